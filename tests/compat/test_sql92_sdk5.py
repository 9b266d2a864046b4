"""SQL92 subscriptions of the RocketMQ 5 SDK (a FilterExpression of type SQL), against
Apache RocketMQ 5.5.0 (its proxy in local mode, enablePropertyFilter=true) and ferry (its
proxy, brokers with the same key) in the same test: the same messages selected, and a
selector that does not compile refused.
"""

from __future__ import annotations

import itertools

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import FilterType

from tests.compat.backends import BACKENDS, start_backend
from tests.compat.specs import parametrize_cluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.apache5]
_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_backend(request.param, tmp_path_factory.mktemp(f"sql5-{request.param}"))
    try:
        yield backend
    finally:
        backend.release()


def _send(cluster, topic: str, count: int) -> dict[str, int]:
    """`count` messages with the properties seq=i and colour=red|blue: message id -> i."""
    producer = Producer(cluster.config(), (topic,))
    producer.startup()
    sent = {}
    try:
        for i in range(count):
            m = Message()
            m.topic, m.body, m.tag = topic, f"sql {i}".encode(), "TagA" if i % 2 else "TagB"
            m.add_property("seq", str(i))
            m.add_property("colour", "red" if i % 3 else "blue")
            sent[producer.send(m).message_id] = i
    finally:
        producer.shutdown()
    return sent


def _receive_all(consumer: SimpleConsumer, want: int) -> list:
    got = []

    def enough() -> bool:
        for m in consumer.receive(16, 20):
            got.append(m)
            consumer.ack(m)
        return len(got) >= want

    wait_for(enough, 90, lambda: f"{want} messages ({len(got)} so far)", interval_s=0)
    return got


def test_an_sql92_subscription_receives_what_its_selector_selects(cluster):
    topic, group = f"Sql5T{next(_ids)}", f"Sql5G{next(_ids)}"
    cluster.create_topic(topic, 2)
    cluster.ensure_group(group)
    selector = "seq >= 4 AND seq < 16 AND (colour = 'red' OR TAGS = 'TagB') AND nope IS NULL"
    consumer = SimpleConsumer(
        cluster.config(), group, {topic: FilterExpression(selector, FilterType.SQL)}, 2
    )
    consumer.startup()
    try:
        sent = _send(cluster, topic, 20)
        expected = sorted(
            i
            for i in range(4, 16)
            if i % 3 or i % 2 == 0  # red, or TagB (even)
        )
        got = _receive_all(consumer, len(expected))
        # Nothing more comes: what the selector leaves out is never handed out.
        assert list(consumer.receive(16, 3)) == []
    finally:
        consumer.shutdown()
    assert sorted(sent[m.message_id] for m in got) == expected
    assert all(m.properties["seq"] == str(sent[m.message_id]) for m in got)


def test_a_selector_that_does_not_compile_is_refused(cluster):
    topic, group = f"Sql5Bad{next(_ids)}", f"Sql5BadG{next(_ids)}"
    cluster.create_topic(topic, 1)
    cluster.ensure_group(group)
    consumer = SimpleConsumer(
        cluster.config(), group, {topic: FilterExpression("seq >>= 1", FilterType.SQL)}, 2
    )
    consumer.startup()
    try:
        _send(cluster, topic, 1)
        with pytest.raises(Exception) as refused:  # noqa: PT011 - the SDK's own exception types differ by version
            consumer.receive(1, 10)
    finally:
        consumer.shutdown()
    # Both answer with an error status (Apache: INTERNAL_SERVER_ERROR with "parse the
    # consumer's subscription failed"; ferry: ILLEGAL_FILTER_EXPRESSION saying why).
    assert "subscription" in str(refused.value).lower() or "sql92" in str(refused.value).lower()
