"""A broker's configuration: RocketMQ's `broker.conf` keys plus ferry's own (every
one in docs/reference/broker-config.md), parsed and validated once at startup
into a frozen `BrokerConfig`.

Sources, later ones winning: the defaults, the properties file (`-c`), then
`-o key=value` overrides. Unknown keys are warned about (with the nearest
known key), never silently ignored; a bad value stops startup with a
`ConfigError` naming the key, the value and what was expected. RocketMQ's
durations are milliseconds in the file and seconds (`*_s`) here.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ferry.model import BROKER_ROLES, DELAY_LEVELS_S, NAMESRV_ADDR_ENV, check_addr, check_name
from ferry.runtime.errors import ConfigError, InvalidArgument

FLUSH_DISK_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
REGISTER_PERIOD_MIN_S = 10.0
REGISTER_PERIOD_MAX_S = 60.0
ENV_ROCKETMQ_HOME = "ROCKETMQ_HOME"
ACL_FILE_NAME = "plain_acl.yml"
GRPC_PORT_OFFSET = 4  # grpcListenPort's default: listenPort + 4 (10915)
PROXY_GRPC_PORT = 8081  # grpcServerPort's default, as rmq-proxy.json's
FAST_PORT_OFFSET = -2  # fastListenPort's default: listenPort - 2 (10909), as RocketMQ


@dataclass(frozen=True)
class BrokerConfig:
    cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_role: str = "ASYNC_MASTER"
    flush_disk_type: str = "ASYNC_FLUSH"
    namesrv_addrs: tuple[str, ...] = ()
    bind_host: str = "0.0.0.0"
    listen_port: int = 10911  # RocketMQ's protocol (0: a free port)
    # RocketMQ's protocol again, the "VIP channel" of Java clients up to 4.4.
    # None: listenPort - 2 (a free port when listenPort is 0); -1: off.
    fast_listen_port: int | None = None
    # ferry.v1 gRPC. None: listenPort + 4 (a free port when listenPort is 0).
    grpc_listen_port: int | None = None
    ha_listen_port: int = 10912
    metrics_port: int = 10913
    broker_ip1: str = "127.0.0.1"
    broker_ip2: str = ""
    store_root: Path = field(default_factory=lambda: Path.home() / "ferry" / "store")
    broker_permission: int = 6
    slave_read_enable: bool = False
    access_message_in_memory_percent: int = 40  # % of RAM behind the log's end: "in memory"
    register_period_s: float = 30.0
    register_timeout_s: float = 6.0
    force_register: bool = True
    ha_master_address: str = ""
    commit_log_file_size: int = 1 << 30
    consume_queue_entries_per_file: int = 300_000
    # The message index by key (services.broker.store.index): RocketMQ's keys and defaults.
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_message_size: int = 4 * 1024 * 1024
    send_stream_max_in_flight: int = 1024  # unanswered messages per SendStream
    slave_timeout_s: float = 3.0
    sync_flush_timeout_s: float = 5.0
    flush_interval_s: float = 0.5
    flush_consumer_offset_interval_s: float = 5.0
    ha_transfer_batch_size: int = 32 * 1024
    ha_heartbeat_interval_s: float = 5.0
    ha_housekeeping_interval_s: float = 20.0
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024
    ha_secret: str = ""
    admin_token: str = ""  # guards BrokerAdmin writes; sent to name servers when registering
    # RocketMQ's ACL (ferry.acl): every RocketMQ-protocol request checked against acl_file.
    acl_enable: bool = False
    acl_file: Path | None = None  # None: see load_config (beside broker.conf, ROCKETMQ_HOME)
    grpc_max_message_size: int = 64 * 1024 * 1024
    tls_cert: str = ""  # serve gRPC over TLS (with tls_key); also this broker's client certificate
    tls_key: str = ""
    tls_client_ca: str = ""  # require client certificates signed by this CA
    tls_ca: str = ""  # verify name servers and the master (SlaveSync) with this CA: TLS out
    # RocketMQ's tls.server.mode for the RocketMQ-protocol ports, with tlsCert/tlsKey:
    # disabled, permissive (TLS and plaintext on one port) or enforcing (TLS only).
    tls_server_mode: str = "permissive"
    health_port: int = -1  # >= 0: grpc.health.v1 alone, plaintext (kubelet probes with TLS)
    ha_tls: bool = False  # the HA stream over TLS too (master: tlsCert/tlsKey; slave: tlsCa)
    ha_max_connections: int = 16
    ha_max_frame_size: int = 64 * 1024 * 1024
    ha_read_buffer_size: int = 8 * 1024 * 1024
    ha_sync_from: str = "lastFile"
    ha_reset_out_of_range_slave: bool = True
    ha_reconnect_interval_s: float = 5.0
    visibility: str = ""  # "" = by role: confirmed on a SYNC_MASTER, appended otherwise
    slave_sync_delay_s: float = 3.0
    slave_sync_interval_s: float = 10.0
    message_delay_levels_s: tuple[float, ...] = tuple(float(s) for s in DELAY_LEVELS_S)
    grace_s: float = 5.0
    port_file: Path | None = None
    # Retention (RocketMQ's names; ratios as fractions here, percent in broker.conf).
    file_reserved_time_s: float = 72 * 3600.0
    delete_when_hours: tuple[int, ...] = (4,)
    disk_max_used_space_ratio: float = 0.75
    disk_space_clean_forcibly_ratio: float = 0.85
    disk_space_warning_level_ratio: float = 0.90
    clean_file_forcibly_enable: bool = True
    delete_commit_log_files_interval_s: float = 0.1
    clean_resource_interval_s: float = 10.0
    # Pop consumption and timers.
    timer_max_delay_s: float = 3 * 86400.0
    auto_create_subscription_group: bool = True
    # RocketMQ 5's server-side assignment (QUERY_ASSIGNMENT): how a (topic, group) with no
    # mode set by SET_MESSAGE_REQUEST_MODE consumes, and how many consumers' queues a pop
    # consumer shares (-1: every queue of every broker).
    default_message_request_mode: str = "PULL"
    default_pop_share_queue_num: int = -1
    # The topics Apache's broker keeps by itself (services.broker.metadata.defaults).
    auto_create_topic_enable: bool = True  # TBW102, and a send may create its topic from it
    default_topic_queue_nums: int = 8  # TBW102's queues, the most an auto-created topic gets
    cluster_topic_enable: bool = True  # the topic named brokerClusterName is read-write
    broker_topic_enable: bool = True  # the topic named brokerName is read-write
    trace_topic_enable: bool = False  # the message trace topic msgTraceTopicName
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    # SQL92 subscriptions (MessageSelector.bySql, the v5 SDKs' FilterExpression SQL92).
    enable_property_filter: bool = False
    # Transactional messages (RocketMQ's keys and defaults; services.broker.transactions).
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 60_000
    transaction_check_max: int = 15
    # RocketMQ 5 SDKs: apache.rocketmq.v2.MessagingService on the gRPC port (local mode).
    enable_proxy: bool = False
    # With enableProxy: the SDKs' native door (ferry_native), as rmq-proxy.json's
    # grpcServerPort (0: a free port, -1: none, v2 on grpcListenPort only).
    grpc_server_listen_port: int | None = None
    enable_topic_message_type_check: bool = True  # local mode: sends match the topic's type
    enable_mixed_message_type: bool = False  # topics may be created +message.type=MIXED
    min_invisible_time_ms_for_recv: int = 10_000  # with enableProxy: a receive's least
    # Automatic failover on etcd: the group's members campaign for a leader key under
    # a lease; brokerRole is how a member replicates while it leads.
    enable_failover: bool = False
    etcd_endpoints: tuple[str, ...] = ()
    failover_lease_ttl_s: float = 6.0
    allow_lossy_failover: bool = False
    min_in_sync_replicas: int = 1  # failover: members (master included) a send needs

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    @property
    def is_master(self) -> bool:
        return not self.is_slave

    @property
    def effective_visibility(self) -> str:
        """Consumers of a SYNC_MASTER see what a slave confirmed
        (docs/guides/replication.md, "SYNC_MASTER")."""
        if self.visibility:
            return self.visibility
        return "confirmed" if self.broker_role == "SYNC_MASTER" else "appended"

    @property
    def fast_port(self) -> int:
        """The VIP port to listen on: -1 off, 0 a free port."""
        if self.fast_listen_port is not None:
            return self.fast_listen_port
        return self.listen_port + FAST_PORT_OFFSET if self.listen_port > 2 else 0

    @property
    def grpc_server_port(self) -> int:
        """enableProxy's SDK door port: grpcServerPort, else RocketMQ's proxy's 8081
        (a free port when listenPort is 0, as every other default port)."""
        if self.grpc_server_listen_port is not None:
            return self.grpc_server_listen_port
        return PROXY_GRPC_PORT if self.listen_port else 0

    @property
    def grpc_port(self) -> int:
        """The ferry.v1 gRPC port to listen on (0: a free port)."""
        if self.grpc_listen_port is not None:
            return self.grpc_listen_port
        return self.listen_port + GRPC_PORT_OFFSET if self.listen_port else 0

    @property
    def ha_host(self) -> str:
        return self.broker_ip2 or self.broker_ip1

    @property
    def effective_register_period_s(self) -> float:
        """`clamp(registerNameServerPeriod, 10 s, 60 s)`, as RocketMQ does."""
        return min(max(self.register_period_s, REGISTER_PERIOD_MIN_S), REGISTER_PERIOD_MAX_S)

    @property
    def commit_log_dir(self) -> Path:
        return self.store_root / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_root / "consumequeue"

    @property
    def config_dir(self) -> Path:
        return self.store_root / "config"


# ---------------------------------------------------------------- value parsers


# An index file's size is a Java int in RocketMQ (MappedFile).
MAX_INDEX_FILE_BYTES = (1 << 31) - 1


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, str], int]:
    def parse(key: str, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(key, f"{text!r} is not an integer") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(
                key,
                f"{value} is outside {lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}",
            )
        return value

    return parse


def _ms_to_s(lo_ms: int = 1) -> Callable[[str, str], float]:
    def parse(key: str, text: str) -> float:
        return _int(lo_ms)(key, text) / 1000.0

    return parse


def _bool(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise ConfigError(key, f"{text!r} is not true or false")


def _choice(options: Sequence[str]) -> Callable[[str, str], str]:
    def parse(key: str, text: str) -> str:
        value = text.strip()
        if value not in options:
            raise ConfigError(key, f"{value!r} is not one of {', '.join(options)}")
        return value

    return parse


def _name(key: str, text: str) -> str:
    try:
        return check_name(text.strip(), key)
    except InvalidArgument as exc:
        raise ConfigError(key, exc.reason) from None


def _text(key: str, text: str) -> str:
    return text.strip()


def _host(key: str, text: str) -> str:
    value = text.strip()
    if not value or any(c.isspace() or c in "/:;," for c in value):
        raise ConfigError(key, f"{text!r} is not a host name or IP address")
    return value


def _addr_or_empty(key: str, text: str) -> str:
    value = text.strip()
    if value:
        try:
            check_addr(value, key)
        except InvalidArgument as exc:
            raise ConfigError(key, exc.reason) from None
    return value


def _namesrv(key: str, text: str) -> tuple[str, ...]:
    addrs = tuple(a.strip() for a in text.replace(",", ";").split(";") if a.strip())
    for addr in addrs:
        try:
            check_addr(addr, key)
        except InvalidArgument as exc:
            raise ConfigError(key, f"{exc.reason}; expected host:port;host:port") from None
    return addrs


def _path(key: str, text: str) -> Path:
    value = text.strip()
    if not value:
        raise ConfigError(key, "must not be empty")
    return Path(value).expanduser()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_delay_levels(key: str, text: str) -> tuple[float, ...]:
    """RocketMQ's `messageDelayLevel`: `"1s 5s 10s 30s 1m ... 2h"`."""
    levels = []
    for item in text.split():
        if item.endswith("ms"):  # a ferry extension, for tests and quick retries
            unit, number = 0.001, item[:-2]
        else:
            unit, number = _UNITS.get(item[-1:]), item[:-1]
        if unit is None or not number.isdigit() or int(number) <= 0:
            raise ConfigError(key, f"{item!r} is not a delay like 500ms, 5s, 1m, 2h or 1d")
        levels.append(int(number) * unit)
    if not levels:
        raise ConfigError(key, "names no delay level")
    return tuple(levels)


