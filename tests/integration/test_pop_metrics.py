"""The broker's pop and timer metrics on a real in-process master, scraped over
HTTP from its /metrics endpoint (collected on the event loop): in-flight
messages per group after pops and acks, a redelivery and a dead letter, a timed
message's delivery and lateness; and a slave, which runs neither, without
those series."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from ferry.model import PROPERTY_TIMER_DELIVER_MS
from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2
from tests.conftest import start_broker
from tests.integration.support import create_topic, scrape
from tests.waiting import wait_for

# Quick retry backoff: the delay levels.
LEVELS = "100ms 200ms 300ms"
POP_TYPES = {
    "ferry_pop_inflight_messages": "gauge",
    "ferry_pop_retries_pending_messages": "gauge",
    "ferry_pop_dlq_messages": "gauge",
    "ferry_pop_redeliveries": "counter",
    "ferry_pop_dead_letters": "counter",
    "ferry_timer_pending_messages": "gauge",
    "ferry_timer_delivered": "counter",
    "ferry_timer_delivery_lateness_seconds": "histogram",
}


def metrics(broker) -> dict:
    text = scrape(f"http://127.0.0.1:{broker.app.metrics_port}/metrics")
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families, name, sample_name=None, **labels) -> float | None:
    """The one sample of `name` with `labels`, or None if there is none."""
    found = [
        s.value
        for s in families[name].samples
        if s.name == (sample_name or name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def pop(b, group, topic, n, invisible_ms=60_000):
    r = b.broker.PopMessage(
        broker_pb2.PopMessageRequest(
            consumer_group=group, topic=topic, max_msg_nums=n, invisible_ms=invisible_ms,
            max_wait_ms=200,
        ),
        timeout=10,
    )  # fmt: skip
    return list(r.messages)


def pop_exactly(b, group, topic, n, invisible_ms=60_000) -> list:
    got: list = []
    wait_for(
        lambda: got.extend(pop(b, group, topic, n - len(got), invisible_ms)) or len(got) >= n,
        10,
        f"{n} messages popped by {group}",
    )
    assert len(got) == n
    return got


def ack(b, group, topic, messages) -> None:
    r = b.broker.AckMessage(
        broker_pb2.AckMessageRequest(
            consumer_group=group, topic=topic, receipt_handles=[m.receipt_handle for m in messages]
        ),
        timeout=10,
    )
    assert [x.status for x in r.results] == [broker_pb2.OK] * len(messages)


def send(b, topic, body, **properties) -> None:
    r = b.broker.SendMessage(
        broker_pb2.SendMessageRequest(topic=topic, body=body, properties=properties), timeout=10
    )
    assert r.status == broker_pb2.SEND_OK


def test_pop_and_timer_metrics_on_a_master_and_none_on_its_slave(loop_thread, tmp_path):
    master = start_broker(
        loop_thread, tmp_path / "m", brokerName="broker-pm", metricsPort=0,
        messageDelayLevel=LEVELS,
    )  # fmt: skip
    slave = None
    try:
        create_topic(master.channel, "Orders", 2)
        create_topic(master.channel, "Later", 1)
        master.admin.UpdateAndCreateSubscriptionGroup(
            broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
                config=common_pb2.SubscriptionGroupConfig(group_name="fragile", retry_max_times=1)
            ),
            timeout=10,
        )
        for i in range(6):
            send(master, "Orders", b"o%d" % i)

        # Group "billing" pops 5, acknowledges 2: 3 in flight.
        popped = pop_exactly(master, "billing", "Orders", 5)
        ack(master, "billing", "Orders", popped[:2])
        families = metrics(master)
        for name, kind in POP_TYPES.items():
            assert families[name].type == kind, (name, families[name].type)
        ids = {"cluster": "DefaultCluster", "broker_name": "broker-pm", "broker_id": "0"}
        assert value(families, "ferry_pop_inflight_messages", group="billing", **ids) == 3
        assert value(families, "ferry_pop_retries_pending_messages", group="billing") == 0
        assert value(families, "ferry_pop_dlq_messages", group="billing") == 0
        assert value(families, "ferry_pop_redeliveries", "ferry_pop_redeliveries_total") == 0
        assert value(families, "ferry_pop_dead_letters", "ferry_pop_dead_letters_total") == 0

        # A timed message due in 500 ms, and one due in an hour.
        now_ms = int(time.time() * 1000)
        send(master, "Later", b"soon", **{PROPERTY_TIMER_DELIVER_MS: str(now_ms + 500)})
        send(master, "Later", b"later", **{PROPERTY_TIMER_DELIVER_MS: str(now_ms + 3_600_000)})
        families = wait_for(
            lambda: (
                (f := metrics(master))
                and value(f, "ferry_timer_delivered", "ferry_timer_delivered_total") >= 1
                and f
            ),
            10,
            "the timed message's delivery in ferry_timer_delivered_total",
        )
        assert value(families, "ferry_timer_delivered", "ferry_timer_delivered_total") == 1
        assert value(families, "ferry_timer_pending_messages") == 1  # the one due in an hour
        lateness = "ferry_timer_delivery_lateness_seconds"
        assert value(families, lateness, f"{lateness}_count", **ids) == 1
        assert 0 <= value(families, lateness, f"{lateness}_sum") < 10
        assert value(families, lateness, f"{lateness}_bucket", le="+Inf") == 1
        [delivered] = pop_exactly(master, "reader", "Later", 1)
        assert delivered.body == b"soon"

        # Group "fragile" (retry_max_times=1) never acknowledges its message:
        # it is redelivered once through its retry topic, then dead-lettered.
        [first] = pop_exactly(master, "fragile", "Orders", 1, invisible_ms=1000)
        families = wait_for(
            lambda: (
                (f := metrics(master))
                and value(f, "ferry_timer_delivered", "ferry_timer_delivered_total") >= 2
                # and dispatched to the retry topic's queue (a step behind, under load)
                and value(f, "ferry_pop_retries_pending_messages", group="fragile") == 1
                and f
            ),
            10,
            "the unacknowledged message's retry copy, through the timer, in its queue",
        )
        assert value(families, "ferry_pop_redeliveries", "ferry_pop_redeliveries_total") == 1
        assert value(families, "ferry_pop_inflight_messages", group="fragile") == 0
        assert value(families, "ferry_pop_retries_pending_messages", group="fragile") == 1
        [again] = pop_exactly(master, "fragile", "Orders", 1, invisible_ms=1000)
        assert again.body == first.body and again.delivery_attempt == 2
        families = wait_for(
            lambda: (
                (f := metrics(master))
                and value(f, "ferry_pop_dlq_messages", group="fragile") == 1
                and f
            ),
            10,
            "the message in %DLQ%fragile",
        )
        assert value(families, "ferry_pop_dead_letters", "ferry_pop_dead_letters_total") == 1
        assert value(families, "ferry_pop_redeliveries", "ferry_pop_redeliveries_total") == 1
        assert value(families, "ferry_pop_inflight_messages", group="fragile") == 0
        assert value(families, "ferry_pop_retries_pending_messages", group="fragile") == 0
        assert value(families, "ferry_pop_inflight_messages", group="billing") == 3
        # The retry copy went through the timer too.
        assert value(families, "ferry_timer_delivered", "ferry_timer_delivered_total") == 2

        # A slave runs no pop consumption and no timer: no such series.
        slave = start_broker(
            loop_thread, tmp_path / "s", brokerName="broker-pm", brokerRole="SLAVE", brokerId=1,
            haMasterAddress=f"127.0.0.1:{master.app.ha_master.port}", haReconnectInterval=200,
            metricsPort=0,
        )  # fmt: skip
        families = metrics(slave)
        assert value(families, "ferry_commitlog_max_offset_bytes") is not None
        for name in POP_TYPES:
            samples = families[name].samples if name in families else []
            assert samples == [], (name, samples)
    finally:
        if slave is not None:
            slave.stop()
        master.stop()
