"""Composition root of a broker: builds the store, metadata, use cases,
servicers, registrar and background tasks from a `BrokerConfig`, and owns the
start/stop order.

Two doors, one broker: `listenPort` (10911) and `fastListenPort` (10909)
speak RocketMQ's protocol (services.broker.remoting's handlers), and
`grpcListenPort` (10915) speaks ferry.v1 gRPC; both call the same use cases.
Records' store host (and so every offsetMsgId) is brokerIP1 with the bound
RocketMQ-protocol port, as RocketMQ's clients expect.

Start (`start` reads as these steps): recover the store (before anything
listens) → open metadata → build the use cases and servicers → bind the gRPC
server, the RocketMQ-protocol ports and the metrics endpoint (built by
servers.py) → start the dispatcher/flusher, HA, the delay scheduler (masters)
and the offset persister → SERVING → register with every name server → the
ready line and the port file. Stop: NOT_SERVING → unregister from every name
server → stop the RocketMQ-protocol server, then the gRPC
server (each with the grace) → close the local proxy's loopback channel →
stop background tasks → close the store cleanly (flush, checkpoint, remove
`abort`) → persist metadata. A failover run (`incarnation`) binds no server:
it mounts its servicers on the failover node's gRPC server and installs its
RocketMQ-protocol table on the node's listener, and takes both away where it
would stop them.

With `enableProxy=true` a master also serves `apache.rocketmq.v2.MessagingService`
(RocketMQ's proxy in local mode) on its gRPC port: the proxy's own servicer,
with `LocalRoutes` answering from this broker's topic table and calling this
broker's `ferry.v1` port over loopback. A slave does not serve it (it can
neither take sends nor hand out pops); the SDKs get UNIMPLEMENTED there, as
from any broker without the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from ferry.model import TopicConfig, revive_topic
from ferry.remoting.local import LocalLink
from ferry.remoting.server import RemotingServer
from ferry.runtime.clock import Clock, SystemClock
from ferry.runtime.errors import FerryError, StorageFault
from ferry.runtime.files import atomic_write_bytes
from ferry.runtime.metrics_http import MetricsEndpoint
from ferry.runtime.server import GrpcServer, Service
from ferry.runtime.tls import ClientTLS, server_ssl_context
from services.broker.api.servicer import (
    BrokerAdminServicer,
    BrokerServicer,
    Gate,
    HAAdminServicer,
    SlaveSyncServicer,
)
from services.broker.api.transactions import TransactionsServicer
from services.broker.cluster.replication import SyncReplication
from services.broker.cluster.slave_sync import SlaveSyncLoop
from services.broker.config import BrokerConfig
from services.broker.incarnation import Incarnation
from services.broker.messaging.access import BrokerAccess, BrokerPermission
from services.broker.messaging.admin import AdminService
from services.broker.messaging.autocreate import TopicAutoCreate
from services.broker.messaging.filters import Filters
from services.broker.messaging.outgoing import SendStatus
from services.broker.messaging.pull import PullService, hot_bytes_of
from services.broker.messaging.replication import HAParts, ReplicationStatus
from services.broker.messaging.send import SendObservers, SendService, Settler
from services.broker.messaging.sendback import SendBack
from services.broker.messaging.staging import Stager
from services.broker.messaging.statistics import StatisticsService
from services.broker.metadata.defaults import default_topics
from services.broker.metadata.metadata_log import MetadataLog
from services.broker.metadata.tables import BrokerMetadata
from services.broker.metrics import BrokerMetrics, BrokerStateCollector
from services.broker.pop import PopConfig, PopService
from services.broker.remoting import connection_closed as remoting_connection_closed
from services.broker.remoting import handlers as remoting_handlers
from services.broker.remoting import housekeeping as remoting_housekeeping
from services.broker.remoting.deps import Deps
from services.broker.remoting.sends import InProcessSends, Sends
from services.broker.schedule.delay import DelayScheduler
from services.broker.schedule.timer import TimerService
from services.broker.servers import (
    ADD,
    ADMIN_SERVICE,
    BROKER_SERVICE,
    HA_ADMIN_SERVICE,
    SLAVE_SYNC_SERVICE,
    TRANSACTIONS_SERVICE,
    grpc_server,
    listen_remoting,
    load_acl_file,
    metrics_endpoint,
    proxy_door,
    remoting_server,
    rocketmq_v2_service,
)
from services.broker.store import (
    FlushDiskType,
    IndexConfig,
    MessageStore,
    RetentionConfig,
    StoreConfig,
)
from services.broker.transactions import TransactionConfig, TransactionService
from services.ha.master import HAMaster, HAMasterConfig
from services.ha.slave import HASlave, HASlaveConfig
from services.ha.sync import ReplicaAcks

if TYPE_CHECKING:
    from ferry.runtime.acl_file import AclFile
    from ferry.runtime.swap import Mount
    from services.broker.cluster.registration import Registrar
    from services.proxy.routes import LocalRoutes
    from services.proxy.servicer import MessagingServicer

log = logging.getLogger(__name__)


def _ha_server_ssl(cfg: BrokerConfig) -> ssl.SSLContext:
    """The master's side of the HA stream over TLS; with tlsClientCa, slaves must
    present a certificate it signed."""
    return server_ssl_context(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca or None)


def _ha_client_ssl(cfg: BrokerConfig) -> ssl.SSLContext:
    """The slave's side: the master's certificate must chain to tlsCa and name the
    address dialled; tlsCert, when set, is presented as the slave's."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls_ca)
    if cfg.tls_cert:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    return ctx


