"""The name server's metric names and types (docs/reference/metrics.md, "Name
server") on a fresh registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ferry.runtime.clock import FakeClock
from services.namesrv.metrics import NamesrvMetrics
from services.namesrv.routes import RouteTable


def test_names_and_types():
    registry = CollectorRegistry()
    metrics = NamesrvMetrics(registry, RouteTable(FakeClock()))
    metrics.registrations.labels(changed="true").inc()
    text = generate_latest(registry).decode()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types["ferry_namesrv_live_brokers"] == "gauge"
    assert types["ferry_namesrv_topics"] == "gauge"
    assert types["ferry_namesrv_broker_last_update_timestamp_seconds"] == "gauge"
    assert types["ferry_namesrv_registrations"] == "counter"
    assert types["ferry_namesrv_unregisters"] == "counter"
    assert types["ferry_build_info"] == "gauge"
    assert "ferry_namesrv_registrations_total" in text
