"""The message store: the commit log, its consume queues, recovery and the
appends — RocketMQ's DefaultMessageStore, without the broker around it.

Data flow: the appends encode records and write them to the commit log, one
entry point per kind of caller — `append_sends` (messages clients send),
`append_own` (the broker's own records: pop journal, retries, dead letters,
metadata changes, timer entries), `append_due` (messages accepted once and
coming due: the delay-level scheduler, transaction check copies; never refused
for space), `append_decisions` (the transaction service's decisions, several
queues in one append) and `append_replicated` (a slave's bytes from its HA
master, through `replica_log`). The dispatcher tails the commit log into the
consume queues and wakes long-polling readers (`longpoll.py`); the message
index tails it too, with its own offset (`index.py`); the flusher makes the log
and the queues durable and writes the checkpoint (`flush.py`); retention
deletes old files (`retention.py`). The reads (`reads.py`: pulls, records by
offset, by key and by time, the confirm offset) answer through the store's own
methods, which delegate to them. The HA data plane sees the store only through
`replica_log` (`replica_log.py`).

Ownership and concurrency: everything here runs on the event loop thread.
Work that may wait on the disk does not: fdatasync (the flusher), commit-log
reads that are not in the page cache (`reader.py` tries a non-blocking read
first and falls back to a reader thread), allocating the next commit-log file
(ahead of need, in a thread) and unlinking deleted files. A file read in a
thread is pinned so retention cannot close it under the read. The appenders
are `_append` (one queue) and `append_decisions` (several), both over
`_write_records`: they assign commit offsets and queue offsets and write
without awaiting in between, so appends are serialised and each batch is
contiguous. No other code writes the commit log.

Storage errors: a full disk refuses the write (RESOURCE_EXHAUSTED) and loses
nothing; any other failed write or sync trips `failstop` (`failstop.py`).
The store holds `storePathRootDir/lock` while open (`storelock.py`).

Must never: check topic configuration, permissions or queue choice (the
caller's job, `messaging/`; this module trusts its arguments), nor read
records itself (`reads.py` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ferry import record
from ferry.model import DELAY_LEVELS_S
from ferry.native import native as _native
from ferry.runtime.clock import Clock, wait_event
from ferry.runtime.errors import (
    FerryError,
    ResourceExhausted,
    StorageFault,
    Unavailable,
)
from ferry.runtime.tasks import cancel_and_wait
from services.broker.store.allocator import SegmentAllocator
from services.broker.store.checkpoint import ABORT, CHECKPOINT
from services.broker.store.commitlog import CommitLog, CommitLogError
from services.broker.store.consumequeue import ConsumeQueues
from services.broker.store.dispatcher import Dispatcher
from services.broker.store.failstop import FailStop, is_full_disk
from services.broker.store.flush import Flusher
from services.broker.store.index import IndexConfig, KeyLookup, MessageIndex
from services.broker.store.longpoll import LongPolls
from services.broker.store.reader import LogReader
from services.broker.store.reads import GetResult, MessageReads, QueueView, Selects
from services.broker.store.recovery import RecoveryReport, recover_store
from services.broker.store.replica_log import StoreReplicaLog
from services.broker.store.retention import (
    CleanResult,
    Retention,
    RetentionConfig,
    RetentionStatus,
    disk_used_ratio,
)
from services.broker.store.storelock import StoreLock

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
    # Bytes of messages one pull returns at most (RocketMQ's
    # maxTransferBytesOnMessageInMemory): an answer is built and serialised on
    # the event loop, so a large one stalls every send meanwhile.
    max_pull_bytes: int = 256 << 10
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    reader_threads: int = 4  # commit-log reads that would wait on the disk
    index: IndexConfig = field(default_factory=IndexConfig)  # the message index (index.py)

    @property
    def commit_log_dir(self) -> Path:
        return self.root / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.root / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class MessageIn:
    """One message to append (already validated)."""

    body: bytes
    properties: bytes  # encoded with `record.encode_properties`
    flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = record.pack_host(("127.0.0.1", 0))
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_offset: int = 0  # PREPAREDTRANSACTIONOFFSET: a committed transaction's half


def copy_message(
    message: record.StoredMessage,
    properties: Mapping[str, str],
    reconsume_times: int | None = None,
) -> MessageIn:
    """A stored message appended again (a timed delivery, a retry or a dead
    letter): its body, flag, birth and reconsume times, with new properties."""
    host, _, port = message.born_host.rpartition(":")
    try:
        born_host = record.pack_host((host or "127.0.0.1", int(port)))
    except (ValueError, OSError):
        born_host = record.pack_host(("127.0.0.1", 0))
    return MessageIn(
        body=message.body,
        properties=record.encode_properties(properties),
        flag=message.flag,
        born_timestamp=message.born_timestamp,
        born_host=born_host,
        reconsume_times=message.reconsume_times if reconsume_times is None else reconsume_times,
    )


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class PutResult:
    status: PutStatus
    topic: str
    queue_id: int
    queue_offset: int  # of the first message
    commit_offsets: list[int]
    id_prefix: str  # the store host's half of an offset message id
    end_offset: int  # commit offset just past the last record
    store_timestamp: int
    _msg_ids: list[str] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def msg_ids(self) -> list[str]:
        """The records' offset message ids, made when first asked: most of the
        broker's own appends (op records, pop checkpoints) never are."""
        ids = self._msg_ids
        if ids is None:
            prefix = self.id_prefix
            ids = self._msg_ids = [f"{prefix}{o:016X}" for o in self.commit_offsets]
        return ids


