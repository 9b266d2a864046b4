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

The sides take turns run by run (a run of one command on one side, then on the other). A
command's time in mqadmin is mostly mqadmin's own (its admin client's start and shutdown:
~15-40 ms), and varies run to run by as much (p10 to p90 17-62 ms in one run of 50): a
figure is therefore the median of 25 runs per round and side, then the median over the
rounds of ferry / Apache; target ≤ 1.0 (ferry answers at least as fast).

Then RocketMQ's ACL: two ferry clusters (a name server and an ASYNC_MASTER each), one with
`aclEnable=true` and a plain_acl.yml, one without. Apache's 4.9.8 Java client
(tests/compat/client49 SendLoad49: DefaultMQProducer, ACL_THREADS threads of synchronous
single sends; with the ACL, every request signed by AclClientRPCHook) loads each in turn,
in alternating rounds. The figure is the ACL cluster's send rate over the open one's,
target ≥ 0.9; each side's broker CPU per message is reported beside it.
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
from ferry.model import RETRY_TOPIC_PREFIX
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
    acl_rounds: int  # (ACL on, ACL off) pairs of send runs
    acl_warmup_s: float
    acl_window_s: float
    acl_windows: int


FULL = Plan(TOPICS, GROUPS, rounds=3, repeats=25, warmup=15, acl_rounds=3, acl_warmup_s=20.0,
            acl_window_s=10.0, acl_windows=2)  # fmt: skip
QUICK = Plan(40, 5, rounds=1, repeats=2, warmup=1, acl_rounds=1, acl_warmup_s=2.0,
             acl_window_s=2.0, acl_windows=1)  # fmt: skip
ACL_THREADS = 64  # as the single-send figure of the apache benchmark (TOOL_THREADS)
ACL_TOPIC = "AclBench"
ACL_ADMIN = ("bench-admin", "bench-admin-secret")
ACL_PRODUCER = ("bench-producer", "bench-producer-secret")
ACL_YAML = f"""\
accounts:
  - accessKey: {ACL_ADMIN[0]}
    secretKey: {ACL_ADMIN[1]}
    admin: true
  - accessKey: {ACL_PRODUCER[0]}
    secretKey: {ACL_PRODUCER[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {ACL_TOPIC}=PUB
"""

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
        await _pipelined(
            master, [_topic_request(RETRY_TOPIC_PREFIX + g, 1) for g in groups], "retry topics"
        )
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
            last = RETRY_TOPIC_PREFIX + group_name(plan.groups - 1)
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
            for name, make in COMMANDS.items():
                runs: dict[str, list[float]] = {"ferry": [], "apache": []}
                for i in range(plan.repeats):  # the sides take turns, command by command
                    for side in ("ferry", "apache") if (r + i) % 2 == 0 else ("apache", "ferry"):
                        out = sessions[side].run(*make(plan), "-n", clusters[side].namesrv)
                        if out.err.strip():
                            raise RuntimeError(f"{side}: mqadmin {name} failed: {out.err[-2000:]}")
                        runs[side].append(out.ms)
                for side, ms in runs.items():
                    times[name][side].append(statistics.median(ms))
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
                    baseline_label="Apache RocketMQ 4.9.7 broker, same command",
                    target=Target("ratio", "<=", 1.0),
                    detail=(
                        f"median of {plan.repeats} runs per round and side in a warm mqadmin JVM "
                        "per side, the sides taking turns run by run; "
                        f"{plan.rounds} rounds, the median round shown; ratios "
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
        "tests/compat/remoting_backends.py; mqadmin is rocketmq-tools 4.9.8's MQAdminStartup "
        "(tests/compat/mqadmin.py keeps one JVM per side)."
    )
    result.figures += acl_figures(plan, workdir / "acl")
    result.notes.append(f"The admin benchmark took {time.monotonic() - started:.0f} s.")
    return result


# ---------------------------------------------------------------- ACL on against off


