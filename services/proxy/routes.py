"""Where topics live, for the MessagingService servicer (`RouteSource`).

A route is ferry's client-side `TopicRoute` (`ferry.client.routes`), so the
proxy reads a route by the same rules as ferry's own clients; only the fetching
(grpc.aio, the name servers' gRPC ports discovered) is the proxy's.

`Routes` (cluster mode, the `ferry proxy` process): routes from the name
servers, kept in the library's `RouteCache`, and one async channel per broker.
The proxy is stateless: everything it knows about brokers comes from here. A
route is fetched on first use and again after `ttl_s` (RocketMQ's clients poll
every 30 s); a broker that stopped answering is forgotten at the next fetch,
because the name servers drop it from the route.

`LocalRoutes` (local mode, a broker with `enableProxy=true`): routes from the
broker's own topic table, read at every call (a dictionary lookup, so never
stale), and one loopback channel to the broker's own `ferry.v1` port. It
never talks to a name server and knows no other broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from ferry.client.routes import ROUTE_TTL_S, BrokerQueues, RouteCache, TopicRoute
from ferry.model import MASTER_ID, PERM_READ_WRITE, TopicConfig
from ferry.remoting import discovery
from ferry.runtime.tls import ClientTLS, aio_channel
from ferry.v1 import broker_pb2_grpc, namesrv_pb2, namesrv_pb2_grpc, transactions_pb2_grpc

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 3.0
# LocalRoutes keeps the route it made for this many topics, then starts again.
MADE_ROUTES_KEPT = 4096


class TopicNotFound(Exception):
    def __init__(self, topic: str, where: str = "no route on the name servers") -> None:
        super().__init__(f"topic {topic!r} has {where}; create it first")
        self.topic = topic


class NameServersDown(Exception):
    def __init__(self, addrs: Sequence[str], detail: str) -> None:
        super().__init__(f"no name server answered ({', '.join(addrs)}): {detail}")


class RouteSource(Protocol):
    """What the MessagingService servicer asks about brokers: `Routes` and
    `LocalRoutes` answer it."""

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route. Raises TopicNotFound, or NameServersDown (cluster mode)."""
        ...

    def broker_addr(self, broker_name: str) -> str | None: ...

    def remoting_addr(self, broker_name: str) -> str | None: ...

    def stub(self, addr: str) -> broker_pb2_grpc.BrokerStub: ...

    def transactions(self, addr: str) -> transactions_pb2_grpc.TransactionsStub: ...

    async def close(self) -> None: ...


