"""Pop consumption against a real in-process broker over gRPC: groups that
share work, acknowledgements, redelivery with backoff, dead letters,
ChangeInvisibleTime, ordered groups, timed delivery and bad input."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2
from tests.conftest import start_broker
from tests.integration import support
from tests.waiting import wait_for

BACKOFF = "1s 1s 2s"  # messageDelayLevel: the retry backoff by attempt


@pytest.fixture
def broker(loop_thread, tmp_path):
    b = start_broker(
        loop_thread,
        tmp_path / "store",
        brokerName="broker-p",
        messageDelayLevel=BACKOFF,
        mappedFileSizeCommitLog=8 << 20,
    )
    yield b
    b.stop()


def pop(b, group, topic, n=32, invisible_ms=30_000, wait_ms=0, **kw):
    return b.broker.PopMessage(
        broker_pb2.PopMessageRequest(
            consumer_group=group,
            topic=topic,
            max_msg_nums=n,
            invisible_ms=invisible_ms,
            max_wait_ms=wait_ms,
            **kw,
        ),
        timeout=30,
    )


def ack(b, group, topic, handles):
    return b.broker.AckMessage(
        broker_pb2.AckMessageRequest(consumer_group=group, topic=topic, receipt_handles=handles),
        timeout=30,
    )


def set_group(b, group, **fields):
    b.admin.UpdateAndCreateSubscriptionGroup(
        broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
            config=common_pb2.SubscriptionGroupConfig(group_name=group, **fields)
        ),
        timeout=10,
    )


def send_many(b, topic, bodies, batch=500, **entry_fields):
    for i in range(0, len(bodies), batch):
        r = b.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic=topic,
                messages=[
                    broker_pb2.SendEntry(body=body, **entry_fields)
                    for body in bodies[i : i + batch]
                ],
            ),
            timeout=30,
        )
        assert r.status == broker_pb2.SEND_OK


def test_three_consumers_share_30000_messages_each_delivered_once(broker):
    support.create_topic(broker.channel, "Work", 8)
    bodies = [b"w%05d" % i for i in range(30_000)]
    send_many(broker, "Work", bodies)  # batches go to the queues in turn
    received: list[list[bytes]] = [[] for _ in range(3)]
    attempts: set[int] = set()
    errors: list[str] = []

    def consume(index: int) -> None:
        empty = 0
        while empty < 3:  # three long polls in a row find nothing: all taken
            try:
                r = pop(broker, "billing", "Work", 32, wait_ms=300)
                if not r.messages:
                    empty += 1
                    continue
                empty = 0
                received[index].extend(m.body for m in r.messages)
                attempts.update(m.delivery_attempt for m in r.messages)
                results = ack(broker, "billing", "Work", [m.receipt_handle for m in r.messages])
                if any(x.status != broker_pb2.OK for x in results.results):
                    errors.append(f"ack refused: {results.results[0]}")
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")
                return

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    union = [body for part in received for body in part]
    assert len(union) == len(set(union)) == 30_000, "each message exactly once"
    assert set(union) == set(bodies)
    assert all(part for part in received), "every consumer took a share"
    assert attempts == {1}
    status = broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group="billing", topic="Work")
    )
    assert [q.committed_offset for q in status.queues] == [q.max_offset for q in status.queues]
    assert sum(q.in_flight for q in status.queues) == 0
    # The committed offset is the group's consumer offset, as a pull consumer sees it.
    offset = broker.broker.QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(consumer_group="billing", topic="Work", queue_id=0)
    )
    assert offset.offset == status.queues[0].max_offset > 0


def test_unacknowledged_is_redelivered_with_backoff_then_dead_lettered(broker):
    support.create_topic(broker.channel, "Jobs", 2)
    set_group(broker, "flaky", retry_max_times=2)
    sent = broker.broker.SendMessage(
        broker_pb2.SendMessageRequest(
            topic="Jobs", queue_id=1, body=b"poison", tags="t", properties={"k": "v"}
        )
    )
    first = pop(broker, "flaky", "Jobs", invisible_ms=1000)
    popped_at = time.time()
    assert [(m.body, m.delivery_attempt) for m in first.messages] == [(b"poison", 1)]
    assert first.messages[0].msg_id == sent.msg_id
    # Invisible to the whole group meanwhile.
    assert not pop(broker, "flaky", "Jobs").messages

    seen = [first.messages[0]]

    def redelivered_twice() -> bool:
        nonlocal popped_at
        r = pop(broker, "flaky", "Jobs", invisible_ms=1000, wait_ms=1000)
        if r.messages:
            seen.append(r.messages[0])
            seen_at = time.time()
            attempt = r.messages[0].delivery_attempt
            # Never before invisibility + backoff of the previous attempt (1 s each).
            assert seen_at - popped_at >= 1.0 + 1.0 - 0.05
            popped_at = seen_at
            assert attempt == len(seen)
        return len(seen) >= 3

    wait_for(redelivered_twice, 60, lambda: f"two redeliveries ({len(seen) - 1} so far)",
             interval_s=0)  # fmt: skip
    assert [(m.body, m.delivery_attempt, m.topic) for m in seen] == [
        (b"poison", 1, "Jobs"),
        (b"poison", 2, "Jobs"),
        (b"poison", 3, "Jobs"),
    ]
    assert {m.msg_id for m in seen} == {sent.msg_id}, "one message id across deliveries"
    assert seen[1].properties["k"] == "v" and seen[1].tags == "t"

    # The third delivery is not acknowledged either: retry_max_times=2 is spent.
    def in_dlq():
        r = broker.broker.PullMessage(
            broker_pb2.PullMessageRequest(
                consumer_group="inspect", topic="%DLQ%flaky", queue_id=0, queue_offset=0
            )
        )
        return list(r.messages) if r.status == broker_pb2.FOUND else None

    dead = wait_for(lambda: _quiet(in_dlq), 30, "the message in %DLQ%flaky")
    assert len(dead) == 1
    d = dead[0]
    assert d.body == b"poison" and d.tags == "t"
    assert d.properties["DLQ_ORIGIN_TOPIC"] == "Jobs"
    assert d.properties["DLQ_ORIGIN_MESSAGE_ID"] == sent.msg_id
    assert d.properties["DLQ_DELIVERY_ATTEMPTS"] == "3"
    assert d.reconsume_times == 3
    # Read back by an operator's group, a dead letter is on its first delivery there.
    (inspected,) = pop(broker, "inspect", "%DLQ%flaky").messages
    assert (inspected.body, inspected.delivery_attempt) == (b"poison", 1)
    # ... and nowhere else: the group gets nothing more.
    assert not pop(broker, "flaky", "Jobs", wait_ms=2500).messages
    status = broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group="flaky", topic="Jobs")
    )
    assert (status.dlq_messages, status.retries_pending, status.retry_max_times) == (1, 0, 2)
    assert sum(q.in_flight for q in status.queues) == 0
    assert status.queues[1].committed_offset == 1


def test_forward_to_dead_letter_queue_moves_one_message_now(broker):
    support.create_topic(broker.channel, "Gives", 1)
    sent = broker.broker.SendMessage(
        broker_pb2.SendMessageRequest(topic="Gives", body=b"hopeless", properties={"k": "v"})
    )
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Gives", body=b"fine"))
    hopeless, fine = pop(broker, "quitter", "Gives", invisible_ms=60_000).messages

    def forward(handle):
        return broker.broker.ForwardToDeadLetterQueue(
            broker_pb2.ForwardToDeadLetterQueueRequest(
                consumer_group="quitter", topic="Gives", receipt_handle=handle
            ),
            timeout=10,
        )

    answer = forward(hopeless.receipt_handle)
    assert (answer.status, answer.dlq_topic) == (broker_pb2.OK, "%DLQ%quitter")
    # The handle is spent: forwarding or acknowledging it again is STALE.
    assert forward(hopeless.receipt_handle).status == broker_pb2.STALE
    (stale,) = ack(broker, "quitter", "Gives", [hopeless.receipt_handle]).results
    assert stale.status == broker_pb2.STALE
    with pytest.raises(grpc.RpcError) as bad:
        forward("not a handle")
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (dead,) = pop(broker, "inspect", "%DLQ%quitter").messages
    assert dead.body == b"hopeless" and dead.properties["k"] == "v"
    assert dead.properties["DLQ_ORIGIN_TOPIC"] == "Gives"
    assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == sent.msg_id
    assert dead.properties["DLQ_DELIVERY_ATTEMPTS"] == "1"
    (ok,) = ack(broker, "quitter", "Gives", [fine.receipt_handle]).results
    assert ok.status == broker_pb2.OK
    status = broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group="quitter", topic="Gives")
    )
    assert (status.dlq_messages, sum(q.in_flight for q in status.queues)) == (1, 0)
    assert status.queues[0].committed_offset == 2


def _quiet(fn):
    try:
        return fn()
    except grpc.RpcError:
        return None


def test_change_invisible_time_extends_shortens_and_spends_the_old_handle(broker):
    support.create_topic(broker.channel, "Inv", 1)
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Inv", body=b"a"))
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Inv", body=b"b"))
    a, b_ = pop(broker, "g", "Inv", invisible_ms=1000).messages

    def change(handle, ms):
        return broker.broker.ChangeInvisibleTime(
            broker_pb2.ChangeInvisibleTimeRequest(
                consumer_group="g", topic="Inv", receipt_handle=handle, invisible_ms=ms
            )
        )

    # Extend a to 10 minutes; shorten... b stays at 1 s.
    extended = change(a.receipt_handle, 600_000)
    assert extended.status == broker_pb2.OK and extended.receipt_handle != a.receipt_handle
    assert extended.invisible_until_ms > a.invisible_until_ms + 500_000
    # The old handle is spent, for acks and for changes.
    stale = ack(broker, "g", "Inv", [a.receipt_handle]).results[0]
    assert stale.status == broker_pb2.STALE and stale.reason
    assert change(a.receipt_handle, 5000).status == broker_pb2.STALE
    # b comes back after 1 s + backoff; a does not (extended).
    again = wait_for(
        lambda: pop(broker, "g", "Inv", invisible_ms=600_000, wait_ms=500).messages,
        30,
        "b redelivered",
    )
    assert [(m.body, m.delivery_attempt) for m in again] == [(b"b", 2)]
    # Shorten: from 10 minutes to 1 s, and a is delivered again soon.
    shortened = change(extended.receipt_handle, 1000)
    assert shortened.status == broker_pb2.OK
    back = wait_for(
        lambda: pop(broker, "g", "Inv", invisible_ms=60_000, wait_ms=500).messages,
        30,
        "a redelivered after shortening",
    )
    assert [(m.body, m.delivery_attempt) for m in back] == [(b"a", 2)]
    assert ack(broker, "g", "Inv", [shortened.receipt_handle]).results[0].status == (
        broker_pb2.STALE
    )
    results = ack(broker, "g", "Inv", [back[0].receipt_handle, again[0].receipt_handle]).results
    assert [r.status for r in results] == [broker_pb2.OK, broker_pb2.OK]


def test_a_deadline_the_consumer_chose_has_no_backoff_after_it(loop_thread, tmp_path):
    """A v5 SDK's push consumer sets its own backoff after a failure (ChangeInvisibleTime
    with its retry policy's delay); RocketMQ's pop redelivers then, adding nothing. A
    deadline that just passed still waits the broker's backoff (20 s here)."""
    b = start_broker(
        loop_thread, tmp_path / "store", brokerName="broker-c", messageDelayLevel="20s"
    )

    def status(group, topic):
        return b.broker.GetGroupStatus(
            broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=topic)
        )

    def nack(group, topic, m):
        changed = b.broker.ChangeInvisibleTime(
            broker_pb2.ChangeInvisibleTimeRequest(
                consumer_group=group, topic=topic, receipt_handle=m.receipt_handle,
                invisible_ms=300,
            )
        )  # fmt: skip
        assert changed.status == broker_pb2.OK

    def again(group, topic):
        return wait_for(
            lambda: pop(b, group, topic, n=1, invisible_ms=60_000, wait_ms=500).messages,
            8,
            f"{group}'s message back 300 ms after its consumer's nack, without the backoff",
        )

    try:
        support.create_topic(b.channel, "Chosen", 1)
        support.create_topic(b.channel, "ChosenOrdered", 1)
        set_group(b, "ordered", consume_message_orderly=True)
        # What the proxy tells a v5 consumer as its backoff.
        assert list(status("plain", "Chosen").retry_backoff_ms) == [20_000]
        for topic in ("Chosen", "ChosenOrdered"):
            for body in (b"nacked", b"forgotten"):
                b.broker.SendMessage(broker_pb2.SendMessageRequest(topic=topic, body=body))

        (nacked,) = pop(b, "plain", "Chosen", n=1, invisible_ms=60_000).messages
        (forgotten,) = pop(b, "plain", "Chosen", n=1, invisible_ms=1000).messages
        nack("plain", "Chosen", nacked)
        assert [(m.body, m.delivery_attempt) for m in again("plain", "Chosen")] == [(b"nacked", 2)]
        wait_for(lambda: status("plain", "Chosen").retries_pending == 1, 5, "the retry copy")
        assert not pop(b, "plain", "Chosen", wait_ms=500).messages  # forgotten: 20 s more

        # An ordered queue hands out one message at a time: the nacked one comes back first.
        (nacked,) = pop(b, "ordered", "ChosenOrdered", n=1, invisible_ms=60_000).messages
        nack("ordered", "ChosenOrdered", nacked)
        (back,) = again("ordered", "ChosenOrdered")
        assert (back.body, back.delivery_attempt) == (b"nacked", 2)
        ack(b, "ordered", "ChosenOrdered", [back.receipt_handle])
        (forgotten,) = pop(b, "ordered", "ChosenOrdered", n=1, invisible_ms=1000).messages
        assert forgotten.body == b"forgotten"
        wait_for(
            lambda: status("ordered", "ChosenOrdered").queues[0].redeliveries_pending == 1,
            5,
            "the expired message waiting for its backoff",
        )
        assert not pop(b, "ordered", "ChosenOrdered", wait_ms=500).messages
    finally:
        b.stop()


