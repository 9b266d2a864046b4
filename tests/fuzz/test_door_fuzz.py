"""The native gRPC door (native/src/door.rs, ferry.runtime.native_server) fed what
no gRPC client sends, on a proxy whose port serves TLS and plaintext alike
(permissive, so both of the door's first-byte paths are hit): random bytes, a
truncated HTTP/2 preface, an oversized frame, oversized headers, requests that
do not parse, and a client that opens streams and never reads. Each gets a
clear gRPC status or a closed connection, a count in the door's metrics and a
log line; the proxy stays SERVING and other clients are answered meanwhile.

FERRY_DOOR_FUZZ_CONNECTIONS sets the random-bytes connections (make test: 200;
make fuzz: FUZZ_EXAMPLES x 5)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import struct
import threading
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.runtime.tls import ServerTLS
from services.proxy.app import ProxyApp, ProxyConfig
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

CONNECTIONS = int(os.environ.get("FERRY_DOOR_FUZZ_CONNECTIONS", "200"))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TOPIC = "DoorFuzzTopic"
SERVICE = s.DESCRIPTOR.services_by_name["MessagingService"]
QUERY_ROUTE = f"/{SERVICE.full_name}/QueryRoute"


class Door:
    def __init__(self, root) -> None:
        (root / "certs").mkdir()
        certs = support.make_test_certs(root / "certs")
        self.loop = LoopThread()
        self.ns = start_namesrv(self.loop, root / "ns", metrics_port=-1)
        self.broker = start_broker(
            self.loop, root / "store", self.ns.remoting_addr, brokerName="broker-a"
        )
        support.create_topic(self.broker.channel, TOPIC, 4)
        tls = ServerTLS.load(certs / "server.pem", certs / "server.key")
        config = ProxyConfig(
            (self.ns.remoting_addr,), host="127.0.0.1", port=0, grace_s=0.5, tls=tls
        )
        self.app = ProxyApp(config)
        self.loop.run(self.app.start())
        self.port = self.app.port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    @property
    def native(self):
        return self.app.server._server

    def stats(self) -> dict[str, int]:
        return self.native.stats()

    def healthy(self) -> bool:
        answer = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def routes(self) -> bool:
        stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        answer = stub.QueryRoute(s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10)
        return answer.status.code == v2.OK

    def close(self) -> None:
        self.channel.close()
        self.loop.run(self.app.stop())
        self.broker.stop()
        self.ns.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def door(tmp_path_factory) -> Iterator[Door]:
    d = Door(tmp_path_factory.mktemp("door-fuzz"))
    yield d
    d.close()


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (socket timeout: 10 s, a hang fails)."""
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk


