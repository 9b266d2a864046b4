"""The chaos suite: faults injected into real broker processes under load, in
rounds, each scenario bounded in time; every message acknowledged SEND_OK must
survive, byte-identical. `make chaos` runs FERRY_CHAOS_ROUNDS=20 and writes
chaos-report.jsonl; `make test` runs 2 rounds of each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import grpc
import pytest

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.chaos.harness import (
    FILE_SIZE,
    QUEUES,
    ROUNDS,
    SLAVE_TIMEOUT_MS,
    TOPIC,
    Pair,
    Producers,
    Report,
    check_acked_on,
    count_messages,
    fixed_port,
    read_log,
)
from tests.conftest import broker_options
from tests.faultproxy import FaultProxy
from tests.integration.support import BrokerServer, NamesrvProcess, create_topic, run_ferry
from tests.waiting import wait_for

RECOVERED = r"store recovered .* commit_log=\[(\d+),(\d+)\)"


def reports_in(log: str) -> list[str]:
    """The offsets the slave reported on each HA connection, in order."""
    return re.findall(r"HA connected to master \S+; reporting (\d+)", log)


def first_start(store) -> int:
    return min(int(p.name) for p in (store / "commitlog").iterdir())


def assert_logs_identical(pair: Pair, end: int, report: Report) -> None:
    lo = max(first_start(pair.master.store), first_start(pair.slave.store))
    master, slave = read_log(pair.master.store, lo, end), read_log(pair.slave.store, lo, end)
    if master != slave:
        at = next(i for i, (a, b) in enumerate(zip(master, slave, strict=True)) if a != b)
        report.notes.append(f"logs differ at {lo + at}")
        report.write()
        raise AssertionError(f"the commit logs differ at offset {lo + at} (end {end})")


def test_sigkill_sync_master_under_load_loses_no_acknowledged_message(tmp_path):
    """Each round: producers send to the SYNC_MASTER, it is SIGKILLed mid-load;
    every SEND_OK so far must be on the slave, byte-identical; the master
    restarts, recovers, the slave re-joins and the two logs are identical."""
    report = Report("sigkill-sync-master")
    pair = Pair(tmp_path).start()
    producers = Producers(pair.master.addr)
    try:
        for _ in range(ROUNDS):
            producers.start()
            producers.wait_acked(100)  # and they go on sending through the kill
            pair.master.kill()
            report.faults += 1
            producers.stop()
            lost, differing = check_acked_on(pair.slave.store, producers.acked)
            report.lost, report.differing = lost, differing
            report.acknowledged = len(producers.acked)
            assert (lost, differing) == (0, 0), (
                f"round {report.rounds + 1}: {lost} acknowledged messages lost and "
                f"{differing} different on the slave, of {len(producers.acked)}"
            )
            pair.master.start()
            assert "crashed=True" in pair.master.log().rsplit("store recovered", 1)[1][:40]
            end = pair.wait_in_sync()
            assert_logs_identical(pair, end, report)
            report.rounds += 1
        # And on the master too, after all its recoveries.
        assert check_acked_on(pair.master.store, producers.acked) == (0, 0)
    finally:
        producers.stop()
        report.notes.append(f"statuses {producers.statuses}")
        report.write()
        pair.stop()


def test_sigkill_slave_under_load_resumes_from_its_own_end(tmp_path):
    """Each round: the slave is SIGKILLed while producers send, restarted, and
    resumes from the end of its own log; after the load the logs converge
    byte-identical and every SEND_OK is on both."""
    report = Report("sigkill-slave")
    pair = Pair(tmp_path).start()
    producers = Producers(pair.master.addr).start()
    try:
        for _ in range(ROUNDS):
            producers.wait_acked(100)
            pair.slave.kill()
            report.faults += 1
            before = len(reports_in(pair.slave.log()))
            refused = producers.statuses.get("SLAVE_NOT_AVAILABLE", 0)
            wait_for(  # sends during the outage: not acknowledged
                lambda r=refused: producers.statuses.get("SLAVE_NOT_AVAILABLE", 0) > r,
                15,
                "the master to answer SLAVE_NOT_AVAILABLE",
            )
            pair.slave.start()
            recovered = re.findall(RECOVERED, pair.slave.log())[-1]
            end_on_disk = int(recovered[1])
            starts = wait_for(
                lambda before=before: reports_in(pair.slave.log())[before:],
                15,
                "the slave to reconnect",
            )
            # It resumed from its own end, not from zero or the master's end.
            assert int(starts[0]) == end_on_disk > 0, (starts[0], end_on_disk)
            report.rounds += 1
        producers.stop()
        end = pair.wait_in_sync()
        report.acknowledged = len(producers.acked)
        lost, differing = check_acked_on(pair.slave.store, producers.acked)
        report.lost, report.differing = lost, differing
        assert (lost, differing) == (0, 0), f"{lost} lost, {differing} different"
        assert_logs_identical(pair, end, report)
    finally:
        producers.stop()
        report.notes.append(f"statuses {producers.statuses}")
        report.write()
        pair.stop()


FAULTS = ("blackhole-up", "blackhole-down", "delay-down", "cut-mid-frame")


def test_link_faults_time_out_in_time_and_heal_without_a_restart(tmp_path, loop_thread):
    """The slave reaches its master through a fault proxy. Each round injects
    one fault (in turn: blackhole slave→master, blackhole master→slave, a delay
    longer than slaveTimeout, a cut in the middle of a frame) under load: a sync
    send answers FLUSH_SLAVE_TIMEOUT within slaveTimeout + 10% (not for a cut:
    the slave reconnects), and once the link heals sends are SEND_OK again with
    the same processes. At the end every SEND_OK is on the slave and the two
    logs are byte-identical."""
    report = Report("link-faults")
    pair = Pair(tmp_path)
    proxy = FaultProxy("127.0.0.1", pair.ha_port)
    loop_thread.run(proxy.start())
    pair.slave_ha_target = proxy.addr
    pair.start()
    pids = (pair.master.proc.pid, pair.slave.proc.pid)
    producers = Producers(pair.master.addr, count=2).start()
    channel = grpc.insecure_channel(pair.master.addr)
    stub = broker_pb2_grpc.BrokerStub(channel)
    limit_s = SLAVE_TIMEOUT_MS / 1000 * 1.1
    slowest = 0.0

    def probe() -> tuple[int, float]:
        started = time.monotonic()
        r = stub.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"probe"), timeout=10)
        return r.status, time.monotonic() - started

    try:
        for i in range(max(ROUNDS, len(FAULTS))):
            fault = FAULTS[i % len(FAULTS)]
            producers.wait_acked(20)
            before = proxy.connections
            if fault == "blackhole-up":
                loop_thread.call(proxy.blackhole, "up")
            elif fault == "blackhole-down":
                loop_thread.call(proxy.blackhole, "down")
            elif fault == "delay-down":
                loop_thread.call(proxy.delay_s.__setitem__, "down", SLAVE_TIMEOUT_MS / 1000 * 1.5)
            else:
                loop_thread.call(proxy.cut_after.__setitem__, "down", 100)
            report.faults += 1
            status, took = probe()
            if fault == "cut-mid-frame":
                wait_for(lambda before=before: proxy.connections > before, 10, "a reconnect")
            else:
                assert status == broker_pb2.FLUSH_SLAVE_TIMEOUT, (fault, status)
                assert took <= limit_s, f"{fault}: FLUSH_SLAVE_TIMEOUT after {took:.2f}s"
                slowest = max(slowest, took)
            loop_thread.call(proxy.heal)
            loop_thread.call(proxy.delay_s.__setitem__, "down", 0.0)
            loop_thread.call(proxy.cut_after.__setitem__, "down", None)
            wait_for(lambda: probe()[0] == broker_pb2.SEND_OK, 15, f"SEND_OK after {fault}")
            report.rounds += 1
        producers.stop()
        end = pair.wait_in_sync()
        assert (pair.master.proc.pid, pair.slave.proc.pid) == pids  # no restart
        report.acknowledged = len(producers.acked)
        report.lost, report.differing = check_acked_on(pair.slave.store, producers.acked)
        assert (report.lost, report.differing) == (0, 0)
        assert_logs_identical(pair, end, report)
    finally:
        producers.stop()
        channel.close()
        report.notes.append(
            f"slowest FLUSH_SLAVE_TIMEOUT {slowest:.2f}s (limit {limit_s:.2f}s); "
            f"proxy connections {proxy.connections}; statuses {producers.statuses}"
        )
        report.write()
        pair.stop()
        loop_thread.call(proxy.heal)
        loop_thread.run(proxy.stop())


REGISTER_PERIOD_S = 10  # registerNameServerPeriod, at RocketMQ's lower clamp


def test_name_server_restarts_and_losses(tmp_path):
    """Two name servers and a broker group. Each round SIGKILLs one name server
    (in turn): clients keep routing through the other (`ferry route` with
    both), the restarted one has the brokers again within one registration
    period, and its routes come back."""
    report = Report("name-server-faults")
    ports = [fixed_port(), fixed_port()]

    def namesrv(i: int) -> NamesrvProcess:
        return NamesrvProcess(
            tmp_path / f"namesrv-{i}",
            # RocketMQ's protocol on the same port each run, gRPC wherever it
            # lands: the broker finds it again through the first.
            ["--port", str(ports[i]), "--grpc-port", "0", "--metrics-port", "0"],
        ).wait_ready()

    servers = [namesrv(0), namesrv(1)]
    both = ";".join(f"127.0.0.1:{p}" for p in ports)
    pair = Pair(tmp_path, namesrvAddr=both, registerNameServerPeriod=REGISTER_PERIOD_S * 1000)
    slowest = 0.0
    try:
        pair.start()

        def knows_both_brokers(port: int) -> bool:
            got = run_ferry("cluster", "--json", "-n", f"127.0.0.1:{port}", timeout_s=20)
            return got.returncode == 0 and got.stdout.count('"127.0.0.1:') >= 2

        def routes(addrs: str) -> bool:
            got = run_ferry("route", TOPIC, "-n", addrs, timeout_s=20)
            return got.returncode == 0 and "broker-c" in got.stdout

        for p in ports:
            wait_for(lambda p=p: routes(f"127.0.0.1:{p}"), 15, "the route on each name server")
        for r in range(ROUNDS):
            victim = r % 2
            servers[victim].kill()
            report.faults += 1
            assert routes(both), "no route with one of two name servers down"
            restarted = time.monotonic()
            servers[victim] = namesrv(victim)
            wait_for(
                lambda v=victim: routes(f"127.0.0.1:{ports[v]}"),
                REGISTER_PERIOD_S + 5,
                "the broker to register with the restarted name server",
            )
            slowest = max(slowest, time.monotonic() - restarted)
            assert slowest <= REGISTER_PERIOD_S, f"re-registered after {slowest:.1f}s"
            assert knows_both_brokers(ports[victim])
            report.rounds += 1
    finally:
        report.notes.append(f"slowest re-registration {slowest:.1f}s (period {REGISTER_PERIOD_S}s)")
        report.write()
        pair.stop()
        for s in servers:
            s.stop()


def test_slave_behind_retention_resyncs_by_itself(tmp_path):
    """Each round: the slave is down while the master writes more than a few
    files; then the master's retention deletes the files the slave still had
    (their last writes made 100 h old with os.utime, past the default 72 h
    fileReservedTime, and `ferry store clean` run against the live master).
    Restarted, the slave finds its end outside the master's range, says so in
    its log, discards its log and resyncs from the master's first file; the
    logs end byte-identical."""
    report = Report("retention-resync")
    pair = Pair(tmp_path, haSyncFrom="minOffset").start()
    producers = Producers(pair.master.addr, count=2, body_size=8192)

    def master_files() -> list:
        return sorted((pair.master.store / "commitlog").iterdir())

    try:
        producers.start().wait_acked(50)  # something on both sides first
        producers.stop()
        pair.wait_in_sync()
        for _ in range(ROUNDS):
            pair.slave.stop()
            producers.start()
            slave_last = max(p.name for p in (pair.slave.store / "commitlog").iterdir())
            wait_for(
                lambda s=slave_last: sum(p.name > s for p in master_files()) >= 2,
                60,
                "the master to write two more files",
            )
            producers.stop()
            old = time.time() - 100 * 3600
            expired = [f for f in master_files() if f.name <= slave_last]
            for f in expired:
                os.utime(f, (old, old))
            cleaned = run_ferry("store", "clean", "-b", pair.master.addr, "--json")
            assert cleaned.returncode == 0, cleaned.stderr
            assert json.loads(cleaned.stdout)["deletedFiles"] == len(expired)
            assert all(f.name > slave_last for f in master_files())
            report.faults += 1
            warnings_before = pair.slave.log().count("resyncing from")
            pair.slave.start()
            end = pair.wait_in_sync()
            assert pair.slave.log().count("resyncing from") == warnings_before + 1
            assert_logs_identical(pair, end, report)
            assert first_start(pair.slave.store) == first_start(pair.master.store)
            report.rounds += 1
    finally:
        # With the slave away a SYNC_MASTER acknowledges nothing (SLAVE_NOT_AVAILABLE):
        # the check here is the byte-identical logs after each resync.
        report.notes.append(f"statuses {producers.statuses}")
        producers.stop()
        report.write()
        pair.stop()


def _mount_tmpfs(path, size_bytes: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size_bytes}"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def _resize_tmpfs(path, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(path)], check=True)


def _used(path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_disk_full_on_the_master_refuses_sends_and_resumes(tmp_path):
    """The master's store on a small tmpfs (needs root to mount; the ENOSPC
    path itself is also tested in-process, anywhere, by
    tests/integration/test_broker_grpc.py). Each round: the file system is made
    ~2 MiB larger than what is used, producers fill it: sends fail with
    RESOURCE_EXHAUSTED naming the full disk, the broker keeps running, every
    SEND_OK so far is intact; then space returns and sends succeed again, with
    the same process. At the end a restart recovers everything."""
    disk = tmp_path / "store"  # the mount point is the store (its log stays outside)
    if os.geteuid() != 0 or not _mount_tmpfs(disk, 4 << 20):
        pytest.skip("cannot mount a tmpfs here (not root, or not allowed)")
    report = Report("disk-full")
    broker = BrokerServer(
        disk,
        broker_options(disk, flushDiskType="SYNC_FLUSH", mappedFileSizeCommitLog=FILE_SIZE,
                       mappedFileSizeConsumeQueue=20 * 1000, maxMessageSize=64 * 1024,
                       # This scenario is about ENOSPC itself: no retention, no early refusal.
                       diskMaxUsedSpaceRatio=99, diskSpaceCleanForciblyRatio=99,
                       diskSpaceWarningLevelRatio=99, cleanFileForciblyEnable="false"),
    )  # fmt: skip
    producers = None
    try:
        broker.start()
        pid = broker.proc.pid
        with grpc.insecure_channel(broker.addr) as ch:
            create_topic(ch, TOPIC, QUEUES)
        producers = Producers(broker.addr, count=2, body_size=4000)
        for _ in range(ROUNDS):
            _resize_tmpfs(disk, _used(disk) + (2 << 20))
            refused = producers.statuses.get("RESOURCE_EXHAUSTED", 0)
            acked = len(producers.acked)
            producers.start()
            wait_for(lambda r=refused: producers.statuses.get("RESOURCE_EXHAUSTED", 0) > r + 2,
                     60, "sends refused for a full disk")  # fmt: skip
            assert len(producers.acked) > acked  # it filled up under load this round
            producers.stop()
            report.faults += 1
            assert broker.proc.poll() is None and broker.proc.pid == pid
            # ENOSPC ("the broker's disk is full") or, just before it, the 99 %
            # warning ratio ("the broker's disk is nearly full").
            assert "the broker's disk is" in producers.last_error["RESOURCE_EXHAUSTED"]
            lost, differing = check_acked_on(broker.store, producers.acked)
            assert (lost, differing) == (0, 0), (lost, differing)
            _resize_tmpfs(disk, _used(disk) + (8 << 20))  # space returns
            with grpc.insecure_channel(broker.addr) as ch:
                stub = broker_pb2_grpc.BrokerStub(ch)
                r = stub.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"again"))
                assert r.status == broker_pb2.SEND_OK
                producers.acked[r.commit_offset] = b"again"
            report.rounds += 1
        broker.stop()
        broker.start()  # what was acknowledged survives a restart too
        report.acknowledged = len(producers.acked)
        report.lost, report.differing = check_acked_on(broker.store, producers.acked)
        assert (report.lost, report.differing) == (0, 0)
        with grpc.insecure_channel(broker.addr) as ch:
            assert count_messages(ch) == len(producers.acked)
    finally:
        if producers is not None:
            producers.stop()
            report.notes.append(f"statuses {producers.statuses}")
        report.write()
        broker.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
