"""Transactional messages over ferry.v1: ferry's own client (ferry.client.transactions)
and `ferry send --transaction`, against a name server and a master in this process
(the CLI as a subprocess).

"Never delivered" is judged by pulling up to the queue's end once a later message is
there: each topic has one queue, and the dispatcher writes its entries in log order.
"""

from __future__ import annotations

import grpc
import pytest

from ferry.client.broker import BrokerClient
from ferry.client.namesrv import NamesrvClient
from ferry.client.transactions import TransactionProducer, TransactionState
from ferry.v1 import transactions_pb2, transactions_pb2_grpc
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)
GROUP = "tx-client-group"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("ferry-tx")
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    broker = start_broker(
        loop, d / "broker", ns.remoting_addr, transactionTimeOut=500,
        transactionCheckInterval=500, transactionCheckMax=3,
    )  # fmt: skip
    try:
        yield ns, broker
    finally:
        broker.stop()
        ns.stop()
        loop.close()


def _topic(cluster, name: str) -> str:
    ns, broker = cluster
    support.create_topic(broker.channel, name, 1)
    wait_for(lambda: support.route_queue_datas(ns.stub, name) > 0, 30, f"{name}'s route")
    return name


def _bodies(broker, topic: str) -> list[bytes]:
    with BrokerClient(broker.addr) as client:
        return [m.body for m in client.pull("reader", topic, 0, 0, 64).messages]


def _plain(broker, topic: str, body: bytes) -> None:
    with BrokerClient(broker.addr) as client:
        client.send(topic, body)


def _delivered_through(broker, topic: str, marker: bytes) -> list[bytes]:
    """The queue's bodies once `marker`, sent now, is among them."""
    _plain(broker, topic, marker)
    return wait_for(
        lambda: (b := _bodies(broker, topic)) and marker in b and b, 30, f"{marker!r} delivered"
    )


def test_commit_delivers_once_rollback_never_unknown_is_checked(cluster):
    ns, broker = cluster
    topic = _topic(cluster, "TxClient")
    checks = []

    def checker(check):
        checks.append(check.message.body)
        return TransactionState.COMMIT

    with TransactionProducer(NamesrvClient([ns.addr]), GROUP, checker=checker) as producer:
        producer.send(topic, b"committed", lambda sent: TransactionState.COMMIT)
        producer.send(topic, b"rolled back", lambda sent: TransactionState.ROLLBACK)
        undecided = producer.send(topic, b"undecided", lambda sent: TransactionState.UNKNOWN)
        assert undecided.state is TransactionState.UNKNOWN
        wait_for(lambda: b"undecided" in _bodies(broker, topic), 60, "the checked-back commit")
    assert checks[0] == b"undecided"
    got = _delivered_through(broker, topic, b"marker")
    assert got.count(b"committed") == 1
    assert got.count(b"undecided") == 1
    assert b"rolled back" not in got


def test_a_second_decision_changes_nothing_and_a_wrong_group_is_refused(cluster):
    ns, broker = cluster
    topic = _topic(cluster, "TxTwice")
    with TransactionProducer(NamesrvClient([ns.addr]), GROUP) as producer:
        out = producer.send(topic, b"once", lambda sent: TransactionState.COMMIT)
    stub = transactions_pb2_grpc.TransactionsStub(broker.channel)

    def end(group: str, resolution: int) -> transactions_pb2.EndTransactionResponse:
        return stub.EndTransaction(
            transactions_pb2.EndTransactionRequest(
                producer_group=group,
                commit_offset=out.sent.result.commit_offset,
                queue_offset=out.sent.result.queue_offset,
                msg_id=out.msg_id,
                resolution=resolution,
            ),
            timeout=10,
        )

    assert end(GROUP, transactions_pb2.COMMIT).applied is False
    assert end(GROUP, transactions_pb2.ROLLBACK).applied is False
    with pytest.raises(grpc.RpcError) as refused:
        stub.EndTransaction(
            transactions_pb2.EndTransactionRequest(
                producer_group=GROUP, commit_offset=out.sent.result.commit_offset + 1,
                resolution=transactions_pb2.COMMIT,
            ),
            timeout=10,
        )  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert _delivered_through(broker, topic, b"marker").count(b"once") == 1


def test_a_new_producer_of_the_group_answers_for_one_that_went_away(cluster):
    ns, broker = cluster
    topic = _topic(cluster, "TxOrphan")
    with TransactionProducer(NamesrvClient([ns.addr]), GROUP) as first:
        first.send(topic, b"orphaned", lambda sent: TransactionState.UNKNOWN)
    asked = []

    def checker(check):
        asked.append(check.msg_id)
        return TransactionState.ROLLBACK

    with TransactionProducer(
        NamesrvClient([ns.addr]), GROUP, checker=checker, topics=[topic]
    ) as second:
        wait_for(lambda: second.checks_answered >= 1, 60, "the new producer's answer")
    got = _delivered_through(broker, topic, b"marker")
    assert b"orphaned" not in got
    assert len(asked) >= 1


def test_the_cli_sends_commits_and_answers_a_check_back(cluster):
    ns, broker = cluster
    topic = _topic(cluster, "TxCli")
    common = ["-n", ns.remoting_addr]
    done = support.run_ferry("send", topic, "--body", "by hand", "--transaction", "commit", *common)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("COMMIT msgId=")
    assert "producerGroup=ferry-cli-tx" in done.stdout
    back = support.run_ferry(
        "send", topic, "--body", "checked", "--transaction", "unknown", "--check-answer",
        "commit", "--check-wait-s", "60", *common, timeout_s=90,
    )  # fmt: skip
    assert back.returncode == 0, back.stderr
    assert "check-back from the broker" in back.stderr
    assert "answered COMMIT" in back.stdout
    got = _delivered_through(broker, topic, b"marker")
    assert got.count(b"by hand") == 1
    assert got.count(b"checked") == 1
    bad = support.run_ferry(
        "send", topic, "--body", "x", "--transaction", "commit", "--count", "2", *common
    )
    assert bad.returncode != 0
    assert "--transaction" in bad.stderr
