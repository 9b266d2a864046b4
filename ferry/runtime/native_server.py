"""A gRPC server whose transport is native (`ferry_native.Door`) and whose
methods are grpcio's: the same servicers, generated `add_*_to_server`
functions, interceptors and handlers as on a `grpc.aio` server, answered on
this process's event loop.

The door (native/src/door.rs) runs HTTP/2, gRPC's framing, TLS and the
connection limits on tokio threads that never take the GIL; this module is
the Python half. It receives the door's events in batches (a call with its
request bytes, metadata, peer and deadline; a client-streamed message; the
client's end; a cancellation; a log line), runs each call as a task through
the interceptors to its handler, and hands the answers back in one call per
event-loop turn. A call costs what the door's native code and the handler
cost, not grpcio's core (~230 µs of CPU per unary call here).

What it serves is what was registered on it, by method path; health and
reflection are registered as on every ferry server (`ferry.runtime.server`).
The context handed to handlers offers what ferry's handlers and grpcio's
health and reflection servicers use: `peer()`, `time_remaining()`,
`invocation_metadata()`, `abort()`, `set_code()`/`set_details()`, `write()`
and `read()`, `cancelled()`, `done()`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ferry.runtime.clock import wait_future

log = logging.getLogger(__name__)

# Event kinds, as native/src/door.rs `take` hands them over.
_CALL, _MESSAGE, _HALF_CLOSE, _CANCEL, _LOG, _DRAINED = range(6)
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR}

DEFAULT_MAX_CALLS = 4096
DEFAULT_MAX_STREAMS = 1000  # per connection, as grpc-java's default (unbounded) is not


class _CallDetails(grpc.HandlerCallDetails):
    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, invocation_metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class _Requests:
    """A streaming call's requests, read one demand at a time from the door."""

    def __init__(self, server: NativeServer, call_id: int, deserialize: Callable | None) -> None:
        self._server = server
        self._id = call_id
        self._deserialize = deserialize
        self._queue: collections.deque[bytes] = collections.deque()
        self._ended = False
        self._demanded = False
        self._waiter: asyncio.Future[None] | None = None

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        while not self._queue:
            if self._ended:
                raise StopAsyncIteration
            if not self._demanded:
                self._demanded = True
                self._server._door.demand(self._id)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        payload = self._queue.popleft()
        if self._deserialize is None:
            return payload
        try:
            return self._deserialize(payload)
        except DecodeError as exc:
            raise _BadRequest(str(exc)) from None

    def _arrived(self, payload: bytes | None) -> None:
        self._demanded = False
        if payload is None:
            self._ended = True
        else:
            self._queue.append(payload)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _BadRequest(Exception):
    """A request whose bytes are not the method's message."""


class _Context:
    """What a handler is given as its `grpc.aio.ServicerContext` (the module doc)."""

    __slots__ = (
        "_server", "_id", "_method", "_metadata", "_peer", "_deadline", "_code", "_details",
        "_cancelled", "_done", "_serialize", "_requests", "_callbacks",
    )  # fmt: skip

    def __init__(
        self,
        server: NativeServer,
        call_id: int,
        method: str,
        metadata: tuple[tuple[str, str], ...],
        peer: str,
        timeout_ms: int,
    ) -> None:
        self._server = server
        self._id = call_id
        self._method = method
        self._metadata = metadata
        self._peer = peer
        self._deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms >= 0 else None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._cancelled = False
        self._done = False
        self._serialize: Callable | None = None
        self._requests: _Requests | None = None
        self._callbacks: list[Callable] = []

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a status other than OK")
        self._code, self._details = code, details
        raise grpc.aio.AbortError(details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable) -> None:
        self._callbacks.append(callback)

    async def write(self, message: Any) -> None:
        payload = self._serialize(message) if self._serialize is not None else message
        self._server._send(self._id, payload)

    async def read(self) -> Any:
        if self._requests is None:
            raise RuntimeError("read() is for a call with streamed requests")
        try:
            return await self._requests.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def send_initial_metadata(self, initial_metadata) -> None:
        return None  # answered headers carry nothing of the handler's

    def set_trailing_metadata(self, trailing_metadata) -> None:
        return None

    def set_compression(self, compression) -> None:
        return None

    def disable_next_message_compression(self) -> None:
        return None

    def auth_context(self) -> dict:
        return {}

    def peer_identities(self) -> None:
        return None


class _Method:
    __slots__ = ("path", "handler", "streamed_in", "streamed_out")

    def __init__(self, path: str, handler: grpc.RpcMethodHandler) -> None:
        self.path = path
        self.handler = handler
        self.streamed_in = handler.request_streaming
        self.streamed_out = handler.response_streaming


