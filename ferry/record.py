"""The commit-log record layout (RocketMQ v1; docs/reference/contract.md, "The
commit-log record"): the one module that knows byte positions inside a record.
No file I/O, sockets, logging or config.

All integers big-endian.

| #  | field                     | bytes | offset |
|----|---------------------------|-------|--------|
| 1  | TOTALSIZE (whole record)  | 4     | 0      |
| 2  | MAGICCODE 0xDAA320A7      | 4     | 4      |
| 3  | BODYCRC (crc32 & 0x7FFFFFFF) | 4  | 8      |
| 4  | QUEUEID                   | 4     | 12     |
| 5  | FLAG                      | 4     | 16     |
| 6  | QUEUEOFFSET               | 8     | 20     |
| 7  | PHYSICALOFFSET            | 8     | 28     |
| 8  | SYSFLAG                   | 4     | 36     |
| 9  | BORNTIMESTAMP (ms)        | 8     | 40     |
| 10 | BORNHOST (IPv4 + int32 port) | 8  | 48     |
| 11 | STORETIMESTAMP (ms)       | 8     | 56     |
| 12 | STOREHOSTADDRESS (IPv4 + port) | 8 | 64    |
| 13 | RECONSUMETIMES            | 4     | 72     |
| 14 | PREPAREDTRANSACTIONOFFSET | 8     | 76     |
| 15 | BODY: int32 length + bytes | 4+n  | 84     |
| 16 | TOPIC: int8 length + UTF-8 | 1+n  |        |
| 17 | PROPERTIES: int16 length + `k\\x01v\\x02...` | 2+n | |

A BLANK marker fills the end of a file when a record (plus 8 bytes) does not
fit: TOTALSIZE = the bytes left in the file, MAGICCODE 0xCBD43194; only its
first 8 bytes are meaningful.

Decoders distrust their input: every length is checked before slicing and
every failure is a `RecordError`.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry.native import native as _native

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
BLANK_SIZE = 8  # the part of a BLANK marker that is written

_HEAD = struct.Struct(">iIIiiqqiq4sIq4sIiqi")  # fields 1-14 and BODY's length
HEAD_SIZE = _HEAD.size  # 88
_SIZE_MAGIC = struct.Struct(">iI")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
MIN_RECORD_SIZE = HEAD_SIZE + 1 + 2  # empty body, topic and properties
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"


class RecordError(ValueError):
    """Bytes that are not a valid record (or a value that cannot be encoded)."""


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    queue_id: int
    body: bytes
    queue_offset: int = 0
    commit_offset: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    body_crc: int = -1  # -1: computed when encoding

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    @property
    def keys(self) -> str:
        return self.properties.get(PROPERTY_KEYS, "")


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(properties: Mapping[str, str]) -> bytes:
    if _native is not None and type(properties) is dict:
        encoded = _native.encode_properties(properties)
        if encoded is not None:
            return encoded
    parts = []
    for key, value in properties.items():
        if any(sep in key or sep in value for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
            raise RecordError(f"property {key[:40]!r} contains a separator byte (\\x01 or \\x02)")
        parts.append(f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode()


def decode_properties(data: bytes) -> dict[str, str]:
    if _native is not None and type(data) is bytes:
        decoded = _native.decode_properties(data)
        if decoded is not None:
            return decoded
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"properties are not UTF-8: {exc}") from None
    properties = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep:
            raise RecordError(f"property {item[:40]!r} has no name/value separator")
        properties[key] = value
    return properties


def _host_bytes(host: tuple[str, int], name: str) -> tuple[bytes, int]:
    try:
        packed = socket.inet_aton(host[0])
    except OSError:
        raise RecordError(f"{name} {host[0]!r} is not an IPv4 address") from None
    if not 0 <= host[1] <= 0xFFFFFFFF:
        raise RecordError(f"{name} port {host[1]} is out of range")
    return packed, host[1]


def encoded_size(topic_bytes: int, body_bytes: int, properties_bytes: int) -> int:
    return HEAD_SIZE + body_bytes + 1 + topic_bytes + 2 + properties_bytes


def encode(record: Record) -> bytes:
    """The bytes of one record."""
    topic = record.topic.encode()
    if not 0 < len(topic) <= MAX_TOPIC_BYTES:
        raise RecordError(f"topic is {len(topic)} bytes; it must be 1..{MAX_TOPIC_BYTES}")
    props = encode_properties(record.properties)
    if len(props) > MAX_PROPERTIES_BYTES:
        raise RecordError(f"properties are {len(props)} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    born_ip, born_port = _host_bytes(record.born_host, "born_host")
    store_ip, store_port = _host_bytes(record.store_host, "store_host")
    total = encoded_size(len(topic), len(record.body), len(props))
    crc = body_crc(record.body) if record.body_crc < 0 else record.body_crc
    try:
        head = _HEAD.pack(
            total, MESSAGE_MAGIC, crc, record.queue_id, record.flag, record.queue_offset,
            record.commit_offset, record.sys_flag, record.born_timestamp, born_ip, born_port,
            record.store_timestamp, store_ip, store_port, record.reconsume_times,
            record.prepared_transaction_offset, len(record.body),
        )  # fmt: skip
    except struct.error as exc:
        raise RecordError(f"a field is out of range: {exc}") from None
    return b"".join((head, record.body, _U8.pack(len(topic)), topic, _U16.pack(len(props)), props))


def encode_blank(remaining: int) -> bytes:
    """The BLANK marker for the last `remaining` bytes of a file."""
    if remaining < BLANK_SIZE:
        raise RecordError(f"a BLANK marker needs {BLANK_SIZE} bytes, only {remaining} are left")
    return _SIZE_MAGIC.pack(remaining, BLANK_MAGIC)


@dataclass(frozen=True, slots=True)
class Blank:
    """The end-of-file marker: `size` bytes up to the end of the file."""

    size: int


def peek(head: bytes | bytearray | memoryview) -> int | Blank:
    """From a record's first 8 bytes: its TOTALSIZE, or the `Blank` it is.

    Raises:
        RecordError: fewer than 8 bytes, or a magic that is neither kind.
    """
    if len(head) < BLANK_SIZE:
        raise RecordError(f"{len(head)} bytes: too few for a record header")
    total, magic = _SIZE_MAGIC.unpack_from(head, 0)
    if magic == BLANK_MAGIC:
        if total < BLANK_SIZE:
            raise RecordError(f"BLANK marker has size {total}")
        return Blank(total)
    if magic != MESSAGE_MAGIC:
        raise RecordError(f"bad magic 0x{magic:08X}")
    if total < MIN_RECORD_SIZE:
        raise RecordError(f"record claims {total} bytes, less than the minimum {MIN_RECORD_SIZE}")
    return total


_STORE_TIMESTAMP = struct.Struct(">q")
STORE_TIMESTAMP_END = 64  # the head bytes `store_timestamp` needs


def store_timestamp(head: bytes | bytearray | memoryview) -> int:
    """STORETIMESTAMP from a record's first `STORE_TIMESTAMP_END` bytes.

    Raises:
        RecordError: too few bytes, or not a message record.
    """
    if len(head) < STORE_TIMESTAMP_END:
        raise RecordError(f"{len(head)} bytes: too few for a record's store timestamp")
    if isinstance(peek(head), Blank):
        raise RecordError("a BLANK marker has no store timestamp")
    return _STORE_TIMESTAMP.unpack_from(head, 56)[0]


def decode(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    check_crc: bool = True,
    max_size: int = 1 << 30,
) -> Record | Blank:
    """Decode the record or BLANK marker at `buf[pos:]`.

    Raises:
        RecordError: the bytes there are not a whole valid record.
    """
    view = memoryview(buf)
    available = len(view) - pos
    if pos < 0 or available < BLANK_SIZE:
        raise RecordError(f"{max(available, 0)} bytes at {pos}: too few for a record header")
    try:
        head = peek(view[pos : pos + BLANK_SIZE])
    except RecordError as exc:
        raise RecordError(f"at {pos}: {exc}") from None
    if isinstance(head, Blank):
        return head
    total = head
    if total > max_size:
        raise RecordError(f"record at {pos} claims {total} bytes; the limit is {max_size}")
    if total > available:
        raise RecordError(
            f"record at {pos} claims {total} bytes, only {available} follow (torn write?)"
        )
    (
        _, _, crc, queue_id, flag, queue_offset, commit_offset, sys_flag, born_ts, born_ip, born_port,
        store_ts, store_ip, store_port, reconsume, prepared, body_len,
    ) = _HEAD.unpack_from(view, pos)  # fmt: skip
    at = pos + HEAD_SIZE
    end = pos + total
    if body_len < 0 or at + body_len + 3 > end:
        raise RecordError(f"record at {pos}: body length {body_len} does not fit in {total} bytes")
    body = bytes(view[at : at + body_len])
    at += body_len
    topic_len = view[at]
    at += 1
    if at + topic_len + 2 > end:
        raise RecordError(f"record at {pos}: topic length {topic_len} does not fit")
    try:
        topic = bytes(view[at : at + topic_len]).decode()
    except UnicodeDecodeError:
        raise RecordError(f"record at {pos}: topic is not UTF-8") from None
    at += topic_len
    (props_len,) = _U16.unpack_from(view, at)
    at += 2
    if at + props_len != end:
        raise RecordError(
            f"record at {pos}: lengths add up to {at + props_len - pos}, TOTALSIZE says {total}"
        )
    properties = decode_properties(bytes(view[at:end]))
    if check_crc and body_crc(body) != crc:
        raise RecordError(f"record at {pos}: body CRC mismatch")
    return Record(
        topic=topic, queue_id=queue_id, body=body, queue_offset=queue_offset, commit_offset=commit_offset,
        flag=flag, sys_flag=sys_flag, born_timestamp=born_ts, born_host=(socket.inet_ntoa(born_ip), born_port),
        store_timestamp=store_ts, store_host=(socket.inet_ntoa(store_ip), store_port), reconsume_times=reconsume,
        prepared_transaction_offset=prepared, properties=properties, body_crc=crc,
    )  # fmt: skip


# ---------------------------------------------------------------- fast paths
#
# The dispatcher and recovery look at millions of records: they read only the
# fields they need, straight from the buffer, without building a `Record`.

_DISPATCH = struct.Struct(
    ">iIIi4xqq4x16xq20xi"
)  # size, magic, crc, queue id, queue/commit offsets, store ts, body len
_PROPS_TAGS = (PROPERTY_TAGS + NAME_VALUE_SEPARATOR).encode()
_PROPS_SEP = PROPERTY_SEPARATOR.encode()


def tags_hash(tags: str) -> int:
    """Java's `String.hashCode()` of the tags (what RocketMQ stores in a consume-queue entry)."""
    h = 0
    for unit in tags.encode() if tags.isascii() else _utf16_units(tags):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _utf16_units(text: str) -> list[int]:
    data = text.encode("utf-16-be")
    return [(data[i] << 8) | data[i + 1] for i in range(0, len(data), 2)]


