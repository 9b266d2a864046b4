"""The timer-done record format, and nothing else.

Timer-done records (queue 1 of the timer topic): `{"o": [timer queue offsets]}`,
the timer queue offsets whose messages were delivered. Decoders distrust their
input and raise `PopFormatError` only.
"""

from __future__ import annotations

import json
from typing import Any

from ferry.receipt_handle import PopFormatError

MAX_RECORD_ITEMS = 100_000


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
