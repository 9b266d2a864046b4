"""The broker's consumer side over RocketMQ's protocol, against a real
in-process broker's own RocketMQ-protocol port and ferry's RemotingClient:
heartbeats and member lists, NOTIFY_CONSUMER_IDS_CHANGED, long-polling pulls,
tag filters, the commit-offset flag, OFFSET_MOVED, queue locks and send-back
to %RETRY% / %DLQ%. Messages are sent through ferry.v1."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from ferry import record
from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command
from ferry.remoting.server import RemotingServer
from ferry.runtime.clock import FakeClock
from ferry.v1 import broker_pb2
from services.broker.remoting.deps import Deps
from tests.conftest import LoopThread, RunningBroker, start_broker
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "Orders"
GROUP = "cg"


@dataclass
class Door:
    """A broker, its own RocketMQ-protocol door (`app.remoting`) with the
    tables its handlers use (`app.remoting_deps`), and clients to it."""

    broker: RunningBroker
    loop: LoopThread
    server: RemotingServer
    deps: Deps
    addr: str
    clients: list[RemotingClient] = dataclasses.field(default_factory=list)

    def connect(self) -> RemotingClient:
        client = self.loop.run(RemotingClient.connect(self.addr))
        self.clients.append(client)
        return client

    def call(self, client: RemotingClient, code: int, body: Any = b"", **ext: Any) -> Command:
        return self.loop.run(client.request(command(code, body, **ext), timeout=30))

    def start_call(self, client: RemotingClient, code: int, body: Any = b"", **ext: Any):
        """A request whose answer the test waits for later (a long poll)."""
        return asyncio.run_coroutine_threadsafe(
            client.request(command(code, body, **ext), timeout=30), self.loop.loop
        )

    def send(self, body: bytes, tags: str = "", queue_id: int = 0, topic: str = TOPIC) -> int:
        """Send through ferry.v1; the message's queue offset."""
        r = self.broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(topic=topic, queue_id=queue_id, body=body, tags=tags),
            timeout=10,
        )
        assert r.status == broker_pb2.SEND_OK
        return r.queue_offset


def command(code: int, body: Any = b"", **ext: Any) -> Command:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return Command(code, ext={k: str(v) for k, v in ext.items()}, body=body, language="JAVA")


def door_of(broker: RunningBroker) -> Door:
    """The broker app's own RocketMQ-protocol door (listenPort)."""
    app = broker.app
    assert app.remoting is not None and app.remoting_deps is not None, "no RocketMQ door"
    return Door(broker, broker.loop, app.remoting, app.remoting_deps, broker.remoting_addr)


def close_clients(door: Door) -> None:
    """Close the test's clients; the door is the broker's and stops with it."""
    for client in door.clients:
        door.loop.call(client.close)


def start_test_broker(loop_thread: LoopThread, root, name: str = "broker-r", clock: Any = None):
    b = start_broker(loop_thread, root, clock=clock, brokerName=name, messageDelayLevel="1s 1s 1s")
    support.create_topic(b.channel, TOPIC, 2)
    return b


@pytest.fixture
def broker(loop_thread, tmp_path):
    b = start_test_broker(loop_thread, tmp_path / "store")
    yield b
    b.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timed_broker(loop_thread, tmp_path, clock):
    """A broker whose clock (client and lock expiry) the test moves."""
    b = start_test_broker(loop_thread, tmp_path / "store", clock=clock)
    yield b
    b.stop()


@pytest.fixture
def door(broker):
    d = door_of(broker)
    yield d
    close_clients(d)


def heartbeat(
    client_id: str, *topics: tuple[str, str], group: str = GROUP, push: bool = True
) -> dict:
    return {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY" if push else "CONSUME_ACTIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {"topic": t, "subString": e, "expressionType": "TAG", "subVersion": 1}
                    for t, e in topics
                ],
            }
        ],
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
    }


def pull(door: Door, client: RemotingClient, offset: int, queue_id: int = 0, **ext: Any):
    fields = {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subVersion": 0, **ext,
    }  # fmt: skip
    return door.call(client, codes.PULL_MESSAGE, **fields)


