"""A real broker's RocketMQ-protocol sends, offsets and lookups (codes 10,
310, 320, 14, 15, 29-33), driven by ferry's RemotingClient and read back
through ferry.v1: one message and one offset table whichever door was used.
Each test connects to the broker app's own RocketMQ-protocol port
(listenPort, `remoting_addr`) and reads its request counters from the app's
metrics registry.
"""

from __future__ import annotations

import errno
import os
import socket
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ferry import record
from ferry.model import SCHEDULE_TOPIC
from ferry.remoting import batch, codec, codes
from ferry.remoting.client import RemotingClient, recv_command
from ferry.remoting.codec import ROCKETMQ, Command
from ferry.remoting.server import RemotingServer
from ferry.runtime.clock import FakeClock
from ferry.v1 import broker_admin_pb2, broker_pb2
from services.broker.remoting.deps import Deps
from services.broker.store import commitlog as commitlog_module
from tests.conftest import LoopThread, RunningBroker, start_broker
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "Orders"
PROPS = "\x01".join  # one name/value pair of a property string


@dataclass
class Door:
    """A broker, its own RocketMQ-protocol door (`app.remoting` on listenPort)
    with the tables its handlers use (`app.remoting_deps`), and a connected
    client."""

    broker: RunningBroker
    deps: Deps
    server: RemotingServer
    client: RemotingClient
    loop: LoopThread
    registry: CollectorRegistry

    def requests(self, request_code: int, response_code: int = codes.SUCCESS) -> float:
        """How many requests of a code the door answered with `response_code`."""
        labels = {"server": "broker", "request_code": str(request_code)}
        labels["response_code"] = str(response_code)
        value = self.registry.get_sample_value("ferry_remoting_requests_total", labels)
        return value or 0.0

    def call(self, command: Command) -> Command:
        return self.loop.run(self.client.request(command, timeout=10))

    def oneway(self, command: Command) -> None:
        self.loop.call(self.client.oneway, command)

    def pull(self, topic: str, queue_id: int, offset: int = 0, group: str = "g"):
        return self.broker.broker.PullMessage(
            broker_pb2.PullMessageRequest(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                max_msg_nums=32,
            ),
            timeout=10,
        )

    def pulled(self, topic: str, queue_id: int, count: int):
        """The first `count` messages of a queue, once they are visible."""
        return wait_for(
            lambda: (
                (r := self.pull(topic, queue_id)).status == broker_pb2.FOUND
                and len(r.messages) >= count
                and list(r.messages)
            ),
            what=f"{count} messages in {topic}/{queue_id}",
        )

    @property
    def local_addr(self) -> tuple[str, int]:
        return self.client._transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]

    def max_offset(self) -> int:
        return self.loop.call(lambda: self.broker.app.store.max_offset)

    def close(self) -> None:
        """Close the client; the door is the broker's and stops with it."""
        self.loop.call(self.client.close)


def connect_door(loop: LoopThread, broker: RunningBroker) -> Door:
    """A client connected to the broker app's own RocketMQ-protocol port."""
    app = broker.app
    assert app.remoting is not None and app.remoting_deps is not None, "no RocketMQ door"
    client = loop.run(RemotingClient.connect(broker.remoting_addr))
    return Door(broker, app.remoting_deps, app.remoting, client, loop, app.registry)


@pytest.fixture
def door(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Door]:
    # No TBW102: a send to a topic this broker lacks is refused, not a new topic
    # (test_remoting_autocreate.py has the broker's default).
    broker = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-a", autoCreateTopicEnable=False
    )
    support.create_topic(broker.channel, TOPIC, 4)
    d = connect_door(loop_thread, broker)
    yield d
    d.close()
    if broker.app.gate.open:
        broker.stop()


def v2(topic: str, body: bytes, queue_id: int = 0, properties: str = "", **fields) -> Command:
    ext = {
        "a": "pg",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": "1700000000123",
        "h": "0",
        "i": properties,
        "j": "0",
        "k": "false",
        "m": "false",
    }
    ext.update(fields)
    return Command(codes.SEND_MESSAGE_V2, ext=ext, body=body)


def props(**pairs: str) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in pairs.items())


# ---------------------------------------------------------------- sends


