"""`Broker.SendStream`: pipelined single messages on one bidirectional stream,
each answered with its own result, in order, under the client's sequence
number; a refused message fails alone; the broker stops reading a stream
with sendStreamMaxInFlight unanswered messages; a SYNC_MASTER whose slave is
cut off answers FLUSH_SLAVE_TIMEOUT for every message."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ferry.client.sendstream import StreamSender, StreamSendError
from ferry.v1 import broker_pb2, broker_pb2_grpc
from services.broker.api.sendstream import SendStreamSession
from tests.faultproxy import FaultProxy
from tests.integration import support
from tests.integration.test_ha_faults import _master, _slave
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

TOPIC = "Streamed"
QUEUES = 4
MAX_MESSAGE_SIZE = 4096


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from support.module_broker(
        tmp_path_factory, "stream", TOPIC, QUEUES, maxMessageSize=str(MAX_MESSAGE_SIZE)
    )


def _message(seq: int, topic: str = TOPIC, **fields) -> broker_pb2.StreamedMessage:
    return broker_pb2.StreamedMessage(
        sequence=seq,
        topic=topic,
        body=fields.pop("body", f"body {seq}".encode()),
        tags=f"t{seq % 2}",
        keys=f"k{seq}",
        properties={"n": str(seq)},
        **fields,
    )


def _stream(broker, requests, timeout=30):
    """Every result the broker answers to these requests, in the order answered."""
    responses = broker.broker.SendStream(iter(requests), timeout=timeout)
    return [r for response in responses for r in response.results]


def _pull(broker, queue_id: int, offset: int) -> broker_pb2.MessageExt:
    answer = broker.broker.PullMessage(
        broker_pb2.PullMessageRequest(
            consumer_group="check", topic=TOPIC, queue_id=queue_id, queue_offset=offset,
            max_msg_nums=1,
        ),
        timeout=10,
    )  # fmt: skip
    assert answer.status == broker_pb2.FOUND, answer
    return answer.messages[0]


def test_each_message_is_answered_in_order_with_its_own_result(broker):
    # One message per request, and several per request: both are streams of messages.
    requests = [broker_pb2.SendStreamRequest(messages=[_message(i)]) for i in range(100)]
    requests.append(broker_pb2.SendStreamRequest(messages=[_message(i) for i in range(100, 150)]))
    results = _stream(broker, requests)

    assert [r.sequence for r in results] == list(range(150))
    assert all(r.HasField("result") and not r.error_code for r in results)
    assert all(r.result.status == broker_pb2.SEND_OK for r in results)
    assert len({r.result.msg_id for r in results}) == 150
    for r in results[::7]:
        m = _pull(broker, r.result.queue_id, r.result.queue_offset)
        assert m.body == f"body {r.sequence}".encode()
        assert m.msg_id == r.result.msg_id
        assert (m.tags, m.keys, m.properties["n"]) == (
            f"t{r.sequence % 2}", f"k{r.sequence}", str(r.sequence)
        )  # fmt: skip
    # One producer's messages to one queue keep their order there.
    per_queue: dict[int, list[int]] = {}
    for r in results:
        per_queue.setdefault(r.result.queue_id, []).append(r.result.queue_offset)
    assert all(offsets == sorted(offsets) for offsets in per_queue.values())


def test_a_refused_message_fails_alone(broker):
    requests = [
        broker_pb2.SendStreamRequest(messages=[_message(1)]),
        broker_pb2.SendStreamRequest(messages=[_message(2, topic="NoSuchTopic")]),
        broker_pb2.SendStreamRequest(
            messages=[_message(3, body=b"x" * (MAX_MESSAGE_SIZE + 1)), _message(4)]
        ),
        broker_pb2.SendStreamRequest(messages=[_message(5, topic="bad topic!")]),
        broker_pb2.SendStreamRequest(messages=[_message(6, queue_id=QUEUES)]),
        broker_pb2.SendStreamRequest(messages=[_message(7, body=b"")]),
        broker_pb2.SendStreamRequest(messages=[_message(8)]),
    ]
    results = {r.sequence: r for r in _stream(broker, requests)}
    assert sorted(results) == [1, 2, 3, 4, 5, 6, 7, 8]
    ok = {s for s, r in results.items() if r.HasField("result")}
    assert ok == {1, 4, 8}
    assert all(results[s].result.status == broker_pb2.SEND_OK for s in ok)
    expected = {
        2: (grpc.StatusCode.NOT_FOUND, "NoSuchTopic"),
        3: (grpc.StatusCode.RESOURCE_EXHAUSTED, "maxMessageSize"),
        5: (grpc.StatusCode.INVALID_ARGUMENT, "topic"),
        6: (grpc.StatusCode.INVALID_ARGUMENT, "queue_id"),
        7: (grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    }
    for seq, (code, text) in expected.items():
        assert results[seq].error_code == code.value[0], results[seq]
        assert text in results[seq].error, results[seq]


def test_messages_answered_before_the_client_goes_away_are_stored(broker):
    async def go():
        channel = grpc.aio.insecure_channel(broker.addr)
        call = broker_pb2_grpc.BrokerStub(channel).SendStream()
        answered = []
        for i in range(20):
            await call.write(broker_pb2.SendStreamRequest(messages=[_message(1000 + i)]))
            response = await call.read()
            answered += list(response.results)
        call.cancel()  # cut mid-way: nothing half-closed, nothing more read
        await channel.close()
        return answered

    answered = broker.loop.run(go())
    assert [r.sequence for r in answered] == list(range(1000, 1020))
    for r in answered:
        assert _pull(broker, r.result.queue_id, r.result.queue_offset).msg_id == r.result.msg_id


def test_a_stream_holds_at_most_max_in_flight_unanswered_messages(broker):
    """The answering side is not run: the reader stages up to the bound and
    then reads no more, so the client's writes back up instead of the broker's
    memory growing."""
    pulled = []

    async def requests():
        for i in range(100):
            pulled.append(i)
            yield broker_pb2.SendStreamRequest(messages=[_message(2000 + i)])

    async def go():
        session = SendStreamSession(broker.app.sends, lambda: None, max_in_flight=8)
        answers = session.run(requests())
        first = asyncio.ensure_future(answers.__anext__())  # starts the reader, answers once
        result = await first
        return session, answers, result

    session, answers, first = broker.loop.run(go())
    # The first answer took what had arrived; nobody has taken it, nor asks for more
    # (an answer counts as unanswered until the transport takes it).
    assert first.results
    wait_for(
        lambda: broker.loop.call(lambda: not session._room.is_set()),
        10,
        "the reader to stop at the bound",
    )
    in_flight = broker.loop.call(lambda: session._in_flight)
    assert in_flight == 8
    assert len(pulled) == 8
    broker.loop.run(answers.aclose())


def test_a_cut_off_slave_gives_flush_slave_timeout_for_each_message(loop_thread, tmp_path):
    master = _master(loop_thread, tmp_path / "m", slaveTimeout=500)
    proxy = FaultProxy("127.0.0.1", master.app.ha_master.port)
    loop_thread.run(proxy.start())
    slave = _slave(loop_thread, tmp_path / "s", proxy.addr)
    try:
        support.create_topic(master.channel, TOPIC, 1)
        wait_for(lambda: ha_status(master).connections, 10, "the slave to connect")
        before = _stream(master, [broker_pb2.SendStreamRequest(messages=[_message(0)])])
        assert before[0].result.status == broker_pb2.SEND_OK
        loop_thread.call(proxy.blackhole, "both")
        results = _stream(
            master,
            [broker_pb2.SendStreamRequest(messages=[_message(i)]) for i in range(1, 6)],
        )
        assert [r.sequence for r in results] == [1, 2, 3, 4, 5]
        assert {r.result.status for r in results} == {broker_pb2.FLUSH_SLAVE_TIMEOUT}
    finally:
        loop_thread.call(proxy.heal)
        slave.stop()
        loop_thread.run(proxy.stop())
        master.stop()


# ---------------------------------------------------------------- ferry.client.sendstream


def _sender_run(broker, coro_fn, addr=None):
    """Run coro_fn(sender) on the broker's loop with a StreamSender to `addr`."""

    async def go():
        channel = grpc.aio.insecure_channel(addr or broker.addr)
        sender = StreamSender(broker_pb2_grpc.BrokerStub(channel), timeout_s=10)
        try:
            return await coro_fn(sender)
        finally:
            await sender.close()
            await channel.close()

    return broker.loop.run(go())


