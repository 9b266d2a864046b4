"""RocketMQ's proxy in local mode: a broker with `enableProxy=true` serves
`apache.rocketmq.v2.MessagingService` on its native door (grpcServerPort) and its
own gRPC port, backed by itself, with no name server anywhere. The official Python
SDK is pointed at both; raw v2 calls check routes, a broker without the key, a slave
and TLS (where the broker calls its own port over TLS). Sends go to the broker's
RocketMQ-protocol send door's own steps in-process (InProcessSends: no header, no
answer to encode), pops and acks to its RocketMQ-protocol handlers in-process
(ferry.remoting.local), with no socket; the rest over its own ferry.v1 port."""

from __future__ import annotations

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command
from ferry.runtime.errors import ConfigError
from ferry.runtime.tls import ClientTLS
from ferry.v1 import broker_pb2
from services.broker.config import load_config
from services.proxy import remoting_sends
from services.proxy.remoting_pops import PopHandle
from tests.conftest import LoopThread, start_broker
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "LocalTopic"
BROKER = "broker-local"
V2_SERVICE = "apache.rocketmq.v2.MessagingService"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    loop = LoopThread()
    b = start_broker(
        loop,
        tmp_path_factory.mktemp("local") / "b",
        enableProxy="true",
        brokerName=BROKER,
        enableMixedMessageType="true",
    )
    support.create_topic(b.channel, TOPIC, 4)
    try:
        yield b
    finally:
        b.stop()
        loop.close()


def _v2(channel: grpc.Channel) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(channel)


def _query_route(channel: grpc.Channel, topic: str) -> s.QueryRouteResponse:
    return _v2(channel).QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=10)


def _services(channel: grpc.Channel) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    return {svc.name for a in answers for svc in a.list_services_response.service}


def _message(topic: str, body: bytes, tag: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = tag
    return m


@pytest.mark.parametrize("door", ["native", "grpcListenPort"])
def test_the_sdk_sends_and_receives_through_the_broker_itself(broker, door):
    """On grpcServerPort (the native door, as RocketMQ's proxy's 8081) and on the
    broker's ferry.v1 port (grpcio), the one servicer behind both."""
    endpoint = f"127.0.0.1:{broker.app.proxy_port}" if door == "native" else broker.addr
    connections = broker.app.proxy_door.door_stats()["connections"]
    topic = f"{TOPIC}-{door}"
    support.create_topic(broker.channel, topic, 4)
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    consumer = SimpleConsumer(config, "local-group", {topic: FilterExpression("*")}, 2)
    consumer.startup()
    try:
        sent = {}
        for i in range(10):
            receipt = producer.send(_message(topic, f"local {i}".encode(), f"Tag{i % 2}"))
            sent[receipt.message_id] = i
        got = []

        def received_all() -> bool:
            for m in consumer.receive(32, 30):
                got.append(m)
                consumer.ack(m)
            return len(got) >= 10

        wait_for(received_all, 60, lambda: f"10 messages ({len(got)} so far)", interval_s=0)
        assert sorted(m.message_id for m in got) == sorted(sent), "not every message arrived"
        for m in got:
            i = sent[m.message_id]
            assert (m.body, m.tag, m.delivery_attempt) == (f"local {i}".encode(), f"Tag{i % 2}", 1)
        assert consumer.receive(32, 30) == []  # all acknowledged: nothing comes back
        # Sent, popped and acknowledged through the broker's RocketMQ-protocol handlers,
        # in-process: the handles are Apache-form, and nothing dialled the broker's port.
        assert all(PopHandle.decode(m.receipt_handle) is not None for m in got)
        assert broker.app.proxy.remoting_sends.stats.messages >= 10
        assert broker.app.proxy.remoting_sends.stats.in_process >= 10
        assert not broker.app.remoting.connections
        opened = broker.app.proxy_door.door_stats()["connections"] - connections
        assert opened > 0 if door == "native" else opened == 0
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_routes_come_from_the_brokers_own_topic_table(broker):
    route = _query_route(broker.channel, TOPIC)
    assert route.status.code == v2.OK, route.status.message
    port = broker.app.proxy_port
    assert [(q.id, q.permission, q.broker.name) for q in route.message_queues] == [
        (i, v2.READ_WRITE, BROKER) for i in range(4)
    ]
    # Asked without endpoints, the route names the broker's advertised address and
    # its SDK door's port (grpcServerPort), where RocketMQ's proxy sends its SDKs.
    assert {
        (a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses
    } == {("127.0.0.1", port)}
    missing = _query_route(broker.channel, "NoSuchTopic")
    assert missing.status.code == v2.TOPIC_NOT_FOUND
    assert missing.status.message.startswith(  # as RocketMQ's proxy, in local mode too
        "CODE: 17  DESC: No topic route info in name server for the topic: NoSuchTopic\n"
    )
    # Listed by reflection, beside the broker's own services.
    assert {V2_SERVICE, "ferry.v1.Broker"} <= _services(broker.channel)


def test_routes_and_sends_follow_the_topics_message_type(broker):
    """The topic table's message.type, read at every call: what a route accepts
    and what a send may be; MIXED (enableMixedMessageType) takes every type."""
    support.create_topic(broker.channel, "LocalDelay", 2, message_type="DELAY")
    support.create_topic(broker.channel, "LocalMixed", 2, message_type="MIXED")
    accepted = {
        topic: {
            tuple(q.accept_message_types)
            for q in _query_route(broker.channel, topic).message_queues
        }
        for topic in (TOPIC, "LocalDelay", "LocalMixed")
    }
    assert accepted == {
        TOPIC: {(v2.NORMAL,)},
        "LocalDelay": {(v2.DELAY,)},
        "LocalMixed": {(v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)},
    }

    def send(topic: str, message_type: int) -> v2.Status:
        message = v2.Message(topic=v2.Resource(name=topic), body=b"x")
        message.system_properties.message_id = f"01LOCALTYPE{message_type}"
        message.system_properties.message_type = message_type
        request = s.SendMessageRequest(messages=[message])
        return _v2(broker.channel).SendMessage(request, timeout=10).status

    refused = send("LocalDelay", v2.NORMAL)
    assert (refused.code, refused.message) == (
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        "TopicMessageType validate failed, the expected type is DELAY, but actual type is NORMAL",
    )
    assert send("LocalMixed", v2.NORMAL).code == v2.OK
    assert send("LocalMixed", v2.TRANSACTION).code == v2.OK  # a half message, never ended


def test_without_the_type_check_any_type_goes_and_the_sdks_are_told_not_to_check(tmp_path):
    """enableTopicMessageTypeCheck=false, as RocketMQ's proxy with the key off:
    sends of any type are taken and producers' settings say not to validate."""
    loop = LoopThread()
    b = start_broker(loop, tmp_path / "b", enableProxy="true", enableTopicMessageTypeCheck="false")
    try:
        support.create_topic(b.channel, TOPIC, 1)  # NORMAL
        message = v2.Message(topic=v2.Resource(name=TOPIC), body=b"fifo")
        message.system_properties.message_id = "01UNCHECKED"
        message.system_properties.message_group = "g"
        sent = _v2(b.channel).SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
        assert sent.status.code == v2.OK, sent.status.message
        hello = s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER))
        answer = next(iter(_v2(b.channel).Telemetry(iter([hello]), timeout=10)))
        assert answer.settings.publishing.validate_message_type is False
    finally:
        b.stop()
        loop.close()


