"""The official RocketMQ 5 Python SDK (rocketmq-python-client 5.1.2) through a proxy, with
nothing but the endpoint changed, against two back ends (tests/compat/backends.py): ferry
(two masters and a name server in this process, the proxy as its own process) and Apache
RocketMQ's 5.x proxy in local mode, the reference. The SDK's public API only (Producer,
SimpleConsumer, PushConsumer).

Every test of what the SDK sees runs on both (`[ferry]`, `[apache]`): Apache's answer is
what ferry's must be. A test marked `ferry_only` checks something only ferry has (its
metrics, its own client, its NOT_IMPLEMENTED answers), and says so.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import duration_pb2
from rocketmq import (
    ConsumeResult,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import MessageType
from rocketmq.v5.exception import InternalErrorException, PayloadTooLargeException

from ferry.client.broker import Producer as FerryProducer
from ferry.client.namesrv import NamesrvClient
from ferry.client.pop import PopConsumer
from ferry.v1 import broker_pb2
from tests.compat.backends import BACKENDS, BROKER_MAX_BODY, start_backend
from tests.compat.specs import parametrize_cluster
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "SdkTopic"
# A back end's first test also starts its cluster (Apache's JVMs: ~15 s, more on a busy
# machine).
pytestmark = [pytest.mark.timeout(300), pytest.mark.apache5]


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_backend(request.param, tmp_path_factory.mktemp(f"proxy-sdk-{request.param}"))
    try:
        backend.create_topic(TOPIC)
        yield backend
    finally:
        backend.release()


def _dead_letters(cluster, group: str, want: int = 1) -> list:
    """What is in %DLQ%<group>, read with the SDK's SimpleConsumer (in a group of its own)
    once the broker that created the topic has registered it with the name server."""
    topic = f"%DLQ%{group}"
    cluster.wait_route(topic)
    reader = _simple(cluster, f"dlq-reader-{group}", topic)
    try:
        return _receive_until(reader, want, 60)
    finally:
        reader.shutdown()


class _SdkHeaders(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """What every SDK request carries besides its signature: Apache's proxy answers a
    request without a client id CLIENT_ID_REQUIRED (ferry's does not ask for one)."""

    HEADERS = (
        ("x-mq-client-id", "ferry-wire-test"),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
    )

    def _with_headers(self, details):
        return details._replace(metadata=[*(details.metadata or ()), *self.HEADERS])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_headers(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_headers(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_headers(client_call_details), request_iterator)


@contextlib.contextmanager
def _wire_channel(cluster):
    """A channel to the proxy whose calls carry the SDKs' headers."""
    with grpc.insecure_channel(cluster.endpoint) as channel:
        yield grpc.intercept_channel(channel, _SdkHeaders())


def _message(topic: str, body: bytes, tag: str = "", keys: str = "", **props) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    for k, v in props.items():
        m.add_property(k, v)
    return m


def _producer(cluster, topic=TOPIC) -> Producer:
    p = Producer(cluster.config(), (topic,))
    p.startup()
    return p


def _simple(cluster, group: str, topic=TOPIC, await_s: int = 2) -> SimpleConsumer:
    cluster.ensure_group(group)
    c = SimpleConsumer(cluster.config(), group, {topic: FilterExpression("*")}, await_s)
    c.startup()
    return c


# Apache's proxy fails a receive that comes before it has the consumer's settings (sent
# on the Telemetry stream as the SDK starts; a NullPointerException in
# ReceiveMessageActivity): a race of the first receives, which ferry's stateless proxy
# does not have.
_NO_SETTINGS_YET = '"settings" is null'


def _receive(consumer, max_msgs: int, invisible_s: int, settled_s: float = 10.0) -> list:
    """consumer.receive, retried while Apache's proxy has not had its settings yet."""
    deadline = time.monotonic() + settled_s
    while True:
        try:
            return consumer.receive(max_msgs, invisible_s)
        except InternalErrorException as exc:
            if _NO_SETTINGS_YET not in str(exc) or time.monotonic() > deadline:
                raise


def _receive_until(consumer, want: int, timeout_s: float, invisible_s: int = 30, ack=True):
    """At least `want` messages, received (and acked, with `ack`) within `timeout_s`."""
    got = []

    def enough() -> bool:
        for m in _receive(consumer, 32, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
        return len(got) >= want

    wait_for(enough, timeout_s, lambda: f"{want} messages ({len(got)} so far)", interval_s=0)
    return got


def test_send_with_tags_keys_and_properties_then_receive_and_ack(cluster):
    producer = _producer(cluster)
    consumer = _simple(cluster, "sdk-basic")
    try:
        sent = {}
        for i in range(20):
            receipt = producer.send(
                _message(TOPIC, f"basic {i}".encode(), tag="TagA", keys=f"key-{i}", color="blue")
            )
            sent[receipt.message_id] = i
            # RocketMQ's proxy returns the message id as the transaction id of every send.
            assert receipt.transaction_id == receipt.message_id
        got = _receive_until(consumer, 20, 60)
        assert sorted(sent) == sorted(m.message_id for m in got)  # the client's ids, kept
        for m in got:
            i = sent[m.message_id]
            assert m.body == f"basic {i}".encode()
            assert m.tag == "TagA"
            assert m.keys == {f"key-{i}"}
            assert m.properties == {"color": "blue"}
            assert m.delivery_attempt == 1
        assert consumer.receive(32, 30) == []  # all acknowledged: nothing comes back
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_delay_message_is_not_delivered_early(cluster):
    topic = "SdkDelay"
    cluster.create_topic(topic, message_type="DELAY")
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, "sdk-delay", topic)
    try:
        due_s = int(time.time()) + 3
        m = _message(topic, b"later")
        m.delivery_timestamp = due_s  # the SDK sends this value as Timestamp.seconds
        producer.send(m)
        got = _receive_until(consumer, 1, 30)
        received = time.time()
        assert [x.body for x in got] == [b"later"]
        assert received >= due_s
        # As RocketMQ's proxy: a delay message, with its delivery time (ms).
        assert got[0].message_type == MessageType.DELAY
        assert got[0].delivery_timestamp == due_s * 1000
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_fifo_messages_keep_their_group_order(cluster):
    topic = "SdkFifo"
    cluster.create_topic(topic, message_type="FIFO")
    cluster.set_group("sdk-fifo", consume_message_orderly=True)
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, "sdk-fifo", topic)
    try:
        for i in range(10):
            for g in range(5):
                m = _message(topic, f"{g}:{i}".encode())
                m.message_group = f"group-{g}"
                producer.send(m)
        seen: dict[str, list[int]] = defaultdict(list)
        got = _receive_until(consumer, 50, 90)
        for m in got:
            g, i = m.body.decode().split(":")
            seen[g].append(int(i))
            assert m.message_group == f"group-{g}"
            # RocketMQ's proxy shows __SHARDINGKEY among the user properties too.
            assert m.properties == {"__SHARDINGKEY": f"group-{g}"}
        assert {g: v for g, v in seen.items()} == {str(g): list(range(10)) for g in range(5)}
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_unknown_topic_and_oversized_body_raise_the_sdks_errors(cluster):
    producer = _producer(cluster)
    try:
        # The SDK wraps the route's TOPIC_NOT_FOUND (it logs the code) in its own error.
        with pytest.raises(Exception, match="failed to fetch topic:NoSuchTopic route"):
            producer.send(_message("NoSuchTopic", b"x"))
        # Above the brokers' maxMessageSize, within the proxy's: ferry's proxy answers
        # MESSAGE_BODY_TOO_LARGE (not retried); Apache's answers INTERNAL_ERROR, which the
        # SDK retries, then raises (a difference ferry keeps: docs/guides/rocketmq5-sdks.md,
        # "Differences from Apache RocketMQ's proxy").
        too_large = PayloadTooLargeException if cluster.name == "ferry" else InternalErrorException
        with pytest.raises(too_large):
            producer.send(_message(TOPIC, b"x" * (BROKER_MAX_BODY + 1)))
        with pytest.raises(Exception, match="exceeds the threshold"):  # the proxy's 4 MiB
            producer.send(_message(TOPIC, b"x" * (4 * 1024 * 1024 + 1)))
    finally:
        producer.shutdown()


def test_no_ack_means_delivered_again_with_a_higher_attempt(cluster):
    topic = "SdkRedeliver"
    cluster.create_topic(topic)
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, "sdk-redeliver", topic)
    try:
        message_id = producer.send(_message(topic, b"again")).message_id
        first = _receive_until(consumer, 1, 30, invisible_s=1, ack=False)
        assert [(m.message_id, m.delivery_attempt) for m in first] == [(message_id, 1)]
        second = _receive_until(consumer, 1, 60, invisible_s=30)
        assert [(m.message_id, m.delivery_attempt, m.body) for m in second] == [
            (message_id, 2, b"again")
        ]
        # The first delivery's handle, past its invisibility: refused as RocketMQ's proxy
        # refuses it (the response's status names the entries' one code).
        with pytest.raises(Exception, match="INVALID_RECEIPT_HANDLE"):
            consumer.ack(first[0])
        # The retry copy came through the timer, after the backoff: still a normal
        # message, with no delivery time (the SDK reads an unset one as 0).
        assert (second[0].message_type, second[0].delivery_timestamp) == (MessageType.NORMAL, 0)
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_a_group_whose_retry_topic_passes_127_bytes_receives_and_gets_its_retries(cluster):
    """`%RETRY%<group>_<topic>` past 127 bytes (a topic's limit): Apache serves the group
    (it stores a long topic name whole); ferry fits the name (`fit_topic_name`) and serves
    it too. It used to refuse every receive with ILLEGAL_CONSUMER_GROUP."""
    topic = "SdkLongGroupTopic"
    group = "sdk-long-group-" + "x" * 100  # 115 characters: Apache's admin takes up to 120
    assert len(f"%RETRY%{group}_{topic}") > 127
    cluster.create_topic(topic)
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, group, topic)
    try:
        message_id = producer.send(_message(topic, b"long")).message_id
        first = _receive_until(consumer, 1, 30, invisible_s=1, ack=False)
        assert [(m.message_id, m.delivery_attempt) for m in first] == [(message_id, 1)]
        second = _receive_until(consumer, 1, 60, invisible_s=30)
        assert [(m.message_id, m.delivery_attempt, m.body) for m in second] == [
            (message_id, 2, b"long")
        ]
        assert consumer.receive(32, 30) == []
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_change_invisible_duration(cluster):
    topic = "SdkInvisible"
    cluster.create_topic(topic)
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, "sdk-invisible", topic)
    try:
        producer.send(_message(topic, b"later, then acked"))
        producer.send(_message(topic, b"sooner"))
        got = _receive_until(consumer, 2, 30, invisible_s=60, ack=False)
        by_body = {m.body: m for m in got}
        keep = by_body[b"later, then acked"]
        consumer.change_invisible_duration(keep, 120)
        consumer.ack(keep)  # with the handle the change returned
        consumer.change_invisible_duration(by_body[b"sooner"], 1)
        again = _receive_until(consumer, 1, 60, ack=False)
        assert [(m.body, m.delivery_attempt) for m in again] == [(b"sooner", 2)]
        # More than the proxy's maximum (12 h) is refused in RocketMQ's words (the SDK
        # then holds the refusal's empty handle: the last use of this message).
        with pytest.raises(Exception, match="the invisibleTime is too large. max is 43200000"):
            consumer.change_invisible_duration(again[0], 13 * 3600)
        # Less than the proxy's least for a receive (1 s in these tests, 10 s by default).
        with pytest.raises(Exception, match="the invisibleTime is too small. min is 1000"):
            consumer.receive(1, 0)
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_two_simple_consumers_split_messages_none_lost_none_twice(cluster):
    topic = "SdkSplit"
    cluster.create_topic(topic)
    # 10,000 through ferry; Apache, the reference for what the SDK sees, takes 2,000
    # (its half of the suite is not a load test, and 10,000 cost it a minute here).
    # The SDK's producer sends 2,000 on both; ferry's other 8,000 come from ferry's own
    # producer in batches: the consumers are what this test is about, and 8,000 SDK sends
    # cost ~14 of the test's 70 CPU-s here.
    n = 10_000 if cluster.name == "ferry" else 2_000
    by_sdk = 2_000
    if n > by_sdk:
        with NamesrvClient([cluster.ns.addr]) as ns, FerryProducer(ns) as seeder:
            for start in range(by_sdk, n, 100):
                entries = [
                    broker_pb2.SendEntry(body=f"{i:05d}".encode())
                    for i in range(start, min(n, start + 100))
                ]
                seeder.send_batch(topic, entries)
    producer = _producer(cluster, topic)
    try:
        for start in range(0, by_sdk, 100):  # 100 sends in flight at a time
            window = [
                producer.send_async(_message(topic, f"{i:05d}".encode()))
                for i in range(start, min(by_sdk, start + 100))
            ]
            for f in window:
                f.result(timeout=60)
    finally:
        producer.shutdown()
    cluster.ensure_group("sdk-split")  # before the two consumers start together
    received: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    done = threading.Event()

    def drain(index: int) -> None:
        consumer = _simple(cluster, "sdk-split", topic)
        try:
            deadline = time.monotonic() + 240
            while not done.is_set() and time.monotonic() < deadline:
                batch = _receive(consumer, 32, 60)
                # The batch's acks in flight together, as an application's workers
                # would ack (each SDK ack waits for its answer).
                for m, _ in zip(batch, ackers.map(consumer.ack, batch), strict=True):
                    received[index].append(int(m.body))
                if sum(map(len, received)) >= n:
                    done.set()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            consumer.shutdown()

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    with ThreadPoolExecutor(16, thread_name_prefix="ack") as ackers:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert not errors
    everything = received[0] + received[1]
    assert sorted(everything) == list(range(n))  # none lost, none twice
    assert received[0] and received[1]  # both took a share


