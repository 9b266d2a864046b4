"""Composition root of the name server: builds the clock, KV store, route
table, metrics, servicer, the RocketMQ-protocol server and the gRPC server,
and owns the start/stop order and the housekeeping task (the only background
task; it expires brokers).

Two doors, one table: `port` (9876, RocketMQ's) speaks RocketMQ's protocol
(services.namesrv.remoting), `grpc_port` (9879) speaks ferry.v1 gRPC; both
read and change the same routes and KV store. Start: both listen, then
SERVING. Stop: the RocketMQ-protocol server closes first (its clients have no
graceful drain to wait for), then gRPC stops with its grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import RemotingServer
from ferry.runtime import auth
from ferry.runtime.clock import Clock, SystemClock
from ferry.runtime.files import atomic_write_bytes
from ferry.runtime.metrics_http import MetricsEndpoint, start_metrics_endpoint
from ferry.runtime.server import DEFAULT_MAX_MESSAGE_BYTES, GrpcServer, Service
from ferry.runtime.tls import ServerTLS
from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc
from services.namesrv import remoting
from services.namesrv.kvconfig import FILE_NAME, KVConfigStore
from services.namesrv.metrics import NamesrvMetrics
from services.namesrv.routes import DEFAULT_HEARTBEAT_TIMEOUT_S, RouteTable
from services.namesrv.servicer import NameServerServicer

log = logging.getLogger(__name__)

SERVICE_NAME = namesrv_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
DEFAULT_PORT = 9876  # RocketMQ's protocol, as Apache's name server
DEFAULT_GRPC_PORT = 9879  # ferry.v1 gRPC: clashes with none of RocketMQ's ports


@dataclass(frozen=True)
class NamesrvConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT  # RocketMQ's protocol; 0 picks a free port
    # ferry.v1 gRPC; None: DEFAULT_GRPC_PORT, or a free port when `port` is 0.
    grpc_port: int | None = None
    metrics_port: int = 9877  # -1: no metrics endpoint
    home: Path = field(default_factory=lambda: Path.home() / "ferry" / "namesrv")
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    scan_interval_s: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    grace_s: float = 5.0
    port_file: Path | None = None  # written with the bound ports once serving
    admin_token: str = ""  # "": state-changing RPCs are open, as in RocketMQ
    # With an admin token: who may register brokers over RocketMQ's protocol.
    broker_hosts: tuple[str, ...] = ()
    tls: ServerTLS | None = None  # None: plaintext gRPC
    # TLS on the RocketMQ-protocol port (RocketMQ's tls.server.mode): an SSL context
    # (None: plaintext) and "permissive" (TLS and plaintext on the port) or "enforcing".
    remoting_tls: ssl.SSLContext | None = None
    remoting_tls_mode: str = "permissive"
    health_port: int = -1  # >= 0: grpc.health.v1 alone, plaintext, here (probes)

    @property
    def effective_grpc_port(self) -> int:
        if self.grpc_port is not None:
            return self.grpc_port
        return 0 if self.port == 0 else DEFAULT_GRPC_PORT


class NamesrvApp:
    def __init__(
        self,
        config: NamesrvConfig,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.kv = KVConfigStore(Path(config.home) / FILE_NAME)
        self.routes = RouteTable(self.clock, config.heartbeat_timeout_s)
        self.metrics = NamesrvMetrics(self.registry, self.routes)
        self.servicer = NameServerServicer(self.routes, self.kv, self.metrics, self.clock)
        self.server = GrpcServer(
            [
                Service(
                    SERVICE_NAME, self.servicer, namesrv_pb2_grpc.add_NameServerServicer_to_server
                )
            ],
            config.host,
            config.effective_grpc_port,
            config.max_message_bytes,
            interceptors=auth.interceptors(config.admin_token, auth.NAMESRV_ADMIN_METHODS),
            tls=config.tls,
            health_port=config.health_port,
            registry=self.registry,
        )
        self.remoting = RemotingServer(
            "namesrv",
            remoting.handlers(
                routes=self.routes,
                kv=self.kv,
                grpc_port=lambda: self.server.port,
                metrics=self.metrics,
                admin_token=config.admin_token,
                broker_hosts=config.broker_hosts,
                settings=self._settings(),
            ),
            metrics=RemotingMetrics(self.registry, "namesrv"),
        )
        self.remoting_port = 0  # bound by start()
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._housekeeping: asyncio.Task | None = None

    def _settings(self) -> dict[str, str]:
        """What GET_NAMESRV_CONFIG answers: Apache's keys for what ferry has
        (listenPort as configured, 0: picked at start), ferry's own besides."""
        c = self.config
        return {
            "listenPort": str(c.port),
            "grpcListenPort": str(c.effective_grpc_port),
            "kvConfigPath": str(c.home / FILE_NAME),
            "scanNotActiveBrokerInterval": str(int(c.scan_interval_s * 1000)),
            "brokerHeartbeatTimeoutMillis": str(int(c.heartbeat_timeout_s * 1000)),
            "orderMessageEnable": "true",
            "clusterTest": "false",
            "tlsServerMode": c.remoting_tls_mode if c.remoting_tls is not None else "disabled",
            "metricsPort": str(c.metrics_port),
        }

    @property
    def port(self) -> int:
        """The ferry.v1 gRPC port (bound)."""
        return self.server.port

    @property
    def metrics_port(self) -> int:
        return self._metrics_endpoint.port if self._metrics_endpoint else -1

    async def start(self) -> None:
        await self.kv.save_if_recovered()
        await self.server.start()
        try:
            self.remoting_port = await self.remoting.listen(
                self.config.host,
                self.config.port,
                self.config.remoting_tls,
                self.config.remoting_tls_mode,
            )
        except OSError as exc:
            await self.server.stop(0)
            raise OSError(
                f"cannot listen on {self.config.host}:{self.config.port} (RocketMQ's protocol, "
                f"--port): {exc.strerror or exc}"
            ) from None
        if self.config.metrics_port >= 0:
            self._metrics_endpoint = start_metrics_endpoint(
                self.config.host,
                self.config.metrics_port,
                self.registry,
                loop=asyncio.get_running_loop(),
            )
        self._housekeeping = asyncio.create_task(self._housekeep(), name="namesrv-housekeeping")
        await self.server.set_serving()
        log.info(
            "name server ready: rocketmq=%s:%d grpc=%s:%d metrics=%d home=%s",
            self.config.host,
            self.remoting_port,
            self.config.host,
            self.port,
            self.metrics_port,
            self.config.home,
        )
        # The port file last: whoever sees it finds the ready line in the log already.
        if self.config.port_file:
            info = {
                "remoting_port": self.remoting_port,
                "grpc_port": self.port,
                "metrics_port": self.metrics_port,
                "health_port": self.server.health_port,
                "pid": os.getpid(),
            }
            atomic_write_bytes(Path(self.config.port_file), json.dumps(info).encode())

    async def stop(self) -> None:
        self.servicer.begin_shutdown()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        await self.remoting.stop()
        await self.server.stop(self.config.grace_s)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        log.info("name server stopped")

    def expire_now(self) -> int:
        """One housekeeping pass: expire brokers past their heartbeat timeout."""
        removals = self.routes.expire(self.clock.monotonic())
        self.metrics.removed(removals)
        for r in removals:
            log.warning(
                "broker expired (no heartbeat in time): addr=%s group=%s id=%d",
                r.broker_addr,
                r.broker_name,
                r.broker_id,
            )
        return len(removals)

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval_s)
            try:
                self.expire_now()
            except Exception:
                log.exception("housekeeping pass failed; trying again next period")