def records(body: bytes) -> list[record.Record]:
    out, pos = [], 0
    while pos < len(body):
        r = record.decode(body, pos)
        assert isinstance(r, record.Record)
        out.append(r)
        pos += record.peek(body[pos : pos + 8])
    return out


def notices(client: RemotingClient) -> list[str]:
    return [
        c.ext.get("consumerGroup", "")
        for c in client.received
        if c.code == codes.NOTIFY_CONSUMER_IDS_CHANGED
    ]


# ---------------------------------------------------------------- membership


def test_heartbeat_then_member_list_and_a_joiner_is_announced_to_the_first_member(door):
    first, second = door.connect(), door.connect()
    answer = door.call(first, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
    assert answer.code == codes.SYSTEM_ERROR and GROUP in answer.remark
    assert door.call(first, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "*"))).code == 0
    answer = door.call(first, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
    assert answer.code == 0
    assert json.loads(answer.body) == {"consumerIdList": ["c1"]}
    # A push consumer is not told of its own arrival (it rebalances at the end of its
    # start); a notice would come before the answer, on the same connection.
    assert door.loop.call(notices, first) == []

    assert door.call(second, codes.HEART_BEAT, heartbeat("c2", (TOPIC, "*"))).code == 0
    assert door.loop.call(notices, second) == []
    wait_for(lambda: door.loop.call(notices, first) == [GROUP], what="40 for the joiner")
    answer = door.call(second, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
    assert json.loads(answer.body) == {"consumerIdList": ["c1", "c2"]}
    # The same heartbeat again changes nothing: nobody is told.
    assert door.call(second, codes.HEART_BEAT, heartbeat("c2", (TOPIC, "*"))).code == 0
    # The retry topic of the group exists from its first heartbeat on.
    assert door.deps.metadata.topics.get(f"%RETRY%{GROUP}") is not None

    door.loop.call(second.close)
    wait_for(lambda: door.loop.call(notices, first) == [GROUP] * 2, what="40 for the leaver")
    answer = door.call(first, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
    assert json.loads(answer.body) == {"consumerIdList": ["c1"]}

    unregister = door.call(first, codes.UNREGISTER_CLIENT, clientID="c1", consumerGroup=GROUP)
    assert unregister.code == 0
    answer = door.call(first, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
    assert answer.code == codes.SYSTEM_ERROR


def test_a_pull_consumer_is_told_of_its_own_arrival_and_a_push_consumer_of_a_changed_subscription(
    door,
):
    """A lite pull consumer does not rebalance at its start: the notice of its own
    arrival is what starts it, as on Apache. A push consumer that changes its
    subscription (subscribe() after start) is told too."""
    puller, pusher = door.connect(), door.connect()
    joined = door.call(puller, codes.HEART_BEAT, heartbeat("p1", (TOPIC, "*"), push=False))
    assert joined.code == 0
    assert door.loop.call(notices, puller) == [GROUP]
    assert door.call(pusher, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "*"))).code == 0
    assert door.loop.call(notices, pusher) == []
    wait_for(lambda: door.loop.call(notices, puller) == [GROUP] * 2, what="40 for the joiner")
    changed = door.call(pusher, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "TagA")))
    assert changed.code == 0
    assert door.loop.call(notices, pusher) == [GROUP]


def test_two_brokers_answer_the_member_list_alike(broker, loop_thread, tmp_path):
    other = start_broker(loop_thread, tmp_path / "store-b", brokerName="broker-s")
    doors = [door_of(broker), door_of(other)]
    try:
        for client_id in ("c2", "c1", "c3"):
            for d in doors:
                assert d.call(d.connect(), codes.HEART_BEAT, heartbeat(client_id)).code == 0
        lists = [
            d.call(d.clients[0], codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP).body
            for d in doors
        ]
        assert lists[0] == lists[1] == b'{"consumerIdList":["c1","c2","c3"]}'
    finally:
        for d in doors:
            close_clients(d)
        other.stop()


