"""A real broker's statistics over RocketMQ's protocol (GET_BROKER_RUNTIME_INFO 28,
GET_TOPIC_STATS_INFO 202, GET_CONSUME_STATS 208, INVOKE_BROKER_TO_RESET_OFFSET 222)
and ferry.v1's GetBrokerRuntimeInfo: the bodies mqadmin parses, with the figures of
the store they describe, the same on both doors.

The broker runs on a fake clock, so store times and the uptime are exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.remoting import codes
from ferry.remoting.bodies import loads, loads_object_keyed
from ferry.remoting.codec import Command
from ferry.runtime.clock import FakeClock
from ferry.v1 import broker_admin_pb2
from tests.conftest import LoopThread, start_broker
from tests.integration import support
from tests.integration.test_remoting_sends import Door, connect_door, offsets_request, v2

TOPIC = "Stats"
GROUP = "cg"
BROKER = "broker-s"


@pytest.fixture
def timed(loop_thread: LoopThread, tmp_path: Path) -> Iterator[tuple[Door, FakeClock, int]]:
    """A broker with 3 messages in queue 0 of TOPIC (4 queues), stored 1 s apart,
    and GROUP's committed offset 2 there; the store time of the first."""
    clock = FakeClock()
    broker = start_broker(loop_thread, tmp_path / "store", clock=clock, brokerName=BROKER)
    support.create_topic(broker.channel, TOPIC, 4)
    door = connect_door(loop_thread, broker)
    start = clock.wall_ms()
    for i in range(3):
        assert door.call(v2(TOPIC, b"s%d" % i, 0)).code == codes.SUCCESS
        clock.advance(1.0)
    door.pulled(TOPIC, 0, 3)
    commit = offsets_request(
        codes.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, topic=TOPIC, queueId=0, commitOffset=2
    )
    assert door.call(commit).code == codes.SUCCESS
    yield door, clock, start
    door.close()
    broker.stop()


def offset_table(answer: Command) -> tuple[str, list]:
    assert answer.code == codes.SUCCESS, answer.remark
    text = bytes(answer.body).decode()
    pairs, _ = loads_object_keyed(text, text.index("{", text.index('"offsetTable":')))
    return text, pairs


def heartbeat(door: Door, *topics: str) -> None:
    """The door's client joins GROUP as a consumer of `topics`."""
    subscriptions = [
        {"topic": t, "subString": "*", "expressionType": "TAG", "subVersion": 1} for t in topics
    ]
    body = {
        "clientID": "c1",
        "consumerDataSet": [
            {"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": subscriptions}
        ],
        "producerDataSet": [],
    }  # fmt: skip
    answer = door.call(Command(codes.HEART_BEAT, body=json.dumps(body).encode()))
    assert answer.code == codes.SUCCESS, answer.remark


def key(queue_id: int) -> dict:
    return {"brokerName": BROKER, "queueId": queue_id, "topic": TOPIC}


def test_topic_stats_are_each_queues_offsets_and_last_store_time(timed):
    door, _, start = timed
    text, pairs = offset_table(door.call(Command(codes.GET_TOPIC_STATS_INFO, ext={"topic": TOPIC})))
    assert text.startswith('{"offsetTable":{{"brokerName":')
    assert pairs == [
        (key(0), {"lastUpdateTimestamp": start + 2000, "maxOffset": 3, "minOffset": 0}),
        *[(key(q), {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}) for q in (1, 2, 3)],
    ]
    unknown = door.call(Command(codes.GET_TOPIC_STATS_INFO, ext={"topic": "Nope"}))
    assert (unknown.code, unknown.remark) == (codes.TOPIC_NOT_EXIST, "topic[Nope] not exist")


def test_consume_stats_are_the_groups_offsets_beside_the_brokers(timed):
    door, _, start = timed
    expected = [
        (key(0), {"brokerOffset": 3, "consumerOffset": 2, "lastTimestamp": start + 1000}),
        *[
            (key(q), {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0})
            for q in (1, 2, 3)
        ],
    ]
    for ext in ({"consumerGroup": GROUP, "topic": TOPIC}, {"consumerGroup": GROUP}):
        text, pairs = offset_table(door.call(Command(codes.GET_CONSUME_STATS, ext=ext)))
        assert text.startswith('{"consumeTps":0.0,"offsetTable":'), text
        assert pairs == expected, ext
    none = door.call(Command(codes.GET_CONSUME_STATS, ext={"consumerGroup": "other"}))
    assert offset_table(none) == ('{"consumeTps":0.0,"offsetTable":{}}', [])
    # Online, and reading another topic only: not this one's figures.
    heartbeat(door, f"%RETRY%{GROUP}")
    for ext in ({"consumerGroup": GROUP, "topic": TOPIC}, {"consumerGroup": GROUP}):
        assert offset_table(door.call(Command(codes.GET_CONSUME_STATS, ext=ext)))[1] == []
    heartbeat(door, TOPIC)
    assert offset_table(door.call(Command(codes.GET_CONSUME_STATS, ext=ext)))[1] == expected


