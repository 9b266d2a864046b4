"""Draining a preloaded topic with consumer processes, shared by the pop and
proxy benchmarks: preloading it (`send_all`, `wait_queue_ends`), running the
consumers, and checking the group is done with it (`check_group`).

A consumer process is `python -m <module> consume SPEC_JSON`: it sets up, prints
"ready", waits for a line on stdin, consumes, and prints one JSON report
{start, end, calls, cpu_s, bad_acks, redelivered, seqs} (`seqs`: the sequence
number in the first 8 bytes of every body it received)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from ferry.v1 import broker_pb2

SEND_METHOD = "/ferry.v1.Broker/SendMessages"
STATUS_METHOD = "/ferry.v1.Broker/GetGroupStatus"
MAX_OFFSET_METHOD = "/ferry.v1.Broker/GetMaxOffset"
CALL_TIMEOUT_S = 30.0


async def send_all(
    target: str, requests: list[bytes], senders: int = 4
) -> tuple[float, list[float]]:
    """Send pre-serialized `SendMessagesRequest`s with `senders` concurrent
    callers; returns the seconds from the first call to the last answer, and
    the wall time (ms) each request was answered."""
    async with grpc.aio.insecure_channel(target) as channel:
        send = channel.unary_unary(
            SEND_METHOD, response_deserializer=broker_pb2.SendResult.FromString
        )
        await asyncio.wait_for(channel.channel_ready(), CALL_TIMEOUT_S)
        todo = iter(enumerate(requests))
        answered_ms = [0.0] * len(requests)

        async def caller() -> None:
            for i, request in todo:
                answer = await send(request, timeout=CALL_TIMEOUT_S)
                if answer.status != broker_pb2.SEND_OK:
                    raise RuntimeError(f"send failed: {answer}")
                answered_ms[i] = time.time() * 1000

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(senders)))
        return time.perf_counter() - start, answered_ms


def wait_queue_ends(target: str, topic: str, queues: int, per_queue: int) -> None:
    """Wait until each of the topic's queues ends at `per_queue`: the
    dispatcher may still be writing consume queues after the last send."""
    with grpc.insecure_channel(target) as channel:
        max_offset = channel.unary_unary(
            MAX_OFFSET_METHOD,
            request_serializer=broker_pb2.GetMaxOffsetRequest.SerializeToString,
            response_deserializer=broker_pb2.GetOffsetResponse.FromString,
        )
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            ends = [
                max_offset(broker_pb2.GetMaxOffsetRequest(topic=topic, queue_id=q)).offset
                for q in range(queues)
            ]
            if all(end == per_queue for end in ends):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"queue ends {ends} after preload, expected {per_queue} each")
            time.sleep(0.05)


def check_group(
    target: str, group: str, topic: str, queues: int, per_queue: int, what: str
) -> None:
    """The group is done with `topic`: each of its `queues` queues committed
    to `per_queue`, nothing in flight, no retry pending, no dead letter."""
    with grpc.insecure_channel(target) as channel:
        status = channel.unary_unary(
            STATUS_METHOD,
            request_serializer=broker_pb2.GetGroupStatusRequest.SerializeToString,
            response_deserializer=broker_pb2.GetGroupStatusResponse.FromString,
        )(
            broker_pb2.GetGroupStatusRequest(consumer_group=group, topic=topic),
            timeout=CALL_TIMEOUT_S,
        )  # fmt: skip
    wrong = [
        f"queue {q.queue_id}: committed {q.committed_offset}, in flight {q.in_flight}"
        for q in status.queues
        if q.committed_offset != per_queue or q.in_flight
    ]
    if wrong or len(status.queues) != queues or status.retries_pending or status.dlq_messages:
        raise RuntimeError(
            f"group {group} after {what}: {'; '.join(wrong) or 'queues as expected'}; "
            f"{len(status.queues)} queues, {status.retries_pending} retries pending, "
            f"{status.dlq_messages} dead letters"
        )


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
