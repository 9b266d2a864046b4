"""ferry_native.encode_records (native/src/encode.rs) against what it mirrors:
`CommitLog.append_many` laying out records encoded by `record.encode_raw` (the
store's path without the native module). Equal chunks and offsets, across file
ends; None exactly where the Python would refuse, and only for inputs the native
code is not sure of (the store then takes the Python path).

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from services.broker.store.commitlog import CommitLog
from services.broker.store.message_store import MessageIn, _encoder
from tests.native_twins import require_native

ferry_native = require_native()

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
HOST = st.binary(min_size=8, max_size=8)


def python_layout(tmp_path, records, position, file_size, store_ts, store_host):
    """(chunks, offsets) as `CommitLog.append_many` writes them with `encode_raw`; None
    where it raises (a record larger than a file, a field out of its range)."""
    log = CommitLog(tmp_path / f"log-{file_size}", file_size)
    writes: list[tuple[int, bytes]] = []
    log._write_offset = position
    log._write = lambda start, data: writes.append((start, bytes(data)))  # type: ignore[method-assign]
    items = [
        (
            record.encoded_size(len(t), len(m.body), len(m.properties)),
            _encoder(t, q, o, m, store_ts, store_host),
        )
        for t, q, o, m in records
    ]
    try:
        offsets = log.append_many(items)
    except (record.RecordError, struct.error):
        return None
    finally:
        log.close()
    return [w for w in writes if w[1]], offsets


messages = st.builds(
    MessageIn,
    body=st.binary(max_size=300),
    properties=st.binary(max_size=120),
    flag=I32,
    born_timestamp=I64,
    born_host=HOST,
    sys_flag=I32,
    reconsume_times=I32,
    prepared_offset=I64,
)
entries = st.tuples(st.binary(min_size=1, max_size=40), I32, I64, messages)


@given(
    st.lists(entries, max_size=8),
    st.integers(0, 5000),
    st.integers(200, 2048),
    I64,
    HOST,
)
@settings(max_examples=400, deadline=None)
def test_the_layout_is_append_many_s(tmp_path_factory, records, position, file_size, ts, host):
    tmp = tmp_path_factory.mktemp("enc")
    native = ferry_native.encode_records(records, position, file_size, ts, host)
    python = python_layout(tmp, records, position, file_size, ts, host)
    assert native == python
    if native is not None:
        chunks, offsets = native
        assert type(chunks) is list and type(offsets) is list
        assert all(type(c) is tuple and type(c[1]) is bytes for c in chunks)


def test_records_cross_a_file_end_after_a_blank_marker(tmp_path):
    """A record that does not fit before the file's end starts the next file; the
    first chunk ends with the BLANK marker of what is left."""
    host = record.pack_host(("127.0.0.1", 10911))
    m = MessageIn(body=b"x" * 100, properties=b"TAGS\x01a\x02", born_host=host)
    records = [(b"T", 0, i, m) for i in range(5)]
    size = record.encoded_size(1, 100, len(m.properties))
    native = ferry_native.encode_records(records, 1000, 1024, 7, host)
    assert native is not None
    chunks, offsets = native
    assert [start for start, _ in chunks] == [1000, 1024]
    assert chunks[0][1] == struct.pack(">iI", 24, record.BLANK_MAGIC)
    assert offsets == [1024 + i * size for i in range(5)]
    assert native == python_layout(tmp_path, records, 1000, 1024, 7, host)


def test_what_the_python_decides_is_left_to_it(tmp_path):
    """None (the Python path then runs) for a record larger than a file, a host that
    is not 8 bytes, a topic over 255 bytes, a value outside its field."""
    host = record.pack_host(("127.0.0.1", 10911))
    ok = MessageIn(body=b"b", properties=b"", born_host=host)
    cases = [
        [(b"T", 0, 0, MessageIn(body=b"x" * 5000, properties=b"", born_host=host))],
        [(b"T", 0, 0, MessageIn(body=b"b", properties=b"", born_host=b"\x7f\x00\x00\x01"))],
        [(b"T" * 256, 0, 0, ok)],
        [(b"T", 2**31, 0, ok)],
        [(b"T", 0, 0, MessageIn(body=b"b", properties=b"", born_host=host, flag=2**31))],
        [(b"T", 0, 0, MessageIn(body="text", properties=b"", born_host=host))],  # type: ignore[arg-type]
        [("T", 0, 0, ok)],
        [(b"T", 0, 0)],
    ]
    for records in cases:
        assert ferry_native.encode_records(records, 0, 1024, 1, host) is None, records
    assert ferry_native.encode_records([(b"T", 0, 0, ok)], 0, 1024, 1, b"short") is None
    assert ferry_native.encode_records([(b"T", 0, 0, ok)], 0, 1024, 1, host) is not None