def store_config_of(cfg: BrokerConfig) -> StoreConfig:
    """The store's settings from the broker's."""
    return StoreConfig(
        root=cfg.store_root,
        commit_log_file_size=cfg.commit_log_file_size,
        consume_queue_entries_per_file=cfg.consume_queue_entries_per_file,
        flush_disk_type=FlushDiskType(cfg.flush_disk_type),
        flush_interval_s=cfg.flush_interval_s,
        sync_flush_timeout_s=cfg.sync_flush_timeout_s,
        store_host=(_ipv4_or_loopback(cfg.broker_ip1), cfg.listen_port),
        delay_levels_s=tuple(cfg.message_delay_levels_s),
        retention=RetentionConfig(
            file_reserved_time_s=cfg.file_reserved_time_s,
            delete_when_hours=cfg.delete_when_hours,
            disk_max_used_space_ratio=cfg.disk_max_used_space_ratio,
            disk_space_clean_forcibly_ratio=cfg.disk_space_clean_forcibly_ratio,
            disk_space_warning_level_ratio=cfg.disk_space_warning_level_ratio,
            clean_file_forcibly_enable=cfg.clean_file_forcibly_enable,
            delete_files_interval_s=cfg.delete_commit_log_files_interval_s,
            check_interval_s=cfg.clean_resource_interval_s,
        ),
        index=IndexConfig(
            enabled=cfg.message_index_enable,
            max_hash_slot_num=cfg.max_hash_slot_num,
            max_index_num=cfg.max_index_num,
        ),
    )


class Announcements:
    """The admin use case's `TopicAnnouncer`: topic changes go to the name
    servers through the app's registrar, from when the app has one.

    It exists because of the start order. The admin use case is built with the
    other use cases, before anything listens; the registrar only once the ports
    are bound (its registrations carry them), as the last step of start. A change
    made before then has nowhere to go and needs nowhere: the registrar's first,
    full registration carries every topic. Without name servers there is never
    a registrar, and nothing is announced. The app owns it and alone says which
    registrar it goes through (`through`)."""

    def __init__(self) -> None:
        self._registrar: Registrar | None = None

    def through(self, registrar: Registrar) -> None:
        """Announce through `registrar` from now on (the app's, before it starts)."""
        self._registrar = registrar

    async def announce_topics(self, configs: Sequence[TopicConfig]) -> None:
        """New or changed topics to the name servers (none before registration starts)."""
        if self._registrar is not None:
            await self._registrar.register_topics(configs)

    async def announce_all(self) -> None:
        if self._registrar is not None:
            await self._registrar.register_all(force=True)


class SlaveFollower:
    """What follows the master the name servers name (the registrar's
    `MasterFollower`; a master's registrar never calls it): the master's address
    as the admin use case reports it, the HA slave's master and the metadata
    sync's. Built with the registrar, once the HA slave and the sync exist."""

    def __init__(
        self, admin: AdminService, ha_slave: HASlave | None, slave_sync: SlaveSyncLoop | None
    ) -> None:
        """`ha_slave`: None where the HA master's address comes from elsewhere
        (failover: etcd) or there is no HA slave."""
        self.admin = admin
        self.ha_slave = ha_slave
        self.slave_sync = slave_sync

    def follow_master(self, master_addr: str, ha_addr: str) -> None:
        self.admin.master_addr = master_addr
        if self.ha_slave is not None:
            self.ha_slave.set_master(ha_addr)
        if self.slave_sync is not None:
            self.slave_sync.set_master(master_addr)
        log.info("master is now %s (HA %s)", master_addr or "unknown", ha_addr or "unknown")


