"""Fail-stop on storage errors (services/broker/failstop.py).

Real broker processes run with an LD_PRELOAD library that makes `fdatasync`
and `fsync` (or `pwrite`) fail with EIO once a trigger file exists. After the
fault no send that started later is acknowledged, the broker logs one
CRITICAL line, leaves its name server, exits with status 3 and leaves its
abort marker; restarted without the library it recovers from a crash and
serves every message it acknowledged, byte for byte.

The in-process tests need no compiler: they replace the store's file
operations (`flush.sync_fds`, the commit log's `pwrite_all`, the flusher's
`save_checkpoint`) with failing ones and check the store's state directly
(flushed offset, checkpoint on disk, refusals, abort marker); a full disk
(ENOSPC) is refused without tripping.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import ResourceExhausted, StorageFault, Unavailable
from ferry.v1 import broker_pb2, broker_pb2_grpc, namesrv_pb2, namesrv_pb2_grpc
from services.broker.cli import EXIT_STORAGE
from services.broker.store import (
    FlushDiskType,
    MessageIn,
    MessageStore,
    PutStatus,
    RecoveryReport,
    StoreConfig,
)
from services.broker.store import commitlog as commitlog_module
from services.broker.store import flush as flush_module
from services.broker.store.checkpoint import ABORT, CHECKPOINT, load_checkpoint
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, NamesrvProcess, create_topic, pull_all
from tests.waiting import wait_for, wait_for_async

TRIGGER_ENV = "FERRY_FAULT_TRIGGER"  # fdatasync and fsync fail while this file exists
PWRITE_TRIGGER_ENV = "FERRY_FAULT_PWRITE_TRIGGER"  # pwrite fails while this file exists
TOPIC = "Faults"
QUEUES = 4
SENDERS = 4
ACKED_BEFORE_FAULT = 200
EXIT_DEADLINE_S = 30.0

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* True while the file named by the environment variable exists. */
static int armed(const char *variable) {
    const char *path = getenv(variable);
    if (path == NULL || *path == '\0') {
        return 0;
    }
    int saved = errno;
    int exists = access(path, F_OK) == 0;
    errno = saved;
    return exists;
}

#define FAIL_WHEN_ARMED(variable)  \
    if (armed(variable)) {         \
        errno = EIO;               \
        return -1;                 \
    }

int fdatasync(int fd) {
    static int (*real)(int);
    FAIL_WHEN_ARMED("FERRY_FAULT_TRIGGER")
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    FAIL_WHEN_ARMED("FERRY_FAULT_TRIGGER")
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    return real(fd);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    FAIL_WHEN_ARMED("FERRY_FAULT_PWRITE_TRIGGER")
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    }
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    FAIL_WHEN_ARMED("FERRY_FAULT_PWRITE_TRIGGER")
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    }
    return real(fd, buf, count, offset);
}
"""


@pytest.fixture(scope="session")
def fault_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libfault.so, built here with `cc` (each xdist worker builds its own)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (`cc`) on PATH: cannot build the LD_PRELOAD fault library")
    build = tmp_path_factory.mktemp("fault-shim")
    source = build / "shim.c"
    source.write_text(SHIM_SOURCE)
    library = build / "libfault.so"
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(library), str(source), "-ldl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"cc failed to build the fault library:\n{done.stderr}"
    return library


# ---------------------------------------------------------------- real processes


@dataclass
class Send:
    started: float
    finished: float
    outcome: str  # a SendStatus name, or the gRPC status code name of a failed call
    details: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.outcome == "SEND_OK"


