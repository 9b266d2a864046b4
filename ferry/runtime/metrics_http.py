"""The Prometheus `/metrics` HTTP endpoint every process serves."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

log = logging.getLogger(__name__)


@dataclass
class MetricsEndpoint:
    host: str
    port: int
    _server: object
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


def start_metrics_endpoint(host: str, port: int, registry: CollectorRegistry) -> MetricsEndpoint:
    """Serve `registry` on http://host:port/metrics (port 0 picks a free port).

    Counters and histograms are served without prometheus_client's `*_created`
    series (one extra series each, which ferry's rules and dashboards never use).
    """
    disable_created_metrics()
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsEndpoint(host, bound, server, thread)