def message_id(store_host: tuple[str, int], commit_offset: int) -> str:
    """RocketMQ's offset message id: store IPv4 (4) + port (4) + commit offset (8), as hex."""
    ip, port = _host_bytes(store_host, "store_host")
    return (ip + struct.pack(">iq", port, commit_offset)).hex().upper()


def pack_host(host: tuple[str, int]) -> bytes:
    """An IPv4 host and port as the 8 bytes a record stores (for `encode_raw`)."""
    ip, port = _host_bytes(host, "host")
    return ip + struct.pack(">I", port)


_HEAD_RAW = struct.Struct(">iIIiiqqiq8sq8siqi")


def encode_raw(
    topic: bytes, queue_id: int, flag: int, queue_offset: int, commit_offset: int, sys_flag: int,
    born_timestamp: int, born_host: bytes, store_timestamp: int, store_host: bytes,
    body: bytes, properties: bytes, reconsume_times: int = 0, prepared_offset: int = 0,
) -> bytes:  # fmt: skip
    """The hot-path encoder: the same bytes as `encode`, from pre-encoded parts
    (`topic` UTF-8 of 1..127 bytes, hosts from `pack_host`, properties from
    `encode_properties`; `prepared_offset` is PREPAREDTRANSACTIONOFFSET). The
    caller has checked the lengths."""
    return b"".join((
        _HEAD_RAW.pack(
            HEAD_SIZE + len(body) + 3 + len(topic) + len(properties), MESSAGE_MAGIC,
            zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, commit_offset, sys_flag,
            born_timestamp, born_host, store_timestamp, store_host, reconsume_times, prepared_offset,
            len(body),
        ),
        body, _U8.pack(len(topic)), topic, _U16.pack(len(properties)), properties,
    ))  # fmt: skip


