"""Apache RocketMQ's `mqadmin` (rocketmq-tools 4.9.8, or 5.5.0 with kit="rocketmq5", unchanged)
for tests and benchmarks.

`MqadminSession` keeps one JVM (ferry.compat.MqadminSession, tests/compat/shared-java) that runs
mqadmin commands one after another, each as `mqadmin ARGS` would run it, and answers what each
printed and how long it took. A JVM per command costs ~3.5 s (start, then the admin client's
shutdown); a session pays the start once. With `access_key` / `secret_key`, the session's
`conf/tools.yml` holds them and every command signs its requests (RocketMQ's ACL), as mqadmin
does with that file.

A session is used from one thread at a time; `run` is bounded by `timeout_s` and the JVM is
stopped by PID (SIGTERM, then SIGKILL) in `stop`, also when a command overran.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.apache import java_program
from tests.processes import signal_and_reap

MAIN = "ferry.compat.MqadminSession"
RUN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Result:
    args: list[str]
    out: str  # what the command printed on stdout
    err: str  # on stderr (mqadmin's error stack traces)
    ms: float  # the command's own time in the warm JVM

    @property
    def lines(self) -> list[str]:
        return [line for line in self.out.splitlines() if line.strip()]


class MqadminSession:
    def __init__(
        self,
        directory: Path,
        *,
        access_key: str = "",
        secret_key: str = "",
        heap: str = "256m",
        kit: str = "client49",
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        command, env = java_program(kit, MAIN, [], directory=self.directory, heap=heap)
        if access_key:
            tools = self.directory / "home" / "conf" / "tools.yml"
            tools.write_text(f"accessKey: {access_key}\nsecretKey: {secret_key}\n")
        self._stderr = open(self.directory / "stderr.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=self.directory,
            env=env,
            text=True,
            encoding="utf-8",
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put(None)

    def run(self, *args: str, timeout_s: float = RUN_TIMEOUT_S) -> Result:
        """One mqadmin command; its output once it returned."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(list(args)) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.stop()
            raise TimeoutError(
                f"mqadmin {' '.join(args)} did not return in {timeout_s} s"
            ) from None
        if line is None:
            tail = (self.directory / "stderr.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the mqadmin session ended (exit {self._proc.poll()}): {tail}")
        doc = json.loads(line)
        return Result(list(doc["args"]), doc["out"], doc["err"], float(doc["ms"]))

    def stop(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            signal_and_reap(self._proc, signal.SIGTERM, timeout_s=5)
        self._stderr.close()

    def __enter__(self) -> MqadminSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def session_pair(root: Path, names: Sequence[str] = ("ferry", "apache"), **keys: str):
    """One session per side (same credentials)."""
    return {name: MqadminSession(root / f"mqadmin-{name}", **keys) for name in names}
