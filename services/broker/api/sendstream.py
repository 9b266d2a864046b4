"""`Broker.SendStream`: pipelined single-message sends on one stream.

A unary call costs the broker several times the CPU of the append it carries.
On a stream, a producer writes messages without waiting; the broker appends
them as they arrive (in arrival order, so one producer's messages to a queue
keep their order; a request's messages for one queue in one append, and its
plain messages of a topic on one queue the broker picks), and an answering
loop waits once for the flush and the slave that cover everything appended so
far, then answers all of it in one response, each message under its client's
sequence number.

    reader:  request -> stage_each (check + append) -> pending   (at most max_in_flight)
    answer:  pending -> settle once (flush, slave) -> response

A message the broker refuses (InvalidArgument, NotFound, PermissionDenied,
ResourceExhausted) is answered with its error and nothing stored; the stream
goes on. A fault of the broker itself (a storage fault, the broker stopping:
Unavailable) ends the stream with UNAVAILABLE; what was appended but not
answered may or may not be kept, as for a unary call that fails.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ferry.runtime import errors
from ferry.v1 import broker_pb2
from services.broker.api import convert
from services.broker.messaging.outgoing import Staged
from services.broker.messaging.send import SendService


@dataclass(frozen=True, slots=True)
class _Pending:
    sequence: int
    outcome: Staged | errors.FerryError  # appended, or refused
    wait: bool = True


class SendStreamSession:
    def __init__(
        self,
        sends: SendService,
        check_open: Callable[[], None],
        max_in_flight: int,
    ) -> None:
        self.sends = sends
        self.check_open = check_open
        self.max_in_flight = max_in_flight
        self._pending: deque[_Pending] = deque()
        self._in_flight = 0  # staged or refused, not yet answered
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._done = False  # the reader has seen the end of the requests
        self._fault: BaseException | None = None

    async def run(
        self, requests: AsyncIterator[broker_pb2.SendStreamRequest]
    ) -> AsyncIterator[broker_pb2.SendStreamResponse]:
        reader = asyncio.get_running_loop().create_task(self._read(requests))
        try:
            while True:
                if not self._pending:
                    if self._fault is not None:
                        raise self._fault
                    if self._done:
                        return
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                batch = list(self._pending)
                self._pending.clear()
                yield await self._answer(batch)
                self._in_flight -= len(batch)
                if self._in_flight < self.max_in_flight:
                    self._room.set()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[broker_pb2.SendStreamRequest]) -> None:
        try:
            async for request in requests:
                self._pending.extend(self._stage(request.messages))
                self._in_flight += len(request.messages)
                self._arrived.set()
                if self._in_flight >= self.max_in_flight:
                    self._room.clear()
                    await self._room.wait()  # no more reading: the client's writes back up
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken stream is the whole stream's fault
            self._fault = exc
        finally:
            self._done = True
            self._arrived.set()

    def _stage(self, messages) -> list[_Pending]:
        """A request's messages, staged together (one append per queue)."""
        self.check_open()  # Unavailable: ends the stream
        staged = self.sends.stage_each(
            [(m.topic, convert.queue_id_of(m), convert.outgoing(m)) for m in messages]
        )  # Unavailable (a storage fault) ends the stream too
        return [
            _Pending(m.sequence, s, convert.wait_of(m))
            for m, s in zip(messages, staged, strict=True)
        ]

    async def _answer(self, batch: list[_Pending]) -> broker_pb2.SendStreamResponse:
        statuses = {}
        for wait in (True, False):
            staged = [p.outcome for p in batch if p.wait is wait and isinstance(p.outcome, Staged)]
            if staged:
                statuses[wait] = await self.sends.settle(staged, wait)
        return broker_pb2.SendStreamResponse(
            results=[
                convert.streamed_result_pb(
                    p.sequence,
                    p.outcome.outcome(statuses[p.wait])
                    if isinstance(p.outcome, Staged)
                    else p.outcome,
                )
                for p in batch
            ]
        )
