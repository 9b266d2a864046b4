"""A small RocketMQ-protocol client: what ferry's own processes, tests, fuzzers
and benchmarks use to talk to a RocketMQ-protocol port. (Applications use
RocketMQ's clients; this is not one of those.)

`RemotingClient` pipelines requests on one connection and matches answers by
opaque; the requests made in one turn of the event loop go out in one write (one
syscall, and the server reads them as one run); requests the server sends (e.g.
NOTIFY_CONSUMER_IDS_CHANGED) go to `on_request`. `call` is the blocking one-shot form for command-line tools, and
`recv_command` reads the next command off any blocking socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import Callable
from typing import cast

from ferry.remoting.codec import (
    FLAG_ONEWAY,
    Command,
    RemotingProtocolError,
    encode,
    next_frame,
)
from ferry.runtime.clock import answer_within, within


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingClient(asyncio.Protocol):
    def __init__(self, on_request: Callable[[Command], Command | None] | None = None) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._opaque = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Command]] = {}
        self._on_request = on_request
        self._out: list[bytes] = []  # encoded requests of this loop turn, not written yet
        self.received: list[Command] = []  # requests from the server, when no on_request
        self.closed = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        addr: str,
        on_request: Callable[[Command], Command | None] | None = None,
        timeout: float = 5.0,
    ) -> RemotingClient:
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        _, client = await within(
            loop.create_connection(lambda: cls(on_request), host, port), timeout
        )
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports have asyncio.Transport's API without subclassing it)
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("connection closed by the server"))
        self._waiting.clear()
        self.closed.set()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        pos = 0
        try:
            while (found := next_frame(self._buffer, pos)) is not None:
                command, pos = found
                self._arrived(command)
        except RemotingProtocolError:
            self.close()
        finally:
            del self._buffer[:pos]

    def _arrived(self, command: Command) -> None:
        if command.is_response:
            future = self._waiting.pop(command.opaque, None)
            if future is not None and not future.done():
                future.set_result(command)
            return
        if self._on_request is None:
            self.received.append(command)
            return
        answer = self._on_request(command)
        if answer is not None and not command.is_oneway and self._transport is not None:
            answer.opaque = command.opaque
            self._transport.write(encode(answer))

    async def request(self, command: Command, timeout: float = 10.0) -> Command:
        if self._transport is None:
            raise ConnectionError("not connected")
        command.opaque = next(self._opaque)
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._waiting[command.opaque] = future
        self._queue(encode(command))
        try:
            return await answer_within(future, timeout)
        finally:
            self._waiting.pop(command.opaque, None)

    def oneway(self, command: Command) -> None:
        if self._transport is None:
            raise ConnectionError("not connected")
        command.opaque = next(self._opaque)
        command.flag |= FLAG_ONEWAY
        self._queue(encode(command))

    def _queue(self, frame: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def write_raw(self, data: bytes) -> None:
        """Bytes as they are (fuzzing), after the requests made before them."""
        self._flush()
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


def call(addr: str, command: Command, timeout: float = 5.0) -> Command:
    """One request on a fresh blocking connection; its answer."""
    host, port = split_addr(addr)
    deadline = time.monotonic() + timeout
    command.opaque = command.opaque or 1
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(encode(command))
        buffer = bytearray()
        while True:
            try:
                answer = recv_command(sock, buffer, deadline)
            except ConnectionError:
                raise ConnectionError(f"{addr} closed the connection without answering") from None
            if answer.is_response and answer.opaque == command.opaque:
                return answer


def recv_command(sock: socket.socket, buffer: bytearray, deadline: float | None = None) -> Command:
    """The next whole command on a blocking socket. `buffer` holds what was read
    past it: pass the same one for the next. ConnectionError when the peer
    closes first; TimeoutError past `deadline` (time.monotonic()), else after the
    socket's own timeout; RemotingProtocolError for a frame that does not decode."""
    while (found := next_frame(buffer)) is None:
        if deadline is not None:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buffer += chunk
    command, end = found
    del buffer[:end]
    return command