class NativeServer:
    """Takes grpcio's generated registrations (`add_generic_rpc_handlers`,
    `add_registered_method_handlers`), then serves them on a native door."""

    def __init__(
        self,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        max_message_bytes: int = 4 * 1024 * 1024,
        max_calls: int = DEFAULT_MAX_CALLS,
        max_streams: int = DEFAULT_MAX_STREAMS,
        overload_answer: Callable[[str], bytes | None] | None = None,
    ) -> None:
        """`overload_answer(path)`: what a method answers when `max_calls` are open
        (a response with a retriable status, serialized), or None for gRPC's
        RESOURCE_EXHAUSTED."""
        self._interceptors = list(interceptors)
        self._max_message_bytes = max_message_bytes
        self._max_calls = max_calls
        self._max_streams = max_streams
        self._overload_answer = overload_answer or (lambda path: None)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._methods: list[_Method] = []
        self._door: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[int, asyncio.Task] = {}
        self._streams: dict[int, _Requests] = {}
        self._contexts: dict[int, _Context] = {}
        self._out: list[tuple] = []
        self._flush_due = False
        self._drained: asyncio.Future[None] | None = None
        self.bad_requests = 0
        self.port = 0

    # ------------------------------------------------------------ registration

    def add_generic_rpc_handlers(self, handlers) -> None:
        """Generated code registers each service twice, here and by name (below);
        the by-name table is the one served."""

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    # ------------------------------------------------------------ life

    async def start(
        self,
        host: str,
        port: int,
        tls: Any = None,
        tls_mode: str = "disabled",
        threads: int = 1,
    ) -> int:
        """Bind and serve; OSError when the port cannot be had. `tls`: a
        `ferry.runtime.tls.ServerTLS`; `tls_mode` as Apache's proxy's tlsMode."""
        import ferry_native  # the extension is built by `make venv`

        self._loop = asyncio.get_running_loop()
        self._methods = [_Method(path, h) for path, h in self._handlers.items()]
        table = [
            (m.path, m.streamed_in, m.streamed_out, self._overload_answer(m.path))
            for m in self._methods
        ]
        self._door = ferry_native.Door(
            host,
            port,
            table,
            self._max_message_bytes,
            self._max_calls,
            self._max_streams,
            tls_mode=tls_mode if tls is not None else "disabled",
            cert=tls.cert if tls is not None else None,
            key=tls.key if tls is not None else None,
            client_ca=tls.client_ca if tls is not None else None,
            threads=threads,
        )
        self.port = self._door.port
        self._loop.add_reader(self._door.wake_fd(), self._events)
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Refuse new connections, let calls in flight finish for `grace`
        seconds (GOAWAY to the clients), then cancel what is left."""
        door = self._door
        if door is None:
            return
        assert self._loop is not None
        self._drained = self._loop.create_future()
        door.shutdown(grace or 0.0)
        if await wait_future(self._drained, (grace or 0.0) + 5.0, on_timeout=False) is False:
            log.warning("the gRPC door did not drain in time; closing it")
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._loop.remove_reader(door.wake_fd())
        door.close()
        self._door = None

    def stats(self) -> dict[str, int]:
        return dict(self._door.stats()) if self._door is not None else {}

    def open_calls(self) -> int:
        """Calls open on the door now (Python's and those it has answered but not sent)."""
        return self._door.open_calls() if self._door is not None else 0

    # ------------------------------------------------------------ events

    def _events(self) -> None:
        door = self._door
        if door is None:
            return
        for event in door.take():
            kind = event[0]
            if kind == _CALL:
                _, call_id, index, payload, metadata, peer, timeout_ms = event
                method = self._methods[index]
                context = _Context(self, call_id, method.path, tuple(metadata), peer, timeout_ms)
                self._contexts[call_id] = context
                if method.streamed_in:
                    self._streams[call_id] = _Requests(self, call_id, None)
                task = self._loop.create_task(self._run(method, context, payload))
                self._tasks[call_id] = task
            elif kind == _MESSAGE:
                stream = self._streams.get(event[1])
                if stream is not None:
                    stream._arrived(event[2])
            elif kind == _HALF_CLOSE:
                stream = self._streams.get(event[1])
                if stream is not None:
                    stream._arrived(None)
            elif kind == _CANCEL:
                context = self._contexts.get(event[1])
                if context is not None:
                    context._cancelled = True
                task = self._tasks.get(event[1])
                if task is not None:
                    task.cancel()
            elif kind == _LOG:
                log.log(_LOG_LEVELS.get(event[1], logging.WARNING), "%s", event[2])
            elif kind == _DRAINED and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    def _send(self, call_id: int, payload: bytes) -> None:
        self._out.append((call_id, payload))
        self._flush_soon()

    def _end(self, call_id: int, code: int, details: str) -> None:
        self._out.append((call_id, code, details))
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        out, self._out = self._out, []
        if out and self._door is not None:
            self._door.reply(out)

    # ------------------------------------------------------------ calls

    async def _handler(self, method: _Method, context: _Context) -> grpc.RpcMethodHandler | None:
        if not self._interceptors:
            return method.handler
        details = _CallDetails(method.path, context._metadata)

        async def at(i: int, details: grpc.HandlerCallDetails):
            if i == len(self._interceptors):
                return self._handlers.get(details.method)
            return await self._interceptors[i].intercept_service(
                functools.partial(at, i + 1), details
            )

        return await at(0, details)

    async def _run(self, method: _Method, context: _Context, payload: bytes | None) -> None:
        call_id = context._id
        code, details = grpc.StatusCode.OK, ""
        try:
            handler = await self._handler(method, context)
            if handler is None:
                code, details = grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method.path}"
                return
            context._serialize = handler.response_serializer
            if method.streamed_in:
                requests = self._streams[call_id]
                requests._deserialize = handler.request_deserializer
                context._requests = requests
                argument: Any = requests
                behaviour = handler.stream_stream
            else:
                deserialize = handler.request_deserializer
                try:
                    argument = deserialize(payload) if deserialize is not None else payload
                except DecodeError as exc:
                    raise _BadRequest(str(exc)) from None
                behaviour = handler.unary_stream if method.streamed_out else handler.unary_unary
            result = behaviour(argument, context)
            if method.streamed_out:
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        await context.write(response)
                elif inspect.isawaitable(result):
                    await result  # a handler that writes through context.write
            else:
                if inspect.isawaitable(result):
                    result = await result
                if result is not None and context._code in (None, grpc.StatusCode.OK):
                    await context.write(result)
                elif context._code in (None, grpc.StatusCode.OK):
                    code, details = grpc.StatusCode.INTERNAL, "the handler answered nothing"
            if context._code is not None:
                code, details = context._code, context._details
        except grpc.aio.AbortError:
            code, details = context._code or grpc.StatusCode.UNKNOWN, context._details
        except _BadRequest as exc:
            self.bad_requests += 1
            log.warning("%s from %s: a request that does not parse (%s)", method.path,
                        context._peer, exc)  # fmt: skip
            code = grpc.StatusCode.INVALID_ARGUMENT
            details = f"the request is not a valid message of {method.path}: {exc}"
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the door has forgotten the call
        except Exception:  # noqa: BLE001 - a handler's bug answers UNKNOWN, as grpcio does
            log.exception("unexpected error in %s", method.path)
            code, details = grpc.StatusCode.UNKNOWN, f"unexpected error in {method.path}"
        finally:
            context._done = True
            self._tasks.pop(call_id, None)
            self._streams.pop(call_id, None)
            self._contexts.pop(call_id, None)
            if code != grpc.StatusCode.CANCELLED:
                self._end(call_id, code.value[0], details)
            for callback in context._callbacks:
                try:
                    callback(context)
                except Exception:  # noqa: BLE001 - one callback's bug ends no call
                    log.exception("done callback of %s failed", method.path)


