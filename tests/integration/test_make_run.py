"""`make run`, as a user runs it: the README's main command starts the
2m-2s-failover topology on loopback (and each other overlay with TOPOLOGY=),
is ready within 60 s, a message sent with `ferry send` is consumed with
`ferry consume`, the RocketMQ 5 proxy answers what its "Try:" lines show
(grpcurl's describe through reflection; the official SDK's producer and simple
consumer, as printed), its one-member etcd answers on the printed endpoint,
and Ctrl-C (SIGINT to the terminal's process group) stops everything: no
process is left, etcd included.

With failover (the default), each group has elected a master in that etcd:
the summary names it, both name servers route to it as broker 0 with the
other member as a slave, a send to it answers SEND_OK (a SYNC_MASTER's, so
the slave has it), `ferry ha-status` shows it from etcd, and the printed
`ferry failover` command hands the role over to the other member.

The ports are moved by --port-offset (make run ARGS=...) so this test never
meets a developer's own `make run`; the offset is one whose ports are free."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from ferry.client.namesrv import NamesrvClient
from ferry.v1 import broker_pb2, broker_pb2_grpc
from services.cli.dev.etcd import etcd_healthy
from tests.integration.support import LineReader, child_env, grpcurl_path, run_ferry
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
# Ports of the 2m-2s topology before the offset: name servers, brokers, the proxy, etcd.
BASE_PORTS = (
    [9876, 9877, 9879, 9886, 9887, 9889]
    + [p + 10 * i for i in range(4) for p in (10909, 10911, 10912, 10913, 10915)]
    + [8081, 8082]
    + [2379, 2380]
)


def free_offset() -> int:
    # Below the ephemeral range (32768+), where the other tests' servers bind.
    # (tests/integration/test_k8s_local_run.py takes ports from 21000 up.) Each
    # xdist worker has its own range, in case two of these tests run at once.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = 1000 + 2000 * (worker % 4)
    for offset in range(first, first + 2000, 250):
        try:
            for port in BASE_PORTS:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return offset
    pytest.fail("no free port offset for make run")


def processes_under(path: Path) -> list[str]:
    """Processes whose command line mentions `path` (the run's data directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def check_proxy(text: str, offset: int, tmp_path: Path, sdk: bool) -> None:
    """The proxy's line, and its "Try:" lines run as printed: grpcurl's describe
    (reflection) and, with `sdk`, the official SDK's snippet."""
    [(port, metrics)] = re.findall(
        r"^  proxy +grpc 127\.0\.0\.1:(\d+) +metrics :(\d+) +pid \d+ +RocketMQ 5 proxy", text, re.M
    )
    assert (int(port), int(metrics)) == (8081 + offset, 8082 + offset), text
    [describe] = re.findall(r"^  \.venv/bin/grpcurl (-plaintext \S+ describe \S+)$", text, re.M)
    assert describe.split() == [
        "-plaintext", f"127.0.0.1:{port}", "describe", "apache.rocketmq.v2.MessagingService"
    ]  # fmt: skip
    out = subprocess.run(
        [grpcurl_path(), *describe.split()], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for rpc in ("QueryRoute", "SendMessage", "ReceiveMessage", "AckMessage", "Telemetry"):
        assert f"rpc {rpc} (" in out.stdout, out.stdout
    # The SDK example: `.venv/bin/python - <<'EOF'`, the code flush left, `EOF`.
    [code] = re.findall(r"^  \.venv/bin/python - <<'EOF'.*\n((?:.*\n)+?)EOF$", text, re.M)
    assert f'ClientConfiguration("127.0.0.1:{port}"' in code
    if not sdk:
        return
    home = tmp_path / "home"  # the SDK logs to ~/logs/rocketmq_python
    home.mkdir()
    ran = subprocess.run(
        [sys.executable, "-"], input=code, cwd=REPO, env={**child_env(), "HOME": str(home)},
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [sent] = re.findall(r"^sent (\S+)$", ran.stdout, re.M)
    assert f"received {sent} TagA b'hello RocketMQ 5'" in ran.stdout, ran.stdout


DEFAULT_TOPOLOGY = "2m-2s-failover"
ROLES = {  # None: elected (check_elected)
    "2m-2s-failover": {"broker-a-0": None, "broker-a-1": None,
                       "broker-b-0": None, "broker-b-1": None},
    "2m-2s-sync": {"broker-a-master": "SYNC_MASTER", "broker-a-slave": "SLAVE",
                   "broker-b-master": "SYNC_MASTER", "broker-b-slave": "SLAVE"},
    "2m-2s-async": {"broker-a-master": "ASYNC_MASTER", "broker-a-slave": "SLAVE",
                    "broker-b-master": "ASYNC_MASTER", "broker-b-slave": "SLAVE"},
    "2m-noslave": {"broker-a-master": "ASYNC_MASTER", "broker-b-master": "ASYNC_MASTER"},
}  # fmt: skip


def check_elected(text: str, namesrv: str) -> dict[str, tuple[str, str, int]]:
    """The summary's failover lines against the name servers: per group one
    member "elected master (epoch N)", registered as broker 0 at its address
    with that epoch, and the other "slave of" it under its own brokerId.
    Returns group -> (master's name, master's address, epoch)."""
    line = (
        r"^  (broker-[ab])-(\d) +rocketmq 127\.0\.0\.1:\d+ +grpc (127\.0\.0\.1:\d+) "
        r"+metrics :\d+ +pid \d+ +(.+)$"
    )
    members: dict[str, dict[str, tuple[str, str]]] = {}
    for group, i, addr, role in re.findall(line, text, re.M):
        members.setdefault(group, {})[f"{group}-{i}"] = (addr, role)
    assert sorted(members) == ["broker-a", "broker-b"], text
    elected = {}
    for group, lines in members.items():
        assert sorted(lines) == [f"{group}-0", f"{group}-1"], text
        won = {n: re.fullmatch(r"elected master \(epoch (\d+)\), SYNC_MASTER, HA 127\.0\.0\.1:\d+", r)
               for n, (_, r) in lines.items()}  # fmt: skip
        [(master, match)] = [(n, m) for n, m in won.items() if m]
        [slave] = [n for n in lines if n != master]
        slave_of = re.fullmatch(rf"slave of {master} \(brokerId ([12])\)", lines[slave][1])
        assert slave_of, text
        slave_id, epoch = int(slave_of.group(1)), int(match.group(1))
        master_addr, slave_addr = lines[master][0], lines[slave][0]
        elected[group] = (master, master_addr, epoch)
        for ns in namesrv.split(";"):
            with NamesrvClient([ns], timeout_s=5, discover=True) as client:
                info = client.cluster_info()
            routes = dict(info.broker_addr_table[group].broker_addrs)
            assert routes == {0: master_addr, slave_id: slave_addr}, (ns, info)
            master_live, slave_live = (info.broker_live_table[a] for a in (master_addr, slave_addr))
            assert (master_live.broker_role, master_live.epoch) == ("SYNC_MASTER", epoch)
            assert slave_live.broker_role == "SLAVE"
        # The `ferry cluster` table printed: the same.
        rows = re.findall(rf"^DefaultCluster +{group} +(\d+) +(\S+) +(\S+)", text, re.M)
        assert sorted(rows) == [("0", master_addr, "SYNC_MASTER"),
                                (str(slave_id), slave_addr, "SLAVE")], text  # fmt: skip
    return elected


def sync_send(addr: str, body: bytes) -> None:
    """A send straight to a master: a SYNC_MASTER answers SEND_OK once its slave has it."""
    with grpc.insecure_channel(addr) as channel:
        result = broker_pb2_grpc.BrokerStub(channel).SendMessage(
            broker_pb2.SendMessageRequest(topic="TopicTest", body=body), timeout=10
        )
    assert result.status == broker_pb2.SEND_OK, result


def check_failover_hints(text: str, elected: dict[str, tuple[str, str, int]], offset: int) -> None:
    """The printed failover lines, run as printed: `ferry ha-status` shows each
    group's master from etcd, and `ferry failover` hands broker-a over."""
    [endpoints] = re.findall(r"^  export FERRY_ETCD_ENDPOINTS='([^']+)'$", text, re.M)
    assert endpoints == f"127.0.0.1:{2379 + offset}"
    assert re.search(r"^  \.venv/bin/ferry ha-status$", text, re.M), text
    [handover] = re.findall(r"^  \.venv/bin/ferry (failover .*)$", text, re.M)
    assert handover.split() == ["failover", "-c", "DefaultCluster", "-b", "broker-a"]
    env = {"FERRY_ETCD_ENDPOINTS": endpoints}
    status = run_ferry("ha-status", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    for group, (_, addr, epoch) in elected.items():
        [row] = re.findall(rf"^DefaultCluster +{group} +(\d+) +\d+ (\S+) ", status.stdout, re.M)
        assert row == (str(epoch), addr), status.stdout
    moved = run_ferry(*handover.split(), env=env)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    _, old, epoch = elected["broker-a"]
    [(new, new_epoch)] = re.findall(
        r"^broker-a: member \d at (\S+) is master, epoch (\d+)", moved.stdout, re.M
    )
    assert new != old and int(new_epoch) == epoch + 1, moved.stdout

    # The new master takes sends once its name servers route to it and the old one follows it.
    def routed_and_replicated() -> bool:
        try:
            sync_send(new, b"after the handover")
        except (AssertionError, grpc.RpcError):
            return False
        return True

    wait_for(routed_and_replicated, 30, "SEND_OK from broker-a's new master", interval_s=0.2)


# Up to 60 s to be ready, and the SDK example may long-poll the wrong broker a few times (5 s each).
@pytest.mark.timeout(240)
@pytest.mark.parametrize("topology", [None, "2m-2s-sync", "2m-2s-async", "2m-noslave"])
def test_make_run_serves_and_stops_on_ctrl_c(tmp_path, topology):
    data = tmp_path / "var"
    offset = free_offset()
    started = time.monotonic()
    roles = ROLES[topology or DEFAULT_TOPOLOGY]
    extra = [f"TOPOLOGY={topology}"] if topology else []  # None: the default, as in the README
    make = subprocess.Popen(
        [
            "make",
            "--no-print-directory",
            "run",
            f"DATA_DIR={data}",
            f"ARGS=--port-offset {offset}",
            *extra,
        ],  # fmt: skip
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's job is
    )
    reader = LineReader(make.stdout)
    pids: list[int] = []
    try:
        try:
            wait_for(
                lambda: (
                    make.poll() is not None
                    or any(line.startswith("Ctrl-C stops everything") for line in reader.lines)
                ),
                60,
                "make run ready within 60 s",
                interval_s=0.1,
            )
            assert make.poll() is None, f"make run exited with {make.returncode}"
        except AssertionError:
            logs = "".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}\n"
                for p in sorted((data / "logs").glob("*.log"))
            )
            logs += subprocess.run(["ss", "-tanp"], capture_output=True, text=True).stdout
            pytest.fail("make run was not ready in 60 s:\n" + "\n".join(reader.lines) + "\n" + logs)
        assert time.monotonic() - started < 60
        text = "\n".join(reader.lines)
        assert f"ferry {topology or DEFAULT_TOPOLOGY} is running on loopback" in text
        # etcd runs first, on 127.0.0.1 only, and answers /health.
        [(etcd_port, etcd_peer, etcd_role)] = re.findall(
            r"^  etcd +etcd 127\.0\.0\.1:(\d+) +peer +:(\d+) +pid \d+ +(.*)$", text, re.M
        )
        assert (int(etcd_port), int(etcd_peer)) == (2379 + offset, 2380 + offset), text
        assert etcd_healthy(int(etcd_port))
        [namesrv] = re.findall(r"export FERRY_NAMESRV_ADDR='([^']+)'", text)
        assert namesrv == f"127.0.0.1:{9876 + offset};127.0.0.1:{9886 + offset}"
        elected = {}
        if None in roles.values():  # roles by election
            assert "where the groups elect their masters" in etcd_role, text
            elected = check_elected(text, namesrv)
        else:
            assert "failover is off" in etcd_role, text
            assert "FERRY_ETCD_ENDPOINTS" not in text and "ferry failover" not in text
            line = (
                r"^  (broker-\S+) +rocketmq 127\.0\.0\.1:\d+ +grpc 127\.0\.0\.1:\d+ "
                r"+metrics :\d+ +pid \d+ +([A-Z_]+)"
            )
            assert dict(re.findall(line, text, re.M)) == roles, text
            # The `ferry cluster` table lists the brokers with their roles.
            table = re.findall(r"^DefaultCluster +(broker-[ab]) +([01]) +\S+ +(\S+)", text, re.M)
            assert sorted(
                f"{g}-{'master' if i == '0' else 'slave'} {r}" for g, i, r in table
            ) == sorted(f"{b} {r}" for b, r in roles.items()), text

        sent = run_ferry("send", "TopicTest", "--body", "hello from make run", "-n", namesrv)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert sent.stdout.startswith("SEND_OK "), sent.stdout
        got = run_ferry("consume", "TopicTest", "--group", "smoke", "--from-beginning",
                        "--max", "1", "-n", namesrv, timeout_s=60)  # fmt: skip
        assert got.returncode == 0, got.stdout + got.stderr
        assert "hello from make run" in got.stdout
        check_proxy(text, offset, tmp_path, sdk=topology is None)
        for _, addr, _ in elected.values():
            sync_send(addr, b"to an elected SYNC_MASTER")
        if elected:
            check_failover_hints(text, elected, offset)
        pids = [int(p) for p in re.findall(r" pid (\d+)", text)]
        # etcd, name servers, brokers, the exporter, the proxy
        assert len(pids) == 1 + 2 + len(roles) + 2
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
            pytest.fail("make run did not stop within 60 s of Ctrl-C")
    reader.join(timeout_s=10)
    stopped = [line for line in reader.lines if line.startswith("stopped ")]
    assert len(stopped) == len(pids), "\n".join(reader.lines)
    left = processes_under(data)
    assert not left, f"left behind after Ctrl-C: {left}"
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), pid