def test_send_v2_is_the_message_ferry_v1_reads(door: Door):
    properties = props(
        KEYS="order-1 order-2", TAGS="TagA", UNIQ_KEY="7F0000010001" + "AB" * 10, WAIT="true", p="1"
    )
    answer = door.call(v2(TOPIC, b"hello", 2, properties, f="0", h="7", j="0"))
    assert answer.code == codes.SUCCESS, answer.remark
    assert answer.is_response and answer.remark is None
    assert answer.ext["queueId"] == "2" and answer.ext["queueOffset"] == "0"
    assert (answer.ext["MSG_REGION"], answer.ext["TRACE_ON"]) == ("DefaultRegion", "true")
    msg_id = answer.ext["msgId"]
    host, port = door.broker.app.store.store_host
    assert (host, port) == ("127.0.0.1", door.broker.app.remoting_port)  # the door's own port
    assert msg_id[:16] == record.message_id((host, port), 0)[:16]

    (message,) = door.pulled(TOPIC, 2, 1)
    assert message.msg_id == msg_id
    assert msg_id == record.message_id((host, port), message.commit_offset)
    assert message.body == b"hello"
    assert (message.tags, message.keys) == ("TagA", "order-1 order-2")
    # ferry.v1 hands TAGS and KEYS out as fields; WAIT is the broker's, not the message's;
    # CLUSTER is the broker's stamp, as Apache's.
    assert dict(message.properties) == {
        "UNIQ_KEY": "7F0000010001" + "AB" * 10,
        "p": "1",
        "CLUSTER": "DefaultCluster",
    }
    assert message.flag == 7
    assert message.born_timestamp == 1700000000123
    assert message.born_host == "{}:{}".format(*door.local_addr)
    assert message.store_host == f"{host}:{port}"


def test_send_v1_long_names_keeps_compression_flags_and_reconsume_times(door: Door):
    text = b"compressible " * 800
    ext = {
        "producerGroup": "pg",
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "1",
        "sysFlag": "1",  # compressed (zlib), as the Java client marks bodies over 4 KiB
        "bornTimestamp": "1700000000999",
        "flag": "0",
        "properties": props(TAGS="Z"),
        "reconsumeTimes": "2",
        "unitMode": "false",
    }
    answer = door.call(Command(codes.SEND_MESSAGE, ext=ext, body=zlib.compress(text)))
    assert answer.code == codes.SUCCESS, answer.remark
    assert answer.ext["queueId"] == "1"

    (message,) = door.pulled(TOPIC, 1, 1)
    assert message.body == text  # ferry.v1 hands out the inflated body
    assert message.reconsume_times == 2 and message.tags == "Z"

    # VIEW_MESSAGE_BY_ID: the record as stored (compressed, sysFlag kept).
    view = door.call(Command(codes.VIEW_MESSAGE_BY_ID, ext={"offset": str(message.commit_offset)}))
    assert view.code == codes.SUCCESS, view.remark
    stored = record.decode(view.body, 0)
    assert isinstance(stored, record.Record) and len(view.body) == message.store_size
    assert stored.sys_flag == 1 and zlib.decompress(stored.body) == text
    assert stored.commit_offset == message.commit_offset and stored.topic == TOPIC
    assert stored.reconsume_times == 2


def test_send_in_the_binary_header_form_is_answered_in_it(door: Door):
    request = v2(TOPIC, b"bin", 0)
    request.serialize_type = ROCKETMQ
    answer = door.call(request)
    assert answer.code == codes.SUCCESS, answer.remark
    assert answer.serialize_type == ROCKETMQ


def test_batch_send(door: Door):
    entries = [
        batch.BatchEntry(
            i,
            b"item-%d" % i,
            props(KEYS=f"k{i}", TAGS="B", UNIQ_KEY=f"{i:032X}", WAIT="true").encode(),
        )
        for i in range(3)
    ]
    request = v2(TOPIC, batch.encode(entries), 3, props(WAIT="true"), m="true")
    request.code = codes.SEND_BATCH_MESSAGE
    answer = door.call(request)
    assert answer.code == codes.SUCCESS, answer.remark
    ids = answer.ext["msgId"].split(",")
    assert len(ids) == 3 and answer.ext["queueOffset"] == "0" and answer.ext["queueId"] == "3"

    messages = door.pulled(TOPIC, 3, 3)
    assert [m.msg_id for m in messages] == ids
    assert [m.body for m in messages] == [b"item-0", b"item-1", b"item-2"]
    assert [m.flag for m in messages] == [0, 1, 2]
    assert [(m.keys, m.tags, dict(m.properties)) for m in messages] == [
        (f"k{i}", "B", {"UNIQ_KEY": f"{i:032X}", "CLUSTER": "DefaultCluster"}) for i in range(3)
    ]
    assert [m.queue_offset for m in messages] == [0, 1, 2]


