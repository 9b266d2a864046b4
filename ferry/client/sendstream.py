"""One `Broker.SendStream` to one broker, shared by any number of concurrent
senders on an asyncio loop.

`await sender.send(message)` hands the message to the stream and waits for
its own result. Messages handed over while a write is in progress go out
together in the next request (one write for all of them: the stream's
per-message cost is mostly the write); the broker answers each under its
sequence number, which this class assigns. At most `max_in_flight`
messages are unanswered; `send` waits for room beyond that.

Errors, raised by `send` as `StreamSendError` (with `code()` and `details()`,
as a `grpc.aio.AioRpcError`, so callers handle both alike):
- the broker refused the message (its code: NOT_FOUND, INVALID_ARGUMENT,
  RESOURCE_EXHAUSTED, ...): nothing stored;
- the stream failed or ended before the answer (the stream's code, e.g.
  UNAVAILABLE): the message may or may not be stored; the next `send` opens
  a new stream;
- no answer within `timeout_s` (DEADLINE_EXCEEDED): may or may not be stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import grpc

from ferry.runtime.clock import within
from ferry.v1 import broker_pb2, broker_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 1024  # as the broker's sendStreamMaxInFlight
CLOSE_TIMEOUT_S = 5.0  # a cancelled call ends at once; this only bounds a wedged one


class StreamSendError(Exception):
    """`maybe_stored`: False when the broker refused the message or it never
    left this process (safe to send again); True when it was written to the
    stream and no answer came (sending it again may store it twice)."""

    def __init__(self, code: grpc.StatusCode, details: str, maybe_stored: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.maybe_stored = maybe_stored

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def no_answer(timeout_s: float) -> StreamSendError:
    """A written message not answered within `timeout_s`: it may be stored."""
    return StreamSendError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"no answer on the send stream within {timeout_s:g} s",
        maybe_stored=True,
    )


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class _Stream:
    """One open call: its writer and reader tasks and the messages it owes answers for."""

    def __init__(self, call) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future] = {}
        # Sequences rise in the order written: those up to here were written.
        self.written_upto = 0
        self.outbox: list[broker_pb2.StreamedMessage] = []
        self.wake = asyncio.Event()
        self.failed: StreamSendError | None = None
        self.tasks: list[asyncio.Task] = []


class StreamSender:
    def __init__(
        self,
        stub: broker_pb2_grpc.BrokerStub,
        timeout_s: float | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self._stub = stub
        self._timeout_s = timeout_s
        self._room = asyncio.Semaphore(max_in_flight)
        self._sequence = itertools.count(1)
        self._stream: _Stream | None = None

    async def send(self, message: broker_pb2.StreamedMessage) -> broker_pb2.SendResult:
        """The broker's result for `message` (its `sequence` is set here)."""
        async with self._room:
            future = self.submit([message])[0]
            try:
                return await within(future, self._timeout_s)
            except TimeoutError:
                raise no_answer(self._timeout_s) from None

    def submit(self, messages: list[broker_pb2.StreamedMessage]) -> list[asyncio.Future]:
        """Hand messages to the stream, in this order, without waiting and
        without the in-flight bound (the caller keeps its own): one future of
        a `SendResult` (or a `StreamSendError`) per message."""
        stream = self._open()
        loop = asyncio.get_running_loop()
        futures = []
        for message in messages:
            message.sequence = sequence = next(self._sequence)
            future = stream.waiting[sequence] = loop.create_future()
            futures.append(future)
        stream.outbox.extend(messages)
        stream.wake.set()
        return futures

    def _open(self) -> _Stream:
        if self._stream is not None and self._stream.failed is None:
            return self._stream
        stream = self._stream = _Stream(self._stub.SendStream())
        loop = asyncio.get_running_loop()
        stream.tasks = [loop.create_task(self._write(stream)), loop.create_task(self._read(stream))]
        return stream

    async def _write(self, stream: _Stream) -> None:
        try:
            while stream.failed is None:
                await stream.wake.wait()
                stream.wake.clear()
                if stream.outbox:
                    batch, stream.outbox = stream.outbox, []
                    await stream.call.write(broker_pb2.SendStreamRequest(messages=batch))
                    stream.written_upto = batch[-1].sequence
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the reader reports the call's status
            log.debug("send stream write failed: %s", exc)
            stream.call.cancel()

    async def _read(self, stream: _Stream) -> None:
        error = StreamSendError(grpc.StatusCode.UNAVAILABLE, "the broker ended the send stream")
        try:
            async for response in stream.call:
                for r in response.results:
                    future = stream.waiting.pop(r.sequence, None)
                    if future is None or future.done():
                        continue  # its sender gave up
                    if r.HasField("result"):
                        future.set_result(r.result)
                    else:
                        code = _CODES.get(r.error_code, grpc.StatusCode.UNKNOWN)
                        future.set_exception(StreamSendError(code, r.error))
        except asyncio.CancelledError:
            error = StreamSendError(grpc.StatusCode.CANCELLED, "the send stream was closed")
            raise
        except grpc.aio.AioRpcError as exc:
            error = StreamSendError(exc.code(), exc.details() or exc.code().name)
        finally:
            stream.failed = error
            stream.wake.set()  # the writer stops
            for sequence, future in list(stream.waiting.items()):
                if not future.done():
                    written = sequence <= stream.written_upto
                    future.set_exception(
                        StreamSendError(error.code(), error.details(), maybe_stored=written)
                    )
            stream.waiting.clear()

    async def close(self) -> None:
        """Cancel the call and wait until its reader and writer have seen it
        end. They are not cancelled mid-operation: a gRPC operation left
        pending completes later through grpc's process-wide poller, and on a
        loop closed by then that prints "Event loop is closed" tracebacks."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        stream.call.cancel()
        stream.wake.set()
        _, stuck = await asyncio.wait(stream.tasks, timeout=CLOSE_TIMEOUT_S)
        for task in stuck:
            task.cancel()
        for task in stream.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
