"""Store benchmarks: a loop that never blocks on the disk, and retention.

1. SendMessage latency: one producer, single unary sends of 128-byte bodies to
   a topic of its own, on a broker with the default 1 GiB commit-log files.
   One sender runs through the whole phase; its calls are grouped by the
   window they started in:
   (0) no other load: two quiet windows, one before everything else and one
       after, pooled (the baseline);
   (a) while a consumer in another process drains 1 GiB of cold data: one
       pull loop (1,000 messages asked per pull, so 8 MiB answers, the store's
       byte cap) from queue offset 0 of a one-queue topic whose 64 KiB-body
       records fill the first commit-log file. The data is written
       beforehand by a `MessageStore` opened in this process on the broker's
       store directory (real records, which the broker recovers and serves),
       then made cold: fsync + `POSIX_FADV_DONTNEED` on every commit-log file,
       checked with mincore(2) (the share of the file's pages in the page cache);
   (a') the same drain again, now from the page cache: a control. What (a)
       costs beyond (a') is the disk; what (a') costs beyond (0) is CPU (the
       broker, pinned to one core, decodes and serialises 8 MiB answers);
   (b) while retention deletes those 1 GiB: the first file's mtime is set
       100 h into the past with os.utime and one pass is triggered with
       `BrokerAdmin.DeleteExpiredCommitLog` (or, if that RPC is missing, a
       periodic pass every 100 ms). The window runs from the call until it
       returns, and at least `min_delete_window_s`. The file is still in the
       page cache from (a'), so the kernel also frees 1 GiB of cached pages.
   A quick run (`--quick`) does the same with 64 MiB files and 64 MiB of data.
2. Sustained writes under retention: a broker with 64 MiB files, a
   fileReservedTime of 2 s, deleteWhen at every hour and a pass every 200 ms;
   4 concurrent `SendMessages` callers (batches of 16 x 16 KiB) write five
   times the volume retention allows. The disk use of the commit log (its
   directory plus the file allocated ahead) is sampled every 50 ms. Allowed:
   the file being written, the one allocated ahead, the closed files younger
   than fileReservedTime + one pass interval at the run's peak rate, and one
   being deleted. Throughput of the last fifth of the volume against the first.
   (`--quick`: 32 MiB files, fileReservedTime 0.5 s, a pass every 100 ms.)

The broker runs as a child process pinned to one core; the producer, the
consumer process (at nice 10, so its parsing does not delay the producer's
timing) and the sustained writers run on the other.

`python -m benchmarks.store_bench drain TARGET TOPIC QUEUES` is the consumer:
it prints one JSON line (monotonic start/end, messages, body bytes, pulls).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import mmap
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.broker_bench import _broker_args, _create_topic
from benchmarks.procs import ServerProcess, cpu_plan, pinned, pinning_note
from benchmarks.report import BenchResult, Figure, Target
from ferry import record
from ferry.runtime.clock import SystemClock
from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, broker_pb2
from services.broker.store import MessageIn, MessageStore, StoreConfig

TITLE = "store — a loop that never blocks; retention"

SEND_ONE_METHOD = "/ferry.v1.Broker/SendMessage"
SEND_METHOD = "/ferry.v1.Broker/SendMessages"
PULL_METHOD = "/ferry.v1.Broker/PullMessage"
LIVE_TOPIC = "Live"
LIVE_BODY = b"s" * 128
COLD_TOPIC = "Cold"
COLD_QUEUES = 1  # one pull loop, as one consumer of the topic
COLD_BODY = bytes(range(256)) * 256  # 64 KiB
COLD_BATCH = 16
PULL_NUMS = 1000
FLOOD_TOPIC = "Flood"
FLOOD_BODY = b"f" * (16 << 10)
FLOOD_BATCH = 16
FLOOD_CALLERS = 4
CALL_TIMEOUT_S = 30.0
EXPIRED_AGE_S = 100 * 3600.0
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


@dataclass(frozen=True)
class Plan:
    file_size: int  # commit-log files of the latency phase; the cold data fills one
    quiet_s: float  # each of the two quiet windows
    min_delete_window_s: float
    sustained_file_size: int
    reserved_s: float  # fileReservedTime of the sustained run
    clean_interval_s: float  # cleanResourceInterval of the sustained run
    warmup_s: float  # past fileReservedTime + cleanResourceInterval: retention is deleting
    timeout_s: float  # each phase


# The warm-up lasts until retention has been deleting for a while, so that the
# first fifth and the last both run in the steady state (a first fifth with no
# deletions yet would be faster for that reason alone).
FULL = Plan(1 << 30, 6.0, 1.0, 64 << 20, 2.0, 0.2, 5.0, 240.0)
QUICK = Plan(64 << 20, 1.5, 0.5, 32 << 20, 0.5, 0.1, 1.5, 60.0)


def _progress(text: str) -> None:
    print(f"  store: {text}", file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    result = BenchResult(TITLE)
    server_cpus, client_cpus = cpu_plan()
    result.notes.append(
        pinning_note(server_cpus, client_cpus, "The broker", "producer, consumer and writers")
    )
    started = time.monotonic()
    with pinned(client_cpus):
        result.figures += latency_under_io(workdir, plan, server_cpus, result.notes)
        result.figures += sustained_retention(workdir, plan, server_cpus)
    result.notes.append(f"The store benchmark took {time.monotonic() - started:.0f} s.")
    return result


# ---------------------------------------------------------------- page cache


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_share(path: Path) -> float:
    """The share of a file's pages in the page cache (mincore(2) on a mapping
    that is never touched, so asking does not read anything in)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0.0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in bytes(vec)) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(paths: Sequence[Path]) -> None:
    """Push files out of the page cache (fsync first: dirty pages stay)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _segments(store_dir: Path) -> list[Path]:
    return sorted(
        p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit() and len(p.name) == 20
    )


# ---------------------------------------------------------------- 1. latency under I/O


@dataclass(frozen=True)
class Stats:
    calls: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def text(self) -> str:
        return (
            f"{self.calls:,} calls, p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, "
            f"max {self.max_ms:.1f} ms"
        )


@dataclass(frozen=True)
class Drain:
    start: float
    end: float
    messages: int
    body_bytes: int
    pulls: int

    @property
    def mb_per_s(self) -> float:
        return self.body_bytes / (self.end - self.start) / 1e6


class Sender:
    """One producer: single SendMessage calls back to back, each recorded as
    (monotonic start, latency seconds, ok)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.samples: list[tuple[float, float, bool]] = []
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.target)
        call = self._channel.unary_unary(
            SEND_ONE_METHOD, response_deserializer=broker_pb2.SendResult.FromString
        )
        request = broker_pb2.SendMessageRequest(
            topic=LIVE_TOPIC, body=LIVE_BODY
        ).SerializeToString()
        first = await call(request, timeout=CALL_TIMEOUT_S)
        if first.status != broker_pb2.SEND_OK:
            raise RuntimeError(f"SendMessage answered {first}")
        self._task = asyncio.create_task(self._run(call, request))

    async def _run(self, call, request: bytes) -> None:
        monotonic, clock = time.monotonic, time.perf_counter
        while not self._stopping:
            t = monotonic()
            start = clock()
            try:
                ok = (await call(request, timeout=CALL_TIMEOUT_S)).status == broker_pb2.SEND_OK
            except grpc.aio.AioRpcError:
                ok = False
            self.samples.append((t, clock() - start, ok))
            if not ok:
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await self._task
        if self._channel is not None:
            await self._channel.close()

    def stats(self, *windows: tuple[float, float]) -> Stats:
        picked = [(lat, ok) for t, lat, ok in self.samples if any(a <= t < b for a, b in windows)]
        latencies = [lat for lat, ok in picked if ok]
        if len(latencies) < 2:
            raise RuntimeError(f"only {len(latencies)} sends in the windows {windows}")
        q = statistics.quantiles(latencies, n=100)
        return Stats(len(latencies), len(picked) - len(latencies), q[49] * 1e3, q[98] * 1e3,
                     max(latencies) * 1e3)  # fmt: skip


