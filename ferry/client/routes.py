"""Topic routes as every ferry.v1 client reads them, and the one cache that keeps them.

Owns: `TopicRoute` (one topic's route, parsed once from the name servers'
`TopicRouteData`: each broker group's queues and perm, every broker id's
address, whether the topic is ordered and its message type), `BrokerQueues`,
`QueueRef`, `group_broker` (the broker a message group goes to) and
`RouteCache` (routes by topic, fresh for `ttl_s` after they were fetched, and
the master address last seen for each broker name).

The blocking clients (`ferry.client.broker.BrokerRoutes`, used by `Producer`,
`Consumer`, `PopConsumer` and `PipelinedProducer`) and the RocketMQ 5 proxy
(`services.proxy.routes`, on grpc.aio) fetch routes their own way and keep them
here, so both read a route by the same rules: a queue is writable on a group
whose master is routed, a message group hashes over the same names, a route
goes stale after the same 30 s (RocketMQ's clients poll every 30 s).

Must never: make a call, open a channel or log: fetching is the caller's. The
clock is injected (`ferry.runtime.clock`). `RouteCache` only reads and sets
dictionary entries (each atomic under the GIL), so a blocking client may read
it on one thread while a lookup on another stores.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ferry.model import (
    DEFAULT_MESSAGE_TYPE,
    MASTER_ID,
    MESSAGE_TYPE_ATTRIBUTE,
    PERM_READ,
    PERM_WRITE,
    order_brokers,
)
from ferry.runtime.clock import Clock, SystemClock
from ferry.v1 import common_pb2

ROUTE_TTL_S = 30.0


@dataclass(frozen=True)
class QueueRef:
    broker_name: str
    queue_id: int


@dataclass(frozen=True)
class BrokerQueues:
    """One broker group's queues of a topic. `addr` is its master's address,
    "" when the route has no master for the group (only slaves are left)."""

    broker_name: str
    addr: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    remoting_addr: str = ""  # the master's RocketMQ-protocol address, "" if unknown

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ) and self.read_queue_nums > 0

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE) and self.write_queue_nums > 0


@dataclass(frozen=True)
class TopicRoute:
    """One topic's route. Never changes once made (a fresh route replaces it).

    Args:
        topic: the topic.
        queues: every broker group carrying the topic, by broker name.
        addrs: broker name -> broker id -> address, slaves included.
        ordered: the topic is ordered on a routed master (RocketMQ's orderTopicConf).
        message_type: the topic's message.type (RocketMQ 5; NORMAL when it has none),
            as its first master by name has it: one type per topic, as RocketMQ's
            proxy reads it from one broker's topic config (create a topic with the same
            type on every master).
    """

    topic: str
    queues: tuple[BrokerQueues, ...]
    addrs: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    ordered: bool = False
    message_type: str = DEFAULT_MESSAGE_TYPE

    @classmethod
    def from_data(cls, topic: str, data: common_pb2.TopicRouteData) -> TopicRoute:
        addrs = {b.broker_name: dict(b.broker_addrs) for b in data.broker_datas}
        masters = {name: ids[MASTER_ID] for name, ids in addrs.items() if MASTER_ID in ids}
        remoting = {
            b.broker_name: b.remoting_addrs[MASTER_ID]
            for b in data.broker_datas
            if MASTER_ID in b.remoting_addrs and b.broker_name in masters
        }
        queues = tuple(
            sorted(
                (
                    BrokerQueues(q.broker_name, masters.get(q.broker_name, ""), q.read_queue_nums,
                                 q.write_queue_nums, q.perm, remoting.get(q.broker_name, ""))
                    for q in data.queue_datas
                ),
                key=lambda b: b.broker_name,
            )
        )  # fmt: skip
        types = {
            q.broker_name: q.attributes.get(MESSAGE_TYPE_ATTRIBUTE, DEFAULT_MESSAGE_TYPE)
            for q in data.queue_datas
            if q.broker_name in masters
        }
        return cls(
            topic,
            queues,
            addrs,
            ordered=not order_brokers(data.order_topic_conf).isdisjoint(masters),
            message_type=types[min(types)] if types else DEFAULT_MESSAGE_TYPE,
        )

    @cached_property
    def brokers(self) -> tuple[BrokerQueues, ...]:
        """The groups whose master is routed, by broker name."""
        return tuple(q for q in self.queues if q.addr)

    def broker(self, name: str) -> BrokerQueues | None:
        """The group `name` if its master is routed."""
        return next((b for b in self.brokers if b.broker_name == name), None)

    def master(self, broker_name: str) -> str | None:
        return self.addrs.get(broker_name, {}).get(MASTER_ID)

    def read_addr(self, broker_name: str, prefer: int = MASTER_ID) -> str | None:
        """Where to pull from: the broker id the last pull suggested if it is in
        the route, else the master, else (the master gone) the lowest slave."""
        addrs = self.addrs.get(broker_name, {})
        if prefer in addrs:
            return addrs[prefer]
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        return addrs[min(addrs)] if addrs else None

    def write_queues(self) -> list[QueueRef]:
        """Every writable queue of a group whose master is routed, by broker name."""
        return self._write_queues

    @cached_property
    def _write_queues(self) -> list[QueueRef]:
        return [
            QueueRef(q.broker_name, i)
            for q in self.queues
            if q.perm & PERM_WRITE and self.master(q.broker_name)
            for i in range(q.write_queue_nums)
        ]

    def read_queues(self) -> list[QueueRef]:
        """Every readable queue of a group with any broker routed, by broker name."""
        return [
            QueueRef(q.broker_name, i)
            for q in self.queues
            if q.perm & PERM_READ and self.read_addr(q.broker_name)
            for i in range(q.read_queue_nums)
        ]


def group_broker(queues: Iterable[QueueRef | BrokerQueues], message_group: str) -> str:
    """The broker a message group's messages go to: a stable hash over the
    names of the brokers with a writable queue, sorted."""
    names = sorted({q.broker_name for q in queues})
    return names[zlib.crc32(message_group.encode()) % len(names)]


class RouteCache:
    """Routes by topic, each fresh for `ttl_s` after it was stored, and the
    master address last seen for each broker name."""

    def __init__(self, ttl_s: float = ROUTE_TTL_S, clock: Clock | None = None) -> None:
        self.ttl_s = ttl_s
        self._clock = clock or SystemClock()
        self._routes: dict[str, tuple[TopicRoute, float]] = {}
        self._masters: dict[str, str] = {}
        self._remoting: dict[str, str] = {}

    def fresh(self, topic: str) -> TopicRoute | None:
        """The topic's route if it is cached and not older than `ttl_s`."""
        entry = self._routes.get(topic)
        if entry is None or self._clock.monotonic() - entry[1] > self.ttl_s:
            return None
        return entry[0]

    def put(self, route: TopicRoute) -> TopicRoute:
        """Keep `route` as its topic's, fresh from now; returns it."""
        for broker in route.brokers:
            self._masters[broker.broker_name] = broker.addr
            if broker.remoting_addr:
                self._remoting[broker.broker_name] = broker.remoting_addr
        self._routes[route.topic] = (route, self._clock.monotonic())
        return route

    def forget(self, topic: str) -> None:
        """Drop the topic's route (the name servers no longer know it)."""
        self._routes.pop(topic, None)

    def master_addr(self, broker_name: str) -> str | None:
        """The master address last seen for a broker name, in any topic's route."""
        return self._masters.get(broker_name)

    def remoting_addr(self, broker_name: str) -> str | None:
        """The master's RocketMQ-protocol address last seen for a broker name."""
        return self._remoting.get(broker_name)
