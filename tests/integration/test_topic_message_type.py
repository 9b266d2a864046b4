"""RocketMQ 5's topic message type, the topic attribute `message.type`, on the
brokers: set by `ferry topic create/update --message-type` (or `-a`) and
BrokerAdmin with RocketMQ's `+key`/`-key` rules, persisted in topics.json,
copied to a slave with the rest of the topic table, and registered with the
name server, whose routes carry it to the proxy. A name server, a master and
its slave in this process; the `ferry` command as a subprocess."""

from __future__ import annotations

import json

import grpc
import pytest

from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    common_pb2,
    namesrv_pb2,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from tests.conftest import start_broker
from tests.integration.support import run_ferry
from tests.waiting import wait_for

MASTER = "broker-t"


@pytest.fixture
def group(loop_thread, tmp_path, ns):
    master = start_broker(loop_thread, tmp_path / "m", ns.remoting_addr, brokerName=MASTER)
    slave = start_broker(
        loop_thread,
        tmp_path / "s",
        ns.remoting_addr,
        brokerName=MASTER,
        brokerRole="SLAVE",
        brokerId=1,
        slaveSyncDelay=0,
        slaveSyncInterval=200,
    )
    try:
        yield ns, master, slave
    finally:
        slave.stop()
        master.stop()


def _update(broker, topic: str, **attributes: str) -> None:
    broker_admin_pb2_grpc.BrokerAdminStub(broker.channel).UpdateAndCreateTopic(
        broker_admin_pb2.UpdateAndCreateTopicRequest(
            topic_config=common_pb2.TopicConfig(
                topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6,
                attributes=attributes,
            )
        ),
        timeout=10,
    )  # fmt: skip


def _attributes(broker, topic: str) -> dict[str, str]:
    table = slave_sync_pb2_grpc.SlaveSyncStub(broker.channel).GetAllTopicConfig(
        slave_sync_pb2.GetAllTopicConfigRequest(), timeout=10
    )
    return dict(table.topic_config_table[topic].attributes)


def test_the_message_type_follows_rocketmqs_attribute_rules(group):
    _, master, _ = group
    _update(master, "Typed", **{"+message.type": "FIFO"})
    assert _attributes(master, "Typed") == {"message.type": "FIFO"}
    _update(master, "Typed")  # an update that names no attribute keeps them
    assert _attributes(master, "Typed") == {"message.type": "FIFO"}
    _update(master, "Typed", **{"+message.type": "DELAY"})
    assert _attributes(master, "Typed") == {"message.type": "DELAY"}
    _update(master, "Typed", **{"-message.type": ""})  # back to no type: NORMAL
    assert _attributes(master, "Typed") == {}

    refusals = {
        "MIXED message type is not supported.": {"+message.type": "MIXED"},
        "value is not in set": {"+message.type": "fifo"},
        "unsupported key: queue.type": {"+queue.type": "SimpleCQ"},
        "wrong format key": {"message.type": "FIFO"},
        "only add attribute is supported while creating topic": {"-message.type": ""},
    }
    for text, attributes in refusals.items():
        with pytest.raises(grpc.RpcError) as err:
            _update(master, "Refused", **attributes)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, text
        assert text in err.value.details()
    assert "Refused" not in json.loads(_topics_json(master))["topicConfigTable"]


def _topics_json(broker) -> str:
    return (broker.app.config.config_dir / "topics.json").read_text()


def test_the_message_type_is_persisted_synced_to_the_slave_and_routed(group):
    ns, master, slave = group
    out = run_ferry(
        "topic",
        "create",
        "Orders",
        "-b",
        master.addr,
        "-n",
        ns.remoting_addr,
        "--message-type",
        "FIFO",
    )
    assert out.returncode == 0, out.stderr
    assert "attributes +message.type=FIFO" in out.stdout
    stored = json.loads(_topics_json(master))["topicConfigTable"]["Orders"]
    assert stored["attributes"] == {"message.type": "FIFO"}
    wait_for(
        lambda: _attributes(slave, "Orders") == {"message.type": "FIFO"},
        30,
        "the slave's topic table to have Orders as FIFO",
    )

    def routed() -> dict[str, str] | None:
        try:
            route = ns.stub.GetRouteInfoByTopic(
                namesrv_pb2.GetRouteInfoByTopicRequest(topic="Orders"), timeout=5
            )
        except grpc.RpcError:
            return None
        return {q.broker_name: dict(q.attributes) for q in route.queue_datas} or None

    assert wait_for(routed, 30, "Orders in the route") == {MASTER: {"message.type": "FIFO"}}
    # `--order` is another thing (ordered consumption); the type stays as it was.
    out = run_ferry(
        "topic", "update", "Orders", "-b", master.addr, "-n", ns.remoting_addr, "--order"
    )
    assert out.returncode == 0, out.stderr
    assert _attributes(master, "Orders") == {"message.type": "FIFO"}


def test_a_topic_table_written_before_message_types_loads_as_normal(loop_thread, tmp_path):
    """topics.json of an older ferry (no attributes at all) loads; its topics
    are NORMAL, and get a type by an update."""
    store = tmp_path / "old"
    (store / "config").mkdir(parents=True)
    (store / "config" / "topics.json").write_text(
        json.dumps(
            {
                "dataVersion": {"counter": 3, "stateVersion": 0, "timestamp": 1},
                "topicConfigTable": {
                    "Legacy": {
                        "order": False, "perm": 6, "readQueueNums": 2, "topicFilterType":
                        "SINGLE_TAG", "topicName": "Legacy", "topicSysFlag": 0,
                        "writeQueueNums": 2,
                    }
                },
            }
        )
    )  # fmt: skip
    b = start_broker(loop_thread, store)
    try:
        legacy = b.app.metadata.topics.get("Legacy")
        assert (legacy.read_queue_nums, legacy.message_type) == (2, "NORMAL")
        _update(b, "Legacy", **{"+message.type": "DELAY"})
        assert b.app.metadata.topics.get("Legacy").message_type == "DELAY"
    finally:
        b.stop()
