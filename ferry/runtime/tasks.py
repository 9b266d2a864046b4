"""Stopping background tasks without losing our own cancellation."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


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
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        except Exception:
            log.exception("task %s failed while stopping", task.get_name())
