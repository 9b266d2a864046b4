"""Transactional messages for the RocketMQ 5 SDKs, over ferry.v1's `Transactions`.

A v5 transactional send (message_type TRANSACTION) goes to a broker as a
prepared message: TRAN_MSG=true and PGROUP=<topic>, the topic standing for the
producer group as in RocketMQ's proxy (SendMessageActivity: v5 producers have
no group). Its transaction id is its message id (UNIQ_KEY), as RocketMQ's
broker answers it and its proxy hands it on: the SDK ends the transaction with
that id, and the committed message carries it as `__transactionId__`.

Ending: `EndTransaction` names the topic and the transaction id. This proxy
remembers, for each half it sent (and each check it handed on), the broker
name that holds it and its commit and queue offsets (`_Sent`, bounded by
`REMEMBERED_MAX`), and ends it at the master now serving that name (after a
failover, the new master, whose log holds the same offsets): in RocketMQ's
protocol where the route gives the broker's address in it (END_TRANSACTION, 37,
answered, not oneway as Java's producers send it: the proxy tells the SDK what
happened), else over ferry.v1's Transactions. When it does not
know the transaction (another proxy sent the half, this one restarted or
forgot it), or that broker has no master now or does not know the half, it
asks each master of the topic's current route to end the pending transaction
of that message id (`EndTransactionRequest` without a commit offset).

Check-backs: a producer's Telemetry settings name the topics it publishes.
For each such topic this proxy watches `WatchTransactionChecks` on every
broker of the topic's route (the route re-read every `WATCH_REFRESH_S`, so a
failover's new master is watched too), and hands each check to one producer
stream of the topic, round robin, as RecoverOrphanedTransactionCommand with
the message id as its transaction id. With no producer of the topic connected
here, a check is dropped: the broker checks again at its next interval
(transactionCheckInterval).

Ownership: everything runs on the proxy's event loop; `register` and
`unregister` are called by Telemetry streams, `sent` by SendMessage, the watch
tasks by this class.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import grpc

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from ferry.model import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED
from ferry.remoting import codes
from ferry.v1 import broker_pb2, transactions_pb2
from services.proxy import convert
from services.proxy.convert import OK, Code, status
from services.proxy.remoting_sends import RemotingSends, SendRefused
from services.proxy.routes import NameServersDown, RouteSource, TopicNotFound

log = logging.getLogger(__name__)

WATCH_REFRESH_S = 5.0
CALL_TIMEOUT_S = 10.0
REMEMBERED_MAX = 100_000  # halves whose broker this proxy remembers (oldest forgotten first)

RESOLUTIONS = {
    v2.COMMIT: transactions_pb2.COMMIT,
    v2.ROLLBACK: transactions_pb2.ROLLBACK,
}


def prepared(request: broker_pb2.SendMessageRequest, topic: str) -> None:
    """Mark a send as a transaction's half message, its producer group the topic."""
    request.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
    request.properties[PROPERTY_PRODUCER_GROUP] = topic


@dataclass(frozen=True, slots=True)
class _Sent:
    """Where this proxy sent a half (or was last asked about it)."""

    broker_name: str
    commit_offset: int
    queue_offset: int = -1  # the half's; -1: not known, ended over ferry.v1


# END_TRANSACTION's commitOrRollback (MessageSysFlag's transaction types).
_SYS_FLAGS = {
    transactions_pb2.COMMIT: "8",
    transactions_pb2.ROLLBACK: "12",
    transactions_pb2.UNKNOWN: "0",
}


class _NotHere(Exception):
    """A broker does not know the transaction (NOT_FOUND): ask the others."""


class _Refused(Exception):
    """A broker's refusal other than NOT_FOUND, as the SDK gets it."""

    def __init__(self, broker_name: str, exc: grpc.aio.AioRpcError | SendRefused) -> None:
        super().__init__(f"{broker_name}: {exc.details() or exc.code().name}")
        code = convert.error_code(exc)
        self.code = Code.BAD_REQUEST if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else code


@dataclass
class _Producers:
    """The Telemetry streams publishing one topic, and the watch of its brokers."""

    outboxes: dict[int, asyncio.Queue] = field(default_factory=dict)  # by id(outbox)
    turn: itertools.count = field(default_factory=itertools.count)
    watch: asyncio.Task | None = None