def test_foreign_and_garbled_handles(broker):
    support.create_topic(broker.channel, "F", 1)
    support.create_topic(broker.channel, "G", 1)
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="F", body=b"x"))
    (m,) = pop(broker, "g1", "F").messages
    results = ack(broker, "g2", "F", [m.receipt_handle]).results
    assert results[0].status == broker_pb2.FOREIGN and "g1" in results[0].reason
    assert ack(broker, "g1", "G", [m.receipt_handle]).results[0].status == broker_pb2.FOREIGN
    other_broker = m.receipt_handle.replace("broker-p", "broker-z")
    assert ack(broker, "g1", "F", [other_broker]).results[0].status == broker_pb2.FOREIGN
    with pytest.raises(grpc.RpcError) as err:
        ack(broker, "g1", "F", [m.receipt_handle, "garbage"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "receipt_handles[1]" in err.value.details()
    # Nothing changed: the good handle still acknowledges.
    assert ack(broker, "g1", "F", [m.receipt_handle]).results[0].status == broker_pb2.OK


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"max_msg_nums": 0}, "max_msg_nums"),
        ({"max_msg_nums": 33}, "max_msg_nums"),
        ({"invisible_ms": 999}, "invisible_ms"),
        ({"invisible_ms": 12 * 3600 * 1000 + 1}, "invisible_ms"),
        ({"topic": "bad topic"}, "topic"),
        ({"consumer_group": ""}, "consumer_group"),
        ({"consumer_group": "a.b"}, "consumer_group"),
        ({"queue_id": 5}, "queue_id"),
    ],
)
def test_pop_bad_input_names_the_field_and_changes_nothing(broker, fields, names):
    support.create_topic(broker.channel, "B", 2)
    request = dict(consumer_group="g", topic="B", max_msg_nums=1, invisible_ms=1000, max_wait_ms=0)
    request.update(fields)
    with pytest.raises(grpc.RpcError) as err:
        broker.broker.PopMessage(broker_pb2.PopMessageRequest(**request))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert names in err.value.details()


