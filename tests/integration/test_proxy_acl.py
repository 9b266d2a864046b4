"""The proxy with `--acl-file`: the official RocketMQ 5 Python SDK (rocketmq-python-client
5.1.2) meets the plain_acl.yml the brokers use (tests/compat/acl_probe.py's ACL_YAML). A
producer whose key has PUB on the topic sends; with a wrong secret it is refused
(UNAUTHORIZED); a key without PUB on the topic is refused (FORBIDDEN, naming the missing
permission); a consumer whose key has SUB on topic and group receives. The broker behind
has `aclEnable=true` with the same file (its topics are created with the admin key, signed
as the SDKs sign). The proxy's log names the refusals and holds no secret key.

A name server and a broker in this process, the proxy as its own process."""

from __future__ import annotations

import grpc
import pytest
import yaml
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.v5.exception import ForbiddenException, UnauthorizedException
from rocketmq.v5.util.messaging_result_checker import MessagingResultChecker
from rocketmq.v5.util.signature import Signature

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2, service_pb2_grpc
from ferry.client.broker import BrokerClient
from ferry.runtime import auth as ferry_auth
from ferry.v1 import common_pb2
from services.proxy import auth
from tests.compat.acl_probe import ACL_YAML, ADMIN, PUB, SUB
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "AclTopicA"  # PUB: PUB, SUB: SUB
SUB_ONLY = "AclTopicB"  # PUB's key has SUB only
GROUP = "AclGroupA"  # SUB on it: both keys
WRONG = (PUB[0], "not-the-secret")


