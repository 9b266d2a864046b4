"""A RocketMQ-protocol link to a server in the same process: each request goes
straight to the server's handler for its code, with no socket, no framing and no
encoding (a broker's local-mode proxy calling its own broker, RocketMQ's local mode).

`LocalLink` has the part of `RemotingClient` that callers of a broker use
(`request`, `closed`, `close`), so the proxy's RocketMQ-protocol calls
(services/proxy/remoting_sends.py, remoting_pops.py) run unchanged over it. The
handlers see one `LocalConnection` for the link's life, as they would see one socket.
A handler that raises is answered SYSTEM_ERROR with the reason, as the server answers
it; the request is counted in the server's metrics as a socket's would be.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import Handler

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

    async def request(self, command: Command, timeout: float) -> Command:
        """The handler's answer. Raises ConnectionError once closed, TimeoutError after
        `timeout` seconds (the handler is cancelled)."""
        if self.closed.is_set():
            raise ConnectionError("the in-process link is closed")
        handler = self._handlers().get(command.code)
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

    def close(self) -> None:
        self.closed.set()
