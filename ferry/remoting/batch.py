"""The body of a batch send (SEND_BATCH_MESSAGE, 320): the messages of one
batch, each in RocketMQ's short message form, back to back. Encode/decode
only: no sockets, logging or config. All integers big-endian.

| field      | bytes | meaning                                               |
|------------|-------|-------------------------------------------------------|
| TOTALSIZE  | 4     | the entry's bytes, this field included                |
| MAGICCODE  | 4     | 0 (clients write 0; not checked, as Apache does not)  |
| BODYCRC    | 4     | 0 (the broker computes the stored CRC)                |
| FLAG       | 4     | the message's flag                                    |
| BODY       | 4 + n | int32 length, then the body                           |
| PROPERTIES | 2 + n | int16 length, then `k\\x01v\\x02k\\x01v` (UTF-8)        |

Every length is checked against what is left of the body and TOTALSIZE must
agree with them: any mismatch is a `BatchError`, and a batch with one bad
entry is refused whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEAD = struct.Struct(">iiiii")  # total size, magic, body crc, flag, body length
_PROPERTIES_LENGTH = struct.Struct(">h")
ENTRY_OVERHEAD = _HEAD.size + _PROPERTIES_LENGTH.size  # 22 bytes around body and properties
MAX_PROPERTIES_BYTES = 32767


class BatchError(ValueError):
    """A batch body that breaks the entry format."""


@dataclass(frozen=True, slots=True)
class BatchEntry:
    flag: int
    body: bytes
    properties: bytes  # as the client wrote them: `k\x01v\x02k\x01v`


def decode(body: bytes | bytearray | memoryview, max_entries: int = 1 << 20) -> list[BatchEntry]:
    """The entries of a batch body, in order.

    Raises:
        BatchError: an empty body, a length that does not fit, a TOTALSIZE
            that disagrees with the lengths, or more than `max_entries` entries.
    """
    view = memoryview(body)
    end = len(view)
    if end == 0:
        raise BatchError("the batch body is empty: a batch needs at least one message")
    entries: list[BatchEntry] = []
    pos = 0
    while pos < end:
        index = len(entries)
        if index >= max_entries:
            raise BatchError(f"more than {max_entries} messages in one batch")
        if end - pos < ENTRY_OVERHEAD:
            raise BatchError(
                f"message {index}: {end - pos} bytes left, fewer than an entry's "
                f"{ENTRY_OVERHEAD}-byte frame"
            )
        total, _, _, flag, body_len = _HEAD.unpack_from(view, pos)
        at = pos + _HEAD.size
        if body_len < 0 or body_len > end - at - _PROPERTIES_LENGTH.size:
            raise BatchError(
                f"message {index}: body length {body_len} does not fit the "
                f"{end - at - _PROPERTIES_LENGTH.size} bytes left"
            )
        message_body = bytes(view[at : at + body_len])
        at += body_len
        (props_len,) = _PROPERTIES_LENGTH.unpack_from(view, at)
        at += _PROPERTIES_LENGTH.size
        if props_len < 0 or props_len > end - at:
            raise BatchError(
                f"message {index}: properties length {props_len} does not fit the "
                f"{end - at} bytes left"
            )
        properties = bytes(view[at : at + props_len])
        at += props_len
        if total != at - pos:
            raise BatchError(
                f"message {index}: TOTALSIZE says {total} bytes, its fields take {at - pos}"
            )
        entries.append(BatchEntry(flag, message_body, properties))
        pos = at
    return entries


def encode(entries: list[BatchEntry]) -> bytes:
    """A batch body, as RocketMQ's clients write it (ferry's tests and tools)."""
    parts = []
    for entry in entries:
        if len(entry.properties) > MAX_PROPERTIES_BYTES:
            raise BatchError(
                f"{len(entry.properties)} bytes of properties; the limit is {MAX_PROPERTIES_BYTES}"
            )
        total = ENTRY_OVERHEAD + len(entry.body) + len(entry.properties)
        parts += [
            _HEAD.pack(total, 0, 0, entry.flag, len(entry.body)),
            entry.body,
            _PROPERTIES_LENGTH.pack(len(entry.properties)),
            entry.properties,
        ]
    return b"".join(parts)
