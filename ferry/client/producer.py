"""A pipelining producer: `send_async()` returns a future at once, and a
background thread sends over `Broker.SendStream` (one stream per broker)
without waiting for each answer, as Kafka's producer does.

    producer = PipelinedProducer(NamesrvClient(addrs), max_in_flight=256)
    futures = [producer.send_async("T", b"...") for _ in range(10_000)]
    producer.flush()                     # every message handed over is answered
    sent = futures[0].result()           # a `Sent`, or the send's exception

How messages travel:
- Each message is assigned a queue when handed over: round-robin over the
  topic's writable queues, or, with a message group, the group's broker
  (the same hash as `Producer`) with the broker picking the queue. Messages
  to one queue keep their order: they are written to the broker's stream in
  the order handed over, and the broker appends in arrival order.
- Batching (`linger_ms`, `batch_max_messages`, `batch_max_bytes`): a queue's
  messages wait up to `linger_ms` for company and go out together in one
  write (each still answered on its own). With `linger_ms=0` (the default)
  nothing waits: what is handed over while a write is in progress goes in
  the next one.
- At most `max_in_flight` messages per broker are written and unanswered.
- Memory: at most `buffer_max_bytes` of bodies handed over and unanswered;
  beyond that `send_async` blocks (up to `max_block_s`, then raises
  `BufferFull`), or raises at once with `block_when_full=False`.
- Retries: a message that never left this process because its stream could
  not be written (the broker unreachable) is sent again on a fresh stream to
  the same queue, up to `retries` times, in its queue's order: the queue
  writes nothing more until everything it had in flight is answered or
  failed, then the failed ones go first. (Unlike the blocking `Producer`, it
  does not move to another broker: that would need the queue's order carried
  across brokers.) A message written to a stream that broke before its
  answer is NOT sent again: it may be stored, and sending it again could
  store it twice. Its future fails with a `StreamSendError` whose
  `maybe_stored` is True; the application decides.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from ferry.client.broker import (
    CHANNEL_OPTIONS,
    RETRIABLE_CODES,
    BrokerRoutes,
    NoRoute,
    NoWritableQueue,
    Sent,
    message_properties,
)
from ferry.client.namesrv import NamesrvClient
from ferry.client.routes import QueueRef, TopicRoute, group_broker
from ferry.client.sendstream import StreamSender, StreamSendError, no_answer
from ferry.runtime import tls
from ferry.runtime.clock import within
from ferry.v1 import broker_pb2, broker_pb2_grpc


class BufferFull(Exception):
    """The producer holds `buffer_max_bytes` of unanswered messages."""


class ProducerClosed(Exception):
    pass


@dataclass(order=True)
class _Item:
    seq: int  # the order it was handed over: a queue's messages go out in this order
    message: broker_pb2.StreamedMessage = field(compare=False)
    future: concurrent.futures.Future = field(compare=False)
    topic: str = field(compare=False)
    group: str = field(compare=False)
    attempts: int = field(default=0, compare=False)


class _Room:
    """Messages a broker may still be sent before it answers some (shared by
    the queues of that broker; every waiter re-checks when room is given)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self._given = asyncio.Event()

    def give(self) -> None:
        self.free += 1
        self._given.set()

    async def wait_free(self) -> None:
        while self.free <= 0:
            self._given.clear()
            await self._given.wait()


