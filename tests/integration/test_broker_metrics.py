"""The broker's /metrics (docs/reference/metrics.md): names and types on a fresh
registry, and replication lag that agrees with GetHAStatus while a slave's link
is blackholed."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ferry.v1 import broker_pb2
from tests.integration.test_ha_faults import proxied, send  # noqa: F401 - fixture
from tests.integration.test_replication import ha_status

EXPECTED_TYPES = {
    # store
    "ferry_commitlog_max_offset_bytes": "gauge",
    "ferry_commitlog_min_offset_bytes": "gauge",
    "ferry_commitlog_flushed_offset_bytes": "gauge",
    "ferry_dispatch_behind_bytes": "gauge",
    "ferry_broker_topics": "gauge",
    "ferry_broker_permission": "gauge",
    "ferry_broker_get_messages": "counter",
    "ferry_consumer_lag_messages": "gauge",
    "ferry_build_info": "gauge",
    # retention
    "ferry_store_disk_used_ratio": "gauge",
    "ferry_store_disk_full": "gauge",
    "ferry_store_deleted_files": "counter",
    # sends
    "ferry_broker_put_messages": "counter",
    "ferry_broker_put_duration_seconds": "histogram",
    # HA master
    "ferry_ha_slave_ack_offset_bytes": "gauge",
    "ferry_ha_replication_lag_bytes": "gauge",
    "ferry_ha_last_ack_timestamp_seconds": "gauge",
    "ferry_ha_sent_bytes": "counter",
    "ferry_ha_connected_slaves": "gauge",
    "ferry_ha_sync_wait_seconds": "histogram",
    "ferry_ha_sync_results": "counter",
}
SLAVE_TYPES = {
    "ferry_ha_slave_max_offset_bytes": "gauge",
    "ferry_ha_master_offset_bytes": "gauge",
    "ferry_ha_last_read_timestamp_seconds": "gauge",
    "ferry_ha_slave_connected": "gauge",
}


def scrape(broker) -> dict:
    text = generate_latest(broker.app.registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families, name, sample_name=None, **labels) -> float:
    found = [
        s.value
        for s in families[name].samples
        if s.name == (sample_name or name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, families[name].samples)
    return found[0]


def test_names_types_and_lag_agree_with_ha_status(loop_thread, proxied):  # noqa: F811
    master, slave, proxy = proxied
    assert send(master, b"before")[0].status == broker_pb2.SEND_OK
    master.broker.UpdateConsumerOffset(
        broker_pb2.UpdateConsumerOffsetRequest(
            consumer_group="billing", topic="F", queue_id=0, offset=0
        )
    )

    loop_thread.call(proxy.blackhole, "down")
    r, _ = send(master, b"x" * 1000)
    assert r.status == broker_pb2.FLUSH_SLAVE_TIMEOUT

    families = scrape(master)
    status = ha_status(master)
    for name, kind in EXPECTED_TYPES.items():
        assert families[name].type == kind, (name, families[name].type)
    [conn] = status.connections
    lag = value(families, "ferry_ha_replication_lag_bytes")
    assert lag == conn.diff > 1000  # the unacknowledged message and more
    assert value(families, "ferry_ha_slave_ack_offset_bytes") == conn.ack_offset
    assert value(families, "ferry_ha_connected_slaves") == 1
    assert value(families, "ferry_commitlog_max_offset_bytes") == status.master_max_offset
    assert (
        value(families, "ferry_ha_sync_results", "ferry_ha_sync_results_total",
              status="FLUSH_SLAVE_TIMEOUT") == 1
    )  # fmt: skip
    assert (
        value(families, "ferry_broker_put_messages", "ferry_broker_put_messages_total",
              topic="F", status="SEND_OK") == 1
    )  # fmt: skip
    assert value(families, "ferry_ha_sync_wait_seconds", "ferry_ha_sync_wait_seconds_count") == 2
    assert value(families, "ferry_consumer_lag_messages", group="billing", topic="F") == 2
    assert value(families, "ferry_ha_sent_bytes", "ferry_ha_sent_bytes_total") > 0
    assert 0 < value(families, "ferry_store_disk_used_ratio") < 1
    assert value(families, "ferry_store_disk_full") == 0
    assert (
        value(families, "ferry_store_deleted_files", "ferry_store_deleted_files_total",
              kind="commitlog") == 0
    )  # fmt: skip

    slave_families = scrape(slave)
    for name, kind in SLAVE_TYPES.items():
        assert slave_families[name].type == kind, name
    assert value(slave_families, "ferry_ha_slave_max_offset_bytes") == conn.ack_offset
    assert value(slave_families, "ferry_ha_slave_connected") == 1
    assert value(slave_families, "ferry_commitlog_max_offset_bytes") == conn.ack_offset

    loop_thread.call(proxy.heal)
