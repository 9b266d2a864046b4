"""Queue locks for orderly consumers (RocketMQ's RebalanceLockManager): within
a consumer group, each queue (topic, broker name, queue id) is consumed by at
most one client id at a time.

A lock belongs to a client id and is held through a channel handle (opaque
here). It lives `max_live_s` after it was last taken or renewed (RocketMQ's
`rocketmq.broker.rebalance.lockMaxLiveTime`, 60 s; clients renew every 20 s),
ends when its owner unlocks it, and ends at once when the owner's channel
closes (RocketMQ 4.9 waits for the expiry instead). An expired lock is free
for anyone.

Pure tables: time is an argument (`now`, monotonic seconds), no I/O, no logs.
Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

LOCK_MAX_LIVE_S = 60.0


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """A queue as RocketMQ's clients name it (MessageQueue)."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(slots=True)
class _Lock:
    client_id: str
    channel: Hashable
    renewed: float


class QueueLocks:
    def __init__(self, max_live_s: float = LOCK_MAX_LIVE_S) -> None:
        self.max_live_s = max_live_s
        self._locks: dict[tuple[str, QueueKey], _Lock] = {}

    def lock(
        self,
        group: str,
        client_id: str,
        channel: Hashable,
        queues: Iterable[QueueKey],
        now: float,
    ) -> list[QueueKey]:
        """Take or renew the locks of `queues` for `client_id`; returns those it
        holds now (the others are held by another live client), sorted."""
        held = []
        for queue in dict.fromkeys(queues):
            key = (group, queue)
            current = self._locks.get(key)
            if current is None or current.client_id == client_id or self._expired(current, now):
                self._locks[key] = _Lock(client_id, channel, now)
                held.append(queue)
        return sorted(held)

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> None:
        """Release the locks `client_id` holds among `queues` (others' stay)."""
        for queue in queues:
            current = self._locks.get((group, queue))
            if current is not None and current.client_id == client_id:
                del self._locks[(group, queue)]

    def channel_closed(self, channel: Hashable) -> int:
        """Release every lock held through `channel`; returns how many."""
        gone = [k for k, v in self._locks.items() if v.channel == channel]
        for key in gone:
            del self._locks[key]
        return len(gone)

    def owner(self, group: str, queue: QueueKey, now: float) -> str | None:
        """The client id holding the queue's lock now, or None."""
        current = self._locks.get((group, queue))
        if current is None or self._expired(current, now):
            return None
        return current.client_id

    def expire(self, now: float) -> int:
        """Drop expired locks (they are free already; this bounds the table)."""
        gone = [k for k, v in self._locks.items() if self._expired(v, now)]
        for key in gone:
            del self._locks[key]
        return len(gone)

    def _expired(self, lock: _Lock, now: float) -> bool:
        return now - lock.renewed > self.max_live_s
