"""TLS on the proxy's port, as Apache's proxy's tlsMode: with a certificate the
port serves TLS and plaintext alike (permissive, the default: the native door
tells them apart by the first byte; behind grpcio's door a relay does,
ferry.runtime.tls_sniff), TLS only (enforcing) or plaintext only (disabled).
Every test runs on both doors. The certificate is a throwaway one made by the real
openssl (tests/integration/support.py). What the Java SDK does with TLS is
tests/compat/test_sdk5_java_parity.py's."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.runtime.tls import ServerTLS
from services.proxy.app import ProxyApp, ProxyConfig
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support

TOPIC = "TlsTopic"


class Cluster:
    """A name server and a broker in this process; proxies in front of them."""

    def __init__(self, root: Path) -> None:
        (root / "certs").mkdir()
        self.certs = support.make_test_certs(root / "certs")
        self.loop = LoopThread()
        self.ns = start_namesrv(self.loop, root / "ns", metrics_port=-1)
        self.broker = start_broker(
            self.loop, root / "store", self.ns.remoting_addr, brokerName="broker-a"
        )
        support.create_topic(self.broker.channel, TOPIC, 4)
        self.tls = ServerTLS.load(self.certs / "server.pem", self.certs / "server.key")

    def proxy(self, mode: str, tls: bool = True, door: str = "native") -> ProxyApp:
        config = ProxyConfig(
            (self.ns.remoting_addr,),
            host="127.0.0.1",
            port=0,
            grace_s=0.5,
            tls=self.tls if tls else None,
            tls_mode=mode,
            door=door,
        )
        app = ProxyApp(config)
        self.loop.run(app.start())
        return app

    def close(self) -> None:
        self.broker.stop()
        self.ns.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("proxy-tls"))
    yield c
    c.close()


@pytest.fixture(params=["native", "grpcio"])
def door(request) -> str:
    return request.param


@pytest.fixture
def proxy_in(cluster, door) -> Iterator:
    started: list[ProxyApp] = []

    def start(mode: str, tls: bool = True) -> ProxyApp:
        started.append(cluster.proxy(mode, tls, door))
        return started[-1]

    yield start
    for app in started:
        cluster.loop.run(app.stop())


def tls_channel(cluster: Cluster, port: int) -> grpc.Channel:
    ca = (cluster.certs / "ca.pem").read_bytes()
    return grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca))


def plain_channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{port}")


def healthy(channel: grpc.Channel) -> bool:
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return answer.status == health_pb2.HealthCheckResponse.SERVING


def route_and_send(channel: grpc.Channel, body: bytes) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    route = stub.QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10)
    assert route.status.code == v2.OK, route.status
    assert {q.broker.name for q in route.message_queues} == {"broker-a"}
    message = v2.Message(topic=v2.Resource(name=TOPIC), body=body)
    message.system_properties.message_id = "01" + body.hex().upper()
    message.system_properties.body_encoding = v2.IDENTITY
    sent = stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
    assert [e.status.code for e in sent.entries] == [v2.OK], sent


def refused(channel: grpc.Channel) -> bool:
    try:
        healthy(channel)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def test_permissive_serves_tls_and_plaintext_on_one_port(cluster, proxy_in):
    app = proxy_in("permissive")
    with tls_channel(cluster, app.port) as secure, plain_channel(app.port) as plain:
        assert healthy(secure) and healthy(plain)
        route_and_send(secure, b"over tls")
        route_and_send(plain, b"in plaintext")
    if app.config.door == "native":
        stats = app.server._server.stats()
        assert stats["tls_connections"] >= 1, stats
        assert stats["connections"] - stats["tls_connections"] >= 1, stats
    else:
        relayed = app.server._relay.relayed
        assert relayed[True] >= 1 and relayed[False] >= 1, relayed


def test_the_python_sdk_sends_in_plaintext_through_a_permissive_port(cluster, proxy_in):
    app = proxy_in("permissive")
    config = ClientConfiguration(f"127.0.0.1:{app.port}", Credentials(), request_timeout=10)
    producer = Producer(config, (TOPIC,))
    producer.startup()
    try:
        m = Message()
        m.topic, m.body, m.tag = TOPIC, b"sdk", "t"
        assert producer.send(m).message_id
    finally:
        producer.shutdown()


def test_a_large_message_and_many_calls_cross_the_relay(cluster, proxy_in):
    """Flow control: requests larger than the relay's buffers, many calls on
    one connection and several connections at once."""
    app = proxy_in("permissive")
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            with tls_channel(cluster, app.port) as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                for j in range(10):
                    batch = []
                    for k in range(8):  # 8 bodies of 60 kB: past the relay's 256 KiB buffers
                        message = v2.Message(topic=v2.Resource(name=TOPIC), body=bytes(60_000))
                        message.system_properties.message_id = f"01{i:04X}{j:04X}{k:04X}"
                        message.system_properties.body_encoding = v2.IDENTITY
                        batch.append(message)
                    sent = stub.SendMessage(s.SendMessageRequest(messages=batch), timeout=30)
                    assert [e.status.code for e in sent.entries] == [v2.OK] * 8, sent
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_a_connection_that_says_nothing_is_closed_when_the_proxy_stops(cluster, door):
    app = cluster.proxy("permissive", door=door)
    idle = socket.create_connection(("127.0.0.1", app.port), timeout=10)
    with idle, plain_channel(app.port) as plain:
        assert healthy(plain)
        cluster.loop.run(app.stop())
        assert idle.recv(1) == b""  # closed, not left hanging


def test_enforcing_refuses_plaintext(cluster, proxy_in):
    app = proxy_in("enforcing")
    with tls_channel(cluster, app.port) as secure, plain_channel(app.port) as plain:
        route_and_send(secure, b"enforced")
        assert refused(plain)


def test_disabled_refuses_tls(cluster, proxy_in):
    app = proxy_in("disabled")
    with tls_channel(cluster, app.port) as secure, plain_channel(app.port) as plain:
        route_and_send(plain, b"disabled")
        assert refused(secure)


def test_without_a_certificate_no_relay_runs(cluster, proxy_in):
    app = proxy_in("permissive", tls=False)
    assert app.server._relay is None
    if app.config.door == "native":
        assert app.server._server.stats()["tls_connections"] == 0
    with tls_channel(cluster, app.port) as secure, plain_channel(app.port) as plain:
        assert healthy(plain)
        assert refused(secure)
