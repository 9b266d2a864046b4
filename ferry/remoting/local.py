"""A RocketMQ-protocol link to a server in the same process: each request goes
straight to the server's handler for its code, with no socket, no framing and no
encoding (a broker's local-mode proxy calling its own broker, RocketMQ's local mode).

`LocalLink` has the part of `RemotingClient` that callers of a broker use
(`request`, `closed`, `close`), so the proxy's RocketMQ-protocol calls
(services/proxy/remoting_sends.py, remoting_pops.py) run unchanged over it. The
handlers see one `LocalConnection` for the link's life, as they would see one socket.
A handler that raises is answered SYSTEM_ERROR with the reason, as the server answers
it; the request is counted in the server's metrics as a socket's would be.

Runs, as on a socket (ferry.remoting.server): the requests of a `Batchable` code made
in one turn of the event loop (the proxy's concurrent sends) go to its `many` in one
call, as requests that arrived back to back in one read do: one task, one append and
one settle for the run. A caller whose timeout passes stops waiting; the run goes on
(as a request written to a socket does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import Batchable, Handler, run_answers
from ferry.runtime.clock import answer_within
from ferry.runtime.turns import TurnRuns

log = logging.getLogger(__name__)


class LocalConnection:
    """What a handler reads of its connection: the peer, per-connection state and
    whether it is gone."""

    def __init__(self, remote: str) -> None:
        self.remote = remote
        self.state: dict[str, Any] = {}
        self.closed = asyncio.Event()


class LocalLink:
    def __init__(
        self,
        handlers: Callable[[], Mapping[int, Handler]],
        metrics: RemotingMetrics | None = None,
        remote: str = "127.0.0.1:0",
    ) -> None:
        """`handlers`: the server's table now (a failover member's changes per run);
        `remote`: the peer address the handlers see (a send's born host)."""
        self._handlers = handlers
        self._metrics = metrics
        self._connection = LocalConnection(remote)
        self.closed = self._connection.closed
        # Requests of Batchable codes made in one loop turn, by (code, handler).
        self._runs: TurnRuns[tuple[int, Batchable], Command, Command] = TurnRuns(
            self._run, "the in-process link is closed"
        )

    async def request(self, command: Command, timeout: float) -> Command:
        """The handler's answer. Raises ConnectionError once closed, TimeoutError after
        `timeout` seconds (the handler is cancelled)."""
        if self.closed.is_set():
            raise ConnectionError("the in-process link is closed")
        handler = self._handlers().get(command.code)
        if type(handler) is Batchable:
            return await answer_within(self._runs.submit((command.code, handler), command), timeout)
        if handler is None:
            answer = command.answer(
                codes.REQUEST_CODE_NOT_SUPPORTED, f" request type {command.code} not supported"
            )
        else:
            try:
                async with asyncio.timeout(timeout):
                    answer = await handler(self._connection, command)  # type: ignore[arg-type]
            except TimeoutError:
                raise
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a handler's bug fails this request only
                log.exception("in-process request code %d failed", command.code)
                answer = command.answer(codes.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if answer is None:  # a oneway handler: nothing to say
                answer = command.answer(codes.SUCCESS)
        if self._metrics is not None:
            self._metrics.request(command.code, answer.code)
        return answer

    async def _run(self, key: tuple[int, Batchable], commands: list[Command]) -> list[Command]:
        answers = await run_answers(key[1], self._connection, commands, "in-process link")
        # a oneway handler's None: nothing to say
        out = [a or c.answer(codes.SUCCESS) for c, a in zip(commands, answers, strict=True)]
        if self._metrics is not None:
            counts: dict[int, int] = {}
            for answer in out:
                counts[answer.code] = counts.get(answer.code, 0) + 1
            for code, n in counts.items():
                self._metrics.request(commands[0].code, code, n)
        return out

    def close(self) -> None:
        """Refuse new requests; runs under way finish (a send's append is not cut)."""
        self.closed.set()
