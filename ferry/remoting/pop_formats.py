"""RocketMQ 5's pop formats on the RocketMQ protocol: the text fields of a
POP_MESSAGE answer's header and the BatchAck entries of a BATCH_ACK_MESSAGE body.
Written by the broker (services/broker/remoting/pops.py), read by ferry's proxy
(services/proxy/remoting_pops.py) and Apache's clients; nothing else spells them.

Every field names messages by (mark, queue id, offset), where the mark is "0" for
the topic and "1" for its pop retry topic `%RETRY%<group>_<topic>`
(ExtraInfoUtil's retry marks):

| field            | form (items joined by ";")                 |
|------------------|--------------------------------------------|
| startOffsetInfo  | "<mark> <queueId> <lowest offset popped>"  |
| msgOffsetInfo    | "<mark> <queueId> <o1>,<o2>,..."           |
| orderCountInfo   | "<mark> qo<queueId>%<offset> <count>"      |

A BatchAck (BatchAckMessageRequestBody's entries, fastjson's short names): c group,
t topic (the one the consumer asked for), r mark, so start offset, q queue id, rq
revive queue id, pt pop time, it invisible time, b the acknowledged offsets as
Java's BitSet.toByteArray in Base64 (little-endian: bit i, offset so + i, is bit
i % 8 of byte i // 8).

Decoders distrust their text: anything malformed raises PopFieldError, naming the
field.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ferry.model import RETRY_TOPIC_PREFIX

TOPIC_MARK = "0"
RETRY_MARK = "1"
MAX_BITSET_CHARS = 87_384  # Base64 of 64 KiB: 524,288 offsets in one BatchAck
MAX_NUMBER_CHARS = 20

QueueKey = tuple[str, int]  # (mark, queue id)
OffsetKey = tuple[str, int, int]  # (mark, queue id, offset)


class PopFieldError(ValueError):
    """A pop header field or BatchAck entry that does not parse."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def mark_of(topic: str) -> str:
    """The mark of a message's topic: RETRY_MARK for a pop retry topic (ferry's are
    all of Apache's first form, `%RETRY%<group>_<topic>`), TOPIC_MARK otherwise."""
    return RETRY_MARK if topic.startswith(RETRY_TOPIC_PREFIX) else TOPIC_MARK


# ------------------------------------------------------------ pop answer header


def encode_offset_infos(popped: Iterable[OffsetKey]) -> tuple[str, str]:
    """(startOffsetInfo, msgOffsetInfo) of the messages, given in the body's order."""
    by_queue: dict[QueueKey, list[int]] = {}
    for mark, queue_id, offset in popped:
        by_queue.setdefault((mark, queue_id), []).append(offset)
    start = ";".join(f"{mark} {qid} {min(o)}" for (mark, qid), o in by_queue.items())
    offsets = ";".join(
        f"{mark} {qid} {','.join(map(str, o))}" for (mark, qid), o in by_queue.items()
    )
    return start, offsets


def decode_start_offsets(text: str) -> dict[QueueKey, int]:
    """startOffsetInfo: the start offset of each (mark, queue id)."""
    out: dict[QueueKey, int] = {}
    for item in _items(text):
        mark, queue_id, start = _split3(item, "startOffsetInfo")
        out[(mark, _number(queue_id, "startOffsetInfo"))] = _number(start, "startOffsetInfo")
    return out


def decode_msg_offsets(text: str) -> dict[QueueKey, list[int]]:
    """msgOffsetInfo: the offsets popped of each (mark, queue id)."""
    out: dict[QueueKey, list[int]] = {}
    for item in _items(text):
        mark, queue_id, listed = _split3(item, "msgOffsetInfo")
        out[(mark, _number(queue_id, "msgOffsetInfo"))] = [
            _number(o, "msgOffsetInfo") for o in listed.split(",")
        ]
    return out


def encode_order_counts(counts: Iterable[tuple[str, int, int, int]]) -> str:
    """orderCountInfo of (mark, queue id, offset, count) per message; the client
    takes the count as the message's reconsume times."""
    return ";".join(f"{mark} qo{qid}%{offset} {count}" for mark, qid, offset, count in counts)