class _Listener(MessageListener):
    def __init__(self) -> None:
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self.lock = threading.Lock()

    def consume(self, message) -> ConsumeResult:
        body = message.body.decode()
        with self.lock:
            self.attempts[body].append(message.delivery_attempt)
        if body.startswith("always-fails") or (
            body.startswith("fails-once") and message.delivery_attempt == 1
        ):
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def test_push_consumer_retries_failures_and_dead_letters_what_always_fails(cluster):
    topic = "SdkPush"
    group = "sdk-push"
    cluster.create_topic(topic)
    cluster.set_group(group, retry_max_times=2)
    listener = _Listener()
    consumer = PushConsumer(cluster.config(), group, listener, {topic: FilterExpression("*")})
    consumer.startup()  # raises unless the proxy's settings arrive within the SDK's 10 s
    producer = _producer(cluster, topic)
    try:
        ids = {
            body: producer.send(_message(topic, body.encode())).message_id
            for body in ("ok-1", "ok-2", "fails-once", "always-fails")
        }

        def settled():
            a = listener.attempts
            return (
                a.get("ok-1") == [1]
                and a.get("ok-2") == [1]
                and a.get("fails-once") == [1, 2]
                and len(a.get("always-fails", [])) == 3  # first delivery + retry_max_times
            )

        wait_for(settled, 90, f"the listener's deliveries, so far {dict(listener.attempts)}")
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert listener.attempts["always-fails"] == [1, 2, 3]
    # The dead letter, read back with the SDK from the group's DLQ: the message as it was
    # sent (its id, no user properties), the brokers' dead-letter bookkeeping hidden.
    (dead,) = _dead_letters(cluster, group)
    assert (dead.topic, dead.body, dead.message_id, dead.properties) == (
        f"%DLQ%{group}",
        b"always-fails",
        ids["always-fails"],
        {},
    )


