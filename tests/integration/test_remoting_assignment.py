"""RocketMQ 5's server-side assignment and heartbeat v2 on the broker's RocketMQ-protocol
port, against a real in-process broker and ferry's RemotingClient: QUERY_ASSIGNMENT (400),
SET_MESSAGE_REQUEST_MODE (401), GET_ALL_MESSAGE_REQUEST_MODE (402) as rocketmq-client 5.x
and rocketmq-tools send them, and HEART_BEAT's v2 fields (heartbeatFingerprint,
withoutSub; IS_SUPPORT_HEART_BEAT_V2 and IS_SUB_CHANGE in the answer). The 5.x Java pop
consumer against ferry and Apache 5.5.0: tests/compat/test_pop_consumer5.py."""

from __future__ import annotations

import json

import pytest

from ferry.remoting import codes
from services.broker.metadata.tables import MESSAGE_REQUEST_MODE_FILE, RequestMode
from services.broker.remoting import assignment
from tests.integration.test_remoting_consumers import (
    GROUP,
    TOPIC,
    Door,
    close_clients,
    door_of,
    heartbeat,
    start_test_broker,
)

BROKER = "broker-q"


@pytest.fixture
def door(loop_thread, tmp_path):
    broker = start_test_broker(loop_thread, tmp_path / "store", name=BROKER)
    d = door_of(broker)
    yield d
    close_clients(d)
    broker.stop()


def query(door: Door, client, client_id: str, topic: str = TOPIC, **more) -> list[dict] | None:
    body = {
        "clientId": client_id,
        "consumerGroup": GROUP,
        "messageModel": "CLUSTERING",
        "strategyName": "AVG",
        "topic": topic,
        **more,
    }
    answer = door.call(client, codes.QUERY_ASSIGNMENT, body)
    assert answer.code == codes.SUCCESS, answer.remark
    return json.loads(answer.body).get("messageQueueAssignments")


def set_mode(door: Door, client, mode: str, share: int = 0, topic: str = TOPIC):
    body = {"consumerGroup": GROUP, "mode": mode, "popShareQueueNum": share, "topic": topic}
    return door.call(client, codes.SET_MESSAGE_REQUEST_MODE, body)


def test_pull_assignments_divide_the_queues_among_the_members(door):
    one, two = door.connect(), door.connect()
    for client, cid in ((one, "c1"), (two, "c2")):
        assert door.call(client, codes.HEART_BEAT, heartbeat(cid, (TOPIC, "*"))).code == 0
    mine = query(door, one, "c1")
    theirs = query(door, two, "c2")
    assert {a["mode"] for a in mine + theirs} == {"PULL"}
    assert [a["messageQueue"] for a in mine] == [
        {"brokerName": BROKER, "queueId": 0, "topic": TOPIC}
    ]
    assert [a["messageQueue"]["queueId"] for a in theirs] == [1]
    # Not a member (no heartbeat): nothing of its own; an unknown strategy: no answer.
    assert query(door, one, "c3") is None or query(door, one, "c3") == []
    assert query(door, one, "c1", strategyName="CONSISTENT_HASH") is None


def test_pop_mode_is_set_kept_listed_and_assigns_every_queue(door, tmp_path):
    client = door.connect()
    assert door.call(client, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "*"))).code == 0
    answer = set_mode(door, client, "POP")
    assert answer.code == codes.SUCCESS, answer.remark
    assigned = query(door, client, "c1")
    assert assigned == [
        {"messageQueue": {"brokerName": BROKER, "queueId": -1, "topic": TOPIC}, "mode": "POP"}
    ]
    # A retry topic is always pulled.
    retry = query(door, client, "c1", topic=f"%RETRY%{GROUP}")
    assert retry is None or {a["mode"] for a in retry} <= {"PULL"}
    listed = door.call(client, codes.GET_ALL_MESSAGE_REQUEST_MODE)
    assert json.loads(listed.body) == {
        "messageRequestModeMap": {
            TOPIC: {
                GROUP: {
                    "consumerGroup": GROUP, "mode": "POP", "popShareQueueNum": 0, "topic": TOPIC
                }
            }
        }
    }  # fmt: skip
    saved = json.loads((tmp_path / "store" / "config" / MESSAGE_REQUEST_MODE_FILE).read_text())
    assert saved["messageRequestModeMap"][TOPIC][GROUP]["mode"] == "POP"