_BODY_LEN = struct.Struct(">i")


def scan_valid(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, str | None]:
    """Walk whole records in `buf[pos:end]`, checking TOTALSIZE, MAGICCODE, the
    lengths inside and BODYCRC: recovery's inner loop.

    Returns `(position, verdict)`: where the walk stopped and why — None when
    it reached `end` (or a record that continues past `end`: read more and
    call again), "blank" at a BLANK marker (the rest of the file is padding),
    "zero" at zeros (the end of written data), or a description of the first
    invalid record.
    """
    view = memoryview(buf)
    crc32 = zlib.crc32
    unpack_sm = _SIZE_MAGIC.unpack_from
    unpack_i = _BODY_LEN.unpack_from
    unpack_u16 = _U16.unpack_from
    while pos + BLANK_SIZE <= end:
        total, magic = unpack_sm(buf, pos)
        if magic != MESSAGE_MAGIC:
            if magic == BLANK_MAGIC:
                return pos, "blank"
            if total == 0 and magic == 0:
                return pos, "zero"
            return pos, f"bad magic 0x{magic:08X}"
        if total < MIN_RECORD_SIZE:
            return pos, f"record claims {total} bytes, less than {MIN_RECORD_SIZE}"
        record_end = pos + total
        if record_end > end:
            return pos, None
        (body_len,) = unpack_i(buf, pos + HEAD_SIZE - 4)
        at = pos + HEAD_SIZE + body_len
        if body_len < 0 or at + 3 > record_end:
            return pos, f"body length {body_len} does not fit in {total} bytes"
        topic_len = buf[at]
        if at + 3 + topic_len > record_end:
            return pos, f"topic length {topic_len} does not fit"
        (props_len,) = unpack_u16(buf, at + 1 + topic_len)
        if at + 3 + topic_len + props_len != record_end:
            return pos, "field lengths do not add up to TOTALSIZE"
        # A torn write leaves zeros at the end; a whole record's topic and properties end
        # in a non-zero byte. (ferry ends properties with \x02; Apache 4.9 leaves the
        # last separator out, so the last byte is any non-zero byte of a value.)
        if not buf[at + topic_len] or (props_len and not buf[record_end - 1]):
            return pos, "topic or properties end in zeros (a torn write)"
        (crc,) = unpack_i(buf, pos + 8)
        if crc32(view[pos + HEAD_SIZE : at]) & 0x7FFFFFFF != crc:
            return pos, "body CRC mismatch"
        pos = record_end
    return pos, None