@pytest.mark.ferry_only("ferry's own client and name server")
def test_interop_with_ferrys_own_client(cluster):
    topic = "SdkInterop"
    cluster.create_topic(topic)
    # The SDK sends; ferry's consumer reads (tags, keys and the client's id as UNIQ_KEY).
    producer = _producer(cluster, topic)
    try:
        receipt = producer.send(_message(topic, b"from the sdk", tag="T1", keys="k1"))
    finally:
        producer.shutdown()
    with NamesrvClient([cluster.ns.addr]) as ns:
        ferry_consumer = PopConsumer(ns, "interop-ferry", topic)
        try:
            got = []
            wait_for(
                lambda: got.extend(ferry_consumer.receive(max_msgs=8, wait_s=1)) or got,
                30,
                "the SDK's message through ferry's consumer",
            )
            for m in got:
                ferry_consumer.ack([m])
        finally:
            ferry_consumer.close()
        assert [(m.body, m.tags, m.keys) for m in got] == [(b"from the sdk", "T1", "k1")]
        assert got[0].properties.get("UNIQ_KEY") == receipt.message_id
        # ferry's producer sends; the SDK's consumer reads.
        with FerryProducer(ns) as ferry_producer:
            ferry_producer.send(topic, b"from ferry", tags="T2", keys="k2")
    consumer = _simple(cluster, "interop-sdk", topic)
    try:
        got = _receive_until(consumer, 2, 30)
    finally:
        consumer.shutdown()
    assert sorted((m.body, m.tag) for m in got) == [(b"from ferry", "T2"), (b"from the sdk", "T1")]


