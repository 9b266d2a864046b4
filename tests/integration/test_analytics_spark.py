"""The Spark job (a real local Spark): pure transforms on static DataFrames,
the streaming job on a prepared spool with availableNow (deterministic), a
restart from the checkpoint that adds windows without repeating any, and an
end-to-end run where a blackholed slave link yields exactly one incident."""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path

import pytest

# pyspark is one of ferry's dependencies: a missing one fails here, never skips.
from ferry.client.namesrv import NamesrvClient
from ferry.pipeline import analytics
from ferry.pipeline.analytics import LAG, PUT_INCREASE, SCHEMA, SYNC_INCREASE, JobConfig
from ferry.pipeline.exporter import Exporter, iso_utc
from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.faultproxy import FaultProxy
from tests.integration.support import run_ferry
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

T0 = datetime.datetime(2026, 11, 22, 10, 0, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def spark():
    session = analytics.spark_session(
        "local[2]", "ferry-tests", java_options=analytics.SHORT_LIVED_JVM
    )
    session.sparkContext.setLogLevel("ERROR")
    # One shuffle partition (the job's default is 4): these frames hold a few hundred rows,
    # and each partition of a stateful query is a state store to load and commit per batch.
    session.conf.set("spark.sql.shuffle.partitions", "1")
    yield session
    session.stop()


def ts(seconds: float) -> str:
    return iso_utc((T0 + datetime.timedelta(seconds=seconds)).timestamp())


def row(seconds, metric, value, replica="1", labels=None, broker="broker-a"):
    return {
        "ts": ts(seconds), "cluster": "c", "broker_name": broker, "broker_id": 0,
        "role": "SYNC_MASTER", "replica": replica, "metric": metric, "labels": labels or {},
        "value": float(value),
    }  # fmt: skip


def frame(spark, rows):
    tuples = [tuple(r[f.name] for f in SCHEMA.fields) for r in rows]
    return analytics.with_event_time(spark.createDataFrame(tuples, SCHEMA))


CONFIG = JobConfig(
    window="1 minute", watermark="0 seconds", lag_threshold=1000, min_duration_s=20, gap="8 seconds"
)


def test_transforms_on_static_frames(spark):
    rows = [row(s, LAG, 100 if s < 20 else 5000) for s in range(0, 60, 5)]
    rows += [row(s, LAG, 0, replica="2") for s in range(0, 60, 5)]
    rows += [
        row(s, PUT_INCREASE, 10, "", {"topic": "T", "status": "SEND_OK"}) for s in range(0, 60, 5)
    ]
    rows += [row(30, SYNC_INCREASE, 2, "", {"status": "FLUSH_SLAVE_TIMEOUT"})]
    rows += [row(30, SYNC_INCREASE, 7, "", {"status": "SEND_OK"})]
    df = frame(spark, rows)

    lag = {r["replica"]: r for r in analytics.lag_windows(df, CONFIG).collect()}
    assert lag["1"]["max_lag"] == 5000 and lag["1"]["samples"] == 12
    assert lag["1"]["avg_lag"] == pytest.approx((4 * 100 + 8 * 5000) / 12)
    assert lag["2"]["max_lag"] == 0

    [put] = analytics.throughput_windows(df, CONFIG).collect()
    assert put["put_messages"] == 120 and put["put_per_second"] == 2.0
    assert put["sync_timeouts"] == 2

    # Replica 1 above 1000 B from 0:20 to 0:55 (35 s >= 20 s): one incident.
    [incident] = analytics.incidents(df, CONFIG).collect()
    assert (incident["replica"], incident["duration_s"], incident["peak_lag"]) == ("1", 35.0, 5000)

    # One sample at the threshold splits it into two, each shorter than 20 s: none.
    split = [r if r["ts"] != ts(40) or r["replica"] != "1" else row(40, LAG, 1000) for r in rows]
    assert analytics.incidents(frame(spark, split), CONFIG).collect() == []


def write_spool(spool: Path, name: str, rows) -> None:
    spool.mkdir(parents=True, exist_ok=True)
    tmp = spool / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(spool / name)


def lag_windows_in(spark, out: Path) -> list[tuple[str, str]]:
    table = analytics.read_table(spark, out, "lag")
    if table is None:
        return []
    return sorted((r["window_start"].isoformat(), r["replica"]) for r in table.collect())


def test_streaming_job_and_restart_from_the_checkpoint(spark, tmp_path):
    spool, out = tmp_path / "spool", tmp_path / "out"
    config = JobConfig(window="1 minute", watermark="10 seconds", lag_threshold=10**12)
    for minute in range(2):  # 10:00 and 10:01
        write_spool(spool, f"metrics-{minute}.json",
                    [row(minute * 60 + s, LAG, 7) for s in range(0, 60, 5)])  # fmt: skip
    write_spool(spool, "metrics-2.json", [row(135, LAG, 7)])  # moves the watermark past 10:01
    analytics.run(spark, spool, out, config, once=True)
    first = lag_windows_in(spark, out)
    assert first == [("2026-11-22T10:00:00", "1"), ("2026-11-22T10:01:00", "1")]

    # More files arrive; the restarted job adds 10:02 and 10:03 and repeats nothing.
    write_spool(spool, "metrics-3.json", [row(120 + s, LAG, 9) for s in range(10, 120, 5)])
    write_spool(spool, "metrics-4.json", [row(260, LAG, 9)])
    analytics.run(spark, spool, out, config, once=True)
    second = lag_windows_in(spark, out)
    assert second == [
        ("2026-11-22T10:00:00", "1"),
        ("2026-11-22T10:01:00", "1"),
        ("2026-11-22T10:02:00", "1"),
        ("2026-11-22T10:03:00", "1"),
    ]
    # The report command prints the newest windows as a table.
    report = run_ferry("analytics", "report", "--out", str(out), "--limit", "2", timeout_s=120)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[:2] == ["== lag", lines[1]] and lines[1].split()[:3] == [
        "WINDOW_START", "BROKER_NAME", "REPLICA"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[2:4]] == [
        "2026-11-22T10:02:00Z", "2026-11-22T10:03:00Z"
    ]  # fmt: skip
    assert "== incidents" in lines and "(none)" in lines
    table = analytics.read_table(spark, out, "lag")
    # 10:02 holds the row that moved the watermark (0:02:15, kept in the state
    # across the restart) and the ten new ones from 0:02:10 to 0:02:55.
    assert table.where("window_start = '2026-11-22 10:02:00'").first()["samples"] == 11


def test_a_blackholed_slave_is_exactly_one_incident(spark, loop_thread, tmp_path, ns):
    common = dict(mappedFileSizeCommitLog=256 * 1024, metricsPort=0, brokerName="broker-i")
    master = start_broker(
        loop_thread,
        tmp_path / "m",
        ns.remoting_addr,
        brokerRole="SYNC_MASTER",
        slaveTimeout=300,
        **common,
    )
    proxy = FaultProxy("127.0.0.1", master.app.ha_master.port)
    loop_thread.run(proxy.start())
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerRole="SLAVE", brokerId=1,
        haMasterAddress=proxy.addr, haReconnectInterval=200, slaveSyncDelay=0, **common,
    )  # fmt: skip
    interval = 0.25
    # The gap is 4 intervals of sample time (a sample at or below the threshold
    # still ends the incident).
    config = JobConfig(
        window="10 seconds", watermark="0 seconds", lag_threshold=2000, min_duration_s=1.5,
        gap="1 second",
    )  # fmt: skip
    try:
        create_topic(master, "I", queues=1)
        wait_for(lambda: ha_status(master).connections, 10, "the slave")
        with NamesrvClient([ns.addr]) as nsc:
            # Sample time advances one interval per round, whatever a round takes on
            # the wall clock: a slow scrape on a loaded machine neither splits an
            # incident (the session gap) nor shortens it (min_duration_s).
            sampled = [time.time()]

            def rounds(spool: Path, seconds: float) -> None:
                exporter = Exporter(nsc, spool)
                exporter.seq = len(list(spool.glob("metrics-*"))) if spool.exists() else 0
                for _ in range(round(seconds / interval)):
                    exporter.round(now=sampled[0])
                    sampled[0] += interval

            healthy, sick = tmp_path / "healthy", tmp_path / "sick"
            rounds(healthy, 2.0)
            rounds(sick, 1.0)
            loop_thread.call(proxy.blackhole, "down")
            sender = threading.Thread(
                target=lambda: master.broker.SendMessage(
                    broker_pb2.SendMessageRequest(topic="I", body=b"x" * 5000)
                )
            )
            sender.start()
            wait_for(lambda: ha_status(master).connections[0].diff > 2000, 5, "lag")
            rounds(sick, 3.0)  # lag above the threshold for 3 s >= 1.5 s
            loop_thread.call(proxy.heal)
            sender.join(5)
            wait_for(lambda: ha_status(master).connections[0].diff == 0, 10, "the slave back")
            rounds(sick, 1.5)
            # Append mode emits a session once a later batch's watermark has
            # passed it: the job runs now, and again after more rounds, as it
            # would in production; the checkpoint keeps it from counting twice.
            analytics.run(spark, sick, tmp_path / "out-sick", config, once=True)
            rounds(sick, 1.5)
            rounds(healthy, 1.5)

        for _ in range(2):
            analytics.run(spark, healthy, tmp_path / "out-healthy", config, once=True)
        quiet = analytics.read_table(spark, tmp_path / "out-healthy", "incidents")
        assert quiet is None or quiet.count() == 0
        analytics.run(spark, sick, tmp_path / "out-sick", config, once=True)
        found = analytics.read_table(spark, tmp_path / "out-sick", "incidents").collect()
        assert len(found) == 1, found
        [incident] = found
        assert incident["broker_name"] == "broker-i" and incident["replica"]
        assert 1.5 <= incident["duration_s"] <= 6.0
        assert incident["peak_lag"] > 5000
    finally:
        loop_thread.call(proxy.heal)
        slave.stop()
        loop_thread.run(proxy.stop())
        master.stop()
