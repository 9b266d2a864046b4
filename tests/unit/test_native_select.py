"""ferry_native.property_values (native/src/select.rs) against the Python it mirrors,
`ferry.record.property_values` run without the native module: the same values of the
named properties for each entry of an SQL92-filtered pull (absent ones None, the later
of duplicate names), and None exactly where the Python raises `RecordError` (an entry
that points at no record of its size, properties that are not UTF-8 or have an item
without "\\x01").

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


def python_values(data, start, entries, names):
    saved = record._native
    record._native = None
    try:
        return record.property_values(data, start, entries, names)
    except record.RecordError:
        return None
    finally:
        record._native = saved


def check(data, start, entries, names):
    native = ferry_native.property_values(data, start, entries, names)
    python = python_values(data, start, entries, names)
    assert native == python
    if native is not None:
        assert all(type(v) is tuple for v in native)
        assert record.property_values(data, start, entries, names) == python
    return native


def log(
    properties: list[bytes], gap: int = 0, body: bytes = b"body"
) -> tuple[bytes, list[tuple[int, int, int]]]:
    """Records with these raw property strings from START, `gap` foreign bytes between
    them; the entries."""
    data = bytearray()
    entries = []
    for i, props in enumerate(properties):
        data += b"\0" * (gap if i else 0)
        offset = START + len(data)
        raw = record.encode_raw(b"T", 0, 0, i, offset, 0, 1, bytes(8), 2, bytes(8), body, props)
        entries.append((offset, len(raw), 7))
        data += raw
    return bytes(data), entries


def test_the_named_values_of_each_record_none_when_absent():
    data, entries = log(
        [b"a\x011\x02TAGS\x01A\x02", b"TAGS\x01B\x02", b"", b"a\x01x\x02a\x01y\x02"]
    )
    got = check(data, START, entries, ("a", "TAGS"))
    assert got == [("1", "A"), (None, "B"), (None, None), ("y", None)]
    assert check(data, START, entries, ()) == [()] * 4
    assert check(data, START, [], ("a",)) == []


def test_what_the_python_refuses_defers_to_its_error():
    good, entries = log([b"a\x011\x02"])
    (offset, size, code) = entries[0]
    for bad in ([(offset, size + 1, code)], [(offset + 1, size, code)], [(offset, -5, code)],
                [(offset, 3, code)], [(START - 10, size, code)]):  # fmt: skip
        assert check(good, START, bad, ("a",)) is None
        with pytest.raises(record.RecordError):
            record.property_values(good, START, bad, ("a",))
    for props in (b"\xff\xfe\x01x\x02", b"no-separator\x02"):
        data, entries = log([props])
        assert check(data, START, entries, ("a",)) is None
        with pytest.raises(record.RecordError):
            record.property_values(data, START, entries, ("a",))
    # Not three ints, a name that is not a str: the native walk defers, the Python answers.
    odd = [(offset, size, "seven")]
    assert ferry_native.property_values(good, START, odd, ("a",)) is None
    assert record.property_values(good, START, odd, ("a",)) == [("1",)]


def test_a_bytearray_read_is_walked_alike():
    data, entries = log([b"k\x01v\x02"] * 4, gap=3)
    assert check(bytearray(data), START, entries, ("k",)) == [("v",)] * 4


names_st = st.sampled_from(["a", "b", "TAGS", "é", "a\x01"])
value_st = st.text(alphabet=st.sampled_from(["1", "x", "é", "\x01", "\x02", " "]), max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.lists(st.tuples(names_st, value_st), max_size=5), min_size=1, max_size=8),
    names=st.lists(names_st, max_size=3, unique=True),
    gap=st.integers(0, 20),
    corrupt=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.integers(-50, 50))),
    flip=st.one_of(st.none(), st.integers(0, 3000)),
)
def test_native_and_python_agree_on_any_read(records, names, gap, corrupt, flip):
    raw = [b"".join(f"{k}\x01{v}\x02".encode() for k, v in items) for items in records]
    data, entries = log(raw, gap)
    if corrupt is not None:
        i, delta = corrupt
        i %= len(entries)
        offset, size, code = entries[i]
        entries[i] = (offset + delta, size, code) if delta % 2 else (offset, size + delta, code)
    if flip is not None:
        at = flip % len(data)
        data = data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]
    check(data, START, entries, tuple(names))