def test_a_shared_sender_answers_each_caller_with_its_own_result(broker):
    async def go(sender):
        messages = [_message(0) for _ in range(200)]
        for i, m in enumerate(messages):
            m.body = f"shared {i}".encode()
        return await asyncio.gather(*(sender.send(m) for m in messages), return_exceptions=True)

    results = _sender_run(broker, go)
    assert all(isinstance(r, broker_pb2.SendResult) for r in results), results[:3]
    assert len({r.msg_id for r in results}) == 200
    for i, r in enumerate(results[::17]):
        m = _pull(broker, r.queue_id, r.queue_offset)
        assert m.body == f"shared {i * 17}".encode()


def test_a_refused_message_raises_with_the_brokers_code_and_others_go_on(broker):
    async def go(sender):
        return await asyncio.gather(
            sender.send(_message(0)),
            sender.send(_message(0, topic="NoSuchTopic")),
            sender.send(_message(0, body=b"x" * (MAX_MESSAGE_SIZE + 1))),
            sender.send(_message(0)),
            return_exceptions=True,
        )

    ok1, missing, large, ok2 = _sender_run(broker, go)
    assert isinstance(ok1, broker_pb2.SendResult) and isinstance(ok2, broker_pb2.SendResult)
    assert isinstance(missing, StreamSendError)
    assert missing.code() == grpc.StatusCode.NOT_FOUND and "NoSuchTopic" in missing.details()
    assert isinstance(large, StreamSendError)
    assert large.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_sender_to_nowhere_fails_each_message_unavailable(broker):
    with support.HeldPort() as held:

        async def go(sender):
            return await asyncio.gather(
                *(sender.send(_message(i)) for i in range(3)), return_exceptions=True
            )

        results = _sender_run(broker, go, addr=held.addr)
    assert all(isinstance(r, StreamSendError) for r in results), results
    assert {r.code() for r in results} == {grpc.StatusCode.UNAVAILABLE}


