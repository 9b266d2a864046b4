"""Name-server benchmarks: route lookups per second and the cost of a big registration.

1. GetRouteInfoByTopic requests/s against 1,000 topics x 4 master groups, 16
   concurrent callers, compared with an empty unary RPC (`benchmarks.empty_server`,
   same `GrpcServer` runtime) measured by the same load generator in the same
   run. The servers run as child processes pinned to one core; the load
   generator runs here, pinned to the other. Rounds alternate baseline and
   route; the median of each is reported.
2. One RegisterBroker carrying 10,000 and 100,000 topics: (a) end to end from a
   client to the real server, next to the same request sent to the empty
   method; (b) in process, `convert.registration` + `RouteTable.register`, next
   to one bare pass over the request's topics. Every run is a first
   registration or carries a new DataVersion, and must report
   `topic_config_applied`; body_crc32 is set, so the server checks it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from benchmarks.empty_server import METHOD as EMPTY_METHOD
from benchmarks.load import LoadResult, closed_loop
from benchmarks.procs import ServerProcess, cpu_plan, namesrv_process, pinned, pinning_note
from benchmarks.report import BenchResult, Figure, Target
from ferry.runtime.clock import SystemClock
from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc
from ferry.wire import body_crc32
from services.namesrv import convert
from services.namesrv.routes import RouteTable
from tests.helpers import register_request

TITLE = "namesrv — name server"

ROUTE_TOPICS = 1_000
ROUTE_GROUPS = ("broker-a", "broker-b", "broker-c", "broker-d")
QUEUES = 4
CONCURRENCY = 16
ROUTE_RATIO_TARGET = 0.8
REGISTRATION_TARGET_MS = {10_000: 50.0, 100_000: 500.0}
HEARTBEAT_TIMEOUT_MS = 3_600_000  # no broker may expire during a run
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
ROUTE_METHOD = "/ferry.v1.NameServer/GetRouteInfoByTopic"

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    rounds: int
    warmup_s: float
    duration_s: float
    registration_runs: int


FULL = Plan(rounds=3, warmup_s=1.0, duration_s=5.0, registration_runs=7)
QUICK = Plan(rounds=1, warmup_s=0.3, duration_s=1.0, registration_runs=2)


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    result = BenchResult(TITLE)
    server_cpus, client_cpus = cpu_plan()
    result.notes.append(
        pinning_note(server_cpus, client_cpus, clients="load generator and in-process runs")
    )
    namesrv = namesrv_process(workdir, server_cpus)
    empty = ServerProcess("benchmarks.empty_server", [], workdir, "empty", server_cpus)
    with pinned(client_cpus), namesrv, empty:
        result.figures.append(route_throughput(namesrv, empty, plan))
        result.figures += registration_end_to_end(namesrv, empty, plan)
    with pinned(client_cpus):
        result.figures += registration_in_process(plan)
    return result


# --------------------------------------------------------------------- route lookups


def _route_topics() -> list[str]:
    return [f"BenchTopic-{i:04d}" for i in range(ROUTE_TOPICS)]


def _load_route_registry(target: str) -> None:
    topics = dict.fromkeys(_route_topics(), QUEUES)
    with _channel(target) as channel:
        stub = namesrv_pb2_grpc.NameServerStub(channel)
        for i, name in enumerate(ROUTE_GROUPS):
            port = 10911 + 100 * i
            response = stub.RegisterBroker(
                register_request(
                    broker_name=name,
                    addr=f"127.0.0.1:{port}",
                    ha_addr=f"127.0.0.1:{port + 1}",
                    topics=topics,
                    heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
                )
            )
            if not response.topic_config_applied:
                raise RuntimeError(f"registering {name} did not apply its topics")
        listed = stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest()).topic_list
        if len(listed) != ROUTE_TOPICS:
            raise RuntimeError(f"expected {ROUTE_TOPICS} topics, the server lists {len(listed)}")
        for topic in random.Random(7).sample(list(topics), 10):
            route = stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic))
            groups = sorted(b.broker_name for b in route.broker_datas)
            queues = sorted((q.broker_name, q.read_queue_nums) for q in route.queue_datas)
            if groups != list(ROUTE_GROUPS) or queues != [(g, QUEUES) for g in ROUTE_GROUPS]:
                raise RuntimeError(f"unexpected route for {topic}: {route}")


def route_throughput(namesrv: ServerProcess, empty: ServerProcess, plan: Plan) -> Figure:
    _load_route_registry(namesrv.target)
    route_requests = [
        namesrv_pb2.GetRouteInfoByTopicRequest(topic=t).SerializeToString() for t in _route_topics()
    ]

    async def one(server: ServerProcess, method: str, requests: list[bytes]) -> LoadResult:
        return await closed_loop(
            server.target,
            method,
            requests,
            CONCURRENCY,
            plan.warmup_s,
            plan.duration_s,
            server_cpu_seconds=server.cpu_seconds,
        )

    async def rounds() -> tuple[list[LoadResult], list[LoadResult]]:
        base, route = [], []
        for _ in range(plan.rounds):
            base.append(await one(empty, EMPTY_METHOD, [b""]))
            route.append(await one(namesrv, ROUTE_METHOD, route_requests))
        return base, route

    base, route = asyncio.run(rounds())
    failed = sum(r.errors for r in base + route)
    if failed:
        raise RuntimeError(f"{failed} calls failed during the route benchmark")
    return Figure(
        name=f"GetRouteInfoByTopic, {ROUTE_TOPICS:,} topics x {len(ROUTE_GROUPS)} groups, "
        f"{CONCURRENCY} callers",
        value=statistics.median(r.rate for r in route),
        unit="req/s",
        baseline=statistics.median(r.rate for r in base),
        baseline_label="empty unary RPC",
        target=Target("ratio", ">=", ROUTE_RATIO_TARGET),
        detail=(
            f"{plan.rounds} alternating rounds of {plan.warmup_s:g} s warm-up + "
            f"{plan.duration_s:g} s, median. Route rounds: {_load_summary(route)}. "
            f"Empty rounds: {_load_summary(base)}. Baseline = `{EMPTY_METHOD}` on "
            "`benchmarks.empty_server` (the same `ferry.runtime.server.GrpcServer`, request "
            'bytes not parsed, answers `b""`). Requests pre-serialized, answers not parsed '
            "by the client; topics picked at random; 16 tasks share one channel."
        ),
    )


def _load_summary(results: list[LoadResult]) -> str:
    parts = []
    for r in results:
        cpu = f", server CPU {r.server_cpu:.0%}" if r.server_cpu is not None else ""
        parts.append(
            f"{r.rate:,.0f}/s (p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms{cpu}, "
            f"client CPU {r.client_cpu:.0%})"
        )
    return "; ".join(parts)


# --------------------------------------------------------------------- registrations


def _registration_request(topics: int) -> namesrv_pb2.RegisterBrokerRequest:
    """A master carrying `topics` topics; a broker group of its own per size."""
    port = 20911 + topics // 1000
    request = register_request(
        broker_name=f"broker-big-{topics}",
        addr=f"127.0.0.1:{port}",
        ha_addr=f"127.0.0.1:{port + 1}",
        topics={f"BigTopic-{topics}-{i:06d}": QUEUES for i in range(topics)},
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    # What the server holds: a request parsed from the wire.
    return namesrv_pb2.RegisterBrokerRequest.FromString(request.SerializeToString())


def _next_version(request: namesrv_pb2.RegisterBrokerRequest, run: int) -> None:
    """Give run `run` its own DataVersion (run 0 keeps counter 1) and a matching body_crc32."""
    version = request.body.topic_config.data_version
    version.counter = run + 1
    version.timestamp = 1_000 + run + 1
    request.body_crc32 = body_crc32(request.body)


def _channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(
        target,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )


def _timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[float, T]:
    """(milliseconds, result) of one call."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return (time.perf_counter() - start) * 1e3, out


