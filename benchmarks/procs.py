"""Servers under test as child processes, and CPU pinning.

`ServerProcess` starts `python -m MODULE ... --port-file F`, waits for the
port file, and stops the child by its PID (SIGTERM, then SIGKILL). Use it as a
context manager so the child is stopped on every path. `namesrv_process` is a
name server on loopback, `wait_for_route` waits until it routes a topic, and
`free_port` finds a port for a server that needs one named up front. `pinned` pins the
calling process (the load generator) to some CPUs and restores the old mask.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.processes import port_free

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_plan() -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, load-generator CPUs): one core each when we have two, else no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def pinning_note(
    server_cpus: set[int] | None,
    client_cpus: set[int] | None,
    servers: str = "Servers",
    clients: str = "load generator",
) -> str:
    """The line a benchmark section records about CPU placement."""
    if server_cpus is None:
        return f"Fewer than 2 CPUs: {servers.lower()} and {clients} were not pinned."
    return (
        f"{servers} pinned to CPU {sorted(server_cpus)}, {clients} to CPU "
        f"{sorted(client_cpus or ())}."
    )  # fmt: skip


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    if cpus is None:
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class ServerProcess:
    """A server child process that writes {grpc_port, pid, ...} to a port file when ready."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        workdir: Path,
        name: str,
        cpus: set[int] | None = None,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.module = module
        self.args = list(args)
        self.workdir = workdir
        self.name = name
        self.cpus = cpus
        self.ready_timeout_s = ready_timeout_s
        self.port_file = workdir / f"{name}.port.json"
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def target(self) -> str:
        """Its ferry.v1 gRPC address."""
        return f"127.0.0.1:{self.info['grpc_port']}"

    @property
    def remoting_target(self) -> str:
        """A name server's or broker's RocketMQ-protocol address (what brokers'
        namesrvAddr and the proxy's -n name)."""
        return f"127.0.0.1:{self.info['remoting_port']}"

    def start(self) -> ServerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", self.module, *self.args, "--port-file", str(self.port_file)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        if self.cpus is not None:
            # Before the child starts any thread; threads inherit the main thread's mask.
            os.sched_setaffinity(self.proc.pid, self.cpus)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} wrote no port file within {self.ready_timeout_s}s:\n"
                    + self.log_tail()
                )
            time.sleep(0.02)
        self.info = json.loads(self.port_file.read_text())
        if self.info.get("pid") != self.proc.pid:
            raise RuntimeError(f"{self.name}: port file names pid {self.info.get('pid')}")
        return self

    def cpu_seconds(self) -> float:
        """User + system CPU time the child has used so far."""
        return cpu_seconds(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)

    def __enter__(self) -> ServerProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dirty_bytes() -> int:
    """Page-cache bytes not yet on disk (Dirty + Writeback of /proc/meminfo; 0
    where there is no such file)."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Dirty", "Writeback"):
                total += int(rest.split()[0]) * 1024
    return total


def settle_disk(limit_bytes: int = 32 << 20, timeout_s: float = 120.0) -> tuple[int, float]:
    """Before a benchmark: write back what earlier ones left dirty, so that
    none of them pays for another's writeback. Returns (dirty bytes found,
    seconds waited), which the progress line reports. (In the full run of
    2026-11-26 every benchmark found 0 MiB: the order effect seen in the pop
    benchmark that day did not come from writeback.)"""
    found = dirty_bytes()
    start = time.monotonic()
    os.sync()
    while dirty_bytes() > limit_bytes and time.monotonic() - start < timeout_s:
        time.sleep(0.2)
    return found, time.monotonic() - start


# Ports handed to servers that must be told theirs: below the kernel's ephemeral range
# (32768-60999 here), so no outgoing connection is given one between free_port() and
# the server's bind -- or while a server restarts on its old port (the HA benchmark's
# master does, and CI once lost a run to a gRPC client's socket holding its HA port).
# The tests' servers take 10000-32767 (tests/integration/support.py), so the
# benchmarks take from below that; each port is handed out once a process.
_PORT_RANGE = (4000, 9800)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before (for a server that must be
    told its port), from below the ephemeral range."""
    low, high = _PORT_RANGE
    start = random.randrange(low, high)
    for i in range(high - low):
        port = low + (start - low + i) % (high - low)
        if port not in _handed_out and port_free(port, reuse_address=True):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free loopback port left in {low}-{high}")


def namesrv_process(workdir: Path, cpus: set[int] | None = None, name: str = "namesrv"):
    """A name server on a free loopback port, its home under `workdir`."""
    args = ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1"]
    return ServerProcess(
        "services.namesrv", [*args, "--home", str(workdir / f"{name}-home")], workdir, name, cpus
    )


def wait_for_remoting_route(namesrv: str, topic: str, timeout_s: float = 60.0) -> None:
    """Wait until the name server at `namesrv` (host:port of its RocketMQ-protocol
    port: Apache's or ferry's) answers GET_ROUTEINFO_BY_TOPIC for `topic`."""
    from ferry.remoting import codes
    from ferry.remoting.client import call
    from ferry.remoting.codec import Command

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), 5)
            if answer.code == codes.SUCCESS:
                return
        except (OSError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no route for {topic} on the name server {namesrv} after {timeout_s} s"
            )
        time.sleep(0.05)


def wait_for_route(namesrv: str, topic: str, timeout_s: float = 30.0) -> None:
    """Wait until the name server at `namesrv` routes `topic` to some queue."""
    import grpc

    from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc

    with grpc.insecure_channel(namesrv) as channel:
        stub = namesrv_pb2_grpc.NameServerStub(channel)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                route = stub.GetRouteInfoByTopic(
                    namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=timeout_s
                )
                if route.queue_datas:
                    return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"no route for {topic} on the name server after {timeout_s} s")
            time.sleep(0.05)