class Senders:
    """Threads sending unique bodies as fast as they can; every call is recorded."""

    def __init__(self, addr: str, count: int = SENDERS) -> None:
        self.channel = grpc.insecure_channel(addr)
        self.stub = broker_pb2_grpc.BrokerStub(self.channel)
        self.sends: list[Send] = []
        self.stop_event = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def start(self) -> Senders:
        for t in self._threads:
            t.start()
        return self

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            body = f"w{worker}-n{n}-".encode() + os.urandom(16 + n % 200)
            n += 1
            started = time.monotonic()
            try:
                r = self.stub.SendMessage(
                    broker_pb2.SendMessageRequest(topic=TOPIC, body=body), timeout=10
                )
            except grpc.RpcError as exc:
                self.sends.append(
                    Send(started, time.monotonic(), exc.code().name, exc.details() or "")
                )
                continue
            outcome = broker_pb2.SendStatus.Name(r.status)
            self.sends.append(
                Send(started, time.monotonic(), outcome, "", r.queue_id, r.queue_offset, body)
            )

    def acked(self) -> dict[tuple[int, int], bytes]:
        return {(s.queue_id, s.queue_offset): s.body for s in list(self.sends) if s.ok}

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(15)
        self.channel.close()


class LogWatch:
    """When the first CRITICAL line showed up in a log file (polled on a thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if " CRITICAL " in self.path.read_text(errors="replace"):
                self.seen_at = time.monotonic()
                return
            self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def routed_addrs(stub: namesrv_pb2_grpc.NameServerStub, topic: str) -> set[str]:
    """Every broker address the name server routes `topic` to (none: NOT_FOUND)."""
    try:
        route = stub.GetRouteInfoByTopic(
            namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
        )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return set()
        raise
    return {addr for data in route.broker_datas for addr in data.broker_addrs.values()}


def timeline(sends: list[Send], t0: float, around: float = 0.05) -> str:
    """The sends near the first non-acknowledged one, times relative to `t0` (ms)."""
    failed = [s.finished for s in sends if not s.ok]
    first = min(failed) if failed else t0
    near = [s for s in sends if s.finished >= first - around][:60]
    return "\n".join(
        f"{(s.started - t0) * 1e3:9.1f} → {(s.finished - t0) * 1e3:9.1f} ms  {s.outcome} "
        f"{s.details[:80]}"
        for s in sorted(near, key=lambda s: s.started)
    )


def critical_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " CRITICAL " in line]


@dataclass(frozen=True)
class Scenario:
    flush_disk_type: str
    trigger_env: str  # which calls fail
    operation: str  # named in the CRITICAL line
    # Some send must be refused naming the fault (not only by the closed gate).
    refusal_expected: bool


# SYNC_FLUSH: the failed fdatasync had sends waiting for it. With ASYNC_FLUSH
# the gate may close before any send reaches the store; a failed pwrite may be
# the dispatcher's (a consume queue: "write of consume queues under ...").
SYNC_FDATASYNC = Scenario("SYNC_FLUSH", TRIGGER_ENV, "fdatasync", refusal_expected=True)
ASYNC_FDATASYNC = Scenario("ASYNC_FLUSH", TRIGGER_ENV, "fdatasync", refusal_expected=False)
ASYNC_PWRITE = Scenario("ASYNC_FLUSH", PWRITE_TRIGGER_ENV, "write", refusal_expected=False)


def run_fault_scenario(
    tmp_path: Path, shim: Path, monkeypatch: pytest.MonkeyPatch, scenario: Scenario
) -> dict[str, float]:
    """Start a name server and a broker under the fault library, send, pull the
    trigger while sending, check the fail-stop, restart without the library and
    check every acknowledged message. Returns phase timings (s)."""
    timings: dict[str, float] = {}
    began = time.monotonic()
    store = tmp_path / "store"
    trigger = tmp_path / "fault.trigger"
    namesrv = NamesrvProcess(tmp_path / "namesrv")
    server: BrokerServer | None = None
    senders: Senders | None = None
    watch: LogWatch | None = None
    ns_channel: grpc.Channel | None = None
    try:
        namesrv.wait_ready()
        server = BrokerServer(
            store,
            broker_options(
                store,
                namesrv.remoting_addr,
                brokerRole="ASYNC_MASTER",
                flushDiskType=scenario.flush_disk_type,
                flushIntervalCommitLog=100,
                mappedFileSizeCommitLog=256 * 1024,
                # The shipped default (tests use 0): calls in flight when the
                # server stops are answered, and the exit must not wait it out.
                shutdownGraceSeconds=5,
            ),
        )
        ns_channel = grpc.insecure_channel(namesrv.addr)
        routes = namesrv_pb2_grpc.NameServerStub(ns_channel)

        # The library is in the broker's environment only (not the name server's).
        with monkeypatch.context() as env:
            env.setenv("LD_PRELOAD", str(shim))
            env.setenv(scenario.trigger_env, str(trigger))
            server.start()
        with grpc.insecure_channel(server.addr) as channel:
            create_topic(channel, TOPIC, QUEUES)
        wait_for(
            lambda: server.addr in routed_addrs(routes, TOPIC),
            15,
            f"the name server to route {TOPIC} to the broker at {server.addr}",
        )
        timings["start"] = time.monotonic() - began

        senders = Senders(server.addr).start()
        wait_for(
            lambda: len(senders.acked()) >= ACKED_BEFORE_FAULT,
            30,
            f"{ACKED_BEFORE_FAULT} acknowledged sends before the fault",
        )
        watch = LogWatch(server.log_path)
        # The time first: a send that ended before it ended before the fault was armed
        # (one ending between the two lines may already have met the fault).
        triggered_at = time.monotonic()
        trigger.touch()

        assert server.proc is not None
        try:
            returncode = server.proc.wait(EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the broker did not exit within {EXIT_DEADLINE_S}s of the storage fault; "
                f"log tail:\n{server.log()[-4000:]}"
            )
        exited_at = time.monotonic()
        timings["fault_to_exit"] = exited_at - triggered_at
        senders.stop()
        watch.stop()
        first_log = server.log()
        assert returncode == EXIT_STORAGE, (
            f"the broker exited {returncode}, not {EXIT_STORAGE}, after a storage fault; "
            f"log tail:\n{first_log[-4000:]}"
        )

        sends = list(senders.sends)
        before = [s for s in sends if s.finished < triggered_at]
        assert len([s for s in before if s.ok]) >= ACKED_BEFORE_FAULT
        assert all(s.ok for s in before), [s for s in before if not s.ok][:3]

        # The cut: the first refusal a client saw, the CRITICAL line appearing,
        # or the process gone — whichever came first. No send started later is
        # acknowledged.
        failures = [s for s in sends if not s.ok]
        assert failures, "no send failed after the storage fault"
        first_failure = min(s.finished for s in failures)
        logged_at = watch.seen_at if watch.seen_at is not None else exited_at
        cut = min(first_failure, logged_at, exited_at)
        late_acks = [s for s in sends if s.started > cut and s.ok]
        assert not late_acks, (
            f"{len(late_acks)} sends started after the fault was known were acknowledged "
            f"(cut {cut - triggered_at:.3f}s after the trigger): {late_acks[:3]}"
        )
        if scenario.flush_disk_type == "SYNC_FLUSH" or scenario.trigger_env == PWRITE_TRIGGER_ENV:
            # Stronger: a send that started after the trigger could only be
            # acknowledged by an fdatasync (or written by a pwrite) that began
            # after the trigger existed, and every one of those failed.
            after_trigger = [s for s in sends if s.started > triggered_at and s.ok]
            assert not after_trigger, (
                f"{len(after_trigger)} sends started after the trigger were acknowledged "
                f"although no sync could succeed any more: {after_trigger[:3]}"
            )
        refused = [s for s in failures if "storage failure" in s.details]
        # UNAVAILABLE: refused by the store or the closed gate, or the process
        # is gone. CANCELLED: grpc cancels calls that reach a server already
        # shutting down, before any handler ran.
        unexpected = [s for s in failures if s.outcome not in ("UNAVAILABLE", "CANCELLED")]
        assert not unexpected, "sends after the fault must fail UNAVAILABLE:\n" + timeline(
            sends, triggered_at
        )
        if scenario.refusal_expected:
            # The sends waiting for the failed sync are told why, not just cut off.
            assert refused, f"no send was refused naming the storage failure: {failures[:3]}"
        timings["sends"] = len(sends)
        timings["refused_naming_fault"] = len(refused)

        criticals = critical_lines(first_log)
        assert len(criticals) == 1, "expected exactly one CRITICAL line:\n" + "\n".join(criticals)
        assert "EIO" in criticals[0], criticals[0]
        assert scenario.operation in criticals[0], criticals[0]
        named = re.search(r"(/\S+) failed", criticals[0])
        assert named, f"the CRITICAL line names no file: {criticals[0]}"
        assert named.group(1).startswith(str(store)), criticals[0]

        assert (store / ABORT).exists(), "the abort marker was removed: a clean close after a fault"
        assert "store closed cleanly" not in first_log
        assert "Traceback" not in first_log, first_log[-4000:]
        assert "unregistered from name server" in first_log, first_log[-3000:]
        wait_for(
            lambda: server.addr not in routed_addrs(routes, TOPIC),
            10,
            f"the name server to stop routing {TOPIC} to the failed broker {server.addr}",
        )

        # Restart without the fault library on the same store.
        trigger.unlink()
        acked = senders.acked()
        restart_log_start = len(first_log)
        began_restart = time.monotonic()
        server.start()
        timings["restart"] = time.monotonic() - began_restart
        restart_log = server.log()[restart_log_start:]
        assert "store recovered crashed=True" in restart_log, restart_log[-3000:]
        with grpc.insecure_channel(server.addr) as channel:
            found = pull_all(channel, TOPIC, QUEUES)
        missing = [k for k in acked if k not in found]
        different = [k for k in acked if k in found and found[k] != acked[k]]
        assert not missing, (
            f"{len(missing)} of {len(acked)} acknowledged messages lost: {sorted(missing)[:5]}"
        )
        assert not different, f"{len(different)} acknowledged messages differ: {different[:5]}"
        timings["acked"] = len(acked)
        timings["total"] = time.monotonic() - began
        return timings
    finally:
        if senders is not None:
            senders.stop()
        if watch is not None:
            watch.stop()
        if ns_channel is not None:
            ns_channel.close()
        trigger.unlink(missing_ok=True)
        if server is not None:
            server.stop()
        namesrv.stop()


@pytest.mark.timeout(120)
def test_sync_flush_fdatasync_failure_stops_the_broker(tmp_path, fault_shim, monkeypatch):
    timings = run_fault_scenario(tmp_path, fault_shim, monkeypatch, SYNC_FDATASYNC)
    print(f"\nSYNC_FLUSH fdatasync fault: {timings}")


@pytest.mark.timeout(120)
def test_async_flush_fdatasync_failure_stops_the_broker(tmp_path, fault_shim, monkeypatch):
    timings = run_fault_scenario(tmp_path, fault_shim, monkeypatch, ASYNC_FDATASYNC)
    print(f"\nASYNC_FLUSH fdatasync fault: {timings}")


@pytest.mark.timeout(120)
def test_pwrite_failure_stops_the_broker(tmp_path, fault_shim, monkeypatch):
    timings = run_fault_scenario(tmp_path, fault_shim, monkeypatch, ASYNC_PWRITE)
    print(f"\nASYNC_FLUSH pwrite fault: {timings}")


# ---------------------------------------------------------------- in process


def _store_config(root: Path, flush: FlushDiskType) -> StoreConfig:
    return StoreConfig(
        root=root,
        commit_log_file_size=64 * 1024,
        consume_queue_entries_per_file=64,
        flush_disk_type=flush,
        flush_interval_s=0.05,
        sync_flush_timeout_s=5.0,
        preallocate=False,
    )


def _messages(first: int, count: int = 1) -> list[MessageIn]:
    return [
        MessageIn(body=b"body-%05d-" % i + b"x" * (i % 50), properties=b"")
        for i in range(first, first + count)
    ]


def _checkpointed(root: Path) -> int:
    """The flushed offset in the checkpoint file on disk (-1: none)."""
    checkpoint = load_checkpoint(root / CHECKPOINT)
    return -1 if checkpoint is None else checkpoint.flushed_offset


def _eio() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


async def _open_store(
    root: Path, flush: FlushDiskType = FlushDiskType.SYNC_FLUSH
) -> tuple[MessageStore, RecoveryReport]:
    store = MessageStore(_store_config(root, flush), FakeClock())
    report = store.open()
    await store.start()
    return store, report


def _failing_pwrite(errnos: list[int]) -> Callable[[int, bytes, int], None]:
    """The commit log's pwrite_all, failing once with each of `errnos` first."""
    real = commitlog_module.pwrite_all

    def pwrite_all(fd: int, data: bytes, offset: int) -> None:
        if errnos:
            number = errnos.pop(0)
            raise OSError(number, os.strerror(number))
        real(fd, data, offset)

    return pwrite_all


