"""ferry_native.scan_dispatch (native/src/dispatch.rs) against the Python it mirrors,
`ferry.record.scan_dispatch` run without the native module: equal answers on
commit-log chunks (whole, torn, corrupted), and None exactly where the Python raises
`RecordError` (the Python then raises it with its own message).

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from tests.native_twins import require_native

ferry_native = require_native()

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TYPICAL_PROPS = b"UNIQ_KEY\x01" + b"0123456789ABCDEF" * 2 + b"\x02TAGS\x01TagA\x02"


def python_scan(buf: bytes, pos: int):
    """`record.scan_dispatch` with the native module off; None where it raises RecordError."""
    saved = record._native
    record._native = None
    try:
        return record.scan_dispatch(buf, pos)
    except record.RecordError:
        return None
    finally:
        record._native = saved


def check(buf: bytes, pos: int = 0):
    """The native answer equals the Python one (None where Python raises), with the same
    types; the wired `record.scan_dispatch` gives it too. Returns the native answer."""
    native = ferry_native.scan_dispatch(buf, pos)
    python = python_scan(buf, pos)
    assert native == python
    if native is not None:
        records, end, blank = native
        assert type(records) is list and type(end) is int and type(blank) is bool
        for item in records:
            assert type(item) is tuple and len(item) == 7
            assert type(item[2]) is bytes and type(item[6]) is bytes
        assert record.scan_dispatch(buf, pos) == python
    return native


def _record(topic=b"TopicTest", body=b"x", props=b"", queue_id=0, queue_offset=0,
            commit_offset=0, store_ts=0) -> bytes:  # fmt: skip
    return record.encode_raw(
        topic, queue_id, 0, queue_offset, commit_offset, 0, 1, bytes(8), store_ts, bytes(8),
        body, props,
    )  # fmt: skip


# ---------------------------------------------------------------- generated chunks

topics = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).map(
    lambda t: t.encode()[:127] or b"T"
)  # non-ASCII included; a cut may leave broken UTF-8, which the scan does not check
words = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
                max_size=8).map(str.encode)  # fmt: skip
prop_items = st.one_of(
    st.builds(lambda k, v: k + b"\x01" + v + b"\x02", words, words),
    st.builds(lambda v: b"TAGS\x01" + v + b"\x02", words),
    st.builds(lambda v: b"XTAGS\x01" + v + b"\x02", words),
    st.builds(lambda k, v: k + b"\x01" + v + b"TAGS\x01", words, words),
    st.binary(max_size=8),
)


@st.composite
def properties(draw) -> bytes:
    props = b"".join(draw(st.lists(prop_items, max_size=5)))
    if draw(st.booleans()):  # TAGS last without its separator
        props += b"TAGS\x01" + draw(words)
    return props


@st.composite
def records(draw) -> bytes:
    return _record(
        draw(topics), draw(st.binary(max_size=64)), draw(properties()), draw(I32), draw(I64),
        draw(I64), draw(I64),
    )  # fmt: skip


# Field positions inside a record that a corruption aims at (start, width).
FIELDS = [(0, 4), (4, 4), (record.HEAD_SIZE - 4, 4)]


@st.composite
def chunks(draw) -> tuple[bytes, list[int]]:
    """Whole records, maybe a BLANK marker and trailing bytes, maybe torn and corrupted;
    and the record starts."""
    parts = draw(st.lists(records(), max_size=6))
    starts, at = [], 0
    for part in parts:
        starts.append(at)
        at += len(part)
    buf = b"".join(parts)
    if draw(st.booleans()):
        starts.append(len(buf))
        buf += struct.pack(">iI", draw(st.one_of(st.integers(8, 1 << 20), I32)), record.BLANK_MAGIC)
    buf += draw(st.sampled_from([b"", bytes(16), b"\xff" * 3]))
    if draw(st.booleans()):
        buf = buf[: draw(st.integers(0, len(buf)))]
    data = bytearray(buf)
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        if starts and draw(st.booleans()):
            start = draw(st.sampled_from(starts))
            body_len = (
                struct.unpack_from(">i", data, start + 84)[0] if start + 88 <= len(data) else 0
            )
            topic_at = start + record.HEAD_SIZE + max(body_len, 0)
            topic_len = data[topic_at] if topic_at < len(data) else 0
            fields = [*FIELDS, (topic_at - start, 1), (topic_at - start + 1 + topic_len, 2)]
            offset, width = draw(st.sampled_from(fields))
            for k in range(start + offset, min(start + offset + width, len(data))):
                data[k] = draw(st.integers(0, 255))
        else:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data), starts


@given(chunks(), st.data())
@settings(max_examples=1000, deadline=None)
def test_scan_dispatch_reads_what_record_reads(chunk, data):
    buf, starts = chunk
    check(buf, 0)
    pos = data.draw(st.one_of(st.sampled_from([0, *starts]), st.integers(0, len(buf) + 9)))
    check(buf, pos)


@given(st.lists(records(), min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_scan_dispatch_of_whole_records_is_not_deferred(parts):
    buf = b"".join(parts)
    assert len(check(buf)[0]) == len(parts)


@given(st.binary(max_size=300), st.integers(0, 310))
@settings(max_examples=500, deadline=None)
def test_scan_dispatch_of_random_bytes(buf, pos):
    check(buf, pos)


# ---------------------------------------------------------------- edge cases


@pytest.mark.parametrize(
    ("props", "tags"),
    [
        (b"", b""), (b"TAGS\x01A\x02", b"A"), (b"TAGS\x01A", b"A"), (b"K\x01v\x02TAGS\x01A\x02", b"A"),
        (b"K\x01v\x02TAGS\x01A", b"A"), (b"TAGS\x01A\x02TAGS\x01B\x02", b"A"),
        (b"XTAGS\x01A\x02TAGS\x01B\x02", b""), (b"K\x01TAGS\x01A\x02", b""), (b"TAGS\x01\x02", b""),
        (b"TAGS\x01", b""), (b"TAGS", b""), (b"TAGS\x02", b""), (b"\x02TAGS\x01\xc3\xa9\x02", "é".encode()),
        (b"TAGS\x01A\x01B\x02C", b"A\x01B"), (TYPICAL_PROPS, b"TagA"), (b"\x00" * 5, b""),
    ],
)  # fmt: skip
def test_scan_dispatch_tags(props, tags):
    ((*_, got),), _, _ = check(_record(props=props))
    assert got == tags


def test_scan_dispatch_fields():
    one = _record("主题".encode(), b"body", TYPICAL_PROPS, -(2**31), -(2**63), 2**63 - 1, -1)
    two = _record(b"", b"", b"", 2**31 - 1, 7, 0, 2**63 - 1)
    records, end, blank = check(one + two)
    assert records == [
        (2**63 - 1, len(one), "主题".encode(), -(2**31), -(2**63), -1, b"TagA"),
        (0, record.MIN_RECORD_SIZE, b"", 2**31 - 1, 7, 2**63 - 1, b""),
    ]
    assert (end, blank) == (len(one) + len(two), False)


BLANK = record.encode_blank(8)
ONE = _record()
ONE_ENTRY = (0, len(ONE), b"TopicTest", 0, 0, 0, b"")


@pytest.mark.parametrize(
    ("buf", "pos", "expected"),
    [
        (b"", 0, ([], 0, False)),
        (b"\x00" * 7, 0, ([], 0, False)),
        (ONE[:-1], 0, ([], 0, False)),  # torn: read more and call again
        (ONE + ONE[:50], 0, ([ONE_ENTRY], len(ONE), False)),
        (ONE + BLANK, 0, ([ONE_ENTRY], len(ONE), True)),
        (ONE + record.encode_blank(1 << 20), 0, ([ONE_ENTRY], len(ONE), True)),
        (ONE + struct.pack(">iI", 7, record.BLANK_MAGIC), 0, None),
        (ONE + struct.pack(">iI", -1, record.BLANK_MAGIC), 0, None),
        (ONE + bytes(8), 0, None),  # zeros: bad magic
        (struct.pack(">iI", record.MIN_RECORD_SIZE - 1, record.MESSAGE_MAGIC), 0, None),
        (struct.pack(">iI", -5, record.MESSAGE_MAGIC), 0, None),
        (ONE, len(ONE), ([], len(ONE), False)),
        (ONE, len(ONE) + 100, ([], len(ONE) + 100, False)),
        (ONE, 2**62, ([], 2**62, False)),
        (ONE + ONE, len(ONE), ([ONE_ENTRY], 2 * len(ONE), False)),
        (ONE, 1, None),
        (ONE, -1, None),  # negative: deferred, Python decides
        (ONE, -len(ONE), None),
    ],
)  # fmt: skip
def test_scan_dispatch_stops(buf, pos, expected):
    assert ferry_native.scan_dispatch(buf, pos) == expected
    if pos >= 0:
        assert python_scan(buf, pos) == expected


def _patched(buf: bytes, at: int, fmt: str, value: int) -> bytes:
    data = bytearray(buf)
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


@pytest.mark.parametrize(
    "buf",
    [
        _patched(ONE, 84, ">i", -1),  # body length
        _patched(ONE, 84, ">i", 2**31 - 1),
        _patched(ONE, 84, ">i", 2),  # lengths no longer add up
        _patched(ONE, 89, ">B", 255),  # topic length
        _patched(ONE, 89, ">B", 0),
        _patched(ONE, 90 + 9, ">H", 1),  # properties length
        _patched(ONE, 0, ">i", len(ONE) + 1) + b"\x00",  # TOTALSIZE
    ],
)
def test_scan_dispatch_defers_what_record_refuses(buf):
    assert python_scan(buf, 0) is None
    assert ferry_native.scan_dispatch(buf, 0) is None
    with pytest.raises(record.RecordError):
        record.scan_dispatch(buf, 0)


@pytest.mark.parametrize("buf", [bytearray(ONE), memoryview(ONE), "x", None])
def test_scan_dispatch_takes_bytes_only(buf):
    with pytest.raises(TypeError):
        ferry_native.scan_dispatch(buf, 0)


def test_scan_dispatch_of_a_typical_chunk_is_native(monkeypatch):
    """What the dispatcher reads (bytes of whole records and a torn one) is answered
    natively, and `record.scan_dispatch` returns that answer."""
    parts = [
        _record(body=bytes(128), props=TYPICAL_PROPS, queue_id=n % 4, queue_offset=n,
                commit_offset=n * 250, store_ts=1_700_000_000_000 + n)
        for n in range(64)
    ]  # fmt: skip
    chunk = b"".join(parts)[:-10]
    native = ferry_native.scan_dispatch(chunk, 0)
    assert native is not None and len(native[0]) == 63
    assert native == python_scan(chunk, 0)
    assert record._native is ferry_native
    calls = []

    def spy(buf, pos):
        calls.append(pos)
        return ferry_native.scan_dispatch(buf, pos)

    monkeypatch.setattr(record, "_native", type("Spy", (), {"scan_dispatch": staticmethod(spy)}))
    assert record.scan_dispatch(chunk, 0) == native
    assert calls == [0]
    record.scan_dispatch(memoryview(chunk), 0)  # not bytes: the Python path
    assert calls == [0]