def test_after_its_stream_breaks_the_next_send_opens_a_new_one(broker):
    async def go(sender):
        first = await sender.send(_message(0))
        broken = sender._stream
        broken.call.cancel()  # as when the connection drops
        await asyncio.gather(*broken.tasks, return_exceptions=True)
        assert broken.failed is not None
        second = await sender.send(_message(1))
        return first, second, sender._stream is not broken

    first, second, reopened = _sender_run(broker, go)
    assert reopened
    assert first.status == second.status == broker_pb2.SEND_OK


def test_a_requests_plain_messages_are_appended_together_on_one_queue(broker):
    messages = [_message(i) for i in range(3000, 3010)]
    messages[4] = _message(3004, topic="NoSuchTopic")  # refused: the others still go together
    messages[7].properties["TIMER_DELIVER_MS"] = "1"  # due already: stored as a plain message
    results = _stream(broker, [broker_pb2.SendStreamRequest(messages=messages)])
    stored = [r for r in results if r.HasField("result")]
    assert [r.sequence for r in stored] == [3000, 3001, 3002, 3003, 3005, 3006, 3007, 3008, 3009]
    assert results[4].error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert len({r.result.queue_id for r in stored}) == 1
    offsets = [r.result.queue_offset for r in stored]
    assert offsets == list(range(offsets[0], offsets[0] + len(stored)))
    for r in stored:
        m = _pull(broker, r.result.queue_id, r.result.queue_offset)
        assert (m.body, m.msg_id) == (f"body {r.sequence}".encode(), r.result.msg_id)