class SyncSeam:
    """The flusher's file-operations seam: real fdatasyncs until armed, then EIO."""

    def __init__(self) -> None:
        self.armed = False
        self.failed = 0


def _patch_sync(monkeypatch: pytest.MonkeyPatch) -> SyncSeam:
    seam = SyncSeam()
    real = flush_module.sync_fds

    def sync(fds) -> None:
        if seam.armed:
            seam.failed += 1
            raise StorageFault("fdatasync", "commitlog/00000000000000000000", _eio())
        real(fds)

    monkeypatch.setattr(flush_module, "sync_fds", sync)
    return seam


def test_failed_fdatasync_fails_the_waiting_send_and_freezes_the_flushed_offset(
    tmp_path, monkeypatch
):
    seam = _patch_sync(monkeypatch)
    root = tmp_path / "store"

    async def scenario() -> None:
        store, _ = await _open_store(root)
        try:
            for i in range(20):
                result = await store.put("T", 0, _messages(i))
                assert result.status is PutStatus.PUT_OK
            flushed = store.flushed_offset
            assert flushed == store.max_offset > 0
            await wait_for_async(
                lambda: _checkpointed(root) == flushed,
                5,
                "the checkpoint to reach the flushed offset",
            )

            seam.armed = True
            with pytest.raises(Unavailable, match="storage failure"):
                await store.put("T", 0, _messages(100))
            assert store.max_offset > flushed, "the put was refused before it was appended"
            assert seam.failed >= 1
            assert store.failstop.tripped
            assert store.failstop.fault is not None and store.failstop.fault.errno == errno.EIO
            assert store.flushed_offset == flushed

            seam.armed = False  # the disk "works" again: nothing is taken all the same
            for wait_flush in (True, False):
                with pytest.raises(Unavailable):
                    await store.put("T", 0, _messages(200), wait_flush=wait_flush)
            assert store.flushed_offset == flushed
            # The flusher stopped: no later checkpoint claims more than was synced.
            flusher_task = next(t for t in store._tasks if t.get_name() == "flusher")
            await wait_for_async(flusher_task.done, 5, "the flusher to stop after the fault")
            assert _checkpointed(root) == flushed
        finally:
            await store.stop()
        # No clean close after a fault: the abort marker stays.
        assert (root / ABORT).exists()
        assert _checkpointed(root) == flushed

        reopened, report = await _open_store(root)
        try:
            assert report.crashed
            got = await reopened.get_messages("T", 0, 0, 100)
            assert [m.body for m in got.records[:20]] == [
                m.body for i in range(20) for m in _messages(i)
            ]
        finally:
            await reopened.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("number", "refusal", "match"),
    [
        (errno.EIO, Unavailable, "storage failure"),
        (errno.ENOSPC, ResourceExhausted, "disk is full"),
    ],
    ids=["EIO", "ENOSPC"],
)
def test_pwrite_failure_trips_unless_the_disk_is_full(
    tmp_path, monkeypatch, number, refusal, match
):
    """The commit log's pwrite: EIO is a fault and every later put is refused;
    a full disk refuses that put only, and the next one is stored."""
    root = tmp_path / "store"
    failures = [number]
    fault = number == errno.EIO

    async def scenario() -> None:
        store, _ = await _open_store(root)
        try:
            assert (await store.put("T", 0, _messages(0))).status is PutStatus.PUT_OK
            end = store.max_offset
            monkeypatch.setattr(commitlog_module, "pwrite_all", _failing_pwrite(failures))
            with pytest.raises(refusal, match=match):
                await store.put("T", 0, _messages(1))
            assert not failures, "the commit log did not write through pwrite_all"
            assert store.failstop.tripped is fault
            assert store.max_offset == end
            if fault:
                assert store.failstop.fault is not None and store.failstop.fault.errno == errno.EIO
                assert store.failstop.fault.operation == "pwrite"
                with pytest.raises(Unavailable):  # pwrite works again; still refused
                    await store.put("T", 0, _messages(2))
            else:
                result = await store.put("T", 0, _messages(2))
                assert result.status is PutStatus.PUT_OK and result.queue_offset == 1
                store.dispatcher.dispatch_all()
                got = await store.get_messages("T", 0, 0, 10)
                bodies = [m.body for i in (0, 2) for m in _messages(i)]
                assert [m.body for m in got.records] == bodies
        finally:
            await store.stop()
        assert (root / ABORT).exists() is fault, "a full disk is not a fault: the close is clean"

    asyncio.run(scenario())


