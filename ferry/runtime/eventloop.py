"""Which asyncio event loop a server runs on.

uvloop (libuv under asyncio's API) cuts the CPU a grpc.aio server spends per
call. Measured on the proxy (`python -m benchmarks --only proxy`, two runs back
to back, 2026-11-24, 2 cores): the same single-message sends cost 538-555 µs
of proxy CPU per message on uvloop against 603-618 on asyncio's own loop, and
the throughput ratio to direct sends went from 0.63 to 0.68; receive streams
were unchanged (172-175 against 173-180 µs per message). grpc.aio runs on it
unchanged, the SDK tests included. `asyncio` stays selectable, for a platform
without uvloop wheels or to rule the loop out when debugging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

LOOPS = ("uvloop", "asyncio")
DEFAULT_LOOP = "uvloop"


def run(main: Callable[[], Coroutine[Any, Any, None]], loop: str = DEFAULT_LOOP) -> None:
    """Run `main()` to completion on the named loop."""
    if loop not in LOOPS:
        raise ValueError(f"unknown event loop {loop!r}; choose one of {', '.join(LOOPS)}")
    if loop == "uvloop":
        import uvloop  # a dependency; imported here so that `asyncio` never needs it

        uvloop.run(main())
    else:
        asyncio.run(main())
