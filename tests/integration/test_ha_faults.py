"""HA under faults and from foreign peers: a blackholed link gives
FLUSH_SLAVE_TIMEOUT within slaveTimeout and heals by itself; consumers of a
SYNC_MASTER see only what a slave holds; a minimal RocketMQ-style slave written
from the legacy frames of docs/reference/contract.md, "The HA protocol",
replicates; a wrong secret gets no byte; garbage on the HA port closes only that
connection."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.faultproxy import FaultProxy
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

FILE = 256 * 1024
SLAVE_TIMEOUT_MS = 1000


def _master(loop_thread, path, ns_addr="", **keys):
    settings = {
        "brokerName": "broker-f",
        "brokerRole": "SYNC_MASTER",
        "mappedFileSizeCommitLog": FILE,
        "haListenPort": 0,
        "slaveTimeout": SLAVE_TIMEOUT_MS,
        **keys,
    }
    return start_broker(loop_thread, path, ns_addr, **settings)


def _slave(loop_thread, path, ha_addr, **keys):
    return start_broker(
        loop_thread,
        path,
        "",
        brokerName="broker-f",
        brokerRole="SLAVE",
        brokerId=1,
        mappedFileSizeCommitLog=FILE,
        haMasterAddress=ha_addr,
        haReconnectInterval=200,
        slaveSyncDelay=0,
        **keys,
    )


@pytest.fixture
def proxied(loop_thread, tmp_path):
    master = _master(loop_thread, tmp_path / "m")
    proxy = FaultProxy("127.0.0.1", master.app.ha_master.port)
    loop_thread.run(proxy.start())
    slave = _slave(loop_thread, tmp_path / "s", proxy.addr)
    create_topic(master, "F", queues=1)
    wait_for(lambda: ha_status(master).connections, 10, "the slave to connect through the proxy")
    yield master, slave, proxy
    loop_thread.call(proxy.heal)
    slave.stop()
    loop_thread.run(proxy.stop())
    master.stop()


def send(master, body: bytes):
    started = time.monotonic()
    r = master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="F", queue_id=0, body=body))
    return r, time.monotonic() - started


def pull(master, offset=0):
    return master.broker.PullMessage(
        broker_pb2.PullMessageRequest(
            consumer_group="g", topic="F", queue_id=0, queue_offset=offset
        )
    )


def test_blackhole_gives_flush_slave_timeout_in_time_and_heals(loop_thread, proxied):
    master, slave, proxy = proxied
    assert send(master, b"before")[0].status == broker_pb2.SEND_OK
    for direction in ("down", "up"):
        loop_thread.call(proxy.blackhole, direction)
        r, took = send(master, b"during-" + direction.encode())
        assert r.status == broker_pb2.FLUSH_SLAVE_TIMEOUT
        assert SLAVE_TIMEOUT_MS / 1000 * 0.9 <= took <= SLAVE_TIMEOUT_MS / 1000 * 1.1, took
        loop_thread.call(proxy.heal)
        wait_for(
            lambda: send(master, b"after")[0].status == broker_pb2.SEND_OK, 10, "SEND_OK again"
        )
    assert proxy.connections == 1  # healed without a reconnect


def test_consumers_of_a_sync_master_see_only_what_a_slave_holds(loop_thread, proxied):
    master, slave, proxy = proxied
    assert send(master, b"one")[0].status == broker_pb2.SEND_OK
    wait_for(lambda: len(pull(master).messages) == 1, 5, "the first message to be visible")
    loop_thread.call(proxy.blackhole, "down")
    r, _ = send(master, b"unconfirmed")
    assert r.status == broker_pb2.FLUSH_SLAVE_TIMEOUT
    answer = pull(master, 1)
    assert answer.status == broker_pb2.NO_NEW_MSG and not answer.messages
    loop_thread.call(proxy.heal)
    found = wait_for(
        lambda: (a := pull(master, 1)).messages and a, 10, "the message once the slave has it"
    )
    assert found.messages[0].body == b"unconfirmed"


def test_minimal_legacy_slave_replicates_from_a_master_without_secret(loop_thread, tmp_path):
    master = _master(loop_thread, tmp_path / "m", brokerRole="ASYNC_MASTER")
    try:
        create_topic(master, "L", queues=1)
        for i in range(50):
            master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="L", body=b"m%d" % i))
        end = master.app.store.max_offset
        # A slave straight from the legacy frames (docs/reference/contract.md, "The HA
        # protocol"): report 0, read 12-byte headers and bodies.
        got = bytearray()
        with socket.create_connection(("127.0.0.1", master.app.ha_master.port), timeout=5) as s:
            s.sendall(struct.pack(">q", 0))
            start = None
            while len(got) < end:
                header = _recv(s, 12)
                offset, size = struct.unpack(">qi", header)
                if start is None:
                    start = offset
                assert offset == start + len(got)
                got += _recv(s, size)
                s.sendall(struct.pack(">q", offset + size))
        assert start == 0
        master_file = (tmp_path / "m" / "commitlog" / f"{0:020d}").read_bytes()
        assert bytes(got) == master_file[:end]
    finally:
        master.stop()


def _recv(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "master closed the connection"
        data += chunk
    return data


def test_handshake_replicates_and_a_wrong_secret_gets_nothing(loop_thread, tmp_path):
    master = _master(loop_thread, tmp_path / "m", brokerRole="ASYNC_MASTER", haSecret="right")
    addr = f"127.0.0.1:{master.app.ha_master.port}"
    good = _slave(loop_thread, tmp_path / "good", addr, haSecret="right")
    bad = _slave(loop_thread, tmp_path / "bad", addr, haSecret="wrong")
    try:
        create_topic(master, "H", queues=1)
        master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="H", body=b"secret stuff"))
        end = master.app.store.max_offset
        wait_for(lambda: good.app.store.max_offset == end, 10, "the slave with the right secret")
        # The wrong one has had its chances: refused three times (it reconnects every 0.2 s).
        wait_for(lambda: master.app.ha_master.protocol_errors >= 3, 10, "three refusals")
        assert bad.app.store.max_offset == 0
        assert not (tmp_path / "bad" / "commitlog").exists() or not list(
            (tmp_path / "bad" / "commitlog").iterdir()
        )
        assert master.app.ha_master.protocol_errors >= 1
        # A legacy client (no handshake) gets no commit-log byte either.
        with socket.create_connection(("127.0.0.1", master.app.ha_master.port), timeout=5) as s:
            s.sendall(struct.pack(">q", 0))
            first = _recv(s, 20)
            assert first[:4] == b"FHAC"  # a challenge, never data
    finally:
        bad.stop()
        good.stop()
        master.stop()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff" * 8,  # a negative report
        struct.pack(">q", 1 << 40),  # beyond the master's max offset
        b"random bytes that are not a report at all!",
        struct.pack(">q", 0)[:5],  # stops mid-report
    ],
)
def test_garbage_on_the_ha_port_closes_only_that_connection(loop_thread, tmp_path, garbage):
    master = _master(loop_thread, tmp_path / "m", brokerRole="ASYNC_MASTER")
    slave = _slave(loop_thread, tmp_path / "s", f"127.0.0.1:{master.app.ha_master.port}")
    try:
        create_topic(master, "G", queues=1)
        wait_for(lambda: ha_status(master).connections, 10, "the real slave")
        with socket.create_connection(("127.0.0.1", master.app.ha_master.port), timeout=5) as s:
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            rest = b""
            try:
                while chunk := s.recv(65536):
                    rest += chunk
            except TimeoutError:
                pytest.fail("the master kept a garbage connection open")
        master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="G", body=b"still fine"))
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the real slave to go on")
        assert len(ha_status(master).connections) == 1
    finally:
        slave.stop()
        master.stop()


class FakeMaster:
    """A master from the legacy frames (docs/reference/contract.md, "The HA
    protocol") written in the test: accepts slave connections one at a time and
    hands each to the test, which plays the master's side."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(10)
        self.addr = f"127.0.0.1:{self.server.getsockname()[1]}"

    def accept(self) -> tuple[socket.socket, int]:
        conn, _ = self.server.accept()
        conn.settimeout(10)
        report = b""
        while len(report) < 8:
            chunk = conn.recv(8 - len(report))
            assert chunk, "the slave closed before reporting"
            report += chunk
        return conn, struct.unpack(">q", report)[0]

    def close(self) -> None:
        self.server.close()


def _closed_by_peer(conn: socket.socket) -> bool:
    """Read until the slave closes; reports it sends meanwhile are fine."""
    try:
        while conn.recv(65536):
            pass
        return True
    except (TimeoutError, ConnectionResetError):
        return False


def _one_record(commit_offset: int) -> bytes:
    from ferry import record

    return record.encode_raw(
        b"F", 0, 0, 0, commit_offset, 0, 1, record.pack_host(("127.0.0.1", 1)),
        2, record.pack_host(("127.0.0.1", 2)), b"from the fake master", b"",
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack(">qi", 0, 1 << 30),  # a header over the frame limit
        struct.pack(">qi", 12345, 4) + b"abcd",  # a frame at the wrong offset
        struct.pack(">qi", 0, 100) + b"x" * 50,  # the master stops mid-frame
        b"\x00\x00\x00",  # the master stops mid-header
    ],
    ids=["oversized", "wrong-offset", "mid-frame", "mid-header"],
)
def test_a_misbehaving_master_gets_its_connection_closed_and_nothing_appended(
    loop_thread, tmp_path, bad
):
    fake = FakeMaster()
    slave = _slave(loop_thread, tmp_path / "s", fake.addr)
    try:
        conn, reported = fake.accept()
        assert reported == 0  # an empty slave reports 0 on connect
        with conn:
            conn.sendall(bad)
            if bad.startswith(struct.pack(">qi", 0, 100)) or len(bad) < 12:
                conn.shutdown(socket.SHUT_WR)  # the peer goes away mid-transfer
            assert _closed_by_peer(conn), "the slave kept a bad connection open"
        assert slave.app.store.max_offset == 0
        assert not slave.app.store.commit_log.segment_starts()

        # The slave reconnects, reports its (unchanged) end, and takes a good frame.
        conn, reported = fake.accept()
        with conn:
            assert reported == 0
            good = _one_record(0)
            conn.sendall(struct.pack(">qi", 0, len(good)) + good)
            wait_for(lambda: slave.app.store.max_offset == len(good), 10, "the good frame")
            # ... and acknowledges it with a report of its new end.
            acked = bytearray()

            def reported_new_end() -> bool:
                acked.extend(conn.recv(8))
                return len(acked) >= 8 and struct.unpack(">q", acked[-8:])[0] == len(good)

            wait_for(reported_new_end, 10, "a report of the slave's new end", interval_s=0)
            assert struct.unpack(">q", acked[-8:])[0] == len(good)
        assert slave.app.store.commit_log.read_raw(0, len(good)) == good
    finally:
        slave.stop()
        fake.close()
