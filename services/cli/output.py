"""Plain-text tables and JSON for the `ferry` command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def message_json(message: Any) -> str:
    """A message as JSON with RocketMQ's camelCase names (queueDatas, brokerAddrs, ...)."""
    return json.dumps(
        MessageToDict(message, always_print_fields_with_no_presence=True), indent=2, sort_keys=True
    )
