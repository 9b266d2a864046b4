"""A real broker's answers to the codes that look inside it (services/broker/remoting/
diagnostics.py): GET_BROKER_CONSUME_STATS 317, QUERY_CONSUME_QUEUE 321,
GET_BROKER_HA_STATUS 907 on a master and its slave, GET_BROKER_EPOCH_CACHE 1007 and the
cold-data and ACL 2.0 codes, with the figures of the store and HA they describe, in the
field names of Apache's body classes (tests/compat/test_admin_tools5.py decodes them
with rocketmq-tools 5.5.0 beside Apache's broker).
"""

from __future__ import annotations

import pytest

from ferry.remoting import codes
from ferry.remoting.bodies import loads, loads_object_keyed
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.v1 import broker_pb2, ha_admin_pb2, ha_admin_pb2_grpc
from tests.conftest import start_broker
from tests.integration.support import create_topic
from tests.integration.test_remoting_stats import GROUP, TOPIC, heartbeat, timed  # noqa: F401
from tests.waiting import wait_for


def test_broker_consume_stats_are_every_groups_progress(timed):  # noqa: F811
    door, _, start = timed
    heartbeat(door, TOPIC)  # creates the group (autoCreateSubscriptionGroup)
    answer = door.call(Command(codes.GET_BROKER_CONSUME_STATS, ext={"isOrder": "false"}))
    assert answer.code == codes.SUCCESS, answer.remark
    text = bytes(answer.body).decode()
    assert text.startswith('{"brokerAddr":"127.0.0.1:')
    assert '"totalDiff":1,"totalInflightDiff":0}' in text  # 3 stored, 2 committed
    at = text.index(f'"{GROUP}":[')
    pairs, _ = loads_object_keyed(text, text.index('"offsetTable":', at) + len('"offsetTable":'))
    by_queue = {k["queueId"]: v for k, v in pairs}
    assert sorted(by_queue) == [0, 1, 2, 3]
    assert by_queue[0] == {"brokerOffset": 3, "consumerOffset": 2,
                           "lastTimestamp": start + 1000, "pullOffset": 2}  # fmt: skip
    ordered = door.call(Command(codes.GET_BROKER_CONSUME_STATS, ext={"isOrder": "true"}))
    assert f'"{GROUP}":[]' in bytes(ordered.body).decode()  # TOPIC is not orderly
    missing = door.call(Command(codes.GET_BROKER_CONSUME_STATS))
    assert (missing.code, missing.remark) == (
        codes.SYSTEM_ERROR,
        "isOrder: missing from the request header",
    )


def test_query_consume_queue_lists_the_entries_from_the_index(timed):  # noqa: F811
    door, _, _ = timed
    heartbeat(door, TOPIC)
    ext = {"topic": TOPIC, "queueId": "0", "index": "1", "count": "5", "consumerGroup": GROUP}
    answer = door.call(Command(codes.QUERY_CONSUME_QUEUE, ext=ext))
    assert answer.code == codes.SUCCESS, answer.remark
    body = loads(answer.body)
    assert (body["minQueueIndex"], body["maxQueueIndex"]) == (0, 3)
    assert [sorted(e) for e in body["queueData"]] == [
        ["eval", "physicOffset", "physicSize", "tagsCode"]
    ] * 2
    first, second = body["queueData"]
    assert first["physicOffset"] + first["physicSize"] == second["physicOffset"]
    assert body["subscriptionData"]["topic"] == TOPIC and body["filterData"] == "null"
    offline = door.call(Command(codes.QUERY_CONSUME_QUEUE, ext={**ext, "consumerGroup": "nobody"}))
    assert loads(offline.body)["filterData"] == f"nobody@{TOPIC} is not online!"
    past = door.call(Command(codes.QUERY_CONSUME_QUEUE, ext={**ext, "index": "9"}))
    assert past.code == codes.SUCCESS and loads(past.body)["queueData"] == []
    assert past.remark == f"Index 9 of 0@{TOPIC} is not exist!"
    unknown = door.call(Command(codes.QUERY_CONSUME_QUEUE, ext={**ext, "queueId": "7"}))
    assert (unknown.code, unknown.remark) == (codes.SYSTEM_ERROR, f"7@{TOPIC} is not exist!")
    bad = door.call(Command(codes.QUERY_CONSUME_QUEUE, ext={**ext, "index": "x"}))
    assert bad.code == codes.SYSTEM_ERROR and bad.remark.startswith("index: not an integer")


