"""The broker's servers, built from its config: the ferry.v1 gRPC server (options,
admin-token and ACL interceptors, TLS, the plaintext health port), the
RocketMQ-protocol server and its listening ports, the metrics endpoint, the ACL
file they check requests against, and which gRPC services a broker may serve and
how each is added to a server.

Used by the two roots that run a broker's servers: `app.BrokerApp` builds its own,
and a failover node (services.broker.failover.node) builds one set for all its
runs. Owns these factories only: no use case, no state, no start/stop order (the
roots own it: `grpc_server` and `remoting_server` return servers not yet serving,
`listen_remoting` binds when the root says so). Must never import app, failover/ or
the entry points, nor assign to the objects it builds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import Check, Connection, Handler, RemotingServer
from ferry.runtime import auth
from ferry.runtime.acl_file import AclFile
from ferry.runtime.errors import ConfigError
from ferry.runtime.metrics_http import MetricsEndpoint, start_metrics_endpoint
from ferry.runtime.server import GrpcServer, Service
from ferry.runtime.tls import ServerTLS, server_ssl_context
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    ha_admin_pb2,
    ha_admin_pb2_grpc,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
    transactions_pb2,
    transactions_pb2_grpc,
)
from services.broker.config import BrokerConfig
from services.broker.remoting import after_close as remoting_after_close
from services.broker.remoting.acl import acl_check

log = logging.getLogger(__name__)

BROKER_SERVICE = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
ADMIN_SERVICE = broker_admin_pb2.DESCRIPTOR.services_by_name["BrokerAdmin"].full_name
SLAVE_SYNC_SERVICE = slave_sync_pb2.DESCRIPTOR.services_by_name["SlaveSync"].full_name
HA_ADMIN_SERVICE = ha_admin_pb2.DESCRIPTOR.services_by_name["HAAdmin"].full_name
TRANSACTIONS_SERVICE = transactions_pb2.DESCRIPTOR.services_by_name["Transactions"].full_name
ADD = {  # how each service is added to a server
    BROKER_SERVICE: broker_pb2_grpc.add_BrokerServicer_to_server,
    ADMIN_SERVICE: broker_admin_pb2_grpc.add_BrokerAdminServicer_to_server,
    SLAVE_SYNC_SERVICE: slave_sync_pb2_grpc.add_SlaveSyncServicer_to_server,
    HA_ADMIN_SERVICE: ha_admin_pb2_grpc.add_HAAdminServicer_to_server,
    TRANSACTIONS_SERVICE: transactions_pb2_grpc.add_TransactionsServicer_to_server,
}


def load_acl_file(cfg: BrokerConfig) -> AclFile | None:
    """The plain_acl.yml of aclEnable (None when off); ConfigError naming aclFile and
    what is wrong in the file."""
    if not cfg.acl_enable:
        return None
    assert cfg.acl_file is not None  # load_config gives aclEnable its default file
    try:
        acl = AclFile(cfg.acl_file)
    except ValueError as exc:
        raise ConfigError(
            "aclFile", f"aclEnable=true and the ACL file cannot be used: {exc}"
        ) from None
    log.info(
        "RocketMQ's ACL on: %d accounts from %s (re-read when it changes)",
        len(acl.config.accounts),
        acl.path,
    )
    return acl


def grpc_server(
    cfg: BrokerConfig,
    services: Sequence[Service],
    registry: CollectorRegistry,
    acl: AclFile | None = None,
) -> GrpcServer:
    """The broker's gRPC server for `services` on grpcListenPort: its options,
    admin-token interceptors (with `acl`: the token or an admin account's
    signature), TLS and plaintext health port. A `BrokerApp` builds its own; a
    failover node builds one for all its runs (services.broker.failover.node)."""
    return GrpcServer(
        services,
        cfg.bind_host,
        cfg.grpc_port,
        cfg.grpc_max_message_size,
        interceptors=_interceptors(cfg, acl),
        tls=(
            ServerTLS.load(
                cfg.tls_cert,
                cfg.tls_key,
                cfg.tls_client_ca or None,
                keys=("tlsCert", "tlsKey", "tlsClientCa"),
            )
            if cfg.tls_cert
            else None
        ),
        health_port=cfg.health_port,
        registry=registry,
    )


def _interceptors(cfg: BrokerConfig, acl: AclFile | None) -> list[Any]:
    out = list(auth.interceptors(cfg.admin_token, auth.BROKER_ADMIN_METHODS, acl))
    if acl is not None and cfg.enable_proxy:
        from services.proxy.auth import AclInterceptor  # local mode: the SDKs' door too

        out.append(AclInterceptor(acl))
    return out


def remoting_server(
    registry: CollectorRegistry,
    handlers: Mapping[int, Handler],
    on_close: Callable[[Connection], None] | None = None,
    acl: AclFile | None = None,
) -> RemotingServer:
    """The broker's RocketMQ-protocol server serving `handlers`, every request
    checked against `acl` when given. A `BrokerApp` builds its own; a failover
    node builds one for all its runs."""
    check: Check | None = acl_check(acl) if acl is not None else None
    return RemotingServer(
        "broker",
        handlers,
        metrics=RemotingMetrics(registry, "broker"),
        on_close=on_close,
        after_close=remoting_after_close(),
        check=check,
    )


async def listen_remoting(cfg: BrokerConfig, server: RemotingServer) -> tuple[int, int]:
    """Listen on listenPort and fastListenPort (unless -1), with TLS as
    tlsServerMode says when tlsCert is set; the bound ports (fast: -1 when
    off). An OSError names the key whose port is taken."""
    ports = []
    tls = None
    if cfg.tls_cert and cfg.tls_server_mode != "disabled":
        tls = server_ssl_context(cfg.tls_cert, cfg.tls_key)  # no client certificate asked
    for key, port in (("listenPort", cfg.listen_port), ("fastListenPort", cfg.fast_port)):
        if port < 0:
            ports.append(-1)
            continue
        try:
            ports.append(await server.listen(cfg.bind_host, port, tls, cfg.tls_server_mode))
        except OSError as exc:
            raise OSError(
                f"cannot listen on {cfg.bind_host}:{port} ({key}, RocketMQ's protocol): "
                f"{exc.strerror or exc}"
            ) from None
    return ports[0], ports[1]


def servable(cfg: BrokerConfig) -> dict[str, Callable[[Any, Any], None]]:
    """Every service a broker with `cfg` may serve in some role, by name, with
    how to add it to a server (a failover node's server holds them all)."""
    services: dict[str, Callable[[Any, Any], None]] = dict(ADD)
    if cfg.enable_proxy:
        services.update([rocketmq_v2_service()])
    return services


def proxy_door(
    cfg: BrokerConfig, servicer: Any, registry: CollectorRegistry, acl: AclFile | None
) -> GrpcServer:
    """enableProxy's native door on grpcServerPort: apache.rocketmq.v2 alone (with
    health and reflection), served by ferry_native as the separate proxy's door is;
    with tlsCert, TLS and plaintext on the one port as tlsServerMode says (no client
    certificate asked, as RocketMQ's proxy); with aclEnable, RocketMQ's ACL."""
    from services.proxy import auth as proxy_auth
    from services.proxy.app import MAX_MESSAGE_BYTES, overload_answer

    name, add = rocketmq_v2_service()
    tls = None
    if cfg.tls_cert and cfg.tls_server_mode != "disabled":
        tls = ServerTLS.load(cfg.tls_cert, cfg.tls_key, None, keys=("tlsCert", "tlsKey"))
    return GrpcServer(
        [Service(name, servicer, add)],
        cfg.bind_host,
        cfg.grpc_server_port,
        max(cfg.grpc_max_message_size, MAX_MESSAGE_BYTES),
        interceptors=proxy_auth.interceptors("", "", acl=acl),
        registry=registry,
        tls=tls,
        permissive=cfg.tls_server_mode == "permissive",
        native=True,
        overload_answer=overload_answer,
    )


def rocketmq_v2_service() -> tuple[str, Callable[[Any, Any], None]]:
    """apache.rocketmq.v2.MessagingService (enableProxy): its name and adder."""
    from apache.rocketmq.v2 import service_pb2, service_pb2_grpc

    return (
        service_pb2.DESCRIPTOR.services_by_name["MessagingService"].full_name,
        service_pb2_grpc.add_MessagingServiceServicer_to_server,
    )


def metrics_endpoint(cfg: BrokerConfig, registry: CollectorRegistry) -> MetricsEndpoint | None:
    """`/metrics` of `registry` on metricsPort (None when -1), served from the
    running event loop, which owns what the collectors read."""
    if cfg.metrics_port < 0:
        return None
    return start_metrics_endpoint(
        cfg.bind_host, cfg.metrics_port, registry, loop=asyncio.get_running_loop()
    )
