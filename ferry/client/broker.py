"""Blocking clients for brokers: one broker's API, a producer and a consumer
that find brokers through the name servers.

- `BrokerClient`: the `Broker` and `BrokerAdmin` RPCs of one broker.
- `BrokerRoutes`: what the clients here (and `PopConsumer`, `PipelinedProducer`)
  share: routes from the name servers in the library's `RouteCache`
  (`ferry.client.routes`) and one `BrokerClient` per broker.
- `Producer`: resolves a topic's route through any name server, picks a
  writable queue of a master round-robin, and retries another broker's queue
  when one does not answer (`UNAVAILABLE`/deadline), up to `retries` times —
  RocketMQ's `retryTimesWhenSendFailed`. A message with a message group
  (property `__SHARDINGKEY`, RocketMQ 5's FIFO key) always goes to the same
  master: `crc32(group) % count` over the route's writable masters sorted by
  name, sent without a queue id so that broker picks the queue by the same hash
  of its write queues; a retry goes to the same choice over the refreshed route
  (never elsewhere while that broker is routed, which would break the group's
  order). `deliver_at_ms` sets `TIMER_DELIVER_MS` (a timed message).
- `Consumer`: pulls queue by queue over every readable queue of the route,
  starting from the group's committed offset (or the queue's min offset with
  `from_beginning`, else its max: RocketMQ's CONSUME_FROM_LAST_OFFSET), and
  commits what it consumed. Pulls go to the master; when the master is gone
  from the route, to the lowest slave id present. A pull below a queue's min
  offset (OFFSET_MOVED: the broker's retention deleted those messages before
  they were consumed) resumes at the queue's new min offset, commits it at
  once, as RocketMQ's consumers do, and logs a WARNING with the number of
  messages skipped.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from ferry.client.namesrv import NamesrvClient
from ferry.client.routes import ROUTE_TTL_S, QueueRef, RouteCache, TopicRoute, group_broker
from ferry.model import (
    MASTER_ID,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELIVER_MS,
)
from ferry.runtime import auth, tls
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    ha_admin_pb2,
    ha_admin_pb2_grpc,
)

log = logging.getLogger(__name__)

# The codes after which a call may go to another broker, or again on a fresh stream.
RETRIABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Every client channel to a broker: messages up to 64 MiB either way.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


class NoRoute(Exception):
    """The topic has no route on the name servers (it was never created, or
    every broker carrying it is gone)."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic!r} has no route on the name servers; create it with "
            f"`ferry topic create {topic} -c CLUSTER` (or check `ferry cluster`)"
        )
        self.topic = topic


class NoWritableQueue(NoRoute):
    """The topic has a route, but no master that may be written to is alive
    (only slaves are left, or every group is read-only)."""

    def __init__(self, topic: str) -> None:
        Exception.__init__(
            self,
            f"topic {topic!r} has no writable queue: no master carrying it is alive (only "
            "slaves, which take no writes), or its brokers are read-only; see `ferry cluster`",
        )
        self.topic = topic


