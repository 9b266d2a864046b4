"""RocketMQ 5's BATCH_ACK_MESSAGE (200151), PEEK_MESSAGE (200052), NOTIFICATION
(200054) and POLLING_INFO (200055) on the broker's RocketMQ-protocol port, against a
real in-process broker and ferry's RemotingClient, with the bodies and headers
Apache 5.5.0's client and proxy send (BatchAck's short JSON names, Java's
BitSet.toByteArray in Base64)."""

from __future__ import annotations

from ferry.remoting import codes, pop_formats
from tests.integration.test_remoting_consumers import TOPIC
from tests.integration.test_remoting_pop import (
    BROKER,
    GROUP,
    door,  # noqa: F401 (the fixture)
    in_flight,
    pop,
    records,
)
from tests.waiting import wait_for


def bitset(offsets: list[int], start: int) -> str:
    """Java's BitSet.toByteArray of (offset - start), in Base64."""
    return pop_formats.encode_bitset(o - start for o in offsets)


def batch_ack_body(answer, messages, topic: str = TOPIC, group: str = GROUP) -> dict:
    """The body MQClientAPIImpl.batchAckMessageAsync builds from a pop's POP_CKs:
    one BatchAck per (retry, queue, start offset)."""
    starts = pop_formats.decode_start_offsets(answer.ext["startOffsetInfo"])
    acks: dict[tuple[str, int], list[int]] = {}
    for m in messages:
        acks.setdefault((pop_formats.mark_of(m.topic), m.queue_id), []).append(m.queue_offset)
    entries = [
        pop_formats.BatchAck(
            group,
            topic,
            mark,
            starts[(mark, qid)],
            qid,
            int(answer.ext["reviveQid"]),
            int(answer.ext["popTime"]),
            int(answer.ext["invisibleTime"]),
            tuple(o - starts[(mark, qid)] for o in offsets),
        ).to_json()
        for (mark, qid), offsets in acks.items()
    ]
    return {"brokerName": BROKER, "acks": entries}


def test_batch_ack_acknowledges_the_offsets_its_bitset_names(door):  # noqa: F811
    for q in (0, 1):
        for i in range(4):
            door.send(f"m{q}-{i}".encode(), queue_id=q)
    client = door.connect()
    answer = pop(door, client)
    got = records(answer.body)
    assert len(got) == 8 and in_flight(door) == 8
    some = [m for m in got if m.queue_offset in (0, 2, 3)]
    ok = door.call(client, codes.BATCH_ACK_MESSAGE, batch_ack_body(answer, some))
    assert ok.code == codes.SUCCESS, ok.remark
    assert in_flight(door) == 2  # offset 1 of each queue
    # An entry naming an unknown topic, a queue out of range or offsets past the
    # queue is skipped, as Apache's is; the rest of the batch still counts.
    rest = [m for m in got if m.queue_offset == 1]
    body = batch_ack_body(answer, rest)
    body["acks"].append({**body["acks"][0], "t": "NoSuchTopic"})
    body["acks"].append({**body["acks"][0], "q": 9})
    body["acks"].append({**body["acks"][0], "b": bitset([90, 91], 0)})
    assert door.call(client, codes.BATCH_ACK_MESSAGE, body).code == codes.SUCCESS
    assert in_flight(door) == 0


