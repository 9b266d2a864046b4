"""Apache RocketMQ for tests and benchmarks: its published jars, run as child JVMs on loopback.

The jars come from Maven Central through ferry's own Maven project (tests/compat/pom.xml,
`make apache`), which copies five class paths under `.cache/rocketmq/` (outside git):

- `rocketmq4`: Apache RocketMQ 4.9 (name server, broker, mqadmin, the remoting client, the
  benchmark tools) and ferry's 4.x test programs (tests/compat/rocketmq4/src);
- `rocketmq5`: Apache RocketMQ 5.x (name server, broker, the proxy in local mode, mqadmin)
  and ferry's admin program (tests/compat/rocketmq5/src);
- `sdk5`: the RocketMQ 5 Java SDK and ferry's parity programs (tests/compat/sdk5/src);
- `spring`: rocketmq-spring-boot 2.3.5 (the Spring starter's RocketMQTemplate) and ferry's
  program that sends through it (tests/compat/spring/src);
- `client49`: the 4.x Java client (rocketmq-client 4.9.8) alone and ferry's client programs
  for the remoting tests (tests/compat/client49/src, run by tests/compat/clients.py).

`ApacheNamesrv`, `ApacheBroker` and `ApacheProxy` each own one JVM: free loopback ports,
small heaps, `ROCKETMQ_HOME` and `user.home` inside the process's own directory (logs,
store and configuration all live there: nothing is written outside it), the `--add-opens`
Java 17 needs, `brokerIP1=127.0.0.1`. `start()` waits for the JVM's own "boot success" line
and a listening port, and fails with the JVM's last log lines when it does not come; `stop()`
sends SIGTERM by PID, then SIGKILL, and always reaps. `run_java()` runs a short-lived program
(mqadmin, a test program) with a timeout and returns what it printed. `ApacheAdmin` keeps one
admin JVM (ferry's Admin5) for a test module's topic and group commands.

A machine without Java or Maven, or without the jars, gets an error naming what to install or
run, never a skip: CI installs them (.ci/run → make tools → make apache).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.processes import free_port, port_free, signal_and_reap
from tests.waiting import wait_for

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "rocketmq"
CONF = Path(__file__).resolve().parent / "compat" / "conf"
# What the Maven project resolved (tests/compat/pom.xml: rocketmq4.version, rocketmq5.version).
ROCKETMQ4_VERSION = "4.9.7"
ROCKETMQ5_VERSION = "5.5.0"

START_TIMEOUT_S = 90.0
BIND_TRIES = 3  # starts of a JVM whose picked port another process took first
STOP_TIMEOUT_S = 20.0
RUN_TIMEOUT_S = 120.0

# Java 17 closes the JDK internals RocketMQ reaches into: MappedFile's unmapping
# (DirectByteBuffer.cleaner), the 5.x controller's reflection, sun.nio.ch for read-ahead.
JAVA17_OPENS = (
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
)
# The 90 % disk guard refuses sends on a full CI disk; tests keep their stores small.
DISK_GUARD = (
    "-Drocketmq.broker.diskSpaceWarningLevelRatio=0.98",
    "-Drocketmq.broker.diskSpaceCleanForciblyRatio=0.97",
)


# JIT and collector flags for every JVM this module starts. The test suite turns on
# `quick_start` (tests/conftest.py): C1 only and the serial collector cost a JVM about a
# quarter less CPU to start (measured: a 4.9 name server + broker 11.3 -> 7.2 s of CPU,
# the 5.x proxy 28.5 -> 24.1 s), and a test's Java time is mostly starting. Benchmarks
# keep the JVM's defaults (C2, G1 for servers): they measure steady state.
QUICK_START_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
quick_start = False


def jvm_flags(server: bool) -> list[str]:
    """The JIT and collector flags: quick-start ones for tests, else G1 for a server
    and the serial collector for a short-lived program."""
    if quick_start:
        return list(QUICK_START_FLAGS)
    return ["-XX:+UseG1GC"] if server else ["-XX:+UseSerialGC"]


class ApacheUnavailable(RuntimeError):
    """Java, Maven or the jars are missing: the message says what to install or run."""


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise ApacheUnavailable(
            "Apache RocketMQ runs on Java 17, and `java` is not on PATH: install it "
            "(sudo apt-get install -y openjdk-17-jdk-headless maven), then run `make apache`"
        )
    return java


def classpath(kit: str) -> str:
    """The class path of one kit ("rocketmq4", "rocketmq5", "sdk5", "spring" or "client49"), checked
    to exist."""
    lib = CACHE / kit / "lib"
    if not (lib / "ferry-compat-programs.jar").exists():
        hint = "" if shutil.which("mvn") else " (Maven is missing: sudo apt-get install -y maven)"
        raise ApacheUnavailable(
            f"Apache RocketMQ's jars are not in {lib}: run `make apache`, which resolves them "
            f"from Maven Central with tests/compat/pom.xml{hint}"
        )
    return f"{lib}/*"


def free_port_pair() -> int:
    """A free port p with p+1 free too (RocketMQ puts HA or the remoting port beside it),
    and p-2 free (a 4.x broker's VIP channel)."""
    for _ in range(50):
        port = free_port()
        if port < 1026 or port > 65000:
            continue
        if all(port_free(p) for p in (port - 2, port + 1)):
            return port
    raise RuntimeError("no free loopback port with its neighbours free after 50 tries")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _properties(values: dict[str, object]) -> str:
    return "".join(f"{key}={_prop(value)}\n" for key, value in values.items())


def _prop(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class JavaProcess:
    """One long-running JVM with its own directory (home, logs, store); see the module doc."""

    kit = "rocketmq4"
    main_class = ""
    ready_line = ""
    heap = "256m"
    port_fields: tuple[str, ...] = ()  # the attributes `prepare` picks a port for when 0

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = Path(directory)
        self.name = name
        self.home = self.directory / "home"
        self.stdout_path = self.directory / "stdout.log"
        self._proc: subprocess.Popen | None = None

    # --------------------------------------------------------------- subclass hooks
    def arguments(self) -> list[str]:
        return []

    def system_properties(self) -> list[str]:
        return []

    def ports(self) -> list[int]:
        """Ports that must accept connections before the process counts as started."""
        return []

    def prepare(self) -> None:
        """Write the configuration files the arguments name."""

    # --------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        heap = self.heap
        return [
            java_binary(),
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:MaxDirectMemorySize=512m",
            *jvm_flags(server=True),
            "-XX:-OmitStackTraceInFastThrow",
            "-Djava.net.preferIPv4Stack=true",
            *JAVA17_OPENS,
            *_private_dirs(self.directory, self.home),
            "-Drocketmq.client.logUseSlf4j=true",
            *DISK_GUARD,
            *self.system_properties(),
            "-cp",
            classpath(self.kit),
            self.main_class,
            *self.arguments(),
        ]

    def environment(self) -> dict[str, str]:
        return dict(_java_env(self.home), RMQ_PROXY_HOME=str(self.home))

    def start(self, timeout_s: float = START_TIMEOUT_S):
        """Start and wait until ready. Ports this process picked itself are picked
        again when it could not bind one: a port found free is only free until some
        other process (another test worker's server) takes it before this JVM binds it."""
        picked = [f for f in self.port_fields if not getattr(self, f)]
        tries = BIND_TRIES if picked else 1
        while True:
            tries -= 1
            try:
                return self._start_once(timeout_s)
            except RuntimeError as e:
                if not tries or "Address already in use" not in str(e):
                    raise
                log.warning("%s could not bind a port it picked; picking again (%s)", self.name, e)
                for field in picked:
                    setattr(self, field, 0)

    def _start_once(self, timeout_s: float):
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.home.mkdir(parents=True, exist_ok=True)
        _install_conf(self.home)
        self.prepare()
        command = self.command()
        with open(self.stdout_path, "ab") as out:
            self._proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                env=self.environment(),
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM by PID (RocketMQ's shutdown hook flushes and closes), SIGKILL after
        `timeout_s`; always reaps."""
        self._signal_and_reap(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        self._signal_and_reap(signal.SIGKILL, STOP_TIMEOUT_S)

    def __enter__(self):
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        """The JVM's stdout and its RocketMQ log files, last lines of each."""
        parts = []
        for path in [self.stdout_path, *sorted(self.log_dir().glob("*.log"))]:
            try:
                text = path.read_text(errors="replace")
            except FileNotFoundError:
                continue
            if text.strip():
                parts.append(f"--- {path}:\n{text[-chars:]}")
        return "\n".join(parts) or "(no log)"

    def log_dir(self) -> Path:
        return self.home / "logs" / "rocketmqlogs"

    def _wait_ready(self, timeout_s: float) -> None:
        def ready() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} (Apache RocketMQ, {self.main_class}) exited with status "
                    f"{self._proc.returncode} while starting; its logs end:\n{self.log_tail()}"
                )
            said = not self.ready_line or self.ready_line in self.stdout_path.read_text(
                errors="replace"
            )
            return said and all(port_open(port) for port in self.ports())

        try:
            wait_for(ready, timeout_s, f"{self.name} to be ready", interval_s=0.1)
        except AssertionError:
            raise RuntimeError(
                f"{self.name} (Apache RocketMQ, {self.main_class}) was not ready within "
                f"{timeout_s:.0f}s (waiting for {self.ready_line!r} and ports {self.ports()}); "
                f"its logs end:\n{self.log_tail()}"
            ) from None

    def _signal_and_reap(self, sig: int, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        signal_and_reap(proc, sig, timeout_s)

    def __repr__(self) -> str:
        state = f"pid {self._proc.pid}" if self.running and self._proc else "stopped"
        return f"{type(self).__name__}({self.name}, {state}, {self.directory})"


def _private_dirs(directory: Path, home: Path) -> list[str]:
    """Everything a JVM writes stays in its directory: logs and stores (user.home,
    rocketmq.home.dir), temporary files (the 5.x proxy's self-signed gRPC certificate,
    RocksDB's native library) and no hsperfdata in /tmp."""
    tmp = directory / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return [
        f"-Duser.home={home}",
        f"-Drocketmq.home.dir={home}",
        f"-Djava.io.tmpdir={tmp}",
        "-XX:-UsePerfData",
    ]


def _install_conf(home: Path) -> None:
    """ROCKETMQ_HOME/conf with ferry's logback files (4.9 refuses to start without them;
    they exist only in Apache's binary zip, which is not on Maven Central)."""
    conf = home / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for source in CONF.glob("*.xml"):
        shutil.copyfile(source, conf / source.name)


# Apache sheds a send that waited in its send queue over 200 ms ("[TIMEOUT_CLEAN_QUEUE]broker
# busy", code 2) or held the commit-log lock over 1 s ("[PC_SYNCHRONIZED]"). Two cores shared
# with a parallel test worker reach that on an idle broker, and the tests then fail on the
# oracle's load shedding, not on what they check; 10 s keeps the shedding for a broker that
# is truly stuck. The benchmarks put Apache's shipped values back (APACHE_FLOW_CONTROL).
LOADED_MACHINE = {"waitTimeMillsInSendQueue": 10_000, "osPageCacheBusyTimeOutMills": 10_000}
APACHE_FLOW_CONTROL = {"waitTimeMillsInSendQueue": 200, "osPageCacheBusyTimeOutMills": 1000}


def _broker_conf(
    broker_name: str, broker_id: int, role: str, port: int, store_dir: Path, namesrv: str
) -> dict[str, object]:
    """broker.conf for a broker on loopback: HA on port + 1, the store in `store_dir`, 64 MiB
    commit-log files, asynchronous flushing, topics created on first use, and flow control
    that tolerates a loaded test machine (`LOADED_MACHINE`)."""
    values: dict[str, object] = {
        "brokerClusterName": "ApacheCluster",
        "brokerName": broker_name,
        "brokerId": broker_id,
        "brokerRole": role,
        "brokerIP1": "127.0.0.1",
        "listenPort": port,
        "haListenPort": port + 1,
        "storePathRootDir": store_dir,
        "storePathCommitLog": store_dir / "commitlog",
        "flushDiskType": "ASYNC_FLUSH",
        "mappedFileSizeCommitLog": 64 * 1024 * 1024,
        "autoCreateTopicEnable": True,
        **LOADED_MACHINE,
    }
    if namesrv:
        values["namesrvAddr"] = namesrv
    if quick_start:
        values.update(QUICK_START_BROKER)
    return values


# A 5.x broker's TimerFlushService forces its whole timer wheel file (~40 MiB, mapped) to
# disk every timerFlushIntervalMs, 1 s by default: about a third of a core here while the
# broker does nothing else (measured: an idle proxy in local mode 0.40 cores, 0.32 of it that
# thread). The tests never crash a broker that holds timers, so they flush once a minute;
# benchmarks keep Apache's default. (4.9 has no timer and ignores the key.)
QUICK_START_BROKER: dict[str, object] = {"timerFlushIntervalMs": 60_000}


class ApacheNamesrv(JavaProcess):
    """An Apache name server (4.9 with kit "rocketmq4", 5.x with "rocketmq5")."""

    main_class = "org.apache.rocketmq.namesrv.NamesrvStartup"
    ready_line = "The Name Server boot success"
    heap = "128m"
    port_fields = ("port",)

    def __init__(self, directory: Path, kit: str = "rocketmq4", name: str = "apache-namesrv"):
        super().__init__(directory, name)
        self.kit = kit
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def prepare(self) -> None:
        if not self.port:
            self.port = free_port()
        (self.home / "namesrv.properties").write_text(_properties({"listenPort": self.port}))

    def arguments(self) -> list[str]:
        return ["-c", str(self.home / "namesrv.properties")]

    def ports(self) -> list[int]:
        return [self.port]


class ApacheBroker(JavaProcess):
    """An Apache broker of any role. `settings` are broker.conf keys (Apache's names), on
    top of the loopback defaults below; the store lives in `directory/store`."""

    main_class = "org.apache.rocketmq.broker.BrokerStartup"
    ready_line = "boot success"
    heap = "512m"
    port_fields = ("port",)

    def __init__(
        self,
        directory: Path,
        *,
        kit: str = "rocketmq4",
        name: str = "apache-broker",
        broker_name: str = "broker-a",
        broker_id: int = 0,
        role: str = "ASYNC_MASTER",
        namesrv: str = "",
        settings: dict[str, object] | None = None,
    ) -> None:
        super().__init__(directory, name)
        self.kit = kit
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.role = role
        self.namesrv = namesrv
        self.settings = dict(settings or {})
        self.port = 0
        self.store_dir = self.directory / "store"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ha_port(self) -> int:
        """haListenPort: beside listenPort, as RocketMQ's default puts it."""
        return self.port + 1

    @property
    def ha_address(self) -> str:
        return f"127.0.0.1:{self.ha_port}"

    @property
    def commit_log_dir(self) -> Path:
        return self.store_dir / "commitlog"

    def prepare(self) -> None:
        if not self.port:
            self.port = free_port_pair()
        values = _broker_conf(
            self.broker_name, self.broker_id, self.role, self.port, self.store_dir, self.namesrv
        )
        values.update(
            {"brokerIP2": "127.0.0.1", "deleteWhen": "04", "fileReservedTime": 48},
            **self.settings,
        )
        (self.home / "broker.conf").write_text(_properties(values))

    def arguments(self) -> list[str]:
        return ["-c", str(self.home / "broker.conf")]

    def ports(self) -> list[int]:
        return [self.port]


class ApacheProxy(JavaProcess):
    """Apache's 5.x proxy in local mode: the proxy and a broker in one JVM (what
    `mqbroker --enable-proxy` runs). gRPC (the v5 SDKs) on `grpc_port`, remoting on
    `remoting_port`, the embedded broker on `broker_port`."""

    kit = "rocketmq5"
    main_class = "org.apache.rocketmq.proxy.ProxyStartup"
    ready_line = "rocketmq-proxy startup successfully"
    heap = "768m"
    port_fields = ("grpc_port", "remoting_port", "broker_port")

    def __init__(
        self,
        directory: Path,
        namesrv: str,
        *,
        name: str = "apache-proxy",
        broker_name: str = "broker-a",
        broker_settings: dict[str, object] | None = None,
        proxy_settings: dict[str, object] | None = None,
    ) -> None:
        super().__init__(directory, name)
        self.namesrv = namesrv
        self.broker_name = broker_name
        self.broker_settings = dict(broker_settings or {})
        self.proxy_settings = dict(proxy_settings or {})
        self.grpc_port = 0
        self.remoting_port = 0
        self.broker_port = 0
        self.store_dir = self.directory / "store"

    @property
    def endpoint(self) -> str:
        """host:port of the gRPC endpoint, as a v5 SDK takes it."""
        return f"127.0.0.1:{self.grpc_port}"

    def prepare(self) -> None:
        if not self.grpc_port:
            self.grpc_port = free_port()
            self.remoting_port = free_port()
            self.broker_port = free_port_pair()
        broker = _broker_conf(
            self.broker_name, 0, "ASYNC_MASTER", self.broker_port, self.store_dir, self.namesrv
        )
        broker.update(
            {"autoCreateSubscriptionGroup": True, "enablePropertyFilter": True},
            **self.broker_settings,
        )
        (self.home / "broker.conf").write_text(_properties(broker))
        proxy: dict[str, object] = {
            "rocketMQClusterName": "ApacheCluster",
            "namesrvAddr": self.namesrv,
            "proxyMode": "local",
            "grpcServerPort": self.grpc_port,
            "remotingListenPort": self.remoting_port,
            "localServeAddr": "127.0.0.1",
        }
        proxy.update(self.proxy_settings)
        (self.home / "rmq-proxy.json").write_text(json.dumps(proxy, indent=2))

    def arguments(self) -> list[str]:
        return [
            "-pm",
            "local",
            "-bc",
            str(self.home / "broker.conf"),
            "-pc",
            str(self.home / "rmq-proxy.json"),
        ]

    def ports(self) -> list[int]:
        return [self.grpc_port, self.broker_port]


class ApacheAdmin:
    """ferry's Admin5 (tests/compat/rocketmq5): `mqadmin updateTopic` and `updateSubGroup`
    for a whole test module in one JVM, as each mqadmin run spends ~5 s shutting its client
    down. `call()` sends one command and returns its answer; `stop()` closes its stdin (it
    exits) and reaps it, by PID, killing it when it does not go."""

    def __init__(self, directory: Path, namesrv: str, cluster: str = "ApacheCluster") -> None:
        self.directory = Path(directory)
        self.namesrv = namesrv
        self.cluster = cluster
        self.stderr_path = self.directory / "stderr.log"
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one command at a time, from any thread

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ApacheAdmin:
        home = self.directory / "home"
        home.mkdir(parents=True, exist_ok=True)
        _install_conf(home)
        with open(self.stderr_path, "ab") as err:
            self._proc = subprocess.Popen(
                [
                    *_java_command(home, "rocketmq5", "128m"),
                    "ferry.compat.Admin5",
                    self.namesrv,
                    self.cluster,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=self.directory,
                env=_java_env(home),
                text=True,
                bufsize=1,
            )
        try:
            self._answer(timeout_s, "start")
        except BaseException:
            self.stop()
            raise
        return self

    def call(self, timeout_s: float = 60.0, **command: object) -> dict:
        """One command (see Admin5.java); fails with the program's error when it is not ok."""
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                raise RuntimeError("Admin5 is not running")
            self._proc.stdin.write(json.dumps(command) + "\n")
            self._proc.stdin.flush()
            answer = self._answer(timeout_s, command.get("op", "?"))
        if not answer.get("ok"):
            raise RuntimeError(f"Admin5 {command}: {answer.get('error')}")
        return answer

    def _answer(self, timeout_s: float, what: object) -> dict:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        if not line:
            status = proc.poll()
            # An answer that comes later would be read as the next command's: the program
            # is stopped, so that nothing talks to it again (`running` turns false).
            if status is None:
                proc.kill()
            tail = self.stderr_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"Admin5 gave no answer to {what} within {timeout_s:.0f}s "
                f"(exit status {status}); it printed:\n{tail}"
            )
        return json.loads(line)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def class_archive(kit: str) -> Path:
    """The kit's class-data-sharing archive for its short-lived programs: the classes a
    training run loaded, parsed and verified once (`python -m tests.apache archive`, run by
    `make apache`), which a test program then maps instead of loading them again: some
    0.4 CPU-s less per Java client start (1.4 -> 1.0 s for a Producer49 run)."""
    return CACHE / kit / "programs.jsa"


# The kits whose programs start often in the tests, and the training run of each: a program
# of the kit against a closed loopback port (discard, 9), which loads the client, its
# remoting and logging, then fails and exits.
ARCHIVED_KITS = {
    "client49": (
        "ferry.compat.Producer49",
        ["--namesrv", "127.0.0.1:9", "--topic", "Training", "--mode", "sync", "--count", "1"],
    ),
}


def _archive_flags(kit: str) -> list[str]:
    """Test programs (the quick-start flags) map their kit's archive when `make apache`
    wrote one. A stale one (the jars changed since) is ignored by the JVM; its warning,
    printed on standard output, is turned off (the tests read that output)."""
    archive = class_archive(kit)
    if not quick_start or not archive.exists():
        return []
    return [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def write_class_archive(kit: str, directory: Path) -> Path:
    """Run the kit's training program with the tests' flags and keep the classes it loaded
    as `class_archive(kit)` (written by the JVM as it exits)."""
    global quick_start
    main_class, args = ARCHIVED_KITS[kit]
    archive = class_archive(kit)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    archive.unlink(missing_ok=True)  # the training run must not start from the old one
    saved, quick_start = quick_start, True
    try:
        home = Path(directory) / "home"
        home.mkdir(parents=True, exist_ok=True)
        _install_conf(home)
        command = _java_command(home, kit, "128m")
        command.insert(1, f"-XX:ArchiveClassesAtExit={partial}")
        subprocess.run(
            [*command, main_class, *args],
            env=_java_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT_S,
            check=False,  # the training run's send fails by design
        )
    finally:
        quick_start = saved
    if not partial.exists():
        raise RuntimeError(f"the training run of {kit} wrote no class archive ({main_class})")
    partial.replace(archive)
    return archive


def _java_command(home: Path, kit: str, heap: str, system_properties: Sequence[str] = ()):
    """`java` with the flags every short-lived program of a kit runs with, up to the class
    (`home` is the program's directory's `home`; see `_private_dirs`)."""
    return [
        java_binary(),
        f"-Xmx{heap}",
        *jvm_flags(server=False),
        *_archive_flags(kit),
        "-Djava.net.preferIPv4Stack=true",
        *JAVA17_OPENS,
        *_private_dirs(home.parent, home),
        "-Drocketmq.client.logUseSlf4j=true",
        *system_properties,
        "-cp",
        classpath(kit),
    ]


def _java_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, ROCKETMQ_HOME=str(home))
    env.pop("NAMESRV_ADDR", None)
    return env


def java_program(
    kit: str,
    main_class: str,
    args: Sequence[str],
    *,
    directory: Path,
    heap: str = "256m",
    system_properties: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a Java program of one kit, its home (logs,
    configuration) in `directory/home`: for `run_java`, and for tests that keep a program
    running (tests/compat/clients.py)."""
    home = Path(directory) / "home"
    home.mkdir(parents=True, exist_ok=True)
    _install_conf(home)
    command = [*_java_command(home, kit, heap, system_properties), main_class, *args]
    return command, _java_env(home)


def run_java(
    kit: str,
    main_class: str,
    args: Sequence[str],
    *,
    directory: Path,
    timeout_s: float = RUN_TIMEOUT_S,
    system_properties: Sequence[str] = (),
    heap: str = "256m",
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run a short-lived Java program of one kit (mqadmin, a test program) and return its
    output; `check` fails on a non-zero exit with what it printed. Killed (by PID, with its
    process group) when it overruns `timeout_s`."""
    command, env = java_program(
        kit, main_class, args, directory=directory, heap=heap, system_properties=system_properties
    )
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=directory,
        env=env,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise RuntimeError(
            f"{main_class} {' '.join(args)} did not finish within {timeout_s:.0f}s; "
            f"it printed:\n{out[-3000:]}\n{err[-3000:]}"
        ) from None
    result = subprocess.CompletedProcess(command, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{main_class} {' '.join(args)} exited with status {proc.returncode}; "
            f"it printed:\n{out[-3000:]}\n{err[-3000:]}"
        )
    return result


def main(argv: Sequence[str]) -> int:
    """`python -m tests.apache archive`: write the class archives of ARCHIVED_KITS."""
    if list(argv) != ["archive"]:
        print("usage: python -m tests.apache archive", file=sys.stderr)
        return 2
    for kit in ARCHIVED_KITS:
        with tempfile.TemporaryDirectory(prefix=f"cds-{kit}-") as d:
            started = time.monotonic()
            archive = write_class_archive(kit, Path(d))
            print(
                f"{kit}: class archive {archive} ({archive.stat().st_size >> 20} MiB) "
                f"in {time.monotonic() - started:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
