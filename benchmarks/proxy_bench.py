"""The RocketMQ 5 proxy (issue 14): `apache.rocketmq.v2.MessagingService` in
front of one broker against the same work sent to the broker with `ferry.v1`,
128-byte bodies on loopback, ASYNC_FLUSH, both modes in the same run.

1. Sends: SENDERS asyncio tasks on one `grpc.aio` channel, one call at a time
   each, single-message requests pre-serialized (a pool of SEND_POOL requests,
   each with its own message id and body). Via the proxy: v2 `SendMessage`
   {Message{topic, body, system_properties{message_id, NORMAL, IDENTITY,
   born_timestamp}}}; direct: the `ferry.v1` `Broker/SendMessage` the proxy
   makes of that message (`services.proxy.convert.send_request`, so the
   broker stores the same bytes either way). Every answer is parsed and must
   say OK. Calls/s, p50 and p99 latency.
2. Receive + ack: a topic of QUEUES queues is preloaded with M messages (each
   body carrying its sequence number, each message a `UNIQ_KEY` as an SDK's
   send leaves), then CONSUMERS consumer processes (synchronous grpc, one
   channel, one call at a time, as in `pop_bench`) drain it: via the proxy, v2 `ReceiveMessage` (batch 32, invisible 60 s, long
   polling 0, queue id -1 on the broker by name) + v2 `AckMessage` of the
   batch; direct, `Broker/PopMessage` (32, invisible 60 s, no wait) +
   `Broker/AckMessage` of the batch. Each drain uses a fresh consumer group
   and ends when a receive finds nothing; it is checked: every sequence number
   received exactly once, each the first delivery, every ack OK, and
   `GetGroupStatus` shows every queue committed to its end, nothing in flight.
   Messages/s from the first call to the last answer.

Rounds are paired: one measurement of each mode back to back, the order
alternating, giving one ratio; this machine drifts by tens of percent within
a minute, two neighbouring measurements share most of that drift. Each figure
shows the round with its median ratio, every round in the detail.

Placement (2 cores, three busy parties): the broker (and the idle name
server) on one core; the proxy and the load generator on the other, in both
modes. The broker has the same core whether or not a proxy stands in front of
it, so the baseline is the broker's own ceiling, and the proxy pays for its
CPU out of the room the clients leave (direct sends keep the client core about
half busy). The other placements distort more: the proxy alone on a core
leaves that core idle in direct mode and crowds the broker and the clients
onto the other, so the baseline falls and the proxy looks free (sends came
out at 1.0x that way); the proxy beside the broker makes the two servers share
a core, so every proxy CPU-second is also a broker CPU-second lost (0.42x for
sends, against 0.55x here, in one trial). Each figure's detail gives the
CPU-µs per message of the broker, the proxy and the clients, and the rate the
proxy's CPU per message would allow on a core of its own: the proxy's
ceiling whatever the placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from benchmarks.broker_bench import _broker_args, _create_topic
from benchmarks.drains import (
    check_group,
    check_reports,
    pop_and_ack,
    run_consumers,
    send_all,
    wait_queue_ends,
)
from benchmarks.load import LoadResult, closed_loop
from benchmarks.procs import ServerProcess, cpu_plan, namesrv_process, pinned, wait_for_route
from benchmarks.report import BenchResult, Figure, Target
from ferry.v1 import broker_pb2
from services.proxy.convert import PROPERTY_UNIQ_KEY, duration, send_request, timestamp

TITLE = "proxy — apache.rocketmq.v2 through the proxy against ferry.v1 on the broker"

V2 = "/apache.rocketmq.v2.MessagingService/"
V2_SEND = V2 + "SendMessage"
V2_RECEIVE = V2 + "ReceiveMessage"
V2_ACK = V2 + "AckMessage"
V2_TELEMETRY = V2 + "Telemetry"
BROKER_SEND = "/ferry.v1.Broker/SendMessage"
BROKER_POP = "/ferry.v1.Broker/PopMessage"
BROKER_ACK = "/ferry.v1.Broker/AckMessage"
BROKER_STATUS = "/ferry.v1.Broker/GetGroupStatus"

BROKER_NAME = "bench-broker"
SEND_TOPIC = "ProxySendBench"
DRAIN_TOPIC = "ProxyDrainBench"
QUEUES = 8
BODY_SIZE = 128
SENDERS = 8
SEND_POOL = 64
CONSUMERS = 4
BATCH = 32
INVISIBLE_MS = 60_000
PRELOAD_BATCH = 250
CALL_TIMEOUT_S = 30.0
ROUTE_TIMEOUT_S = 30.0
OK = v2.Code.OK
NOT_FOUND = v2.Code.MESSAGE_NOT_FOUND


@dataclass(frozen=True)
class Plan:
    rounds: int
    warmup_s: float
    duration_s: float
    messages: int  # preloaded for receive + ack; a multiple of QUEUES * PRELOAD_BATCH


FULL = Plan(5, 0.5, 3.0, 24_000)
QUICK = Plan(1, 0.5, 2.0, 8_000)


def _progress(text: str) -> None:
    print(f"  proxy: {text}", file=sys.stderr, flush=True)


def _body(seq: int) -> bytes:
    return f"{seq:08d} ".encode().ljust(BODY_SIZE, b".")


def _message_id(seq: int) -> str:
    """The shape of an SDK's id: 34 hex digits."""
    return f"01{seq:032X}"


