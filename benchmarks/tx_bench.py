"""Transactional messages and the message index (issue 30), with RocketMQ's own
benchmark tools (rocketmq-example 4.7.0 on the 4.9.7 client, unchanged, as the apache
benchmark runs them: TOOL_THREADS sending threads, BODY_SIZE-byte messages, a report line
every 10 s).

Two clusters, each a name server and ASYNC_MASTERs on the server core, the tools on the
other core (both up throughout; the side not measured is idle):
- ferry: `bench-tx` (the message index on, the default) and `bench-noidx`
  (messageIndexEnable=false);
- Apache RocketMQ 4.9.7: one ASYNC_MASTER.

In each round, in alternating order where the two sides meet, on fresh topics of QUEUES
queues:
1. Apache's `TransactionProducer` (every transaction committed: prepare, then END_TRANSACTION
   commit) against ferry's `bench-tx` and against Apache: ferry / Apache, target >= 0.7;
2. Apache's `Producer` (plain sends, the same threads and size) against `bench-tx`: the
   transactional rate of 1. over this one, target >= 0.5;
3. `Producer -k true` (each message with a key, indexed) against `bench-tx` (index on) and
   `bench-noidx` (index off): on / off, target >= 0.9.
A run goes until its report lines have settled (as the apache benchmark's tool runs:
at least `min_lines`, at most `max_lines`); its rate is the mean of the last two lines.
Every figure is the median over the rounds of the per-round ratio.

Then the index's lookup latency: a ferry broker takes `index_messages` messages, each with a
key (batch sends over RocketMQ's protocol); once its index and its consume queues have caught
up, it answers `lookups` RocketMQ QUERY_MESSAGE requests (12) for random keys, one at a time
over one connection: p50 / p99, target p99 <= 10 ms (benchmarks/index_lookup.py).

`--quick`: one round, one report line per run, 200,000 indexed messages: a smoke run.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.apache_bench import (
    BODY_SIZE,
    TOOL_REPORT_S,
    TOOL_THREADS,
    JavaProgram,
    parse_producer,
    settled,
    start_all,
    steady,
    write_apache_metadata,
)
from benchmarks.broker_bench import _broker_args, _create_topic
from benchmarks.procs import (
    ServerProcess,
    cpu_plan,
    free_port,
    namesrv_process,
    pinning_note,
    wait_for_route,
)
from benchmarks.report import BenchResult, Figure, Target
from tests.apache import APACHE_FLOW_CONTROL, ROCKETMQ4_VERSION, ApacheBroker, ApacheNamesrv

TITLE = "tx — transactional sends and the message index, against Apache RocketMQ 4.9"
QUEUES = 4
FERRY, APACHE = "ferry", "Apache"
TX_GROUP = "benchmark_transaction_producer"  # the TransactionProducer's own


@dataclass(frozen=True)
class Plan:
    rounds: int
    min_lines: int
    max_lines: int
    index_messages: int
    lookups: int


FULL = Plan(rounds=3, min_lines=3, max_lines=4, index_messages=10_000_000, lookups=2_000)
QUICK = Plan(rounds=1, min_lines=1, max_lines=1, index_messages=200_000, lookups=200)

# TransactionProducer 4.7.0: "Send TPS: 123 Max RT: 45 AVG RT:6.7 Send Failed: 0 check: 0
# unexpectedCheck: 0 duplicatedCheck: 0".
_TX_LINE = re.compile(
    r"Send TPS:\s*(\d+)\s+Max RT:\s*(\d+)\s+AVG RT:\s*([\d.]+)\s+Send Failed:\s*(\d+)\s+"
    r"check:\s*(\d+)\s+unexpectedCheck:\s*(\d+)\s+duplicatedCheck:\s*(\d+)"
)


@dataclass(frozen=True)
class TxLine:
    tps: int
    avg_rt_ms: float
    failed: int
    checks: int
    unexpected: int
    duplicated: int


def parse_tx(text: str) -> list[TxLine]:
    """Every report line of Apache's TransactionProducer in `text`."""
    return [
        TxLine(int(m[1]), float(m[3]), int(m[4]), int(m[5]), int(m[6]), int(m[7]))
        for m in map(_TX_LINE.search, text.splitlines())
        if m
    ]


@dataclass(frozen=True)
class Run:
    what: str
    tps: float
    lines: tuple[int, ...]
    note: str = ""

    def text(self) -> str:
        return f"{self.what}: {self.tps:,.0f} msgs/s (lines {', '.join(f'{t:,}' for t in self.lines)}{self.note})"


