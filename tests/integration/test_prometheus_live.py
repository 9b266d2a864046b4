"""A real Prometheus scrapes a real name server, SYNC_MASTER and slave:
replication lag read through Prometheus's HTTP API matches GetHAStatus (with
the slave's link blackholed, so the lag is not zero), and every panel of the
Grafana dashboard evaluates without error, the core ones returning series (a
consumer group pops and acknowledges, and a timed message is delivered, so the
pop and timer panels have theirs)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ferry.model import PROPERTY_TIMER_DELIVER_MS
from ferry.v1 import broker_pb2
from tests.conftest import start_broker, start_namesrv
from tests.faultproxy import FaultProxy
from tests.integration.support import free_port
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "k8s" / "monitoring" / "grafana" / "ferry-dashboard.json"
# Panels that must show series on a running cluster with some traffic.
CORE_PANELS = {
    "Replication lag per replica",
    "Ack age per replica",
    "Connected slaves per master",
    "Sync send results",
    "Put rate per broker group",
    "Live brokers per name server",
    "Dispatch behind",
    "Commit log end per broker",
    "Pop in-flight messages by group",
    "Pop retries pending by group",
    "DLQ messages by group",
    "Pop redelivery rate",
    "Timer backlog",
    "Timer lateness p99",
}


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, list[str]]) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.fail(
                "prometheus is not installed: apt-get install -y --no-install-recommends "
                "prometheus (make test and .ci/run do this when they can)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        rules = REPO / "deploy" / "k8s" / "monitoring" / "prometheus" / "rules"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules / "recording.yml"), str(rules / "alerts.yml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": addrs}]}
                for job, addrs in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.port = free_port()
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                exe,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.tsdb.path={workdir / 'data'}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def _ready(prom: Prometheus, expr: str):
    try:
        return prom.query(expr)
    except OSError:
        return None


def test_prometheus_sees_the_lag_ha_status_reports_and_the_dashboard_works(loop_thread, tmp_path):
    ns = start_namesrv(loop_thread, tmp_path / "ns")
    master = start_broker(
        loop_thread, tmp_path / "m", ns.remoting_addr, brokerName="broker-p",
        brokerRole="SYNC_MASTER", mappedFileSizeCommitLog=256 * 1024, slaveTimeout=3000,
        metricsPort=0,
    )  # fmt: skip
    proxy = FaultProxy("127.0.0.1", master.app.ha_master.port)
    loop_thread.run(proxy.start())
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerName="broker-p", brokerRole="SLAVE",
        brokerId=1, mappedFileSizeCommitLog=256 * 1024, haMasterAddress=proxy.addr,
        haReconnectInterval=200, slaveSyncDelay=0, metricsPort=0,
    )  # fmt: skip
    prom = Prometheus(
        tmp_path / "prom",
        {
            "ferry-namesrv": [f"127.0.0.1:{ns.app.metrics_port}"],
            "ferry-broker": [
                f"127.0.0.1:{master.app.metrics_port}",
                f"127.0.0.1:{slave.app.metrics_port}",
            ],
        },
    )
    try:
        create_topic(master, "P", queues=1)
        wait_for(lambda: ha_status(master).connections, 10, "the slave to connect")
        for i in range(20):
            r = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="P", body=b"m%d" % i))
            assert r.status == broker_pb2.SEND_OK
        # A consumer group with messages in flight, and a timed message
        # delivered (while the slave is connected: a SYNC_MASTER's timer
        # delivers only what its slave has).
        popped = master.broker.PopMessage(
            broker_pb2.PopMessageRequest(
                consumer_group="dash", topic="P", max_msg_nums=5, invisible_ms=60_000
            )
        )
        assert len(popped.messages) == 5
        acked = master.broker.AckMessage(
            broker_pb2.AckMessageRequest(
                consumer_group="dash", topic="P",
                receipt_handles=[m.receipt_handle for m in popped.messages[:2]],
            )
        )  # fmt: skip
        assert [a.status for a in acked.results] == [broker_pb2.OK] * 2
        due_ms = int(time.time() * 1000) + 500
        r = master.broker.SendMessage(
            broker_pb2.SendMessageRequest(
                topic="P", body=b"timed", properties={PROPERTY_TIMER_DELIVER_MS: str(due_ms)}
            )
        )
        assert r.status == broker_pb2.SEND_OK
        wait_for(lambda: master.app.timer.delivered, 10, "the timed message's delivery")
        loop_thread.call(proxy.blackhole, "down")
        r = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="P", body=b"x" * 5000))
        assert r.status == broker_pb2.FLUSH_SLAVE_TIMEOUT
        [conn] = ha_status(master).connections
        assert conn.diff > 5000

        # The lag through Prometheus equals GetHAStatus's diff (it is frozen
        # while the link is blackholed).
        lag = wait_for(
            lambda: (got := _ready(prom, "ferry_ha_replication_lag_bytes")) and got,
            30,
            "Prometheus to scrape the master's lag",
        )
        assert len(lag) == 1
        assert lag[0]["metric"]["broker_name"] == "broker-p"
        assert float(lag[0]["value"][1]) == ha_status(master).connections[0].diff
        # The recording rule carries it too, per group and replica.
        recorded = wait_for(
            lambda: _ready(prom, "ferry:ha_replication_lag_bytes:max"), 30, "the recording rule"
        )
        assert float(recorded[0]["value"][1]) == conn.diff

        # Every dashboard panel's query evaluates; the core ones have series
        # (rates need two scrapes, so allow a few seconds).
        dashboard = json.loads(DASHBOARD.read_text())
        panels = {
            p["title"]: p["targets"][0]["expr"] for p in dashboard["panels"] if p["type"] != "row"
        }
        assert set(panels) >= CORE_PANELS
        missing = set(CORE_PANELS)

        def every_core_panel_has_series() -> bool:
            for title, expr in panels.items():
                if prom.query(expr):  # raises on a PromQL error
                    missing.discard(title)
            return not missing

        wait_for(every_core_panel_has_series, 30,
                 lambda: f"series for every core panel (none yet: {sorted(missing)})",
                 interval_s=1)  # fmt: skip
    finally:
        prom.stop()
        loop_thread.call(proxy.heal)
        slave.stop()
        loop_thread.run(proxy.stop())
        master.stop()
        ns.stop()
