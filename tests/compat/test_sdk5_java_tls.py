"""The RocketMQ 5 Java SDK over TLS (Parity5 with -Dparity5.ssl=true: 5.2.0's
ClientConfiguration.enableSsl(true), which trusts any server certificate, as 5.0.3
always dials TLS) against ferry's proxy with a throwaway certificate (permissive, its
default: TLS and plaintext on one port) and against Apache RocketMQ's 5.x proxy with its
defaults (permissive, a self-signed certificate of its own: tlsTestModeEnable). A producer
and a SimpleConsumer, then a PushConsumer: every message comes through. What Python clients
see in each tlsMode is tests/integration/test_proxy_tls.py's."""

from __future__ import annotations

import re

import pytest

from tests.apache import run_java
from tests.compat.backends import BACKENDS, start_backend
from tests.compat.specs import json_lines
from tests.integration import support

pytestmark = [pytest.mark.timeout(600), pytest.mark.apache5]
SCENARIOS = ("normal", "push")
# Parity5's topics and groups with this after their names: the parity suite sends to
# J5Normal and J5Push on the same shared Apache back end (tests/compat/backends.py).
SUFFIX = "Tls"


@pytest.fixture(scope="module", params=BACKENDS)
def observed(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"sdk5-tls-{request.param}")
    (d / "certs").mkdir()
    certs = support.make_test_certs(d / "certs")
    tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    backend = start_backend(request.param, d, ferry_proxy_args=tls)
    try:
        backend.create_topic(f"J5Normal{SUFFIX}", 4)
        backend.create_topic(f"J5Push{SUFFIX}", 4)
        backend.set_group(f"j5-normal{SUFFIX}")
        backend.set_group(f"j5-push{SUFFIX}")
        if request.param == "ferry":
            assert "TLS and plaintext on one port" in backend.proxy.log()
        result = run_java(
            "sdk5",
            "ferry.compat.Parity5",
            [backend.endpoint, *SCENARIOS],
            directory=d / "parity5",
            timeout_s=300,
            system_properties=["-Dparity5.ssl=true", f"-Dparity5.suffix={SUFFIX}"],
        )
    finally:
        backend.release()
    if request.param == "ferry":  # the SDK's connections went the TLS way
        [(tls, plain)] = re.findall(
            r"served (\d+) TLS and (\d+) plaintext connections", backend.proxy.log()
        )
        assert int(tls) >= 1 and int(plain) == 0, backend.proxy.log()[-3000:]
    return list(json_lines(result.stdout)), result.stderr


def _events(observed, scenario: str, event: str) -> list[dict]:
    lines, stderr = observed
    ends = [e for e in lines if e["scenario"] == scenario and e["event"] in ("done", "error")]
    assert ends and ends[-1]["event"] == "done", (ends, stderr[-3000:])
    return [e for e in lines if e["scenario"] == scenario and e["event"] == event]


def test_a_producer_and_a_simple_consumer_work_over_tls(observed):
    sent = {e["body"] for e in _events(observed, "normal", "sent")}
    got = [m["body"] for m in _events(observed, "normal", "received")]
    assert len(sent) == 12
    assert sorted(got) == sorted(f"normal {i}" for i in range(0, 12, 2))


def test_a_push_consumer_works_over_tls(observed):
    sent = [e["body"] for e in _events(observed, "push", "sent")]
    consumed = [m["body"] for m in _events(observed, "push", "consumed")]
    assert len(sent) == 16 and sorted(consumed) == sorted(sent)
