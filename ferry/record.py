"""The commit-log record layout (RocketMQ v1, SPEC §4.2): the one module that
knows byte positions inside a record. No file I/O, sockets, logging or config.

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
    parts = []
    for key, value in properties.items():
        if any(sep in key or sep in value for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
            raise RecordError(f"property {key[:40]!r} contains a separator byte (\\x01 or \\x02)")
        parts.append(f"{key}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode()


def decode_properties(data: bytes) -> dict[str, str]:
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
