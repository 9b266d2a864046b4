"""The proxy's sends in RocketMQ's protocol (services/proxy/remoting_sends.py)
against a real broker: each message goes as its own SEND_MESSAGE_V2 on one
pipelined connection and is stored as a ferry.v1 send stores it; a refusal
reads as the ferry.v1 error the servicer maps to the SDK's code; a broker that
is gone is a link error. End to end, a proxy in front of a name server and a
broker sends over RocketMQ's protocol where the route names the broker's
RocketMQ port, and over ferry.v1 with `broker_protocol="grpc"`."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.model import PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS
from ferry.v1 import broker_pb2, namesrv_pb2
from services.proxy import convert
from services.proxy.app import ProxyApp, ProxyConfig
from services.proxy.remoting_sends import RemotingSends, SendRefused, offset_of
from services.proxy.sends import LINK_ERRORS
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "RemotingSent"
QUEUES = 4
MAX_MESSAGE_SIZE = 1024


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from support.module_broker(
        tmp_path_factory, "remoting-sends", TOPIC, QUEUES, maxMessageSize=str(MAX_MESSAGE_SIZE)
    )


def _request(i: int, **properties: str) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        topic=TOPIC,
        body=f"message {i}".encode(),
        tags=f"tag{i % 3}",
        keys=f"key{i} other{i}",
        properties={"UNIQ_KEY": f"RID{i:04d}", "user": str(i), **properties},
        born_timestamp=1_700_000_000_000 + i,
    )


def _send_all(broker, requests, addr: str | None = None):
    """Every request sent at once through one RemotingSends: each result or error."""

    async def go():
        sends = RemotingSends(timeout_s=10)
        try:
            return await asyncio.gather(
                *(sends.send(addr or broker.remoting_addr, r) for r in requests),
                return_exceptions=True,
            )
        finally:
            await sends.close()

    return broker.loop.run(go())


def _stored(broker) -> dict[tuple[int, int], broker_pb2.MessageExt]:
    return support.pull_all(broker.channel, TOPIC, QUEUES, whole=True)


def test_pipelined_sends_each_get_their_own_result_and_are_stored_whole(broker):
    before = set(_stored(broker))
    requests = [_request(i) for i in range(60)]
    results = _send_all(broker, requests)
    assert all(isinstance(r, broker_pb2.SendResult) for r in results), results
    assert all(r.status == broker_pb2.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 60
    assert len({r.commit_offset for r in results}) == 60
    stored = {k: m for k, m in _stored(broker).items() if k not in before}
    assert len(stored) == 60
    # The broker picks each run's queue (queueId -1), as for a ferry.v1 send.
    assert {r.queue_id for r in results} <= set(range(QUEUES))
    for i, r in enumerate(results):
        m = stored[(r.queue_id, r.queue_offset)]
        assert m.body == f"message {i}".encode()
        assert m.tags == f"tag{i % 3}"
        assert m.keys == f"key{i} other{i}"
        assert m.properties["user"] == str(i)
        assert m.properties["UNIQ_KEY"] == f"RID{i:04d}"
        assert m.born_timestamp == 1_700_000_000_000 + i
        assert m.commit_offset == r.commit_offset == offset_of(r.msg_id)


def test_a_message_group_lands_on_one_queue_as_a_ferry_v1_send_puts_it(broker):
    grouped = [_request(100 + i, **{PROPERTY_SHARDING_KEY: "order-7"}) for i in range(8)]
    results = _send_all(broker, grouped)
    assert len({r.queue_id for r in results}) == 1
    direct = broker.broker.SendMessage(
        _request(200, **{PROPERTY_SHARDING_KEY: "order-7"}), timeout=10
    )
    assert direct.queue_id == results[0].queue_id


def test_a_delivery_time_is_kept(broker):
    deliver_ms = 4_000_000_000_000  # far ahead, within no limit: refused, with ferry's reason
    [refused] = _send_all(broker, [_request(300, **{PROPERTY_TIMER_DELIVER_MS: str(deliver_ms)})])
    assert isinstance(refused, SendRefused)
    assert convert.error_code(refused) == v2.ILLEGAL_DELIVERY_TIME, refused.details()


def test_refusals_read_as_the_errors_the_servicer_maps(broker):
    too_large = _request(400)
    too_large.body = b"x" * (MAX_MESSAGE_SIZE + 1)
    no_topic = _request(401)
    no_topic.topic = "NoSuchTopicHere"
    bad_group = _request(402)
    bad_group.producer_group = "bad group!"
    results = _send_all(broker, [too_large, no_topic, bad_group])
    assert all(isinstance(r, SendRefused) for r in results), results
    assert convert.error_code(results[0]) == v2.MESSAGE_BODY_TOO_LARGE, results[0].details()
    assert "maxMessageSize" in results[0].details()
    assert convert.error_code(results[1]) == v2.TOPIC_NOT_FOUND, results[1].details()
    assert results[2].code() not in LINK_ERRORS, results[2].details()
    assert all(r.code() not in LINK_ERRORS for r in results)


def test_a_broker_that_is_not_there_is_a_link_error(broker):
    with support.HeldPort() as held:  # bound, never listening: refused at once
        [result] = _send_all(broker, [_request(500)], addr=f"127.0.0.1:{held.port}")
    assert isinstance(result, SendRefused)
    assert result.code() in LINK_ERRORS
    assert "cannot connect" in result.details()


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("remoting-proxy")
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    b = start_broker(loop, d / "b", ns.remoting_addr, brokerName="broker-r")
    support.create_topic(b.channel, TOPIC, QUEUES)
    wait_for(lambda: support.has_route(ns.stub, TOPIC), 30, "the topic's route")
    try:
        yield ns, b, loop
    finally:
        b.stop()
        ns.stop()
        loop.close()


def test_routes_name_each_brokers_rocketmq_port(cluster):
    ns, b, _ = cluster
    route = ns.stub.GetRouteInfoByTopic(
        namesrv_pb2.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=10
    )
    [data] = route.broker_datas
    assert dict(data.broker_addrs) == {0: b.addr}
    assert dict(data.remoting_addrs) == {0: b.remoting_addr}


@pytest.mark.parametrize("protocol", ["remoting", "grpc"])
def test_the_proxy_sends_over_the_protocol_it_is_told(cluster, protocol):
    ns, b, loop = cluster
    config = ProxyConfig(
        namesrv_addrs=(ns.remoting_addr,), host="127.0.0.1", port=0, broker_protocol=protocol
    )
    app = ProxyApp(config)
    loop.run(app.start())
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{app.port}")
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for i in range(5):
            message = v2.Message(topic=v2.Resource(name=TOPIC), body=f"{protocol} {i}".encode())
            message.system_properties.message_id = f"01{protocol.upper()}{i:04d}"
            message.system_properties.message_type = v2.NORMAL
            sent = stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
            assert sent.status.code == v2.OK, sent.status.message
            assert sent.entries[0].message_id == f"01{protocol.upper()}{i:04d}"
        channel.close()
        remoting = app.servicer.remoting_sends
        over_remoting = remoting.stats.messages if remoting is not None else 0
        over_grpc = app.servicer.sends.stats.messages
        assert (over_remoting, over_grpc) == ((5, 0) if protocol == "remoting" else (0, 5))
        bodies = set(support.pull_all(b.channel, TOPIC, QUEUES).values())
        assert {f"{protocol} {i}".encode() for i in range(5)} <= bodies
    finally:
        loop.run(app.stop())
