"""RocketMQ 5's pop header fields and BatchAck entries (ferry.remoting.pop_formats):
what the broker writes the proxy reads back, Java's BitSet layout as the 5.x client
builds it, and text that does not parse only ever raises PopFieldError."""

from __future__ import annotations

import base64
import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.remoting import pop_formats
from ferry.remoting.pop_formats import BatchAck, PopFieldError

marks = st.sampled_from([pop_formats.TOPIC_MARK, pop_formats.RETRY_MARK])
queue_ids = st.integers(0, 1023)
offsets = st.integers(0, 2**62)
popped = st.lists(st.tuples(marks, queue_ids, offsets), min_size=1, max_size=40)


@given(popped)
def test_offset_infos_round_trip(messages):
    start, listed = pop_formats.encode_offset_infos(messages)
    by_queue: dict[tuple[str, int], list[int]] = {}
    for mark, qid, offset in messages:
        by_queue.setdefault((mark, qid), []).append(offset)
    assert pop_formats.decode_msg_offsets(listed) == by_queue
    assert pop_formats.decode_start_offsets(start) == {k: min(v) for k, v in by_queue.items()}


def test_offset_infos_read_as_apache_writes_them():
    start, listed = pop_formats.encode_offset_infos([("0", 0, 5), ("0", 0, 6), ("1", 3, 9)])
    assert start == "0 0 5;1 3 9"
    assert listed == "0 0 5,6;1 3 9"


@given(st.lists(st.tuples(marks, queue_ids, offsets, st.integers(0, 1000)), max_size=40))
def test_order_counts_round_trip(counts):
    text = pop_formats.encode_order_counts(counts)
    assert pop_formats.decode_order_counts(text) == {(m, q, o): c for m, q, o, c in counts}


def test_order_counts_read_as_apache_writes_them():
    assert pop_formats.encode_order_counts([("0", 2, 17, 3)]) == "0 qo2%17 3"
    assert pop_formats.decode_order_counts("1 qo0%4 1;") == {("1", 0, 4): 1}


@given(st.sets(st.integers(0, 4095), max_size=200))
def test_bitset_round_trip(bits):
    assert pop_formats.decode_bitset(pop_formats.encode_bitset(bits)) == sorted(bits)


def test_bitset_is_javas_little_endian_byte_array():
    # new BitSet(); set(0); set(9); Base64 of toByteArray() -> {0x01, 0x02}
    assert pop_formats.encode_bitset([0, 9]) == base64.b64encode(b"\x01\x02").decode()
    assert pop_formats.encode_bitset([]) == ""
    assert pop_formats.decode_bitset(None) == []


@given(marks, st.integers(0, 2**40), queue_ids, st.sets(st.integers(0, 500), max_size=50))
def test_batch_ack_round_trip(mark, start, qid, bits):
    entry = BatchAck("g", "t", mark, start, qid, 0, 1_700_000_000_000, 30_000, tuple(sorted(bits)))
    assert BatchAck.from_json(entry.to_json()) == entry


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("not an object", "acks"),
        ({"t": "t", "so": 0, "q": 0, "pt": 1, "it": 1}, "acks.c"),
        ({"c": "g", "t": "t", "so": "0", "q": 0, "pt": 1, "it": 1}, "acks.so"),
        ({"c": "g", "t": "t", "so": 0, "q": True, "pt": 1, "it": 1}, "acks.q"),
        ({"c": "g", "t": "t", "so": 0, "q": 0, "pt": 1, "it": 2**63}, "acks.it"),
        ({"c": "g", "t": "t", "so": 0, "q": 0, "pt": 1, "it": 1, "b": "!!"}, "acks.b"),
        ({"c": "g", "t": "t", "so": 0, "q": 0, "pt": 1, "it": 1, "b": 7}, "acks.b"),
    ],
)
def test_batch_ack_refusals_name_the_field(entry, field):
    with pytest.raises(PopFieldError) as refused:
        BatchAck.from_json(entry)
    assert refused.value.field == field


@given(st.text(max_size=80))
def test_header_fields_from_junk_raise_only_pop_field_error(text):
    for decode in (
        pop_formats.decode_start_offsets,
        pop_formats.decode_msg_offsets,
        pop_formats.decode_order_counts,
    ):
        with contextlib.suppress(PopFieldError):
            decode(text)


@given(st.text(max_size=120))
def test_bitset_from_junk_raises_only_pop_field_error(text):
    with contextlib.suppress(PopFieldError):
        pop_formats.decode_bitset(text)
