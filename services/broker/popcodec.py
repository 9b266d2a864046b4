"""The formats of pop consumption and timers, and nothing else: receipt handles
and the bodies of the broker's own journal records.

Receipt handle (a string, space-separated; no field can hold a space):

    | # | field          | meaning                                               |
    |---|----------------|-------------------------------------------------------|
    | 1 | `1`            | format version                                        |
    | 2 | broker name    | the broker that handed the message out                |
    | 3 | group          | the consumer group it was handed to                   |
    | 4 | topic          | the queue's topic (the retry topic for a redelivery)  |
    | 5 | queue id       |                                                       |
    | 6 | queue offset   | the message in that queue                             |
    | 7 | checkpoint     | revive-queue offset of the checkpoint that issued it  |
    | 8 | invisible until| epoch ms                                              |

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

Timer-done records (queue 1 of the timer topic): `{"o": [timer queue offsets]}`.

Decoders distrust their input and raise `PopFormatError` only.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

HANDLE_VERSION = "1"
MAX_HANDLE_CHARS = 1024
MAX_RECORD_ITEMS = 100_000


class PopFormatError(ValueError):
    """Bytes or text that are not a valid handle or journal record."""


class ReceiptHandle(NamedTuple):
    broker_name: str
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    checkpoint: int
    invisible_until_ms: int

    def encode(self) -> str:
        return join_handle(
            handle_prefix(self.broker_name, self.group, self.topic, self.queue_id),
            self.queue_offset,
            handle_suffix(self.checkpoint, self.invisible_until_ms),
        )


def handle_prefix(broker_name: str, group: str, topic: str, queue_id: int) -> str:
    """Fields 1-5 of a handle and a space, shared by every message popped from
    one queue (`join_handle` makes a handle of it)."""
    return f"{HANDLE_VERSION} {broker_name} {group} {topic} {queue_id} "


def handle_suffix(checkpoint: int, invisible_until_ms: int) -> str:
    """A space and fields 7-8, shared by every message of one checkpoint."""
    return f" {checkpoint} {invisible_until_ms}"


def join_handle(prefix: str, queue_offset: int, suffix: str) -> str:
    """A handle from a queue's prefix, a message's queue offset and a checkpoint's suffix."""
    return f"{prefix}{queue_offset}{suffix}"


def decode_handle(text: str) -> ReceiptHandle:
    if not isinstance(text, str) or not text or len(text) > MAX_HANDLE_CHARS:
        raise PopFormatError("empty or longer than 1024 characters")
    parts = text.split(" ")
    if len(parts) != 8 or parts[0] != HANDLE_VERSION:
        raise PopFormatError("not a ferry receipt handle (expected 8 space-separated fields, v1)")
    _, broker, group, topic, queue_id, queue_offset, checkpoint, until = parts
    if not (broker and group and topic):
        raise PopFormatError("a name field is empty")
    numbers = queue_id + queue_offset + checkpoint + until
    if not (numbers.isascii() and numbers.isdecimal()) or not (
        queue_id and queue_offset and checkpoint and until
    ):
        raise PopFormatError("a number field is not a non-negative decimal integer")
    return ReceiptHandle(
        broker, group, topic, int(queue_id), int(queue_offset), int(checkpoint), int(until)
    )


def handle_broker(text: str) -> str | None:
    """The broker that issued a receipt handle (field 2), for routing an ack
    to it without decoding the rest; None if the text is not a handle."""
    if type(text) is not str or len(text) > MAX_HANDLE_CHARS:
        return None
    parts = text.split(" ", 2)
    if len(parts) < 3 or parts[0] != HANDLE_VERSION or not parts[1]:
        return None
    return parts[1]


class BadHandle(PopFormatError):
    """Handle number `index` of a request does not parse."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


Head = tuple[str, str, str, int]  # (broker, group, topic, queue id): fields 2-5


class HandleReader:
    """Decodes the handles of one request, with the same answers as
    `decode_handle`. Handles of one queue share fields 1-5, and those of one
    checkpoint fields 7-8 too: a handle that repeats the previous one's
    shared text has only its queue offset to check; any other is decoded
    whole, and the fields a queue's handles share are checked once."""

    def __init__(self) -> None:
        self._heads: dict[str, Head] = {}

    def read(self, text: str) -> tuple[Head, int, int, int]:
        """(head, queue offset, checkpoint, invisible until)."""
        if type(text) is str and len(text) <= MAX_HANDLE_CHARS:
            parts = text.rsplit(" ", 3)
            if len(parts) == 4:
                head = self._heads.get(parts[0])
                if head is not None:
                    _, offset, checkpoint, until = parts
                    digits = offset + checkpoint + until
                    if offset and checkpoint and until and digits.isascii() and digits.isdecimal():
                        return head, int(offset), int(checkpoint), int(until)
        handle = decode_handle(text)
        head = (handle.broker_name, handle.group, handle.topic, handle.queue_id)
        self._heads[text.rsplit(" ", 3)[0]] = head
        return head, handle.queue_offset, handle.checkpoint, handle.invisible_until_ms

    def read_all(self, texts: Sequence[str]) -> list[tuple[Head, int, int]]:
        """(head, queue offset, checkpoint) of every handle, in order.

        Raises:
            BadHandle: the first that does not parse.
        """
        out: list[tuple[Head, int, int]] = []
        append = out.append
        prefix = suffix = ""  # the last decoded handle's text before and after its offset
        head: Head | None = None
        checkpoint = 0
        for index, text in enumerate(texts):
            if (
                head is not None
                and type(text) is str
                and len(text) <= MAX_HANDLE_CHARS
                and text.startswith(prefix)
                and text.endswith(suffix)
            ):
                offset = text[len(prefix) : len(text) - len(suffix)]
                if offset.isdecimal() and offset.isascii():  # "" is not decimal
                    append((head, int(offset), checkpoint))
                    continue
            try:
                head, offset_value, checkpoint, _ = self.read(text)
            except PopFormatError as exc:
                raise BadHandle(index, str(exc)) from None
            before, _, checkpoint_text, until_text = text.rsplit(" ", 3)
            prefix, suffix = f"{before} ", f" {checkpoint_text} {until_text}"
            append((head, offset_value, checkpoint))
        return out


# ---------------------------------------------------------------- revive records


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


def encode_timer_done(offsets: list[int]) -> bytes:
    return json.dumps({"o": offsets}, separators=(",", ":")).encode()


def decode_timer_done(body: bytes) -> tuple[int, ...]:
    return _ints(_object(body), "o")


def _object(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PopFormatError("not JSON") from None
    if not isinstance(doc, dict):
        raise PopFormatError("not a JSON object")
    return doc


def _ints(doc: dict[str, Any], key: str) -> tuple[int, ...]:
    value = doc.get(key)
    if not isinstance(value, list) or len(value) > MAX_RECORD_ITEMS:
        raise PopFormatError(f"{key!r} is not a list")
    if not all(type(v) is int and v >= 0 for v in value):
        raise PopFormatError(f"{key!r} holds a value that is not a non-negative integer")
    return tuple(value)
