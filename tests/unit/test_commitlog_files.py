"""The commit log's file layer: names, rolling with BLANK markers, reads across files."""

from __future__ import annotations

import os

import pytest

from ferry import record
from ferry.record import Blank, Record, RecordError
from services.broker.store.commitlog import CommitLog, CommitLogError

FILE_SIZE = 1024


def rec(body_size: int, topic: str = "T", queue_offset: int = 0) -> Record:
    return Record(
        topic=topic,
        queue_id=0,
        body=bytes([queue_offset % 251]) * body_size,
        queue_offset=queue_offset,
    )


def size_of(body_size: int, topic: str = "T") -> int:
    return record.encoded_size(len(topic), body_size, 0)


def body_for(total: int) -> int:
    """The body size that makes a record of `total` bytes with topic "T"."""
    return total - size_of(0)


def encoder(r: Record):
    """`encode(offset)` for `r`: the record stores its own commit offset."""
    return lambda offset: record.encode(Record(**{**_fields(r), "commit_offset": offset}))


def put(log: CommitLog, r: Record) -> int:
    return log.append(size_of(len(r.body), r.topic), encoder(r))


def _fields(r: Record) -> dict:
    return {f: getattr(r, f) for f in Record.__slots__}


@pytest.fixture
def log(tmp_path):
    cl = CommitLog(tmp_path / "commitlog", FILE_SIZE)
    yield cl
    cl.close()


def test_files_are_named_by_start_offset_and_preallocated(log, tmp_path):
    put(log, rec(10))
    names = sorted(os.listdir(tmp_path / "commitlog"))
    assert names == ["00000000000000000000"]
    assert os.path.getsize(tmp_path / "commitlog" / names[0]) == FILE_SIZE


def test_record_leaving_exactly_8_bytes_stays_then_next_rolls_with_an_8_byte_blank(log, tmp_path):
    first = put(log, rec(body_for(FILE_SIZE - 8)))
    assert first == 0 and log.max_offset == FILE_SIZE - 8
    second = put(log, rec(10))
    assert second == FILE_SIZE  # rolled: the 8 bytes left hold the BLANK marker
    assert log.read(FILE_SIZE - 8, 8) == record.encode_blank(8)
    assert sorted(os.listdir(tmp_path / "commitlog")) == [
        "00000000000000000000",
        f"{FILE_SIZE:020d}",
    ]


def test_record_that_would_leave_7_bytes_rolls_at_once(log):
    put(log, rec(10))
    start = log.max_offset
    remaining = FILE_SIZE - start
    offset = put(log, rec(body_for(remaining - 7)))
    assert offset == FILE_SIZE
    assert record.peek(log.read(start, 8)) == Blank(remaining)


def test_record_that_would_exactly_fill_the_file_rolls(log):
    put(log, rec(10))
    start = log.max_offset
    offset = put(log, rec(body_for(FILE_SIZE - start)))
    assert offset == FILE_SIZE
    assert record.peek(log.read(start, 8)) == Blank(FILE_SIZE - start)


def test_record_larger_than_a_file_is_refused(log):
    with pytest.raises(RecordError, match="cannot fit"):
        put(log, rec(body_for(FILE_SIZE - 7)))
    assert log.max_offset == 0


def test_records_read_back_across_files_in_order(log):
    written = []
    for i in range(60):
        r = rec(20 + i, queue_offset=i)
        written.append((put(log, r), r))
    assert len(log.segment_starts()) > 3
    read = list(log.records(0))
    assert [o for o, _ in read] == [o for o, _ in written]
    assert [(d.body, d.queue_offset, d.commit_offset) for _, d in read] == [
        (r.body, r.queue_offset, o) for o, r in written
    ]
    for offset, _ in written:
        assert offset % FILE_SIZE + size_of(0) <= FILE_SIZE  # no record crosses a file


def test_batch_is_one_write_per_file_and_matches_single_appends(tmp_path):
    batch_log = CommitLog(tmp_path / "a", FILE_SIZE)
    single_log = CommitLog(tmp_path / "b", FILE_SIZE)
    records = [rec(30 + i % 50, queue_offset=i) for i in range(40)]
    items = [(size_of(len(r.body)), encoder(r)) for r in records]
    batch_offsets = batch_log.append_many(items)
    single_offsets = [put(single_log, r) for r in records]
    assert batch_offsets == single_offsets
    for start in batch_log.segment_starts():
        a = (tmp_path / "a" / f"{start:020d}").read_bytes()
        b = (tmp_path / "b" / f"{start:020d}").read_bytes()
        assert a == b
    batch_log.close()
    single_log.close()


def test_encoder_returning_the_wrong_size_is_refused(log):
    with pytest.raises(RecordError, match="announced"):
        log.append(100, lambda offset: b"x" * 99)


