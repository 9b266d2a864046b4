"""What RocketMQ Dashboard's topic pages and mqadmin 5.x ask a cluster through
rocketmq-tools 5.5.0's DefaultMQAdminExt (tests/compat/rocketmq5's Admin5), against
Apache RocketMQ 5.5.0 and ferry in the same test (tests/compat/backends.py: Apache's
broker in its local-mode proxy; two ferry masters): the topic list with its system
topics (206; 304 to the name server, then 305 to the broker it names), one topic's
config on each master (351), and its stats (202, with 351 for the static-topic view),
which fail for a topic nobody created.

Apache 4.9's brokers answer 351 with 3, so these run against 5.5.0 only;
tests/compat/test_default_topics.py has what 4.9 and ferry share.
"""

from __future__ import annotations

import itertools
import json
import re
import time

import pytest

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.apache import ApacheAdmin
from tests.compat import clients
from tests.compat.backends import BACKENDS, start_backend
from tests.compat.mqadmin import MqadminSession
from tests.compat.specs import parametrize_cluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.apache5]


_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_backend(request.param, tmp_path_factory.mktemp(f"tools5-{request.param}"))
    try:
        yield backend
    finally:
        backend.release()


def routed(namesrv: str, topic: str) -> bool:
    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), 10)
    return answer.code == codes.SUCCESS


def cluster_name_of(cluster) -> str:
    return "ApacheCluster" if cluster.name == "apache" else "DefaultCluster"


@pytest.fixture(scope="module")
def admin(cluster, tmp_path_factory):
    session = ApacheAdmin(
        tmp_path_factory.mktemp(f"admin5-{cluster.name}"),
        cluster.namesrv_addr,
        cluster_name_of(cluster),
    ).start()
    try:
        yield session
    finally:
        session.stop()


def test_the_dashboards_topic_calls(cluster, admin, tmp_path):
    name = cluster_name_of(cluster)
    topic = f"Shown{next(_ids)}"
    # The cluster-named topic is routed once a master has registered (Apache's broker
    # inside its proxy may still be on its way).
    wait_for(lambda: routed(cluster.namesrv_addr, name), 60, f"the route of {name}", 0.2)
    masters = admin.call(op="createTopicByKey", key=name, topic=topic, queues=2)["brokers"]
    assert masters == (1 if cluster.name == "apache" else 2)
    system = set(admin.call(op="systemTopics")["topics"])
    assert {name, "TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"} <= system
    assert topic not in system
    configs = admin.call(op="topicConfig", topic=topic)["configs"]
    assert list(configs.values()) == [[2, 2, 6]] * masters
    run = clients.java(
        "Producer49",
        ["--namesrv", cluster.namesrv_addr, "--topic", topic, "--count", "8",
         "--key-prefix", "shown"],
        tmp_path / "producer",
        "producer",
    )  # fmt: skip
    sends = clients.produce(run)
    assert {s["status"] for s in sends} == {"SEND_OK"}, sends
    stats = admin.call(op="topicStats", topic=topic)["queues"]
    assert len(stats) == 2 * masters
    assert sum(high - low for low, high in stats.values()) == 8
    with pytest.raises(RuntimeError, match="No topic route info|TOPIC_NOT_EXIST|17"):
        admin.call(op="topicStats", topic=f"Never{next(_ids)}")


@pytest.mark.parametrize("unit", ["sec", "ms"])
def test_a_relative_timer_from_the_5x_client_waits(cluster, admin, unit):
    """rocketmq-client 5.x's Message.setDelayTimeSec / setDelayTimeMs (TIMER_DELAY_SEC /
    TIMER_DELAY_MS; the Spring starter's syncSendDelayTimeSeconds): the message is held
    that long after the broker stores it, then delivered, a DELAY message to the SDKs."""
    from rocketmq.grpc_protocol import MessageType

    from tests.integration.test_proxy_sdk import _receive_until, _simple

    topic = f"Relative{unit.capitalize()}{next(_ids)}"
    cluster.create_topic(topic, 2, message_type="DELAY")
    consumer = _simple(cluster, f"gRelative{next(_ids)}", topic)
    try:
        sent_at = time.time()
        delay = {"sec": 3} if unit == "sec" else {"ms": 3000}
        answer = admin.call(op="sendDelayed", topic=topic, body="later", **delay)
        assert answer["status"] == "SEND_OK"
        got = _receive_until(consumer, 1, 60)
        received = time.time()
        assert [m.body for m in got] == [b"later"]
        assert received - sent_at >= 3 * 0.9, "delivered before its time"
        assert got[0].message_type == MessageType.DELAY
    finally:
        consumer.shutdown()


