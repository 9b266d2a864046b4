"""Automatic failover (enableFailover, etcd) under Apache's Java producer 4.9.8: broker-a's
two members elect their master in a real etcd (tests/failover/group.py's FailoverGroup,
each member its own process), and RocketMQ's clients follow it through the name server's
route as they read it over RocketMQ's protocol (105).

One run, two faults:
1. the master is frozen (SIGSTOP) until the other member has taken over, then thawed: it
   is deposed. Its answers to sends from then on — fenced, between two roles, as a slave —
   are all codes a Java 4.9 producer retries elsewhere (14, 1, 16, 17; never 2, never a
   success), until it is elected again;
2. the new master is SIGKILLed; the deposed one, back in the in-sync set, takes over.

Throughout, the 105 route names the elected master's RocketMQ-protocol address as id 0 (the
same table, and the same epoch fencing, as the ferry.v1 route), the Java producer's sends
land on whoever it names, and every message it was told SEND_OK — and every success a
probe pinned to the first master was answered — is read from the last master by Apache's
push consumer, at the queue and offset its producer was told: by one that consumed through
both faults, and by a new group afterwards. (A consumer's pulls long-polling on the killed
master wait out their 30 s timeout: Java 4.9 fails a request early only when it closes the
connection itself. Apache's brokers leave it the same wait.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc
from tests.compat import clients
from tests.compat.ferry_remoting import group_addrs
from tests.failover.config import BROKER, TOPIC
from tests.failover.group import FailoverGroup
from tests.failover.member import Member
from tests.integration.support import FreePorts
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(240)

EACH = 20  # Java SEND_OKs stored by each master in turn
# What a Java 4.9 producer sends again elsewhere (DefaultMQProducer.retryResponseCodes,
# those a broker answers): TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR, NO_PERMISSION.
RETRIED = {codes.TOPIC_NOT_EXIST, codes.SERVICE_NOT_AVAILABLE, codes.SYSTEM_ERROR,
           codes.NO_PERMISSION}  # fmt: skip


@dataclass
class Answer:
    """One probe send: its body, when its answer arrived (monotonic), and the answer (code
    None: no answer, e.g. the broker was frozen)."""

    body: str
    at: float
    code: int | None
    remark: str = ""
    queue_id: int = -1
    queue_offset: int = -1


class Probe:
    """SEND_MESSAGE_V2 to one broker address, again and again (one connection per send), as
    a Java producer whose route still names it would; records every answer."""

    def __init__(self, address: str, topic: str) -> None:
        self.address, self.topic = address, topic
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = f"probe-{i}"
            i += 1
            request = Command(
                codes.SEND_MESSAGE_V2,
                ext={"a": "ferry-probe", "b": self.topic, "c": "TBW102", "d": 4, "e": i % 4,
                     "f": 0, "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0,
                     "k": "false", "m": "false"},
                body=body.encode(),
            )  # fmt: skip
            try:
                a = call(self.address, request, timeout=1.0)
            except OSError as exc:
                self.answers.append(Answer(body, time.monotonic(), None, str(exc)))
            else:
                self.answers.append(
                    Answer(body, time.monotonic(), a.code, a.remark or "",
                           int(a.ext.get("queueId", -1)), int(a.ext.get("queueOffset", -1)))
                )  # fmt: skip
            self._stop.wait(0.01)


def decode_store_host(offset_msg_id: str) -> str:
    """The RocketMQ-protocol address an offsetMsgId names (IPv4: 4 bytes host, 4 port)."""
    raw = bytes.fromhex(offset_msg_id)
    return f"{'.'.join(str(b) for b in raw[:4])}:{int.from_bytes(raw[4:8], 'big')}"


def routes(group: FailoverGroup) -> tuple[dict[int, str], dict[int, str]]:
    """broker-a's addresses by id in TOPIC's route: over RocketMQ's protocol (105), and over
    ferry.v1 mapped to the same members' RocketMQ-protocol addresses."""
    assert group.namesrv is not None
    remoting = group_addrs(group.namesrv.remoting_addr, TOPIC).get(BROKER, {})
    stub = namesrv_pb2_grpc.NameServerStub(group.channel(group.namesrv.addr))
    route = stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=5)
    by_grpc = {m.addr: m.remoting_addr for m in group.members}
    grpc_view = {
        int(i): by_grpc.get(a, a)
        for b in route.broker_datas
        if b.broker_name == BROKER
        for i, a in b.broker_addrs.items()
    }
    return remoting, grpc_view


def wait_route(group: FailoverGroup, want: dict[int, Member], what: str) -> None:
    """Until 105 names `want` (id -> member) for broker-a, and the ferry.v1 route agrees."""
    expected = {i: m.remoting_addr for i, m in want.items()}
    wait_for(lambda: routes(group) == (expected, expected), 20, what)


def reader(group: FailoverGroup, tmp_path, name: str) -> clients.Client:
    """Apache's push consumer 4.9.8 of TOPIC in the group `name` (not yet started)."""
    assert group.namesrv is not None
    return clients.java(
        "PushConsumer49",
        ["--namesrv", group.namesrv.remoting_addr, "--topic", TOPIC, "--group", name,
         "--instance", name, "--stdin-stop", "--from", "first"],
        tmp_path / name,
        name,
    )  # fmt: skip


