"""Broker benchmarks (issue #3): 128-byte bodies on loopback, ASYNC_FLUSH unless
said otherwise, every figure next to a baseline measured in the same run.

1. `SendMessages`, batches of 64, 4 concurrent callers: messages/s. Baseline:
   the same request bytes sent to the empty method (`benchmarks.empty_server`,
   the same `GrpcServer` runtime): the transport's ceiling.
2. `SendMessage` one at a time, 1 caller: p50/p99 latency, against an empty
   unary RPC carrying the same bytes.
3. Pull throughput draining N messages (1,000,000 in a full run) from 4 queues
   with 4 concurrent pullers, 1,000 messages per pull; the client parses every
   answer (it must, for next_begin_offset). Baseline: empty RPC round trips/s.
4. SYNC_FLUSH with 16 concurrent senders against ASYNC_FLUSH with the same 16.
5. Recovery after a crash with 1 GiB of commit log (one 1 GiB file, written
   and then abandoned without a clean stop, as SIGKILL leaves it): the time the
   broker's store recovery takes (its own log line), next to one sequential
   read of the same bytes.
6. Broker RSS after that recovery, with 1,000 topics created, next to an empty
   broker's RSS.

The broker and the empty server run as child processes pinned to one core;
the load generator runs here, on the other. Requests are pre-serialized and,
except for pulls, answers are not parsed, so the figures measure the server.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.empty_server import METHOD as EMPTY_METHOD
from benchmarks.load import LoadResult, closed_loop
from benchmarks.procs import ServerProcess, cpu_plan, pinned, pinning_note
from benchmarks.report import BenchResult, Figure, Target
from ferry import record
from ferry.model import TopicConfig
from ferry.runtime.clock import SystemClock
from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, broker_pb2, common_pb2
from services.broker.metadata.tables import BrokerMetadata
from services.broker.store import MessageIn, MessageStore, StoreConfig

TITLE = "broker — commit-log store, producers and consumers"

BODY = b"b" * 128
BATCH = 64
SEND_METHOD = "/ferry.v1.Broker/SendMessages"
SEND_ONE_METHOD = "/ferry.v1.Broker/SendMessage"
PULL_METHOD = "/ferry.v1.Broker/PullMessage"
QUEUES = 4
PULL_BATCH = 1000


@dataclass(frozen=True)
class Plan:
    rounds: int
    warmup_s: float
    duration_s: float
    drain_messages: int
    log_bytes: int
    topics: int


FULL = Plan(3, 1.0, 5.0, 1_000_000, 1 << 30, 1000)
QUICK = Plan(1, 0.3, 1.0, 40_000, 32 << 20, 100)


def _broker_args(store: Path, *options: str, file_size: int = 1 << 30) -> list[str]:
    base = [
        "bindAddress=127.0.0.1",
        "listenPort=0",
        "metricsPort=-1",
        "haListenPort=0",  # a free port: brokers here run side by side
        f"storePathRootDir={store}",
        f"mappedFileSizeCommitLog={file_size}",
        # A benchmark measures speed, not disk policy: on a shared machine whose disk is
        # already near RocketMQ's 90 % warning ratio, the defaults would refuse sends or
        # delete unexpired files part-way through a run. Options below override these.
        "diskMaxUsedSpaceRatio=99",
        "diskSpaceCleanForciblyRatio=99",
        "diskSpaceWarningLevelRatio=99",
        *options,
    ]
    return [arg for option in base for arg in ("-o", option)]


def _create_topic(target: str, name: str, queues: int = QUEUES) -> None:
    with grpc.insecure_channel(target) as channel:
        broker_admin_pb2_grpc.BrokerAdminStub(channel).UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name=name, read_queue_nums=queues, write_queue_nums=queues, perm=6
                )
            ),
            timeout=30,
        )


def _summary(results: list[LoadResult]) -> str:
    return "; ".join(
        f"{r.rate:,.0f} calls/s (p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms"
        + (f", server CPU {r.server_cpu:.0%}" if r.server_cpu is not None else "")
        + ")"
        for r in results
    )


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    result = BenchResult(TITLE)
    server_cpus, client_cpus = cpu_plan()
    result.notes.append(pinning_note(server_cpus, client_cpus))
    broker = ServerProcess(
        "services.broker", _broker_args(workdir / "async"), workdir, "broker-async", server_cpus
    )
    empty = ServerProcess("benchmarks.empty_server", [], workdir, "empty", server_cpus)
    with pinned(client_cpus), broker, empty:
        _create_topic(broker.target, "Bench")
        _create_topic(broker.target, "Drain")
        result.figures.append(batch_send(broker, empty, plan))
        result.figures += single_send_latency(broker, empty, plan)
        result.figures.append(pull_drain(broker, empty, plan))
        async_16 = concurrent_singles(broker, plan)
    sync = ServerProcess(
        "services.broker",
        _broker_args(workdir / "sync", "flushDiskType=SYNC_FLUSH"),
        workdir,
        "broker-sync",
        server_cpus,
    )
    with pinned(client_cpus), sync:
        _create_topic(sync.target, "Bench")
        sync_16 = concurrent_singles(sync, plan)
    result.figures.append(
        Figure(
            name="SendMessage SYNC_FLUSH, 16 concurrent senders",
            value=statistics.median(r.rate for r in sync_16),
            unit="msgs/s",
            baseline=statistics.median(r.rate for r in async_16),
            baseline_label="ASYNC_FLUSH, same 16 senders",
            target=Target("ratio", ">=", 1 / 3),
            detail=f"SYNC rounds: {_summary(sync_16)}. ASYNC rounds: {_summary(async_16)}. "
            "Group commit: one fdatasync serves every send waiting when it starts.",
        )
    )
    with pinned(client_cpus):
        result.figures += recovery_and_rss(workdir, plan, server_cpus)
    return result


# ---------------------------------------------------------------- sends


def _batch_request(topic: str = "Bench") -> bytes:
    return broker_pb2.SendMessagesRequest(
        topic=topic, messages=[broker_pb2.SendEntry(body=BODY) for _ in range(BATCH)]
    ).SerializeToString()


def _rounds(target_a, method_a, req_a, target_b, method_b, req_b, concurrency, plan, cpu_a=None):
    async def go():
        a, b = [], []
        for _ in range(plan.rounds):
            b.append(
                await closed_loop(
                    target_b, method_b, req_b, concurrency, plan.warmup_s, plan.duration_s
                )
            )
            a.append(
                await closed_loop(
                    target_a,
                    method_a,
                    req_a,
                    concurrency,
                    plan.warmup_s,
                    plan.duration_s,
                    server_cpu_seconds=cpu_a,
                )  # fmt: skip
            )
        return a, b

    a, b = asyncio.run(go())
    failed = sum(r.errors for r in a + b)
    if failed:
        raise RuntimeError(f"{failed} calls failed")
    return a, b


def batch_send(broker: ServerProcess, empty: ServerProcess, plan: Plan) -> Figure:
    request = _batch_request()
    real, base = _rounds(
        broker.target, SEND_METHOD, [request], empty.target, EMPTY_METHOD, [request], 4, plan,
        broker.cpu_seconds,
    )  # fmt: skip
    return Figure(
        name="SendMessages, batches of 64 x 128 B, 4 concurrent callers",
        value=statistics.median(r.rate for r in real) * BATCH,
        unit="msgs/s",
        baseline=statistics.median(r.rate for r in base) * BATCH,
        baseline_label="same bytes to the empty method",
        target=Target("value", ">=", 60_000),
        detail=f"{plan.rounds} rounds of {plan.duration_s:g} s, median. Broker: "
        f"{_summary(real)}. Empty: {_summary(base)}.",
    )


def single_send_latency(broker: ServerProcess, empty: ServerProcess, plan: Plan) -> list[Figure]:
    request = broker_pb2.SendMessageRequest(topic="Bench", body=BODY).SerializeToString()
    real, base = _rounds(
        broker.target, SEND_ONE_METHOD, [request], empty.target, EMPTY_METHOD, [request], 1, plan,
        broker.cpu_seconds,
    )  # fmt: skip
    p50 = statistics.median(r.p50_ms for r in real)
    p99 = statistics.median(r.p99_ms for r in real)
    return [
        Figure(
            name="SendMessage one at a time, 1 caller: p50",
            value=p50,
            unit="ms",
            baseline=statistics.median(r.p50_ms for r in base),
            baseline_label="empty unary RPC p50",
            target=Target("ratio", "<=", 1.3),
            detail=f"Broker: {_summary(real)}. Empty: {_summary(base)}.",
        ),
        Figure(
            name="SendMessage one at a time, 1 caller: p99",
            value=p99,
            unit="ms",
            baseline=statistics.median(r.p99_ms for r in base),
            baseline_label="empty unary RPC p99",
            target=Target("value", ">=", 0),
            detail="Reported, no target.",
        ),
    ]


def concurrent_singles(broker: ServerProcess, plan: Plan) -> list[LoadResult]:
    request = broker_pb2.SendMessageRequest(topic="Bench", body=BODY).SerializeToString()

    async def go():
        return [
            await closed_loop(
                broker.target,
                SEND_ONE_METHOD,
                [request],
                16,
                plan.warmup_s,
                plan.duration_s,
                server_cpu_seconds=broker.cpu_seconds,
            )  # fmt: skip
            for _ in range(plan.rounds)
        ]

    results = asyncio.run(go())
    if sum(r.errors for r in results):
        raise RuntimeError("sends failed")
    return results


# ---------------------------------------------------------------- pulls


def pull_drain(broker: ServerProcess, empty: ServerProcess, plan: Plan) -> Figure:
    per_queue = plan.drain_messages // QUEUES
    batch = broker_pb2.SendMessagesRequest(
        topic="Drain", messages=[broker_pb2.SendEntry(body=BODY) for _ in range(1000)]
    )

    async def load() -> None:
        async with grpc.aio.insecure_channel(broker.target) as channel:
            send = channel.unary_unary(
                SEND_METHOD,
                request_serializer=broker_pb2.SendMessagesRequest.SerializeToString,
                response_deserializer=broker_pb2.SendResult.FromString,
            )
            for queue in range(QUEUES):
                batch.queue_id = queue
                for _ in range(per_queue // 1000):
                    r = await send(batch, timeout=60)
                    if r.status != broker_pb2.SEND_OK:
                        raise RuntimeError(f"preload failed: {r}")

    async def drain() -> tuple[int, float]:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(broker.target, options=options) as channel:
            pull = channel.unary_unary(
                PULL_METHOD,
                request_serializer=broker_pb2.PullMessageRequest.SerializeToString,
                response_deserializer=broker_pb2.PullMessageResponse.FromString,
            )
            await pull(broker_pb2.PullMessageRequest(consumer_group="b", topic="Drain"), timeout=30)

            async def one(queue: int) -> int:
                offset, got = 0, 0
                while True:
                    r = await pull(
                        broker_pb2.PullMessageRequest(
                            consumer_group="bench",
                            topic="Drain",
                            queue_id=queue,
                            queue_offset=offset,
                            max_msg_nums=PULL_BATCH,
                        ),  # fmt: skip
                        timeout=60,
                    )
                    if r.status != broker_pb2.FOUND:
                        return got
                    got += len(r.messages)
                    offset = r.next_begin_offset

            start = time.perf_counter()
            counts = await asyncio.gather(*(one(q) for q in range(QUEUES)))
            return sum(counts), time.perf_counter() - start

    asyncio.run(load())
    # Let the dispatcher finish before timing reads.
    time.sleep(1.0)
    got, seconds = asyncio.run(drain())
    if got != per_queue // 1000 * 1000 * QUEUES:
        raise RuntimeError(f"drained {got} messages, expected {per_queue // 1000 * 1000 * QUEUES}")

    async def base_rate() -> LoadResult:
        return await closed_loop(
            empty.target, EMPTY_METHOD, [b""], QUEUES, plan.warmup_s, plan.duration_s
        )

    base = asyncio.run(base_rate())
    return Figure(
        name=f"PullMessage draining {got:,} messages (4 queues, 4 pullers, {PULL_BATCH}/pull)",
        value=got / seconds,
        unit="msgs/s",
        baseline=base.rate,
        baseline_label="empty RPC round trips/s (4 callers)",
        target=Target("value", ">=", 100_000),
        detail=f"{got:,} messages in {seconds:.2f} s; the client parses every answer. The "
        "ratio is messages per empty round trip: what batching buys.",
    )


# ---------------------------------------------------------------- recovery and memory


def _write_log(store_dir: Path, log_bytes: int) -> int:
    """Fill a store with `log_bytes` of 128-byte-body records over 4 queues, flush
    and checkpoint as the flusher would, append a little more, and abandon it
    without a clean stop (the abort marker stays): what SIGKILL leaves."""
    store = MessageStore(
        StoreConfig(root=store_dir, commit_log_file_size=1 << 30, preallocate=True), SystemClock()
    )
    store.open()
    BrokerMetadata.open(store_dir / "config", SystemClock()).topics.put(
        TopicConfig("Recover", QUEUES, QUEUES, 6)
    )
    message = MessageIn(body=BODY, properties=record.encode_properties({"TAGS": "bench"}))
    batch = [message] * 1000
    written = 0
    queue = 0
    while store.max_offset < log_bytes - 512 * 1024:
        store._append("Recover", queue % QUEUES, batch)
        store.dispatcher.dispatch_all()
        queue += 1
        written += len(batch)
    snapshot = store.flusher.snapshot()
    from services.broker.store.consumequeue import sync_fds

    sync_fds(snapshot[2])
    store.flusher.write_checkpoint_now(snapshot)
    while store.max_offset < log_bytes - 4096:  # the tail after the last checkpoint
        store._append("Recover", 0, [message])
        written += 1
    store.abandon()  # files closed, lock released; checkpoint and abort marker stay
    return written


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def recovery_and_rss(workdir: Path, plan: Plan, server_cpus) -> list[Figure]:
    store_dir = workdir / "recover"
    start = time.perf_counter()
    written = _write_log(store_dir, plan.log_bytes)
    fill_s = time.perf_counter() - start
    segment = store_dir / "commitlog" / f"{0:020d}"
    os.posix_fadvise(os.open(segment, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    with open(segment, "rb") as f:
        while f.read(8 << 20):
            pass
    read_s = time.perf_counter() - start

    broker = ServerProcess(
        "services.broker", _broker_args(store_dir), workdir, "broker-recover", server_cpus, 600
    )
    empty = ServerProcess(
        "services.broker",
        _broker_args(workdir / "empty-store"),
        workdir,
        "broker-empty",
        server_cpus,
    )
    with broker, empty:
        log_text = broker.log_path.read_text()
        found = re.search(r"store recovered crashed=(\w+).* in ([0-9.]+)s", log_text)
        if not found or found.group(1) != "True":
            raise RuntimeError(f"no crash recovery in the broker log:\n{broker.log_tail()}")
        recovery_s = float(found.group(2))
        for i in range(plan.topics):
            _create_topic(broker.target, f"Topic-{i:04d}", 8)
        with grpc.insecure_channel(broker.target) as channel:
            pull = channel.unary_unary(
                PULL_METHOD,
                request_serializer=broker_pb2.PullMessageRequest.SerializeToString,
                response_deserializer=broker_pb2.PullMessageResponse.FromString,
            )
            r = pull(
                broker_pb2.PullMessageRequest(
                    consumer_group="c", topic="Recover", queue_id=1, max_msg_nums=1000
                ),
                timeout=30,
            )
        if r.status != broker_pb2.FOUND or len(r.messages) != 1000:
            raise RuntimeError(f"the recovered log did not serve a pull: status {r.status}")
        rss = _rss_mib(broker.pid)
        empty_rss = _rss_mib(empty.pid)
    size_mib = plan.log_bytes / 2**20
    return [
        Figure(
            name=f"Crash recovery, {size_mib:,.0f} MiB commit log ({written:,} records)",
            value=recovery_s,
            unit="s",
            baseline=read_s,
            baseline_label="one sequential read of the file (cold cache)",
            target=Target("value", "<", 10.0),
            detail=f"The broker's own `store recovered` figure: scan + CRC of every record from "
            f"the checkpoint's file, cut of the torn tail, re-dispatch of the records after "
            f"the checkpoint. Filling the log took {fill_s:.1f} s.",
        ),
        Figure(
            name=f"Broker RSS with a {size_mib:,.0f} MiB commit log and {plan.topics:,} topics",
            value=rss,
            unit="MiB",
            baseline=empty_rss,
            baseline_label="an empty broker",
            target=Target("value", "<", 300.0),
            detail="VmRSS after recovery, topic creation and a 1,000-message pull. The commit "
            "log is read with pread, not mapped, so the page cache is not in the RSS.",
        ),
    ]