def test_pop_unknown_topic_is_not_found(broker):
    with pytest.raises(grpc.RpcError) as err:
        pop(broker, "g", "Nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_long_poll_returns_when_a_message_arrives(broker):
    support.create_topic(broker.channel, "LP", 2)
    result: list = []
    t = threading.Thread(target=lambda: result.append(pop(broker, "g", "LP", wait_ms=20_000)))
    t.start()
    # Send only once the pop is parked on the topic's queues (it found nothing).
    polls = broker.app.store.long_polls
    wait_for(
        lambda: broker.loop.call(lambda: polls.waiting_on("LP", 0) and polls.waiting_on("LP", 1)),
        10,
        "the pop to wait",
    )
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="LP", body=b"late"))
    t.join(30)
    assert [m.body for m in result[0].messages] == [b"late"]


def test_tag_filter_resolves_the_rest(broker):
    support.create_topic(broker.channel, "Tags", 1)
    for i in range(6):
        broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(topic="Tags", body=b"%d" % i, tags="a" if i % 2 else "b")
        )
    got = pop(broker, "g", "Tags", sub_expression="a").messages
    assert [m.body for m in got] == [b"1", b"3", b"5"]
    ack(broker, "g", "Tags", [m.receipt_handle for m in got])
    status = broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group="g", topic="Tags")
    )
    assert status.queues[0].committed_offset == 6


