"""Operators' tools against ferry and Apache RocketMQ 4.9, same run: how long Apache's own
`mqadmin` takes to answer on a cluster with 1,000 topics and 100 consumer groups.

Each side is one ASYNC_MASTER and its name server (tests/compat/remoting_backends.py,
`SINGLE`), loaded alike over RocketMQ's protocol: 1,000 topics of 4 queues, one message
in each queue; 100 subscription groups, each with its retry topic and committed offsets
(1, past the queue's message) on the 4 queues of 10 topics. Then one warm mqadmin JVM per
side (tests/compat/mqadmin.py: MQAdminStartup.main0, unchanged, many commands in one JVM,
so a JVM's start is not what is measured) runs, in alternating rounds:

- `clusterList`: the name server's cluster info (106), then the broker's runtime info (28);
- `consumerProgress -g G`: the route of %RETRY%G (105), consume stats (208) over the group's
  40 queues (a store-time lookup each), and the group's connections (203);
- `consumerProgress` (no group): the topic list (206), then for each of the 100 groups its
  route, consume stats and connections: ~400 requests.

A figure is the median command time over a round's repetitions, then the median over the
rounds of ferry / Apache; target ≤ 1.0 (ferry answers at least as fast).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import BenchResult, Figure, Target
from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command

TITLE = "Operators' tools: mqadmin against ferry and Apache RocketMQ 4.9"
TOPICS = 1_000
GROUPS = 100
QUEUES = 4
TOPICS_PER_GROUP = 10
IN_FLIGHT = 64


@dataclass(frozen=True)
class Plan:
    topics: int
    groups: int
    rounds: int
    repeats: int
    warmup: int  # runs of each command on each side before the first round


FULL = Plan(TOPICS, GROUPS, rounds=3, repeats=7, warmup=15)
QUICK = Plan(40, 5, rounds=1, repeats=2, warmup=1)

COMMANDS: dict[str, Callable[[Plan], list[str]]] = {
    "clusterList": lambda plan: ["clusterList"],
    "consumerProgress -g": lambda plan: ["consumerProgress", "-g", group_name(0)],
    "consumerProgress": lambda plan: ["consumerProgress"],
}


def topic_name(i: int) -> str:
    return f"AdmBench{i:04d}"


def group_name(i: int) -> str:
    return f"AdmBenchGroup{i:03d}"


def _progress(text: str) -> None:
    print(f"[admin] {text}", file=sys.stderr, flush=True)


async def _pipelined(addr: str, commands: Sequence[Command], what: str) -> None:
    """Every command over one connection, IN_FLIGHT at a time; each must succeed."""
    client = await RemotingClient.connect(addr)
    try:
        pending = list(commands)
        for start in range(0, len(pending), IN_FLIGHT):
            answers = await asyncio.gather(
                *(client.request(c, timeout=30) for c in pending[start : start + IN_FLIGHT])
            )
            bad = [a for a in answers if a.code != codes.SUCCESS]
            if bad:
                raise RuntimeError(f"{what} on {addr}: {bad[0].code} {bad[0].remark}")
    finally:
        client.close()


def _topic_request(topic: str, queues: int) -> Command:
    return Command(
        codes.UPDATE_AND_CREATE_TOPIC,
        ext={"topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
             "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG",
             "topicSysFlag": "0", "order": "false"},
    )  # fmt: skip


def _send_request(topic: str, queue_id: int) -> Command:
    return Command(
        codes.SEND_MESSAGE_V2,
        ext={"a": "AdmBenchProducer", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id),
             "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0",
             "k": "false", "m": "false"},
        body=b"m" * 64,
    )  # fmt: skip


def _group_request(group: str) -> Command:
    body = {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": False,
            "consumeBroadcastEnable": False, "retryQueueNums": 1, "retryMaxTimes": 16,
            "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True}  # fmt: skip
    return Command(codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(body).encode())


def _offset_request(group: str, topic: str, queue_id: int) -> Command:
    return Command(
        codes.UPDATE_CONSUMER_OFFSET,
        ext={"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "commitOffset": "1"},
    )


def load(master: str, plan: Plan) -> None:
    """The same topics, messages, groups and offsets on one side's master."""
    topics = [topic_name(i) for i in range(plan.topics)]
    groups = [group_name(i) for i in range(plan.groups)]

    async def go() -> None:
        await _pipelined(master, [_topic_request(t, QUEUES) for t in topics], "topics")
        await _pipelined(master, [_topic_request("%RETRY%" + g, 1) for g in groups], "retry topics")
        await _pipelined(master, [_group_request(g) for g in groups], "groups")
        sends = [_send_request(t, q) for t in topics for q in range(QUEUES)]
        await _pipelined(master, sends, "sends")
        offsets = [
            _offset_request(g, topics[(i * TOPICS_PER_GROUP + k) % len(topics)], q)
            for i, g in enumerate(groups)
            for k in range(TOPICS_PER_GROUP)
            for q in range(QUEUES)
        ]
        await _pipelined(master, offsets, "offsets")

    asyncio.run(go())


