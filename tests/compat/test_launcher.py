"""The launcher of Apache RocketMQ's JVMs (tests/apache.py): it stops what it starts, even
when the test fails, keeps every file in its own directory, and fails a start that does not
come with the JVM's own last lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apache import ApacheNamesrv, ApacheProxy, port_open
from tests.processes import pid_alive
from tests.waiting import wait_for


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


def test_a_failing_test_still_stops_the_jvm_it_started(tmp_path):
    pid = port = 0
    with pytest.raises(ZeroDivisionError), ApacheNamesrv(tmp_path / "ns") as ns:
        pid, port = ns.pid, ns.port
        assert port_open(port)
        _ = 1 / 0
    assert pid and not pid_alive(pid)
    assert not port_open(port)


BOOT_LINE = "The Name Server boot success"


def test_a_start_that_never_comes_fails_with_the_jvms_last_lines_and_leaves_nothing(tmp_path):
    class Silent(ApacheNamesrv):
        ready_line = "a line Apache never prints"

        def _wait_ready(self, timeout_s: float) -> None:
            # The error must quote the JVM's own last lines: let it print its boot line
            # first (however long a busy machine takes), then give the line it never
            # prints its timeout.
            wait_for(
                lambda: BOOT_LINE in self.stdout_path.read_text(errors="replace"),
                120,
                "the name server's boot line",
            )
            super()._wait_ready(timeout_s)

    ns = Silent(tmp_path / "ns")
    with pytest.raises(RuntimeError) as failure:
        ns.start(timeout_s=2)
    text = str(failure.value)
    assert "was not ready within 2s" in text
    assert BOOT_LINE in text  # the JVM's own output, quoted
    assert not ns.running


def test_a_jvm_that_exits_while_starting_is_reported_with_its_output(tmp_path):
    class Broken(ApacheNamesrv):
        def arguments(self) -> list[str]:
            return ["-c", str(self.home / "no-such-file.properties")]

    with pytest.raises(RuntimeError) as failure:
        Broken(tmp_path / "ns").start(timeout_s=60)
    assert "exited with status" in str(failure.value)
    assert "no-such-file.properties" in str(failure.value)


def test_everything_the_5x_proxy_writes_stays_in_its_directory(tmp_path, monkeypatch):
    # A HOME of its own: the JVMs must not write there (logs, store) nor in /tmp (the
    # proxy's self-signed certificate, RocksDB's native library, hsperfdata).
    home = tmp_path / "home-of-the-test"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    ns = ApacheNamesrv(tmp_path / "ns", kit="rocketmq5").start()
    try:
        proxy = ApacheProxy(tmp_path / "proxy", ns.address).start()
        try:
            cmdline = Path(f"/proc/{proxy.pid}/cmdline").read_bytes().split(b"\0")
        finally:
            proxy.stop()
    finally:
        ns.stop()
    assert not _files(home)
    # Its temporary files (the self-signed gRPC certificate, RocksDB's native library) go to
    # a directory of its own, not /tmp (shared, so not compared here), and no hsperfdata.
    assert f"-Djava.io.tmpdir={tmp_path / 'proxy' / 'tmp'}".encode() in cmdline
    assert b"-XX:-UsePerfData" in cmdline
    assert (tmp_path / "proxy" / "home" / "logs" / "rocketmqlogs" / "proxy.log").exists()
