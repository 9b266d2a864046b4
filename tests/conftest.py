"""Shared fixtures: fake clock, in-process servers on 127.0.0.1:0, etcd, metric registries.

Waiting on a condition is tests/waiting.py's; its helpers are importable from here too
for code outside tests/ (benchmarks/admin_bench.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import settings
from prometheus_client import CollectorRegistry

from ferry.runtime.clock import FakeClock
from ferry.v1 import namesrv_pb2_grpc
from services.namesrv.app import NamesrvApp, NamesrvConfig
from tests import apache, durations
from tests.waiting import wait_equal, wait_for, wait_for_async  # noqa: F401 (re-exported)

# Property tests judge what code does, never how fast one example ran: Hypothesis's
# default 200 ms deadline per example failed decoder tests on a loaded 2-core machine.
settings.register_profile("ferry", deadline=None)
settings.load_profile("ferry")

# Every JVM a test starts (Apache RocketMQ, the Java clients, mqadmin) starts on C1 and
# the serial collector: cheaper to start, and no test measures speed (tests/apache.py).
apache.quick_start = True


class LoopThread:
    """An asyncio event loop in a background thread, for running servers in-process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 30.0) -> Any:
        future: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a plain function on the loop thread (safe access to server state)."""

        async def wrapper() -> Any:
            return fn(*args)

        return self.run(wrapper())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass
class RunningNamesrv:
    app: NamesrvApp
    loop: LoopThread
    addr: str
    home: Path
    channel: grpc.Channel
    stub: namesrv_pb2_grpc.NameServerStub

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.app.metrics_port}/metrics"

    @property
    def remoting_addr(self) -> str:
        """RocketMQ's protocol: what brokers' namesrvAddr, the proxy's and the
        CLI's --namesrv name (`addr` is the ferry.v1 gRPC address)."""
        return f"127.0.0.1:{self.app.remoting_port}"

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.app.stop())


def start_namesrv(loop: LoopThread, home: Path, **config: Any) -> RunningNamesrv:
    settings = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "home": home,
        "grace_s": 0.5,
        **config,
    }
    clock = settings.pop("clock", None)

    async def build_and_start() -> NamesrvApp:
        app = NamesrvApp(NamesrvConfig(**settings), clock=clock, registry=CollectorRegistry())
        await app.start()
        return app

    app = loop.run(build_and_start())
    addr = f"127.0.0.1:{app.port}"
    channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)])
    return RunningNamesrv(app, loop, addr, home, channel, namesrv_pb2_grpc.NameServerStub(channel))


def copy_store(src: Path, dst: Path) -> None:
    """Copy a store directory keeping its files sparse. shutil.copytree writes every
    hole out as zeros: a store's index file (RocketMQ's IndexFile, 420 MB by default,
    almost all of it a hole) made each copy of a store cost ~0.2 s and 420 MB of disk."""
    shutil.copytree(src, dst, copy_function=_copy_sparse)


def _copy_sparse(src: str, dst: str) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            fin.seek(start)
            fout.seek(start)
            left = end - start
            while left:
                chunk = fin.read(min(left, 1 << 20))
                if not chunk:
                    break
                fout.write(chunk)
                left -= len(chunk)
            pos = end
        fout.truncate(size)
    shutil.copystat(src, dst)


@pytest.fixture(autouse=True)
def main_thread_event_loop() -> None:
    """Give the main thread a current event loop when an earlier test left it
    without one. `asyncio.run` ends by clearing the main thread's loop, after
    which `asyncio.get_event_loop()` raises there; the RocketMQ 5 Python SDK
    opens its Telemetry stream through grpc.aio from the caller's thread, which
    asks for that loop, so an SDK client started after such a test (on the same
    xdist worker) failed with "There is no current event loop in thread
    'MainThread'" and then reported the topic's route as missing."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(_spare_loop())


_SPARE_LOOP: list[asyncio.AbstractEventLoop] = []


def _spare_loop() -> asyncio.AbstractEventLoop:
    """One loop per process for `main_thread_event_loop`, never run by the tests."""
    if not _SPARE_LOOP or _SPARE_LOOP[0].is_closed():
        _SPARE_LOOP[:] = [asyncio.new_event_loop()]
    return _SPARE_LOOP[0]


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def namesrv(loop_thread: LoopThread, tmp_path: Path) -> Iterator[RunningNamesrv]:
    """A real name server on 127.0.0.1:0 (in-process), with a blocking stub."""
    ns = start_namesrv(loop_thread, tmp_path / "namesrv")
    yield ns
    ns.stop()


# ---------------------------------------------------------------- brokers


@dataclass
class RunningBroker:
    app: Any  # services.broker.app.BrokerApp
    loop: LoopThread
    addr: str
    channel: grpc.Channel

    @property
    def remoting_addr(self) -> str:
        """RocketMQ's protocol (`addr` is the ferry.v1 gRPC address)."""
        return f"127.0.0.1:{self.app.remoting_port}"

    @property
    def broker(self):
        from ferry.v1 import broker_pb2_grpc

        return broker_pb2_grpc.BrokerStub(self.channel)

    @property
    def admin(self):
        from ferry.v1 import broker_admin_pb2_grpc

        return broker_admin_pb2_grpc.BrokerAdminStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.loop.run(self.app.stop())


