"""The proxy's receives, acks, re-timings and dead-lettering in RocketMQ's protocol
(services/proxy/remoting_pops.py: POP_MESSAGE, ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME, CONSUMER_SEND_MSG_BACK), end to end through a proxy in
front of a real name server and broker, against the same calls over ferry.v1
(`broker_protocol="grpc"`): the SDK sees the same messages either way; over RocketMQ's
protocol its receipt handle is Apache's proxy's (nine fields), over ferry.v1 ferry's."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.v1 import broker_pb2
from services.proxy.app import ProxyApp, ProxyConfig
from services.proxy.remoting_pops import PopHandle
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

TOPICS = {"remoting": "RemotingPopped", "grpc": "GrpcPopped"}  # one per protocol: each its own
TX_TOPICS = {"remoting": "RemotingTx", "grpc": "GrpcTx"}
QUEUES = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("remoting-pops")
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    b = start_broker(loop, d / "b", ns.remoting_addr, brokerName="broker-p")
    for topic in TOPICS.values():
        support.create_topic(b.channel, topic, QUEUES)
        wait_for(lambda t=topic: support.has_route(ns.stub, t), 30, f"{topic}'s route")
    for topic in TX_TOPICS.values():
        support.create_topic(b.channel, topic, QUEUES, message_type="TRANSACTION")
        wait_for(lambda t=topic: support.has_route(ns.stub, t), 30, f"{topic}'s route")
    try:
        yield ns, b, loop
    finally:
        b.stop()
        ns.stop()
        loop.close()


@pytest.fixture(params=["remoting", "grpc"])
def proxy(request, cluster):
    ns, b, loop = cluster
    config = ProxyConfig(
        namesrv_addrs=(ns.remoting_addr,),
        host="127.0.0.1",
        port=0,
        broker_protocol=request.param,
    )
    app = ProxyApp(config)
    loop.run(app.start())
    channel = grpc.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield Proxied(request.param, service_pb2_grpc.MessagingServiceStub(channel), b)
    finally:
        channel.close()
        loop.run(app.stop())


class Proxied:
    def __init__(self, protocol: str, stub, broker) -> None:
        self.protocol, self.stub, self.broker = protocol, stub, broker
        self.topic = TOPICS[protocol]


def _send(p: Proxied, body: bytes, tag: str = "") -> str:
    message = v2.Message(topic=v2.Resource(name=p.topic), body=body)
    message.system_properties.message_id = "01" + body.hex().upper()
    message.system_properties.message_type = v2.NORMAL
    if tag:
        message.system_properties.tag = tag
    sent = p.stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
    assert sent.status.code == v2.OK, sent.status.message
    return message.system_properties.message_id


def _receive(p: Proxied, group: str, batch: int = 32, invisible_s: int = 30) -> list[v2.Message]:
    request = s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=p.topic), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=invisible_s),
        long_polling_timeout=duration_pb2.Duration(seconds=1),
    )
    out = []
    for response in p.stub.ReceiveMessage(request, timeout=20):
        if response.HasField("message"):
            out.append(response.message)
        elif response.HasField("status") and response.status.code not in (
            v2.OK,
            v2.MESSAGE_NOT_FOUND,
        ):
            raise AssertionError(f"receive failed: {response.status}")
    return out


def _in_flight(p: Proxied, group: str) -> int:
    status = p.broker.broker.GetGroupStatus(
        broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=p.topic), timeout=10
    )
    return sum(q.in_flight for q in status.queues)


def _receive_all(p: Proxied, group: str, want: set[str]) -> dict[str, v2.Message]:
    got: dict[str, v2.Message] = {}

    def more() -> bool:
        for m in _receive(p, group):
            got[m.system_properties.message_id] = m
        return want <= set(got)

    wait_for(more, 30, f"{len(want)} messages through the proxy")
    return got


def test_receive_ack_retime_and_dead_letter_through_either_protocol(proxy):
    protocol, stub = proxy.protocol, proxy.stub
    group = f"gPopped{protocol.capitalize()}"
    ids = {_send(proxy, f"{protocol}-{i}".encode(), tag="T") for i in range(4)}
    got = _receive_all(proxy, group, ids)
    handles = {mid: m.system_properties.receipt_handle for mid, m in got.items()}
    for m in got.values():
        assert m.topic.name == proxy.topic and m.system_properties.tag == "T"
        assert m.system_properties.delivery_attempt == 1
        assert m.body.decode().startswith(protocol)
    forms = {PopHandle.decode(h) is not None for h in handles.values()}
    assert forms == {protocol == "remoting"}, handles
    assert _in_flight(proxy, group) == 4
    first, second, third, fourth = sorted(ids)
    # Ack one.
    acked = stub.AckMessage(
        s.AckMessageRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=proxy.topic),
            entries=[s.AckMessageEntry(message_id=first, receipt_handle=handles[first])],
        ),
        timeout=10,
    )
    assert acked.status.code == v2.OK, acked.status
    # Re-time one: the new handle acknowledges it.
    changed = stub.ChangeInvisibleDuration(
        s.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=proxy.topic),
            receipt_handle=handles[second],
            invisible_duration=duration_pb2.Duration(seconds=60),
            message_id=second,
        ),
        timeout=10,
    )
    assert changed.status.code == v2.OK, changed.status
    assert changed.receipt_handle and changed.receipt_handle != handles[second]
    # Dead-letter one.
    moved = stub.ForwardMessageToDeadLetterQueue(
        s.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=proxy.topic),
            receipt_handle=handles[third],
            message_id=third,
            delivery_attempt=1,
            max_delivery_attempts=16,
        ),
        timeout=10,
    )
    assert moved.status.code == v2.OK, moved.status
    assert _in_flight(proxy, group) == 2
    # Ack the re-timed one and the last in one request.
    both = stub.AckMessage(
        s.AckMessageRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=proxy.topic),
            entries=[
                s.AckMessageEntry(message_id=second, receipt_handle=changed.receipt_handle),
                s.AckMessageEntry(message_id=fourth, receipt_handle=handles[fourth]),
            ],
        ),
        timeout=10,
    )
    assert [e.status.code for e in both.entries] == [v2.OK, v2.OK], both
    assert _in_flight(proxy, group) == 0
    dlq = support.pull_all(proxy.broker.channel, f"%DLQ%{group}", 1)
    assert f"{protocol}-".encode() in b"".join(dlq.values())


def test_a_handle_past_its_invisible_time_is_refused(proxy):
    protocol, stub = proxy.protocol, proxy.stub
    if protocol != "remoting":
        pytest.skip("the ferry.v1 broker decides this for its own handles")
    group = "gPoppedExpired"
    mid = _send(proxy, b"expired")
    m = _receive_all(proxy, group, {mid})[mid]
    held = _in_flight(proxy, group)
    handle = PopHandle.decode(m.system_properties.receipt_handle)
    stale = handle._replace(retrieve_time=handle.retrieve_time - 10 * 60_000).encode()
    answer = stub.AckMessage(
        s.AckMessageRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=proxy.topic),
            entries=[s.AckMessageEntry(message_id=mid, receipt_handle=stale)],
        ),
        timeout=10,
    )
    assert answer.entries[0].status.code == v2.INVALID_RECEIPT_HANDLE
    assert "expired" in answer.entries[0].status.message
    assert _in_flight(proxy, group) == held  # nothing was acknowledged


def _ends_over_remoting(broker) -> float:
    """END_TRANSACTION (37) requests the broker's RocketMQ-protocol port answered."""
    total = 0.0
    for metric in broker.app.registry.collect():
        for sample in metric.samples:
            if (
                sample.name == "ferry_remoting_requests_total"
                and sample.labels.get("request_code") == "37"
            ):
                total += sample.value
    return total