def test_a_client_silent_for_120_s_expires_and_the_group_is_told(timed_broker, clock):
    door = door_of(timed_broker)
    try:
        quiet, chatty = door.connect(), door.connect()
        door.call(quiet, codes.HEART_BEAT, heartbeat("quiet"))
        door.call(chatty, codes.HEART_BEAT, heartbeat("chatty"))
        clock.advance(100)
        door.call(chatty, codes.HEART_BEAT, heartbeat("chatty"))
        before = len(door.loop.call(notices, chatty))
        clock.advance(21)
        answer = door.call(chatty, codes.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=GROUP)
        assert json.loads(answer.body) == {"consumerIdList": ["chatty"]}
        wait_for(lambda: len(door.loop.call(notices, chatty)) == before + 1, what="40")
        # As RocketMQ does, the broker closes the silent client's channel.
        wait_for(lambda: quiet.closed.is_set(), what="the silent client's channel closed")
    finally:
        close_clients(door)


def test_check_client_config_takes_tags_and_refuses_sql92_when_filters_are_off(door):
    client = door.connect()
    tag = {"clientId": "c1", "group": GROUP, "subscriptionData": {"topic": TOPIC,
           "subString": "A", "expressionType": "TAG"}}  # fmt: skip
    assert door.call(client, codes.CHECK_CLIENT_CONFIG, tag).code == 0
    sql = {**tag, "subscriptionData": {"topic": TOPIC, "subString": "a > 1",
                                       "expressionType": "SQL92"}}  # fmt: skip
    answer = door.call(client, codes.CHECK_CLIENT_CONFIG, sql)
    # The door's broker runs with enablePropertyFilter at its default (off):
    # Apache's words, then what to do.
    assert answer.code == codes.SYSTEM_ERROR
    assert "does not support consumer to filter message by SQL92" in answer.remark
    assert "enablePropertyFilter=true" in answer.remark


def test_check_client_config_compiles_sql92_when_filters_are_on(loop_thread, tmp_path):
    b = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-sql", enablePropertyFilter="true"
    )
    d = door_of(b)
    try:
        client = d.connect()
        sub = {"topic": TOPIC, "subString": "a > 1", "expressionType": "SQL92"}
        body = {"clientId": "c1", "group": GROUP, "subscriptionData": sub}
        assert d.call(client, codes.CHECK_CLIENT_CONFIG, body).code == 0
        bad = {**body, "subscriptionData": {**sub, "subString": "a >"}}
        answer = d.call(client, codes.CHECK_CLIENT_CONFIG, bad)
        assert answer.code == codes.SUBSCRIPTION_PARSE_FAILED
        assert answer.remark.startswith("the SQL92 selector does not compile")
    finally:
        close_clients(d)
        b.stop()


# ---------------------------------------------------------------- pulls


def test_found_answers_carry_the_stored_bytes_as_stored(door):
    offsets = [door.send(f"m{i}".encode(), tags="A") for i in range(3)]
    client = door.connect()
    answer = pull(door, client, 0, sysFlag=0x4, subscription="*")
    assert answer.code == codes.SUCCESS and answer.remark == "FOUND"
    assert answer.ext["nextBeginOffset"] == "3"
    assert (answer.ext["minOffset"], answer.ext["maxOffset"]) == ("0", "3")
    assert answer.ext["suggestWhichBrokerId"] == "0"
    got = records(answer.body)
    assert [r.body for r in got] == [b"m0", b"m1", b"m2"]
    assert [r.queue_offset for r in got] == offsets
    stored = [door.loop.run(door.broker.app.store.record_bytes(r.commit_offset)) for r in got]
    assert answer.body == b"".join(stored)


def test_a_pull_returns_at_most_32_messages(door):
    for i in range(40):
        door.send(f"m{i}".encode())
    answer = pull(door, door.connect(), 0, sysFlag=0x4, subscription="*", maxMsgNums=100)
    assert answer.code == 0
    assert len(records(answer.body)) == 32
    assert answer.ext["nextBeginOffset"] == "32"


