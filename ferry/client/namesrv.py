"""A blocking name-server client that fails over between name servers.

Name servers do not talk to each other and each holds the full registry, so a
read can go to any of them: the client tries them in order and moves on when
one does not answer (UNAVAILABLE or a deadline) or is not a name server at
all (UNIMPLEMENTED: a broker's or some other gRPC port named by mistake). Any
other error is the server's answer and is raised as is.

Addresses are the name servers' ferry.v1 gRPC addresses, or, with
`discover=True` (what the `ferry` command does), their RocketMQ-protocol
addresses (RocketMQ's namesrvAddr, 9876): each is then asked for its gRPC
port (`ferry.remoting.discovery`) when first used; one that cannot say is
skipped like one that does not answer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc

from ferry.model import DEFAULT_NAMESRV_ADDR, NAMESRV_ADDR_ENV, check_addr
from ferry.remoting import discovery
from ferry.runtime import auth, tls
from ferry.runtime.errors import InvalidArgument
from ferry.v1 import common_pb2, namesrv_pb2, namesrv_pb2_grpc

_UNANSWERED = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
)


class NoNameServerAnswered(Exception):
    """None of the name servers could be reached."""

    def __init__(self, failures: Sequence[tuple[str, str]], dialled_as_given: bool = True) -> None:
        """`dialled_as_given`: the addresses were dialled as gRPC addresses
        (not discovered from RocketMQ-protocol ones), so one that answers
        RocketMQ's protocol was the wrong kind of address."""
        tried = "; ".join(f"{addr}: {why}" for addr, why in failures)
        closed = [addr for addr, why in failures if "Socket closed" in why]
        rocketmq = [addr for addr in closed if dialled_as_given and _speaks_rocketmq(addr)]
        if rocketmq:
            tls_hint = (
                f" {', '.join(rocketmq)} speak RocketMQ's protocol, not ferry.v1 gRPC: give "
                "NamesrvClient discover=True to find each name server's gRPC port from its "
                "RocketMQ-protocol address (ferry's CLI does), or name the gRPC ports "
                "(--grpc-port, 9879 by default)."
            )
        elif closed and not os.environ.get(tls.ENV_CA):
            tls_hint = " If they serve TLS, pass --tls-ca (or set $FERRY_TLS_CA)."
        else:
            tls_hint = ""
        super().__init__(
            f"no name server answered (tried {tried}). Is one running? "
            f"Name them with -n 'host:port;host:port' or {NAMESRV_ADDR_ENV}.{tls_hint}"
        )
        self.failures = list(failures)


def _speaks_rocketmq(addr: str) -> bool:
    """Whether `addr` answers a RocketMQ-protocol request (for error hints)."""
    from ferry.remoting.client import call
    from ferry.remoting.codec import Command

    try:
        call(addr, Command(0), timeout=1.0)
    except Exception:  # noqa: BLE001 - anything else: it does not
        return False
    return True


def parse_addrs(text: str | None) -> list[str]:
    """`"host:port;host:port"` (RocketMQ's namesrvAddr form; commas accepted too)."""
    raw = text if text else os.environ.get(NAMESRV_ADDR_ENV) or DEFAULT_NAMESRV_ADDR
    addrs = [a.strip() for a in raw.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise InvalidArgument(
            "namesrv", f"{raw!r} names no name server; expected host:port;host:port"
        )
    for addr in addrs:
        check_addr(addr, "namesrv")
    return addrs


class NamesrvClient:
    def __init__(
        self,
        addrs: Sequence[str],
        timeout_s: float = 3.0,
        max_message_bytes: int = 64 * 1024 * 1024,
        admin_token: str | auth.AdminCredentials | None = None,
        discover: bool = False,
    ) -> None:
        """`discover`: `addrs` are RocketMQ-protocol addresses whose gRPC
        ports are asked for (see the module's docstring)."""
        if not addrs:
            raise ValueError("at least one name server address is needed")
        self.addrs = list(addrs)
        self.timeout_s = timeout_s
        self.discover = discover
        self._metadata = auth.client_metadata(admin_token)  # sent with every call
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, namesrv_pb2_grpc.NameServerStub] = {}
        self.grpc_addrs: dict[str, str] = {}  # addr -> the gRPC address it is called at
        if not discover:
            for a in self.addrs:
                self._dial(a, a)

    def _dial(self, addr: str, grpc_addr: str) -> namesrv_pb2_grpc.NameServerStub:
        channel = tls.channel(grpc_addr, options=self._options)
        self._channels[addr] = channel
        self._stubs[addr] = stub = namesrv_pb2_grpc.NameServerStub(channel)
        self.grpc_addrs[addr] = grpc_addr
        return stub

    def _stub(self, addr: str) -> namesrv_pb2_grpc.NameServerStub:
        """The stub for `addr`, discovering its gRPC port first if needed.

        Raises:
            discovery.DiscoveryError: `addr` did not say (down, or not ferry's).
        """
        stub = self._stubs.get(addr)
        if stub is None:
            stub = self._dial(addr, discovery.grpc_address_sync(addr, self.timeout_s))
        return stub

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def __enter__(self) -> NamesrvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any) -> Any:
        """Call `method` on the first name server that answers."""
        failures = []
        for addr in self.addrs:
            try:
                stub = self._stub(addr)
            except discovery.DiscoveryError as exc:
                failures.append((addr, str(exc)))
                continue
            try:
                return getattr(stub, method)(
                    request, timeout=self.timeout_s, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                if exc.code() not in _UNANSWERED:
                    raise
                failures.append((addr, _short(exc)))
        raise NoNameServerAnswered(failures, dialled_as_given=not self.discover)

    def call_each(self, method: str, request: Any) -> dict[str, Any]:
        """Call `method` on every name server: addr -> response, the RpcError,
        or the DiscoveryError of one whose gRPC port could not be found."""
        results: dict[str, Any] = {}
        for addr in self.addrs:
            try:
                stub = self._stub(addr)
            except discovery.DiscoveryError as exc:
                results[addr] = exc
                continue
            try:
                results[addr] = getattr(stub, method)(
                    request, timeout=self.timeout_s, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                results[addr] = exc
        return results

    def route(self, topic: str) -> common_pb2.TopicRouteData:
        return self.call("GetRouteInfoByTopic", namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic))

    def cluster_info(self) -> namesrv_pb2.ClusterInfo:
        return self.call("GetBrokerClusterInfo", namesrv_pb2.GetBrokerClusterInfoRequest())

    def topics(self) -> list[str]:
        return list(self.call("GetAllTopicList", namesrv_pb2.GetAllTopicListRequest()).topic_list)


def _short(exc: grpc.RpcError) -> str:
    details = exc.details() or ""
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return "not a ferry name server (it does not serve ferry.v1.NameServer)"
    if "Connection refused" in details or "connection refused" in details:
        return "connection refused"
    return f"{exc.code().name}: {details[:120]}"
