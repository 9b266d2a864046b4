"""The message index's lookup latency (tx_bench's last figure): a ferry ASYNC_MASTER
(`services.broker` process, on the server CPUs) takes `messages` messages, each with its
own key (`IdxKey<n>`), in batch sends over RocketMQ's protocol (the index built as it
goes); once its index and its consume queues have caught up (the dispatcher trails batch
sends, and its catch-up would otherwise share the loop with the lookups), `lookups`
QUERY_MESSAGE requests (12) for random keys go one at a time over one connection, each
timed from request to answer, and each must find its message.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.broker_bench import _broker_args, _create_topic
from benchmarks.procs import ServerProcess
from ferry import record
from ferry.remoting import batch, codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command

TOPIC = "IndexBench"
QUEUES = 4
BATCH = 256
IN_FLIGHT = 16
BODY = b"i" * 128


@dataclass(frozen=True)
class LookupResult:
    p50_ms: float
    p99_ms: float
    max_ms: float
    write_s: float
    index_s: float


def key(n: int) -> str:
    return f"IdxKey{n}"


def _batch_request(queue_id: int, first: int, count: int) -> Command:
    entries = [
        batch.BatchEntry(0, BODY, record.encode_properties({record.PROPERTY_KEYS: key(first + i)}))
        for i in range(count)
    ]
    ext = {
        "a": "index_bench_producer", "b": TOPIC, "c": "TBW102", "d": str(QUEUES),
        "e": str(queue_id), "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": "",
        "j": "0", "k": "false", "m": "true",
    }  # fmt: skip
    return Command(codes.SEND_BATCH_MESSAGE, ext=ext, body=batch.encode(entries))


def _query_request(n: int) -> Command:
    return Command(
        codes.QUERY_MESSAGE,
        ext={"topic": TOPIC, "key": key(n), "maxNum": "32", "beginTimestamp": "0",
             "endTimestamp": str(2**63 - 1)},
    )  # fmt: skip


async def _fill(address: str, messages: int) -> float:
    client = await RemotingClient.connect(address)
    started = time.monotonic()
    try:
        pending: set[asyncio.Future] = set()

        async def send(n: int) -> None:
            count = min(BATCH, messages - n)
            answer = await client.request(_batch_request(n // BATCH % QUEUES, n, count), timeout=60)
            if answer.code != codes.SUCCESS:
                raise RuntimeError(f"batch send at {n}: {answer.code} {answer.remark}")

        for n in range(0, messages, BATCH):
            if len(pending) >= IN_FLIGHT:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    future.result()
            pending.add(asyncio.ensure_future(send(n)))
        await asyncio.gather(*pending)
    finally:
        client.close()
    return time.monotonic() - started


async def _indexed(address: str, last: int, timeout_s: float) -> float:
    """Wait until the last key sent is found; the seconds waited."""
    client = await RemotingClient.connect(address)
    started = time.monotonic()
    try:
        while True:
            answer = await client.request(_query_request(last), timeout=30)
            if answer.code == codes.SUCCESS:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"key {key(last)} not indexed after {timeout_s:.0f} s")
            await asyncio.sleep(0.2)
    finally:
        client.close()


async def _dispatched(address: str, messages: int, timeout_s: float) -> float:
    """Wait until the topic's consume queues hold all `messages` (GET_MAX_OFFSET 30 on
    each queue): the dispatcher, which trails batch sends, has caught up and no longer
    takes turns on the loop between lookups. The seconds waited."""
    client = await RemotingClient.connect(address)
    started = time.monotonic()
    try:
        while True:
            total = 0
            for queue_id in range(QUEUES):
                answer = await client.request(
                    Command(codes.GET_MAX_OFFSET, ext={"topic": TOPIC, "queueId": str(queue_id)}),
                    timeout=30,
                )
                if answer.code != codes.SUCCESS:
                    raise RuntimeError(
                        f"GET_MAX_OFFSET queue {queue_id}: {answer.code} {answer.remark}"
                    )
                total += int(answer.ext.get("offset", "0"))
            if total >= messages:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(
                    f"consume queues hold {total:,} of {messages:,} after {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.5)
    finally:
        client.close()


async def _lookups(address: str, messages: int, lookups: int) -> list[float]:
    client = await RemotingClient.connect(address)
    rng = random.Random(30)
    times = []
    try:
        for _ in range(lookups):
            n = rng.randrange(messages)
            t0 = time.perf_counter()
            answer = await client.request(_query_request(n), timeout=30)
            times.append((time.perf_counter() - t0) * 1000)
            if answer.code != codes.SUCCESS or not answer.body:
                raise RuntimeError(f"key {key(n)} not found: {answer.code} {answer.remark}")
    finally:
        client.close()
    return times


def lookup_latency(
    workdir: Path, messages: int, lookups: int, server_cpus: set[int] | None
) -> LookupResult:
    args = _broker_args(workdir / "store", "brokerName=bench-index", "brokerRole=ASYNC_MASTER")
    with ServerProcess("services.broker", args, workdir, "bench-index", server_cpus) as broker:
        _create_topic(broker.target, TOPIC, QUEUES)
        write_s = asyncio.run(_fill(broker.remoting_target, messages))
        index_s = asyncio.run(_indexed(broker.remoting_target, messages - 1, 1800))
        index_s += asyncio.run(_dispatched(broker.remoting_target, messages, 1800))
        times = sorted(asyncio.run(_lookups(broker.remoting_target, messages, lookups)))
    return LookupResult(
        p50_ms=statistics.median(times),
        p99_ms=times[min(len(times) - 1, int(len(times) * 0.99))],
        max_ms=times[-1],
        write_s=write_s,
        index_s=index_s,
    )