def fill_cold(store_dir: Path, plan: Plan) -> tuple[int, float]:
    """Write `COLD_TOPIC` records through the store's own `put`, round robin
    over its queues, until they fill the first commit-log file (the last batch
    starts the second), and close the store cleanly. Returns (messages, seconds)."""
    store = MessageStore(
        StoreConfig(root=store_dir, commit_log_file_size=plan.file_size), SystemClock()
    )
    store.open()
    message = MessageIn(body=COLD_BODY, properties=record.encode_properties({"TAGS": "cold"}))
    batch = [message] * COLD_BATCH

    async def go() -> int:
        await store.start()
        puts = 0
        next_report = 256 << 20
        try:
            while store.max_offset < plan.file_size:
                await store.put(COLD_TOPIC, puts % COLD_QUEUES, batch)
                puts += 1
                if store.max_offset >= next_report:
                    _progress(f"filled {_mib(store.max_offset)} of {_mib(plan.file_size)}")
                    next_report += 256 << 20
                await asyncio.sleep(0)  # let the dispatcher and flusher run
        finally:
            await store.stop()
        return puts * COLD_BATCH

    start = time.monotonic()
    messages = asyncio.run(go())
    return messages, time.monotonic() - start


def _has_delete_rpc() -> bool:
    service = broker_admin_pb2.DESCRIPTOR.services_by_name["BrokerAdmin"]
    return "DeleteExpiredCommitLog" in service.methods_by_name