def _broker_addrs(cluster) -> list[str]:
    """The masters' RocketMQ-protocol addresses."""
    if cluster.name == "apache":
        return [f"127.0.0.1:{cluster.proxy.broker_port}"]
    return [b.remoting_addr for b in cluster.brokers]


def test_mqadmins_maintenance_and_config_commands(cluster, tmp_path):
    """mqadmin 5.5.0's getNamesrvConfig (319), deleteExpiredCommitLog (329), cleanExpiredCQ
    (306) and cleanUnusedTopic (316), none of which ferry answered before (3)."""

    with MqadminSession(tmp_path / "mqadmin", kit="rocketmq5") as session:

        def mqadmin(*args: str) -> str:
            done = session.run(*args, "-n", cluster.namesrv_addr)
            assert "not supported" not in done.out + done.err, done.out + done.err
            return done.out

        config = mqadmin("getNamesrvConfig")
        assert f"============{cluster.namesrv_addr}============" in config
        assert re.search(r"^listenPort\s+=\s+\d+", config, re.M), config
        for addr in _broker_addrs(cluster):
            for command in ("deleteExpiredCommitLog", "cleanExpiredCQ", "cleanUnusedTopic"):
                assert mqadmin(command, "-b", addr).strip().endswith("success"), command


N, B, S = "n", "b", "s"  # Admin5's shape leaves: number, boolean, string
OFFSETS = {"brokerOffset": N, "consumerOffset": N, "lastTimestamp": N, "pullOffset": N}
# What rocketmq-tools 5.5.0 decodes from each answer, the same from ferry and Apache 5.5.0
# (Admin5's "inspect": the decoded objects' fields; maps keyed by queues or groups as "*").
SHAPES = {
    "brokerConsumeStats": {
        "brokerAddr": S,
        "consumeStatsList": [{"*": [{"consumeTps": N, "offsetTable": {"*": OFFSETS}}]}],
        "totalDiff": N,
        "totalInflightDiff": N,
    },
    "queryCq": {  # asked without a group: no subscription or filter on either
        "filterData": "null",
        "maxQueueIndex": N,
        "minQueueIndex": N,
        "queueData": [
            {
                "bitMap": "null",
                "eval": B,
                "extendDataJson": "null",
                "msg": "null",
                "physicOffset": N,
                "physicSize": N,
                "tagsCode": N,
            }
        ],
        "subscriptionData": "null",
    },  # fmt: skip
    "haStatus": {  # a master without slaves, on both
        "haClientRuntimeInfo": {
            "lastReadTimestamp": N,
            "lastWriteTimestamp": N,
            "masterAddr": "null",  # a master's: no master of its own
            "masterFlushOffset": N,
            "maxOffset": N,
            "transferredByteInSecond": N,
        },
        "haConnectionInfo": [],
        "inSyncSlaveNums": N,
        "master": B,
        "masterCommitLogMaxOffset": N,
    },  # fmt: skip
    "coldData": {
        "cgColdReadThreshold": N,
        "configTable": {},
        "globalAcc": N,
        "globalColdReadThreshold": N,
        "runtimeTable": {},
    },  # fmt: skip
}


def test_mqadmins_inspecting_calls_decode_alike(cluster, admin, tmp_path):
    """brokerConsumeStats (317), queryCq (321), haStatus (907), getColdDataFlowCtrInfo
    (2003) decode into the same structure from both; getBrokerEpoch (1007) is refused
    alike outside controller mode (Apache) / without failover (ferry)."""
    name = cluster_name_of(cluster)
    topic, group = f"Inspected{next(_ids)}", f"gInspected{next(_ids)}"
    wait_for(lambda: routed(cluster.namesrv_addr, name), 60, f"the route of {name}", 0.2)
    admin.call(op="createTopicByKey", key=name, topic=topic, queues=1)
    admin.call(op="group", group=group)
    run = clients.java(
        "Producer49", ["--namesrv", cluster.namesrv_addr, "--topic", topic, "--count", "4"],
        tmp_path / "producer", "producer",
    )  # fmt: skip
    assert {s["status"] for s in clients.produce(run)} == {"SEND_OK"}
    broker = _broker_addrs(cluster)[0]
    commit = Command(
        codes.UPDATE_CONSUMER_OFFSET,
        ext={"consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": "1"},
    )
    assert call(broker, commit, 10).code == codes.SUCCESS
    got = admin.call(op="inspect", broker=broker, topic=topic)
    for key, shape in SHAPES.items():
        assert got[key] == {"shape": shape}, f"{key}: {json.dumps(got[key])}"
    assert "CODE: 1" in got["epochCache"]["error"]
    assert "this request only for controllerMode" in got["epochCache"]["error"]
