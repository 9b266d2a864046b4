"""`apache.rocketmq.v2.MessagingService` on ferry's brokers (RocketMQ's
proxy in cluster mode): the SDKs talk to this proxy only; it finds brokers
through the name servers and calls them in RocketMQ's protocol
(`remoting_sends`, `remoting_pops`) where their routes give that port, else
with `ferry.v1`.

Every answer carries a v2 `Status` (the API's error channel); gRPC errors are
kept for requests that cannot be read at all. Nothing here holds state a
restart would lose: routes are re-fetched, receipt handles name their
broker, a transaction (whose id is its message id) is found at the topic's
masters when this proxy does not remember where its half went, and
Telemetry streams are per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.client.routes import BrokerQueues, group_broker
from ferry.model import (
    DEFAULT_RETRY_MAX_TIMES,
    DELAY_LEVELS_S,
    DLQ_TOPIC_PREFIX,
    RETRY_TOPIC_PREFIX,
    check_name,
    check_pop_group,
    check_topic,
)
from ferry.receipt_handle import PopFormatError, decode_handle, handle_broker
from ferry.runtime.errors import InvalidArgument
from ferry.v1 import broker_pb2
from services.proxy import convert, metrics, transactions, validate
from services.proxy.convert import OK, Code, status
from services.proxy.metrics import ProxyMetrics
from services.proxy.remoting_pops import PopHandle, RemotingPops, batchable
from services.proxy.remoting_sends import RemotingSends, SendRefused
from services.proxy.routes import NameServersDown, RouteSource, TopicNotFound
from services.proxy.sends import LINK_ERRORS, SendCoalescer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024  # the brokers' default maxMessageSize
MAX_BATCH = 32  # the brokers' largest pop
DEFAULT_INVISIBLE_MS = 30_000
MIN_INVISIBLE_MS = 10_000  # RocketMQ's proxy's minInvisibleTimeMillsForRecv
MAX_INVISIBLE_MS = 12 * 3600_000  # its maxInvisibleTimeMills
DEFAULT_LONG_POLL_MS = 20_000
DEADLINE_MARGIN_MS = 1_000  # a receive stream ends this long before the client's deadline
CALL_TIMEOUT_S = 10.0
MAX_MS = 2**63 - 1  # the broker's int64 timestamps
SEND_ATTEMPTS = 3  # brokers tried per message
# A consumer's backoff when no broker says its own (GetGroupStatus.retry_backoff_ms):
# RocketMQ's default messageDelayLevel, which its default group retry policy copies.
RETRY_BACKOFF_MS = tuple(int(s * 1000) for s in DELAY_LEVELS_S)


@dataclass(frozen=True)
class ProxyOptions:
    # The (host, port) to hand SDKs in routes when they do not say: read per
    # route, as the port is known only once the server has bound it.
    endpoint: Callable[[], tuple[str, int]]
    max_body_bytes: int = MAX_BODY_BYTES
    # RocketMQ's enableTopicMessageTypeCheck: a send must be of its topic's
    # message.type (and the SDKs are told to check it first).
    topic_message_type_check: bool = True
    # RocketMQ's proxy's minInvisibleTimeMillsForRecv and maxInvisibleTimeMills: a
    # receive asks for at least the one (unless it lets the proxy renew), and no
    # receive or change of invisibility for more than the other.
    min_invisible_ms: int = MIN_INVISIBLE_MS
    max_invisible_ms: int = MAX_INVISIBLE_MS
    # How sends, receives, acks and re-timings reach a broker that routes give a
    # RocketMQ-protocol address for: "remoting" (pipelined SEND_MESSAGE_V2 and the
    # POP codes, as Apache's proxy) or "grpc" (ferry.v1). A transaction's half, and
    # a broker without that address, always go over ferry.v1.
    broker_protocol: str = "remoting"
    # The account the RocketMQ-protocol sends are signed with, for brokers with
    # RocketMQ's ACL on (aclEnable); "": unsigned (a broker that refuses them
    # gets this proxy's sends over ferry.v1 instead).
    broker_access_key: str = ""
    broker_secret_key: str = field(default="", repr=False)


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(
        self, routes: RouteSource, options: ProxyOptions, metrics: ProxyMetrics | None = None
    ) -> None:
        self.routes = routes
        self.options = options
        self.metrics = metrics  # read by the @metrics decorators
        self._round_robin = itertools.count()
        self.sends = SendCoalescer(routes.stub, CALL_TIMEOUT_S)
        self.remoting_sends = (
            RemotingSends(CALL_TIMEOUT_S, options.broker_access_key, options.broker_secret_key)
            if options.broker_protocol == "remoting"
            else None
        )
        # Receives, acks and re-timings go the way sends go (RemotingPops' handles
        # are Apache's proxy's; a ferry.v1 handle still acks over ferry.v1).
        self.remoting_pops = (
            RemotingPops(self.remoting_sends) if self.remoting_sends is not None else None
        )
        self.transactions = transactions.ProxyTransactions(
            routes, f"ferry-proxy@{os.getpid()}", self.remoting_sends
        )

    async def close(self) -> None:
        """Ends the send batches still in flight (the server has stopped taking calls)."""
        await self.sends.close()
        if self.remoting_sends is not None:
            await self.remoting_sends.close()
        await self.transactions.close()

    # ------------------------------------------------------------ routes

    @metrics.unary("QueryRoute", s.QueryRouteResponse)
    async def QueryRoute(self, request: s.QueryRouteRequest, context) -> s.QueryRouteResponse:
        topic = convert.topic_name(request.topic)
        bad = _bad_topic(topic)
        if bad:
            return s.QueryRouteResponse(status=status(Code.ILLEGAL_TOPIC, bad))
        try:
            route = await self.routes.get(topic, refresh=True)
        except TopicNotFound as exc:
            return s.QueryRouteResponse(status=convert.topic_not_found(exc.topic))
        except NameServersDown as exc:
            return s.QueryRouteResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(exc)))
        endpoints = self._endpoints(request.endpoints)
        accepted = convert.accepted_types(route.message_type)
        # Queue 0 of every broker, then queue 1 of every broker, ...: the SDKs rotate
        # their sends and a simple consumer its receives over this list, so one after the
        # other goes to each broker in turn (broker by broker, a receive could wait out
        # its long poll on each queue of a broker with nothing for it, while another
        # broker holds the group's messages).
        queues = []
        most = max((max(b.read_queue_nums, b.write_queue_nums) for b in route.brokers), default=0)
        for queue_id in range(most):
            for broker in route.brokers:
                if queue_id >= max(broker.read_queue_nums, broker.write_queue_nums):
                    continue
                queues.append(
                    v2.MessageQueue(
                        topic=request.topic,
                        id=queue_id,
                        permission=_permission(broker, queue_id),
                        broker=v2.Broker(name=broker.broker_name, id=0, endpoints=endpoints),
                        accept_message_types=accepted,
                    )
                )
        return s.QueryRouteResponse(status=OK, message_queues=queues)

    @metrics.unary("QueryAssignment", s.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: s.QueryAssignmentRequest, context
    ) -> s.QueryAssignmentResponse:
        """A push consumer's share: one queue (id -1, any) per readable master,
        as RocketMQ's proxy answers for pop consumption."""
        topic = convert.topic_name(request.topic)
        bad = _bad_topic(topic) or _bad_pop_group(convert.topic_name(request.group), topic)
        if bad:
            return s.QueryAssignmentResponse(status=status(Code.BAD_REQUEST, bad))
        try:
            route = await self.routes.get(topic)
        except TopicNotFound as exc:
            return s.QueryAssignmentResponse(status=convert.topic_not_found(exc.topic))
        except NameServersDown as exc:
            return s.QueryAssignmentResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(exc)))
        endpoints = self._endpoints(request.endpoints)
        assignments = [
            v2.Assignment(
                message_queue=v2.MessageQueue(
                    topic=request.topic,
                    id=-1,
                    permission=v2.READ,
                    broker=v2.Broker(name=b.broker_name, id=0, endpoints=endpoints),
                )  # no accepted types: RocketMQ's proxy lists none in an assignment
            )
            for b in route.brokers
            if b.readable
        ]
        return s.QueryAssignmentResponse(status=OK, assignments=assignments)

    def _endpoints(self, asked: v2.Endpoints) -> v2.Endpoints:
        """Routes point SDKs back at this proxy: at the address they used."""
        if asked.addresses:
            return asked
        host, port = self.options.endpoint()
        return v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host=host, port=port)])

    # ------------------------------------------------------------ clients

    @metrics.unary("Heartbeat", s.HeartbeatResponse)
    async def Heartbeat(self, request: s.HeartbeatRequest, context) -> s.HeartbeatResponse:
        return s.HeartbeatResponse(status=OK)

    @metrics.unary("NotifyClientTermination", s.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: s.NotifyClientTerminationRequest, context
    ) -> s.NotifyClientTerminationResponse:
        return s.NotifyClientTerminationResponse(status=OK)

    @metrics.stream("Telemetry", s.TelemetryCommand)
    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Answer each client's settings with the server's settings for its
        type. Each answer is computed from the command alone, so a client that
        reads slowly only slows its own stream. A producer's stream also
        carries the check-backs of its topics' transactions
        (RecoverOrphanedTransactionCommand, `services.proxy.transactions`)."""
        outbox: asyncio.Queue[s.TelemetryCommand | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.WhichOneof("command") != "settings":
                        continue  # stack traces, verification results: nothing to do with them
                    asked = command.settings
                    outbox.put_nowait(
                        s.TelemetryCommand(status=OK, settings=await self._settings(asked))
                    )
                    if asked.client_type == v2.PRODUCER:
                        topics = [convert.topic_name(t) for t in asked.publishing.topics]
                        self.transactions.register([t for t in topics if t], outbox)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (command := await outbox.get()) is not None:
                yield command
            await reader  # its error, if it ended with one
        finally:
            reader.cancel()
            self.transactions.unregister(outbox)

    async def _settings(self, asked: v2.Settings) -> v2.Settings:
        out = v2.Settings()
        out.CopyFrom(asked)
        if asked.client_type == v2.PRODUCER:
            out.publishing.max_body_size = self.options.max_body_bytes
            out.publishing.validate_message_type = self.options.topic_message_type_check
            out.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=SEND_ATTEMPTS,
                    exponential_backoff=v2.ExponentialBackoff(
                        initial=convert.duration(10), max=convert.duration(1000), multiplier=2.0
                    ),
                )
            )
        elif asked.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER):
            group = convert.topic_name(asked.subscription.group)
            orderly, retry_max, backoff_ms = await self._group_settings(group, asked)
            sub = out.subscription
            sub.fifo = orderly
            sub.receive_batch_size = MAX_BATCH
            if not asked.subscription.HasField("long_polling_timeout"):
                sub.long_polling_timeout.CopyFrom(convert.duration(DEFAULT_LONG_POLL_MS))
            out.backoff_policy.CopyFrom(
                v2.RetryPolicy(
                    max_attempts=retry_max + 1,
                    customized_backoff=v2.CustomizedBackoff(
                        next=[convert.duration(ms) for ms in backoff_ms]
                    ),
                )
            )
        return out

    async def _group_settings(
        self, group: str, asked: v2.Settings
    ) -> tuple[bool, int, tuple[int, ...]]:
        """(ordered, retry_max_times, backoff by attempt in ms) of a group, from a broker
        of its first topic: the brokers' delay levels are its retry policy, as RocketMQ's
        proxy hands its SDKs a group's retry policy (GrpcClientSettingsManager)."""
        for entry in asked.subscription.subscriptions:
            topic = convert.topic_name(entry.topic)
            try:
                route = await self.routes.get(topic)
                broker = next(b for b in route.brokers if b.readable)
                answer = await self.routes.stub(broker.addr).GetGroupStatus(
                    broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=topic),
                    timeout=CALL_TIMEOUT_S,
                )
                backoff = tuple(answer.retry_backoff_ms) or RETRY_BACKOFF_MS
                return answer.orderly, answer.retry_max_times, backoff
            except (TopicNotFound, NameServersDown, StopIteration, grpc.aio.AioRpcError):
                continue
        return False, DEFAULT_RETRY_MAX_TIMES, RETRY_BACKOFF_MS

    # ------------------------------------------------------------ send

    @metrics.unary("SendMessage", s.SendMessageResponse)
    async def SendMessage(self, request: s.SendMessageRequest, context) -> s.SendMessageResponse:
        if not request.messages:
            return s.SendMessageResponse(status=status(Code.BAD_REQUEST, "no message to send"))
        messages = request.messages
        first = messages[0].topic
        if len(messages) == 1:  # what the SDKs send but for a batch
            entry = await self._send_one(messages[0], first)
            return s.SendMessageResponse(status=entry.status, entries=(entry,))
        entries = [await self._send_one(m, first) for m in messages]
        codes = {e.status.code for e in entries}
        top = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "mixed")
        return s.SendMessageResponse(status=top, entries=entries)

    async def _send_one(self, message: v2.Message, first: v2.Resource) -> s.SendResultEntry:
        sp = message.system_properties
        message_id = sp.message_id
        topic = convert.topic_name(message.topic)

        def failed(code: int, text: str) -> s.SendResultEntry:
            return s.SendResultEntry(status=status(code, text), message_id=message_id)

        bad = _bad_topic(topic)
        if bad:
            return failed(Code.ILLEGAL_TOPIC, bad)
        refusal = validate.send_refusal(
            message, first, self.options.max_body_bytes, int(time.time() * 1000)
        )
        if refusal is not None:
            return s.SendResultEntry(status=refusal, message_id=message_id)
        born = sp.born_timestamp
        if not 0 <= convert.to_ms(born) <= MAX_MS:
            return failed(
                Code.BAD_REQUEST,
                f"system_properties.born_timestamp ({born.seconds} s) is not a date after 1970",
            )
        request = convert.send_request(message, topic)
        transactional = sp.message_type == v2.TRANSACTION
        if transactional:
            transactions.prepared(request, topic)
        group = sp.message_group
        last = "no writable queue"
        code = Code.INTERNAL_SERVER_ERROR
        for attempt in range(SEND_ATTEMPTS):
            try:
                route = await self.routes.get(topic, refresh=attempt > 0)
            except TopicNotFound as exc:
                return failed(Code.TOPIC_NOT_FOUND, convert.topic_not_found(exc.topic).message)
            except NameServersDown as exc:
                return failed(Code.INTERNAL_SERVER_ERROR, str(exc))
            refusal = self._type_refusal(topic, route.message_type, message, request)
            if refusal is not None:
                return s.SendResultEntry(status=refusal, message_id=message_id)
            writable = [b for b in route.brokers if b.writable]
            if not writable:
                return failed(Code.FORBIDDEN, f"topic {topic!r} has no writable queue now")
            if group:  # a message group stays on one broker (and the broker hashes the queue)
                name = group_broker(writable, group)  # as ferry's own producers pick
                broker = next(b for b in writable if b.broker_name == name)
            else:
                broker = writable[(next(self._round_robin) + attempt) % len(writable)]
            try:
                result = await self._send_to(broker, request, transactional)
            except (grpc.aio.AioRpcError, SendRefused) as exc:
                code, last = convert.error_code(exc), f"{broker.broker_name}: {exc.details()}"
                if exc.code() in LINK_ERRORS:
                    continue  # another broker, with a fresh route
                return failed(code, exc.details() or exc.code().name)
            code = convert.SEND_CODES.get(result.status, Code.INTERNAL_ERROR)
            sent_id = message_id or result.msg_id
            # RocketMQ's broker answers a stored message with its UNIQ_KEY as its
            # transaction id, transactional or not; its proxy passes it on for SEND_OK.
            transaction_id = sent_id if result.status == broker_pb2.SEND_OK else ""
            if transaction_id and transactional:  # EndTransaction asks there first
                self.transactions.sent(
                    topic,
                    transaction_id,
                    broker.broker_name,
                    result.commit_offset,
                    result.queue_offset,
                )
            return s.SendResultEntry(
                status=status(code, convert.SEND_TEXT.get(result.status, "unknown result")),
                message_id=sent_id,
                transaction_id=transaction_id,
                offset=result.queue_offset,
            )
        return failed(code, f"not sent after {SEND_ATTEMPTS} attempts: {last}")

    async def _send_to(
        self, broker: BrokerQueues, request: broker_pb2.SendMessageRequest, transactional: bool
    ) -> broker_pb2.SendResult:
        """One message to `broker`: over RocketMQ's protocol where the route gives its
        address in it (a transaction's half too: TRAN_MSG and PGROUP in its
        properties), else over ferry.v1. Raises the broker's refusal
        (grpc.aio.AioRpcError or SendRefused)."""
        remoting = self.remoting_sends
        addr = broker.remoting_addr
        if remoting is None or not addr or addr in remoting.unsigned_refused:
            return await self.sends.send(broker.addr, request, alone=transactional)
        try:
            return await remoting.send(addr, request)
        except SendRefused as refused:
            if (
                refused.code() != grpc.StatusCode.PERMISSION_DENIED
                or self.options.broker_access_key
            ):
                raise
            # Refused for want of a signature (RocketMQ's ACL on the broker's port), or
            # for what the message asks: its ferry.v1 port, which checks no signature,
            # tells which.
            result = await self.sends.send(broker.addr, request)
            remoting.unsigned_refused.add(addr)
            log.warning(
                "broker %s (%s) refuses unsigned RocketMQ-protocol sends (aclEnable): "
                "sending to it over ferry.v1; give the proxy --broker-access-key and "
                "--broker-secret-key of an account with PUB to send over RocketMQ's protocol",
                broker.broker_name, addr,
            )  # fmt: skip
            return result

    async def _pop_remoting(
        self,
        broker: BrokerQueues,
        group: str,
        topic: str,
        max_nums: int,
        invisible_ms: int,
        wait_ms: int,
        expression: str,
        kind: str,
        timeout_s: float,
    ) -> list[v2.Message] | None:
        """A pop over RocketMQ's protocol; None when the broker refused it unsigned
        and this proxy has no account for it (the caller pops over ferry.v1, which
        tells whether the refusal was the signature's). Raises SendRefused."""
        addr = broker.remoting_addr
        try:
            popped = await self.remoting_pops.pop(  # type: ignore[union-attr]
                addr, broker.broker_name, group, topic, max_nums, invisible_ms, wait_ms,
                expression, kind, timeout_s,
            )  # fmt: skip
        except SendRefused as refused:
            if refused.code() != grpc.StatusCode.PERMISSION_DENIED or (
                self.options.broker_access_key
            ):
                raise
            return None
        return [
            convert.popped_message(p.message, topic, p.handle.encode(), invisible_ms, p.attempt)
            for p in popped
        ]

    def _over_remoting(self, broker: BrokerQueues) -> bool:
        """Whether the proxy pops from `broker` over RocketMQ's protocol: where the
        route gives its address in it, and it has not refused this proxy's unsigned
        requests (its ACL is on and the proxy has no account)."""
        links = self.remoting_sends
        addr = broker.remoting_addr
        return links is not None and bool(addr) and addr not in links.unsigned_refused

    def _type_refusal(
        self,
        topic: str,
        topic_type: str,
        message: v2.Message,
        request: broker_pb2.SendMessageRequest,
    ) -> v2.Status | None:
        """Why the message may not go to the topic, or None. As RocketMQ's
        proxy (ProducerProcessor.sendMessage), with enableTopicMessageTypeCheck
        its type, read from what it carries (a transaction flag, then a
        delivery time, then a message group), must be the topic's; retry and
        dead-letter topics are not checked."""
        if message.system_properties.message_type == v2.TRANSACTION:
            actual = v2.TRANSACTION
        else:
            actual = convert.message_type(request.properties)
        if self.options.topic_message_type_check and not topic.startswith(
            (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX)
        ):
            conflict = convert.type_conflict(topic_type, actual)
            if conflict is not None:
                return conflict
        return None

    # ------------------------------------------------------------ receive / ack

    @metrics.stream("ReceiveMessage", s.ReceiveMessageResponse)
    async def ReceiveMessage(
        self, request: s.ReceiveMessageRequest, context
    ) -> AsyncIterator[s.ReceiveMessageResponse]:
        group = convert.topic_name(request.group)
        topic = convert.topic_name(request.message_queue.topic)
        broker_name = request.message_queue.broker.name
        bad_topic = _bad_topic(topic)
        bad_group = "" if bad_topic else _bad_pop_group(group, topic)
        if bad_topic or bad_group:
            code = Code.ILLEGAL_TOPIC if bad_topic else Code.ILLEGAL_CONSUMER_GROUP
            yield s.ReceiveMessageResponse(status=status(code, bad_topic or bad_group))
            return
        # Absent reads as 0, too small, as RocketMQ's proxy reads it; unless the
        # client lets the proxy renew (auto_renew), when the default applies.
        # (ferry's proxy does not renew: the time asked for, or the default.)
        invisible_ms = (
            convert.duration_ms(request.invisible_duration)
            if request.HasField("invisible_duration") or not request.auto_renew
            else DEFAULT_INVISIBLE_MS
        )
        bad_time = self._bad_invisible_time(
            invisible_ms, 0 if request.auto_renew else self.options.min_invisible_ms
        )
        if bad_time:
            yield s.ReceiveMessageResponse(status=status(Code.ILLEGAL_INVISIBLE_TIME, bad_time))
            return
        wait_ms = (
            convert.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else DEFAULT_LONG_POLL_MS
        )
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the client gives up
            wait_ms = max(0, min(wait_ms, int(remaining * 1000) - DEADLINE_MARGIN_MS))
        try:
            route = await self.routes.get(topic)
        except TopicNotFound as exc:
            yield s.ReceiveMessageResponse(status=convert.topic_not_found(exc.topic))
            return
        except NameServersDown as exc:
            yield s.ReceiveMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(exc)))
            return
        broker = route.broker(broker_name) if broker_name else None
        if broker is None:
            readable = [b for b in route.brokers if b.readable]
            if not readable:
                yield s.ReceiveMessageResponse(
                    status=status(Code.FORBIDDEN, f"topic {topic!r} has no readable queue now")
                )
                return
            broker = readable[next(self._round_robin) % len(readable)]
        # The queue the SDK names is not used: RocketMQ's proxy pops the whole broker it
        # names (its acting queue, id -1), FIFO topics too, whose queues each keep their
        # order on the broker. (A pin to the named queue of an ordered topic stood here;
        # it never applied, the name servers' gRPC routes carrying no orderTopicConf.)
        max_nums = max(1, min(request.batch_size or MAX_BATCH, MAX_BATCH))
        expression = request.filter_expression.expression
        kind = convert.expression_type(request.filter_expression.type)
        timeout_s = wait_ms / 1000 + CALL_TIMEOUT_S
        messages: list[v2.Message] | None = None
        try:
            if self._over_remoting(broker):
                messages = await self._pop_remoting(
                    broker, group, topic, max_nums, invisible_ms, wait_ms, expression, kind,
                    timeout_s,
                )  # fmt: skip
            if messages is None:
                pop = broker_pb2.PopMessageRequest(
                    consumer_group=group,
                    topic=topic,
                    max_msg_nums=max_nums,
                    invisible_ms=invisible_ms,
                    max_wait_ms=wait_ms,
                    sub_expression=expression,
                    expression_type=kind,
                )
                answer = await self.routes.stub(broker.addr).PopMessage(pop, timeout=timeout_s)
                messages = [convert.received_message(m, invisible_ms) for m in answer.messages]
                if self._over_remoting(broker):  # refused unsigned there, taken here
                    self.remoting_sends.unsigned_refused.add(broker.remoting_addr)  # type: ignore[union-attr]
                    log.warning(
                        "broker %s (%s) refuses unsigned RocketMQ-protocol pops (aclEnable): "
                        "calling it over ferry.v1; give the proxy --broker-access-key and "
                        "--broker-secret-key of an account with SUB to call it in RocketMQ's "
                        "protocol",
                        broker.broker_name, broker.remoting_addr,
                    )  # fmt: skip
        except (grpc.aio.AioRpcError, SendRefused) as exc:
            yield s.ReceiveMessageResponse(
                status=status(convert.error_code(exc), exc.details() or exc.code().name)
            )
            return
        if not messages:
            yield s.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield s.ReceiveMessageResponse(status=OK)
        for m in messages:
            yield s.ReceiveMessageResponse(message=m)
        # When the batch left the proxy: the SDKs' receive-latency metric needs it.
        yield s.ReceiveMessageResponse(
            delivery_timestamp=convert.timestamp(int(time.time() * 1000))
        )

    @metrics.unary("AckMessage", s.AckMessageResponse)
    async def AckMessage(self, request: s.AckMessageRequest, context) -> s.AckMessageResponse:
        group = convert.topic_name(request.group)
        topic = convert.topic_name(request.topic)
        bad = _bad_topic(topic) or _bad_group(group)
        if bad:
            return s.AckMessageResponse(status=status(Code.BAD_REQUEST, bad))
        if not request.entries:
            return s.AckMessageResponse(status=status(Code.BAD_REQUEST, "no entry to acknowledge"))
        results: list[s.AckMessageResultEntry | None] = [None] * len(request.entries)
        over_remoting = [
            (i, handle)
            for i, entry in enumerate(request.entries)
            if (handle := PopHandle.decode(entry.receipt_handle)) is not None
        ]
        if over_remoting:
            acked = await self._remoting_acks(group, topic, [h for _, h in over_remoting])
            for (i, _), outcome in zip(over_remoting, acked, strict=True):
                results[i] = _ack_entry(request.entries[i], outcome.code, outcome.message)
        by_broker: dict[str, list[int]] = {}
        names = [handle_broker(entry.receipt_handle) for entry in request.entries]
        addrs = await self._broker_addrs(
            [n for i, n in enumerate(names) if results[i] is None], topic
        )
        for i, entry in enumerate(request.entries):
            if results[i] is not None:
                continue
            addr = addrs.get(names[i])
            if addr is None:
                results[i] = _ack_entry(
                    entry, Code.INVALID_RECEIPT_HANDLE,
                    "not a receipt handle of a broker this proxy knows",
                )  # fmt: skip
                continue
            by_broker.setdefault(addr, []).append(i)
        for addr, indexes in by_broker.items():
            try:
                answer = await self.routes.stub(addr).AckMessage(
                    broker_pb2.AckMessageRequest(
                        consumer_group=group,
                        topic=topic,
                        receipt_handles=[request.entries[i].receipt_handle for i in indexes],
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as exc:
                for i in indexes:
                    results[i] = _ack_entry(
                        request.entries[i], convert.error_code(exc), exc.details() or ""
                    )
                continue
            for i, r in zip(indexes, answer.results, strict=False):
                if r.status == broker_pb2.OK:
                    results[i] = _ack_entry(request.entries[i], Code.OK, "OK")
                else:
                    results[i] = _ack_entry(
                        request.entries[i],
                        Code.INVALID_RECEIPT_HANDLE,
                        _refusal(request.entries[i].receipt_handle, r.reason),
                    )
        entries = [r for r in results if r is not None]
        codes = {e.status.code for e in entries}
        # As RocketMQ's proxy: the one code of every entry (or MULTIPLE_RESULTS), named.
        code = entries[0].status.code if len(codes) == 1 else Code.MULTIPLE_RESULTS
        top = status(code, v2.Code.Name(code))
        return s.AckMessageResponse(status=top, entries=entries)

    @metrics.unary("ChangeInvisibleDuration", s.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: s.ChangeInvisibleDurationRequest, context
    ) -> s.ChangeInvisibleDurationResponse:
        bad_time = self._bad_invisible_time(convert.duration_ms(request.invisible_duration), 0)
        if bad_time:
            return s.ChangeInvisibleDurationResponse(
                status=status(Code.ILLEGAL_INVISIBLE_TIME, bad_time)
            )
        handle = PopHandle.decode(request.receipt_handle)
        if handle is not None:
            invisible_ms = convert.duration_ms(request.invisible_duration)
            renewed, outcome = await self._on_remoting_handle(
                request,
                handle,
                lambda addr, group, topic: self.remoting_pops.change_invisible(  # type: ignore[union-attr]
                    addr, group, topic, handle, invisible_ms
                ),
            )
            if renewed is None:
                return s.ChangeInvisibleDurationResponse(status=outcome)
            return s.ChangeInvisibleDurationResponse(status=OK, receipt_handle=renewed.encode())
        answer, outcome = await self._on_handle_broker(
            request,
            lambda stub, group, topic: stub.ChangeInvisibleTime(
                broker_pb2.ChangeInvisibleTimeRequest(
                    consumer_group=group,
                    topic=topic,
                    receipt_handle=request.receipt_handle,
                    invisible_ms=convert.duration_ms(request.invisible_duration),
                ),
                timeout=CALL_TIMEOUT_S,
            ),
        )
        if answer is None:
            return s.ChangeInvisibleDurationResponse(status=outcome)
        return s.ChangeInvisibleDurationResponse(status=OK, receipt_handle=answer.receipt_handle)

    async def _learn_brokers(self, topic: str) -> None:
        with contextlib.suppress(TopicNotFound, NameServersDown):
            await self.routes.get(topic, refresh=True)

    @metrics.unary("ForwardMessageToDeadLetterQueue", s.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: s.ForwardMessageToDeadLetterQueueRequest, context
    ) -> s.ForwardMessageToDeadLetterQueueResponse:
        """A consumer gives up on a message (the SDKs' FIFO consumers do after
        their local retries): the broker that issued the handle moves it to
        %DLQ%<group> and resolves it."""
        handle = PopHandle.decode(request.receipt_handle)
        if handle is not None:
            done, outcome = await self._on_remoting_handle(
                request,
                handle,
                lambda addr, group, topic: self._remoting_dead_letter(
                    addr, group, topic, handle, request.message_id
                ),
            )
            if done is None:
                return s.ForwardMessageToDeadLetterQueueResponse(status=outcome)
            return s.ForwardMessageToDeadLetterQueueResponse(
                status=status(Code.OK, f"moved to {done}")
            )
        answer, outcome = await self._on_handle_broker(
            request,
            lambda stub, group, topic: stub.ForwardToDeadLetterQueue(
                broker_pb2.ForwardToDeadLetterQueueRequest(
                    consumer_group=group, topic=topic, receipt_handle=request.receipt_handle
                ),
                timeout=CALL_TIMEOUT_S,
            ),
        )
        if answer is None:
            return s.ForwardMessageToDeadLetterQueueResponse(status=outcome)
        return s.ForwardMessageToDeadLetterQueueResponse(
            status=status(Code.OK, f"moved to {answer.dlq_topic}")
        )

    def _bad_invisible_time(self, invisible_ms: int, min_ms: int) -> str:
        """RocketMQ's proxy's check of an invisible time, in its words ("" when it
        is fine): at least `min_ms`, at most the proxy's maximum."""
        if invisible_ms < min_ms:
            return f"the invisibleTime is too small. min is {min_ms}"
        if invisible_ms > self.options.max_invisible_ms:
            return f"the invisibleTime is too large. max is {self.options.max_invisible_ms}"
        return ""

    async def _on_handle_broker(
        self, request: Any, call: Callable[[Any, str, str], Awaitable[Any]]
    ) -> tuple[Any, v2.Status]:
        """One in-flight message's RPC on the broker its receipt handle names:
        (the broker's answer, OK) when it was OK for the message, else (None,
        why not: a bad name, an unknown handle, the broker's refusal)."""
        group = convert.topic_name(request.group)
        topic = convert.topic_name(request.topic)
        bad = _bad_topic(topic) or _bad_group(group)
        if bad:
            return None, status(Code.BAD_REQUEST, bad)
        addr = await self._handle_addr(request.receipt_handle, topic)
        if addr is None:
            return None, status(
                Code.INVALID_RECEIPT_HANDLE, "not a receipt handle of a broker this proxy knows"
            )
        try:
            answer = await call(self.routes.stub(addr), group, topic)
        except grpc.aio.AioRpcError as exc:
            return None, status(convert.error_code(exc), exc.details() or "")
        if answer.status != broker_pb2.OK:
            return None, status(
                Code.INVALID_RECEIPT_HANDLE, _refusal(request.receipt_handle, answer.reason)
            )
        return answer, OK

    async def _remoting_acks(
        self, group: str, topic: str, handles: list[PopHandle]
    ) -> list[v2.Status]:
        """Each (Apache-form) handle's ack, per broker in one request: a
        BATCH_ACK_MESSAGE for several (one ACK_MESSAGE for one, or for a handle
        whose offset does not fit a bit set), each handle checked by
        `_handle_target`."""
        outcomes: list[v2.Status | None] = [None] * len(handles)
        now_ms = time.time() * 1000
        by_addr: dict[str, list[int]] = {}
        for i, handle in enumerate(handles):
            addr, refused = await self._handle_target(handle, topic, now_ms)
            if addr is None:
                outcomes[i] = refused
                continue
            by_addr.setdefault(addr, []).append(i)

        async def ack(addr: str, indexes: list[int]) -> None:
            pops = self.remoting_pops
            assert pops is not None
            batch = [i for i in indexes if batchable(handles[i])]
            if len(batch) < 2:
                batch = []
            calls = [(i,) for i in indexes if i not in batch] + ([tuple(batch)] if batch else [])
            for group_of in calls:
                try:
                    if len(group_of) == 1:
                        await pops.ack(addr, group, topic, handles[group_of[0]])
                    else:
                        await pops.batch_ack(addr, group, topic, [handles[i] for i in group_of])
                    outcome = status(Code.OK, "OK")
                except SendRefused as exc:
                    outcome = _handle_refusal(exc)
                for i in group_of:
                    outcomes[i] = outcome

        await asyncio.gather(*(ack(addr, indexes) for addr, indexes in by_addr.items()))
        return [o if o is not None else status(Code.INTERNAL_SERVER_ERROR, "") for o in outcomes]

    async def _remoting_addr(self, broker_name: str, topic: str) -> str | None:
        """The RocketMQ-protocol address of a broker named in a handle, with the
        topic's route refreshed once at most if it is not known."""
        addr = self.routes.remoting_addr(broker_name)
        if addr is None:
            await self._learn_brokers(topic)
            addr = self.routes.remoting_addr(broker_name)
        return addr

    async def _remoting_dead_letter(
        self, addr: str, group: str, topic: str, handle: PopHandle, message_id: str
    ) -> str:
        await self.remoting_pops.to_dead_letters(  # type: ignore[union-attr]
            addr, group, topic, handle, message_id
        )
        return DLQ_TOPIC_PREFIX + group

    async def _on_remoting_handle(
        self, request: Any, handle: PopHandle, call: Callable[[str, str, str], Awaitable[Any]]
    ) -> tuple[Any, v2.Status]:
        """One in-flight message's request over RocketMQ's protocol, on the broker
        its (Apache-form) receipt handle names: (the result, OK), else (None, why
        not), the handle checked by `_handle_target`."""
        group = convert.topic_name(request.group)
        topic = convert.topic_name(request.topic)
        bad = _bad_topic(topic) or _bad_group(group)
        if bad:
            return None, status(Code.BAD_REQUEST, bad)
        addr, refused = await self._handle_target(handle, topic, time.time() * 1000)
        if addr is None:
            return None, refused
        try:
            return await call(addr, group, topic), OK
        except SendRefused as exc:
            return None, _handle_refusal(exc)

    async def _handle_target(
        self, handle: PopHandle, topic: str, now_ms: float
    ) -> tuple[str | None, v2.Status]:
        """(the RocketMQ-protocol address of the broker an Apache-form handle
        names, OK), or (None, why not). A handle past its invisible time is refused,
        as RocketMQ's proxy refuses it: the message may be on its way to another
        consumer."""
        if handle.visible_at_ms <= now_ms:
            return None, status(Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired")
        addr = await self._remoting_addr(handle.broker_name, topic)
        if addr is None or self.remoting_pops is None:
            return None, status(
                Code.INVALID_RECEIPT_HANDLE, "not a receipt handle of a broker this proxy knows"
            )
        return addr, OK

    async def _handle_addr(self, receipt_handle: str, topic: str) -> str | None:
        """The address of the broker a receipt handle names."""
        name = handle_broker(receipt_handle)
        return (await self._broker_addrs([name], topic)).get(name)

    async def _broker_addrs(self, names: list[str], topic: str) -> dict[str, str | None]:
        """The addresses of the brokers named ("" for no broker: None), with
        the topic's route refreshed once at most if one is not known."""
        addrs = {name: self.routes.broker_addr(name) for name in set(names) if name}
        if None in addrs.values():
            await self._learn_brokers(topic)
            addrs = {name: addr or self.routes.broker_addr(name) for name, addr in addrs.items()}
        return addrs

    # ------------------------------------------------------------ not served

    @metrics.unary("EndTransaction", s.EndTransactionResponse)
    async def EndTransaction(self, request, context):
        return s.EndTransactionResponse(status=await self.transactions.end(request))

    # The PullConsumer's offset API, recall and lite topics: answered at once,
    # with NOT_IMPLEMENTED in the response's status as the API reports errors.

    @metrics.stream("PullMessage", s.PullMessageResponse)
    async def PullMessage(self, request, context):
        yield s.PullMessageResponse(status=_not_served("PullMessage", _USE_RECEIVE))

    @metrics.unary("UpdateOffset", s.UpdateOffsetResponse)
    async def UpdateOffset(self, request, context):
        return s.UpdateOffsetResponse(status=_not_served("UpdateOffset", _USE_RECEIVE))

    @metrics.unary("GetOffset", s.GetOffsetResponse)
    async def GetOffset(self, request, context):
        return s.GetOffsetResponse(status=_not_served("GetOffset", _USE_RECEIVE))

    @metrics.unary("QueryOffset", s.QueryOffsetResponse)
    async def QueryOffset(self, request, context):
        return s.QueryOffsetResponse(status=_not_served("QueryOffset", _USE_RECEIVE))

    @metrics.unary("RecallMessage", s.RecallMessageResponse)
    async def RecallMessage(self, request, context):
        return s.RecallMessageResponse(
            status=_not_served("RecallMessage", "a timed message cannot be recalled")
        )

    @metrics.unary("SyncLiteSubscription", s.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request, context):
        return s.SyncLiteSubscriptionResponse(
            status=_not_served("SyncLiteSubscription", "ferry has no lite topics")
        )


_USE_RECEIVE = "consume with a SimpleConsumer or PushConsumer (ReceiveMessage)"


def _not_served(rpc: str, instead: str) -> v2.Status:
    return status(Code.NOT_IMPLEMENTED, f"{rpc} is not served by ferry's proxy; {instead}")


def _refusal(receipt_handle: str, reason: str) -> str:
    """A broker's refusal of a receipt handle, in RocketMQ's proxy's words when
    its invisible time has passed ("receipt handle is expired"), else the
    broker's reason."""
    try:
        expired = decode_handle(receipt_handle).invisible_until_ms < time.time() * 1000
    except PopFormatError:
        expired = False
    return f"receipt handle is expired ({reason})" if expired else reason


def _ack_entry(entry: s.AckMessageEntry, code: int, text: str) -> s.AckMessageResultEntry:
    return s.AckMessageResultEntry(
        message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status(code, text)
    )


def _handle_refusal(exc: SendRefused) -> v2.Status:
    """A broker's refusal of a request on an in-flight message: 208 (not in flight
    under that handle) is the SDK's INVALID_RECEIPT_HANDLE."""
    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
        return status(Code.INVALID_RECEIPT_HANDLE, exc.details())
    return status(convert.error_code(exc), exc.details())


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked per message
def _bad_topic(topic: str) -> str:
    """Why `topic` is not a topic name, or "": the brokers' rule (ferry.model), and
    RocketMQ's proxy's for system topics (`validate.system_topic`)."""
    try:
        check_topic(topic)
    except InvalidArgument as exc:
        return f"bad topic name: {exc.reason}"
    return validate.system_topic(topic)


def _bad_group(group: str) -> str:
    """Why `group` is not a consumer group name, or "": the brokers' rule
    (ferry.model), for acks and invisibility changes."""
    try:
        check_name(group, "consumer group")
    except InvalidArgument as exc:
        return f"bad consumer group name: {exc.reason}"
    return ""


def _bad_pop_group(group: str, topic: str) -> str:
    """Why `group` cannot pop `topic`, or "": the brokers' pop rule
    (ferry.model), which its retry and dead-letter topic names bound."""
    try:
        check_pop_group(group, topic, "consumer group")
    except InvalidArgument as exc:
        return f"bad consumer group name: {exc.reason}"
    return ""


def _permission(broker: BrokerQueues, queue_id: int) -> int:
    read = broker.readable and queue_id < broker.read_queue_nums
    write = broker.writable and queue_id < broker.write_queue_nums
    if read and write:
        return v2.READ_WRITE
    return v2.READ if read else v2.WRITE if write else v2.NONE


__all__ = ["MessagingServicer", "ProxyOptions"]