class DoorCollector:
    """`ferry_grpc_door_*`: what the native door counted (connections, refusals,
    overloads, calls) and the calls open now."""

    def __init__(self, server: NativeServer, service: str) -> None:
        self._server = server
        self._service = service

    def collect(self):
        stats = self._server.stats()
        # Each name written out in its CounterMetricFamily: the docs' check finds them so.
        labels = ["service"]
        counted = {
            "connections": CounterMetricFamily(
                "ferry_grpc_door_connections", "Connections the native gRPC door accepted.", labels=labels
            ),
            "tls_connections": CounterMetricFamily(
                "ferry_grpc_door_tls_connections", "Connections that completed a TLS handshake.", labels=labels
            ),
            "plaintext_connections": CounterMetricFamily(
                "ferry_grpc_door_plaintext_connections",
                "Plaintext connections that sent the HTTP/2 preface.", labels=labels,
            ),
            "refused_connections": CounterMetricFamily(
                "ferry_grpc_door_refused_connections",
                "Connections closed for not speaking TLS or HTTP/2 as the port serves it, "
                "or for sending nothing in time.", labels=labels,
            ),
            "calls": CounterMetricFamily(
                "ferry_grpc_door_calls", "Calls the door handed to Python.", labels=labels
            ),
            "overloaded": CounterMetricFamily(
                "ferry_grpc_door_overloaded",
                "Calls answered at once because too many were open.", labels=labels,
            ),
            "unknown_methods": CounterMetricFamily(
                "ferry_grpc_door_unknown_methods",
                "Calls of methods the door does not serve.", labels=labels,
            ),
        }  # fmt: skip
        for key, family in counted.items():
            family.add_metric([self._service], stats.get(key, 0))
            yield family
        bad = CounterMetricFamily(
            "ferry_grpc_door_bad_requests",
            "Requests whose bytes were not the method's message.",
            labels=["service"],
        )
        bad.add_metric([self._service], self._server.bad_requests)
        yield bad
        open_calls = GaugeMetricFamily(
            "ferry_grpc_door_calls_open", "Calls open on the native door now.", labels=["service"]
        )
        open_calls.add_metric([self._service], len(self._server._tasks))
        yield open_calls
