"""The proxy's certificate in `ferry dev`: a self-signed one for 127.0.0.1 and
localhost, made once per data directory with the `openssl` command (the
`cryptography` package is not one of ferry's dependencies), as Apache's proxy
makes its own when none is configured (tlsTestModeEnable). The RocketMQ 5 Java
SDK before 5.1 always dials TLS and trusts any certificate; other clients may
trust this one (it is its own CA).

Owns the files `cert.pem` and `key.pem` in the directory it is given; never
overwrites a pair that is there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUBJECT = "/CN=ferry dev proxy"
SAN = "subjectAltName=IP:127.0.0.1,DNS:localhost"
DAYS = 3650


@dataclass(frozen=True)
class ProxyCert:
    cert: Path
    key: Path
    made: bool  # True: made now; False: found from an earlier run


def self_signed(directory: Path) -> ProxyCert:
    """The pair in `directory`, made now if it is not there yet.

    Raises:
        OSError: `openssl` is not installed or failed (its message included).
    """
    cert, key = directory / "cert.pem", directory / "key.pem"
    if cert.exists() and key.exists():
        return ProxyCert(cert, key, made=False)
    exe = shutil.which("openssl")
    if exe is None:
        raise OSError("the openssl command is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    partial_key = directory / "key.pem.tmp"
    partial_cert = directory / "cert.pem.tmp"
    done = subprocess.run(
        [exe, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
         "-keyout", str(partial_key), "-out", str(partial_cert), "-days", str(DAYS),
         "-subj", SUBJECT, "-addext", SAN],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise OSError(f"openssl req failed: {done.stderr.strip()}")
    os.chmod(partial_key, 0o600)
    os.replace(partial_key, key)
    os.replace(partial_cert, cert)
    return ProxyCert(cert, key, made=True)
