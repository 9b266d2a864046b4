"""RocketMQ 5's pop codes on the broker's RocketMQ-protocol port (POP_MESSAGE 200050,
ACK_MESSAGE 200051, CHANGE_MESSAGE_INVISIBLETIME 200053), against a real in-process
broker and ferry's RemotingClient, checked as RocketMQ's 5.x client reads the answers
(MQClientAPIImpl.processPopResponse: the records in the body, the POP_CK it builds from
the header's startOffsetInfo and msgOffsetInfo, sent back as an ack's extraInfo), and
against the one pop state ferry.v1's PopMessage and GetGroupStatus share."""

from __future__ import annotations

import pytest

from ferry import record
from ferry.remoting import codes, pop_formats
from ferry.v1 import broker_pb2
from tests.integration.test_remoting_consumers import (
    TOPIC,
    Door,
    close_clients,
    door_of,
    start_test_broker,
)
from tests.waiting import wait_for

GROUP = "pop_cg"
BROKER = "broker-r"


@pytest.fixture
def door(loop_thread, tmp_path):
    broker = start_test_broker(loop_thread, tmp_path / "store", name=BROKER)
    d = door_of(broker)
    yield d
    close_clients(d)
    broker.stop()


def records(body: bytes) -> list[record.StoredMessage]:
    out, pos = [], 0
    while pos < len(body):
        size = record.peek(body[pos : pos + 64])
        assert isinstance(size, int), "the body holds records only"
        out.append(record.decode_stored(body, pos, size))
        pos += size
    return out


def pop_ck(answer, message: record.StoredMessage) -> str:
    """The POP_CK the 5.x Java client builds for `message` from a pop answer."""
    mark = pop_formats.mark_of(message.topic)
    starts = pop_formats.decode_start_offsets(answer.ext["startOffsetInfo"])
    offsets = pop_formats.decode_msg_offsets(answer.ext["msgOffsetInfo"])
    key = (mark, message.queue_id)
    assert message.queue_offset in offsets[key]
    return " ".join(
        [
            str(starts[key]),
            answer.ext["popTime"],
            answer.ext["invisibleTime"],
            answer.ext["reviveQid"],
            mark,
            BROKER,
            str(message.queue_id),
            str(message.queue_offset),
        ]
    )


def pop(door: Door, client, max_nums: int = 32, invisible_ms: int = 60_000, **more):
    fields = {
        "consumerGroup": GROUP,
        "topic": TOPIC,
        "queueId": -1,
        "maxMsgNums": max_nums,
        "invisibleTime": invisible_ms,
        "pollTime": 0,
        "bornTime": 0,
        "initMode": 0,
        **more,
    }
    return door.call(client, codes.POP_MESSAGE, **fields)


def ack(door: Door, client, message: record.StoredMessage, extra: str, group: str = GROUP):
    return door.call(
        client,
        codes.ACK_MESSAGE,
        consumerGroup=group,
        topic=message.topic,
        queueId=message.queue_id,
        extraInfo=extra,
        offset=message.queue_offset,
    )


def status(door: Door) -> broker_pb2.GetGroupStatusResponse:
    return door.broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group=GROUP, topic=TOPIC), timeout=10
    )


def in_flight(door: Door) -> int:
    return sum(q.in_flight for q in status(door).queues)


def test_pop_answers_records_and_offset_infos_the_client_acks_with(door):
    sent = {(q, door.send(f"m{q}-{i}".encode(), queue_id=q)) for q in (0, 1) for i in range(3)}
    client = door.connect()
    answer = pop(door, client)
    assert answer.code == codes.SUCCESS, answer.remark
    got = records(answer.body)
    assert {(m.queue_id, m.queue_offset) for m in got} == sent
    assert {m.body for m in got} == {f"m{q}-{i}".encode() for q in (0, 1) for i in range(3)}
    assert int(answer.ext["invisibleTime"]) == 60_000 and answer.ext["restNum"] == "0"
    assert sorted(answer.ext["startOffsetInfo"].split(";")) == ["0 0 0", "0 1 0"]
    assert sorted(answer.ext["msgOffsetInfo"].split(";")) == ["0 0 0,1,2", "0 1 0,1,2"]
    assert in_flight(door) == 6
    # Nothing more to hand out: the client's "no new message".
    empty = pop(door, client)
    assert empty.code == codes.POLLING_TIMEOUT and empty.body == b""
    for m in got:
        assert ack(door, client, m, pop_ck(answer, m)).code == codes.SUCCESS
    assert in_flight(door) == 0
    assert [q.committed_offset for q in status(door).queues] == [3, 3]