@pytest.mark.ferry_only("ferry's proxy metrics")
def test_metrics_count_requests_by_rpc_and_code(cluster):
    topic = "SdkMetrics"
    cluster.create_topic(topic)

    def count(rpc: str, code: str) -> float:
        text = support.scrape(cluster.metrics_url)
        return support.sample(text, "ferry_proxy_requests_total", f'code="{code}",rpc="{rpc}"') or 0

    sends, receives = count("SendMessage", "OK"), count("ReceiveMessage", "OK")
    acks, missing = count("AckMessage", "OK"), count("QueryRoute", "TOPIC_NOT_FOUND")
    producer = _producer(cluster, topic)
    consumer = _simple(cluster, "sdk-metrics", topic)
    try:
        for i in range(3):
            producer.send(_message(topic, f"m{i}".encode()))
        with pytest.raises(Exception, match="failed to fetch topic"):
            producer.send(_message("NoSuchTopicEither", b"x"))
        assert len(_receive_until(consumer, 3, 30)) == 3
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert count("SendMessage", "OK") == sends + 3
    assert count("ReceiveMessage", "OK") >= receives + 1
    assert count("AckMessage", "OK") == acks + 3
    assert count("QueryRoute", "TOPIC_NOT_FOUND") >= missing + 1
    text = support.scrape(cluster.metrics_url)
    assert support.sample(text, "ferry_proxy_request_duration_seconds_count", 'rpc="SendMessage"')
    # Every consumer of this module is shut down: their long polls end (a cancelled
    # one as soon as the proxy hears of it).
    wait_for(
        lambda: (
            support.sample(
                support.scrape(cluster.metrics_url),
                "ferry_proxy_streams_open",
                'rpc="ReceiveMessage"',
            )
            == 0
        ),
        30,
        "no receive stream open",
    )


