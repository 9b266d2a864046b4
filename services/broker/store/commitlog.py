"""The commit log's files (docs/reference/contract.md, "Store files"): fixed-size
segments named by their start commit offset as 20 zero-padded digits,
preallocated, written append-only.

Rolling: a record goes into the current file only if it leaves at least 8
bytes behind it (room for a BLANK marker); otherwise a BLANK marker fills the
rest of the file and the record starts the next one. So no record crosses a
file boundary, and the file holding offset `o` starts at `o - o % file_size`.

Ownership: one appender owns a `CommitLog` (all writes come from it); reads
may come from anywhere below `max_offset`. This module does blocking file I/O:
async callers run it in a thread. Byte positions inside a record belong to
`ferry.record`; this module only knows record sizes and the BLANK marker.

Files outlive their place in the log while someone reads them: a reader in
another thread (a cold pull, an HA transfer) `pin`s the segment it reads, and
retention (`remove_oldest`) takes the file out of the log at once but closes
its descriptor only when the last pin goes — so a descriptor is never closed
(and its number reused for another file) under a read.

Segments are allocated ahead of need (RocketMQ's AllocateMappedFileService):
`allocate_file` runs in a thread, creating and preallocating the next file
under a hidden name beside the directory; the appender renames it into place
when it rolls. Only when no spare is ready does it create a file itself.

Recovery, flushing and dispatch live in `message_store.py`, `recovery.py` and
`dispatcher.py`; they drive this class.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ferry import record
from ferry.record import Blank, Record, RecordError
from ferry.runtime.files import pwrite_all

log = logging.getLogger(__name__)

NAME_DIGITS = 20
_NAME = re.compile(r"\d{20}")
_ZERO_CHUNK = bytes(4 << 20)
# At most this many of the bytes written last are kept to answer reads (`CommitLog._tail`).
TAIL_BYTES = 4 << 20


class CommitLogError(Exception):
    """The commit log's files are not usable as they are; the message names the file."""


@dataclass(eq=False)
class _Segment:
    start: int
    path: Path
    fd: int
    pins: int = 0  # readers in other threads
    removed: bool = False  # out of the log: close once unpinned


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class Region:
    """Part of one commit-log file, pinned for a reader in another thread (or
    for `sendfile`): `fd` stays open until `CommitLog.unpin(region.segment)`."""

    segment: _Segment
    offset: int  # commit offset of the first byte
    file_position: int  # where that byte is in the file
    size: int

    @property
    def fd(self) -> int:
        return self.segment.fd


SPARE_SUFFIX = ".alloc"


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


def _spare_path(directory: Path, start: int) -> Path:
    """Where the next file is allocated ahead: hidden, beside the log's
    directory (same file system: renamed into it when used), so that the
    directory holds only the log's files."""
    return directory.parent / f".{directory.name}-{segment_name(start)}{SPARE_SUFFIX}"


