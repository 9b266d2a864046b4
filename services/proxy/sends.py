"""Single-message sends that meet at one broker share its calls.

An SDK sends one message per `SendMessage`, from many threads at once. Each
unary call costs the broker (and this proxy) far more CPU than the append it
carries, so while one call to a broker's topic is in flight, the proxy holds
the plain messages that arrive for it, and sends them together as one
`SendMessages` batch when that call returns. Nothing waits on a timer: a lone
message goes at once; under load a batch is as large as what arrived during
one round trip, the adaptive batching of Kafka's producer without `linger.ms`.

Only messages any queue may take are combined (no message group, no delivery
time, no delay level, no queue asked for); the others go alone, as before.
A batch is appended whole or not at all, so a batch the broker refuses for
what one message holds (too large, a bad property) is sent again one message
at a time, each getting its own verdict; a batch lost to the connection
(UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) fails each message with that error, and the
caller's own retry goes on as for a single send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ferry.model import PROPERTY_DELAY, PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS
from ferry.v1 import broker_pb2

MAX_BATCH_MESSAGES = 64
MAX_BATCH_BYTES = 1024 * 1024  # well below a broker's maxMessageSize (4 MiB)
# Errors that speak of the connection or the broker, not of the messages: retried
# by the caller, on another broker. CANCELLED from a broker is its server
# stopping under the call (a process going away), not the caller's cancellation
# (which reaches the caller as asyncio.CancelledError).
LINK_ERRORS = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)

StubFor = Callable[[str], Any]  # an address -> its ferry.v1.Broker stub


def combinable(request: broker_pb2.SendMessageRequest) -> bool:
    """Whether the message may share a batch: any queue of the topic will do."""
    props = request.properties
    return not (
        request.HasField("queue_id")
        or request.HasField("wait_store_msg_ok")
        or PROPERTY_SHARDING_KEY in props
        or PROPERTY_TIMER_DELIVER_MS in props
        or PROPERTY_DELAY in props
    )


@dataclass
class _Lane:
    """The sends of one (broker, topic): one call in flight, the rest waiting.
    A lane exists while its call is in flight (it is busy while it is in `_lanes`)."""

    waiting: list[tuple[broker_pb2.SendMessageRequest, asyncio.Future]] = field(
        default_factory=list
    )


@dataclass
class SendStats:
    calls: int = 0  # calls made to brokers
    messages: int = 0  # messages they carried
    in_process: int = 0  # of them, to a broker's send door in this process (local mode)


class SendCoalescer:
    def __init__(self, stub_for: StubFor, timeout_s: float) -> None:
        self._stub_for = stub_for
        self._timeout_s = timeout_s
        self._lanes: dict[tuple[str, str, str], _Lane] = {}
        self._tasks: set[asyncio.Task] = set()
        self.stats = SendStats()

    async def send(
        self, addr: str, request: broker_pb2.SendMessageRequest, alone: bool = False
    ) -> broker_pb2.SendResult:
        """The broker's result for this one message; raises the broker's
        `grpc.aio.AioRpcError` as a unary `SendMessage` would. `alone`: sent
        on its own (a transaction's half, which no batch may carry)."""
        if alone or not combinable(request):
            return await self._single(addr, request)
        key = (addr, request.topic, request.producer_group)
        lane = self._lanes.get(key)
        if lane is not None:  # a call is in flight: wait to go in the next one
            future = asyncio.get_running_loop().create_future()
            lane.waiting.append((request, future))
            return await future
        lane = self._lanes[key] = _Lane()
        try:
            return await self._single(addr, request)
        finally:
            self._next(addr, key, lane)

    async def _single(
        self, addr: str, request: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendResult:
        self.stats.calls += 1
        self.stats.messages += 1
        return await self._stub_for(addr).SendMessage(request, timeout=self._timeout_s)

    def _next(self, addr: str, key: tuple[str, str, str], lane: _Lane) -> None:
        """Start the batch of what waited while the lane was busy, or free the lane."""
        if not lane.waiting:
            del self._lanes[key]
            return
        batch, size = [], 0
        for request, future in lane.waiting:
            if batch and (
                len(batch) == MAX_BATCH_MESSAGES or size + len(request.body) > MAX_BATCH_BYTES
            ):
                break
            batch.append((request, future))
            size += len(request.body)
        del lane.waiting[: len(batch)]
        task = asyncio.get_running_loop().create_task(self._flush(addr, key, lane, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, addr: str, key: tuple[str, str, str], lane: _Lane, batch: list) -> None:
        try:
            await self._send_batch(addr, key[1], key[2], batch)
        finally:
            self._next(addr, key, lane)

    async def _send_batch(self, addr: str, topic: str, producer_group: str, batch: list) -> None:
        live = [(r, f) for r, f in batch if not f.done()]  # a caller that gave up is dropped
        if len(live) == 1:
            await self._settle_alone(addr, *live[0])
            return
        if not live:
            return
        self.stats.calls += 1
        self.stats.messages += len(live)
        try:
            result = await self._stub_for(addr).SendMessages(
                broker_pb2.SendMessagesRequest(
                    topic=topic,
                    messages=[_entry(r) for r, _ in live],
                    producer_group=producer_group,
                ),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in LINK_ERRORS:
                for _, future in live:
                    _settle(future, error=exc)
                return
            # Refused whole for what some message holds: nothing was stored.
            # Each message alone gets its own verdict.
            await asyncio.gather(*(self._settle_alone(addr, r, f) for r, f in live))
            return
        for i, (_, future) in enumerate(live):
            _settle(future, result=_one_of(result, i))

    async def _settle_alone(self, addr: str, request, future: asyncio.Future) -> None:
        try:
            result = await self._single(addr, request)
        except grpc.aio.AioRpcError as exc:
            _settle(future, error=exc)
        else:
            _settle(future, result=result)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _entry(request: broker_pb2.SendMessageRequest) -> broker_pb2.SendEntry:
    return broker_pb2.SendEntry(
        body=request.body,
        tags=request.tags,
        keys=request.keys,
        properties=request.properties,
        flag=request.flag,
        born_timestamp=request.born_timestamp,
    )


def _one_of(result: broker_pb2.SendResult, i: int) -> broker_pb2.SendResult:
    """Message i's share of a batch's result: its id and its offset."""
    return broker_pb2.SendResult(
        status=result.status,
        msg_id=result.msg_ids[i] if i < len(result.msg_ids) else "",
        queue_id=result.queue_id,
        queue_offset=result.queue_offset + i,
        commit_offset=result.commit_offset,
        message_count=1,
    )


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
