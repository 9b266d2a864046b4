"""A TLS cluster with certificates made in the test (by the real openssl): a
name server and a SYNC_MASTER with its slave, all requiring client
certificates. Brokers register and the slave syncs its master's metadata over
mutual TLS; `ferry` commands and grpcurl work with the CA and a client
certificate; a plaintext client and a TLS client without a certificate get
nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.runtime.tls import ClientTLS, ServerTLS
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from tests.conftest import start_broker, start_namesrv
from tests.integration.support import grpcurl_path, make_test_certs, run_ferry
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def test_a_mutual_tls_cluster(loop_thread, tmp_path, certs):
    c = lambda name: str(certs / name)  # noqa: E731
    ns = start_namesrv(
        loop_thread, tmp_path / "ns", metrics_port=-1, health_port=0,
        tls=ServerTLS.load(c("server.pem"), c("server.key"), c("ca.pem")),
    )  # fmt: skip
    tls_keys = {"tlsCert": c("server.pem"), "tlsKey": c("server.key"),
                "tlsClientCa": c("ca.pem"), "tlsCa": c("ca.pem")}  # fmt: skip
    master = start_broker(
        loop_thread, tmp_path / "m", ns.remoting_addr, brokerName="broker-t", brokerRole="SYNC_MASTER",
        haListenPort=0, healthPort=0, **tls_keys,
    )  # fmt: skip
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerName="broker-t", brokerRole="SLAVE",
        brokerId=1, slaveReadEnable="true", slaveSyncDelay=0, slaveSyncInterval=200,
        haReconnectInterval=200, **tls_keys,
    )  # fmt: skip
    client = ClientTLS.load(c("ca.pem"), c("client.pem"), c("client.key"))
    channels = []

    def secure(addr: str, tls: ClientTLS | None = client) -> grpc.Channel:
        ch = grpc.secure_channel(addr, tls.credentials()) if tls else grpc.insecure_channel(addr)
        channels.append(ch)
        return ch

    try:
        names = namesrv_pb2_grpc.NameServerStub(secure(ns.addr))
        # Both brokers registered over mutual TLS (their client certificates).
        wait_for(
            lambda: len(names.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
                        .broker_addr_table["broker-t"].broker_addrs) == 2,
            15, "both brokers to register over TLS",
        )  # fmt: skip
        broker_admin_pb2_grpc.BrokerAdminStub(secure(master.addr)).UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name="Tls", read_queue_nums=2, write_queue_nums=2, perm=6
                )
            ),
            timeout=10,
        )
        # The slave pulled the topic from its master's SlaveSync over TLS.
        wait_for(lambda: slave.app.metadata.topics.get("Tls") is not None, 15, "slave sync")
        sent = broker_pb2_grpc.BrokerStub(secure(master.addr)).SendMessage(
            broker_pb2.SendMessageRequest(topic="Tls", body=b"over tls"), timeout=10
        )
        assert sent.status == broker_pb2.SEND_OK  # the slave has it (HA, plaintext)

        # Refused: plaintext, and TLS without a client certificate.
        for tls in (None, ClientTLS.load(c("ca.pem"))):
            with pytest.raises(grpc.RpcError) as err:
                namesrv_pb2_grpc.NameServerStub(secure(ns.addr, tls)).GetBrokerClusterInfo(
                    namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=5
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        # Probes that cannot speak TLS (the kubelet's) use the plaintext health-only port.
        for server in (ns.app.server, master.app.server):
            health = health_pb2_grpc.HealthStub(secure(f"127.0.0.1:{server.health_port}", None))
            answer = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:  # and nothing else is served there
                namesrv_pb2_grpc.NameServerStub(
                    secure(f"127.0.0.1:{server.health_port}", None)
                ).GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

        # The ferry command, with the CA and a client certificate.
        env = {"FERRY_TLS_CA": c("ca.pem"), "FERRY_TLS_CERT": c("client.pem"),
               "FERRY_TLS_KEY": c("client.key")}  # fmt: skip
        got = run_ferry("consume", "Tls", "-g", "g", "--from-beginning", "--max", "1",
                        "-n", ns.remoting_addr, env=env)  # fmt: skip
        assert got.returncode == 0 and "over tls" in got.stdout, got.stderr
        flags = run_ferry("route", "Tls", "-n", ns.remoting_addr, "--tls-ca", c("ca.pem"),
                          "--tls-cert", c("client.pem"), "--tls-key", c("client.key"))  # fmt: skip
        assert flags.returncode == 0 and "broker-t" in flags.stdout, flags.stderr
        plain = run_ferry("route", "Tls", "-n", ns.remoting_addr)
        assert plain.returncode != 0 and "--tls-ca" in plain.stderr  # says what to do

        # grpcurl, as an operator would.
        out = subprocess.run(
            [grpcurl_path(), "-cacert", c("ca.pem"), "-cert", c("client.pem"), "-key",
             c("client.key"), "-d", '{"topic":"Tls"}', ns.addr,
             "ferry.v1.NameServer/GetRouteInfoByTopic"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.returncode == 0 and "broker-t" in out.stdout, out.stderr
    finally:
        for ch in channels:
            ch.close()
        slave.stop()
        master.stop()
        ns.stop()


def test_a_bad_tls_file_stops_startup_with_its_name(tmp_path):
    (tmp_path / "not.pem").write_text("hello")
    got = run_ferry("broker", "-o", "tlsCert=" + str(tmp_path / "not.pem"), "-o",
                    "tlsKey=" + str(tmp_path / "missing.key"), "-o", "listenPort=0",
                    "-o", f"storePathRootDir={tmp_path / 'store'}", "-o", "metricsPort=-1",
                    "-o", "haListenPort=0")  # fmt: skip
    assert got.returncode == 2
    assert "tlsCert" in got.stderr + got.stdout and "not a PEM file" in got.stderr + got.stdout


def test_the_ha_stream_over_tls(loop_thread, tmp_path, certs):
    """haTls: the master serves its HA port with TLS and requires the slave's
    certificate; the slave verifies the master's. It replicates (a SYNC send is
    acknowledged by the slave), byte-identical; a slave speaking plaintext to
    that port, or without a certificate, gets no byte."""
    c = lambda name: str(certs / name)  # noqa: E731
    tls = {"haTls": "true", "tlsCert": c("server.pem"), "tlsKey": c("server.key"),
           "tlsClientCa": c("ca.pem"), "tlsCa": c("ca.pem")}  # fmt: skip
    master = start_broker(
        loop_thread, tmp_path / "m", brokerName="broker-t", brokerRole="SYNC_MASTER",
        haListenPort=0, haSecret="s", **tls,
    )  # fmt: skip
    ha = f"127.0.0.1:{master.app.ha_master.port}"
    common = {"brokerName": "broker-t", "brokerRole": "SLAVE", "brokerId": 1,
              "haMasterAddress": ha, "haReconnectInterval": 200, "haSecret": "s"}  # fmt: skip
    slave = start_broker(loop_thread, tmp_path / "s", **common, **tls)
    plain = start_broker(loop_thread, tmp_path / "p", **common)
    no_cert = start_broker(loop_thread, tmp_path / "n", **common, haTls="true", tlsCa=c("ca.pem"))
    try:
        channel = grpc.secure_channel(
            master.addr, ClientTLS.load(c("ca.pem"), c("client.pem"), c("client.key")).credentials()
        )
        broker_admin_pb2_grpc.BrokerAdminStub(channel).UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name="HaTls", read_queue_nums=1, write_queue_nums=1, perm=6
                )
            ),
            timeout=10,
        )
        wait_for(lambda: slave.app.ha_slave.connected, 10, "the TLS slave to connect")
        for i in range(20):
            r = broker_pb2_grpc.BrokerStub(channel).SendMessage(
                broker_pb2.SendMessageRequest(topic="HaTls", body=b"secret %d" % i), timeout=10
            )
            assert r.status == broker_pb2.SEND_OK
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the TLS slave to catch up")
        read = lambda p: b"".join(f.read_bytes() for f in sorted((p / "commitlog").iterdir()))  # noqa: E731
        assert read(tmp_path / "s")[:end] == read(tmp_path / "m")[:end]
        assert plain.app.store.max_offset == 0 and not plain.app.ha_slave.connected
        assert no_cert.app.store.max_offset == 0 and not no_cert.app.ha_slave.connected
        channel.close()
    finally:
        for b in (no_cert, plain, slave, master):
            b.stop()
