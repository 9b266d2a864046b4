"""The proxy's send coalescing (services/proxy/sends.py) against a real broker:
single messages that meet at one broker while a call to it is in flight go
together as one `SendMessages` batch, and each caller still gets the result
of its own message: its id, its offset, its error."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ferry.model import PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS
from ferry.v1 import broker_pb2, broker_pb2_grpc
from services.proxy.sends import SendCoalescer
from tests.integration import support

TOPIC = "Coalesced"
QUEUES = 4
MAX_MESSAGE_SIZE = 1024


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from support.module_broker(
        tmp_path_factory, "coalesce", TOPIC, QUEUES, maxMessageSize=str(MAX_MESSAGE_SIZE)
    )


def _request(i: int, **properties: str) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        topic=TOPIC,
        body=f"message {i}".encode(),
        tags=f"tag{i % 3}",
        keys=f"key{i} other{i}",
        properties={"UNIQ_KEY": f"ID{i:04d}", "user": str(i), **properties},
    )


def _send_all(broker, requests, addr: str | None = None):
    """Every request sent at once through one coalescer on the broker's loop:
    (each caller's result or error, broker calls made, messages they carried)."""

    async def go():
        channel = grpc.aio.insecure_channel(addr or broker.addr)
        stub = broker_pb2_grpc.BrokerStub(channel)
        sends = SendCoalescer(lambda _addr: stub, timeout_s=10)
        try:
            results = await asyncio.gather(
                *(sends.send(addr or broker.addr, r) for r in requests), return_exceptions=True
            )
        finally:
            await sends.close()
            await channel.close()
        return results, sends.stats.calls, sends.stats.messages

    return broker.loop.run(go())


def _stored(broker) -> dict[tuple[int, int], broker_pb2.MessageExt]:
    return support.pull_all(broker.channel, TOPIC, QUEUES, whole=True)


def test_concurrent_sends_share_calls_and_keep_their_own_results(broker):
    before = set(_stored(broker))
    requests = [_request(i) for i in range(50)]
    results, calls, messages = _send_all(broker, requests)

    # The first goes alone; the 49 that arrived while it was in flight go as one batch.
    assert (calls, messages) == (2, 50)
    assert all(isinstance(r, broker_pb2.SendResult) for r in results), results
    assert all(r.status == broker_pb2.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 50
    assert all(r.message_count == 1 for r in results)

    stored = {k: m for k, m in _stored(broker).items() if k not in before}
    assert len(stored) == 50
    # Each caller's result names where its own message is, with its own fields.
    for i, r in enumerate(results):
        m = stored[(r.queue_id, r.queue_offset)]
        assert m.body == f"message {i}".encode()
        assert m.msg_id == r.msg_id
        assert m.properties["UNIQ_KEY"] == f"ID{i:04d}"
        assert m.properties["user"] == str(i)
        assert m.tags == f"tag{i % 3}"
        assert m.keys == f"key{i} other{i}"


def test_a_message_the_broker_refuses_fails_alone(broker):
    before = set(_stored(broker))
    requests = [_request(i) for i in range(10)]
    requests[5].body = b"x" * (MAX_MESSAGE_SIZE + 1)  # the batch is refused whole for it
    results, calls, _ = _send_all(broker, requests)

    assert isinstance(results[5], grpc.aio.AioRpcError)
    assert results[5].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "maxMessageSize" in results[5].details()
    good = [r for i, r in enumerate(results) if i != 5]
    assert all(
        isinstance(r, broker_pb2.SendResult) and r.status == broker_pb2.SEND_OK for r in good
    )
    # Nothing of the refused batch was stored: each good message is there once.
    stored = [m for k, m in _stored(broker).items() if k not in before]
    assert sorted(m.properties["UNIQ_KEY"] for m in stored) == sorted(
        f"ID{i:04d}" for i in range(10) if i != 5
    )
    assert calls == 1 + 1 + 9  # the first alone, the refused batch, then each of its 9 alone


def test_messages_bound_to_a_queue_or_a_time_go_alone(broker):
    requests = [
        _request(0, **{PROPERTY_SHARDING_KEY: "order-1"}),
        _request(1, **{PROPERTY_SHARDING_KEY: "order-1"}),
        _request(2, **{PROPERTY_TIMER_DELIVER_MS: "1"}),
        _request(3),
    ]
    requests[3].queue_id = 2
    results, calls, messages = _send_all(broker, requests)
    assert all(isinstance(r, broker_pb2.SendResult) for r in results), results
    assert (calls, messages) == (4, 4)
    assert results[0].queue_id == results[1].queue_id  # one group, one queue
    assert results[3].queue_id == 2


def test_a_lost_connection_fails_every_waiting_message(broker):
    with support.HeldPort() as held:  # a port nothing answers on
        results, calls, _ = _send_all(
            broker, [_request(i) for i in range(5)], addr=f"127.0.0.1:{held.port}"
        )
    assert calls == 2
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results), results
    assert {r.code() for r in results} == {grpc.StatusCode.UNAVAILABLE}


def test_a_caller_that_gave_up_before_its_batch_left_is_not_sent(broker):
    before = set(_stored(broker))

    async def go():
        channel = grpc.aio.insecure_channel(broker.addr)
        stub = broker_pb2_grpc.BrokerStub(channel)
        sends = SendCoalescer(lambda _addr: stub, timeout_s=10)
        tasks = [asyncio.ensure_future(sends.send(broker.addr, _request(i))) for i in range(4)]
        await asyncio.sleep(0)  # every task has queued; the first call is still in flight
        tasks[2].cancel()  # (the broker runs on this very loop: it cannot have answered yet)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await sends.close()
        await channel.close()
        return results, sends.stats.messages

    results, messages = broker.loop.run(go())
    assert isinstance(results[2], asyncio.CancelledError)
    assert messages == 3
    stored = [m for k, m in _stored(broker).items() if k not in before]
    assert sorted(m.properties["UNIQ_KEY"] for m in stored) == ["ID0000", "ID0001", "ID0003"]
