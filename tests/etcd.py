"""A real etcd for tests: one member on 127.0.0.1, run as a child process.

`EtcdServer` owns one etcd process: it picks free loopback ports for clients and
peers, starts the command line `ferry dev` runs (`services.cli.dev.etcd.etcd_command`),
waits until GET /health says so, and stops it by PID (SIGTERM, then SIGKILL),
always reaping it. Its directory holds `data/` (etcd's --data-dir, kept across
`restart()`) and `etcd.log` (its stderr, JSON lines, warnings and up). It never
sleeps to wait for a condition and never leaves a process behind on failure.

etcd is the Debian package etcd-server (`/usr/bin/etcd`). A missing binary is
an error, not a skip: CI installs it (.ci/run).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from services.cli.dev.etcd import etcd_command, etcd_healthy, find_etcd
from tests.processes import free_port, signal_and_reap
from tests.waiting import wait_for

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
# A port chosen by bind(0) and released may be taken again before etcd binds it.
_BIND_ATTEMPTS = 3


class EtcdServer:
    """One etcd member listening only on 127.0.0.1 (clients and peers).

    Attributes:
        directory: where `data/` and `etcd.log` live.
        client_port, peer_port: its ports (the same after `restart()`).
    """

    def __init__(self, directory: Path, name: str = "etcd") -> None:
        self.directory = Path(directory)
        self.name = name
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "etcd.log"
        self.client_port = 0
        self.peer_port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """host:port, the form of the brokers' etcdEndpoints."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("etcd is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> EtcdServer:
        """Start etcd on fresh free ports and wait until it is healthy."""
        if self._proc is not None:
            raise RuntimeError("etcd already started; stop() it first or restart()")
        binary = find_etcd()
        self.directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            self.client_port, self.peer_port = free_port(), free_port()
            try:
                self._launch(binary, timeout_s)
                return self
            except _PortTaken:
                if attempt == _BIND_ATTEMPTS:
                    raise RuntimeError(
                        f"etcd found its ports taken {attempt} times in a row:\n{self.log_tail()}"
                    ) from None
        raise AssertionError("unreachable")

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> EtcdServer:
        """Stop (if running) and start again on the same ports and data."""
        self.stop()
        self._launch(find_etcd(), timeout_s)
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM by PID, SIGKILL if it has not exited within `timeout_s`; reaps it."""
        self._signal_and_reap(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL by PID (a crash: no clean shutdown); reaps it."""
        self._signal_and_reap(signal.SIGKILL, STOP_TIMEOUT_S)

    def healthy(self) -> bool:
        return self.running and etcd_healthy(self.client_port, timeout_s=1.0)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> EtcdServer:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self._proc.pid}" if self.running and self._proc else "stopped"
        return f"EtcdServer({self.endpoint}, {state}, {self.directory})"

    def _launch(self, binary: str, timeout_s: float) -> None:
        command = etcd_command(binary, self.name, self.data_dir, self.client_port, self.peer_port)
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        proc = self._proc

        def healthy() -> bool:
            if proc.poll() is not None:
                tail = self.log_tail()
                with open(self.log_path, "rb") as log:
                    log.seek(log_start)
                    this_run = log.read().decode(errors="replace")
                if "address already in use" in this_run:
                    raise _PortTaken
                raise RuntimeError(
                    f"etcd exited with status {proc.returncode} while starting "
                    f"({' '.join(command)}); {self.log_path} ends:\n{tail}"
                )
            return etcd_healthy(self.client_port, timeout_s=1.0)

        try:
            wait_for(healthy, timeout_s, f"etcd at {self.url}")
        except AssertionError:
            error = RuntimeError(
                f"etcd was not healthy (GET {self.url}/health) within {timeout_s}s "
                f"({' '.join(command)}); {self.log_path} ends:\n{self.log_tail()}"
            )
            self.kill()
            raise error from None
        except BaseException:
            self.kill()
            raise

    def _signal_and_reap(self, sig: int, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        signal_and_reap(proc, sig, timeout_s)


class _PortTaken(Exception):
    """etcd could not bind a port chosen for it; another one is tried."""
