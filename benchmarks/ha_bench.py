"""HA benchmarks (issue #4): master→slave replication over the real HA port,
every figure next to a baseline measured in the same run.

1. Replication throughput: an empty slave (the master has `haSyncFrom=minOffset`) copies a
   master's 1 GiB commit log (one 1 GiB file of records with 1 KiB bodies),
   once with 32 KiB frames (`haTransferBatchSize`, the default) and once with
   1 MiB frames. Timed from the first byte the slave reports to its last,
   polling the slave's own commit-log end. Baseline: a raw Python transfer of
   the same file over loopback TCP (`os.sendfile` into the socket; the receiver,
   another process, `recv_into` + `pwrite` into a preallocated file), the least
   any replication in Python can do.
2. SYNC_MASTER vs ASYNC_MASTER send throughput, 128-byte bodies: 16 concurrent
   `SendMessage` senders, and 16 concurrent callers of `SendMessages` with
   batches of 64. Both pairs (master + slave) run at once and the rounds
   alternate, so noise hits both alike. Every answer is parsed: anything but
   SEND_OK counts as an error and fails the benchmark.
3. Send latency p50/p99, 1 caller, SYNC against ASYNC in the same run.
   Then `SendStream` on the SYNC_MASTER (issue #15), every answer parsed:
   16 raw streams with one message in flight each, set against Redis
   (`redis_peer`: a primary and a replica, XADD + WAIT 1 from 16 clients) and
   against grpc.aio's own floor for that shape (`empty_server`'s Echo: answers
   at once, stores nothing); 16 PipelinedProducers (`send_async`, 256 in
   flight each, no linger, routed by a name server) against the batches of
   64; raw streams pipelining 256 each, one message per write (the worst
   case) and 16 per write; one producer with one message in flight (p50,
   against the unary p50).
4. Catch-up: a slave holding the master's first 128 MiB file starts while the
   master has 1 GiB more (eight more files); default settings (32 KiB frames).

Masters are pinned to one core, slaves (and the load generator) to the other.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks import redis_peer
from benchmarks.broker_bench import _broker_args, _create_topic, _summary
from benchmarks.empty_server import ECHO_METHOD
from benchmarks.load import LoadResult, closed_loop, producer_closed_loop, stream_closed_loop
from benchmarks.procs import (
    ServerProcess,
    cpu_plan,
    free_port,
    namesrv_process,
    pinned,
    pinning_note,
    wait_for_route,
)
from benchmarks.report import BenchResult, Figure, Target
from ferry.client.namesrv import NamesrvClient
from ferry.client.producer import PipelinedProducer
from ferry.model import TopicConfig
from ferry.runtime.clock import SystemClock
from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, broker_pb2
from services.broker.metadata.tables import BrokerMetadata
from services.broker.store import MessageIn, MessageStore, StoreConfig

TITLE = "ha — master→slave replication"

SEND_BODY = b"s" * 128
REPL_BODY = b"r" * 1024
BATCH = 64
SEND_ONE = "/ferry.v1.Broker/SendMessage"
FRESH_WAIT_S = 5.0
SEND_BATCH = "/ferry.v1.Broker/SendMessages"


@dataclass(frozen=True)
class Plan:
    rounds: int
    warmup_s: float
    duration_s: float
    repl_bytes: int  # the log an empty slave copies (figure 1)
    catchup_file: int  # file size of the catch-up master (figure 4)
    catchup_bytes: int  # how far behind the catch-up slave starts


FULL = Plan(3, 1.0, 5.0, 1 << 30, 128 << 20, 1 << 30)
QUICK = Plan(1, 0.3, 1.0, 64 << 20, 16 << 20, 64 << 20)


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    result = BenchResult(TITLE)
    server_cpus, client_cpus = cpu_plan()
    result.notes.append(
        pinning_note(server_cpus, client_cpus, "Masters", "slaves and the load generator")
    )
    result.notes.append(
        "This VM (virtio-balloon with free-page reporting) hands freed RAM back to the host "
        "after a few seconds, and the first write to such a page runs at ~200-250 MB/s instead "
        "of ~2-5 GB/s. A copy into new page cache is bounded by that, whoever makes it. So "
        f"every timed copy, raw or replicated, starts {FRESH_WAIT_S:g} s after the previous "
        "copy was deleted (its pages handed back): both sides write into fresh pages, as a "
        "new slave does. A raw copy started at once after the previous one (recycled pages) "
        "reaches ~1.4-2.2 GB/s here."
    )
    result.figures += replication_throughput(workdir, plan, server_cpus, client_cpus)
    result.figures += sync_vs_async(workdir, plan, server_cpus, client_cpus)
    result.figures.append(catch_up(workdir, plan, server_cpus, client_cpus))
    return result


# ---------------------------------------------------------------- helpers


def touch_memory(nbytes: int) -> float:
    """Write `nbytes` of anonymous memory once, then free it; returns seconds."""
    import mmap

    start = time.perf_counter()
    chunk = b"\1" * (8 << 20)
    with mmap.mmap(-1, nbytes) as m:
        for _ in range(nbytes // len(chunk)):
            m.write(chunk)
    return time.perf_counter() - start


def _fill(store_dir: Path, nbytes: int, file_size: int) -> int:
    """Write at least `nbytes` of 1 KiB-body records over 4 queues of topic
    `Repl` and close the store cleanly; returns the commit log's end."""
    store = MessageStore(
        StoreConfig(root=store_dir, commit_log_file_size=file_size, preallocate=True),
        SystemClock(),
    )
    store.open()
    BrokerMetadata.open(store_dir / "config", SystemClock()).topics.put(
        TopicConfig("Repl", 4, 4, 6)
    )
    batch = [MessageIn(body=REPL_BODY, properties=b"")] * 256
    queue = 0
    while store.max_offset < nbytes:
        store._append("Repl", queue % 4, batch)
        store.dispatcher.dispatch_all()
        queue += 1
    end = store.max_offset
    asyncio.run(store.stop())
    return end


