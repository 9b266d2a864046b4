"""JSON bodies in the forms RocketMQ's clients parse (fastjson's, 4.9).

* `dumps`: compact standard JSON with quoted keys and no spaces, which every
  client reads (the Go client hand-splits route addresses on `,` and `:`, so a
  space breaks it).
* `dumps_object_keyed`: a map whose keys are objects — invalid JSON, yet what
  fastjson writes for ConsumeStats (208) and TopicStatsTable (202) and what
  mqadmin parses.
* `loads`: standard JSON, falling back to fastjson's forms Java peers send
  (unquoted numeric keys such as `{0:"addr"}`); anything else is a
  `BodyError`. A lone surrogate (a `\\ud800` escape without its pair) becomes
  "?", as a Java client's UTF-8 would carry it: no text that UTF-8, protobuf
  or a JSON answer cannot hold gets past the door.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

MAX_DEPTH = 64


class BodyError(ValueError):
    """A request body that is not the JSON its code expects."""


def dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: only the \\u escape is valid UTF-8
        return json.dumps(value, separators=(",", ":")).encode()


def scrub(value: Any) -> Any:
    """`value` (from json.loads) with each lone surrogate in its strings,
    keys included, replaced by "?"."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "replace").decode()
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    return value


def dumps_object_keyed(pairs: Iterable[tuple[Mapping[str, Any], Any]]) -> str:
    """`{{key object}:value,...}` as fastjson writes a map keyed by objects;
    embed the result with `raw_json`. (orjson: these maps have a key per
    queue, thousands on a broker with many topics.)"""
    return "{" + ",".join(f"{_fast(k)}:{_fast(v)}" for k, v in pairs) + "}"


def _fast(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # what orjson refuses (a lone surrogate, a huge int): the stdlib's form
        return dumps(value).decode()


def loads_object_keyed(text: str, start: int = 0) -> tuple[list[tuple[Any, Any]], int]:
    """The (key, value) pairs of a map written as `dumps_object_keyed` (and
    fastjson) write it, starting at `text[start]`, and the index after its
    closing brace. Keys and values are any JSON values.

    Raises:
        BodyError: not such a map.
    """
    decoder = json.JSONDecoder()
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = skip(start)
    if i >= n or text[i] != "{":
        raise BodyError("expected a map")
    i = skip(i + 1)
    pairs: list[tuple[Any, Any]] = []
    if i < n and text[i] == "}":
        return pairs, i + 1
    while True:
        try:
            key, i = decoder.raw_decode(text, i)
            i = skip(i)
            if i >= n or text[i] != ":":
                raise BodyError(f"expected ':' at {i}")
            value, i = decoder.raw_decode(text, skip(i + 1))
        except (ValueError, RecursionError) as e:
            raise BodyError(f"map entry at {i}: {e}") from None
        pairs.append((key, value))
        i = skip(i)
        if i < n and text[i] == ",":
            i = skip(i + 1)
            continue
        if i < n and text[i] == "}":
            return pairs, i + 1
        raise BodyError(f"expected ',' or '}}' at {i}")


def loads(body: bytes | bytearray | memoryview) -> Any:
    try:
        text = bytes(body).decode()
    except UnicodeDecodeError as e:
        raise BodyError(f"body is not UTF-8: {e}") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BodyError("body nests too deeply") from None
    except ValueError:
        try:
            value = json.loads(_quote_bare_keys(text))
        except (ValueError, RecursionError) as e:
            raise BodyError(f"body is not JSON: {e}") from None
    if "\\u" not in text:  # only an escape makes a lone surrogate
        return value
    try:
        return scrub(value)
    except RecursionError:
        raise BodyError("body nests too deeply") from None


def _quote_bare_keys(text: str) -> str:
    """Quote the bare numeric keys fastjson writes for maps keyed by numbers,
    outside strings only."""
    out: list[str] = []
    i, n = 0, len(text)
    depth = 0
    expect_key = False
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
            expect_key = False
            continue
        if c in "{,":
            if c == "{":
                depth += 1
                if depth > MAX_DEPTH:
                    raise BodyError("body nests too deeply")
            out.append(c)
            i += 1
            expect_key = True
            continue
        if c == "}":
            depth -= 1
        if expect_key and (c == "-" or c.isdigit()):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i = j
                expect_key = False
                continue
        if not c.isspace():
            expect_key = False
        out.append(c)
        i += 1
    return "".join(out)
