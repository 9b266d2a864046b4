"""`python -m services.namesrv` as a real process: port file, health across SIGTERM,
exit statuses, and refusing to start on a corrupt kvConfig.json."""

from __future__ import annotations

import json
import os
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc
from tests.helpers import register_request
from tests.integration.support import scrape

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_sigterm_turns_health_not_serving_and_exits_zero(namesrv_process):
    server = namesrv_process().wait_ready()
    assert server.metrics_port > 0
    assert "ferry_namesrv_live_brokers 0.0" in scrape(
        f"http://127.0.0.1:{server.metrics_port}/metrics"
    )

    channel = grpc.insecure_channel(server.addr)
    try:
        stub = namesrv_pb2_grpc.NameServerStub(channel)
        stub.RegisterBroker(register_request(), timeout=10)
        assert list(
            stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest(), timeout=10).topic_list
        ) == ["TopicTest"]

        health = health_pb2_grpc.HealthStub(channel)
        check = health.Check(health_pb2.HealthCheckRequest(service="ferry.v1.NameServer"))
        assert check.status == SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=20)
        assert next(watch).status == SERVING

        os.kill(server.proc.pid, signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        watch.cancel()  # let the graceful stop finish without waiting for this stream
    finally:
        channel.close()

    assert server.proc.wait(15) == 0
    assert "signal received; stopping" in server.log()
    assert "name server stopped" in server.log()


def test_corrupt_kv_file_without_backup_stops_startup_naming_the_file(namesrv_process, tmp_path):
    home = tmp_path / "corrupt-home"
    home.mkdir()
    (home / "kvConfig.json").write_text('{"configTable": ')
    server = namesrv_process(home)
    assert server.proc.wait(15) == 1
    log = server.log()
    assert "cannot start" in log
    assert str(home / "kvConfig.json") in log
    assert "no backup" in log
    assert not server.port_file.exists()


def test_corrupt_kv_file_with_backup_starts_from_it(namesrv_process, tmp_path):
    home = tmp_path / "bak-home"
    home.mkdir()
    (home / "kvConfig.json").write_text("\x00\x00garbage")
    (home / "kvConfig.json.bak").write_text(json.dumps({"configTable": {"ns": {"k": "v"}}}))
    server = namesrv_process(home).wait_ready()
    with grpc.insecure_channel(server.addr) as channel:
        stub = namesrv_pb2_grpc.NameServerStub(channel)
        value = stub.GetKVConfig(
            namesrv_pb2.GetKVConfigRequest(namespace="ns", key="k"), timeout=10
        )
    assert value.value == "v"
    assert "loaded its backup" in server.log()


def test_a_port_in_use_stops_startup(namesrv_process, tmp_path):
    first = namesrv_process(tmp_path / "first").wait_ready()
    # The other port is 0: a default one (9876, 9879) may be taken on this machine, and
    # the failure must be the one this test makes.
    for flag, port, other in (
        ("--port", first.remoting_port, "--grpc-port"),
        ("--grpc-port", first.grpc_port, "--port"),
    ):
        second = namesrv_process(
            tmp_path / f"second{flag}", [flag, str(port), other, "0", "--metrics-port", "-1"]
        )
        assert second.proc.wait(15) == 1, flag
        assert "cannot start" in second.log()
        assert str(port) in second.log()
        assert not second.port_file.exists()
    assert first.proc.poll() is None  # the first one is unharmed


def test_the_port_file_and_the_ready_line_name_both_protocols(namesrv_process):
    server = namesrv_process().wait_ready()
    info = json.loads(server.port_file.read_text())
    assert info["remoting_port"] > 0 and info["grpc_port"] > 0
    assert info["remoting_port"] != info["grpc_port"]
    assert (
        f"rocketmq=127.0.0.1:{info['remoting_port']} grpc=127.0.0.1:{info['grpc_port']}"
        in server.log()
    )
