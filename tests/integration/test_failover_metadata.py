"""Topics and groups survive a role change (issue 25): a topic and a group
created on the elected master, acknowledged messages in the topic, then the
master frozen (SIGSTOP past its lease) long before any slave sync could copy
them — the followers here sync every 10 minutes. The member elected next has
the topic, the group and every acknowledged message, the name server keeps
routing the topic, the frozen master rejoins without dropping them; a topic
deleted by an operator stays deleted through the next failover."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
)
from tests.conftest import LoopThread
from tests.failover.config import PATIENCE_S
from tests.failover.group import FailoverGroup
from tests.integration.support import PortRange, create_topic, pull_all, scrape
from tests.waiting import wait_equal, wait_for

PORTS = PortRange(31500, 32000)
NEW_TOPIC = "CreatedJustBefore"
NEW_GROUP = "created-just-before"
QUEUES = 2


@pytest.fixture
def group(tmp_path: Path, etcd, loop_thread: LoopThread) -> Iterator[FailoverGroup]:
    g = FailoverGroup(tmp_path / "group", etcd.endpoint, PORTS, loop_thread, size=2,
                      slaveSyncInterval=600_000, metricsPort=0)  # fmt: skip
    try:
        yield g.start()
    finally:
        g.stop_all()


def _admin(group: FailoverGroup, addr: str) -> broker_admin_pb2_grpc.BrokerAdminStub:
    return broker_admin_pb2_grpc.BrokerAdminStub(group.channel(addr))


def _send(group: FailoverGroup, addr: str, n: int) -> dict[tuple[int, int], bytes]:
    """`n` sends to NEW_TOPIC, every one SEND_OK: body by (queue, queue offset)."""
    stub = broker_pb2_grpc.BrokerStub(group.channel(addr))
    acked = {}
    for i in range(n):
        body = b"acked-%04d" % i
        r = stub.SendMessage(broker_pb2.SendMessageRequest(topic=NEW_TOPIC, body=body), timeout=10)
        assert broker_pb2.SendStatus.Name(r.status) == "SEND_OK", r
        acked[(r.queue_id, r.queue_offset)] = body
    return acked


def _applied(m) -> dict[str, float]:
    """`m`'s ferry_metadata_log_applied_records by queue, from its /metrics."""
    text = scrape(f"http://127.0.0.1:{m.server.metrics_port}/metrics")
    found = re.findall(r'^ferry_metadata_log_applied_records\{[^}]*queue="(\w+)"[^}]*\} (\S+)$',
                       text, re.MULTILINE)  # fmt: skip
    return {queue: float(value) for queue, value in found}


def _has(group: FailoverGroup, m, topic: str | None = None, grp: str | None = None) -> bool:
    tables = group.tables(m)
    if tables is None:
        return False
    topics, groups = tables
    return (topic is None or topic in topics) and (grp is None or grp in groups)


def test_a_topic_created_just_before_the_master_freezes_survives(group: FailoverGroup) -> None:
    old = group.wait_leader()
    follower = next(m for m in group.members if m is not old)
    create_topic(group.channel(old.addr), NEW_TOPIC, QUEUES)
    _admin(group, old.addr).UpdateAndCreateSubscriptionGroup(
        broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
            config=common_pb2.SubscriptionGroupConfig(group_name=NEW_GROUP)
        ),
        timeout=10,
    )
    # Acknowledged means the in-sync follower's log has both; it applies them
    # as they arrive (its slave sync is 10 minutes away).
    wait_for(
        lambda: _has(group, follower, NEW_TOPIC, NEW_GROUP), PATIENCE_S, "the follower's tables"
    )
    acked = _send(group, old.addr, 40)

    group.pause(old)
    new = group.wait_leader(exclude=[old.id], timeout_s=PATIENCE_S)
    assert _has(group, new, NEW_TOPIC, NEW_GROUP), group.tables(new)
    group.wait_routed(new)
    wait_for(lambda: group.routed(NEW_TOPIC), PATIENCE_S, f"the name server to route {NEW_TOPIC}")
    got = pull_all(group.channel(new.addr), NEW_TOPIC, QUEUES)
    assert {k: got.get(k) for k in acked} == acked

    group.resume(old)
    group.wait_isr([old.id, new.id], timeout_s=PATIENCE_S)
    assert _has(group, old, NEW_TOPIC, NEW_GROUP), group.tables(old)
    assert group.routed(NEW_TOPIC)
    # Both members' tables include the same records (Failover, NEW_TOPIC; NEW_GROUP).
    wait_equal(lambda: [_applied(m) for m in (old, new)], [{"topics": 2, "groups": 1}] * 2, PATIENCE_S,
               "the members' ferry_metadata_log_applied_records")  # fmt: skip

    # An operator's delete reaches the follower and survives the next failover.
    _admin(group, new.addr).DeleteTopic(
        broker_admin_pb2.DeleteTopicRequest(topic=NEW_TOPIC), timeout=10
    )
    assert not _has(group, old, NEW_TOPIC), group.tables(old)
    group.kill(new)
    again = group.wait_leader(exclude=[new.id], timeout_s=PATIENCE_S)
    assert again is old
    group.wait_routed(old)
    assert not _has(group, old, NEW_TOPIC), group.tables(old)
    assert _has(group, old, grp=NEW_GROUP), group.tables(old)
    wait_for(lambda: not group.routed(NEW_TOPIC), PATIENCE_S, f"{NEW_TOPIC} to leave the route")
    with pytest.raises(grpc.RpcError) as err:
        broker_pb2_grpc.BrokerStub(group.channel(old.addr)).SendMessage(
            broker_pb2.SendMessageRequest(topic=NEW_TOPIC, body=b"x"), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value


def test_a_topic_created_by_its_first_send_goes_through_the_metadata_log(
    group: FailoverGroup,
) -> None:
    """autoCreateTopicEnable with failover on: a RocketMQ producer's first send to a new
    topic (defaultTopic TBW102) creates it on the elected master through the metadata
    log, so the in-sync follower has it at once (its slave sync is 10 minutes away) and
    keeps it, with the message, when it is elected next."""
    from ferry.remoting import codes as rcodes
    from ferry.remoting.client import call
    from tests.integration.test_remoting_sends import v2

    leader = group.wait_leader()
    follower = next(m for m in group.members if m is not leader)
    answer = call(leader.remoting_addr, v2("AutoCreated", b"first", 1, d="2"), 10)
    assert answer.code == rcodes.SUCCESS, answer.remark
    wait_for(lambda: _has(group, follower, "AutoCreated"), PATIENCE_S, "the follower's topic table")
    group.pause(leader)
    new = group.wait_leader(exclude=[leader.id], timeout_s=PATIENCE_S)
    assert new is follower
    got = pull_all(group.channel(new.addr), "AutoCreated", 2)
    assert list(got.values()) == [b"first"]
    group.resume(leader)
