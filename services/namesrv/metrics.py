"""The name server's Prometheus metrics (docs/reference/metrics.md, "Name server").
Values read from the route table are collected at scrape time; events are counted
as they happen.

The route collector runs on the event loop, which owns the route table
(`ferry.runtime.metrics_http` hands each scrape's collection to the loop), so it
reads the live tables directly; it must stay quick and never block or await."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import ferry
from services.namesrv.routes import Removal, RouteTable


class _RouteCollector(Collector):
    def __init__(self, routes: RouteTable) -> None:
        self._routes = routes

    def collect(self) -> Iterable[Metric]:
        live = GaugeMetricFamily(
            "ferry_namesrv_live_brokers", "Brokers registered and not expired."
        )
        live.add_metric([], self._routes.live_count())
        yield live
        topics = GaugeMetricFamily("ferry_namesrv_topics", "Topics with a route.")
        topics.add_metric([], len(self._routes.topic_queue_table))
        yield topics
        last = GaugeMetricFamily(
            "ferry_namesrv_broker_last_update_timestamp_seconds",
            "When each live broker last registered or heartbeated (wall clock).",
            labels=["cluster", "broker_name", "broker_id", "addr"],
        )
        for addr, b in self._routes.live.items():
            last.add_metric(
                [b.cluster_name, b.broker_name, str(b.broker_id), addr],
                b.last_update_wall_ms / 1000.0,
            )
        yield last


class NamesrvMetrics:
    def __init__(self, registry: CollectorRegistry, routes: RouteTable) -> None:
        self.registrations = Counter(
            "ferry_namesrv_registrations",
            "RegisterBroker calls applied, by whether they changed the topic routes.",
            ["changed"],
            registry=registry,
        )
        self.unregisters = Counter(
            "ferry_namesrv_unregisters",
            "Brokers removed, by reason (graceful, expired, connection_lost).",
            ["reason"],
            registry=registry,
        )
        for reason in ("graceful", "expired", "connection_lost"):
            self.unregisters.labels(reason)
        for changed in ("true", "false"):
            self.registrations.labels(changed)
        build = GaugeMetricFamily(
            "ferry_build_info", "ferry build information.", labels=["version", "component"]
        )
        build.add_metric([ferry.__version__, "namesrv"], 1)
        registry.register(_Static([build]))
        registry.register(_RouteCollector(routes))

    def registered(self, topic_config_applied: bool) -> None:
        self.registrations.labels("true" if topic_config_applied else "false").inc()

    def removed(self, removals: Iterable[Removal | None]) -> None:
        for removal in removals:
            if removal is not None:
                self.unregisters.labels(removal.reason).inc()


class _Static(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self._metrics)
