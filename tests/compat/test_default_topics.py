"""The topics a broker keeps by itself, and what RocketMQ's own tools and clients do
with them, against Apache RocketMQ 4.9 and ferry in the same test (two masters each,
tests/compat/remoting_backends.py):

- every master registers a topic named after its cluster (16 queues, read-write and
  inherit), one named after itself (1 queue), `TBW102` (8 queues, inherit) and
  `SELF_TEST_TOPIC`, so the name server routes them;
- the admin API's `createTopic(key, topic, queues)` (rocketmq-tools 5.x, what RocketMQ's
  e2e suites call for every topic, with the cluster's name as key) creates the topic on
  every master the key's route lists;
- a 4.x Java producer's first send to a topic nobody created succeeds: the client routes
  it by `TBW102`, each master it reaches creates the topic with min(4, 8) queues, and the
  name server routes it afterwards; a push consumer reads every message.

Waits on the programs' events and the name server's routes with bounds, never a sleep.
"""

from __future__ import annotations

import itertools

import pytest

from ferry.remoting import bodies, codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.apache import ApacheAdmin
from tests.compat import clients
from tests.compat.remoting_backends import BACKENDS, TWO_MASTERS, start_remoting_backend
from tests.compat.specs import parametrize_cluster
from tests.compat.test_remoting_clients import producer, push_consumer, successes
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(240)

_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_remoting_backend(
        request.param, TWO_MASTERS, tmp_path_factory.mktemp(f"defaults-{request.param}")
    )
    try:
        yield backend
    finally:
        backend.stop()


@pytest.fixture(scope="module")
def admin(cluster, tmp_path_factory):
    """rocketmq-tools 5.x's DefaultMQAdminExt (tests/compat/rocketmq5's Admin5)."""
    session = ApacheAdmin(
        tmp_path_factory.mktemp(f"admin-{cluster.name}"), cluster.namesrv, cluster.cluster_name
    ).start()
    try:
        yield session
    finally:
        session.stop()


def route(namesrv: str, topic: str) -> dict | None:
    """The name server's GET_ROUTEINFO_BY_TOPIC answer (None: TOPIC_NOT_EXIST)."""
    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), 10)
    if answer.code == codes.TOPIC_NOT_EXIST:
        return None
    assert answer.code == codes.SUCCESS, (answer.code, answer.remark)
    return bodies.loads(answer.body)


def queues(namesrv: str, topic: str) -> dict[str, tuple[int, int, int]]:
    """The route's (readQueueNums, writeQueueNums, perm) by broker name; {} without one."""
    got = route(namesrv, topic)
    if got is None:
        return {}
    return {
        q["brokerName"]: (q["readQueueNums"], q["writeQueueNums"], q["perm"])
        for q in got["queueDatas"]
    }


def test_every_master_routes_the_cluster_broker_and_default_topics(cluster):
    ns = cluster.namesrv
    both = {"broker-a", "broker-b"}
    # Registered at start: routed as soon as the brokers are.
    assert queues(ns, cluster.cluster_name) == dict.fromkeys(both, (16, 16, 7))
    assert queues(ns, "TBW102") == dict.fromkeys(both, (8, 8, 7))
    assert queues(ns, "SELF_TEST_TOPIC") == dict.fromkeys(both, (1, 1, 6))
    assert queues(ns, "broker-a") == {"broker-a": (1, 1, 7)}
    assert queues(ns, "broker-b") == {"broker-b": (1, 1, 7)}
    assert queues(ns, f"{cluster.cluster_name}_REPLY_TOPIC") == dict.fromkeys(both, (1, 1, 6))


def test_create_topic_by_the_cluster_key_reaches_every_master(cluster, admin):
    topic = f"ByKey{next(_ids)}"
    answer = admin.call(op="createTopicByKey", key=cluster.cluster_name, topic=topic, queues=3)
    assert answer["brokers"] == 2
    assert queues(cluster.namesrv, topic) == dict.fromkeys({"broker-a", "broker-b"}, (3, 3, 6))
    assert topic in admin.call(op="topicList")["topics"]