def test_a_pull_before_any_heartbeat_without_its_subscription_is_refused(door):
    door.send(b"m")
    answer = pull(door, door.connect(), 0)
    assert answer.code == codes.SUBSCRIPTION_NOT_EXIST
    assert "HEART_BEAT" in answer.remark
    assert answer.ext["nextBeginOffset"] == "0"


def test_tag_filters_from_the_request_and_from_the_heartbeat(door):
    for tags in ("A", "B", "A", "C"):
        door.send(tags.encode(), tags=tags)
    client = door.connect()
    answer = pull(door, client, 0, sysFlag=0x4, subscription="A || C")
    assert [r.body for r in records(answer.body)] == [b"A", b"A", b"C"]
    assert answer.ext["nextBeginOffset"] == "4"

    door.call(client, codes.HEART_BEAT, heartbeat("c1", (TOPIC, "B")))
    answer = pull(door, client, 0)
    assert [r.body for r in records(answer.body)] == [b"B"]
    # Entries read and none matching: try again at once from further on.
    answer = pull(door, client, 2)
    assert answer.code == codes.PULL_RETRY_IMMEDIATELY
    assert answer.ext["nextBeginOffset"] == "4"

    sql = pull(door, client, 0, sysFlag=0x4, subscription="a > 1", expressionType="SQL92")
    assert sql.code == codes.SYSTEM_ERROR and "SQL92" in sql.remark


def suspended_pull(door, queue_offset: int):
    """A pull of queue 1 from `queue_offset` that suspends for up to 20 s, once it is
    waiting in the store's long polls; its answer, pending."""
    client = door.connect()
    pending = door.start_call(
        client, codes.PULL_MESSAGE, consumerGroup=GROUP, topic=TOPIC, queueId=1,
        queueOffset=queue_offset, maxMsgNums=32, sysFlag=0x2 | 0x4, commitOffset=0,
        suspendTimeoutMillis=20_000, subscription="*", subVersion=0,
    )  # fmt: skip
    polls = door.broker.app.store.long_polls
    wait_for(lambda: door.loop.call(lambda: polls.waiting_on(TOPIC, 1)), what="the pull to wait")
    return pending


def test_a_suspended_pull_returns_when_a_message_arrives(door):
    pending = suspended_pull(door, 0)
    door.send(b"late", queue_id=1)
    answer = pending.result(10)  # the arrival answers it, well before its 20 s
    assert answer.code == 0
    assert [r.body for r in records(answer.body)] == [b"late"]


def test_a_suspended_pull_keeps_the_consumers_offset_when_the_broker_stops(door):
    # The broker stops while its RocketMQ door keeps the connection (as a failover member's
    # listener does across roles): closing the store wakes every long poll, and the answer
    # must not move the consumer. A Java or Go consumer takes OFFSET_MOVED's
    # nextBeginOffset as its new offset and commits it: with 0, the next master would hand
    # the whole queue out again.
    for body in (b"one", b"two"):
        door.send(body, queue_id=1)
    pending = suspended_pull(door, 2)
    door.broker.stop()
    # A broker of its own closes its RocketMQ door when it stops (after its grace), so the
    # client may see the connection close instead of an answer; an answer that does come
    # must not move the consumer. (A failover member's listener outlives its runs: there
    # the answer always comes, see test_failover_remoting.py; the store's refusal to read
    # once closed is tests/unit/test_store.py's.)
    try:
        answer = pending.result(30)
    except ConnectionError:
        return
    assert answer.code == codes.SERVICE_NOT_AVAILABLE, (answer.code, answer.remark)
    assert "stopping" in answer.remark
    assert answer.ext["nextBeginOffset"] == "2"


def test_a_suspended_pull_answers_not_found_after_its_timeout(door):
    client = door.connect()
    started = time.monotonic()
    answer = pull(door, client, 0, sysFlag=0x2 | 0x4, subscription="*", suspendTimeoutMillis=300)
    assert time.monotonic() - started >= 0.3
    assert answer.code == codes.PULL_NOT_FOUND
    assert answer.ext["nextBeginOffset"] == "0"
    assert answer.body == b""


