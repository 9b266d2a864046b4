"""The broker's Prometheus metrics. Figures owned by the store and metadata
are read at scrape time by a custom collector; nothing sets gauges on a timer.

Issue #5 extends this (latencies, replication); names follow SPEC §6.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import ferry
from services.broker.store import MessageStore


class _StoreCollector(Collector):
    def __init__(
        self, store: MessageStore, metadata, permission: Callable[[], int], config
    ) -> None:
        self.store = store
        self.metadata = metadata
        self.permission = permission
        self.labels = [
            config.cluster_name,
            config.broker_name,
            str(config.broker_id),
            config.broker_role,
        ]

    def collect(self) -> Iterable[Metric]:
        names = ["cluster", "broker_name", "broker_id", "role"]
        store = self.store

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(self.labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(self.labels, value)
            return family

        yield gauge(
            "ferry_broker_commit_log_max_offset_bytes",
            "Commit offset just past the last record written.",
            store.max_offset,
        )
        yield gauge(
            "ferry_broker_commit_log_min_offset_bytes",
            "Commit offset of the oldest commit-log file.",
            store.min_offset,
        )
        yield gauge(
            "ferry_broker_commit_log_flushed_offset_bytes",
            "Commit offset below which the commit log is fsynced.",
            store.flushed_offset,
        )
        yield gauge(
            "ferry_broker_dispatch_behind_bytes",
            "Commit-log bytes not yet in consume queues.",
            store.dispatcher.behind_bytes,
        )
        yield counter(
            "ferry_broker_put_messages",
            "Messages appended to the commit log.",
            store.put_message_count,
        )
        yield counter(
            "ferry_broker_get_messages",
            "Messages returned to consumers.",
            store.get_message_count,
        )
        topics, _ = self.metadata.topics.snapshot()
        yield gauge("ferry_broker_topics", "Topics in the broker's topic table.", len(topics))
        yield gauge(
            "ferry_broker_permission",
            "brokerPermission (6 read-write, 4 read-only, 2 write-only).",
            self.permission(),
        )
        build = GaugeMetricFamily(
            "ferry_build_info", "ferry version.", labels=["version", "service"]
        )
        build.add_metric([ferry.__version__, "broker"], 1)
        yield build


class BrokerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        store: MessageStore,
        metadata,
        permission: Callable[[], int],
        config,
    ) -> None:
        registry.register(_StoreCollector(store, metadata, permission, config))