def test_many_sends_in_flight_on_one_connection(door: Door):
    async def burst() -> list[Command]:
        import asyncio

        return await asyncio.gather(
            *(door.client.request(v2(TOPIC, b"m%d" % i, 0)) for i in range(50))
        )

    answers = door.loop.run(burst())
    assert all(a.code == codes.SUCCESS for a in answers)
    assert sorted(int(a.ext["queueOffset"]) for a in answers) == list(range(50))


def pipelined(door: Door, requests: list[Command]) -> dict[int, Command]:
    """`requests` written back to back on a new connection to the door (one read
    on the broker: one run), numbered 1.. as their opaques; the answers by opaque."""
    for opaque, request in enumerate(requests, 1):
        request.opaque = opaque
    host, port = door.client._transport.get_extra_info("peername")[:2]  # type: ignore[union-attr]
    answers: dict[int, Command] = {}
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"".join(codec.encode(r) for r in requests))
        buffer = bytearray()
        while len(answers) < len(requests):
            answer = recv_command(sock, buffer)
            answers[answer.opaque] = answer
    return answers


def test_a_run_of_sends_in_one_read_is_answered_each_as_alone(door: Door):
    """Sends written back to back (one read on the broker: one run) are appended in
    their order, a retry-topic send in the middle taking its own place; a refused one
    is answered as alone and the others go on; WAIT=false and WAIT=true both SEND_OK."""
    requests = [
        v2(TOPIC, b"r0", 0),
        v2(TOPIC, b"r1", 1),
        v2("NoSuchTopic", b"x", 0),
        v2(TOPIC, b"bad", 0, e="not-a-number"),
        v2("%RETRY%cg", b"again", 0, props(DELAY="4"), j="1", l="3"),
        v2(TOPIC, b"r3", 0, props(WAIT="false")),
        v2(TOPIC, b"r4", 0),
    ]
    answers = pipelined(door, requests)
    codes_by_request = [answers[i].code for i in range(1, len(requests) + 1)]
    assert codes_by_request == [codes.SUCCESS, codes.SUCCESS, codes.TOPIC_NOT_EXIST,
                                codes.MESSAGE_ILLEGAL, codes.SUCCESS, codes.SUCCESS,
                                codes.SUCCESS]  # fmt: skip
    assert [answers[i].ext["queueOffset"] for i in (1, 6, 7)] == ["0", "1", "2"]
    assert (answers[2].ext["queueId"], answers[2].ext["queueOffset"]) == ("1", "0")
    assert all(a.ext["MSG_REGION"] == "DefaultRegion" for a in answers.values())
    messages = door.pulled(TOPIC, 0, 3)
    assert [m.body for m in messages] == [b"r0", b"r3", b"r4"]
    assert [m.msg_id for m in messages] == [answers[i].ext["msgId"] for i in (1, 6, 7)]
    assert door.requests(codes.SEND_MESSAGE_V2) == 5


def test_delay_level_waits_in_the_schedule_topic(door: Door):
    answer = door.call(v2(TOPIC, b"later", 1, props(DELAY="3")))
    assert answer.code == codes.SUCCESS, answer.remark
    assert answer.ext["queueId"] == "1"  # the producer's queue, as Apache answers it
    store = door.broker.app.store
    wait_for(
        lambda: door.loop.call(lambda: store.queue_max_offset(SCHEDULE_TOPIC, 2)) == 1,
        what="the message in delay level 3's queue",
    )
    assert door.pull(TOPIC, 1).status != broker_pb2.FOUND


