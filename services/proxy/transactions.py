"""Transactional messages for the RocketMQ 5 SDKs, over ferry.v1's `Transactions`.

A v5 transactional send (message_type TRANSACTION) goes to a broker as a
prepared message: TRAN_MSG=true and PGROUP=<topic>, the topic standing for the
producer group as in RocketMQ's proxy (SendMessageActivity: v5 producers have
no group). The transaction id handed back names where the half message lies
(`transaction_handle`: broker name, commit offset, queue offset), so
EndTransaction needs no state here: any proxy, or this one after a restart,
ends it at the broker that now serves that name (the new master after a
failover, its log holding the same offsets).

Check-backs: a producer's Telemetry settings name the topics it publishes.
For each such topic this proxy watches `WatchTransactionChecks` on every
broker of the topic's route (the route re-read every `WATCH_REFRESH_S`, so a
failover's new master is watched too), and hands each check to one producer
stream of the topic, round robin, as RecoverOrphanedTransactionCommand. With
no producer of the topic connected here, a check is dropped: the broker
checks again at its next interval (transactionCheckInterval).

Ownership: everything runs on the proxy's event loop; `register` and
`unregister` are called by Telemetry streams, the watch tasks by this class.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field

import grpc

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from ferry.model import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED
from ferry.v1 import broker_pb2, transactions_pb2
from services.proxy import convert
from services.proxy.convert import OK, Code, status
from services.proxy.routes import NameServersDown, RouteSource, TopicNotFound

log = logging.getLogger(__name__)

WATCH_REFRESH_S = 5.0
CALL_TIMEOUT_S = 10.0

RESOLUTIONS = {
    v2.COMMIT: transactions_pb2.COMMIT,
    v2.ROLLBACK: transactions_pb2.ROLLBACK,
}


class BadHandle(ValueError):
    """A transaction id this proxy did not hand out."""


def transaction_handle(broker_name: str, commit_offset: int, queue_offset: int) -> str:
    """The transaction id an SDK gets for a half message."""
    return f"{broker_name}:{commit_offset}:{queue_offset}"


def parse_handle(handle: str) -> tuple[str, int, int]:
    """(broker name, commit offset, queue offset) of a `transaction_handle`.

    Raises:
        BadHandle: not one (a broker name may hold ':' itself: split from the right).
    """
    name, sep, rest = handle.rpartition(":")
    name, sep2, commit = name.rpartition(":")
    if not (sep and sep2 and name and commit.isdigit() and rest.isdigit()):
        raise BadHandle(f"transaction_id {handle[:80]!r} was not handed out by a ferry proxy")
    return name, int(commit), int(rest)


def prepared(request: broker_pb2.SendMessageRequest, topic: str) -> None:
    """Mark a send as a transaction's half message, its producer group the topic."""
    request.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    request.properties[PROPERTY_PRODUCER_GROUP] = topic


@dataclass
class _Producers:
    """The Telemetry streams publishing one topic, and the watch of its brokers."""

    outboxes: dict[int, asyncio.Queue] = field(default_factory=dict)  # by id(outbox)
    turn: itertools.count = field(default_factory=itertools.count)
    watch: asyncio.Task | None = None


