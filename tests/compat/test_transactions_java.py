"""Transactional messages from Apache's own 4.9.8 `TransactionMQProducer` (tests/compat/client49
TxProducer49) against ferry over RocketMQ's TCP protocol, consumed by Apache's 4.9.8
`DefaultMQPushConsumer` (PushConsumer49): a commit is delivered once, a rollback never; an
undecided transaction is checked back (CHECK_TRANSACTION_STATE) and resolved by the producer's
`checkLocalTransaction` either way, by a new producer of the group when the first one left,
and discarded (and counted) after transactionCheckMax checks; a SIGKILL of the broker between
prepare and commit loses no decision and duplicates no message.

The broker runs as its own process (killed by PID), with check-back times a test can wait
for: transactionTimeOut 1 s, transactionCheckInterval 0.2 s, transactionCheckMax 4. Every
wait is on the programs' events or the broker's state, bounded, never a sleep.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import grpc
import pytest

from ferry.v1 import broker_pb2, broker_pb2_grpc, namesrv_pb2_grpc
from tests.compat import clients
from tests.compat.backends import ApacheBackend, start_backend
from tests.conftest import broker_options
from tests.integration import support
from tests.waiting import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.apache5]

QUEUES = 4
CHECK_MAX = 4
TX_KEYS = {
    "brokerName": "broker-tx",
    "metricsPort": 0,
    "transactionTimeOut": 1000,
    "transactionCheckInterval": 200,
    "transactionCheckMax": CHECK_MAX,
}
_ids = itertools.count()


class Cluster:
    """A name server and one ferry broker, each a process; the broker can be killed and
    started again on the same store and port."""

    def __init__(self, d: Path, **keys: object) -> None:
        self.dir = d
        self.keys = dict(TX_KEYS, **keys)
        self.namesrv = support.NamesrvProcess(d / "namesrv").wait_ready()
        self.ns_channel = grpc.insecure_channel(self.namesrv.addr)
        self.ns = namesrv_pb2_grpc.NameServerStub(self.ns_channel)
        self.broker: support.BrokerServer | None = None
        self.channel: grpc.Channel | None = None
        self.start_broker()

    def start_broker(self, port: int = 0) -> None:
        store = self.dir / "broker-tx"
        keys = dict(self.keys, listenPort=port)
        self.broker = support.BrokerServer(
            store, broker_options(store, self.namesrv.remoting_addr, **keys)
        ).start()
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(self.broker.addr)
        addr = self.broker.addr
        wait_for(lambda: addr in support.live_addrs(self.ns), 30, "the broker registered", 0.05)

    def kill_and_restart(self) -> None:
        assert self.broker is not None
        port = self.broker.remoting_port
        self.broker.kill()
        self.start_broker(port)

    def create_topic(self, topic: str) -> None:
        assert self.channel is not None
        support.create_topic(self.channel, topic, QUEUES)
        wait_for(
            lambda: support.route_queue_datas(self.ns, topic) == 1, 30, f"{topic} routed", 0.05
        )

    def stored(self, topic: str) -> int:
        """Messages in the topic's queues (delivered copies, whoever consumes them)."""
        stub = broker_pb2_grpc.BrokerStub(self.channel)
        return sum(
            stub.GetMaxOffset(broker_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q)).offset
            for q in range(QUEUES)
        )

    def metric(self, name: str) -> float:
        assert self.broker is not None
        text = support.scrape(f"http://127.0.0.1:{self.broker.metrics_port}/metrics")
        values = [
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith((name + "{", name + " "))
        ]
        assert len(values) == 1, f"{name}: {values}"
        return values[0]

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.ns_channel.close()
        try:
            if self.broker is not None:
                self.broker.stop()
        finally:
            self.namesrv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("tx-java"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def names(request):
    n = next(_ids)

    def name(kind: str) -> str:
        return f"{kind}{n}_{request.node.originalname[5:28]}"

    return name


def producer(cluster: Cluster, d: Path, topic: str, group: str, *args: str, name="tx"):
    return clients.java(
        "TxProducer49",
        ["--namesrv", cluster.namesrv.remoting_addr, "--topic", topic, "--group", group, *args],
        d / name,
        name,
    )


def consumer(cluster: Cluster, d: Path, topic: str, group: str) -> clients.Client:
    return clients.java(
        "PushConsumer49",
        ["--namesrv", cluster.namesrv.remoting_addr, "--group", group, "--topic", topic,
         "--from", "first", "--stdin-stop"],
        d / "consumer",
        "consumer",
    ).start()  # fmt: skip


def keys_seen(c: clients.Client, topic: str) -> Counter:
    return Counter(e["keys"] for e in c.of("msg") if e["topic"] == topic)


def test_commit_is_delivered_once_and_rollback_never(cluster, names, tmp_path):
    topic, group = names("T"), names("pg")
    cluster.create_topic(topic)
    with consumer(cluster, tmp_path, topic, names("cg")) as c:
        c.wait(lambda c: c.of("started"), 60, "the consumer started")
        rolled = clients.produce(
            producer(cluster, tmp_path, topic, group, "--count", "3", "--decide", "rollback",
                     "--key-prefix", "rb", name="rollback")
        )  # fmt: skip
        committed = clients.produce(
            producer(cluster, tmp_path, topic, group, "--count", "5", "--decide", "commit",
                     "--key-prefix", "ok", name="commit")
        )  # fmt: skip
        assert [s["status"] for s in rolled + committed] == ["SEND_OK"] * 8
        assert all(s["transactionId"] for s in committed)
        assert {s["localState"] for s in committed} == {"COMMIT_MESSAGE"}
        want = {f"ok-{i}" for i in range(5)}
        c.wait(lambda c: set(keys_seen(c, topic)) >= want, 60, "the 5 committed messages")
        wait_for(lambda: cluster.stored(topic) == 5, 30, "5 messages stored in the topic")
    seen = keys_seen(c, topic)
    assert seen == Counter({k: 1 for k in want}), seen  # once each, no rolled-back one
    assert cluster.metric("ferry_transaction_half_messages") == 0


@pytest.mark.parametrize("answer", ["commit", "rollback"])
def test_unknown_is_checked_back_and_resolved(cluster, names, tmp_path, answer):
    topic, group = names("T"), names("pg")
    cluster.create_topic(topic)
    checks_before = cluster.metric("ferry_transaction_checks_total")
    tx = producer(
        cluster, tmp_path, topic, group, "--count", "2", "--decide", "unknown", "--check", answer,
        "--stdin-stop",
    )  # fmt: skip
    with tx:
        tx.wait(lambda p: p.of("done"), 60, "the sends")
        assert {s["localState"] for s in tx.of("send")} == {"UNKNOW"}
        tx.wait(lambda p: len({e["key"] for e in p.of("check")}) == 2, 60, "a check of each")
        check = tx.of("check")[0]
        assert check["topic"] == topic and check["checkTimes"] == "1"
        sent = {s["key"]: s for s in tx.of("send")}
        assert check["transactionId"] == sent[check["key"]]["msgId"]  # the client's UNIQ_KEY
        wait_for(lambda: cluster.metric("ferry_transaction_half_messages") == 0, 30, "both decided")
    assert cluster.metric("ferry_transaction_checks_total") >= checks_before + 2
    if answer == "commit":
        with consumer(cluster, tmp_path, topic, names("cg")) as c:
            c.wait(lambda c: len(keys_seen(c, topic)) == 2, 60, "the 2 committed messages")
        assert keys_seen(c, topic) == Counter({"tx-0": 1, "tx-1": 1})
        assert cluster.stored(topic) == 2
    else:
        assert cluster.stored(topic) == 0


def test_a_new_producer_of_the_group_is_asked_when_the_first_left(cluster, names, tmp_path):
    topic, group = names("T"), names("pg")
    cluster.create_topic(topic)
    # (A producer heartbeats to the brokers of the topics it sent to: one commit first.)
    with producer(cluster, tmp_path, topic, group, "--count", "1", "--check", "commit",
                  "--key-prefix", "warm", "--stdin-stop", name="second") as second:  # fmt: skip
        second.wait(lambda p: p.of("done"), 60, "the second producer up")
        # The first producer decides nothing and leaves (it would answer "unknown" if asked).
        first = clients.produce(
            producer(cluster, tmp_path, topic, group, "--count", "1", "--decide", "unknown",
                     "--check", "unknown", "--key-prefix", "left", name="first")
        )  # fmt: skip
        assert first[0]["status"] == "SEND_OK"
        second.wait(lambda p: any(e["key"] == "left-0" for e in p.of("check")), 60, "a check")
        wait_for(lambda: cluster.stored(topic) == 2, 30, "the message committed")
    with consumer(cluster, tmp_path, topic, names("cg")) as c:
        c.wait(lambda c: len(keys_seen(c, topic)) == 2, 60, "the committed messages")
    assert keys_seen(c, topic) == Counter({"warm-0": 1, "left-0": 1})


def test_after_check_max_checks_the_transaction_is_discarded(cluster, names, tmp_path):
    topic, group = names("T"), names("pg")
    cluster.create_topic(topic)
    discarded_before = cluster.metric("ferry_transaction_discarded_total")
    with producer(cluster, tmp_path, topic, group, "--count", "1", "--decide", "unknown",
                  "--check", "unknown", "--stdin-stop") as tx:  # fmt: skip
        wait_for(
            lambda: cluster.metric("ferry_transaction_discarded_total") == discarded_before + 1,
            60,
            "the transaction discarded",
        )
        # The last check is a oneway request the broker sent before it discarded; the
        # producer's JVM may print it after the metric moved (seen under load in CI).
        tx.wait(lambda p: len(p.of("check")) >= CHECK_MAX, 60, f"{CHECK_MAX} checks printed")
        checks = tx.of("check")
    assert [e["checkTimes"] for e in checks] == [str(n) for n in range(1, CHECK_MAX + 1)]
    assert cluster.stored(topic) == 0
    assert cluster.metric("ferry_transaction_half_messages") == 0
    assert cluster.broker is not None
    log = cluster.broker.log()
    assert f"transaction discarded after {CHECK_MAX} checks" in log
    assert f"group={group} topic={topic} msgId={checks[0]['transactionId']}" in log


def test_a_killed_broker_keeps_every_decision(tmp_path, names):
    """SIGKILL between prepare and commit, and right after commits: each message is
    delivered exactly once after the restart."""
    # (Checked until a producer of the group is back: no discard meanwhile.)
    cluster = Cluster(tmp_path / "cluster", transactionCheckMax=1000)
    try:
        topic, group = names("T"), names("pg")
        cluster.create_topic(topic)
        committed = clients.produce(
            producer(cluster, tmp_path, topic, group, "--count", "3", "--key-prefix", "ok",
                     name="commit")
        )  # fmt: skip
        assert [s["status"] for s in committed] == ["SEND_OK"] * 3
        pending = clients.produce(
            producer(cluster, tmp_path, topic, group, "--count", "1", "--decide", "unknown",
                     "--check", "unknown", "--key-prefix", "pending", name="pending")
        )  # fmt: skip
        assert pending[0]["status"] == "SEND_OK"
        cluster.kill_and_restart()
        assert cluster.stored(topic) == 3
        assert cluster.metric("ferry_transaction_half_messages") == 1
        # The prepared one is decided after the restart, by a producer of its group.
        with producer(cluster, tmp_path, topic, group, "--count", "1", "--check", "commit",
                      "--key-prefix", "after", "--stdin-stop", name="after") as after:  # fmt: skip
            after.wait(lambda p: p.of("check"), 60, "a check of the prepared message")
            wait_for(lambda: cluster.stored(topic) == 5, 30, "the prepared message committed")
        cluster.kill_and_restart()
        with consumer(cluster, tmp_path, topic, names("cg")) as c:
            c.wait(lambda c: len(keys_seen(c, topic)) == 5, 60, "the 5 committed messages")
        assert keys_seen(c, topic) == Counter(
            {"ok-0": 1, "ok-1": 1, "ok-2": 1, "pending-0": 1, "after-0": 1}
        )
        assert cluster.stored(topic) == 5
        assert cluster.metric("ferry_transaction_half_messages") == 0
    finally:
        cluster.stop()


# ---------------------------------------------------------------- transaction ids, as Apache's


@pytest.fixture(scope="module", params=("ferry", "apache"))
def ids_cluster(request, tmp_path_factory):
    """(name server address, create_topic) of ferry's cluster, or of Apache RocketMQ 5.x
    (its broker inside its proxy, tests/compat/backends.py), the reference for ids."""
    d = tmp_path_factory.mktemp(f"tx-ids-{request.param}")
    if request.param == "ferry":
        c = Cluster(d)
        try:
            yield c.namesrv.remoting_addr, c.create_topic
        finally:
            c.stop()
        return
    backend = start_backend("apache", d)
    try:

        def create_topic(topic: str) -> None:
            backend.create_topic(topic, QUEUES)
            backend.wait_route(topic)

        assert isinstance(backend, ApacheBackend)
        yield backend.namesrv.address, create_topic
    finally:
        backend.release()


def test_transaction_id_is_the_message_id_and_the_commit_carries_it(ids_cluster, tmp_path):
    """As RocketMQ 5's broker: every stored send answers transactionId = its UNIQ_KEY (the
    4.9 client's SendResult.getTransactionId(), which TransactionMQProducer puts in
    END_TRANSACTION), and a committed message keeps the half's `__transactionId__` = that
    id, which a 4.9 consumer sees among its properties."""
    namesrv, create_topic = ids_cluster
    topic, group = f"TxIds{next(_ids)}", "pg-tx-ids"
    create_topic(topic)
    sent = clients.produce(
        clients.java(
            "TxProducer49",
            ["--namesrv", namesrv, "--topic", topic, "--group", group, "--count", "3",
             "--key-prefix", "ids"],
            tmp_path / "tx",
            "tx",
        )
    )  # fmt: skip
    plain = clients.produce(
        clients.java(
            "Producer49",
            ["--namesrv", namesrv, "--topic", topic, "--count", "2", "--key-prefix", "plain"],
            tmp_path / "plain",
            "plain",
        )
    )  # fmt: skip
    assert [s["status"] for s in sent + plain] == ["SEND_OK"] * 5
    for s in sent + plain:
        assert s["transactionId"] == s["msgId"], s
    c = clients.java(
        "PushConsumer49",
        ["--namesrv", namesrv, "--group", "cg-tx-ids", "--topic", topic, "--from", "first",
         "--stdin-stop"],
        tmp_path / "consumer",
        "consumer",
    ).start()  # fmt: skip
    with c:
        c.wait(lambda c: len(c.of("msg")) >= 5, 90, "the 5 messages")
    got = {m["msgId"]: m for m in c.of("msg")}
    for s in sent:
        assert got[s["msgId"]]["properties"].get("__transactionId__") == s["transactionId"]
    for s in plain:
        assert "__transactionId__" not in got[s["msgId"]]["properties"]
