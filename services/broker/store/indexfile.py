"""RocketMQ 4.9's message index file (`<storeRoot>/index/<yyyyMMddHHmmssSSS>`), byte for
byte: the layout, putting a key, walking a key's chain. Nothing else — no logging, no
policy about which keys go in (that is `index.py`).

Every integer is big-endian:

| part | offset | bytes | fields |
|---|---|---|---|
| header | 0 | 40 | beginTimestamp int64 (ms), endTimestamp int64, beginPhyOffset int64, endPhyOffset int64, hashSlotCount int32, indexCount int32 |
| slots | 40 | 4 × maxHashSlotNum | int32: the newest entry of the keys hashing there (0: none) |
| entries | 40 + 4 × maxHashSlotNum | 20 × maxIndexNum | keyHash int32, commit offset int64, timeDiff int32 (seconds after beginTimestamp), previous entry int32 (0: none) |

A key is `topic#key`; its hash is the absolute value of Java's `String.hashCode()` of
that string (UTF-16 code units; `Integer.MIN_VALUE` counts as 0), its slot `hash %
maxHashSlotNum`. Entries are numbered from 1: `indexCount` is the next one to write
(1 in a new file), so a file is full at `indexCount == maxIndexNum`. The begin fields
are the first entry's, the end fields the last one's; a new file starts with the
previous file's end in all four. `hashSlotCount` counts the slots in use.

A put writes its entry, then points the slot at it, then the header — the order a
reader of a torn file can live with. A chain runs from a slot to ever older entries
(each entry's `previous` is below its own number); a walk stops at 0, at a number
that does not go down, or at an entry older than the time asked for.

Apache writes the first entry's timeDiff against the previous file's end time (its
begin time changes after it computed the difference); ferry writes 0, the difference
to the begin time it sets. Readers compute the same times either way up to that.

`build` puts the keys of a run of commit-log records (`record.scan_index`) in one
call; `ferry_native.index_records` is its twin (tests/unit/test_native_index.py).

Decoders distrust the bytes: a file whose size, counts or numbers do not fit the
configured geometry raises `IndexFileError`, and a walk never reads outside the file.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

from ferry import record
from ferry.native import native as _native

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
SLOT = struct.Struct(">i")
SLOT_SIZE = SLOT.size  # 4
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 20
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
INT_MAX = (1 << 31) - 1
# RocketMQ's MessageSysFlag: bits 2-3 are the transaction type; both set is a rollback.
TRANSACTION_MASK = 0xC
TRANSACTION_ROLLBACK = 0xC
PROPERTY_UNIQ_KEY = b"UNIQ_KEY"
PROPERTY_KEYS = b"KEYS"
KEY_SEPARATOR = b" "
NAME_LENGTH = 17  # yyyyMMddHHmmssSSS


class IndexFileError(ValueError):
    """An index file (or its bytes) does not fit the configured layout."""


def file_size(hash_slots: int, max_entries: int) -> int:
    return HEADER_SIZE + hash_slots * SLOT_SIZE + max_entries * ENTRY_SIZE


def key_hash(topic: str, key: str) -> int:
    """The hash of `topic#key`: abs(Java `String.hashCode()`), MIN_VALUE as 0."""
    return positive_hash(record.tags_hash(f"{topic}#{key}"))


def positive_hash(java_hash: int) -> int:
    return 0 if java_hash == -(1 << 31) else abs(java_hash)


def index_keys(properties: bytes) -> list[bytes]:
    """The keys a record is indexed under, as the bytes of its properties carry them:
    its UNIQ_KEY, then each non-empty space-separated word of KEYS (the later of two
    equal names wins; an item without `\\x01` is skipped)."""
    uniq = keys = b""
    for item in properties.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if not sep:
            continue
        if name == PROPERTY_UNIQ_KEY:
            uniq = value
        elif name == PROPERTY_KEYS:
            keys = value
    out = [uniq] if uniq else []
    if keys:
        out.extend(k for k in keys.split(KEY_SEPARATOR) if k)
    return out


class IndexFile:
    """One index file over a writable buffer of exactly `file_size(hash_slots,
    max_entries)` bytes (an mmap of the file, or a bytearray in tests). The header
    lives only in the buffer: every property reads it there.

    Raises:
        IndexFileError: the buffer's size or header does not fit the geometry.
    """

    def __init__(
        self,
        buffer: mmap.mmap | bytearray,
        hash_slots: int,
        max_entries: int,
        path: Path | None = None,
        fd: int | None = None,
    ) -> None:
        if hash_slots <= 0 or max_entries <= 1:
            raise IndexFileError(f"bad geometry: {hash_slots} slots, {max_entries} entries")
        expected = file_size(hash_slots, max_entries)
        if len(buffer) != expected:
            raise IndexFileError(
                f"{path or 'index file'} holds {len(buffer)} bytes; {hash_slots} slots and "
                f"{max_entries} entries take {expected} (maxHashSlotNum or maxIndexNum changed?)"
            )
        self.buffer = buffer
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.path = path
        self._fd = fd
        self._entries_at = HEADER_SIZE + hash_slots * SLOT_SIZE
        count = self.index_count
        if count > max_entries:
            raise IndexFileError(f"{path or 'index file'}: index count {count} > {max_entries}")
        if not 0 <= self.hash_slot_count <= hash_slots:
            raise IndexFileError(
                f"{path or 'index file'}: hash slot count {self.hash_slot_count} outside "
                f"0..{hash_slots}"
            )

    # ------------------------------------------------------------ files

    @classmethod
    def create(
        cls,
        path: Path,
        hash_slots: int,
        max_entries: int,
        prev_end_offset: int = 0,
        prev_end_timestamp: int = 0,
    ) -> IndexFile:
        """A new file, its begin and end fields set to the previous file's end when
        there was one. Sparse, as RocketMQ's: blocks are taken as entries are written."""
        size = file_size(hash_slots, max_entries)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            buffer = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        offset = prev_end_offset if prev_end_offset > 0 else 0
        ts = prev_end_timestamp if prev_end_timestamp > 0 else 0
        HEADER.pack_into(buffer, 0, ts, ts, offset, offset, 0, 1)
        return cls(buffer, hash_slots, max_entries, path, fd)

    @classmethod
    def open(cls, path: Path, hash_slots: int, max_entries: int) -> IndexFile:
        """An existing file.

        Raises:
            IndexFileError: its size or header does not fit the geometry.
            OSError: it cannot be opened or mapped.
        """
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            expected = file_size(hash_slots, max_entries)
            if size != expected:
                raise IndexFileError(
                    f"{path} holds {size} bytes; {hash_slots} slots and {max_entries} entries "
                    f"take {expected} (maxHashSlotNum or maxIndexNum changed?)"
                )
            buffer = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        try:
            return cls(buffer, hash_slots, max_entries, path, fd)
        except IndexFileError:
            buffer.close()
            os.close(fd)
            raise

    def flush(self) -> None:
        """Make the file durable (blocking)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def sync_handle(self) -> int | None:
        """A descriptor of its own for `sync_and_close` in a worker thread: the file may
        be closed meanwhile (a truncation, a stop) without the sync touching its mapping."""
        return os.dup(self._fd) if self._fd is not None else None

    def close(self) -> None:
        if isinstance(self.buffer, mmap.mmap):
            self.buffer.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else ""

    # ------------------------------------------------------------ header

    @property
    def begin_timestamp(self) -> int:
        return _I64.unpack_from(self.buffer, 0)[0]

    @property
    def end_timestamp(self) -> int:
        return _I64.unpack_from(self.buffer, 8)[0]

    @property
    def begin_offset(self) -> int:
        return _I64.unpack_from(self.buffer, 16)[0]

    @property
    def end_offset(self) -> int:
        return _I64.unpack_from(self.buffer, 24)[0]

    @property
    def hash_slot_count(self) -> int:
        return _I32.unpack_from(self.buffer, 32)[0]

    @property
    def index_count(self) -> int:
        """The next entry's number (1 in an empty file; a stored 0 or less reads as 1)."""
        return max(1, _I32.unpack_from(self.buffer, 36)[0])

    @property
    def entries(self) -> int:
        return self.index_count - 1

    @property
    def full(self) -> bool:
        return self.index_count >= self.max_entries

    def time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether the file's time span meets [begin_ms, end_ms] (a second's slack:
        entries keep whole seconds)."""
        return self.begin_timestamp - 1000 <= end_ms and begin_ms <= self.end_timestamp + 1000

    # ------------------------------------------------------------ writes

    def put(self, hash_: int, commit_offset: int, store_timestamp: int) -> bool:
        """Add one entry; False when the file is full."""
        buf = self.buffer
        count = self.index_count
        if count >= self.max_entries:
            return False
        slot_at = HEADER_SIZE + (hash_ % self.hash_slots) * SLOT_SIZE
        previous = SLOT.unpack_from(buf, slot_at)[0]
        if previous <= 0 or previous >= count:
            previous = 0
        if count <= 1:
            _I64.pack_into(buf, 0, store_timestamp)
            _I64.pack_into(buf, 16, commit_offset)
        begin = self.begin_timestamp
        diff = 0 if begin <= 0 else min(max((store_timestamp - begin) // 1000, 0), INT_MAX)
        ENTRY.pack_into(
            buf, self._entries_at + count * ENTRY_SIZE, hash_, commit_offset, diff, previous
        )
        SLOT.pack_into(buf, slot_at, count)
        if previous == 0:
            _I32.pack_into(buf, 32, self.hash_slot_count + 1)
        _I32.pack_into(buf, 36, count + 1)
        _I64.pack_into(buf, 24, commit_offset)
        _I64.pack_into(buf, 8, store_timestamp)
        return True

    # ------------------------------------------------------------ reads

    def lookup(
        self,
        hash_: int,
        begin_ms: int,
        end_ms: int,
        limit: int,
        out: list[int],
        seen: set[int],
    ) -> None:
        """Append to `out` the commit offsets of the entries under `hash_` stored in
        [begin_ms, end_ms] (to the second: a caller checks exact times on the
        records), newest first, each once (`seen`), until `out` holds `limit`."""
        buf = self.buffer
        count = self.index_count
        if count <= 1 or len(out) >= limit:
            return
        current = SLOT.unpack_from(buf, HEADER_SIZE + (hash_ % self.hash_slots) * SLOT_SIZE)[0]
        begin = self.begin_timestamp
        entries_at = self._entries_at
        unpack = ENTRY.unpack_from
        while 0 < current < count:
            got_hash, commit_offset, diff, previous = unpack(buf, entries_at + current * ENTRY_SIZE)
            if diff < 0:
                return
            stored = begin + diff * 1000
            if (
                got_hash == hash_
                and begin_ms - 1000 < stored <= end_ms
                and commit_offset not in seen
            ):
                seen.add(commit_offset)
                out.append(commit_offset)
                if len(out) >= limit:
                    return
            if stored + 1000 < begin_ms or previous >= current:
                return
            current = previous


# ---------------------------------------------------------------- building


def build(file: IndexFile, chunk: bytes, pos: int, skip: int) -> tuple[int, int, bool, bool]:
    """Put the keys of the whole records of `chunk` from `pos` into `file`: each
    record's `index_keys` under its topic (not a transaction rollback's), with its
    commit offset and store time; the first record's first `skip` keys are in already.

    Returns `(position, skip, blank, full)`: where the walk stopped (the end of the
    last whole record done, or the record the file filled up in), how many of that
    record's keys went in (0 unless full), whether it stopped at a BLANK marker, and
    whether the file is full.

    Raises:
        record.RecordError: bytes at `position` that are neither a record nor a BLANK.
    """
    if _native is not None and type(chunk) is bytes:
        built = _native.index_records(
            chunk, pos, file.buffer, file.hash_slots, file.max_entries, skip
        )
        if built is not None:
            return built
    return build_python(file, chunk, pos, skip)


def build_python(file: IndexFile, chunk: bytes, pos: int, skip: int) -> tuple[int, int, bool, bool]:
    """`build` without the native module (its twin, and the reference)."""
    records, end, blank = record.scan_index(chunk, pos)
    at = pos
    for commit_offset, size, store_ts, sys_flag, topic, props in records:
        if sys_flag & TRANSACTION_MASK != TRANSACTION_ROLLBACK:
            keys = index_keys(props) if props else []
            for i in range(skip, len(keys)):
                text = (topic + b"#" + keys[i]).decode(errors="replace")
                if not file.put(positive_hash(record.tags_hash(text)), commit_offset, store_ts):
                    return at, i, False, True
        skip = 0
        at += size
    return end, 0, blank, file.full


def sync_and_close(fd: int | None) -> None:
    """fsync a `sync_handle` (pages written through the mapping included) and close it."""
    if fd is None:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_name(wall_ms: int) -> str:
    """`yyyyMMddHHmmssSSS` of a wall-clock time, local time (as RocketMQ names them)."""
    seconds, ms = divmod(wall_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(seconds)) + f"{ms:03d}"


def is_file_name(name: str) -> bool:
    return len(name) == NAME_LENGTH and name.isascii() and name.isdigit()