def _max_offset(stub) -> int:
    return stub.GetBrokerRuntimeInfo(
        broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=10
    ).commit_log_max_offset


def _watch_until(target: str, start_offset: int, end: int, timeout_s: float) -> tuple[float, int]:
    """Poll a broker's commit-log end every 10 ms until it reaches `end`.
    Returns (seconds from the first poll that saw it past `start_offset` to
    the first that saw `end`, the offset seen at that first poll)."""
    with grpc.insecure_channel(target) as channel:
        stub = broker_admin_pb2_grpc.BrokerAdminStub(channel)
        deadline = time.monotonic() + timeout_s
        t0 = o0 = None
        while time.monotonic() < deadline:
            offset = _max_offset(stub)
            now = time.perf_counter()
            if t0 is None and offset > start_offset:
                t0, o0 = now, offset
            if offset >= end:
                assert t0 is not None and o0 is not None
                return now - t0, o0
            time.sleep(0.01)
    raise RuntimeError(f"{target} did not reach offset {end} within {timeout_s:.0f} s")


_RECEIVER = r"""
import json, os, socket, sys, time
out, size, port_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = socket.create_server(("127.0.0.1", 0))
open(port_file + ".tmp", "w").write(str(server.getsockname()[1]))
os.replace(port_file + ".tmp", port_file)
conn, _ = server.accept()
fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.posix_fallocate(fd, 0, size)
buf = bytearray(1 << 20)
view = memoryview(buf)
pos = 0
t0 = None
while pos < size:
    n = conn.recv_into(view)
    if not n:
        break
    if t0 is None:
        t0 = time.perf_counter()
    os.pwrite(fd, view[:n], pos)
    pos += n
print(json.dumps({"bytes": pos, "seconds": time.perf_counter() - t0}))
"""


def _raw_transfer(source: Path, size: int, out: Path, sender_cpus, receiver_cpus) -> float:
    """Bytes/s of a raw sendfile→socket→pwrite copy of `source` (another process receives)."""
    port_file = out.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER, str(out), str(size), str(port_file)],
        stdout=subprocess.PIPE,
    )
    try:
        if receiver_cpus is not None:
            os.sched_setaffinity(receiver.pid, receiver_cpus)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if time.monotonic() > deadline or receiver.poll() is not None:
                raise RuntimeError("the raw receiver did not start")
            time.sleep(0.01)
        port = int(port_file.read_text())
        with (
            pinned(sender_cpus),
            socket.create_connection(("127.0.0.1", port)) as sock,
            open(source, "rb") as f,
        ):
            offset = 0
            while offset < size:
                count = min(1 << 20, size - offset)
                offset += os.sendfile(sock.fileno(), f.fileno(), offset, count)
        stdout, _ = receiver.communicate(timeout=120)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    got = json.loads(stdout)
    if got["bytes"] != size:
        raise RuntimeError(f"raw transfer moved {got['bytes']} of {size} bytes")
    out.unlink()
    return size / got["seconds"]


