"""Master→slave replication between real brokers over the real HA port:
byte-identical commit logs, matching consume queues, reads from the slave,
sync sends, visibility, metadata sync."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import grpc
import pytest

from ferry.v1 import broker_pb2, ha_admin_pb2, ha_admin_pb2_grpc
from tests.conftest import start_broker
from tests.integration.test_broker_grpc import create_topic
from tests.waiting import wait_for

FILE = 256 * 1024


def ha_status(b) -> ha_admin_pb2.HAStatus:
    return ha_admin_pb2_grpc.HAAdminStub(b.channel).GetHAStatus(ha_admin_pb2.GetHAStatusRequest())


def pair(loop_thread, tmp_path, ns, role="ASYNC_MASTER", **keys):
    common = dict(
        mappedFileSizeCommitLog=FILE,
        haListenPort=0,
        haReconnectInterval=200,
        slaveSyncDelay=0,
        slaveSyncInterval=300,
        **keys,
    )
    master = start_broker(
        loop_thread,
        tmp_path / "master",
        ns.remoting_addr,
        brokerName="broker-r",
        brokerRole=role,
        **common,
    )
    slave = start_broker(
        loop_thread,
        tmp_path / "slave",
        ns.remoting_addr,
        brokerName="broker-r",
        brokerRole="SLAVE",
        brokerId=1,
        slaveReadEnable="true",
        **common,
    )
    return master, slave


@pytest.fixture
def async_pair(loop_thread, tmp_path, ns):
    master, slave = pair(loop_thread, tmp_path, ns)
    yield master, slave
    slave.stop()
    master.stop()


def files(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


def test_slave_commit_log_is_byte_identical_and_serves_the_same_messages(async_pair, tmp_path):
    master, slave = async_pair
    create_topic(master, "Rep", queues=4)
    body = os.urandom(1000)
    sent = 0
    while sent < 20 * 1024 * 1024:
        r = master.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="Rep",
                messages=[broker_pb2.SendEntry(body=body + b"%d" % i) for i in range(200)],
            )
        )
        assert r.status == broker_pb2.SEND_OK
        sent += 200 * 1000
    end = master.app.store.max_offset
    wait_for(lambda: slave.app.store.max_offset == end, 30, "the slave to catch up")
    names = [p.name for p in files(tmp_path / "master")]
    assert len(names) > 60  # many files, so rolling and BLANKs were replicated
    assert [p.name for p in files(tmp_path / "slave")] == names
    for name in names:
        assert filecmp.cmp(
            tmp_path / "master" / "commitlog" / name,
            tmp_path / "slave" / "commitlog" / name,
            shallow=False,
        ), name
    wait_for(lambda: slave.app.store.dispatcher.behind_bytes == 0, 10, "the slave's dispatcher")
    for q in range(4):
        assert slave.app.store.queue_max_offset("Rep", q) == master.app.store.queue_max_offset(
            "Rep", q
        )
    pull = broker_pb2.PullMessageRequest(
        consumer_group="g", topic="Rep", queue_id=2, queue_offset=7, max_msg_nums=5
    )
    from_master = master.broker.PullMessage(pull)
    from_slave = slave.broker.PullMessage(pull)
    assert [m.body for m in from_slave.messages] == [m.body for m in from_master.messages]
    assert [m.msg_id for m in from_slave.messages] == [m.msg_id for m in from_master.messages]
    status = ha_status(master)
    assert status.in_sync_slave_nums == 1 and status.connections[0].ack_offset == end
    assert ha_status(slave).slave.connected


def test_slave_refuses_writes(async_pair):
    _, slave = async_pair
    with pytest.raises(grpc.RpcError) as info:
        slave.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Rep", body=b"x"))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_metadata_reaches_the_slave(async_pair):
    master, slave = async_pair
    create_topic(master, "Synced", queues=3)
    wait_for(
        lambda: slave.app.metadata.topics.get("Synced") is not None, 10, "the topic on the slave"
    )
    assert slave.app.metadata.topics.data_version == master.app.metadata.topics.data_version


def test_sync_master_acknowledges_after_the_slave(loop_thread, tmp_path, ns):
    master, slave = pair(loop_thread, tmp_path, ns, role="SYNC_MASTER")
    try:
        create_topic(master, "S", queues=1)
        wait_for(lambda: ha_status(master).connections, 10, "the slave to connect")
        r = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="S", body=b"safe"))
        assert r.status == broker_pb2.SEND_OK
        assert slave.app.store.max_offset >= r.commit_offset  # the slave had it before the ack
        slave.stop()
        wait_for(lambda: not ha_status(master).connections, 10, "the slave to go")
        r = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="S", body=b"alone"))
        assert r.status == broker_pb2.SLAVE_NOT_AVAILABLE
    finally:
        if slave.app.gate.open:
            slave.stop()
        master.stop()


def test_consumer_falls_back_to_the_slave_when_the_master_leaves_the_route(
    loop_thread, tmp_path, ns
):
    from ferry.client.broker import Consumer
    from ferry.client.namesrv import NamesrvClient

    master, slave = pair(loop_thread, tmp_path, ns)
    master_running = True
    try:
        create_topic(master, "Fallback", queues=1)
        for i in range(20):
            master.broker.SendMessage(
                broker_pb2.SendMessageRequest(topic="Fallback", queue_id=0, body=b"m%02d" % i)
            )
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to catch up")
        wait_for(
            lambda: slave.app.metadata.topics.get("Fallback") is not None, 10, "the topic sync"
        )
        with (
            NamesrvClient([ns.addr]) as nsc,
            Consumer(nsc, "g-fallback", "Fallback", from_beginning=True, timeout_s=3) as consumer,
        ):
            first = consumer.poll(max_msgs=8, wait_ms=0)
            assert [m.message.body for m in first] == [b"m%02d" % i for i in range(8)]
            assert consumer.commit() == 1

            master.stop()  # unregisters: broker-r has only its slave in the route now
            master_running = False
            rest: list[bytes] = []
            deadline_polls = 20
            while len(rest) < 12 and deadline_polls:
                rest += [m.message.body for m in consumer.poll(max_msgs=32, wait_ms=100)]
                deadline_polls -= 1
            # No gap and no repeat: the consumer goes on from its own position.
            assert rest == [b"m%02d" % i for i in range(8, 20)]
            # Offsets are committed on the slave (merged max-wins with the master later).
            assert consumer.commit() == 1
        committed = slave.broker.QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(
                consumer_group="g-fallback", topic="Fallback", queue_id=0
            )
        )
        assert committed.offset == 20
    finally:
        slave.stop()
        if master_running:
            master.stop()
