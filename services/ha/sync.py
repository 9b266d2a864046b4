"""Synchronous replication bookkeeping (docs/guides/replication.md, "SYNC_MASTER"):
acks per replica, the confirmed offset, and the sends waiting for it.

- `slave_ok(end)`: a SYNC_MASTER send may wait for a slave only if one is
  connected and `end - best_ack < max_gap` (strict `<`, RocketMQ's
  `haSlaveFallbehindMax`); otherwise it answers SLAVE_NOT_AVAILABLE at once.
- `wait(end, timeout)`: True once some replica has acked `end` or more, False
  when the send's own monotonic deadline passes. Waiters sit in a heap by
  offset; each ack releases every waiter at or below it, so one slow request
  never delays or fails another, and many sends share one slave round trip.
- `confirmed`: the highest offset any replica has acked; consumers of a
  SYNC_MASTER see records up to it. It never goes down.

Automatic failover narrows this to the group's published in-sync set
(`require`): a send is confirmed once *every* in-sync slave has acked it
(Kafka's acks=all over the ISR), so any member that can be elected holds
every acknowledged message. While an in-sync slave is disconnected the
confirmed offset stays where it was (RocketMQ's #6662 fix). With no slave in
the set the master alone confirms what it appended (`local_end`; RocketMQ 5's
minInSyncReplicas=1): only it can then be elected.
`on_outsider_ack` tells the failover controller of acks from slaves outside
the set (candidates to join it).

Pure asyncio bookkeeping on the event loop thread: no sockets, no clock but
the loop's own timeouts.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Hashable

from ferry.runtime.clock import resolve, wait_future


class ReplicaAcks:
    def __init__(
        self,
        max_gap: int,
        on_confirmed: Callable[[int], None] | None = None,
        local_end: Callable[[], int] | None = None,
        on_outsider_ack: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        """`local_end` (failover): the master's log end, what it confirms alone
        while its in-sync set is empty; `on_outsider_ack` (failover): a slave
        outside the in-sync set acked an offset."""
        self.max_gap = max_gap
        self.on_confirmed = on_confirmed
        self._acks: dict[Hashable, int] = {}  # connected replicas only
        self._confirmed = 0
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._seq = itertools.count()
        # Failover: the replica keys whose acks count (None: any replica's).
        self._required: frozenset[Hashable] | None = None
        self.local_end = local_end
        self.on_outsider_ack = on_outsider_ack

    # ------------------------------------------------------------ replicas

    def connect(self, replica: Hashable, offset: int = 0) -> None:
        self._acks[replica] = max(offset, self._acks.get(replica, 0))
        self._acked(replica, offset)

    def disconnect(self, replica: Hashable) -> None:
        self._acks.pop(replica, None)

    def ack(self, replica: Hashable, offset: int) -> None:
        if replica in self._acks and offset > self._acks[replica]:
            self._acks[replica] = offset
        self._acked(replica, offset)

    def _acked(self, replica: Hashable, offset: int) -> None:
        required = self._required
        if required is None:
            self._advance(offset)
            return
        if replica in required:
            self._advance_required()
        elif self.on_outsider_ack is not None and replica in self._acks:
            self.on_outsider_ack(replica, self._acks[replica])

    # ------------------------------------------------------------ in-sync set

    def require(self, replicas: frozenset[Hashable], floor: int = 0) -> None:
        """From now on a send is confirmed once every one of `replicas` acked
        it (failover's in-sync set, the master excluded); `floor` is what is
        confirmed already (the start of the master's epoch)."""
        if not self._required and self.local_end is not None:
            floor = max(floor, self.local_end())  # what the master alone confirmed stays
        self._required = frozenset(replicas)
        if floor > self._confirmed:
            self._advance(floor)
        self._advance_required()

    @property
    def required(self) -> frozenset[Hashable] | None:
        return self._required

    def _advance_required(self) -> None:
        required = self._required
        if not required:
            return
        acks = self._acks
        if all(r in acks for r in required):
            self._advance(min(acks[r] for r in required))

    def lagging(self, end_offset: int) -> list[Hashable]:
        """The in-sync replicas that have not acked `end_offset`."""
        return [r for r in self._required or () if self._acks.get(r, -1) < end_offset]

    @property
    def connected(self) -> int:
        return len(self._acks)

    @property
    def best_ack(self) -> int:
        return max(self._acks.values(), default=0)

    @property
    def confirmed(self) -> int:
        if self._required is not None and not self._required and self.local_end is not None:
            return max(self._confirmed, self.local_end())
        return self._confirmed

    def acks(self) -> dict[Hashable, int]:
        return dict(self._acks)

    def in_sync(self, master_max: int) -> int:
        return sum(1 for a in self._acks.values() if master_max - a < self.max_gap)

    # ------------------------------------------------------------ sends

    def slave_ok(self, end_offset: int) -> bool:
        required = self._required
        if required is not None:
            acks = self._acks
            return (
                bool(required)
                and all(r in acks for r in required)
                and end_offset - min(acks[r] for r in required) < self.max_gap
            )
        return bool(self._acks) and end_offset - self.best_ack < self.max_gap

    async def wait(self, end_offset: int, timeout_s: float) -> bool:
        if self._confirmed >= end_offset:
            return True
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_offset, next(self._seq), future))
        try:
            if await wait_future(future, timeout_s, on_timeout=False):
                return True
            return self._confirmed >= end_offset
        finally:
            if not future.done():
                future.cancel()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiters if not f.done())

    def _advance(self, offset: int) -> None:
        if offset <= self._confirmed:
            return
        self._confirmed = offset
        waiters = self._waiters
        while waiters and waiters[0][0] <= offset:
            _, _, future = heapq.heappop(waiters)
            resolve(future, True)
        if self.on_confirmed is not None:
            self.on_confirmed(offset)
