"""rocketmq-client 5.5.0's DefaultMQPushConsumer as a pop consumer over RocketMQ's
protocol (tests/compat/rocketmq5's PopConsumer5), against Apache RocketMQ 5.5.0 and ferry
in the same test (tests/compat/backends.py: Apache's broker inside its local-mode proxy;
two ferry masters). With `clientRebalance` off the consumer asks a broker for its
queues (QUERY_ASSIGNMENT 400); once `mqadmin setConsumeMode -m POP` set the group's mode
(SET_MESSAGE_REQUEST_MODE 401 on every master, through Admin5) it pops every queue of
every broker (200050), acknowledges each message (200051) and re-times a message its
listener answers RECONSUME_LATER (200053), which then comes again, from the pop retry
topic once the broker has revived it.

What holds on Apache is what ferry must do: Apache 5.5.0 is the oracle.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.apache import ApacheAdmin
from tests.compat import clients
from tests.compat.backends import BACKENDS, start_backend
from tests.compat.specs import parametrize_cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.apache5]

_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_backend(request.param, tmp_path_factory.mktemp(f"pop5-{request.param}"))
    try:
        yield backend
    finally:
        backend.release()


@pytest.fixture(scope="module")
def admin(cluster, tmp_path_factory):
    session = ApacheAdmin(
        tmp_path_factory.mktemp(f"pop5-admin-{cluster.name}"),
        cluster.namesrv_addr,
        "ApacheCluster" if cluster.name == "apache" else "DefaultCluster",
    ).start()
    try:
        yield session
    finally:
        session.stop()


def _masters(cluster) -> list[str]:
    """The masters' RocketMQ-protocol addresses."""
    if cluster.name == "apache":
        return [f"127.0.0.1:{cluster.proxy.broker_port}"]
    return [b.remoting_addr for b in cluster.brokers]


def _produce(cluster, tmp_path, topic: str, name: str, count: int) -> list[dict]:
    producer = clients.java(
        "Producer49",
        # 15 s a send: a fresh-clone CI run once saw the shared back end's name server answer
        # no route lookup for over 3 s, and one send of 20 ran out of the default 5 s. A slow
        # machine is not what these tests check.
        ["--namesrv", cluster.namesrv_addr, "--topic", topic, "--count", str(count),
         "--key-prefix", name, "--timeout-ms", "15000"],
        tmp_path / name,
        name,
    )  # fmt: skip
    sent = clients.sent_ok(clients.produce(producer))
    assert len(sent) == count, f"{name}: {count - len(sent)} sends failed"
    return sent


def _pop_consumer(cluster, tmp_path, group: str, topic: str, *extra: str) -> clients.Client:
    return clients.java(
        "PopConsumer5",
        ["--namesrv", cluster.namesrv_addr, "--group", group, "--topic", topic,
         "--stdin-stop", "--invisible-ms", "5000", *extra],
        tmp_path / f"pop-{group}",
        f"pop-{group}",
        kit="rocketmq5",
    )  # fmt: skip


def _delivered(consumer: clients.Client, status: str = "SUCCESS") -> list[dict]:
    return [e for e in consumer.of("msg") if e["status"] == status]


def test_a_5x_push_consumer_pops_every_message_and_acks_it(cluster, admin, tmp_path):
    """Every message sent is delivered, popped (each carries the POP_CK it is acknowledged
    with) from the queues of both brokers, and acknowledged: a second consumer of the group
    started afterwards gets nothing more."""
    n = next(_ids)
    topic, group = f"Pop5Topic{n}", f"gPop5{n}"
    cluster.create_topic(topic, 2)
    cluster.ensure_group(group)
    admin.call(op="consumeMode", topic=topic, group=group, mode="POP", popShareQueueNum=0)
    sent = _produce(cluster, tmp_path, topic, f"pop5-{n}", 20)

    with _pop_consumer(cluster, tmp_path, group, topic) as consumer:
        consumer.wait(
            lambda c: {e["keys"] for e in _delivered(c)} >= {s["key"] for s in sent},
            120,
            lambda c: f"all 20 messages (got {len(_delivered(c))})",
        )
        got = _delivered(consumer)
    assert all("POP_CK" in e["properties"] for e in got), "a delivery was not popped"
    brokers = {e["properties"]["POP_CK"].split(" ")[5] for e in got}
    assert len(brokers) == len(_masters(cluster)), brokers
    # Acknowledged: each message's pop state is gone; nothing comes back to a new consumer
    # within twice the invisible time.
    with _pop_consumer(cluster, tmp_path, group, topic, "--timeout-ms", "12000") as again:
        again.wait(lambda c: c.of("stopped"), 60, "the second consumer's end")
        assert _delivered(again) == [], "acknowledged messages came again"


