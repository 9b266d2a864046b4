"""Waiting in tests: poll a predicate until it holds or a deadline passes, and fail
saying what did not happen: a test never sleeps `n` seconds to wait for a condition.

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


def _said(what: What) -> str:
    return what() if callable(what) else what


def _poll(predicate: Callable[[], Any], timeout_s: float, interval_s: float) -> tuple[bool, Any]:
    """(True, the first truthy value) or, at the deadline, (False, the last value)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return True, last
        time.sleep(interval_s)
    return False, last


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float = 5.0,
    what: What = "condition",
    interval_s: float = 0.02,
) -> Any:
    """Poll `predicate` until it returns a truthy value; fail saying `what` did not happen."""
    ok, last = _poll(predicate, timeout_s, interval_s)
    if not ok:
        raise AssertionError(
            f"timed out after {round(timeout_s, 2)}s waiting for {_said(what)} "
            f"(last value: {last!r})"
        )
    return last


def wait_equal(
    get: Callable[[], Any],
    want: Any,
    timeout_s: float = 5.0,
    what: What = "value",
    interval_s: float = 0.02,
) -> None:
    """Poll `get()` until it equals `want`; fail showing the last value beside `want`."""
    got = None

    def same() -> bool:
        nonlocal got
        got = get()
        return got == want

    ok, _ = _poll(same, timeout_s, interval_s)
    if not ok:
        raise AssertionError(
            f"timed out after {round(timeout_s, 2)}s waiting for {_said(what)}:\n"
            f" got  {got!r}\n want {want!r}"
        )


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
    raise AssertionError(
        f"timed out after {round(timeout_s, 2)}s waiting for {_said(what)} (last value: {last!r})"
    )
