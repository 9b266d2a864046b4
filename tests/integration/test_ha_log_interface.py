"""The HA data plane against `ReplicatedLog` alone: a real HAMaster and HASlave
on loopback, each over a minimal log written for this test (one memfd-backed
file, no broker, no store) — so HA depends on the interface and nothing else.
Covers streaming, waiting for growth, acks, regions released, and a slave
outside its master's range restarted empty at it."""

from __future__ import annotations

import ast
import asyncio
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.ha import protocol
from services.ha.master import HAMaster, HAMasterConfig
from services.ha.slave import HASlave, HASlaveConfig
from services.ha.sync import ReplicaAcks
from tests.waiting import wait_for_async

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")

FILE = 1 << 20  # one "file" of the log; regions never cross it
SECRET = b"interface-secret"


@dataclass(frozen=True)
class Region:
    fd: int
    offset: int
    file_position: int
    size: int


class MemoryLog:
    """A log in one anonymous file: [start, end) of it holds data."""

    def __init__(self, start: int = 0) -> None:
        self.fd = os.memfd_create("ferry-log")
        os.ftruncate(self.fd, 64 * FILE)
        self.start = self.end = start
        self.empty = True
        self._grown = asyncio.Event()
        self.held = 0

    # ReplicatedLog
    @property
    def min_offset(self) -> int:
        return self.start

    @property
    def max_offset(self) -> int:
        return self.end

    def file_start(self, offset: int) -> int:
        return offset - offset % FILE

    async def read_region(self, offset: int, max_bytes: int) -> Region:
        size = min(max_bytes, self.end - offset, self.file_start(offset) + FILE - offset)
        self.held += 1
        return Region(self.fd, offset, offset, size)

    def release(self, region: Region) -> None:
        self.held -= 1

    def read_now(self, offset: int, max_bytes: int) -> bytes:
        size = min(max_bytes, self.end - offset, self.file_start(offset) + FILE - offset)
        return os.pread(self.fd, size, offset)

    async def wait_for_growth(self, offset: int, timeout_s: float) -> bool:
        if self.end > offset:
            return True
        grown = self._grown
        try:
            async with asyncio.timeout(timeout_s):
                await grown.wait()
        except TimeoutError:
            pass
        return self.end > offset

    def append(self, offset: int, data) -> int:
        if offset != self.end and not (self.empty and offset % FILE == 0):
            raise ValueError(f"bytes at {offset}, the log ends at {self.end}")
        if self.empty:
            self.start = self.end = offset
        os.pwrite(self.fd, bytes(data), offset)
        self.end = offset + len(data)
        self.empty = False
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()
        return self.end

    def restart_at(self, offset: int) -> None:
        self.start = self.end = offset
        self.empty = True

    async def truncate(self, offset: int) -> None:
        self.end = offset

    # for the test
    def bytes(self, start: int, end: int) -> bytes:
        return os.pread(self.fd, end - start, start)


async def _pair(master_log: MemoryLog, slave_log: MemoryLog, secret: bytes = b""):
    acks = ReplicaAcks(256 << 20)
    master = HAMaster(
        HAMasterConfig(host="127.0.0.1", port=0, secret=secret, group="g", sync_from="minOffset"),
        master_log,
        acks,
    )
    await master.start()
    slave = HASlave(
        HASlaveConfig(
            master_address=f"127.0.0.1:{master.port}",
            reconnect_s=0.05,
            secret=secret,
            group="g",
            replica_id=1,
        ),
        slave_log,
    )
    await slave.start()
    return master, slave, acks


