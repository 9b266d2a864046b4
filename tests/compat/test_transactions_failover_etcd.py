"""Transactions across an automatic failover (enableFailover, etcd), from Apache's 4.9.8
`TransactionMQProducer` (tests/compat/client49 TxProducer49): broker-a's two members elect
their master in a real etcd (tests/failover/group.py's FailoverGroup, SYNC_MASTER, each
member its own process). Committed transactions and one left undecided are on the first
master when it is SIGKILLed; the member elected next rebuilds the undecided one from the
replicated log, checks it back with a producer of the group, and every message is
delivered exactly once to Apache's push consumer."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.compat import clients
from tests.compat.test_remoting_failover_etcd import wait_route
from tests.failover.config import TOPIC
from tests.failover.group import FailoverGroup
from tests.integration.support import FreePorts

pytestmark = pytest.mark.timeout(240)

GROUP = "tx-failover"


@pytest.fixture
def group(tmp_path, etcd, loop_thread):
    g = FailoverGroup(
        tmp_path / "group",
        etcd.endpoint,
        FreePorts(),
        loop_thread,
        size=2,
        transactionTimeOut=1000,
        transactionCheckInterval=200,
        transactionCheckMax=1000,
    )
    try:
        yield g.start()
    finally:
        g.stop_all()
        for m in g.members:  # shown when the test fails
            lines = [ln for ln in m.log().splitlines() if "WARNING" in ln or "ERROR" in ln]
            print(f"--- member {m.id} ({m.server.log_path})\n" + "\n".join(lines[-40:]))


def tx_producer(group: FailoverGroup, tmp_path, name: str, *args: str) -> clients.Client:
    assert group.namesrv is not None
    return clients.java(
        "TxProducer49",
        ["--namesrv", group.namesrv.remoting_addr, "--topic", TOPIC, "--group", GROUP,
         "--key-prefix", name, *args],
        tmp_path / name,
        name,
    )  # fmt: skip


def test_decisions_survive_a_failover_and_pending_ones_are_checked_by_the_new_master(
    group, tmp_path
):
    first = group.leader()
    assert first is not None
    other = next(m for m in group.members if m is not first)
    wait_route(group, {0: first, other.id: other}, "105 to route the first master as id 0")

    committed = clients.produce(tx_producer(group, tmp_path, "ok", "--count", "3"))
    assert [s["status"] for s in committed] == ["SEND_OK"] * 3
    # Prepared (SYNC_MASTER: on both members before SEND_OK), then left undecided.
    pending = clients.produce(
        tx_producer(group, tmp_path, "pending", "--count", "1", "--decide", "unknown",
                    "--check", "unknown")
    )  # fmt: skip
    assert pending[0]["status"] == "SEND_OK"

    group.kill(first)
    second = group.wait_leader(exclude=[first.id])
    wait_route(group, {0: second}, f"105 to route {second} as id 0")

    with tx_producer(group, tmp_path, "after", "--count", "1", "--check", "commit",
                     "--stdin-stop") as after:  # fmt: skip
        after.wait(lambda p: p.of("done"), 60, "the new producer's commit")
        after.wait(
            lambda p: any(e["key"] == "pending-0" for e in p.of("check")),
            60,
            "the new master to check the undecided transaction back",
        )
        consumer = clients.java(
            "PushConsumer49",
            ["--namesrv", group.namesrv.remoting_addr, "--topic", TOPIC, "--group", "tx-reader",
             "--stdin-stop", "--from", "first"],
            tmp_path / "reader",
            "reader",
        )  # fmt: skip
        with consumer.start():
            consumer.wait(
                lambda c: len({e["keys"] for e in c.of("msg")}) == 5, 60, "the 5 messages"
            )
    seen = Counter(e["keys"] for e in consumer.of("msg"))
    assert seen == Counter({"ok-0": 1, "ok-1": 1, "ok-2": 1, "pending-0": 1, "after-0": 1})
    check = next(e for e in after.of("check") if e["key"] == "pending-0")
    assert check["transactionId"] == pending[0]["msgId"]
