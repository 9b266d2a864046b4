"""The proxy with an access key and secret key: the official RocketMQ 5 Python
SDK (rocketmq-python-client 5.1.2) signs its requests and gets through; with a
wrong secret or no credentials it is refused with the v2 status UNAUTHORIZED;
health and reflection answer without credentials. A name server and a broker
in this process, the proxy as its own process (access key as a flag, secret
key from the environment, as an operator keeps it out of the process list)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.v5.exception import UnauthorizedException
from rocketmq.v5.util.messaging_result_checker import MessagingResultChecker
from rocketmq.v5.util.signature import Signature

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2, service_pb2_grpc
from services.proxy import auth
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
TOPIC = "AuthTopic"
AK, SK = "ferry-ak", "ferry-sk-0123456789"
SDK_LOGGER = "rocketmq-python-client"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("proxy-auth")
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    broker = start_broker(loop, d / "broker-a", ns.remoting_addr, brokerName="broker-a")
    env = support.child_env()
    env.pop(auth.ENV_ACCESS_KEY, None)
    env[auth.ENV_SECRET_KEY] = SK
    proxy = support.ProxyProcess(d, ns.remoting_addr, ["--access-key", AK], env)
    try:
        endpoint = proxy.endpoint
        support.create_topic(broker.channel, TOPIC, 4)
        wait_for(
            lambda: support.route_queue_datas(ns.stub, TOPIC) > 0,
            30,
            f"{TOPIC} in the name server's route",
        )
        channel = grpc.insecure_channel(endpoint)
        c = Cluster(endpoint, channel, proxy.log_path)
        c.metrics_url = proxy.metrics_url
        yield c
        channel.close()
    finally:
        proxy.stop()
        broker.stop()
        ns.stop()
        loop.close()


class Cluster:
    def __init__(self, endpoint: str, channel: grpc.Channel, proxy_log: Path) -> None:
        self.endpoint, self.channel, self.proxy_log = endpoint, channel, proxy_log
        self.stub = service_pb2_grpc.MessagingServiceStub(channel)

    def config(self, credentials: Credentials) -> ClientConfiguration:
        return ClientConfiguration(self.endpoint, credentials, request_timeout=10)

    def signed(self, credentials: Credentials) -> list[tuple[str, str]]:
        """The metadata the SDK sends with each request, from the SDK's own signer."""
        return Signature.metadata(self.config(credentials), "auth-test-client")


def _message(body: bytes) -> Message:
    m = Message()
    m.topic = TOPIC
    m.body = body
    return m


