"""The commit-log record codec: golden bytes, round trips, hostile input."""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from ferry.record import Blank, Record, RecordError

GOLDEN = Record(
    topic="TopicTest",
    queue_id=3,
    body=b"hello",
    queue_offset=7,
    commit_offset=4096,
    flag=0,
    sys_flag=0,
    born_timestamp=1_700_000_000_000,
    born_host=("10.0.0.5", 50123),
    store_timestamp=1_700_000_000_005,
    store_host=("10.0.0.1", 10911),
    properties={"TAGS": "tagA"},
)


def golden_bytes() -> bytes:
    """The same record assembled field by field from the table in
    docs/reference/contract.md, "The commit-log record"."""
    body, topic, props = b"hello", b"TopicTest", b"TAGS\x01tagA\x02"
    total = (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + 8
        + 8
        + 8
        + 4
        + 8
        + 4
        + len(body)
        + 1
        + len(topic)
        + 2
        + len(props)
    )
    return b"".join([
        struct.pack(">i", total),
        bytes.fromhex("DAA320A7"),
        struct.pack(">I", zlib.crc32(body) & 0x7FFFFFFF),
        struct.pack(">i", 3),  # queue id
        struct.pack(">i", 0),  # flag
        struct.pack(">q", 7),  # queue offset
        struct.pack(">q", 4096),  # physical offset
        struct.pack(">i", 0),  # sys flag
        struct.pack(">q", 1_700_000_000_000),
        bytes([10, 0, 0, 5]) + struct.pack(">i", 50123),
        struct.pack(">q", 1_700_000_000_005),
        bytes([10, 0, 0, 1]) + struct.pack(">i", 10911),
        struct.pack(">i", 0),  # reconsume times
        struct.pack(">q", 0),  # prepared transaction offset
        struct.pack(">i", len(body)) + body,
        struct.pack(">b", len(topic)) + topic,
        struct.pack(">h", len(props)) + props,
    ])  # fmt: skip


def test_golden_bytes():
    data = record.encode(GOLDEN)
    assert data == golden_bytes()
    assert len(data) == 115
    assert data.hex()[:16] == "00000073daa320a7"


def test_decode_golden():
    decoded = record.decode(golden_bytes())
    assert isinstance(decoded, Record)
    assert decoded.tags == "tagA" and decoded.body == b"hello" and decoded.commit_offset == 4096
    assert decoded.born_host == ("10.0.0.5", 50123)


def test_blank_marker():
    marker = record.encode_blank(100)
    assert marker == bytes.fromhex("00000064CBD43194")
    assert record.decode(marker + bytes(92)) == Blank(100)
    with pytest.raises(RecordError):
        record.encode_blank(7)


def test_crc_mismatch_is_detected():
    data = bytearray(golden_bytes())
    data[record.HEAD_SIZE] ^= 0x01  # flip a body bit
    with pytest.raises(RecordError, match="CRC"):
        record.decode(bytes(data))
    assert isinstance(record.decode(bytes(data), check_crc=False), Record)


@pytest.mark.parametrize("cut", range(0, 115, 3))
def test_every_truncation_is_a_record_error(cut):
    with pytest.raises(RecordError):
        record.decode(golden_bytes()[:cut])


def test_unencodable_values_raise_record_error():
    with pytest.raises(RecordError, match="topic"):
        record.encode(Record(topic="", queue_id=0, body=b"x"))
    with pytest.raises(RecordError, match="separator"):
        record.encode(Record(topic="T", queue_id=0, body=b"x", properties={"a\x01": "b"}))
    with pytest.raises(RecordError, match="IPv4"):
        record.encode(Record(topic="T", queue_id=0, body=b"x", born_host=("::1", 1)))
    with pytest.raises(RecordError, match="out of range"):
        record.encode(Record(topic="T", queue_id=2**40, body=b"x"))