def test_a_message_the_listener_defers_comes_again(cluster, admin, tmp_path):
    """RECONSUME_LATER re-times the message (CHANGE_MESSAGE_INVISIBLETIME, 10 s: the
    client's first pop delay level); it comes again with reconsumeTimes 1, then is
    acknowledged."""
    n = next(_ids)
    topic, group = f"Pop5Later{n}", f"gPop5Later{n}"
    cluster.create_topic(topic, 1)
    cluster.ensure_group(group)
    admin.call(op="consumeMode", topic=topic, group=group, mode="POP", popShareQueueNum=0)
    name = f"later5-{n}"
    sent = _produce(cluster, tmp_path, topic, name, 3)
    deferred = sent[0]["key"]
    with _pop_consumer(
        cluster, tmp_path, group, topic, "--later-keys", deferred, "--later-times", "1"
    ) as consumer:
        consumer.wait(
            lambda c: {e["keys"] for e in _delivered(c)} >= {s["key"] for s in sent},
            120,
            lambda c: (
                f"the deferred message again (events {Counter(e['status'] for e in c.of('msg'))})"
            ),
        )
        later = [e for e in consumer.of("msg") if e["keys"] == deferred]
    assert [e["status"] for e in later][:2] == ["LATER", "SUCCESS"], later
    assert later[1]["reconsumeTimes"] >= 1


def test_the_mode_is_kept_and_listed(cluster, admin):
    """401's mode is what 402 lists (a RocketMQ slave copies it from there), and a query
    for the assignment names every broker with queue id -1 in POP mode."""
    n = next(_ids)
    topic, group = f"Pop5Mode{n}", f"gPop5Mode{n}"
    cluster.create_topic(topic, 2)
    cluster.ensure_group(group)
    admin.call(op="consumeMode", topic=topic, group=group, mode="POP", popShareQueueNum=0)
    for addr in _masters(cluster):
        answer = call(addr, Command(codes.GET_ALL_MESSAGE_REQUEST_MODE), 10)
        assert answer.code == codes.SUCCESS, answer.remark
        table = json.loads(answer.body)["messageRequestModeMap"]
        assert table[topic][group] == {
            "consumerGroup": group, "mode": "POP", "popShareQueueNum": 0, "topic": topic,
        }  # fmt: skip


def test_setting_a_mode_is_refused_as_apache_refuses_it(cluster):
    """A retry topic (16), a topic the broker does not have (17)."""
    addr = _masters(cluster)[0]

    def set_mode(topic: str) -> Command:
        body = json.dumps(
            {"consumerGroup": "gPop5Refused", "mode": "POP", "popShareQueueNum": 0, "topic": topic}
        ).encode()
        return call(addr, Command(codes.SET_MESSAGE_REQUEST_MODE, body=body), 10)

    retry = set_mode("%RETRY%gPop5Refused")
    assert (retry.code, retry.remark) == (
        codes.NO_PERMISSION,
        "retry topic is not allowed to set mode",
    )
    unknown = set_mode("Pop5NoSuchTopic")
    assert (unknown.code, unknown.remark) == (
        codes.TOPIC_NOT_EXIST,
        "topic[Pop5NoSuchTopic] not exist",
    )