def test_retry_sends_go_to_the_dlq_past_max_reconsume_times(door: Door):
    retry, dlq = "%RETRY%cg", "%DLQ%cg"
    early = door.call(v2(retry, b"again", 0, props(DELAY="4"), j="1", l="3"))
    assert early.code == codes.SUCCESS, early.remark
    store = door.broker.app.store
    wait_for(
        lambda: door.loop.call(lambda: store.queue_max_offset(SCHEDULE_TOPIC, 3)) == 1,
        what="the retry waiting in delay level 4",
    )
    assert door.broker.app.metadata.topics.get(retry) is not None  # created on first use

    dead = door.call(v2(retry, b"dead", 0, props(DELAY="5", ORIGIN_MESSAGE_ID="X"), j="3", l="3"))
    assert dead.code == codes.SUCCESS, dead.remark
    (message,) = door.pulled(dlq, 0, 1)
    assert message.body == b"dead" and message.reconsume_times == 3
    # no DELAY in the DLQ
    assert dict(message.properties) == {"ORIGIN_MESSAGE_ID": "X", "CLUSTER": "DefaultCluster"}
    assert dead.ext["msgId"] == message.msg_id


# ---------------------------------------------------------------- refusals


def refused(door: Door, request: Command, code: int) -> Command:
    before = door.max_offset()
    answer = door.call(request)
    assert answer.code == code, (answer.code, answer.remark)
    assert answer.remark
    assert (answer.ext["MSG_REGION"], answer.ext["TRACE_ON"]) == ("DefaultRegion", "true")
    assert door.max_offset() == before, "a refused send stored something"
    return answer


def test_refused_sends_store_nothing(door: Door):
    refused(door, v2("NoSuchTopic", b"x"), codes.TOPIC_NOT_EXIST)
    missing = v2(TOPIC, b"x")
    del missing.ext["e"]
    assert "queueId" in refused(door, missing, codes.MESSAGE_ILLEGAL).remark
    refused(door, v2(TOPIC, b"x", g="soon"), codes.MESSAGE_ILLEGAL)
    refused(door, v2(TOPIC, b"x", 9), codes.MESSAGE_ILLEGAL)  # 4 queues
    refused(door, v2(TOPIC, b""), codes.MESSAGE_ILLEGAL)
    refused(door, v2(TOPIC, b"x", properties="no-separator"), codes.MESSAGE_ILLEGAL)
    refused(door, v2(TOPIC, b"x" * (64 * 1024 + 1)), codes.MESSAGE_ILLEGAL)
    half_in_batch = batch.encode([batch.BatchEntry(0, b"a", props(TRAN_MSG="true").encode())])
    request = v2(TOPIC, half_in_batch, m="true")
    request.code = codes.SEND_BATCH_MESSAGE
    refused(door, request, codes.NO_PERMISSION)  # a transactional batch
    refused(door, v2("rmq_sys_wheel_timer", b"x"), codes.MESSAGE_ILLEGAL)

    good = batch.encode([batch.BatchEntry(0, b"a", b""), batch.BatchEntry(0, b"b", b"")])
    for bad in (b"", good[:-1], good + b"\x00", b"\x7f" + good[1:]):
        request = v2(TOPIC, bad, m="true")
        request.code = codes.SEND_BATCH_MESSAGE
        refused(door, request, codes.MESSAGE_ILLEGAL)
    delayed = batch.encode([batch.BatchEntry(0, b"a", props(DELAY="2").encode())])
    request = v2(TOPIC, delayed, m="true")
    request.code = codes.SEND_BATCH_MESSAGE
    refused(door, request, codes.MESSAGE_ILLEGAL)


def test_read_only_broker_answers_no_permission(door: Door):
    door.broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=4), timeout=10
    )
    refused(door, v2(TOPIC, b"x"), codes.NO_PERMISSION)


def test_full_disk_answers_service_not_available(door: Door):
    retention = door.broker.app.store.retention

    def fill() -> None:
        retention.disk_ratio = lambda: 0.999
        retention.used_ratio()

    door.loop.call(fill)
    answer = refused(door, v2(TOPIC, b"x"), codes.SERVICE_NOT_AVAILABLE)
    assert "disk" in answer.remark