def test_a_broker_without_enable_proxy_does_not_serve_the_v2_api(tmp_path):
    loop = LoopThread()
    plain = start_broker(loop, tmp_path / "plain")
    try:
        support.create_topic(plain.channel, TOPIC, 1)
        with pytest.raises(grpc.RpcError) as caught:
            _query_route(plain.channel, TOPIC)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert V2_SERVICE not in _services(plain.channel)
    finally:
        plain.stop()
        loop.close()


def test_a_slave_with_enable_proxy_does_not_serve_the_v2_api(tmp_path):
    loop = LoopThread()
    master = start_broker(loop, tmp_path / "m", enableProxy="true", brokerName=BROKER)
    slave = None
    try:
        slave = start_broker(
            loop, tmp_path / "s", enableProxy="true", brokerName=BROKER, brokerRole="SLAVE",
            brokerId=1, haMasterAddress=f"127.0.0.1:{master.app.ha_master.port}",
        )  # fmt: skip
        support.create_topic(master.channel, TOPIC, 1)
        assert _query_route(master.channel, TOPIC).status.code == v2.OK
        with pytest.raises(grpc.RpcError) as caught:
            _query_route(slave.channel, TOPIC)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert (master.app.proxy_port > 0, slave.app.proxy_port) == (True, -1)
    finally:
        if slave is not None:
            slave.stop()
        master.stop()
        loop.close()