def _master(store: Path, workdir: Path, name: str, cpus, *options: str, file_size: int):
    ha_port = free_port()
    proc = ServerProcess(
        "services.broker",
        _broker_args(store, f"haListenPort={ha_port}", f"brokerName={name}", *options,
                     file_size=file_size),
        workdir, name, cpus, 120,
    )  # fmt: skip
    return proc, ha_port


def _slave(store: Path, workdir: Path, name: str, cpus, ha_port: int, *options: str, file_size):
    return ServerProcess(
        "services.broker",
        _broker_args(store, "brokerRole=SLAVE", "brokerId=1", f"brokerName={name}",
                     f"haMasterAddress=127.0.0.1:{ha_port}", "haListenPort=0",
                     "haReconnectInterval=200", *options, file_size=file_size),
        workdir, f"{name}-slave", cpus, 120,
    )  # fmt: skip


# ---------------------------------------------------------------- 1. throughput


def replication_throughput(workdir: Path, plan: Plan, master_cpus, slave_cpus) -> list[Figure]:
    file_size = max(plan.repl_bytes + (16 << 20), 1 << 30)
    store = workdir / "repl-master"
    start = time.perf_counter()
    end = _fill(store, plan.repl_bytes, file_size)
    fill_s = time.perf_counter() - start
    source = store / "commitlog" / f"{0:020d}"

    os.sync()  # the fill's dirty pages are written back before anything is timed
    # Warm the page cache the same way for both: read the file once.
    with open(source, "rb") as f:
        while f.read(8 << 20):
            pass
    raw = []
    for _ in range(plan.rounds):
        time.sleep(FRESH_WAIT_S)
        raw.append(_raw_transfer(source, end, workdir / "raw-copy", master_cpus, slave_cpus))
    figures = []
    master, ha_port = _master(store, workdir, "repl", master_cpus, "brokerRole=ASYNC_MASTER",
                              file_size=file_size)  # fmt: skip
    with pinned(slave_cpus), master:
        for frame in (32 << 10, 1 << 20):
            rates = []
            for i in range(plan.rounds):
                # The frame size is the master's; restart it with each setting.
                master.stop()
                master.args = _broker_args(
                    store, f"haListenPort={ha_port}", "brokerName=repl", "brokerRole=ASYNC_MASTER",
                    f"haTransferBatchSize={frame}", "haSyncFrom=minOffset", file_size=file_size,
                )  # fmt: skip
                master.start()
                slave_store = workdir / f"repl-slave-{frame}-{i}"
                slave = _slave(slave_store, workdir, "repl", slave_cpus, ha_port,
                               file_size=file_size)  # fmt: skip
                time.sleep(FRESH_WAIT_S)
                with slave:
                    seconds, first = _watch_until(slave.target, 0, end, 300)
                shutil.rmtree(slave_store)
                rates.append((end - first) / seconds)
            label = f"{frame >> 10} KiB" if frame < (1 << 20) else f"{frame >> 20} MiB"
            figures.append(
                Figure(
                    name=f"Replication of a {end / 2**30:.2f} GiB log, {label} frames",
                    value=statistics.median(rates) / 1e6,
                    unit="MB/s",
                    baseline=statistics.median(raw) / 1e6,
                    baseline_label="raw sendfile→socket→pwrite of the same file",
                    target=Target("ratio", ">=", 0.5) if frame == 1 << 20 else None,
                    detail=f"{plan.rounds} runs, median; slave MB/s "
                    + ", ".join(f"{r / 1e6:,.0f}" for r in rates)
                    + "; raw MB/s "
                    + ", ".join(f"{r / 1e6:,.0f}" for r in raw)
                    + f". 1 KiB bodies; the slave appends, reports every frame and builds its "
                    f"consume queues meanwhile. Filling the master took {fill_s:.1f} s."
                    + ("" if frame == 1 << 20 else " No target (the default frame size)."),
                )
            )
    shutil.rmtree(store)
    return figures


# ---------------------------------------------------------------- 2–3. sync vs async


def _send_ok(answer: bytes) -> bool:
    return broker_pb2.SendResult.FromString(answer).status == broker_pb2.SEND_OK


