"""`ferry.client.producer.PipelinedProducer` against real brokers and a real
name server: pipelined sends over SendStream, each message stored once and
in its queue's order; linger batching; the memory bound; a stream cut
mid-way (what was answered is stored, the rest is reported, nothing is
stored twice by a retry); refusals surface on the message's future."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from ferry.client.namesrv import NamesrvClient
from ferry.client.producer import BufferFull, PipelinedProducer
from ferry.client.sendstream import StreamSendError
from ferry.v1 import broker_pb2
from tests.faultproxy import FaultProxy
from tests.integration import support
from tests.waiting import wait_for

QUEUES = 4


def _topic(ns, brokers, topic: str, queues: int = QUEUES) -> None:
    for b in brokers:
        support.create_topic(b.channel, topic, queues)
    with NamesrvClient([ns.addr]) as nsc:
        wait_for(lambda: len(nsc.route(topic).queue_datas) == len(brokers), 10, f"{topic}'s route")


def _stored(brokers, topic: str) -> dict[str, list[bytes]]:
    """broker/queue -> bodies in queue order."""
    out = {}
    for b in brokers:
        found = support.pull_all(b.channel, topic, QUEUES)
        for (queue_id, _offset), body in sorted(found.items()):
            out.setdefault(f"{b.app.config.broker_name}/{queue_id}", []).append(body)
    return out


def test_every_message_is_stored_once_in_its_queues_order(two_brokers):
    ns, brokers = two_brokers
    _topic(ns, brokers, "Piped")
    with NamesrvClient([ns.addr]) as nsc, PipelinedProducer(nsc, max_in_flight=64) as producer:
        futures = [producer.send_async("Piped", b"%06d" % i, tags="t") for i in range(2000)]
        producer.flush(60)
        sent = [f.result() for f in futures]
    assert {s.result.status for s in sent} == {broker_pb2.SEND_OK}
    assert {s.broker_name for s in sent} == {"broker-a", "broker-b"}
    stored = _stored(brokers, "Piped")
    bodies = [b for queue in stored.values() for b in queue]
    assert sorted(bodies) == [b"%06d" % i for i in range(2000)]  # each once
    for queue, in_order in stored.items():
        assert in_order == sorted(in_order), f"{queue} out of order"
    # Each result names where its own message is.
    for i in (0, 777, 1999):
        s = sent[i]
        queue = stored[f"{s.broker_name}/{s.result.queue_id}"]
        assert queue[s.result.queue_offset] == b"%06d" % i


def test_linger_holds_a_lone_message_and_a_full_batch_goes_at_once(two_brokers):
    ns, brokers = two_brokers
    _topic(ns, brokers[:1], "Lingered", queues=1)
    with NamesrvClient([ns.addr]) as nsc:
        with PipelinedProducer(nsc, linger_ms=60_000, batch_max_messages=10) as producer:
            futures = [producer.send_async("Lingered", b"m%d" % i) for i in range(10)]
            producer.flush(30)  # a full batch does not wait out the linger
            assert all(f.result().result.status == broker_pb2.SEND_OK for f in futures)
        with PipelinedProducer(nsc, linger_ms=300) as producer:
            started = time.monotonic()
            producer.send_async("Lingered", b"alone").result(30)
            assert time.monotonic() - started >= 0.3  # it waited for company


def test_a_full_buffer_raises_at_once_without_blocking(two_brokers):
    ns, brokers = two_brokers
    _topic(ns, brokers, "Bounded")
    with NamesrvClient([ns.addr]) as nsc:
        producer = PipelinedProducer(nsc, buffer_max_bytes=1000, block_when_full=False)
        try:
            # Hold the producer's thread: nothing handed over can be answered.
            gate = threading.Event()
            producer._loop.call_soon_threadsafe(gate.wait, 30)
            held = [producer.send_async("Bounded", b"x" * 300) for _ in range(3)]
            with pytest.raises(BufferFull, match="buffer_max_bytes=1000"):
                producer.send_async("Bounded", b"x" * 300)
            gate.set()
            producer.flush(60)
            assert all(f.result().result.status == broker_pb2.SEND_OK for f in held)
            # Answered messages free their room.
            assert producer.send_async("Bounded", b"x" * 300).result(30)
        finally:
            producer.close()


def test_a_full_buffer_blocks_the_sender_until_answers_free_room(two_brokers):
    ns, brokers = two_brokers
    _topic(ns, brokers, "Blocking")
    with NamesrvClient([ns.addr]) as nsc:
        producer = PipelinedProducer(nsc, buffer_max_bytes=1000, max_block_s=60)
        try:
            gate = threading.Event()
            producer._loop.call_soon_threadsafe(gate.wait, 30)  # nothing can be answered
            held = [producer.send_async("Blocking", b"x" * 300) for _ in range(3)]
            late: list = []
            sender = threading.Thread(
                target=lambda: late.append(producer.send_async("Blocking", b"y" * 300))
            )
            sender.start()
            wait_for(lambda: producer._waiters == 1, 10, "the fourth send to block")
            assert not late and sender.is_alive()  # still blocked: 900 + 300 > 1000
            gate.set()  # answers free room: the blocked send goes on
            sender.join(30)
            assert late and late[0].result(30).result.status == broker_pb2.SEND_OK
            assert all(f.result(30).result.status == broker_pb2.SEND_OK for f in held)
        finally:
            producer.close()
        # Blocked longer than max_block_s: BufferFull, and nothing handed over.
        producer = PipelinedProducer(nsc, buffer_max_bytes=1000, max_block_s=0.2)
        try:
            gate = threading.Event()
            producer._loop.call_soon_threadsafe(gate.wait, 30)
            held = [producer.send_async("Blocking", b"x" * 300) for _ in range(3)]
            started = time.monotonic()
            with pytest.raises(BufferFull):
                producer.send_async("Blocking", b"z" * 300)
            assert time.monotonic() - started >= 0.2
            gate.set()
            producer.flush(60)
            assert all(f.result().result.status == broker_pb2.SEND_OK for f in held)
        finally:
            producer.close()


def test_a_refused_message_fails_its_future_only(two_brokers):
    ns, brokers = two_brokers
    _topic(ns, brokers, "Mixed")
    with NamesrvClient([ns.addr]) as nsc, PipelinedProducer(nsc) as producer:
        good = producer.send_async("Mixed", b"fine")
        timed = producer.send_async(
            "Mixed", b"later", deliver_at_ms=1 << 62
        )  # past timerMaxDelaySec
        after = producer.send_async("Mixed", b"also fine")
        producer.flush(60)
        assert good.result().result.status == broker_pb2.SEND_OK
        assert after.result().result.status == broker_pb2.SEND_OK
        exc = timed.exception()
        assert isinstance(exc, StreamSendError)
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and not exc.maybe_stored


def test_a_cut_stream_reports_the_unanswered_and_stores_nothing_twice(two_brokers, loop_thread):
    ns, brokers = two_brokers
    _topic(ns, brokers[:1], "Cut")
    broker = brokers[0]
    proxy = FaultProxy("127.0.0.1", broker.app.port)
    loop_thread.run(proxy.start())
    try:
        with NamesrvClient([ns.addr]) as nsc, PipelinedProducer(nsc, max_in_flight=512) as producer:
            # The producer reaches the broker through the proxy: the cached route names it.
            route = producer._routes.get("Cut")
            route.addrs["broker-a"][0] = proxy.addr
            futures = [producer.send_async("Cut", b"%05d" % i) for i in range(300)]
            producer.flush(60)
            # Answers held back: what is written from now on stays unanswered.
            loop_thread.call(proxy.blackhole, "down")
            futures += [producer.send_async("Cut", b"%05d" % i) for i in range(300, 3000)]
            store = broker.app.store
            stored = lambda: sum(store.queue_max_offset("Cut", q) for q in range(QUEUES))  # noqa: E731
            wait_for(
                lambda: loop_thread.call(stored) > 300,
                30,
                "messages written after the answers were held back",
            )
            loop_thread.call(proxy.cut_connections)
            loop_thread.call(proxy.heal)
            producer.flush(60)
        ok = {b"%05d" % i for i, f in enumerate(futures) if f.exception() is None}
        failed = [f.exception() for f in futures if f.exception() is not None]
        assert len(ok) >= 300 and failed
        # What failed was written and unanswered: reported, not sent again.
        assert all(isinstance(e, StreamSendError) and e.maybe_stored for e in failed), failed[:3]
        bodies = [b for queue in _stored([broker], "Cut").values() for b in queue]
        assert len(bodies) == len(set(bodies)), "a message stored twice"
        assert ok <= set(bodies)  # every answered message is stored
    finally:
        loop_thread.run(proxy.stop())
