"""Consume queues (docs/reference/contract.md, "Store files"): per (topic, queue id),
an index of the queue's messages in the commit log.

`consumequeue/<topic>/<queueId>/` holds files of `entries_per_file` 20-byte
entries `int64 commit_offset | int32 size | int64 tags_code`, named by the
byte position of their first entry (20 digits, as RocketMQ names them). Entry
`n` (the queue offset) is at byte `20 * n` of that sequence. Files are sparse
(ftruncate), so a queue costs disk only for what it holds.

Consume queues are derived data: only the dispatcher writes them (from the
commit log, on masters and slaves alike), and recovery may truncate or rebuild
them. Reads come from anywhere on the event loop thread. Blocking I/O here is
small (20-byte entries); callers that flush run `sync()` in a thread.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ferry.runtime.errors import StorageFault
from ferry.runtime.files import pwrite_all

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20
_NAME = re.compile(r"\d{20}")


class ConsumeQueueError(Exception):
    """A consume queue's files are not usable; the message names the file."""


@dataclass
class _File:
    start: int  # queue offset of its first entry
    path: Path
    fd: int


class ConsumeQueue:
    def __init__(self, directory: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.directory = Path(directory)
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_file = entries_per_file
        self._files: list[_File] = []
        self._dirty: set[int] = set()
        self.min_offset = 0  # oldest queue offset stored
        self.max_offset = 0  # next queue offset to be written (the message count)
        self.max_commit_end = 0  # end (commit offset + size) of the last entry
        self._load()

    # ------------------------------------------------------------ load

    def _load(self) -> None:
        if not self.directory.exists():
            return
        file_bytes = self.entries_per_file * ENTRY_SIZE
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):
                continue
            if not _NAME.fullmatch(path.name) or int(path.name) % file_bytes:
                raise ConsumeQueueError(
                    f"{path}: not a consume-queue file name (20 digits, a multiple of "
                    f"{file_bytes}); was mappedFileSizeConsumeQueue changed?"
                )
            start = int(path.name) // ENTRY_SIZE
            if self._files and start != self._files[-1].start + self.entries_per_file:
                raise ConsumeQueueError(f"{path}: a file is missing before it")
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_size != file_bytes:
                os.ftruncate(fd, file_bytes)
            self._files.append(_File(start, path, fd))
        if not self._files:
            return
        self.min_offset = self._first_entry(self._files[0])
        last = self._files[-1]
        count = self._count_entries(
            last, self.min_offset - last.start if len(self._files) == 1 else 0
        )
        if count == 0 and len(self._files) > 1:
            # An empty newest file: the end is the end of the one before.
            self.max_offset = last.start
        else:
            self.max_offset = last.start + count
        if self.max_offset > self.min_offset:
            entry = self.entry(self.max_offset - 1)
            self.max_commit_end = entry[0] + entry[1]

    def _first_entry(self, f: _File) -> int:
        """Queue offset of the first written entry of the oldest file (a slave's
        queue may start mid-file, at its master's offsets)."""
        _, size, _ = ENTRY.unpack(os.pread(f.fd, ENTRY_SIZE, 0))
        if size > 0:
            return f.start
        data = os.pread(f.fd, self.entries_per_file * ENTRY_SIZE, 0)
        leading_zeros = len(data) - len(data.lstrip(b"\0"))
        if leading_zeros == len(data):
            return f.start
        return f.start + leading_zeros // ENTRY_SIZE

    def _count_entries(self, f: _File, first: int) -> int:
        """End of the entries written in a file (they run from `first`): a binary
        search for the first empty entry (size 0)."""
        lo, hi = first, self.entries_per_file
        while lo < hi:
            mid = (lo + hi) // 2
            _, size, _ = ENTRY.unpack(os.pread(f.fd, ENTRY_SIZE, mid * ENTRY_SIZE))
            if size > 0:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------ writes (dispatcher only)

    def put(self, queue_offset: int, entries: list[tuple[int, int, int]]) -> None:
        """Write consecutive entries starting at `queue_offset`.

        Entries below `max_offset` are already here (recovery re-dispatches
        from a safe point): they are skipped. A gap above `max_offset` is
        logged; the entries are written at their own positions all the same,
        so a slave's queue offsets stay those of its master.
        """
        if queue_offset < self.max_offset:
            skip = self.max_offset - queue_offset
            if skip >= len(entries):
                return
            entries = entries[skip:]
            queue_offset = self.max_offset
        if queue_offset > self.max_offset:
            log.error(
                "consume queue gap topic=%s queue_id=%d expected=%d got=%d",
                self.topic,
                self.queue_id,
                self.max_offset,
                queue_offset,
            )
        if self.max_offset == 0 and not self._files:
            self.min_offset = self.max_offset = queue_offset  # a slave may start mid-queue
        position = queue_offset
        index = 0
        while index < len(entries):
            f = self._file_for(position, create=True)
            room = f.start + self.entries_per_file - position
            chunk = entries[index : index + room]
            data = b"".join(ENTRY.pack(*e) for e in chunk)
            try:
                pwrite_all(f.fd, data, (position - f.start) * ENTRY_SIZE)
            except OSError as exc:
                exc.filename = exc.filename or str(f.path)
                raise
            self._dirty.add(f.fd)
            position += len(chunk)
            index += len(chunk)
        self.max_offset = position
        last = entries[-1]
        self.max_commit_end = last[0] + last[1]

    def truncate_commit_end(self, commit_end: int) -> int:
        """Drop every entry whose record does not end at or before `commit_end`
        (recovery cut the commit log there). Returns how many were dropped."""
        if self.max_commit_end <= commit_end:
            return 0
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:  # first entry whose record ends past commit_end
            mid = (lo + hi) // 2
            offset, size, _ = self.entry(mid)
            if offset + size <= commit_end:
                lo = mid + 1
            else:
                hi = mid
        return self.truncate_queue_offset(lo)

    def take_dirty(self) -> list[int]:
        fds = list(self._dirty)
        self._dirty.clear()
        return fds

    def delete_below(self, commit_min: int) -> int:
        """Retention removed the commit log below `commit_min`: the queue now
        starts at its first entry whose record is at or after it, and the
        files holding only older entries go (never the newest file, which the
        next entry is written to). Returns how many files were deleted."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:  # the first entry whose record starts at or after commit_min
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < commit_min:
                lo = mid + 1
            else:
                hi = mid
        self.min_offset = lo
        deleted = 0
        while len(self._files) > 1 and self._files[0].start + self.entries_per_file <= lo:
            f = self._files.pop(0)
            self._dirty.discard(f.fd)
            os.close(f.fd)
            f.path.unlink(missing_ok=True)
            deleted += 1
        return deleted

    def truncate_queue_offset(self, queue_offset: int) -> int:
        """Drop the entries from `queue_offset` on; returns how many."""
        queue_offset = max(queue_offset, self.min_offset)
        if queue_offset >= self.max_offset:
            return 0
        dropped = self.max_offset - queue_offset
        self._zero_from(queue_offset)
        self.max_offset = queue_offset
        if queue_offset > self.min_offset:
            offset, size, _ = self.entry(queue_offset - 1)
            self.max_commit_end = offset + size
        else:
            self.max_commit_end = 0
        return dropped

    # ------------------------------------------------------------ reads

    def entry(self, queue_offset: int) -> tuple[int, int, int]:
        f = self._file_for(queue_offset, create=False)
        data = os.pread(f.fd, ENTRY_SIZE, (queue_offset - f.start) * ENTRY_SIZE)
        return ENTRY.unpack(data)

    def entries(
        self, queue_offset: int, max_count: int, limit: int | None = None
    ) -> list[tuple[int, int, int]]:
        """Up to `max_count` entries from `queue_offset`, below `limit` (default `max_offset`),
        within one file."""
        end = min(self.max_offset if limit is None else limit, queue_offset + max_count)
        if queue_offset < self.min_offset or queue_offset >= end:
            return []
        f = self._file_for(queue_offset, create=False)
        end = min(end, f.start + self.entries_per_file)
        data = os.pread(
            f.fd, (end - queue_offset) * ENTRY_SIZE, (queue_offset - f.start) * ENTRY_SIZE
        )
        return list(ENTRY.iter_unpack(data))

    def iter_entries(self, queue_offset: int) -> Iterator[tuple[int, int, int]]:
        while queue_offset < self.max_offset:
            batch = self.entries(queue_offset, 4096)
            if not batch:
                return
            yield from batch
            queue_offset += len(batch)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        for f in self._files:
            os.close(f.fd)
        self._files = []

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.min_offset = self.max_offset = self.max_commit_end = 0

    # ------------------------------------------------------------ internals

    def _file_for(self, queue_offset: int, create: bool) -> _File:
        start = queue_offset - queue_offset % self.entries_per_file
        if self._files:
            index = (start - self._files[0].start) // self.entries_per_file
            if 0 <= index < len(self._files):
                return self._files[index]
        if not create:
            raise ConsumeQueueError(
                f"queue {self.topic}/{self.queue_id} has no file for queue offset {queue_offset}"
            )
        if self._files and start < self._files[0].start:
            raise ConsumeQueueError(f"queue offset {queue_offset} is below the oldest file")
        self.directory.mkdir(parents=True, exist_ok=True)
        next_start = self._files[-1].start + self.entries_per_file if self._files else start
        while True:
            path = self.directory / f"{next_start * ENTRY_SIZE:020d}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, self.entries_per_file * ENTRY_SIZE)
            f = _File(next_start, path, fd)
            self._files.append(f)
            if next_start >= start:
                return f
            next_start += self.entries_per_file

    def _zero_from(self, queue_offset: int) -> None:
        keep: list[_File] = []
        for i, f in enumerate(self._files):
            if f.start + self.entries_per_file <= queue_offset:
                keep.append(f)
            elif f.start >= queue_offset and i > 0:
                self._dirty.discard(f.fd)
                os.close(f.fd)
                f.path.unlink()
            else:
                os.ftruncate(f.fd, max(0, queue_offset - f.start) * ENTRY_SIZE)
                os.ftruncate(f.fd, self.entries_per_file * ENTRY_SIZE)
                self._dirty.add(f.fd)
                keep.append(f)
        self._files = keep


def sync_fds(fds: Iterable[int]) -> None:
    """fdatasync each file (run in a thread).

    Raises:
        StorageFault: a file could not be synced. Its dirty pages may be lost
            (after a failed fdatasync Linux may drop them and report success
            next time): the caller must not count anything in it as durable.
    """
    for fd in fds:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                # Closed meanwhile: its file was deleted (a topic, retention,
                # a truncation), so nothing in it is needed any more.
                continue
            raise StorageFault("fdatasync", _fd_path(fd), exc) from exc


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


class ConsumeQueues:
    """Every consume queue of a broker, by (topic, queue id), created on first write."""

    def __init__(self, root: Path, entries_per_file: int) -> None:
        self.root = Path(root)
        self.entries_per_file = entries_per_file
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load_all(self) -> bool:
        """Open the queues on disk; returns whether the directory existed."""
        if not self.root.exists():
            self.root.mkdir(parents=True)
            return False
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.name.isdigit():
                    log.warning("ignoring %s: not a queue id directory", queue_dir)
                    continue
                key = (topic_dir.name, int(queue_dir.name))
                self._queues[key] = ConsumeQueue(queue_dir, key[0], key[1], self.entries_per_file)
        return True

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            queue = ConsumeQueue(
                self.root / topic / str(queue_id), topic, queue_id, self.entries_per_file
            )
            self._queues[(topic, queue_id)] = queue
        return queue

    def all(self) -> list[ConsumeQueue]:
        return list(self._queues.values())

    def __len__(self) -> int:
        return len(self._queues)

    def of_topic(self, topic: str) -> list[ConsumeQueue]:
        return [q for (t, _), q in self._queues.items() if t == topic]

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self._queues if k[0] == topic]:
            self._queues.pop(key).destroy()
        shutil.rmtree(self.root / topic, ignore_errors=True)

    def take_dirty(self) -> list[int]:
        fds: list[int] = []
        for queue in self._queues.values():
            if queue._dirty:
                fds.extend(queue.take_dirty())
        return fds

    def delete_below(self, commit_min: int) -> int:
        """Every queue follows the commit log's new minimum; returns files deleted."""
        return sum(queue.delete_below(commit_min) for queue in self._queues.values())

    def truncate_commit_end(self, commit_end: int) -> int:
        """Every queue drops the entries past `commit_end`; returns how many."""
        return sum(queue.truncate_commit_end(commit_end) for queue in self._queues.values())

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()
