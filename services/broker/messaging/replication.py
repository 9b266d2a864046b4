"""Where replication stands, computed once for every door: what ferry.v1's
GetHAStatus answers (`ferry ha-status -b`) and what RocketMQ's GET_BROKER_HA_STATUS
(907, `mqadmin haStatus`) renders as HARuntimeInfo.

Owns: ReplicationStatus and the plain dataclasses it answers with — ReplicationFigures
(this broker's side), ReplicaFigures (one slave connected to this master) and
FollowFigures (this slave's view of its master). It reads the HA parts the app
hands it at call time (a failover run swaps them), through the small Protocols
below, which services/ha's HAMaster and HASlave satisfy.

Must never: change replication state; render a wire format; import services/ha
(the figures it needs are the Protocols' attributes). Runs on the event-loop
thread, which owns the HA connections it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class _Connection(Protocol):
    addr: str
    replica_id: int
    ack_offset: int
    transfer_from: int
    last_ack_ms: int

    def bytes_per_second(self) -> float: ...


class _ReplicaState(Protocol):
    conn: _Connection
    lag: int
    in_sync: bool


class MasterSide(Protocol):
    """services.ha.master.HAMaster, as this use case reads it."""

    def replica_states(self) -> Sequence[_ReplicaState]: ...


class SlaveSide(Protocol):
    """services.ha.slave.HASlave, as this use case reads it."""

    master_addr: str
    master_max_offset: int
    last_read_ms: int
    last_write_ms: int
    connected: bool


class _Store(Protocol):
    max_offset: int
    confirm_offset: int


@dataclass(frozen=True)
class HAParts:
    """What the app hands over at call time: its role, store and HA sides."""

    role: str
    store: object  # a MessageStore: max_offset, confirm_offset
    master: object | None  # a MasterSide on a master with its HA server running
    slave: object | None  # a SlaveSide on a slave


@dataclass(frozen=True)
class ReplicaFigures:
    addr: str  # the slave's HA connection, host:port
    replica_id: int  # from the handshake; 0 for a 4.x slave without one
    ack_offset: int  # the commit offset the slave last acknowledged
    lag: int  # this master's max commit offset minus ack_offset
    in_sync: bool  # lag below haMaxGapNotInSync
    bytes_per_second: float
    transfer_from: int  # the commit offset streaming started from; −1: not yet
    last_ack_ms: int


@dataclass(frozen=True)
class FollowFigures:
    master_addr: str  # the master's HA address; "" while unknown
    master_max_offset: int  # as the master's last frame said
    last_read_ms: int
    last_write_ms: int
    connected: bool


@dataclass(frozen=True)
class ReplicationFigures:
    role: str  # ASYNC_MASTER, SYNC_MASTER or SLAVE
    max_offset: int  # this broker's commit-log end
    confirm_offset: int
    replicas: tuple[ReplicaFigures, ...]  # a master's connected slaves
    following: FollowFigures | None  # a slave's master; None on a master

    @property
    def is_master(self) -> bool:
        return self.following is None

    @property
    def in_sync_replicas(self) -> int:
        return sum(r.in_sync for r in self.replicas)


class HASource(Protocol):
    """Who holds this run's HA parts (the broker app: a slave's HASlave starts after
    the doors are built, so the parts are read at every call)."""

    def ha_parts(self) -> HAParts: ...


class ReplicationStatus:
    def __init__(self, source: HASource) -> None:
        self.source = source

    def figures(self) -> ReplicationFigures:
        parts = self.source.ha_parts()
        store: _Store = parts.store  # type: ignore[assignment]
        replicas: tuple[ReplicaFigures, ...] = ()
        if parts.master is not None:
            master: MasterSide = parts.master  # type: ignore[assignment]
            replicas = tuple(
                ReplicaFigures(
                    addr=s.conn.addr,
                    replica_id=s.conn.replica_id,
                    ack_offset=s.conn.ack_offset,
                    lag=s.lag,
                    in_sync=s.in_sync,
                    bytes_per_second=s.conn.bytes_per_second(),
                    transfer_from=s.conn.transfer_from,
                    last_ack_ms=s.conn.last_ack_ms,
                )
                for s in master.replica_states()
            )
        following = None
        if parts.slave is not None:
            slave: SlaveSide = parts.slave  # type: ignore[assignment]
            following = FollowFigures(
                master_addr=slave.master_addr,
                master_max_offset=slave.master_max_offset,
                last_read_ms=slave.last_read_ms,
                last_write_ms=slave.last_write_ms,
                connected=slave.connected,
            )
        return ReplicationFigures(
            role=parts.role,
            max_offset=store.max_offset,
            confirm_offset=store.confirm_offset,
            replicas=replicas,
            following=following,
        )