def test_fail_stop_answers_service_not_available_then_the_door_closes(
    loop_thread: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The send whose write fails (EIO) trips fail-stop: it is answered 1 and
    stores nothing, and the broker stops, its RocketMQ door with it. The grace
    lets the answer being written go out before the door closes."""
    broker = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-f", shutdownGraceSeconds=5
    )
    support.create_topic(broker.channel, TOPIC, 4)
    door = connect_door(loop_thread, broker)
    try:
        assert door.call(v2(TOPIC, b"before", 0)).code == codes.SUCCESS
        real = commitlog_module.pwrite_all

        def pwrite_all(fd: int, data: bytes, offset: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(commitlog_module, "pwrite_all", pwrite_all)
        answer = refused(door, v2(TOPIC, b"x"), codes.SERVICE_NOT_AVAILABLE)
        assert "storage failure" in answer.remark, answer.remark
        monkeypatch.setattr(commitlog_module, "pwrite_all", real)
        assert broker.app.store.failstop.tripped
        wait_for(broker.app.failed.is_set, what="the broker to fail-stop")
        wait_for(door.client.closed.is_set, what="the door to close the client's connection")
        with pytest.raises(OSError):
            loop_thread.run(RemotingClient.connect(broker.remoting_addr))
    finally:
        door.close()
        broker.stop()


# ---------------------------------------------------------------- offsets


def offsets_request(code: int, **ext: object) -> Command:
    return Command(code, ext={k: str(v) for k, v in ext.items()})


def test_consumer_offsets_are_one_table(door: Door):
    query = offsets_request(codes.QUERY_CONSUMER_OFFSET, consumerGroup="cg", topic=TOPIC, queueId=1)
    first = door.call(query)
    assert (first.code, first.ext["offset"]) == (codes.SUCCESS, "0")  # a young queue: from 0

    door.oneway(
        offsets_request(
            codes.UPDATE_CONSUMER_OFFSET, consumerGroup="cg", topic=TOPIC, queueId=1, commitOffset=5
        )
    )
    wait_for(
        lambda: door.broker.app.metadata.consumer_offsets.query("cg", TOPIC, 1) == 5,
        what="the oneway commit",
    )
    answer = door.call(
        offsets_request(codes.QUERY_CONSUMER_OFFSET, consumerGroup="cg", topic=TOPIC, queueId=1)
    )
    assert (answer.code, answer.ext["offset"]) == (codes.SUCCESS, "5")
    got = door.broker.broker.QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=1)
    )
    assert got.offset == 5

    door.broker.broker.UpdateConsumerOffset(
        broker_pb2.UpdateConsumerOffsetRequest(
            consumer_group="cg", topic=TOPIC, queue_id=1, offset=7
        )
    )
    assert door.call(query).ext["offset"] == "7"

    synced = door.call(
        offsets_request(
            codes.UPDATE_CONSUMER_OFFSET, consumerGroup="cg", topic=TOPIC, queueId=1, commitOffset=8
        )
    )
    assert synced.code == codes.SUCCESS and door.call(query).ext["offset"] == "8"

    for bad, code in (
        ({"consumerGroup": "cg", "topic": TOPIC, "queueId": 4}, codes.MESSAGE_ILLEGAL),
        ({"consumerGroup": "cg", "topic": "Nope", "queueId": 0}, codes.TOPIC_NOT_EXIST),
        ({"topic": TOPIC, "queueId": 0}, codes.MESSAGE_ILLEGAL),
    ):
        assert door.call(offsets_request(codes.QUERY_CONSUMER_OFFSET, **bad)).code == code
    negative = offsets_request(
        codes.UPDATE_CONSUMER_OFFSET, consumerGroup="cg", topic=TOPIC, queueId=1, commitOffset=-1
    )
    assert door.call(negative).code == codes.MESSAGE_ILLEGAL
    assert door.call(query).ext["offset"] == "8"


def test_min_max_offsets_and_unknown_queues(door: Door):
    for i in range(3):
        assert door.call(v2(TOPIC, b"x%d" % i, 0)).code == codes.SUCCESS
    door.pulled(TOPIC, 0, 3)
    high = door.call(offsets_request(codes.GET_MAX_OFFSET, topic=TOPIC, queueId=0))
    low = door.call(offsets_request(codes.GET_MIN_OFFSET, topic=TOPIC, queueId=0))
    assert (high.code, high.ext["offset"], low.code, low.ext["offset"]) == (0, "3", 0, "0")
    empty = door.call(offsets_request(codes.GET_EARLIEST_MSG_STORETIME, topic=TOPIC, queueId=3))
    assert (empty.code, empty.ext["timestamp"]) == (codes.SUCCESS, "-1")
    nothing = door.call(offsets_request(codes.GET_MAX_OFFSET, topic="Nope", queueId=0))
    assert nothing.code == codes.TOPIC_NOT_EXIST
    assert door.call(offsets_request(codes.GET_MIN_OFFSET, topic=TOPIC)).code == (
        codes.MESSAGE_ILLEGAL
    )


def test_view_by_id_refuses_offsets_where_no_record_starts(door: Door):
    answer = door.call(v2(TOPIC, b"only", 0))
    (message,) = door.pulled(TOPIC, 0, 1)
    for offset in (message.commit_offset + 1, message.commit_offset + 10**9):
        view = door.call(Command(codes.VIEW_MESSAGE_BY_ID, ext={"offset": str(offset)}))
        assert view.code == codes.SYSTEM_ERROR and not view.body, offset
    bad = door.call(Command(codes.VIEW_MESSAGE_BY_ID, ext={"offset": "-1"}))
    assert bad.code == codes.MESSAGE_ILLEGAL
    assert answer.code == codes.SUCCESS


@pytest.fixture
def timed_door(loop_thread: LoopThread, tmp_path: Path) -> Iterator[tuple[Door, FakeClock]]:
    clock = FakeClock()
    broker = start_broker(loop_thread, tmp_path / "store", clock=clock, brokerName="broker-t")
    support.create_topic(broker.channel, TOPIC, 1)
    d = connect_door(loop_thread, broker)
    yield d, clock
    d.close()
    broker.stop()


def test_search_by_timestamp_and_earliest_store_time(timed_door):
    door, clock = timed_door
    start = clock.wall_ms()
    for i in range(5):  # stored at start, +1000, +2000, +3000, +4000 (two at +2000)
        assert door.call(v2(TOPIC, b"t%d" % i, 0)).code == codes.SUCCESS
        if i != 2:
            clock.advance(1.0)
    assert door.call(v2(TOPIC, b"t5", 0)).code == codes.SUCCESS
    door.pulled(TOPIC, 0, 6)
    times = [m.store_timestamp - start for m in door.pulled(TOPIC, 0, 6)]
    assert times == [0, 1000, 2000, 2000, 3000, 4000]

    def search(ts: int, boundary: str | None = None) -> int:
        ext = {"topic": TOPIC, "queueId": 0, "timestamp": start + ts}
        if boundary:
            ext["boundaryType"] = boundary
        answer = door.call(offsets_request(codes.SEARCH_OFFSET_BY_TIMESTAMP, **ext))
        assert answer.code == codes.SUCCESS, answer.remark
        return int(answer.ext["offset"])

    assert [search(t) for t in (-5, 0, 500, 2000, 2001, 4000, 9000)] == [0, 0, 1, 2, 4, 5, 6]
    assert [search(t, "UPPER") for t in (-5, 0, 500, 2000, 3999, 9000)] == [0, 0, 0, 3, 4, 5]
    bad = door.call(
        offsets_request(
            codes.SEARCH_OFFSET_BY_TIMESTAMP,
            topic=TOPIC,
            queueId=0,
            timestamp=start,
            boundaryType="middle",
        )
    )
    assert bad.code == codes.MESSAGE_ILLEGAL
    earliest = door.call(offsets_request(codes.GET_EARLIEST_MSG_STORETIME, topic=TOPIC, queueId=0))
    assert (earliest.code, earliest.ext["timestamp"]) == (codes.SUCCESS, str(start))


def test_a_sync_master_without_a_slave_answers_slave_not_available(loop_thread, tmp_path):
    broker = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-s", brokerRole="SYNC_MASTER"
    )
    support.create_topic(broker.channel, TOPIC, 1)
    door = connect_door(loop_thread, broker)
    try:
        before = door.max_offset()
        answer = door.call(v2(TOPIC, b"unreplicated", 0))
        assert answer.code == codes.SLAVE_NOT_AVAILABLE, answer.remark
        # Stored all the same: the answer carries where, as a SEND_OK's does.
        assert answer.ext["queueOffset"] == "0" and len(answer.ext["msgId"]) == 32
        assert door.max_offset() > before
        assert door.requests(codes.SEND_MESSAGE_V2, codes.SLAVE_NOT_AVAILABLE) == 1
    finally:
        door.close()
        broker.stop()