class Cluster:
    def __init__(self, endpoint: str, channel: grpc.Channel, proxy, broker) -> None:
        self.endpoint, self.channel, self.proxy, self.broker = endpoint, channel, proxy, broker
        self.namesrv_addr = ""
        self.acl_file = None
        self.stub = service_pb2_grpc.MessagingServiceStub(channel)

    def config(self, key: tuple[str, str]) -> ClientConfiguration:
        return ClientConfiguration(self.endpoint, Credentials(*key), request_timeout=10)

    def signed(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        """The metadata the SDK sends with each request, from the SDK's own signer."""
        return Signature.metadata(self.config(key), "acl-test-client")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("proxy-acl")
    acl_file = d / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    broker = start_broker(loop, d / "broker", ns.remoting_addr, aclEnable="true", aclFile=acl_file)
    env = support.child_env()
    for name in (auth.ENV_ACCESS_KEY, auth.ENV_SECRET_KEY, auth.ENV_ACL_FILE):
        env.pop(name, None)
    proxy = support.ProxyProcess(d, ns.remoting_addr, ["--acl-file", str(acl_file)], env)
    try:
        admin = ferry_auth.AdminCredentials(access_key=ADMIN[0], secret_key=ADMIN[1])
        with BrokerClient(broker.addr, admin_token=admin) as client:
            for topic in (TOPIC, SUB_ONLY):
                client.update_topic(
                    common_pb2.TopicConfig(
                        topic_name=topic, read_queue_nums=2, write_queue_nums=2, perm=6
                    )
                )
        for topic in (TOPIC, SUB_ONLY):
            wait_for(
                lambda t=topic: support.route_queue_datas(ns.stub, t) > 0,
                30,
                f"{topic} in the name server's route",
            )
        channel = grpc.insecure_channel(proxy.endpoint)
        c = Cluster(proxy.endpoint, channel, proxy, broker)
        c.namesrv_addr, c.acl_file = ns.remoting_addr, acl_file
        yield c
        channel.close()
    finally:
        proxy.stop()
        broker.stop()
        ns.stop()
        loop.close()


def _message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def test_pub_key_sends_and_sub_key_receives(cluster):
    producer = Producer(cluster.config(PUB), (TOPIC,))
    producer.startup()
    consumer = SimpleConsumer(cluster.config(SUB), GROUP, {TOPIC: FilterExpression()}, 2)
    consumer.startup()
    try:
        sent = {producer.send(_message(TOPIC, f"acl {i}".encode())).message_id for i in range(5)}
        got = {}

        def received_all() -> bool:
            for m in consumer.receive(32, 30):
                got[m.message_id] = m.body
                consumer.ack(m)
            return len(got) >= len(sent)

        wait_for(received_all, 60, lambda: f"{len(sent)} messages ({len(got)} so far)",
                 interval_s=0)  # fmt: skip
        assert set(got) == sent
        assert sorted(got.values()) == [f"acl {i}".encode() for i in range(5)]
    finally:
        consumer.shutdown()
        producer.shutdown()
    # The broker's RocketMQ port checks its ACL and this proxy has no account to sign
    # with: its sends went to the broker's ferry.v1 port instead, said once.
    assert cluster.proxy.log().count("refuses unsigned RocketMQ-protocol sends") == 1


def test_a_proxy_with_a_broker_account_signs_its_rocketmq_protocol_sends(cluster, tmp_path):
    env = support.child_env()
    for name in (auth.ENV_ACCESS_KEY, auth.ENV_SECRET_KEY, auth.ENV_ACL_FILE):
        env.pop(name, None)
    env["FERRY_PROXY_BROKER_SECRET_KEY"] = ADMIN[1]
    ns_addr = cluster.namesrv_addr
    proxy = support.ProxyProcess(
        tmp_path, ns_addr, ["--acl-file", str(cluster.acl_file), "--broker-access-key", ADMIN[0]],
        env,
    )  # fmt: skip
    try:
        with grpc.insecure_channel(proxy.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            for i in range(3):
                message = v2.Message(topic=v2.Resource(name=TOPIC), body=f"signed {i}".encode())
                message.system_properties.message_id = f"01SIGNEDBYPROXY{i:04d}"
                message.system_properties.message_type = v2.NORMAL
                response = stub.SendMessage(
                    service_pb2.SendMessageRequest(messages=[message]),
                    metadata=cluster.signed(PUB),
                    timeout=10,
                )
                assert response.status.code == v2.OK, response.status.message
    finally:
        proxy.stop()
    log = proxy.log()
    assert "sends over RocketMQ's protocol: 3 messages" in log, log[-3000:]
    assert "refuses unsigned" not in log


def test_a_wrong_secret_is_unauthorized(cluster):
    producer = Producer(cluster.config(WRONG), (TOPIC,))
    producer.startup()
    try:
        # The SDK's route query is refused: it reports the route as missing.
        with pytest.raises(Exception, match=f"failed to fetch topic:{TOPIC} route"):
            producer.send(_message(TOPIC, b"refused"))
    finally:
        producer.shutdown()
    response = cluster.stub.SendMessage(
        service_pb2.SendMessageRequest(
            messages=[v2.Message(topic=v2.Resource(name=TOPIC), body=b"x")]
        ),
        metadata=cluster.signed(WRONG),
        timeout=10,
    )
    assert response.status.code == v2.UNAUTHORIZED
    assert 'bad signature for access key "aclprobe-pub"' in response.status.message
    with pytest.raises(UnauthorizedException):
        MessagingResultChecker.check(response.status)


def test_a_key_without_pub_on_the_topic_is_forbidden(cluster):
    producer = Producer(cluster.config(PUB), (SUB_ONLY,))
    producer.startup()
    try:
        with pytest.raises(ForbiddenException, match='lacks PUB on topic "AclTopicB"'):
            producer.send(_message(SUB_ONLY, b"refused"))
    finally:
        producer.shutdown()
    response = cluster.stub.SendMessage(
        service_pb2.SendMessageRequest(
            messages=[v2.Message(topic=v2.Resource(name=SUB_ONLY), body=b"x")]
        ),
        metadata=cluster.signed(PUB),
        timeout=10,
    )
    assert response.status.code == v2.FORBIDDEN
    assert response.status.message.startswith(
        'No permission: access key "aclprobe-pub" lacks PUB on topic "AclTopicB"'
    )
    assert 'topicPerms entry "AclTopicB=SUB" grants no PUB' in response.status.message


def test_a_receive_without_sub_on_the_group_is_forbidden(cluster):
    request = service_pb2.ReceiveMessageRequest(
        group=v2.Resource(name="AclGroupB"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
    )
    (answer,) = list(cluster.stub.ReceiveMessage(request, metadata=cluster.signed(SUB)))
    assert answer.status.code == v2.FORBIDDEN
    assert 'lacks SUB on group "AclGroupB"' in answer.status.message


def test_telemetry_settings_are_checked(cluster):
    settings = v2.Settings(
        client_type=v2.PRODUCER,
        publishing=v2.Publishing(topics=[v2.Resource(name=SUB_ONLY)]),
    )
    commands = list(
        cluster.stub.Telemetry(
            iter([service_pb2.TelemetryCommand(settings=settings)]),
            metadata=cluster.signed(PUB),
            timeout=10,
        )
    )
    assert [c.status.code for c in commands] == [v2.FORBIDDEN]
    settings.publishing.topics[0].name = TOPIC
    commands = list(
        cluster.stub.Telemetry(
            iter([service_pb2.TelemetryCommand(settings=settings)]),
            metadata=cluster.signed(PUB),
            timeout=10,
        )
    )
    assert [c.status.code for c in commands] == [v2.OK]


def test_the_route_needs_pub_or_sub(cluster):
    def route(topic: str, key) -> int:
        request = service_pb2.QueryRouteRequest(topic=v2.Resource(name=topic))
        return cluster.stub.QueryRoute(
            request, metadata=cluster.signed(key), timeout=10
        ).status.code

    assert route(SUB_ONLY, PUB) == v2.OK  # SUB is enough
    assert route(SUB_ONLY, SUB) == v2.FORBIDDEN  # defaultTopicPerm: DENY
    assert route(TOPIC, SUB) == v2.OK


def test_no_log_line_holds_a_secret_key(cluster):
    """Runs after the refusals above (tests run in file order)."""
    secrets = [a["secretKey"] for a in yaml.safe_load(ACL_YAML)["accounts"]] + [WRONG[1]]
    proxy_log = cluster.proxy.log()
    assert "ACL refused" in proxy_log  # the refusals above are there
    for secret in secrets:
        assert secret not in proxy_log, f"a secret key is in {cluster.proxy.log_path}"


def test_a_brokers_local_proxy_checks_the_same_file(tmp_path, loop_thread):
    """enableProxy=true with aclEnable: the broker's own apache.rocketmq.v2 door is checked
    against its aclFile too."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    broker = start_broker(
        loop_thread, tmp_path / "broker", aclEnable="true", aclFile=acl_file, enableProxy="true"
    )
    try:
        stub = service_pb2_grpc.MessagingServiceStub(broker.channel)
        request = service_pb2.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
        assert stub.QueryRoute(request, timeout=10).status.code == v2.UNAUTHORIZED
        config = ClientConfiguration(broker.addr, Credentials(*SUB), request_timeout=10)
        signed = Signature.metadata(config, "acl-test-client")
        request = service_pb2.QueryRouteRequest(topic=v2.Resource(name=SUB_ONLY))
        answer = stub.QueryRoute(request, metadata=signed, timeout=10)
        assert answer.status.code == v2.FORBIDDEN
        assert 'lacks PUB or SUB on topic "AclTopicB"' in answer.status.message
    finally:
        broker.stop()
