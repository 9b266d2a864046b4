"""END_TRANSACTION (37) and prepared sends on a real broker's RocketMQ-protocol door,
driven by ferry's RemotingClient: the send's answer, END's answers when not oneway
(decided, decided before, a wrong group, no half), a oneway END, and a slave's refusal.
The Java client's view is tests/compat/test_transactions_java.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import FLAG_ONEWAY, Command
from tests.conftest import start_broker
from tests.integration import support
from tests.integration.test_remoting_sends import TOPIC, Door, connect_door, props, v2
from tests.waiting import wait_for


@pytest.fixture
def door(loop_thread, tmp_path: Path) -> Iterator[Door]:
    broker = start_broker(loop_thread, tmp_path / "store", brokerName="broker-a")
    support.create_topic(broker.channel, TOPIC, 4)
    d = connect_door(loop_thread, broker)
    yield d
    d.close()
    broker.stop()


def prepared(uniq: str, group: str = "pg") -> Command:
    """A half as Java's TransactionMQProducer sends it (sysFlag 0x4, TRAN_MSG, PGROUP)."""
    properties = props(TRAN_MSG="true", PGROUP=group, UNIQ_KEY=uniq)
    return v2(TOPIC, b"order", 2, properties=properties, a=group, f="4")


def end(answer: Command, decision: int, group: str = "pg", oneway: bool = False) -> Command:
    commit_offset = int(answer.ext["msgId"][16:], 16)
    return Command(
        codes.END_TRANSACTION,
        flag=FLAG_ONEWAY if oneway else 0,
        ext={
            "producerGroup": group,
            "tranStateTableOffset": answer.ext["queueOffset"],
            "commitLogOffset": str(commit_offset),
            "commitOrRollback": str(decision),
            "fromTransactionCheck": "false",
            "msgId": answer.ext.get("transactionId", ""),
        },
    )


def stored(door: Door, queue_id: int = 2) -> int:
    return door.loop.call(lambda: door.broker.app.store.queue_max_offset(TOPIC, queue_id))


def test_a_prepared_send_is_answered_with_the_half(door: Door):
    answer = door.call(prepared("U1"))
    assert answer.code == codes.SUCCESS, answer.remark
    assert answer.ext["transactionId"] == "U1"
    assert answer.ext["queueId"] == "2" and answer.ext["queueOffset"] == "0"
    assert stored(door) == 0  # not in the topic until committed
    assert door.call(end(answer, 0x8)).code == codes.SUCCESS
    assert door.call(end(answer, 0x8)).code == codes.SUCCESS  # decided before: nothing more
    assert door.call(end(answer, 0xC)).code == codes.SUCCESS
    messages = door.pulled(TOPIC, 2, 1)
    assert [m.body for m in messages] == [b"order"]
    assert stored(door) == 1


def test_end_refusals_change_nothing(door: Door):
    answer = door.call(prepared("U2"))
    wrong_group = door.call(end(answer, 0x8, group="other"))
    assert wrong_group.code == codes.SYSTEM_ERROR and "producer group wrong" in wrong_group.remark
    no_half = end(answer, 0x8)
    no_half.ext["commitLogOffset"] = "1"
    refused = door.call(no_half)
    assert refused.code == codes.SYSTEM_ERROR
    assert "Find prepared transaction message failed" in refused.remark
    bad = end(answer, 0x5)
    assert door.call(bad).code == codes.SYSTEM_ERROR
    missing = end(answer, 0x8)
    del missing.ext["producerGroup"]
    assert "producerGroup" in door.call(missing).remark
    assert stored(door) == 0
    assert door.loop.call(lambda: door.broker.app.transactions.pending_count) == 1


def test_a_oneway_rollback_is_never_delivered(door: Door):
    rolled = door.call(prepared("U3"))
    door.oneway(end(rolled, 0xC, oneway=True))
    committed = door.call(prepared("U4"))
    door.oneway(end(committed, 0x8, oneway=True))
    wait_for(lambda: stored(door) == 1, what="the committed message stored")
    assert door.loop.call(lambda: door.broker.app.transactions.pending_count) == 0
    [message] = door.pulled(TOPIC, 2, 1)
    assert message.body == b"order" and message.properties["UNIQ_KEY"] == "U4"


def test_a_slave_refuses_end_transaction(loop_thread, tmp_path: Path):
    slave = start_broker(
        loop_thread, tmp_path / "slave", brokerName="broker-a", brokerId=1, brokerRole="SLAVE"
    )
    try:
        client = loop_thread.run(RemotingClient.connect(slave.remoting_addr))
        answer = Command(codes.SEND_MESSAGE_V2, ext={"msgId": "0" * 32, "queueOffset": "0"})
        request = end(answer, 0x8)
        reply = loop_thread.run(client.request(request, timeout=10))
        assert reply.code == codes.SLAVE_NOT_AVAILABLE
        assert "slave mode" in reply.remark
        loop_thread.call(client.close)
    finally:
        slave.stop()