_HOST_CACHE: dict[bytes, str] = {}


def _host_text(raw: bytes) -> str:
    text = _HOST_CACHE.get(raw)
    if text is None:
        if len(_HOST_CACHE) > 4096:
            _HOST_CACHE.clear()
        text = f"{socket.inet_ntoa(raw[:4])}:{int.from_bytes(raw[4:], 'big')}"
        _HOST_CACHE[raw] = text
    return text


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A record as a consumer gets it (the pull path's light decode)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    body: bytes
    properties: dict[str, str]
    flag: int
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    born_host: str  # "ip:port"
    store_host: str
    store_host_raw: bytes  # 8 bytes, for the message id
    size: int

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    @property
    def msg_id(self) -> str:
        return (self.store_host_raw + self.commit_offset.to_bytes(8, "big")).hex().upper()


_PULL_HEAD = struct.Struct(">iI4xiiqqiq8sq8si8xi")

# SYSFLAG bits of a compressed body (RocketMQ's MessageSysFlag): bit 0 says compressed;
# bits 8-10 name the codec in 5.x (LZ4 1, ZSTD 2, ZLIB 3), 0 is 4.x's zlib.
COMPRESSED_FLAG = 0x1
COMPRESSION_TYPE_MASK = 0x700
_ZLIB_TYPES = (0, 3 << 8)
# A body inflates to at most this many bytes (RocketMQ bodies are ≤ 4 MiB before the
# client compresses them; a larger result is a decompression bomb, served as stored).
MAX_INFLATED_BODY = 64 * 1024 * 1024


def inflate_body(body: bytes, sys_flag: int) -> bytes:
    """The body a consumer sees: a compressed body (a 4.x or 5.x client compressed it, as
    Apache's clients do over 4 KiB) inflated, as Apache's consumers and proxy do. A body
    that does not inflate whole within MAX_INFLATED_BODY, or uses a codec ferry lacks
    (LZ4, ZSTD: 5.x clients use zlib unless told otherwise), is returned as stored: the
    consumer gets the bytes the producer's client wrote rather than nothing."""
    if not sys_flag & COMPRESSED_FLAG or sys_flag & COMPRESSION_TYPE_MASK not in _ZLIB_TYPES:
        return body
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, MAX_INFLATED_BODY)
    except zlib.error:
        return body
    if not inflater.eof or inflater.unconsumed_tail:
        return body
    return out


