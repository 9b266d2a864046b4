"""Replication across process deaths: a slave SIGKILLed mid-stream resumes from
its own end (no gap, no duplicate: the logs end byte-identical), and a slave
reconnects to a restarted master by itself."""

from __future__ import annotations

import filecmp
import os
import threading

import grpc

from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
)
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, free_port
from tests.waiting import wait_for

FILE = 256 * 1024


def _channel_stubs(addr):
    ch = grpc.insecure_channel(addr)
    return ch, broker_pb2_grpc.BrokerStub(ch), broker_admin_pb2_grpc.BrokerAdminStub(ch)


def _runtime(addr):
    ch, _, admin = _channel_stubs(addr)
    with ch:
        return admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=5)


def test_slave_killed_mid_stream_resumes_and_reconnects_to_a_restarted_master(tmp_path):
    ha_port = free_port()
    master = BrokerServer(
        tmp_path / "m",
        broker_options(
            tmp_path / "m",
            brokerName="broker-k",
            mappedFileSizeCommitLog=FILE,
            haListenPort=ha_port,
            haTransferBatchSize=4096,
            # The files are compared from the first: the master may have rolled
            # before the slave's first connect, so it streams from its oldest.
            haSyncFrom="minOffset",
        ),  # fmt: skip
    ).start()
    slave_options = broker_options(
        tmp_path / "s", brokerName="broker-k", brokerRole="SLAVE", brokerId=1,
        mappedFileSizeCommitLog=FILE, haMasterAddress=f"127.0.0.1:{ha_port}", haReconnectInterval=200,
    )  # fmt: skip
    slave = BrokerServer(tmp_path / "s", slave_options).start()
    stop = threading.Event()
    try:
        ch, broker, admin = _channel_stubs(master.addr)
        admin.UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name="K", read_queue_nums=2, write_queue_nums=2, perm=6
                )
            )
        )

        def produce():
            body = os.urandom(900)
            while not stop.is_set():
                broker.SendMessages(
                    broker_pb2.SendMessagesRequest(
                        topic="K", messages=[broker_pb2.SendEntry(body=body) for _ in range(50)]
                    ),
                    timeout=10,
                )

        producer = threading.Thread(target=produce)
        producer.start()
        for _ in range(3):  # kill the slave three times while data streams
            wait_for(
                lambda: _runtime(slave.addr).commit_log_max_offset > 0, 20, "the slave to receive"
            )
            before = _runtime(slave.addr).commit_log_max_offset
            wait_for(
                lambda b=before: _runtime(slave.addr).commit_log_max_offset > b + 200_000,
                20,
                "more data",
            )
            slave.kill()
            slave.start()
        stop.set()
        producer.join(20)
        end = _runtime(master.addr).commit_log_max_offset
        wait_for(
            lambda: _runtime(slave.addr).commit_log_max_offset == end, 30, "the slave to catch up"
        )
        _assert_identical(tmp_path)

        # The master restarts; the slave reconnects by itself and follows.
        master.stop()
        master.start()
        ch.close()
        ch, broker, _ = _channel_stubs(master.addr)
        broker.SendMessage(broker_pb2.SendMessageRequest(topic="K", body=b"after restart"))
        end = _runtime(master.addr).commit_log_max_offset
        wait_for(
            lambda: _runtime(slave.addr).commit_log_max_offset == end, 30, "the slave to reconnect"
        )
        _assert_identical(tmp_path)
        ch.close()
    finally:
        stop.set()
        slave.stop()
        master.stop()


def _assert_identical(tmp_path):
    names = sorted(p.name for p in (tmp_path / "m" / "commitlog").iterdir())
    assert sorted(p.name for p in (tmp_path / "s" / "commitlog").iterdir()) == names
    for name in names:
        assert filecmp.cmp(
            tmp_path / "m" / "commitlog" / name, tmp_path / "s" / "commitlog" / name, shallow=False
        ), name