def _hours_to_s(key: str, text: str) -> float:
    """RocketMQ's `fileReservedTime`: hours, fractions allowed (0.001 = 3.6 s)."""
    try:
        hours = float(text.strip())
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a number of hours (e.g. 72 or 0.5)") from None
    if not hours > 0 or hours != hours or hours == float("inf"):
        raise ConfigError(key, f"{text!r} must be a positive number of hours")
    return hours * 3600.0


def parse_delete_when(key: str, text: str) -> tuple[int, ...]:
    """RocketMQ's `deleteWhen`: hours of the day, `"04"` or `"04;16"`."""
    hours = []
    for item in text.replace(",", ";").split(";"):
        item = item.strip()
        if not item.isdigit() or not 0 <= int(item) <= 23:
            raise ConfigError(
                key, f"{text!r} is not hours of the day 00-23 separated by ';' (e.g. 04 or 04;16)"
            )
        hours.append(int(item))
    return tuple(sorted(set(hours)))


def _percent(key: str, text: str) -> float:
    """A disk ratio given in percent (RocketMQ's diskMaxUsedSpaceRatio etc.)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a percentage (e.g. 75)") from None
    if not 1 <= value <= 99:
        raise ConfigError(key, f"{value:g} is outside 1..99 (percent of the disk)")
    return value / 100.0


def _file_size(key: str, text: str) -> int:
    return _int(4096, 1 << 40)(key, text)


def _cq_file_bytes(key: str, text: str) -> int:
    value = _int(20 * 16)(key, text)
    if value % 20:
        raise ConfigError(key, f"{value} is not a multiple of 20 (the consume-queue entry size)")
    return value // 20


# conf key -> (field, parser, meaning)
KNOWN_KEYS: dict[str, tuple[str, Callable[[str, str], Any], str]] = {
    "brokerClusterName": ("cluster_name", _name, "cluster this broker belongs to"),
    "brokerName": ("broker_name", _name, "broker group (master + slaves share it)"),
    "brokerId": ("broker_id", _int(0), "0 = master, > 0 = slave"),
    "brokerRole": ("broker_role", _choice(BROKER_ROLES), "ASYNC_MASTER, SYNC_MASTER or SLAVE"),
    "flushDiskType": ("flush_disk_type", _choice(FLUSH_DISK_TYPES), "ASYNC_FLUSH or SYNC_FLUSH"),
    "namesrvAddr": (
        "namesrv_addrs",
        _namesrv,
        "name servers' RocketMQ-protocol addresses (their --port, 9876), host:port;host:port",
    ),
    "bindAddress": ("bind_host", _host, "interface the servers listen on (ferry)"),
    "listenPort": (
        "listen_port",
        _int(0, 65535),
        "RocketMQ-protocol port, for RocketMQ's clients and mqadmin (0: pick a free one)",
    ),
    "fastListenPort": (
        "fast_listen_port",
        _int(-1, 65535),
        "RocketMQ-protocol VIP port of Java clients up to 4.4; default listenPort - 2 "
        "(a free port when listenPort is 0), -1 off",
    ),
    "grpcListenPort": (
        "grpc_listen_port",
        _int(0, 65535),
        "ferry.v1 gRPC port (ferry's clients, the proxy, slaves, grpcurl); default "
        "listenPort + 4 (a free port when listenPort is 0) (ferry)",
    ),
    "haListenPort": ("ha_listen_port", _int(0, 65535), "HA replication port"),
    "metricsPort": ("metrics_port", _int(-1, 65535), "Prometheus /metrics port, -1 off (ferry)"),
    "brokerIP1": (
        "broker_ip1",
        _host,
        "advertised host of the RocketMQ-protocol and gRPC addresses",
    ),
    "brokerIP2": ("broker_ip2", _host, "advertised host of the HA address (default brokerIP1)"),
    "storePathRootDir": (
        "store_root",
        _path,
        "store directory (commitlog/, consumequeue/, config/)",
    ),
    "brokerPermission": (
        "broker_permission",
        _int(0, 15),
        "6 read-write, 4 read-only, 2 write-only",
    ),
    "slaveReadEnable": ("slave_read_enable", _bool, "slaves serve pulls"),
    "accessMessageInMemoryMaxRatio": (
        "access_message_in_memory_percent",
        _int(0, 100),
        "percent of RAM: a message further behind the commit log's end is not in memory "
        "(a consumer that far behind is sent to a slave when slaveReadEnable; a pop group "
        "that does not consume from the minimum starts a new queue at 0 only while its "
        "first message is in memory)",
    ),
    "registerNameServerPeriod": (
        "register_period_s",
        _ms_to_s(),
        "ms between registrations (10-60 s)",
    ),
    "registerBrokerTimeoutMills": ("register_timeout_s", _ms_to_s(), "ms to wait for name servers"),
    "forceRegister": ("force_register", _bool, "false: QueryDataVersion before registering"),
    "haMasterAddress": ("ha_master_address", _addr_or_empty, "master's HA host:port (slaves)"),
    "mappedFileSizeCommitLog": ("commit_log_file_size", _file_size, "bytes per commit-log file"),
    "mappedFileSizeConsumeQueue": (
        "consume_queue_entries_per_file",
        _cq_file_bytes,
        "bytes per consume-queue file (a multiple of 20)",
    ),
    "messageIndexEnable": (
        "message_index_enable",
        _bool,
        "index every message by its keys and unique key, for lookups by key",
    ),
    "maxHashSlotNum": (
        "max_hash_slot_num",
        _int(1, MAX_INDEX_FILE_BYTES // 4),
        "hash slots per index file (4 bytes each)",
    ),
    "maxIndexNum": (
        "max_index_num",
        _int(2, MAX_INDEX_FILE_BYTES // 20),
        "keys per index file (20 bytes each); a full file starts the next",
    ),
    "maxMessageSize": ("max_message_size", _int(1), "largest message body, bytes"),
    "sendStreamMaxInFlight": (
        "send_stream_max_in_flight",
        _int(1, 65536),
        "unanswered messages per SendStream before the broker stops reading it",
    ),
    "slaveTimeout": ("slave_timeout_s", _ms_to_s(), "ms a SYNC_MASTER waits for a slave"),
    "syncFlushTimeout": (
        "sync_flush_timeout_s",
        _ms_to_s(),
        "ms a SYNC_FLUSH send waits for fsync",
    ),
    "flushIntervalCommitLog": ("flush_interval_s", _ms_to_s(), "ms between ASYNC_FLUSH flushes"),
    "flushConsumerOffsetInterval": (
        "flush_consumer_offset_interval_s",
        _ms_to_s(),
        "ms between consumer/delay offset persists",
    ),
    "haTransferBatchSize": ("ha_transfer_batch_size", _int(1024), "bytes per HA frame"),
    "haSendHeartbeatInterval": ("ha_heartbeat_interval_s", _ms_to_s(), "ms between HA heartbeats"),
    "haHousekeepingInterval": (
        "ha_housekeeping_interval_s",
        _ms_to_s(),
        "ms of HA silence before closing",
    ),
    "haMaxGapNotInSync": (
        "ha_max_gap_not_in_sync",
        _int(1),
        "bytes a slave may lag and be in sync",
    ),
    "haSecret": ("ha_secret", _text, "shared secret of the HA handshake (ferry)"),
    "tlsCert": ("tls_cert", _text, "PEM certificate: serve gRPC over TLS (with tlsKey) (ferry)"),
    "tlsKey": ("tls_key", _text, "PEM private key of tlsCert (ferry)"),
    "tlsClientCa": (
        "tls_client_ca",
        _text,
        "PEM CA: require client certificates it signed (mutual TLS) (ferry)",
    ),
    "tlsServerMode": (
        "tls_server_mode",
        _choice(("disabled", "permissive", "enforcing")),
        "with tlsCert/tlsKey, TLS on the RocketMQ-protocol ports (listenPort, fastListenPort) as "
        "Apache's tls.server.mode: permissive serves TLS and plaintext on the same port (Apache's "
        "default), enforcing TLS only, disabled plaintext only; no client certificate is asked "
        "there (Apache's tls.server.need.client.auth=none)",
    ),
    "tlsCa": (
        "tls_ca",
        _text,
        "PEM CA to verify name servers and the master with: TLS for this broker's own "
        "calls, presenting tlsCert as its client certificate (ferry)",
    ),
    "healthPort": (
        "health_port",
        _int(-1, 65535),
        "also serve grpc.health.v1 alone, in plaintext, on this port, for probes that cannot "
        "speak TLS (the kubelet's); -1: off (ferry)",
    ),
    "haTls": (
        "ha_tls",
        _bool,
        "the HA stream over TLS: a master serves it with tlsCert/tlsKey (and checks slaves' "
        "certificates against tlsClientCa), a slave verifies it with tlsCa (ferry)",
    ),
    "grpcMaxMessageSize": (
        "grpc_max_message_size",
        _int(64 * 1024),
        "largest gRPC request or answer, bytes; larger ones get RESOURCE_EXHAUSTED (ferry)",
    ),
    "haMaxConnections": (
        "ha_max_connections",
        _int(1, 1024),
        "HA connections a master accepts at once; more are closed at once (ferry)",
    ),
    "haMaxFrameSize": (
        "ha_max_frame_size",
        _int(64 * 1024),
        "largest HA frame a slave accepts; a master announcing more is disconnected (ferry)",
    ),
    "haReadBufferSize": (
        "ha_read_buffer_size",
        _int(512 * 1024),
        "bytes a slave buffers from its master per connection before it stops reading (ferry)",
    ),
    "adminToken": (
        "admin_token",
        _text,
        "require 'authorization: Bearer <token>' on topic, subscription and permission "
        "changes, and send it to the name servers when registering (ferry)",
    ),
    "aclEnable": (
        "acl_enable",
        _bool,
        "RocketMQ's ACL: every RocketMQ-protocol request is checked against aclFile (signature "
        "and permissions; a refusal is answered 16 NO_PERMISSION), and BrokerAdmin changes take "
        "an admin account's signature",
    ),
    "aclFile": (
        "acl_file",
        _path,
        "the plain_acl.yml of aclEnable, re-read when it changes; default: plain_acl.yml beside "
        "the broker.conf given with -c, else $ROCKETMQ_HOME/conf/plain_acl.yml (ferry)",
    ),
    "haSyncFrom": (
        "ha_sync_from",
        _choice(("lastFile", "minOffset")),
        "where an empty slave starts: lastFile or minOffset",
    ),
    "haResetOutOfRangeSlave": (
        "ha_reset_out_of_range_slave",
        _bool,
        "a slave behind its master's retention resyncs (needs haSecret)",
    ),
    "haReconnectInterval": ("ha_reconnect_interval_s", _ms_to_s(), "ms a slave waits to reconnect"),
    "visibility": (
        "visibility",
        _choice(("confirmed", "appended")),
        "what consumers see: confirmed (by a slave) or appended; default by role",
    ),
    "slaveSyncDelay": (
        "slave_sync_delay_s",
        _ms_to_s(0),
        "ms before a slave's first metadata sync",
    ),
    "slaveSyncInterval": ("slave_sync_interval_s", _ms_to_s(), "ms between metadata syncs"),
    "messageDelayLevel": (
        "message_delay_levels_s",
        parse_delay_levels,
        "delay levels, 1s 5s ... 2h",
    ),
    "timerMaxDelaySec": (
        "timer_max_delay_s",
        _int(1),
        "seconds ahead a TIMER_DELIVER_MS may be (3 days)",
    ),
    "autoCreateTopicEnable": (
        "auto_create_topic_enable",
        _bool,
        "keep the topic TBW102 and let a RocketMQ-protocol send to an unknown topic create it "
        "with min(the producer's defaultTopicQueueNums, defaultTopicQueueNums) queues, as "
        "Apache does (default true; false: such a send is answered TOPIC_NOT_EXIST)",
    ),
    "defaultTopicQueueNums": (
        "default_topic_queue_nums",
        _int(1, 1024),
        "TBW102's read and write queues, the most a topic created by a send gets (default 8)",
    ),
    "clusterTopicEnable": (
        "cluster_topic_enable",
        _bool,
        "the topic named brokerClusterName (what the admin API's createTopic(key=cluster) "
        "routes by) is read-write; false: inherit only (default true)",
    ),
    "brokerTopicEnable": (
        "broker_topic_enable",
        _bool,
        "the topic named brokerName is read-write; false: inherit only (default true)",
    ),
    "traceTopicEnable": (
        "trace_topic_enable",
        _bool,
        "keep the message trace topic msgTraceTopicName (default false)",
    ),
    "enablePropertyFilter": (
        "enable_property_filter",
        _bool,
        "serve SQL92 subscriptions (filters on message properties), as Apache does with "
        "the same key (default false: they are refused)",
    ),
    "msgTraceTopicName": (
        "msg_trace_topic_name",
        _name,
        "the message trace topic's name (default RMQ_SYS_TRACE_TOPIC)",
    ),
    "autoCreateSubscriptionGroup": (
        "auto_create_subscription_group",
        _bool,
        "create a consumer group on its first pop (default true)",
    ),
    "defaultMessageRequestMode": (
        "default_message_request_mode",
        _choice(("PULL", "POP")),
        "how a RocketMQ 5 push consumer that asks the broker for its queues "
        "(QUERY_ASSIGNMENT, clientRebalance=false) consumes a topic for which "
        "`mqadmin setConsumeMode` set nothing: PULL (default) or POP",
    ),
    "defaultPopShareQueueNum": (
        "default_pop_share_queue_num",
        _int(-1),
        "with defaultMessageRequestMode=POP: how many other consumers' queues each pop "
        "consumer also pops (-1, default: every queue of every broker)",
    ),
    "transactionTimeOut": (
        "transaction_timeout_ms",
        _int(1),
        "ms a transactional half waits for its producer's decision before it is checked back "
        "(a message's CHECK_IMMUNITY_TIME_IN_SECONDS overrides it)",
    ),
    "transactionCheckInterval": (
        "transaction_check_interval_ms",
        _int(1),
        "ms between two check-back passes over the undecided transactional halves",
    ),
    "transactionCheckMax": (
        "transaction_check_max",
        _int(1, 10_000),
        "check-backs of a transaction before it is discarded (kept in "
        "TRANS_CHECK_MAX_TIME_TOPIC, never delivered)",
    ),
    "enableProxy": (
        "enable_proxy",
        _bool,
        "also serve the RocketMQ 5 SDKs' apache.rocketmq.v2.MessagingService, backed by this "
        "broker alone (RocketMQ's proxy in local mode): on grpcServerPort (the native door) "
        "and on grpcListenPort; masters only, a SLAVE ignores it",
    ),
    "grpcServerPort": (
        "grpc_server_listen_port",
        _int(-1, 65535),
        "with enableProxy: the port of the SDKs' native door (HTTP/2 and TLS in ferry_native, "
        "TLS and plaintext on one port), as RocketMQ's proxy's rmq-proxy.json key; -1: none "
        "(the SDKs then use grpcListenPort, served by grpcio, slower); 0: a free port; default "
        "8081 (a free port when listenPort is 0)",
    ),
    "enableTopicMessageTypeCheck": (
        "enable_topic_message_type_check",
        _bool,
        "with enableProxy: refuse a send whose type (NORMAL, FIFO, DELAY, TRANSACTION) is not "
        "its topic's message.type, MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, as RocketMQ's proxy "
        "(its rmq-proxy.json key; ferry proxy --no-topic-message-type-check in cluster mode)",
    ),
    "minInvisibleTimeMillsForRecv": (
        "min_invisible_time_ms_for_recv",
        _int(0),
        "with enableProxy: the least invisible time a ReceiveMessage may ask for unless it "
        "lets the proxy renew; less is ILLEGAL_INVISIBLE_TIME, as RocketMQ's proxy (its "
        "rmq-proxy.json key; ferry proxy --min-invisible-time-ms in cluster mode)",
    ),
    "enableMixedMessageType": (
        "enable_mixed_message_type",
        _bool,
        "allow topics of message.type MIXED, which take every type (default false: refused "
        "at creation, as RocketMQ's broker)",
    ),
    "enableFailover": (
        "enable_failover",
        _bool,
        "elect the group's master in etcd (etcdEndpoints); brokerId >= 1 per member",
    ),
    "etcdEndpoints": ("etcd_endpoints", _namesrv, "etcd client endpoints, host:port;host:port"),
    "failoverLeaseTtl": (
        "failover_lease_ttl_s",
        _ms_to_s(2000),
        "ms the leader's etcd lease lives without renewal",
    ),
    "minInSyncReplicas": (
        "min_in_sync_replicas",
        _int(1),
        "failover, SYNC_MASTER: in-sync members (master included) a send needs for SEND_OK",
    ),
    "allowLossyFailover": (
        "allow_lossy_failover",
        _bool,
        "a replica outside the in-sync set may be elected (may lose acknowledged messages)",
    ),
    "shutdownGraceSeconds": ("grace_s", _int(0), "seconds calls in flight get at shutdown (ferry)"),
    "fileReservedTime": (
        "file_reserved_time_s",
        _hours_to_s,
        "hours a commit-log file is kept after its last write (fractions allowed)",
    ),
    "deleteWhen": (
        "delete_when_hours",
        parse_delete_when,
        "hours of day when expired files are deleted, 04 or 04;16",
    ),
    "diskMaxUsedSpaceRatio": (
        "disk_max_used_space_ratio",
        _percent,
        "percent of the disk above which expired files are deleted at once",
    ),
    "diskSpaceCleanForciblyRatio": (
        "disk_space_clean_forcibly_ratio",
        _percent,
        "percent above which the oldest files are deleted even unexpired",
    ),
    "diskSpaceWarningLevelRatio": (
        "disk_space_warning_level_ratio",
        _percent,
        "percent above which sends are refused until retention frees space",
    ),
    "cleanFileForciblyEnable": (
        "clean_file_forcibly_enable",
        _bool,
        "delete unexpired files above diskSpaceCleanForciblyRatio",
    ),
    "deleteCommitLogFilesInterval": (
        "delete_commit_log_files_interval_s",
        _ms_to_s(0),
        "ms between two commit-log file deletions",
    ),
    "cleanResourceInterval": (
        "clean_resource_interval_s",
        _ms_to_s(),
        "ms between retention passes",
    ),
}


def parse_properties(text: str) -> dict[str, str]:
    """Java-properties lines as broker.conf uses them: `key=value`, `key:value`
    or `key value`; `#`/`!` comments and blank lines skipped."""
    result: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = len(line)
        for i, ch in enumerate(line):
            if ch in "=:" or ch.isspace():
                cut = i
                break
        key = line[:cut].strip()
        rest = line[cut:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        result[key] = rest.strip()
    return result


def load_config(
    path: Path | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[BrokerConfig, list[str]]:
    """Build the config from a broker.conf and `key=value` overrides; returns it
    with the warnings to log (unknown keys); `warn`, when given, gets each
    warning at once, so it is seen even when a bad value stops the load.

    Raises:
        ConfigError: a bad value, naming its key.
        OSError: the file cannot be read.
    """
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    if path is not None:
        for key, value in parse_properties(Path(path).read_text()).items():
            values[key] = value
            sources[key] = str(path)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "an override must look like key=value (e.g. -o listenPort=0)")
        values[key.strip()] = value
        sources[key.strip()] = "-o"
    warnings = []
    changes: dict[str, Any] = {}
    for key, text in values.items():
        known = KNOWN_KEYS.get(key)
        if known is None:
            near = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            warnings.append(f"unknown key {key!r} in {sources[key]}, ignored{hint}")
            if warn is not None:
                warn(warnings[-1])
            continue
        name, parse, _ = known
        changes[name] = parse(key, text)
    if "namesrv_addrs" not in changes and env.get(NAMESRV_ADDR_ENV):
        changes["namesrv_addrs"] = _namesrv(NAMESRV_ADDR_ENV, env[NAMESRV_ADDR_ENV])
    if changes.get("acl_enable") and changes.get("acl_file") is None:
        changes["acl_file"] = default_acl_file(path, env)
    config = replace(BrokerConfig(), **changes)
    _check(config)
    return config, warnings


def default_acl_file(conf: Path | None, env: Mapping[str, str]) -> Path:
    """Where aclEnable looks without aclFile: plain_acl.yml beside the broker.conf, else
    $ROCKETMQ_HOME/conf/plain_acl.yml (Apache's place)."""
    if conf is not None:
        return Path(conf).expanduser().parent / ACL_FILE_NAME
    home = env.get(ENV_ROCKETMQ_HOME)
    if home:
        return Path(home).expanduser() / "conf" / ACL_FILE_NAME
    raise ConfigError(
        "aclFile",
        "aclEnable=true needs a plain_acl.yml: set aclFile=PATH (without it the broker reads "
        f"{ACL_FILE_NAME} beside the broker.conf given with -c, or "
        f"${ENV_ROCKETMQ_HOME}/conf/{ACL_FILE_NAME}; there is neither)",
    )


def _check_ports(config: BrokerConfig) -> None:
    """Each listener its own fixed port (0 = a free port, -1 = off)."""
    if config.grpc_port > 65535:
        raise ConfigError(
            "grpcListenPort",
            f"listenPort + {GRPC_PORT_OFFSET} = {config.grpc_port} is not a port; set "
            "grpcListenPort (or a lower listenPort)",
        )
    ports = [
        ("listenPort", config.listen_port),
        ("fastListenPort", config.fast_port),
        ("grpcListenPort", config.grpc_port),
        ("haListenPort", config.ha_listen_port),
        ("metricsPort", config.metrics_port),
        ("healthPort", config.health_port),
        ("grpcServerPort", config.grpc_server_port if config.enable_proxy else -1),
    ]
    seen: dict[int, str] = {}
    for key, port in ports:
        if port <= 0:
            continue
        if port in seen:
            raise ConfigError(
                key,
                f"{port} is also {seen[port]}'s port (fastListenPort defaults to listenPort - "
                f"{-FAST_PORT_OFFSET}, "
                f"grpcListenPort to listenPort + {GRPC_PORT_OFFSET}): give each its own port",
            )
        seen[port] = key


def _check(config: BrokerConfig) -> None:
    _check_ports(config)
    if config.enable_failover:
        _check_failover(config)
    elif config.broker_role == "SLAVE" and config.broker_id <= 0:
        raise ConfigError("brokerId", f"a SLAVE needs brokerId > 0, not {config.broker_id}")
    elif config.broker_role != "SLAVE" and config.broker_id != 0:
        raise ConfigError(
            "brokerId", f"a {config.broker_role} must have brokerId 0, not {config.broker_id}"
        )
    if config.ha_tls and config.broker_role != "SLAVE" and not config.tls_cert:
        raise ConfigError("haTls", "a master serves the HA stream over TLS with tlsCert and tlsKey")
    if config.ha_tls and config.broker_role == "SLAVE" and not config.tls_ca:
        raise ConfigError("haTls", "a slave verifies its master's HA certificate with tlsCa")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ConfigError("tlsCert", "TLS needs both tlsCert and tlsKey")
    if config.enable_proxy and config.tls_cert and not config.tls_ca and not config.is_slave:
        raise ConfigError(
            "enableProxy",
            "a broker serving TLS calls its own port over TLS for the SDKs' requests: set tlsCa "
            "to a CA that signed tlsCert (and, with tlsClientCa, have it sign tlsCert too)",
        )
    if config.tls_client_ca and not config.tls_cert:
        raise ConfigError("tlsClientCa", "client certificates are checked only with tlsCert/tlsKey")
    if config.tls_server_mode == "enforcing" and not config.tls_cert:
        raise ConfigError("tlsServerMode", "enforcing serves TLS only: it needs tlsCert and tlsKey")
    if config.max_message_size + 64 * 1024 > config.grpc_max_message_size:
        raise ConfigError(
            "grpcMaxMessageSize",
            f"{config.grpc_max_message_size} bytes cannot carry a message of maxMessageSize "
            f"{config.max_message_size} with its fields; raise it to at least "
            f"{config.max_message_size + 64 * 1024}",
        )
    ratios = (
        ("diskMaxUsedSpaceRatio", config.disk_max_used_space_ratio),
        ("diskSpaceCleanForciblyRatio", config.disk_space_clean_forcibly_ratio),
        ("diskSpaceWarningLevelRatio", config.disk_space_warning_level_ratio),
    )
    for (low_key, low), (high_key, high) in zip(ratios, ratios[1:], strict=False):
        if low > high:
            raise ConfigError(
                high_key,
                f"{high:.0%} is below {low_key}={low:.0%}; retention needs "
                "diskMaxUsedSpaceRatio <= diskSpaceCleanForciblyRatio <= "
                "diskSpaceWarningLevelRatio (defaults 75, 85, 90), or sends would be refused "
                "before it cleans",
            )
    index_bytes = 40 + 4 * config.max_hash_slot_num + 20 * config.max_index_num
    if index_bytes > MAX_INDEX_FILE_BYTES:
        raise ConfigError(
            "maxIndexNum",
            f"an index file of {config.max_hash_slot_num} slots and {config.max_index_num} "
            f"keys takes {index_bytes} bytes; RocketMQ's index files stay below 2 GiB "
            "(40 + 4 x maxHashSlotNum + 20 x maxIndexNum < 2^31)",
        )
    if config.max_message_size + 512 > config.commit_log_file_size:
        raise ConfigError(
            "maxMessageSize",
            f"{config.max_message_size} does not fit in a commit-log file of "
            f"{config.commit_log_file_size} bytes (mappedFileSizeCommitLog); set maxMessageSize "
            f"below {config.commit_log_file_size - 512} or raise mappedFileSizeCommitLog",
        )


def _check_failover(config: BrokerConfig) -> None:
    """enableFailover: members are configured alike but for brokerId (>= 1,
    distinct) and addresses; brokerRole says how a member replicates while it leads."""
    if not config.etcd_endpoints:
        raise ConfigError(
            "etcdEndpoints",
            "enableFailover=true needs etcd: set etcdEndpoints=host:port;host:port",
        )
    if config.broker_role == "SLAVE":
        raise ConfigError(
            "brokerRole",
            "with enableFailover=true the role is decided by election: set brokerRole to "
            "SYNC_MASTER or ASYNC_MASTER (how this member replicates while it leads)",
        )
    if config.broker_id < 1:
        raise ConfigError(
            "brokerId",
            f"with enableFailover=true every member needs its own brokerId >= 1, not "
            f"{config.broker_id} (the leader registers as 0)",
        )
    if config.ha_master_address:
        raise ConfigError(
            "haMasterAddress", "with enableFailover=true the master's HA address comes from etcd"
        )


def shown_default(key: str) -> str:
    """A key's default as broker.conf writes it (hours, percent, ms, bytes…):
    parsing it back gives the default (tests/unit/test_broker_config checks)."""
    return shown_value(key, BrokerConfig())


def shown_value(key: str, config: BrokerConfig) -> str:
    """A key's value in `config` as broker.conf writes it (what
    GET_BROKER_CONFIG answers)."""
    name = KNOWN_KEYS[key][0]
    value = getattr(config, name)
    if name == "file_reserved_time_s":
        return f"{value / 3600:g}"
    if name == "delete_when_hours":
        return ";".join(f"{h:02d}" for h in value)
    if name == "consume_queue_entries_per_file":
        return str(value * 20)  # the key is in bytes, 20 per entry
    if name.endswith("_ratio"):
        return f"{value * 100:g}"
    if key.endswith(("Sec", "Seconds")) and isinstance(value, float):
        return f"{value:g}"
    if name.endswith("_s") and isinstance(value, float):
        return str(int(value * 1000))
    if isinstance(value, tuple):
        if name == "namesrv_addrs":
            return ";".join(map(str, value))
        return " ".join(f"{v:g}s" for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def describe_keys() -> str:
    rows = [
        (key, shown_default(key) or '""', meaning) for key, (_, _, meaning) in KNOWN_KEYS.items()
    ]
    width = max(len(r[0]) for r in rows)
    dwidth = min(max(len(r[1]) for r in rows), 28)
    lines = [f"{'key'.ljust(width)}  {'default'.ljust(dwidth)}  meaning"]
    lines += [f"{k.ljust(width)}  {d.ljust(dwidth)}  {m}" for k, d, m in rows]
    return "\n".join(lines)


__all__ = [
    "KNOWN_KEYS",
    "BrokerConfig",
    "describe_keys",
    "load_config",
    "parse_properties",
    "shown_default",
    "shown_value",
]
