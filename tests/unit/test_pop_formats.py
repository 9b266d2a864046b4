"""The pop formats: receipt handles and revive/timer-done records round-trip,
and anything else only ever raises PopFormatError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.receipt_handle import (
    BadHandle,
    HandleReader,
    PopFormatError,
    ReceiptHandle,
    decode_handle,
    handle_broker,
)
from services.broker.pop.records import Acks, Change, Checkpoint, decode_revive, encode_revive
from services.broker.schedule.timer_done import decode_timer_done, encode_timer_done

names = st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=30)
offsets = st.integers(0, 2**62)


@given(names, names, names, st.integers(0, 65535), offsets, offsets, offsets)
def test_handle_round_trip(broker, group, topic, queue_id, offset, checkpoint, until):
    handle = ReceiptHandle(broker, group, topic, queue_id, offset, checkpoint, until)
    assert decode_handle(handle.encode()) == handle


@given(names, names, names, st.integers(0, 65535), offsets, offsets, offsets)
def test_handle_broker_names_the_issuing_broker(broker, group, topic, queue_id, offset, ck, until):
    handle = ReceiptHandle(broker, group, topic, queue_id, offset, ck, until)
    assert handle_broker(handle.encode()) == broker


@pytest.mark.parametrize("text", ["", "1", "1 broker-a", "2 broker-a g T 0 0 0 0", "1  g T", None])
def test_handle_broker_of_what_is_not_a_handle(text):
    assert handle_broker(text) is None


@given(st.text(max_size=200))
def test_random_text_is_a_handle_or_a_format_error(text):
    with contextlib.suppress(PopFormatError):
        decode_handle(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1 a b c 0 0 0",
        "2 a b c 0 0 0 0",
        "1 a b c x 0 0 0",
        "1 a b c -1 0 0 0",
        "1  b c 0 0 0 0",
    ],
)
def test_bad_handles(text):
    with pytest.raises(PopFormatError):
        decode_handle(text)


def _decoded(text):
    """decode_handle's answer in HandleReader's shape, or its error."""
    try:
        h = decode_handle(text)
    except PopFormatError:
        return PopFormatError
    return (
        (h.broker_name, h.group, h.topic, h.queue_id),
        h.queue_offset,
        h.checkpoint,
        h.invisible_until_ms,
    )


tails = st.lists(
    st.sampled_from(["0", "7", "12", "x", "-1", "", " ", "٣", "1 2"]), min_size=0, max_size=5
)


@given(names, names, st.integers(0, 9), tails, st.text(max_size=40))
def test_handle_reader_answers_as_decode_handle(group, topic, queue_id, tail, noise):
    """The reader checks a known queue's handles by their last three fields
    only: whatever follows a primed prefix — or any other text — it accepts
    and rejects exactly what decode_handle does, with the same fields."""
    prefix = f"1 broker-a {group} {topic} {queue_id}"
    reader = HandleReader()
    assert reader.read(f"{prefix} 5 6 7") == _decoded(f"{prefix} 5 6 7")  # primes the prefix
    for text in (f"{prefix} {' '.join(tail)}", f"{prefix}{noise}", noise, f"{prefix} 1 2 {noise}"):
        expected = _decoded(text)
        if expected is PopFormatError:
            with pytest.raises(PopFormatError):
                reader.read(text)
        else:
            assert reader.read(text) == expected


@given(
    names,
    st.lists(
        st.tuples(
            st.sampled_from(["", "0", "7", "12", "٣", "x", "1 2"]),
            st.sampled_from([" 5 6", " 5 7", " 05 6", " 5", "", " 5 6 "]),
            st.sampled_from(
                [
                    "1 broker-a {g} T 3 ",
                    "1 broker-a {g} T 4 ",
                    "1 broker-b {g} T 3 ",
                    "",
                    "2 broker-a {g} T 3 ",
                ]
            ),
        ),
        max_size=12,
    ),
)
def test_handle_reader_reads_a_request_as_decode_handle(group, pieces):
    """A request's handles read together (the fast path reuses the last
    handle's text around its offset) give decode_handle's answers, or fail
    at the first handle decode_handle rejects."""
    texts = [prefix.format(g=group) + offset + suffix for offset, suffix, prefix in pieces]
    expected = [_decoded(t) for t in texts]
    bad = next((i for i, e in enumerate(expected) if e is PopFormatError), None)
    if bad is not None:
        with pytest.raises(BadHandle) as caught:
            HandleReader().read_all(texts)
        assert caught.value.index == bad
    else:
        assert HandleReader().read_all(texts) == [(h, o, c) for h, o, c, _ in expected]


@st.composite
def checkpoints(draw):
    start = draw(st.integers(0, 10**9))
    picked = sorted(draw(st.sets(st.integers(0, 50), max_size=10)))
    return Checkpoint(
        draw(names), draw(names), draw(st.integers(0, 100)), start, start + 51,
        tuple(start + p for p in picked), tuple(draw(st.integers(0, 20)) for _ in picked),
        draw(offsets),
    )  # fmt: skip


records = st.one_of(
    checkpoints(),
    st.builds(
        Acks,
        names,
        names,
        st.integers(0, 100),
        st.lists(st.tuples(offsets, offsets), max_size=5).map(tuple),
        st.sampled_from(["ack", "revive", "dlq"]),
    ),  # fmt: skip
    st.builds(
        Change,
        names,
        names,
        st.integers(0, 100),
        offsets,
        offsets,
        offsets,
        st.integers(0, 2**32 - 1),
    ),
)


@given(records)
def test_revive_record_round_trip(item):
    assert decode_revive(encode_revive(item)) == item


@given(st.binary(max_size=300))
def test_random_bytes_are_a_record_or_a_format_error(data):
    with contextlib.suppress(PopFormatError):
        decode_revive(data)
    with contextlib.suppress(PopFormatError):
        decode_timer_done(data)


GOOD = [
    Checkpoint("g", "t", 3, 5, 9, (5, 7), (1, 2), 1000),
    Acks("g", "t", 0, ((1, 2), (3, 4)), "revive"),
    Change("g", "t", 1, 4, 2, 9, 1),
]


@pytest.mark.parametrize("item", GOOD, ids=["ck", "ack", "chg"])
def test_every_truncation_and_extension_is_a_format_error(item):
    body = encode_revive(item)
    assert decode_revive(body) == item
    for cut in range(len(body)):
        with pytest.raises(PopFormatError):
            decode_revive(body[:cut])
    with pytest.raises(PopFormatError):
        decode_revive(body + b"\x00")


@pytest.mark.parametrize(
    "item",
    [
        Checkpoint("g", "t", 0, 5, 6, (9,), (1,), 1),  # an offset outside the range
        Checkpoint("g", "t", 0, 6, 5, (), (), 1),  # end before start
        Checkpoint("g", "t", -1, 5, 6, (5,), (1,), 1),  # a negative queue id
        Acks("g", "t", 0, ((-1, 2),)),
        Change("g", "t", 0, -4, 2, 9, 1),
    ],
)
def test_bad_revive_records(item):
    with pytest.raises(PopFormatError):
        decode_revive(encode_revive(item))


def test_unknown_kind_and_bad_names():
    body = encode_revive(GOOD[1])
    with pytest.raises(PopFormatError):
        decode_revive(b"Z" + body[1:])
    with pytest.raises(PopFormatError):
        decode_revive(encode_revive(Acks("", "t", 0, ())))
    with pytest.raises(PopFormatError):
        decode_revive(body.replace(b"g", b"\xff", 1))


@given(st.lists(st.integers(0, 2**62), max_size=50))
def test_timer_done_round_trip(listed):
    assert decode_timer_done(encode_timer_done(listed)) == tuple(listed)