def decode_order_counts(text: str) -> dict[OffsetKey, int]:
    """orderCountInfo: the count of each (mark, queue id, offset)."""
    out: dict[OffsetKey, int] = {}
    for item in _items(text):
        mark, where, count = _split3(item, "orderCountInfo")
        if not where.startswith("qo") or "%" not in where:
            raise PopFieldError("orderCountInfo", f"not 'qo<queueId>%<offset>': {where[:40]!r}")
        queue_id, _, offset = where[2:].partition("%")
        key = (mark, _number(queue_id, "orderCountInfo"), _number(offset, "orderCountInfo"))
        out[key] = _number(count, "orderCountInfo")
    return out


# ------------------------------------------------------------------- BatchAck


class BatchAck(NamedTuple):
    group: str
    topic: str  # the topic the consumer asked for, also for a retry-topic mark
    mark: str
    start_offset: int
    queue_id: int
    revive_qid: int
    pop_time: int
    invisible_ms: int
    bits: tuple[int, ...]  # acknowledged offsets, each less start_offset

    def to_json(self) -> dict[str, object]:
        return {
            "c": self.group,
            "t": self.topic,
            "r": self.mark,
            "so": self.start_offset,
            "q": self.queue_id,
            "rq": self.revive_qid,
            "pt": self.pop_time,
            "it": self.invisible_ms,
            "b": encode_bitset(self.bits),
        }

    @classmethod
    def from_json(cls, entry: object) -> BatchAck:
        if not isinstance(entry, Mapping):
            raise PopFieldError("acks", "each entry must be a BatchAck object")
        return cls(
            _field_text(entry, "c"),
            _field_text(entry, "t"),
            RETRY_MARK if str(entry.get("r", TOPIC_MARK)) == RETRY_MARK else TOPIC_MARK,
            _field_int(entry, "so"),
            _field_int(entry, "q"),
            _field_int(entry, "rq", default=0),
            _field_int(entry, "pt"),
            _field_int(entry, "it"),
            tuple(decode_bitset(entry.get("b"))),
        )


def encode_bitset(bits: Iterable[int]) -> str:
    """Java's BitSet.toByteArray of the bits (each >= 0), in Base64."""
    bits = list(bits)
    raw = bytearray(max(bits) // 8 + 1 if bits else 0)
    for bit in bits:
        raw[bit // 8] |= 1 << (bit % 8)
    return base64.b64encode(bytes(raw)).decode()


def decode_bitset(encoded: object) -> list[int]:
    """The set bits of a Base64 BitSet.toByteArray, lowest first; [] for none."""
    if encoded is None or encoded == "":
        return []
    if not isinstance(encoded, str) or len(encoded) > MAX_BITSET_CHARS:
        raise PopFieldError("acks.b", "must be a Base64 BitSet of at most 64 KiB")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise PopFieldError("acks.b", "is not Base64") from None
    return [
        at * 8 + bit for at, byte in enumerate(raw) if byte for bit in range(8) if byte >> bit & 1
    ]


# -------------------------------------------------------------------- helpers


def _items(text: str) -> list[str]:
    if not isinstance(text, str):
        raise PopFieldError("pop header", "must be text")
    return [item for item in text.split(";") if item]


def _split3(item: str, field: str) -> tuple[str, str, str]:
    parts = item.split(" ")
    if len(parts) != 3 or parts[0] not in (TOPIC_MARK, RETRY_MARK):
        raise PopFieldError(field, f"not '<mark> <queue> <value>': {item[:40]!r}")
    return parts[0], parts[1], parts[2]


def _number(text: str, field: str) -> int:
    if not (text.isascii() and text.lstrip("-").isdecimal()) or len(text) > MAX_NUMBER_CHARS:
        raise PopFieldError(field, f"not an integer: {text[:24]!r}")
    return int(text)


def _field_text(entry: Mapping[str, object], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise PopFieldError(f"acks.{key}", "must be a non-empty string")
    return value


def _field_int(entry: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise PopFieldError(f"acks.{key}", f"must be an integer, not {value!r:.24}")
    return value