def decode_stored(buf: bytes | bytearray | memoryview, pos: int, size: int) -> StoredMessage:
    """Decode the record of `size` bytes at `pos` (located by a consume-queue
    entry) for a consumer: the fields a pull returns, without the body CRC, the body
    inflated when a client compressed it (`inflate_body`).

    Raises:
        RecordError: the bytes there are not a whole valid record.
    """
    if pos < 0 or size < MIN_RECORD_SIZE or pos + size > len(buf):
        raise RecordError(f"no record of {size} bytes at {pos}")
    try:
        (
            total, magic, queue_id, flag, queue_offset, commit_offset, sys_flag, born_ts,
            born_host, store_ts, store_host, reconsume, body_len,
        ) = _PULL_HEAD.unpack_from(buf, pos)  # fmt: skip
    except struct.error as exc:
        raise RecordError(f"record at {pos}: {exc}") from None
    if magic != MESSAGE_MAGIC or total != size:
        raise RecordError(
            f"record at {pos}: not a record of {size} bytes (magic 0x{magic:08X}, size {total})"
        )
    at = pos + HEAD_SIZE
    end = pos + size
    if body_len < 0 or at + body_len + 3 > end:
        raise RecordError(f"record at {pos}: body length {body_len} does not fit")
    body = bytes(buf[at : at + body_len])
    if sys_flag & COMPRESSED_FLAG:
        body = inflate_body(body, sys_flag)
    at += body_len
    topic_len = buf[at]
    at += 1
    if at + topic_len + 2 > end:
        raise RecordError(f"record at {pos}: topic length {topic_len} does not fit")
    try:
        topic = bytes(buf[at : at + topic_len]).decode()
    except UnicodeDecodeError:
        raise RecordError(f"record at {pos}: topic is not UTF-8") from None
    at += topic_len + 2
    properties = decode_properties(bytes(buf[at:end])) if at < end else {}
    return StoredMessage(
        topic, queue_id, queue_offset, commit_offset, body, properties, flag, born_ts, store_ts,
        reconsume, _host_text(born_host), _host_text(store_host), store_host, size,
    )  # fmt: skip


_BODY_LEN = struct.Struct(">i")


def properties_at(buf: bytes | bytearray | memoryview, pos: int, size: int) -> dict[str, str]:
    """The properties of the record of `size` bytes at `pos`, without decoding
    the rest (what an SQL92 selector reads of each message).

    Raises:
        RecordError: the bytes there are not a whole record of that size.
    """
    if pos < 0 or size < MIN_RECORD_SIZE or pos + size > len(buf):
        raise RecordError(f"no record of {size} bytes at {pos}")
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC or total != size:
        raise RecordError(f"record at {pos}: not a record of {size} bytes")
    (body_len,) = _BODY_LEN.unpack_from(buf, pos + HEAD_SIZE - 4)
    at = pos + HEAD_SIZE + body_len
    end = pos + size
    if body_len < 0 or at + 3 > end:
        raise RecordError(f"record at {pos}: body length {body_len} does not fit")
    at += 1 + buf[at]
    if at + 2 > end:
        raise RecordError(f"record at {pos}: topic does not fit")
    (length,) = _U16.unpack_from(buf, at)
    at += 2
    if at + length > end:
        raise RecordError(f"record at {pos}: properties do not fit")
    return decode_properties(bytes(buf[at : at + length])) if length else {}


