"""TLS on the RocketMQ-protocol ports, as Apache's tls.server.mode: a name server and
a broker with tlsCert/tlsKey serve TLS and plaintext on one port (permissive, the
default), TLS only (enforcing: a plaintext client is closed unanswered) or plaintext
only (disabled). The certificates are ferry's gRPC and HA ones (tlsCert/tlsKey,
--tls-cert/--tls-key), made by the real openssl. What a Java client with
`tls.enable=true` does against both servers is tests/compat/test_remoting_clients.py's.
"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest

from ferry.remoting import codec, codes
from ferry.remoting.client import recv_command
from ferry.remoting.codec import Command
from ferry.runtime.tls import server_ssl_context
from tests.conftest import start_broker, start_namesrv
from tests.integration.support import make_test_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def ask(addr: str, command: Command, tls_ca: Path | None) -> Command:
    """One request on a new connection, over TLS (verifying the server against
    `tls_ca`) or plaintext; ConnectionError when the server closes unanswered."""
    host, port = addr.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    sock: socket.socket = raw
    if tls_ca is not None:
        context = ssl.create_default_context(cafile=str(tls_ca))
        sock = context.wrap_socket(raw, server_hostname=host)
    with sock:
        command.opaque = 7
        sock.sendall(codec.encode(command))
        return recv_command(sock, bytearray(), time.monotonic() + 10)


def tls_broker(loop_thread, tmp_path: Path, certs: Path, **keys):
    """A broker with the test certificate as tlsCert/tlsKey (and `keys`)."""
    return start_broker(
        loop_thread,
        tmp_path / "store",
        tlsCert=certs / "server.pem",
        tlsKey=certs / "server.key",
        **keys,
    )


def test_a_broker_serves_tls_and_plaintext_on_one_port(loop_thread, tmp_path, certs):
    broker = tls_broker(loop_thread, tmp_path, certs)
    try:
        request = Command(codes.GET_BROKER_RUNTIME_INFO)
        for ca in (certs / "ca.pem", None):  # TLS, then plaintext, on listenPort
            answer = ask(broker.remoting_addr, request, ca)
            assert answer.code == codes.SUCCESS, answer.remark
    finally:
        broker.stop()


def test_enforcing_closes_a_plaintext_client_unanswered(loop_thread, tmp_path, certs):
    broker = tls_broker(loop_thread, tmp_path, certs, tlsServerMode="enforcing")
    try:
        request = Command(codes.GET_BROKER_RUNTIME_INFO)
        assert ask(broker.remoting_addr, request, certs / "ca.pem").code == codes.SUCCESS
        with pytest.raises((ConnectionError, OSError)):
            ask(broker.remoting_addr, request, None)
    finally:
        broker.stop()


def test_disabled_serves_plaintext_only(loop_thread, tmp_path, certs):
    broker = tls_broker(loop_thread, tmp_path, certs, tlsServerMode="disabled")
    try:
        request = Command(codes.GET_BROKER_RUNTIME_INFO)
        assert ask(broker.remoting_addr, request, None).code == codes.SUCCESS
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            ask(broker.remoting_addr, request, certs / "ca.pem")
    finally:
        broker.stop()


def tls_namesrv(loop_thread, tmp_path: Path, certs: Path):
    """A name server whose RocketMQ-protocol port is permissive TLS."""
    return start_namesrv(
        loop_thread,
        tmp_path / "ns",
        remoting_tls=server_ssl_context(certs / "server.pem", certs / "server.key"),
    )


def test_a_name_server_serves_tls_and_plaintext_on_one_port(loop_thread, tmp_path, certs):
    ns = tls_namesrv(loop_thread, tmp_path, certs)
    try:
        addr = f"127.0.0.1:{ns.app.remoting_port}"
        for ca in (certs / "ca.pem", None):
            answer = ask(addr, Command(codes.GET_BROKER_CLUSTER_INFO), ca)
            assert answer.code == codes.SUCCESS, answer.remark
    finally:
        ns.stop()


def test_a_client_that_says_nothing_holds_no_other_connection_up(loop_thread, tmp_path, certs):
    """A silent connection waits for its first byte on its own: others are served."""
    ns = tls_namesrv(loop_thread, tmp_path, certs)
    try:
        addr = f"127.0.0.1:{ns.app.remoting_port}"
        with socket.create_connection(("127.0.0.1", ns.app.remoting_port), timeout=10):
            answer = ask(addr, Command(codes.GET_BROKER_CLUSTER_INFO), None)
            assert answer.code == codes.SUCCESS
    finally:
        ns.stop()
