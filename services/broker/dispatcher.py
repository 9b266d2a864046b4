"""The dispatcher: tails the commit log and builds the consume queues (SPEC §4.3).

It is the one writer of consume queues, on masters and slaves alike: it reads
records from `offset` up to the commit log's write position and appends one
20-byte entry per record to the record's (topic, queue id) queue, at the
record's own QUEUEOFFSET — so a slave's queues match its master's. BLANK
markers skip to the next file.

Ownership: the event loop thread runs `dispatch_some`; `offset` only grows
(recovery sets it once, before anything runs). Reads here are page-cache
sized (a few MiB per step); the async loop yields between steps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ferry import record
from ferry.model import DELAY_LEVELS_S, SCHEDULE_TOPIC
from ferry.record import Blank, RecordError
from ferry.runtime.clock import wait_event
from services.broker.commitlog import CommitLog
from services.broker.consumequeue import ConsumeQueues

log = logging.getLogger(__name__)

DEFAULT_STEP_BYTES = 4 << 20
PROPERTY_DELAY = "DELAY"


class DispatchError(Exception):
    """The commit log holds bytes the dispatcher cannot read; it stops there."""


def tags_code(info: record.DispatchInfo, delay_levels_s: tuple[float, ...]) -> int:
    """What a consume-queue entry stores in its third field: the tags hash, or,
    for the delay topic, when the message is due (ms) — as RocketMQ does."""
    if info.topic == SCHEDULE_TOPIC:
        level = info.queue_id + 1
        if 1 <= level <= len(delay_levels_s):
            return info.store_timestamp + int(delay_levels_s[level - 1] * 1000)
        return info.store_timestamp
    return record.tags_hash(info.tags) if info.tags else 0


class Dispatcher:
    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        offset: int,
        on_dispatch: Callable[[set[tuple[str, int]]], None] | None = None,
        delay_levels_s: tuple[float, ...] = DELAY_LEVELS_S,
        step_bytes: int = DEFAULT_STEP_BYTES,
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.offset = offset
        self.on_dispatch = on_dispatch
        self.delay_levels_s = delay_levels_s
        self.step_bytes = step_bytes
        self.records_dispatched = 0
        self._wake = asyncio.Event() if _has_loop() else None
        self.error: str | None = None

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commit_log.max_offset - self.offset)

    def dispatch_some(self, limit: int | None = None) -> int:
        """Dispatch records from `offset` (at most `step_bytes`, never past
        `limit` or the write position); returns the bytes consumed."""
        end = (
            self.commit_log.max_offset if limit is None else min(limit, self.commit_log.max_offset)
        )
        start = self.offset
        if start >= end:
            return 0
        chunk = self.commit_log.read_into_chunk(start, min(self.step_bytes, end - start))
        pos = 0
        pending: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        touched: set[tuple[str, int]] = set()
        levels = self.delay_levels_s
        while pos + record.BLANK_SIZE <= len(chunk):
            try:
                head = record.peek(chunk[pos : pos + record.BLANK_SIZE])
                if isinstance(head, Blank):
                    self._flush(pending, touched)
                    self.offset = self.commit_log.file_end(start + pos)
                    self._notify(touched)
                    return self.offset - start
                if head > len(chunk) - pos:
                    if pos > 0 or start + head > end:
                        break  # the rest comes with the next read (or the next HA frame)
                    chunk = self.commit_log.read(start, head)  # one record larger than a step
                info = record.dispatch_info(chunk, pos)
            except RecordError as exc:
                self.error = f"commit offset {start + pos}: {exc}"
                log.error("dispatch stopped at commit offset %d: %s", start + pos, exc)
                raise DispatchError(self.error) from None
            assert isinstance(info, record.DispatchInfo)
            key = (info.topic, info.queue_id)
            entry = (info.commit_offset, info.size, tags_code(info, levels))
            group = pending.get(key)
            if group is not None and group[0] + len(group[1]) == info.queue_offset:
                group[1].append(entry)
            else:
                if group is not None:
                    self._put(key, group)
                pending[key] = (info.queue_offset, [entry])
            pos += info.size
            self.records_dispatched += 1
        self._flush(pending, touched)
        self.offset = start + pos
        self._notify(touched)
        return pos

    def dispatch_all(self, limit: int | None = None) -> int:
        """Dispatch until caught up (recovery, before serving)."""
        total = 0
        while True:
            n = self.dispatch_some(limit)
            if not n:
                return total
            total += n

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def run(self, idle_wait_s: float = 0.2) -> None:
        """Dispatch whenever woken (the appender and the HA slave call `wake`),
        and at least every `idle_wait_s`."""
        if self._wake is None:
            self._wake = asyncio.Event()
        while True:
            await wait_event(self._wake, idle_wait_s)
            self._wake.clear()
            try:
                while self.dispatch_some():
                    await asyncio.sleep(0)
            except DispatchError:
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------ internals

    def _put(self, key: tuple[str, int], group: tuple[int, list[tuple[int, int, int]]]) -> None:
        self.queues.get_or_create(*key).put(group[0], group[1])

    def _flush(
        self,
        pending: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]],
        touched: set[tuple[str, int]],
    ) -> None:
        for key, group in pending.items():
            self._put(key, group)
            touched.add(key)
        pending.clear()

    def _notify(self, touched: set[tuple[str, int]]) -> None:
        if touched and self.on_dispatch is not None:
            self.on_dispatch(touched)


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
