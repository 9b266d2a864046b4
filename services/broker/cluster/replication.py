"""The replication policy of a SYNC_MASTER: a send is acknowledged once a slave
has its bytes (or, under automatic failover, every member of the in-sync set).

`SyncReplication.wait` is what messaging awaits after a send is stored (its
`replication_wait`). It waits on the HA master's `ReplicaAcks` (an offset waiter,
never a sleep loop) with the configured `slave_timeout_s`, and answers with a
`SendStatus`, never an exception. Runs on the event loop; holds no state of its
own beyond its collaborators.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Protocol

from services.broker.messaging.outgoing import SendStatus
from services.broker.store import PutResult
from services.ha.sync import ReplicaAcks


class ConfirmSignal(Protocol):
    """Wakes what waits for the confirm offset (the message store)."""

    def notify_confirmed(self) -> None: ...


class SlaveTimeouts(Protocol):
    """What is told which replicas lagged past slaveTimeout (under automatic
    failover, the node's in-sync set, which they leave)."""

    def on_slave_timeout(self, lagging: list[Hashable]) -> None: ...


class ReplicaPush(Protocol):
    """Sends the log's new bytes to the slaves now (the HA master)."""

    def push_now(self) -> None: ...


class SyncObserver(Protocol):
    """Metrics of the replication waits (the broker's metrics)."""

    def observe_sync(self, status: str, seconds: float) -> None: ...


class SyncReplication:
    def __init__(
        self,
        acks: ReplicaAcks,
        timeout_s: float,
        confirmed: ConfirmSignal,
        *,
        failover: bool = False,
        min_in_sync_replicas: int = 1,
        slave_timeouts: SlaveTimeouts | None = None,
        observer: SyncObserver | None = None,
        push: ReplicaPush | None = None,
    ) -> None:
        """
        Args:
            acks: the HA master's replica acknowledgements.
            timeout_s: how long a send waits for a slave (slaveTimeout).
            confirmed: woken (`notify_confirmed`) when the confirm offset moves
                without a slave (an in-sync set of this master alone): long polls.
            failover: the in-sync set (`acks.required`) decides, and
                `min_in_sync_replicas` members (this master included) must exist.
            slave_timeouts: told (`on_slave_timeout`) which replicas lagged past
                the timeout (under failover they leave the in-sync set).
            observer: (status, seconds) of each wait, for metrics.
            push: sends the new bytes to the slaves now, before the wait
                (`push_now`: the HA master's), instead of one event-loop turn later.
        """
        self.acks = acks
        self.timeout_s = timeout_s
        self.confirmed = confirmed
        self.failover = failover
        self.min_in_sync_replicas = min_in_sync_replicas
        self.slave_timeouts = slave_timeouts
        self.observer = observer
        self.push = push

    async def wait(self, result: PutResult) -> SendStatus:
        acks = self.acks
        started = time.perf_counter()
        if self.failover and 1 + len(acks.required or ()) < self.min_in_sync_replicas:
            status = SendStatus.SLAVE_NOT_AVAILABLE
        elif self.failover and not acks.required:
            # The in-sync set is this master alone (minInSyncReplicas=1).
            status = SendStatus.SEND_OK
            self.confirmed.notify_confirmed()
        elif not acks.slave_ok(result.end_offset):
            status = SendStatus.SLAVE_NOT_AVAILABLE
        else:
            if self.push is not None and acks.confirmed < result.end_offset:
                self.push.push_now()  # the bytes leave now, not at the HA writer's next turn
            if await acks.wait(result.end_offset, self.timeout_s):
                status = SendStatus.SEND_OK
            else:
                status = SendStatus.FLUSH_SLAVE_TIMEOUT
                if self.slave_timeouts is not None:
                    self.slave_timeouts.on_slave_timeout(acks.lagging(result.end_offset))
        if self.observer is not None:
            self.observer.observe_sync(status.value, time.perf_counter() - started)
        return status
