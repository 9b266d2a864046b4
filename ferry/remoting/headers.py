"""Checked readers of a request's header fields (`extFields`, all strings on
the wire): each returns the typed value or raises `BadRequest` naming the
field and what was wrong with it. No I/O, no logging.

Apache answers a required field that is missing with SYSTEM_ERROR and a remark
naming it; ferry's servers do the same with these errors' messages.
"""

from __future__ import annotations

from collections.abc import Mapping

from ferry.runtime import errors

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


class BadRequest(errors.InvalidArgument):
    """A header field missing or malformed."""


def text(
    ext: Mapping[str, str],
    key: str,
    *,
    required: bool = True,
    default: str = "",
    allow_empty: bool = False,
) -> str:
    """A string field. Required: present and, unless `allow_empty`, not ""."""
    value = ext.get(key)
    if value is None or (value == "" and not allow_empty):
        if required:
            raise BadRequest(key, "missing from the request header")
        return default
    return value


def integer(
    ext: Mapping[str, str],
    key: str,
    *,
    required: bool = True,
    default: int = 0,
    low: int = INT64[0],
    high: int = INT64[1],
) -> int:
    """A decimal integer field within low..high (Java's long by default)."""
    value = ext.get(key)
    if value is None or value == "":
        if required:
            raise BadRequest(key, "missing from the request header")
        return default
    if len(value) > 24:
        raise BadRequest(key, f"not an integer: {value[:24]!r}...")
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(key, f"not an integer: {value!r}") from None
    if not low <= number <= high:
        raise BadRequest(key, f"{number} outside {low}..{high}")
    return number


def boolean(ext: Mapping[str, str], key: str, *, default: bool = False) -> bool:
    """ "true" or "false" in any case (what Java prints); absent: `default`."""
    value = ext.get(key)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise BadRequest(key, f"{value[:24]!r} is neither true nor false")
    return lowered == "true"
