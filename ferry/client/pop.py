"""A blocking pop consumer (RocketMQ 5's SimpleConsumer): consumers of one group
share the group's position on the brokers, so several processes split a topic's
messages without assigning queues to each other.

`PopConsumer` owns only a route cache and one client per broker (`BrokerRoutes` of
`ferry.client.broker`) and a round-robin start index; every other piece of state
— which message is in flight, for whom, until when, how often it was delivered —
lives on the brokers and travels in the receipt handle. It never retries an ack
or re-times a message by itself: what it could not acknowledge is delivered again
later (`delivery_attempt` + 1), so a handler must tolerate a second delivery.

Pops go to each broker's master (a slave keeps no pop state). `receive` tries
the masters of the route in turn, starting one further each call; only the last
one tried long-polls, so a message on any broker is found within one call.
A broker that does not answer (`UNAVAILABLE`/deadline) makes it refresh the
route and go on with the next.

The types it returns are plain (`Received`, `AckOutcome`), never protobuf.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from ferry.client.broker import RETRIABLE_CODES, BrokerRoutes, NoRoute
from ferry.client.namesrv import NamesrvClient
from ferry.client.routes import TopicRoute
from ferry.model import PROPERTY_SHARDING_KEY
from ferry.runtime.errors import InvalidArgument
from ferry.v1 import broker_pb2

log = logging.getLogger(__name__)

_ACK_STATUS = {v: k for k, v in broker_pb2.AckStatus.items()}
MAX_MSGS = 32
INVISIBLE_MIN_S = 1.0
INVISIBLE_MAX_S = 12 * 3600.0


class NoMasterToPop(NoRoute):
    """The topic is routed, but no readable broker of it has its master alive
    (pop state lives on masters: slaves cannot serve a pop)."""

    def __init__(self, topic: str) -> None:
        Exception.__init__(
            self,
            f"topic {topic!r} has no master to pop from: every broker carrying it is a "
            "slave whose master is gone, or not readable; see `ferry route` and `ferry cluster`",
        )
        self.topic = topic


class StaleHandle(Exception):
    """A receipt handle the broker no longer honours: the message was
    acknowledged, redelivered (its invisible time ran out) or re-timed under a
    newer handle (STALE), or the handle belongs to another group, topic or
    broker (FOREIGN)."""

    def __init__(self, receipt_handle: str, status: str, reason: str) -> None:
        super().__init__(
            f"receipt handle {status.lower()}: {reason or 'not in flight under this handle'}"
        )
        self.receipt_handle = receipt_handle
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Received:
    """One popped message. A retry is presented with its original topic and
    msg_id; `delivery_attempt` is 1 on the first delivery."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    tags: str
    keys: str
    properties: dict[str, str]
    message_group: str  # the FIFO key (`__SHARDINGKEY`), "" if none
    born_timestamp: int  # epoch ms
    store_timestamp: int  # epoch ms
    delivery_attempt: int
    receipt_handle: str
    invisible_until_ms: int  # epoch ms the group may see it again
    broker_name: str
    broker_addr: str


@dataclass(frozen=True)
class AckOutcome:
    """What became of one handle: `status` "OK", "STALE", "FOREIGN", or
    "UNREACHABLE" when its broker did not answer (then `reason` says why;
    "UNKNOWN" if a broker's answer left the handle out)."""

    receipt_handle: str
    ok: bool
    status: str
    reason: str


def _invisible_ms(invisible_s: float) -> int:
    if not INVISIBLE_MIN_S <= invisible_s <= INVISIBLE_MAX_S:
        raise InvalidArgument(
            "invisible_s",
            f"{invisible_s:g} is outside {INVISIBLE_MIN_S:g}..{INVISIBLE_MAX_S:g} seconds",
        )
    return round(invisible_s * 1000)


def _received(m: broker_pb2.MessageExt, broker_name: str, broker_addr: str) -> Received:
    properties = dict(m.properties)
    return Received(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        msg_id=m.msg_id,
        body=m.body,
        tags=m.tags,
        keys=m.keys,
        properties=properties,
        message_group=properties.get(PROPERTY_SHARDING_KEY, ""),
        born_timestamp=m.born_timestamp,
        store_timestamp=m.store_timestamp,
        delivery_attempt=m.delivery_attempt,
        receipt_handle=m.receipt_handle,
        invisible_until_ms=m.invisible_until_ms,
        broker_name=broker_name,
        broker_addr=broker_addr,
    )