class _Records(logging.Handler):
    """What the SDK writes to its log file (~/logs/rocketmq_python), kept in memory."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> _Records:
        logging.getLogger(SDK_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(SDK_LOGGER).removeHandler(self)


def _refused_send(cluster, credentials: Credentials) -> list[str]:
    """Send through the SDK's public API with `credentials`; the SDK's log lines."""
    with _Records() as records:
        producer = Producer(cluster.config(credentials), (TOPIC,))
        producer.startup()
        try:
            # The SDK logs the route's refusal and reports the route as missing.
            with pytest.raises(Exception, match=f"failed to fetch topic:{TOPIC} route"):
                producer.send(_message(b"refused"))
        finally:
            producer.shutdown()
    return records.lines


def test_the_sdks_signature_is_the_one_the_proxy_computes():
    date_time = "20261105T101500Z"
    assert auth.sign(SK, date_time) == Signature.sign(SK, date_time)
    header = dict(Signature.metadata(ClientConfiguration("127.0.0.1:1", Credentials(AK, SK)), "c"))
    parsed = auth.parse_authorization(header["authorization"])
    assert (parsed.algorithm, parsed.access_key, parsed.signed_headers) == (
        "MQv2-HMAC-SHA1",
        AK,
        ("x-mq-date-time",),
    )
    assert auth.refusal_reason(AK, SK, header) is None
    assert "bad signature" in auth.refusal_reason(AK, "other", header)


def test_signed_sdk_sends_and_receives(cluster):
    creds = Credentials(AK, SK)
    producer = Producer(cluster.config(creds), (TOPIC,))
    producer.startup()
    consumer = SimpleConsumer(cluster.config(creds), "auth-group", {TOPIC: FilterExpression()}, 2)
    consumer.startup()
    try:
        sent = {producer.send(_message(f"signed {i}".encode())).message_id for i in range(5)}
        got = {}

        def received_all() -> bool:
            for m in consumer.receive(32, 30):
                got[m.message_id] = m.body
                consumer.ack(m)
            return len(got) >= len(sent)

        wait_for(received_all, 60, lambda: f"{len(sent)} messages ({len(got)} so far)",
                 interval_s=0)  # fmt: skip
        assert set(got) == sent
        assert sorted(got.values()) == [f"signed {i}".encode() for i in range(5)]
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_wrong_secret_key_is_refused_as_unauthorized(cluster):
    lines = _refused_send(cluster, Credentials(AK, "not-the-secret"))
    refusals = [line for line in lines if "40100" in line and "bad signature" in line]
    assert refusals, lines  # e.g. "query topic raise exception, 40100, bad signature for ..."
    assert "secret key" in refusals[0]
    # The same refusal on a send: the SDK's result check raises its UnauthorizedException.
    response = cluster.stub.SendMessage(
        service_pb2.SendMessageRequest(),
        metadata=cluster.signed(Credentials(AK, "not-the-secret")),
        timeout=10,
    )
    assert response.status.code == v2.UNAUTHORIZED
    with pytest.raises(UnauthorizedException, match="bad signature for access key 'ferry-ak'"):
        MessagingResultChecker.check(response.status)


def test_no_credentials_are_refused(cluster):
    lines = _refused_send(cluster, Credentials())
    assert any("40100" in line and "names no access key" in line for line in lines), lines
    response = cluster.stub.QueryRoute(
        service_pb2.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10
    )  # no metadata at all, as a hand-written client might send
    assert response.status.code == v2.UNAUTHORIZED
    assert "no 'authorization' metadata" in response.status.message
    assert "Credentials(access_key, secret_key)" in response.status.message  # what to do
    assert not response.message_queues


def test_unknown_access_key_is_refused(cluster):
    response = cluster.stub.Heartbeat(
        service_pb2.HeartbeatRequest(), metadata=cluster.signed(Credentials("other-ak", SK))
    )
    assert response.status.code == v2.UNAUTHORIZED
    assert "access key 'other-ak' is unknown" in response.status.message
    wait_for(
        lambda: (
            "refused /apache.rocketmq.v2.MessagingService/Heartbeat"
            in cluster.proxy_log.read_text()
        ),
        10,
        "the proxy to log the refusal",
    )


def test_streaming_calls_are_refused_with_one_status(cluster):
    bad = cluster.signed(Credentials(AK, "not-the-secret"))
    received = list(
        cluster.stub.ReceiveMessage(service_pb2.ReceiveMessageRequest(), metadata=bad, timeout=10)
    )
    assert [r.WhichOneof("content") for r in received] == ["status"]
    assert received[0].status.code == v2.UNAUTHORIZED
    commands = list(
        cluster.stub.Telemetry(iter([service_pb2.TelemetryCommand()]), metadata=bad, timeout=10)
    )
    assert [c.status.code for c in commands] == [v2.UNAUTHORIZED]


def test_refusals_are_counted_by_rpc_with_the_code_unauthorized(cluster):
    def count(rpc: str) -> float:
        text = support.scrape(cluster.metrics_url)
        labels = f'code="UNAUTHORIZED",rpc="{rpc}"'
        return support.sample(text, "ferry_proxy_requests_total", labels) or 0

    routes, receives = count("QueryRoute"), count("ReceiveMessage")
    response = cluster.stub.QueryRoute(
        service_pb2.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10
    )
    assert response.status.code == v2.UNAUTHORIZED
    bad = cluster.signed(Credentials(AK, "not-the-secret"))
    for _ in range(2):
        list(cluster.stub.ReceiveMessage(service_pb2.ReceiveMessageRequest(), metadata=bad))
    assert (count("QueryRoute"), count("ReceiveMessage")) == (routes + 1, receives + 2)


def test_health_and_reflection_answer_without_credentials(cluster):
    health = health_pb2_grpc.HealthStub(cluster.channel)
    for service in ("", "apache.rocketmq.v2.MessagingService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(cluster.channel)
    (answer,) = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = {s.name for s in answer.list_services_response.service}
    assert "apache.rocketmq.v2.MessagingService" in names


def test_an_access_key_without_a_secret_key_does_not_start(tmp_path):
    env = support.child_env()
    env.pop(auth.ENV_SECRET_KEY, None)
    env.pop(auth.ENV_ACCESS_KEY, None)
    done = subprocess.run(
        [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", "0",
         "--access-key", AK],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "access key and secret key go together" in done.stderr + done.stdout
