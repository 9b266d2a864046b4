"""A closed-loop unary load generator on `grpc.aio`.

`concurrency` tasks share one channel; each sends a request picked at random
from `requests` (already serialized), awaits the answer, and sends the next.
Requests and answers stay raw bytes: the client never parses an answer, so
the generator costs the same per call whatever the method, and the figure
measures the server. Calls are counted only inside the measured window,
after the warm-up. `stream_closed_loop` does the same over bidirectional
send streams, and `producer_closed_loop` through ferry's PipelinedProducer.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    metadata: Sequence[tuple[str, str]] | None = None,
) -> LoadResult:
    """`answer_ok`, when given, parses each answer: a False counts as an error
    (e.g. a SendResult whose status is not SEND_OK). `metadata` goes with every
    call (a RocketMQ 5 client's `x-mq-client-id`, say)."""
    run = Run()

    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        md = tuple(metadata) if metadata else None
        await call(requests[0], timeout=CALL_TIMEOUT_S, metadata=md)  # connect; fail if broken

        async def worker(rng: random.Random) -> None:
            clock = time.perf_counter
            while not run.stopping:
                request = rng.choice(requests)
                start = clock()
                try:
                    answer = await call(request, timeout=CALL_TIMEOUT_S, metadata=md)
                except grpc.aio.AioRpcError:
                    if run.measuring:
                        run.errors += 1
                    continue
                if answer_ok is not None and not answer_ok(answer):
                    if run.measuring:
                        run.errors += 1
                    continue
                if run.measuring:
                    run.latencies.append(clock() - start)

        root = random.Random(seed)
        workers = [worker(random.Random(root.random())) for _ in range(concurrency)]
        return await run.drive(workers, warmup_s, duration_s, server_cpu_seconds, "callers")


async def stream_closed_loop(
    target: str,
    method: str,
    request: bytes,
    producers: int,
    in_flight: int,
    warmup_s: float,
    duration_s: float,
    count_results: Callable[[bytes], tuple[int, int]],
    server_cpu_seconds: Callable[[], float] | None = None,
    per_write: int = 1,
) -> LoadResult:
    """`producers` bidirectional streams on one channel, each keeping up to
    `in_flight` messages written and unanswered, `request` (pre-serialized,
    `per_write` messages) at a time. `count_results(answer)` parses an answer into
    (messages answered, of which not OK): an answer may cover several
    messages, in the order written. Latency is per message, from its write
    to the answer that covers it; `calls` counts messages."""
    run = Run()

    async with grpc.aio.insecure_channel(target) as channel:
        open_stream = channel.stream_stream(method)

        async def producer() -> None:
            call = open_stream(timeout=warmup_s + duration_s + 60)
            sent: list[float] = []  # write times of the unanswered, oldest first
            head = 0
            room = asyncio.Event()
            room.set()
            clock = time.perf_counter

            async def read() -> None:
                nonlocal head
                async for answer in call:
                    n, bad = count_results(answer)
                    now = clock()
                    if run.measuring:
                        run.errors += bad
                        run.latencies.extend(now - t for t in sent[head : head + n])
                    head += n
                    if head > 4096:
                        del sent[:head]
                        head = 0
                    room.set()

            reader = asyncio.create_task(read())
            try:
                while not run.stopping:
                    if reader.done():
                        reader.result()  # the stream failed: so does the benchmark
                        raise RuntimeError("the broker ended a send stream")
                    if len(sent) - head + per_write > in_flight:
                        room.clear()
                        await asyncio.wait(
                            [asyncio.ensure_future(room.wait()), reader],
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                        continue
                    sent.extend([clock()] * per_write)
                    await call.write(request)
                await call.done_writing()
                await reader
            finally:
                reader.cancel()

        workers = [producer() for _ in range(producers)]
        return await run.drive(workers, warmup_s, duration_s, server_cpu_seconds, "send streams")


def producer_closed_loop(
    new_producer: Callable[[], Any],
    topic: str,
    body: bytes,
    producers: int,
    window: int,
    warmup_s: float,
    duration_s: float,
    server_cpu_seconds: Callable[[], float] | None = None,
) -> LoadResult:
    """`producers` PipelinedProducers (`new_producer()` each), each fed by its
    own thread that keeps up to `window` messages handed over (`send_async`)
    and unanswered, as an application does; when the window is full it waits
    for the oldest 64. `calls` counts answered messages. Latency is sampled:
    every 16th message, from its hand-over to its answer."""
    run = Run()
    counts = [0] * producers
    failures = [0] * producers
    clock = time.perf_counter

    def sampled(started: float):
        def done(_future) -> None:
            if run.measuring:
                run.latencies.append(clock() - started)

        return done

    def feed(index: int, producer) -> None:
        out: collections.deque = collections.deque()

        def settle(future) -> None:
            if run.measuring:
                counts[index] += 1
                if future.exception() is not None:
                    failures[index] += 1

        sent = 0
        while not run.stopping:
            if len(out) >= window:
                out[min(63, len(out) - 1)].exception()  # waits, never raises
                while out and out[0].done():
                    settle(out.popleft())
                continue
            future = producer.send_async(topic, body)
            sent += 1
            if sent % 16 == 0:
                future.add_done_callback(sampled(clock()))
            out.append(future)
        for future in out:
            future.exception()

    made = [new_producer() for _ in range(producers)]
    threads = [
        threading.Thread(target=feed, args=(i, p), name=f"bench-producer-{i}")
        for i, p in enumerate(made)
    ]
    try:
        for thread in threads:
            thread.start()
        measured = asyncio.run(
            measure_window(warmup_s, duration_s, server_cpu_seconds, run.set_measuring)
        )
    finally:
        run.stopping = True  # read by the feeding threads
        for thread in threads:
            thread.join()
        for producer in made:
            producer.close()
    result = load_result(run.latencies, sum(failures), measured)
    return dataclasses.replace(result, calls=sum(counts))


@dataclass
class Run:
    """What a load generator's workers share: whether the measured window is
    on, whether to stop, and what they measured in the window."""

    measuring: bool = False
    stopping: bool = False
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    def set_measuring(self, on: bool) -> None:
        self.measuring = on

    async def drive(
        self,
        workers: Sequence[Coroutine[Any, Any, None]],
        warmup_s: float,
        duration_s: float,
        server_cpu_seconds: Callable[[], float] | None,
        what: str,
    ) -> LoadResult:
        """Run the workers through the warm-up and the window, then stop them
        (`stopping`); one that failed fails the run, named as `what`."""
        tasks = [asyncio.create_task(w) for w in workers]
        try:
            window = await measure_window(
                warmup_s, duration_s, server_cpu_seconds, self.set_measuring
            )
        finally:
            self.stopping = True
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} {what} failed: {failed[0]!r}")
        return load_result(self.latencies, self.errors, window)


@dataclass
class Window:
    """The measured window of a load run: its length and the CPU both sides spent in it."""

    seconds: float = 0.0
    server_cpu: float | None = None
    client_cpu: float = 0.0


async def measure_window(
    warmup_s: float,
    duration_s: float,
    server_cpu_seconds: Callable[[], float] | None,
    measuring: Callable[[bool], None],
) -> Window:
    """Sleep out the warm-up, then measure `duration_s` with `measuring(True)`."""
    await asyncio.sleep(warmup_s)
    measuring(True)
    server0 = server_cpu_seconds() if server_cpu_seconds else None
    client0 = time.process_time()
    t0 = time.perf_counter()
    await asyncio.sleep(duration_s)
    measuring(False)
    seconds = time.perf_counter() - t0
    client1 = time.process_time()
    server1 = server_cpu_seconds() if server_cpu_seconds else None
    return Window(
        seconds,
        (server1 - server0) / seconds if server0 is not None and server1 is not None else None,
        (client1 - client0) / seconds,
    )


def load_result(latencies: list[float], errors: int, window: Window) -> LoadResult:
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return LoadResult(
        calls=len(latencies),
        errors=errors,
        seconds=window.seconds,
        p50_ms=quantiles[49] * 1e3,
        p99_ms=quantiles[98] * 1e3,
        server_cpu=window.server_cpu,
        client_cpu=window.client_cpu,
    )
