"""A RocketMQ producer's first send to a topic the broker lacks creates it from
the default topic its header names (autoCreateTopicEnable, on by default, as
Apache's): min(defaultTopicQueueNums, the default topic's write queues) queues,
the default topic's permission without INHERIT; a default topic that is missing
or has no INHERIT creates nothing (TOPIC_NOT_EXIST), nor does TBW102 while the
switch is off, nor a slave. What Apache 4.9 does in the same case is checked by
tests/compat/test_default_topics.py against both servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.model import TopicConfig
from ferry.remoting import codes
from tests.conftest import LoopThread, start_broker
from tests.integration import support
from tests.integration.test_remoting_sends import Door, connect_door, pipelined, refused, v2


def door_with(loop_thread: LoopThread, store: Path, **keys) -> Door:
    return connect_door(loop_thread, start_broker(loop_thread, store, brokerName="broker-a",
                                                  **keys))  # fmt: skip


@pytest.fixture
def door(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Door]:
    d = door_with(loop_thread, tmp_path / "store")
    yield d
    d.close()
    d.broker.stop()


def topic(door: Door, name: str) -> TopicConfig | None:
    return door.loop.call(lambda: door.broker.app.metadata.topics.get(name))


def test_the_broker_keeps_apaches_default_topics(door: Door):
    assert topic(door, "TBW102") == TopicConfig("TBW102", 8, 8, perm=7)
    assert topic(door, "DefaultCluster") == TopicConfig("DefaultCluster", 16, 16, perm=7)
    assert topic(door, "broker-a") == TopicConfig("broker-a", 1, 1, perm=7)
    for name, queues in (("SELF_TEST_TOPIC", 1), ("BenchmarkTest", 1024),
                         ("OFFSET_MOVED_EVENT", 1), ("DefaultCluster_REPLY_TOPIC", 1)):  # fmt: skip
        assert topic(door, name) == TopicConfig(name, queues, queues, perm=6)
    assert topic(door, "RMQ_SYS_TRACE_TOPIC") is None  # traceTopicEnable is off


def test_a_send_to_an_unknown_topic_creates_it_from_tbw102(door: Door):
    answer = door.call(v2("Fresh", b"first", 2, d="3"))
    assert answer.code == codes.SUCCESS, answer.remark
    assert topic(door, "Fresh") == TopicConfig("Fresh", 3, 3, perm=6)
    assert [m.body for m in door.pulled("Fresh", 2, 1)] == [b"first"]
    # At most TBW102's 8 queues, whatever the producer asks for.
    assert door.call(v2("Wide", b"x", 0, d="64")).code == codes.SUCCESS
    assert topic(door, "Wide") == TopicConfig("Wide", 8, 8, perm=6)
    # The cluster's topic has INHERIT too (Apache's createTopicKey may name it).
    assert door.call(v2("ByCluster", b"x", 0, c="DefaultCluster", d="2")).code == codes.SUCCESS
    assert topic(door, "ByCluster") == TopicConfig("ByCluster", 2, 2, perm=6)


def test_no_topic_without_an_inheritable_default(door: Door):
    refused(door, v2("NoDefault", b"x", c="NoSuchDefault"), codes.TOPIC_NOT_EXIST)
    refused(door, v2("NoInherit", b"x", c="SELF_TEST_TOPIC"), codes.TOPIC_NOT_EXIST)
    refused(door, v2("NoQueues", b"x", d="0"), codes.TOPIC_NOT_EXIST)
    refused(door, v2("bad/name", b"x"), codes.MESSAGE_ILLEGAL)
    refused(door, v2("SELF_TEST_TOPIC", b"x"), codes.MESSAGE_ILLEGAL)  # a system topic
    for name in ("NoDefault", "NoInherit", "NoQueues", "bad/name"):
        assert topic(door, name) is None


def test_sends_that_arrive_together_create_the_topic_once(door: Door):
    """One run of pipelined sends to a new topic: every one stored, one topic."""
    answers = pipelined(door, [v2("Together", f"m{i}".encode(), i % 4) for i in range(8)])
    assert {a.code for a in answers.values()} == {codes.SUCCESS}
    assert topic(door, "Together") == TopicConfig("Together", 4, 4, perm=6)
    assert sorted(m.body for q in range(4) for m in door.pulled("Together", q, 2)) == [
        f"m{i}".encode() for i in range(8)
    ]


def test_off_tbw102_gives_no_topic_even_when_it_is_in_the_table(loop_thread, tmp_path):
    d = door_with(loop_thread, tmp_path / "store", autoCreateTopicEnable=False)
    try:
        assert topic(d, "TBW102") is None
        refused(d, v2("Fresh", b"x"), codes.TOPIC_NOT_EXIST)
        # An operator's TBW102 (or one left in topics.json) gives nothing while the switch is off.
        support.create_topic(d.broker.channel, "TBW102", 8, perm=7)
        refused(d, v2("Fresh", b"x"), codes.TOPIC_NOT_EXIST)
        assert topic(d, "Fresh") is None
    finally:
        d.close()
        d.broker.stop()
