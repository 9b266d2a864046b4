"""SQL92 subscriptions over RocketMQ's TCP protocol — the 4.x Java client's
`MessageSelector.bySql`, a push consumer — against Apache RocketMQ 4.9 and ferry in the same
test, both brokers with enablePropertyFilter=true: the same messages delivered, none of the
others.
"""

from __future__ import annotations

import itertools

import pytest

from tests.compat import clients
from tests.compat.remoting_backends import BACKENDS, SINGLE, start_remoting_backend
from tests.compat.specs import parametrize_cluster

pytestmark = pytest.mark.timeout(240)
_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_remoting_backend(
        request.param, SINGLE, tmp_path_factory.mktemp(f"sql-{request.param}")
    )
    try:
        yield backend
    finally:
        backend.stop()


def test_a_push_consumer_by_sql_gets_what_its_selector_selects(cluster, tmp_path):
    topic, group = f"SqlT{next(_ids)}", f"SqlG{next(_ids)}"
    cluster.create_topic(topic, 2)
    selector = (
        "seq BETWEEN 5 AND 14 AND (seq < 8 OR seq > 11) AND colour IN ('red', 'green') "
        "AND TAGS = 'TagS' AND missing IS NULL"
    )
    expected = [5, 6, 7, 12, 13, 14]
    consumer = clients.java(
        "PushConsumer49",
        ["--namesrv", cluster.namesrv, "--topic", topic, "--group", group, "--instance", "sql",
         "--sql", selector, "--count", str(len(expected)), "--timeout-ms", "120000"],
        tmp_path / "consumer", "consumer",
    ).start()  # fmt: skip
    with consumer:
        consumer.wait(lambda c: c.of("started"), 60, "the consumer's start")
        producer = clients.java(
            "Producer49",
            ["--namesrv", cluster.namesrv, "--topic", topic, "--mode", "sync", "--count", "20",
             "--key-prefix", "sql", "--tag", "TagS", "--prop", "colour=red"],
            tmp_path / "producer", "producer",
        )  # fmt: skip
        assert len(clients.sent_ok(clients.produce(producer))) == 20
        events = consumer.finish(150)
    got = sorted(int(e["properties"]["seq"]) for e in events if e["event"] == "msg")
    assert got == expected, events[-5:]
