"""Child processes of tests and benchmarks (tests/etcd.py's etcd, tests/apache.py's JVMs):
free loopback ports for them, and stopping them by PID."""

from __future__ import annotations

import os
import socket
import subprocess


def free_port() -> int:
    """A loopback port free now (bind(0) then release: the caller binds it soon, or retries)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int, reuse_address: bool = False) -> bool:
    """Nothing holds loopback `port` now (bound, then released). With `reuse_address`
    a port whose old connections linger in TIME_WAIT counts as free, as it is to a
    server that binds with SO_REUSEADDR (ferry's do)."""
    with socket.socket() as s:
        if reuse_address:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    """A process has `pid` (one of another user's counts; so does a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_and_reap(proc: subprocess.Popen | None, sig: int, timeout_s: float) -> None:
    """Send `sig` to a running `proc` by PID, SIGKILL it when it has not exited within
    `timeout_s`, and always reap it (no zombie, no process left behind)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