class _Recorder(MessageListener):
    def __init__(self, fails: str) -> None:
        self.fails = fails
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def consume(self, message) -> ConsumeResult:
        body = message.body.decode()
        with self.lock:
            self.seen.append((body, message.delivery_attempt))
        return ConsumeResult.FAILURE if body == self.fails else ConsumeResult.SUCCESS


def test_fifo_push_consumer_forwards_what_always_fails_to_the_dlq(cluster):
    """A FIFO PushConsumer retries a failing message itself, then hands it to
    ForwardMessageToDeadLetterQueue; its message group goes on after it."""
    topic, group = "SdkFifoPush", "sdk-fifo-push"
    cluster.create_topic(topic, message_type="FIFO")
    cluster.set_group(group, consume_message_orderly=True, retry_max_times=1)
    listener = _Recorder(fails="poison")
    consumer = PushConsumer(cluster.config(), group, listener, {topic: FilterExpression("*")})
    consumer.startup()
    producer = _producer(cluster, topic)
    try:
        ids = {}
        for body in ("poison", "after-1", "after-2"):
            m = _message(topic, body.encode())
            m.message_group = "g"
            ids[body] = producer.send(m).message_id
        wait_for(
            lambda: [b for b, _ in listener.seen][-2:] == ["after-1", "after-2"],
            60,
            f"the group to go on after the poison, so far {listener.seen}",
        )
    finally:
        consumer.shutdown()
        producer.shutdown()
    # Tried twice (max attempts = retry_max_times + 1; the SDK retries a FIFO
    # message itself, so both show attempt 1), in order, before the rest.
    assert [b for b, _ in listener.seen] == ["poison", "poison", "after-1", "after-2"]
    (dead,) = _dead_letters(cluster, group)
    assert (dead.body, dead.message_id, dead.message_group, dead.properties) == (
        b"poison",
        ids["poison"],
        "g",
        {"__SHARDINGKEY": "g"},
    )


@pytest.mark.ferry_only("what ferry does not serve; Apache's proxy serves these RPCs")
def test_rpcs_not_served_answer_not_implemented_at_once(cluster):
    """On the wire, not through the SDK: what ferry does not serve is said in
    the response's status, promptly (each call has a 5 s deadline)."""
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answers = {
            "QueryOffset": stub.QueryOffset(s.QueryOffsetRequest(), timeout=5),
            "GetOffset": stub.GetOffset(s.GetOffsetRequest(), timeout=5),
            "UpdateOffset": stub.UpdateOffset(s.UpdateOffsetRequest(), timeout=5),
            "RecallMessage": stub.RecallMessage(s.RecallMessageRequest(), timeout=5),
            "PullMessage": next(iter(stub.PullMessage(s.PullMessageRequest(), timeout=5))),
        }
    for rpc, answer in answers.items():
        assert answer.status.code == v2.Code.NOT_IMPLEMENTED, rpc
        assert "ferry" in answer.status.message, rpc