def _send_and_close(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # broken pipe, reset, not connected
            return b""  # the door closed it before all was written
        return _until_closed(sock)


def test_random_bytes_close_the_connection(door, caplog):
    rng = random.Random(44)
    before = door.stats()["refused_connections"]
    with caplog.at_level(logging.WARNING, logger="ferry.runtime.native_server"):
        for i in range(CONNECTIONS):
            junk = rng.randbytes(rng.randint(1, 4096))
            kind = i % 4
            if kind == 1:
                junk = b"\x16" + junk  # a TLS record that is not a ClientHello
            elif kind == 2:
                junk = PREFACE + junk  # HTTP/2 frames that are noise
            elif kind == 3:
                junk = b"\x16\x03\x01" + struct.pack(">H", len(junk)) + junk
            _send_and_close(door.port, junk)
    assert door.healthy() and door.routes()
    # Noise that is not a preface is refused by the door itself and logged there.
    refused = door.stats()["refused_connections"] - before
    assert refused >= CONNECTIONS // 2, door.stats()
    lines = [r.getMessage() for r in caplog.records if "closed the connection" in r.getMessage()]
    assert lines, "a refused connection leaves a log line"


@pytest.mark.parametrize("length", [1, 5, 12, 23])
def test_a_truncated_preface_is_closed(door, length):
    before = door.stats()["refused_connections"]
    assert _send_and_close(door.port, PREFACE[:length]) == b""
    assert door.stats()["refused_connections"] == before + 1
    assert door.healthy()


def _h2(port: int, window: int | None = None) -> tuple[socket.socket, h2.connection.H2Connection]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    if window is not None:
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    sock.sendall(conn.data_to_send())
    return sock, conn


def _grpc_headers(path: str, extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


def _grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def _events_until_closed(sock, conn) -> list:
    data = _until_closed(sock)
    with contextlib.suppress(h2.exceptions.ProtocolError):  # what came after a GOAWAY
        return conn.receive_data(data)
    return []


def _events_until(sock, conn, done) -> list:
    """The server's HTTP/2 events until `done(events)` or its close (10 s socket timeout)."""
    events: list = []
    while not done(events):
        data = sock.recv(65536)
        if not data:
            break
        events += conn.receive_data(data)
        sock.sendall(conn.data_to_send())
    return events


def test_an_oversized_frame_ends_the_connection_with_goaway(door):
    sock, conn = _h2(door.port)
    with sock:
        # A DATA frame header announcing 1 MiB: past SETTINGS_MAX_FRAME_SIZE (16 KiB).
        sock.sendall(struct.pack(">I", 1 << 20)[1:] + b"\x00\x00" + struct.pack(">I", 1))
        sock.sendall(bytes(4096))
        events = _events_until_closed(sock, conn)
    goaways = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaways and goaways[0].error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR, events
    assert door.healthy()


def test_oversized_headers_are_refused_and_others_served(door):
    sock, conn = _h2(door.port)
    with sock:
        big = [("x-padding", "p" * 60_000)]
        conn.send_headers(1, _grpc_headers(QUERY_ROUTE, big), end_stream=False)
        sock.sendall(conn.data_to_send())
        answers = (
            h2.events.ResponseReceived,
            h2.events.StreamReset,
            h2.events.ConnectionTerminated,
        )
        events = _events_until(sock, conn, lambda ev: any(isinstance(e, answers) for e in ev))
    # hyper answers headers past its list size with 431 or ends the connection.
    answered = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    ended = [
        e for e in events if isinstance(e, h2.events.ConnectionTerminated | h2.events.StreamReset)
    ]
    assert ended or all(dict(e.headers).get(":status") == "431" for e in answered), events
    assert door.healthy() and door.routes()


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods if not m.client_streaming])
def test_a_request_that_does_not_parse_is_invalid_argument(door, method):
    path = f"/{SERVICE.full_name}/{method}"
    before = door.native.bad_requests
    call = (
        door.channel.unary_stream(path)
        if SERVICE.methods_by_name[method].server_streaming
        else door.channel.unary_unary(path)
    )
    with pytest.raises(grpc.RpcError) as caught:
        answer = call(b"\xff\xff\xff\xff", timeout=10)
        if SERVICE.methods_by_name[method].server_streaming:
            list(answer)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "not a valid message" in caught.value.details()
    assert door.native.bad_requests == before + 1


def test_an_unknown_method_is_unimplemented(door):
    with pytest.raises(grpc.RpcError) as caught:
        door.channel.unary_unary("/apache.rocketmq.v2.MessagingService/NoSuchMethod")(
            b"", timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_client_that_never_reads_holds_up_no_one(door):
    """Slowloris: 200 calls on a connection whose window is 0 (nothing can be sent
    to it); other clients are served meanwhile, and its calls end with it."""
    sock, conn = _h2(door.port, window=0)
    request = _grpc_message(s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)).SerializeToString())
    with sock:
        for i in range(200):
            stream = 1 + 2 * i
            conn.send_headers(stream, _grpc_headers(QUERY_ROUTE), end_stream=False)
            conn.send_data(stream, request, end_stream=True)
        sock.sendall(conn.data_to_send())
        served = []

        def other() -> None:
            served.append(door.routes())

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert served == [True]
        assert door.healthy()
    # Its calls end with the connection: none stays open on the door.
    wait_for(lambda: door.native.open_calls() == 0, 30, "the slow client's calls to end")
    assert door.healthy()
