"""ferry_native.gather_records (native/src/gather.rs) against the Python it mirrors,
`ferry.record.gather_records` run without the native module: equal answers for a raw
pull's walk over consume-queue entries (confirm offset, byte budget, first record over
the budget, bytes and bytearrays), and None exactly where the Python raises
`RecordError` (entries that point at no record of their size).

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from tests.native_twins import require_native

ferry_native = require_native()

START = 1_000_000  # the read's commit offset


def python_gather(data, start, entries, confirm, budget, have):
    saved = record._native
    record._native = None
    try:
        return record.gather_records(data, start, entries, confirm, budget, have)
    except record.RecordError:
        return None
    finally:
        record._native = saved


def check(data, start, entries, confirm, budget, have):
    native = ferry_native.gather_records(data, start, entries, confirm, budget, have)
    python = python_gather(data, start, entries, confirm, budget, have)
    assert native == python
    if native is not None:
        chunk, taken, kept, last, left, stopped = native
        assert type(chunk) is bytes and type(taken) is int and type(stopped) is bool
        assert kept == taken  # no tag filter natively
        assert record.gather_records(data, start, entries, confirm, budget, have) == python
    return native


def log(bodies: list[bytes], gap: int = 0) -> tuple[bytes, list[tuple[int, int, int]]]:
    """Records of these bodies from START, `gap` foreign bytes between them; the entries."""
    data = bytearray()
    entries = []
    for i, body in enumerate(bodies):
        data += b"\0" * (gap if i else 0)
        offset = START + len(data)
        raw = record.encode_raw(
            b"T", 0, 0, i, offset, 0, 1, bytes(8), 2, bytes(8), body, b"TAGS\x01A\x02"
        )
        entries.append((offset, len(raw), 7))
        data += raw
    return bytes(data), entries


def test_every_record_under_an_open_budget_is_taken_back_to_back():
    data, entries = log([b"a" * 10, b"b" * 200, b"c"])
    chunk, taken, kept, last, left, stopped = check(data, START, entries, 1 << 40, 1 << 20, False)
    assert chunk == data and taken == kept == 3 and last == entries[-1][0] and not stopped
    assert left == (1 << 20) - len(data)


def test_the_confirm_offset_and_the_budget_stop_the_walk():
    data, entries = log([b"a" * 10, b"b" * 10, b"c" * 10], gap=5)
    second_end = entries[1][0] + entries[1][1]
    chunk, taken, *_, stopped = check(data, START, entries, second_end, 1 << 20, False)
    assert taken == 2 and stopped  # the third is not confirmed yet
    size = entries[0][1]
    assert check(data, START, entries, 1 << 40, size, False)[1:] == (1, 1, entries[0][0], 0, True)
    # A pull's first record goes whatever its size; with records already held it does not.
    assert check(data, START, entries, 1 << 40, 1, False)[1] == 1
    assert check(data, START, entries, 1 << 40, 1, True)[:2] == (b"", 0)


def test_entries_that_point_at_no_record_of_their_size_defer_to_the_python_error():
    data, entries = log([b"a" * 10, b"b" * 10])
    (o0, s0, c0), (o1, s1, c1) = entries
    for bad in ([(o0, s0 + 1, c0)], [(o0 + 1, s0, c0)], [(o0 - START - 1 + START - 1, s0, c0)],
                [(o1, s1 + 100, c1)], [(o0, -5, c0)], [(o0, 3, c0)]):  # fmt: skip
        assert check(data, START, bad, 1 << 40, 1 << 20, False) is None
        with pytest.raises(record.RecordError):
            record.gather_records(data, START, bad, 1 << 40, 1 << 20, False)
    # Not three ints: the native walk defers, and the wired function answers as the Python.
    odd = [(o0, s0, "seven")]
    assert ferry_native.gather_records(data, START, odd, 1 << 40, 1 << 20, False) is None
    wired = record.gather_records(data, START, odd, 1 << 40, 1 << 20, False)
    assert wired == python_gather(data, START, odd, 1 << 40, 1 << 20, False) and wired[1] == 1


def test_a_tag_filter_passes_over_entries_in_the_python_walk():
    """With tag hashes the walk is the Python's alone: entries of other tags are taken
    (the pull moves past them) but not kept, and leave the budget as it was."""
    data, entries = log([b"a" * 10, b"b" * 10, b"c" * 10])
    entries[1] = (entries[1][0], entries[1][1], 9)  # another tag
    chunk, taken, kept, last, left, stopped = record.gather_records(
        data, START, entries, 1 << 40, 1 << 20, False, frozenset({7})
    )
    first, third = entries[0], entries[2]
    assert (taken, kept, last, stopped) == (3, 2, third[0], False)
    assert chunk == data[: first[1]] + data[third[0] - START :]
    assert left == (1 << 20) - first[1] - third[1]
    # An entry that points at no record raises only when it is kept.
    broken = [entries[0], (entries[1][0] + 1, entries[1][1], 9)]
    assert (
        record.gather_records(data, START, broken, 1 << 40, 1 << 20, False, frozenset({7}))[2] == 1
    )
    with pytest.raises(record.RecordError):
        record.gather_records(data, START, broken, 1 << 40, 1 << 20, False, frozenset({9}))


def test_a_bytearray_read_is_walked_alike():
    data, entries = log([b"x" * 40] * 4, gap=3)
    assert check(bytearray(data), START, entries, 1 << 40, 1 << 20, False)[1] == 4


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=12),
    gap=st.integers(0, 40),
    confirm_cut=st.integers(0, 5000),
    budget=st.integers(0, 5000),
    have=st.booleans(),
    corrupt=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(-200, 200))),
    flip=st.one_of(st.none(), st.integers(0, 5000)),
)
def test_native_and_python_agree_on_any_walk(bodies, gap, confirm_cut, budget, have, corrupt, flip):
    data, entries = log(bodies, gap)
    if corrupt is not None:
        i, delta = corrupt
        i %= len(entries)
        offset, size, code = entries[i]
        entries[i] = (offset + delta, size, code) if delta % 2 else (offset, size + delta, code)
    if flip is not None:
        at = flip % len(data)
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    confirm = START + len(data) - confirm_cut
    check(data, START, entries, confirm, budget, have)
