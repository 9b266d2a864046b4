"""The message store: the commit log, its consume queues, flushing, recovery
and reads — RocketMQ's DefaultMessageStore, without the broker around it.

Data flow: `put` (the appender) encodes records and writes them to the commit
log; the dispatcher tails the commit log into the consume queues and wakes
long-polling readers; the flusher makes both durable and writes the
checkpoint; `get_messages` reads a queue's entries and then their records.

Ownership and concurrency: everything here runs on the event loop thread,
except fdatasync, which runs in a worker thread on file descriptors handed
over by `take_dirty`. The appender is `_append`: it assigns commit offsets and
queue offsets and writes without awaiting in between, so appends are
serialised and each batch is contiguous. No other code writes the commit log
(on a slave, the HA client appends raw bytes through `append_raw`).

Topic configuration, permissions and queue choice are the caller's job
(`messaging.py`); this module trusts its arguments.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import enum
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ferry import record
from ferry.model import DELAY_LEVELS_S
from ferry.runtime.clock import Clock, wait_event
from ferry.runtime.errors import FerryError, ResourceExhausted, Unavailable
from ferry.runtime.tasks import cancel_and_wait
from services.broker.commitlog import CommitLog
from services.broker.consumequeue import ConsumeQueues, sync_fds
from services.broker.dispatcher import Dispatcher
from services.broker.recovery import (
    ABORT,
    CHECKPOINT,
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
    scan_commit_log,
)

log = logging.getLogger(__name__)


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


@dataclass(frozen=True)
class StoreConfig:
    root: Path
    commit_log_file_size: int = 1 << 30
    consume_queue_entries_per_file: int = 300_000
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_s: float = 0.5
    sync_flush_timeout_s: float = 5.0
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    delay_levels_s: tuple[float, ...] = DELAY_LEVELS_S
    preallocate: bool = True
    max_pull_bytes: int = 8 << 20

    @property
    def commit_log_dir(self) -> Path:
        return self.root / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.root / "consumequeue"


@dataclass(frozen=True, slots=True)
class MessageIn:
    """One message to append (already validated)."""

    body: bytes
    properties: bytes  # encoded with `record.encode_properties`
    flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = record.pack_host(("127.0.0.1", 0))
    sys_flag: int = 0
    reconsume_times: int = 0


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


@dataclass(frozen=True)
class PutResult:
    status: PutStatus
    topic: str
    queue_id: int
    queue_offset: int  # of the first message
    commit_offsets: list[int]
    msg_ids: list[str]
    end_offset: int  # commit offset just past the last record
    store_timestamp: int


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"  # queue_offset == max (nothing yet)
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # entries exist, none matched the tags
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # past the max offset
    OFFSET_MOVED = "OFFSET_MOVED"  # below the min offset


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    records: list[record.StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass
class RecoveryReport:
    crashed: bool
    end_offset: int
    scanned_from: int
    dropped_bytes: int
    reason: str | None
    dispatched_from: int
    dispatched_bytes: int
    consume_queues_rebuilt: bool
    cq_entries_dropped: int
    seconds: float = 0.0


@dataclass(order=True)
class _FlushWaiter:
    offset: int
    future: asyncio.Future = field(compare=False)


class MessageStore:
    def __init__(self, config: StoreConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.commit_log = CommitLog(
            config.commit_log_dir, config.commit_log_file_size, preallocate=config.preallocate
        )
        self.queues = ConsumeQueues(config.consume_queue_dir, config.consume_queue_entries_per_file)
        self.dispatcher = Dispatcher(
            self.commit_log,
            self.queues,
            0,
            on_dispatch=self._on_dispatch,
            delay_levels_s=config.delay_levels_s,
        )
        self._store_host = record.pack_host(config.store_host)
        self._msg_id_prefix = record.message_id(config.store_host, 0)[:16]
        # Next queue offset per (topic, queue id): assigned by the appender.
        self._next_queue_offset: dict[tuple[str, int], int] = {}
        self._long_polls: dict[tuple[str, int], list[asyncio.Future]] = {}
        self._flush_waiters: list[_FlushWaiter] = []
        self._flush_wake: asyncio.Event | None = None
        self._flushed_offset = 0
        self._tasks: list[asyncio.Task] = []
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_written = (0, 0)
        self._opened = False
        self.confirm_offset_fn: Callable[[], int] | None = None  # set by HA on a SYNC_MASTER
        self.on_append: Callable[[int], None] | None = None  # HA master: new bytes to stream
        self.put_message_count = 0
        self.get_message_count = 0

    # ------------------------------------------------------------ lifecycle

    def open(self) -> RecoveryReport:
        """Recover (SPEC §4.4) and create the abort marker. Blocking: call it
        before serving (in a thread if a loop is running)."""
        started = time.monotonic()
        root = self.config.root
        root.mkdir(parents=True, exist_ok=True)
        abort = root / ABORT
        crashed = abort.exists()
        checkpoint = load_checkpoint(root / CHECKPOINT)
        scan_from = checkpoint.flushed_offset if checkpoint else self.commit_log.min_offset
        scan = scan_commit_log(self.commit_log, scan_from)
        end = scan.end_offset
        if not crashed and checkpoint and checkpoint.flushed_offset != end:
            log.warning(
                "clean shutdown, but the checkpoint's flushed offset %d differs from the "
                "recovered end %d",
                checkpoint.flushed_offset,
                end,
            )
        cq_existed = self.queues.load_all()
        dropped_entries = sum(q.truncate_commit_end(end) for q in self.queues.all())
        rebuild = not cq_existed or checkpoint is None
        if rebuild:
            dispatch_from = self.commit_log.min_offset
        else:
            assert checkpoint is not None
            dispatch_from = min(max(checkpoint.dispatched_offset, self.commit_log.min_offset), end)
        self.dispatcher.offset = dispatch_from
        dispatched = self.dispatcher.dispatch_all()
        for queue in self.queues.all():
            self._next_queue_offset[(queue.topic, queue.queue_id)] = queue.max_offset
        self._flushed_offset = end
        self._write_checkpoint_now(self._durable_snapshot())
        abort.write_bytes(str(os.getpid()).encode())
        self._opened = True
        report = RecoveryReport(
            crashed=crashed,
            end_offset=end,
            scanned_from=scan.scanned_from,
            dropped_bytes=scan.dropped_bytes,
            reason=scan.reason,
            dispatched_from=dispatch_from,
            dispatched_bytes=dispatched,
            consume_queues_rebuilt=rebuild,
            cq_entries_dropped=dropped_entries,
            seconds=time.monotonic() - started,
        )
        log.info(
            "store recovered crashed=%s commit_log=[%d,%d) scanned_from=%d dropped_bytes=%d "
            "dispatched_from=%d rebuilt=%s cq_entries_dropped=%d in %.2fs",
            crashed,
            self.commit_log.min_offset,
            end,
            scan.scanned_from,
            scan.dropped_bytes,
            dispatch_from,
            rebuild,
            dropped_entries,
            report.seconds,
        )
        return report

    async def start(self) -> None:
        """Start the dispatcher and flusher tasks."""
        self._flush_wake = asyncio.Event()
        self.dispatcher._wake = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self.dispatcher.run(), name="dispatcher"),
            asyncio.create_task(self._flush_loop(), name="flusher"),
        ]

    async def stop(self) -> None:
        """Stop background tasks, make everything durable, write the checkpoint
        and remove the abort marker (a clean shutdown)."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if not self._opened:
            return
        self.dispatcher.dispatch_all()
        snapshot = self._durable_snapshot()
        await asyncio.to_thread(sync_fds, snapshot[2])
        self._flushed_offset = snapshot[0]
        self._write_checkpoint_now(snapshot)
        self._release_flush_waiters()
        for futures in self._long_polls.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)
        self._long_polls.clear()
        self.commit_log.close()
        self.queues.close()
        with contextlib.suppress(FileNotFoundError):
            (self.config.root / ABORT).unlink()
        self._opened = False
        log.info("store closed cleanly at commit offset %d", snapshot[0])

    def set_store_host(self, host: tuple[str, int]) -> None:
        """The advertised address stored in records and message ids (known once
        the gRPC server has bound its port)."""
        self._store_host = record.pack_host(host)
        self._msg_id_prefix = record.message_id(host, 0)[:16]

    # ------------------------------------------------------------ state

    @property
    def min_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def max_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    @property
    def confirm_offset(self) -> int:
        """The highest commit offset consumers may see (SPEC §3.4)."""
        if self.confirm_offset_fn is not None:
            return min(self.confirm_offset_fn(), self.max_offset)
        return self.max_offset

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue else 0

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue else 0

    # ------------------------------------------------------------ writes

    async def put(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], wait_flush: bool = True
    ) -> PutResult:
        """Append messages to one queue as one contiguous unit. With SYNC_FLUSH
        and `wait_flush`, return once their bytes are fsynced (group commit),
        or with FLUSH_DISK_TIMEOUT after `sync_flush_timeout_s`."""
        result = self._append(topic, queue_id, messages)
        if (
            self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            and wait_flush
            and not await self.wait_flushed(result.end_offset, self.config.sync_flush_timeout_s)
        ):
            return dataclasses.replace(result, status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    def _append(self, topic: str, queue_id: int, messages: Sequence[MessageIn]) -> PutResult:
        if not self._opened:
            raise RuntimeError("the store is not open")
        key = (topic, queue_id)
        first_queue_offset = self._next_queue_offset.get(key, 0)
        topic_bytes = topic.encode()
        store_ts = self.clock.wall_ms()
        store_host = self._store_host
        items = []
        for i, m in enumerate(messages):
            size = record.encoded_size(len(topic_bytes), len(m.body), len(m.properties))
            items.append(
                (
                    size,
                    _encoder(
                        topic_bytes, queue_id, first_queue_offset + i, m, store_ts, store_host
                    ),
                )
            )
        try:
            offsets = self.commit_log.append_many(items)
        except OSError as exc:
            raise _write_failure(exc, self.config.root) from exc
        self._next_queue_offset[key] = first_queue_offset + len(messages)
        end = self.commit_log.max_offset
        self.put_message_count += len(messages)
        self.dispatcher.wake()
        if self.on_append is not None:
            self.on_append(end)
        prefix = self._msg_id_prefix
        return PutResult(
            PutStatus.PUT_OK,
            topic,
            queue_id,
            first_queue_offset,
            offsets,
            [f"{prefix}{o:016X}" for o in offsets],
            end,
            store_ts,
        )

    def append_raw(self, commit_offset: int, data: bytes) -> int:
        """A slave's replicated bytes, appended as they are at `commit_offset`,
        which must be the log's end — or, for an empty log, the start of a file
        (the master's choice). Returns the new end."""
        if not self._opened:
            raise RuntimeError("the store is not open")
        log_ = self.commit_log
        if commit_offset != log_.max_offset:
            if log_.segment_starts() or self.queues.all():
                raise ValueError(f"bytes at {commit_offset}, but the log ends at {log_.max_offset}")
            log_.start_at(commit_offset)
            self.dispatcher.offset = commit_offset
        end = log_.append_raw(data)
        self.dispatcher.wake()
        return end

    def discard_all(self, start_offset: int) -> None:
        """Drop the whole log and every consume queue and start empty at
        `start_offset` (a slave whose offset fell out of its master's retention)."""
        self.commit_log.discard_all()
        for queue in self.queues.all():
            self.queues.delete_topic(queue.topic)
        self._next_queue_offset.clear()
        self.commit_log.start_at(start_offset)
        self.dispatcher.offset = start_offset
        self._flushed_offset = start_offset
        self._checkpoint_written = (0, 0)
        self._write_checkpoint_now((start_offset, start_offset, []))
        log.warning("store discarded: empty, starting at commit offset %d", start_offset)

    # ------------------------------------------------------------ flushing

    async def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Wait until the commit log is fsynced up to `offset`; False on timeout."""
        if self._flushed_offset >= offset:
            return True
        future = asyncio.get_running_loop().create_future()
        bisect.insort(self._flush_waiters, _FlushWaiter(offset, future))
        if self._flush_wake is not None:
            self._flush_wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
            return True
        except TimeoutError:
            return False

    async def _flush_loop(self) -> None:
        """ASYNC_FLUSH: flush every `flush_interval_s`. SYNC_FLUSH: flush as soon as
        a waiter asks, sharing one fsync among all waiting sends (group commit);
        also every interval, for the consume queues and the checkpoint."""
        assert self._flush_wake is not None
        interval = self.config.flush_interval_s
        last_checkpoint = time.monotonic()
        checkpoint_failing = False
        while True:
            await wait_event(self._flush_wake, interval)
            self._flush_wake.clear()
            now = time.monotonic()
            full = now - last_checkpoint >= interval
            try:
                if full:
                    snapshot = self._durable_snapshot()
                    await asyncio.to_thread(sync_fds, snapshot[2])
                    self._flushed_offset = max(self._flushed_offset, snapshot[0])
                    self._release_flush_waiters()
                    last_checkpoint = now
                    checkpoint_failing = await self._checkpoint(snapshot, checkpoint_failing)
                elif self._flush_waiters:
                    target = self.commit_log.max_offset
                    fds = self.commit_log.take_dirty()
                    await asyncio.to_thread(sync_fds, fds)
                    self._flushed_offset = max(self._flushed_offset, target)
                    self._release_flush_waiters()
            except OSError as exc:
                log.error("flush failed: %s; retrying", exc)
                await asyncio.sleep(interval)

    def _durable_snapshot(self) -> tuple[int, int, list[int]]:
        """(commit offset, dispatched offset, files to fsync) at this instant."""
        return (
            self.commit_log.max_offset,
            self.dispatcher.offset,
            self.commit_log.take_dirty() + self.queues.take_dirty(),
        )

    async def _checkpoint(self, snapshot: tuple[int, int, list[int]], failing: bool) -> bool:
        """Write the checkpoint; True while it cannot be written (a full disk).
        Its failure does not hold back commit-log flushes, only how far a
        recovery after a crash must scan."""
        try:
            await asyncio.to_thread(self._write_checkpoint_now, snapshot)
        except OSError as exc:
            if not failing:
                log.error(
                    "cannot write the checkpoint: %s; a recovery would scan from the last one "
                    "written; retrying every %.1f s",
                    exc,
                    self.config.flush_interval_s,
                )
            return True
        if failing:
            log.info("checkpoint written again")
        return False

    def _write_checkpoint_now(self, snapshot: tuple[int, int, list[int]]) -> None:
        """Write the checkpoint (from the flusher's thread or at stop: serialised)."""
        now = self.clock.wall_ms()
        with self._checkpoint_lock:
            if snapshot[:2] < self._checkpoint_written:
                return  # a late flusher thread: never move the checkpoint back
            self._checkpoint_written = snapshot[:2]
            save_checkpoint(
                self.config.root / CHECKPOINT,
                Checkpoint(
                    flushed_offset=snapshot[0],
                    dispatched_offset=snapshot[1],
                    physic_msg_timestamp=now,
                    logics_msg_timestamp=now,
                ),
            )

    def _release_flush_waiters(self) -> None:
        flushed = self._flushed_offset
        waiters = self._flush_waiters
        released = 0
        while released < len(waiters) and waiters[released].offset <= flushed:
            future = waiters[released].future
            if not future.done():
                future.set_result(True)
            released += 1
        del waiters[:released]

    # ------------------------------------------------------------ reads

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        tag_hashes: frozenset[int] | None = None,
    ) -> GetResult:
        """Up to `max_count` records from a queue, starting at `queue_offset`,
        only those below the confirm offset; `tag_hashes` filters by tags."""
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            status = GetStatus.NO_NEW_MSG if queue_offset == 0 else GetStatus.OFFSET_ILLEGAL
            return GetResult(status, [], 0, 0, 0)
        low, high = queue.min_offset, queue.max_offset
        if queue_offset < low:
            return GetResult(GetStatus.OFFSET_MOVED, [], low, low, high)
        if queue_offset > high:
            return GetResult(GetStatus.OFFSET_ILLEGAL, [], high, low, high)
        if queue_offset == high:
            return GetResult(GetStatus.NO_NEW_MSG, [], queue_offset, low, high)
        confirm = self.confirm_offset
        entries = queue.entries(queue_offset, max_count)
        found: list[record.StoredMessage] = []
        decode = record.decode_stored
        next_offset = queue_offset
        budget = self.config.max_pull_bytes
        spans = _spans(entries, self.commit_log.file_size)
        for span_start, span_end, span_entries in spans:
            if span_entries[0][0] + span_entries[0][1] > confirm:
                break
            data = self.commit_log.read(span_start, span_end - span_start)
            stop = False
            for commit_offset, size, code in span_entries:
                if commit_offset + size > confirm or (budget < size and found):
                    stop = True
                    break
                next_offset += 1
                if tag_hashes is not None and code not in tag_hashes:
                    continue
                found.append(decode(data, commit_offset - span_start, size))
                budget -= size
            if stop:
                break
        self.get_message_count += len(found)
        if found:
            return GetResult(GetStatus.FOUND, found, next_offset, low, high)
        if next_offset > queue_offset:
            return GetResult(GetStatus.NO_MATCHED_MSG, [], next_offset, low, high)
        return GetResult(GetStatus.NO_NEW_MSG, [], queue_offset, low, high)

    def read_record(self, commit_offset: int, size: int) -> record.Record:
        decoded = record.decode(self.commit_log.read(commit_offset, size), 0)
        if not isinstance(decoded, record.Record):
            raise record.RecordError(f"commit offset {commit_offset} holds a BLANK marker")
        return decoded

    async def wait_for_messages(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> None:
        """Long polling: return when the queue has a message at `queue_offset`
        that consumers may see, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        key = (topic, queue_id)
        loop = asyncio.get_running_loop()
        while self._opened:
            if self._visible_max(topic, queue_id) > queue_offset:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            future = loop.create_future()
            self._long_polls.setdefault(key, []).append(future)
            try:
                async with asyncio.timeout(min(remaining, 1.0)):
                    await future
            except TimeoutError:
                pass
            finally:
                waiters = self._long_polls.get(key)
                if waiters and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._long_polls[key]

    def notify_confirmed(self) -> None:
        """The confirm offset moved (HA): wake every long poll to re-check."""
        self._on_dispatch(set(self._long_polls))

    def _visible_max(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        if queue is None or queue.max_offset == queue.min_offset:
            return queue.max_offset if queue else 0
        if self.confirm_offset_fn is None:
            return queue.max_offset
        confirm = self.confirm_offset
        offset, size, _ = queue.entry(queue.max_offset - 1)
        if offset + size <= confirm:
            return queue.max_offset
        return queue.max_offset - 1  # not all visible: let the reader re-check

    def _on_dispatch(self, keys: set[tuple[str, int]]) -> None:
        for key in keys:
            futures = self._long_polls.pop(key, None)
            if futures:
                for future in futures:
                    if not future.done():
                        future.set_result(None)

    # ------------------------------------------------------------ topics

    def delete_topic(self, topic: str) -> None:
        """Drop a topic's consume queues (its records stay in the commit log)."""
        self.queues.delete_topic(topic)
        for key in [k for k in self._next_queue_offset if k[0] == topic]:
            del self._next_queue_offset[key]

    def queue_offsets_of(self, topic: str) -> Mapping[int, tuple[int, int]]:
        return {q.queue_id: (q.min_offset, q.max_offset) for q in self.queues.of_topic(topic)}


def _encoder(
    topic: bytes, queue_id: int, queue_offset: int, m: MessageIn, store_ts: int, store_host: bytes
) -> Callable[[int], bytes]:
    def encode(commit_offset: int) -> bytes:
        return record.encode_raw(
            topic, queue_id, m.flag, queue_offset, commit_offset, m.sys_flag, m.born_timestamp,
            m.born_host, store_ts, store_host, m.body, m.properties,
        )  # fmt: skip

    return encode


def _spans(
    entries: list[tuple[int, int, int]],
    file_size: int,
    max_gap: int = 64 << 10,
    max_span: int = 4 << 20,
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Group consume-queue entries into commit-log ranges read with one pread
    each: entries close together (and in one file) share a read."""
    spans: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    for entry in entries:
        offset, size, _ = entry
        if spans:
            start, end, group = spans[-1]
            if (
                0 <= offset - end <= max_gap
                and offset + size - start <= max_span
                and offset // file_size == start // file_size
            ):
                spans[-1] = (start, offset + size, group)
                group.append(entry)
                continue
        spans.append((offset, offset + size, [entry]))
    return spans


def _write_failure(exc: OSError, root: Path) -> FerryError:
    """What a producer is told when the commit log cannot take its messages.
    Nothing already stored is touched: the log's end did not move, and the next
    append writes over whatever part of this one reached the file."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.error("commit log write refused, the disk is full: %s", exc)
        return ResourceExhausted(
            f"the broker's disk is full ({exc.strerror}: {exc.filename or root}); the "
            "message was not stored and nothing stored before is affected; free space "
            f"under {root} (storePathRootDir) and send again"
        )
    log.error("commit log write failed: %s", exc)
    return Unavailable(
        f"the broker could not write its commit log ({exc}); the message was not stored; "
        "see the broker's log"
    )
