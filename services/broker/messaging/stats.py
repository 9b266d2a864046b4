"""Traffic figures over time windows, as RocketMQ's broker reports them to
`mqadmin clusterList`, `brokerStatus` and `consumerProgress` (its
StoreStatsService and BrokerStatsManager): messages put and got per second over
the last 10 s, 60 s and 600 s, and per consumer group and topic.

Counters only grow; `sample` records them once a second (the broker's `run`
task) in a ring of the last 601 samples, and a rate is the growth between the
newest sample and the one a window before it, divided by the time between them
(a young broker's window is as long as it has lived). Between two samples a
rate does not change.

Pure bookkeeping on the event-loop thread: `got` is one dict update per pull
that found messages.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

WINDOWS_S = (10, 60, 600)
SAMPLE_EVERY_S = 1.0


class TrafficStats:
    def __init__(self, monotonic: Callable[[], float], totals: Callable[[], tuple[int, int]]):
        """`totals`: (messages put, messages got) since the store opened."""
        self._monotonic = monotonic
        self._totals = totals
        self._group_got: dict[tuple[str, str], int] = {}
        # (time, put total, got total, messages got per (group, topic))
        self._ring: collections.deque[tuple[float, int, int, dict[tuple[str, str], int]]] = (
            collections.deque(maxlen=WINDOWS_S[-1] + 1)
        )

    def got(self, group: str, topic: str, count: int) -> None:
        """A pull of `group` took `count` messages of `topic`."""
        key = (group, topic)
        self._group_got[key] = self._group_got.get(key, 0) + count

    def forget_group(self, group: str) -> None:
        for key in [k for k in self._group_got if k[0] == group]:
            del self._group_got[key]

    def sample(self) -> None:
        put, got = self._totals()
        self._ring.append((self._monotonic(), put, got, dict(self._group_got)))

    async def run(self) -> None:
        """Samples every second until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def _pair(self, window_s: float):
        """(older sample, newest sample) spanning at most `window_s`; None
        before there are two."""
        if len(self._ring) < 2:
            return None
        newest = self._ring[-1]
        older = self._ring[0]
        for sample in reversed(self._ring):
            if newest[0] - sample[0] >= window_s:
                older = sample
                break
        if newest[0] <= older[0]:
            return None
        return older, newest

    def put_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        pair = self._pair(window_s)
        return 0.0 if pair is None else (pair[1][1] - pair[0][1]) / (pair[1][0] - pair[0][0])

    def got_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        pair = self._pair(window_s)
        return 0.0 if pair is None else (pair[1][2] - pair[0][2]) / (pair[1][0] - pair[0][0])

    def group_tps(self, group: str, topic: str, window_s: float = WINDOWS_S[1]) -> float:
        """Messages of `topic` the group took per second (RocketMQ's consumeTps
        is over the last minute)."""
        pair = self._pair(window_s)
        if pair is None:
            return 0.0
        (t0, _, _, before), (t1, _, _, after) = pair
        return (after.get((group, topic), 0) - before.get((group, topic), 0)) / (t1 - t0)