class BrokerClient:
    def __init__(
        self,
        addr: str,
        timeout_s: float = 10.0,
        admin_token: str | auth.AdminCredentials | None = None,
    ) -> None:
        self.addr = addr
        self.timeout_s = timeout_s
        self._admin_md = auth.client_metadata(admin_token)  # for the BrokerAdmin writes
        self.channel = tls.channel(addr, options=CHANNEL_OPTIONS)  # TLS per $FERRY_TLS_CA
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.admin = broker_admin_pb2_grpc.BrokerAdminStub(self.channel)
        self.ha = ha_admin_pb2_grpc.HAAdminStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # producers and consumers
    def send(self, topic: str, body: bytes, queue_id: int | None = None, **fields: Any):
        request = broker_pb2.SendMessageRequest(topic=topic, body=body, **fields)
        if queue_id is not None:
            request.queue_id = queue_id
        return self.broker.SendMessage(request, timeout=self.timeout_s)

    def send_batch(
        self, topic: str, entries: Sequence[broker_pb2.SendEntry], queue_id: int | None = None
    ):
        request = broker_pb2.SendMessagesRequest(topic=topic, messages=entries)
        if queue_id is not None:
            request.queue_id = queue_id
        return self.broker.SendMessages(request, timeout=self.timeout_s)

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_msgs: int = 32,
        wait_ms: int = 0,
        sub_expression: str = "",
    ) -> broker_pb2.PullMessageResponse:
        return self.broker.PullMessage(
            broker_pb2.PullMessageRequest(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=queue_offset,
                max_msg_nums=max_msgs,
                max_wait_ms=wait_ms,
                sub_expression=sub_expression,
            ),
            timeout=self.timeout_s + wait_ms / 1000,
        )

    def pop(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        wait_ms: int,
        sub_expression: str = "",
        queue_id: int | None = None,
    ) -> broker_pb2.PopMessageResponse:
        """Pop from one queue, or (`queue_id` None) any readable queue of this broker."""
        request = broker_pb2.PopMessageRequest(
            consumer_group=group,
            topic=topic,
            max_msg_nums=max_msgs,
            invisible_ms=invisible_ms,
            max_wait_ms=wait_ms,
            sub_expression=sub_expression,
        )
        if queue_id is not None:
            request.queue_id = queue_id
        return self.broker.PopMessage(request, timeout=self.timeout_s + wait_ms / 1000)

    def ack(self, group: str, topic: str, handles: Sequence[str]) -> broker_pb2.AckMessageResponse:
        return self.broker.AckMessage(
            broker_pb2.AckMessageRequest(
                consumer_group=group, topic=topic, receipt_handles=list(handles)
            ),
            timeout=self.timeout_s,
        )

    def change_invisible_time(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> broker_pb2.ChangeInvisibleTimeResponse:
        return self.broker.ChangeInvisibleTime(
            broker_pb2.ChangeInvisibleTimeRequest(
                consumer_group=group, topic=topic, receipt_handle=handle, invisible_ms=invisible_ms
            ),
            timeout=self.timeout_s,
        )

    def group_status(self, group: str, topic: str) -> broker_pb2.GetGroupStatusResponse:
        return self.broker.GetGroupStatus(
            broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=topic),
            timeout=self.timeout_s,
        )

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        try:
            return self.broker.QueryConsumerOffset(
                broker_pb2.QueryConsumerOffsetRequest(
                    consumer_group=group, topic=topic, queue_id=queue_id
                ),
                timeout=self.timeout_s,
            ).offset
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.broker.UpdateConsumerOffset(
            broker_pb2.UpdateConsumerOffsetRequest(
                consumer_group=group, topic=topic, queue_id=queue_id, offset=offset
            ),
            timeout=self.timeout_s,
        )

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.broker.GetMaxOffset(
            broker_pb2.GetMaxOffsetRequest(topic=topic, queue_id=queue_id), timeout=self.timeout_s
        ).offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.broker.GetMinOffset(
            broker_pb2.GetMinOffsetRequest(topic=topic, queue_id=queue_id), timeout=self.timeout_s
        ).offset

    # administration
    def update_topic(self, config: common_pb2.TopicConfig) -> common_pb2.DataVersion:
        return self.admin.UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(topic_config=config),
            timeout=self.timeout_s,
            metadata=self._admin_md,
        ).data_version

    def delete_topic(self, topic: str) -> common_pb2.DataVersion:
        return self.admin.DeleteTopic(
            broker_admin_pb2.DeleteTopicRequest(topic=topic),
            timeout=self.timeout_s,
            metadata=self._admin_md,
        ).data_version

    def runtime_info(self) -> broker_admin_pb2.BrokerRuntimeInfo:
        return self.admin.GetBrokerRuntimeInfo(
            broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=self.timeout_s
        )

    def ha_status(self) -> ha_admin_pb2.HAStatus:
        return self.ha.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=self.timeout_s)

    def update_permission(self, perm: int) -> broker_admin_pb2.UpdateBrokerPermissionResponse:
        return self.admin.UpdateBrokerPermission(
            broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=perm),
            timeout=self.timeout_s,
            metadata=self._admin_md,
        )

    def delete_expired_commit_log(self) -> broker_admin_pb2.DeleteExpiredCommitLogResponse:
        """One retention pass on this broker now, ignoring deleteWhen."""
        return self.admin.DeleteExpiredCommitLog(
            broker_admin_pb2.DeleteExpiredCommitLogRequest(),
            timeout=self.timeout_s,
            metadata=self._admin_md,
        )


class BrokerRoutes:
    """What the blocking clients share: topic routes from the name servers,
    kept in a `RouteCache` for `ttl_s`, and one `BrokerClient` per broker."""

    def __init__(
        self, namesrv: NamesrvClient, timeout_s: float, ttl_s: float = ROUTE_TTL_S
    ) -> None:
        self.namesrv = namesrv
        self.timeout_s = timeout_s
        self.cache = RouteCache(ttl_s)
        self._clients: dict[str, BrokerClient] = {}

    def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route, looked up when not cached, stale or `refresh`.

        Raises:
            NoRoute: the name servers do not know the topic.
        """
        route = None if refresh else self.cache.fresh(topic)
        if route is None:
            try:
                data = self.namesrv.route(topic)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise NoRoute(topic) from None
                raise
            route = self.cache.put(TopicRoute.from_data(topic, data))
        return route

    def cached(self, topic: str) -> TopicRoute | None:
        """The topic's route if it is cached and fresh: no lookup."""
        return self.cache.fresh(topic)

    def client(self, addr: str) -> BrokerClient:
        c = self._clients.get(addr)
        if c is None:
            c = self._clients[addr] = BrokerClient(addr, self.timeout_s)
        return c

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()