def test_a_tls_broker_calls_its_own_port_over_mutual_tls(tmp_path):
    certs = support.make_test_certs(tmp_path)
    c = lambda name: str(certs / name)  # noqa: E731
    loop = LoopThread()
    b = start_broker(
        loop, tmp_path / "b", enableProxy="true", brokerName=BROKER, tlsCert=c("server.pem"),
        tlsKey=c("server.key"), tlsClientCa=c("ca.pem"), tlsCa=c("ca.pem"),
    )  # fmt: skip
    b.channel.close()
    client = ClientTLS.load(c("ca.pem"), c("client.pem"), c("client.key"))
    channel = grpc.secure_channel(b.addr, client.credentials())
    try:
        support.create_topic(channel, TOPIC, 1)
        message = v2.Message(topic=v2.Resource(name=TOPIC), body=b"over tls")
        message.system_properties.message_id = "01TLS"
        message.system_properties.tag = "T"
        sent = _v2(channel).SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
        assert sent.status.code == v2.OK, sent.status.message
        assert [(e.status.code, e.message_id) for e in sent.entries] == [(v2.OK, "01TLS")]
        # The SDKs' door, as RocketMQ's proxy: TLS without a client certificate, and
        # plaintext, on the one port.
        door = f"127.0.0.1:{b.app.proxy_port}"
        server_only = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        over = {
            "tls": grpc.secure_channel(
                door, server_only, options=[("grpc.ssl_target_name_override", "localhost")]
            ),
            "plaintext": grpc.insecure_channel(door),
        }
        for kind, door_channel in over.items():
            message.system_properties.message_id = f"01DOOR{kind.upper()}"
            with door_channel:
                answer = _v2(door_channel).SendMessage(
                    s.SendMessageRequest(messages=[message]), timeout=10
                )
            assert answer.status.code == v2.OK, (kind, answer.status.message)
        assert b.app.proxy_door.door_stats()["tls_connections"] >= 1
    finally:
        channel.close()
        loop.run(b.app.stop())
        loop.close()


def test_the_sdk_door_port_is_rocketmqs_8081_unless_told():
    def port(*keys: str) -> int:
        return load_config(None, ["enableProxy=true", *keys], env={})[0].grpc_server_port

    assert port() == 8081
    assert port("listenPort=0") == 0  # free ports everywhere: a free one here too
    assert port("grpcServerPort=-1") == -1
    with pytest.raises(ConfigError, match="grpcServerPort"):
        load_config(None, ["enableProxy=true", "grpcServerPort=10911"], env={})  # listenPort's


def test_a_tls_broker_needs_tls_ca_to_call_itself(tmp_path):
    keys = ["enableProxy=true", "tlsCert=c.pem", "tlsKey=k.pem"]
    with pytest.raises(ConfigError, match="enableProxy"):
        load_config(None, keys, env={})
    config, _ = load_config(None, [*keys, "tlsCa=ca.pem"], env={})
    assert config.enable_proxy


def test_the_in_process_send_door_answers_as_the_brokers_socket_does(broker):
    """A send the local-mode proxy makes in-process (InProcessSends) gets the code and
    remark the broker's RocketMQ-protocol port gives the same SEND_MESSAGE_V2 over a
    socket, taken or refused, and its stored message reads back the same."""
    app = broker.app
    door = app.proxy.remoting_sends._local[app.remoting_addr]
    cases = {
        "stored": (TOPIC, {"KEYS": "k1", "TAGS": "t"}, b"twin"),
        "unknown topic": ("NoSuchTopicHere", {}, b"x"),
        "too large": (TOPIC, {}, b"x" * (app.config.max_message_size + 1)),
        "bad delay": (TOPIC, {"DELAY": "soon"}, b"x"),
    }

    async def both(topic, properties, body):
        code, remark, outcome = await door.send("DEFAULT_PRODUCER", topic, dict(properties),
                                                body, 1_700_000_000_000, 0, 10.0)  # fmt: skip
        ext = remoting_sends.header(
            broker_pb2.SendMessageRequest(topic=topic, body=body, properties=properties),
            "DEFAULT_PRODUCER",
        )
        ext["g"] = "1700000000000"
        client = await RemotingClient.connect(app.remoting_addr, timeout=5)
        try:
            answer = await client.request(Command(codes.SEND_MESSAGE_V2, ext=ext, body=body), 10)
        finally:
            client.close()
        return (code, remark, outcome), answer

    for name, case in cases.items():
        (code, remark, outcome), answer = broker.loop.run(both(*case))
        assert (code, remark) == (answer.code, answer.remark or ""), name
        if name == "stored":
            assert code == codes.SUCCESS and outcome is not None
            here = broker.loop.run(app.store.read_full(outcome.commit_offset))
            there = broker.loop.run(app.store.read_full(int(answer.ext["msgId"][-16:], 16)))
            assert here is not None and there is not None
            alike = ("topic", "body", "properties", "flag", "sys_flag", "born_timestamp")
            assert [getattr(here, f) for f in alike] == [getattr(there, f) for f in alike]
        else:
            assert code != codes.SUCCESS and outcome is None, name
    # What the wire cannot carry, the door refuses, storing nothing.
    code, remark, outcome = broker.loop.run(
        door.send("DEFAULT_PRODUCER", TOPIC, {"a": "b\x02c"}, b"x", 1, 0, 10.0)
    )
    assert (code, outcome) == (codes.MESSAGE_ILLEGAL, None) and "separator" in remark