prop_text = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=20
)
records = st.builds(
    Record,
    topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True),
    queue_id=st.integers(0, 65535),
    body=st.binary(max_size=2000),
    queue_offset=st.integers(0, 2**62),
    commit_offset=st.integers(0, 2**62),
    flag=st.integers(-(2**31), 2**31 - 1),
    born_timestamp=st.integers(0, 2**50),
    store_timestamp=st.integers(0, 2**50),
    born_host=st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    properties=st.dictionaries(prop_text.filter(bool), prop_text, max_size=5),
)


@given(records)
def test_round_trip(rec):
    data = record.encode(rec)
    decoded = record.decode(data)
    assert decoded == Record(
        **{**{f: getattr(rec, f) for f in Record.__slots__}, "body_crc": record.body_crc(rec.body)}
    )


@settings(max_examples=500)
@given(st.binary(max_size=400), st.integers(0, 16))
def test_random_bytes_only_raise_record_error(data, pos):
    with contextlib.suppress(RecordError):
        record.decode(data, pos)


@settings(max_examples=300)
@given(st.integers(0, 114), st.integers(0, 255))
def test_mutated_golden_only_raises_record_error(index, value):
    data = bytearray(golden_bytes())
    data[index] = value
    with contextlib.suppress(RecordError):
        record.decode(bytes(data))


def _raw(properties: bytes) -> bytes:
    host = record.pack_host(("127.0.0.1", 10911))
    return record.encode_raw(
        b"T", 0, 0, 0, 0, 0, 1, host, 2, host, b"body", properties
    )  # fmt: skip


def test_recovery_takes_properties_without_a_trailing_separator_as_apache_4_9_writes_them():
    # Apache 4.9's broker writes `k\x01v\x02k\x01v`: no separator after the last value
    # (seen in its commit log, tests/compat). ferry writes one. Both are whole records.
    for props in (b"TAGS\x01a\x02KEYS\x01k", b"TAGS\x01a\x02KEYS\x01k\x02"):
        buf = _raw(props) * 2
        assert record.scan_valid(buf, 0, len(buf)) == (len(buf), None)
        decoded = record.decode(buf[: len(buf) // 2])
        assert decoded.tags == "a" and decoded.keys == "k"


def test_recovery_still_cuts_properties_that_end_in_zeros():
    buf = _raw(b"TAGS\x01a\x02KEYS\x01\x00\x00")
    assert record.scan_valid(buf, 0, len(buf)) == (
        0,
        "topic or properties end in zeros (a torn write)",
    )


def test_a_consumer_reads_a_compressed_body_inflated_and_a_bad_one_as_stored():
    # Apache's 4.x producer deflates bodies over 4 KiB and sets SYSFLAG bit 0; its consumers
    # (and its 5.x proxy) inflate them. ferry's reads for consumers do the same.
    host = record.pack_host(("127.0.0.1", 10911))
    plain = b"order 4711 " * 1000
    for sys_flag, body, want in (
        (0x1, zlib.compress(plain), plain),  # 4.x: zlib, no codec bits
        (0x1 | 3 << 8, zlib.compress(plain), plain),  # 5.x: ZLIB named
        (0x0, zlib.compress(plain), zlib.compress(plain)),  # not flagged: as stored
        (0x1, b"not zlib at all", b"not zlib at all"),  # corrupt: as stored
        (0x1 | 1 << 8, b"lz4 frame", b"lz4 frame"),  # LZ4: as stored
    ):
        raw = record.encode_raw(b"T", 0, 0, 0, 0, sys_flag, 1, host, 2, host, body, b"")
        assert record.decode_stored(raw, 0, len(raw)).body == want
    bomb = zlib.compress(b"\0" * (record.MAX_INFLATED_BODY + 1))
    raw = record.encode_raw(b"T", 0, 0, 0, 0, 0x1, 1, host, 2, host, bomb, b"")
    assert record.decode_stored(raw, 0, len(raw)).body == bomb