def test_a_transaction_is_sent_and_ended_through_either_protocol(proxy):
    """Over RocketMQ's protocol the half is a SEND_MESSAGE_V2 with TRAN_MSG and the end
    an END_TRANSACTION (37) naming its offsets; over ferry.v1, its Transactions call.
    Either way the committed message is delivered."""
    topic = TX_TOPICS[proxy.protocol]
    message = v2.Message(topic=v2.Resource(name=topic), body=b"tx")
    message.system_properties.message_id = f"01TXEND{proxy.protocol.upper()}"
    message.system_properties.message_type = v2.TRANSACTION
    sent = proxy.stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
    assert sent.status.code == v2.OK, sent.status.message
    [entry] = sent.entries
    ends_before = _ends_over_remoting(proxy.broker)

    def end() -> v2.Status:
        request = s.EndTransactionRequest(
            topic=v2.Resource(name=topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=v2.COMMIT,
            source=v2.SOURCE_CLIENT,
        )
        return proxy.stub.EndTransaction(request, timeout=10).status

    ended = end()
    assert ended.code == v2.OK, ended.message
    over_remoting = _ends_over_remoting(proxy.broker) - ends_before
    assert over_remoting == (1 if proxy.protocol == "remoting" else 0)
    proxy.topic = topic
    got = _receive_all(proxy, f"tx-{proxy.protocol}", {entry.message_id})
    assert got[entry.message_id].body == b"tx"