@pytest.mark.parametrize("number", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_checkpoint_write_failure_trips_unless_the_disk_is_full(tmp_path, monkeypatch, number):
    """The checkpoint's own fsync/write: EIO is a fault; a full disk is retried."""
    root = tmp_path / "store"
    real = flush_module.save_checkpoint
    failing = threading.Event()
    attempts: list[int] = []

    def save_checkpoint(path, checkpoint) -> None:
        if failing.is_set():
            attempts.append(checkpoint.flushed_offset)
            raise OSError(number, os.strerror(number), str(path))
        real(path, checkpoint)

    monkeypatch.setattr(flush_module, "save_checkpoint", save_checkpoint)

    async def scenario() -> None:
        store, _ = await _open_store(root, FlushDiskType.ASYNC_FLUSH)
        try:
            assert (await store.put("T", 0, _messages(0))).status is PutStatus.PUT_OK
            first = store.max_offset
            await wait_for_async(lambda: _checkpointed(root) == first, 5, "the first checkpoint")
            failing.set()
            assert (await store.put("T", 0, _messages(1))).status is PutStatus.PUT_OK
            second = store.max_offset
            if number == errno.EIO:
                await wait_for_async(lambda: store.failstop.tripped, 5, "the fail-stop to trip")
                assert attempts and _checkpointed(root) == first
                assert store.failstop.fault is not None
                assert store.failstop.fault.path == str(root / CHECKPOINT)
                with pytest.raises(Unavailable):
                    await store.put("T", 0, _messages(2))
            else:
                await wait_for_async(lambda: attempts, 5, "a checkpoint write to be attempted")
                assert _checkpointed(root) == first
                assert not store.failstop.tripped
                assert (await store.put("T", 0, _messages(2))).status is PutStatus.PUT_OK
                failing.clear()  # space again: the next checkpoint is written
                await wait_for_async(
                    lambda: _checkpointed(root) == store.max_offset > second,
                    5,
                    "the checkpoint to be written again once the disk has space",
                )
        finally:
            await store.stop()
        assert (root / ABORT).exists() is (number == errno.EIO)

    asyncio.run(scenario())