def test_ha_modules_import_no_broker_code():
    ha = Path(__file__).resolve().parents[2] / "services" / "ha"
    for source in sorted(ha.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not [n for n in names if n.startswith("services.broker")], source.name


def test_streaming_growth_and_acks_over_the_interface():
    async def scenario():
        master_log, slave_log = MemoryLog(), MemoryLog()
        master_log.append(0, b"a" * 100_000)
        master, slave, acks = await _pair(master_log, slave_log)
        try:
            await wait_for_async(
                lambda: slave_log.end == master_log.end, 10, "the slave to catch up"
            )
            for i in range(20):  # growth wakes the master's writer
                master_log.append(master_log.end, bytes([i]) * (1000 + i))
            await wait_for_async(lambda: slave_log.end == master_log.end, 10, "the slave to follow")
            await wait_for_async(lambda: acks.confirmed == master_log.end, 10, "the ack")
            assert slave_log.bytes(0, slave_log.end) == master_log.bytes(0, master_log.end)
            assert master_log.held == 0  # every region released
        finally:
            await slave.stop()
            await master.stop()

    asyncio.run(scenario())


def test_a_slave_outside_the_masters_range_restarts_at_its_start():
    async def scenario():
        master_log = MemoryLog(start=3 * FILE)  # older files gone (retention)
        master_log.empty = True
        master_log.append(3 * FILE, b"m" * 5000)
        slave_log = MemoryLog()
        slave_log.append(0, b"s" * 10)  # ends at 10: below the master's range
        master, slave, _ = await _pair(master_log, slave_log, secret=SECRET)
        try:
            await wait_for_async(lambda: slave_log.end == master_log.end, 10, "the resync")
            assert slave_log.start == 3 * FILE and slave.resyncs == 1
            assert slave_log.bytes(3 * FILE, slave_log.end) == b"m" * 5000
        finally:
            await slave.stop()
            await master.stop()

    asyncio.run(scenario())


def test_a_master_stopped_under_a_connected_slave_reports_no_loop_error():
    """Stopping cancels each connection task; none may reach the event
    loop's exception handler (Python 3.11 logged one ERROR per connection)."""

    async def scenario():
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        master_log, slave_log = MemoryLog(), MemoryLog()
        master_log.append(0, b"a" * 1000)
        master, slave, _ = await _pair(master_log, slave_log)
        try:
            await wait_for_async(lambda: slave_log.end == master_log.end, 10, "the slave")
            assert len(master.connections) == 1
            await master.stop()
            for _ in range(3):  # let done-callbacks already scheduled run
                await asyncio.sleep(0)
            assert [c.get("message") for c in errors] == []
        finally:
            await slave.stop()
            await master.stop()

    asyncio.run(scenario())


def test_push_now_sends_the_new_bytes_in_the_callers_turn_and_the_writer_goes_on_after():
    """A SYNC_MASTER send about to wait for its slave has its bytes sent from its own
    event-loop turn when the connection's writer is parked: the slave holds the frame
    before any other task (the writer included) has run. Nothing is sent twice and the
    writer's next frame starts where the pushed one ended."""

    async def scenario():
        log_ = MemoryLog()
        log_.append(0, b"a" * 100)
        master = HAMaster(HAMasterConfig(host="127.0.0.1", port=0), log_, ReplicaAcks(1 << 30))
        await master.start()
        loop = asyncio.get_running_loop()
        slave = socket.create_connection(("127.0.0.1", master.port), timeout=5)
        try:
            slave.sendall(struct.pack(">q", 100))  # a legacy slave holding [0, 100)
            slave.setblocking(False)
            await wait_for_async(
                lambda: any(c.parked for c in master.connections.values()), 10, "a parked writer"
            )
            master.push_now()  # nothing new: nothing sent
            log_.append(100, b"pushed")
            master.push_now()  # no await since the append: the writer task has not run
            frame = protocol.encode_header(100, 6) + b"pushed"
            assert slave.recv(1024, socket.MSG_DONTWAIT) == frame
            (conn,) = master.connections.values()
            assert conn.transfer_from == 106 and conn.parked is None
            master.push_now()  # pushed already: nothing twice
            with pytest.raises(BlockingIOError):
                slave.recv(1024, socket.MSG_DONTWAIT)
            # The writer wakes to the growth, finds it sent and parks again.
            await wait_for_async(lambda: conn.parked is not None, 10, "the writer parked again")
            with pytest.raises(BlockingIOError):
                slave.recv(1024, socket.MSG_DONTWAIT)
            log_.append(106, b"by the writer")  # no push: the writer's own frame
            expected = protocol.encode_header(106, 13) + b"by the writer"
            got = b""
            async with asyncio.timeout(10):
                while len(got) < len(expected):
                    got += await loop.sock_recv(slave, 1024)
            assert got == expected
        finally:
            slave.close()
            await master.stop()

    asyncio.run(scenario())
