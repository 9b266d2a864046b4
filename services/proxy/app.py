"""Composition root of the proxy: the route cache, the MessagingService
servicer and the gRPC server (health and reflection as every ferry server).

With a certificate the port serves TLS as Apache's proxy's tlsMode says:
permissive (TLS and plaintext on the one port, through
`ferry.runtime.tls_sniff`), enforcing (TLS only) or disabled (plaintext
only). Without one it is plaintext, and no relay runs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2, service_pb2_grpc
from ferry.runtime.acl_file import AclFile
from ferry.runtime.files import atomic_write_bytes
from ferry.runtime.metrics_http import MetricsEndpoint, start_metrics_endpoint
from ferry.runtime.server import GrpcServer, Service
from ferry.runtime.tls import ServerTLS
from ferry.runtime.tls_sniff import PeerBook
from services.proxy import auth
from services.proxy.metrics import ProxyMetrics
from services.proxy.routes import Routes
from services.proxy.servicer import (
    MAX_BODY_BYTES,
    MIN_INVISIBLE_MS,
    MessagingServicer,
    ProxyOptions,
)

log = logging.getLogger(__name__)

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].full_name
# The largest message accepted: a batch of bodies at the limit, with room for properties.
MAX_MESSAGE_BYTES = 4 * MAX_BODY_BYTES + (1 << 20)
TLS_MODES = ("disabled", "permissive", "enforcing")
DOORS = ("native", "grpcio")
BROKER_PROTOCOLS = ("remoting", "grpc")


@dataclass(frozen=True)
class ProxyConfig:
    namesrv_addrs: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8081
    metrics_port: int = -1  # -1: no metrics endpoint
    advertise_host: str = ""  # what routes name when a client does not say; default: host
    port_file: Path | None = None
    grace_s: float = 5.0
    # Both set: every apache.rocketmq.v2 call must be signed with them (services/proxy/auth.py);
    # both "": nothing is checked, as RocketMQ's proxy with ACL off.
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    # Instead of the keys: every call checked against this plain_acl.yml (RocketMQ's ACL).
    acl_file: Path | None = None
    # RocketMQ's enableTopicMessageTypeCheck: sends must be of their topic's message.type.
    topic_message_type_check: bool = True
    # RocketMQ's proxy's minInvisibleTimeMillsForRecv: the least invisible time a receive asks.
    min_invisible_ms: int = MIN_INVISIBLE_MS
    # The certificate and key; None: plaintext only, whatever tls_mode says.
    tls: ServerTLS | None = field(default=None, repr=False)
    # Apache's proxy's tlsMode with a certificate: "permissive" TLS and plaintext on one
    # port, "enforcing" TLS only, "disabled" plaintext only.
    tls_mode: str = "permissive"
    # The SDKs' door: "native" (ferry_native's HTTP/2 and TLS, `ferry.runtime.native_server`)
    # or "grpcio" (grpcio's core, with a relay in front for a permissive port).
    door: str = "native"
    # How sends reach brokers: "remoting" (RocketMQ's protocol, where a route gives
    # the broker's address in it) or "grpc" (ferry.v1 only).
    broker_protocol: str = "remoting"
    # The account RocketMQ-protocol sends are signed with (brokers with aclEnable).
    broker_access_key: str = ""
    broker_secret_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.tls_mode not in TLS_MODES:
            raise ValueError(f"tls_mode {self.tls_mode!r} is not one of {', '.join(TLS_MODES)}")
        if self.door not in DOORS:
            raise ValueError(f"door {self.door!r} is not one of {', '.join(DOORS)}")
        if self.broker_protocol not in BROKER_PROTOCOLS:
            raise ValueError(
                f"broker_protocol {self.broker_protocol!r} is not one of "
                f"{', '.join(BROKER_PROTOCOLS)}"
            )


def overload_answer(path: str) -> bytes | None:
    """A MessagingService method's answer when the door has too many calls open:
    its response with TOO_MANY_REQUESTS, which the SDKs retry after a backoff."""
    response_type = auth.RESPONSE_TYPES.get(path)
    if response_type is None:
        return None  # health, reflection: gRPC's RESOURCE_EXHAUSTED
    text = "the proxy has too many calls open; retry after a backoff"
    return response_type(
        status=v2.Status(code=v2.TOO_MANY_REQUESTS, message=text)
    ).SerializeToString()


class ProxyApp:
    def __init__(self, config: ProxyConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.routes = Routes(config.namesrv_addrs, max_message_bytes=MAX_MESSAGE_BYTES)
        self.metrics = ProxyMetrics(self.registry)
        options = ProxyOptions(
            self._endpoint,
            topic_message_type_check=config.topic_message_type_check,
            min_invisible_ms=config.min_invisible_ms,
            broker_protocol=config.broker_protocol,
            broker_access_key=config.broker_access_key,
            broker_secret_key=config.broker_secret_key,
        )
        self.servicer = MessagingServicer(self.routes, options, self.metrics)
        # ValueError naming the file and the field when the ACL file cannot be used.
        self.acl = AclFile(config.acl_file) if config.acl_file is not None else None
        native = config.door == "native"
        relayed = config.tls is not None and config.tls_mode == "permissive" and not native
        peers = PeerBook() if relayed else None  # the relay's clients, for the ACL
        self.server = GrpcServer(
            [
                Service(
                    SERVICE_NAME,
                    self.servicer,
                    service_pb2_grpc.add_MessagingServiceServicer_to_server,
                )
            ],
            config.host,
            config.port,
            MAX_MESSAGE_BYTES,
            interceptors=auth.interceptors(
                config.access_key, config.secret_key, self.metrics, acl=self.acl, peers=peers
            ),
            registry=self.registry,
            tls=config.tls if config.tls_mode != "disabled" else None,
            permissive=config.tls_mode == "permissive",
            peers=peers,
            native=native,
            overload_answer=overload_answer,
        )
        self._metrics_endpoint: MetricsEndpoint | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def _endpoint(self) -> tuple[str, int]:
        """Where routes send SDKs that did not say: this proxy's advertised address."""
        host = self.config.advertise_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return host, self.port

    async def start(self) -> None:
        await self.server.start()
        if self.config.metrics_port >= 0:
            self._metrics_endpoint = start_metrics_endpoint(
                self.config.host,
                self.config.metrics_port,
                self.registry,
                loop=asyncio.get_running_loop(),
            )
        await self.server.set_serving()
        log.info(
            "proxy ready: apache.rocketmq.v2 on %s:%d, name servers %s",
            self.config.host,
            self.port,
            ";".join(self.config.namesrv_addrs),
        )
        # The port file last: whoever sees it finds the ready line in the log already.
        if self.config.port_file:
            info = {
                "grpc_port": self.port,
                "metrics_port": self._metrics_endpoint.port if self._metrics_endpoint else -1,
                "pid": os.getpid(),
            }
            atomic_write_bytes(Path(self.config.port_file), json.dumps(info).encode())

    async def stop(self) -> None:
        await self.server.stop(self.config.grace_s)
        await self.servicer.close()
        await self.routes.close()
        sends = self.servicer.sends.stats
        if sends.calls:
            log.info(
                "sends over ferry.v1: %d messages in %d broker calls (%.1f per call)",
                sends.messages, sends.calls, sends.messages / sends.calls,
            )  # fmt: skip
        if self.servicer.remoting_sends is not None:
            remoting = self.servicer.remoting_sends.stats
            if remoting.calls:
                log.info("sends over RocketMQ's protocol: %d messages", remoting.messages)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        log.info("proxy stopped")
