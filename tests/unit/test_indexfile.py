"""The index file's layout (services/broker/store/indexfile.py): Java's hash, puts and
chain walks, full files, the header fields, and distrust of arbitrary bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from services.broker.store import indexfile
from services.broker.store.indexfile import (
    ENTRY_SIZE,
    HEADER_SIZE,
    IndexFile,
    IndexFileError,
    file_size,
    index_keys,
    key_hash,
)


def new_file(slots: int = 7, entries: int = 50) -> IndexFile:
    buf = bytearray(file_size(slots, entries))
    struct.pack_into(">i", buf, 36, 1)
    return IndexFile(buf, slots, entries)


def lookup(f: IndexFile, hash_: int, begin: int = 0, end: int = 2**62, limit: int = 64):
    out: list[int] = []
    f.lookup(hash_, begin, end, limit, out, set())
    return out


# Values printed by OpenJDK 17's String.hashCode() on this machine.
JAVA = [
    ("hello", 99162322),
    ("TopicTest#ORDER-1", -1111209712),
    ("polygenelubricants", -(2**31)),
    ("Aa", 2112),
    ("BB", 2112),
    ("topic#\u00e9t\u00e9", 387055690),
    ("t#\U0001f600key", -2144802483),
    ("", 0),
]


@pytest.mark.parametrize(("text", "expected"), JAVA)
def test_java_hash_code(text: str, expected: int) -> None:
    assert record.tags_hash(text) == expected


def test_key_hash_is_abs_and_min_value_is_zero() -> None:
    assert key_hash("TopicTest", "ORDER-1") == 1111209712
    assert indexfile.positive_hash(-(2**31)) == 0
    assert key_hash("t", "\U0001f600key") == 2144802483


def test_put_then_walk_newest_first() -> None:
    f = new_file()
    assert f.index_count == 1 and f.entries == 0
    for i in range(10):
        assert f.put(i % 3, 1000 + i, 5_000 + i * 1000)
    assert f.entries == 10
    assert (f.begin_offset, f.end_offset) == (1000, 1009)
    assert (f.begin_timestamp, f.end_timestamp) == (5_000, 14_000)
    assert f.hash_slot_count == 3
    assert lookup(f, 0) == [1009, 1006, 1003, 1000]
    assert lookup(f, 1, limit=2) == [1007, 1004]
    assert lookup(f, 5) == []  # slot 5: nothing
    # Times filter to the second: 1003 was stored at 8,000, 1006 at 11,000.
    assert lookup(f, 0, begin=8_000, end=11_000) == [1006, 1003]
    assert lookup(f, 0, begin=8_500, end=10_999) == [1003]  # within a second of 8,500


def test_entry_bytes_are_rocketmqs() -> None:
    f = new_file(slots=4, entries=8)
    f.put(9, 4242, 7_000)
    f.put(13, 4343, 9_500)  # same slot (13 % 4 == 9 % 4)
    buf = bytes(f.buffer)
    assert struct.unpack_from(">qqqqii", buf, 0) == (7_000, 9_500, 4242, 4343, 1, 3)
    assert struct.unpack_from(">i", buf, HEADER_SIZE + 1 * 4) == (2,)
    first = HEADER_SIZE + 4 * 4 + 1 * ENTRY_SIZE
    assert struct.unpack_from(">iqii", buf, first) == (9, 4242, 0, 0)
    assert struct.unpack_from(">iqii", buf, first + ENTRY_SIZE) == (13, 4343, 2, 1)


def test_full_file_refuses() -> None:
    f = new_file(entries=4)
    assert [f.put(1, i, 1) for i in range(4)] == [True, True, True, False]
    assert f.full and f.entries == 3


def test_new_file_continues_from_previous_end(tmp_path) -> None:
    f = IndexFile.create(tmp_path / "20261127010203004", 5, 10, 777, 123_000)
    assert (f.begin_offset, f.end_offset, f.begin_timestamp, f.index_count) == (
        777,
        777,
        123_000,
        1,
    )
    f.put(3, 900, 130_000)
    assert (f.begin_offset, f.begin_timestamp) == (900, 130_000)
    f.close()
    again = IndexFile.open(tmp_path / "20261127010203004", 5, 10)
    assert lookup(again, 3) == [900]
    again.close()
    with pytest.raises(IndexFileError, match="maxHashSlotNum or maxIndexNum"):
        IndexFile.open(tmp_path / "20261127010203004", 6, 10)


def test_index_keys() -> None:
    props = record.encode_properties({"KEYS": " a  b c ", "UNIQ_KEY": "U1", "TAGS": "t"})
    assert index_keys(props) == [b"U1", b"a", b"b", b"c"]
    assert index_keys(b"KEYS\x01x\x02KEYS\x01y\x02junk") == [b"y"]
    assert index_keys(b"") == []


def test_file_name() -> None:
    name = indexfile.file_name(1_764_201_600_123)
    assert len(name) == 17 and name.endswith("123") and indexfile.is_file_name(name)


EXACT = file_size(3, 6)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.binary(min_size=EXACT, max_size=EXACT),  # the right size, any bytes
        st.binary(min_size=EXACT, max_size=EXACT).map(  # counts that make sense, any rest
            lambda b: b[:32] + struct.pack(">ii", b[32] % 4, b[33] % 8) + b[40:]
        ),
        st.binary(max_size=EXACT + 8),
    )
)
def test_random_bytes_only_raise_index_file_error(data: bytes) -> None:
    try:
        f = IndexFile(bytearray(data), 3, 6)
    except IndexFileError:
        return
    for h in range(4):
        lookup(f, h)
        lookup(f, h, begin=-(2**40), end=2**40)
    f.put(5, 1, 2)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**40), st.integers(0, 10**6)),
        max_size=40,
    )
)
def test_round_trip(puts: list[tuple[int, int, int]]) -> None:
    f = new_file(slots=5, entries=30)
    stored = []
    ts = 1_000_000
    for h, offset, gap in puts:
        ts += gap
        if f.put(h, offset, ts):
            stored.append((h, offset))
    for h in {h for h, _ in stored}:
        expected = []
        for hh, offset in reversed(stored):
            if hh == h and offset not in expected:
                expected.append(offset)
        assert lookup(f, h) == expected
