"""The revive-record format of pop consumption, and nothing else: the bodies of
the journal records PopService writes to and reads back from the revive queue.

Revive records (queue 0 of `rmq_sys_REVIVE_LOG_<cluster>`), big-endian; every
one starts with a kind byte, the group and topic (`u16` length + UTF-8 each)
and the queue id (`i32`):

    | kind    | then                                                              |
    |---------|-------------------------------------------------------------------|
    | `C` ck  | start `i64`, end `i64` (the queue-offset range scanned: offsets in |
    |         | it not listed were filtered out by tags), invisible until `i64`   |
    |         | (epoch ms), count `u32`, count × offset `i64`, count × attempt    |
    |         | `u32`. The record's own revive-queue offset names the checkpoint. |
    | `A` ack | why `u8` (0 ack, 1 revive: moved to the retry topic, 2 dlq),      |
    |         | count `u32`, count × (queue offset `i64`, checkpoint `i64`)       |
    | `G` chg | offset `i64`, old checkpoint `i64`, new deadline `i64`, attempt   |
    |         | `u32`; the record's own offset is the new checkpoint.             |

Decoders distrust their input and raise `PopFormatError` only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain

from ferry.receipt_handle import PopFormatError

MAX_RECORD_ITEMS = 100_000


@dataclass(frozen=True, slots=True)
class Checkpoint:
    group: str
    topic: str
    queue_id: int
    start: int
    end: int
    offsets: tuple[int, ...]
    attempts: tuple[int, ...]
    invisible_until_ms: int


@dataclass(frozen=True, slots=True)
class Acks:
    group: str
    topic: str
    queue_id: int
    resolved: tuple[tuple[int, int], ...]  # (queue offset, checkpoint)
    why: str = "ack"


@dataclass(frozen=True, slots=True)
class Change:
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    old_checkpoint: int
    invisible_until_ms: int
    attempt: int


ReviveRecord = Checkpoint | Acks | Change
_KIND = {Checkpoint: b"C", Acks: b"A", Change: b"G"}


_HEAD = struct.Struct(">cH")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_CK = struct.Struct(">qqqI")
_ACK = struct.Struct(">BI")
_CHG = struct.Struct(">qqqI")
_WHY = ("ack", "revive", "dlq")


def encode_revive(item: ReviveRecord) -> bytes:
    group, topic = item.group.encode(), item.topic.encode()
    head = b"".join(
        (_HEAD.pack(_KIND[type(item)], len(group)), group, _U16.pack(len(topic)), topic,
         _I32.pack(item.queue_id))
    )  # fmt: skip
    if isinstance(item, Checkpoint):
        n = len(item.offsets)
        return b"".join((
            head,
            _CK.pack(item.start, item.end, item.invisible_until_ms, n),
            struct.pack(f">{n}q{n}I", *item.offsets, *item.attempts),
        ))  # fmt: skip
    if isinstance(item, Acks):
        n = len(item.resolved)
        why = _WHY.index(item.why) if item.why in _WHY else 0
        return b"".join(
            (
                head,
                _ACK.pack(why, n),
                struct.pack(f">{2 * n}q", *chain.from_iterable(item.resolved)),
            )
        )
    return head + _CHG.pack(
        item.queue_offset, item.old_checkpoint, item.invisible_until_ms, item.attempt
    )


def decode_revive(body: bytes) -> ReviveRecord:
    try:
        kind, group_len = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        group = _text(body, at, group_len)
        at += group_len
        (topic_len,) = _U16.unpack_from(body, at)
        at += 2
        topic = _text(body, at, topic_len)
        at += topic_len
        (queue_id,) = _I32.unpack_from(body, at)
        at += 4
        if queue_id < 0:
            raise PopFormatError("negative queue id")
        if kind == b"C":
            start, end, until, n = _CK.unpack_from(body, at)
            at += _CK.size
            values = _array(body, at, n, f">{n}q{n}I", 12)
            offsets, attempts = values[:n], values[n:]
            if min(start, end, until) < 0 or end < start:
                raise PopFormatError("checkpoint: a bad range or deadline")
            if any(not start <= o < end for o in offsets):
                raise PopFormatError("checkpoint: an offset lies outside its range")
            return Checkpoint(group, topic, queue_id, start, end, offsets, attempts, until)
        if kind == b"A":
            why, n = _ACK.unpack_from(body, at)
            at += _ACK.size
            if why >= len(_WHY):
                raise PopFormatError(f"ack: unknown reason {why}")
            flat = _array(body, at, n, f">{2 * n}q", 16)
            if flat and min(flat) < 0:
                raise PopFormatError("ack: a negative offset")
            pairs = tuple(zip(flat[0::2], flat[1::2], strict=True))
            return Acks(group, topic, queue_id, pairs, _WHY[why])
        if kind == b"G":
            offset, old, until, attempt = _CHG.unpack_from(body, at)
            if at + _CHG.size != len(body):
                raise PopFormatError("change: wrong length")
            if min(offset, old, until) < 0:
                raise PopFormatError("change: a negative field")
            return Change(group, topic, queue_id, offset, old, until, attempt)
    except struct.error as exc:
        raise PopFormatError(f"too short: {exc}") from None
    raise PopFormatError(f"unknown revive record kind {kind!r}")


def _text(body: bytes, at: int, length: int) -> str:
    if length == 0 or at + length > len(body):
        raise PopFormatError("a name is empty or does not fit")
    try:
        return body[at : at + length].decode()
    except UnicodeDecodeError:
        raise PopFormatError("a name is not UTF-8") from None


def _array(body: bytes, at: int, n: int, fmt: str, per_item: int) -> tuple[int, ...]:
    if n > MAX_RECORD_ITEMS or at + n * per_item != len(body):
        raise PopFormatError(f"{n} items do not fit the record's {len(body)} bytes")
    return struct.unpack_from(fmt, body, at)