def _alternate(targets: dict[str, str], method: str, request: bytes, concurrency: int,
               plan: Plan, cpu: dict) -> dict[str, list[LoadResult]]:  # fmt: skip
    async def go():
        out: dict[str, list[LoadResult]] = {k: [] for k in targets}
        for _ in range(plan.rounds):
            for key, target in targets.items():
                out[key].append(
                    await closed_loop(
                        target,
                        method,
                        [request],
                        concurrency,
                        plan.warmup_s,
                        plan.duration_s,
                        server_cpu_seconds=cpu[key],
                        answer_ok=_send_ok,
                    )  # fmt: skip
                )
        return out

    results = asyncio.run(go())
    failed = sum(r.errors for rs in results.values() for r in rs)
    if failed:
        raise RuntimeError(f"{failed} sends failed or were not SEND_OK")
    return results


STREAM = "/ferry.v1.Broker/SendStream"
# (producers, messages in flight each, messages per write) for SendStream: one at
# a time, pipelined one message per write, pipelined 16 per write, alone.
STREAM_SHAPES = {
    "one_each": (16, 1, 1),
    "piped": (16, 256, 1),
    "piped16": (16, 256, 16),
    "alone": (1, 1, 1),
}


def _stream_results(answer: bytes) -> tuple[int, int]:
    results = broker_pb2.SendStreamResponse.FromString(answer).results
    bad = sum(1 for r in results if r.result.status != broker_pb2.SEND_OK)
    return len(results), bad


def _streams(
    target: str, producers: int, in_flight: int, per_write: int, plan: Plan, cpu, method=STREAM
) -> list[LoadResult]:
    request = broker_pb2.SendStreamRequest(
        messages=[broker_pb2.StreamedMessage(sequence=1, topic="Bench", body=SEND_BODY)] * per_write
    ).SerializeToString()
    results = [
        asyncio.run(
            stream_closed_loop(
                target,
                method,
                request,
                producers,
                in_flight,
                plan.warmup_s,
                plan.duration_s,
                _stream_results,
                server_cpu_seconds=cpu,
                per_write=per_write,
            )
        )  # fmt: skip
        for _ in range(plan.rounds)
    ]
    failed = sum(r.errors for r in results)
    if failed:
        raise RuntimeError(f"{failed} streamed sends were not SEND_OK")
    return results


def _producers(namesrv: str, plan: Plan, cpu) -> list[LoadResult]:
    """16 PipelinedProducers through the name server's route, no linger."""

    def new() -> PipelinedProducer:
        return PipelinedProducer(NamesrvClient([namesrv]), max_in_flight=256, linger_ms=0)

    results = [
        producer_closed_loop(new, "Bench", SEND_BODY, 16, 256, plan.warmup_s, plan.duration_s, cpu)
        for _ in range(plan.rounds)
    ]
    failed = sum(r.errors for r in results)
    if failed:
        raise RuntimeError(f"{failed} producer sends failed")
    return results


