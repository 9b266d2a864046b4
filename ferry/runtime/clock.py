"""Injectable clocks.

`wall()` is for timestamps users see (epoch seconds); `monotonic()` is for
intervals, deadlines and expiry. Components take a `Clock` so tests advance a
`FakeClock` instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float: ...

    def wall_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks of this machine."""

    def wall(self) -> float:
        return time.time()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to; both readings advance together."""

    def __init__(self, wall: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        self._wall = wall
        self._monotonic = monotonic

    def wall(self) -> float:
        return self._wall

    def wall_ms(self) -> int:
        return int(self._wall * 1000)

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._wall += seconds
        self._monotonic += seconds


async def wait_event(event, timeout_s: float) -> bool:
    """Wait for an `asyncio.Event` (or any awaitable-producing `.wait()`) at most
    `timeout_s`; True if it was set. Unlike `asyncio.wait_for` on Python 3.11,
    a cancellation arriving just as the event is set is never swallowed."""
    import asyncio

    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False


class Ticker:
    """Sets an `asyncio.Event` every `period_s` until `stop()` (one timer, re-armed as
    it fires): a task that waits on the event with a plain `event.wait()` still runs
    at least that often. For the waits made once per append (the dispatcher's, the
    index's): `wait_event`'s timeout costs ~5 µs more a wait than the plain wait.
    Made on the running loop."""

    def __init__(self, event, period_s: float) -> None:
        import asyncio

        self._event = event
        self._period_s = period_s
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(period_s, self._tick)

    def _tick(self) -> None:
        self._event.set()
        self._handle = self._loop.call_later(self._period_s, self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def within(awaitable, timeout_s: float | None):
    """`await awaitable` for at most `timeout_s` (TimeoutError after, the awaitable
    cancelled). What `asyncio.wait_for` does, except that on Python 3.11 wait_for
    returns the result when a cancellation arrives just as the awaitable finishes,
    and a task stopped that way carries on: a shutdown waiting for it hangs."""
    import asyncio

    async with asyncio.timeout(timeout_s):
        return await awaitable


async def wait_future(future, timeout_s: float, on_timeout: object = None):
    """Await `future`, which someone else resolves; if no one has after `timeout_s`,
    it is resolved with `on_timeout`. Returns its result. A plain timer: cheaper
    than `asyncio.timeout` for waits made once per pull or per run of sends."""
    import asyncio

    timer = asyncio.get_running_loop().call_later(timeout_s, resolve, future, on_timeout)
    try:
        return await future
    finally:
        timer.cancel()


async def answer_within(future, timeout_s: float):
    """Await `future`, which someone else resolves (an answer matched to its request);
    TimeoutError when no one has after `timeout_s`. A plain timer, as `wait_future`:
    cheaper than `within` for a wait made once per request."""
    import asyncio

    timer = asyncio.get_running_loop().call_later(timeout_s, _expire, future, timeout_s)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no answer within {timeout_s:g} s"))


def resolve(future, value: object = None) -> None:
    """Set `future`'s result unless it is done (resolved, or cancelled) already."""
    if not future.done():
        future.set_result(value)
