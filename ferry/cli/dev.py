"""`ferry dev` (what `make run` starts): a local ferry on loopback until Ctrl-C.

Today it runs a name server and one broker group: `broker-a`, a SYNC_MASTER
and its slave (with a `TopicTest` topic created at start). The second group and
the exporter join as they are built. Every process is a child started with its own command line, logged
to `DATA_DIR/logs/`, and stopped by PID (SIGTERM, then SIGKILL after a grace
period) when this command gets SIGINT or SIGTERM, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    port_file: Path
    log_path: Path


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dev",
        help="run a local ferry on loopback until Ctrl-C (make run)",
        description="Start ferry's processes on 127.0.0.1, print their endpoints and example "
        "commands, and stop them all on Ctrl-C. Currently: one name server and broker-a "
        "(a SYNC_MASTER and its slave).",
    )
    p.add_argument(
        "--data-dir", type=Path, default=Path("var"), help="where data and logs go (default ./var)"
    )
    p.add_argument(
        "--namesrv-port", type=int, default=9876, help="name server gRPC port (default 9876)"
    )
    p.add_argument(
        "--metrics-port", type=int, default=9877, help="name server metrics port (default 9877)"
    )
    p.add_argument(
        "--broker-port", type=int, default=10911, help="broker gRPC port (default 10911)"
    )
    p.add_argument(
        "--broker-metrics-port", type=int, default=10913, help="broker metrics port (default 10913)"
    )
    p.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for each process"
    )
    p.set_defaults(func=run)


def _start(name: str, argv: list[str], data_dir: Path) -> Child:
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port_file = data_dir / "run" / f"{name}.json"
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    log_path = logs / f"{name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, *argv, "--port-file", str(port_file)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # our Ctrl-C is ours to forward, in order
    )
    log_file.close()
    return Child(name, proc, port_file, log_path)


def _wait_ready(child: Child, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            tail = child.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"{child.name} exited with status {child.proc.returncode}; its log ends:\n{tail}"
            )
        if child.port_file.exists():
            return json.loads(child.port_file.read_text())
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} was not ready after {timeout_s:.0f}s; see {child.log_path}")


def _create_topic(broker_addr: str, topic: str) -> str:
    """Create the demo topic through the broker's admin API (idempotent)."""
    import grpc

    from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, common_pb2

    with grpc.insecure_channel(broker_addr) as channel:
        stub = broker_admin_pb2_grpc.BrokerAdminStub(channel)
        stub.UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=6
                )
            ),
            timeout=10,
        )
    return f"topic {topic} (4 queues) created on broker-a (the slave syncs it within 10 s)"


def _stop(children: list[Child], grace_s: float = 10.0) -> None:
    """Stop children newest first, each fully before the next (a broker must
    unregister while its name server still runs)."""
    for child in reversed(children):
        if child.proc.poll() is not None:
            continue  # already exited, and reported then
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        print(f"stopped {child.name} (pid {child.proc.pid})", flush=True)