def test_unknown_topic_and_bad_receipt_handle_on_the_wire(cluster):
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        missing = stub.QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name="Nope")), timeout=5)
        bad = stub.AckMessage(
            s.AckMessageRequest(
                group=v2.Resource(name="sdk-wire"),
                topic=v2.Resource(name=TOPIC),
                entries=[s.AckMessageEntry(receipt_handle="junk")],
            ),
            timeout=5,
        )
    assert missing.status.code == v2.Code.TOPIC_NOT_FOUND
    # Apache's proxy fails to parse it: INTERNAL_SERVER_ERROR (ferry keeps its answer,
    # docs/guides/rocketmq5-sdks.md, "Differences from Apache RocketMQ's proxy").
    junk = v2.Code.INVALID_RECEIPT_HANDLE if cluster.name == "ferry" else v2.INTERNAL_SERVER_ERROR
    assert bad.entries[0].status.code == junk


# RocketMQ 5.x's proxy, word for word (its route cache's MQClientException, code 17).
NO_ROUTE = (
    "CODE: 17  DESC: No topic route info in name server for the topic: {}\n"
    "For more information, please visit the url, "
    "https://rocketmq.apache.org/docs/bestPractice/06FAQ"
)


def test_an_unknown_topics_route_is_answered_as_rocketmqs_proxy_answers_it(cluster):
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        missing = stub.QueryRoute(
            s.QueryRouteRequest(topic=v2.Resource(name="NoSuchTopicHere")), timeout=5
        )
    assert (missing.status.code, missing.status.message) == (
        v2.Code.TOPIC_NOT_FOUND,
        NO_ROUTE.format("NoSuchTopicHere"),
    )


def _text(status) -> str:
    """A status's text without the Java exception's class name Apache's proxy puts first
    when the refusal comes from behind its gRPC layer."""
    return re.sub(r"^(?:[a-z]+\.)+[A-Za-z]+Exception: ", "", status.message)


def _wire_message(topic: str, message_id: str, group: str = ""):
    """A v2 message as an SDK puts it on the wire (with a message group: FIFO)."""
    from apache.rocketmq.v2 import definition_pb2 as v2

    m = v2.Message(topic=v2.Resource(name=topic), body=b"typed")
    m.system_properties.message_id = message_id
    m.system_properties.message_type = v2.FIFO if group else v2.NORMAL
    if group:
        m.system_properties.message_group = group
    return m


def test_topics_carry_rocketmq5s_message_type(cluster):
    """A topic's message.type decides what its route accepts and what the
    proxy takes, as RocketMQ's proxy: a topic without one is NORMAL."""
    from rocketmq.v5.exception import IllegalArgumentException

    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    fifo = "SdkTypedFifo"
    cluster.create_topic(fifo, message_type="FIFO")
    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def accepted(topic: str) -> set[tuple[int, ...]]:
            route = stub.QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=5)
            assert route.status.code == v2.Code.OK, route.status.message
            return {tuple(q.accept_message_types) for q in route.message_queues}

        assert accepted(TOPIC) == {(v2.NORMAL,)}  # created without a type
        assert accepted(fifo) == {(v2.FIFO,)}

        def send(message):
            return stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10).status

        conflict = v2.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        refused = send(_wire_message(TOPIC, "01TYPED0000000000000000000000001", group="g"))
        assert (refused.code, _text(refused)) == (
            conflict,
            "TopicMessageType validate failed, the expected type is NORMAL, "
            "but actual type is FIFO",
        )
        refused = send(_wire_message(fifo, "01TYPED0000000000000000000000002"))
        assert (refused.code, _text(refused)) == (
            conflict,
            "TopicMessageType validate failed, the expected type is FIFO, "
            "but actual type is NORMAL",
        )
        assert send(_wire_message(fifo, "01TYPED0000000000000000000000003", "g")).code == v2.OK
    # The SDK is told to check first (Settings.publishing.validate_message_type), and does.
    producer = _producer(cluster, fifo)
    try:
        with pytest.raises(IllegalArgumentException, match="not match with queue accept"):
            producer.send(_message(fifo, b"not a fifo message"))
    finally:
        producer.shutdown()