def _progress(text: str) -> None:
    print(f"  tx: {text}", file=sys.stderr, flush=True)


def _tool(
    workdir: Path, name: str, main: str, args: Sequence[str], plan: Plan, transactional: bool
) -> Run:
    """One tool run until its lines settle; stopped by PID."""
    program = JavaProgram(
        workdir / name, "rocketmq4", f"org.apache.rocketmq.example.benchmark.{main}", args,
        heap="256m",
    )  # fmt: skip
    timeout = plan.max_lines * TOOL_REPORT_S + 60
    with program:
        if transactional:
            text = program.wait_for(
                lambda out: settled(parse_tx(out), plan.min_lines, plan.max_lines),
                timeout,
                "steady reports",
            )
            lines = parse_tx(text)
            failed = sum(x.failed for x in lines)
            odd = sum(x.unexpected + x.duplicated for x in lines)
            note = (f"; {failed} failed" if failed else "") + (
                f"; {odd} unexpected or duplicated checks" if odd else ""
            )
            last = steady(lines)
            return Run(
                name, statistics.mean(x.tps for x in last), tuple(x.tps for x in lines), note
            )
        text = program.wait_for(
            lambda out: settled(parse_producer(out), plan.min_lines, plan.max_lines),
            timeout,
            "steady reports",
        )
        plines = parse_producer(text)
        failed = sum(p.send_failed + p.response_failed for p in plines)
        return Run(
            name,
            statistics.mean(p.tps for p in steady(plines)),
            tuple(p.tps for p in plines),
            f"; {failed} failed" if failed else "",
        )


def _tx_args(namesrv: str, topic: str) -> list[str]:
    return ["-n", namesrv, "-t", topic, "-w", str(TOOL_THREADS), "-s", str(BODY_SIZE)]


def _plain_args(namesrv: str, topic: str, keys: bool) -> list[str]:
    return [*_tx_args(namesrv, topic), "-k", "true" if keys else "false"]


@dataclass
class Clusters:
    ferry_namesrv: str
    ferry_tx: ServerProcess
    ferry_noidx: ServerProcess
    apache_namesrv: str
    apache_broker: ApacheBroker


def _topics(round_: int) -> dict[str, str]:
    return {
        "tx": f"TxBench{round_}",
        "plain": f"PlainBench{round_}",
        "keyed": f"KeyedBench{round_}",
        "noidx": f"NoIdxBench{round_}",
    }


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    server_cpus, client_cpus = cpu_plan()
    figures: list[Figure] = []
    notes = [pinning_note(server_cpus, client_cpus, "Brokers and name servers", "the tools")]
    rounds: list[dict[str, Run]] = []
    with contextlib.ExitStack() as stack:
        _progress("starting ferry's and Apache's clusters")
        ns = stack.enter_context(namesrv_process(workdir, server_cpus))
        common = [f"namesrvAddr={ns.remoting_target}"]
        tx = stack.enter_context(
            ServerProcess(
                "services.broker",
                _broker_args(workdir / "bench-tx", *common, "brokerName=bench-tx"),
                workdir, "bench-tx", server_cpus,
            )
        )  # fmt: skip
        noidx = stack.enter_context(
            ServerProcess(
                "services.broker",
                _broker_args(
                    workdir / "bench-noidx", *common, "brokerName=bench-noidx",
                    "messageIndexEnable=false",
                ),
                workdir, "bench-noidx", server_cpus,
            )
        )  # fmt: skip
        apache_ns = ApacheNamesrv(workdir / "apache-namesrv", kit="rocketmq4")
        apache_ns.port = free_port()
        broker = ApacheBroker(
            workdir / "apache-broker", name="apache-tx", broker_name="apache-tx",
            role="ASYNC_MASTER", namesrv=apache_ns.address,
            settings={"autoCreateTopicEnable": False, **APACHE_FLOW_CONTROL},
        )  # fmt: skip
        all_topics = [_topics(r)["tx"] for r in range(plan.rounds)]
        write_apache_metadata(broker.store_dir, dict.fromkeys(all_topics, QUEUES))
        start_all(stack, [(apache_ns, server_cpus), (broker, server_cpus)])
        for r in range(plan.rounds):
            t = _topics(r)
            for topic in (t["tx"], t["plain"], t["keyed"]):
                _create_topic(tx.target, topic, QUEUES)
            _create_topic(noidx.target, t["noidx"], QUEUES)
            for topic in t.values():
                wait_for_route(ns.target, topic, 60)
        for r in range(plan.rounds):
            t = _topics(r)
            runs: dict[str, Run] = {}
            sides = [FERRY, APACHE] if r % 2 == 0 else [APACHE, FERRY]
            for side in sides:
                namesrv = ns.remoting_target if side == FERRY else apache_ns.address
                _progress(f"round {r + 1}: TransactionProducer against {side}")
                runs[f"tx-{side}"] = _tool(
                    workdir, f"tx-{side.lower()}-{r}", "TransactionProducer",
                    _tx_args(namesrv, t["tx"]), plan, transactional=True,
                )  # fmt: skip
            _progress(f"round {r + 1}: Producer (plain) against ferry")
            runs["plain"] = _tool(
                workdir, f"plain-{r}", "Producer", _plain_args(ns.remoting_target, t["plain"], False),
                plan, transactional=False,
            )  # fmt: skip
            order = [("keyed", "index on"), ("noidx", "index off")]
            for key, what in order if r % 2 == 0 else reversed(order):
                _progress(f"round {r + 1}: Producer -k true, {what}")
                runs[key] = _tool(
                    workdir, f"{key}-{r}", "Producer",
                    _plain_args(ns.remoting_target, t[key], True), plan, transactional=False,
                )  # fmt: skip
            rounds.append(runs)
        lookup = _lookup_figure(workdir, plan, server_cpus, client_cpus)
    figures += _tool_figures(rounds, plan)
    figures.append(lookup)
    return BenchResult(TITLE, figures, notes)


