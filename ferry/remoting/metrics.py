"""Prometheus series of a RocketMQ-protocol server (docs/reference/metrics.md,
"RocketMQ protocol"). Each process registers them once; `server` tells the
name server's, a broker's, and a broker's VIP port apart when one process
serves several."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RemotingMetrics:
    """Requests by request and response code, protocol errors, open
    connections, bytes in and out. Labelled children are cached: a send costs
    one dict lookup here, not a label resolution."""

    def __init__(self, registry: CollectorRegistry | None, server: str) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self._server = server
        self._requests = Counter(
            "ferry_remoting_requests",
            "RocketMQ-protocol requests handled, by request code and the response code "
            'answered ("none" for oneway requests and requests without an answer).',
            ["server", "request_code", "response_code"],
            registry=registry,
        )
        self._errors = Counter(
            "ferry_remoting_protocol_errors",
            "Connections closed because a frame broke the protocol (too long, a length "
            "that lies, a header that does not parse).",
            ["server"],
            registry=registry,
        ).labels(server)
        self._connections = Gauge(
            "ferry_remoting_connections",
            "RocketMQ-protocol connections open.",
            ["server"],
            registry=registry,
        ).labels(server)
        self._in = Counter(
            "ferry_remoting_received_bytes",
            "Bytes read from RocketMQ-protocol connections.",
            ["server"],
            registry=registry,
        ).labels(server)
        self._out = Counter(
            "ferry_remoting_sent_bytes",
            "Bytes written to RocketMQ-protocol connections.",
            ["server"],
            registry=registry,
        ).labels(server)
        self._children: dict[tuple[int, int | None], object] = {}

    def request(self, request_code: int, response_code: int | None, count: int = 1) -> None:
        """`count` requests of `request_code` answered with `response_code`."""
        key = (request_code, response_code)
        child = self._children.get(key)
        if child is None:
            child = self._requests.labels(
                self._server,
                str(request_code),
                "none" if response_code is None else str(response_code),
            )
            self._children[key] = child
        child.inc(count)  # type: ignore[attr-defined]

    def protocol_error(self) -> None:
        self._errors.inc()

    def opened(self) -> None:
        self._connections.inc()

    def closed(self) -> None:
        self._connections.dec()

    def received(self, n: int) -> None:
        self._in.inc(n)

    def sent(self, n: int) -> None:
        self._out.inc(n)
