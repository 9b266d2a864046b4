"""ferry_native.index_records (native/src/index.rs) against the Python it mirrors,
`services.broker.store.indexfile.build_python`: on the same commit-log chunk, skip and
file, equal answers and equal file bytes; None exactly where the Python raises, with the
file untouched.

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from services.broker.store import indexfile
from services.broker.store.indexfile import IndexFile, file_size
from tests.native_twins import require_native
from tests.unit.test_native_dispatch import chunks

ferry_native = require_native()

words = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            max_size=6).map(str.encode),
    st.binary(max_size=5),
)  # fmt: skip
keys_values = st.lists(st.one_of(words, st.just(b"")), max_size=4).map(b" ".join)


@st.composite
def keyed_records(draw) -> bytes:
    props = b""
    if draw(st.booleans()):
        props += b"UNIQ_KEY\x01" + draw(words) + b"\x02"
    if draw(st.booleans()):
        props += b"KEYS\x01" + draw(keys_values) + b"\x02"
    if draw(st.booleans()):
        props += draw(st.sampled_from([b"TAGS\x01a\x02", b"KEYS\x01dup\x02", b"noise", b""]))
    topic = draw(st.sampled_from([b"T", b"Topic\xc3\xa9", b"\xe2\x82", b"TopicTest"]))
    sys_flag = draw(st.sampled_from([0, 0x4, 0x8, 0xC, 0x1]))
    return record.encode_raw(
        topic, 0, 0, 0, draw(st.integers(0, 2**40)), sys_flag, 1, bytes(8),
        draw(st.integers(-(2**40), 2**41)), bytes(8), b"b", props,
    )  # fmt: skip


def fresh(slots: int, entries: int, header: tuple[int, ...] | None = None) -> bytearray:
    buf = bytearray(file_size(slots, entries))
    struct.pack_into(">qqqqii", buf, 0, *(header or (0, 0, 0, 0, 0, 1)))
    return buf


def both(chunk: bytes, pos: int, skip: int, slots: int, entries: int, header=None):
    native_buf = fresh(slots, entries, header)
    python_buf = fresh(slots, entries, header)
    native = ferry_native.index_records(chunk, pos, native_buf, slots, entries, skip)
    try:
        python = indexfile.build_python(IndexFile(python_buf, slots, entries), chunk, pos, skip)
    except record.RecordError:
        python = None
    assert native == python
    assert native_buf == python_buf
    if native is None:
        assert native_buf == fresh(slots, entries, header)
    return native


@given(st.lists(keyed_records(), max_size=8), st.integers(0, 3), st.integers(1, 7),
       st.integers(2, 12), st.booleans())  # fmt: skip
@settings(max_examples=600, deadline=None)
def test_index_records_twin(parts, skip, slots, entries, prior) -> None:
    chunk = b"".join(parts)
    header = (5000, 9000, 10, 20, 0, 1) if prior else None
    got = both(chunk, 0, skip, slots, entries, header)
    assert got is not None
    if got[3] and got[0] < len(chunk):  # full mid-walk: resume in a new file
        both(chunk, got[0], got[1], slots, entries, header)


@given(chunks(), st.integers(2, 40))
@settings(max_examples=400, deadline=None)
def test_index_records_on_torn_and_corrupt_chunks(chunk, entries) -> None:
    buf, _starts = chunk
    both(buf, 0, 0, 3, entries)


def test_index_records_defers_on_a_wrong_buffer() -> None:
    chunk = record.encode_raw(b"T", 0, 0, 0, 0, 0, 1, bytes(8), 1, bytes(8), b"b",
                              b"KEYS\x01k\x02")  # fmt: skip
    assert ferry_native.index_records(chunk, 0, bytearray(10), 3, 4, 0) is None
    assert ferry_native.index_records(chunk, 0, bytes(file_size(3, 4)), 3, 4, 0) is None
    assert ferry_native.index_records(chunk, -1, fresh(3, 4), 3, 4, 0) is None
    buf = fresh(3, 4)
    assert ferry_native.index_records(chunk, 0, buf, 3, 4, 0) == (len(chunk), 0, False, False)
    assert IndexFile(buf, 3, 4).entries == 1
