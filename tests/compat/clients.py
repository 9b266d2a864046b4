"""RocketMQ 4.x client programs as the remoting tests drive them: Apache's Java client
(rocketmq-client 4.9.8, tests/compat/client49: Producer49, PushConsumer49, LitePull49) and
the Go client (rocketmq-client-go/v2, tests/compat/go: produce, consume).

Every program prints one JSON object per line, each with "event" ("started", "send", "msg",
"allocate", "assigned", "stopped", "done"); see each program's header for its events and
arguments. `Client` runs one as a child process in its own directory, collects its events
from a reader thread, lets a test wait for a condition on them (bounded, never a sleep), and
stops it by closing its stdin (`--stdin-stop`), then by PID: SIGKILL and reap when it
overruns. `run()` is the same for a program that ends by itself (a producer).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.apache import ROOT, java_program
from tests.processes import signal_and_reap

GO_BIN = ROOT / ".cache" / "go" / "bin"
JAVA_KIT = "client49"
# The client's own log (rocketmq_client.log under the program's home) instead of slf4j,
# which this kit does not carry; rebalances every second instead of every 20 s, so a
# member that joins or leaves is seen quickly even between the broker's notifications; an
# orderly consumer that gives a queue up while it holds pulled messages unlocks it after 1 s
# instead of 20 s, so the member that takes it over starts within the tests' time.
JAVA_PROPERTIES = (
    "-Drocketmq.client.logUseSlf4j=false",
    "-Drocketmq.client.rebalance.waitInterval=1000",
    "-Drocketmq.client.unlockDelayTimeMills=1000",
)
STOP_TIMEOUT_S = 30.0
JAVA_CLIENT_LOG = "home/logs/rocketmqlogs/rocketmq_client.log"  # under a Java program's directory


def _described(what: str | Callable[[Client], str], client: Client) -> str:
    return what if isinstance(what, str) else what(client)


def _read_tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


class Client:
    """One client program, its events in `events` (in the order it printed them)."""

    def __init__(self, name: str, command: Sequence[str], directory: Path, env=None) -> None:
        self.name = name
        self.command = list(command)
        self.directory = Path(directory)
        self.env = env
        self.events: list[dict] = []
        self.stderr_path = self.directory / "stderr.log"
        self._changed = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> Client:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "ab") as err:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=self.directory,
                env=self.env,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-out", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("{"):
                continue
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def exited(self) -> bool:
        return self._proc is not None and self._proc.poll() is not None

    def of(self, event: str) -> list[dict]:
        with self._changed:
            return [e for e in self.events if e["event"] == event]

    def wait(
        self,
        predicate: Callable[[Client], object],
        timeout_s: float,
        what: str | Callable[[Client], str],
    ):
        """Until `predicate(self)` is truthy; fails with what the program printed when the
        time runs out or the program exits first. `what` names the condition, or describes
        what is still missing when it is a function (called only on failure)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                value = predicate(self)
                if value:
                    return value
                if self._reader is not None and not self._reader.is_alive():
                    raise AssertionError(
                        f"{self.name} exited before {_described(what, self)}: {self.tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout_s}s waiting for {_described(what, self)}: "
                        f"{self.tail()}"
                    )
                self._changed.wait(min(left, 0.5))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> list[dict]:
        """Close stdin (the program stops as --stdin-stop says), wait for it to exit and for
        its last lines; SIGKILL by PID when it overruns. Returns its events."""
        proc = self._proc
        if proc is None:
            return self.events
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                signal_and_reap(proc, 9, timeout_s)
        finally:
            if self._reader is not None:
                self._reader.join(timeout_s)
            if proc.stdout is not None:
                proc.stdout.close()
        return self.events

    def finish(self, timeout_s: float) -> list[dict]:
        """Wait for the program to end by itself (killed when it overruns); its events."""
        proc = self._proc
        assert proc is not None
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(1)
            raise AssertionError(
                f"{self.name} did not finish within {timeout_s}s: {self.tail()}"
            ) from None
        return self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None, f"{self.name} was not started"
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def tail(self, chars: int = 3000) -> str:
        """The last events, stderr and the Java client's own warnings (its log under the
        program's home: rebalances, pull failures, flow control)."""
        out = "\n".join(json.dumps(e) for e in self.events[-15:])
        err = _read_tail(self.stderr_path, chars)
        log = _read_tail(self.directory / JAVA_CLIENT_LOG, 20 * chars)
        warnings = "\n".join(line for line in log.splitlines() if " INFO " not in line)
        return (
            f"\n--- {self.name} printed (last events):\n{out}\n--- stderr:\n{err}"
            f"\n--- client log, besides INFO:\n{warnings[-chars:]}"
        )

    def __enter__(self) -> Client:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def java(
    main_class: str,
    args: Sequence[str],
    directory: Path,
    name: str = "",
    system_properties: Sequence[str] = (),
    kit: str = JAVA_KIT,
) -> Client:
    """A ferry.compat program of the client49 kit (not yet started; `kit="rocketmq5"`:
    one built on rocketmq-client 5.5.0); `system_properties` are added to
    JAVA_PROPERTIES (e.g. `-Dtls.enable=true`)."""
    command, env = java_program(
        kit,
        f"ferry.compat.{main_class}",
        args,
        directory=directory,
        heap="128m",
        system_properties=(*JAVA_PROPERTIES, *system_properties),
    )
    return Client(name or main_class, command, directory, env)


def go(program: str, args: Sequence[str], directory: Path, name: str = "") -> Client:
    """A Go program of tests/compat/go (`produce`, `consume`), built by `make go-clients`."""
    binary = GO_BIN / program
    if not binary.exists():
        raise RuntimeError(f"{binary} is missing: run `make go-clients` (or `make tools`)")
    return Client(name or f"go-{program}", [str(binary), *args], directory)


def produce(client: Client, timeout_s: float = 60.0) -> list[dict]:
    """Run a producer to its end; its "send" events (one per message, in print order)."""
    client.start()
    client.finish(timeout_s)
    sends = client.of("send")
    done = client.of("done")
    assert done, f"{client.name} did not report its end: {client.tail()}"
    return sends


def sent_ok(sends: list[dict]) -> list[dict]:
    return [s for s in sends if s["status"] in ("SEND_OK", "ONEWAY")]
