"""What the chaos scenarios share: a SYNC_MASTER and its slave as real broker
processes on fixed loopback ports (so a restarted process comes back where its
peers and clients look), producers that remember every acknowledged message,
readers of a store's commit log straight from its files, and the report.

Rounds come from FERRY_CHAOS_ROUNDS (`make chaos` sets 20; `make test` runs the
default of 2). Each scenario appends one JSON line to FERRY_CHAOS_REPORT when
that is set (`make chaos` writes chaos-report.jsonl) and prints a summary."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ferry import record
from ferry.v1 import broker_pb2, broker_pb2_grpc, ha_admin_pb2, ha_admin_pb2_grpc
from services.broker.store.commitlog import segment_name
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, PortRange, create_topic
from tests.waiting import wait_for

ROUNDS = int(os.environ.get("FERRY_CHAOS_ROUNDS", "2"))
FILE_SIZE = 1 << 20  # commit-log files roll every few rounds
TOPIC = "Chaos"
QUEUES = 4
SECRET = "chaos-secret"
SLAVE_TIMEOUT_MS = 2000
# Fixed ports for processes that restart (see PortRange for the ranges).
_PORTS = PortRange(20000, 21000)


def fixed_port() -> int:
    return _PORTS.take()


@dataclass
class Report:
    scenario: str
    rounds: int = 0
    faults: int = 0
    acknowledged: int = 0
    lost: int = 0
    differing: int = 0
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def write(self) -> None:
        row = {
            "scenario": self.scenario,
            "rounds": self.rounds,
            "faults": self.faults,
            "acknowledged": self.acknowledged,
            "lost": self.lost,
            "differing": self.differing,
            "seconds": round(time.monotonic() - self.started, 1),
            "notes": self.notes,
        }
        print(f"\nchaos {json.dumps(row)}")
        target = os.environ.get("FERRY_CHAOS_REPORT")
        if target:
            with open(target, "a") as f:
                f.write(json.dumps(row) + "\n")


def count_messages(channel: grpc.Channel) -> int:
    """Messages a consumer reads from every queue of the topic."""
    stub = broker_pb2_grpc.BrokerStub(channel)
    total = 0
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            r = stub.PullMessage(
                broker_pb2.PullMessageRequest(consumer_group="chaos-check", topic=TOPIC,
                                              queue_id=queue_id, queue_offset=offset,
                                              max_msg_nums=1000),
                timeout=10,
            )  # fmt: skip
            if r.status != broker_pb2.FOUND:
                break
            total += len(r.messages)
            offset = r.next_begin_offset
    return total


class Pair:
    """broker-c: a SYNC_MASTER and its slave (pinned to the master's HA port)."""

    def __init__(self, root: Path, **master_keys: object) -> None:
        self.root = root
        self.master_keys = master_keys
        # gRPC (what producers and checks dial), HA, the slave's gRPC.
        self.master_port, self.ha_port, self.slave_port = fixed_port(), fixed_port(), fixed_port()
        # RocketMQ's protocol (listenPort), fixed too: a restart binds it again.
        self.master_remoting_port, self.slave_remoting_port = fixed_port(), fixed_port()
        # Where the slave looks for its master's HA port (a fault proxy, say).
        self.slave_ha_target = f"127.0.0.1:{self.ha_port}"
        self.master: BrokerServer
        self.slave: BrokerServer

    def _servers(self) -> None:
        root = self.root
        common = {"brokerName": "broker-c", "mappedFileSizeCommitLog": FILE_SIZE,
                  "haSecret": SECRET, "slaveTimeout": SLAVE_TIMEOUT_MS}  # fmt: skip
        self.master = BrokerServer(
            root / "master",
            broker_options(
                root / "master", brokerRole="SYNC_MASTER", grpcListenPort=self.master_port,
                listenPort=self.master_remoting_port, fastListenPort=-1, haListenPort=self.ha_port, **common, **self.master_keys,
            ),
        )  # fmt: skip
        self.slave = BrokerServer(
            root / "slave",
            broker_options(
                root / "slave", brokerRole="SLAVE", brokerId=1, grpcListenPort=self.slave_port,
                listenPort=self.slave_remoting_port, fastListenPort=-1,
                haMasterAddress=self.slave_ha_target, haReconnectInterval=200,
                slaveReadEnable="true", **common,
            ),
        )  # fmt: skip

    def start(self) -> Pair:
        """Both brokers up, the topic created, the slave in sync; on a failure
        whatever was started is stopped (by PID) before it is raised."""
        self._servers()
        try:
            self.master.start()
            self.slave.start()
            with grpc.insecure_channel(self.master.addr) as ch:
                create_topic(ch, TOPIC, QUEUES)
            self.wait_in_sync()
        except BaseException:
            self.stop()
            raise
        return self

    def ha_status(self) -> ha_admin_pb2.HAStatus:
        with grpc.insecure_channel(self.master.addr) as ch:
            return ha_admin_pb2_grpc.HAAdminStub(ch).GetHAStatus(
                ha_admin_pb2.GetHAStatusRequest(), timeout=3
            )

    def wait_in_sync(self, timeout_s: float = 30.0) -> int:
        """Until the slave has acknowledged everything the master holds."""

        def caught_up():
            try:
                st = self.ha_status()
            except grpc.RpcError:
                return None
            if len(st.connections) == 1 and st.connections[0].ack_offset == st.master_max_offset:
                return st.master_max_offset or -1
            return None

        end = wait_for(caught_up, timeout_s, "the slave to catch up with its master")
        return max(end, 0)

    def stop(self) -> None:
        self.slave.stop()
        self.master.stop()


class Producers:
    """Threads sending synchronously; every SEND_OK is remembered by its
    commit-log offset with its body."""

    def __init__(self, addr: str, count: int = 4, body_size: int = 0) -> None:
        self.addr = addr
        self.count = count
        self.body_size = body_size  # random bytes per body; 0: 16 to 215
        self.acked: dict[int, bytes] = {}
        self.statuses: dict[str, int] = {}
        self.last_error: dict[str, str] = {}  # status code -> its latest details
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._seq = 0

    def start(self) -> Producers:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(self.count)]  # fmt: skip
        for t in self._threads:
            t.start()
        return self

    def _run(self, worker: int) -> None:
        channel = grpc.insecure_channel(self.addr)
        stub = broker_pb2_grpc.BrokerStub(channel)
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._seq += 1
                    seq = self._seq
                size = self.body_size or 16 + seq % 200
                body = f"p{worker}-{seq}-".encode() + os.urandom(size)
                try:
                    r = stub.SendMessage(
                        broker_pb2.SendMessageRequest(topic=TOPIC, body=body), timeout=5
                    )
                except grpc.RpcError as exc:
                    # The broker is down (a fault of the scenario): not acknowledged.
                    with self._lock:
                        self.statuses[exc.code().name] = self.statuses.get(exc.code().name, 0) + 1
                        self.last_error[exc.code().name] = exc.details() or ""
                    time.sleep(0.05)
                    continue
                name = broker_pb2.SendStatus.Name(r.status)
                with self._lock:
                    self.statuses[name] = self.statuses.get(name, 0) + 1
                    if r.status == broker_pb2.SEND_OK:
                        self.acked[r.commit_offset] = body
        finally:
            channel.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def wait_acked(self, n: int, timeout_s: float = 20.0) -> None:
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + n, timeout_s, f"{n} more acknowledged sends")


