"""Pop consumption and timed delivery (issue: pop + timers): 128-byte bodies on
loopback, ASYNC_FLUSH, every figure next to a baseline measured in the same run.

1. Pop + ack against pull + commit of the same messages. One topic of 8
   queues is preloaded with N messages (100,000 in a full run; `SendMessages`,
   batches of 250, 4 callers), each body carrying its sequence number and each
   message a 13-digit property, as many bytes as a timed entry's. Then,
   in alternating rounds, each with a fresh consumer group:
   (baseline) 4 pull consumers, each owning 2 of the 8 queues: `PullMessage`
   of 32 + `UpdateConsumerOffset` per batch, until their queues are drained;
   (pop) 4 pop consumers of one group: `PopMessage` (any queue, 32, invisible
   60 s, no wait) + `AckMessage` of the batch's handles, until a pop finds
   nothing. Messages/s from the first consumer's start to the last one's
   end. A round is one drain of each kind, back to back (the order
   alternating), and gives one ratio; the round with the median ratio is
   reported, every round in the detail. Every pop round is checked: each
   sequence number received exactly once, every ack OK, every delivery the
   first, and `GetGroupStatus` showing every queue committed to its end with
   nothing in flight. Each consumer is its own process (one channel, one call
   at a time, synchronous grpc), the same for both modes:
   `python -m benchmarks.pop_bench consume JSON` prints "ready", waits for a
   line on stdin, consumes and prints one JSON line.
2. Timed delivery: N timed messages (100,000; `TIMER_DELIVER_MS` uniform over
   25 s, the first due 12 s after the sends begin, so that on a quiet machine
   all N are pending at once) are sent with `SendMessages` batches of 250
   timed entries, 4 callers; their send rate is set against the plain preload
   of (1), same shape and bytes. The batches go out roughly in due order
   (sorted, then shuffled within tenths of N, 2.5 s of due times each): a batch
   is timed as a whole, so each entry must still be in the future when the
   broker gets it, even on a slow run. A pull consumer (one long-polling task
   per queue, 1,000 per pull) reads the target topic as they appear. Lateness
   = the wall time the message reached the client − TIMER_DELIVER_MS; the
   broker's own part = store_timestamp of the delivered copy −
   TIMER_DELIVER_MS. Baseline: plain messages sent one by one every 20 ms to
   the same topic during the delivery window and read by the same consumer
   (receive − send time; store_timestamp − send time). Messages due while
   timed batches were still arriving are also reported apart. The phase ends
   when everything has arrived, or fails 30 s after the last delivery time.

The broker runs as a child process pinned to one core; the consumer processes,
the producers and the timer consumer run on the other.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.broker_bench import _broker_args, _create_topic
from benchmarks.drains import (
    check_group,
    check_reports,
    pop_and_ack,
    run_consumers,
    send_all,
    wait_queue_ends,
)
from benchmarks.procs import ServerProcess, cpu_plan, pinned, pinning_note
from benchmarks.report import BenchResult, Figure, Target
from ferry.v1 import broker_pb2

TITLE = "pop — pop consumption and timed delivery"

SEND_ONE_METHOD = "/ferry.v1.Broker/SendMessage"
PULL_METHOD = "/ferry.v1.Broker/PullMessage"
COMMIT_METHOD = "/ferry.v1.Broker/UpdateConsumerOffset"
POP_METHOD = "/ferry.v1.Broker/PopMessage"
ACK_METHOD = "/ferry.v1.Broker/AckMessage"
MAX_OFFSET_METHOD = "/ferry.v1.Broker/GetMaxOffset"

POP_TOPIC = "PopBench"
TIMED_TOPIC = "TimedBench"
QUEUES = 8
CONSUMERS = 4
CONSUMER_BATCH = 32
INVISIBLE_MS = 60_000
BODY_SIZE = 128
SEND_BATCH = 250
SENDERS = 4
TIMER_PULL_NUMS = 1000
TIMER_PULL_WAIT_MS = 500
PLAIN_INTERVAL_S = 0.02
TIMER_PROPERTY = "TIMER_DELIVER_MS"
PLAIN_PROPERTY = "PLAIN_DELIVER_MS"  # the preload's: the same bytes as a timed entry's
CALL_TIMEOUT_S = 30.0
PROGRESS_S = 5.0


@dataclass(frozen=True)
class Plan:
    messages: int  # preloaded for the pop/pull comparison; a multiple of QUEUES * SEND_BATCH
    rounds: int
    timers: int
    timer_lead_ms: int  # the first delivery time after the first timed send
    timer_spread_ms: int
    timer_grace_s: float  # after the last delivery time


FULL = Plan(100_000, 5, 100_000, 12_000, 25_000, 30.0)
QUICK = Plan(8_000, 1, 10_000, 2_000, 4_000, 15.0)


def _progress(text: str) -> None:
    print(f"  pop: {text}", file=sys.stderr, flush=True)


def _wall_ms() -> float:
    return time.time() * 1000


def _body(seq: int, deliver_ms: int = 0) -> bytes:
    """`SSSSSSSS DDDDDDDDDDDDD ` + padding: the sequence number and, for a timed
    message, its delivery time (the broker strips TIMER_DELIVER_MS from the copy)."""
    return f"{seq:08d} {deliver_ms:013d} ".encode().ljust(BODY_SIZE, b".")


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99, max."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[98], max(values)


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    started = time.monotonic()
    result = BenchResult(TITLE)
    server_cpus, client_cpus = cpu_plan()
    broker = ServerProcess(
        "services.broker", _broker_args(workdir / "store"), workdir, "broker", server_cpus
    )
    with pinned(client_cpus), broker:
        _create_topic(broker.target, POP_TOPIC, QUEUES)
        _create_topic(broker.target, TIMED_TOPIC, QUEUES)
        preload_rate = preload(broker.target, plan)
        result.figures.append(pop_against_pull(broker, plan, workdir))
        result.figures += timed_delivery(broker, plan, preload_rate)
    result.notes.append(
        pinning_note(server_cpus, client_cpus, "The broker", "consumers and producers")
    )
    result.notes.append(f"The pop benchmark took {time.monotonic() - started:.0f} s.")
    return result


# ---------------------------------------------------------------- sends


def preload(target: str, plan: Plan) -> float:
    """N plain messages, the same count in each queue, each with a property of
    the size of a timed entry's; returns messages/s."""
    requests = [
        broker_pb2.SendMessagesRequest(
            topic=POP_TOPIC,
            queue_id=batch % QUEUES,
            messages=[
                broker_pb2.SendEntry(body=_body(seq), properties={PLAIN_PROPERTY: "0" * 13})
                for seq in range(batch * SEND_BATCH, (batch + 1) * SEND_BATCH)
            ],
        ).SerializeToString()
        for batch in range(plan.messages // SEND_BATCH)
    ]
    seconds, _ = asyncio.run(send_all(target, requests, SENDERS))
    rate = plan.messages / seconds
    _progress(f"preloaded {plan.messages:,} messages in {seconds:.1f} s ({rate:,.0f}/s)")
    wait_queue_ends(target, POP_TOPIC, QUEUES, plan.messages // QUEUES)
    return rate


# ---------------------------------------------------------------- pop against pull


@dataclass(frozen=True)
class Drain:
    rate: float
    seconds: float
    calls: int
    client_cpu: float  # CPU-seconds of all consumers / wall seconds
    server_cpu: float
    server_us_per_msg: float  # broker CPU per message consumed

    def text(self) -> str:
        return (
            f"{self.rate:,.0f} msgs/s ({self.seconds:.2f} s, {self.calls:,} calls, broker CPU "
            f"{self.server_cpu:.0%} = {self.server_us_per_msg:.0f} µs/msg, consumers' CPU "
            f"{self.client_cpu:.0%})"
        )


def _run_consumers(broker: ServerProcess, specs: list[dict], workdir: Path) -> tuple[Drain, list]:
    """One consumer process per spec, released together; the drain they made."""

    def sample() -> tuple[float, float]:
        return broker.cpu_seconds(), time.monotonic()

    reports, (cpu0, wall0), (cpu1, wall1) = run_consumers(
        "benchmarks.pop_bench", specs, workdir, sample
    )
    server_cpu_s = cpu1 - cpu0
    start = min(r["start"] for r in reports)
    seconds = max(r["end"] for r in reports) - start
    messages = sum(len(r["seqs"]) for r in reports)
    drain = Drain(
        rate=messages / seconds,
        seconds=seconds,
        calls=sum(r["calls"] for r in reports),
        client_cpu=sum(r["cpu_s"] for r in reports) / seconds,
        server_cpu=server_cpu_s / max(wall1 - wall0, 1e-9),
        server_us_per_msg=server_cpu_s / max(messages, 1) * 1e6,
    )
    return drain, reports


def pop_against_pull(broker: ServerProcess, plan: Plan, workdir: Path) -> Figure:
    """Paired rounds: each round drains the topic once with pull + commit and
    once with pop + ack, back to back (pull first in odd rounds, pop first in
    even ones), and gives one ratio. This machine's speed drifts by tens of
    percent within a minute; a ratio of two neighbouring drains carries little
    of that drift, a ratio of medians taken minutes apart carries all of it.
    The round with the median ratio is the figure."""
    per_queue = plan.messages // QUEUES
    rounds: list[tuple[Drain, Drain]] = []  # (pop, pull)
    for r in range(plan.rounds):
        drains = {}
        for mode in ("pull", "pop") if r % 2 == 0 else ("pop", "pull"):
            drains[mode] = _drain(broker, plan, workdir, mode, r, per_queue)
            label = "pull + commit" if mode == "pull" else "pop + ack"
            _progress(f"round {r + 1}/{plan.rounds}: {label} {drains[mode].text()}")
        rounds.append((drains["pop"], drains["pull"]))
        _progress(f"round {r + 1}/{plan.rounds}: ratio {_ratio(rounds[-1]):.2f}")
    by_ratio = sorted(rounds, key=_ratio)
    pop, pull = by_ratio[len(by_ratio) // 2]
    return Figure(
        name=f"PopMessage + AckMessage, {CONSUMERS} consumers, {CONSUMER_BATCH}/pop, "
        f"{plan.messages:,} x {BODY_SIZE} B over {QUEUES} queues",
        value=pop.rate,
        unit="msgs/s",
        baseline=pull.rate,
        baseline_label=f"PullMessage {CONSUMER_BATCH} + UpdateConsumerOffset, {CONSUMERS} "
        f"consumers on {QUEUES // CONSUMERS} queues each, in the same round",
        target=Target("ratio", ">=", 0.7),
        detail=f"{plan.rounds} paired round{'s' if plan.rounds != 1 else ''} (pull and pop back to back, the order "
        "alternating); the round with the median ratio is shown. Ratios by round: "
        + ", ".join(f"{_ratio(pair):.2f}" for pair in rounds)
        + f" (lowest {_ratio(by_ratio[0]):.2f}). Pop: "
        + "; ".join(p.text() for p, _ in rounds)
        + ". Pull: "
        + "; ".join(p.text() for _, p in rounds)
        + ". Each consumer a process with one channel, one call at a time. Every pop round: "
        "each message received exactly once, every ack OK, no redelivery, every queue "
        "committed to its end with nothing in flight.",
    )


def _ratio(pair: tuple[Drain, Drain]) -> float:
    pop, pull = pair
    return pop.rate / pull.rate


def _drain(
    broker: ServerProcess, plan: Plan, workdir: Path, mode: str, r: int, per_queue: int
) -> Drain:
    """One drain of the preloaded topic by a fresh group, checked."""
    if mode == "pull":
        specs = [
            {
                "mode": "pull",
                "target": broker.target,
                "group": f"bench-pull-{r}",
                "queues": list(range(i, QUEUES, CONSUMERS)),
                "end": per_queue,
            }
            for i in range(CONSUMERS)
        ]
        drain, reports = _run_consumers(broker, specs, workdir)
        check_reports(reports, plan.messages, "pull", first_deliveries=False)
        return drain
    group = f"bench-pop-{r}"
    specs = [{"mode": "pop", "target": broker.target, "group": group}] * CONSUMERS
    drain, reports = _run_consumers(broker, specs, workdir)
    check_reports(reports, plan.messages, "pop", first_deliveries=True)
    check_group(broker.target, group, POP_TOPIC, QUEUES, per_queue, "the pop round")
    return drain


# ---------------------------------------------------------------- the consumer process


def _consume(spec: dict) -> dict:
    target = spec["target"]
    group = spec["group"]
    with grpc.insecure_channel(target) as channel:

        def method(name, request_type, response_type):
            return channel.unary_unary(
                name,
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )

        pull = method(PULL_METHOD, broker_pb2.PullMessageRequest, broker_pb2.PullMessageResponse)
        commit = method(
            COMMIT_METHOD,
            broker_pb2.UpdateConsumerOffsetRequest,
            broker_pb2.UpdateConsumerOffsetResponse,
        )
        pop = method(POP_METHOD, broker_pb2.PopMessageRequest, broker_pb2.PopMessageResponse)
        ack = method(ACK_METHOD, broker_pb2.AckMessageRequest, broker_pb2.AckMessageResponse)
        max_offset = method(
            MAX_OFFSET_METHOD, broker_pb2.GetMaxOffsetRequest, broker_pb2.GetOffsetResponse
        )
        max_offset(broker_pb2.GetMaxOffsetRequest(topic=POP_TOPIC), timeout=CALL_TIMEOUT_S)
        print("ready", flush=True)
        sys.stdin.readline()

        seqs: list[int] = []
        calls = bad_acks = redelivered = 0
        cpu0 = time.process_time()
        start = time.monotonic()
        if spec["mode"] == "pull":
            end = spec["end"]
            offsets = dict.fromkeys(spec["queues"], 0)
            active = list(offsets)
            while active:
                for queue in tuple(active):
                    answer = pull(
                        broker_pb2.PullMessageRequest(
                            consumer_group=group,
                            topic=POP_TOPIC,
                            queue_id=queue,
                            queue_offset=offsets[queue],
                            max_msg_nums=CONSUMER_BATCH,
                        ),
                        timeout=CALL_TIMEOUT_S,
                    )
                    if answer.status != broker_pb2.FOUND:
                        raise RuntimeError(
                            f"queue {queue} at {offsets[queue]}: pull status {answer.status}"
                        )
                    seqs.extend(int(m.body[:8]) for m in answer.messages)
                    offsets[queue] = answer.next_begin_offset
                    commit(
                        broker_pb2.UpdateConsumerOffsetRequest(
                            consumer_group=group,
                            topic=POP_TOPIC,
                            queue_id=queue,
                            offset=offsets[queue],
                        ),
                        timeout=CALL_TIMEOUT_S,
                    )
                    calls += 2
                    if offsets[queue] >= end:
                        active.remove(queue)
        else:
            counts = pop_and_ack(
                pop,
                ack,
                broker_pb2.PopMessageRequest(
                    consumer_group=group,
                    topic=POP_TOPIC,
                    max_msg_nums=CONSUMER_BATCH,
                    invisible_ms=INVISIBLE_MS,
                    max_wait_ms=0,
                ),
                group,
                POP_TOPIC,
                CALL_TIMEOUT_S,
            )
            seqs, calls = counts["seqs"], counts["calls"]
            bad_acks, redelivered = counts["bad_acks"], counts["redelivered"]
        end_time = time.monotonic()
    return {
        "start": start,
        "end": end_time,
        "calls": calls,
        "cpu_s": time.process_time() - cpu0,
        "bad_acks": bad_acks,
        "redelivered": redelivered,
        "seqs": seqs,
    }


def _consume_main(argv: list[str]) -> int:
    (spec,) = argv
    print(json.dumps(_consume(json.loads(spec))), flush=True)
    return 0


# ---------------------------------------------------------------- timed delivery


@dataclass
class Latencies:
    """Milliseconds: receive − due (or send) time, store_timestamp − due (or send) time."""

    received: list[float]
    stored: list[float]

    def text(self) -> str:
        p50, p99, top = _quantiles(self.received)
        s50, s99, stop = _quantiles(self.stored)
        return (
            f"{len(self.received):,} messages; received p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"max {top:.1f} ms; stored p50 {s50:.1f} ms, p99 {s99:.1f} ms, max {stop:.1f} ms"
        )


@dataclass
class TimerRun:
    send_s: float
    sent_before_due: int
    during_sends: Latencies  # the timed messages due before the last timed batch was stored
    after_sends: Latencies
    timed: Latencies
    plain: Latencies
    early: int  # stored before their delivery time
    duplicates: int
    plain_sent: int
    pulls: int
    server_cpu: float


async def _timers(broker: ServerProcess, plan: Plan) -> TimerRun:
    n = plan.timers
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(broker.target, options=options) as channel:
        pull = channel.unary_unary(
            PULL_METHOD,
            request_serializer=broker_pb2.PullMessageRequest.SerializeToString,
            response_deserializer=broker_pb2.PullMessageResponse.FromString,
        )
        send_one = channel.unary_unary(
            SEND_ONE_METHOD,
            request_serializer=broker_pb2.SendMessageRequest.SerializeToString,
            response_deserializer=broker_pb2.SendResult.FromString,
        )
        await asyncio.wait_for(channel.channel_ready(), CALL_TIMEOUT_S)

        timed = Latencies([], [])
        timed_due: list[int] = []
        plain = Latencies([], [])
        seen = bytearray(n)
        counts = {"early": 0, "duplicates": 0, "pulls": 0, "plain_sent": 0}
        stop = asyncio.Event()

        async def consume(queue: int) -> None:
            offset = 0
            while not stop.is_set():
                answer = await pull(
                    broker_pb2.PullMessageRequest(
                        consumer_group="bench-timer",
                        topic=TIMED_TOPIC,
                        queue_id=queue,
                        queue_offset=offset,
                        max_msg_nums=TIMER_PULL_NUMS,
                        max_wait_ms=TIMER_PULL_WAIT_MS,
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                now = _wall_ms()
                counts["pulls"] += 1
                if answer.status == broker_pb2.NO_NEW_MSG:
                    continue
                if answer.status != broker_pb2.FOUND:
                    raise RuntimeError(f"queue {queue} at {offset}: pull status {answer.status}")
                offset = answer.next_begin_offset
                for m in answer.messages:
                    body = m.body
                    if body[:1] == b"P":
                        plain.received.append(now - m.born_timestamp)
                        plain.stored.append(m.store_timestamp - m.born_timestamp)
                        continue
                    seq, due = int(body[:8]), int(body[9:22])
                    if seen[seq]:
                        counts["duplicates"] += 1
                        continue
                    seen[seq] = 1
                    timed.received.append(now - due)
                    timed_due.append(due)
                    timed.stored.append(m.store_timestamp - due)
                    counts["early"] += m.store_timestamp < due

        consumers = [asyncio.create_task(consume(q)) for q in range(QUEUES)]
        try:
            rng = random.Random(7)
            offsets = sorted(rng.randrange(plan.timer_spread_ms) for _ in range(n))
            tenth = max(n // 10, 1)
            for i in range(0, n, tenth):
                part = offsets[i : i + tenth]
                rng.shuffle(part)
                offsets[i : i + tenth] = part
            first = int(_wall_ms()) + plan.timer_lead_ms
            due = [first + offset for offset in offsets]
            last = max(due)
            requests = [
                broker_pb2.SendMessagesRequest(
                    topic=TIMED_TOPIC,
                    messages=[
                        broker_pb2.SendEntry(
                            body=_body(seq, due[seq]), properties={TIMER_PROPERTY: str(due[seq])}
                        )
                        for seq in range(start, min(start + SEND_BATCH, n))
                    ],
                ).SerializeToString()
                for start in range(0, n, SEND_BATCH)
            ]
            try:
                send_s, answered_ms = await send_all(broker.target, requests, SENDERS)
            except grpc.aio.AioRpcError as exc:
                raise RuntimeError(
                    f"a timed batch was refused ({exc.code().name}: {exc.details()}); if some "
                    "of its entries were due by the time it arrived, the sends were too slow "
                    "for the lead"
                ) from None
            sent_before_due = sum(
                min(SEND_BATCH, n - i * SEND_BATCH)
                for i, at in enumerate(answered_ms)
                if at <= first
            )
            _progress(
                f"timers: {n:,} timed messages sent in {send_s:.1f} s ({n / send_s:,.0f}/s); "
                f"the first is due in {(first - _wall_ms()) / 1000:.1f} s, the last in "
                f"{(last - _wall_ms()) / 1000:.1f} s"
            )

            async def plain_sender() -> None:
                seq = 0
                while _wall_ms() < last + 1000:
                    answer = await send_one(
                        broker_pb2.SendMessageRequest(
                            topic=TIMED_TOPIC,
                            body=b"P%07d" % seq,
                            born_timestamp=int(_wall_ms()),
                        ),
                        timeout=CALL_TIMEOUT_S,
                    )
                    if answer.status != broker_pb2.SEND_OK:
                        raise RuntimeError(f"plain send failed: {answer}")
                    seq += 1
                    counts["plain_sent"] = seq
                    await asyncio.sleep(PLAIN_INTERVAL_S)

            await asyncio.sleep(max(first - _wall_ms(), 0) / 1000)
            cpu0, wall0 = broker.cpu_seconds(), time.monotonic()
            sender = asyncio.create_task(plain_sender())
            deadline = last + plan.timer_grace_s * 1000
            next_report = time.monotonic() + PROGRESS_S
            while True:
                done = sender.done() and len(plain.received) >= counts["plain_sent"]
                if len(timed.received) >= n and done:
                    break
                if sender.done() and sender.exception() is not None:
                    raise sender.exception()
                if any(c.done() for c in consumers):
                    for c in consumers:
                        if c.done():
                            c.result()
                if _wall_ms() > deadline:
                    raise RuntimeError(
                        f"{n - len(timed.received):,} of {n:,} timed messages and "
                        f"{counts['plain_sent'] - len(plain.received)} plain ones had not arrived "
                        f"{plan.timer_grace_s:g} s after the last delivery time"
                    )
                if time.monotonic() >= next_report:
                    next_report += PROGRESS_S
                    now = _wall_ms()
                    _progress(
                        f"timers: {len(timed.received):,}/{n:,} received, "
                        f"{sum(1 for d in due if d <= now):,} due"
                    )
                await asyncio.sleep(0.1)
            server_cpu = (broker.cpu_seconds() - cpu0) / (time.monotonic() - wall0)
        finally:
            stop.set()
            await asyncio.gather(*consumers, return_exceptions=True)
    sends_done = max(answered_ms)
    during_sends, after_sends = Latencies([], []), Latencies([], [])
    for due_ms, received, stored in zip(timed_due, timed.received, timed.stored, strict=True):
        part = during_sends if due_ms <= sends_done else after_sends
        part.received.append(received)
        part.stored.append(stored)
    return TimerRun(
        send_s=send_s,
        sent_before_due=sent_before_due,
        during_sends=during_sends,
        after_sends=after_sends,
        timed=timed,
        plain=plain,
        early=counts["early"],
        duplicates=counts["duplicates"],
        plain_sent=counts["plain_sent"],
        pulls=counts["pulls"],
        server_cpu=server_cpu,
    )


def timed_delivery(broker: ServerProcess, plan: Plan, preload_rate: float) -> list[Figure]:
    r = asyncio.run(_timers(broker, plan))
    n = plan.timers
    received = _quantiles(r.timed.received)
    stored = _quantiles(r.timed.stored)
    plain_received = _quantiles(r.plain.received)
    plain_stored = _quantiles(r.plain.stored)
    what = f"{n:,} timers due over {plan.timer_spread_ms / 1000:g} s"
    detail = (
        f"Timed: {r.timed.text()}. Plain (one SendMessage every {PLAIN_INTERVAL_S * 1000:g} ms, "
        f"same topic and consumer): {r.plain.text()}. {r.early} timed messages stored before "
        f"their time, {r.duplicates} received twice. Consumer: {QUEUES} long-polling pull "
        f"tasks ({TIMER_PULL_NUMS}/pull, wait {TIMER_PULL_WAIT_MS} ms), {r.pulls:,} pulls; "
        f"broker CPU {r.server_cpu:.0%} during the delivery window. Sending took "
        f"{r.send_s:.1f} s; {r.sent_before_due:,} timed messages were stored before the first "
        f"was due ({plan.timer_lead_ms / 1000:g} s after the sends began)"
        + (
            f"; due while timed batches were still arriving: {r.during_sends.text()}; due "
            f"after: {r.after_sends.text()}."
            if r.during_sends.received
            else "."
        )
    )
    plain_label = "plain messages: receive − send time"
    return [
        Figure(
            name=f"Timed delivery lateness p99 (receive − TIMER_DELIVER_MS), {what}",
            value=received[1],
            unit="ms",
            baseline=plain_received[1],
            baseline_label=plain_label + ", p99",
            target=Target("value", "<=", 1000.0),
            detail=detail,
        ),
        Figure(
            name="Timed delivery lateness p50 (receive − TIMER_DELIVER_MS)",
            value=received[0],
            unit="ms",
            baseline=plain_received[0],
            baseline_label=plain_label + ", p50",
            target=None,
        ),
        Figure(
            name="Timed delivery lateness max (receive − TIMER_DELIVER_MS)",
            value=received[2],
            unit="ms",
            baseline=plain_received[2],
            baseline_label=plain_label + ", max",
            target=None,
        ),
        Figure(
            name="Broker's own lateness p99 (store_timestamp − TIMER_DELIVER_MS)",
            value=stored[1],
            unit="ms",
            baseline=plain_stored[1],
            baseline_label="plain messages: store_timestamp − send time, p99",
            target=None,
            detail=f"p50 {stored[0]:.1f} ms, max {stored[2]:.1f} ms; plain p50 "
            f"{plain_stored[0]:.1f} ms, max {plain_stored[2]:.1f} ms. Millisecond timestamps.",
        ),
        Figure(
            name=f"SendMessages of timed entries, batches of {SEND_BATCH} x {BODY_SIZE} B, "
            f"{SENDERS} callers",
            value=n / r.send_s,
            unit="msgs/s",
            baseline=preload_rate,
            baseline_label="the plain preload: same batches, callers and property bytes",
            target=None,
            detail=f"{n:,} messages in {r.send_s:.1f} s. A timed batch goes to the timer "
            "queue; the timer reads each entry's TIMER_DELIVER_MS as it arrives.",
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] != ["consume"]:
        raise SystemExit("usage: python -m benchmarks.pop_bench consume JSON")
    raise SystemExit(_consume_main(sys.argv[2:]))
