"""`ferry exporter` against real brokers: one complete newline-delimited JSON
file per round with the documented row schema, HA rows that agree with
GetHAStatus, brokers that cannot be scraped reported as such, the spool cap."""

from __future__ import annotations

import json
import re

from ferry.client.namesrv import NamesrvClient
from ferry.pipeline.exporter import ROW_FIELDS, SCRAPE_UP, Exporter
from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.helpers import register_request
from tests.integration.support import HeldPort, run_ferry
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rounds_rows_and_a_broker_that_cannot_be_scraped(loop_thread, tmp_path, ns):
    common = dict(mappedFileSizeCommitLog=256 * 1024, metricsPort=0, brokerName="broker-x")
    master = start_broker(
        loop_thread, tmp_path / "m", ns.remoting_addr, brokerRole="SYNC_MASTER", **common
    )
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerRole="SLAVE", brokerId=1,
        haMasterAddress=f"127.0.0.1:{master.app.ha_master.port}", slaveSyncDelay=0, **common,
    )  # fmt: skip
    dead = HeldPort()
    try:
        create_topic(master, "X", queues=1)
        wait_for(lambda: ha_status(master).connections, 10, "the slave")
        sent = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="X", body=b"m"))
        assert sent.status == broker_pb2.SEND_OK
        # A broker whose /metrics does not answer (registered by hand).
        ns.stub.RegisterBroker(
            register_request(
                broker_name="broker-dead", addr="127.0.0.1:10999", metrics_addr=dead.addr
            )  # fmt: skip
        )
        spool = tmp_path / "spool"
        with NamesrvClient([ns.addr]) as nsc:
            exporter = Exporter(nsc, spool, scrape_timeout_s=2)
            path, count, failed = exporter.round()
        assert failed == 1
        assert [p.name for p in spool.iterdir()] == [path.name]  # no .tmp left behind
        rows = read_rows(path)
        assert len(rows) == count
        for row in rows:
            assert tuple(row) == ROW_FIELDS
            assert TS.match(row["ts"]) and isinstance(row["value"], float)
        up = {(r["broker_name"], r["broker_id"]): r for r in rows if r["metric"] == SCRAPE_UP}
        assert up[("broker-x", 0)]["value"] == 1.0 and up[("broker-x", 1)]["value"] == 1.0
        assert up[("broker-dead", 0)]["value"] == 0.0
        assert "refused" in up[("broker-dead", 0)]["labels"]["error"].lower()

        [conn] = ha_status(master).connections
        lag = [r for r in rows if r["metric"] == "ferry_ha_replication_lag_bytes"]
        assert len(lag) == 1 and lag[0]["role"] == "SYNC_MASTER" and lag[0]["replica"]
        assert lag[0]["value"] == conn.diff
        slave_end = [
            r for r in rows
            if r["metric"] == "ferry_ha_slave_max_offset_bytes" and r["broker_id"] == 1
        ]  # fmt: skip
        assert slave_end[0]["role"] == "SLAVE" and slave_end[0]["value"] == conn.ack_offset
        puts = [r for r in rows if r["metric"] == "ferry_broker_put_duration_seconds_bucket"]
        assert puts and all("le" in r["labels"] for r in puts)

        # Counters get an :increase row from the second round on.
        assert not [r for r in rows if r["metric"].endswith(":increase")]
        sent = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="X", body=b"n"))
        assert sent.status == broker_pb2.SEND_OK
        with NamesrvClient([ns.addr]) as nsc:
            path2, _, _ = exporter_round_again(exporter, nsc)
        increases = [
            r for r in read_rows(path2)
            if r["metric"] == "ferry_broker_put_messages_total:increase"
            and r["labels"].get("status") == "SEND_OK"
        ]  # fmt: skip
        assert [r["value"] for r in increases] == [1.0]

        # The cap removes the oldest files, never the newest.
        with NamesrvClient([ns.addr]) as nsc:
            capped = Exporter(nsc, spool, max_spool_bytes=1)
            newest = [capped.round()[0] for _ in range(3)][-1]
        assert [p.name for p in spool.iterdir()] == [newest.name]

        # The command line: one round, a summary line, exit 0.
        out = run_ferry(
            "exporter", "-n", ns.remoting_addr, "--spool", str(tmp_path / "cli"), "--once"
        )
        assert out.returncode == 0, out.stderr
        assert re.match(r"round 1: \d+ rows, 1 broker\(s\) not scraped -> metrics-", out.stdout)
    finally:
        dead.close()
        slave.stop()
        master.stop()


def exporter_round_again(exporter, nsc):
    exporter.namesrv = nsc
    return exporter.round()


def test_bad_arguments_are_usage_errors(tmp_path):
    bad = run_ferry("exporter", "--spool", str(tmp_path), "--interval", "soon")
    assert bad.returncode == 2 and "--interval" in bad.stderr
    bad = run_ferry("exporter", "--spool", str(tmp_path), "--max-spool-bytes", "lots")
    assert bad.returncode == 2 and "--max-spool-bytes" in bad.stderr