async def run_drain(target: str, expected: int, timeout_s: float) -> Drain:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.store_bench", "drain", target, COLD_TOPIC,
        str(COLD_QUEUES), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the consumer exited with {proc.returncode}: {err.decode()[-2000:]}")
    found = json.loads(out.decode().strip().splitlines()[-1])
    drain = Drain(found["start"], found["end"], found["messages"], found["bytes"], found["pulls"])
    if drain.messages != expected:
        raise RuntimeError(f"the consumer got {drain.messages} messages, expected {expected}")
    return drain


async def _latency_phases(
    broker: ServerProcess, store_dir: Path, plan: Plan, expected: int, rpc: bool
) -> dict:
    sender = Sender(broker.target)
    await sender.start()
    cpu: list[tuple[float, float]] = []  # (monotonic, the broker's CPU seconds)

    async def sample_cpu() -> None:
        while True:
            cpu.append((time.monotonic(), broker.cpu_seconds()))
            await asyncio.sleep(0.1)

    sampling = asyncio.create_task(sample_cpu())
    out: dict = {}
    try:
        await asyncio.sleep(plan.warmup_s)
        t = time.monotonic()
        await asyncio.sleep(plan.quiet_s)
        quiet1 = (t, time.monotonic())

        segments = _segments(store_dir)
        cold_file = segments[0]
        await asyncio.to_thread(evict, segments)
        out["resident_evicted"] = await asyncio.to_thread(resident_share, cold_file)
        _progress(
            f"(a) draining {expected:,} cold messages; {out['resident_evicted']:.1%} of "
            f"{cold_file.name} in the page cache"
        )
        cold = await run_drain(broker.target, expected, plan.timeout_s)
        out["resident_drained"] = await asyncio.to_thread(resident_share, cold_file)
        _progress(f"(a') the same drain from the page cache ({out['resident_drained']:.1%} in)")
        warm = await run_drain(broker.target, expected, plan.timeout_s)

        resident_deleted = await asyncio.to_thread(resident_share, cold_file)
        size = cold_file.stat().st_size
        past = time.time() - EXPIRED_AGE_S
        _progress(f"(b) retention deletes {cold_file.name} ({_mib(size)})")
        t0 = time.monotonic()
        os.utime(cold_file, (past, past))
        if rpc:
            async with grpc.aio.insecure_channel(broker.target) as channel:
                answer = await broker_admin_pb2_grpc.BrokerAdminStub(
                    channel
                ).DeleteExpiredCommitLog(
                    broker_admin_pb2.DeleteExpiredCommitLogRequest(), timeout=plan.timeout_s
                )
            deleted = answer.deleted_files
        else:
            deadline = t0 + plan.timeout_s
            while cold_file.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no periodic pass deleted {cold_file}")
                await asyncio.sleep(0.005)
            deleted = 1
        t1 = time.monotonic()
        if deleted != 1 or cold_file.exists():
            raise RuntimeError(f"the pass deleted {deleted} files; {cold_file} exists: "
                               f"{cold_file.exists()}")  # fmt: skip
        delete_end = max(t1, t0 + plan.min_delete_window_s)
        await asyncio.sleep(max(0.0, delete_end - time.monotonic()))

        t = time.monotonic()
        await asyncio.sleep(plan.quiet_s)
        quiet2 = (t, time.monotonic())
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        await sender.stop()

    def cpu_share(a: float, b: float) -> float:
        inside = [(t, c) for t, c in cpu if a <= t <= b]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    out.update(
        cpu={
            "quiet": cpu_share(*quiet1),
            "cold": cpu_share(cold.start, cold.end),
            "warm": cpu_share(warm.start, warm.end),
            "delete": cpu_share(t0, delete_end),
        },
        quiet=sender.stats(quiet1, quiet2),
        cold=sender.stats((cold.start, cold.end)),
        warm=sender.stats((warm.start, warm.end)),
        delete=sender.stats((t0, delete_end)),
        cold_drain=cold,
        warm_drain=warm,
        delete_call_s=t1 - t0,
        deleted_bytes=size,
        resident_deleted=resident_deleted,
    )
    return out