def test_setting_a_mode_is_refused_with_apaches_codes(door):
    client = door.connect()
    retry = set_mode(door, client, "POP", topic=f"%RETRY%{GROUP}")
    assert (retry.code, retry.remark) == (
        codes.NO_PERMISSION,
        "retry topic is not allowed to set mode",
    )
    unknown = set_mode(door, client, "POP", topic="NoSuchTopic")
    assert (unknown.code, unknown.remark) == (codes.TOPIC_NOT_EXIST, "topic[NoSuchTopic] not exist")
    bad = set_mode(door, client, "PUSH")
    assert bad.code == codes.SYSTEM_ERROR and "mode" in bad.remark


def heartbeat_v2(client_id: str, fingerprint: int, without_sub: bool) -> dict:
    body = heartbeat(client_id, (TOPIC, "TagA"))
    if without_sub:  # the consumer's entry without its subscriptions
        body["consumerDataSet"][0]["subscriptionDataSet"] = []
    body["heartbeatFingerprint"] = fingerprint
    body["withoutSub"] = without_sub
    return body


def test_heartbeat_v2_keeps_the_subscriptions_a_short_heartbeat_leaves_out(door):
    client = door.connect()
    v1 = door.call(client, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "TagA")))
    assert (v1.ext["IS_SUPPORT_HEART_BEAT_V2"], v1.ext["IS_SUB_CHANGE"]) == ("true", "true")
    full = door.call(client, codes.HEART_BEAT, heartbeat_v2("c1", 77, without_sub=False))
    # The group's fingerprint was the v1 heartbeat's 0: changed.
    assert full.ext["IS_SUB_CHANGE"] == "true"
    again = door.call(client, codes.HEART_BEAT, heartbeat_v2("c1", 77, without_sub=False))
    assert again.ext["IS_SUB_CHANGE"] == "false"
    short = door.call(client, codes.HEART_BEAT, heartbeat_v2("c1", 77, without_sub=True))
    assert short.ext["IS_SUB_CHANGE"] == "false"
    sub = door.deps.clients.subscription(GROUP, TOPIC)
    assert sub is not None and sub.expression == "TagA", "the short heartbeat dropped it"
    changed = door.call(client, codes.HEART_BEAT, heartbeat_v2("c1", 78, without_sub=True))
    assert changed.ext["IS_SUB_CHANGE"] == "true"


def test_a_short_heartbeat_from_a_client_the_broker_does_not_know_asks_for_the_full_one(door):
    client = door.connect()
    short = door.call(client, codes.HEART_BEAT, heartbeat_v2("c9", 5, without_sub=True))
    assert short.code == codes.SUCCESS
    assert short.ext["IS_SUB_CHANGE"] == "true"


def test_assign_for_pop_shares_the_next_consumers_queues():
    queues = [("b", i) for i in range(8)]
    cids = ["c1", "c2", "c3", "c4"]
    pop1 = RequestMode("t", "g", "POP", 1)
    assert assignment.assign(queues, cids, "c1", "AVG", "CLUSTERING", pop1) == queues[:4]
    assert assignment.assign(queues, cids, "c4", "AVG", "CLUSTERING", pop1) == [
        *queues[6:], *queues[:2]
    ]  # fmt: skip
    more_consumers = [f"c{i}" for i in range(10)]
    assert assignment.assign(queues, more_consumers, "c9", "AVG", "CLUSTERING", pop1) == [queues[1]]
    circle = RequestMode("t", "g")
    assert assignment.assign(queues, cids[:3], "c2", "AVG_BY_CIRCLE", "CLUSTERING", circle) == [
        queues[1], queues[4], queues[7]
    ]  # fmt: skip
    assert assignment.assign(queues, [], "c1", "AVG", "BROADCASTING", circle) == queues
