"""A RocketMQ-protocol server on asyncio: frames in, handlers by request code,
answers out in any order, and requests of its own to the clients.

One `Connection` per accepted socket. Requests run concurrently (a handler
may long-poll); each answer carries its request's opaque, so a client's
pipelined requests complete in whatever order they finish. A oneway request
(flag bit 1) gets no answer, even an error. An unknown code is answered with
3 (REQUEST_CODE_NOT_SUPPORTED), as Apache's broker does. A frame that breaks
the format closes its connection without a reply; the server logs it once per
connection and goes on serving every other one.

Backpressure: a connection with `max_in_flight` requests being handled stops
being read until one finishes, so a fast producer fills its own socket buffer
instead of the broker's memory.

Runs: a handler that is a `Batchable` (one with a `many`) gets, in one call,
every request of its code that arrived back to back in one read (64
producer threads on one connection send that way under load), and its
answers go out in one socket write: one task, one use-case call and one write
for the run instead of one per request. A run ends at a request of another
code, so requests are handled in the order they came — except a oneway request
of another Batchable code (Java's END_TRANSACTION between a producer's sends),
which waits aside in a run of its own code, dispatched when the run ends: each
code's requests keep their order, and a oneway request has no answer to order.
A run of one is a run.

A client that goes away: asyncio stops reading a socket at its first failed
write (an answer to a client that has closed), while requests the client sent
before it closed may still wait in the socket. Those whose effect outlives the
connection (the server's `after_close` codes: a send, an offset commit) are
read out and handled anyway, their answers going nowhere; the others are
dropped, as after any close.

A check (the server's `check`, e.g. the broker's ACL) runs for every request before
its handler, a request of a run or a oneway one alike: a request it refuses (it
returns a message) is answered 16 (NO_PERMISSION) with that message, or dropped
when oneway, counted as any answer, and never reaches its handler. Without a
check nothing is done per request. Answers to the server's own requests are not
checked.

TLS (RocketMQ's `tls.server.mode`, `TLS_MODES`): `listen` with an SSL context
serves TLS only ("enforcing"), or TLS and plaintext on the same port
("permissive", Apache's default): the first byte a client sends tells which,
a TLS ClientHello starting with 0x16 (a RocketMQ frame starts with its length's
high byte, 0 for any frame under 16 MiB); "disabled" serves plaintext. A
connection that sends nothing for `FIRST_BYTE_TIMEOUT_S` is closed. Requests a
client sent just before it broke are not read out of a TLS connection (the
socket holds ciphertext).

The broker talks back over the same connection (`Connection.request` and
`Connection.oneway`, e.g. NOTIFY_CONSUMER_IDS_CHANGED), with its own opaque
counter; answers to those are matched here and never reach the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, cast

from ferry.remoting import codes
from ferry.remoting.codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Command,
    RemotingProtocolError,
    encode,
    read_frames,
)
from ferry.remoting.metrics import RemotingMetrics
from ferry.runtime.clock import within

log = logging.getLogger(__name__)

Handler = Callable[["Connection", Command], Awaitable[Command | None]]
# A request's check before its handler: None to serve it, else why it is refused.
Check = Callable[["Connection", Command], "str | None"]
MAX_IN_FLIGHT = 256
# What is read out of a broken connection's socket at most (its kernel buffer holds less).
LEFTOVER_LIMIT = 64 * 1024 * 1024
# RocketMQ's tls.server.mode values: plaintext only, TLS beside plaintext, TLS only.
TLS_MODES = ("disabled", "permissive", "enforcing")
TLS_HANDSHAKE = 0x16  # the first byte of a TLS record carrying a ClientHello
FIRST_BYTE_TIMEOUT_S = 30.0  # permissive TLS: a new connection's time to say which it is


class Batchable:
    """A handler that can also take a run of requests of its code at once:
    `many(connection, requests)` returns one answer (or None) per request, in
    their order. Called with one request, it is an ordinary `Handler`."""

    def __init__(
        self,
        one: Handler,
        many: Callable[[Connection, list[Command]], Awaitable[list[Command | None]]],
    ) -> None:
        self.one = one
        self.many = many

    def __call__(self, connection: Connection, command: Command) -> Awaitable[Command | None]:
        return self.one(connection, command)


async def run_answers(
    handler: Batchable, connection: Any, commands: list[Command], where: str
) -> list[Command | None]:
    """`handler.many`'s answers to a run, one per request; a handler that raises (or
    answers a wrong count) fails the run alone: SYSTEM_ERROR with the reason for each,
    logged with `where`. Sockets' runs and the in-process link's (ferry.remoting.local)."""
    try:
        answers = await handler.many(connection, commands)
        if len(answers) != len(commands):
            raise RuntimeError(f"{len(answers)} answers to {len(commands)} requests")
        return answers
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a handler's bug must not take the connection down
        log.exception("%s: a run of %d requests of code %d failed",
                      where, len(commands), commands[0].code)  # fmt: skip
        return [c.answer(codes.SYSTEM_ERROR, f"{type(e).__name__}: {e}") for c in commands]


class Connection(asyncio.Protocol):
    """One client's socket. `state` is for handlers (e.g. the client id a
    heartbeat named); `closed` is set once the socket is gone."""

    def __init__(self, server: RemotingServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._in_flight = 0
        self._paused = False
        self._opaque = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Command]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.remote = ""  # "ip:port" of the client
        self.state: dict[str, Any] = {}
        self.closed = asyncio.Event()
        self._close_callbacks: list[Callable[[Connection], None]] = []

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports have asyncio.Transport's API without subclassing it)
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        transport, self._transport = self._transport, None
        tls = transport is not None and transport.get_extra_info("sslcontext") is not None
        if exc is not None and transport is not None and self._server.after_close and not tls:
            self._handle_leftovers(transport)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError(f"connection to {self.remote} closed"))
        self._waiting.clear()
        self.closed.set()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("remoting %s: close callback failed for %s",
                              self._server.name, self.remote)  # fmt: skip
        self._server._closed(self)

    def on_close(self, callback: Callable[[Connection], None]) -> None:
        """Call `callback(connection)` once when this socket goes away (at
        once if it is gone already), on the loop, before the server's
        `on_close` hook."""
        if self.closed.is_set():
            callback(self)
        else:
            self._close_callbacks.append(callback)

    def data_received(self, data: bytes) -> None:
        self._server.metrics.received(len(data))
        self._buffer += data
        self._frames()

    def _frames(self, only: frozenset[int] | None = None) -> None:
        """Dispatch every whole frame in the buffer (with `only`: just the
        requests with those codes); a frame that breaks the protocol closes
        the connection, after the whole frames before it are served."""
        buffer = self._buffer
        commands, pos, error = read_frames(buffer)
        if pos:
            del buffer[:pos]
        handlers = self._server.handlers
        check = self._server.check
        # A check with a `passed_all(commands)` (e.g. the broker's ACL, in one native call
        # per read) passes a whole read at once: None when every request passed, else
        # which did; the others still go through `check` one by one.
        passed_all = getattr(check, "passed_all", None)
        passed = None if passed_all is None or not commands else self._passed(passed_all, commands)
        run: list[Command] = []  # requests of one Batchable's code, back to back
        run_handler: Batchable | None = None
        # Oneway requests of other Batchable codes met during the run, by code.
        aside: dict[int, tuple[Batchable, list[Command]]] = {}
        for i, command in enumerate(commands):
            if only is not None and (command.is_response or command.code not in only):
                continue
            if command.flag & FLAG_RESPONSE:
                handler = None
            else:
                if check is not None and (passed is None or not passed[i]):
                    try:
                        why = check(self, command)
                    except Exception:  # a check's bug refuses rather than serves
                        log.exception("remoting %s: the check of code %d from %s failed",
                                      self._server.name, command.code, self.remote)  # fmt: skip
                        why = "the server could not check this request (see its log)"
                    if why is not None:
                        self._refuse(command, why)
                        continue
                handler = handlers.get(command.code)
            if type(handler) is Batchable:
                if run and run[0].code != command.code:
                    if command.flag & FLAG_ONEWAY:
                        aside.setdefault(command.code, (handler, []))[1].append(command)
                        continue
                    self._dispatch_run(cast(Batchable, run_handler), run)
                    run = []
                    if aside:
                        self._dispatch_aside(aside)
                run.append(command)
                run_handler = handler
                continue
            if run:
                self._dispatch_run(cast(Batchable, run_handler), run)
                run = []
                if aside:
                    self._dispatch_aside(aside)
            self._dispatch(command)
        if run:
            self._dispatch_run(cast(Batchable, run_handler), run)
            if aside:
                self._dispatch_aside(aside)
        if error is not None:
            self._server._protocol_error(self, error)
            self.close()

    def _dispatch_aside(self, aside: dict[int, tuple[Batchable, list[Command]]]) -> None:
        for handler, requests in aside.values():
            self._dispatch_run(handler, requests)
        aside.clear()

    def _passed(self, passed_all: Callable[[list[Command]], Any], commands: list[Command]):
        """`passed_all(commands)`: a list of whether each passed, or None when all did; a
        check's bug passes none (each then goes through `check`)."""
        try:
            verdict = passed_all(commands)
        except Exception:
            log.exception("remoting %s: the check of %d requests from %s failed",
                          self._server.name, len(commands), self.remote)  # fmt: skip
            return [False] * len(commands)
        return [True] * len(commands) if verdict is None else verdict

    def _refuse(self, command: Command, why: str) -> None:
        """Answer a request its check refused: 16 with why (nothing for a oneway)."""
        self._server.metrics.request(command.code, codes.NO_PERMISSION)
        if not command.is_oneway:
            self.write(command.answer(codes.NO_PERMISSION, why))

    def _handle_leftovers(self, transport: asyncio.Transport) -> None:
        """Read what the client sent before the connection broke and asyncio
        stopped reading (see the module doc), and handle its `after_close`
        requests. The socket is still open here: asyncio closes it after
        connection_lost."""
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        try:
            copy = socket.socket(fileno=os.dup(sock.fileno()))
        except (OSError, ValueError):
            return
        read = 0
        with copy:
            copy.setblocking(False)
            while read < LEFTOVER_LIMIT:
                try:
                    chunk = copy.recv(256 * 1024)
                except OSError:  # nothing more (EAGAIN), or the reset itself
                    break
                if not chunk:
                    break
                self._buffer += chunk
                read += len(chunk)
        if read:
            self._server.metrics.received(read)
        # (A frame the close cut short stays unread; a malformed one ends the
        # reading, as it would have closed the connection.)
        self._frames(only=self._server.after_close)

    # ------------------------------------------------------------ requests in

    def _dispatch(self, command: Command) -> None:
        if command.is_response:
            future = self._waiting.pop(command.opaque, None)
            if future is not None and not future.done():
                future.set_result(command)
            return
        handler = self._server.handlers.get(command.code)
        if handler is None:
            self._server.metrics.request(command.code, codes.REQUEST_CODE_NOT_SUPPORTED)
            if not command.is_oneway:
                self.write(
                    command.answer(
                        codes.REQUEST_CODE_NOT_SUPPORTED,
                        f" request type {command.code} not supported",
                    )
                )
            return
        self._started(1)
        task = asyncio.get_running_loop().create_task(self._handle(handler, command))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch_run(self, handler: Batchable, commands: list[Command]) -> None:
        self._started(len(commands))
        task = asyncio.get_running_loop().create_task(self._handle_run(handler, commands))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _started(self, n: int) -> None:
        self._in_flight += n
        if self._in_flight >= self._server.max_in_flight and not self._paused:
            self._paused = True
            if self._transport is not None:
                self._transport.pause_reading()

    def _finished(self, n: int) -> None:
        self._in_flight -= n
        if self._paused and self._in_flight < self._server.max_in_flight // 2:
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()

    async def _handle(self, handler: Handler, command: Command) -> None:
        try:
            try:
                answer = await handler(self, command)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a handler's bug must not take the connection down
                log.exception("remoting %s: code %d from %s failed",
                              self._server.name, command.code, self.remote)  # fmt: skip
                answer = command.answer(codes.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            self._server.metrics.request(command.code, None if answer is None else answer.code)
            if answer is not None and not command.is_oneway:
                answer.opaque = command.opaque
                answer.serialize_type = command.serialize_type
                self.write(answer)
        finally:
            self._finished(1)

    async def _handle_run(self, handler: Batchable, commands: list[Command]) -> None:
        try:
            answers = await run_answers(
                handler, self, commands, f"remoting {self._server.name}: from {self.remote}"
            )
            out = []
            counts: dict[tuple[int, int | None], int] = {}  # one counter step per kind
            for command, answer in zip(commands, answers, strict=True):
                key = (command.code, None if answer is None else answer.code)
                counts[key] = counts.get(key, 0) + 1
                if answer is not None and not command.is_oneway:
                    answer.opaque = command.opaque
                    answer.serialize_type = command.serialize_type
                    out.append(answer)
            for (code, answered), n in counts.items():
                self._server.metrics.request(code, answered, n)
            self.write_many(out)
        finally:
            self._finished(len(commands))

    # ------------------------------------------------------------ out

    def write(self, command: Command) -> None:
        """Send `command` if the socket is still open (an answer to a client
        that left is dropped)."""
        self.write_many((command,))

    def write_many(self, commands: Sequence[Command]) -> None:
        """Send `commands` in one socket write if the socket is still open."""
        if not commands or self._transport is None or self._transport.is_closing():
            return
        frames = [self._encode(command) for command in commands]
        frame = frames[0] if len(frames) == 1 else b"".join(frames)
        self._server.metrics.sent(len(frame))
        self._transport.write(frame)

    def _encode(self, command: Command) -> bytes:
        try:
            return encode(command)
        except RemotingProtocolError as e:
            log.error("remoting %s: cannot encode code %d for %s: %s",
                      self._server.name, command.code, self.remote, e)  # fmt: skip
            return encode(command.answer(codes.SYSTEM_ERROR, str(e)))

    async def request(self, command: Command, timeout: float) -> Command:
        """Send a request of the server's own to this client and wait for its
        answer (ConnectionError if the socket closes, TimeoutError after
        `timeout` seconds)."""
        command.opaque = next(self._opaque)
        command.flag &= ~FLAG_ONEWAY
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._waiting[command.opaque] = future
        self.write(command)
        try:
            return await within(future, timeout)
        finally:
            self._waiting.pop(command.opaque, None)

    def oneway(self, command: Command) -> None:
        """Send a request of the server's own that expects no answer."""
        command.opaque = next(self._opaque)
        command.flag |= FLAG_ONEWAY
        self.write(command)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def server_stopping(self) -> bool:
        """The server is closing its connections (this one is not the client's doing)."""
        return self._server.stopping

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()


class RemotingServer:
    """Serves `handlers` (request code → coroutine) on one or more ports.
    `on_close` is called with each connection that goes away (client tables
    forget its channel). `check` sees every request before its handler (see
    the module doc)."""

    def __init__(
        self,
        name: str,
        handlers: Mapping[int, Handler],
        metrics: RemotingMetrics | None = None,
        on_close: Callable[[Connection], None] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        after_close: Collection[int] = (),
        check: Check | None = None,
    ) -> None:
        """`after_close`: the request codes still handled when the client sent
        them just before its connection broke (see the module doc)."""
        self.name = name
        self.check = check
        self.after_close = frozenset(after_close)
        self.handlers: Mapping[int, Handler] = handlers
        self.metrics = metrics or RemotingMetrics(None, name)
        self.max_in_flight = max(2, max_in_flight)
        self.connections: set[Connection] = set()
        self._on_close = on_close
        self._servers: list[asyncio.base_events.Server] = []
        self._listeners: list[socket.socket] = []  # permissive TLS: accepted here
        self._accepting: set[asyncio.Task] = set()
        self._complained: set[Connection] = set()
        self.stopping = False

    def serve(
        self, handlers: Mapping[int, Handler], on_close: Callable[[Connection], None] | None = None
    ) -> None:
        """Serve `handlers` (and call `on_close` for each connection that
        goes) from now on, on every connection (requests being handled finish
        with the table they started with): what a failover member's next run
        does on the listener it keeps across roles."""
        self.handlers = handlers
        self._on_close = on_close

    async def listen(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, mode: str = "permissive"
    ) -> int:
        """Start accepting on host:port (0 picks a free port); returns the port.
        With `tls`, `mode` (TLS_MODES) says whether plaintext is served beside it."""
        if mode not in TLS_MODES:
            raise ValueError(f"TLS mode {mode!r} is not one of {', '.join(TLS_MODES)}")
        loop = asyncio.get_running_loop()
        if tls is not None and mode == "permissive":
            return await self._listen_permissive(host, port, tls)
        server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=tls if mode == "enforcing" else None,
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _listen_permissive(self, host: str, port: int, tls: ssl.SSLContext) -> int:
        """TLS and plaintext on one port: accepted here, each connection handed
        to asyncio with TLS or without by its first byte."""
        loop = asyncio.get_running_loop()
        listener = socket.create_server((host, port), reuse_port=False, backlog=1024)
        listener.setblocking(False)
        self._listeners.append(listener)
        self._accepting.add(loop.create_task(self._accept(listener, tls)))
        return int(listener.getsockname()[1])

    async def _accept(self, listener: socket.socket, tls: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if self.stopping or listener.fileno() < 0:
                    return
                log.warning("remoting %s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._sniff(sock, tls))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)

    async def _sniff(self, sock: socket.socket, tls: ssl.SSLContext) -> None:
        """Wait for a new connection's first byte, then serve it with TLS
        (a ClientHello) or without."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        readable = loop.create_future()
        loop.add_reader(sock.fileno(), lambda: readable.done() or readable.set_result(None))
        try:
            await within(readable, FIRST_BYTE_TIMEOUT_S)
            first = sock.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            first = b""
        finally:
            loop.remove_reader(sock.fileno())
        if not first or self.stopping:
            sock.close()
            return
        try:
            await loop.connect_accepted_socket(
                lambda: Connection(self),
                sock,
                ssl=tls if first[0] == TLS_HANDSHAKE else None,
                ssl_handshake_timeout=FIRST_BYTE_TIMEOUT_S if first[0] == TLS_HANDSHAKE else None,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            log.info("remoting %s: TLS handshake failed: %s", self.name, exc)
            sock.close()

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop accepting, let requests being handled finish for `grace_s`
        (their answers still go out), then close every connection and cancel
        what is left."""
        self.stopping = True
        for server in self._servers:
            server.close()
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        for task in list(self._accepting):
            task.cancel()
        if self._accepting:
            await asyncio.gather(*self._accepting, return_exceptions=True)
        self._accepting.clear()
        pending = [t for c in list(self.connections) for t in c._tasks]
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        for connection in list(self.connections):
            connection.close()
        tasks = [t for c in list(self.connections) for t in c._tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await within(server.wait_closed(), 5)
        self._servers.clear()

    def _opened(self, connection: Connection) -> None:
        self.connections.add(connection)
        self.metrics.opened()

    def _closed(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.metrics.closed()
        self._complained.discard(connection)
        if self._on_close is not None:
            try:
                self._on_close(connection)
            except Exception:
                log.exception("remoting %s: close hook failed for %s", self.name, connection.remote)

    def _protocol_error(self, connection: Connection, error: RemotingProtocolError) -> None:
        self.metrics.protocol_error()
        if connection not in self._complained:
            self._complained.add(connection)
            log.warning("remoting %s: closing %s: %s", self.name, connection.remote, error)