def test_reopen_finds_files_and_set_write_offset_discards_the_tail(tmp_path):
    directory = tmp_path / "commitlog"
    log = CommitLog(directory, FILE_SIZE)
    offsets = [put(log, rec(100, queue_offset=i)) for i in range(25)]
    log.flush()
    log.close()
    reopened = CommitLog(directory, FILE_SIZE)
    keep = offsets[12]
    reopened.set_write_offset(keep)
    assert [o for o, _ in reopened.records(0)] == offsets[:12]
    assert reopened.segment_starts()[-1] == keep - keep % FILE_SIZE
    assert reopened.read(keep - keep % FILE_SIZE, 0) == b""
    tail = (directory / f"{keep - keep % FILE_SIZE:020d}").read_bytes()[keep % FILE_SIZE :]
    assert tail == bytes(len(tail))  # discarded bytes are zeroed
    assert put(reopened, rec(100)) == keep
    reopened.close()


@pytest.mark.parametrize(
    ("name", "content_size", "message"),
    [
        ("notes.txt", FILE_SIZE, "20 digits"),
        ("00000000000000000100", FILE_SIZE, "not a multiple"),
        ("00000000000000000000", FILE_SIZE + 1, "expected 1024"),
    ],
)
def test_foreign_or_damaged_files_stop_with_the_file_named(tmp_path, name, content_size, message):
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / name).write_bytes(bytes(content_size))
    with pytest.raises(CommitLogError, match=message):
        CommitLog(directory, FILE_SIZE)


def test_short_file_before_the_newest_is_refused(tmp_path):
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / f"{0:020d}").write_bytes(bytes(10))
    (directory / f"{FILE_SIZE:020d}").write_bytes(bytes(FILE_SIZE))
    with pytest.raises(CommitLogError, match="00000000000000000000: 10 bytes, expected 1024"):
        CommitLog(directory, FILE_SIZE)


def test_short_newest_file_is_extended_with_zeros(tmp_path):
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / f"{0:020d}").write_bytes(b"\x01" * 10)
    log = CommitLog(directory, FILE_SIZE)
    assert (directory / f"{0:020d}").stat().st_size == FILE_SIZE
    assert log.read_raw(0, 12) == b"\x01" * 10 + b"\0\0"
    log.close()


def test_gap_between_files_is_reported(tmp_path):
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / f"{0:020d}").write_bytes(bytes(FILE_SIZE))
    (directory / f"{2 * FILE_SIZE:020d}").write_bytes(bytes(FILE_SIZE))
    with pytest.raises(CommitLogError, match="missing"):
        CommitLog(directory, FILE_SIZE)


def test_reads_outside_the_written_range_are_refused(log):
    put(log, rec(10))
    with pytest.raises(CommitLogError):
        log.read(0, log.max_offset + 1)
    with pytest.raises(CommitLogError):
        log.read(-1, 1)


def test_peek_distrusts_its_input():
    with pytest.raises(RecordError):
        record.peek(b"\x00" * 7)
    with pytest.raises(RecordError, match="magic"):
        record.peek(b"\x00\x00\x00\x80\x00\x00\x00\x00")
    with pytest.raises(RecordError, match="minimum"):
        record.peek((10).to_bytes(4, "big") + record.MESSAGE_MAGIC.to_bytes(4, "big"))


def _file_bytes(log: CommitLog, offset: int, size: int) -> bytes:
    """What the files hold at `offset`, read past the log's own memory of its tail."""
    return log.read_raw(offset, size)[:size]


def test_reads_of_what_was_just_written_match_the_files(tmp_path, monkeypatch):
    log = CommitLog(tmp_path / "commitlog", FILE_SIZE)
    offsets = [put(log, rec(30 + i, queue_offset=i)) for i in range(40)]  # across files
    last, first = offsets[-1], offsets[0]
    newest = _file_bytes(log, last, log.max_offset - last)
    oldest = _file_bytes(log, first, 40)
    preads = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda *a: preads.append(a) or real_pread(*a))
    assert log.read(last, log.max_offset - last) == newest
    assert preads == [], "the newest record was read from the files, not from memory"
    assert log.read(first, 40) == oldest
    assert len(preads) == 1  # an old record is still read from its file
    log.close()


def test_a_discarded_tail_is_never_read_back_from_memory(tmp_path):
    log = CommitLog(tmp_path / "commitlog", FILE_SIZE * 4)
    offsets = [put(log, rec(100, queue_offset=i)) for i in range(5)]
    log.set_write_offset(offsets[3])
    replacement = put(log, rec(60, queue_offset=99))
    assert replacement == offsets[3]
    size = log.max_offset - replacement
    assert log.read(replacement, size) == _file_bytes(log, replacement, size)
    with pytest.raises(CommitLogError):
        log.read(offsets[4], 10)  # past the write position now
    log.close()