@pytest.fixture
def group(tmp_path, etcd, loop_thread):
    g = FailoverGroup(tmp_path / "group", etcd.endpoint, FreePorts(), loop_thread, size=2)
    try:
        yield g.start()
    finally:
        g.stop_all()
        for m in g.members:  # shown when the test fails
            lines = [ln for ln in m.log().splitlines() if "WARNING" in ln or "ERROR" in ln]
            print(f"--- member {m.id} ({m.server.log_path})\n" + "\n".join(lines[-40:]))


def test_java_producer_follows_the_elected_master_and_a_deposed_one_is_retried_elsewhere(
    group, tmp_path
):
    first = group.leader()
    assert first is not None
    other = next(m for m in group.members if m is not first)
    wait_route(group, {0: first, other.id: other}, "105 to route the first master as id 0")

    sender = clients.java(
        "Producer49",
        ["--namesrv", group.namesrv.remoting_addr, "--topic", TOPIC, "--mode", "sync",
         "--count", "100000", "--interval-ms", "10", "--timeout-ms", "3000", "--stdin-stop",
         "--key-prefix", "f"],
        tmp_path / "producer",
        "producer",
    )  # fmt: skip

    def stored_on(m: Member, since: int = 0) -> list[dict]:
        return [
            s
            for s in sender.of("send")[since:]
            if s["status"] == "SEND_OK" and decode_store_host(s["offsetMsgId"]) == m.remoting_addr
        ]

    probe = Probe(first.remoting_addr, TOPIC)
    live = reader(group, tmp_path, "live")
    with sender.start(), live.start():
        sender.wait(lambda c: len(stored_on(first)) >= EACH, 60, f"{EACH} SEND_OKs of {first}")
        live.wait(lambda c: c.of("msg"), 30, "the live consumer's first message")
        probe.start()
        wait_for(lambda: any(a.code == codes.SUCCESS for a in probe.answers), 10,
                 f"the probe's first SEND_OK from {first}")  # fmt: skip

        # 1. The master freezes; the other member is elected; the frozen one is deposed.
        group.pause(first)
        second = group.wait_leader(exclude=[first.id])
        wait_route(group, {0: second}, f"105 to route {second} as id 0")
        frozen_at = len(sender.of("send"))
        sender.wait(lambda c: len(stored_on(second, frozen_at)) >= EACH, 60,
                    f"{EACH} SEND_OKs of the new master {second}")  # fmt: skip
        thawed = time.monotonic()
        group.resume(first)
        # It rejoins as a slave under its own id (the name server refused it as id 0:
        # its epoch is behind), and back in the in-sync set.
        wait_route(group, {0: second, first.id: first}, f"{first} routed as a slave")
        group.wait_isr()
        assert group.leader() is second

        # 2. The new master is killed; the deposed one, in sync again, takes over.
        killed_at = len(sender.of("send"))
        deposed_until = time.monotonic()  # it cannot lead again while `second` lives
        group.kill(second)
        third = group.wait_leader(exclude=[second.id])
        assert third is first
        wait_route(group, {0: first}, f"105 to route {first} as id 0 again")
        sender.wait(lambda c: len(stored_on(first, killed_at)) >= EACH, 60,
                    f"{EACH} SEND_OKs of {first} after the kill")  # fmt: skip
        probe.stop()
        sender.stop()
        live_caught_up = time.monotonic()
        live.wait(
            lambda c: (
                {e["msgId"] for e in c.of("msg")}
                >= {s["msgId"] for s in sender.of("send") if s["status"] == "SEND_OK"}
            ),
            60,
            "the live consumer to have every acknowledged message",
        )
        print(f"the live consumer caught up {time.monotonic() - live_caught_up:.1f} s "
              "after the last send")  # fmt: skip

    # The deposed master's answers, from its thaw until its successor was killed.
    deposed = [a for a in probe.answers if thawed <= a.at < deposed_until]
    answered = [a for a in deposed if a.code is not None]
    assert answered, f"the deposed master answered nothing: {deposed[-5:]}"
    codes_seen = {a.code for a in answered}
    print("the deposed master answered:", Counter(a.code for a in deposed))
    assert codes_seen <= RETRIED, [a for a in answered if a.code not in RETRIED][:5]
    assert any(a.code == codes.SERVICE_NOT_AVAILABLE for a in answered), codes_seen

    sends = sender.of("send")
    acked = [s for s in sends if s["status"] == "SEND_OK"]
    errors = [s["error"] for s in sends if s["status"] == "EXCEPTION"]
    # A code Java does not retry reaches the application as MQBrokerException.
    assert not [e for e in errors if e.startswith("MQBrokerException")], errors
    print(f"Java: {len(acked)} SEND_OK, {len(errors)} failed: {Counter(errors).most_common(3)}")

    # Everything acknowledged is read from the last master, where its producer was told: by
    # the consumer that ran through both faults, and by a new group afterwards.
    after = reader(group, tmp_path, "after")
    with after.start():
        after.wait(lambda c: {e["msgId"] for e in c.of("msg")} >= {s["msgId"] for s in acked},
                   60, "every acknowledged message consumed")  # fmt: skip
    for c in (live, after):
        consumed: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for e in c.of("msg"):
            consumed[e["msgId"]].add((e["queueId"], e["queueOffset"]))
        for s in acked:
            assert (s["queueId"], s["queueOffset"]) in consumed[s["msgId"]], (c.name, s)

    stored = {body.decode(errors="replace"): at for at, body in group.pull(first).items()}
    for a in probe.answers:
        if a.code == codes.SUCCESS:
            assert stored.get(a.body) == (a.queue_id, a.queue_offset), a
