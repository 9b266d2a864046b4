"""Draining a preloaded topic with consumer processes, shared by the pop and
proxy benchmarks.

A consumer process is `python -m <module> consume SPEC_JSON`: it sets up, prints
"ready", waits for a line on stdin, consumes, and prints one JSON report
{start, end, calls, cpu_s, bad_acks, redelivered, seqs} (`seqs`: the sequence
number in the first 8 bytes of every body it received)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ferry.v1 import broker_pb2


def run_consumers(
    module: str, specs: list[dict], workdir: Path, sample: Callable[[], Any]
) -> tuple[list[dict], Any, Any]:
    """Start one consumer process per spec, release them together once all are
    ready, and collect their reports. `sample()` (the servers' CPU seconds, say)
    is taken just before the release and just after the last report:
    returns (reports, before, after)."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = [workdir / f"consumer-{spec['group']}-{i}.log" for i, spec in enumerate(specs)]
    try:
        for spec, log_path in zip(specs, logs, strict=True):
            with open(log_path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, "consume", json.dumps(spec)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                    )
                )  # fmt: skip
        for proc, log_path in zip(procs, logs, strict=True):
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a consumer did not start:\n{log_path.read_text()[-2000:]}")
        before = sample()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        reports = []
        for proc, log_path in zip(procs, logs, strict=True):
            out, _ = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"a consumer failed with {proc.returncode}:\n{log_path.read_text()[-2000:]}"
                )
            reports.append(json.loads(out.splitlines()[-1]))
        after = sample()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports, before, after


def check_reports(reports: list[dict], n: int, mode: str, first_deliveries: bool) -> None:
    """Every one of sequence numbers 0..n-1 received exactly once; with
    `first_deliveries`, also every ack OK and no message delivered twice."""
    seen = bytearray(n)
    duplicates = []
    for report in reports:
        for seq in report["seqs"]:
            if seen[seq]:
                duplicates.append(seq)
            seen[seq] = 1
    missing = n - sum(seen)
    bad_acks = sum(r["bad_acks"] for r in reports) if first_deliveries else 0
    redelivered = sum(r["redelivered"] for r in reports) if first_deliveries else 0
    if duplicates or missing or bad_acks or redelivered:
        raise RuntimeError(
            f"{mode}: {missing:,} of {n:,} messages never received, {len(duplicates):,} received "
            f"twice (first: {duplicates[:5]}), {bad_acks:,} acks not OK, {redelivered:,} "
            "redeliveries"
        )


def pop_and_ack(
    pop: Callable, ack: Callable, request: Any, group: str, topic: str, timeout_s: float
) -> dict:
    """Pop (`request`, a PopMessageRequest or its bytes) and acknowledge each
    batch until a pop finds nothing; the report's counters (not its times)."""
    seqs: list[int] = []
    calls = bad_acks = redelivered = 0
    while True:
        answer = pop(request, timeout=timeout_s)
        calls += 1
        if answer.status == broker_pb2.POP_NO_MESSAGE:
            break  # everything preloaded is handed out (none comes back meanwhile)
        if answer.status != broker_pb2.POP_FOUND:
            raise RuntimeError(f"pop status {answer.status}")
        handles = []
        for m in answer.messages:
            seqs.append(int(m.body[:8]))
            handles.append(m.receipt_handle)
            redelivered += m.delivery_attempt != 1
        acks = ack(
            broker_pb2.AckMessageRequest(
                consumer_group=group, topic=topic, receipt_handles=handles
            ),
            timeout=timeout_s,
        )
        calls += 1
        bad_acks += sum(1 for a in acks.results if a.status != broker_pb2.OK)
        bad_acks += len(handles) - len(acks.results)
    return {"calls": calls, "bad_acks": bad_acks, "redelivered": redelivered, "seqs": seqs}