class CommitLog:
    def __init__(self, directory: Path, file_size: int, preallocate: bool = True) -> None:
        if file_size < record.MIN_RECORD_SIZE + record.BLANK_SIZE:
            raise CommitLogError(f"file size {file_size} is too small for one record")
        self.directory = Path(directory)
        self.file_size = file_size
        self._preallocate = preallocate
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segments: list[_Segment] = self._open_existing()
        self._dirty: list[_Segment] = []
        self._spare: _Segment | None = None  # the next file, allocated ahead
        self.inline_allocations = 0  # files the appender had to create itself
        # Until recovery says otherwise, everything in the files counts as written.
        self._write_offset = self._segments[-1].start + file_size if self._segments else 0
        # The bytes written last, from their offset (`_write`): the dispatcher and the
        # index read each run of records right after it is written, and this answers
        # them without a pread. Extended in place (its earlier bytes never change
        # while it is current) or replaced, never shrunk, so a reader in a thread
        # that took the pair still reads what is in the files.
        self._tail: tuple[int, bytearray] = (self._write_offset, bytearray())

    # ------------------------------------------------------------ state

    @property
    def min_offset(self) -> int:
        return self._segments[0].start if self._segments else self._write_offset

    @property
    def max_offset(self) -> int:
        """The write position: the end of the last record (or BLANK) written."""
        return self._write_offset

    @property
    def files_end(self) -> int:
        """The end of the newest file (0 with no file): where the next file starts."""
        return self._segments[-1].start + self.file_size if self._segments else 0

    def segment_starts(self) -> list[int]:
        return [s.start for s in self._segments]

    def set_write_offset(self, offset: int, zero_to: int | None = None) -> None:
        """Recovery's verdict: everything from `offset` on is discarded (zeroed
        in its file up to `zero_to` — default the file's end — and later files
        deleted)."""
        if offset < self.min_offset or offset > self.files_end:
            raise CommitLogError(
                f"offset {offset} is outside the files [{self.min_offset}, {self.files_end}]"
            )
        start = offset - offset % self.file_size
        while self._segments and self._segments[-1].start > start:
            segment = self._segments.pop()
            if segment in self._dirty:
                self._dirty.remove(segment)
            segment.path.unlink()
            self._release(segment)
        self.discard_spare()
        if self._segments and offset < self.files_end:
            end = self.files_end if zero_to is None else min(zero_to, self.files_end)
            self._zero(self._segments[-1], offset - start, end - start)
        self._write_offset = offset
        self._tail = (offset, bytearray())

    # ------------------------------------------------------------ writes

    def append(self, size: int, encode: Callable[[int], bytes]) -> int:
        """Append one record of `size` bytes; `encode(offset)` returns its bytes."""
        return self.append_many([(size, encode)])[0]

    def append_many(self, items: Sequence[tuple[int, Callable[[int], bytes]]]) -> list[int]:
        """Append records in order with one write per file touched; returns their offsets.

        Each item is `(size, encode)`; `encode(commit_offset)` must return exactly
        `size` bytes (the record stores its own offset).
        """
        offsets = []
        buf = bytearray()
        buf_start = self._write_offset
        for size, encode in items:
            if size + record.BLANK_SIZE > self.file_size:
                raise RecordError(
                    f"a record of {size} bytes cannot fit in a {self.file_size}-byte file"
                )
            position = buf_start + len(buf)
            file_end = position - position % self.file_size + self.file_size
            if size + record.BLANK_SIZE > file_end - position:
                buf += record.encode_blank(file_end - position)
                self._write(buf_start, buf)
                buf = bytearray()
                buf_start = position = file_end
            data = encode(position)
            if len(data) != size:
                raise RecordError(f"encoder returned {len(data)} bytes, not the {size} announced")
            buf += data
            offsets.append(position)
        self._write(buf_start, buf)
        self._write_offset = buf_start + len(buf)
        return offsets

    def write_chunks(self, chunks: Sequence[tuple[int, bytes]]) -> None:
        """Append bytes already laid out from `max_offset` on, as `append_many` lays
        them out (records, and a BLANK marker before one that starts the next file):
        one chunk per file, each written at once, the first at `max_offset` and each
        later one at a file's start."""
        end = self._write_offset
        for i, (start, data) in enumerate(chunks):
            # A later chunk starts the next file, after the BLANK marker ending the one
            # before (which may end exactly at the file's end).
            next_file = i > 0 and start >= end and start % self.file_size == 0
            if start != end and not next_file:
                raise RecordError(f"a chunk laid out at {start}, but the log is at {end}")
            self._write(start, data)
            end = start + len(data)
        self._write_offset = end

    def start_at(self, offset: int) -> None:
        """An empty log (a new slave) begins at `offset`, a file start: the first
        write creates the file named for it."""
        if self._segments:
            raise CommitLogError(f"the log already holds files; it cannot start at {offset}")
        if offset % self.file_size:
            raise CommitLogError(
                f"offset {offset} is not the start of a file of {self.file_size} bytes"
            )
        self._write_offset = offset
        self._tail = (offset, bytearray())

    def append_raw(self, data: bytes) -> int:
        """Append replicated bytes as they are (a slave); they must not cross the
        end of the current file. Returns the new write position."""
        end = self.file_end(self._write_offset)
        if self._write_offset + len(data) > end:
            raise CommitLogError(
                f"{len(data)} bytes at {self._write_offset} would cross the end of the file at {end}"
            )
        self._write(self._write_offset, data)
        self._write_offset += len(data)
        return self._write_offset

    def discard_all(self) -> None:
        """Delete every file (a slave resyncing from scratch)."""
        for segment in self._segments:
            segment.path.unlink()
            self._release(segment)
        self._segments = []
        self._dirty = []
        self._write_offset = 0
        self._tail = (0, bytearray())
        self.discard_spare()

    # ------------------------------------------------------------ retention

    def oldest_removable(self) -> tuple[int, Path, int] | None:
        """(start, path, fd) of the oldest file when it is not the one being
        written (the newest file is never removed), else None."""
        if len(self._segments) < 2:
            return None
        oldest = self._segments[0]
        return oldest.start, oldest.path, oldest.fd

    def remove_oldest(self) -> tuple[Path, int | None]:
        """Take the oldest file out of the log (`min_offset` moves to the next
        file at once). Returns its path, to unlink, and its descriptor to close
        now — or None when a reader still holds it (closed by the last
        `unpin`). Unlink and close in a thread: freeing a large file's blocks
        takes time."""
        if len(self._segments) < 2:
            raise CommitLogError("the file being written is never removed")
        segment = self._segments.pop(0)
        if segment in self._dirty:
            self._dirty.remove(segment)
        segment.removed = True
        if segment.pins:
            return segment.path, None
        return segment.path, segment.fd

    # ------------------------------------------------------------ pins

    def region(self, offset: int, max_bytes: int, limit: int | None = None) -> Region:
        """Up to `max_bytes` from `offset`, within one file and below `limit`
        (default: the write position), pinned: `unpin(region.segment)` after use."""
        end = self._write_offset if limit is None else min(limit, self._write_offset)
        size = min(max_bytes, end - offset, self.file_end(offset) - offset)
        if offset < self.min_offset or size < 0:
            raise CommitLogError(f"offset {offset} is outside [{self.min_offset}, {end})")
        segment = self._segment_for(offset)
        segment.pins += 1
        return Region(segment, offset, offset - segment.start, size)

    def pin_range(self, offset: int, size: int) -> Region:
        """Exactly `[offset, offset + size)`, checked as `read` checks it, pinned."""
        segment = self._checked_segment(offset, size)
        segment.pins += 1
        return Region(segment, offset, offset - segment.start, size)

    def unpin(self, segment: _Segment) -> int | None:
        """Release a pin; returns a descriptor the caller must close (in a
        thread) when this was the last pin of a removed file."""
        segment.pins -= 1
        if segment.removed and segment.pins == 0:
            return segment.fd
        return None

    # ------------------------------------------------------------ allocation ahead

    @property
    def spare_start(self) -> int | None:
        """The start of the file to allocate ahead, or None when one is ready
        (or the log is empty: its first file is made when the first bytes come)."""
        if self._spare is not None or not self._segments:
            return None
        return self.files_end

    @staticmethod
    def allocate_file(directory: Path, start: int, file_size: int, preallocate: bool) -> Path:
        """Create and size the file for `start` under a hidden name (blocking:
        run in a thread). Returns its path, for `adopt_spare`."""
        hidden = _spare_path(Path(directory), start)
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if preallocate:
                os.posix_fallocate(fd, 0, file_size)
            else:
                os.ftruncate(fd, file_size)
        except OSError:
            hidden.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return hidden

    def adopt_spare(self, start: int, hidden: Path) -> bool:
        """Hold a file made by `allocate_file` for the next roll. It keeps its
        hidden name until the appender takes it (renamed then, on the
        appender's thread), so the files under real names are always exactly
        the log's, and a crash leaves at most a hidden file that the next open
        removes. False (and the file removed) when the log moved on meanwhile
        (the appender made that file itself)."""
        if self._spare is not None or not self._segments or start != self.files_end:
            hidden.unlink(missing_ok=True)
            return False
        self._spare = _Segment(start, hidden, os.open(hidden, os.O_RDWR))
        return True

    def discard_spare(self) -> None:
        if self._spare is not None:
            os.close(self._spare.fd)
            self._spare.path.unlink(missing_ok=True)
            self._spare = None

    def flush(self) -> None:
        """Make everything written durable (fdatasync of the files written since the last flush)."""
        for fd in self.take_dirty():
            os.fdatasync(fd)

    def take_dirty(self) -> list[int]:
        """The files written since the last call, to fdatasync (possibly in a
        thread, while the appender goes on writing)."""
        fds = [segment.fd for segment in self._dirty]
        self._dirty.clear()
        return fds

    def file_end(self, offset: int) -> int:
        """The end of the file that holds `offset`."""
        return offset - offset % self.file_size + self.file_size

    def read_into_chunk(self, offset: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` from `offset`, stopping at the write position and at
        the end of the file (for scans; may end mid-record)."""
        end = min(self._write_offset, self.file_end(offset), offset + max_bytes)
        return self.read(offset, max(0, end - offset))

    def read_raw(self, offset: int, size: int) -> bytes:
        """Like `read`, but may look past the write position (recovery scans the
        whole file before it knows where the data ends)."""
        segment = self._segment_for(offset)
        size = min(size, segment.start + self.file_size - offset)
        return os.pread(segment.fd, size, offset - segment.start)

    # ------------------------------------------------------------ reads

    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`, inside one file and below the write position:
        from the bytes written last when they hold them (no pread), else the file."""
        segment = self._checked_segment(offset, size)
        tail_start, tail = self._tail
        i = offset - tail_start
        if i >= 0 and i + size <= len(tail):
            return bytes(tail[i : i + size])
        return os.pread(segment.fd, size, offset - segment.start)

    def _checked_segment(self, offset: int, size: int) -> _Segment:
        if offset < self.min_offset or offset + size > self._write_offset or size < 0:
            raise CommitLogError(
                f"[{offset}, {offset + size}) is outside [{self.min_offset}, {self._write_offset})"
            )
        segment = self._segment_for(offset)
        if offset + size > segment.start + self.file_size:
            raise CommitLogError(
                f"[{offset}, {offset + size}) crosses the end of file {segment.path.name}"
            )
        return segment

    def records(self, offset: int, check_crc: bool = True) -> Iterator[tuple[int, Record]]:
        """Every record from `offset` (a record start) up to the write position,
        skipping BLANK markers into the next file."""
        while offset < self._write_offset:
            segment = self._segment_for(offset)
            head = self.read(offset, min(record.BLANK_SIZE, self._write_offset - offset))
            try:
                total = record.peek(head)
            except RecordError as exc:
                raise CommitLogError(f"{segment.path.name} at offset {offset}: {exc}") from None
            if isinstance(total, Blank):
                offset = segment.start + self.file_size
                continue
            if offset + total > self._write_offset:
                raise CommitLogError(
                    f"{segment.path.name} at offset {offset}: record of {total} bytes passes the end"
                )
            decoded = record.decode(self.read(offset, total), 0, check_crc=check_crc)
            assert isinstance(decoded, Record)
            yield offset, decoded
            offset += total

    def close(self) -> None:
        for segment in self._segments:
            os.close(segment.fd)
        self._segments = []
        if self._spare is not None:
            os.close(self._spare.fd)  # a hidden file: the next open removes it
            self._spare = None

    # ------------------------------------------------------------ internals

    def _open_existing(self) -> list[_Segment]:
        segments: list[_Segment] = []
        size_problems: list[Path] = []
        for path in self.directory.parent.glob(f".{self.directory.name}-*{SPARE_SUFFIX}"):
            path.unlink(missing_ok=True)  # an allocation a crash left unused
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):
                continue
            if not _NAME.fullmatch(path.name):
                raise CommitLogError(
                    f"{path}: not a commit-log file name (20 digits); move it out of {self.directory}"
                )
            start = int(path.name)
            if start % self.file_size:
                raise CommitLogError(
                    f"{path}: start offset {start} is not a multiple of mappedFileSizeCommitLog={self.file_size}; "
                    "was the file size changed?"
                )
            if path.stat().st_size != self.file_size:
                size_problems.append(path)
            if segments and start != segments[-1].start + self.file_size:
                raise CommitLogError(
                    f"{path}: a file is missing before it (gap after {segments[-1].path.name})"
                )
            segments.append(_Segment(start, path, os.open(path, os.O_RDWR)))
        for path in size_problems:
            size = path.stat().st_size
            if path != segments[-1].path or size > self.file_size:
                for segment in segments:
                    os.close(segment.fd)
                raise CommitLogError(f"{path}: {size} bytes, expected {self.file_size}")
            # The newest file cut short (a crash while it grew, or a copy): its
            # missing end reads as zeros, which recovery treats as "no data".
            log.warning(
                "%s is %d bytes, not %d: extending it with zeros", path, size, self.file_size
            )
            os.ftruncate(segments[-1].fd, self.file_size)
        return segments

    def _has_segment(self, start: int) -> bool:
        return bool(self._segments) and self._segments[-1].start >= start

    def _segment_for(self, offset: int) -> _Segment:
        index = (offset - self.min_offset) // self.file_size
        if not 0 <= index < len(self._segments):
            raise CommitLogError(f"no file holds offset {offset}")
        return self._segments[index]

    def _write(self, start: int, data: bytes | bytearray) -> None:
        if not data:
            return
        file_start = start - start % self.file_size
        if not self._has_segment(file_start):
            self._create(file_start)
        segment = self._segment_for(start)
        if segment not in self._dirty:
            self._dirty.append(segment)
        try:
            pwrite_all(segment.fd, data, start - segment.start)
        except OSError as exc:
            exc.filename = exc.filename or str(segment.path)  # name the file in what is logged
            raise
        tail_start, tail = self._tail
        if start == tail_start + len(tail) and len(tail) + len(data) <= TAIL_BYTES:
            tail += data
        elif len(data) <= TAIL_BYTES:
            self._tail = (start, bytearray(data))
        else:
            self._tail = (start + len(data), bytearray())

    def _create(self, start: int) -> None:
        spare = self._spare
        if spare is not None and spare.start == start:
            self._spare = None
            final = self.directory / segment_name(start)
            os.rename(spare.path, final)
            spare.path = final
            self._segments.append(spare)
            return
        self.discard_spare()
        self.inline_allocations += 1
        path = self.directory / segment_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if self._preallocate:
                os.posix_fallocate(fd, 0, self.file_size)
            else:
                os.ftruncate(fd, self.file_size)
        except OSError as exc:
            # No half-made file left behind: the next append creates it again.
            os.close(fd)
            path.unlink(missing_ok=True)
            exc.filename = exc.filename or str(path)
            raise
        self._segments.append(_Segment(start, path, fd))

    def _release(self, segment: _Segment) -> None:
        """A file gone from the log: close it unless a reader holds it."""
        segment.removed = True
        if not segment.pins:
            os.close(segment.fd)

    def _zero(self, segment: _Segment, position: int, end: int) -> None:
        while position < end:
            n = min(len(_ZERO_CHUNK), end - position)
            pwrite_all(segment.fd, _ZERO_CHUNK[:n], position)
            position += n