def test_one_pop_state_whichever_door(door):
    door.send(b"one", queue_id=0)
    popped = door.broker.broker.PopMessage(
        broker_pb2.PopMessageRequest(
            consumer_group=GROUP, topic=TOPIC, max_msg_nums=32, invisible_ms=60_000
        ),
        timeout=10,
    )
    assert [m.body for m in popped.messages] == [b"one"]
    client = door.connect()
    assert pop(door, client).code == codes.POLLING_TIMEOUT  # in flight already, through ferry.v1
    door.send(b"two", queue_id=1)
    answer = pop(door, client)
    assert [m.body for m in records(answer.body)] == [b"two"]
    again = door.broker.broker.PopMessage(
        broker_pb2.PopMessageRequest(
            consumer_group=GROUP, topic=TOPIC, max_msg_nums=32, invisible_ms=60_000
        ),
        timeout=10,
    )
    assert list(again.messages) == []


def test_a_stale_ack_changes_nothing_and_a_retimed_message_is_acked_by_its_new_pop_ck(door):
    door.send(b"slow", queue_id=0)
    client = door.connect()
    answer = pop(door, client)
    (m,) = records(answer.body)
    extra = pop_ck(answer, m)
    changed = door.call(
        client,
        codes.CHANGE_MESSAGE_INVISIBLETIME,
        consumerGroup=GROUP,
        topic=m.topic,
        queueId=m.queue_id,
        extraInfo=extra,
        offset=m.queue_offset,
        invisibleTime=120_000,
    )
    assert changed.code == codes.SUCCESS, changed.remark
    assert changed.ext["invisibleTime"] == "120000"
    # The old POP_CK names the pop before the re-timing: answered 0, as Apache does, and
    # the message stays in flight.
    assert ack(door, client, m, extra).code == codes.SUCCESS
    assert in_flight(door) == 1
    parts = extra.split(" ")
    parts[1], parts[2] = changed.ext["popTime"], changed.ext["invisibleTime"]
    assert ack(door, client, m, " ".join(parts)).code == codes.SUCCESS
    assert in_flight(door) == 0


def test_a_redelivery_comes_from_the_retry_topic_and_is_acked_there(door):
    door.send(b"again", queue_id=0)
    client = door.connect()
    first = pop(door, client, invisible_ms=1_000)
    (m,) = records(first.body)
    # Not acknowledged: after its deadline and the 1 s backoff it comes back, copied
    # to the group's retry topic.
    box = {}

    def redelivered() -> bool:
        answer = pop(door, client)
        if answer.code == codes.SUCCESS:
            box["answer"] = answer
        return "answer" in box

    wait_for(redelivered, 30, "the message redelivered from the retry topic")
    answer = box["answer"]
    (r,) = records(answer.body)
    assert r.topic == f"%RETRY%{GROUP}_{TOPIC}" and r.body == b"again"
    assert answer.ext["startOffsetInfo"] == f"1 0 {r.queue_offset}"
    assert r.reconsume_times == 1
    assert ack(door, client, r, pop_ck(answer, r)).code == codes.SUCCESS
    assert status(door).retries_pending == 0


def test_bad_pops_and_acks_get_apaches_codes(door):
    client = door.connect()
    door.send(b"x", queue_id=0)
    too_many = pop(door, client, max_nums=33)
    assert too_many.code == codes.INVALID_PARAMETER and "greater than 32" in too_many.remark
    assert pop(door, client, topic="NoSuchTopic").code == codes.TOPIC_NOT_EXIST
    missing = door.call(client, codes.POP_MESSAGE, consumerGroup=GROUP, topic=TOPIC)
    assert missing.code == codes.MESSAGE_ILLEGAL and "queueId" in missing.remark
    answer = pop(door, client)
    (m,) = records(answer.body)
    extra = pop_ck(answer, m)
    fields = dict(consumerGroup=GROUP, topic=TOPIC, queueId=0, extraInfo=extra, offset=0)
    assert door.call(client, codes.ACK_MESSAGE, **{**fields, "offset": 99}).code == codes.NO_MESSAGE
    assert (
        door.call(client, codes.ACK_MESSAGE, **{**fields, "queueId": 7}).code
        == codes.MESSAGE_ILLEGAL
    )
    assert (
        door.call(client, codes.ACK_MESSAGE, **{**fields, "topic": "NoSuchTopic"}).code
        == codes.TOPIC_NOT_EXIST
    )
    bad = door.call(client, codes.ACK_MESSAGE, **{**fields, "extraInfo": "0 x y"})
    assert bad.code == codes.MESSAGE_ILLEGAL and "popTime" in bad.remark
    assert in_flight(door) == 1  # none of these touched it
    assert door.call(client, codes.ACK_MESSAGE, **fields).code == codes.SUCCESS
    assert in_flight(door) == 0
