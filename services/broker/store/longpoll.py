"""Long polling: pulls that found nothing wait here until their queue has a
message consumers may see (RocketMQ's PullRequestHoldService, without its
polling thread).

The dispatcher calls `notify(keys)` for the queues it wrote; HA calls
`notify_all()` when the confirmed offset moves (a SYNC_MASTER shows only what
a slave has). Waiters re-check `visible_at` when woken, and at least every
second. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from ferry.runtime.clock import resolve, wait_future


class LongPolls:
    def __init__(self, visible_at: Callable[[str, int, int], bool]) -> None:
        self.visible_at = visible_at  # (topic, queue id, offset): a pull there has an answer
        self._waiters: dict[tuple[str, int], list[asyncio.Future]] = {}
        self.open = True

    @property
    def waiting(self) -> int:
        """How many pulls are waiting now (one `wait_any` counts once, however many queues)."""
        return len({id(f) for futures in self._waiters.values() for f in futures})

    def waiting_on(self, topic: str, queue_id: int) -> int:
        """How many pulls wait on this queue now. Other services wait here too
        (the timer on its own queue, a metadata follower on its log), so a
        caller that means one queue asks about that queue."""
        return len(self._waiters.get((topic, queue_id), ()))

    async def wait(self, topic: str, queue_id: int, queue_offset: int, timeout_s: float) -> None:
        """Return when the queue has a visible message at `queue_offset`, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.open:
            if self.visible_at(topic, queue_id, queue_offset):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await self.wait_any([(topic, queue_id)], min(remaining, 1.0))

    async def wait_any(self, keys: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """Return when any of the queues is notified (something was written to
        it, or the pop service freed it), or after `timeout_s`. The caller
        re-checks what it wants."""
        if not self.open:
            return
        future = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._waiters.setdefault(key, []).append(future)
        try:
            await wait_future(future, timeout_s)
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._waiters[key]

    def notify(self, keys: Iterable[tuple[str, int]]) -> None:
        for key in keys:
            futures = self._waiters.pop(key, None)
            if futures:
                for future in futures:
                    resolve(future)

    def notify_all(self) -> None:
        self.notify(list(self._waiters))

    def close(self) -> None:
        """Release every waiter (the store is stopping)."""
        self.open = False
        self.notify_all()