def latency_under_io(
    workdir: Path, plan: Plan, server_cpus: set[int] | None, notes: list[str]
) -> list[Figure]:
    store_dir = workdir / "latency"
    size = _mib(plan.file_size)
    _progress(f"writing {size} of 64 KiB-body records in-process")
    expected, fill_s = fill_cold(store_dir, plan)
    rpc = _has_delete_rpc()
    if rpc:
        # No periodic pass may delete on its own meanwhile: the pass is ours.
        options = [f"deleteWhen={(time.localtime().tm_hour + 12) % 24:02d}"]
    else:
        options = [f"deleteWhen={ALL_HOURS}", "cleanResourceInterval=100"]
    broker = ServerProcess(
        "services.broker",
        _broker_args(store_dir, *options, file_size=plan.file_size),
        workdir,
        "broker-latency",
        server_cpus,
        ready_timeout_s=120,
    )
    try:
        with broker:
            _create_topic(broker.target, COLD_TOPIC, COLD_QUEUES)
            _create_topic(broker.target, LIVE_TOPIC, 1)
            r = asyncio.run(
                asyncio.wait_for(
                    _latency_phases(broker, store_dir, plan, expected, rpc), 4 * plan.timeout_s
                )
            )
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    quiet, cold, warm, delete = r["quiet"], r["cold"], r["warm"], r["delete"]
    bad = {k: s.errors for k, s in (("quiet", quiet), ("a", cold), ("b", delete)) if s.errors}
    if bad or warm.errors:
        raise RuntimeError(f"sends failed: {bad}, warm drain {warm.errors}")
    cd, wd = r["cold_drain"], r["warm_drain"]
    trigger = (
        "`DeleteExpiredCommitLog`" if rpc else "a periodic pass (cleanResourceInterval=100 ms)"
    )
    notes.append(
        f"Latency phase: commit-log files of {size}"
        + (" (the default mappedFileSizeCommitLog)" if plan.file_size == 1 << 30 else "")
        + f"; the cold topic holds {expected:,} records of 64 KiB "
        f"({_mib(expected * len(COLD_BODY))} of bodies) written in {fill_s:.1f} s by a "
        f"MessageStore opened in this process before the broker started. (0) pools two "
        f"quiet windows of {plan.quiet_s:g} s: {quiet.text()}."
    )
    return [
        _against_quiet(
            f"SendMessage p99 while a consumer drains {size} of cold data (a)",
            cold.p99_ms,
            quiet.p99_ms,
            target=Target("ratio", "<=", 2.0),
            detail=f"(a): {cold.text()}; (0): {quiet.text()}. Page cache before the drain: "
            f"{r['resident_evicted']:.1%} of the first file (mincore), after it "
            f"{r['resident_drained']:.1%}. The drain: {cd.messages:,} messages in "
            f"{cd.pulls:,} pulls, {cd.end - cd.start:.1f} s, {cd.mb_per_s:.0f} MB/s, "
            f"{(cd.end - cd.start) / cd.pulls * 1e3:.0f} ms per pull. Broker CPU (one core): "
            f"{r['cpu']['cold']:.0%} during the drain, {r['cpu']['quiet']:.0%} in the first "
            "quiet window.",
        ),
        _against_quiet("SendMessage p50 while the cold drain runs (a)", cold.p50_ms, quiet.p50_ms),
        _against_quiet(
            "SendMessage p99 while the same drain reads the page cache (a', control)",
            warm.p99_ms,
            quiet.p99_ms,
            detail=f"{warm.text()}. The drain: {wd.end - wd.start:.1f} s, "
            f"{wd.mb_per_s:.0f} MB/s, broker CPU {r['cpu']['warm']:.0%}. (a) beyond (a') is the disk; (a') beyond (0) is the "
            "broker's one core decoding and serialising 8 MiB answers.",
        ),
        _against_quiet(
            f"SendMessage p99 while retention deletes {_mib(r['deleted_bytes'])} (b)",
            delete.p99_ms,
            quiet.p99_ms,
            target=Target("ratio", "<=", 2.0),
            detail=f"(b): {delete.text()}. One pass by {trigger} took "
            f"{r['delete_call_s'] * 1e3:.0f} ms (unlink and close in a worker thread), broker CPU "
            f"{r['cpu']['delete']:.0%}; the "
            f"window is the call and at least {plan.min_delete_window_s:g} s from its start. "
            f"The file was {r['resident_deleted']:.0%} in the page cache (just drained), so "
            "the kernel also dropped its cached pages.",
        ),
        _against_quiet("SendMessage p50 while retention deletes (b)", delete.p50_ms, quiet.p50_ms),
    ]