def _mutate(**changes):
    """A change to a valid NORMAL message of TOPIC, as a test case sends it."""

    def apply(m):
        for key, value in changes.items():
            if key == "props":
                m.user_properties.update(value)
            elif key == "keys":
                m.system_properties.keys.extend(value)
            elif key == "body":
                m.body = value
            elif key == "topic":
                m.topic.name = value
            elif key == "delivery_s":
                m.system_properties.delivery_timestamp.seconds = int(time.time()) + value
            else:
                setattr(m.system_properties, key, value)

    return apply


# What RocketMQ's proxy refuses before any broker sees it: (case, change, code name, text).
SEND_REFUSALS = [
    ("system property", _mutate(props={"DELAY": "3"}), "ILLEGAL_MESSAGE_PROPERTY_KEY",
     "property is used by system: DELAY"),
    ("client id property", _mutate(props={"UNIQ_KEY": "x"}), "ILLEGAL_MESSAGE_PROPERTY_KEY",
     "property is used by system: UNIQ_KEY"),
    ("control key", _mutate(props={"a\x01b": "v"}), "ILLEGAL_MESSAGE_PROPERTY_KEY",
     "the key of property cannot contain control character"),
    ("control value", _mutate(props={"k": "v\x02"}), "ILLEGAL_MESSAGE_PROPERTY_KEY",
     "the value of property cannot contain control character"),
    ("129 properties", _mutate(props={f"p{i}": "v" for i in range(129)}),
     "MESSAGE_PROPERTIES_TOO_LARGE", "too many user properties, max is 128"),
    ("16 KiB of properties", _mutate(props={"big": "x" * 16_384}),
     "MESSAGE_PROPERTIES_TOO_LARGE", "the total size of user property is too large, max is 16384"),
    ("tag with |", _mutate(tag="a|b"), "ILLEGAL_MESSAGE_TAG", "tag cannot contain '|'"),
    ("blank tag", _mutate(tag="  "), "ILLEGAL_MESSAGE_TAG",
     "tag cannot be the char sequence of whitespace"),
    ("blank key", _mutate(keys=[" "]), "ILLEGAL_MESSAGE_KEY",
     "key cannot be the char sequence of whitespace"),
    ("no message id", _mutate(message_id=""), "ILLEGAL_MESSAGE_ID", "message id cannot be empty"),
    ("two days ahead", _mutate(delivery_s=2 * 86400), "ILLEGAL_DELIVERY_TIME",
     "the max delay time of message is too large, max is 86400000"),
    ("64-byte group", _mutate(message_group="g" * 64), "ILLEGAL_MESSAGE_GROUP",
     "message group exceed the max size 64"),
    ("blank group", _mutate(message_group=" "), "ILLEGAL_MESSAGE_GROUP",
     "message group cannot be the char sequence of whitespace"),
    ("empty body", _mutate(body=b""), "MESSAGE_BODY_EMPTY", "message body cannot be empty"),
    ("system topic", _mutate(topic="SCHEDULE_TOPIC_XXXX"), "ILLEGAL_TOPIC",
     "cannot access system topic"),
]  # fmt: skip


def test_sends_are_refused_as_rocketmqs_proxy_refuses_them(cluster):
    """On the wire: a message RocketMQ's proxy refuses before any broker sees it (a user
    property with a system property's name would otherwise turn a message into a delay
    message, a control character would break the stored property string)."""
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    answers = {}
    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for i, (case, change, _, _) in enumerate(SEND_REFUSALS):
            m = _wire_message(TOPIC, f"01REFUSED{i:023d}")
            change(m)
            answer = stub.SendMessage(s.SendMessageRequest(messages=[m]), timeout=10)
            answers[case] = (v2.Code.Name(answer.status.code), answer.status.message)
    assert answers == {case: (code, text) for case, _, code, text in SEND_REFUSALS}