def test_batch_ack_refusals(door):  # noqa: F811
    client = door.connect()
    empty = door.call(client, codes.BATCH_ACK_MESSAGE, {"brokerName": BROKER, "acks": []})
    assert empty.code == codes.NO_MESSAGE
    assert door.call(client, codes.BATCH_ACK_MESSAGE, b"").code == codes.NO_MESSAGE
    junk = door.call(client, codes.BATCH_ACK_MESSAGE, b"\xff{not json")
    assert junk.code == codes.SYSTEM_ERROR and "body" in junk.remark
    entry = {"c": GROUP, "t": TOPIC, "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 1}
    not_b64 = door.call(
        client, codes.BATCH_ACK_MESSAGE, {"acks": [{**entry, "b": "!!not base64!!"}]}
    )
    assert not_b64.code == codes.MESSAGE_ILLEGAL and "Base64" in not_b64.remark
    no_group = door.call(client, codes.BATCH_ACK_MESSAGE, {"acks": [{**entry, "c": ""}]})
    assert no_group.code == codes.MESSAGE_ILLEGAL and "acks.c" in no_group.remark


def test_peek_shows_messages_from_the_committed_offset_and_takes_nothing(door):  # noqa: F811
    for i in range(5):
        door.send(f"p{i}".encode(), queue_id=0)
    client = door.connect()
    fields = dict(consumerGroup=GROUP, topic=TOPIC, queueId=0, maxMsgNums=3)
    first = door.call(client, codes.PEEK_MESSAGE, **fields)
    assert first.code == codes.SUCCESS, first.remark
    assert [m.body for m in records(first.body)] == [b"p0", b"p1", b"p2"]
    assert first.ext["restNum"] == "2"
    again = door.call(client, codes.PEEK_MESSAGE, **fields)
    assert [m.queue_offset for m in records(again.body)] == [0, 1, 2]  # nothing moved
    assert in_flight(door) == 0
    door.call(
        client,
        codes.UPDATE_CONSUMER_OFFSET,
        consumerGroup=GROUP,
        topic=TOPIC,
        queueId=0,
        commitOffset=4,
    )
    later = door.call(client, codes.PEEK_MESSAGE, **{**fields, "queueId": -1})
    assert [m.body for m in records(later.body)] == [b"p4"]
    door.call(
        client,
        codes.UPDATE_CONSUMER_OFFSET,
        consumerGroup=GROUP,
        topic=TOPIC,
        queueId=0,
        commitOffset=5,
    )
    none = door.call(client, codes.PEEK_MESSAGE, **fields)
    assert none.code == codes.PULL_NOT_FOUND and none.remark == "NO_MESSAGE_IN_QUEUE"


def test_peek_notification_and_polling_info_refusals(door):  # noqa: F811
    client = door.connect()
    base = dict(consumerGroup=GROUP, topic="NoSuchTopic", queueId=0, maxMsgNums=1, pollTime=0)
    for code in (codes.PEEK_MESSAGE, codes.NOTIFICATION, codes.POLLING_INFO):
        unknown = door.call(client, code, **base)
        assert unknown.code == codes.TOPIC_NOT_EXIST and "NoSuchTopic" in unknown.remark
        bad_queue = door.call(client, code, **{**base, "topic": TOPIC, "queueId": 99})
        assert bad_queue.code == codes.SYSTEM_ERROR and "queueId[99] is illegal" in bad_queue.remark
        missing = door.call(client, code, topic=TOPIC)
        assert missing.code == codes.MESSAGE_ILLEGAL


def test_notification_says_whether_a_pop_would_find_a_message(door):  # noqa: F811
    client = door.connect()
    fields = dict(consumerGroup=GROUP, topic=TOPIC, queueId=-1, pollTime=0, bornTime=0)
    empty = door.call(client, codes.NOTIFICATION, **fields)
    assert empty.code == codes.SUCCESS and empty.ext["hasMsg"] == "false"
    # A long-polling notification is answered when a message arrives.
    waiting = door.start_call(client, codes.NOTIFICATION, **{**fields, "pollTime": 20_000})
    polls = door.broker.app.store.long_polls
    wait_for(lambda: polls.waiting_on(TOPIC, 1) > 0, 10, "the notification to wait")
    door.send(b"n0", queue_id=1)
    wait_for(waiting.done, 15, "the notification to be answered on arrival")
    assert waiting.result().ext["hasMsg"] == "true"
    assert door.call(client, codes.NOTIFICATION, **fields).ext["hasMsg"] == "true"
    # Popped (in flight), the message is no longer there to be found.
    answer = pop(door, client)
    assert len(records(answer.body)) == 1
    assert door.call(client, codes.NOTIFICATION, **fields).ext["hasMsg"] == "false"


def test_polling_info_counts_the_pops_waiting(door):  # noqa: F811
    client = door.connect()
    fields = dict(consumerGroup=GROUP, topic=TOPIC, queueId=-1)
    assert door.call(client, codes.POLLING_INFO, **fields).ext["pollingNum"] == "0"
    waiting = door.start_call(
        client,
        codes.POP_MESSAGE,
        consumerGroup=GROUP,
        topic=TOPIC,
        queueId=-1,
        maxMsgNums=1,
        invisibleTime=60_000,
        pollTime=20_000,
        bornTime=0,
    )
    wait_for(
        lambda: door.call(client, codes.POLLING_INFO, **fields).ext["pollingNum"] == "1",
        10,
        "POLLING_INFO to count the waiting pop",
    )
    door.send(b"w0", queue_id=0)
    wait_for(waiting.done, 15, "the pop to be answered on arrival")
    assert waiting.result().code == codes.SUCCESS
    assert door.call(client, codes.POLLING_INFO, **fields).ext["pollingNum"] == "0"


def test_a_pop_long_past_its_born_time_and_poll_time_is_refused(door):  # noqa: F811
    door.send(b"late", queue_id=0)
    client = door.connect()
    now = door.deps.clock.wall_ms()
    late = pop(door, client, pollTime=1_000, bornTime=now - 60_000)
    assert late.code == codes.POLLING_TIMEOUT and "timeout too much" in late.remark
    assert in_flight(door) == 0  # nothing was taken
    fresh = pop(door, client, pollTime=1_000, bornTime=now)
    assert fresh.code == codes.SUCCESS and len(records(fresh.body)) == 1