# ---------------------------------------------------------------- ordered groups


def test_ordered_group_processes_each_message_group_in_send_order(loop_thread, tmp_path):
    b = start_broker(
        loop_thread,
        tmp_path / "store",
        brokerName="broker-o",
        messageDelayLevel="100ms 200ms",
        mappedFileSizeCommitLog=8 << 20,
    )
    try:
        support.create_topic(b.channel, "Fifo", 8)
        set_group(b, "ordered", consume_message_orderly=True, retry_max_times=16)
        groups = [f"order-{g}" for g in range(100)]
        sent: dict[str, list[int]] = {g: [] for g in groups}
        for seq in range(5):  # interleaved: every group's first, then every second...
            for g in groups:
                r = b.broker.SendMessage(
                    broker_pb2.SendMessageRequest(
                        topic="Fifo",
                        body=f"{g}:{seq}".encode(),
                        properties={"__SHARDINGKEY": g},
                    )
                )
                assert r.status == broker_pb2.SEND_OK
                sent[g].append(seq)
        processed: dict[str, list[list[int]]] = {g: [] for g in groups}  # [seq] per record
        lock = threading.Lock()
        failures = [0]
        errors: list[str] = []
        rng = random.Random(7)

        total = sum(len(v) for v in sent.values())
        deadline = time.monotonic() + 240

        def consume() -> None:
            while time.monotonic() < deadline:
                with lock:
                    if sum(len(v) for v in processed.values()) >= total:
                        return
                try:
                    r = pop(b, "ordered", "Fifo", 8, invisible_ms=2000, wait_ms=500)
                except grpc.RpcError as exc:
                    errors.append(f"{exc.code().name}: {exc.details()}")
                    return
                if not r.messages:
                    continue
                done, failed_queues = [], set()
                for m in r.messages:
                    if m.queue_id in failed_queues:
                        continue  # after a failure, the rest of its queue waits
                    with lock:
                        fail = rng.random() < 0.05
                    if fail:
                        failed_queues.add(m.queue_id)
                        failures[0] += 1
                        continue
                    done.append(m)
                if not done:
                    continue
                # Processed, then acknowledged, as a consumer does: recorded before the
                # ack, since once it lands another thread may pop and record the next
                # message of the group before this one gets the lock back. An ack the
                # broker refuses (the handle expired) takes its record back out.
                seqs = []
                with lock:
                    for m in done:
                        g, seq = m.body.decode().split(":")
                        entry = (g, [int(seq)])  # a list of its own: removed by identity
                        processed[g].append(entry[1])
                        seqs.append(entry)
                results = ack(b, "ordered", "Fifo", [m.receipt_handle for m in done]).results
                with lock:
                    for (g, entry), res in zip(seqs, results, strict=True):
                        if res.status != broker_pb2.OK:
                            processed[g] = [e for e in processed[g] if e is not entry]

        threads = [threading.Thread(target=consume) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors[:3]
        assert failures[0] > 0, "the test must exercise failures"
        order = {g: [e[0] for e in processed[g]] for g in groups}
        out_of_order = {g: order[g] for g in groups if order[g] != sent[g]}
        assert not out_of_order, f"{len(out_of_order)} groups out of order or incomplete"
    finally:
        b.stop()


def test_message_group_shares_one_queue(broker):
    support.create_topic(broker.channel, "MG", 8)
    queues = {
        broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(
                topic="MG", body=b"x", properties={"__SHARDINGKEY": "customer-42"}
            )
        ).queue_id
        for _ in range(20)
    }
    assert len(queues) == 1