@dataclass
class Sent:
    """A send's result and where it went."""

    result: broker_pb2.SendResult
    broker_name: str
    broker_addr: str


class Producer:
    def __init__(self, namesrv: NamesrvClient, retries: int = 2, timeout_s: float = 10.0) -> None:
        self._routes = BrokerRoutes(namesrv, timeout_s)
        self.retries = retries
        self._counter = itertools.count()

    def close(self) -> None:
        self._routes.close()

    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route (cached for ROUTE_TTL_S unless `refresh`); raises NoRoute."""
        return self._routes.get(topic, refresh)

    def client(self, addr: str) -> BrokerClient:
        """This producer's client of the broker at `addr` (one channel per broker)."""
        return self._routes.client(addr)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        body: bytes,
        tags: str = "",
        keys: str = "",
        properties: Mapping[str, str] | None = None,
        message_group: str = "",
        deliver_at_ms: int | None = None,
    ) -> Sent:
        """Send one message. `message_group`: FIFO key (every message of a group
        lands in one queue); `deliver_at_ms`: epoch ms before which no consumer
        sees it (the broker refuses more than `timerMaxDelaySec` ahead)."""
        props = message_properties(properties, message_group, deliver_at_ms)

        def call(client: BrokerClient, queue_id: int | None):
            return client.send(
                topic, body, queue_id=queue_id, tags=tags, keys=keys, properties=props
            )

        return self._with_retries(topic, call, message_group)

    def send_batch(
        self, topic: str, entries: Sequence[broker_pb2.SendEntry], message_group: str = ""
    ) -> Sent:
        """One batch, stored and acknowledged as one unit on one queue. With
        `message_group` the batch goes where that group's messages go (the
        entries carry their own properties: see `message_properties`)."""
        return self._with_retries(
            topic, lambda c, q: c.send_batch(topic, entries, queue_id=q), message_group
        )

    def _with_retries(self, topic: str, call, message_group: str = "") -> Sent:
        refresh = False
        avoid: set[str] = set()
        last: grpc.RpcError | None = None
        for _ in range(self.retries + 1):
            route = self._routes.get(topic, refresh)
            queues = route.write_queues()
            if not queues:
                if route.queues:
                    raise NoWritableQueue(topic)
                raise NoRoute(topic)
            queue_id: int | None
            if message_group:
                name, queue_id = group_broker(queues, message_group), None
            else:
                candidates = [q for q in queues if q.broker_name not in avoid] or queues
                queue = candidates[next(self._counter) % len(candidates)]
                name, queue_id = queue.broker_name, queue.queue_id
            addr = route.master(name)
            assert addr is not None
            try:
                return Sent(call(self._routes.client(addr), queue_id), name, addr)
            except grpc.RpcError as exc:
                if exc.code() not in RETRIABLE_CODES:
                    raise
                last = exc
                avoid.add(name)
                refresh = True
        assert last is not None
        raise last


def message_properties(
    properties: Mapping[str, str] | None = None,
    message_group: str = "",
    deliver_at_ms: int | None = None,
) -> dict[str, str]:
    """`properties` plus the message group and delivery time, as the broker reads them."""
    props = dict(properties or {})
    if message_group:
        props[PROPERTY_SHARDING_KEY] = message_group
    if deliver_at_ms is not None:
        props[PROPERTY_TIMER_DELIVER_MS] = str(int(deliver_at_ms))
    return props


@dataclass
class Consumed:
    broker_name: str
    queue_id: int
    message: broker_pb2.MessageExt


@dataclass
class _Position:
    offset: int
    committed: int


