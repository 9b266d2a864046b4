"""Stopping background tasks without losing our own cancellation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ferry.runtime.errors import FerryError, StorageFault

log = logging.getLogger(__name__)

RECANCEL_S = 5.0  # how long a cancelled task may take to end before it is told again


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel `tasks` and wait until each has finished; their errors are logged
    and dropped.

    `with suppress(CancelledError): await task` is not enough: if the task
    running this code is itself cancelled while it waits (a shutdown arriving
    just as a connection ends), the suppress swallows that cancellation too and
    the caller carries on as if nothing happened, e.g. reconnecting forever
    while its owner waits for it to stop. Here our own cancellation is raised
    again once the tasks are done.
    """
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            # A task that swallowed its cancellation (library code that turns it into
            # an ordinary result) would keep its owner waiting forever: it is told
            # again every RECANCEL_S, and the log says which one.
            while not task.done():
                await asyncio.wait((task,), timeout=RECANCEL_S)
                if not task.done():
                    log.warning("task %s is still running %.0f s after it was cancelled; "
                                "cancelling it again", task.get_name(), RECANCEL_S)  # fmt: skip
                    task.cancel()
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        except Exception:
            log.exception("task %s failed while stopping", task.get_name())


async def run_rounds(name: str, one_round: Callable[[], Awaitable[None]]) -> None:
    """A background service's loop: `one_round` again and again (it does some
    work and then waits for more). A storage fault ends the loop (fail-stop
    stops the process); a refusal such as a full disk, or a bug, is logged and
    the next round runs after 1 s."""
    while True:
        try:
            await one_round()
        except asyncio.CancelledError:
            raise
        except StorageFault:
            return
        except FerryError as exc:
            log.warning("%s paused: %s; retrying in 1 s", name, exc)
            await asyncio.sleep(1.0)
        except Exception:
            log.exception("%s round failed; retrying in 1 s", name)
            await asyncio.sleep(1.0)
