"""The store's reads: records by queue offset (pulls, pops), by commit offset, by
key and by store time, and what consumers may see of them (the confirm offset).

Owns: MessageReads, the read-side types (GetStatus, GetResult, QueueView), the
store-time cache of the statistics codes and the count of records read. Reads
take what they need from the commit log, the consume queues, the message index
and the cold-read threads (`reader.py`); MessageStore hands them over and
delegates to them, so callers keep using the store's own methods.

Must never: write anything — no commit-log append, no consume-queue entry, no
index entry, no checkpoint; make the loop wait on the disk (a read that is not
in the page cache goes to `LogReader`'s threads; `read_record` alone reads
synchronously, for a caller that asks it to); answer from a closed store
(`check_open`). The appends live in `message_store.py`; the store tells this
module only that it opened or closed (`opened`, `closed`) and that records were
cut (`forget_store_times`).

Ownership and concurrency: the event loop thread, like the rest of the store.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferry import record
from ferry.runtime.errors import FailedPrecondition, Unavailable
from services.broker.store.commitlog import CommitLog, CommitLogError
from services.broker.store.consumequeue import ConsumeQueues
from services.broker.store.index import KeyLookup, MessageIndex, carries_key
from services.broker.store.reader import LogReader

log = logging.getLogger(__name__)
# Store times of records kept for the statistics codes (RocketMQ protocol 202/208).
STORE_TIME_CACHE = 65_536


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"  # queue_offset == max (nothing yet)
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # entries exist, none matched the tags
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # past the max offset
    OFFSET_MOVED = "OFFSET_MOVED"  # below the min offset


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class GetResult:
    status: GetStatus
    records: list[record.StoredMessage]  # decoded (empty when read `raw`)
    next_begin_offset: int
    min_offset: int
    max_offset: int
    # Read `raw`: the records found, as stored, back to back (RocketMQ's pull
    # body), and how many there are.
    raw: bytes = b""
    raw_count: int = 0
    last_commit_offset: int = -1  # of the last record found; -1 when none


# Entries a pull with an SQL92 selector looks at for its messages (Apache looks
# at up to 16,000 bytes of consume queue, 800 entries).
SELECTED_SCAN = 800


class Selects(Protocol):
    """What a pull filters records by besides tags: a compiled SQL92 selector,
    which reads the properties `names` of a record and nothing else."""

    @property
    def names(self) -> tuple[str, ...]: ...

    def matches_values(self, values: tuple[str | None, ...]) -> bool: ...


class QueueView(Protocol):
    """A consume queue as its readers see it: offsets and entries, never writes.
    An entry is (commit offset, size, tag hash or due time)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def entry(self, queue_offset: int) -> tuple[int, int, int]: ...

    def entries(
        self, queue_offset: int, max_count: int, limit: int | None = None
    ) -> list[tuple[int, int, int]]: ...