def sync_vs_async(workdir: Path, plan: Plan, master_cpus, slave_cpus) -> list[Figure]:
    pairs = {}
    namesrv = namesrv_process(workdir, master_cpus)
    namesrv.start()
    for role in ("SYNC_MASTER", "ASYNC_MASTER"):
        name = role.split("_")[0].lower()
        register = [f"namesrvAddr={namesrv.remoting_target}"] if role == "SYNC_MASTER" else []
        master, ha_port = _master(workdir / f"{name}-m", workdir, name, master_cpus,
                                  f"brokerRole={role}", *register, file_size=1 << 30)  # fmt: skip
        slave = _slave(workdir / f"{name}-s", workdir, name, slave_cpus, ha_port,
                       file_size=1 << 30)  # fmt: skip
        pairs[role] = (master, slave)
    try:
        for master, slave in pairs.values():
            master.start()
            slave.start()
            _create_topic(master.target, "Bench")
        wait_for_route(namesrv.target, "Bench")
        _wait_in_sync(pairs["SYNC_MASTER"][0].target)
        targets = {role: m.target for role, (m, _) in pairs.items()}
        cpu = {role: m.cpu_seconds for role, (m, _) in pairs.items()}
        with pinned(slave_cpus):
            one = broker_pb2.SendMessageRequest(topic="Bench", body=SEND_BODY).SerializeToString()
            batch = broker_pb2.SendMessagesRequest(
                topic="Bench", messages=[broker_pb2.SendEntry(body=SEND_BODY)] * BATCH
            ).SerializeToString()
            singles = _alternate(targets, SEND_ONE, one, 16, plan, cpu)
            batches = _alternate(targets, SEND_BATCH, batch, 16, plan, cpu)
            latency = _alternate(targets, SEND_ONE, one, 1, plan, cpu)
            sync = pairs["SYNC_MASTER"][0]
            streams = {
                shape: _streams(sync.target, *sizes, plan, sync.cpu_seconds)
                for shape, sizes in STREAM_SHAPES.items()
            }
            producers = _producers(namesrv.target, plan, sync.cpu_seconds)
    finally:
        for master, slave in pairs.values():
            slave.stop()
            master.stop()
        namesrv.stop()
    # grpc.aio's floor for the one-in-flight shape: a server that stores nothing.
    echo = ServerProcess("benchmarks.empty_server", [], workdir, "echo", master_cpus)
    with pinned(slave_cpus), echo:
        floor = _streams(
            echo.target, *STREAM_SHAPES["one_each"], plan, echo.cpu_seconds, ECHO_METHOD
        )
    with (
        pinned(slave_cpus),
        redis_peer.primary_and_replica(workdir, master_cpus, slave_cpus) as port,
    ):
        redis = [
            asyncio.run(redis_peer.xadd_wait(port, 16, SEND_BODY, plan.warmup_s, plan.duration_s))
            for _ in range(plan.rounds)
        ]
    if sum(r.errors for r in redis):
        raise RuntimeError("Redis answered a WAIT 1 with no replica")

    def med(results: list[LoadResult], scale: int = 1) -> float:
        return statistics.median(r.rate for r in results) * scale

    s, a = "SYNC_MASTER", "ASYNC_MASTER"
    one_each, piped, piped16, alone = (streams[k] for k in STREAM_SHAPES)
    p50 = statistics.median(r.p50_ms for r in alone)
    unary_p50 = statistics.median(r.p50_ms for r in latency[s])

    def vs_batches(name: str, results, target: Target | None, detail: str) -> Figure:
        return Figure(
            name=name,
            value=med(results),
            unit="msgs/s",
            baseline=med(batches[s], BATCH),
            baseline_label="SendMessages, batches of 64, 16 callers, SYNC_MASTER, same run",
            target=target,
            detail=detail,
        )

    stream_figures = [
        Figure(
            name="SendStream, 16 producers, one message in flight each, SYNC_MASTER",
            value=med(one_each),
            unit="msgs/s",
            baseline=med(redis),
            baseline_label="Redis XADD + WAIT 1 from 16 clients, a primary and a replica, same run",
            target=Target("ratio", ">=", 1.0),
            detail=f"{_summary(one_each)}. Redis (benchmarks/redis_peer.py; primary on the "
            f"master's core, replica on the slave's): {_summary(redis)}. Unary SendMessage from "
            f"16 senders in the same run: {med(singles[s]):,.0f} msgs/s. The floor of this "
            f"shape in grpc.aio, a server that answers each message at once and stores nothing "
            f"(benchmarks.empty_server Echo, same cores, same client): {_summary(floor)}.",
        ),
        vs_batches(
            "PipelinedProducer, 16 producers (send_async, up to 256 in flight each, "
            "no linger), SYNC_MASTER",
            producers,
            Target("ratio", ">=", 0.5),
            "ferry.client.producer.PipelinedProducer, routed by the name server, each "
            "fed by its own thread keeping 256 messages unanswered; latency sampled every 16th "
            f"message. {_summary(producers)}. server CPU is the master's: below 100% the "
            "producers' process (one core, shared with the slave) is the limit.",
        ),
        vs_batches(
            "SendStream, 16 producers pipelining (up to 256 in flight each), "
            "one message per write, SYNC_MASTER",
            piped,
            None,
            f"The worst case of pipelining: a producer that never has two messages to "
            f"write at once (raw streams, no producer). {_summary(piped)}.",
        ),
        vs_batches(
            "SendStream, 16 producers pipelining, 16 messages per write, SYNC_MASTER",
            piped16,
            None,
            "What a pipelining producer writes when messages queue up behind a write "
            "in progress (raw streams); each message still staged and answered on its own. "
            f"{_summary(piped16)}.",
        ),
        Figure(
            name="SendStream latency p50, one producer, one message in flight, SYNC_MASTER",
            value=p50,
            unit="ms",
            baseline=unary_p50,
            baseline_label="unary SendMessage p50, 1 caller, SYNC_MASTER, same run",
            target=Target("value", "<=", 0.8),
            detail=f"{_summary(alone)}. Also to be below the unary p50: "
            f"{'yes' if p50 < unary_p50 else 'no'} ({p50:.2f} against {unary_p50:.2f} ms).",
        ),
    ]
    return stream_figures + [
        Figure(
            name="SendMessage, 16 concurrent senders, SYNC_MASTER",
            value=med(singles[s]),
            unit="msgs/s",
            baseline=med(singles[a]),
            baseline_label="ASYNC_MASTER, same senders",
            target=Target("ratio", ">=", 0.7),
            detail=f"Rounds alternate. SYNC: {_summary(singles[s])}. ASYNC: {_summary(singles[a])}.",
        ),
        *(
            Figure(
                name=f"SendMessages, batches of 64, 16 concurrent callers, SYNC_MASTER ({kind})",
                value=med(batches[s], BATCH),
                unit="msgs/s",
                baseline=med(batches[a], BATCH),
                baseline_label="ASYNC_MASTER, same callers",
                target=target,
                detail=detail,
            )
            for kind, target, detail in (
                (
                    "ratio",
                    Target("ratio", ">=", 0.7),
                    f"Calls/s x 64. SYNC: {_summary(batches[s])}. ASYNC: {_summary(batches[a])}.",
                ),
                ("absolute", Target("value", ">=", 60_000), "The same rounds as the line above."),
            )
        ),
        *(
            Figure(
                name=f"SendMessage latency {q}, 1 caller, SYNC_MASTER",
                value=statistics.median(getattr(r, f"{q}_ms") for r in latency[s]),
                unit="ms",
                baseline=statistics.median(getattr(r, f"{q}_ms") for r in latency[a]),
                baseline_label=f"ASYNC_MASTER {q}",
                target=None,
                detail=detail,
            )
            for q, detail in (
                (
                    "p50",
                    f"SYNC: {_summary(latency[s])}. ASYNC: {_summary(latency[a])}. Reported, "
                    "no target: a sync send adds one slave round trip.",
                ),
                ("p99", "The same rounds as the line above."),
            )
        ),
    ]


