"""The batch-send body (ferry.remoting.batch): golden bytes as Apache's
client writes them, round trips, and hostile bodies."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.remoting import batch
from ferry.remoting.batch import BatchEntry, BatchError


def java_entry(flag: int, body: bytes, properties: bytes) -> bytes:
    """One entry laid out field by field as MessageDecoder.encodeMessage writes it."""
    total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(properties)
    return (
        struct.pack(">iiii", total, 0, 0, flag)
        + struct.pack(">i", len(body))
        + body
        + struct.pack(">h", len(properties))
        + properties
    )


def test_golden_bytes():
    entries = [
        BatchEntry(0, b"hello", b"TAGS\x01a\x02UNIQ_KEY\x01AB"),
        BatchEntry(-1, b"", b""),
    ]
    golden = java_entry(0, b"hello", b"TAGS\x01a\x02UNIQ_KEY\x01AB") + java_entry(-1, b"", b"")
    assert batch.encode(entries) == golden
    assert batch.decode(golden) == entries


entries_strategy = st.lists(
    st.builds(
        BatchEntry,
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=64),
        st.binary(max_size=64),
    ),
    min_size=1,
    max_size=8,
)


@given(entries_strategy)
def test_round_trip(entries):
    assert batch.decode(batch.encode(entries)) == entries


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_batch_error(data):
    try:
        entries = batch.decode(data)
    except BatchError:
        return
    assert batch.encode(entries) == data


@given(entries_strategy, st.data())
def test_a_cut_entry_is_refused_before_or_after_whole_ones(entries, data):
    body = batch.encode(entries[:1])
    cut = data.draw(st.integers(1, len(body) - 1))
    with pytest.raises(BatchError):
        batch.decode(body[:cut] if data.draw(st.booleans()) else body + body[:cut])
    with pytest.raises(BatchError):
        batch.decode(batch.encode(entries) + body[:cut])


def test_lengths_that_lie_are_named():
    good = java_entry(0, b"abc", b"k\x01v")
    with pytest.raises(BatchError, match="TOTALSIZE"):
        batch.decode(struct.pack(">i", 999) + good[4:])
    with pytest.raises(BatchError, match="body length"):
        batch.decode(good[:16] + struct.pack(">i", 2**31 - 1) + good[20:])
    with pytest.raises(BatchError, match="body length -1"):
        batch.decode(good[:16] + struct.pack(">i", -1) + good[20:])
    with pytest.raises(BatchError, match="properties length -1"):
        batch.decode(good[:23] + struct.pack(">h", -1) + good[25:])
    with pytest.raises(BatchError, match="empty"):
        batch.decode(b"")
    with pytest.raises(BatchError, match="more than 2"):
        batch.decode(good * 3, max_entries=2)