def run(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir
    children: list[Child] = []
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        ns = _start(
            "namesrv",
            [
                "-m",
                "services.namesrv",
                "--host",
                "127.0.0.1",
                "--port",
                str(args.namesrv_port),
                "--metrics-port",
                str(args.metrics_port),
                "--home",
                str(data_dir / "namesrv"),
            ],
            data_dir,
        )
        children.append(ns)
        ports = _wait_ready(ns, args.ready_timeout)
        addr = f"127.0.0.1:{ports['grpc_port']}"

        # The HA handshake on (slaves get a stable replica id in ha-status and
        # metrics, and a wrong peer gets nothing): one secret per data directory.
        secret_file = data_dir / "ha-secret"
        if not secret_file.exists():
            secret_file.write_text(secrets.token_hex(16))
            secret_file.chmod(0o600)
        ha_secret = secret_file.read_text().strip()

        def broker_argv(name: str, port: int, metrics: int, ha: int, *extra: str) -> list[str]:
            options = [
                "bindAddress=127.0.0.1",
                "brokerIP1=127.0.0.1",
                f"namesrvAddr={addr}",
                "brokerName=broker-a",
                f"listenPort={port}",
                f"metricsPort={metrics}",
                f"haListenPort={ha}",
                f"haSecret={ha_secret}",
                f"storePathRootDir={data_dir / name}",
                # 64 MiB files keep a laptop's disk use small; production uses 1 GiB.
                "mappedFileSizeCommitLog=67108864",
                *extra,
            ]
            return ["-m", "services.broker", *[a for o in options for a in ("-o", o)]]

        broker = _start(
            "broker-a-master",
            broker_argv(
                "broker-a-master",
                args.broker_port,
                args.broker_metrics_port,
                args.broker_port + 1,
                "brokerRole=SYNC_MASTER",
            ),
            data_dir,
        )
        children.append(broker)
        bports = _wait_ready(broker, args.ready_timeout)
        baddr = f"127.0.0.1:{bports['grpc_port']}"
        slave = _start(
            "broker-a-slave",
            broker_argv(
                "broker-a-slave",
                args.broker_port + 10,
                args.broker_metrics_port + 10,
                args.broker_port + 11,
                "brokerRole=SLAVE",
                "brokerId=1",
                "slaveReadEnable=true",
            ),
            data_dir,
        )
        children.append(slave)
        sports = _wait_ready(slave, args.ready_timeout)
        saddr = f"127.0.0.1:{sports['grpc_port']}"
        created = _create_topic(baddr, "TopicTest")
        spool = data_dir / "spool"
        exporter = _start(
            "exporter",
            ["-m", "ferry.cli.main", "exporter", "-n", addr, "--spool", str(spool),
             "--interval", "5s"],
            data_dir,
        )  # fmt: skip
        children.append(exporter)
        _wait_ready(exporter, args.ready_timeout)
        print(
            f"""ferry is running on loopback (data and logs in {data_dir}/):
  name server  grpc {addr}   metrics http://127.0.0.1:{ports["metrics_port"]}/metrics   pid {ns.proc.pid}
  broker-a     grpc {baddr}   metrics http://127.0.0.1:{bports["metrics_port"]}/metrics   pid {broker.proc.pid}   (SYNC_MASTER, HA 127.0.0.1:{bports["ha_port"]})
  broker-a/1   grpc {saddr}   metrics http://127.0.0.1:{sports["metrics_port"]}/metrics   pid {slave.proc.pid}   (SLAVE)
  exporter     every 5 s into {spool}/   pid {exporter.proc.pid}
  {created}

Try:
  export FERRY_NAMESRV_ADDR={addr}
  .venv/bin/ferry cluster
  .venv/bin/ferry send TopicTest --body 'hello ferry'
  .venv/bin/ferry send TopicTest --count 10000 --size 128 --batch 64
  .venv/bin/ferry consume TopicTest --group demo --from-beginning --max 5
  .venv/bin/ferry ha-status -b {baddr}
  .venv/bin/ferry ha-status -b {saddr}
  .venv/bin/ferry runtime -b {baddr}
  .venv/bin/grpcurl -plaintext {baddr} list
  .venv/bin/grpcurl -plaintext -d '{{"topic":"TopicTest"}}' {addr} ferry.v1.NameServer/GetRouteInfoByTopic
  .venv/bin/ferry analytics run --spool {spool} --out {data_dir}/analytics --once

Ctrl-C stops everything.""",
            flush=True,
        )
        # A child that dies (or that you kill to watch a failover) is reported;
        # the others keep running until Ctrl-C, or until none is left.
        reported: set[str] = set()
        while not stop_requested:
            for child in children:
                if child.proc.poll() is not None and child.name not in reported:
                    reported.add(child.name)
                    print(
                        f"{child.name} exited with status {child.proc.returncode} (see "
                        f"{child.log_path}); the others keep running",
                        flush=True,
                    )
            if len(reported) == len(children):
                return 1
            time.sleep(0.2)
        return 0
    except RuntimeError as exc:
        print(f"ferry dev: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop(children)
