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

Revive records (queue 0 of `rmq_sys_REVIVE_LOG_<cluster>`), a compact JSON
object each, key `k` the kind:

- `ck`: a pop of one queue. `g` group, `t` topic, `q` queue id, `s`/`e` the
  queue-offset range scanned (offsets in it not listed were filtered out by
  tags), `o` the offsets handed out, `a` their delivery attempts, `d` invisible
  until (epoch ms). The record's own revive-queue offset names the checkpoint.
- `ack`: `g`, `t`, `q`, `m` a list of `[queue offset, checkpoint]` resolved
  (acknowledged, or moved to the retry or dead-letter topic: `why`).
- `chg`: one in-flight message re-timed: `g`, `t`, `q`, `o` offset, `r` the old
  checkpoint, `d` the new deadline, `a` attempt. The record's own offset is the
  new checkpoint.

Timer-done records (queue 1 of the timer topic): `{"o": [timer queue offsets]}`.

Decoders distrust their input and raise `PopFormatError` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

HANDLE_VERSION = "1"
MAX_HANDLE_CHARS = 1024
MAX_RECORD_ITEMS = 100_000


class PopFormatError(ValueError):
    """Bytes or text that are not a valid handle or journal record."""


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    broker_name: str
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    checkpoint: int
    invisible_until_ms: int

    def encode(self) -> str:
        return " ".join(
            (
                HANDLE_VERSION,
                self.broker_name,
                self.group,
                self.topic,
                str(self.queue_id),
                str(self.queue_offset),
                str(self.checkpoint),
                str(self.invisible_until_ms),
            )
        )


def decode_handle(text: str) -> ReceiptHandle:
    if not isinstance(text, str) or not text or len(text) > MAX_HANDLE_CHARS:
        raise PopFormatError("empty or longer than 1024 characters")
    parts = text.split(" ")
    if len(parts) != 8 or parts[0] != HANDLE_VERSION:
        raise PopFormatError("not a ferry receipt handle (expected 8 space-separated fields, v1)")
    _, broker, group, topic, *numbers = parts
    if not broker or not group or not topic:
        raise PopFormatError("a name field is empty")
    try:
        queue_id, queue_offset, checkpoint, until = (int(n) for n in numbers)
    except ValueError:
        raise PopFormatError("a number field is not an integer") from None
    if queue_id < 0 or queue_offset < 0 or checkpoint < 0 or until < 0:
        raise PopFormatError("a number field is negative")
    return ReceiptHandle(broker, group, topic, queue_id, queue_offset, checkpoint, until)


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


def encode_revive(item: ReviveRecord) -> bytes:
    doc: dict[str, Any]
    if isinstance(item, Checkpoint):
        doc = {
            "k": "ck", "g": item.group, "t": item.topic, "q": item.queue_id, "s": item.start,
            "e": item.end, "o": list(item.offsets), "a": list(item.attempts),
            "d": item.invisible_until_ms,
        }  # fmt: skip
    elif isinstance(item, Acks):
        doc = {
            "k": "ack", "g": item.group, "t": item.topic, "q": item.queue_id,
            "m": [list(pair) for pair in item.resolved], "why": item.why,
        }  # fmt: skip
    else:
        doc = {
            "k": "chg", "g": item.group, "t": item.topic, "q": item.queue_id,
            "o": item.queue_offset, "r": item.old_checkpoint, "d": item.invisible_until_ms,
            "a": item.attempt,
        }  # fmt: skip
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_revive(body: bytes) -> ReviveRecord:
    doc = _object(body)
    kind = doc.get("k")
    group, topic, queue_id = _str(doc, "g"), _str(doc, "t"), _int(doc, "q")
    if kind == "ck":
        offsets = _ints(doc, "o")
        attempts = _ints(doc, "a")
        if len(attempts) != len(offsets):
            raise PopFormatError("checkpoint: offsets and attempts differ in length")
        start, end = _int(doc, "s"), _int(doc, "e")
        if end < start or any(not start <= o < end for o in offsets):
            raise PopFormatError("checkpoint: an offset lies outside its range")
        return Checkpoint(group, topic, queue_id, start, end, offsets, attempts, _int(doc, "d"))
    if kind == "ack":
        pairs = doc.get("m")
        if not isinstance(pairs, list) or len(pairs) > MAX_RECORD_ITEMS:
            raise PopFormatError("ack: 'm' is not a list")
        resolved = []
        for pair in pairs:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(type(v) is int and v >= 0 for v in pair)
            ):
                raise PopFormatError("ack: an entry is not [offset, checkpoint]")
            resolved.append((pair[0], pair[1]))
        why = doc.get("why", "ack")
        return Acks(group, topic, queue_id, tuple(resolved), why if isinstance(why, str) else "ack")
    if kind == "chg":
        return Change(
            group, topic, queue_id, _int(doc, "o"), _int(doc, "r"), _int(doc, "d"), _int(doc, "a")
        )
    raise PopFormatError(f"unknown revive record kind {str(kind)[:20]!r}")


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


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise PopFormatError(f"{key!r} is not a non-empty string")
    return value


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if type(value) is not int or value < 0:
        raise PopFormatError(f"{key!r} is not a non-negative integer")
    return value


def _ints(doc: dict[str, Any], key: str) -> tuple[int, ...]:
    value = doc.get(key)
    if not isinstance(value, list) or len(value) > MAX_RECORD_ITEMS:
        raise PopFormatError(f"{key!r} is not a list")
    if not all(type(v) is int and v >= 0 for v in value):
        raise PopFormatError(f"{key!r} holds a value that is not a non-negative integer")
    return tuple(value)