def test_the_commit_offset_flag_stores_the_offset_in_the_groups_table(door):
    for i in range(3):
        door.send(f"m{i}".encode())
    client = door.connect()
    answer = pull(door, client, 2, sysFlag=0x1 | 0x4, subscription="*", commitOffset=2)
    assert answer.code == 0
    got = door.broker.broker.QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=0),
        timeout=10,
    )
    assert got.offset == 2
    # Without the flag nothing is stored.
    pull(door, client, 3, sysFlag=0x4, subscription="*", commitOffset=3)
    assert door.deps.metadata.consumer_offsets.query(GROUP, TOPIC, 0) == 2


def test_an_offset_beyond_the_queue_is_moved_back_to_its_end(door):
    for i in range(3):
        door.send(f"m{i}".encode())
    answer = pull(door, door.connect(), 100, sysFlag=0x4, subscription="*")
    assert answer.code == codes.PULL_OFFSET_MOVED
    assert answer.ext == {
        "suggestWhichBrokerId": "0", "nextBeginOffset": "3", "minOffset": "0", "maxOffset": "3",
    }  # fmt: skip


def test_pull_errors_still_carry_the_offsets_java_decodes(door):
    answer = pull(door, door.connect(), 5, sysFlag=0x4, subscription="*", topic="Nope")
    assert answer.code == codes.TOPIC_NOT_EXIST
    assert answer.ext["nextBeginOffset"] == "5"
    assert {"suggestWhichBrokerId", "minOffset", "maxOffset"} <= answer.ext.keys()
    bad = door.call(door.connect(), codes.PULL_MESSAGE, consumerGroup=GROUP, topic=TOPIC)
    assert bad.code == codes.SYSTEM_ERROR and "queueId" in bad.remark
    assert "nextBeginOffset" in bad.ext


# ---------------------------------------------------------------- locks


def lock_body(client_id: str, *queue_ids: int) -> dict:
    return {
        "consumerGroup": GROUP,
        "clientId": client_id,
        "mqSet": [{"brokerName": "broker-r", "queueId": q, "topic": TOPIC} for q in queue_ids],
    }


def locked(answer: Command) -> list[int]:
    assert answer.code == 0
    return sorted(q["queueId"] for q in json.loads(answer.body)["lockOKMQSet"])


def test_queue_locks_are_exclusive_and_freed_when_the_owner_leaves(door):
    one, two = door.connect(), door.connect()
    assert locked(door.call(one, codes.LOCK_BATCH_MQ, lock_body("c1", 0, 1))) == [0, 1]
    assert locked(door.call(two, codes.LOCK_BATCH_MQ, lock_body("c2", 1, 2))) == [2]
    assert door.call(one, codes.UNLOCK_BATCH_MQ, lock_body("c1", 0)).code == 0
    assert locked(door.call(two, codes.LOCK_BATCH_MQ, lock_body("c2", 0, 1))) == [0]
    door.loop.call(one.close)
    wait_for(
        lambda: door.loop.call(door.deps.locks.owner, GROUP, _queue(1), 0.0) is None,
        what="c1's locks freed by its channel closing",
    )
    assert locked(door.call(two, codes.LOCK_BATCH_MQ, lock_body("c2", 0, 1, 2))) == [0, 1, 2]


def test_queue_locks_expire_after_60_s(timed_broker, clock):
    door = door_of(timed_broker)
    try:
        one, two = door.connect(), door.connect()
        assert locked(door.call(one, codes.LOCK_BATCH_MQ, lock_body("c1", 0))) == [0]
        clock.advance(60)
        assert locked(door.call(two, codes.LOCK_BATCH_MQ, lock_body("c2", 0))) == []
        clock.advance(1)
        assert locked(door.call(two, codes.LOCK_BATCH_MQ, lock_body("c2", 0))) == [0]
        assert locked(door.call(one, codes.LOCK_BATCH_MQ, lock_body("c1", 0))) == []
    finally:
        close_clients(door)


