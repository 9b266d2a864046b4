"""Waiting in tests: poll a predicate until it holds or a deadline passes, and fail
saying what did not happen (STYLE.md, "Tests": never `sleep(n)` to wait for a condition).

The one polling helper of the suite; every other wait (a group's leader, a route, a
process's ready line, a consumer's messages) is a predicate handed to it.

- `wait_for`: from a thread (the test's own, or a producer's); returns the predicate's
  first truthy value.
- `wait_equal`: `wait_for` of `get() == want`, failing with the last value beside `want`.
- `wait_for_async`: inside an event loop, which keeps running while it polls.

A predicate may do work (read a socket, pull messages) as long as calling it again is
safe, and may raise to give up at once (a process that exited). The failure message shows
its last value, so make that value say something; `what` may be a function, called only
on failure, when the message needs what is known then (a process's log tail).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

What = str | Callable[[], str]


def _timed_out(timeout_s: float, what: What, last: Any) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout_s}s waiting for {said} (last value: {last!r})")


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float = 5.0,
    what: What = "condition",
    interval_s: float = 0.02,
) -> Any:
    """Poll `predicate` until it returns a truthy value; fail saying `what` did not happen."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise _timed_out(timeout_s, what, last)


def wait_equal(
    get: Callable[[], Any], want: Any, timeout_s: float = 5.0, what: What = "value"
) -> None:
    """Poll `get()` until it equals `want`; fail showing the last value beside `want`."""
    last = None

    def same() -> bool:
        nonlocal last
        last = get()
        return last == want

    try:
        wait_for(same, timeout_s, what)
    except AssertionError:
        said = what() if callable(what) else what
        raise AssertionError(
            f"timed out after {timeout_s}s waiting for {said}:\n got  {last!r}\n want {want!r}"
        ) from None


async def wait_for_async(
    predicate: Callable[[], Any],
    timeout_s: float = 5.0,
    what: What = "condition",
    interval_s: float = 0.01,
) -> Any:
    """`wait_for` inside an event loop: the loop keeps running while it polls."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise _timed_out(timeout_s, what, last)