def _tool_figures(rounds: list[dict[str, Run]], plan: Plan) -> list[Figure]:
    """Per figure, the round whose ratio is the median (value and baseline from it)."""
    how = (
        f"rocketmq-example 4.7.0's tools on the {ROCKETMQ4_VERSION} client, {TOOL_THREADS} "
        f"threads, {BODY_SIZE}-byte messages, topics of {QUEUES} queues; "
        f"{plan.rounds} round(s), {plan.min_lines}-{plan.max_lines} report lines per run, "
        "the mean of the last two; the median round shown"
    )
    specs = [
        ("TransactionProducer (prepare + commit), ferry", f"tx-{FERRY}", f"tx-{APACHE}",
         "Apache RocketMQ 4.9.7, same tool", 0.7),
        ("ferry: TransactionProducer against Producer (plain sends)", f"tx-{FERRY}", "plain",
         "the same broker, plain sends", 0.5),
        ("ferry: Producer -k true (keys indexed), index on", "keyed", "noidx",
         "a broker with messageIndexEnable=false", 0.9),
    ]  # fmt: skip
    out = []
    for name, top, bottom, label, target in specs:
        ratios = [r[top].tps / max(r[bottom].tps, 1) for r in rounds]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
        detail = "; ".join(
            f"round {i + 1}: {r[top].text()} / {r[bottom].text()}" for i, r in enumerate(rounds)
        )
        out.append(
            Figure(
                name=name,
                value=rounds[middle][top].tps,
                unit="msgs/s",
                baseline=rounds[middle][bottom].tps,
                baseline_label=label,
                target=Target("ratio", ">=", target),
                detail=f"{how}; ratios {', '.join(f'{x:.2f}' for x in ratios)}. {detail}",
            )
        )
    return out


def _lookup_figure(workdir: Path, plan: Plan, server_cpus, client_cpus) -> Figure:
    from benchmarks.index_lookup import lookup_latency

    _progress(f"index lookups: writing {plan.index_messages:,} keyed messages")
    result = lookup_latency(workdir / "index", plan.index_messages, plan.lookups, server_cpus)
    return Figure(
        name=f"QUERY_MESSAGE by key, {plan.index_messages:,} indexed messages: p99",
        value=result.p99_ms,
        unit="ms",
        baseline=None,
        baseline_label="",
        target=Target("value", "<=", 10.0),
        detail=(
            f"{plan.lookups:,} lookups of random keys, one at a time over one connection: "
            f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, max {result.max_ms:.2f} "
            f"ms; every lookup found its message. Messages sent in {result.write_s:.0f} s; the "
            f"index and the consume queues caught up {result.index_s:.0f} s later, before "
            f"the lookups"
        ),
    )