# ---------------------------------------------------------------- timers


def test_timed_message_is_never_early_and_the_limit_is_enforced(broker):
    support.create_topic(broker.channel, "Later", 1)
    deliver = int(time.time() * 1000) + 1500
    r = broker.broker.SendMessage(
        broker_pb2.SendMessageRequest(
            topic="Later", body=b"t", properties={"TIMER_DELIVER_MS": str(deliver)}
        )
    )
    assert r.status == broker_pb2.SEND_OK
    got = wait_for(lambda: pop(broker, "g", "Later", wait_ms=500).messages, 30, "the timed message")
    assert got[0].body == b"t" and got[0].store_timestamp >= deliver
    assert int(got[0].properties.get("TIMER_DELIVER_MS", "0") or 0) in (0, deliver)
    too_far = int(time.time() * 1000) + 3 * 86400 * 1000 + 60_000
    with pytest.raises(grpc.RpcError) as err:
        broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(
                topic="Later", body=b"t", properties={"TIMER_DELIVER_MS": str(too_far)}
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timerMaxDelaySec=259200" in err.value.details()


def test_order_topic_config_on_the_name_server_makes_an_ordered_topic(
    loop_thread, tmp_path, namesrv
):
    from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc

    namesrv_pb2_grpc.NameServerStub(namesrv.channel).PutKVConfig(
        namesrv_pb2.PutKVConfigRequest(
            namespace="ORDER_TOPIC_CONFIG", key="Ledger", value="broker-o:4"
        ),
        timeout=10,
    )
    b = start_broker(loop_thread, tmp_path / "store", namesrv.remoting_addr, brokerName="broker-o")
    try:
        support.create_topic(b.channel, "Ledger", 4)  # registered at once: the answer says ordered

        def orderly():
            return b.broker.GetGroupStatus(
                broker_pb2.GetGroupStatusRequest(consumer_group="any", topic="Ledger")
            ).orderly

        wait_for(orderly, 20, "Ledger to become an ordered topic")
        for body in (b"1", b"2"):
            b.broker.SendMessage(
                broker_pb2.SendMessageRequest(topic="Ledger", queue_id=0, body=body)
            )
        first = pop(b, "any", "Ledger", invisible_ms=60_000, queue_id=0).messages
        assert [m.body for m in first] == [b"1", b"2"]
        # In flight: the queue hands out nothing else until they are resolved.
        b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Ledger", queue_id=0, body=b"3"))
        assert not pop(b, "any", "Ledger", queue_id=0).messages
        ack(b, "any", "Ledger", [m.receipt_handle for m in first])
        assert [m.body for m in pop(b, "any", "Ledger", queue_id=0).messages] == [b"3"]
    finally:
        b.stop()


def test_deadline_heap_is_compacted_but_in_flight_messages_still_expire(broker):
    from services.broker.pop import state as pop_module

    service = broker.app.pop
    support.create_topic(broker.channel, "Heap", 1)
    send_many(broker, "Heap", [b"h%03d" % i for i in range(300)])
    popped = []
    while len(popped) < 300:  # one checkpoint (and one deadline) per pop
        popped.extend(pop(broker, "heap", "Heap", n=1, invisible_ms=600_000).messages)
    ack(broker, "heap", "Heap", [m.receipt_handle for m in popped[:299]])
    last = popped[299]
    service.state.compact_at = 50  # the broker's own threshold is 10,000 (COMPACT_AT)
    change = broker.broker.ChangeInvisibleTime(
        broker_pb2.ChangeInvisibleTimeRequest(
            consumer_group="heap", topic="Heap", receipt_handle=last.receipt_handle,
            invisible_ms=1000,
        )
    )  # fmt: skip
    assert change.status == broker_pb2.OK
    assert len(service.state.expiry) < 300, "resolved checkpoints' deadlines were dropped"
    assert service.state.compact_at >= pop_module.COMPACT_AT
    back = wait_for(
        lambda: pop(broker, "heap", "Heap", wait_ms=500).messages, 30, "the re-timed message"
    )
    assert [(m.body, m.delivery_attempt) for m in back] == [(last.body, 2)]


def test_a_timed_batch_may_hold_entries_already_due_but_not_untimed_ones(broker):
    support.create_topic(broker.channel, "Batch", 1)
    now = int(time.time() * 1000)
    times = [now - 5000, now + 800, now + 1200]  # the first came due in transit
    r = broker.broker.SendMessages(
        broker_pb2.SendMessagesRequest(
            topic="Batch",
            messages=[
                broker_pb2.SendEntry(body=b"%d" % i, properties={"TIMER_DELIVER_MS": str(t)})
                for i, t in enumerate(times)
            ],
        )
    )
    assert r.status == broker_pb2.SEND_OK
    got: list = []
    wait_for(
        lambda: got.extend(pop(broker, "b", "Batch", wait_ms=500).messages) or len(got) == 3,
        30,
        "the three timed messages",
    )
    assert sorted(m.body for m in got) == [b"0", b"1", b"2"]
    for m in got:
        assert m.store_timestamp >= times[int(m.body)]
    with pytest.raises(grpc.RpcError) as err:
        broker.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="Batch",
                messages=[
                    broker_pb2.SendEntry(body=b"x", properties={"TIMER_DELIVER_MS": str(now)}),
                    broker_pb2.SendEntry(body=b"y"),
                ],
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1 of 2 messages carry TIMER_DELIVER_MS" in err.value.details()


def test_an_ordered_message_acknowledged_as_it_expires_is_not_dead_lettered(broker):
    support.create_topic(broker.channel, "Ord", 1)
    set_group(broker, "fifo-ack", consume_message_orderly=True, retry_max_times=1)
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Ord", body=b"last chance"))
    assert pop(broker, "fifo-ack", "Ord", invisible_ms=1000).messages  # attempt 1, not acked
    again = wait_for(
        lambda: pop(broker, "fifo-ack", "Ord", invisible_ms=1000, wait_ms=500).messages,
        30,
        "attempt 2",
    )
    assert again[0].delivery_attempt == 2  # its last: expired, it goes to the DLQ
    service, store = broker.app.pop, broker.app.store
    original = store.read_entries

    async def acknowledged_meanwhile(entries):
        # The expiry reads the record; the consumer's ack lands in that window.
        store.read_entries = original
        assert (await service.ack("fifo-ack", "Ord", [again[0].receipt_handle]))[0].status == "OK"
        return await original(entries)

    store.read_entries = acknowledged_meanwhile

    def status():
        return broker.broker.GetGroupStatus(
            broker_pb2.GetGroupStatusRequest(consumer_group="fifo-ack", topic="Ord")
        )

    wait_for(lambda: status().queues[0].committed_offset == 1, 30, "the message resolved")
    assert store.read_entries is original, "the expiry read the record"
    assert status().dlq_messages == 0


def test_an_ordered_message_expired_is_never_redelivered_to_a_filter_it_does_not_match(broker):
    """RocketMQ's ordered pop reads the queue again through the popping
    consumer's filter: what the filter does not match is skipped (resolved for
    the group), never handed out."""
    support.create_topic(broker.channel, "OrdTags", 1)
    set_group(broker, "fifo-tags", consume_message_orderly=True, retry_max_times=16)
    for body, tag in ((b"a0", "a"), (b"b1", "b")):
        broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(topic="OrdTags", body=body, tags=tag)
        )
    first = pop(broker, "fifo-tags", "OrdTags", n=1, invisible_ms=1000, sub_expression="*")
    assert [m.body for m in first.messages] == [b"a0"]  # not acknowledged: it expires
    again = wait_for(
        lambda: pop(broker, "fifo-tags", "OrdTags", invisible_ms=30_000, wait_ms=500,
                    sub_expression="b").messages,
        30,
        "a message for the consumer of tag b",
    )  # fmt: skip
    assert [(m.body, m.tags) for m in again] == [(b"b1", "b")]
    assert ack(broker, "fifo-tags", "OrdTags", [again[0].receipt_handle]).results[0].status == (
        broker_pb2.OK
    )
    status = broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group="fifo-tags", topic="OrdTags")
    )
    assert status.queues[0].committed_offset == 2  # a0 resolved for the group, as b1
    assert list(pop(broker, "fifo-tags", "OrdTags", sub_expression="*").messages) == []