class ProxyTransactions:
    def __init__(
        self, routes: RouteSource, client_id: str, remoting: RemotingSends | None = None
    ) -> None:
        self.routes = routes
        self.client_id = client_id  # how brokers name this proxy in their logs
        self.remoting = remoting  # None: every end over ferry.v1
        self._topics: dict[str, _Producers] = {}
        self._sent: OrderedDict[tuple[str, str], _Sent] = OrderedDict()  # (topic, id) ->
        self.checks_forwarded = 0
        self.checks_dropped = 0

    # ------------------------------------------------------------ end

    def sent(
        self,
        topic: str,
        transaction_id: str,
        broker_name: str,
        commit_offset: int,
        queue_offset: int = -1,
    ) -> None:
        """Remember where the half of `transaction_id` lies, for its EndTransaction."""
        key = (topic, transaction_id)
        self._sent[key] = _Sent(broker_name, commit_offset, queue_offset)
        self._sent.move_to_end(key)
        while len(self._sent) > REMEMBERED_MAX:
            self._sent.popitem(last=False)

    async def end(self, request: s.EndTransactionRequest) -> v2.Status:
        """As RocketMQ's proxy (EndTransactionActivity): a resolution other than
        COMMIT or ROLLBACK leaves the transaction undecided (the broker checks
        back), and is answered OK."""
        topic = convert.topic_name(request.topic)
        transaction_id = request.transaction_id
        if not transaction_id:
            return status(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        end = transactions_pb2.EndTransactionRequest(
            producer_group=topic,
            msg_id=transaction_id,
            transaction_id=transaction_id,
            resolution=RESOLUTIONS.get(request.resolution, transactions_pb2.UNKNOWN),
            from_check=request.source == v2.SOURCE_SERVER_CHECK,
        )
        key = (topic, transaction_id)
        tried = ""
        try:
            remembered = self._sent.get(key)
            if remembered is not None and await self._end_remoting(topic, remembered, end):
                return self._ended(key, end.resolution)
            if remembered is not None:
                addr = await self._broker_addr(topic, remembered.broker_name)
                if addr is not None:
                    tried = addr
                    mine = transactions_pb2.EndTransactionRequest()
                    mine.CopyFrom(end)
                    mine.commit_offset = remembered.commit_offset
                    try:
                        await self._end_at(remembered.broker_name, addr, mine)
                        return self._ended(key, end.resolution)
                    except _NotHere:
                        pass
            found = await self._end_anywhere(topic, end, tried)
        except _Refused as exc:
            return status(exc.code, str(exc))
        if not found:
            return status(
                Code.INVALID_TRANSACTION_ID,
                f"no master of topic {topic!r} holds a pending transaction {transaction_id!r}; "
                "it was ended before, or its broker has no master now (end it again later: "
                "the broker checks back meanwhile)",
            )
        return self._ended(key, end.resolution)

    def _ended(self, key: tuple[str, str], resolution: int) -> v2.Status:
        if resolution != transactions_pb2.UNKNOWN:
            self._sent.pop(key, None)
        return OK

    async def _end_anywhere(
        self, topic: str, end: transactions_pb2.EndTransactionRequest, tried: str
    ) -> bool:
        """End the pending transaction of `end.msg_id` at whichever master of the
        topic's current route (but `tried`) has it; False when none does.

        Raises:
            _Refused: none had it, and one of them refused (say, unreachable):
                that refusal, as it may be the one that holds it.
        """
        try:
            route = await self.routes.get(topic, refresh=True)
        except (TopicNotFound, NameServersDown):
            return False
        refused: _Refused | None = None
        for broker in route.brokers:
            if broker.addr == tried:
                continue
            try:
                await self._end_at(broker.broker_name, broker.addr, end)
            except _NotHere:
                continue
            except _Refused as exc:
                refused = exc
                continue
            return True
        if refused is not None:
            raise refused
        return False

    async def _end_remoting(
        self, topic: str, sent: _Sent, end: transactions_pb2.EndTransactionRequest
    ) -> bool:
        """End a half this proxy sent with END_TRANSACTION (37) on the RocketMQ-protocol
        address of its broker: True when the broker ended it; False when that is not
        possible here (no address, the queue offset not known) or the broker does not
        know the half (ended before, or not in its log: the caller asks over ferry.v1).
        Raises _Refused for another refusal."""
        if self.remoting is None or sent.queue_offset < 0:
            return False
        addr = self.routes.remoting_addr(sent.broker_name)
        if addr is None:
            try:
                await self.routes.get(topic, refresh=True)
            except (TopicNotFound, NameServersDown):
                return False
            addr = self.routes.remoting_addr(sent.broker_name)
        if addr is None or addr in self.remoting.unsigned_refused:
            return False
        ext = {
            "producerGroup": topic,  # a v5 producer's group is its topic
            "tranStateTableOffset": str(sent.queue_offset),
            "commitLogOffset": str(sent.commit_offset),
            "commitOrRollback": _SYS_FLAGS[end.resolution],
            "fromTransactionCheck": "true" if end.from_check else "false",
            "msgId": end.msg_id,
            "transactionId": end.transaction_id,
        }
        try:
            answer = await self.remoting.call(
                addr, codes.END_TRANSACTION, ext, timeout_s=CALL_TIMEOUT_S, what="transaction end"
            )
        except SendRefused as exc:
            raise _Refused(sent.broker_name, exc) from None
        if answer.code == codes.SUCCESS:
            return True
        if answer.code == codes.SYSTEM_ERROR:  # Apache: "Find prepared transaction message failed"
            return False
        refused = SendRefused(
            grpc.StatusCode.FAILED_PRECONDITION
            if answer.code != codes.NO_PERMISSION
            else grpc.StatusCode.PERMISSION_DENIED,
            answer.remark or f"refused with code {answer.code}",
        )
        raise _Refused(sent.broker_name, refused)

    async def _end_at(
        self, broker_name: str, addr: str, end: transactions_pb2.EndTransactionRequest
    ) -> None:
        """Raises _NotHere when the broker has no such transaction, _Refused
        for any other refusal."""
        try:
            await self.routes.transactions(addr).EndTransaction(end, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise _NotHere() from None
            raise _Refused(broker_name, exc) from None

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
        transaction_id = check.transaction_id or check.msg_id
        self.sent(topic, transaction_id, broker_name, check.commit_offset, check.queue_offset)
        outbox.put_nowait(
            s.TelemetryCommand(
                status=OK,
                recover_orphaned_transaction_command=s.RecoverOrphanedTransactionCommand(
                    message=message,
                    transaction_id=transaction_id,
                ),
            )
        )
        self.checks_forwarded += 1
