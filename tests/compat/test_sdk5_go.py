"""RocketMQ 5's official Go SDK (rocketmq-clients/golang/v5 from the Go module proxy)
through ferry's proxy: tests/compat/go5's v2send, the `apache` benchmark's send load
generator, sends for a short window and every send it counts is stored on the broker.
A benchmark whose load generator no longer runs is a bug: this is its check."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.compat.clients import GO_BIN
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

TOPIC = "GoSdkSent"
QUEUES = 2
SENDER = GO_BIN / "v2send"
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    if not SENDER.exists():
        pytest.fail(f"{SENDER} is missing: run `make go-clients` (or `make tools`)")
    d = tmp_path_factory.mktemp("go-sdk5")
    loop = LoopThread()
    ns = start_namesrv(loop, d / "ns")
    broker = start_broker(loop, d / "broker", ns.remoting_addr, brokerName="broker-go")
    support.create_topic(broker.channel, TOPIC, QUEUES)
    wait_for(lambda: support.has_route(ns.stub, TOPIC), 30, "the topic's route")
    proxy = support.ProxyProcess(d, ns.remoting_addr)
    try:
        yield proxy, broker
    finally:
        proxy.stop()
        broker.stop()
        ns.stop()
        loop.close()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SENDER), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def test_the_go_sdk_sends_through_ferrys_proxy_and_every_send_is_stored(proxied, tmp_path):
    proxy, broker = proxied
    run = _run(
        "-endpoint", proxy.endpoint, "-topic", TOPIC, "-senders", "4",
        "-warmup-s", "0.5", "-duration-s", "1",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert [e["event"] for e in events] == ["window", "window", "done"]
    done = events[-1]
    assert done["errors"] == 0 and done["sends"] > 0, done
    assert 0 < done["p50_ms"] <= done["p99_ms"]
    stored = support.pull_all(broker.channel, TOPIC, QUEUES)
    # Every send of the window, and those of the warm-up and the first one, are stored.
    assert len(stored) >= done["sends"] + 1
    assert {len(body) for body in stored.values()} == {128}


def test_bad_arguments_and_a_dead_endpoint_fail_with_a_reason():
    missing = _run("-topic", TOPIC)
    assert missing.returncode != 0 and "-endpoint and -topic are required" in missing.stderr
    dead = _run("-endpoint", "127.0.0.1:1", "-topic", TOPIC, "-duration-s", "1")
    assert dead.returncode != 0 and "v2send:" in dead.stderr
