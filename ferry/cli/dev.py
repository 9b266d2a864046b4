"""`ferry dev` (what `make run` starts): a local ferry on loopback until Ctrl-C.

Today it runs a name server (issue #2); brokers and replicas join it as they
are built. Every process is a child started with its own command line, logged
to `DATA_DIR/logs/`, and stopped by PID (SIGTERM, then SIGKILL after a grace
period) when this command gets SIGINT or SIGTERM, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
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
        "commands, and stop them all on Ctrl-C. Currently: one name server.",
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
        "--ready-timeout", type=float, default=30.0, help="seconds to wait for each process"
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


def _stop(children: list[Child], grace_s: float = 10.0) -> None:
    for child in reversed(children):
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in reversed(children):
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
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
        print(
            f"""ferry is running on loopback (data and logs in {data_dir}/):
  name server  grpc {addr}   metrics http://127.0.0.1:{ports["metrics_port"]}/metrics   pid {ns.proc.pid}

Try:
  .venv/bin/grpcurl -plaintext {addr} list
  .venv/bin/grpcurl -plaintext -d '{{"service":"ferry.v1.NameServer"}}' {addr} grpc.health.v1.Health/Check
  .venv/bin/ferry cluster -n {addr}
  .venv/bin/ferry kv put -n {addr} ORDER_TOPIC_CONFIG TopicTest 'broker-a:4'

Ctrl-C stops everything.""",
            flush=True,
        )
        while not stop_requested:
            for child in children:
                if child.proc.poll() is not None:
                    print(
                        f"{child.name} exited with status {child.proc.returncode}; see {child.log_path}",
                        flush=True,
                    )
                    return 1
            time.sleep(0.2)
        return 0
    except RuntimeError as exc:
        print(f"ferry dev: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop(children)