class PopConsumer:
    """Consume `topic` as `group` by pop: each message goes to one consumer of
    the group and stays invisible to the others for `invisible_s` (1 s .. 12 h);
    acknowledge it within that time or it is delivered again. A group new to a
    queue starts at the queue's oldest message; otherwise at what the group has
    acknowledged."""

    def __init__(
        self,
        namesrv: NamesrvClient,
        group: str,
        topic: str,
        sub_expression: str = "",
        invisible_s: float = 30.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.group = group
        self.topic = topic
        self.sub_expression = sub_expression
        self.invisible_ms = _invisible_ms(invisible_s)
        self._routes = BrokerRoutes(namesrv, timeout_s)
        self._next = 0

    def close(self) -> None:
        self._routes.close()

    def __enter__(self) -> PopConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive(
        self, max_msgs: int = MAX_MSGS, wait_s: float = 5.0, invisible_s: float | None = None
    ) -> list[Received]:
        """Up to `max_msgs` (1..32) messages from the first broker that has any,
        or [] when none had any within `wait_s` (the last broker tried waits).

        Raises:
            NoRoute: the topic is not routed (`NoMasterToPop`: only slaves are).
            grpc.RpcError: a broker refused the pop, or no broker answered.
        """
        if not 1 <= max_msgs <= MAX_MSGS:
            raise InvalidArgument("max_msgs", f"{max_msgs} is outside 1..{MAX_MSGS}")
        if wait_s < 0:
            raise InvalidArgument("wait_s", f"{wait_s:g} is negative")
        invisible_ms = self.invisible_ms if invisible_s is None else _invisible_ms(invisible_s)
        wait_ms = round(wait_s * 1000)
        brokers = self._masters(self._routes.get(self.topic))
        start = self._next
        self._next = (start + 1) % len(brokers)
        answered: list[tuple[str, str]] = []
        failure: grpc.RpcError | None = None
        waited = False
        for i in range(len(brokers)):
            name, addr = brokers[(start + i) % len(brokers)]
            last = i == len(brokers) - 1
            try:
                got = self._pop(name, addr, max_msgs, invisible_ms, wait_ms if last else 0)
            except grpc.RpcError as exc:
                if exc.code() not in RETRIABLE_CODES:
                    raise
                log.info(
                    "pop failed, trying the next broker: broker=%s addr=%s code=%s",
                    name,
                    addr,
                    exc.code().name,
                )
                failure = exc
                self._routes.get(self.topic, refresh=True)
                continue
            if got:
                self._next = (start + i + 1) % len(brokers)
                return got
            answered.append((name, addr))
            waited = last
        if not waited and answered and wait_ms:
            # The broker meant to long-poll did not answer: one that did waits instead.
            name, addr = answered[-1]
            try:
                return self._pop(name, addr, max_msgs, invisible_ms, wait_ms)
            except grpc.RpcError as exc:
                if exc.code() not in RETRIABLE_CODES:
                    raise
                return []
        if failure is not None and not answered:
            raise failure
        return []

    def ack(self, msgs: Received | Iterable[Received]) -> list[AckOutcome]:
        """Acknowledge messages: one AckMessage per broker; outcomes in the order
        given. A handle that is no longer in flight is answered STALE (the
        message was redelivered or re-timed meanwhile), not raised.

        Raises:
            grpc.RpcError: a broker refused the request (a handle that does not
                parse); a broker that does not answer makes its outcomes UNREACHABLE.
        """
        items = [msgs] if isinstance(msgs, Received) else list(msgs)
        by_broker: dict[str, list[Received]] = {}
        for m in items:
            by_broker.setdefault(m.broker_addr, []).append(m)
        outcomes: dict[str, AckOutcome] = {}
        for addr, group in by_broker.items():
            handles = [m.receipt_handle for m in group]
            try:
                response = self._routes.client(addr).ack(self.group, self.topic, handles)
            except grpc.RpcError as exc:
                if exc.code() not in RETRIABLE_CODES:
                    raise
                reason = f"{addr}: {exc.code().name}: {exc.details()}"
                for h in handles:
                    outcomes[h] = AckOutcome(h, False, "UNREACHABLE", reason)
                continue
            for r in response.results:
                status = _ACK_STATUS.get(r.status, str(r.status))
                outcomes[r.receipt_handle] = AckOutcome(
                    r.receipt_handle, r.status == broker_pb2.OK, status, r.reason
                )
        return [
            outcomes.get(m.receipt_handle)
            or AckOutcome(m.receipt_handle, False, "UNKNOWN", "the broker did not answer for it")
            for m in items
        ]

    def change_invisible_time(self, msg: Received, invisible_s: float) -> Received:
        """Keep `msg` invisible for `invisible_s` from now (more time to process
        it, or less to hand it back sooner); returns it with its new handle —
        the old one is spent.

        Raises:
            StaleHandle: the handle is no longer in flight, or not this group's.
        """
        response = self._routes.client(msg.broker_addr).change_invisible_time(
            self.group, self.topic, msg.receipt_handle, _invisible_ms(invisible_s)
        )
        if response.status != broker_pb2.OK:
            status = _ACK_STATUS.get(response.status, str(response.status))
            raise StaleHandle(msg.receipt_handle, status, response.reason)
        return dataclasses.replace(
            msg,
            receipt_handle=response.receipt_handle,
            invisible_until_ms=response.invisible_until_ms,
        )

    def _masters(self, route: TopicRoute) -> list[tuple[str, str]]:
        """(broker name, master address) of each readable broker, sorted by name."""
        brokers = sorted(
            (q.broker_name, route.master(q.broker_name)) for q in route.queues if q.readable
        )
        found = [(name, addr) for name, addr in brokers if addr]
        if not found:
            if any(route.addrs.get(name) for name, _ in brokers):
                raise NoMasterToPop(self.topic)
            raise NoRoute(self.topic)
        return found

    def _pop(
        self, name: str, addr: str, max_msgs: int, invisible_ms: int, wait_ms: int
    ) -> list[Received]:
        response = self._routes.client(addr).pop(
            self.group, self.topic, max_msgs, invisible_ms, wait_ms, self.sub_expression
        )
        if response.status != broker_pb2.POP_FOUND:
            return []
        return [_received(m, name, addr) for m in response.messages]
