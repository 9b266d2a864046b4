"""Requests made in one turn of the event loop, run together.

Callers in one process hand a server requests one at a time, but the server
serves a run of them for little more than one (one append and one settle for a
run of sends): what a socket gets for free when requests arrive back to back in
one read. `TurnRuns` collects what is submitted during one loop turn, per key,
and runs each key's items in one call, in a task of its own, the next turn
(the task made at the turn's first submit).
The in-process RocketMQ-protocol link (ferry.remoting.local) and the broker's
in-process send door (services.broker.remoting.sends.InProcessSends) use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


class TurnRuns(Generic[K, T, R]):
    def __init__(self, run: Callable[[K, list[T]], Awaitable[list[R]]], stopped: str) -> None:
        """`run(key, items)` answers a run: one result per item, in order; it must
        not raise (a run's own failure is its results' to say). A run cancelled
        (its server stopping) fails its submitters with ConnectionError(`stopped`)."""
        self._run = run
        self._stopped = stopped
        self._pending: dict[K, tuple[list[T], list[asyncio.Future[R]]]] = {}
        self._tasks: set[asyncio.Task] = set()

    def submit(self, key: K, item: T) -> asyncio.Future[R]:
        """The future of `item`'s result; it runs with what else is submitted under
        `key` this turn."""
        loop = asyncio.get_running_loop()
        if not self._pending:
            # The task that runs this turn's items is made now: its first step comes
            # next turn, after everything else this turn submits (one turn sooner
            # than a callback that would make it).
            self._track(loop.create_task(self._drain()))
        future: asyncio.Future[R] = loop.create_future()
        items, futures = self._pending.setdefault(key, ([], []))
        items.append(item)
        futures.append(future)
        return future

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        pending, self._pending = self._pending, {}
        runs = list(pending.items())
        loop = asyncio.get_running_loop()
        for key, (items, futures) in runs[:-1]:  # other keys run beside this one
            self._track(loop.create_task(self._one(key, items, futures)))
        key, (items, futures) = runs[-1]
        await self._one(key, items, futures)

    async def _one(self, key: K, items: list[T], futures: list[asyncio.Future[R]]) -> None:
        try:
            results = await self._run(key, items)
        except asyncio.CancelledError:
            for future in futures:
                if not future.done():
                    future.set_exception(ConnectionError(self._stopped))
            raise
        for future, result in zip(futures, results, strict=True):
            if not future.done():  # a caller whose timeout passed has stopped waiting
                future.set_result(result)
