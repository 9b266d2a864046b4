"""Traffic figures over time windows, as RocketMQ's broker reports them to
`mqadmin clusterList`, `brokerStatus` and `consumerProgress` (its
StoreStatsService and BrokerStatsManager): messages put and got per second over
the last 10 s, 60 s and 600 s, and per consumer group and topic.

Counters only grow; `sample` records them once a second (the broker's `run`
task) in a ring of the last 601 samples, and a rate is the growth between the
newest sample and the one a window before it, divided by the time between them
(a young broker's window is as long as it has lived). Between two samples a
rate does not change.

`StatsItems` keeps Apache's BrokerStatsManager items that VIEW_BROKER_STATS_DATA
(315: `mqadmin statsAll`, the Dashboard's topic charts) reads: TOPIC_PUT_NUMS by
topic (the messages of client sends, and how many sends) and GROUP_GET_NUMS by
`topic@group` (messages pulled, and how many pulls), each over the last minute,
hour and day. As Apache's StatsItem, an item exists once it first counts
something, and is sampled every 10 s (7 kept: a minute), every 10 min (7: an
hour) and every hour (25: a day); a window's figures are the growth from its
oldest sample to now.

Pure bookkeeping on the event-loop thread: `got` is two dict updates per pull
that found messages, `observe_send` one per settled run of sends to a topic.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

WINDOWS_S = (10, 60, 600)
# One sample of TrafficStats: (time, put total, got total, messages got per (group, topic),
# reads that found messages, reads that found none).
Sample = tuple[float, int, int, dict[tuple[str, str], int], int, int]
SAMPLE_EVERY_S = 1.0
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
# Apache's StatsItem rings: (name, seconds between samples, samples kept).
STATS_RINGS = (("minute", 10.0, 7), ("hour", 600.0, 7), ("day", 3600.0, 25))


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """One window of a stats item (Apache's BrokerStatsItem): what it counted,
    per second, and per call."""

    sum: int
    tps: float
    avgpt: float


class StatsItems:
    def __init__(self) -> None:
        # (name, key) -> [sum, times]; GROUP_GET_NUMS's key is (group, topic), made
        # into Apache's `topic@group` only when asked (`windows`), not on every pull.
        self._values: dict[tuple[str, object], list[int]] = {}
        self._rings = {
            name: (every, collections.deque(maxlen=kept)) for name, every, kept in STATS_RINGS
        }

    def add(self, name: str, key: object, value: int, times: int = 1) -> None:
        counted = self._values.get((name, key))
        if counted is None:
            self._values[(name, key)] = [value, times]
        else:
            counted[0] += value
            counted[1] += times

    def forget_group(self, group: str) -> None:
        for item in [k for k in self._values if k[0] == GROUP_GET_NUMS and k[1][0] == group]:
            del self._values[item]

    def sample(self, now: float) -> None:
        for every, ring in self._rings.values():
            if not ring or now - ring[-1][0] >= every:
                ring.append((now, {k: (v[0], v[1]) for k, v in self._values.items()}))

    def windows(self, name: str, key: str, now: float) -> dict[str, StatsWindow] | None:
        """The item's minute, hour and day; None when it never counted anything.
        GROUP_GET_NUMS's `key` is `topic@group`, as Apache's statsKey."""
        item: tuple[str, object] = (name, key)
        if name == GROUP_GET_NUMS:
            topic, _, group = key.rpartition("@")
            item = (name, (group, topic))
        counted = self._values.get(item)
        if counted is None:
            return None
        out = {}
        for window, (_, ring) in self._rings.items():
            start, (value, times) = (now, (0, 0))
            if ring:
                start, table = ring[0]
                value, times = table.get(item, (0, 0))
            grown, calls, span = counted[0] - value, counted[1] - times, now - start
            out[window] = StatsWindow(
                grown, grown / span if span > 0 else 0.0, grown / calls if calls > 0 else 0.0
            )
        return out


class TrafficStats:
    def __init__(
        self,
        monotonic: Callable[[], float],
        totals: Callable[[], tuple[int, int]],
        reads: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ):
        """`totals`: (messages put, messages got) since the store opened; `reads`:
        (reads that found messages, reads that found none) since then, what Apache
        counts per getMessage call for getFoundTps and getMissTps."""
        self._monotonic = monotonic
        self._totals = totals
        self._reads = reads
        self.items = StatsItems()
        self._group_got: dict[tuple[str, str], int] = {}
        # (time, put total, got total, messages got per (group, topic), found reads,
        # missed reads)
        self._ring: collections.deque[Sample] = collections.deque(maxlen=WINDOWS_S[-1] + 1)

    def got(self, group: str, topic: str, count: int) -> None:
        """A pull of `group` took `count` messages of `topic`."""
        key = (group, topic)
        self._group_got[key] = self._group_got.get(key, 0) + count
        self.items.add(GROUP_GET_NUMS, key, count)

    def observe_send(
        self, topic: str, status: str, messages: int, seconds: float, sends: int
    ) -> None:
        """The send use case's `SendObserver`: client sends stored in `topic`."""
        self.items.add(TOPIC_PUT_NUMS, topic, messages, sends)

    def forget_group(self, group: str) -> None:
        for key in [k for k in self._group_got if k[0] == group]:
            del self._group_got[key]
        self.items.forget_group(group)

    def sample(self) -> None:
        put, got = self._totals()
        now = self._monotonic()
        found, missed = self._reads()
        self._ring.append((now, put, got, dict(self._group_got), found, missed))
        self.items.sample(now)

    def stats_item(self, name: str, key: str) -> dict[str, StatsWindow] | None:
        """VIEW_BROKER_STATS_DATA's item (`StatsItems.windows`), up to now."""
        return self.items.windows(name, key, self._monotonic())

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

    def _rate(self, column: int, window_s: float) -> float:
        """Per second, over `window_s`, of one of a Sample's running totals."""
        pair = self._pair(window_s)
        if pair is None:
            return 0.0
        older, newest = pair
        return (newest[column] - older[column]) / (newest[0] - older[0])

    def put_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        return self._rate(1, window_s)

    def got_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        return self._rate(2, window_s)

    def found_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        """Reads that found messages, per second (Apache's getFoundTps)."""
        return self._rate(4, window_s)

    def missed_tps(self, window_s: float = WINDOWS_S[0]) -> float:
        """Reads that found nothing (an empty queue, a filter that matched
        nothing, an offset out of range), per second (Apache's getMissTps)."""
        return self._rate(5, window_s)

    def group_tps(self, group: str, topic: str, window_s: float = WINDOWS_S[1]) -> float:
        """Messages of `topic` the group took per second (RocketMQ's consumeTps
        is over the last minute)."""
        pair = self._pair(window_s)
        if pair is None:
            return 0.0
        (t0, _, _, before, _, _), (t1, _, _, after, _, _) = pair
        return (after.get((group, topic), 0) - before.get((group, topic), 0)) / (t1 - t0)
