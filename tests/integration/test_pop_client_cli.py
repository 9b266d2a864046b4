"""Pop consumption through the client library (`ferry.client.pop`) and the
`ferry` commands, against two real brokers and a real name server: `ferry
consume` processes of one group splitting a topic, --no-ack and redelivery,
timed messages (`ferry send --delay-ms/--deliver-at`), message groups landing
in one queue, `ferry group status`, and PopConsumer's ack and re-timing
outcomes."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import subprocess
import sys
import time
import zlib

import grpc
import pytest

from ferry.client.broker import Producer
from ferry.client.namesrv import NamesrvClient
from ferry.client.pop import PopConsumer, StaleHandle
from ferry.runtime.errors import InvalidArgument
from services.cli.main import main as ferry_main
from tests.conftest import start_broker
from tests.integration.support import REPO, child_env, create_topic, run_ferry, stop_pid
from tests.waiting import wait_for

BROKERS = ("broker-a", "broker-b")
# Quick redelivery: the retry backoff comes from the delay levels.
QUICK_LEVELS = "100ms 200ms 300ms 400ms 500ms 500ms 500ms 500ms 500ms 1s 1s 1s 1s 1s 1s 1s 1s 1s"


@pytest.fixture
def cluster(loop_thread, tmp_path, ns):
    brokers = [
        start_broker(
            loop_thread,
            tmp_path / name,
            ns.remoting_addr,
            brokerName=name,
            messageDelayLevel=QUICK_LEVELS,
        )
        for name in BROKERS
    ]
    yield ns, brokers
    for b in brokers:
        if b.app.gate.open:
            b.stop()


@pytest.fixture
def nsc(cluster):
    ns, _ = cluster
    with NamesrvClient([ns.addr]) as client:
        yield client


def make_topic(brokers, topic: str, queues: int) -> None:
    """`topic` with `queues` queues on every broker (each registers it before answering)."""
    for b in brokers:
        create_topic(b.channel, topic, queues)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def start_ferry(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )


def receive_all(consumer: PopConsumer, count: int, timeout_s: float, what: str) -> list:
    got: list = []

    def enough() -> bool:
        got.extend(consumer.receive(max_msgs=min(32, count - len(got)), wait_s=0.5))
        return len(got) >= count

    wait_for(enough, timeout_s, f"{what} ({count} messages; got {len(got)})")
    return got


def test_two_consume_processes_of_a_group_split_the_messages(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Split", 2)
    with Producer(nsc) as producer:
        sent = {f"split-{i:02d}" for i in range(40)}
        for body in sorted(sent):
            producer.send("Split", body.encode())
    args = ("consume", "Split", "-g", "workers", "--max", "20", "--json", "--wait-s", "0.5",
            "--idle-exit-s", "60", "-n", ns.remoting_addr)  # fmt: skip
    procs = [start_ferry(*args) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            stop_pid(p)
    got = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == 20, (out, err)  # each stops at --max; 40 in all
        assert "consumed 20 messages as group workers by pop; 20 acknowledged" in err
        got.append(lines)
    bodies = [m["body"] for lines in got for m in lines]
    assert sorted(bodies) == sorted(sent)  # every message, none twice
    assert {m["deliveryAttempt"] for lines in got for m in lines} == {1}
    assert {m["topic"] for lines in got for m in lines} == {"Split"}
    # Everything acknowledged: the group has nothing in flight and no lag.
    status = json.loads(ok(run_ferry("group", "status", "-g", "workers", "-t", "Split",
                                     "-n", ns.remoting_addr, "--json")))  # fmt: skip
    assert len(status["queues"]) == 4
    assert sum(q["maxOffset"] for q in status["queues"]) == 40
    assert all(q["inFlight"] == 0 and q["lag"] == 0 for q in status["queues"]), status


def test_no_ack_shows_the_message_again_with_attempt_2(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Again", 1)
    with Producer(nsc) as producer:
        sent = producer.send("Again", b"twice please", tags="t1")
    first = ok(run_ferry("consume", "Again", "-g", "g", "--max", "1", "--no-ack",
                         "--invisible-s", "1", "--idle-exit-s", "30", "-n", ns.remoting_addr,
                         timeout_s=60))  # fmt: skip
    line = first.strip()
    assert re.fullmatch(
        rf"{sent.broker_name} q\d+ @\d+ {sent.result.msg_id} tags=t1 attempt=1 twice please", line
    ), line
    # Not acknowledged: after its invisible time (and the retry backoff) it comes back.
    second = ok(run_ferry("consume", "Again", "-g", "g", "--max", "1", "--json",
                          "--idle-exit-s", "60", "-n", ns.remoting_addr, timeout_s=90))  # fmt: skip
    again = json.loads(second)
    assert again["deliveryAttempt"] == 2
    assert again["msgId"] == sent.result.msg_id and again["topic"] == "Again"
    assert again["body"] == "twice please" and again["tags"] == "t1"
    # That delivery was acknowledged: nothing more comes.
    with PopConsumer(nsc, "g", "Again") as consumer:
        assert consumer.receive(wait_s=1) == []


def test_timed_messages_are_not_delivered_before_their_time(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Timed", 2)
    before = time.time()
    single = ok(
        run_ferry("send", "Timed", "--body", "later", "--delay-ms", "6000", "-n", ns.remoting_addr)
    )
    after = time.time()
    at_single = dt.datetime.fromisoformat(re.search(r"deliverAt=(\S+)", single)[1]).timestamp()
    assert before + 6 - 0.01 <= at_single <= after + 6 + 0.01, single
    batch = ok(run_ferry("send", "Timed", "--count", "3", "--batch", "3", "--size", "20",
                         "--delay-ms", "6000", "-n", ns.remoting_addr))  # fmt: skip
    assert "sent 3 messages" in batch and "SEND_OK=3" in batch
    at_batch = dt.datetime.fromisoformat(re.search(r"deliverAt=(\S+)", batch)[1]).timestamp()

    arrivals: list[tuple[float, object]] = []
    with PopConsumer(nsc, "timed", "Timed") as consumer:
        if time.time() < at_single - 1:
            assert consumer.receive(wait_s=0) == [], "delivered before its time"

        def all_four() -> bool:
            for m in consumer.receive(wait_s=0.5):
                arrivals.append((time.time(), m))
            return len(arrivals) >= 4

        wait_for(all_four, 30, "the four timed messages")
        consumer.ack([m for _, m in arrivals])
    # The timer may round to its precision, never by more than a second.
    for when, m in arrivals:
        due = at_single if m.body == b"later" else at_batch
        assert when >= due - 1.0, (m.body, when, due)
    assert len(arrivals) == 4 and b"later" in {m.body for _, m in arrivals}


def test_deliver_at_takes_local_time_and_bad_times_are_refused(cluster):
    ns, brokers = cluster
    make_topic(brokers, "At", 1)
    when = (dt.datetime.now() + dt.timedelta(minutes=5)).replace(microsecond=0)  # naive: local
    out = ok(run_ferry("send", "At", "--body", "x", "--deliver-at", when.isoformat(),
                       "-n", ns.remoting_addr))  # fmt: skip
    printed = dt.datetime.fromisoformat(re.search(r"deliverAt=(\S+)", out)[1])
    assert printed.timestamp() == when.timestamp()
    assert printed.utcoffset() is not None  # shown with the local offset

    both = run_ferry("send", "At", "--body", "x", "--delay-ms", "1", "--deliver-at",
                     when.isoformat(), "-n", ns.remoting_addr)  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr
    garbled = run_ferry(
        "send", "At", "--body", "x", "--deliver-at", "tomorrow", "-n", ns.remoting_addr
    )
    assert garbled.returncode == 2 and "not an ISO 8601 time" in garbled.stderr
    too_far = run_ferry("send", "At", "--body", "x", "--delay-ms", str(4 * 86400 * 1000),
                        "-n", ns.remoting_addr)  # fmt: skip
    assert too_far.returncode == 1 and "INVALID_ARGUMENT" in too_far.stderr, too_far.stderr


def test_a_message_group_lands_in_one_queue(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Fifo", 4)
    group = "order-7"
    h = zlib.crc32(group.encode())
    broker, queue = sorted(BROKERS)[h % 2], h % 4
    single = ok(run_ferry("send", "Fifo", "--body", "first", "--message-group", group,
                          "-n", ns.remoting_addr))  # fmt: skip
    assert f"broker={broker} " in single and f"queueId={queue} " in single, single
    assert f"messageGroup={group}" in single
    ok(run_ferry("send", "Fifo", "--count", "6", "--size", "24", "--batch", "3",
                 "--message-group", group, "-n", ns.remoting_addr))  # fmt: skip
    with Producer(nsc) as producer:
        sent = [producer.send("Fifo", b"lib-%d" % i, message_group=group) for i in range(3)]
    assert {(s.broker_name, s.result.queue_id) for s in sent} == {(broker, queue)}

    out = ok(run_ferry("consume", "Fifo", "-g", "fifo", "--max", "10", "--json",
                       "--idle-exit-s", "30", "-n", ns.remoting_addr, timeout_s=60))  # fmt: skip
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == 10
    assert {(m["broker"], m["queueId"]) for m in got} == {(broker, queue)}
    assert {m["messageGroup"] for m in got} == {group}
    assert sorted(m["queueOffset"] for m in got) == list(range(10))
    text = ok(run_ferry("send", "Fifo", "--body", "shown", "--message-group", group,
                        "-n", ns.remoting_addr))  # fmt: skip
    assert "queueOffset=10" in text
    shown = ok(run_ferry("consume", "Fifo", "-g", "fifo", "--max", "1", "--idle-exit-s", "30",
                         "-n", ns.remoting_addr, timeout_s=60))  # fmt: skip
    assert f"attempt=1 group={group} shown" in shown


def test_group_status_table_and_json(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Status", 2)
    group_key = "s"
    h = zlib.crc32(group_key.encode())
    broker, queue = sorted(BROKERS)[h % 2], h % 2
    with Producer(nsc) as producer:
        for i in range(4):
            producer.send("Status", b"s%d" % i, message_group=group_key)
    with PopConsumer(nsc, "watchers", "Status", invisible_s=120) as consumer:
        got = receive_all(consumer, 4, 15, "the four messages")
        lowest = min(got, key=lambda m: m.queue_offset)
        assert [o.status for o in consumer.ack(lowest)] == ["OK"]

    def status() -> dict:
        return json.loads(ok(run_ferry("group", "status", "-g", "watchers", "-t", "Status",
                                       "-n", ns.remoting_addr, "--json")))  # fmt: skip

    def settled() -> dict | None:
        doc = status()
        row = next(q for q in doc["queues"] if (q["broker"], q["queueId"]) == (broker, queue))
        return doc if row["committedOffset"] == 1 and row["inFlight"] == 3 else None

    doc = wait_for(settled, 15, "the ack to move the committed offset to 1")
    assert doc["group"] == "watchers" and doc["topic"] == "Status" and doc["errors"] == []
    rows = {(q["broker"], q["queueId"]): q for q in doc["queues"]}
    assert set(rows) == {(b, q) for b in BROKERS for q in range(2)}
    mine = rows.pop((broker, queue))
    assert (mine["popOffset"], mine["maxOffset"], mine["lag"]) == (4, 4, 3)
    assert all(r["maxOffset"] == r["inFlight"] == r["lag"] == 0 for r in rows.values()), rows
    # Queues the group never popped have no offsets yet.
    assert all(r["committedOffset"] is r["popOffset"] is None for r in rows.values()), rows
    assert [b["broker"] for b in doc["brokers"]] == sorted(BROKERS)
    for b in doc["brokers"]:
        assert b["retriesPending"] == 0 and b["dlqMessages"] == 0 and b["orderly"] is False
        assert b["retryMaxTimes"] > 0 and b["dlqTopic"] == "%DLQ%watchers"

    text = ok(
        run_ferry("group", "status", "-g", "watchers", "-t", "Status", "-n", ns.remoting_addr)
    )
    lines = text.splitlines()
    assert lines[0] == "group watchers on topic Status"
    assert lines[1].split() == ["BROKER", "QUEUE", "COMMITTED", "POP", "OFFSET", "MAX", "IN",
                                "FLIGHT", "LAG"]  # fmt: skip
    table = {tuple(line.split()[:2]): line.split()[2:] for line in lines[2:6]}
    assert table.pop((broker, str(queue))) == ["1", "4", "4", "3", "3"]
    assert list(table.values()) == [["-", "-", "0", "0", "0"]] * 3
    per_broker = text.split("\n\n")[1].splitlines()
    assert per_broker[0].split() == ["BROKER", "RETRIES", "PENDING", "DLQ", "MESSAGES",
                                     "ORDERLY", "RETRY", "MAX", "TIMES"]  # fmt: skip
    assert [r.split()[:4] for r in per_broker[1:3]] == [[b, "0", "0", "no"] for b in BROKERS]
    assert "dead letters go to %DLQ%watchers" in text

    missing = run_ferry("group", "status", "-g", "watchers", "-t", "Nope", "-n", ns.remoting_addr)
    assert missing.returncode == 1 and "has no route" in missing.stderr


def test_pop_consumer_ack_and_change_invisible_time(cluster, nsc):
    ns, brokers = cluster
    make_topic(brokers, "Handles", 1)
    with Producer(nsc) as producer:
        producer.send("Handles", b"handle me", keys="k1")
    with (
        PopConsumer(nsc, "h", "Handles", invisible_s=30) as consumer,
        PopConsumer(nsc, "other", "Handles") as other,
    ):
        [m] = receive_all(consumer, 1, 15, "the message")
        now_ms = time.time() * 1000
        assert m.delivery_attempt == 1 and m.keys == "k1" and m.message_group == ""
        assert now_ms + 25_000 < m.invisible_until_ms < now_ms + 31_000
        # Another group's handle is FOREIGN here, and this one's is untouched by it.
        [foreign] = other.ack(m)
        assert (foreign.ok, foreign.status) == (False, "FOREIGN")

        later = consumer.change_invisible_time(m, 60)
        assert later.receipt_handle != m.receipt_handle
        assert later.invisible_until_ms > m.invisible_until_ms + 20_000
        assert later.body == m.body and later.msg_id == m.msg_id
        [spent] = consumer.ack(m)  # the old handle is spent
        assert (spent.ok, spent.status, spent.receipt_handle) == (False, "STALE", m.receipt_handle)
        with pytest.raises(StaleHandle) as stale:
            consumer.change_invisible_time(m, 10)
        assert stale.value.status == "STALE"

        [done] = consumer.ack([later])
        assert (done.ok, done.status, done.reason) == (True, "OK", "")
        [twice] = consumer.ack(later)
        assert twice.status == "STALE"
        assert consumer.receive(wait_s=0) == []

        with pytest.raises(InvalidArgument):
            consumer.receive(max_msgs=33)
        with pytest.raises(InvalidArgument):
            consumer.change_invisible_time(later, 0.5)
    with pytest.raises(InvalidArgument):
        PopConsumer(nsc, "h", "Handles", invisible_s=43201)


def test_receive_moves_on_when_a_broker_does_not_answer(cluster, nsc, caplog):
    ns, brokers = cluster
    make_topic(brokers, "Down", 1)
    with Producer(nsc) as producer:
        sent = [producer.send("Down", b"d%d" % i) for i in range(8)]
    on_a = sorted(s.result.msg_id for s in sent if s.broker_name == "broker-a")
    assert 1 < len(on_a) < len(sent)
    caplog.set_level(logging.INFO, logger="ferry.client.pop")
    with PopConsumer(nsc, "d", "Down", timeout_s=3) as consumer:
        # broker-a first (sorted by name); the next receive starts at broker-b.
        got = consumer.receive(max_msgs=1, wait_s=5)
        assert [m.broker_name for m in got] == ["broker-a"]
        # broker-b stops answering; the name server still routes it.
        brokers[1].channel.close()
        brokers[1].loop.run(brokers[1].app.server.stop(0))
        got += receive_all(consumer, len(on_a) - 1, 20, "broker-a's messages past broker-b")
        assert sorted(m.msg_id for m in got) == on_a
        assert any("broker=broker-b" in r.getMessage() for r in caplog.records)
        assert {o.status for o in consumer.ack(got)} == {"OK"}
        # No broker answers: that is the caller's to see.
        brokers[0].channel.close()
        brokers[0].loop.run(brokers[0].app.server.stop(0))
        with pytest.raises(grpc.RpcError) as err:
            consumer.receive(wait_s=0)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_consume_options_of_the_other_mode_are_refused(cluster, capsys):
    ns, _ = cluster
    for args, option in (
        (("--pull", "--no-ack"), "--no-ack"),
        (("--pull", "--invisible-s", "5"), "--invisible-s"),
        (("--wait-ms", "100"), "--wait-ms"),
        (("--invisible-s", "0.5"), "--invisible-s"),
    ):
        code = ferry_main(["consume", "Any", "-g", "g", *args, "-n", ns.remoting_addr])
        err = capsys.readouterr().err
        assert code == 2 and f"ferry: {option}:" in err, (args, err)
    assert ferry_main(["consume", "Nope", "-g", "g", "--max", "1", "-n", ns.remoting_addr]) == 1
    assert "has no route" in capsys.readouterr().err
