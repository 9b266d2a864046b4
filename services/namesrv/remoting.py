"""The name server's RocketMQ-protocol handlers (docs/reference/remoting.md,
"Name server"): each parses a request's header fields and body, reads or
changes the same route table and KV store as the `ferry.v1` servicer, and
answers with RocketMQ 4.9's codes and bodies.

`handlers(...)` is the whole table the name server's RemotingServer serves.

One table for both protocols: a RocketMQ 4.x broker registering here (103)
joins the route table beside ferry's brokers (registered through ferry.v1),
under its RocketMQ-protocol address; route and cluster answers here give each
broker's RocketMQ-protocol address and leave out brokers that have none
(`RouteTable.route(topic, REMOTING)`). Such a broker is removed when the
connection it registered on closes (as Apache does), when it unregisters
(104), or when it stops registering for its heartbeat timeout (120 s).

Bad input (a missing or malformed header field, a body that is not what its
code expects) is answered with SYSTEM_ERROR and a remark naming the field, as
Apache answers a header it cannot decode; nothing is changed.

The admin token: RocketMQ's protocol has no place for ferry's token. With no
token configured everything is open, as in RocketMQ. With one, the codes that
change state are refused with NO_PERMISSION (use ferry.v1 with the token),
except broker registration (103, 104, 322) from the hosts in `broker_hosts`.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

from ferry.model import check_topic
from ferry.remoting import bodies, codes
from ferry.remoting.bodies import BodyError
from ferry.remoting.codec import Command
from ferry.remoting.discovery import GRPC_PORT_KEY, NAMESPACE
from ferry.remoting.headers import boolean, integer, text
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.namesrv import remoting_convert as rc
from services.namesrv.kvconfig import ORDER_TOPIC_CONFIG, KVConfigStore
from services.namesrv.metrics import NamesrvMetrics
from services.namesrv.routes import CONNECTION_LOST, REMOTING, RouteTable, StaleMaster

log = logging.getLogger(__name__)

# Apache's remark for a topic without a route, FAQ pointer included (clients show it).
NO_ROUTE_HINT = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
# Codes that change the tables; the broker ones may be let through by host.
ADMIN_CODES = frozenset(
    {
        codes.PUT_KV_CONFIG,
        codes.DELETE_KV_CONFIG,
        codes.WIPE_WRITE_PERM_OF_BROKER,
        codes.ADD_WRITE_PERM_OF_BROKER,
        codes.DELETE_TOPIC_IN_NAMESRV,
    }
)
BROKER_CODES = frozenset({codes.REGISTER_BROKER, codes.UNREGISTER_BROKER, codes.QUERY_DATA_VERSION})
_BROKERS_STATE = "namesrv.brokers"  # connection.state: broker addr -> generation
_ROUTE_CACHE_LIMIT = 100_000


def handlers(
    routes: RouteTable,
    kv: KVConfigStore,
    grpc_port: Callable[[], int],
    *,
    metrics: NamesrvMetrics | None = None,
    admin_token: str = "",
    broker_hosts: Collection[str] = (),
    settings: Mapping[str, str] | None = None,
) -> dict[int, Handler]:
    """`grpc_port`: the bound port of this name server's ferry.v1 server,
    answered for GET_KV_CONFIG ferry.v1/grpcPort (ferry.remoting.discovery).
    `admin_token`: the name server's (only whether there is one matters here).
    `broker_hosts`: IP addresses or networks ("10.0.0.0/8") whose connections
    may register brokers when there is an admin token. `settings`: what
    GET_NAMESRV_CONFIG answers (key -> value)."""
    return _Handlers(
        routes, kv, grpc_port, metrics, admin_token, broker_hosts, settings or {}
    ).table()


def parse_hosts(hosts: Collection[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """`broker_hosts` as networks; a ValueError names the entry that is not one."""
    networks = []
    for host in hosts:
        try:
            networks.append(ipaddress.ip_network(host.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"broker host {host!r} is neither an IP address nor a network such as 10.0.0.0/8"
            ) from None
    return networks


class _Handlers:
    def __init__(
        self,
        routes: RouteTable,
        kv: KVConfigStore,
        grpc_port: Callable[[], int],
        metrics: NamesrvMetrics | None,
        admin_token: str,
        broker_hosts: Collection[str],
        settings: Mapping[str, str],
    ) -> None:
        self._routes = routes
        self._kv = kv
        self._grpc_port = grpc_port
        self._metrics = metrics
        self._guarded = bool(admin_token)
        self._broker_networks = parse_hosts(broker_hosts)
        # (topic, orderTopicConf) -> route JSON, valid for one route-table version.
        self._route_cache: dict[tuple[str, str], bytes] = {}
        self._settings = dict(settings)  # GET_NAMESRV_CONFIG's answer
        self._route_cache_version = -1

    def table(self) -> dict[int, Handler]:
        served: dict[int, Callable[[Connection, Command], Awaitable[Command]]] = {
            codes.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            codes.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            codes.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            codes.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topics,
            codes.GET_NAMESRV_CONFIG: self.get_config,
            codes.UPDATE_NAMESRV_CONFIG: self.update_config,
            codes.PUT_KV_CONFIG: self.put_kv_config,
            codes.GET_KV_CONFIG: self.get_kv_config,
            codes.DELETE_KV_CONFIG: self.delete_kv_config,
            codes.GET_KVLIST_BY_NAMESPACE: self.get_kv_list,
            codes.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm,
            codes.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm,
            codes.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            codes.REGISTER_BROKER: self.register_broker,
            codes.UNREGISTER_BROKER: self.unregister_broker,
            codes.QUERY_DATA_VERSION: self.query_data_version,
        }
        return {code: self._wrap(code, fn) for code, fn in served.items()}

    def _wrap(self, code: int, fn: Callable[[Connection, Command], Awaitable[Command]]) -> Handler:
        guarded = code in ADMIN_CODES or code in BROKER_CODES

        async def handle(connection: Connection, request: Command) -> Command:
            if guarded and self._guarded:
                refusal = self._refusal(connection, request)
                if refusal is not None:
                    return refusal
            try:
                return await fn(connection, request)
            except StaleMaster as e:
                log.warning(
                    "refused stale master addr=%s group=%s epoch=%d group_epoch=%d (registered by %s)",
                    e.broker_addr, e.broker_name, e.epoch, e.group_epoch, e.group_addr,
                )  # fmt: skip
                return request.answer(codes.SYSTEM_ERROR, e.message)
            except (errors.FerryError, BodyError) as e:
                return request.answer(codes.SYSTEM_ERROR, str(e))

        return handle

    def _refusal(self, connection: Connection, request: Command) -> Command | None:
        if request.code in BROKER_CODES and self._broker_host(connection.remote):
            return None
        what = (
            "registering brokers is allowed only from the name server's broker hosts"
            if request.code in BROKER_CODES
            else "use ferry.v1 with the admin token (e.g. the ferry CLI with --admin-token)"
        )
        log.warning(
            "refused code %d from %s: admin token required", request.code, connection.remote
        )
        return request.answer(
            codes.NO_PERMISSION,
            f"request code {request.code} changes state and this name server requires an admin "
            f"token, which RocketMQ's protocol cannot carry; {what}",
        )

    def _broker_host(self, remote: str) -> bool:
        host = remote.rpartition(":")[0].strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self._broker_networks)

    # ------------------------------------------------------------ routes

    async def get_route(self, connection: Connection, request: Command) -> Command:
        topic = text(request.ext, "topic")
        try:
            check_topic(topic)
        except errors.InvalidArgument as e:
            # No such topic can exist: 17 as for any other topic without a route.
            remark = f"No topic route info in name server for the topic: {topic[:200]} ({e.reason})"
            return request.answer(codes.TOPIC_NOT_EXIST, remark + NO_ROUTE_HINT)
        boolean(
            request.ext, "acceptStandardJsonOnly"
        )  # checked; the answer is standard JSON anyway
        order_conf = self._kv.get(ORDER_TOPIC_CONFIG, topic) or ""
        if self._route_cache_version != self._routes.version:
            self._route_cache.clear()
            self._route_cache_version = self._routes.version
        body = self._route_cache.get((topic, order_conf))
        if body is None:
            try:
                route = self._routes.route(topic, REMOTING)
            except errors.NotFound as e:
                return request.answer(codes.TOPIC_NOT_EXIST, e.message + NO_ROUTE_HINT)
            body = rc.route_json(route, order_conf)
            if len(self._route_cache) < _ROUTE_CACHE_LIMIT:
                self._route_cache[(topic, order_conf)] = body
        return request.answer(codes.SUCCESS, body=body)

    async def get_cluster_info(self, connection: Connection, request: Command) -> Command:
        groups, clusters = self._routes.cluster_view(REMOTING)
        return request.answer(codes.SUCCESS, body=rc.cluster_info_json(groups, clusters))

    async def get_all_topics(self, connection: Connection, request: Command) -> Command:
        return request.answer(codes.SUCCESS, body=rc.topic_list_json(self._routes.topics()))

    async def get_topics_by_cluster(self, connection: Connection, request: Command) -> Command:
        topics = self._routes.topics_by_cluster(text(request.ext, "cluster"))
        return request.answer(codes.SUCCESS, body=rc.topic_list_json(topics))

    async def get_system_topics(self, connection: Connection, request: Command) -> Command:
        """GET_SYSTEM_TOPIC_LIST_FROM_NS (304), as Apache's name server: every
        cluster's name and its groups' names (the topics each broker keeps
        named after them), and one broker's address, which the admin API then
        asks for its own system topics (305)."""
        groups, clusters = self._routes.cluster_view(REMOTING)
        topics = set(clusters)
        for names in clusters.values():
            topics.update(names)
        doc: dict[str, object] = {"topicList": sorted(topics)}
        for name in sorted(groups):
            addrs = groups[name].broker_addrs
            if addrs:
                doc["brokerAddr"] = addrs[min(addrs)]
                break
        return request.answer(codes.SUCCESS, body=bodies.dumps(doc))

    async def get_config(self, connection: Connection, request: Command) -> Command:
        """GET_NAMESRV_CONFIG (319, `mqadmin getNamesrvConfig`): this name
        server's settings as `key=value` lines, under Apache's names where it has
        them (ferry's own keys besides)."""
        lines = "".join(f"{k}={v}\n" for k, v in sorted(self._settings.items()))
        return request.answer(codes.SUCCESS, body=lines.encode())

    async def update_config(self, connection: Connection, request: Command) -> Command:
        """UPDATE_NAMESRV_CONFIG (318): refused, saying why; ferry's name server
        takes its settings from its command line only."""
        return request.answer(
            codes.SYSTEM_ERROR,
            "ferry's name server takes its settings from its command line (ferry namesrv "
            "--help): restart it with the new value; nothing was changed",
        )

    async def wipe_write_perm(self, connection: Connection, request: Command) -> Command:
        name = text(request.ext, "brokerName")
        count = self._routes.wipe_write_perm(name)
        log.info(
            "wiped write perm of broker group %s (%d topics) for %s", name, count, connection.remote
        )
        return request.answer(codes.SUCCESS, ext={"wipeTopicCount": count})

    async def add_write_perm(self, connection: Connection, request: Command) -> Command:
        name = text(request.ext, "brokerName")
        count = self._routes.add_write_perm(name)
        log.info(
            "added write perm of broker group %s (%d topics) for %s", name, count, connection.remote
        )
        return request.answer(codes.SUCCESS, ext={"addTopicCount": count})

    async def delete_topic(self, connection: Connection, request: Command) -> Command:
        topic = text(request.ext, "topic")
        cluster = text(request.ext, "clusterName", required=False)
        count = self._routes.delete_topic(topic, cluster)
        log.info("deleted topic %s from the routes of %d groups (cluster=%s) for %s",
                 topic, count, cluster or "*", connection.remote)  # fmt: skip
        return request.answer(codes.SUCCESS)

    # ------------------------------------------------------------ KV config

    async def put_kv_config(self, connection: Connection, request: Command) -> Command:
        namespace = text(request.ext, "namespace")
        key = text(request.ext, "key")
        value = text(request.ext, "value", allow_empty=True)
        if namespace == NAMESPACE:
            return self._reserved(request)
        await self._kv.put(namespace, key, value)
        return request.answer(codes.SUCCESS)

    async def get_kv_config(self, connection: Connection, request: Command) -> Command:
        namespace = text(request.ext, "namespace")
        key = text(request.ext, "key")
        if namespace == NAMESPACE and key == GRPC_PORT_KEY:
            return request.answer(codes.SUCCESS, ext={"value": str(self._grpc_port())})
        value = self._kv.get(namespace, key)
        if value is None:
            return request.answer(
                codes.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return request.answer(codes.SUCCESS, ext={"value": value})

    async def delete_kv_config(self, connection: Connection, request: Command) -> Command:
        namespace = text(request.ext, "namespace")
        key = text(request.ext, "key")
        if namespace == NAMESPACE:
            return self._reserved(request)
        await self._kv.delete(namespace, key)
        return request.answer(codes.SUCCESS)

    async def get_kv_list(self, connection: Connection, request: Command) -> Command:
        namespace = text(request.ext, "namespace")
        table = self._kv.namespace(namespace)
        if table is None:
            return request.answer(codes.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return request.answer(codes.SUCCESS, body=rc.kv_table_json(table))

    def _reserved(self, request: Command) -> Command:
        return request.answer(
            codes.NO_PERMISSION,
            f"namespace {NAMESPACE} is the name server's own (its {GRPC_PORT_KEY} is the "
            "ferry.v1 port); it cannot be changed",
        )

    # ------------------------------------------------------------ brokers

    async def register_broker(self, connection: Connection, request: Command) -> Command:
        # A registration can carry 100,000 topics: no full GC passes mid-apply
        # (nothing awaits in between).
        gc.disable()
        try:
            try:
                reg = rc.registration(
                    request.ext, request.body, instance_id=f"remoting/{connection.remote}"
                )
            except rc.CrcMismatch:
                log.warning("registration from %s: crc32 not match", connection.remote)
                return request.answer(codes.SYSTEM_ERROR, "crc32 not match")
            result = self._routes.register(reg)
        finally:
            gc.enable()
        if self._metrics is not None:
            self._metrics.registered(result.topic_config_applied)
        live = self._routes.live[reg.broker_addr]
        self._watch(connection, reg.broker_addr, live.generation)
        if result.replaced_master:
            log.info("new master addr=%s group=%s replaces addr=%s",
                     reg.broker_addr, reg.broker_name, result.replaced_master)  # fmt: skip
        ext = {}
        if result.master_addr:
            ext["masterAddr"] = result.master_addr
        if result.ha_server_addr:
            ext["haServerAddr"] = result.ha_server_addr
        table = self._kv.namespace(ORDER_TOPIC_CONFIG)
        body = rc.kv_table_json(table) if table is not None else b""
        return request.answer(codes.SUCCESS, ext=ext, body=body)

    async def unregister_broker(self, connection: Connection, request: Command) -> Command:
        removal = self._routes.unregister(
            text(request.ext, "clusterName"),
            text(request.ext, "brokerAddr"),
            text(request.ext, "brokerName"),
            integer(request.ext, "brokerId", low=0),
        )
        if self._metrics is not None:
            self._metrics.removed([removal])
        if removal is not None:
            log.info("unregistered broker addr=%s group=%s id=%d (RocketMQ protocol, from %s)",
                     removal.broker_addr, removal.broker_name, removal.broker_id,
                     connection.remote)  # fmt: skip
        return request.answer(codes.SUCCESS)

    async def query_data_version(self, connection: Connection, request: Command) -> Command:
        cluster = text(request.ext, "clusterName")
        addr = text(request.ext, "brokerAddr")
        name = text(request.ext, "brokerName")
        broker_id = integer(request.ext, "brokerId", low=0)
        version = rc.data_version_body(request.body)
        changed, stored = self._routes.query_data_version(cluster, addr, name, broker_id, version)
        body = rc.data_version_json(stored) if stored is not None else b""
        return request.answer(codes.SUCCESS, ext={"changed": changed}, body=body)

    def _watch(self, connection: Connection, addr: str, generation: int) -> None:
        """Remove the broker when the connection it registered on closes (its
        registration then is still this one), as Apache does."""
        watched = connection.state.get(_BROKERS_STATE)
        if watched is None:
            watched = connection.state[_BROKERS_STATE] = {}
            connection.on_close(self._connection_closed)
        watched[addr] = generation

    def _connection_closed(self, connection: Connection) -> None:
        if connection.server_stopping:
            return  # our shutdown, not the brokers' doing
        for addr, generation in connection.state.get(_BROKERS_STATE, {}).items():
            removal = self._routes.remove_if_current(addr, generation, CONNECTION_LOST)
            if self._metrics is not None:
                self._metrics.removed([removal])
            if removal is not None:
                log.warning("connection %s of broker addr=%s closed; removed it from the routes",
                            connection.remote, addr)  # fmt: skip
