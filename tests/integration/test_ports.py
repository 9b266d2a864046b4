"""Which port speaks what (docs/guides/name-server.md, "Ports"): a name
server's --port and a broker's listenPort and fastListenPort speak RocketMQ's
protocol, ferry.v1 gRPC has ports of its own, a broker's records carry its
RocketMQ-protocol address, and brokers find a name server's gRPC port by
discovery, saying clearly when an address is not a ferry name server's."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.remoting.discovery import DiscoveryError, grpc_address_sync
from ferry.v1 import broker_pb2
from services.broker.failover.runs import _Unavailable
from tests.conftest import start_broker
from tests.integration.support import HeldPort, create_topic, live_addrs

UNKNOWN = 9999  # a request code nobody serves


def test_a_name_server_speaks_rocketmqs_protocol_on_its_port(ns):
    assert ns.app.remoting_port not in (0, ns.app.port)
    answer = call(ns.remoting_addr, Command(UNKNOWN))
    assert (answer.code, answer.opaque) == (codes.REQUEST_CODE_NOT_SUPPORTED, 1)
    # Discovery: its RocketMQ-protocol port gives its gRPC port.
    assert grpc_address_sync(ns.remoting_addr) == ns.addr


def test_a_broker_speaks_rocketmqs_protocol_on_listen_port_and_the_vip_port(loop_thread, tmp_path):
    b = start_broker(loop_thread, tmp_path / "b")
    try:
        app = b.app
        ports = {app.remoting_port, app.fast_port, app.port}
        assert len(ports) == 3 and 0 not in ports, ports
        for port in (app.remoting_port, app.fast_port):
            answer = call(f"127.0.0.1:{port}", Command(UNKNOWN))
            assert answer.code == codes.REQUEST_CODE_NOT_SUPPORTED, port
        assert app.remoting_addr == f"127.0.0.1:{app.remoting_port}"
    finally:
        b.stop()


def test_a_broker_without_the_vip_port(loop_thread, tmp_path):
    b = start_broker(loop_thread, tmp_path / "b", fastListenPort=-1)
    try:
        assert b.app.fast_port == -1
        assert call(b.remoting_addr, Command(UNKNOWN)).code == codes.REQUEST_CODE_NOT_SUPPORTED
    finally:
        b.stop()


def test_records_carry_the_rocketmq_protocol_address_as_their_store_host(loop_thread, tmp_path):
    """offsetMsgId = store host (IPv4, port) + commit offset: RocketMQ's clients
    look a message up at that address, so its port is listenPort's."""
    b = start_broker(loop_thread, tmp_path / "b")
    try:
        create_topic(b.channel, "Hosted", 1)
        sent = b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Hosted", body=b"x"))
        raw = bytes.fromhex(sent.msg_id)
        assert raw[:4] == bytes([127, 0, 0, 1])
        assert int.from_bytes(raw[4:8], "big") == b.app.remoting_port
        assert b.app.store.store_host == ("127.0.0.1", b.app.remoting_port)
    finally:
        b.stop()


def test_discovery_says_clearly_what_an_address_is_not(loop_thread, tmp_path, ns):
    # A gRPC port (a name server's old address, say): it does not speak RocketMQ's protocol.
    with pytest.raises(DiscoveryError, match="is it a gRPC port"):
        grpc_address_sync(ns.addr, timeout=3)
    # A RocketMQ-protocol port that is not a ferry name server's (a broker's,
    # or Apache's name server: no ferry.v1/grpcPort key).
    b = start_broker(loop_thread, tmp_path / "b")
    try:
        with pytest.raises(DiscoveryError, match="did not give its ferry.v1 gRPC port"):
            grpc_address_sync(b.remoting_addr, timeout=3)
    finally:
        b.stop()
    # Nothing there.
    with HeldPort() as held, pytest.raises(DiscoveryError, match="ConnectionRefusedError"):
        grpc_address_sync(held.addr, timeout=3)


def test_a_broker_registers_through_discovery(loop_thread, tmp_path, ns, caplog):
    caplog.set_level(logging.INFO, "services.broker.cluster.registration")
    b = start_broker(loop_thread, tmp_path / "b", ns.remoting_addr)
    try:
        assert b.addr in live_addrs(ns.stub)  # registered (ferry.v1) at the gRPC address found
        registrar = b.app.registrar
        assert registrar.status().keys() == {ns.remoting_addr}
        assert f"name server {ns.remoting_addr} serves ferry.v1 gRPC at {ns.addr}" in caplog.text
        request = registrar._request()
        assert (request.broker_addr, request.remoting_addr) == (b.addr, b.app.remoting_addr)
    finally:
        b.stop()
    assert b.addr not in live_addrs(ns.stub)  # and unregistered there


def test_a_broker_given_a_grpc_address_as_namesrvaddr_says_so(loop_thread, tmp_path, ns, caplog):
    """namesrvAddr with a name server's gRPC address (its port before RocketMQ's
    protocol took 9876): not fatal, nothing registered, and the log says why."""
    b = start_broker(loop_thread, tmp_path / "b", ns.addr)
    try:
        assert b.addr not in live_addrs(ns.stub)
        assert f"registration with name server {ns.addr} failed" in caplog.text
        assert "is it a gRPC port" in caplog.text
    finally:
        b.stop()


def test_between_two_failover_runs_every_code_is_answered_service_not_available():
    """What a failover member's RocketMQ-protocol listener serves while it
    changes role: 14, which a RocketMQ producer retries at another broker."""
    table = _Unavailable("member 1 of broker-a is changing its role; try another broker")
    for code in (codes.SEND_MESSAGE, codes.PULL_MESSAGE, codes.HEART_BEAT, UNKNOWN):
        handler = table.get(code)
        assert handler is not None
        answer = asyncio.run(handler(None, Command(code, opaque=7)))  # type: ignore[arg-type]
        assert answer.code == codes.SERVICE_NOT_AVAILABLE
        assert "changing its role" in (answer.remark or "")


def test_the_cli_and_client_say_when_a_rocketmq_protocol_port_was_given_for_grpc(
    loop_thread, tmp_path, ns, capsys
):
    """gRPC alone only says "Socket closed" when it dials a RocketMQ-protocol
    port; ferry's CLI (-b) and NamesrvClient (without discovery) say what the
    port is and what to give instead."""
    from ferry.client.namesrv import NamesrvClient, NoNameServerAnswered
    from services.cli.main import main

    b = start_broker(loop_thread, tmp_path / "b")
    try:
        assert main(["runtime", "-b", b.remoting_addr]) != 0
        err = capsys.readouterr().err
        assert f"{b.remoting_addr} speaks RocketMQ's protocol" in err, err
        assert "grpcListenPort" in err
        with (
            pytest.raises(NoNameServerAnswered) as raised,
            NamesrvClient([ns.remoting_addr], timeout_s=2) as client,
        ):
            client.topics()
        assert "speak RocketMQ's protocol, not ferry.v1 gRPC" in str(raised.value)
        assert "discover=True" in str(raised.value)
    finally:
        b.stop()