def test_a_broker_that_is_not_readable_refuses_pops_as_it_refuses_pulls(broker):
    support.create_topic(broker.channel, "Drain", 1)
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Drain", body=b"x"))
    broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=2), timeout=10
    )
    with pytest.raises(grpc.RpcError) as err:
        pop(broker, "g", "Drain")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "brokerPermission=2" in err.value.details()
    broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=6), timeout=10
    )
    assert [m.body for m in pop(broker, "g", "Drain").messages] == [b"x"]


def test_a_group_that_does_not_consume_from_the_minimum_still_gets_a_fresh_queue(broker):
    """consumeFromMinEnable=false (the admin API's default SubscriptionGroupConfig): a
    queue the group never read starts at 0 while its first message is in memory, as
    RocketMQ 5's pop starts one, so what was sent before the group's first pop is
    delivered (ordered or not); a group that starts later, on a queue whose first
    messages were deleted, gets the newest message and what follows."""
    support.create_topic(broker.channel, "Early", 1)
    send_many(broker, "Early", [f"m{i}".encode() for i in range(5)])
    for group, orderly in (("late-plain", False), ("late-fifo", True)):
        set_group(broker, group, consume_from_min_enable=False, consume_message_orderly=orderly)
        got = []
        while len(got) < 5:
            r = pop(broker, group, "Early", 8, wait_ms=1000)
            assert r.messages, f"{group}: only {got}"
            got += [m.body for m in r.messages]
            ack(broker, group, "Early", [m.receipt_handle for m in r.messages])
        assert got == [f"m{i}".encode() for i in range(5)], group


