"""The Prometheus `/metrics` HTTP endpoint every process serves.

prometheus_client's HTTP server answers each scrape on a thread of its own.
The collectors behind a ferry registry read state the asyncio event loop owns
and changes at any moment (the name server's route tables, the broker's store,
consume queues, metadata tables and HA connections); iterating those dicts from
another thread fails at random ("dictionary changed size during iteration") or
reports torn figures. So when `start_metrics_endpoint` is given the process's
loop, collectors run on the event loop: the HTTP thread asks the loop to run
`registry.collect()` and waits (bounded) for the finished `Metric` objects,
which it then encodes itself. The loop only ever pays for the collection, never
for the text encoding, compression or socket writes.

This module owns the HTTP server thread and the hand-off to the loop; it never
touches the state the collectors read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server
from prometheus_client.core import Metric

log = logging.getLogger(__name__)

DEFAULT_COLLECT_TIMEOUT_S = 5.0


class ScrapeUnavailable(Exception):
    """The event loop did not collect the metrics (closed, stopped or too slow)."""


class _LoopCollected:
    """A registry stand-in whose `collect()` runs the real one on the event loop.

    The HTTP thread holds only this object; the collectors it wraps are called
    on the loop thread, so they see the loop's state between two of its steps.
    """

    def __init__(
        self, collect: Callable[[], Iterable[Metric]], registry, loop, timeout_s: float
    ) -> None:
        self._collect = collect
        self._registry = registry
        self._loop = loop
        self._timeout_s = timeout_s

    def collect(self) -> list[Metric]:
        if self._loop.is_closed() or not self._loop.is_running():
            raise ScrapeUnavailable("the event loop is not running")
        future: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def on_loop() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the scrape already gave up
            try:
                future.set_result(list(self._collect()))
            except BaseException as exc:  # handed to the HTTP thread, which answers 500
                future.set_exception(exc)

        try:
            self._loop.call_soon_threadsafe(on_loop)
        except RuntimeError as exc:  # closed between the check and the call
            raise ScrapeUnavailable("the event loop is closed") from exc
        try:
            return future.result(timeout=self._timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise ScrapeUnavailable(
                f"the event loop did not collect within {self._timeout_s:g}s"
            ) from exc

    def restricted_registry(self, names: Iterable[str]) -> _LoopCollected:
        """The `?name[]=` filter: restrict the real registry, still collect on the loop."""
        restricted = self._registry.restricted_registry(names)
        return _LoopCollected(restricted.collect, restricted, self._loop, self._timeout_s)


def _answer_503_when_unavailable(app: Callable) -> Callable:
    """Wrap prometheus_client's WSGI app: a scrape the loop could not serve gets a 503.

    A 503 (rather than an empty 200 exposition) makes Prometheus record the scrape
    as failed: `up` drops to 0 and the target page shows the reason, instead of
    every series vanishing from a target that claims to be healthy.
    """

    def wrapped(environ, start_response):
        try:
            return app(environ, start_response)
        except ScrapeUnavailable as exc:
            log.warning("metrics scrape failed: %s", exc)
            start_response(
                "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")]
            )
            return [f"metrics unavailable: {exc}\n".encode()]

    return wrapped


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


def start_metrics_endpoint(
    host: str,
    port: int,
    registry: CollectorRegistry,
    loop: asyncio.AbstractEventLoop | None = None,
    collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S,
) -> MetricsEndpoint:
    """Serve `registry` on http://host:port/metrics (port 0 picks a free port).

    With `loop`, every scrape's collection runs on that event loop (see the
    module docstring); a scrape the loop does not serve within
    `collect_timeout_s` (loop stopped, closed or blocked) is answered with
    HTTP 503 and a one-line reason, and the server thread keeps serving.
    Without `loop`, collectors run on the HTTP thread, which is only safe for
    registries whose collectors read nothing a loop mutates.

    Counters and histograms are served without prometheus_client's `*_created`
    series (one extra series each, which ferry's rules and dashboards never use).
    """
    disable_created_metrics()
    served = (
        registry
        if loop is None
        else _LoopCollected(registry.collect, registry, loop, collect_timeout_s)
    )
    server, thread = start_http_server(port, addr=host, registry=served)  # type: ignore[arg-type]
    if loop is not None:
        # Each request looks the app up anew; one arriving before this line gets
        # a 500 instead of a 503 if the loop cannot serve it, nothing worse.
        server.set_app(_answer_503_when_unavailable(server.get_app()))
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsEndpoint(host, bound, server, thread)