def test_runtime_info_is_the_stores_figures_on_both_doors(timed):
    door, clock, start = timed
    answer = door.call(Command(codes.GET_BROKER_RUNTIME_INFO))
    assert answer.code == codes.SUCCESS, answer.remark
    table = loads(bytes(answer.body))["table"]
    assert list(table) == sorted(table)
    info = door.broker.admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest())
    assert table["brokerRole"] == info.broker_role == "ASYNC_MASTER"
    assert table["bootTimestamp"] == str(info.start_timestamp)
    assert table["runtime"] == "[ 0 days, 0 hours, 0 minutes, 3 seconds ]"
    assert table["msgPutTotalTodayNow"] == table["putMessageTimesTotal"] == "3"
    assert table["putMessageTotal"] == info.table["putMessageTotal"] == "3"
    assert table["commitLogMinOffset"] == str(info.commit_log_min_offset) == "0"
    assert table["commitLogMaxOffset"] == str(info.commit_log_max_offset)
    assert table["confirmOffset"] == str(info.confirm_offset) == table["commitLogMaxOffset"]
    assert table["dispatchBehindBytes"] == str(info.dispatch_behind_bytes) == "0"
    assert table["earliestMessageTimeStamp"] == str(start)
    assert re.fullmatch(r"\d+(\.\d+)? [KMGTPE]?i?B", table["remainHowManyDataToFlush"])
    rated = ("putTps", "getTransferedTps", "getFoundTps", "getMissTps", "getTotalTps")
    for rates in (table[k] for k in rated):
        assert re.fullmatch(r"\d+\.\d{4} \d+\.\d{4} \d+\.\d{4}", rates), rates
    assert re.fullmatch(r"\d\.\d\d", table["commitLogDiskRatio"])
    assert table["consumeQueueDiskRatio"] == table["commitLogDiskRatio"]
    assert re.fullmatch(r"Total : .+B, Free : .+B\.", table["commitLogDirCapacity"])
    assert table["brokerVersion"] == "409" and table["brokerVersionDesc"].startswith("ferry-")
    assert {k: v for k, v in info.table.items()} == {k: table[k] for k in info.table}
    assert info.topic_count >= 2 and info.broker_name == BROKER


def test_reset_offset_targets_are_the_first_messages_at_or_after_the_time(timed):
    door, _, start = timed

    def reset(timestamp: int, force: bool = True, topic: str = TOPIC) -> Command:
        ext = {"topic": topic, "group": GROUP, "timestamp": str(timestamp),
               "isForce": str(force).lower()}  # fmt: skip
        return door.call(Command(codes.INVOKE_BROKER_TO_RESET_OFFSET, ext=ext))

    missing = reset(start + 1000)
    assert (missing.code, missing.remark) == (
        codes.SYSTEM_ERROR,
        f"THe consumer group <{GROUP}> not exist",
    )
    for queue_id in (1, 2, 3):
        commit = offsets_request(codes.UPDATE_CONSUMER_OFFSET, consumerGroup=GROUP, topic=TOPIC,
                                 queueId=queue_id, commitOffset=0)  # fmt: skip
        assert door.call(commit).code == codes.SUCCESS
    assert reset(start + 1000).code == codes.CONSUMER_NOT_ONLINE
    heartbeat(door, TOPIC)
    rest = [(key(q), 0) for q in (1, 2, 3)]
    for timestamp, force, first in (
        (start + 1000, True, 1),
        (start + 1, True, 1),
        (-1, True, 3),
        (-1, False, 2),
        (start - 5, False, 0),
        (start + 9000, True, 3),
    ):
        _, pairs = offset_table(reset(timestamp, force))
        assert pairs == [(key(0), first), *rest], (timestamp - start, force)
    unknown = reset(start, topic="Nope")
    assert unknown.code == codes.SYSTEM_ERROR and "no topic in this broker" in unknown.remark