def test_a_queue_whose_first_message_is_not_in_memory_starts_at_its_newest(loop_thread, tmp_path):
    """The same group on a broker where nothing counts as in memory
    (accessMessageInMemoryMaxRatio=0): it starts at the newest message, as RocketMQ's
    max - 1; a group that consumes from the minimum still gets everything."""
    b = start_broker(loop_thread, tmp_path / "store", brokerName="broker-h",
                     accessMessageInMemoryMaxRatio=0)  # fmt: skip
    try:
        support.create_topic(b.channel, "Cold", 1)
        send_many(b, "Cold", [f"m{i}".encode() for i in range(5)])
        set_group(b, "cold-max", consume_from_min_enable=False)
        r = pop(b, "cold-max", "Cold", 8, wait_ms=1000)
        assert [m.body for m in r.messages] == [b"m4"]
        set_group(b, "cold-min", consume_from_min_enable=True)
        r = pop(b, "cold-min", "Cold", 8, wait_ms=1000)
        assert [m.body for m in r.messages] == [f"m{i}".encode() for i in range(5)]
    finally:
        b.stop()


def _group_status(b, group, topic):
    return b.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=topic)
    )


def _next_batch(b, group, topic, n, timeout_s=30):
    """The next pop that hands out anything (polled, no fixed wait)."""
    return wait_for(
        lambda: pop(b, group, topic, n=n, invisible_ms=30_000, wait_ms=500).messages,
        timeout_s,
        f"{group}'s queue to hand out again",
    )


