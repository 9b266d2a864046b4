"""Integration fixtures. Helpers live in tests/integration/support.py; the in-process
`namesrv` fixture and `start_namesrv` live in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import LoopThread, RunningNamesrv, start_broker, start_namesrv
from tests.integration.support import BrokerProcess, NamesrvProcess


@pytest.fixture
def ns(loop_thread: LoopThread, tmp_path: Path) -> Iterator[RunningNamesrv]:
    """Like `namesrv`, without the /metrics endpoint (whose shutdown costs 0.5 s a test)."""
    server = start_namesrv(loop_thread, tmp_path / "namesrv", metrics_port=-1)
    yield server
    server.stop()


@pytest.fixture
def two_brokers(loop_thread: LoopThread, tmp_path: Path, ns: RunningNamesrv) -> Iterator:
    """(the name server, [broker-a, broker-b]): two in-process masters registered
    with it; a broker a test stopped itself is left alone at teardown."""
    brokers = [
        start_broker(loop_thread, tmp_path / name, ns.remoting_addr, brokerName=name)
        for name in ("broker-a", "broker-b")
    ]
    yield ns, brokers
    for b in brokers:
        if b.app.gate.open:
            b.stop()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator:
    """Factory of broker-like KeepAlive subprocesses; every one is killed at teardown."""
    started: list[BrokerProcess] = []

    def start(
        namesrv_addr: str,
        addr: str = "127.0.0.1:20911",
        instance_id: str = "run-1",
        topic: str = "KeepAliveTopic",
    ) -> BrokerProcess:
        log = tmp_path / f"broker-{len(started)}.log"
        broker = BrokerProcess(namesrv_addr, addr, instance_id, topic, log)
        started.append(broker)
        return broker

    yield start
    for broker in reversed(started):
        broker.stop()


@pytest.fixture
def namesrv_process(tmp_path: Path) -> Iterator:
    """Factory of name-server subprocesses; each is stopped by PID at teardown."""
    started: list[NamesrvProcess] = []

    def start(home: Path | None = None, extra_args: Sequence[str] = ()) -> NamesrvProcess:
        p = NamesrvProcess(home or tmp_path / f"ns{len(started)}", extra_args)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()
