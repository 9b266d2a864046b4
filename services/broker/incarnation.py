"""The `Incarnation` contract: what one run of the broker app (`app.BrokerApp`)
needs from whoever runs it as a member of an automatic-failover group.

Declared on the app side, so the app never imports `failover/`: the failover node
(`services/broker/failover/node.py`) builds an Incarnation per role and hands it
to a new BrokerApp. Must never import anything of the broker but this contract's
own types.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from ferry.runtime.server import GrpcServer
from ferry.runtime.swap import ServiceSwitch
from services.ha.sync import ReplicaAcks


class EpochStart(Protocol):
    """What the node does with a run's store once the app has opened it, before
    HA or any send (services/broker/failover/rejoin.py)."""

    # The node's epoch history (services.broker.failover.epochs.EpochHistory:
    # `entries`, each with `epoch` and `start`), which RocketMQ's 1007 reports.
    history: Any

    async def start_epoch(self, store: object) -> None:
        """`store`: the run's MessageStore, open. A new leader records its
        epoch; a follower cuts what its new leader does not have."""


class SlaveTimeouts(Protocol):
    """The node's in-sync set on a master: cluster/'s `SlaveTimeouts`
    (services.broker.cluster.replication), named here since this contract may
    not import cluster/."""

    def on_slave_timeout(self, lagging: list[Hashable]) -> None:
        """`lagging`: the in-sync replicas that did not acknowledge a send
        within slaveTimeout (they leave the in-sync set)."""


class Fence(Protocol):
    """The node's fence on a master: messaging's `Fence`
    (services.broker.messaging.contracts), named here since this contract may
    not import messaging/."""

    def check_accepting(self) -> None: ...

    def check_acknowledging(self) -> None: ...


@dataclass
class Incarnation:
    """What one run of the broker app needs from the failover node."""

    epoch: int  # the epoch led, or followed (0: no leader known)
    epoch_start: EpochStart  # the node's, for this run's role
    fence: Fence  # the node itself
    # A master run's: the node's in-sync set, told which in-sync replicas
    # lagged past slaveTimeout (None: a follower run).
    slave_timeouts: SlaveTimeouts | None
    # A master run's replica acknowledgements: the node's, which its in-sync
    # set counts (None: a follower run, which has none).
    acks: ReplicaAcks | None
    metrics_port: int
    # The node's gRPC server, which outlives the run, and where the run mounts
    # its servicers (None: the app runs its own server).
    server: GrpcServer | None = None
    switch: ServiceSwitch | None = None
    # Serves the run's RocketMQ-protocol table on the node's listener, which
    # outlives the run (None: every request answered SERVICE_NOT_AVAILABLE);
    # None here: the app runs its own RocketMQ-protocol server.
    # Installs a run's RocketMQ-protocol table and close hook on the node's
    # listener (None: the between-runs table answering 14).
    serve_remoting: Callable[..., None] | None = None
    # The RocketMQ door's tables of its connections (services.broker.messaging's
    # ClientTables and QueueLocks: who sent which heartbeat, which orderly
    # consumer holds which queue), which outlive the run as the connections on
    # the node's listener do; None: the run keeps tables of its own.
    remoting_clients: Any = None
    remoting_locks: Any = None
