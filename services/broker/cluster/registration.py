"""The broker side of name-server registration (docs/guides/broker.md,
"Registration").

At start the broker registers with every name server in parallel, then every
period (`clamp(registerNameServerPeriod, 10 s, 60 s)`, done by the caller);
with `forceRegister=false` a round first asks each name server
`QueryDataVersion` and registers only where the answer is "changed". After a
name server accepts a registration the broker opens a `KeepAlive` stream to
it; when the stream breaks (the name server restarted, the network dropped)
the broker registers with that name server again at once and reopens it. A
created or updated topic is registered at once (`incremental`). On stop the
broker unregisters from every name server (with its instance id, so a newer
run of the same broker is never removed).

An unreachable name server is logged and retried in the next round, never
fatal. If the broker is not both readable and writable (`brokerPermission`),
every topic is registered with `perm & brokerPermission`.

With automatic failover every registration carries the broker's election
epoch. A name server that has seen a newer one refuses this broker as master
(FAILED_PRECONDITION, "stale master"): the refusal is logged, handed to
the `FenceListener` (the failover controller steps down) and asked again no
sooner than the next period.

What a registration answer tells the broker goes to objects it is handed
(each a small Protocol below): a slave's new master to its `MasterFollower`,
the name servers' ORDER_TOPIC_CONFIG to `OrderTopics`, a refusal as a stale
master to the `FenceListener`.

`namesrvAddr` names the name servers' RocketMQ-protocol addresses, as in
RocketMQ. Registration itself is ferry.v1 gRPC: the broker asks each name
server for its gRPC port (`ferry.remoting.discovery`: GET_KV_CONFIG
`ferry.v1`/`grpcPort`), keeps the answer, and asks again after a failed call
(a restarted name server may serve gRPC elsewhere). An address that does not
answer the question (Apache's name server, or a name server's gRPC port) is
logged saying so and retried like an unreachable one. Each registration
carries both of the broker's addresses: gRPC (`broker_addr`) and RocketMQ's
protocol (`remoting_addr`, what route answers give RocketMQ's clients).

This is a gRPC client adapter: it owns one channel per name server and the
loop and KeepAlive tasks, all on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from ferry.model import PERM_READ_WRITE, DataVersion, TopicConfig
from ferry.remoting import discovery
from ferry.runtime import auth
from ferry.runtime.clock import Clock, wait_event
from ferry.runtime.tasks import cancel_and_wait
from ferry.runtime.tls import ClientTLS, aio_channel
from ferry.v1 import common_pb2, namesrv_pb2, namesrv_pb2_grpc
from ferry.wire import body_crc32

log = logging.getLogger(__name__)

KEEPALIVE_PING_S = 5.0
RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
# A slave learns its master's address from the registration answer. One whose
# master had not registered yet (pods starting in parallel) asks again this
# soon rather than a whole period later (RocketMQ waits the period).
MASTERLESS_REREGISTER_S = 2.0
_FILTER = {"SINGLE_TAG": common_pb2.SINGLE_TAG, "MULTI_TAG": common_pb2.MULTI_TAG}


@dataclass(frozen=True)
class BrokerIdentity:
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str  # advertised gRPC host:port
    ha_server_addr: str  # advertised HA host:port
    broker_role: str
    metrics_addr: str = ""
    remoting_addr: str = ""  # advertised RocketMQ-protocol host:port
    # Failover epoch: the leader election this broker won (id 0) or follows; 0 = failover off.
    epoch: int = 0


def topic_pb(config: TopicConfig, broker_permission: int) -> common_pb2.TopicConfig:
    perm = config.perm
    if broker_permission & PERM_READ_WRITE != PERM_READ_WRITE:
        perm &= broker_permission
    return common_pb2.TopicConfig(
        topic_name=config.topic_name,
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=perm,
        topic_filter_type=_FILTER.get(config.topic_filter_type, common_pb2.SINGLE_TAG),
        topic_sys_flag=config.topic_sys_flag,
        order=config.order,
        attributes=dict(config.attributes),
    )


class _NameServer:
    def __init__(self, addr: str) -> None:
        self.addr = addr  # RocketMQ's protocol, as namesrvAddr names it
        self.grpc_addr = ""  # discovered through `addr`
        self.rediscover = True  # ask `addr` for its gRPC port before the next call
        self.channel: grpc.aio.Channel | None = None
        self.stub: namesrv_pb2_grpc.NameServerStub | None = None
        # Channels to a gRPC address the name server no longer gave: a
        # KeepAlive call may still be on one; closed at stop.
        self.retired: list[grpc.aio.Channel] = []
        self.registered = asyncio.Event()
        self.last_success_wall = 0.0
        self.failures = 0
        self.keepalive: asyncio.Task | None = None
        # (master_addr, ha_server_addr) from this name server's last answer.
        self.master: tuple[str, str] = ("", "")
        # Its last answer refused us as a stale master: retry only at the period.
        self.fenced = False


class TopicSnapshots(Protocol):
    """The topic table as a registration reads it (metadata's TopicTable)."""

    def snapshot(self) -> tuple[dict[str, TopicConfig], DataVersion]: ...


class PermissionReading(Protocol):
    """brokerPermission now (messaging's BrokerPermission)."""

    def get(self) -> int: ...


class MasterFollower(Protocol):
    """What follows the master the name servers name, on a slave (the app's
    slave parts: the admin use case's report, the HA slave, the metadata sync)."""

    def follow_master(self, master_addr: str, ha_addr: str) -> None:
        """The master is now at `master_addr` (gRPC), streaming HA from
        `ha_addr` ("" each: none known)."""


class OrderTopics(Protocol):
    """Where the name servers' ORDER_TOPIC_CONFIG table goes, from every
    registration answer that has one: RocketMQ's checkOrderConfig (the admin
    use case, on a master)."""

    def apply_order_topics(self, table: Mapping[str, str]) -> None:
        """`table`: topic -> "brokerName:queues;..."."""


class FenceListener(Protocol):
    """Told each time a name server refuses this broker as a stale master (its
    failover epoch is older than the group's)."""

    def on_fenced(self, message: str) -> None:
        """`message`: the name server's reason. An exception is logged, and
        registration goes on."""


class Registrar:
    def __init__(
        self,
        namesrv_addrs: Sequence[str],
        identity: BrokerIdentity,
        topics: TopicSnapshots,
        permission: PermissionReading,
        clock: Clock,
        period_s: float = 30.0,
        timeout_s: float = 6.0,
        force_register: bool = True,
        master_follower: MasterFollower | None = None,
        order_topics: OrderTopics | None = None,
        heartbeat_timeout_ms: int = 0,
        keepalive_ping_s: float = KEEPALIVE_PING_S,
        admin_token: str = "",
        tls: ClientTLS | None = None,
        fence_listener: FenceListener | None = None,
    ) -> None:
        self.identity = identity
        self.tls = tls
        self._auth = tuple(auth.bearer(admin_token))  # call metadata for the name servers
        self.topics = topics
        self.permission = permission
        self.clock = clock
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.force_register = force_register
        self.master_follower = master_follower
        self.order_topics = order_topics
        self.fence_listener = fence_listener
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.keepalive_ping_s = keepalive_ping_s
        self.instance_id = uuid.uuid4().hex
        self._servers = [_NameServer(a) for a in namesrv_addrs]
        self._loop_task: asyncio.Task | None = None
        self._stopping = False
        self._master = ("", "")
        self.registrations = 0  # successful RegisterBroker calls (for tests and metrics)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.register_all(force=True)
        for server in self._servers:
            server.keepalive = asyncio.create_task(
                self._keepalive(server), name=f"keepalive-{server.addr}"
            )
        self._loop_task = asyncio.create_task(self._periodic(), name="register-loop")

    async def stop(self) -> None:
        """Stop registering, unregister from every name server (bounded), then
        close the KeepAlive streams: in that order the name servers count a
        graceful unregister, not a lost connection."""
        self._stopping = True
        await cancel_and_wait(self._loop_task)
        await asyncio.gather(*(self._unregister(s) for s in self._servers))
        await cancel_and_wait(*(s.keepalive for s in self._servers if s.keepalive))
        for server in self._servers:
            for channel in [*server.retired, server.channel]:
                if channel is not None:
                    await channel.close()
            server.channel, server.stub, server.retired = None, None, []

    def status(self) -> dict[str, float]:
        return {s.addr: s.last_success_wall for s in self._servers}

    # ------------------------------------------------------------ registration

    async def register_all(self, force: bool = True) -> dict[str, bool]:
        """One round with every name server in parallel; addr -> success."""
        request = self._request()
        results = await asyncio.gather(
            *(self._register_one(s, request, force) for s in self._servers)
        )
        return {s.addr: ok for s, ok in zip(self._servers, results, strict=True)}

    async def register_topics(self, topics: Sequence[TopicConfig]) -> None:
        """Register created/updated topics at once (incremental); a name server
        that does not know this broker (it restarted) gets a full registration."""
        table, version = self.topics.snapshot()
        body = self._body({t.topic_name: t for t in topics}, version)
        request = self._base_request(body, incremental=True)
        await asyncio.gather(*(self._register_one(s, request, True) for s in self._servers))

    def _request(self) -> namesrv_pb2.RegisterBrokerRequest:
        table, version = self.topics.snapshot()
        return self._base_request(self._body(table, version), incremental=False)

    def _body(
        self, table: dict[str, TopicConfig], version: DataVersion
    ) -> namesrv_pb2.RegisterBrokerBody:
        perm = self.permission.get()
        wrapper = common_pb2.TopicConfigSerializeWrapper(
            data_version=common_pb2.DataVersion(
                timestamp=version.timestamp,
                counter=version.counter,
                state_version=version.state_version,
            )
        )
        for name, config in table.items():
            wrapper.topic_config_table[name].CopyFrom(topic_pb(config, perm))
        return namesrv_pb2.RegisterBrokerBody(topic_config=wrapper)

    def _base_request(
        self, body: namesrv_pb2.RegisterBrokerBody, incremental: bool
    ) -> namesrv_pb2.RegisterBrokerRequest:
        ident = self.identity
        return namesrv_pb2.RegisterBrokerRequest(
            cluster_name=ident.cluster_name,
            broker_addr=ident.broker_addr,
            broker_name=ident.broker_name,
            broker_id=ident.broker_id,
            ha_server_addr=ident.ha_server_addr,
            body=body,
            body_crc32=body_crc32(body),
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            instance_id=self.instance_id,
            broker_role=ident.broker_role,
            metrics_addr=ident.metrics_addr,
            incremental=incremental,
            epoch=ident.epoch,
            remoting_addr=ident.remoting_addr,
        )

    async def _connect(self, server: _NameServer) -> bool:
        """A stub for `server`'s gRPC port, found through its RocketMQ-protocol
        address the first time and after each failed call."""
        if not server.rediscover and server.stub is not None:
            return True
        try:
            grpc_addr = await discovery.grpc_address(server.addr, timeout=self.timeout_s)
        except discovery.DiscoveryError as exc:
            server.failures += 1
            server.master = ("", "")
            log.warning(
                "registration with name server %s failed: %s (retrying next round)",
                server.addr,
                exc,
            )
            return False
        server.rediscover = False
        if grpc_addr != server.grpc_addr:
            if server.channel is not None:
                server.retired.append(server.channel)
            server.grpc_addr = grpc_addr
            server.channel = aio_channel(
                grpc_addr,
                self.tls,
                options=[
                    ("grpc.max_send_message_length", 64 * 1024 * 1024),
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ],
            )
            server.stub = namesrv_pb2_grpc.NameServerStub(server.channel)
            log.info("name server %s serves ferry.v1 gRPC at %s", server.addr, grpc_addr)
        return True

    async def _register_one(
        self, server: _NameServer, request: namesrv_pb2.RegisterBrokerRequest, force: bool
    ) -> bool:
        if not await self._connect(server):
            return False
        assert server.stub is not None
        try:
            if not force and server.registered.is_set():
                answer = await server.stub.QueryDataVersion(
                    namesrv_pb2.QueryDataVersionRequest(
                        cluster_name=request.cluster_name,
                        broker_addr=request.broker_addr,
                        broker_name=request.broker_name,
                        broker_id=request.broker_id,
                        data_version=request.body.topic_config.data_version,
                    ),
                    timeout=self.timeout_s,
                )
                if not answer.changed:
                    server.last_success_wall = self.clock.wall()
                    return True
            try:
                response = await server.stub.RegisterBroker(
                    request, timeout=self.timeout_s, metadata=self._auth
                )
            except grpc.aio.AioRpcError as exc:
                if request.incremental and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    response = await server.stub.RegisterBroker(
                        self._request(), timeout=self.timeout_s, metadata=self._auth
                    )
                else:
                    raise
        except grpc.aio.AioRpcError as exc:
            server.failures += 1
            server.master = ("", "")  # an answer it cannot give any more
            server.rediscover = True
            if self._is_fenced(exc):
                self._fenced(server, exc.details() or "")
                return False
            log.warning(
                "registration with name server %s (gRPC %s) failed: %s: %s (retrying next round)",
                server.addr,
                server.grpc_addr,
                exc.code().name,
                exc.details(),
            )
            return False
        self.registrations += 1
        first = not server.registered.is_set()
        server.registered.set()
        server.failures = 0
        server.fenced = False
        server.last_success_wall = self.clock.wall()
        if first:
            log.info(
                "registered with name server %s: topics=%d incremental=%s",
                server.addr,
                len(request.body.topic_config.topic_config_table),
                request.incremental,
            )
        else:
            log.debug("registered with name server %s", server.addr)
        server.master = (response.master_addr, response.ha_server_addr)
        if self.order_topics is not None and response.kv_table:
            self.order_topics.apply_order_topics(dict(response.kv_table))
        # The name servers do not talk to each other: one may not have heard
        # from the master yet while another has. The first that knows it wins
        # (as in RocketMQ); "no master" only when none of them knows one.
        master = next((s.master for s in self._servers if any(s.master)), ("", ""))
        if self.identity.broker_id != 0 and master != self._master:
            self._master = master
            if self.master_follower is not None:
                self.master_follower.follow_master(*master)
        return True

    def _is_fenced(self, exc: grpc.aio.AioRpcError) -> bool:
        """A full registration answered FAILED_PRECONDITION can only be a stale-master
        refusal (an incremental one refused so is retried in full first), and only a
        master with an epoch can be refused so."""
        ident = self.identity
        return (
            exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            and ident.broker_id == 0
            and ident.epoch > 0
        )

    def _fenced(self, server: _NameServer, message: str) -> None:
        server.fenced = True
        log.warning(
            "name server %s refused this broker as master of %s at epoch %d: %s "
            "(asking again next round)",
            server.addr,
            self.identity.broker_name,
            self.identity.epoch,
            message,
        )
        if self.fence_listener is not None:
            try:
                self.fence_listener.on_fenced(message)
            except Exception:
                log.exception("on_fenced callback failed; registration goes on")

    async def _periodic(self) -> None:
        while not self._stopping:
            masterless = self.identity.broker_id != 0 and not self._master[1]
            await asyncio.sleep(
                min(self.period_s, MASTERLESS_REREGISTER_S) if masterless else self.period_s
            )
            try:
                await self.register_all(force=self.force_register)
            except Exception:
                log.exception("registration round failed; trying again next period")

    # ------------------------------------------------------------ keepalive

    async def _keepalive(self, server: _NameServer) -> None:
        """Hold a KeepAlive stream open; when it breaks, register again at once."""
        attempt = 0
        while not self._stopping:
            while not server.registered.is_set():
                if self._stopping:
                    return
                if server.fenced:
                    # Asking sooner than the periodic round cannot help a stale master;
                    # that round (or one after a new identity) sets `registered`.
                    await wait_event(server.registered, self.period_s)
                    continue
                if await self._register_one(server, self._request(), True):
                    break
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1
            assert server.stub is not None
            stop_pinging = asyncio.Event()

            call = server.stub.KeepAlive(self._pings(stop_pinging), metadata=self._auth)
            opened = False
            try:
                async for _ in call:
                    opened = True
                    attempt = 0
                reason = "the name server closed it"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            finally:
                stop_pinging.set()
                call.cancel()
            if self._stopping:
                return
            log.warning(
                "KeepAlive stream to name server %s ended (%s); registering again",
                server.addr,
                reason,
            )
            if not opened:
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1
            server.registered.clear()
            server.rediscover = True  # it may have restarted with another gRPC port

    async def _pings(self, stop: asyncio.Event):
        """The KeepAlive request stream: the broker's name, then a ping per interval."""
        yield namesrv_pb2.KeepAliveRequest(
            cluster_name=self.identity.cluster_name,
            broker_addr=self.identity.broker_addr,
            instance_id=self.instance_id,
        )
        while not await wait_event(stop, self.keepalive_ping_s):
            yield namesrv_pb2.KeepAliveRequest()

    def _backoff(self, attempt: int) -> float:
        """Retry delays grow to one registration period."""
        steps = (*RETRY_BACKOFF_S, self.period_s)
        return min(steps[min(attempt, len(steps) - 1)], self.period_s)

    async def _unregister(self, server: _NameServer) -> None:
        if server.stub is None or not server.registered.is_set():
            return
        try:
            await server.stub.UnregisterBroker(
                namesrv_pb2.UnregisterBrokerRequest(
                    cluster_name=self.identity.cluster_name,
                    broker_addr=self.identity.broker_addr,
                    broker_name=self.identity.broker_name,
                    broker_id=self.identity.broker_id,
                    instance_id=self.instance_id,
                ),
                timeout=self.timeout_s,
                metadata=self._auth,
            )
            log.info("unregistered from name server %s", server.addr)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "could not unregister from name server %s: %s", server.addr, exc.code().name
            )