def _queue(queue_id: int):
    from services.broker.messaging.locks import QueueKey

    return QueueKey(TOPIC, "broker-r", queue_id)


# ---------------------------------------------------------------- send-back


def pull_all(door: Door, client: RemotingClient, topic: str, want: int) -> list[record.Record]:
    """Long-poll queue 0 of `topic` until `want` records came."""
    got: list[record.Record] = []

    def pulled() -> bool:
        answer = pull(
            door, client, len(got), topic=topic, sysFlag=0x2 | 0x4, subscription="*",
            suspendTimeoutMillis=2000,
        )  # fmt: skip
        assert answer.code in (0, codes.PULL_NOT_FOUND), answer.remark
        got.extend(records(answer.body))
        return len(got) >= want

    wait_for(pulled, 15, lambda: f"{want} records in {topic} ({len(got)} so far)", interval_s=0)
    assert len(got) == want, f"{len(got)} of {want} records in {topic}"
    return got


def test_send_back_goes_to_the_retry_topic_then_to_the_dlq(door):
    door.send(b"fails", tags="A")
    client = door.connect()
    [original] = records(pull(door, client, 0, sysFlag=0x4, subscription="*").body)

    answer = door.call(
        client, codes.CONSUMER_SEND_MSG_BACK, offset=original.commit_offset, group=GROUP,
        delayLevel=0, originMsgId="X", originTopic=TOPIC, maxReconsumeTimes=1,
    )  # fmt: skip
    assert answer.code == 0, answer.remark
    [retry] = pull_all(door, client, f"%RETRY%{GROUP}", 1)
    assert retry.body == b"fails"
    assert retry.reconsume_times == 1
    assert retry.properties["RETRY_TOPIC"] == TOPIC
    origin_id = record.message_id(original.store_host, original.commit_offset)
    assert retry.properties["ORIGIN_MESSAGE_ID"] == origin_id
    assert retry.properties["TAGS"] == "A"
    # Kept on the re-published copy, as Apache 4.9 keeps them: level 3 + reconsume times 0.
    assert (retry.properties["DELAY"], retry.properties["REAL_TOPIC"]) == ("3", f"%RETRY%{GROUP}")

    # Reconsumed once already, the maximum: the next failure is a dead letter.
    answer = door.call(
        client, codes.CONSUMER_SEND_MSG_BACK, offset=retry.commit_offset, group=GROUP,
        delayLevel=0, maxReconsumeTimes=1,
    )  # fmt: skip
    assert answer.code == 0, answer.remark
    [dead] = pull_all(door, client, f"%DLQ%{GROUP}", 1)
    assert dead.body == b"fails"
    assert dead.reconsume_times == 2
    assert dead.properties["RETRY_TOPIC"] == TOPIC
    assert dead.properties["ORIGIN_MESSAGE_ID"] == origin_id
    dlq = door.deps.metadata.topics.get(f"%DLQ%{GROUP}")
    assert dlq is not None and dlq.queue_nums == 1


def test_send_back_with_a_negative_level_goes_straight_to_the_dlq(door):
    door.send(b"poison")
    client = door.connect()
    [original] = records(pull(door, client, 0, sysFlag=0x4, subscription="*").body)
    answer = door.call(
        client, codes.CONSUMER_SEND_MSG_BACK, offset=original.commit_offset, group=GROUP,
        delayLevel=-1,
    )  # fmt: skip
    assert answer.code == 0
    [dead] = pull_all(door, client, f"%DLQ%{GROUP}", 1)
    assert dead.reconsume_times == 1


def test_send_back_of_an_offset_holding_no_message_is_refused(door):
    door.send(b"m")
    answer = door.call(
        door.connect(), codes.CONSUMER_SEND_MSG_BACK, offset=3, group=GROUP, delayLevel=0
    )
    assert answer.code == codes.SYSTEM_ERROR
    assert "no message at commit offset 3" in answer.remark