class _Replay(asyncio.Protocol):
    """Sends one pre-encoded request frame again and again, `in_flight` unanswered at a
    time, and counts the answers (and those whose code is not 0). Costs its process
    almost nothing per request, so the broker is what limits the rate."""

    def __init__(self, frame: bytes, in_flight: int) -> None:
        self.frame = frame
        self.in_flight = in_flight
        self.buffer = bytearray()
        self.answered = 0
        self.bad = 0
        self.first_bad = b""
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.frame * self.in_flight)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        done = 0
        while len(buf) - pos >= 8:
            length = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos - 4 < length:
                break
            header_len = int.from_bytes(buf[pos + 4 : pos + 8], "big") & 0xFFFFFF
            header = bytes(buf[pos + 8 : pos + 8 + header_len])
            if b'"code":0,' not in header:
                self.bad += 1
                self.first_bad = self.first_bad or header
            pos += 4 + length
            done += 1
        del buf[:pos]
        self.answered += done
        if done and self.transport is not None:
            self.transport.write(self.frame * done)

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def replay_sends(addr: str, frame: bytes, in_flight: int, warmup_s: float, seconds: float,
                 cpu: Callable[[], float]) -> tuple[float, float, int, bytes]:  # fmt: skip
    """(answers per second, server CPU seconds per answer, bad answers, the first bad
    header) over `seconds` after `warmup_s`."""
    from ferry.remoting.client import split_addr

    async def go():
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        _, replay = await loop.create_connection(lambda: _Replay(frame, in_flight), host, port)
        await asyncio.sleep(warmup_s)
        n0, c0, t0 = replay.answered, cpu(), time.monotonic()
        await asyncio.sleep(seconds)
        n1, c1, t1 = replay.answered, cpu(), time.monotonic()
        replay.transport.close()
        return (n1 - n0) / (t1 - t0), (c1 - c0) / max(n1 - n0, 1), replay.bad, replay.first_bad

    return asyncio.run(go())


def _send_frame(acl_on: bool) -> bytes:
    from ferry.remoting.codec import encode

    command = _send_request(ACL_TOPIC, -1)
    command.ext["i"] = "WAIT\x01true\x02"
    command.body = b"b" * 128
    if acl_on:
        _signed(command, ACL_PRODUCER)
    command.opaque = 1
    return encode(command)


@dataclass(frozen=True)
class AclRun:
    tps: float
    failed: int
    broker_us_per_msg: float
    client_us_per_msg: float

    def text(self) -> str:
        return (
            f"{self.tps:,.0f} msgs/s, broker {self.broker_us_per_msg:.1f} us/msg, "
            f"client {self.client_us_per_msg:.1f} us/msg"
        )


def _signed(command: Command, key: tuple[str, str]) -> Command:
    from ferry import acl

    command.ext["AccessKey"] = key[0]
    command.ext["Signature"] = acl.sign(key[1], command.ext, command.body)
    return command


def _acl_cluster(root: Path, acl_on: bool):
    from ferry.remoting.client import call
    from tests.conftest import broker_options
    from tests.integration import support

    root.mkdir(parents=True, exist_ok=True)
    keys: dict[str, object] = {"brokerName": "broker-acl" if acl_on else "broker-open"}
    if acl_on:
        (root / "plain_acl.yml").write_text(ACL_YAML)
        keys |= {"aclEnable": "true", "aclFile": root / "plain_acl.yml"}
    namesrv = support.NamesrvProcess(root / "namesrv").wait_ready()
    broker = support.BrokerServer(
        root / "broker", broker_options(root / "broker", namesrv.remoting_addr, **keys)
    )
    try:
        broker.start()
        request = _topic_request(ACL_TOPIC, 8)
        answer = call(broker.remoting_addr, _signed(request, ACL_ADMIN) if acl_on else request, 10)
        if answer.code != codes.SUCCESS:
            raise RuntimeError(f"creating {ACL_TOPIC}: {answer.code} {answer.remark}")
    except BaseException:
        broker.stop()
        namesrv.stop()
        raise
    return namesrv, broker


def _acl_run(namesrv, broker, acl_on: bool, plan: Plan, directory: Path) -> AclRun:
    from benchmarks.procs import cpu_seconds
    from tests.compat.clients import java

    args = ["--namesrv", namesrv.remoting_addr, "--topic", ACL_TOPIC,
            "--threads", str(ACL_THREADS), "--warmup-s", str(plan.acl_warmup_s),
            "--window-s", str(plan.acl_window_s), "--windows", str(plan.acl_windows)]  # fmt: skip
    if acl_on:
        args += ["--access-key", ACL_PRODUCER[0], "--secret-key", ACL_PRODUCER[1]]
    load = java("SendLoad49", args, directory, "send-load").start()
    try:
        load.wait(lambda c: c.of("window"), plan.acl_warmup_s + plan.acl_window_s + 120, "a window")
        cpu0 = cpu_seconds(broker.proc.pid)
        client0 = cpu_seconds(load.pid)
        load.wait(
            lambda c: len(c.of("window")) >= plan.acl_windows,
            plan.acl_window_s * plan.acl_windows + 120,
            "its windows",
        )
        cpu = cpu_seconds(broker.proc.pid) - cpu0
        client = cpu_seconds(load.pid) - client0
        load.wait(lambda c: c.of("done"), 60, "its end")
    finally:
        load.stop()
    windows = load.of("window")
    errors = load.of("error")
    if errors:
        raise RuntimeError(f"ACL {'on' if acl_on else 'off'}: a send failed: {errors[0]['error']}")
    measured = (
        windows[1:] if len(windows) > 1 else windows
    )  # (the CPU window starts after the first)
    sent = sum(w["sent"] for w in measured)
    seconds = sum(w["seconds"] for w in measured)
    per_msg = 1e6 / max(sent, 1)
    return AclRun(
        sent / seconds, sum(w["failed"] for w in windows), cpu * per_msg, client * per_msg
    )