@dataclass
class Consumer:
    namesrv: NamesrvClient
    group: str
    topic: str
    from_beginning: bool = False
    sub_expression: str = ""
    timeout_s: float = 10.0
    _routes: BrokerRoutes = field(init=False)
    _positions: dict[QueueRef, _Position] = field(init=False, default_factory=dict)
    _next: int = field(init=False, default=0)
    # broker name -> the broker id its last pull answer suggested (slaveReadEnable)
    _suggested: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._routes = BrokerRoutes(self.namesrv, self.timeout_s)

    def close(self) -> None:
        self._routes.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self, max_msgs: int = 32, wait_ms: int = 1000) -> list[Consumed]:
        """Pull from the queues in turn; returns the first non-empty batch, or []
        after every queue was tried (the last one waits up to `wait_ms`)."""
        route = self._routes.get(self.topic)
        queues = route.read_queues()
        if not queues:
            raise NoRoute(self.topic)
        for i in range(len(queues)):
            queue = queues[(self._next + i) % len(queues)]
            last = i == len(queues) - 1
            got = self._pull(route, queue, max_msgs, wait_ms if last else 0)
            if got:
                self._next = (self._next + i + 1) % len(queues)
                return got
        return []

    def _pull(
        self, route: TopicRoute, queue: QueueRef, max_msgs: int, wait_ms: int
    ) -> list[Consumed]:
        addr = route.read_addr(queue.broker_name, self._suggested.get(queue.broker_name, MASTER_ID))
        if addr is None:
            return []
        client = self._routes.client(addr)
        position = self._positions.get(queue)
        try:
            if position is None:
                position = self._start_position(client, queue)
                self._positions[queue] = position
            response = self._pull_at(client, queue, position.offset, max_msgs, wait_ms)
            if response.status == broker_pb2.OFFSET_MOVED:
                # Once more from the new start; moved again meanwhile, the next poll goes on.
                self._offset_moved(route, queue, position, response.next_begin_offset, addr)
                response = self._pull_at(client, queue, position.offset, max_msgs, wait_ms)
        except grpc.RpcError as exc:
            if exc.code() in RETRIABLE_CODES:
                self._routes.get(self.topic, refresh=True)
                return []
            raise
        self._suggested[queue.broker_name] = response.suggest_which_broker_id
        if response.status == broker_pb2.OFFSET_MOVED:
            self._offset_moved(route, queue, position, response.next_begin_offset, addr)
            return []
        if response.status == broker_pb2.OFFSET_ILLEGAL:
            position.offset = response.next_begin_offset
            return []
        if response.status == broker_pb2.NO_MATCHED_MSG:
            position.offset = response.next_begin_offset
            return []
        if response.status != broker_pb2.FOUND:
            return []
        position.offset = response.next_begin_offset
        return [Consumed(queue.broker_name, queue.queue_id, m) for m in response.messages]

    def _pull_at(
        self, client: BrokerClient, queue: QueueRef, offset: int, max_msgs: int, wait_ms: int
    ) -> broker_pb2.PullMessageResponse:
        return client.pull(
            self.group, self.topic, queue.queue_id, offset, max_msgs, wait_ms, self.sub_expression
        )

    def _start_position(self, client: BrokerClient, queue: QueueRef) -> _Position:
        committed = client.query_offset(self.group, self.topic, queue.queue_id)
        if committed is None:
            if self.from_beginning:
                start = client.min_offset(self.topic, queue.queue_id)
            else:
                start = client.max_offset(self.topic, queue.queue_id)
            return _Position(start, -1)
        return _Position(committed, committed)

    def _offset_moved(
        self, route: TopicRoute, queue: QueueRef, position: _Position, new_start: int, addr: str
    ) -> None:
        """The queue now starts past `position` (retention deleted the rest):
        continue at its new min offset and commit that at once."""
        skipped = new_start - position.offset
        log.warning(
            "skipping %d messages: the broker's retention deleted them before group %s "
            "consumed them (fileReservedTime, or a full disk); resuming at queue offset %d "
            "topic=%s queue_id=%d broker=%s (%s) requested_offset=%d",
            skipped,
            self.group,
            new_start,
            self.topic,
            queue.queue_id,
            queue.broker_name,
            addr,
            position.offset,
        )
        position.offset = new_start
        try:
            self._commit_one(route, queue, position)
        except grpc.RpcError as exc:
            if exc.code() not in RETRIABLE_CODES:
                raise
            # Not committed yet: the next commit() does it.

    def _commit_one(self, route: TopicRoute, queue: QueueRef, position: _Position) -> bool:
        addr = route.read_addr(queue.broker_name)
        if addr is None:
            return False
        self._routes.client(addr).commit_offset(
            self.group, self.topic, queue.queue_id, position.offset
        )
        position.committed = position.offset
        return True

    def commit(self) -> int:
        """Commit every queue's position that moved; returns how many were committed."""
        route = self._routes.get(self.topic)
        committed = 0
        for queue, position in self._positions.items():
            if position.offset != position.committed and self._commit_one(route, queue, position):
                committed += 1
        return committed

    def positions(self) -> Iterable[tuple[QueueRef, int]]:
        return ((q, p.offset) for q, p in self._positions.items())
