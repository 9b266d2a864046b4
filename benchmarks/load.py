"""A closed-loop unary load generator on `grpc.aio`.

`concurrency` tasks share one channel; each sends a request picked at random
from `requests` (already serialized), awaits the answer, and sends the next.
Requests and answers stay raw bytes: the client never parses an answer, so
the generator costs the same per call whatever the method, and the figure
measures the server. Calls are counted only inside the measured window,
after the warm-up.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LoadResult:
    calls: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu: float | None  # server CPU seconds / wall seconds in the window
    client_cpu: float  # this process's CPU seconds / wall seconds in the window

    @property
    def rate(self) -> float:
        return self.calls / self.seconds


async def closed_loop(
    target: str,
    method: str,
    requests: Sequence[bytes],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    server_cpu_seconds: Callable[[], float] | None = None,
    seed: int = 1,
    answer_ok: Callable[[bytes], bool] | None = None,
) -> LoadResult:
    """`answer_ok`, when given, parses each answer: a False counts as an error
    (e.g. a SendResult whose status is not SEND_OK)."""
    latencies: list[float] = []
    errors = 0
    measuring = False
    stopping = False

    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        await call(requests[0], timeout=CALL_TIMEOUT_S)  # connect; fail fast if broken

        async def worker(rng: random.Random) -> None:
            nonlocal errors
            clock = time.perf_counter
            while not stopping:
                request = rng.choice(requests)
                start = clock()
                try:
                    answer = await call(request, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError:
                    if measuring:
                        errors += 1
                    continue
                if answer_ok is not None and not answer_ok(answer):
                    if measuring:
                        errors += 1
                    continue
                if measuring:
                    latencies.append(clock() - start)

        root = random.Random(seed)
        tasks = [
            asyncio.create_task(worker(random.Random(root.random()))) for _ in range(concurrency)
        ]
        try:
            await asyncio.sleep(warmup_s)
            measuring = True
            server0 = server_cpu_seconds() if server_cpu_seconds else None
            client0 = time.process_time()
            t0 = time.perf_counter()
            await asyncio.sleep(duration_s)
            measuring = False
            seconds = time.perf_counter() - t0
            client1 = time.process_time()
            server1 = server_cpu_seconds() if server_cpu_seconds else None
        finally:
            stopping = True
            await asyncio.gather(*tasks, return_exceptions=True)

    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return LoadResult(
        calls=len(latencies),
        errors=errors,
        seconds=seconds,
        p50_ms=quantiles[49] * 1e3,
        p99_ms=quantiles[98] * 1e3,
        server_cpu=(server1 - server0) / seconds
        if server0 is not None and server1 is not None
        else None,
        client_cpu=(client1 - client0) / seconds,
    )