@dataclass
class Cluster:
    broker: ServerProcess
    proxy: ServerProcess
    namesrv: ServerProcess

    def cpu(self) -> tuple[float, float]:
        """CPU-seconds used so far by (broker, proxy)."""
        return self.broker.cpu_seconds(), self.proxy.cpu_seconds()


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    started = time.monotonic()
    result = BenchResult(TITLE)
    broker_cpus, client_cpus = cpu_plan()
    with pinned(client_cpus), _cluster(workdir, broker_cpus, client_cpus) as cluster:
        result.figures += sends(cluster, plan)
        preload(cluster.broker.target, plan)
        result.figures.append(receive_and_ack(cluster, plan, workdir))
    if broker_cpus is None:
        result.notes.append("Fewer than 2 CPUs: nothing was pinned.")
    else:
        result.notes.append(
            f"The broker (and the idle name server) pinned to CPU {sorted(broker_cpus)}; the "
            f"proxy and the load generator to CPU {sorted(client_cpus or ())}, in both modes: "
            "the broker's core is the same with or without the proxy, and the proxy pays "
            "for its CPU out of the room the clients leave (see the module docstring)."
        )
    result.notes.append(f"The proxy benchmark took {time.monotonic() - started:.0f} s.")
    return result


@contextlib.contextmanager
def _cluster(workdir: Path, broker_cpus, proxy_cpus) -> Iterator[Cluster]:
    """A name server, a broker registered with it holding both topics, and a
    proxy, started in that order and stopped in reverse."""
    with contextlib.ExitStack() as stack:
        namesrv = stack.enter_context(namesrv_process(workdir, broker_cpus))
        broker = stack.enter_context(
            ServerProcess(
                "services.broker",
                _broker_args(
                    workdir / "store",
                    f"namesrvAddr={namesrv.remoting_target}",
                    f"brokerName={BROKER_NAME}",
                ),
                workdir,
                "broker",
                broker_cpus,
            )
        )
        for topic in (SEND_TOPIC, DRAIN_TOPIC):
            _create_topic(broker.target, topic, QUEUES)
            wait_for_route(namesrv.target, topic, ROUTE_TIMEOUT_S)
        proxy = stack.enter_context(
            ServerProcess(
                "services.proxy",
                ["--host", "127.0.0.1", "--port", "0", "-n", namesrv.remoting_target],
                workdir,
                "proxy",
                proxy_cpus,
            )
        )
        yield Cluster(broker, proxy, namesrv)


def _paired(rounds: int, measure: Callable[[str, int], object], ratio, label: str) -> list:
    """`rounds` pairs (proxy, direct), measured back to back, direct first in
    even rounds."""
    pairs = []
    for r in range(rounds):
        got = {}
        for mode in ("direct", "proxy") if r % 2 == 0 else ("proxy", "direct"):
            got[mode] = measure(mode, r)
        pairs.append((got["proxy"], got["direct"]))
        _progress(f"{label} round {r + 1}/{rounds}: ratio {ratio(pairs[-1]):.2f}")
    return pairs