@pytest.mark.parametrize("restart", [False, True], ids=["live", "restarted"])
def test_an_ordered_batch_comes_back_whole_from_its_first_unacknowledged_message(
    loop_thread, tmp_path, restart
):
    """Apache's ordered pop (ConsumerOrderInfoManager.checkBlock / commitAndNext): a
    queue hands out nothing while a message of its last batch is in flight; a batch
    whose first message was not acknowledged comes back whole, the acknowledged ones
    after it included, each one delivery more; the group's offset never passes the
    unacknowledged message — across a restart too (the state is replayed)."""
    store = tmp_path / "store"
    b = start_broker(loop_thread, store, brokerName="broker-f", messageDelayLevel="1s")
    try:
        support.create_topic(b.channel, "FifoBatch", 1)
        set_group(b, "fifo-batch", consume_message_orderly=True, retry_max_times=16)
        send_many(b, "FifoBatch", [f"m{i}".encode() for i in range(5)])
        first = pop(b, "fifo-batch", "FifoBatch", n=3, invisible_ms=1000).messages
        assert [(m.body, m.delivery_attempt) for m in first] == [(b"m0", 1), (b"m1", 1), (b"m2", 1)]
        acked = ack(b, "fifo-batch", "FifoBatch", [m.receipt_handle for m in first[1:]])
        assert [r.status for r in acked.results] == [broker_pb2.OK, broker_pb2.OK]
        assert _group_status(b, "fifo-batch", "FifoBatch").queues[0].committed_offset == 0
        if restart:
            b.stop()
            b = start_broker(loop_thread, store, brokerName="broker-f", messageDelayLevel="1s")
            queue = _group_status(b, "fifo-batch", "FifoBatch").queues[0]
            assert (queue.committed_offset, queue.in_flight + queue.redeliveries_pending) == (0, 1)
        again = _next_batch(b, "fifo-batch", "FifoBatch", n=3)
        assert [(m.body, m.delivery_attempt) for m in again] == [(b"m0", 2), (b"m1", 2), (b"m2", 2)]
        # In flight again: nothing of the queue goes out, m3 included.
        assert not pop(b, "fifo-batch", "FifoBatch", n=3, wait_ms=300).messages
        ack(b, "fifo-batch", "FifoBatch", [m.receipt_handle for m in again])
        rest = pop(b, "fifo-batch", "FifoBatch", n=3).messages
        assert [(m.body, m.delivery_attempt) for m in rest] == [(b"m3", 1), (b"m4", 1)]
        ack(b, "fifo-batch", "FifoBatch", [m.receipt_handle for m in rest])
        assert _group_status(b, "fifo-batch", "FifoBatch").queues[0].committed_offset == 5
    finally:
        b.stop()


def test_a_retimed_message_alone_in_flight_is_all_that_a_restart_keeps(loop_thread, tmp_path):
    """Pop 3, acknowledge the last two, re-time the first: after a restart only the
    first is in flight (the replay starts early enough to see the pop that handed it
    out, not only the change record), and nothing is handed out again."""
    store = tmp_path / "store"
    b = start_broker(loop_thread, store, brokerName="broker-r")
    try:
        support.create_topic(b.channel, "Retimed", 1)
        send_many(b, "Retimed", [b"a", b"b", b"c"])
        got = pop(b, "plain", "Retimed", n=3, invisible_ms=30_000).messages
        assert [m.body for m in got] == [b"a", b"b", b"c"]
        ack(b, "plain", "Retimed", [m.receipt_handle for m in got[1:]])
        changed = b.broker.ChangeInvisibleTime(
            broker_pb2.ChangeInvisibleTimeRequest(
                consumer_group="plain", topic="Retimed", receipt_handle=got[0].receipt_handle,
                invisible_ms=60_000,
            )
        )  # fmt: skip
        assert changed.status == broker_pb2.OK
        b.stop()
        b = start_broker(loop_thread, store, brokerName="broker-r")
        queue = _group_status(b, "plain", "Retimed").queues[0]
        assert (queue.committed_offset, queue.pop_offset, queue.in_flight) == (0, 3, 1)
        assert not pop(b, "plain", "Retimed", n=3, wait_ms=300).messages
        done = ack(b, "plain", "Retimed", [changed.receipt_handle])
        assert [r.status for r in done.results] == [broker_pb2.OK]
        assert _group_status(b, "plain", "Retimed").queues[0].committed_offset == 3
    finally:
        b.stop()
