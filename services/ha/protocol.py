"""The HA wire format (docs/reference/contract.md, "The HA protocol"): byte-exact
with RocketMQ 4.x, plus ferry's optional authenticated handshake. Encode/decode
only: no sockets, logging or config. All integers big-endian.

Legacy frames (RocketMQ 4.x):

| direction      | frame     | layout                                         | bytes  |
|----------------|-----------|------------------------------------------------|--------|
| slave → master | report    | int64 slave_max_offset (also the ack)          | 8      |
| master → slave | transfer  | int64 phy_offset, int32 body_size, body        | 12 + n |
| master → slave | heartbeat | a transfer header with body_size 0             | 12     |

Handshake (only when an HA secret is configured):

| direction      | frame     | layout                                                    |
|----------------|-----------|-----------------------------------------------------------|
| master → slave | CHALLENGE | b"FHAC", 16 random bytes                                  |
| slave → master | HELLO     | b"FHA1", uint16 version, uint16 flags, uint16 len, group  |
|                |           | (UTF-8, len bytes), int64 replica_id, int64 max_offset,   |
|                |           | 32-byte HMAC-SHA256(secret, challenge ‖ HELLO so far)     |
| master → slave | WELCOME   | b"FHAW", int64 master_min_offset, int64 master_max_offset,|
|                |           | int64 start_offset, 32-byte HMAC-SHA256(secret,           |
|                |           | challenge ‖ HELLO's HMAC ‖ WELCOME so far)                |

Automatic failover (enableFailover) always runs the handshake (the secret may
be empty: the HMAC then only guards against corruption) and fences by epoch:
the HELLO sets flag `FLAG_EPOCH` and carries, after the replica id and
offset, int64 epoch (the leader epoch the slave follows); the WELCOME's magic
is b"FHAE" and it carries int64 epoch (the master's) after start_offset, under
the HMAC. A master refuses a slave that follows a newer epoch (the master was
deposed); a slave refuses a master of an older epoch.

Decoders distrust their input: every size is bounded by the caller's maximum,
every failure is an `HAProtocolError`. Readers are anything with
`readexactly` (an `asyncio.StreamReader`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Protocol

REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
REPORT_SIZE = REPORT.size  # 8
HEADER_SIZE = HEADER.size  # 12

CHALLENGE_MAGIC = b"FHAC"
HELLO_MAGIC = b"FHA1"
WELCOME_MAGIC = b"FHAW"
NONCE_SIZE = 16
MAC_SIZE = 32
WELCOME_EPOCH_MAGIC = b"FHAE"
VERSION = 1
FLAG_EPOCH = 0x1
MAX_GROUP_BYTES = 255
_HELLO_HEAD = struct.Struct(">4sHHH")  # magic, version, flags, group length
_HELLO_TAIL = struct.Struct(">qq")  # replica id, max offset
_EPOCH = struct.Struct(">q")
_WELCOME = struct.Struct(">4sqqq")
_WELCOME_EPOCH = struct.Struct(">4sqqqq")
CHALLENGE_SIZE = len(CHALLENGE_MAGIC) + NONCE_SIZE  # 20
WELCOME_SIZE = _WELCOME.size + MAC_SIZE  # 60
WELCOME_EPOCH_SIZE = _WELCOME_EPOCH.size + MAC_SIZE  # 68


class HAProtocolError(Exception):
    """Bytes that break the HA protocol; the connection must be closed."""


class Reader(Protocol):
    async def readexactly(self, n: int) -> bytes: ...


# ---------------------------------------------------------------- legacy frames


def encode_report(offset: int) -> bytes:
    if offset < 0:
        raise HAProtocolError(f"report offset {offset} is negative")
    return REPORT.pack(offset)


def decode_report(data: bytes) -> int:
    if len(data) != REPORT_SIZE:
        raise HAProtocolError(f"a report is {REPORT_SIZE} bytes, got {len(data)}")
    (offset,) = REPORT.unpack(data)
    if offset < 0:
        raise HAProtocolError(f"report offset {offset} is negative")
    return offset


def encode_header(phy_offset: int, body_size: int) -> bytes:
    if phy_offset < 0 or not 0 <= body_size < 1 << 31:
        raise HAProtocolError(f"bad transfer header ({phy_offset}, {body_size})")
    return HEADER.pack(phy_offset, body_size)


def decode_header(data: bytes, max_body: int) -> tuple[int, int]:
    """(phy_offset, body_size) of a transfer header; body_size 0 is a heartbeat."""
    if len(data) != HEADER_SIZE:
        raise HAProtocolError(f"a transfer header is {HEADER_SIZE} bytes, got {len(data)}")
    phy_offset, body_size = HEADER.unpack(data)
    if phy_offset < 0:
        raise HAProtocolError(f"transfer offset {phy_offset} is negative")
    if body_size < 0 or body_size > max_body:
        raise HAProtocolError(f"transfer body of {body_size} bytes (the limit is {max_body})")
    return phy_offset, body_size


async def read_exactly(reader: Reader, n: int, what: str) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise HAProtocolError(
            f"the peer closed the connection in the middle of a {what} "
            f"({len(exc.partial)} of {n} bytes)"
        ) from None


async def read_report(reader: Reader) -> int:
    return decode_report(await read_exactly(reader, REPORT_SIZE, "report"))


async def read_transfer(reader: Reader, max_body: int) -> tuple[int, bytes]:
    """One transfer frame: (phy_offset, body); an empty body is a heartbeat."""
    phy_offset, size = decode_header(await read_exactly(reader, HEADER_SIZE, "header"), max_body)
    body = await read_exactly(reader, size, "transfer body") if size else b""
    return phy_offset, body


# ---------------------------------------------------------------- handshake


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def encode_challenge(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_SIZE:
        raise HAProtocolError(f"a challenge nonce is {NONCE_SIZE} bytes")
    return CHALLENGE_MAGIC + nonce


def decode_challenge(data: bytes) -> bytes:
    if len(data) != CHALLENGE_SIZE or data[:4] != CHALLENGE_MAGIC:
        raise HAProtocolError("not a CHALLENGE (is the master configured without haSecret?)")
    return data[4:]


@dataclass(frozen=True)
class Hello:
    version: int
    flags: int
    group: str
    replica_id: int
    max_offset: int
    mac: bytes
    epoch: int | None = None  # with FLAG_EPOCH: the leader epoch the slave follows


def encode_hello(
    secret: bytes,
    challenge: bytes,
    group: str,
    replica_id: int,
    max_offset: int,
    flags: int = 0,
    epoch: int | None = None,
) -> bytes:
    name = group.encode()
    if len(name) > MAX_GROUP_BYTES:
        raise HAProtocolError(f"group name of {len(name)} bytes (the limit is {MAX_GROUP_BYTES})")
    if epoch is not None:
        flags |= FLAG_EPOCH
    body = (
        _HELLO_HEAD.pack(HELLO_MAGIC, VERSION, flags, len(name))
        + name
        + _HELLO_TAIL.pack(replica_id, max_offset)
        + (_EPOCH.pack(epoch) if epoch is not None else b"")
    )
    return body + _mac(secret, challenge, body)


async def read_hello(reader: Reader) -> tuple[Hello, bytes]:
    """A HELLO and its bytes before the MAC (for verification)."""
    head = await read_exactly(reader, _HELLO_HEAD.size, "HELLO")
    magic, version, flags, length = _HELLO_HEAD.unpack(head)
    if magic != HELLO_MAGIC:
        raise HAProtocolError(
            f"expected a HELLO, got {head[:4]!r} (a slave without haSecret, or not a slave)"
        )
    if length > MAX_GROUP_BYTES:
        raise HAProtocolError(
            f"HELLO group name of {length} bytes (the limit is {MAX_GROUP_BYTES})"
        )
    tail = _HELLO_TAIL.size + (_EPOCH.size if flags & FLAG_EPOCH else 0)
    rest = await read_exactly(reader, length + tail + MAC_SIZE, "HELLO")
    name = rest[:length]
    replica_id, max_offset = _HELLO_TAIL.unpack_from(rest, length)
    epoch = None
    if flags & FLAG_EPOCH:
        (epoch,) = _EPOCH.unpack_from(rest, length + _HELLO_TAIL.size)
        if epoch < 0:
            raise HAProtocolError(f"HELLO epoch {epoch} is negative")
    mac = rest[length + tail :]
    try:
        group = name.decode()
    except UnicodeDecodeError:
        raise HAProtocolError("HELLO group name is not UTF-8") from None
    if max_offset < 0:
        raise HAProtocolError(f"HELLO offset {max_offset} is negative")
    signed = head + rest[: length + tail]
    return Hello(version, flags, group, replica_id, max_offset, mac, epoch), signed


def verify_hello(secret: bytes, challenge: bytes, hello: Hello, signed: bytes) -> bool:
    return hmac.compare_digest(_mac(secret, challenge, signed), hello.mac)


@dataclass(frozen=True)
class Welcome:
    min_offset: int
    max_offset: int
    start_offset: int
    epoch: int | None = None  # the master's leader epoch (failover), else None


def encode_welcome(secret: bytes, challenge: bytes, hello_mac: bytes, welcome: Welcome) -> bytes:
    if welcome.epoch is None:
        body = _WELCOME.pack(
            WELCOME_MAGIC, welcome.min_offset, welcome.max_offset, welcome.start_offset
        )
    else:
        body = _WELCOME_EPOCH.pack(
            WELCOME_EPOCH_MAGIC,
            welcome.min_offset,
            welcome.max_offset,
            welcome.start_offset,
            welcome.epoch,
        )
    return body + _mac(secret, challenge, hello_mac, body)


def welcome_size(with_epoch: bool) -> int:
    return WELCOME_EPOCH_SIZE if with_epoch else WELCOME_SIZE


def decode_welcome(secret: bytes, challenge: bytes, hello_mac: bytes, data: bytes) -> Welcome:
    """A WELCOME of either form (its size tells which the slave asked for)."""
    layout = _WELCOME_EPOCH if len(data) == WELCOME_EPOCH_SIZE else _WELCOME
    if len(data) != layout.size + MAC_SIZE:
        raise HAProtocolError(f"a WELCOME is {WELCOME_SIZE} bytes, got {len(data)}")
    magic, low, high, start, *rest = layout.unpack_from(data)
    expected = WELCOME_EPOCH_MAGIC if rest else WELCOME_MAGIC
    if magic != expected:
        raise HAProtocolError(f"expected a WELCOME ({expected!r}), got {magic!r}")
    epoch = rest[0] if rest else None
    if epoch is not None and epoch < 0:
        raise HAProtocolError(f"WELCOME epoch {epoch} is negative")
    if not hmac.compare_digest(
        _mac(secret, challenge, hello_mac, data[: layout.size]), data[layout.size :]
    ):
        raise HAProtocolError("the WELCOME's HMAC does not verify: the master has another haSecret")
    if min(low, high, start) < 0 or not low <= high:
        raise HAProtocolError(
            f"WELCOME offsets make no sense: min {low}, max {high}, start {start}"
        )
    return Welcome(low, high, start, epoch)
