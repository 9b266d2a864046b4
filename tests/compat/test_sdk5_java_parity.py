"""The RocketMQ 5 Java SDK (rocketmq-client-java, tests/compat/sdk5/.../Parity5.java) against
ferry's proxy and against Apache RocketMQ's 5.x proxy (tests/compat/backends.py): the same
program, the same scenarios (producer, SimpleConsumer, PushConsumer: normal, delay, FIFO,
redelivery, DLQ, transactions), and the same outcomes asserted on both back ends.

The program runs once per back end, every scenario in one JVM; each test reads what it
printed about one scenario.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import pytest

from services.proxy import convert, validate
from tests.apache import run_java
from tests.compat.backends import BACKENDS, start_backend
from tests.compat.specs import json_lines

# A back end's first test starts its cluster and runs every scenario (~15-40 s each).
pytestmark = [pytest.mark.timeout(600), pytest.mark.apache5]
SCENARIOS = ("normal", "push", "delay", "fifo", "fifo-batch", "redelivery", "dlq", "transaction")
# (queues, message type); the DLQ made beforehand, as an operator may, so that its route is
# there when the scenario reads it (a broker registers one it makes with its next
# registration, up to 10 s later here).
TOPICS = {
    "%DLQ%j5-dlq": (1, ""),
    "J5Normal": (4, ""),
    "J5Push": (4, ""),
    "J5Delay": (4, "DELAY"),
    "J5Fifo": (4, "FIFO"),
    "J5FifoBatch": (1, "FIFO"),
    "J5Redeliver": (4, ""),
    "J5Dlq": (4, ""),
    "J5Tx": (1, "TRANSACTION"),
}
GROUPS = {
    "j5-normal": {},
    "j5-push": {},
    "j5-delay": {},
    "j5-fifo": {"consume_message_orderly": True},
    "j5-fifo-batch": {"consume_message_orderly": True},
    "j5-redeliver": {},
    "j5-dlq": {"retry_max_times": 1},
    "j5-dlq-reader": {},
    "j5-tx": {},
}


@pytest.fixture(scope="module", params=BACKENDS)
def observed(request, tmp_path_factory):
    """{scenario: [event, ...]} as Parity5 printed them against one back end."""
    d = tmp_path_factory.mktemp(f"sdk5-{request.param}")
    backend = start_backend(request.param, d)
    try:
        for topic, (queues, message_type) in TOPICS.items():
            backend.create_topic(topic, queues, message_type)
        for group, settings in GROUPS.items():
            backend.set_group(group, **settings)
        result = run_java(
            "sdk5",
            "ferry.compat.Parity5",
            [backend.endpoint, *SCENARIOS],
            directory=d / "parity5",
            timeout_s=600,
        )
    finally:
        backend.release()
    events: dict[str, list[dict]] = defaultdict(list)
    for line in json_lines(result.stdout):
        events[line["scenario"]].append(line)
    return events


def _events(observed, scenario: str, event: str) -> list[dict]:
    ends = [e for e in observed[scenario] if e["event"] in ("done", "error")]
    assert ends and ends[-1]["event"] == "done", ends
    return [e for e in observed[scenario] if e["event"] == event]


def test_normal_messages_keep_tags_keys_and_properties(observed):
    sent = {e["body"]: e["id"] for e in _events(observed, "normal", "sent")}
    got = _events(observed, "normal", "received")
    assert sorted(m["body"] for m in got) == sorted(f"normal {i}" for i in range(0, 12, 2))
    for m in got:
        i = int(m["body"].split()[1])
        assert m["id"] == sent[m["body"]]
        assert m["tag"] == "TagA"
        assert m["keys"] == sorted([f"key-{i}", f"order-{i}"])
        assert m["properties"] == {"colour": "grün" if i % 3 == 0 else "blue", "seq": str(i)}
        assert (m["attempt"], m["group"], m["deliveryTimestamp"]) == (1, None, None)
    assert _events(observed, "normal", "extra") == []  # acknowledged: nothing came back


def test_a_plain_sends_transaction_id_is_its_message_id(observed):
    """As RocketMQ's broker answers every stored send and its proxy hands on (the SDK's
    SendReceiptImpl.getTransactionId())."""
    sent = _events(observed, "normal", "sent")
    assert len(sent) == 12
    assert [e["transactionId"] for e in sent] == [e["id"] for e in sent]


def test_a_transaction_is_named_by_its_message_id_and_its_commit_carries_it(observed):
    """The SDK ends a transaction with the id its send got: the message id, as RocketMQ's
    proxy gives it; the committed message carries it as the user property
    `__transactionId__` (RocketMQ 5's broker writes it on the half, and the commit keeps
    the half's properties)."""
    sent = {e["body"]: e for e in _events(observed, "transaction", "sent")}
    for e in sent.values():
        assert e["transactionId"] == e["id"]
    got = _events(observed, "transaction", "received")
    assert {m["body"] for m in got} == {"commit", "checked commit", "marker"}
    for m in got:
        assert m["id"] == sent[m["body"]]["id"]
        # (A commit answered to a check keeps the check copy's TRANSACTION_CHECK_TIMES too,
        # on both back ends.)
        assert m["properties"]["__transactionId__"] == sent[m["body"]]["transactionId"]


def test_push_consumer_takes_every_body_whatever_its_checksum(observed):
    """Half the bodies have a CRC32 of seven hex digits or fewer: the Java SDK computes a
    CRC32 digest without leading zeros, and a push consumer discards (and never hands its
    listener) a message whose digest does not match."""
    sent = _events(observed, "push", "sent")
    assert sum(e["crc32"] < 0x10000000 for e in sent) == 8
    assert all(zlib.crc32(e["body"].encode()) == e["crc32"] for e in sent)
    consumed = _events(observed, "push", "consumed")
    assert sorted(m["body"] for m in consumed) == sorted(e["body"] for e in sent)
    assert {m["attempt"] for m in consumed} == {1}


def test_delay_message_comes_when_due_with_its_delivery_time(observed):
    (sent,) = _events(observed, "delay", "sent")
    (got,) = _events(observed, "delay", "received")
    (timing,) = _events(observed, "delay", "timing")
    assert got["id"] == sent["id"]
    assert got["deliveryTimestamp"] == sent["due"]
    assert timing["lateMs"] >= 0  # never early


def test_fifo_groups_keep_their_order(observed):
    got = _events(observed, "fifo", "received")
    order: dict[str, list[int]] = defaultdict(list)
    for m in got:
        g, i = m["body"].split(":")
        order[g].append(int(i))
        assert m["group"] == f"group-{g}"
        # As RocketMQ's proxy shows it: the message group is a user property too.
        assert m["properties"] == {"__SHARDINGKEY": f"group-{g}"}
    assert dict(order) == {str(g): list(range(5)) for g in range(3)}


def test_a_fifo_batch_comes_back_whole_from_its_first_unacknowledged_message(observed):
    """A FIFO group's queue hands out nothing while a message of its batch is in flight;
    the 2nd and 3rd of a batch acknowledged and the 1st not, what comes next is the same
    three, the acknowledged ones again too (Apache's ConsumerOrderInfoManager: the
    group's offset stays at the first unacknowledged message). ferry used to hand out
    the 1st, then the 4th and 5th."""
    sent = [e["id"] for e in _events(observed, "fifo-batch", "sent")]
    first = _events(observed, "fifo-batch", "first")
    assert [(m["id"], m["attempt"]) for m in first] == [(i, 1) for i in sent[:3]]
    nxt = _events(observed, "fifo-batch", "next")
    assert [m["id"] for m in nxt] == sent[:3]
    assert [m["body"] for m in nxt] == ["m0", "m1", "m2"]
    assert [m["attempt"] for m in nxt] == [2, 2, 2]  # each one consumption more


def test_unacknowledged_message_comes_again_with_a_higher_attempt(observed):
    (sent,) = _events(observed, "redelivery", "sent")
    got = _events(observed, "redelivery", "received")
    assert [(m["id"], m["body"], m["attempt"]) for m in got] == [
        (sent["id"], "again", 1),
        (sent["id"], "again", 2),
    ]


def test_what_always_fails_ends_in_the_dead_letter_queue(observed):
    (sent,) = _events(observed, "dlq", "sent")
    failed = _events(observed, "dlq", "failed")
    assert [m["attempt"] for m in failed][:2] == [1, 2]  # retry max times 1: two deliveries
    (dead,) = _events(observed, "dlq", "received")
    assert (dead["topic"], dead["body"], dead["id"]) == ("%DLQ%j5-dlq", "always fails", sent["id"])
    # Only what the producer set: the broker's own dead-letter bookkeeping stays hidden.
    assert dead["properties"] == {"k": "v"}


def test_ferrys_copies_of_rocketmqs_names_are_this_versions(tmp_path):
    """The proxy hides and refuses RocketMQ's system property names and refuses its system
    topics from copies of Apache's lists (services/proxy): equal to the jar's, so a new
    RocketMQ version with new names fails here first."""
    printed = run_java("rocketmq5", "ferry.compat.Admin5", ["--names"], directory=tmp_path)
    (names,) = json_lines(printed.stdout)
    assert set(names["systemProperties"]) == set(convert.ROCKETMQ_SYSTEM_PROPERTIES)
    assert set(names["systemTopics"]) == set(validate.SYSTEM_TOPICS)
    assert names["systemTopicPrefix"] == validate.SYSTEM_TOPIC_PREFIX


def test_transactions_commit_roll_back_and_are_checked_back(observed, request):
    """Committed: delivered; rolled back: never; left undecided: checked back with the
    producer (still running), whose checker's answer is applied either way.

    ferry checks only what is undecided, and delivers each committed message once.
    Apache's broker also checks transactions already ended (in most runs here, the
    committed and the rolled-back one: its check pass can read a half before the op record
    that ended it), and a COMMIT answer to such a check may deliver a second copy. The
    checker answers as the local transaction decided, so those checks change nothing else
    (answering COMMIT for the rolled-back one had Apache deliver it)."""
    sent = [e["body"] for e in _events(observed, "transaction", "sent")]
    assert sent == ["commit", "rollback", "checked commit", "checked rollback", "marker"]
    checked = {e["body"] for e in _events(observed, "transaction", "checked")}
    got = [m["body"] for m in _events(observed, "transaction", "received")]
    assert set(got) == {"commit", "checked commit", "marker"}
    if request.node.callspec.params["observed"] == "ferry":
        assert checked == {"checked commit", "checked rollback"}
        assert got.count("commit") == 1
        assert got.count("checked commit") == 1
    else:
        assert checked >= {"checked commit", "checked rollback"}