def property_values(
    data: bytes | bytearray,
    start: int,
    entries: list[tuple[int, int, int]],
    names: tuple[str, ...],
) -> list[tuple[str | None, ...]]:
    """What an SQL92-filtered pull reads of each record, out of one read of the commit
    log: `data` holds the log from commit offset `start`, `entries` are consume-queue
    entries `(commit_offset, size, tag_code)` inside it; for each, the values of the
    properties `names` of its record (None: the record has no such property), found as
    `properties_at` finds them.

    Raises:
        RecordError: an entry that points at no record of its size, or a record whose
            properties do not decode.
    """
    if _native is not None and type(entries) is list and type(names) is tuple:
        got = _native.property_values(data, start, entries, names)
        if got is not None:
            return got
    out = []
    for commit_offset, size, _code in entries:
        properties = properties_at(data, commit_offset - start, size)
        out.append(tuple(properties.get(name) for name in names))
    return out


def gather_records(
    data: bytes | bytearray,
    start: int,
    entries: list[tuple[int, int, int]],
    confirm: int,
    budget: int,
    have: bool,
    tag_hashes: frozenset[int] | None = None,
) -> tuple[bytes, int, int, int, int, bool]:
    """A raw pull's records out of one read of the commit log: `data` holds the log from
    commit offset `start`, `entries` are consume-queue entries `(commit_offset, size,
    tag_code)` inside it. Entries are taken in order while their record ends at or below
    `confirm` and fits what is left of the byte `budget` (a pull's first record is taken
    whatever its size: `have` says whether the pull holds records already); with
    `tag_hashes`, a taken entry whose tag code is not among them is passed over.

    Returns `(records, taken, kept, last_commit_offset, budget_left, stopped)`: the kept
    records' bytes as stored, back to back; how many entries were taken (passed over
    included) and how many records kept; the last kept one's commit offset (-1: none);
    the budget left; and whether an entry was left (not confirmed yet, or over the
    budget).

    Raises:
        RecordError: a kept entry that points at no record of its size.
    """
    if _native is not None and tag_hashes is None and type(entries) is list:
        got = _native.gather_records(data, start, entries, confirm, budget, have)
        if got is not None:
            return got
    view = memoryview(data)
    pieces: list[memoryview] = []
    last = -1
    taken = 0
    for commit_offset, size, code in entries:
        if commit_offset + size > confirm or (budget < size and (have or pieces)):
            return b"".join(pieces), taken, len(pieces), last, budget, True
        taken += 1
        if tag_hashes is not None and code not in tag_hashes:
            continue
        at = commit_offset - start
        if at < 0 or at + size > len(data) or peek(view[at : at + BLANK_SIZE]) != size:
            raise RecordError(f"commit offset {commit_offset} holds no record of {size} bytes")
        pieces.append(view[at : at + size])
        last = commit_offset
        budget -= size
    return b"".join(pieces), taken, len(pieces), last, budget, False


_SCAN = struct.Struct(">iIIi4xqq4x16xq20xi")


