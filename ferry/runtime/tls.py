"""TLS for ferry's gRPC servers and clients.

A server with a certificate and key serves TLS only; with a client CA as well
it also requires and verifies client certificates (mutual TLS). A client with
a CA bundle connects with TLS and verifies the server's certificate (its
subject alternative names must cover the address dialled: an IP SAN for
127.0.0.1, the pod's DNS name in Kubernetes); with a certificate and key of
its own it can present them.

Where ferry's blocking clients (the `ferry` commands, the exporter, library
users) get their settings: the environment ($FERRY_TLS_CA, $FERRY_TLS_CERT,
$FERRY_TLS_KEY; the commands' --tls-* flags set it), one switch for all.
Brokers pass theirs from broker.conf. The HA stream's TLS (haTls) uses
Python's ssl contexts, built in services.broker.app.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from ferry.runtime.errors import ConfigError

ENV_CA, ENV_CERT, ENV_KEY = "FERRY_TLS_CA", "FERRY_TLS_CERT", "FERRY_TLS_KEY"


def _read(path: Path | str, what: str, key: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(key, f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(key, f"{path} is not a PEM file (the {what})")
    return data


@dataclass(frozen=True)
class ServerTLS:
    cert: bytes
    key: bytes
    client_ca: bytes | None = None  # set: client certificates are required and verified

    @classmethod
    def load(
        cls, cert: str | Path, key: str | Path, client_ca: str | Path | None = None,
        keys: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-client-ca"),
    ) -> ServerTLS:  # fmt: skip
        return cls(
            _read(cert, "certificate", keys[0]),
            _read(key, "private key", keys[1]),
            _read(client_ca, "client CA bundle", keys[2]) if client_ca else None,
        )

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ClientTLS:
    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def load(
        cls, ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None,
        keys: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key"),
    ) -> ClientTLS:  # fmt: skip
        if bool(cert) != bool(key):
            raise ConfigError(
                keys[1], "a client certificate needs its key, and a key its certificate"
            )
        return cls(
            _read(ca, "CA bundle", keys[0]),
            _read(cert, "certificate", keys[1]) if cert else None,
            _read(key, "private key", keys[2]) if key else None,
        )

    @classmethod
    def from_env(cls) -> ClientTLS | None:
        ca = os.environ.get(ENV_CA)
        if not ca:
            return None
        return cls.load(
            ca, os.environ.get(ENV_CERT) or None, os.environ.get(ENV_KEY) or None,
            keys=(f"${ENV_CA}", f"${ENV_CERT}", f"${ENV_KEY}"),
        )  # fmt: skip

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def server_ssl_context(
    cert: str | Path, key: str | Path, client_ca: str | Path | None = None
) -> ssl.SSLContext:
    """A server's TLS context for a plain TCP port (the HA stream, RocketMQ's
    protocol) from PEM files; with `client_ca`, clients must present a
    certificate it signed. An OSError or ssl.SSLError names what is wrong."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(str(client_ca))
    return ctx


def channel(addr: str, options: Sequence = ()) -> grpc.Channel:
    """A blocking channel: TLS when the environment names a CA."""
    settings = ClientTLS.from_env()
    if settings is None:
        return grpc.insecure_channel(addr, options=list(options))
    return grpc.secure_channel(addr, settings.credentials(), options=list(options))


def aio_channel(addr: str, tls: ClientTLS | None, options: Sequence = ()) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(addr, options=list(options))
    return grpc.aio.secure_channel(addr, tls.credentials(), options=list(options))