def _against_quiet(
    name: str, value_ms: float, quiet_ms: float, target: Target | None = None, detail: str = ""
) -> Figure:
    """A SendMessage latency figure against the same percentile over the quiet windows (0)."""
    return Figure(
        name=name,
        value=value_ms,
        unit="ms",
        baseline=quiet_ms,
        baseline_label="no other load (0)",
        target=target,
        detail=detail,
    )


# ---------------------------------------------------------------- 2. sustained retention


def commit_log_disk_bytes(store_dir: Path) -> int:
    """Blocks held by the commit log's files and the file allocated ahead."""
    total = 0
    for directory, keep in (
        (store_dir / "commitlog", lambda name: True),
        (store_dir, lambda name: name.startswith(".commitlog")),
    ):
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if not keep(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted meanwhile
            total += st.st_blocks * 512
    return total


def allowed_files(plan: Plan, rate: float) -> int:
    """What the retention settings keep at `rate` bytes/s: the file being
    written, the one allocated ahead, the closed files younger than
    fileReservedTime + one pass interval, and one being deleted."""
    young = math.ceil((plan.reserved_s + plan.clean_interval_s) * rate / plan.sustained_file_size)
    return 2 + young + 1


async def _flood(target: str, store_dir: Path, plan: Plan) -> dict:
    requests = [
        broker_pb2.SendMessagesRequest(
            topic=FLOOD_TOPIC,
            queue_id=i,
            messages=[broker_pb2.SendEntry(body=FLOOD_BODY) for _ in range(FLOOD_BATCH)],
        ).SerializeToString()
        for i in range(FLOOD_CALLERS)
    ]
    per_call = FLOOD_BATCH * len(FLOOD_BODY)
    written = 0
    goal: int | None = None
    done = False
    completions: list[tuple[float, int]] = []
    disk: list[tuple[float, int]] = []

    async def sampler() -> None:
        while not done:
            disk.append((time.monotonic(), commit_log_disk_bytes(store_dir)))
            await asyncio.sleep(0.05)

    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            SEND_METHOD, response_deserializer=broker_pb2.SendResult.FromString
        )

        async def writer(request: bytes) -> None:
            nonlocal written
            while not done and (goal is None or written < goal):
                answer = await call(request, timeout=CALL_TIMEOUT_S)
                if answer.status != broker_pb2.SEND_OK:
                    raise RuntimeError(f"SendMessages answered {answer}")
                written += per_call
                completions.append((time.monotonic(), written))

        sampling = asyncio.create_task(sampler())
        t_start = time.monotonic()
        writers = [asyncio.create_task(writer(r)) for r in requests]
        try:
            await asyncio.sleep(plan.warmup_s)
            warm_bytes, warm_s = written, time.monotonic() - t_start
            estimate = allowed_files(plan, 1.25 * warm_bytes / warm_s) * plan.sustained_file_size
            goal = warm_bytes + 5 * estimate
            _progress(
                f"sustained: {warm_bytes / warm_s / 1e6:.0f} MB/s in the warm-up; writing "
                f"{_mib(5 * estimate)} more (5x an estimated allowance of {_mib(estimate)})"
            )
            waiting = asyncio.gather(*writers)
            deadline = time.monotonic() + plan.timeout_s
            next_report = warm_bytes + estimate
            while not waiting.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"wrote {_mib(written)} of {_mib(goal)} in time")
                if written >= next_report:
                    _progress(f"sustained: {_mib(written - warm_bytes)} written, commit log "
                              f"on disk {_mib(disk[-1][1])}")  # fmt: skip
                    next_report += estimate
                await asyncio.sleep(0.05)
            await waiting
        finally:
            done = True
            for task in writers:
                task.cancel()
            await asyncio.gather(*writers, sampling, return_exceptions=True)
    return {
        "warm_bytes": warm_bytes,
        "goal": goal,
        "written": written,
        "completions": completions,
        "disk": disk,
    }


