"""Which asyncio event loop a server runs on.

uvloop (libuv under asyncio's API) cuts the CPU a grpc.aio server spends per
call. Measured on the proxy (`python -m benchmarks --only proxy`, two runs back
to back, 2026-11-24, 2 cores): the same single-message sends cost 538-555 µs
of proxy CPU per message on uvloop against 603-618 on asyncio's own loop, and
the throughput ratio to direct sends went from 0.63 to 0.68; receive streams
were unchanged (172-175 against 173-180 µs per message). grpc.aio runs on it
unchanged, the SDK tests included. `asyncio` stays selectable, for a platform
without uvloop wheels or to rule the loop out when debugging.

The broker (and its HA plane) stays on asyncio's loop by default: measured
2026-11-24 with a SYNC_MASTER and its slave both on each loop, two rounds each
(`SendStream`, 16 producers one message in flight: 3,302 and 3,480 msgs/s on
asyncio, 3,528 and 3,374 on uvloop; pipelined 256 each: 5,109 and 5,076
against 5,175 and 4,695), no difference beyond the noise. A bare grpc.aio echo
server does gain from uvloop (about 174 against 111 µs of CPU per streamed
message), but the broker's time goes to its own work per message, not to the
loop. `--event-loop uvloop` (or $FERRY_EVENT_LOOP) runs it on uvloop. A broker that
serves the RocketMQ 5 SDKs itself (enableProxy) is the exception, on uvloop by default:
there the loop's own Python is a share of each call (services/broker/cli.py has the
figures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

LOOPS = ("uvloop", "asyncio")
DEFAULT_LOOP = "uvloop"
ENV = "FERRY_EVENT_LOOP"


def add_argument(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_LOOP, default_text: str = ""
) -> None:
    """`--event-loop`, defaulting to $FERRY_EVENT_LOOP, else `default` (None: the
    program decides later, as `default_text` tells the help)."""
    parser.add_argument(
        "--event-loop",
        choices=LOOPS,
        default=os.environ.get(ENV) or default,
        help=f"the asyncio event loop: uvloop (less CPU per call) or asyncio (Python's own); "
        f"default {default_text or default}; ${ENV}",
    )


def check(name: str) -> str | None:
    """What is wrong with a loop name (argparse trusts a default from the
    environment), or None."""
    if name in LOOPS:
        return None
    return (
        f"bad event loop {name!r} (from --event-loop or ${ENV}): choose one of {', '.join(LOOPS)}"
    )


def run(main: Callable[[], Coroutine[Any, Any, None]], loop: str = DEFAULT_LOOP) -> None:
    """Run `main()` to completion on the named loop."""
    if loop not in LOOPS:
        raise ValueError(f"unknown event loop {loop!r}; choose one of {', '.join(LOOPS)}")
    if loop == "uvloop":
        import uvloop  # a dependency; imported here so that `asyncio` never needs it

        uvloop.run(main())
    else:
        asyncio.run(main())