class Routes:
    """Routes from the name servers. `namesrv_addrs` are their RocketMQ-protocol
    addresses (RocketMQ's namesrvAddr); each one's ferry.v1 gRPC port is asked
    for (`ferry.remoting.discovery`) on first use, and again after a call to it
    failed."""

    def __init__(
        self, namesrv_addrs: Sequence[str], ttl_s: float = ROUTE_TTL_S, max_message_bytes: int = 0
    ) -> None:
        self.addrs = list(namesrv_addrs)
        options = []
        if max_message_bytes:
            options = [
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ]
        self._options = options
        # Channels are made on first use, on the event loop that serves (a
        # grpc.aio channel belongs to the loop it was made on).
        self._namesrv_channels: dict[str, grpc.aio.Channel] = {}  # by RocketMQ address
        self._namesrv: dict[str, namesrv_pb2_grpc.NameServerStub] = {}
        self._namesrv_grpc: dict[str, str] = {}  # RocketMQ address -> gRPC address found
        # Channels to a gRPC address a name server no longer gave (a fetch may
        # still be on one): closed by close().
        self._retired: list[grpc.aio.Channel] = []
        self._brokers: dict[str, tuple[grpc.aio.Channel, broker_pb2_grpc.BrokerStub]] = {}
        self._cache = RouteCache(ttl_s)
        self._fetching: dict[str, asyncio.Future[TopicRoute]] = {}

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        route = None if refresh else self._cache.fresh(topic)
        if route is not None:
            return route
        pending = self._fetching.get(topic)
        if pending is None:  # one fetch per topic at a time
            pending = self._fetching[topic] = asyncio.ensure_future(self._fetch(topic))
            pending.add_done_callback(lambda _: self._fetching.pop(topic, None))
        return await asyncio.shield(pending)

    async def _namesrv_stub(self, addr: str) -> namesrv_pb2_grpc.NameServerStub:
        """The gRPC stub of the name server at RocketMQ address `addr`.

        Raises:
            discovery.DiscoveryError: it did not give its gRPC port.
        """
        stub = self._namesrv.get(addr)
        if stub is not None:
            return stub
        grpc_addr = await discovery.grpc_address(addr, timeout=CALL_TIMEOUT_S)
        old = self._namesrv_channels.pop(addr, None)
        if old is not None:
            self._retired.append(old)
        channel = self._namesrv_channels[addr] = grpc.aio.insecure_channel(grpc_addr)
        self._namesrv[addr] = stub = namesrv_pb2_grpc.NameServerStub(channel)
        if self._namesrv_grpc.get(addr) != grpc_addr:
            log.info("name server %s serves ferry.v1 gRPC at %s", addr, grpc_addr)
        self._namesrv_grpc[addr] = grpc_addr
        return stub

    async def _fetch(self, topic: str) -> TopicRoute:
        failures = []
        for addr in self.addrs:
            try:
                stub = await self._namesrv_stub(addr)
            except discovery.DiscoveryError as exc:
                failures.append(str(exc))
                continue
            try:
                data = await stub.GetRouteInfoByTopic(
                    namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    self._cache.forget(topic)  # no such topic, or no such name
                    raise TopicNotFound(topic) from None
                failures.append(f"{addr}: {exc.code().name} {exc.details() or ''}".strip())
                self._namesrv.pop(addr, None)  # ask for its gRPC port again next time
                continue
            route = TopicRoute.from_data(topic, data)
            if not route.brokers:
                raise TopicNotFound(topic)
            return self._cache.put(route)
        raise NameServersDown(self.addrs, "; ".join(failures))

    def broker_addr(self, broker_name: str) -> str | None:
        """The master address last seen for a broker name."""
        return self._cache.master_addr(broker_name)

    def remoting_addr(self, broker_name: str) -> str | None:
        """The master's RocketMQ-protocol address last seen for a broker name."""
        return self._cache.remoting_addr(broker_name)

    def stub(self, addr: str) -> broker_pb2_grpc.BrokerStub:
        entry = self._brokers.get(addr)
        if entry is None:
            channel = grpc.aio.insecure_channel(addr, options=self._options)
            entry = self._brokers[addr] = (channel, broker_pb2_grpc.BrokerStub(channel))
        return entry[1]

    def transactions(self, addr: str) -> transactions_pb2_grpc.TransactionsStub:
        """The broker's Transactions service, on its `stub` channel."""
        self.stub(addr)
        return transactions_pb2_grpc.TransactionsStub(self._brokers[addr][0])

    async def close(self) -> None:
        for channel, _ in self._brokers.values():
            await channel.close()
        self._brokers.clear()
        for channel in [*self._namesrv_channels.values(), *self._retired]:
            await channel.close()
        self._namesrv_channels.clear()
        self._namesrv.clear()
        self._retired.clear()


class LocalRoutes:
    """RocketMQ's local mode: routes of the one broker this servicer runs in.

    Each topic's route is this broker alone, with its queue numbers, its perm
    (`perm & brokerPermission` unless the broker is read-write, as registered
    with the name servers) and its `order` flag. Sends, pops, acks and re-timings
    go to the broker's RocketMQ-protocol handlers in-process once the broker has
    attached them (`attach_remoting`: no socket, the same handlers and gate as any
    client's); the rest (a transaction's half and end, group settings, ferry.v1
    handles) over one channel to the broker's own `ferry.v1` port.

    Args:
        broker_name: this broker's `brokerName`; receipt handles name it.
        dial: the address this broker's own port is dialled at ("127.0.0.1:port"),
            asked on first use, once the server is bound.
        topic: a topic's config from the broker's topic table, None if absent.
        permission: the broker's current `brokerPermission`.
        tls: set when the broker serves TLS: how to call it.
        channel_options: gRPC options of the loopback channel (message sizes,
            `grpc.ssl_target_name_override`).
    """

    def __init__(
        self,
        broker_name: str,
        dial: Callable[[], str],
        topic: Callable[[str], TopicConfig | None],
        permission: Callable[[], int],
        tls: ClientTLS | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.broker_name = broker_name
        self._dial = dial
        self._topic = topic
        self._permission = permission
        self._tls = tls
        self._options = list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: broker_pb2_grpc.BrokerStub | None = None
        # This broker's RocketMQ-protocol address, once its proxy calls it through an
        # in-process link there (`attach_remoting`); "" until then: ferry.v1 only.
        self.remoting = ""
        self._made: dict[str, tuple[tuple, TopicRoute]] = {}

    @property
    def addr(self) -> str:
        return self._dial()

    def attach_remoting(self, addr: str) -> None:
        """Routes name `addr` as this broker's RocketMQ-protocol address from now on
        (its proxy's sends, pops and acks go there, in-process)."""
        self.remoting = addr

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        config = self._topic(topic)
        if config is None:
            raise TopicNotFound(topic, f"no queue on broker {self.broker_name}")
        perm = config.perm
        broker_perm = self._permission()
        if broker_perm & PERM_READ_WRITE != PERM_READ_WRITE:
            perm &= broker_perm
        addr = self.addr
        # The route of the last call for this topic when nothing it is made of has
        # changed since (a TopicConfig is immutable): a send asks for it every time.
        key = (config, perm, addr, self.remoting)
        known = self._made.get(topic)
        if known is not None and known[0] == key:
            return known[1]
        route = self._route(topic, config, perm, addr)
        if len(self._made) >= MADE_ROUTES_KEPT:
            self._made.clear()
        self._made[topic] = (key, route)
        return route

    def _route(self, topic: str, config, perm: int, addr: str) -> TopicRoute:
        queues = BrokerQueues(
            self.broker_name, addr, config.read_queue_nums, config.write_queue_nums, perm,
            self.remoting,
        )  # fmt: skip
        return TopicRoute(
            topic, (queues,), {self.broker_name: {MASTER_ID: addr}}, config.order,
            config.message_type,
        )  # fmt: skip

    def broker_addr(self, broker_name: str) -> str | None:
        """This broker's address for its own name; None for any other."""
        return self.addr if broker_name == self.broker_name else None

    def remoting_addr(self, broker_name: str) -> str | None:
        """This broker's RocketMQ-protocol address for its own name, once attached."""
        return self.remoting or None if broker_name == self.broker_name else None

    def stub(self, addr: str) -> broker_pb2_grpc.BrokerStub:
        """The broker's own stub: every address this class hands out is its own."""
        if self._stub is None:
            self._channel = aio_channel(self.addr, self._tls, self._options)
            self._stub = broker_pb2_grpc.BrokerStub(self._channel)
        return self._stub

    def transactions(self, addr: str) -> transactions_pb2_grpc.TransactionsStub:
        """The broker's own Transactions service, on the `stub` channel."""
        self.stub(addr)
        return transactions_pb2_grpc.TransactionsStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