def _routed(namesrv: str, topic: str) -> bool:
    from ferry.remoting.client import call

    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), 10)
    return answer.code == codes.SUCCESS


def run(quick: bool, workdir: Path) -> BenchResult:
    from tests.compat.mqadmin import MqadminSession
    from tests.compat.remoting_backends import SINGLE, start_remoting_backend
    from tests.conftest import wait_for

    plan = QUICK if quick else FULL
    started = time.monotonic()
    result = BenchResult(TITLE)
    clusters = {}
    sessions = {}
    try:
        for side in ("ferry", "apache"):
            clusters[side] = start_remoting_backend(side, SINGLE, workdir / side)
            master = clusters[side].masters()[0].address
            t0 = time.monotonic()
            load(master, plan)
            last = "%RETRY%" + group_name(plan.groups - 1)
            wait_for(lambda s=side, t=last: _routed(clusters[s].namesrv, t), 60, f"{side}: routes")
            _progress(
                f"{side}: {plan.topics} topics, {plan.groups} groups loaded in "
                f"{time.monotonic() - t0:.1f} s"
            )
            sessions[side] = MqadminSession(workdir / f"mqadmin-{side}")
        times: dict[str, dict[str, list[float]]] = {
            c: {"ferry": [], "apache": []} for c in COMMANDS
        }
        for side, session in sessions.items():  # warm both mqadmin JVMs and both servers
            for _ in range(plan.warmup):
                for make in COMMANDS.values():
                    session.run(*make(plan), "-n", clusters[side].namesrv)
        for r in range(plan.rounds):
            order = ("ferry", "apache") if r % 2 == 0 else ("apache", "ferry")
            for name, make in COMMANDS.items():
                for side in order:
                    runs = []
                    for _ in range(plan.repeats):
                        out = sessions[side].run(*make(plan), "-n", clusters[side].namesrv)
                        if out.err.strip():
                            raise RuntimeError(f"{side}: mqadmin {name} failed: {out.err[-2000:]}")
                        runs.append(out.ms)
                    times[name][side].append(statistics.median(runs))
            _progress(
                f"round {r + 1}: "
                + "; ".join(
                    f"{n} ferry {t['ferry'][-1]:.1f} ms / Apache {t['apache'][-1]:.1f} ms"
                    for n, t in times.items()
                )
            )
        for name, t in times.items():
            ratios = [f / a for f, a in zip(t["ferry"], t["apache"], strict=True)]
            middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
            result.figures.append(
                Figure(
                    name=f"mqadmin {name}, {plan.topics:,} topics x {plan.groups} groups",
                    value=t["ferry"][middle],
                    unit="ms",
                    baseline=t["apache"][middle],
                    baseline_label="Apache RocketMQ 4.9.7, same command",
                    target=Target("ratio", "<=", 1.0),
                    detail=(
                        f"median of {plan.repeats} runs per round in a warm mqadmin JVM, "
                        f"{plan.rounds} alternating rounds, the median round shown; ratios "
                        + ", ".join(f"{x:.2f}" for x in ratios)
                        + "; ferry ms "
                        + ", ".join(f"{x:.1f}" for x in t["ferry"])
                        + "; Apache ms "
                        + ", ".join(f"{x:.1f}" for x in t["apache"])
                    ),
                )
            )
    finally:
        for session in sessions.values():
            session.stop()
        for cluster in clusters.values():
            cluster.stop()
    result.notes.append(
        "Each side: one ASYNC_MASTER and its name server on loopback, started by "
        "tests/compat/remoting_backends.py; mqadmin is rocketmq-tools 4.9.7's MQAdminStartup "
        "(tests/compat/mqadmin.py keeps one JVM per side)."
    )
    result.notes.append(f"The admin benchmark took {time.monotonic() - started:.0f} s.")
    return result
