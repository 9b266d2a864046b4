"""A slave's pulls over RocketMQ's protocol, as Apache 4.9's PullMessageProcessor answers
them: what a Java consumer meets when its group's master is gone (the route then names the
slave alone) or when a master with slaveReadEnable steers it there (suggestWhichBrokerId).

- A slave serves the pull (0 with the records) whatever its slaveReadEnable says; without
  slaveReadEnable it suggests the master (0), with it the group's brokerId;
- a master with slaveReadEnable suggests the group's brokerId (its consumers move to that
  slave), without it the master;
- a slave does not store the offset a pull commits (0x1): that is the master's;
- a pull past a slave's end is 20 (PULL_RETRY_IMMEDIATELY) at the same offset, not 21 (a
  slave may lag: it never moves the consumer's offset), where the master says 21.
"""

from __future__ import annotations

import pytest

from ferry import record
from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2
from tests.conftest import start_broker
from tests.integration.support import create_topic
from tests.waiting import wait_for

TOPIC = "SlaveReads"
STEERED = "steered"  # a group whose brokerId is 1: read from the slave
SENT = 6  # messages, all in queue 0

FLAG_COMMIT, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x1, 0x2, 0x4


@pytest.fixture
def pair(loop_thread, tmp_path, namesrv):
    """A master with slaveReadEnable and its slave without, SENT messages in queue 0 of
    TOPIC on both, and the group STEERED (brokerId 1) on both."""
    common = dict(brokerName="broker-s", slaveSyncDelay=0, slaveSyncInterval=300,
                  haReconnectInterval=200)  # fmt: skip
    master = start_broker(loop_thread, tmp_path / "m", namesrv.remoting_addr,
                          slaveReadEnable="true", **common)  # fmt: skip
    slave = start_broker(loop_thread, tmp_path / "s", namesrv.remoting_addr,
                         brokerRole="SLAVE", brokerId=1, **common)  # fmt: skip
    try:
        create_topic(master.channel, TOPIC, 1)
        master.admin.UpdateAndCreateSubscriptionGroup(
            broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
                config=common_pb2.SubscriptionGroupConfig(group_name=STEERED, broker_id=1)
            ),
            timeout=10,
        )
        master.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic=TOPIC,
                queue_id=0,
                messages=[broker_pb2.SendEntry(body=b"m%d" % i) for i in range(SENT)],
            ),
            timeout=10,
        )
        wait_for(lambda: slave.app.store.queue_max_offset(TOPIC, 0) == SENT, 15,
                 "the slave to hold every message")  # fmt: skip
        wait_for(
            lambda: (
                slave.app.metadata.topics.get(TOPIC) is not None
                and slave.app.metadata.subscription_groups.get(STEERED) is not None
            ),
            15,
            f"the slave to copy topic {TOPIC} and group {STEERED}",
        )
        yield master, slave
    finally:
        slave.stop()
        master.stop()


def pull(broker, group: str, offset: int = 0, commit: int = -1) -> Command:
    flags = FLAG_SUBSCRIPTION | (FLAG_COMMIT if commit >= 0 else 0)
    ext = {"consumerGroup": group, "topic": TOPIC, "queueId": 0, "queueOffset": offset,
           "maxMsgNums": 32, "sysFlag": flags, "commitOffset": max(commit, 0),
           "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0,
           "expressionType": "TAG"}  # fmt: skip
    return call(broker.remoting_addr, Command(codes.PULL_MESSAGE, ext=ext), timeout=10)


def bodies(answer: Command) -> list[bytes]:
    out, pos = [], 0
    while pos < len(answer.body):
        size = int.from_bytes(answer.body[pos : pos + 4], "big")
        out.append(record.decode_stored(answer.body, pos, size).body)
        pos += size
    return out


def committed(broker, group: str) -> Command:
    ext = {"consumerGroup": group, "topic": TOPIC, "queueId": 0}
    return call(broker.remoting_addr, Command(codes.QUERY_CONSUMER_OFFSET, ext=ext))


def test_slave_serves_pulls_and_suggests_as_apache(pair):
    master, slave = pair
    want = [b"m%d" % i for i in range(SENT)]

    # The master with slaveReadEnable steers STEERED to broker id 1, the others stay.
    from_master = pull(master, STEERED)
    assert (from_master.code, bodies(from_master)) == (codes.SUCCESS, want)
    assert from_master.ext["suggestWhichBrokerId"] == "1"
    assert pull(master, "plain").ext["suggestWhichBrokerId"] == "0"

    # The slave (no slaveReadEnable) serves the pull all the same, and suggests the master.
    for group in (STEERED, "plain"):
        from_slave = pull(slave, group, commit=4)
        assert (from_slave.code, bodies(from_slave)) == (codes.SUCCESS, want), group
        assert from_slave.ext["suggestWhichBrokerId"] == "0"
        assert from_slave.ext["nextBeginOffset"] == str(SENT)
        assert (from_slave.ext["minOffset"], from_slave.ext["maxOffset"]) == ("0", str(SENT))
    # The commit flag stored nothing on the slave: its answer is the young queue's start.
    answer = committed(slave, "plain")
    assert (answer.code, answer.ext.get("offset")) == (codes.SUCCESS, "0")

    # Past the end: the master moves the consumer (21), the slave keeps it where it was (20).
    assert (pull(master, "plain", offset=SENT + 5).code) == codes.PULL_OFFSET_MOVED
    beyond = pull(slave, "plain", offset=SENT + 5)
    assert (beyond.code, beyond.ext["nextBeginOffset"]) == (
        codes.PULL_RETRY_IMMEDIATELY, str(SENT + 5),
    )  # fmt: skip
    # At the end: nothing new, on both.
    assert pull(slave, "plain", offset=SENT).code == codes.PULL_NOT_FOUND
