"""The `etcd` fixture (tests/etcd.py), against the real etcd with the client the
brokers will use (aetcd): a put is read back, a key under a lease that nobody
renews disappears while a key without one stays, data survives a restart on
the same ports, and stop()/kill() leave no process behind."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aetcd
import pytest

from tests.conftest import LoopThread
from tests.etcd import EtcdServer
from tests.waiting import wait_for


@pytest.fixture
def client(etcd: EtcdServer, loop_thread: LoopThread) -> Iterator[aetcd.Client]:
    """An aetcd client of `etcd`, living on the loop thread (use loop_thread.run)."""

    async def connect() -> aetcd.Client:
        c = aetcd.Client(host="127.0.0.1", port=etcd.client_port, timeout=5)
        await c.connect()
        return c

    c = loop_thread.run(connect())
    yield c
    loop_thread.run(c.close())


def gone(pid: int) -> bool:
    """No process (not even a zombie) has `pid`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return not Path(f"/proc/{pid}").exists()
    return False


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_put_then_get(etcd, client, loop_thread):
    assert etcd.endpoint == f"127.0.0.1:{etcd.client_port}"
    loop_thread.run(client.put(b"/ferry/test/key", b"value-1"))
    got = loop_thread.run(client.get(b"/ferry/test/key"))
    assert got is not None and got.value == b"value-1"
    assert loop_thread.run(client.get(b"/ferry/test/missing")) is None
    status = loop_thread.run(client.status())
    assert status.version.startswith("3.")
    members = loop_thread.run(_members(client))
    assert [m.id for m in members] == [status.leader.id]  # one member, its own leader
    assert members[0].client_urls == [etcd.url]


async def _members(client: aetcd.Client) -> list:
    return [m async for m in client.members()]


def test_a_key_under_an_unrenewed_lease_disappears(etcd, client, loop_thread):
    lease = loop_thread.run(client.lease(2))
    loop_thread.run(client.put(b"/ferry/test/leased", b"mine", lease=lease))
    loop_thread.run(client.put(b"/ferry/test/kept", b"no lease"))
    granted = time.monotonic()
    got = loop_thread.run(client.get(b"/ferry/test/leased"))
    assert got is not None and got.value == b"mine" and got.lease == lease.id

    wait_for(
        lambda: loop_thread.run(client.get(b"/ferry/test/leased")) is None,
        timeout_s=15,
        what="the key under the unrenewed 2 s lease to disappear",
        interval_s=0.1,
    )
    # The lease removed it, not something else: not before its TTL (less a
    # little for the clocks), and the key without a lease is still there.
    assert time.monotonic() - granted >= 1.5
    kept = loop_thread.run(client.get(b"/ferry/test/kept"))
    assert kept is not None and kept.value == b"no lease"


def test_restart_keeps_data_and_ports(etcd, client, loop_thread):
    loop_thread.run(client.put(b"/ferry/test/durable", b"v"))
    port, old_pid = etcd.client_port, etcd.pid
    etcd.restart()
    assert etcd.client_port == port and etcd.pid != old_pid
    assert gone(old_pid)

    async def read_back() -> bytes | None:
        async with aetcd.Client(host="127.0.0.1", port=port, timeout=5) as c:
            got = await c.get(b"/ferry/test/durable")
            return None if got is None else got.value

    assert loop_thread.run(read_back()) == b"v"


def test_stop_leaves_no_process(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    pid, port = server.pid, server.client_port
    assert server.healthy() and not gone(pid)
    server.stop()
    assert gone(pid), f"etcd pid {pid} is still there after stop()"
    assert refused(port) and not server.running
    server.stop()  # idempotent


def test_kill_leaves_no_process(tmp_path):
    with EtcdServer(tmp_path / "etcd") as server:
        pid = server.pid
        server.kill()
        assert gone(pid), f"etcd pid {pid} is still there after kill()"
        assert not server.healthy()
        server.restart()
        assert server.healthy() and server.pid != pid


def test_a_failed_start_reports_the_log(tmp_path):
    """A data directory etcd cannot use: start() fails fast with etcd's own
    words, and nothing is left running."""
    bad = tmp_path / "etcd"
    bad.mkdir()
    (bad / "data").write_text("a file where the data directory should be")
    server = EtcdServer(bad)
    with pytest.raises(RuntimeError, match="exited with status") as err:
        server.start(timeout_s=20)
    assert "etcd.log ends" in str(err.value)
    assert not server.running


def test_without_etcd_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    """No `etcd` on PATH and no /usr/bin/etcd: an error naming the package, for
    the tests (never a silent skip) and for `ferry dev` alike."""
    import services.cli.dev.etcd

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(services.cli.dev.etcd, "DEBIAN_ETCD", str(tmp_path / "no-etcd"))
    install = "apt-get install -y --no-install-recommends etcd-server"
    with pytest.raises(RuntimeError, match=install):
        services.cli.dev.etcd.find_etcd()
    server = EtcdServer(tmp_path / "etcd")
    with pytest.raises(RuntimeError, match=install):
        server.start()
    assert not server.running