def broker_options(store_root: Path, namesrv_addrs: str = "", **keys: Any) -> list[str]:
    """`-o` overrides for a test broker: loopback, free ports, small files."""
    options = {
        "bindAddress": "127.0.0.1",
        "brokerIP1": "127.0.0.1",
        "listenPort": 0,
        "haListenPort": 0,
        "metricsPort": -1,
        "storePathRootDir": store_root,
        "mappedFileSizeCommitLog": 1 << 20,
        "maxMessageSize": 64 * 1024,
        "shutdownGraceSeconds": 0,
        # The host's disk is shared and may already be near RocketMQ's 90 % warning
        # ratio: test brokers refuse sends or delete files only when a test asks for
        # it (tests/chaos/test_disk_pressure.py sets the defaults back on a tmpfs).
        "diskMaxUsedSpaceRatio": 99,
        "diskSpaceCleanForciblyRatio": 99,
        "diskSpaceWarningLevelRatio": 99,
        **keys,
    }
    if namesrv_addrs:
        options["namesrvAddr"] = namesrv_addrs
    return [f"{k}={v}" for k, v in options.items()]


def start_broker(
    loop: LoopThread,
    store_root: Path,
    namesrv_addrs: str = "",
    clock: Any = None,
    **keys: Any,
) -> RunningBroker:
    from services.broker.app import BrokerApp
    from services.broker.config import load_config

    config, _ = load_config(None, broker_options(store_root, namesrv_addrs, **keys), env={})

    async def build_and_start():
        app = BrokerApp(config, clock=clock, registry=CollectorRegistry())
        await app.start()
        return app

    app = loop.run(build_and_start())
    addr = f"127.0.0.1:{app.port}"
    channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)])
    return RunningBroker(app, loop, addr, channel)


def _shares_apache(item) -> bool:
    return item.get_closest_marker("apache5") is not None


def pytest_collection_modifyitems(session, config, items):
    """The modules that share a pytest process's Apache RocketMQ 5 back end (marked
    `apache5`, tests/compat/backends.py) first, so that each worker runs its share of them
    one after another on one back end; then the slowest modules, longest first, the rest
    in collection order (tests/durations.py): with `--dist loadfile` no worker is left
    running a long module alone at the end. A stable sort keeps each module's own order."""
    items.sort(key=lambda item: (not _shares_apache(item), -durations.weight(item.nodeid)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of `apache5` modules (the next test is not of one, or
    there is none), the shared Apache back end stops: its JVMs do not idle beside the
    rest of the suite."""
    yield
    if nextitem is None or not _shares_apache(nextitem):
        _stop_shared_apache()


def _stop_shared_apache() -> None:
    # Only where a module imported it: the back end is started by nothing else.
    backends = sys.modules.get("tests.compat.backends")
    if backends is not None:
        backends.stop_shared_apache()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    _stop_shared_apache()  # where the session ended early (-x, a failed fixture)
    # CPython 3.11 before 3.11.8 (gh-106905): a finalizer that runs Python code
    # while the AST is being built (here: garbage from gRPC channels collected
    # during hypothesis's lazy import in the terminal summary) makes ast.parse
    # fail with "AST constructor recursion depth mismatch". Collect it first.
    import gc

    gc.collect()


# ---------------------------------------------------------------- etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Any]:
    """A real one-member etcd on 127.0.0.1 (tests/etcd.py), healthy; stopped by PID after."""
    from tests.etcd import EtcdServer

    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.stop()
