"""`python -m benchmarks.grpc_stream_floor`: what gRPC Python itself costs
per streamed message, with no ferry code on either side.

The v2 `ReceiveMessage` answers with one response per message, so each
message received through the proxy is one streamed gRPC message the proxy
writes and the consumer reads. This measures that floor: a server streams
MESSAGES x BODY-byte responses per call (bytes in, bytes out, no protobuf),
CLIENTS synchronous grpcio clients (one channel each, one call at a time,
as the proxy benchmark's consumers) read them. Server on one core, clients
on the other, as in the proxy benchmark. Prints messages/s and CPU-µs per
message on each side, for a grpc.aio server (asyncio and uvloop) and a
synchronous grpcio server.

Not part of `make bench`: a reference figure for the proxy section's
analysis (docs/guides/rocketmq5-sdks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import threading
import time
from concurrent import futures

import grpc

from benchmarks.procs import cpu_plan, cpu_seconds
from ferry.runtime import eventloop

MESSAGES = 32
BODY = b"x" * 300
METHOD = "/ferry.bench.Stream/Read"
SERVERS = ("aio-asyncio", "aio-uvloop", "sync")


def _stream_sync(request: bytes, context):
    for _ in range(MESSAGES):
        yield BODY


async def _stream_aio(request: bytes, context):
    for _ in range(MESSAGES):
        yield BODY


def _handler(fn):
    return grpc.method_handlers_generic_handler(
        "ferry.bench.Stream", {"Read": grpc.unary_stream_rpc_method_handler(fn)}
    )


def _serve(kind: str, cpus, ports: mp.Queue, stop: mp.Event) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(8))
        server.add_generic_rpc_handlers((_handler(_stream_sync),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        stop.wait()
        server.stop(0)
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(_stream_aio),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await server.stop(0)

    eventloop.run(main, "uvloop" if kind == "aio-uvloop" else "asyncio")


def measure(kind: str, clients: int, calls: int) -> str:
    server_cpus, client_cpus = cpu_plan()
    ports: mp.Queue = mp.Queue()
    stop = mp.Event()
    proc = mp.Process(target=_serve, args=(kind, server_cpus, ports, stop))
    proc.start()
    try:
        port = ports.get(timeout=30)
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        channels = [
            grpc.insecure_channel(f"127.0.0.1:{port}", [("grpc.use_local_subchannel_pool", 1)])
            for _ in range(clients)
        ]
        reads = [c.unary_stream(METHOD) for c in channels]
        for read in reads:  # warm-up: connections up, code paths hot
            for _ in range(20):
                for _ in read(b"", timeout=30):
                    pass
        counts = [0] * clients

        def work(i: int) -> None:
            for _ in range(calls):
                for _ in reads[i](b"", timeout=30):
                    counts[i] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        server0, client0, start = cpu_seconds(proc.pid), time.process_time(), time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - start
        server_s, client_s = cpu_seconds(proc.pid) - server0, time.process_time() - client0
        n = sum(counts)
        for c in channels:
            c.close()
    finally:
        stop.set()
        proc.join(30)
    return (
        f"{kind:12} {n / seconds:8,.0f} msgs/s   CPU µs/msg: server {server_s / n * 1e6:5.1f}, "
        f"clients {client_s / n * 1e6:5.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.grpc_stream_floor",
        description="gRPC Python's own CPU cost per server-streamed message (no ferry code).",
    )
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--calls", type=int, default=300, help="calls per client (default 300)")
    parser.add_argument("--server", choices=SERVERS, action="append", help="default: all")
    args = parser.parse_args(argv)
    print(
        f"{args.clients} grpcio sync clients x {args.calls} calls x {MESSAGES} messages of "
        f"{len(BODY)} B; server and clients on separate cores"
    )
    for kind in args.server or SERVERS:
        print(measure(kind, args.clients, args.calls), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