def _median_pair(pairs: list, ratio):
    return sorted(pairs, key=ratio)[len(pairs) // 2]


def _ratios(pairs: list, ratio) -> str:
    return ", ".join(f"{ratio(p):.2f}" for p in pairs)


# ---------------------------------------------------------------- sends


@dataclass(frozen=True)
class SendRun:
    load: LoadResult
    broker_cpu: float  # CPU-seconds / wall seconds in the window
    proxy_cpu: float

    @property
    def proxy_us(self) -> float:
        """The proxy's CPU-µs per message."""
        return self.proxy_cpu * 1e6 / self.load.rate

    def text(self) -> str:
        us = 1e6 / self.load.rate
        return (
            f"{self.load.rate:,.0f}/s, p50 {self.load.p50_ms:.2f} ms, p99 "
            f"{self.load.p99_ms:.2f} ms; CPU µs/msg: broker {self.broker_cpu * us:.0f}, proxy "
            f"{self.proxy_us:.0f}, clients {self.load.client_cpu * us:.0f}"
        )


def _send_pools() -> tuple[list[bytes], list[bytes]]:
    """(v2 SendMessageRequests, the ferry.v1 SendMessageRequests the proxy makes of them)."""
    born = timestamp(int(time.time() * 1000))
    via_proxy, direct = [], []
    for seq in range(SEND_POOL):
        message = v2.Message(
            topic=v2.Resource(name=SEND_TOPIC),
            body=_body(seq),
            system_properties=v2.SystemProperties(
                message_id=_message_id(seq),
                message_type=v2.NORMAL,
                body_encoding=v2.IDENTITY,
                born_timestamp=born,
            ),
        )
        via_proxy.append(s.SendMessageRequest(messages=[message]).SerializeToString())
        direct.append(send_request(message, SEND_TOPIC).SerializeToString())
    return via_proxy, direct


def _v2_send_ok(answer: bytes) -> bool:
    response = s.SendMessageResponse.FromString(answer)
    return response.status.code == OK and all(e.status.code == OK for e in response.entries)


def _broker_send_ok(answer: bytes) -> bool:
    return broker_pb2.SendResult.FromString(answer).status == broker_pb2.SEND_OK


def sends(cluster: Cluster, plan: Plan) -> list[Figure]:
    via_proxy, direct = _send_pools()

    def measure(mode: str, r: int) -> SendRun:
        snaps: list[tuple[float, float]] = []

        def broker_cpu() -> float:  # closed_loop calls it at the window's start and end
            snaps.append(cluster.cpu())
            return snaps[-1][0]

        target, method, requests, ok = (
            (cluster.proxy.target, V2_SEND, via_proxy, _v2_send_ok)
            if mode == "proxy"
            else (cluster.broker.target, BROKER_SEND, direct, _broker_send_ok)
        )
        load = asyncio.run(
            closed_loop(
                target, method, requests, SENDERS, plan.warmup_s, plan.duration_s,
                server_cpu_seconds=broker_cpu, answer_ok=ok,
            )
        )  # fmt: skip
        if load.errors:
            raise RuntimeError(f"{mode}: {load.errors} sends failed or were not OK")
        (b0, p0), (b1, p1) = snaps
        run = SendRun(load, (b1 - b0) / load.seconds, (p1 - p0) / load.seconds)
        _progress(f"send round {r + 1}, {mode}: {run.text()}")
        return run

    def rate_ratio(pair: tuple[SendRun, SendRun]) -> float:
        return pair[0].load.rate / pair[1].load.rate

    def p50_ratio(pair: tuple[SendRun, SendRun]) -> float:
        return pair[0].load.p50_ms / pair[1].load.p50_ms

    def p99_ratio(pair: tuple[SendRun, SendRun]) -> float:
        return pair[0].load.p99_ms / pair[1].load.p99_ms

    pairs = _paired(plan.rounds, measure, rate_ratio, "send")
    shape = f"{SENDERS} concurrent callers, 1 x {BODY_SIZE} B per call"
    how = (
        f"{plan.rounds} paired round{'s' if plan.rounds != 1 else ''} of {plan.duration_s:g} s "
        f"each way (after {plan.warmup_s:g} s of warm-up), the order alternating; the round "
        "with the median ratio is shown. "
    )
    rounds_text = (
        " Via the proxy: " + "; ".join(p.text() for p, _ in pairs)
        + ". Direct: " + "; ".join(d.text() for _, d in pairs) + "."
    )  # fmt: skip
    proxy, base = _median_pair(pairs, rate_ratio)
    figures = [
        Figure(
            name=f"v2 SendMessage via the proxy, {shape}: throughput",
            value=proxy.load.rate,
            unit="msgs/s",
            baseline=base.load.rate,
            baseline_label="ferry.v1 SendMessage to the broker, same callers, same round",
            target=Target("ratio", ">=", 0.7),
            detail=how
            + "Ratios by round: "
            + _ratios(pairs, rate_ratio)
            + "."
            + rounds_text
            + f" The proxy's CPU per message caps it near {1e6 / proxy.proxy_us:,.0f} msgs/s "
            "even on a core of its own.",
        )
    ]
    proxy, base = _median_pair(pairs, p50_ratio)
    figures.append(
        Figure(
            name=f"v2 SendMessage via the proxy, {shape}: p50 latency",
            value=proxy.load.p50_ms,
            unit="ms",
            baseline=base.load.p50_ms,
            baseline_label="ferry.v1 SendMessage to the broker, same round",
            target=Target("ratio", "<=", 1.5),
            detail=how + "Ratios by round: " + _ratios(pairs, p50_ratio) + ".",
        )
    )
    proxy, base = _median_pair(pairs, p99_ratio)
    figures.append(
        Figure(
            name=f"v2 SendMessage via the proxy, {shape}: p99 latency",
            value=proxy.load.p99_ms,
            unit="ms",
            baseline=base.load.p99_ms,
            baseline_label="ferry.v1 SendMessage to the broker, same round",
            target=None,
            detail="Reported, no target. Ratios by round: " + _ratios(pairs, p99_ratio) + ".",
        )
    )
    return figures


# ---------------------------------------------------------------- receive + ack


def preload(target: str, plan: Plan) -> None:
    """M messages, the same count in each queue, each with a UNIQ_KEY."""
    requests = [
        broker_pb2.SendMessagesRequest(
            topic=DRAIN_TOPIC,
            queue_id=batch % QUEUES,
            messages=[
                broker_pb2.SendEntry(
                    body=_body(seq), properties={PROPERTY_UNIQ_KEY: _message_id(seq)}
                )
                for seq in range(batch * PRELOAD_BATCH, (batch + 1) * PRELOAD_BATCH)
            ],
        ).SerializeToString()
        for batch in range(plan.messages // PRELOAD_BATCH)
    ]
    seconds, _ = asyncio.run(send_all(target, requests))
    _progress(f"preloaded {plan.messages:,} messages in {seconds:.1f} s")
    wait_queue_ends(target, DRAIN_TOPIC, QUEUES, plan.messages // QUEUES)


@dataclass(frozen=True)
class Drain:
    messages: int
    seconds: float
    calls: int
    broker_cpu_s: float
    proxy_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def proxy_us(self) -> float:
        """The proxy's CPU-µs per message."""
        return self.proxy_cpu_s * 1e6 / max(self.messages, 1)

    def text(self) -> str:
        per = 1e6 / max(self.messages, 1)
        return (
            f"{self.rate:,.0f} msgs/s ({self.seconds:.2f} s, {self.calls:,} calls; CPU µs/msg: "
            f"broker {self.broker_cpu_s * per:.0f}, proxy {self.proxy_cpu_s * per:.0f}, "
            f"consumers {self.client_cpu_s * per:.0f})"
        )


def client_metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    """The headers a RocketMQ 5 SDK sends with every call. Apache's proxy refuses a call
    without a client id (CLIENT_ID_REQUIRED); ferry's proxy does not need them."""
    return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"))


@contextlib.contextmanager
def simple_consumer_session(
    channel: grpc.Channel, group: str, topic: str, metadata: tuple[tuple[str, str], ...]
) -> Iterator[None]:
    """A Telemetry stream announcing a SimpleConsumer of `group` on `topic`, open for the
    block, as an SDK keeps one open: Apache's proxy serves ReceiveMessage only to a client
    whose settings it holds (without them it answers INTERNAL_SERVER_ERROR)."""
    commands: queue.SimpleQueue = queue.SimpleQueue()
    commands.put(
        s.TelemetryCommand(
            settings=v2.Settings(
                client_type=v2.SIMPLE_CONSUMER,
                request_timeout=duration(int(CALL_TIMEOUT_S * 1000)),
                subscription=v2.Subscription(
                    group=v2.Resource(name=group),
                    subscriptions=[
                        v2.SubscriptionEntry(
                            topic=v2.Resource(name=topic),
                            expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                        )
                    ],
                ),
                user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
            )
        )
    )

    def requests() -> Iterator[s.TelemetryCommand]:
        while (command := commands.get()) is not None:
            yield command

    telemetry = channel.stream_stream(
        V2_TELEMETRY,
        request_serializer=s.TelemetryCommand.SerializeToString,
        response_deserializer=s.TelemetryCommand.FromString,
    )(requests(), metadata=metadata)
    try:
        first = next(telemetry)
        if first.HasField("status") and first.status.code != OK:
            raise RuntimeError(f"Telemetry refused the settings: {first.status}")
        yield
    finally:
        commands.put(None)
        telemetry.cancel()


def _consume(spec: dict) -> dict:
    """One consumer process: one channel, one call at a time, synchronous grpc. With a
    `client_id` in the spec it behaves as an SDK's SimpleConsumer does on the wire: the
    client headers on every call and a Telemetry stream with its settings."""
    mode, group = spec["mode"], spec["group"]
    seqs: list[int] = []
    calls = bad_acks = redelivered = 0
    md = client_metadata(spec["client_id"]) if spec.get("client_id") else None
    with contextlib.ExitStack() as stack:
        channel = stack.enter_context(grpc.insecure_channel(spec["target"]))
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        if md:
            stack.enter_context(simple_consumer_session(channel, group, DRAIN_TOPIC, md))
        if mode == "proxy":
            receive = channel.unary_stream(
                V2_RECEIVE, response_deserializer=s.ReceiveMessageResponse.FromString
            )
            v2_ack = channel.unary_unary(
                V2_ACK,
                request_serializer=s.AckMessageRequest.SerializeToString,
                response_deserializer=s.AckMessageResponse.FromString,
            )
            receive_request = s.ReceiveMessageRequest(
                group=v2.Resource(name=group),
                message_queue=v2.MessageQueue(
                    topic=v2.Resource(name=DRAIN_TOPIC), id=-1, broker=v2.Broker(name=BROKER_NAME)
                ),
                filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                batch_size=BATCH,
                invisible_duration=duration(INVISIBLE_MS),
                long_polling_timeout=duration(0),
            ).SerializeToString()
            group_resource = v2.Resource(name=group)
            topic_resource = v2.Resource(name=DRAIN_TOPIC)
        else:
            pop = channel.unary_unary(
                BROKER_POP, response_deserializer=broker_pb2.PopMessageResponse.FromString
            )
            ack = channel.unary_unary(
                BROKER_ACK,
                request_serializer=broker_pb2.AckMessageRequest.SerializeToString,
                response_deserializer=broker_pb2.AckMessageResponse.FromString,
            )
            pop_request = broker_pb2.PopMessageRequest(
                consumer_group=group,
                topic=DRAIN_TOPIC,
                max_msg_nums=BATCH,
                invisible_ms=INVISIBLE_MS,
                max_wait_ms=0,
                sub_expression="*",
            ).SerializeToString()
        print("ready", flush=True)
        sys.stdin.readline()

        cpu0 = time.process_time()
        start = time.monotonic()
        while mode == "proxy":
            entries = []
            code = None
            for response in receive(receive_request, timeout=CALL_TIMEOUT_S, metadata=md):
                if response.HasField("status"):
                    code = response.status.code
                elif response.HasField("message"):
                    sp = response.message.system_properties
                    seqs.append(int(response.message.body[:8]))
                    redelivered += sp.delivery_attempt != 1
                    entries.append(
                        s.AckMessageEntry(
                            message_id=sp.message_id, receipt_handle=sp.receipt_handle
                        )
                    )
            calls += 1
            if code == NOT_FOUND and not entries:
                break  # everything preloaded is handed out (none comes back within 60 s)
            if code != OK or not entries:
                raise RuntimeError(f"receive: status {code} with {len(entries)} messages")
            answer = v2_ack(
                s.AckMessageRequest(group=group_resource, topic=topic_resource, entries=entries),
                timeout=CALL_TIMEOUT_S,
                metadata=md,
            )
            calls += 1
            bad = sum(1 for e in answer.entries if e.status.code != OK)
            bad += abs(len(entries) - len(answer.entries))
            bad_acks += bad or (len(entries) if answer.status.code != OK else 0)
        if mode == "direct":
            counts = pop_and_ack(pop, ack, pop_request, group, DRAIN_TOPIC, CALL_TIMEOUT_S)
            seqs, calls = counts["seqs"], counts["calls"]
            bad_acks, redelivered = counts["bad_acks"], counts["redelivered"]
        end = time.monotonic()
    return {
        "start": start,
        "end": end,
        "calls": calls,
        "cpu_s": time.process_time() - cpu0,
        "bad_acks": bad_acks,
        "redelivered": redelivered,
        "seqs": seqs,
    }


def _run_consumers(cluster: Cluster, specs: list[dict], workdir: Path) -> tuple[Drain, list]:
    """One consumer process per spec, released together; the drain they made."""
    reports, (b0, p0), (b1, p1) = run_consumers(
        "benchmarks.proxy_bench", specs, workdir, cluster.cpu
    )
    start = min(r["start"] for r in reports)
    drain = Drain(
        messages=sum(len(r["seqs"]) for r in reports),
        seconds=max(r["end"] for r in reports) - start,
        calls=sum(r["calls"] for r in reports),
        broker_cpu_s=b1 - b0,
        proxy_cpu_s=p1 - p0,
        client_cpu_s=sum(r["cpu_s"] for r in reports),
    )
    return drain, reports


def _drain(cluster: Cluster, plan: Plan, workdir: Path, mode: str, r: int) -> Drain:
    """One drain of the preloaded topic by a fresh group, checked."""
    group = f"bench-{mode}-{r}"
    target = cluster.proxy.target if mode == "proxy" else cluster.broker.target
    spec = {"mode": mode, "target": target, "group": group}
    drain, reports = _run_consumers(cluster, [spec] * CONSUMERS, workdir)
    check_reports(reports, plan.messages, mode, first_deliveries=True)
    per_queue = plan.messages // QUEUES
    check_group(cluster.broker.target, group, DRAIN_TOPIC, QUEUES, per_queue, "its drain")
    _progress(f"drain round {r + 1}, {mode}: {drain.text()}")
    return drain


def receive_and_ack(cluster: Cluster, plan: Plan, workdir: Path) -> Figure:
    def ratio(pair: tuple[Drain, Drain]) -> float:
        return pair[0].rate / pair[1].rate

    pairs = _paired(
        plan.rounds, lambda mode, r: _drain(cluster, plan, workdir, mode, r), ratio, "drain"
    )
    proxy, base = _median_pair(pairs, ratio)
    return Figure(
        name=f"v2 ReceiveMessage + AckMessage via the proxy, {CONSUMERS} consumers, "
        f"{BATCH}/receive, {plan.messages:,} x {BODY_SIZE} B over {QUEUES} queues",
        value=proxy.rate,
        unit="msgs/s",
        baseline=base.rate,
        baseline_label=f"ferry.v1 PopMessage {BATCH} + AckMessage on the broker, same round",
        target=Target("ratio", ">=", 0.7),
        detail=f"{plan.rounds} paired round{'s' if plan.rounds != 1 else ''} (one drain each "
        "way, back to back, the order alternating, a fresh group each); the round with the "
        "median ratio is shown. Ratios by round: " + _ratios(pairs, ratio) + ". Via the "
        "proxy: "
        + "; ".join(p.text() for p, _ in pairs)
        + ". Direct: "
        + "; ".join(d.text() for _, d in pairs)
        + f". The proxy's CPU per message caps it near {1e6 / proxy.proxy_us:,.0f} msgs/s even "
        "on a core of its own. Each consumer is a process with one channel, one call at a "
        "time (synchronous grpc), the same for both modes. Every drain: each message "
        "received exactly once and on its first delivery, every ack OK, every queue committed "
        "to its end with nothing in flight.",
    )


if __name__ == "__main__":
    if sys.argv[1:2] != ["consume"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.proxy_bench consume SPEC_JSON")
    print(json.dumps(_consume(json.loads(sys.argv[2]))), flush=True)