def _fifths(completions: list[tuple[float, int]], start_bytes: int, end_bytes: int) -> list:
    """(start time, end time, bytes) of each fifth of the volume after `start_bytes`."""
    marks = [start_bytes + (end_bytes - start_bytes) * k // 5 for k in range(6)]
    times: list[float] = []
    byte_marks: list[int] = []
    i = 0
    for mark in marks:
        while completions[i][1] < mark:
            i += 1
        times.append(completions[i][0])
        byte_marks.append(completions[i][1])
    return [(times[k], times[k + 1], byte_marks[k + 1] - byte_marks[k]) for k in range(5)]


def sustained_retention(workdir: Path, plan: Plan, server_cpus: set[int] | None) -> list[Figure]:
    store_dir = workdir / "sustained"
    hours = f"{plan.reserved_s / 3600:.9f}"
    broker = ServerProcess(
        "services.broker",
        _broker_args(
            store_dir,
            f"fileReservedTime={hours}",
            f"deleteWhen={ALL_HOURS}",
            f"cleanResourceInterval={plan.clean_interval_s * 1000:.0f}",
            file_size=plan.sustained_file_size,
        ),
        workdir,
        "broker-sustained",
        server_cpus,
    )
    try:
        with broker:
            _create_topic(broker.target, FLOOD_TOPIC, FLOOD_CALLERS)
            r = asyncio.run(_flood(broker.target, store_dir, plan))
            queue_bytes = sum(
                p.stat().st_blocks * 512
                for p in (store_dir / "consumequeue").rglob("*")
                if p.is_file()
            )
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    fifths = _fifths(r["completions"], r["warm_bytes"], r["goal"])
    rates = [b / (t1 - t0) / 1e6 for t0, t1, b in fifths]
    peak = max(rates) * 1e6
    allowed = allowed_files(plan, peak) * plan.sustained_file_size
    disk = r["disk"]
    max_disk = max(d for _, d in disk)
    after_warm = [d for t, d in disk if t >= fifths[0][0]]

    def max_in(k: int) -> int:
        t0, t1, _ = fifths[k]
        return max((d for t, d in disk if t0 <= t < t1), default=0)

    counted = r["goal"] - r["warm_bytes"]
    setting = (
        f"{_mib(plan.sustained_file_size)} files, fileReservedTime {plan.reserved_s:g} s, "
        f"deleteWhen every hour, cleanResourceInterval {plan.clean_interval_s * 1e3:.0f} ms"
    )
    return [
        Figure(
            name=f"Sustained writes under retention: max commit-log disk use ({setting})",
            value=max_disk / 2**20,
            unit="MiB",
            baseline=allowed / 2**20,
            baseline_label=f"allowed: {allowed_files(plan, peak)} files at the peak rate",
            target=Target("ratio", "<=", 1.0),
            detail=f"{_mib(r['written'])} written in all ({_mib(counted)} after the "
            f"{plan.warmup_s:g} s warm-up, {counted / allowed:.1f}x the allowance), "
            f"{len(disk):,} samples every 50 ms. Max disk use in the first fifth "
            f"{_mib(max_in(0))}, in the last {_mib(max_in(4))}; mean after the warm-up "
            f"{_mib(statistics.fmean(after_warm))}. Consume queues at the end: "
            f"{_mib(queue_bytes)} (not counted). Retention deletes one file per "
            f"deleteCommitLogFilesInterval (100 ms) at most: "
            f"{plan.sustained_file_size / 0.1 / 1e6:,.0f} MB/s with these files.",
        ),
        Figure(
            name="Sustained writes under retention: throughput of the last fifth",
            value=rates[-1],
            unit="MB/s",
            baseline=rates[0],
            baseline_label="the first fifth",
            target=Target("ratio", ">=", 0.9),
            detail=f"{FLOOD_CALLERS} SendMessages callers, batches of {FLOOD_BATCH} x "
            f"{len(FLOOD_BODY) >> 10} KiB; MB/s of bodies per fifth: "
            + ", ".join(f"{x:.0f}" for x in rates)
            + ".",
        ),
    ]


# ---------------------------------------------------------------- the consumer process


async def _drain(target: str, topic: str, queues: int) -> dict:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        pull = channel.unary_unary(
            PULL_METHOD,
            request_serializer=broker_pb2.PullMessageRequest.SerializeToString,
            response_deserializer=broker_pb2.PullMessageResponse.FromString,
        )
        await asyncio.wait_for(channel.channel_ready(), CALL_TIMEOUT_S)

        async def one(queue: int) -> tuple[int, int, int]:
            offset = messages = body_bytes = pulls = 0
            while True:
                answer = await pull(
                    broker_pb2.PullMessageRequest(
                        consumer_group="store-bench",
                        topic=topic,
                        queue_id=queue,
                        queue_offset=offset,
                        max_msg_nums=PULL_NUMS,
                    ),  # fmt: skip
                    timeout=CALL_TIMEOUT_S,
                )
                pulls += 1
                if answer.status != broker_pb2.FOUND:
                    if answer.status != broker_pb2.NO_NEW_MSG:
                        raise RuntimeError(f"queue {queue} at {offset}: status {answer.status}")
                    return messages, body_bytes, pulls
                messages += len(answer.messages)
                body_bytes += sum(len(m.body) for m in answer.messages)
                offset = answer.next_begin_offset

        start = time.monotonic()
        parts = await asyncio.gather(*(one(q) for q in range(queues)))
        end = time.monotonic()
    return {
        "start": start,
        "end": end,
        "messages": sum(p[0] for p in parts),
        "bytes": sum(p[1] for p in parts),
        "pulls": sum(p[2] for p in parts),
    }


def _drain_main(argv: list[str]) -> int:
    target, topic, queues = argv
    os.nice(10)
    print(json.dumps(asyncio.run(_drain(target, topic, int(queues)))), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["drain"]:
        raise SystemExit("usage: python -m benchmarks.store_bench drain TARGET TOPIC QUEUES")
    raise SystemExit(_drain_main(sys.argv[2:]))
