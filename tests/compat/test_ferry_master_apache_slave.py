"""ferry SYNC_MASTER → Apache RocketMQ 4.9 SLAVE, over RocketMQ 4.x's plain HA protocol.

A ferry master with no HA secret accepts a plain 4.x slave (no handshake: the slave's first
8-byte offset report starts the stream). ferry's client sends a mix of messages (sizes up to
300 KiB, tags, keys, properties, delay levels) through ferry.v1; the test shows that:

- every send is SEND_OK, which a SYNC_MASTER answers only once the Apache slave reported the
  message's offset (before the slave connects, ferry answers SLAVE_NOT_AVAILABLE);
- the Apache slave's commit log is byte-identical to ferry's, file by file;
- the Apache slave's store, opened by Apache's own store classes (its recovery and the
  consume queues its dispatcher built: tests/compat/rocketmq4/src/.../ReadStore4.java),
  holds every message intact, as ferry serves it.

What the Apache slave cannot do here: ferry's masters hand topics, groups and offsets to
their slaves over ferry.v1 gRPC, which Apache's slave does not speak (it asks its master
over RocketMQ's TCP protocol: GET_ALL_TOPIC_CONFIG and friends). So the Apache slave has no
topic configuration or consumer offsets from ferry; it still builds its consume queues
from the commit log, which is what this test reads. docs/guides/replication.md says so.
"""

from __future__ import annotations

import base64

import pytest

from ferry.v1 import broker_pb2, ha_admin_pb2, ha_admin_pb2_grpc
from tests.apache import ApacheBroker, run_java
from tests.compat.specs import json_lines, message_specs, pull_all, user_view
from tests.conftest import start_broker
from tests.integration.test_broker_grpc import create_topic
from tests.processes import free_port
from tests.waiting import wait_for

FILE = 4 * 1024 * 1024
TOPIC = "CompatToApache"
COUNT = 60


@pytest.fixture
def ferry_master(loop_thread, tmp_path):
    master = start_broker(
        loop_thread,
        tmp_path / "ferry-master",
        "",
        brokerName="broker-f",
        brokerRole="SYNC_MASTER",
        mappedFileSizeCommitLog=FILE,
        maxMessageSize=1024 * 1024,
    )
    create_topic(master, TOPIC, queues=4)
    yield master
    master.stop()


def _send(master, spec: dict) -> broker_pb2.SendResult:
    props = dict(spec["props"])
    if spec["delay"]:
        props["DELAY"] = str(spec["delay"])
    return master.broker.SendMessage(
        broker_pb2.SendMessageRequest(
            topic=spec["topic"],
            body=base64.b64decode(spec["body"]),
            tags=spec["tags"],
            keys=spec["keys"],
            properties=props,
            producer_group="ferry-compat-producer",
        ),
        timeout=30,
    )


def test_ferry_sync_master_replicates_to_an_apache_slave_byte_for_byte(
    ferry_master, loop_thread, tmp_path
):
    specs = message_specs(TOPIC, COUNT)
    master = ferry_master
    assert _send(master, specs[0]).status == broker_pb2.SLAVE_NOT_AVAILABLE

    slave = ApacheBroker(
        tmp_path / "apache-slave",
        broker_name="broker-f",
        broker_id=1,
        role="SLAVE",
        settings={
            "mappedFileSizeCommitLog": FILE,
            "haMasterAddress": f"127.0.0.1:{master.app.ha_master.port}",
            # 4.x reports its offset every haSendHeartbeatInterval when idle (5 s).
            "haSendHeartbeatInterval": 1000,
        },
    )
    try:
        slave.start()
        first_end = master.app.store.max_offset
        wait_for(
            lambda: _acked(master) >= first_end, 60, "the Apache slave to report the first message"
        )
        for spec in specs[1:]:
            result = _send(master, spec)
            assert result.status == broker_pb2.SEND_OK, (spec["props"]["seq"], result)
        # The delayed messages come due on the master and are replicated like any other.
        wait_for(
            lambda: len(pull_all(master, TOPIC, range(4))) == COUNT,
            60,
            "the delayed messages to reach their topic",
        )
        end = master.app.store.max_offset
        wait_for(lambda: _acked(master) >= end, 60, "the Apache slave to report the end")
    finally:
        slave.stop()
    served = pull_all(master, TOPIC, range(4))
    master.stop()

    ours = {
        p.name: p.read_bytes() for p in sorted((tmp_path / "ferry-master" / "commitlog").iterdir())
    }
    theirs = {p.name: p.read_bytes() for p in sorted(slave.commit_log_dir.iterdir())}
    assert sorted(theirs) == sorted(ours)
    for name in ours:
        used = max(0, min(FILE, end - int(name)))
        assert theirs[name][:used] == ours[name][:used], f"commit-log file {name} differs"

    stored = run_java(
        "rocketmq4",
        "ferry.compat.ReadStore4",
        [str(slave.store_dir), str(FILE), str(free_port()), TOPIC],
        directory=tmp_path / "read-store",
    )
    lines = json_lines(stored.stdout)
    summary = lines.pop()
    assert summary["done"] and summary["maxPhyOffset"] == end, summary
    assert len(lines) == COUNT
    for m in lines:
        got = served[(m["queueId"], m["queueOffset"])]
        assert base64.b64decode(m["body"]) == got.body
        assert (m["tags"] or "") == got.tags
        assert (m["keys"] or "") == got.keys
        assert user_view(m["properties"]) == dict(got.properties)
        assert m["bornTimestamp"] == got.born_timestamp
        assert m["storeTimestamp"] == got.store_timestamp
        assert m["commitLogOffset"] == got.commit_offset
        assert m["offsetMsgId"] == got.msg_id
    seqs = sorted(int(m["properties"]["seq"]) for m in lines)
    assert seqs == list(range(COUNT))


def _acked(master) -> int:
    status = ha_admin_pb2_grpc.HAAdminStub(master.channel).GetHAStatus(
        ha_admin_pb2.GetHAStatusRequest()
    )
    return max((c.ack_offset for c in status.connections), default=-1)