def read_log(store: Path, start: int, end: int, file_size: int = FILE_SIZE) -> bytes:
    """Bytes [start, end) of a store's commit log (files of `file_size`), from its files."""
    out = bytearray()
    directory = store / "commitlog"
    pos = start
    while pos < end:
        base = pos - pos % file_size
        path = directory / segment_name(base)
        with path.open("rb") as f:
            f.seek(pos - base)
            chunk = f.read(min(end, base + file_size) - pos)
        if not chunk:
            raise AssertionError(f"{path} ends before {pos}")
        out += chunk
        pos += len(chunk)
    return bytes(out)


def body_at(store: Path, offset: int) -> bytes | None:
    """The body of the record at physical `offset`, or None if none is there."""
    try:
        size = record.peek(read_log(store, offset, offset + record.BLANK_SIZE))
        if isinstance(size, record.Blank) or size > FILE_SIZE:
            return None
        rec = record.decode(read_log(store, offset, offset + size))
    except (AssertionError, OSError, record.RecordError):
        return None
    return rec.body if isinstance(rec, record.Record) else None


def check_acked_on(store: Path, acked: dict[int, bytes]) -> tuple[int, int]:
    """(lost, differing): acknowledged messages missing from, or different
    in, the store's commit log."""
    lost = differing = 0
    for offset, body in acked.items():
        found = body_at(store, offset)
        if found is None:
            lost += 1
        elif found != body:
            differing += 1
    return lost, differing
