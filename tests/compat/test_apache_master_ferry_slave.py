"""Apache RocketMQ 4.9 SYNC_MASTER → ferry SLAVE, over RocketMQ 4.x's plain HA protocol.

Apache's own Java producer (tests/compat/rocketmq4/src/.../Produce4.java) sends a mix of
messages (sizes up to 300 KiB, compressed bodies, tags, keys, properties, delay levels) to
an Apache SYNC_MASTER whose only slave is a ferry broker. The test shows that:

- a send is SEND_OK only while the ferry slave reports offsets: before it connects and
  after it stops, Apache answers SLAVE_NOT_AVAILABLE;
- the ferry slave's commit log is byte-identical to Apache's, file by file;
- the ferry slave, restarted on those bytes (its own recovery, its own consume queues),
  serves every message through ferry.v1 exactly as Apache's consumer saw it: body, tags,
  keys, properties, born and store timestamps, queue ids and offsets, message ids.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from tests.apache import ApacheBroker, ApacheNamesrv, run_java
from tests.compat.specs import json_lines, message_specs, pull_all, user_view, write_specs
from tests.conftest import start_broker
from tests.waiting import wait_for

FILE = 4 * 1024 * 1024
TOPIC = "CompatFromApache"
COUNT = 60


def _ferry_slave(loop_thread, path: Path, master: ApacheBroker):
    return start_broker(
        loop_thread,
        path,
        "",
        brokerName=master.broker_name,
        brokerRole="SLAVE",
        brokerId=1,
        mappedFileSizeCommitLog=FILE,
        maxMessageSize=1024 * 1024,
        haMasterAddress=master.ha_address,
        haReconnectInterval=200,
        slaveReadEnable="true",
    )


def _produce(namesrv: ApacheNamesrv, tmp_path: Path, specs: list[dict], name: str) -> list[dict]:
    spec_file = write_specs(tmp_path / f"{name}.jsonl", specs)
    result = run_java(
        "rocketmq4",
        "ferry.compat.Produce4",
        [namesrv.address, "ferry-compat-producer", str(spec_file)],
        directory=tmp_path / name,
        check=False,
    )
    sends = json_lines(result.stdout)
    assert len(sends) == len(specs), result.stdout[-2000:] + result.stderr[-2000:]
    return sends


def _commit_log_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def cluster(tmp_path):
    namesrv = ApacheNamesrv(tmp_path / "apache-namesrv").start()
    master = ApacheBroker(
        tmp_path / "apache-master",
        role="SYNC_MASTER",
        namesrv=namesrv.address,
        settings={"mappedFileSizeCommitLog": FILE},
    )
    try:
        master.start()
        yield namesrv, master
    finally:
        master.stop()
        namesrv.stop()


def test_apache_sync_master_acknowledges_through_a_ferry_slave_that_serves_its_bytes(
    cluster, loop_thread, tmp_path
):
    namesrv, master = cluster
    specs = message_specs(TOPIC, COUNT)

    # No slave yet: Apache stores the message but cannot say SEND_OK.
    alone = _produce(namesrv, tmp_path, specs[:1], "alone")
    assert alone[0]["status"] == "SLAVE_NOT_AVAILABLE", alone

    slave = _ferry_slave(loop_thread, tmp_path / "ferry-slave", master)
    try:
        wait_for(
            lambda: slave.app.store.max_offset > 0, 30, "the ferry slave to copy the first message"
        )
        sends = _produce(namesrv, tmp_path, specs[1:], "synced")
        assert [s["status"] for s in sends] == ["SEND_OK"] * (COUNT - 1), sends
    finally:
        slave.stop()

    # The slave is gone: Apache is back to SLAVE_NOT_AVAILABLE.
    after = _produce(namesrv, tmp_path, message_specs(TOPIC + "Later", 1, delays=False), "after")
    assert after[0]["status"] == "SLAVE_NOT_AVAILABLE", after

    # What Apache's own consumer sees, delayed messages included once they are due.
    read = run_java(
        "rocketmq4",
        "ferry.compat.Consume4",
        [namesrv.address, TOPIC, str(COUNT), "60000"],
        directory=tmp_path / "consume",
    )
    seen = json_lines(read.stdout)
    assert len(seen) == COUNT
    by_seq = {m["properties"]["seq"]: m for m in seen}
    for i, spec in enumerate(specs):
        m = by_seq[str(i)]
        assert base64.b64decode(m["body"]) == base64.b64decode(spec["body"]), i
        assert (m["tags"] or "") == spec["tags"]

    # The ferry slave catches up with everything, the scheduled deliveries and the message
    # sent while it was away included, then the master stops (flushing its files).
    master_end = _master_end(namesrv, master, tmp_path)
    assert master_end >= max(m["commitLogOffset"] + m["storeSize"] for m in seen)
    slave = _ferry_slave(loop_thread, tmp_path / "ferry-slave", master)
    try:
        wait_for(
            lambda: slave.app.store.max_offset == master_end, 60, "the ferry slave to catch up"
        )
    finally:
        slave.stop()
    master.stop()

    # Byte-identical commit logs: same files, same bytes up to the master's end, zeros after.
    ours = _commit_log_bytes(tmp_path / "ferry-slave" / "commitlog")
    theirs = _commit_log_bytes(master.commit_log_dir)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        start = int(name)
        used = max(0, min(FILE, master_end - start))
        assert ours[name][:used] == theirs[name][:used], f"commit-log file {name} differs"
        assert not ours[name][used:].strip(b"\0"), f"ferry wrote past the end in {name}"

    # Restarted on those bytes, the ferry slave serves every message as Apache's consumer saw it.
    # A ferry slave copies its master's topics, groups and offsets over ferry.v1, which
    # Apache's master does not speak (it serves them over RocketMQ's TCP protocol). Its
    # metadata files are RocketMQ's, though: the operator copies them across, as the docs
    # say (docs/guides/replication.md, "Beside Apache RocketMQ").
    for name in ("topics.json", "subscriptionGroup.json", "consumerOffset.json"):
        shutil.copyfile(
            master.store_dir / "config" / name, tmp_path / "ferry-slave" / "config" / name
        )
    slave = _ferry_slave(loop_thread, tmp_path / "ferry-slave", master)
    try:
        served = pull_all(slave, TOPIC, sorted({m["queueId"] for m in seen}))
    finally:
        slave.stop()
    assert len(served) == COUNT
    for m in seen:
        got = served[(m["queueId"], m["queueOffset"])]
        want_body = base64.b64decode(m["body"])
        assert got.body == want_body, m["properties"]["seq"]
        assert got.tags == (m["tags"] or "")
        assert got.keys == (m["keys"] or "")
        assert dict(got.properties) == user_view(m["properties"])
        assert got.born_timestamp == m["bornTimestamp"]
        assert got.store_timestamp == m["storeTimestamp"]
        assert got.commit_offset == m["commitLogOffset"]
        assert got.msg_id == m["offsetMsgId"]


def _master_end(namesrv: ApacheNamesrv, master: ApacheBroker, tmp_path: Path) -> int:
    """The master's commit-log end as Apache's own mqadmin reports it (brokerStatus)."""
    status = run_java(
        "rocketmq4",
        "org.apache.rocketmq.tools.command.MQAdminStartup",
        ["brokerStatus", "-n", namesrv.address, "-b", master.address],
        directory=tmp_path / "mqadmin",
    )
    for line in status.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "commitLogMaxOffset":
            return int(value.strip())
    raise AssertionError(f"mqadmin brokerStatus printed no commitLogMaxOffset:\n{status.stdout}")