class ProxyTransactions:
    def __init__(self, routes: RouteSource, client_id: str) -> None:
        self.routes = routes
        self.client_id = client_id  # how brokers name this proxy in their logs
        self._topics: dict[str, _Producers] = {}
        self.checks_forwarded = 0
        self.checks_dropped = 0

    # ------------------------------------------------------------ end

    async def end(self, request: s.EndTransactionRequest) -> v2.Status:
        """As RocketMQ's proxy (EndTransactionActivity): a resolution other than
        COMMIT or ROLLBACK leaves the transaction undecided (the broker checks
        back), and is answered OK."""
        topic = convert.topic_name(request.topic)
        if not request.transaction_id:
            return status(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        resolution = RESOLUTIONS.get(request.resolution, transactions_pb2.UNKNOWN)
        try:
            broker_name, commit_offset, queue_offset = parse_handle(request.transaction_id)
        except BadHandle as exc:
            return status(Code.INVALID_TRANSACTION_ID, str(exc))
        addr = await self._broker_addr(topic, broker_name)
        if addr is None:
            return status(
                Code.INTERNAL_SERVER_ERROR,
                f"broker {broker_name} of transaction {request.transaction_id} has no master "
                "in the route now; end it again later (the broker checks back meanwhile)",
            )
        try:
            await self.routes.transactions(addr).EndTransaction(
                transactions_pb2.EndTransactionRequest(
                    producer_group=topic,
                    commit_offset=commit_offset,
                    queue_offset=queue_offset,
                    msg_id=request.message_id,
                    transaction_id=request.transaction_id,
                    resolution=resolution,
                    from_check=request.source == v2.SOURCE_SERVER_CHECK,
                ),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            code = convert.error_code(exc)
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                code = Code.BAD_REQUEST
            return status(code, f"{broker_name}: {exc.details() or exc.code().name}")
        return OK

    async def _broker_addr(self, topic: str, broker_name: str) -> str | None:
        addr = self.routes.broker_addr(broker_name)
        if addr is not None:
            return addr
        try:
            route = await self.routes.get(topic, refresh=True)
        except (TopicNotFound, NameServersDown):
            return None
        broker = route.broker(broker_name)
        return broker.addr if broker is not None else None

    # ------------------------------------------------------------ check-backs

    def register(self, topics: list[str], outbox: asyncio.Queue) -> None:
        """A producer's Telemetry stream, publishing `topics`: it may be asked
        to check their half messages."""
        for topic in topics:
            producers = self._topics.get(topic)
            if producers is None:
                producers = self._topics[topic] = _Producers()
            producers.outboxes[id(outbox)] = outbox
            if producers.watch is None or producers.watch.done():
                producers.watch = asyncio.get_running_loop().create_task(self._watch_topic(topic))

    def unregister(self, outbox: asyncio.Queue) -> None:
        """A Telemetry stream ended: it checks nothing more; a topic without
        producers here is no longer watched."""
        for topic in list(self._topics):
            producers = self._topics[topic]
            producers.outboxes.pop(id(outbox), None)
            if not producers.outboxes:
                if producers.watch is not None:
                    producers.watch.cancel()
                del self._topics[topic]

    async def close(self) -> None:
        tasks = [p.watch for p in self._topics.values() if p.watch is not None]
        self._topics.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch_topic(self, topic: str) -> None:
        """Watch every broker of the topic's route, re-reading it every WATCH_REFRESH_S."""
        running: dict[str, asyncio.Task] = {}
        try:
            while True:
                try:
                    route = await self.routes.get(topic, refresh=True)
                except (TopicNotFound, NameServersDown):
                    route = None
                if route is not None:
                    for broker in route.brokers:
                        task = running.get(broker.addr)
                        if task is None or task.done():
                            running[broker.addr] = asyncio.create_task(
                                self._watch_broker(topic, broker.broker_name, broker.addr)
                            )
                await asyncio.sleep(WATCH_REFRESH_S)
        finally:
            for task in running.values():
                task.cancel()

    async def _watch_broker(self, topic: str, broker_name: str, addr: str) -> None:
        call = self.routes.transactions(addr).WatchTransactionChecks(
            transactions_pb2.WatchTransactionChecksRequest(
                producer_groups=[topic], client_id=self.client_id
            )
        )
        try:
            async for check in call:
                self._deliver(topic, broker_name, check)
        except grpc.aio.AioRpcError as exc:
            log.debug("transaction checks from %s (%s) ended: %s", broker_name, addr, exc.code())
        finally:
            call.cancel()

    def _deliver(self, topic: str, broker_name: str, check: transactions_pb2.TransactionCheck):
        producers = self._topics.get(topic)
        if producers is None or not producers.outboxes:
            self.checks_dropped += 1
            return
        outboxes = list(producers.outboxes.values())
        outbox = outboxes[next(producers.turn) % len(outboxes)]
        message = convert.received_message(check.message, 0)
        message.system_properties.message_type = v2.TRANSACTION
        outbox.put_nowait(
            s.TelemetryCommand(
                status=OK,
                recover_orphaned_transaction_command=s.RecoverOrphanedTransactionCommand(
                    message=message,
                    transaction_id=transaction_handle(
                        broker_name, check.commit_offset, check.queue_offset
                    ),
                ),
            )
        )
        self.checks_forwarded += 1
