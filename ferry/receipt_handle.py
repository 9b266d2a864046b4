"""The receipt-handle format, and nothing else: shared by the broker, which issues
and reads handles, and the proxy, which routes an ack by the broker name inside one.

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

`PopFormatError` is the one error of the pop formats (handles here, revive records in
`services/broker/pop/records.py`, timer-done records in
`services/broker/schedule/timer_done.py`). Decoders distrust their input and raise
it only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

HANDLE_VERSION = "1"
MAX_HANDLE_CHARS = 1024


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
