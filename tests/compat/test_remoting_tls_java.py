"""Apache RocketMQ 4.9's Java client with `tls.enable=true` (its TlsSystemConfig; test
mode, which trusts the server's certificate as RocketMQ's own tests do) produces and
consumes over TLS on both servers in the same test: Apache 4.9's name server and
broker, which serve TLS beside plaintext by default (tls.server.mode=permissive, a
self-signed certificate in test mode), and ferry's with tlsCert/tlsKey (the files of
its gRPC and HA TLS, made by the real openssl) in the same permissive mode. The topic
is created by the first send (TBW102), so nothing but the TLS client touches the
cluster; a plaintext client is served beside it on the same ports.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from ferry.runtime.tls import server_ssl_context
from tests.compat import clients
from tests.compat.remoting_backends import BACKENDS, SINGLE, start_remoting_backend
from tests.compat.specs import parametrize_cluster
from tests.compat.test_remoting_clients import producer, push_consumer, successes
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration.support import make_test_certs

pytestmark = pytest.mark.timeout(240)

TLS = ("-Dtls.enable=true", "-Dtls.test.mode.enable=true")
_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tls-{request.param}")
    if request.param == "apache":
        backend = start_remoting_backend("apache", SINGLE, d)
        try:
            yield backend
        finally:
            backend.stop()
        return
    (d / "certs").mkdir()
    certs = make_test_certs(d / "certs")
    loop = LoopThread()
    ns = start_namesrv(
        loop,
        d / "ns",
        remoting_tls=server_ssl_context(certs / "server.pem", certs / "server.key"),
    )
    broker = None
    try:
        broker = start_broker(
            loop,
            d / "store",
            f"127.0.0.1:{ns.app.remoting_port}",
            tlsCert=certs / "server.pem",
            tlsKey=certs / "server.key",
        )
        yield SimpleNamespace(name="ferry", namesrv=f"127.0.0.1:{ns.app.remoting_port}")
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()
        loop.close()


def test_a_tls_java_producer_and_consumer_beside_a_plaintext_one(cluster, tmp_path):
    topic = f"OverTls{next(_ids)}"
    sent = clients.produce(
        producer(cluster, tmp_path, "tls", topic, "sync", 6, system_properties=TLS)
    )
    assert [s["status"] for s in sent] == ["SEND_OK"] * 6, sent
    plain = clients.produce(producer(cluster, tmp_path, "plain", topic, "sync", 4))
    assert [s["status"] for s in plain] == ["SEND_OK"] * 4, plain
    consumer = push_consumer(
        cluster, tmp_path, topic, f"gTls{next(_ids)}", name="tls-consumer", system_properties=TLS
    ).start()
    want = {s["msgId"] for s in sent + plain}
    try:
        consumer.wait(
            lambda c: {e["msgId"] for e in successes(c)} >= want,
            60,
            "every message at the TLS consumer",
        )
    finally:
        consumer.stop()