def _wait_in_sync(target: str, timeout_s: float = 30) -> None:
    from ferry.v1 import ha_admin_pb2, ha_admin_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = ha_admin_pb2_grpc.HAAdminStub(channel)
        while time.monotonic() < deadline:
            status = stub.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=10)
            if status.in_sync_slave_nums > 0:
                return
            time.sleep(0.05)
    raise RuntimeError(f"no slave of {target} got in sync within {timeout_s:.0f} s")


# ---------------------------------------------------------------- 4. catch-up


def catch_up(workdir: Path, plan: Plan, master_cpus, slave_cpus) -> Figure:
    file_size = plan.catchup_file
    store = workdir / "catchup-master"
    end = _fill(store, file_size + plan.catchup_bytes, file_size)
    # The slave already holds the master's first file (as if it had replicated it).
    slave_store = workdir / "catchup-slave"
    (slave_store / "commitlog").mkdir(parents=True)
    first = f"{0:020d}"
    shutil.copyfile(store / "commitlog" / first, slave_store / "commitlog" / first)
    held = file_size
    os.sync()
    time.sleep(FRESH_WAIT_S)
    # Both caches warm alike: the master's files were just written.
    master, ha_port = _master(store, workdir, "catchup", master_cpus, "brokerRole=ASYNC_MASTER",
                              file_size=file_size)  # fmt: skip
    slave = _slave(slave_store, workdir, "catchup", slave_cpus, ha_port, file_size=file_size)
    with pinned(slave_cpus), master, slave:
        seconds, seen = _watch_until(slave.target, held, end, 300)
    rate = (end - seen) / seconds
    shutil.rmtree(store)
    shutil.rmtree(slave_store)
    return Figure(
        name=f"Catch-up of a slave {(end - held) / 2**30:.2f} GiB behind "
        f"({(end - held) // file_size} files of {file_size >> 20} MiB), default frames",
        value=rate / 1e9,
        unit="GB/s",
        baseline=None,
        baseline_label="",
        target=Target("value", ">=", 0.5),
        detail=f"{end - seen:,} bytes in {seconds:.2f} s, timed from the first poll that saw "
        "the slave move. The slave starts from its own end (the first file, copied from the "
        "master before it starts); 32 KiB frames; frames never cross a file.",
    )