def _ms_list(ms: list[float]) -> str:
    return ", ".join(f"{m:.1f}" for m in ms)


def _runs_text(ms: list[float]) -> str:
    """Run 0 is a first registration, the others carry a new DataVersion."""
    rest = _ms_list(ms[1:])
    return f"first registration {ms[0]:.1f} ms" + (
        f", then with a new DataVersion {rest} ms" if rest else ""
    )


def registration_end_to_end(
    namesrv: ServerProcess, empty: ServerProcess, plan: Plan
) -> list[Figure]:
    figures = []
    with _channel(namesrv.target) as ns_channel, _channel(empty.target) as empty_channel:
        register = namesrv_pb2_grpc.NameServerStub(ns_channel).RegisterBroker
        send_empty = empty_channel.unary_unary(
            EMPTY_METHOD, request_serializer=namesrv_pb2.RegisterBrokerRequest.SerializeToString
        )
        # Connect both channels before timing anything.
        namesrv_pb2_grpc.NameServerStub(ns_channel).GetAllTopicList(
            namesrv_pb2.GetAllTopicListRequest(), timeout=10
        )
        send_empty(namesrv_pb2.RegisterBrokerRequest(), timeout=10)
        for topics, target_ms in REGISTRATION_TARGET_MS.items():
            request = _registration_request(topics)
            size = request.ByteSize()
            real_ms, base_ms = [], []
            for run in range(plan.registration_runs):
                _next_version(request, run)
                base_ms.append(_timed(send_empty, request, timeout=60)[0])
                ms, response = _timed(register, request, timeout=60)
                if not response.topic_config_applied:
                    raise RuntimeError(f"run {run} of {topics} topics was not applied")
                real_ms.append(ms)
            figures.append(
                Figure(
                    name=f"RegisterBroker {topics:,} topics, end to end",
                    value=statistics.median(real_ms),
                    unit="ms",
                    baseline=statistics.median(base_ms),
                    baseline_label="same request to the empty method",
                    target=Target("value", "<", target_ms),
                    detail=(
                        f"request {size / 1e6:.2f} MB; median of {plan.registration_runs} "
                        f"runs: {_runs_text(real_ms)}; empty method: {_ms_list(base_ms)} ms. "
                        "Includes client serialization, transport, parsing, the CRC check "
                        "and the apply."
                    ),
                )
            )
    return figures