@dataclass(frozen=True)
class ReplayRun:
    tps: float
    broker_us_per_msg: float

    def text(self) -> str:
        return f"{self.tps:,.0f} msgs/s, broker {self.broker_us_per_msg:.1f} us/msg"


def _replay_run(broker, acl_on: bool, plan: Plan) -> ReplayRun:
    from benchmarks.procs import cpu_seconds

    pid = broker.proc.pid
    rate, cpu, bad, first = replay_sends(
        broker.remoting_addr, _send_frame(acl_on), ACL_THREADS, plan.acl_warmup_s / 2,
        plan.acl_window_s * plan.acl_windows, lambda: cpu_seconds(pid),
    )  # fmt: skip
    if bad:
        raise RuntimeError(f"ACL {'on' if acl_on else 'off'}: {bad} sends refused: {first[:300]!r}")
    return ReplayRun(rate, cpu * 1e6)


def acl_figures(plan: Plan, workdir: Path) -> list[Figure]:
    clusters = {}
    replays: dict[bool, list[ReplayRun]] = {True: [], False: []}
    runs: dict[bool, list[AclRun]] = {True: [], False: []}
    try:
        for acl_on in (True, False):
            clusters[acl_on] = _acl_cluster(workdir / ("on" if acl_on else "off"), acl_on)
        for r in range(plan.acl_rounds):
            for acl_on in (True, False) if r % 2 == 0 else (False, True):
                namesrv, broker = clusters[acl_on]
                replays[acl_on].append(_replay_run(broker, acl_on, plan))
                where = workdir / f"load-{r}-{'on' if acl_on else 'off'}"
                runs[acl_on].append(_acl_run(namesrv, broker, acl_on, plan, where))
            _progress(
                f"ACL round {r + 1}: replayed on {replays[True][-1].text()}, off "
                f"{replays[False][-1].text()}; Java client on {runs[True][-1].text()}, off "
                f"{runs[False][-1].text()}"
            )
    finally:
        for namesrv, broker in clusters.values():
            broker.stop()
            namesrv.stop()

    def median(pairs: list[tuple], ratio: Callable[[tuple], float]) -> tuple[int, list[float]]:
        ratios = [ratio(p) for p in pairs]
        return sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2], ratios

    replay_pairs = list(zip(replays[True], replays[False], strict=True))
    i, ratios = median(replay_pairs, lambda p: p[0].tps / p[1].tps)
    broker_figure = Figure(
        name="single sends with RocketMQ's ACL on against off: the broker's rate",
        value=replay_pairs[i][0].tps,
        unit="msgs/s",
        baseline=replay_pairs[i][1].tps,
        baseline_label="the same sends, unsigned, to a broker without ACL",
        target=Target("ratio", ">=", 0.9),
        detail=(
            f"one connection, {ACL_THREADS} single SEND_MESSAGE_V2 requests of 128 B in flight "
            "(each its own request, signed as AclClientRPCHook signs it when on), replayed "
            "from one pre-encoded frame so the sender costs next to nothing and the broker "
            "sets the rate; the broker verifies every signature and permission. "
            f"{plan.acl_window_s * plan.acl_windows:g} s after {plan.acl_warmup_s / 2:g} s; "
            f"{plan.acl_rounds} alternating rounds, the median ratio shown; ratios "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + "; on: " + "; ".join(r.text() for r in replays[True])
            + "; off: " + "; ".join(r.text() for r in replays[False])
        ),
    )  # fmt: skip
    run_pairs = list(zip(runs[True], runs[False], strict=True))
    j, ratios = median(run_pairs, lambda p: p[0].tps / p[1].tps)
    client_figure = Figure(
        name="single sends with RocketMQ's ACL on against off: Apache's Java client, same machine",
        value=run_pairs[j][0].tps,
        unit="msgs/s",
        baseline=run_pairs[j][1].tps,
        baseline_label="the same client without ACL, to a broker without ACL",
        target=None,
        detail=(
            f"Apache's 4.9.8 DefaultMQProducer, {ACL_THREADS} threads of sync single sends of "
            f"128 B, AclClientRPCHook when on, client and broker sharing the machine's 2 "
            f"cores; {plan.acl_warmup_s:g} s warm-up, then {plan.acl_windows} x "
            f"{plan.acl_window_s:g} s windows; {plan.acl_rounds} alternating rounds, the "
            "median ratio shown; ratios "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + "; on: " + "; ".join(r.text() for r in runs[True])
            + "; off: " + "; ".join(r.text() for r in runs[False])
            + ". The client's own signing (its hook reads every header field by reflection, "
            "then HMAC-SHA1) is part of this figure: compare its client us/msg on and off"
        ),
    )  # fmt: skip
    return [broker_figure, client_figure]
