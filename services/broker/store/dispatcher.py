"""The dispatcher: tails the commit log and builds the consume queues
(docs/reference/contract.md, "Store files").

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
import time
from collections.abc import Callable

from ferry import record
from ferry.model import DELAY_LEVELS_S, SCHEDULE_TOPIC
from ferry.record import RecordError
from ferry.runtime.clock import Ticker
from ferry.runtime.errors import StorageFault
from services.broker.store.commitlog import CommitLog
from services.broker.store.consumequeue import ConsumeQueues
from services.broker.store.failstop import is_full_disk

log = logging.getLogger(__name__)

DEFAULT_STEP_BYTES = 4 << 20
BACKGROUND_STEP_BYTES = 256 << 10
MAX_DEFER_S = 1.0


class DispatchError(Exception):
    """The commit log holds bytes the dispatcher cannot read; it stops there."""


class Dispatcher:
    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        offset: int,
        on_dispatch: Callable[[set[tuple[str, int]]], None] | None = None,
        delay_levels_s: tuple[float, ...] = DELAY_LEVELS_S,
        step_bytes: int = DEFAULT_STEP_BYTES,
        busy: Callable[[], bool] | None = None,
        on_fault: Callable[[StorageFault], None] | None = None,
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.offset = offset
        self.on_dispatch = on_dispatch
        self.delay_levels_s = delay_levels_s
        self.step_bytes = step_bytes
        self.records_dispatched = 0
        # True while an HA slave receives a bulk transfer: dispatch steps aside.
        self.busy = busy
        self.on_fault = on_fault  # a consume-queue write failed (not a full disk)
        self._wake = asyncio.Event() if _has_loop() else None
        self._idle = False  # `run` waits to be woken (not catching up, not failing)
        self._faulted = False  # a consume-queue write failed: dispatch has stopped
        self.error: str | None = None
        self._topic_names: dict[bytes, str] = {}
        self._tag_hashes: dict[bytes, int] = {}

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commit_log.max_offset - self.offset)

    def dispatch_some(self, limit: int | None = None, step: int | None = None) -> int:
        """Dispatch records from `offset` (at most `step` bytes, default
        `step_bytes`, never past `limit` or the write position); returns the
        bytes consumed."""
        end = (
            self.commit_log.max_offset if limit is None else min(limit, self.commit_log.max_offset)
        )
        start = self.offset
        if start >= end:
            return 0
        chunk = self.commit_log.read_into_chunk(start, min(step or self.step_bytes, end - start))
        try:
            records, pos, blank = record.scan_dispatch(chunk, 0)
            if not records and not blank and pos + record.BLANK_SIZE <= len(chunk):
                # One record larger than a step: read it whole, if it is all written.
                head = record.peek(chunk[: record.BLANK_SIZE])
                if isinstance(head, int) and start + head <= end:
                    records, pos, blank = record.scan_dispatch(self.commit_log.read(start, head), 0)
        except RecordError as exc:
            self.error = f"commit offset {start}+: {exc}"
            log.error("dispatch stopped after commit offset %d: %s", start, exc)
            raise DispatchError(self.error) from None
        pending: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        topics = self._topic_names
        hashes = self._tag_hashes
        levels = self.delay_levels_s
        for commit_offset, size, topic_raw, queue_id, queue_offset, store_ts, tags in records:
            topic = topics.get(topic_raw)
            if topic is None:
                topic = topics[topic_raw] = topic_raw.decode(errors="replace")
            if topic == SCHEDULE_TOPIC:
                level = queue_id + 1
                code = store_ts + (
                    int(levels[level - 1] * 1000) if 1 <= level <= len(levels) else 0
                )
            elif tags:
                code = hashes.get(tags)
                if code is None:
                    if len(hashes) > 65536:
                        hashes.clear()
                    code = hashes[tags] = record.tags_hash(tags.decode(errors="replace"))
            else:
                code = 0
            key = (topic, queue_id)
            group = pending.get(key)
            if group is not None and group[0] + len(group[1]) == queue_offset:
                group[1].append((commit_offset, size, code))
            else:
                if group is not None:
                    self._put(key, group)
                pending[key] = (queue_offset, [(commit_offset, size, code)])
        self.records_dispatched += len(records)
        touched: set[tuple[str, int]] = set()
        self._flush(pending, touched)
        self.offset = self.commit_log.file_end(start + pos) if blank else start + pos
        self._notify(touched)
        return self.offset - start

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

    def follow(self) -> None:
        """New records are in the log: dispatch them now, on the caller's turn,
        when one short step catches up and `run` is idle; otherwise (catching up,
        failing, a bulk transfer under way, more than a step behind) wake `run`,
        which owns the slicing and the error handling. The store calls this once
        per loop turn that appended: a plain callback, where waking `run` for
        every append costs a task step and a new waiter each time."""
        if self._faulted:
            return
        if not self._idle or self.error is not None or (self.busy is not None and self.busy()):
            self.wake()
            return
        try:
            self.dispatch_some(step=BACKGROUND_STEP_BYTES)
        except DispatchError:
            self.wake()  # `run` meets it again: it logs once and retries every second
            return
        except OSError as exc:
            if not is_full_disk(exc):
                self._storage_fault(exc)
                return
            # A full disk: `run` meets it again and retries until there is room.
        if self.offset < self.commit_log.max_offset:
            self.wake()

    async def run(self, idle_wait_s: float = 0.2) -> None:
        """Dispatch whenever woken (the appender and the HA slave call `wake`),
        and at least every `idle_wait_s`."""
        if self._wake is None:
            self._wake = asyncio.Event()
        failing = False
        ticker = Ticker(self._wake, idle_wait_s)
        try:
            while True:
                self._idle = not failing
                try:
                    await self._wake.wait()
                finally:
                    self._idle = False
                self._wake.clear()
                if self._faulted:
                    return
                try:
                    # Short slices: an HA slave catching up, gRPC calls and sends
                    # get their turns between them.
                    while self.dispatch_some(step=BACKGROUND_STEP_BYTES):
                        if self.offset >= self.commit_log.max_offset:
                            break  # caught up: nothing to yield for
                        await self._yield()
                except DispatchError:
                    await asyncio.sleep(1.0)
                except OSError as exc:
                    if not is_full_disk(exc):
                        self._storage_fault(exc)
                        return
                    # A full disk (consume-queue files grow as they fill): the
                    # entries are written again from the same commit-log offset
                    # once there is room; consumers wait for them meanwhile.
                    if not failing:
                        log.error(
                            "dispatch cannot write consume queues: %s; retrying every 1 s", exc
                        )
                    failing = True
                    await asyncio.sleep(1.0)
                else:
                    if failing:
                        log.info("dispatch writes consume queues again")
                    failing = False
        finally:
            ticker.stop()

    async def _yield(self) -> None:
        """Between slices: one event-loop turn; longer while `busy()` says a
        bulk transfer (an HA slave catching up) needs the CPU more — consume
        queues then lag, as RocketMQ's reput does, but never by more than
        MAX_DEFER_S at a time."""
        await asyncio.sleep(0)
        if self.busy is None:
            return
        deferred_since = time.monotonic()
        while self.busy() and time.monotonic() - deferred_since < MAX_DEFER_S:
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------ internals

    def _storage_fault(self, exc: OSError) -> None:
        """A consume-queue write failed (not for a full disk): dispatch stops for
        good and the store fails stop."""
        self._faulted = True
        where = exc.filename or f"a consume queue under {self.queues.root}"
        fault = StorageFault("pwrite", str(where), exc)
        log.error("dispatch stopped: %s", fault)
        if self.on_fault is not None:
            self.on_fault(fault)

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
