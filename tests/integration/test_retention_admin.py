"""Retention as users see it, against real brokers with small commit-log files:
`BrokerAdmin.DeleteExpiredCommitLog` behind the admin token, `ferry store
clean` deleting the expired files whatever deleteWhen says, the new min offsets
in GetMinOffset, GetBrokerRuntimeInfo and `ferry runtime`, OFFSET_MOVED for a
pull below them, ferry's Consumer and `ferry consume` resuming at the new min
(logging how many messages they skipped), /metrics, and a slave cleaning its
own files while it keeps replicating.

Files are made expired by setting their mtime an hour into the past (never
the newest, which retention never deletes), so which files go does not depend
on how long the test takes."""

from __future__ import annotations

import logging
import os
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ferry.client.broker import BrokerClient, Consumer
from ferry.client.namesrv import NamesrvClient
from ferry.runtime import auth
from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2
from services.broker.store.retention import disk_used_ratio
from tests.conftest import start_broker
from tests.integration.support import has_route, run_ferry
from tests.waiting import wait_for

TOKEN = "retention-admin-token"
TOPIC = "Retained"
FILE = 64 * 1024
CQ_ENTRIES = 64  # entries per consume-queue file
TOTAL = 240  # ~58 records of 1000-byte bodies fill a 64 KiB file: 5 files
DELETE_HOUR = (time.localtime().tm_hour + 12) % 24  # deleteWhen: not now, not within the test


def body(i: int) -> bytes:
    return f"m{i:05d}-".encode().ljust(1000, b"x")


def retention_keys(**keys) -> dict:
    return {
        "mappedFileSizeCommitLog": FILE,
        "mappedFileSizeConsumeQueue": 20 * CQ_ENTRIES,
        "maxMessageSize": 4096,
        "fileReservedTime": "0.001",  # 3.6 s
        "deleteWhen": f"{DELETE_HOUR:02d}",
        # Only expiry deletes here, however full the test machine's disk is.
        "diskMaxUsedSpaceRatio": 99,
        "diskSpaceCleanForciblyRatio": 99,
        "diskSpaceWarningLevelRatio": 99,
        **keys,
    }


def store_call(broker, fn):
    return broker.loop.call(fn, broker.app.store)


def wait_settled(broker, what: str) -> None:
    """Until everything written is flushed and in the consume queues (retention
    never deletes past that)."""

    def settled(store) -> bool:
        return store.flushed_offset == store.max_offset and store.dispatcher.behind_bytes == 0

    wait_for(lambda: store_call(broker, settled), 15, f"{what} to flush and dispatch")


def wait_replicated(master, slave, what: str) -> None:
    """Until the slave's commit log ends where the master's does now."""
    end = store_call(master, lambda store: store.max_offset)
    wait_for(lambda: store_call(slave, lambda store: store.max_offset) == end, 15, what)


def fill(client: BrokerClient) -> None:
    for first in range(0, TOTAL, 20):
        entries = [broker_pb2.SendEntry(body=body(i)) for i in range(first, first + 20)]
        assert client.send_batch(TOPIC, entries, queue_id=0).status == broker_pb2.SEND_OK


def commit_offsets(client: BrokerClient) -> list[int]:
    """Every message's commit offset, in queue order (pulled before retention)."""
    found: list[int] = []
    while len(found) < TOTAL:
        answer = client.pull("reader", TOPIC, 0, len(found), 32)
        assert answer.status == broker_pb2.FOUND, answer.status
        found += [m.commit_offset for m in answer.messages]
    return found


def segment_files(store_root: Path) -> list[Path]:
    return sorted((store_root / "commitlog").iterdir())


def expire_all_but_newest(store_root: Path) -> list[Path]:
    files = segment_files(store_root)
    past = time.time() - 3600
    for path in files[:-1]:
        os.utime(path, (past, past))
    return files


