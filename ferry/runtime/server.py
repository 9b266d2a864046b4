"""The gRPC server runtime shared by every ferry process.

`GrpcServer` builds a `grpc.aio` server with ferry's options (no SO_REUSEPORT,
explicit message-size limits, keepalive that notices dead peers), registers the
health service and server reflection for every service, and owns the health
state: NOT_SERVING until the process calls `set_serving()`, NOT_SERVING again
as soon as `stop()` begins, then a graceful stop. It quiets grpc's ERROR for
answers given after their caller stopped waiting, and counts them in the
registry it is given (`ferry.runtime.late_answers`).

`run_until_signalled` runs an app until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer as AsyncReflectionServicer
from prometheus_client import CollectorRegistry

from ferry.runtime import late_answers
from ferry.runtime.native_server import DoorCollector, NativeServer
from ferry.runtime.tls import ServerTLS
from ferry.runtime.tls_sniff import PeerBook, TLSSniffRelay

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class Service:
    """One servicer and how to add it: `add(servicer, server)` and its full name."""

    name: str
    servicer: Any
    add: Callable[[Any, grpc.aio.Server], None]


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Ping idle connections so a peer that vanished without a FIN is noticed.
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]


class GrpcServer:
    def __init__(
        self,
        services: Sequence[Service],
        host: str,
        port: int,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: ServerTLS | None = None,
        health_port: int = -1,
        registry: CollectorRegistry | None = None,
        permissive: bool = False,
        peers: PeerBook | None = None,
        native: bool = False,
        overload_answer: Callable[[str], bytes | None] | None = None,
    ) -> None:
        """`registry`: the process's metrics, where `ferry_grpc_late_answers_total`
        is registered. `permissive` (with `tls`): the port serves TLS and
        plaintext alike, through a relay that tells them apart by the first byte
        (`ferry.runtime.tls_sniff`); the server itself then listens on two
        loopback ports, and the relay writes each connection's client into
        `peers` (for interceptors that need the client's address). Without `tls`
        it changes nothing.

        `native`: serve on ferry_native's door (`ferry.runtime.native_server`)
        instead of grpcio's core: the same services, interceptors, health and
        reflection; TLS and plaintext on one port in the door itself when
        `permissive` (no relay, so `peers` is not needed: the door sees the
        clients). `overload_answer(path)`: what a method of the door answers when
        too many calls are open (None: gRPC's RESOURCE_EXHAUSTED)."""
        self._services = list(services)
        self._interceptors = list(interceptors)
        self._tls = tls
        self._permissive = permissive and tls is not None
        self._relay: TLSSniffRelay | None = None
        self._peers = peers
        # >= 0: also serve grpc.health.v1 alone, in plaintext, on this port (for
        # probes that cannot speak TLS, like the kubelet's); -1: not at all.
        self._health_port = health_port
        self._health_server: grpc.aio.Server | None = None
        self.health_port = -1
        self._host = host
        self._requested_port = port
        self._max_message_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._native = native
        self._overload_answer = overload_answer
        self._registry = registry
        self._health = HealthServicer()
        self._conditions: set[str] = set()  # health names of the process's own, see set_health
        self.port = 0
        if registry is not None:
            late_answers.register(registry)

    def door_stats(self) -> dict[str, int]:
        """The native door's counters (connections, TLS and plaintext ones, refusals);
        {} on grpcio's core."""
        server = self._server
        return server.stats() if self._native and server is not None else {}  # type: ignore[attr-defined]

    async def start(self) -> int:
        """Bind and start; health stays NOT_SERVING. Returns the bound port."""
        if self._native:
            return await self._start_native()
        late_answers.install()
        server = grpc.aio.server(
            options=server_options(self._max_message_bytes), interceptors=self._interceptors
        )
        for service in self._services:
            service.add(service.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [s.name for s in self._services]
        reflection.enable_server_reflection(
            [
                *names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        await self._set_all(NOT_SERVING)
        if self._permissive:
            relay = TLSSniffRelay(
                self._host,
                self._requested_port,
                self._listen(server, 0, self._tls, "127.0.0.1"),
                self._listen(server, 0, None, "127.0.0.1"),
                self._peers,
            )
            await server.start()
            try:
                self.port = await relay.start()
            except OSError as exc:
                await server.stop(0)
                raise OSError(
                    f"cannot listen on {self._host}:{self._requested_port}: {exc}"
                ) from None
            self._relay = relay
        else:
            self.port = self._listen(server, self._requested_port, self._tls)
            await server.start()
        self._server = server
        if self._health_port >= 0:
            await self._start_health_server()
        log.info(
            "gRPC listening on %s:%d (%s%s)",
            self._host,
            self.port,
            ", ".join(names),
            "" if self._tls is None else "; TLS" + (", client certificates required"
                                                  if self._tls.client_ca else "")
            + ("" if self._relay is None else " and plaintext on one port (permissive), "
               f"relayed to 127.0.0.1:{self._relay.tls_port} (TLS) and "
               f":{self._relay.plain_port} (plaintext)"),
        )  # fmt: skip
        return self.port

    def _reflected(self) -> list[str]:
        return [
            *(s.name for s in self._services),
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]

    async def _start_native(self) -> int:
        server = NativeServer(
            self._interceptors,
            self._max_message_bytes,
            overload_answer=self._overload_answer,
        )
        for service in self._services:
            service.add(service.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            AsyncReflectionServicer(self._reflected()), server
        )
        await self._set_all(NOT_SERVING)
        mode = (
            "disabled" if self._tls is None else "permissive" if self._permissive else "enforcing"
        )
        self.port = await server.start(self._host, self._requested_port, self._tls, mode)
        self._server = server  # type: ignore[assignment]
        if self._registry is not None:
            self._registry.register(DoorCollector(server, self._services[0].name))
        if self._health_port >= 0:
            await self._start_health_server()
        log.info(
            "gRPC listening on %s:%d (%s; native door%s)",
            self._host,
            self.port,
            ", ".join(s.name for s in self._services),
            ""
            if self._tls is None
            else (", TLS and plaintext on one port (permissive)" if self._permissive
                  else ", TLS only (enforcing)")
            + (", client certificates required" if self._tls.client_ca else ""),
        )  # fmt: skip
        return self.port

    def _listen(
        self, server: grpc.aio.Server, port: int, tls: ServerTLS | None, host: str = ""
    ) -> int:
        """Add the listening port (TLS when `tls`); the bound port, or OSError."""
        address = f"{host or self._host}:{port}"
        try:
            if tls is not None:
                bound = server.add_secure_port(address, tls.credentials())
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {exc} (is the port in use?)") from None
        if bound == 0:
            raise OSError(f"cannot listen on {address} (is the port in use?)")
        return bound

    async def _start_health_server(self) -> None:
        health_only = grpc.aio.server(options=server_options(64 * 1024))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, health_only)
        port = self._listen(health_only, self._health_port, None)
        await health_only.start()
        self._health_server, self.health_port = health_only, port
        log.info("gRPC health (only) on %s:%d, plaintext", self._host, port)

    async def set_serving(self, names: Collection[str] | None = None) -> None:
        """SERVING for the process and its services; with `names`, only those
        services (the others NOT_SERVING: not served by what runs now)."""
        await self._set_all(SERVING)
        if names is not None:
            for service in self._services:
                if service.name not in names:
                    await self._health.set(service.name, NOT_SERVING)

    async def set_not_serving(self) -> None:
        await self._set_all(NOT_SERVING)

    async def set_health(self, name: str, serving: bool) -> None:
        """Report a condition of the process's own under a health name that is
        not a gRPC service (a probe asks for it with `service: NAME`), e.g. a
        failover member's in-sync readiness. `set_serving` leaves it alone;
        stopping reports it NOT_SERVING with everything else."""
        self._conditions.add(name)
        await self._health.set(name, SERVING if serving else NOT_SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING, let calls in flight finish for `grace_s`, then stop."""
        await self._set_all(NOT_SERVING)
        if self._relay is not None:
            self._relay.stop_accepting()
        if self._server is not None:
            stats = self._server.stats() if isinstance(self._server, NativeServer) else None
            await self._server.stop(grace_s)
            self._server = None
            if stats is not None and self._tls is not None:
                log.info(
                    "served %d TLS and %d plaintext connections (%d refused)",
                    stats.get("tls_connections", 0), stats.get("plaintext_connections", 0),
                    stats.get("refused_connections", 0),
                )  # fmt: skip
        if self._relay is not None:
            await self._relay.stop()
            log.info(
                "relayed %d TLS and %d plaintext connections",
                self._relay.relayed[True], self._relay.relayed[False],
            )  # fmt: skip
            self._relay = None
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None

    async def _set_all(self, status: int) -> None:
        await self._health.set("", status)
        for service in self._services:
            await self._health.set(service.name, status)
        if status == NOT_SERVING:
            for name in self._conditions:
                await self._health.set(name, status)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def run_until_signalled(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    until: asyncio.Event | None = None,
) -> None:
    """Start an app, wait for SIGTERM/SIGINT (or for `until`: the app stopped
    itself), then stop it."""
    stopping = asyncio.Event()
    install_stop_signals(stopping)
    await start()
    try:
        waits = [asyncio.ensure_future(stopping.wait())]
        if until is not None:
            waits.append(asyncio.ensure_future(until.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        log.info("signal received; stopping" if stopping.is_set() else "stopping")
    finally:
        await stop()
