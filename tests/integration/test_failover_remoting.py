"""A failover member's RocketMQ-protocol door across its role changes (real etcd, members as
`python -m services.broker` processes, tests/failover/group.py).

The member keeps its listener and its clients' connections from one run to the next, so it
keeps what those connections told it too: the consumers' heartbeats (group members and
their subscriptions). A consumer connected to a slave that is elected master is a member of
its group there at once — not only after its next heartbeat, which a Java client sends
every 30 s — and its pulls need no new heartbeat; a connection that closes later still
leaves its groups.
"""

from __future__ import annotations

import json

import pytest

from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command
from tests.failover.config import TOPIC
from tests.failover.group import FailoverGroup
from tests.integration.support import FreePorts
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

GROUP = "door-cg"


def heartbeat(client_id: str) -> Command:
    body = {
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "subscriptionDataSet": [
                {"topic": TOPIC, "subString": "*", "expressionType": "TAG", "subVersion": 1}
            ],
        }],
        "producerDataSet": [],
    }  # fmt: skip
    return Command(codes.HEART_BEAT, body=json.dumps(body).encode(), language="JAVA")


def members_request() -> Command:
    return Command(codes.GET_CONSUMER_LIST_BY_GROUP, ext={"consumerGroup": GROUP})


def pull_request() -> Command:
    """A push consumer's pull: no subscription in it (the heartbeat's counts)."""
    ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "queueOffset": "0",
           "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
           "suspendTimeoutMillis": "0", "subVersion": "1"}  # fmt: skip
    return Command(codes.PULL_MESSAGE, ext=ext, language="JAVA")


@pytest.fixture
def group(tmp_path, etcd, loop_thread):
    g = FailoverGroup(tmp_path / "group", etcd.endpoint, FreePorts(), loop_thread, size=2)
    try:
        yield g.start()
    finally:
        g.stop_all()


def test_a_slave_elected_master_keeps_its_connections_consumers(group, loop_thread):
    leader = group.leader()
    assert leader is not None
    follower = next(m for m in group.members if m is not leader)

    def call(client: RemotingClient, request: Command) -> Command:
        return loop_thread.run(client.request(request, timeout=10))

    def members(client: RemotingClient) -> Command:
        return call(client, members_request())

    staying = loop_thread.run(RemotingClient.connect(follower.remoting_addr))
    leaving = loop_thread.run(RemotingClient.connect(follower.remoting_addr))
    try:
        for client, client_id in ((staying, "c-staying"), (leaving, "c-leaving")):
            assert call(client, heartbeat(client_id)).code == codes.SUCCESS
        listed = json.loads(members(staying).body)["consumerIdList"]
        assert sorted(listed) == ["c-leaving", "c-staying"]

        group.kill(leader)
        assert group.wait_leader(exclude=[leader.id]) is follower
        # Until its run as master serves (between two runs every answer is 14).
        answer = wait_for(
            lambda: (a := members(staying)).code != codes.SERVICE_NOT_AVAILABLE and a,
            20,
            "the new master to answer",
        )
        assert answer.code == codes.SUCCESS, answer.remark
        assert sorted(json.loads(answer.body)["consumerIdList"]) == ["c-leaving", "c-staying"]
        pulled = call(staying, pull_request())
        assert pulled.code in (codes.SUCCESS, codes.PULL_NOT_FOUND), pulled.remark

        loop_thread.call(leaving.close)
        wait_for(
            lambda: json.loads(members(staying).body)["consumerIdList"] == ["c-staying"],
            10,
            "the closed connection's consumer to leave its group",
        )
    finally:
        loop_thread.call(staying.close)
        loop_thread.call(leaving.close)


def test_a_new_groups_heartbeat_does_not_wait_for_the_in_sync_replicas(group, loop_thread):
    """A consumer group's first heartbeat creates the group and its retry topic on the
    master as Apache creates them, in the tables, not through the metadata log: its answer
    waits for the name server's registration of the retry topic only. (Through the metadata
    log it waited for the in-sync replicas twice, ~30 ms on this machine: a Java consumer's
    own rebalance, woken by a first master's notification, looked the retry topic up while
    its heartbeat to the second master was still in flight, and found the second master's
    retry queue only at its next route poll, 30 s later.) With the follower frozen, the
    in-sync wait cannot end; the heartbeat is answered and the retry topic routed anyway."""
    leader = group.leader()
    assert leader is not None
    follower = next(m for m in group.members if m is not leader)
    group.wait_routed(leader)
    client = loop_thread.run(RemotingClient.connect(leader.remoting_addr))
    try:
        group.pause(follower)
        answer = loop_thread.run(client.request(heartbeat("c-new-group"), timeout=10))
        assert answer.code == codes.SUCCESS, answer.remark
        assert group.routed(f"%RETRY%{GROUP}")
    finally:
        group.resume(follower)
        loop_thread.call(client.close)
