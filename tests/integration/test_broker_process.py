"""`python -m services.broker` as users run it: configuration errors stop it
with the key named, SIGTERM unregisters and leaves a clean store, a read-only
broker registers read-only routes, and grpcurl drives it with no .proto files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.conftest import broker_options, start_broker
from tests.integration.support import (
    REPO,
    BrokerServer,
    child_env,
    grpcurl_path,
    has_route,
    live_addrs,
)


def test_bad_config_stops_startup_naming_the_key(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerRole=SLAVE\nbrokerId=0\nbrokerNmae=typo\n")
    result = subprocess.run(
        [sys.executable, "-m", "services.broker", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=child_env(),
    )
    assert result.returncode == 2
    assert (
        "unknown key 'brokerNmae'" in result.stderr and "did you mean 'brokerName'" in result.stderr
    )
    assert "config brokerId: a SLAVE needs brokerId > 0" in result.stderr


def test_sigterm_unregisters_and_shuts_down_cleanly(tmp_path, ns):
    server = BrokerServer(
        tmp_path / "store", broker_options(tmp_path / "store", ns.remoting_addr)
    ).start()
    try:
        assert server.addr in live_addrs(ns.stub)
        assert (tmp_path / "store" / "abort").exists()
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert server.addr not in live_addrs(ns.stub)
        assert not (tmp_path / "store" / "abort").exists()  # a clean shutdown
        assert "unregistered from name server" in server.log()
    finally:
        server.stop()


def test_a_taken_rocketmq_protocol_port_stops_startup_naming_the_key(tmp_path):
    """listenPort (RocketMQ's protocol) already taken: exit 1, the key and port named,
    and no port file (nothing half-started is advertised)."""
    from tests.integration.support import HeldPort

    with HeldPort() as held:
        held.sock.listen()
        store = tmp_path / "store"
        options = broker_options(store, listenPort=held.port, grpcListenPort=0, fastListenPort=-1)
        server = BrokerServer(store, options)
        server.port_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.broker", "--port-file", str(server.port_file),
             *[x for o in server.options for x in ("-o", o)]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env=child_env(),
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 1, out
    assert f"cannot listen on 127.0.0.1:{held.port} (listenPort, RocketMQ's protocol)" in out
    assert not server.port_file.exists()


def test_read_only_broker_registers_read_only_routes(loop_thread, tmp_path, ns):
    b = start_broker(loop_thread, tmp_path / "s", ns.remoting_addr, brokerPermission=4)
    try:
        from tests.integration.test_broker_grpc import create_topic

        create_topic(b, "Drained")
        assert has_route(ns.stub, "Drained")
        from ferry.v1 import namesrv_pb2

        route = ns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="Drained"))
        assert [q.perm for q in route.queue_datas] == [4]
    finally:
        b.stop()


def test_grpcurl_lists_services_sends_and_pulls(loop_thread, tmp_path):
    b = start_broker(loop_thread, tmp_path / "s")
    try:
        from tests.integration.test_broker_grpc import create_topic

        create_topic(b, "Curl", queues=1)

        def grpcurl(*args: str, data: dict | None = None) -> subprocess.CompletedProcess:
            command = [grpcurl_path(), "-plaintext"]
            if data is not None:
                command += ["-d", json.dumps(data)]
            return subprocess.run(
                [*command, b.addr, *args], capture_output=True, text=True, timeout=30
            )

        listed = grpcurl("list").stdout.split()
        assert {"ferry.v1.Broker", "ferry.v1.BrokerAdmin", "ferry.v1.SlaveSync"} <= set(listed)
        sent = grpcurl("ferry.v1.Broker/SendMessage", data={"topic": "Curl", "body": "aGVsbG8="})
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["status"] == "SEND_OK"
        pulled = grpcurl(
            "ferry.v1.Broker/PullMessage",
            data={"consumer_group": "g", "topic": "Curl", "queue_id": 0, "max_wait_ms": 3000},
        )
        answer = json.loads(pulled.stdout)
        assert answer["status"] == "FOUND" and answer["messages"][0]["body"] == "aGVsbG8="
        missing = grpcurl("ferry.v1.Broker/SendMessage", data={"topic": "Nope", "body": "eA=="})
        assert missing.returncode == 64 + 5 and "does not exist" in missing.stderr
    finally:
        b.stop()