def scrape_families(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_value(families: dict, family: str, name: str, **labels: str) -> float:
    found = [
        s.value
        for s in families[family].samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, labels, families[family].samples)
    return found[0]


def runtime_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            rows.setdefault(parts[0], parts[1])
    return rows


def ok(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_store_clean_deletes_expired_files_and_consumers_resume(loop_thread, tmp_path, ns, caplog):
    root = tmp_path / "broker"
    broker = start_broker(
        loop_thread, root, ns.remoting_addr, adminToken=TOKEN, metricsPort=0, **retention_keys()
    )
    try:
        client = BrokerClient(broker.addr, admin_token=TOKEN)
        client.update_topic(
            common_pb2.TopicConfig(topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6)
        )
        fill(client)
        wait_settled(broker, "the broker")
        offsets = commit_offsets(client)
        for group in ("behind", "behind-cli"):
            client.commit_offset(group, TOPIC, 0, 0)

        files = expire_all_but_newest(root)
        assert len(files) >= 4, files
        new_commit_min = int(files[-1].name)
        new_queue_min = next(i for i, offset in enumerate(offsets) if offset >= new_commit_min)
        assert 0 < new_queue_min < TOTAL

        # Without the admin token: refused, nothing deleted.
        for metadata in ((), auth.bearer("wrong")):
            with pytest.raises(grpc.RpcError) as err:
                broker.admin.DeleteExpiredCommitLog(
                    broker_admin_pb2.DeleteExpiredCommitLogRequest(), metadata=metadata, timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        refused = run_ferry("store", "clean", "-b", broker.addr)
        assert refused.returncode == 1 and "admin token" in refused.stderr
        assert segment_files(root) == files
        assert client.min_offset(TOPIC, 0) == 0

        # deleteWhen is 12 hours away: `ferry store clean` deletes them anyway.
        out = ok(run_ferry("store", "clean", "-b", broker.addr, "--admin-token", TOKEN))
        print(out)
        deleted_cq = new_queue_min // CQ_ENTRIES
        assert (
            f"deleted {len(files) - 1} commit-log files and {deleted_cq} consume-queue files" in out
        )
        assert f"commit log min offset: {new_commit_min}" in out
        assert segment_files(root) == files[-1:]

        # The new min everywhere.
        assert client.min_offset(TOPIC, 0) == new_queue_min
        assert client.max_offset(TOPIC, 0) == TOTAL
        info = client.runtime_info()
        assert info.commit_log_min_offset == new_commit_min
        assert info.table["deletedCommitLogFiles"] == str(len(files) - 1)
        assert info.table["deletedConsumeQueueFiles"] == str(deleted_cq)
        moved = client.pull("any", TOPIC, 0, 0, 32)
        assert moved.status == broker_pb2.OFFSET_MOVED
        assert moved.next_begin_offset == moved.min_offset == new_queue_min

        # A second pass finds nothing more to delete (the newest file stays).
        again = ok(run_ferry("store", "clean", "-b", broker.addr, "--admin-token", TOKEN, "--json"))
        assert '"deletedFiles": 0' in again and f'"minOffset": "{new_commit_min}"' in again

        # ferry's Consumer, committed at 0: resumes at the new min, says how many it skipped.
        caplog.set_level(logging.WARNING, logger="ferry.client.broker")
        got: list[bytes] = []
        with NamesrvClient([ns.addr]) as nsc, Consumer(nsc, "behind", TOPIC) as consumer:
            wait_for(lambda: has_route(ns.stub, TOPIC), 10, f"a route for {TOPIC}")

            def consumed_all() -> bool:
                got.extend(item.message.body for item in consumer.poll(wait_ms=100))
                return len(got) >= TOTAL - new_queue_min

            wait_for(consumed_all, 15, "the consumer to get the remaining messages")
            assert consumer.poll(wait_ms=100) == []
            consumer.commit()
        assert got == [body(i) for i in range(new_queue_min, TOTAL)]
        skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
        assert len(skipped) == 1, skipped
        assert f"skipping {new_queue_min} messages" in skipped[0]
        assert "retention deleted them" in skipped[0]
        assert client.query_offset("behind", TOPIC, 0) == TOTAL

        # `ferry consume` the same way.
        consumed = run_ferry(
            "consume", TOPIC, "-g", "behind-cli", "--pull", "--max", str(TOTAL - new_queue_min),
            "--json", "-n", ns.remoting_addr,
        )  # fmt: skip
        assert len(ok(consumed).splitlines()) == TOTAL - new_queue_min
        assert f"skipping {new_queue_min} messages" in consumed.stderr
        assert client.query_offset("behind-cli", TOPIC, 0) == TOTAL

        # /metrics.
        families = scrape_families(broker.app.metrics_port)
        deleted = "ferry_store_deleted_files_total"
        assert sample_value(families, "ferry_store_deleted_files", deleted, kind="commitlog") == (
            len(files) - 1
        )
        assert (
            sample_value(families, "ferry_store_deleted_files", deleted, kind="consumequeue")
            == deleted_cq
        )
        ratio = sample_value(families, "ferry_store_disk_used_ratio", "ferry_store_disk_used_ratio")
        assert 0 < ratio < 1
        assert abs(ratio - disk_used_ratio(root)) < 0.05
        assert sample_value(families, "ferry_store_disk_full", "ferry_store_disk_full") == 0

        # `ferry runtime`: disk use and the retention settings.
        shown = ok(run_ferry("runtime", "-b", broker.addr))
        print(shown)
        assert "DISK AND RETENTION" in shown
        rows = runtime_rows(shown)
        assert rows["commit_log_min_offset"] == str(new_commit_min)
        assert rows["fileReservedTime"] == "0.001h"
        assert rows["deleteWhen"] == f"{DELETE_HOUR:02d}"
        assert rows["diskMaxUsedSpaceRatio"] == "99%"
        assert rows["diskSpaceCleanForciblyRatio"] == "99%"
        assert rows["diskSpaceWarningLevelRatio"] == "99%"
        assert rows["cleanFileForciblyEnable"] == "true"
        assert rows["deletedCommitLogFiles"] == str(len(files) - 1)
        assert rows["sendsRefusedDiskFull"] == "false"
        assert 0 < float(rows["diskUsedRatio"].rstrip("%")) < 100
        client.close()
    finally:
        broker.stop()


def test_a_slave_cleans_its_own_files_and_keeps_replicating(loop_thread, tmp_path, ns):
    common = retention_keys(haListenPort=0, haReconnectInterval=200, slaveSyncInterval=300)
    master = start_broker(
        loop_thread, tmp_path / "master", ns.remoting_addr, brokerName="b-r", **common
    )
    slave = start_broker(
        loop_thread, tmp_path / "slave", ns.remoting_addr, brokerName="b-r", brokerRole="SLAVE",
        brokerId=1, **common,
    )  # fmt: skip
    try:
        m, s = BrokerClient(master.addr), BrokerClient(slave.addr)
        m.update_topic(
            common_pb2.TopicConfig(topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6)
        )
        fill(m)
        wait_replicated(master, slave, "the slave to replicate the commit log")
        wait_settled(slave, "the slave")
        files = expire_all_but_newest(tmp_path / "slave")
        master_files = expire_all_but_newest(tmp_path / "master")

        result = s.delete_expired_commit_log()  # no token configured; a slave may clean
        assert result.deleted_files == len(files) - 1 > 0
        assert result.min_offset == int(files[-1].name)
        assert 0 < result.disk_used_ratio < 1
        assert segment_files(tmp_path / "slave") == files[-1:]
        assert segment_files(tmp_path / "master") == master_files  # its own files only
        queue_min = lambda store: store.queue_min_offset(TOPIC, 0)  # noqa: E731
        assert store_call(slave, queue_min) > 0 == store_call(master, queue_min)

        # Replication goes on into the slave's newest file and beyond.
        fill(m)
        wait_replicated(master, slave, "the slave to replicate after cleaning")
        assert store_call(slave, lambda store: store.queue_max_offset(TOPIC, 0)) == 2 * TOTAL
        m.close()
        s.close()
    finally:
        slave.stop()
        master.stop()


def test_expired_files_holding_pending_timers_or_pop_checkpoints_are_kept(
    loop_thread, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="services.broker.store.retention")
    broker = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-h", **retention_keys()
    )
    try:
        client = BrokerClient(broker.addr)
        create_topic = broker.admin.UpdateAndCreateTopic
        create_topic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1, perm=6
                )
            )
        )
        client.send(TOPIC, body(0), queue_id=0)
        popped = client.pop("held", TOPIC, 1, 600_000, 0)
        assert len(popped.messages) == 1  # in flight for 10 minutes: its checkpoint is held
        fill(client)
        wait_settled(broker, "the files")

        def clean():
            return broker.admin.DeleteExpiredCommitLog(
                broker_admin_pb2.DeleteExpiredCommitLogRequest(), timeout=10
            )

        def kept(what: str) -> bool:
            return clean().deleted_files == 0 and any(
                "keeps expired commit-log file" in r.getMessage() and what in r.getMessage()
                for r in caplog.records
            )

        wait_for(lambda: kept("unresolved pop checkpoints"), 30, "the first file kept")
        assert store_call(broker, lambda store: store.min_offset) == 0
        # Acknowledged, the checkpoint no longer needs the file: it goes.
        client.ack("held", TOPIC, [popped.messages[0].receipt_handle])
        assert clean().deleted_files > 0

        # A timed message ten minutes ahead holds its file the same way.
        deliver = int(time.time() * 1000) + 600_000
        timed = client.send(TOPIC, body(1), properties={"TIMER_DELIVER_MS": str(deliver)})
        fill(client)
        wait_settled(broker, "the files")
        caplog.clear()
        wait_for(lambda: kept("timed messages not yet delivered"), 30, "the timer's file kept")
        assert store_call(broker, lambda store: store.min_offset) <= timed.commit_offset
        client.close()
    finally:
        broker.stop()