def test_a_first_send_to_an_unknown_topic_creates_it_from_tbw102(cluster, tmp_path):
    topic = f"Auto{next(_ids)}"
    assert route(cluster.namesrv, topic) is None
    run = producer(cluster, tmp_path, "auto", topic, "sync", 12)
    sends = clients.produce(run)
    assert [s["status"] for s in sends] == ["SEND_OK"] * 12, sends
    reached = {s["broker"] for s in sends}
    # Each master that took a send created the topic with min(the client's 4, TBW102's 8)
    # queues and registered it; the client's later sends used the topic's own route.
    wait_for(
        lambda: set(queues(cluster.namesrv, topic)) == reached,
        30,
        f"{topic} routed to {sorted(reached)}",
    )
    assert set(queues(cluster.namesrv, topic).values()) == {(4, 4, 6)}
    consumer = push_consumer(cluster, tmp_path, topic, f"gAuto{next(_ids)}", name="c").start()
    want = {s["msgId"] for s in sends}
    try:
        consumer.wait(
            lambda c: {e["msgId"] for e in successes(c)} >= want,
            60,
            "every message of the auto-created topic consumed",
        )
    finally:
        consumer.stop()


def test_consumer_running_info_is_asked_of_the_consumer(cluster, admin, tmp_path):
    """307, as `mqadmin consumerStatus` and the Dashboard's consumer page ask it: the
    broker forwards it to the consumer over its connection and hands its answer back."""
    topic = f"Running{next(_ids)}"
    group = f"gRunning{next(_ids)}"
    admin.call(op="createTopicByKey", key=cluster.cluster_name, topic=topic, queues=2)
    consumer = push_consumer(cluster, tmp_path, topic, group, name="running").start()
    try:
        consumer.wait(lambda c: bool(c.of("started")), 60, "the push consumer started")
        info = wait_for(
            lambda: (
                (got := _running_info(admin, group)) is not None
                and len([q for q in got["queues"] if q.startswith(f"{topic}/")]) == 4
                and got
            ),
            60,
            f"{group}'s running info with its 4 queues",
        )
    finally:
        consumer.stop()
    assert topic in info["topics"]
    assert info["consumeType"] == "CONSUME_PASSIVELY"
    mine = [q for q in info["queues"] if q.startswith(f"{topic}/")]
    assert mine == [f"{topic}/{b}/{q}" for b in ("broker-a", "broker-b") for q in (0, 1)]


def _running_info(admin, group: str) -> dict | None:
    try:
        return admin.call(op="consumerRunningInfo", group=group)
    except RuntimeError:
        return None  # not connected yet


def test_broker_stats_count_a_topics_puts_and_a_groups_gets(cluster, admin, tmp_path):
    """315, as `mqadmin statsAll` and the Dashboard's topic charts ask it: TOPIC_PUT_NUMS
    by topic and GROUP_GET_NUMS by topic@group, each master its own share; an item that
    never counted anything is not there."""
    topic = f"Counted{next(_ids)}"
    group = f"gCounted{next(_ids)}"
    admin.call(op="createTopicByKey", key=cluster.cluster_name, topic=topic, queues=2)
    missing = admin.call(op="brokerStats", name="TOPIC_PUT_NUMS", key=topic)["sums"]
    assert all(isinstance(v, str) and "not exist" in v for v in missing.values()), missing
    sends = clients.produce(producer(cluster, tmp_path, "counted", topic, "sync", 10))
    assert {s["status"] for s in sends} == {"SEND_OK"}

    def sums(name: str, key: str) -> list:
        return list(admin.call(op="brokerStats", name=name, key=key)["sums"].values())

    def total(values: list) -> tuple[int, int, int] | None:
        counted = [v for v in values if isinstance(v, list)]
        return tuple(sum(v[i] for v in counted) for i in range(3)) if counted else None

    def wait_total(name: str, key: str) -> None:
        """Apache samples an item's minute every 10 s: wait for it to show all ten.
        Its hour and day are sampled every 10 min and every hour (ferry's run up to
        now, Apache's up to their last sample): somewhere between none and all ten."""
        seen: list = []
        wait_for(
            lambda: (
                seen.append(got := total(sums(name, key)))
                or (got is not None and got[0] == 10 and all(0 <= n <= 10 for n in got[1:]))
            ),
            40,
            lambda: f"{name} of {key} reaching 10 (last sums: {seen[-3:]})",
            0.5,
        )

    wait_total("TOPIC_PUT_NUMS", topic)
    consumer = push_consumer(cluster, tmp_path, topic, group, name="counter").start()
    try:
        consumer.wait(lambda c: len(successes(c)) >= 10, 60, "every message consumed")
    finally:
        consumer.stop()
    wait_total("GROUP_GET_NUMS", f"{topic}@{group}")
