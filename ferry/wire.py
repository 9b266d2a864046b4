"""Helpers on `ferry.v1` messages that servers and clients must compute alike."""

from __future__ import annotations

import zlib
from typing import Any


def body_crc32(body: Any) -> int:
    """RegisterBroker's `body_crc32`: CRC32 of the deterministic serialisation, & 0x7FFFFFFF.

    0 means "unchecked" on the wire, so a body whose CRC is 0 is simply not checked.
    """
    return zlib.crc32(body.SerializeToString(deterministic=True)) & 0x7FFFFFFF