def scan_dispatch(
    buf: bytes | memoryview, pos: int
) -> tuple[list[tuple[int, int, bytes, int, int, int, bytes]], int, bool]:
    """The dispatcher's batch decode: walk whole records from `pos`.

    Returns `(records, position, blank)`: each record as `(commit_offset, size,
    topic_bytes, queue_id, queue_offset, store_timestamp, tags_bytes)`; where the
    walk stopped (the end of the last whole record); and whether it stopped at
    a BLANK marker. A record that continues past the end of `buf` ends the walk
    without an error.

    Raises:
        RecordError: bytes at `position` that are neither a record nor a BLANK.
    """
    if _native is not None and type(buf) is bytes:
        scanned = _native.scan_dispatch(buf, pos)
        if scanned is not None:
            return scanned
    out: list[tuple[int, int, bytes, int, int, int, bytes]] = []
    append = out.append
    unpack = _SCAN.unpack_from
    unpack_sm = _SIZE_MAGIC.unpack_from
    unpack_u16 = _U16.unpack_from
    size = len(buf)
    tags_marker = _PROPS_TAGS
    while pos + BLANK_SIZE <= size:
        total, magic = unpack_sm(buf, pos)
        if magic != MESSAGE_MAGIC:
            if magic == BLANK_MAGIC and total >= BLANK_SIZE:
                return out, pos, True
            raise RecordError(f"at {pos}: bad magic 0x{magic:08X}")
        if total < MIN_RECORD_SIZE:
            raise RecordError(f"at {pos}: record claims {total} bytes, less than {MIN_RECORD_SIZE}")
        end = pos + total
        if end > size:
            break
        _, _, _, queue_id, queue_offset, commit_offset, store_ts, body_len = unpack(buf, pos)
        at = pos + HEAD_SIZE + body_len
        if body_len < 0 or at + 3 > end:
            raise RecordError(f"record at {pos}: body length {body_len} does not fit")
        topic_len = buf[at]
        props_at = at + 3 + topic_len
        if props_at > end:
            raise RecordError(f"record at {pos}: topic length {topic_len} does not fit")
        (props_len,) = unpack_u16(buf, at + 1 + topic_len)
        if props_at + props_len != end:
            raise RecordError(f"record at {pos}: lengths do not add up to TOTALSIZE")
        tags = b""
        if props_len:
            props = bytes(buf[props_at:end])
            i = props.find(tags_marker)
            if i == 0 or (i > 0 and props[i - 1] == 2):
                j = props.find(b"\x02", i)
                tags = props[i + 5 : j if j >= 0 else len(props)]
        append(
            (commit_offset, total, bytes(buf[at + 1 : at + 1 + topic_len]), queue_id, queue_offset,
             store_ts, tags)
        )  # fmt: skip
        pos = end
    return out, pos, False


_SCAN_INDEX = struct.Struct(
    ">iI20xqi16xq20xi"
)  # size, magic, commit offset, sys flag, store ts, body len


def scan_index(
    buf: bytes | memoryview, pos: int
) -> tuple[list[tuple[int, int, int, int, bytes, bytes]], int, bool]:
    """The message index's batch decode: walk whole records from `pos`, with the
    checks and stops of `scan_dispatch`.

    Returns `(records, position, blank)`: each record as `(commit_offset, size,
    store_timestamp, sys_flag, topic_bytes, properties_bytes)`; where the walk
    stopped; whether it stopped at a BLANK marker.

    Raises:
        RecordError: bytes at `position` that are neither a record nor a BLANK.
    """
    out: list[tuple[int, int, int, int, bytes, bytes]] = []
    size = len(buf)
    while pos + BLANK_SIZE <= size:
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic != MESSAGE_MAGIC:
            if magic == BLANK_MAGIC and total >= BLANK_SIZE:
                return out, pos, True
            raise RecordError(f"at {pos}: bad magic 0x{magic:08X}")
        if total < MIN_RECORD_SIZE:
            raise RecordError(f"at {pos}: record claims {total} bytes, less than {MIN_RECORD_SIZE}")
        end = pos + total
        if end > size:
            break
        _, _, commit_offset, sys_flag, store_ts, body_len = _SCAN_INDEX.unpack_from(buf, pos)
        at = pos + HEAD_SIZE + body_len
        if body_len < 0 or at + 3 > end:
            raise RecordError(f"record at {pos}: body length {body_len} does not fit")
        topic_len = buf[at]
        props_at = at + 3 + topic_len
        if props_at > end:
            raise RecordError(f"record at {pos}: topic length {topic_len} does not fit")
        (props_len,) = _U16.unpack_from(buf, at + 1 + topic_len)
        if props_at + props_len != end:
            raise RecordError(f"record at {pos}: lengths do not add up to TOTALSIZE")
        out.append(
            (commit_offset, total, store_ts, sys_flag, bytes(buf[at + 1 : at + 1 + topic_len]),
             bytes(buf[props_at:end]))
        )  # fmt: skip
        pos = end
    return out, pos, False


def parse_message_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """An offset message id (`message_id`) back into `((ip, port), commit_offset)`.

    Raises:
        RecordError: not 32 hex digits (RocketMQ's IPv4 form).
    """
    try:
        raw = bytes.fromhex(msg_id) if len(msg_id) == 32 else b""
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise RecordError(f"{msg_id[:40]!r} is not an offset message id (32 hex digits)")
    port, commit_offset = struct.unpack(">Iq", raw[4:])
    return (socket.inet_ntoa(raw[:4]), port), commit_offset
