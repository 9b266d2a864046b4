"""Redis as a same-run peer for replicated single-message writes (issue #15):
a primary and a replica (`replicaof`) on loopback, `XADD` + `WAIT 1` per
message from N asyncio clients, the same body size as ferry's sends.

`WAIT 1` answers once one replica has every write of the connection before
it: the same promise as a SYNC_MASTER's SEND_OK. Each client sends XADD and
WAIT together (one round trip, a non-transactional pipeline), then the next
message: one message in flight per client, as ferry's producers with one
message in flight. Persistence is off on both (`--save ''`, no AOF), as
ferry's ASYNC_FLUSH does not wait for the disk either.

The primary runs on the servers' core, the replica on the other, as
ferry's master and slave in the ha benchmark. Debian's `redis-server`
(7.0) and redis-py; `.ci/run` installs both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.load import LoadResult, Run
from benchmarks.procs import free_port

WAIT_TIMEOUT_MS = 3000  # as ferry's slaveTimeout


class RedisMissing(RuntimeError):
    pass


def _server(workdir: Path, name: str, port: int, cpus, *extra: str) -> subprocess.Popen:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisMissing(
            "redis-server is not installed (Debian: apt-get install redis-server); the "
            "benchmark's Redis peer needs it"
        )
    data = workdir / name
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
         "--appendonly", "no", "--protected-mode", "no", *extra],
        stdout=(workdir / f"{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc


@contextlib.contextmanager
def primary_and_replica(workdir: Path, primary_cpus, replica_cpus) -> Iterator[int]:
    """Start both, wait until the replica is in sync; yields the primary's port."""
    import redis

    primary_port, replica_port = free_port(), free_port()
    procs = [_server(workdir, "redis-primary", primary_port, primary_cpus)]
    try:
        procs.append(
            _server(
                workdir,
                "redis-replica",
                replica_port,
                replica_cpus,
                "--replicaof",
                "127.0.0.1",
                str(primary_port),
            )  # fmt: skip
        )
        client = redis.Redis(host="127.0.0.1", port=primary_port)
        deadline = time.monotonic() + 30
        while True:
            try:
                info = client.info("replication")
                if info.get("connected_slaves", 0) >= 1 and client.wait(1, 1000) >= 1:
                    break
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis replica did not connect within 30 s")
            time.sleep(0.05)
        client.close()
        yield primary_port
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def xadd_wait(
    port: int, clients: int, body: bytes, warmup_s: float, duration_s: float
) -> LoadResult:
    """`clients` connections, each XADD + WAIT 1 per message, one at a time."""
    import redis.asyncio as aioredis

    run = Run()

    async def client(i: int) -> None:
        r = aioredis.Redis(host="127.0.0.1", port=port)
        try:
            while not run.stopping:
                start = time.perf_counter()
                pipe = r.pipeline(transaction=False)
                pipe.xadd(f"bench-{i % 4}", {"b": body})
                pipe.execute_command("WAIT", 1, WAIT_TIMEOUT_MS)
                _, replicas = await pipe.execute()
                if not run.measuring:
                    continue
                if replicas < 1:
                    run.errors += 1
                else:
                    run.latencies.append(time.perf_counter() - start)
        finally:
            await r.aclose()

    workers = [client(i) for i in range(clients)]
    return await run.drive(workers, warmup_s, duration_s, None, "Redis clients")