class MessageStore:
    """One broker's store. Constructing it takes `storePathRootDir/lock`
    (StoreLockedError when another process holds it); `stop` or `abandon`
    releases it."""

    def __init__(
        self,
        config: StoreConfig,
        clock: Clock,
        disk_ratio: Callable[[], float] | None = None,
        confirmed: Callable[[], int] | None = None,
    ) -> None:
        """`confirmed`: the offset replicas confirmed, when consumers may see
        only that far (a master with visibility `confirmed`; HA's ReplicaAcks)."""
        self.config = config
        self.clock = clock
        self.failstop = FailStop()
        # The lock first: a second broker on this store stops before it reads
        # or writes anything in it (the commit log lists and opens its files).
        self._lock: StoreLock | None = StoreLock.acquire(config.root)
        try:
            self.commit_log = CommitLog(
                config.commit_log_dir, config.commit_log_file_size, preallocate=config.preallocate
            )
        except BaseException:
            self._lock.release()
            raise
        self.queues = ConsumeQueues(config.consume_queue_dir, config.consume_queue_entries_per_file)
        self._dispatch_notified = 0  # the dispatcher's offset at its last step
        self.replica_log = StoreReplicaLog(self)
        self.dispatcher = Dispatcher(
            self.commit_log,
            self.queues,
            0,
            on_dispatch=self._dispatched,
            delay_levels_s=config.delay_levels_s,
            busy=self.replica_log.receiving_bulk,
            on_fault=self.failstop.trip,
        )
        self.flusher = Flusher(
            self.commit_log,
            self.queues,
            lambda: self.dispatcher.offset,
            config.root / CHECKPOINT,
            clock,
            config.flush_interval_s,
            self.failstop,
        )
        # The message index (None with messageIndexEnable=false).
        self.index = (
            MessageIndex(config.index_dir, self.commit_log, config.index, clock.wall_ms)
            if config.index.enabled
            else None
        )
        self.retention = Retention(
            config.retention,
            self.commit_log,
            self.queues,
            lambda: self.dispatcher.offset,
            clock,
            disk_ratio or partial(disk_used_ratio, config.root),
            after_delete=self.index.delete_below if self.index is not None else None,
        )
        self._store_host = record.pack_host(config.store_host)
        self._msg_id_prefix = record.message_id(config.store_host, 0)[:16]
        # Next queue offset per (topic, queue id): assigned by the appender.
        self._next_queue_offset: dict[tuple[str, int], int] = {}
        self.reader = LogReader(self.commit_log, config.reader_threads)
        self.reads = MessageReads(
            self.commit_log,
            self.queues,
            self.reader,
            self.index,
            confirmed=confirmed,
            max_pull_bytes=config.max_pull_bytes,
            max_query_num=config.index.max_query_num,
        )
        self.long_polls = LongPolls(self.reads.visible_at)
        self.allocator = SegmentAllocator(self.commit_log, config.preallocate, lambda: self._opened)
        # What `wait_for_growth` waits on: made by the first waiter, set and
        # dropped by the next append.
        self._grown: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `start` ran on
        self._follow_due = False  # `_follow` is scheduled for this turn
        self._dispatch_due = False  # an append of this turn wants its queues dispatched
        self._tasks: list[asyncio.Task] = []
        self._opened = False
        self.put_message_count = 0

    # ------------------------------------------------------------ lifecycle

    def open(self) -> RecoveryReport:
        """Recover the store (docs/guides/broker.md, "Recovery") and create the
        abort marker. Blocking: call it before serving (in a thread if a loop is
        running)."""
        started = time.monotonic()
        try:
            return self._recover(started)
        except BaseException:
            self.commit_log.close()
            self.queues.close()
            if self._lock is not None:
                self._lock.release()
            raise

    def _recover(self, started: float) -> RecoveryReport:
        report = recover_store(
            self.config.root, self.commit_log, self.queues, self.dispatcher, started
        )
        for queue in self.queues.all():
            self._next_queue_offset[(queue.topic, queue.queue_id)] = queue.max_offset
        if self.index is not None:
            self.index.load(report.crashed, report.end_offset)
        self.flusher.flushed_offset = report.end_offset
        self.flusher.write_checkpoint_now(self.flusher.snapshot())
        (self.config.root / ABORT).write_bytes(str(os.getpid()).encode())
        self._opened = True
        self.reads.opened()
        return report

    async def start(self) -> None:
        """Start the dispatcher, flusher, allocator and retention tasks."""
        self.reader.start()
        self._grown = None
        self._loop = asyncio.get_running_loop()
        self._follow_due = False  # a callback of an earlier loop never ran
        self._tasks = [
            asyncio.create_task(self.dispatcher.run(), name="dispatcher"),
            asyncio.create_task(self.flusher.run(), name="flusher"),
            asyncio.create_task(self.allocator.run(), name="commitlog-allocator"),
            asyncio.create_task(self.retention.run(), name="retention"),
        ]
        if self.index is not None:
            self._tasks.append(asyncio.create_task(self.index.run(), name="message-index"))

    async def stop(self) -> None:
        """Stop background tasks, make everything durable, write the checkpoint
        and remove the abort marker (a clean shutdown). After a storage fault,
        nothing is flushed and the abort marker stays: recovery runs next time."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        self._loop = None
        if not self._opened:
            return
        if self.failstop.tripped:
            self.abandon()
            return
        self.dispatcher.dispatch_all()
        try:
            await self.flusher.flush_now()
        except StorageFault as fault:
            self.failstop.trip(fault)
            self.abandon()
            return
        if self.index is not None:
            try:
                await self.index.flush()
            except OSError as exc:  # derived data, rebuilt from the log: not fatal
                log.warning("message index not fsynced at stop: %s", exc)
        self.long_polls.close()
        self._close_files()
        with contextlib.suppress(FileNotFoundError):
            (self.config.root / ABORT).unlink()
        log.info("store closed cleanly at commit offset %d", self.flusher.flushed_offset)

    def abandon(self) -> None:
        """Close the files and release the lock without flushing or touching
        the checkpoint and abort marker — what a crash leaves behind (after a
        storage fault; tests simulate crashes with it)."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self.long_polls.close()
        if self._opened:
            self._close_files()
            log.warning("store abandoned without a clean close: recovery runs at the next start")

    def _close_files(self) -> None:
        self._opened = False
        self.reads.closed()
        self.reader.close()
        self.commit_log.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def set_store_host(self, host: tuple[str, int]) -> None:
        """The advertised address stored in records and message ids (known once
        the gRPC server has bound its port)."""
        self._store_host = record.pack_host(host)
        self._store_host_addr = host
        self._msg_id_prefix = record.message_id(host, 0)[:16]

    @property
    def store_host(self) -> tuple[str, int]:
        """("ip", port) written into records as their store host."""
        return getattr(self, "_store_host_addr", self.config.store_host)

    @property
    def packed_store_host(self) -> bytes:
        """`store_host` as a record carries it (`record.pack_host`)."""
        return self._store_host

    # ------------------------------------------------------------ state

    @property
    def min_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def max_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def flushed_offset(self) -> int:
        return self.flusher.flushed_offset

    @property
    def confirm_offset(self) -> int:
        """The highest commit offset consumers may see (docs/guides/replication.md,
        "SYNC_MASTER")."""
        return self.reads.confirm_offset

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue else 0

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue else 0

    def queue_view(self, topic: str, queue_id: int) -> QueueView | None:
        """A queue's entries for the broker's own readers (pop, delay levels,
        timers, the metadata log), or None while it has never been written."""
        return self.queues.get(topic, queue_id)

    # ------------------------------------------------------------ appends
    # One entry point per kind of caller; each says whether the disk's warning
    # ratio refuses it. Underneath, `_append` (one queue) and
    # `append_decisions` (several) lay records out with `_write_records`, and
    # `_appended` wakes what follows the log. None of them awaits: appends are
    # serialised, and each batch is contiguous in the log.

    def append_sends(self, topic: str, queue_id: int, messages: Sequence[MessageIn]) -> PutResult:
        """Messages clients send (the send use case in messaging/, a consumer's
        send-back), at once, without waiting for a flush: the caller waits once
        for a run of them (`wait_stored`). Their queues are dispatched at once.

        Raises:
            ResourceExhausted: the disk is full or above the warning ratio.
            Unavailable: a storage fault.
        """
        self.retention.check_writable()
        return self._append(topic, queue_id, messages)

    def append_own(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], dispatch_now: bool = True
    ) -> PutResult:
        """Records the broker writes for itself (the pop journal, pop retries and
        dead letters, metadata changes, the timer's entries and deliveries), at
        once, without waiting for a flush (the caller decides: `wait_stored`,
        `wait_durable`).

        `dispatch_now=False` is for records no consumer waits for (the pop
        journal, read back only by a restart): their consume-queue entries are
        written at the dispatcher's next pass — with the next append that
        wakes it, or within its idle wait (0.2 s) — not in a turn of their own.
        The bytes are in the log, and go to slaves, at once either way.

        Raises:
            ResourceExhausted: the disk is full or above the warning ratio.
            Unavailable: a storage fault.
        """
        self.retention.check_writable()
        return self._append(topic, queue_id, messages, dispatch_now)

    def append_due(self, topic: str, queue_id: int, messages: Sequence[MessageIn]) -> PutResult:
        """Messages the broker already accepted once, coming due (the delay-level
        scheduler's deliveries, the transaction service's check copies of a
        half), at once: unlike `append_sends` this does not refuse above the
        disk warning ratio, since refusing would strand what was acknowledged.

        Raises:
            Unavailable: a storage fault.
        """
        return self._append(topic, queue_id, messages)

    def append_decisions(
        self,
        parts: Sequence[tuple[str, int, Sequence[MessageIn]]],
        check_space: bool = True,
    ) -> list[PutResult]:
        """The transaction service's decisions: records for several (topic,
        queue id) destinations (a committed message or a discarded half's copy,
        each with its op record) in one commit-log append, in the order given:
        a crash keeps a prefix of them, never a later one without an earlier
        one. One PutResult per part; a destination named twice gets
        consecutive queue offsets. `check_space=False` appends what the broker
        accepted already, as `append_due`.

        Raises:
            ResourceExhausted: (`check_space`) the disk is full or above the warning ratio.
            Unavailable: a storage fault.
        """
        if check_space:
            self.retention.check_writable()
        if not self._opened:
            raise Unavailable("the store is not open")
        self.failstop.check()
        store_ts = self.clock.wall_ms()
        next_offsets = self._next_queue_offset
        planned: dict[tuple[str, int], int] = {}
        records = []
        firsts = []
        for topic, queue_id, messages in parts:
            key = (topic, queue_id)
            first = planned.get(key, next_offsets.get(key, 0))
            firsts.append(first)
            planned[key] = first + len(messages)
            topic_bytes = topic.encode()
            records += [(topic_bytes, queue_id, first + i, m) for i, m in enumerate(messages)]
        files_before = self.commit_log.files_end
        offsets = self._write_records(records, store_ts)
        next_offsets.update(planned)
        end = self.commit_log.max_offset
        self.put_message_count += len(records)
        self._appended(files_before)
        prefix = self._msg_id_prefix
        results = []
        at = 0
        for (topic, queue_id, messages), first in zip(parts, firsts, strict=True):
            mine = offsets[at : at + len(messages)]
            at += len(messages)
            results.append(
                PutResult(
                    PutStatus.PUT_OK,
                    topic,
                    queue_id,
                    first,
                    mine,
                    prefix,
                    end,
                    store_ts,
                )
            )
        return results

    def append_replicated(self, commit_offset: int, data: bytes | memoryview) -> int:
        """Bytes the HA master replicated to this slave (through `replica_log`),
        appended as they are at `commit_offset`, which must be the log's end —
        or, for an empty log, the start of a file (the master's choice). Returns
        the new end. The dispatcher builds the consume queues from them.

        Raises:
            ValueError: the offset is not where the bytes can go.
            OSError: not written (a full disk; any other error also trips fail-stop).
        """
        if not self._opened:
            raise ValueError("the store is not open")
        self.failstop.check()
        log_ = self.commit_log
        if commit_offset != log_.max_offset:
            if log_.segment_starts() or self.queues.all():
                raise ValueError(f"bytes at {commit_offset}, but the log ends at {log_.max_offset}")
            try:
                log_.start_at(commit_offset)
            except CommitLogError as exc:
                raise ValueError(str(exc)) from None
            self.dispatcher.offset = commit_offset
        files_before = log_.files_end
        try:
            end = log_.append_raw(data)
        except CommitLogError as exc:
            raise ValueError(str(exc)) from None
        except OSError as exc:
            if not is_full_disk(exc):
                self.failstop.trip(StorageFault("pwrite", str(exc.filename or log_.directory), exc))
            raise
        self._appended(files_before)
        return end

    async def put(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], wait_flush: bool = True
    ) -> PutResult:
        """One send from start to end, for tools and tests: `append_sends`, then
        `wait_stored`; FLUSH_DISK_TIMEOUT if the flush timed out. (The broker's
        send use case stages many sends and waits once for all of them.)

        Raises:
            ResourceExhausted: the disk is full or above the warning ratio.
            Unavailable: a storage fault; nothing more is acknowledged.
        """
        result = self.append_sends(topic, queue_id, messages)
        if not await self.wait_stored(result.end_offset, wait_flush):
            result = dataclasses.replace(result, status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    def _append(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], dispatch_now: bool = True
    ) -> PutResult:
        """The appender of `append_sends`, `append_own` and `append_due`: one
        queue's records, queue offsets assigned here."""
        if not self._opened:
            raise Unavailable("the store is not open")
        self.failstop.check()
        key = (topic, queue_id)
        first_queue_offset = self._next_queue_offset.get(key, 0)
        topic_bytes = topic.encode()
        store_ts = self.clock.wall_ms()
        files_before = self.commit_log.files_end
        offsets = self._write_records(
            [(topic_bytes, queue_id, first_queue_offset + i, m) for i, m in enumerate(messages)],
            store_ts,
        )
        self._next_queue_offset[key] = first_queue_offset + len(messages)
        end = self.commit_log.max_offset
        self.put_message_count += len(messages)
        self._appended(files_before, dispatch_now)
        return PutResult(
            PutStatus.PUT_OK,
            topic,
            queue_id,
            first_queue_offset,
            offsets,
            self._msg_id_prefix,
            end,
            store_ts,
        )

    def _write_records(
        self, records: list[tuple[bytes, int, int, MessageIn]], store_ts: int
    ) -> list[int]:
        """Append (topic bytes, queue id, queue offset, message) records to the
        commit log in one write per file; their commit offsets. Laid out by
        ferry_native's `encode_records` when built and sure of them, else by
        `CommitLog.append_many` with `record.encode_raw` (the same bytes).

        Raises:
            RecordError: a record too large for a file (nothing written).
            Unavailable, ResourceExhausted: as `_write_failure`.
        """
        log_ = self.commit_log
        store_host = self._store_host
        try:
            if _native is not None:
                laid_out = _native.encode_records(
                    records, log_.max_offset, log_.file_size, store_ts, store_host
                )
                if laid_out is not None:
                    chunks, offsets = laid_out
                    log_.write_chunks(chunks)
                    return offsets
            return log_.append_many(
                [
                    (
                        record.encoded_size(len(t), len(m.body), len(m.properties)),
                        _encoder(t, q, o, m, store_ts, store_host),
                    )
                    for t, q, o, m in records
                ]
            )
        except OSError as exc:
            raise self._write_failure(exc) from exc

    def _write_failure(self, exc: OSError) -> FerryError:
        """What a producer is told when the commit log cannot take its messages.
        Nothing already stored is touched: the log's end did not move, and the
        next append writes over whatever part of this one reached the file."""
        root = self.config.root
        if is_full_disk(exc):
            log.error("commit log write refused, the disk is full: %s", exc)
            return ResourceExhausted(
                f"the broker's disk is full ({exc.strerror}: {exc.filename or root}); the "
                "message was not stored and nothing stored before is affected; free space "
                f"under {root} (storePathRootDir) and send again"
            )
        self.failstop.trip(
            StorageFault("pwrite", str(exc.filename or self.commit_log.directory), exc)
        )
        return self.failstop.refusal()

    def _appended(self, files_before: int, dispatch_now: bool = True) -> None:
        self._dispatch_due |= dispatch_now
        if self._loop is None:  # not started (recovery, tests): nothing runs to wake
            self._follow()
        elif not self._follow_due:
            self._follow_due = True
            self._loop.call_soon(self._follow)
        grown, self._grown = self._grown, None
        if grown is not None:
            grown.set()
        if self.commit_log.files_end != files_before:
            self.allocator.wake()  # a new file: allocate the next, run retention
            self.retention.wake()

    def _follow(self) -> None:
        """Once per loop turn that appended, after the appends: the dispatcher and
        the index take the new records (on this turn when they are caught up)."""
        self._follow_due = False
        if self._dispatch_due:
            self._dispatch_due = False
            self.dispatcher.follow()
        if self.index is not None:
            self.index.follow()

    # ------------------------------------------------------------ waits

    async def wait_stored(self, end_offset: int, wait_flush: bool = True) -> bool:
        """What an acknowledgement of appends up to `end_offset` waits for:
        with `wait_flush`, their flush (SYNC_FLUSH; False if it timed out);
        without, only that no storage fault has happened.

        Raises:
            Unavailable: a storage fault; nothing more is acknowledged.
        """
        if not wait_flush:
            self.failstop.check()
            return True
        return await self.wait_durable(end_offset)

    async def wait_durable(self, end_offset: int) -> bool:
        """With SYNC_FLUSH, wait until the log is fsynced up to `end_offset`
        (False after `sync_flush_timeout_s`); at once otherwise.

        Raises:
            Unavailable: a storage fault.
        """
        ok = True
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            ok = await self.flusher.wait_flushed(end_offset, self.config.sync_flush_timeout_s)
        self.failstop.check()
        return ok

    async def wait_for_growth(self, offset: int, timeout_s: float) -> bool:
        """True once the log ends past `offset`; False after `timeout_s`."""
        if self.max_offset > offset:
            return True
        grown = self._grown
        if grown is None:
            grown = self._grown = asyncio.Event()
        await wait_event(grown, timeout_s)
        return self.max_offset > offset

    # ------------------------------------------------------------ cutting the log

    def restart_at(self, start_offset: int) -> None:
        """Drop the whole log and every consume queue and start empty at
        `start_offset`, a file start (a slave whose offset fell out of its
        master's retention, or an empty slave starting where its master says)."""
        self.reads.forget_store_times()
        if self.commit_log.segment_starts() or self.queues.all():
            log.warning("store discarded: empty, starting at commit offset %d", start_offset)
        self.commit_log.discard_all()
        for queue in self.queues.all():
            self.queues.delete_topic(queue.topic)
        self._next_queue_offset.clear()
        self.commit_log.start_at(start_offset)
        self.dispatcher.offset = start_offset
        if self.index is not None:
            self.index.restart_at(start_offset)
        # Nothing is left to flush: everything up to the new start counts as
        # flushed (reset alone only ever moves the flushed offset back).
        self.flusher.flushed_offset = start_offset
        self.flusher.reset(start_offset, start_offset)

    async def truncate(self, offset: int) -> None:
        """Cut the log at `offset`, a record boundary in [min_offset, max_offset]:
        the commit log ends there (later bytes zeroed, later files deleted), the
        consume-queue entries pointing past it go, the next queue offsets follow,
        and the checkpoint never claims more than what is left. Durable before
        it returns (failover cuts a divergent tail with it).

        Raises:
            ValueError: `offset` is outside the log or not a record boundary.
        """
        self.reads.forget_store_times()
        log_ = self.commit_log
        if not log_.min_offset <= offset <= log_.max_offset:
            raise ValueError(
                f"cannot truncate at {offset}: the log holds [{log_.min_offset}, {log_.max_offset}]"
            )
        if offset < log_.max_offset:
            head = log_.read(offset, min(record.BLANK_SIZE, log_.max_offset - offset))
            try:
                record.peek(head)
            except record.RecordError as exc:
                raise ValueError(
                    f"cannot truncate at {offset}: not a record boundary ({exc})"
                ) from None
        async with self.flusher.paused():  # no sync in flight while the log is cut
            # Queues first up to the cut, so their ends are exact for what stays.
            self.dispatcher.dispatch_all(limit=offset)
            dropped = self.queues.truncate_commit_end(offset)
            log_.set_write_offset(offset)
            if self.index is not None:
                self.index.truncate(offset)
            for queue in self.queues.all():
                self._next_queue_offset[(queue.topic, queue.queue_id)] = queue.max_offset
            self.dispatcher.offset = min(self.dispatcher.offset, offset)
            # The flushed offset and checkpoint go back to the cut at once, then
            # forward again only with a sync that covers the cut (zeroed bytes).
            self.flusher.reset(offset, self.dispatcher.offset)
        try:
            await self.flusher.flush_now()
        except StorageFault as fault:
            self.failstop.trip(fault)
            raise
        self.allocator.wake()
        log.warning(
            "commit log truncated at %d (%d consume-queue entries dropped)", offset, dropped
        )

    # ------------------------------------------------------------ reads
    # MessageReads (reads.py) does them; the async ones hand back its own
    # coroutine, so a pull costs no second one.

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        tag_hashes: frozenset[int] | None = None,
        raw: bool = False,
        max_bytes: int | None = None,
        selector: Selects | None = None,
    ) -> Coroutine[Any, Any, GetResult]:
        """Up to `max_count` records of a queue from `queue_offset` that consumers
        may see (`MessageReads.get_messages`)."""
        return self.reads.get_messages(
            topic, queue_id, queue_offset, max_count, tag_hashes, raw, max_bytes, selector
        )

    def read_entries(
        self, entries: Sequence[tuple[int, int, int]]
    ) -> Coroutine[Any, Any, list[record.StoredMessage | None]]:
        """The records consume-queue entries point at (`MessageReads.read_entries`)."""
        return self.reads.read_entries(entries)

    def read_record(self, commit_offset: int, size: int) -> record.Record:
        """The record at `commit_offset`, read on the loop (`MessageReads.read_record`)."""
        return self.reads.read_record(commit_offset, size)

    def read_full(
        self, commit_offset: int, size: int | None = None
    ) -> Coroutine[Any, Any, record.Record | None]:
        """The whole record at `commit_offset`, or None (`MessageReads.read_full`)."""
        return self.reads.read_full(commit_offset, size)

    def records_as_stored(
        self, located: Sequence[tuple[int, int]]
    ) -> Coroutine[Any, Any, list[bytes | None]]:
        """Records by (commit offset, size), as stored (`MessageReads.records_as_stored`)."""
        return self.reads.records_as_stored(located)

    def record_bytes(self, commit_offset: int) -> Coroutine[Any, Any, bytes | None]:
        """The record at `commit_offset` as stored, if consumers may see it
        (`MessageReads.record_bytes`)."""
        return self.reads.record_bytes(commit_offset)

    def find_by_key(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique: bool = False,
    ) -> Coroutine[Any, Any, KeyLookup]:
        """The records of `topic` whose KEYS (or UNIQ_KEY) hold `key`, through
        the message index (`MessageReads.find_by_key`)."""
        return self.reads.find_by_key(topic, key, max_num, begin_ms, end_ms, unique)

    def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, upper: bool = False
    ) -> Coroutine[Any, Any, int]:
        """A queue offset by store time (`MessageReads.offset_by_time`)."""
        return self.reads.offset_by_time(topic, queue_id, timestamp_ms, upper)

    def earliest_store_time(self, topic: str, queue_id: int) -> Coroutine[Any, Any, int]:
        """The store time of a queue's first kept message; −1 if it has none."""
        return self.reads.earliest_store_time(topic, queue_id)

    def store_time_at(
        self, topic: str, queue_id: int, queue_offset: int
    ) -> Coroutine[Any, Any, int]:
        """The store time of the message at `queue_offset`; −1 if there is none."""
        return self.reads.store_time_at(topic, queue_id, queue_offset)

    @property
    def get_message_count(self) -> int:
        """Records handed out by `get_messages` since the store was built."""
        return self.reads.get_message_count

    @property
    def read_counts(self) -> tuple[int, int]:
        """(`get_messages` calls that found messages, calls that found none) since
        the store was built."""
        return self.reads.found_reads, self.reads.missed_reads

    # ------------------------------------------------------------ the message index

    async def wait_indexed(self) -> None:
        """Return once every record written is in the message index (tests, tools)."""
        while self.index is not None and self.index.behind_bytes > 0:
            self.failstop.check()
            self.index.wake()
            await asyncio.sleep(0.005)

    @property
    def index_behind_bytes(self) -> int:
        """Commit-log bytes not yet in the message index (0 when it is off)."""
        return self.index.behind_bytes if self.index is not None else 0

    @property
    def index_files(self) -> tuple[int, int]:
        """(files, bytes) of the message index (zeros when it is off)."""
        if self.index is None:
            return 0, 0
        return self.index.file_count, self.index.size_bytes

    # ------------------------------------------------------------ long polls

    async def wait_for_any(self, keys: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """Long polling over several queues: return when any of them may have
        something new, or after `timeout_s`."""
        await self.long_polls.wait_any(keys, timeout_s)

    def wake(self, keys: Iterable[tuple[str, int]]) -> None:
        """Wake the long polls of these queues to look again (something other
        than an append changed what they may hand out: an ack, a redelivery)."""
        self.long_polls.notify(keys)

    async def wait_for_messages(
        self, topic: str, queue_id: int, queue_offset: int, timeout_s: float
    ) -> None:
        """Long polling: return when the queue has a message at `queue_offset`
        that consumers may see, or after `timeout_s`."""
        if self._opened:
            await self.long_polls.wait(topic, queue_id, queue_offset, timeout_s)

    def notify_confirmed(self) -> None:
        """The confirm offset moved (HA): wake every long poll to re-check."""
        self.long_polls.notify_all()

    def _dispatched(self, keys: set[tuple[str, int]]) -> None:
        """The dispatcher wrote entries to these queues: wake their long polls,
        unless consumers see only confirmed records and none of the records of
        this step is confirmed yet (a SYNC_MASTER, the ack still to come):
        `notify_confirmed` wakes them once it comes, and waking them now only
        sends them back to wait (twice the wake-ups per pull)."""
        start, self._dispatch_notified = self._dispatch_notified, self.dispatcher.offset
        if self.reads.confirmed_only and self.reads.confirm_offset <= start:
            return
        self.long_polls.notify(keys)

    # ------------------------------------------------------------ for the layers above
    # What messaging, metadata, metrics and the app read of the store's parts:
    # none of them reaches into a part (tests/unit/test_wiring.py checks).

    @property
    def delay_levels_s(self) -> tuple[float, ...]:
        return self.config.delay_levels_s

    @property
    def max_pull_bytes(self) -> int:
        return self.config.max_pull_bytes

    @property
    def dispatched_offset(self) -> int:
        """Commit offset up to which records are in their consume queues."""
        return self.dispatcher.offset

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.behind_bytes

    async def wait_dispatched(self) -> None:
        """Return once every record written is in its consume queue (a
        recovered store may have a tail to dispatch).

        Raises:
            Unavailable: a storage fault (a dispatcher that cannot move).
        """
        while self.dispatcher.behind_bytes > 0:
            self.failstop.check()
            self.dispatcher.wake()
            await asyncio.sleep(0.005)

    @property
    def queue_count(self) -> int:
        """How many consume queues exist."""
        return len(self.queues)

    def queue_ends(self) -> list[tuple[str, int, int]]:
        """(topic, queue id, max queue offset) of every consume queue."""
        return [(q.topic, q.queue_id, q.max_offset) for q in self.queues.all()]

    @property
    def commit_log_files(self) -> int:
        return len(self.commit_log.segment_starts())

    def retention_status(self) -> RetentionStatus:
        return self.retention.status()

    async def clean_now(self) -> CleanResult:
        """One retention pass now, whatever the hour (deleteExpiredCommitLog)."""
        return await self.retention.clean_now()

    def hold_files(self, reason: str, lowest: Callable[[], int | None]) -> None:
        """Retention keeps every file from `lowest()` on (None: holds nothing);
        `reason` names the hold in the log when it keeps a file past its time."""
        self.retention.holds[reason] = lowest

    # ------------------------------------------------------------ topics

    def delete_topic(self, topic: str) -> None:
        """Drop a topic's consume queues (its records stay in the commit log)."""
        self.queues.delete_topic(topic)
        for key in [k for k in self._next_queue_offset if k[0] == topic]:
            del self._next_queue_offset[key]


def _encoder(
    topic: bytes, queue_id: int, queue_offset: int, m: MessageIn, store_ts: int, store_host: bytes
) -> Callable[[int], bytes]:
    def encode(commit_offset: int) -> bytes:
        return record.encode_raw(
            topic, queue_id, m.flag, queue_offset, commit_offset, m.sys_flag, m.born_timestamp,
            m.born_host, store_ts, store_host, m.body, m.properties, m.reconsume_times,
            m.prepared_offset,
        )  # fmt: skip

    return encode
