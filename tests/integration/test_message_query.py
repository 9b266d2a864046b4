"""Finding messages on a real broker: RocketMQ's QUERY_MESSAGE (12) by key and by
unique key over the broker's RocketMQ-protocol port, the index as Apache's clients
read it (records back to back, indexLastUpdate* fields, 22 on a miss)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry import record
from ferry.remoting import codes
from ferry.remoting.codec import Command
from tests.conftest import LoopThread, start_broker
from tests.integration import support
from tests.integration.test_remoting_sends import TOPIC, Door, connect_door, props, v2
from tests.waiting import wait_for

UNIQ = "7F0000010B8C18B4AAC2{:012X}"


@pytest.fixture
def door(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Door]:
    broker = start_broker(loop_thread, tmp_path / "store", brokerName="broker-q")
    support.create_topic(broker.channel, TOPIC, 4)
    d = connect_door(loop_thread, broker)
    yield d
    d.close()
    broker.stop()


def query(d: Door, key: str, unique: bool = False, max_num: int = 32, **overrides) -> Command:
    ext = {
        "topic": TOPIC,
        "key": key,
        "maxNum": str(max_num),
        "beginTimestamp": "0",
        "endTimestamp": str(2**63 - 1),
    }
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    ext.update(overrides)
    return d.call(Command(codes.QUERY_MESSAGE, ext=ext))


def records(body: bytes) -> list[record.StoredMessage]:
    out, pos = [], 0
    while pos < len(body):
        size = record.peek(body[pos : pos + record.BLANK_SIZE])
        assert isinstance(size, int)
        out.append(record.decode_stored(body, pos, size))
        pos += size
    return out


def test_query_message_by_key_and_unique_key(door: Door):
    sent = []
    for i in range(5):
        answer = door.call(
            v2(
                TOPIC,
                b"order %d" % i,
                i % 4,
                props(KEYS=f"order-{i} customer-7", UNIQ_KEY=UNIQ.format(i)),
            )
        )
        assert answer.code == codes.SUCCESS
        sent.append(answer.ext["msgId"])
    found = wait_for(
        lambda: (
            (a := query(door, "customer-7")).code == codes.SUCCESS
            and len(records(a.body)) == 5
            and a
        ),
        what="5 messages indexed under customer-7",
    )
    got = records(found.body)
    assert [m.body for m in got] == [b"order %d" % i for i in range(5)]
    assert [m.msg_id for m in got] == sent
    assert int(found.ext["indexLastUpdatePhyoffset"]) == got[-1].commit_offset
    assert int(found.ext["indexLastUpdateTimestamp"]) == got[-1].store_timestamp
    assert [m.body for m in records(query(door, "customer-7", max_num=2).body)] == [
        b"order 3",
        b"order 4",
    ]
    one = query(door, "order-3")
    assert one.code == codes.SUCCESS and [m.body for m in records(one.body)] == [b"order 3"]
    # By unique key: maxNum is the broker's 32 whatever the client asks.
    unique = query(door, UNIQ.format(2), unique=True, max_num=0)
    assert [m.body for m in records(unique.body)] == [b"order 2"]
    assert query(door, UNIQ.format(2)).code == codes.QUERY_NOT_FOUND  # not one of the KEYS


def test_query_message_misses_and_bad_headers(door: Door):
    assert door.call(v2(TOPIC, b"x", 0, props(KEYS="k1"))).code == codes.SUCCESS
    wait_for(lambda: query(door, "k1").code == codes.SUCCESS, what="k1 indexed")
    miss = query(door, "nope")
    assert miss.code == codes.QUERY_NOT_FOUND
    assert miss.remark == "can not find message, maybe time range not correct"
    assert int(miss.ext["indexLastUpdatePhyoffset"]) >= 0 and "indexLastUpdateTimestamp" in miss.ext
    assert query(door, "k1", endTimestamp="1000").code == codes.QUERY_NOT_FOUND
    assert query(door, "k1", topic="Other").code == codes.QUERY_NOT_FOUND
    assert query(door, "k1", max_num=0).code == codes.QUERY_NOT_FOUND
    bad = query(door, "k1", maxNum="many")
    assert bad.code == codes.SYSTEM_ERROR and "maxNum" in (bad.remark or "")
