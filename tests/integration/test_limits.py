"""Every limit is configurable and enforced: the message size
(maxMessageSize), the gRPC message size (grpcMaxMessageSize), the HA frame a
slave accepts (haMaxFrameSize), the HA connections a master accepts at once
(haMaxConnections) and a slave's per-connection read buffer
(haReadBufferSize)."""

from __future__ import annotations

import socket

import grpc
import pytest

from ferry.v1 import broker_pb2
from services.broker.config import ConfigError, load_config
from services.ha.slave import Inbound
from tests.conftest import start_broker
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for


def test_max_message_size(loop_thread, tmp_path):
    b = start_broker(loop_thread, tmp_path / "s", maxMessageSize=1024)
    try:
        create_topic(b, "L", queues=1)
        ok = b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="L", body=b"x" * 1024))
        assert ok.status == broker_pb2.SEND_OK
        end = b.app.store.max_offset
        with pytest.raises(grpc.RpcError) as err:
            b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="L", body=b"x" * 1025))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "maxMessageSize" in err.value.details()
        assert b.app.store.max_offset == end
    finally:
        b.stop()


def test_grpc_message_size(loop_thread, tmp_path):
    limit = 256 * 1024
    b = start_broker(
        loop_thread, tmp_path / "s", grpcMaxMessageSize=limit, maxMessageSize=64 * 1024
    )
    try:
        create_topic(b, "L", queues=1)
        end = b.app.store.max_offset
        batch = [broker_pb2.SendEntry(body=b"y" * 60000) for _ in range(5)]  # ~300 KB
        with pytest.raises(grpc.RpcError) as err:
            b.broker.SendMessages(broker_pb2.SendMessagesRequest(topic="L", messages=batch))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert b.app.store.max_offset == end  # nothing stored
        ok = b.broker.SendMessages(broker_pb2.SendMessagesRequest(topic="L", messages=batch[:3]))
        assert ok.status == broker_pb2.SEND_OK
    finally:
        b.stop()


def test_grpc_message_size_must_carry_the_largest_message(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["maxMessageSize=4194304", "grpcMaxMessageSize=4194304"], env={})
    assert "grpcMaxMessageSize" in str(err.value)


def _master(loop_thread, path, **keys):
    return start_broker(
        loop_thread, path, brokerName="broker-l", brokerRole="ASYNC_MASTER", haListenPort=0,
        mappedFileSizeCommitLog=1 << 20, **keys,
    )  # fmt: skip


def _slave(loop_thread, path, master, **keys):
    return start_broker(
        loop_thread, path, brokerName="broker-l", brokerRole="SLAVE", brokerId=1,
        mappedFileSizeCommitLog=1 << 20, haReconnectInterval=200,
        haMasterAddress=f"127.0.0.1:{master.app.ha_master.port}", **keys,
    )  # fmt: skip


def test_ha_max_frame_size(loop_thread, tmp_path, caplog):
    """A master sending frames larger than the slave's haMaxFrameSize is cut
    off; the slave appends nothing of them."""
    master = _master(loop_thread, tmp_path / "m", haTransferBatchSize=256 * 1024)
    create_topic(master, "L", queues=1)
    batch = [broker_pb2.SendEntry(body=b"z" * 30000) for _ in range(8)]  # one 240 KB append
    master.broker.SendMessages(broker_pb2.SendMessagesRequest(topic="L", messages=batch))
    slave = _slave(loop_thread, tmp_path / "s", master, haMaxFrameSize=64 * 1024)
    try:
        wait_for(
            lambda: "the limit is 65536" in caplog.text, 10, "the slave to refuse the big frame"
        )
        assert slave.app.store.max_offset == 0
    finally:
        slave.stop()
        master.stop()


def test_ha_max_connections(loop_thread, tmp_path, caplog):
    master = _master(loop_thread, tmp_path / "m", haMaxConnections=1)
    slave = _slave(loop_thread, tmp_path / "s", master)
    try:
        wait_for(lambda: len(ha_status(master).connections) == 1, 10, "the slave to connect")
        with socket.create_connection(("127.0.0.1", master.app.ha_master.port), timeout=5) as s:
            s.sendall(b"\x00" * 8)
            try:
                answer = s.recv(100)
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # closed at once
        assert "too many HA connections (max 1)" in caplog.text
        assert len(ha_status(master).connections) == 1
    finally:
        slave.stop()
        master.stop()


class _Transport:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_ha_read_buffer_size_bounds_what_a_slave_buffers():
    """A slave stops reading once its buffer (haReadBufferSize) is full and goes
    on once frames are applied; the buffer grows only for one frame bigger than
    itself, up to haMaxFrameSize."""
    inbound = Inbound(512 * 1024)
    transport = _Transport()
    inbound.connection_made(transport)
    fed = 0
    while not transport.paused:
        view = inbound.get_buffer(-1)
        n = min(len(view), 64 * 1024)
        view[:n] = b"\x00" * n
        inbound.buffer_updated(n)
        fed += n
        assert fed <= 512 * 1024
    assert len(inbound.buf) == 512 * 1024
    inbound.start = inbound.end  # everything applied
    inbound.consumed()
    assert not transport.paused