@dataclass
class _Lane:
    """One queue's messages not yet written."""

    broker_name: str
    addr: str
    queue_id: int | None  # None: the broker picks (a message group)
    pending: list[_Item] = field(default_factory=list)
    pending_bytes: int = 0
    in_flight: int = 0  # written, not yet answered
    held: bool = False  # a retry waits for everything in flight before it
    retries: int = 0  # consecutive retried failures: the backoff
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class PipelinedProducer:
    def __init__(
        self,
        namesrv: NamesrvClient,
        max_in_flight: int = 256,
        linger_ms: float = 0.0,
        batch_max_messages: int = 64,
        batch_max_bytes: int = 1024 * 1024,
        buffer_max_bytes: int = 32 * 1024 * 1024,
        block_when_full: bool = True,
        max_block_s: float = 60.0,
        retries: int = 2,
        timeout_s: float = 10.0,
    ) -> None:
        if max_in_flight < 1 or batch_max_messages < 1 or linger_ms < 0:
            raise ValueError(
                "max_in_flight and batch_max_messages must be at least 1, linger_ms at least 0"
            )
        self.max_in_flight = max_in_flight
        self.linger_s = linger_ms / 1000
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.buffer_max_bytes = buffer_max_bytes
        self.block_when_full = block_when_full
        self.max_block_s = max_block_s
        self.retries = retries
        self.timeout_s = timeout_s
        self._routes = BrokerRoutes(namesrv, timeout_s)
        self._counter = itertools.count()
        self._seq = itertools.count()
        # Shared between the caller's threads and the loop thread:
        self._lock = threading.Condition()
        self._buffered = 0  # body bytes handed over, not yet answered
        self._unanswered = 0
        self._waiters = 0  # threads waiting on _lock (buffer room, flush)
        self._closed = False
        # The loop thread's own:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ferry-producer", daemon=True
        )
        self._thread.start()
        self._lanes: dict[tuple[str, str, int | None, str], _Lane] = {}
        self._senders: dict[str, tuple[grpc.aio.Channel, StreamSender, _Room]] = {}
        self._tls = tls.ClientTLS.from_env()
        # Messages are routed one at a time, in the order handed over: a route
        # lookup (rare: routes are cached) holds back the ones behind it.
        self._inbox: asyncio.Queue[_Item] = asyncio.Queue()  # bound to the loop on first use
        # Callers' threads hand messages over through a deque, and wake the
        # loop only when no wake-up is already on its way: one wake-up per
        # message (a write to the loop's self-pipe) was a third of the CPU of
        # a producer sending as fast as it could.
        self._handoff: collections.deque[_Item] = collections.deque()
        self._handoff_scheduled = False
        self._router = asyncio.run_coroutine_threadsafe(self._route_all(), self._loop)

    # ------------------------------------------------------------ the caller's side

    def send_async(
        self,
        topic: str,
        body: bytes,
        tags: str = "",
        keys: str = "",
        properties: Mapping[str, str] | None = None,
        message_group: str = "",
        deliver_at_ms: int | None = None,
    ) -> concurrent.futures.Future:
        """Hand one message over; the future's result is a `Sent`, or the
        send's exception (`StreamSendError` for the broker's refusal or a
        broken stream, `NoRoute`, ...)."""
        message = broker_pb2.StreamedMessage(
            topic=topic,
            body=body,
            tags=tags,
            keys=keys,
            properties=message_properties(properties, message_group, deliver_at_ms),
        )
        future: concurrent.futures.Future = concurrent.futures.Future()
        size = len(body)
        self._reserve(size)
        item = _Item(next(self._seq), message, future, topic, message_group)
        future.add_done_callback(lambda _f: self._release(size))
        self._handoff.append(item)
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            self._loop.call_soon_threadsafe(self._take_handoff)
        return future

    def send(self, topic: str, body: bytes, **fields) -> Sent:
        """`send_async(...).result()`: one message, waiting for its answer."""
        return self.send_async(topic, body, **fields).result()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message handed over so far is answered (or has failed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._unanswered:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._unanswered} messages still unanswered")
                self._wait(left)

    def close(self) -> None:
        """Flush, then stop the background thread and close the streams."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(self.timeout_s * (self.retries + 1) + 5)
        finally:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()
            self._routes.close()

    def __enter__(self) -> PipelinedProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reserve(self, size: int) -> None:
        with self._lock:
            if self._closed:
                raise ProducerClosed("the producer is closed")
            deadline = time.monotonic() + self.max_block_s
            while self._buffered and self._buffered + size > self.buffer_max_bytes:
                left = deadline - time.monotonic()
                if not self.block_when_full or left <= 0:
                    raise BufferFull(
                        f"{self._buffered} bytes of messages are unanswered "
                        f"(buffer_max_bytes={self.buffer_max_bytes}); wait, or flush()"
                    )
                self._wait(left)
            self._buffered += size
            self._unanswered += 1

    def _wait(self, timeout_s: float | None) -> None:
        # Under self._lock. Counted, so that an answer wakes nobody when nobody waits.
        self._waiters += 1
        try:
            self._lock.wait(timeout_s)
        finally:
            self._waiters -= 1

    def _release(self, size: int) -> None:
        with self._lock:
            self._buffered -= size
            self._unanswered -= 1
            if self._waiters:
                self._lock.notify_all()

    # ------------------------------------------------------------ the loop thread

    def _take_handoff(self) -> None:
        # Cleared before draining: a message appended after the drain's last
        # look schedules a new one (appends and the flag are atomic under the GIL).
        self._handoff_scheduled = False
        while self._handoff:
            item = self._handoff.popleft()
            route = self._routes.cached(item.topic) if self._inbox.empty() else None
            if route is None:  # a lookup first, in the router, behind any waiting there
                self._inbox.put_nowait(item)
                continue
            try:
                self._route(item, route)
            except Exception as exc:  # noqa: BLE001 - the message's own failure
                _fail(item, exc)

    async def _route_all(self) -> None:
        while True:
            item = await self._inbox.get()
            try:
                route = self._routes.cached(item.topic)
                if route is None:
                    route = await self._loop.run_in_executor(None, self._routes.get, item.topic)
                self._route(item, route)
            except Exception as exc:  # noqa: BLE001 - the message's own failure
                _fail(item, exc)

    def _route(self, item: _Item, route: TopicRoute) -> None:
        """Pick the item's queue and queue it in its lane."""
        queues = route.write_queues()
        if not queues:
            raise NoWritableQueue(item.topic) if route.queues else NoRoute(item.topic)
        queue_id: int | None
        if item.group:
            name, queue_id = group_broker(queues, item.group), None
        else:
            ref: QueueRef = queues[next(self._counter) % len(queues)]
            name, queue_id = ref.broker_name, ref.queue_id
        addr = route.master(name)
        assert addr is not None
        if queue_id is not None:  # else unset: the broker picks (a fresh message)
            item.message.queue_id = queue_id
        key = (item.topic, addr, queue_id, item.group if queue_id is None else "")
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(name, addr, queue_id)
            lane.task = self._loop.create_task(self._pump(lane))
        _queue(lane, item)

    def _sender(self, addr: str) -> tuple[StreamSender, _Room]:
        entry = self._senders.get(addr)
        if entry is None:
            channel = tls.aio_channel(addr, self._tls, CHANNEL_OPTIONS)
            sender = StreamSender(
                broker_pb2_grpc.BrokerStub(channel), self.timeout_s, self.max_in_flight
            )
            entry = self._senders[addr] = (channel, sender, _Room(self.max_in_flight))
        return entry[1], entry[2]

    async def _pump(self, lane: _Lane) -> None:
        """Write the lane's messages in order, a batch at a time."""
        sender, room = self._sender(lane.addr)
        while True:
            if not lane.pending or (lane.held and lane.in_flight):
                lane.wake.clear()
                await lane.wake.wait()
                continue
            if lane.held:  # everything in flight is resolved: the retried go first
                lane.held = False
                await asyncio.sleep(min(0.05 * lane.retries, 1.0))
            if self.linger_s and not self._batch_full(lane):
                deadline = self._loop.time() + self.linger_s
                while not self._batch_full(lane) and self._loop.time() < deadline:
                    lane.wake.clear()
                    try:
                        await within(lane.wake.wait(), deadline - self._loop.time())
                    except TimeoutError:
                        break
            await room.wait_free()  # the broker's in-flight bound
            take, size = 0, 0
            limit = min(len(lane.pending), self.batch_max_messages, room.free)
            while take < limit:
                body = len(lane.pending[take].message.body)
                if take and size + body > self.batch_max_bytes:
                    break
                take += 1
                size += body
            if not take:
                continue
            batch = lane.pending[:take]
            del lane.pending[:take]  # one move, not one per message
            room.free -= take
            lane.pending_bytes -= size
            lane.in_flight += len(batch)
            futures = sender.submit([item.message for item in batch])
            self._loop.call_later(self.timeout_s, _expire, futures, self.timeout_s)
            for item, future in zip(batch, futures, strict=True):
                future.add_done_callback(
                    lambda f, it=item, ln=lane: (room.give(), self._answered(it, ln, f))
                )

    def _batch_full(self, lane: _Lane) -> bool:
        return (
            len(lane.pending) >= self.batch_max_messages
            or lane.pending_bytes >= self.batch_max_bytes
        )

    def _answered(self, item: _Item, lane: _Lane, future: asyncio.Future) -> None:
        lane.in_flight -= 1
        if lane.in_flight == 0:
            lane.wake.set()
        if future.cancelled():
            _fail(item, StreamSendError(grpc.StatusCode.CANCELLED, "the producer closed"))
            return
        exc = future.exception()
        if exc is None:
            lane.retries = 0
            if not item.future.done():
                item.future.set_result(Sent(future.result(), lane.broker_name, lane.addr))
            return
        retry = (
            isinstance(exc, StreamSendError)
            and not exc.maybe_stored
            and exc.code() in RETRIABLE_CODES
            and item.attempts < self.retries
            and not self._closed
        )
        if retry:
            item.attempts += 1
            lane.retries += 1
            lane.held = True
            _queue(lane, item)
            return
        _fail(item, exc)

    async def _shutdown(self) -> None:
        """Everything on the loop ends before the loop closes: the router and
        the lanes, then each stream and its channel, then whatever tasks grpc
        itself left (a call's status handler, one step from done). A task or
        gRPC operation outliving the loop prints "Task was destroyed but it is
        pending!" or, through grpc's process-wide poller, "Event loop is
        closed" tracebacks on some other loop of the process."""
        self._router.cancel()
        self._take_handoff()
        while not self._inbox.empty():
            _fail(self._inbox.get_nowait(), ProducerClosed("the producer closed"))
        lanes = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        for lane in self._lanes.values():
            for item in lane.pending:
                _fail(item, ProducerClosed("the producer closed before this message was sent"))
        for channel, sender, _ in self._senders.values():
            await sender.close()
            await channel.close()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            _, stuck = await asyncio.wait(others, timeout=5.0)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)


def _queue(lane: _Lane, item: _Item) -> None:
    bisect.insort(lane.pending, item)  # a retried item goes back before later ones
    lane.pending_bytes += len(item.message.body)
    lane.wake.set()


def _expire(futures: list[asyncio.Future], timeout_s: float) -> None:
    for f in futures:
        if not f.done():
            f.set_exception(no_answer(timeout_s))


def _fail(item: _Item, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)
