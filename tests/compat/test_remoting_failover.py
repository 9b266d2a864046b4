"""A master SIGKILLed while Apache's Java producer 4.9.8 sends: two broker groups, each a
SYNC_MASTER with its slave (tests/compat/remoting_backends.py, TWO_SYNC_GROUPS). The
producer's sends go on to the other group, and nothing acknowledged is lost: every message
the producer printed as SEND_OK is consumed afterwards by a new group of Apache's push
consumer, the killed group's through its slave.
"""

from __future__ import annotations

import pytest

from tests.compat import clients
from tests.compat.remoting_backends import BACKENDS, TWO_SYNC_GROUPS, start_remoting_backend

pytestmark = pytest.mark.timeout(180)

TOPIC = "FailoverSends"
BEFORE = 20  # SEND_OKs per group before the kill
AFTER = 40  # SEND_OKs after it


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request, tmp_path_factory):
    backend = start_remoting_backend(
        request.param, TWO_SYNC_GROUPS, tmp_path_factory.mktemp(f"failover-{request.param}")
    )
    try:
        yield backend
    finally:
        backend.stop()


def test_sends_go_on_to_the_other_group_and_nothing_acknowledged_is_lost(cluster, tmp_path):
    cluster.create_topic(TOPIC, 4)
    victim = next(n for n in cluster.masters() if n.broker_name == "broker-a")
    sender = clients.java(
        "Producer49",
        ["--namesrv", cluster.namesrv, "--topic", TOPIC, "--mode", "sync", "--count", "5000",
         "--interval-ms", "10", "--timeout-ms", "3000", "--stdin-stop", "--key-prefix", "f"],
        tmp_path / "producer",
        "producer",
    )  # fmt: skip

    def ok(c, since: int = 0) -> list[dict]:
        return [s for s in c.of("send")[since:] if s["status"] == "SEND_OK"]

    with sender.start():
        # Both groups acknowledge (a SYNC_MASTER says SLAVE_NOT_AVAILABLE until its slave
        # has connected: such sends are not acknowledged, and not counted).
        sender.wait(
            lambda c: all(
                sum(s["broker"] == name for s in ok(c)) >= BEFORE
                for name in ("broker-a", "broker-b")
            ),
            60,
            f"{BEFORE} SEND_OKs from each group",
        )
        cluster.kill(victim)
        killed_at = len(sender.of("send"))
        sender.wait(
            lambda c: len(ok(c, killed_at)) >= AFTER, 60, f"{AFTER} SEND_OKs after the kill"
        )
        sender.stop()
    sends = sender.of("send")
    after = ok(sender, killed_at)
    # A send answered just as the master died may still be its; those after go elsewhere.
    assert {s["broker"] for s in after[5:]} == {"broker-b"}, after
    acked = {s["msgId"]: s for s in ok(sender)}
    assert len(acked) >= 2 * BEFORE + AFTER

    reader = clients.java(
        "PushConsumer49",
        ["--namesrv", cluster.namesrv, "--topic", TOPIC, "--group", "failover-reader",
         "--instance", "reader", "--stdin-stop"],
        tmp_path / "reader",
        "reader",
    )  # fmt: skip
    with reader.start():
        reader.wait(
            lambda c: {e["msgId"] for e in c.of("msg")} >= set(acked),
            60,
            "every acknowledged message consumed",
        )
    consumed = {e["msgId"]: e for e in reader.of("msg")}
    for msg_id, s in acked.items():
        m = consumed[msg_id]
        assert (m["keys"], m["broker"], m["queueId"], m["queueOffset"]) == (
            s["key"], s["broker"], s["queueId"], s["queueOffset"],
        )  # fmt: skip
    # Only what Apache stored was read: nothing the producer was told failed came back as
    # a different message.
    assert set(consumed) <= {s["msgId"] for s in sends if s.get("msgId")}