class MessageReads:
    """The reads of one MessageStore, over its parts (built by the store)."""

    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        reader: LogReader,
        index: MessageIndex | None,
        *,
        confirmed: Callable[[], int] | None,
        max_pull_bytes: int,
        max_query_num: int,
    ) -> None:
        """`confirmed`: the offset replicas confirmed, when consumers may see
        only that far (the store's own `confirmed`); `max_pull_bytes` and
        `max_query_num` as StoreConfig and IndexConfig say."""
        self._log = commit_log
        self._queues = queues
        self._reader = reader
        self._index = index
        self._confirmed = confirmed
        self.confirmed_only = confirmed is not None  # consumers see only confirmed records
        self._max_pull_bytes = max_pull_bytes
        self._max_query_num = max_query_num
        self._opened = False
        # commit offset -> store time of the record there (statistics read the same few
        # records again and again); emptied when records are cut or the log restarts.
        self._store_times: dict[int, int] = {}
        self.get_message_count = 0
        # Reads (`get_messages` calls) that found messages and that found none, as
        # Apache's StoreStatsService counts getMessage calls (getFoundTps, getMissTps).
        self.found_reads = 0
        self.missed_reads = 0

    def opened(self) -> None:
        """The store is open (recovered): reads are answered."""
        self._opened = True

    def closed(self) -> None:
        """The store closed: reads are refused (`check_open`)."""
        self._opened = False

    def forget_store_times(self) -> None:
        """Records were cut or the log restarted: cached store times may be wrong."""
        self._store_times.clear()

    @property
    def confirm_offset(self) -> int:
        """The highest commit offset consumers may see (docs/guides/replication.md,
        "SYNC_MASTER")."""
        if self._confirmed is not None:
            return min(self._confirmed(), self._log.max_offset)
        return self._log.max_offset

    async def read_full(self, commit_offset: int, size: int | None = None) -> record.Record | None:
        """The whole record at `commit_offset` (of `size` bytes; None: as its
        head says), every field (sysflag, PREPAREDTRANSACTIONOFFSET, the body
        as stored), read off the loop when cold; None when it is not there
        (deleted, past the end, or not a record start)."""
        self.check_open()
        if not self._log.min_offset <= commit_offset <= self._log.max_offset - record.BLANK_SIZE:
            return None
        try:
            if size is None:
                head = record.peek(await self._reader.read(commit_offset, record.BLANK_SIZE))
                if isinstance(head, record.Blank):
                    return None
                size = head
            if size > self._log.max_offset - commit_offset:
                return None
            data = await self._reader.read(commit_offset, size)
            decoded = record.decode(bytes(data), 0, check_crc=False)
        except (record.RecordError, CommitLogError, OSError):
            return None
        if not isinstance(decoded, record.Record) or decoded.commit_offset != commit_offset:
            return None
        return decoded

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        tag_hashes: frozenset[int] | None = None,
        raw: bool = False,
        max_bytes: int | None = None,
        selector: Selects | None = None,
    ) -> GetResult:
        """Up to `max_count` records from a queue, starting at `queue_offset`,
        only those below the confirm offset; `tag_hashes` filters by tags,
        `selector` by each record's properties (an SQL92 selector: up to
        SELECTED_SCAN entries are looked at for `max_count` that match).
        `raw`: the records' bytes as stored (`GetResult.raw`) instead of
        decoded ones. `max_bytes` lowers the byte budget (maxPullBytes): the
        first record is returned whatever its size, later ones while they fit.

        Raises:
            Unavailable: the store is closed (see `check_open`).
        """
        self.check_open()
        queue = self._queues.get(topic, queue_id)
        if queue is None:
            status = GetStatus.NO_NEW_MSG if queue_offset == 0 else GetStatus.OFFSET_ILLEGAL
            return self._missed(GetResult(status, [], 0, 0, 0))
        low, high = queue.min_offset, queue.max_offset
        if queue_offset < low:
            return self._missed(GetResult(GetStatus.OFFSET_MOVED, [], low, low, high))
        if queue_offset > high:
            return self._missed(GetResult(GetStatus.OFFSET_ILLEGAL, [], high, low, high))
        if queue_offset == high:
            return self._missed(GetResult(GetStatus.NO_NEW_MSG, [], queue_offset, low, high))
        if selector is not None:
            return await self._get_selected(
                queue, queue_offset, max_count, tag_hashes, selector, raw, max_bytes
            )
        confirm = self.confirm_offset
        entries = queue.entries(queue_offset, max_count)
        found: list[record.StoredMessage] = []
        pieces: list[bytes] = []  # raw: the records of each span read
        raw_count = 0
        last_commit_offset = -1
        decode = record.decode_stored
        next_offset = queue_offset
        budget = self._max_pull_bytes
        if max_bytes is not None:
            budget = min(budget, max_bytes)
        spans = _spans(entries, self._log.file_size, max_span=budget)
        for span_start, span_end, span_entries in spans:
            if span_entries[0][0] + span_entries[0][1] > confirm:
                break
            if span_start < self._log.min_offset:
                break  # deleted by retention meanwhile: the next pull is told OFFSET_MOVED
            if (found or raw_count) and span_entries[0][1] > budget:
                break  # full: not one more record fits
            data = await self._reader.read(span_start, span_end - span_start)
            if raw:  # the records as stored: one walk (native when built)
                chunk, taken, kept, last, budget, stop = record.gather_records(
                    data, span_start, span_entries, confirm, budget, raw_count > 0, tag_hashes
                )
                next_offset += taken
                if kept:
                    pieces.append(chunk)
                    raw_count += kept
                    last_commit_offset = last
                if stop:
                    break
                continue
            stop = False
            for commit_offset, size, code in span_entries:
                if commit_offset + size > confirm or (budget < size and found):
                    stop = True
                    break
                next_offset += 1
                if tag_hashes is not None and code not in tag_hashes:
                    continue
                found.append(decode(data, commit_offset - span_start, size))
                last_commit_offset = commit_offset
                budget -= size
            if stop:
                break
        return await self._answer(
            queue_offset, next_offset, low, high, found, pieces, raw_count, last_commit_offset
        )

    async def _get_selected(
        self,
        queue: QueueView,
        queue_offset: int,
        max_count: int,
        tag_hashes: frozenset[int] | None,
        selector: Selects,
        raw: bool,
        max_bytes: int | None,
    ) -> GetResult:
        """`get_messages` with a selector over each record's properties: the
        entries from `queue_offset` (at most SELECTED_SCAN of them) until
        `max_count` records matched. A record that does not match is passed
        over, as one whose tags do not.

        The entries are taken in batches, the first of twice `max_count` (at
        least 64), each next one twice the last: a pull whose selector keeps
        one message in two reads about what it returns, not SELECTED_SCAN
        entries' worth of the log each time."""
        low, high = queue.min_offset, queue.max_offset
        confirm = self.confirm_offset
        found: list[record.StoredMessage] = []
        pieces: list[bytes] = []
        last_commit_offset = -1
        next_offset = queue_offset
        budget = self._max_pull_bytes if max_bytes is None else min(self._max_pull_bytes, max_bytes)
        property_values, decode = record.property_values, record.decode_stored
        names, matches = selector.names, selector.matches_values
        scan = max(max_count, SELECTED_SCAN)
        step = max(2 * max_count, 64)
        full = False
        while not full and next_offset - queue_offset < scan:
            entries = queue.entries(next_offset, min(step, scan - (next_offset - queue_offset)))
            if not entries:
                break
            step *= 2
            for span_start, span_end, span_entries in _spans(
                entries, self._log.file_size, max_span=self._max_pull_bytes
            ):
                if span_entries[0][0] + span_entries[0][1] > confirm:
                    full = True
                    break
                if span_start < self._log.min_offset:
                    full = True
                    break  # deleted by retention meanwhile: the next pull is told OFFSET_MOVED
                data = await self._reader.read(span_start, span_end - span_start)
                # The values the selector reads, of the confirmed records whose tags
                # pass: one walk over the span (native when built), then one
                # evaluation per distinct combination of values (the selector
                # remembers its answers).
                values = iter(
                    property_values(
                        data,
                        span_start,
                        [
                            entry
                            for entry in span_entries
                            if entry[0] + entry[1] <= confirm
                            and (tag_hashes is None or entry[2] in tag_hashes)
                        ],
                        names,
                    )
                )
                for commit_offset, size, code in span_entries:
                    kept = len(pieces) if raw else len(found)
                    if commit_offset + size > confirm or (budget < size and kept):
                        full = True
                        break
                    next_offset += 1
                    if tag_hashes is not None and code not in tag_hashes:
                        continue
                    at = commit_offset - span_start
                    if not matches(next(values)):
                        continue
                    if raw:
                        pieces.append(bytes(data[at : at + size]))
                    else:
                        found.append(decode(data, at, size))
                    last_commit_offset = commit_offset
                    budget -= size
                    if kept + 1 >= max_count:
                        full = True
                        break
                if full:
                    break
        return await self._answer(
            queue_offset, next_offset, low, high, found, pieces, len(pieces), last_commit_offset
        )

    def _missed(self, result: GetResult) -> GetResult:
        self.missed_reads += 1
        return result

    async def _answer(
        self,
        queue_offset: int,
        next_offset: int,
        low: int,
        high: int,
        found: list[record.StoredMessage],
        pieces: list[bytes],
        raw_count: int,
        last_commit_offset: int,
    ) -> GetResult:
        """A read's answer from what it found (decoded records, or `raw_count`
        records as stored in `pieces`) and where it got to."""
        count = raw_count or len(found)
        self.get_message_count += count
        if count:
            self.found_reads += 1
            # One event-loop turn between reading the records and building the
            # answer from them: a send waiting meanwhile goes first.
            await asyncio.sleep(0)
            return GetResult(
                GetStatus.FOUND,
                found,
                next_offset,
                low,
                high,
                raw=b"".join(pieces),
                raw_count=raw_count,
                last_commit_offset=last_commit_offset,
            )
        self.missed_reads += 1
        if next_offset > queue_offset:
            return GetResult(GetStatus.NO_MATCHED_MSG, [], next_offset, low, high)
        return GetResult(GetStatus.NO_NEW_MSG, [], queue_offset, low, high)

    async def read_entries(
        self, entries: Sequence[tuple[int, int, int]]
    ) -> list[record.StoredMessage | None]:
        """The records consume-queue entries point at, in order (off the loop when
        cold); None for one that retention deleted meanwhile or that is unreadable."""
        self.check_open()
        out: list[record.StoredMessage | None] = []
        spans = _spans(list(entries), self._log.file_size, max_span=self._max_pull_bytes)
        for span_start, span_end, span_entries in spans:
            if span_start < self._log.min_offset:
                out.extend(None for _ in span_entries)
                continue
            data = await self._reader.read(span_start, span_end - span_start)
            for commit_offset, size, _ in span_entries:
                try:
                    out.append(record.decode_stored(data, commit_offset - span_start, size))
                except record.RecordError:
                    log.error(
                        "no readable record at commit offset %d (%d bytes)", commit_offset, size
                    )
                    out.append(None)
        return out

    def read_record(self, commit_offset: int, size: int) -> record.Record:
        """The record of `size` bytes at `commit_offset`, read on the loop and
        checked, CRC included (the delay scheduler's reads). RecordError when
        it is not a record."""
        decoded = record.decode(self._log.read(commit_offset, size), 0)
        if not isinstance(decoded, record.Record):
            raise record.RecordError(f"commit offset {commit_offset} holds a BLANK marker")
        return decoded

    async def records_as_stored(self, located: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """The records at these (commit offset, size) places as stored, in order, read
        in spans as `read_entries` reads (a pop's answer: records a pop has just
        decoded there); None for one that retention deleted meanwhile."""
        self.check_open()
        out: list[bytes | None] = []
        entries = [(offset, size, 0) for offset, size in located]
        spans = _spans(entries, self._log.file_size, max_span=self._max_pull_bytes)
        for span_start, span_end, span_entries in spans:
            if span_start < self._log.min_offset:
                out.extend(None for _ in span_entries)
                continue
            data = await self._reader.read(span_start, span_end - span_start)
            for commit_offset, size, _ in span_entries:
                at = commit_offset - span_start
                out.append(bytes(data[at : at + size]))
        return out

    async def record_bytes(self, commit_offset: int) -> bytes | None:
        """The whole record that starts at `commit_offset`, as stored, if one
        does and consumers may see it (below the confirm offset); else None."""
        low, visible = self._log.min_offset, self.confirm_offset
        if not low <= commit_offset <= visible - record.MIN_RECORD_SIZE:
            return None
        try:
            size = record.peek(await self._reader.read(commit_offset, record.BLANK_SIZE))
            if isinstance(size, record.Blank):
                return None
            if size > min(visible, self._log.file_end(commit_offset)) - commit_offset:
                return None
            data = bytes(await self._reader.read(commit_offset, size))
            stored = record.decode_stored(data, 0, size)
        except (record.RecordError, CommitLogError):
            return None  # not a record start (a lying offset), or deleted meanwhile
        return data if stored.commit_offset == commit_offset else None

    async def find_by_key(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique: bool = False,
    ) -> KeyLookup:
        """The records of `topic` stored in [begin_ms, end_ms] whose KEYS hold `key`
        (`unique`: whose UNIQ_KEY is `key`), the newest `max_num` of them (at most the
        index's `max_query_num`) in commit-offset order, each checked against the
        record itself; only records consumers may see.

        Raises:
            Unavailable: the store is closed.
            FailedPrecondition: the message index is off (messageIndexEnable=false).
        """
        self.check_open()
        if self._index is None:
            raise FailedPrecondition(
                "the message index is off on this broker (messageIndexEnable=false)"
            )
        limit = max(0, min(max_num, self._max_query_num))
        candidates = self._index.lookup(topic, key, begin_ms, end_ms, 2 * limit + 16)
        found: list[tuple[bytes, record.StoredMessage]] = []
        for commit_offset in candidates:
            if len(found) >= limit:
                break
            data = await self.record_bytes(commit_offset)
            if data is None:
                continue
            try:
                message = record.decode_stored(data, 0, len(data))
            except record.RecordError:
                continue
            if carries_key(message, topic, key, unique, begin_ms, end_ms):
                found.append((data, message))
        found.sort(key=lambda item: item[1].commit_offset)
        return KeyLookup(found, *self._index.last_update())

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, upper: bool = False
    ) -> int:
        """Binary search of a queue by store time (RocketMQ 5's boundary types):
        the first queue offset stored at or after `timestamp_ms`, or the max
        offset when none is; with `upper`, the last one stored at or before it,
        or the min offset when none is. Store times rise along a queue (one
        appender, one clock); an entry whose record retention deleted counts as
        older than any time."""
        self.check_open()
        queue = self._queues.get(topic, queue_id)
        if queue is None:
            return 0
        first, end = queue.min_offset, queue.max_offset
        low, high = first, end  # the answer (for `upper`: plus one) is in [low, high]
        while low < high:
            middle = (low + high) // 2
            stored = await self._store_time(queue, middle)
            if stored < timestamp_ms or (upper and stored == timestamp_ms):
                low = middle + 1
            else:
                high = middle
        return max(first, low - 1) if upper else low

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """The store time of a queue's first kept message; −1 if it has none."""
        self.check_open()
        queue = self._queues.get(topic, queue_id)
        if queue is None or queue.min_offset >= queue.max_offset:
            return -1
        return await self._store_time(queue, queue.min_offset)

    async def store_time_at(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """The store time of the message at `queue_offset`; −1 if the queue
        has none there (never written, deleted by retention, or not yet)."""
        self.check_open()
        queue = self._queues.get(topic, queue_id)
        if queue is None or not queue.min_offset <= queue_offset < queue.max_offset:
            return -1
        return await self._store_time(queue, queue_offset)

    async def _store_time(self, queue: QueueView, queue_offset: int) -> int:
        """The store time of one entry's record; −1 if it is gone or unreadable."""
        commit_offset, size, _ = queue.entry(queue_offset)
        if commit_offset < self._log.min_offset or size < record.STORE_TIMESTAMP_END:
            return -1
        known = self._store_times.get(commit_offset)
        if known is not None:
            return known
        try:
            head = await self._reader.read(commit_offset, record.STORE_TIMESTAMP_END)
            stored = record.store_timestamp(head)
        except (record.RecordError, CommitLogError):
            return -1
        if len(self._store_times) >= STORE_TIME_CACHE:
            self._store_times.clear()
        self._store_times[commit_offset] = stored
        return stored

    def check_open(self) -> None:
        """A closed store has no queues: a read that reached it after it closed
        (a long poll released by `stop`, a request the broker took just before
        it stopped or changed its role) must not answer as if a queue were
        empty, or a consumer would move its offset back to the queue's start.

        Raises:
            Unavailable: the store is closed; the reader retries (elsewhere).
        """
        if not self._opened:
            raise Unavailable(
                "the store is closed: the broker is stopping or changing its role; retry"
            )

    def visible_at(self, topic: str, queue_id: int, queue_offset: int) -> bool:
        """Whether a pull from `queue_offset` has something to answer now: a message
        consumers may see there, or an offset the reader must correct (below the
        queue's first). On a SYNC_MASTER the message at `queue_offset` itself must be
        confirmed: one past the confirm offset would be read as nothing, and a pull
        woken for it answers NOT_FOUND and comes straight back."""
        queue = self._queues.get(topic, queue_id)
        if queue is None or queue_offset >= queue.max_offset:
            return False
        if not self.confirmed_only or queue_offset < queue.min_offset:
            return True
        offset, size, _ = queue.entry(queue_offset)
        return offset + size <= self.confirm_offset


def _spans(
    entries: list[tuple[int, int, int]],
    file_size: int,
    max_span: int,
    max_gap: int = 64 << 10,
) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """Group consume-queue entries into commit-log ranges read with one pread
    each: entries close together (and in one file) share a read of at most
    `max_span` bytes (a single larger record is a span of its own). Lazy: a
    pull that has its fill stops asking, and nothing more is grouped or read."""
    start = end = 0
    group: list[tuple[int, int, int]] = []
    for entry in entries:
        offset, size, _ = entry
        if (
            group
            and 0 <= offset - end <= max_gap
            and offset + size - start <= max_span
            and offset // file_size == start // file_size
        ):
            end = offset + size
            group.append(entry)
            continue
        if group:
            yield start, end, group
        start, end, group = offset, offset + size, [entry]
    if group:
        yield start, end, group