def test_consumers_are_told_their_groups_retry_policy(cluster):
    """What Telemetry answers a consumer: its group's FIFO flag, retry max times + 1
    attempts, and its retry policy as the backoff its push consumer waits after a failure
    (ferry: the brokers' messageDelayLevel; Apache: the group's policy, set to the same
    300 ms steps by tests/compat/backends.py)."""
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    cluster.set_group("sdk-settings", retry_max_times=3, consume_message_orderly=True)
    settings = v2.Settings(
        client_type=v2.PUSH_CONSUMER,
        subscription=v2.Subscription(
            group=v2.Resource(name="sdk-settings"),
            subscriptions=[
                v2.SubscriptionEntry(
                    topic=v2.Resource(name=TOPIC),
                    expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                )
            ],
        ),
    )
    settings.request_timeout.FromSeconds(10)
    answered = threading.Event()

    def commands():  # the stream stays open until answered, as an SDK's does
        yield s.TelemetryCommand(settings=settings)
        answered.wait(10)

    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answers = stub.Telemetry(commands(), timeout=10)
        try:
            answer = next(answers)
        finally:
            answered.set()
            answers.cancel()
    got = answer.settings
    assert got.subscription.fifo is True
    assert got.backoff_policy.max_attempts == 4
    assert [d.ToMilliseconds() for d in got.backoff_policy.customized_backoff.next] == [300] * 4


def test_a_receive_pops_the_whole_broker_it_names_fifo_too(cluster):
    """A simple consumer names one queue of the route in each receive, rotating over
    them; RocketMQ's proxy pops the whole broker the queue is on (its acting queue, id -1),
    FIFO topics too, and so does ferry's. The route lists queue 0 of every broker, then
    queue 1 of every broker, ..., so that the rotation alternates brokers: listed broker by
    broker, a simple consumer asked one broker up to a queue count of times in a row, each
    receive waiting out its long poll, while the other held the group's messages
    (RocketMQ's e2e SimpleOrderTest and SimpleAckTest against `make run`'s two masters:
    messages left on one broker when the test's time ran out)."""
    if cluster.name != "ferry":
        pytest.skip(
            "Apache's proxy fails a raw receive that comes without the SDK's telemetry "
            "settings; what it does is read from its code (ReceiveMessageActivity pops the "
            "broker's acting queue, id -1)"
        )
    from apache.rocketmq.v2 import definition_pb2 as v2
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc
    from ferry.v1 import namesrv_pb2

    topic, group = "SdkFifoAnyQueue", "sdk-fifo-any-queue"
    cluster.create_topic(topic, 4, message_type="FIFO")
    # An ordered topic (RocketMQ's orderTopicConf, what `mqadmin updateTopic -o true`
    # writes), as RocketMQ's e2e suite creates its FIFO topics.
    order = ";".join(f"{b.app.config.broker_name}:4" for b in cluster.brokers)
    cluster.ns.stub.PutKVConfig(
        namesrv_pb2.PutKVConfigRequest(namespace="ORDER_TOPIC_CONFIG", key=topic, value=order),
        timeout=10,
    )
    cluster.set_group(group, consume_message_orderly=True)
    producer = _producer(cluster, topic)
    try:
        for g in range(8):  # eight groups: on queues other than 0 too
            m = _message(topic, f"g{g}".encode())
            m.message_group = f"any-{g}"
            producer.send(m)
    finally:
        producer.shutdown()
    got: set[bytes] = set()
    with _wire_channel(cluster) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        route = stub.QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=10)
        assert route.status.code == v2.Code.OK, route.status.message
        names = [q.broker.name for q in route.message_queues]
        brokers = len(set(names))
        assert brokers == 2
        assert [(q.broker.name, q.id) for q in route.message_queues[:brokers]] == [
            (n, 0) for n in dict.fromkeys(names)
        ], "the route does not start with queue 0 of every broker"
        firsts = route.message_queues[:brokers]  # queue 0 of each broker

        def everything() -> bool:
            for queue in firsts:
                request = s.ReceiveMessageRequest(
                    group=v2.Resource(name=group),
                    message_queue=queue,
                    filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                    batch_size=32,
                    invisible_duration=duration_pb2.Duration(seconds=30),
                    long_polling_timeout=duration_pb2.Duration(seconds=1),
                )
                for answer in stub.ReceiveMessage(request, timeout=20):
                    if not answer.HasField("message"):
                        continue
                    got.add(answer.message.body)
                    ack = stub.AckMessage(
                        s.AckMessageRequest(
                            group=v2.Resource(name=group),
                            topic=v2.Resource(name=topic),
                            entries=[
                                s.AckMessageEntry(
                                    message_id=answer.message.system_properties.message_id,
                                    receipt_handle=answer.message.system_properties.receipt_handle,
                                )
                            ],
                        ),
                        timeout=10,
                    )
                    assert ack.status.code == v2.Code.OK, ack.status.message
            return len(got) == 8

        wait_for(everything, 60, lambda: f"8 messages from queue 0's receives ({sorted(got)})")
    assert got == {f"g{g}".encode() for g in range(8)}