def test_features_ferry_lacks_answer_as_apache_with_them_off(timed):  # noqa: F811
    door, _, _ = timed
    epochs = door.call(Command(codes.GET_BROKER_EPOCH_CACHE))
    assert epochs.code == codes.SYSTEM_ERROR
    assert epochs.remark.startswith("this request only for controllerMode")
    assert "enableFailover" in epochs.remark
    cold = door.call(Command(codes.GET_COLD_DATA_FLOW_CTR_INFO))
    assert cold.code == codes.SUCCESS
    body = loads(cold.body)
    assert (body["runtimeTable"], body["configTable"], body["globalAcc"]) == ({}, {}, 0)
    for code in (
        codes.UPDATE_COLD_DATA_FLOW_CTR_CONFIG,
        codes.AUTH_LIST_USER,
        codes.AUTH_CREATE_ACL,
    ):
        refused = door.call(Command(code, ext={"username": "u"}))
        assert refused.code == codes.SYSTEM_ERROR, code
        assert "ferry" in refused.remark and "not supported" not in refused.remark


@pytest.fixture
def pair(loop_thread, tmp_path, namesrv):
    """A master and its slave, 4 messages replicated."""
    common = dict(brokerName="broker-h", haReconnectInterval=200)
    master = start_broker(loop_thread, tmp_path / "m", namesrv.remoting_addr, **common)
    slave = start_broker(loop_thread, tmp_path / "s", namesrv.remoting_addr,
                         brokerRole="SLAVE", brokerId=1, **common)  # fmt: skip
    try:
        create_topic(master.channel, "Replicated", 1)
        master.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="Replicated", queue_id=0,
                messages=[broker_pb2.SendEntry(body=b"m%d" % i) for i in range(4)],
            ),
            timeout=10,
        )  # fmt: skip
        top = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == top, 15, "the slave to catch up")
        yield master, slave
    finally:
        slave.stop()
        master.stop()


def test_ha_status_is_the_masters_slaves_and_the_slaves_master(pair):
    master, slave = pair
    top = master.app.store.max_offset

    def status(broker) -> dict:
        answer = call(broker.remoting_addr, Command(codes.GET_BROKER_HA_STATUS), timeout=10)
        assert answer.code == codes.SUCCESS, answer.remark
        return loads(answer.body)

    def acked() -> bool:
        conns = status(master)["haConnectionInfo"]
        return len(conns) == 1 and conns[0]["slaveAckOffset"] == top

    wait_for(acked, 15, "the slave's ack of the master's end")
    on_master = status(master)
    assert on_master["master"] is True
    assert on_master["masterCommitLogMaxOffset"] == top
    assert on_master["inSyncSlaveNums"] == 1
    (conn,) = on_master["haConnectionInfo"]
    assert sorted(conn) == ["addr", "diff", "inSync", "slaveAckOffset", "transferFromWhere",
                            "transferredByteInSecond"]  # fmt: skip
    assert (conn["diff"], conn["inSync"]) == (0, True)
    assert conn["addr"].startswith("127.0.0.1:")
    on_slave = status(slave)
    assert on_slave["master"] is False and on_slave["haConnectionInfo"] == []
    client = on_slave["haClientRuntimeInfo"]
    assert client["masterAddr"] == f"127.0.0.1:{master.app.ha_master.port}"
    assert client["maxOffset"] == top
    assert client["lastReadTimestamp"] > 0
    # ferry.v1's GetHAStatus reads the same use case.
    grpc = ha_admin_pb2_grpc.HAAdminStub(master.channel).GetHAStatus(
        ha_admin_pb2.GetHAStatusRequest(), timeout=10
    )
    assert [(c.ack_offset, c.in_sync) for c in grpc.connections] == [(top, True)]
    assert grpc.in_sync_slave_nums == 1