def _bare_pass(request: namesrv_pb2.RegisterBrokerRequest) -> dict[str, tuple[int, ...]]:
    """The least Python that reads every topic of a registration."""
    return {
        name: (tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
        for name, tc in request.body.topic_config.topic_config_table.items()
    }


def registration_in_process(plan: Plan) -> list[Figure]:
    figures = []
    for topics, target_ms in REGISTRATION_TARGET_MS.items():
        source = _registration_request(topics)
        table = RouteTable(SystemClock())
        total_ms, convert_ms, base_ms, parse_ms = [], [], [], []
        for run in range(plan.registration_runs):
            _next_version(source, run)
            # Each run gets a freshly parsed request, as the server would.
            ms, request = _timed(
                namesrv_pb2.RegisterBrokerRequest.FromString, source.SerializeToString()
            )
            parse_ms.append(ms)
            base_ms.append(_timed(_bare_pass, request)[0])
            start = time.perf_counter()
            registration = convert.registration(request)
            converted = time.perf_counter()
            result = table.register(registration)
            end = time.perf_counter()
            if not result.topic_config_applied:
                raise RuntimeError(f"in-process run {run} of {topics} topics was not applied")
            total_ms.append((end - start) * 1e3)
            convert_ms.append((converted - start) * 1e3)
        crc_ms = statistics.median(_timed(body_crc32, source.body)[0] for _ in range(3))
        figures.append(
            Figure(
                name=f"RegisterBroker {topics:,} topics, in process",
                value=statistics.median(total_ms),
                unit="ms",
                baseline=statistics.median(base_ms),
                baseline_label="one bare pass over the topics",
                target=Target("value", "<", target_ms),
                detail=(
                    f"`convert.registration` + `RouteTable.register`, median of "
                    f"{plan.registration_runs} runs on one table: {_runs_text(total_ms)}; "
                    "of which convert "
                    f"(incl. body_crc32 ~{crc_ms:.1f} ms) {_runs_text(convert_ms)}. "
                    f"Not included: parsing the request, median {statistics.median(parse_ms):.1f} ms. Baseline: a dict "
                    "comprehension reading the 4 queue fields of every topic."
                ),
            )
        )
    return figures
