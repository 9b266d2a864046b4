"""The message index: RocketMQ's IndexService — every record's UNIQ_KEY and each word
of its KEYS, under the record's topic, in index files (`indexfile.py`) under
`<storeRoot>/index/`, so a message can be found by key or unique key.

**Its own tail of the commit log, not a dispatcher step.** The index keeps its own
commit offset and reads the log itself, on masters and slaves alike (a slave indexes
the bytes HA replicated). The dispatcher's consume queues and this index fail,
lag and recover apart: the index is dropped and rebuilt from the commit log after a
crash or a truncation while the consume queues are kept, a full disk or a bad
index file never holds consumers back, and the dispatcher's walk (the send path's
neighbour on the loop) carries no property parsing. The price is a second read of
each chunk, from the page cache; the build itself is one native call per chunk
(`ferry_native.index_records`), so it costs the loop little.

Which records: all but transaction rollbacks (sysflag bits 2-3 both set), keys as
`indexfile.index_keys` finds them. A file fills at `maxIndexNum` entries; it is then
fsynced (in a worker thread) before the next one is created, so every file but the
newest is durable — what recovery relies on.

- **Restart.** Indexing resumes at the newest file's last commit offset (that
  record's keys go in twice; lookups drop duplicates).
- **Crash** (the abort marker): the newest file may be torn and is dropped, and
  files holding offsets at or past the recovered end of the log too; what they held
  is indexed again from the commit log, in the background.
- **Truncation** (HA, failover): files holding offsets at or past the cut are
  dropped and rebuilt; lookups also never return offsets outside the log.
- **Retention**: a file goes once every offset it holds is below the commit log's
  first (never the newest file).

Ownership: everything runs on the event loop (`run` is the index task); the files'
mmaps are touched only there. Creating a file (it is preallocated) and fsyncing a
full one run in worker threads. Lookups read the mmaps on the loop: a lookup touches
a few pages per file.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ferry import record
from ferry.runtime.clock import Ticker
from services.broker.store.commitlog import CommitLog, CommitLogError
from services.broker.store.indexfile import (
    IndexFile,
    IndexFileError,
    build,
    file_name,
    file_size,
    is_file_name,
    key_hash,
    sync_and_close,
)

log = logging.getLogger(__name__)

STEP_BYTES = 1 << 20
IDLE_WAIT_S = 0.2


@dataclass(frozen=True)
class IndexConfig:
    enabled: bool = True  # messageIndexEnable
    max_hash_slot_num: int = 5_000_000  # maxHashSlotNum
    max_index_num: int = 20_000_000  # maxIndexNum
    max_query_num: int = 64  # maxMsgsNumBatch: offsets one lookup returns at most

    @property
    def file_size(self) -> int:
        return file_size(self.max_hash_slot_num, self.max_index_num)


class MessageIndex:
    def __init__(
        self,
        directory: Path,
        commit_log: CommitLog,
        config: IndexConfig,
        wall_ms: Callable[[], int],
    ) -> None:
        self.directory = directory
        self.commit_log = commit_log
        self.config = config
        self.wall_ms = wall_ms
        self.files: list[IndexFile] = []
        self.offset = 0  # the next commit offset to index
        self.skip = 0  # keys of the record at `offset` already in
        self.error: str | None = None
        self._wake: asyncio.Event | None = None
        self._idle = False  # `run` waits to be woken (not catching up, not failing)

    # ------------------------------------------------------------ state

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commit_log.max_offset - self.offset)

    @property
    def file_count(self) -> int:
        return len(self.files)

    @property
    def size_bytes(self) -> int:
        return len(self.files) * self.config.file_size

    @property
    def entries(self) -> int:
        return sum(f.entries for f in self.files)

    def last_update(self) -> tuple[int, int]:
        """(store time, commit offset) of the newest entry (RocketMQ's
        indexLastUpdateTimestamp and indexLastUpdatePhyoffset); zeros when none."""
        for f in reversed(self.files):
            if f.entries:
                return f.end_timestamp, f.end_offset
        return 0, 0

    # ------------------------------------------------------------ lifecycle

    def load(self, crashed: bool, log_end: int) -> None:
        """Open the files of a recovered store (see the module docstring) and set where
        indexing resumes. Blocking: runs with the store's recovery."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(self.directory)):
            path = self.directory / name
            if not is_file_name(name):
                log.warning("index: ignoring %s (not an index file name)", path)
                continue
            try:
                self.files.append(
                    IndexFile.open(path, self.config.max_hash_slot_num, self.config.max_index_num)
                )
            except (IndexFileError, OSError) as exc:
                log.warning("index: dropping %s (%s); its keys are indexed again", path, exc)
                path.unlink(missing_ok=True)
        if crashed and self.files:
            self._drop(len(self.files) - 1, "the broker did not stop cleanly")
        self._drop_from(log_end, "past the end of the recovered commit log")
        self.delete_below(self.commit_log.min_offset, unlink=True)
        self._resume()
        log.info(
            "index loaded files=%d entries=%d resume_at=%d",
            len(self.files),
            self.entries,
            self.offset,
        )

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    async def flush(self) -> None:
        """fsync the newest file (a clean stop), in a worker thread."""
        if self.files:
            await asyncio.to_thread(sync_and_close, self.files[-1].sync_handle())

    def truncate(self, offset: int) -> None:
        """The commit log was cut at `offset`: files holding offsets at or past it go,
        and indexing resumes before the cut."""
        self._drop_from(offset, f"the commit log was truncated at {offset}")
        self._resume()

    def restart_at(self, offset: int) -> None:
        """The commit log was discarded and starts empty at `offset`."""
        while self.files:
            self._drop(len(self.files) - 1, "the commit log was discarded")
        self.offset, self.skip = offset, 0

    def delete_below(self, min_offset: int, unlink: bool = False) -> list[Path]:
        """Close the files (never the newest) whose offsets are all below
        `min_offset`; their paths, to unlink (at once with `unlink`)."""
        gone: list[Path] = []
        while len(self.files) > 1 and self.files[0].end_offset < min_offset:
            f = self.files.pop(0)
            f.close()
            if f.path is not None:
                gone.append(f.path)
        if gone:
            log.info(
                "index: %d file(s) below commit offset %d deleted (%s..%s)",
                len(gone),
                min_offset,
                gone[0].name,
                gone[-1].name,
            )
        if unlink:
            for path in gone:
                path.unlink(missing_ok=True)
        return gone

    # ------------------------------------------------------------ building

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def follow(self) -> None:
        """New records are in the log: index them now, on the caller's turn, when
        one step catches up and `run` is idle; otherwise (catching up, failing, a
        file to roll, more than a step behind) wake `run`, which owns the rolling
        and the error handling. The store calls this once per loop turn that
        appended (as `Dispatcher.follow`)."""
        if not self._idle:
            self.wake()
            return
        try:
            moved = self.build_some()
        except (record.RecordError, CommitLogError, OSError):
            moved = None  # `run` meets it again: it logs once and retries every second
        if moved is None or self.offset < self.commit_log.max_offset:
            self.wake()

    def build_some(self, step: int = STEP_BYTES) -> int | None:
        """Index records from `offset` (at most `step` bytes); the bytes consumed, or
        None when the newest file is full (or missing): `roll` first.

        Raises:
            record.RecordError: the commit log holds bytes no record starts at.
        """
        if not self.files or self.files[-1].full:
            return None
        log_ = self.commit_log
        if self.offset < log_.min_offset:
            self.offset, self.skip = log_.min_offset, 0
        start, end = self.offset, log_.max_offset
        if start >= end:
            return 0
        chunk = log_.read_into_chunk(start, min(step, end - start))
        pos, skip, blank, full = build(self.files[-1], chunk, 0, self.skip)
        if not pos and not blank and not full and len(chunk) >= record.BLANK_SIZE:
            head = record.peek(chunk[: record.BLANK_SIZE])
            if isinstance(head, int) and len(chunk) < head and start + head <= end:
                pos, skip, blank, full = build(self.files[-1], log_.read(start, head), 0, self.skip)
        self.skip = skip
        self.offset = log_.file_end(start + pos) if blank else start + pos
        return self.offset - start

    def roll(self) -> None:
        """fsync the full newest file and create the next (blocking)."""
        if self.files and self.files[-1].full:
            self.files[-1].flush()
        self._create_next()

    async def _roll(self) -> None:
        """`roll` while the broker serves: the fsync in a worker thread, on a descriptor
        of its own; the next file only once it is done (so every file but the newest is
        durable) and only if the full one is still the newest (not dropped meanwhile)."""
        last = self.files[-1] if self.files else None
        if last is not None and last.full:
            await asyncio.to_thread(sync_and_close, last.sync_handle())
            if not self.files or self.files[-1] is not last:
                return
        self._create_next()

    def _create_next(self) -> None:
        prev_offset = prev_ts = 0
        if self.files:
            last = self.files[-1]
            if not last.full:
                return
            prev_offset, prev_ts = last.end_offset, last.end_timestamp
        name = file_name(self.wall_ms())
        if self.files and name <= self.files[-1].name:
            name = f"{int(self.files[-1].name) + 1:017d}"
        f = IndexFile.create(
            self.directory / name,
            self.config.max_hash_slot_num,
            self.config.max_index_num,
            prev_offset,
            prev_ts,
        )
        self.files.append(f)

    def build_all(self) -> int:
        """Index until caught up (tests; blocking)."""
        total = 0
        while True:
            moved = self.build_some()
            if moved is None:
                self.roll()
                continue
            if not moved:
                return total
            total += moved

    async def run(self) -> None:
        """Index whenever woken (appends wake it) and at least every IDLE_WAIT_S."""
        self._wake = asyncio.Event()
        failing = False
        ticker = Ticker(self._wake, IDLE_WAIT_S)
        try:
            while True:
                self._idle = not failing
                try:
                    await self._wake.wait()
                finally:
                    self._idle = False
                self._wake.clear()
                try:
                    while True:
                        moved = self.build_some()
                        if moved is None:
                            await self._roll()
                            continue
                        if not moved or self.offset >= self.commit_log.max_offset:
                            break
                        await asyncio.sleep(0)
                except (record.RecordError, CommitLogError) as exc:
                    if not failing:
                        self.error = f"commit offset {self.offset}: {exc}"
                        log.error("index stopped at commit offset %d: %s", self.offset, exc)
                    failing = True
                    await asyncio.sleep(1.0)
                except OSError as exc:
                    if not failing:
                        log.error("index cannot write its files: %s; retrying every 1 s", exc)
                    failing = True
                    await asyncio.sleep(1.0)
                else:
                    if failing:
                        log.info("index builds again from commit offset %d", self.offset)
                    failing, self.error = False, None
        finally:
            ticker.stop()

    # ------------------------------------------------------------ lookups

    def lookup(self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Commit offsets of records indexed under `topic#key` stored in [begin_ms,
        end_ms] (to the second), newest first, each once, at most `limit`, all
        inside the commit log. Candidates: a hash collision is the caller's to
        weed out."""
        hash_ = key_hash(topic, key)
        out: list[int] = []
        seen: set[int] = set()
        for f in reversed(self.files):
            if f.time_matched(begin_ms, end_ms):
                f.lookup(hash_, begin_ms, end_ms, limit, out, seen)
            if len(out) >= limit or (f.entries and f.begin_timestamp < begin_ms):
                break
        low, high = self.commit_log.min_offset, self.commit_log.max_offset
        return [o for o in out if low <= o < high]

    # ------------------------------------------------------------ internals

    def _resume(self) -> None:
        self.offset, self.skip = self.commit_log.min_offset, 0
        for f in reversed(self.files):
            if f.entries:
                self.offset = max(f.end_offset, self.commit_log.min_offset)
                break

    def _drop_from(self, offset: int, why: str) -> None:
        while self.files and self.files[-1].end_offset >= offset:
            self._drop(len(self.files) - 1, why)

    def _drop(self, i: int, why: str) -> None:
        f = self.files.pop(i)
        f.close()
        if f.path is not None:
            log.warning("index: dropping %s (%s); its keys are indexed again", f.path.name, why)
            f.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class KeyLookup:
    """What a lookup by key found: each record as stored with its decoded form, by
    commit offset; and how far the index is (RocketMQ's indexLastUpdateTimestamp and
    indexLastUpdatePhyoffset: the newest entry's store time and commit offset)."""

    found: list[tuple[bytes, record.StoredMessage]]
    last_update_timestamp: int
    last_update_commit_offset: int


def carries_key(
    message: record.StoredMessage, topic: str, key: str, unique: bool, begin_ms: int, end_ms: int
) -> bool:
    """Whether a record the index pointed at is one asked for (hashes collide): its
    topic, its UNIQ_KEY (`unique`) or one of its KEYS, its store time."""
    if message.topic != topic or not begin_ms <= message.store_timestamp <= end_ms:
        return False
    if unique:
        return message.properties.get("UNIQ_KEY") == key
    return key in message.properties.get(record.PROPERTY_KEYS, "").split(" ")