class BrokerApp:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        incarnation: Incarnation | None = None,
    ) -> None:
        """`incarnation`: this run's role in an automatic-failover group
        (services.broker.failover.node), which restarts the app on every role change;
        None without failover. With one, the app mounts its servicers on the
        node's gRPC server, which outlives it, instead of running its own."""
        self.config = config
        self.incarnation = incarnation
        self.clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.gate = Gate()
        # TLS for this broker's own calls (name servers, the master's SlaveSync).
        self.client_tls = (
            ClientTLS.load(config.tls_ca, config.tls_cert or None, config.tls_key or None,
                           keys=("tlsCa", "tlsCert", "tlsKey"))
            if config.tls_ca else None
        )  # fmt: skip
        self.store: MessageStore | None = None
        self.metadata: BrokerMetadata | None = None
        self.registrar: Registrar | None = None  # with name servers
        # Topic changes to the name servers, through the registrar once there is one.
        self.announcements = Announcements()
        self.server: GrpcServer | None = None
        # RocketMQ's protocol: this app's own server (None with failover: the node's).
        self.remoting: RemotingServer | None = None
        self.remoting_deps: Deps | None = None  # the RocketMQ-protocol handlers' tables
        self._remoting_ports = (0, -1)  # (listenPort, fastListenPort) bound; -1: off
        self._mount: Mount | None = None  # failover: this run's servicers on the node's server
        self.scheduler: DelayScheduler | None = None
        self.pop: PopService | None = None
        self.send_back: SendBack | None = None
        self.timer: TimerService | None = None
        self.transactions: TransactionService | None = None  # masters
        self.sends: SendService | None = None  # every door's one send call
        self.auto_create: TopicAutoCreate | None = None  # masters: topics created by a send
        self.pulls: PullService | None = None
        self.statistics: StatisticsService | None = None
        # Where replication stands, for GetHAStatus and RocketMQ's 907 (read at each call).
        self.ha_status = ReplicationStatus(self)
        self.acks: ReplicaAcks | None = None
        self.replication: SyncReplication | None = None  # SYNC_MASTER: sends wait for a slave
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.metrics: BrokerMetrics | None = None
        self.slave_sync: SlaveSyncLoop | None = None
        self.journal: MetadataLog | None = None  # failover: services.broker.metadata.metadata_log
        # enableProxy on a master: the SDKs' MessagingService and its routes.
        self.proxy: MessagingServicer | None = None
        self.local_routes: LocalRoutes | None = None
        self.proxy_door: GrpcServer | None = None  # its native door on grpcServerPort
        self.permission = BrokerPermission(config.broker_permission)
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._tasks: list[asyncio.Task] = []
        self._fault_watch: asyncio.Task | None = None
        self._stopped = False
        self.recovery = None
        # Set once the broker has stopped after a storage fault: the process exits non-zero.
        self.failed = asyncio.Event()

    # ------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        """The ferry.v1 gRPC port (bound)."""
        return self.server.port if self.server else 0

    @property
    def proxy_port(self) -> int:
        """The SDKs' native door's port (enableProxy, bound); -1 when there is none."""
        return self.proxy_door.port if self.proxy_door is not None else -1

    @property
    def remoting_port(self) -> int:
        """The RocketMQ-protocol port (listenPort, bound)."""
        return self._remoting_ports[0]

    @property
    def fast_port(self) -> int:
        """The RocketMQ-protocol VIP port (fastListenPort, bound; -1: off)."""
        return self._remoting_ports[1]

    @property
    def remoting_addr(self) -> str:
        """The advertised RocketMQ-protocol address: what routes give RocketMQ's clients."""
        return f"{self.config.broker_ip1}:{self.remoting_port}"

    @property
    def metrics_port(self) -> int:
        if self.incarnation is not None:  # served by the failover node, across roles
            return self.incarnation.metrics_port
        return self._metrics_endpoint.port if self._metrics_endpoint else -1

    @property
    def addr(self) -> str:
        """The advertised ferry.v1 gRPC address."""
        return f"{self.config.broker_ip1}:{self.port}"

    @property
    def ha_addr(self) -> str:
        """The HA address registered: a master's listening port; a slave (which
        does not listen) registers its configured port, or none for port 0."""
        port = self.ha_master.port if self.ha_master else self.config.ha_listen_port
        return f"{self.config.ha_host}:{port}" if port else ""

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """The module docstring's order, one named step each: config → parts (the
        store recovered before anything listens, then the use cases and their
        servicers) → serve → background tasks → SERVING → register → ready."""
        # Before anything is recovered or bound: a bad ACL file stops startup at once.
        acl = load_acl_file(self.config) if self.incarnation is None else None
        store_config = store_config_of(self.config)
        store, metadata = await self._open_store(store_config)
        self._build_use_cases(store, metadata)
        await self._serve(self._servicers(metadata, store_config), store, metadata, acl)
        await self._start_log(store)
        await self._start_tasks(store, metadata)
        await self._start_serving()
        await self._register(metadata)
        self._ready(store)

    async def _open_store(self, store_config: StoreConfig) -> tuple[MessageStore, BrokerMetadata]:
        """The store, recovered, and the metadata tables (a master's ReplicaAcks
        first: the store reads it)."""
        cfg = self.config
        incarnation = self.incarnation
        # Every part gets its collaborators through its constructor, so the
        # order below is the dependency order. A master's ReplicaAcks (the HA
        # in-sync set) comes first: the store reads its confirmed offset, and
        # it tells the store when that moves.
        acks = None
        if incarnation is not None:
            acks = incarnation.acks  # failover: the node's, counted by its in-sync set
        elif cfg.is_master:
            acks = ReplicaAcks(
                cfg.ha_max_gap_not_in_sync, on_confirmed=lambda _: store.notify_confirmed()
            )
        self.acks = acks
        confirmed = None
        if acks is not None and cfg.effective_visibility == "confirmed":
            confirmed = lambda: acks.confirmed  # noqa: E731 - read at each check
        self.store = store = MessageStore(store_config, self.clock, confirmed=confirmed)
        self.recovery = await asyncio.to_thread(store.open)
        self.metadata = metadata = BrokerMetadata.open(
            cfg.config_dir, self.clock, on_fault=store.failstop.trip
        )
        persisted = metadata.settings.broker_permission
        if persisted is not None:
            # Set by UpdateBrokerPermission: wins over broker.conf, from the first registration.
            if persisted != cfg.broker_permission:
                log.warning(
                    "brokerPermission=%d from %s (set by UpdateBrokerPermission) overrides "
                    "brokerPermission=%d from the broker config; to change it, call "
                    "UpdateBrokerPermission again (there is no ferry command for it), e.g. "
                    "grpcurl %s-d '{\"broker_permission\": %d}' %s:%d "
                    "ferry.v1.BrokerAdmin/UpdateBrokerPermission",
                    persisted,
                    metadata.settings.path,
                    cfg.broker_permission,
                    "" if cfg.tls_cert else "-plaintext ",
                    cfg.broker_permission,
                    cfg.broker_ip1,
                    cfg.grpc_port,
                )
            self.permission.set(persisted)
        if not cfg.is_slave:  # a slave's table is its master's
            for config in default_topics(cfg):
                metadata.topics.ensure_system_topic(config)
        return store, metadata

    def _build_use_cases(self, store: MessageStore, metadata: BrokerMetadata) -> None:
        """Metrics, a master's HA master (built here, listening from `_start_ha`),
        the SYNC_MASTER acknowledgement policy and the use cases (send and pull,
        timers, pop and transactions on a master, the failover metadata log,
        admin, statistics)."""
        cfg = self.config
        incarnation = self.incarnation
        acks = self.acks
        identity = (cfg.cluster_name, cfg.broker_name, cfg.broker_id, cfg.broker_role)
        self.metrics = metrics = BrokerMetrics(self.registry, cfg, timed=not cfg.is_slave)
        if cfg.is_master:
            # Built here, started with the rest of HA (`_start_ha`): the
            # acknowledgement policy pushes a send's bytes through it.
            self.ha_master = self._ha_master(store)
        if acks is not None and cfg.broker_role == "SYNC_MASTER":
            # The acknowledgement policy: a send waits for the in-sync set.
            self.replication = SyncReplication(
                acks,
                cfg.slave_timeout_s,
                store,
                failover=incarnation is not None,
                min_in_sync_replicas=cfg.min_in_sync_replicas,
                slave_timeouts=incarnation.slave_timeouts if incarnation else None,
                observer=metrics,
                push=self.ha_master,
            )
        fence = incarnation.fence if incarnation is not None else None
        if incarnation is not None:
            # Failover: topic and group changes are records of the replicated
            # log, acknowledged once the in-sync set has them.
            self.journal = MetadataLog(
                store,
                metadata,
                cfg.config_dir,
                self.clock,
                replicate=self._replicate_change,
                fence=fence,
            )
        self.admin = admin = AdminService(
            identity,
            metadata,
            store,
            self.clock,
            self.permission,
            journal=None if cfg.is_slave else self.journal,
            announcer=self.announcements,
            allow_mixed_message_type=cfg.enable_mixed_message_type,
        )
        # The send and pull use cases, and what they share: the broker's
        # access checks and the wait that acknowledges a send.
        access = BrokerAccess(
            metadata.topics, self.permission, cfg.is_slave, cfg.broker_name, fence=fence
        )
        stager = Stager(
            store,
            access,
            cfg.max_message_size,
            groups=metadata.subscription_groups,
            topic_creator=admin,
            timer_max_delay_s=cfg.timer_max_delay_s,
        )
        self.pulls = PullService(
            store,
            access,
            groups=metadata.subscription_groups,
            lookups=metrics,
            slave_read_enable=cfg.slave_read_enable,
            hot_bytes=hot_bytes_of(cfg.access_message_in_memory_percent),
            filters=Filters(cfg.enable_property_filter),
        )
        # Stored sends count in the metrics and in the figures mqadmin reads (315).
        observers = SendObservers(metrics, self.pulls.stats)
        settler = Settler(store, fence, self.replication, observer=observers)
        if not cfg.is_slave:
            # Masters run timed delivery and pop consumption; slaves hold their
            # records (HA copies them) and run neither.
            self.timer = TimerService(
                store,
                metadata.topics,
                metadata.consumer_offsets,
                self.clock,
                observer=metrics,
            )
            self.pop = PopService(
                store,
                metadata.topics,
                metadata.subscription_groups,
                metadata.consumer_offsets,
                self.clock,
                PopConfig(
                    broker_name=cfg.broker_name,
                    revive_topic=revive_topic(cfg.cluster_name),
                    backoff_s=tuple(cfg.message_delay_levels_s),
                    auto_create_group=cfg.auto_create_subscription_group,
                    hot_bytes=self.pulls.hot_bytes,
                ),
                access=access,
                topic_creator=admin,
                timers=self.timer,
                filters=self.pulls.filters,
            )
            self.transactions = TransactionService(
                store,
                stager,
                settler,
                metadata.topics,
                metadata.consumer_offsets,
                self.clock,
                TransactionConfig(
                    timeout_ms=cfg.transaction_timeout_ms,
                    check_interval_ms=cfg.transaction_check_interval_ms,
                    check_max=cfg.transaction_check_max,
                ),
            )
        # Every door's one send call: halves go to the transaction use case (a master's).
        self.sends = SendService(stager, settler, access, self.transactions)
        if not cfg.is_slave:
            # A RocketMQ producer's first send to a new topic creates it (TBW102).
            self.auto_create = TopicAutoCreate(access, admin, cfg.auto_create_topic_enable)
        # A consumer's failed message back to its retry topic (RocketMQ's send-back).
        self.send_back = SendBack(
            store,
            access,
            settler,
            metadata.subscription_groups,
            admin,
            cfg.auto_create_subscription_group,
        )
        self.statistics = StatisticsService(
            store,
            metadata,
            self.pulls.stats,
            admin,
            self.clock,
            cfg.flush_disk_type,
            cfg.store_root,
        )

    def _servicers(self, metadata: BrokerMetadata, store_config: StoreConfig) -> list[Service]:
        """The gRPC services over the use cases (and the SDKs' door with enableProxy)."""
        cfg = self.config
        sends, admin, statistics = self.sends, self.admin, self.statistics
        extra_services = []
        if cfg.enable_proxy and cfg.is_slave:
            log.warning(
                "enableProxy=true ignored: a SLAVE does not serve apache.rocketmq.v2 "
                "(it takes no sends and hands out no pops); SDKs use the master's port"
            )
        elif cfg.enable_proxy:
            extra_services.append(self._local_proxy(metadata))
        services = [
            Service(
                BROKER_SERVICE,
                BrokerServicer(
                    sends,
                    self.pulls,
                    metadata.consumer_offsets,
                    self.gate,
                    store_config.store_host,
                    pop=self.pop,
                    broker_name=cfg.broker_name,
                    send_stream_max_in_flight=cfg.send_stream_max_in_flight,
                    max_answer_bytes=cfg.grpc_max_message_size,
                ),
                ADD[BROKER_SERVICE],
            ),
            Service(
                ADMIN_SERVICE,
                BrokerAdminServicer(admin, statistics, self.gate),
                ADD[ADMIN_SERVICE],
            ),
            Service(
                SLAVE_SYNC_SERVICE,
                SlaveSyncServicer(
                    metadata,
                    self.gate,
                    log_position=self.journal.position if self.journal else None,
                ),
                ADD[SLAVE_SYNC_SERVICE],
            ),
            Service(HA_ADMIN_SERVICE, HAAdminServicer(self.ha_status), ADD[HA_ADMIN_SERVICE]),
            Service(
                TRANSACTIONS_SERVICE,
                TransactionsServicer(self.transactions, self.gate, cfg.broker_name),
                ADD[TRANSACTIONS_SERVICE],
            ),
            *extra_services,
        ]
        return services

    async def _serve(
        self,
        services: list[Service],
        store: MessageStore,
        metadata: BrokerMetadata,
        acl: AclFile | None,
    ) -> None:
        """Bind the gRPC server, the RocketMQ-protocol ports and the metrics
        endpoint (with failover: mount on the node's servers), still NOT_SERVING."""
        cfg = self.config
        self.remoting_deps = deps = Deps.from_app(self)
        table = remoting_handlers(deps)
        on_close = remoting_connection_closed(deps)
        if self.incarnation is not None and self.incarnation.switch is not None:
            # Failover: the node's servers outlive this run; serve on them (the
            # node passes its bound ports in the run's config).
            self.server = self.incarnation.server
            self._mount = self.incarnation.switch.mount({s.name: s.servicer for s in services})
            assert self.incarnation.serve_remoting is not None
            self.incarnation.serve_remoting(table, on_close)
            self._remoting_ports = (cfg.listen_port, cfg.fast_port)
            if self.proxy is not None and cfg.grpc_server_port >= 0:
                log.warning(
                    "grpcServerPort is not served with enableFailover (partial): the SDKs "
                    "reach this member's proxy on grpcListenPort, which moves with the leader"
                )
        else:
            self.server = grpc_server(cfg, services, self.registry, acl)
            await self.server.start()
            if self.proxy is not None and cfg.grpc_server_port >= 0:
                self.proxy_door = proxy_door(cfg, self.proxy, self.registry, acl)
                try:
                    await self.proxy_door.start()
                except OSError as exc:
                    raise OSError(
                        f"cannot listen on {cfg.bind_host}:{cfg.grpc_server_port} "
                        f"(grpcServerPort, the SDKs' door of enableProxy): {exc.strerror or exc}"
                    ) from None
            self.remoting = remoting_server(self.registry, table, on_close, acl)
            self._remoting_ports = await listen_remoting(cfg, self.remoting)
        # The store host in records is the advertised address with the real
        # RocketMQ-protocol port: offsetMsgIds lead RocketMQ's clients here.
        store.set_store_host((_ipv4_or_loopback(cfg.broker_ip1), self.remoting_port))
        deps.broker_addr = self.remoting_addr  # known once bound, as the store host
        if self.proxy is not None and self.proxy.remoting_sends is not None:
            # Local mode: the proxy calls this broker's RocketMQ-protocol handlers
            # in-process (no loopback socket), under the broker's own address.
            assert self.local_routes is not None
            metrics = self.remoting.metrics if self.remoting is not None else None
            link = LocalLink(lambda: table, metrics)
            self.proxy.remoting_sends.attach(self.remoting_addr, link)  # type: ignore[arg-type]
            # Sends skip even the in-process link's header and answer: they go to
            # the send door's own steps.
            self.proxy.remoting_sends.attach_local(
                self.remoting_addr, InProcessSends(Sends(deps), metrics)
            )
            self.local_routes.attach_remoting(self.remoting_addr)
        self.registry.register(
            BrokerStateCollector(
                store,
                metadata,
                self.permission.get,
                cfg,
                ha=lambda: (self.ha_master, self.ha_slave),
                pop=self.pop,
                timer=self.timer,
                journal=self.journal,
                transactions=self.transactions,
            )
        )
        if self.incarnation is None:
            self._metrics_endpoint = metrics_endpoint(cfg, self.registry)

    async def _start_log(self, store: MessageStore) -> None:
        """The dispatcher and flusher, then HA and the failover metadata log."""
        cfg = self.config
        await store.start()
        if self.incarnation is not None:
            # Before HA or any send: a new leader records its epoch, a follower
            # cuts what its new leader does not have.
            await self.incarnation.epoch_start.start_epoch(store)
        if self.journal is not None:
            self.journal.open()
        await self._start_ha(store)
        if self.journal is not None and cfg.is_slave:
            self._tasks.append(asyncio.create_task(self.journal.follow(), name="metadata-log"))
        elif self.journal is not None:
            # A new master has every acknowledged change before its first send.
            await self.journal.take_over()

    async def _start_tasks(self, store: MessageStore, metadata: BrokerMetadata) -> None:
        """The background tasks: delay scheduler, timers and pop revive (masters),
        transaction checks, the offset persister, traffic rates, RocketMQ clients'
        expiry, and the fail-stop watch."""
        cfg = self.config
        deps = self.remoting_deps
        if not cfg.is_slave:
            self.scheduler = DelayScheduler(
                store, metadata.delay_offsets, metadata.topics, self.clock
            )
            self._tasks.append(asyncio.create_task(self.scheduler.run(), name="delay-scheduler"))
        if self.timer is not None and self.pop is not None:
            await self.timer.load()
            await self.pop.load()
            # Retention keeps the files their pending state is in.
            store.hold_files("timed messages not yet delivered", self.timer.held_from)
            store.hold_files("unresolved pop checkpoints", self.pop.held_from)
            self._tasks.append(asyncio.create_task(self.timer.run(), name="timer"))
            self._tasks.append(asyncio.create_task(self.pop.run(), name="pop-revive"))
        if self.transactions is not None:
            # Every start as master (failover included): the pending halves, and
            # the op record of a commit cut off at the log's end.
            await self.transactions.load()
            store.hold_files("undecided transactional halves", self.transactions.held_from)
            self._tasks.append(
                asyncio.create_task(self.transactions.run(), name="transaction-check")
            )
        self._tasks.append(asyncio.create_task(self._persist_offsets(), name="offset-persister"))
        self._tasks.append(asyncio.create_task(self.pulls.stats.run(), name="traffic-stats"))
        # RocketMQ's clients: members silent for 120 s and dead queue locks expire.
        self._tasks.append(
            asyncio.create_task(remoting_housekeeping(deps), name="remoting-housekeeping")
        )
        self._fault_watch = asyncio.create_task(self._stop_on_storage_fault(), name="fail-stop")

    async def _start_serving(self) -> None:
        """SERVING: the gate opens and health says so."""
        assert self.server is not None
        self.gate.open = True
        await self.server.set_serving(None if self._mount is None else self._mount.servicers)
        if self.proxy_door is not None:
            await self.proxy_door.set_serving()

    async def _register(self, metadata: BrokerMetadata) -> None:
        """Register with every name server (and keep registering)."""
        cfg = self.config
        if cfg.namesrv_addrs:
            from services.broker.cluster.registration import BrokerIdentity, Registrar

            epoch = self.incarnation.epoch if self.incarnation is not None else 0

            self.registrar = Registrar(
                cfg.namesrv_addrs,
                BrokerIdentity(
                    cluster_name=cfg.cluster_name,
                    broker_name=cfg.broker_name,
                    broker_id=cfg.broker_id,
                    broker_addr=self.addr,
                    remoting_addr=self.remoting_addr,
                    ha_server_addr=self.ha_addr,
                    broker_role=cfg.broker_role,
                    metrics_addr=(
                        f"{cfg.broker_ip1}:{self.metrics_port}" if self.metrics_port > 0 else ""
                    ),
                    epoch=epoch,
                ),
                topics=metadata.topics,
                permission=self.permission,
                clock=self.clock,
                period_s=cfg.effective_register_period_s,
                timeout_s=cfg.register_timeout_s,
                force_register=cfg.force_register,
                master_follower=SlaveFollower(
                    self.admin,
                    # Failover: the leader's HA address comes from etcd, not the name server.
                    self.ha_slave if self.incarnation is None else None,
                    self.slave_sync,
                ),
                order_topics=None if cfg.is_slave else self.admin,
                admin_token=cfg.admin_token,
                tls=self.client_tls,
            )
            self.announcements.through(self.registrar)
            await self.registrar.start()
        else:
            log.warning("no name server configured (namesrvAddr): running standalone")

    def _ready(self, store: MessageStore) -> None:
        """The ready line, then the port file."""
        cfg = self.config
        log.info(
            "broker ready: cluster=%s name=%s id=%d role=%s rocketmq=%s%s grpc=%s%s metrics=%d "
            "store=%s commit_log=[%d,%d)",
            cfg.cluster_name,
            cfg.broker_name,
            cfg.broker_id,
            cfg.broker_role,
            self.remoting_addr,
            f" (vip {self.fast_port})" if self.fast_port >= 0 else "",
            self.addr,
            f" sdk-door={cfg.broker_ip1}:{self.proxy_port}" if self.proxy_port >= 0 else "",
            self.metrics_port,
            cfg.store_root,
            store.min_offset,
            store.max_offset,
        )
        # The port file last: whoever sees it finds the ready line in the log already.
        if cfg.port_file:
            info = {
                "remoting_port": self.remoting_port,
                "fast_port": self.fast_port,
                "grpc_port": self.port,
                "metrics_port": self.metrics_port,
                "ha_port": self.ha_master.port if self.ha_master else cfg.ha_listen_port,
                "health_port": self.server.health_port,
                "proxy_port": self.proxy_port,
                "pid": os.getpid(),
            }
            atomic_write_bytes(Path(cfg.port_file), json.dumps(info).encode())

    async def _stop_on_storage_fault(self) -> None:
        """Fail-stop (failstop.py): after a storage fault, leave the name servers
        and stop serving, without a clean store close, then tell the process to
        exit non-zero so that its supervisor restarts it and recovery runs."""
        assert self.store is not None
        await self.store.failstop.wait()
        self.gate.open = False
        try:
            await self.stop()
        finally:
            self.failed.set()

    async def stop(self, grace_s: float | None = None) -> None:
        """`grace_s`: how long in-flight calls may finish (default: the config's)."""
        if self._stopped:
            return
        self._stopped = True
        if self._fault_watch is not None and self._fault_watch is not asyncio.current_task():
            self._fault_watch.cancel()
        self.gate.open = False
        if self.server is not None:
            await self.server.set_not_serving()
        if self.proxy_door is not None:
            await self.proxy_door.set_not_serving()
        if self.registrar is not None:
            await self.registrar.stop()
        if self.slave_sync is not None:
            await self.slave_sync.stop()
        if self.ha_slave is not None:
            await self.ha_slave.stop()
        if self.ha_master is not None:
            await self.ha_master.stop()
        grace_s = self.config.grace_s if grace_s is None else grace_s
        if self.incarnation is not None and self.incarnation.serve_remoting is not None:
            self.incarnation.serve_remoting(None)  # the listener stays
        if self.remoting is not None:
            await self.remoting.stop(grace_s)
        if self._mount is not None and self.incarnation is not None:
            assert self.incarnation.switch is not None
            await self.incarnation.switch.unmount(self._mount, grace_s)  # the server stays
        elif self.server is not None:
            await self.server.stop(grace_s)
        if self.proxy_door is not None:
            await self.proxy_door.stop(grace_s)
        if self.proxy is not None:
            await self.proxy.close()
        if self.local_routes is not None:
            await self.local_routes.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.store is not None:
            await self.store.stop()
        if self.metadata is not None:
            try:
                self._checkpoint_pop()
                self.metadata.persist_all()
            except (OSError, FerryError) as exc:
                log.error("could not persist metadata at shutdown: %s", exc)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        log.info("broker stopped")

    # ------------------------------------------------------------ internals

    def _local_proxy(self, metadata: BrokerMetadata) -> Service:
        """`apache.rocketmq.v2.MessagingService` backed by this broker alone
        (enableProxy): its routes come from the topic table and its broker calls
        go to this broker's own port, dialled over loopback once bound."""
        from services.proxy.routes import LocalRoutes
        from services.proxy.servicer import MessagingServicer, ProxyOptions

        cfg = self.config
        host = "127.0.0.1" if cfg.bind_host in ("0.0.0.0", "") else cfg.bind_host
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", cfg.grpc_max_message_size),
            ("grpc.max_send_message_length", cfg.grpc_max_message_size),
        ]
        if cfg.tls_cert:  # dialled at loopback, checked against the advertised name
            options.append(("grpc.ssl_target_name_override", cfg.broker_ip1))
        self.local_routes = LocalRoutes(
            cfg.broker_name,
            lambda: f"{host}:{self.port}",
            metadata.topics.get,
            self.permission.get,
            tls=self.client_tls if cfg.tls_cert else None,
            channel_options=options,
        )
        # Routes name this broker's advertised address when an SDK does not say.
        self.proxy = MessagingServicer(
            self.local_routes,
            ProxyOptions(
                lambda: (cfg.broker_ip1, self.proxy_port if self.proxy_port >= 0 else self.port),
                cfg.max_message_size,
                topic_message_type_check=cfg.enable_topic_message_type_check,
                min_invisible_ms=cfg.min_invisible_time_ms_for_recv,
            ),
        )
        name, add = rocketmq_v2_service()
        return Service(name, self.proxy, add)

    def _ha_master(self, store: MessageStore) -> HAMaster:
        """A master's side of the HA data plane, not listening yet: it streams
        the log to slaves, whose acks its ReplicaAcks counts."""
        cfg = self.config
        acks = self.acks
        assert acks is not None
        return HAMaster(
            HAMasterConfig(
                host=cfg.bind_host,
                port=cfg.ha_listen_port,
                transfer_batch_bytes=cfg.ha_transfer_batch_size,
                heartbeat_interval_s=cfg.ha_heartbeat_interval_s,
                housekeeping_interval_s=cfg.ha_housekeeping_interval_s,
                secret=cfg.ha_secret.encode(),
                sync_from=cfg.ha_sync_from,
                group=cfg.broker_name,
                max_connections=cfg.ha_max_connections,
                ssl=_ha_server_ssl(cfg) if cfg.ha_tls else None,
                epoch=self.incarnation.epoch if self.incarnation is not None else None,
            ),
            store.replica_log,
            acks,
        )

    async def _start_ha(self, store: MessageStore) -> None:
        """The HA data plane: a master listens for slaves (whose acks its
        ReplicaAcks counts); a slave follows its master."""
        cfg = self.config
        secret = cfg.ha_secret.encode()
        epoch = self.incarnation.epoch if self.incarnation is not None else None
        if cfg.is_master:
            acks = self.acks
            assert acks is not None and self.ha_master is not None
            if self.incarnation is not None:
                # A new leader: only its published in-sync slaves' acks count
                # (none yet), and what its log holds is its epoch's start.
                acks.require(frozenset(), floor=store.max_offset)
            await self.ha_master.start()
        else:
            self.ha_slave = HASlave(
                HASlaveConfig(
                    master_address=cfg.ha_master_address,
                    heartbeat_interval_s=cfg.ha_heartbeat_interval_s,
                    housekeeping_interval_s=cfg.ha_housekeeping_interval_s,
                    reconnect_s=cfg.ha_reconnect_interval_s,
                    max_frame_bytes=cfg.ha_max_frame_size,
                    read_buffer_bytes=cfg.ha_read_buffer_size,
                    ssl=_ha_client_ssl(cfg) if cfg.ha_tls else None,
                    secret=secret,
                    group=cfg.broker_name,
                    replica_id=cfg.broker_id,
                    reset_out_of_range=cfg.ha_reset_out_of_range_slave,
                    epoch=epoch,
                ),
                store.replica_log,
            )
            await self.ha_slave.start()
            assert self.metadata is not None
            self.slave_sync = SlaveSyncLoop(
                self.metadata,
                cfg.slave_sync_delay_s,
                cfg.slave_sync_interval_s,
                tls=self.client_tls,
                journal=self.journal,
            )
            await self.slave_sync.start()

    async def _replicate_change(self, result) -> bool:
        """A metadata-log record is acknowledged as a send is: once the
        in-sync set has it (SYNC_MASTER), at once otherwise."""
        replication = self.replication
        return replication is None or await replication.wait(result) is SendStatus.SEND_OK

    def _checkpoint_pop(self) -> None:
        """Where a restart replays pop and timer state from; stored in the
        consumer-offset table, so written with the committed offsets it matches."""
        if self.pop is not None:
            self.pop.checkpoint()
        if self.timer is not None:
            self.timer.checkpoint()
        if self.transactions is not None:
            self.transactions.checkpoint()

    def ha_parts(self) -> HAParts:
        """The HA parts of this run, for the replication use case (HASource)."""
        assert self.store is not None
        return HAParts(
            role=self.config.broker_role,
            store=self.store,
            master=self.ha_master,
            slave=self.ha_slave,
        )

    async def _persist_offsets(self) -> None:
        """Consumer and delay offsets change often: persisted every
        flushConsumerOffsetInterval (5 s), as RocketMQ does, and at shutdown."""
        assert self.metadata is not None
        while True:
            await asyncio.sleep(self.config.flush_consumer_offset_interval_s)
            try:
                self._checkpoint_pop()
                self.metadata.consumer_offsets.persist()
                self.metadata.delay_offsets.persist()
            except StorageFault:
                return  # fail-stop has it: the broker is stopping
            except (OSError, FerryError) as exc:
                log.error("could not persist offsets: %s; retrying", exc)


def _ipv4_or_loopback(host: str) -> str:
    """Records store an IPv4 store host: a DNS name (Kubernetes) is resolved,
    and one that does not resolve is stored as 127.0.0.1."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        log.warning("brokerIP1 %r does not resolve to IPv4; records store 127.0.0.1", host)
        return "127.0.0.1"
