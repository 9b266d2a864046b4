"""`python -m benchmarks.empty_server`: the benchmarks' same-run baseline server.

One generic unary method, `/ferry.bench.Empty/Call`, that takes raw bytes
without parsing them and answers `b""`; and one bidirectional method,
`/ferry.bench.Empty/Echo`, that answers each `SendStreamRequest` at once with
a SEND_OK result per message (under its sequence): what a send stream costs
the server with no store behind it. It is served by the same
`ferry.runtime.server.GrpcServer` the name server uses (same options, health
and reflection), so the only difference from a real ferry RPC is the work the
real method does. Writes {grpc_port, pid} to --port-file once serving; stops on
SIGTERM/SIGINT. `--event-loop uvloop` runs it on the loop ferry's proxy uses (the
default stays asyncio's own, the loop of the name server and broker it stands beside).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import grpc

from ferry.runtime import eventloop
from ferry.runtime.files import atomic_write_bytes
from ferry.runtime.server import GrpcServer, Service, run_until_signalled
from ferry.v1 import broker_pb2

SERVICE_NAME = "ferry.bench.Empty"
METHOD = f"/{SERVICE_NAME}/Call"
ECHO_METHOD = f"/{SERVICE_NAME}/Echo"


async def _call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b""


_SEND_OK = broker_pb2.SendResult(status=broker_pb2.SEND_OK)


async def _echo(requests, context: grpc.aio.ServicerContext):
    async for request in requests:
        yield broker_pb2.SendStreamResponse(
            results=[
                broker_pb2.StreamedResult(sequence=m.sequence, result=_SEND_OK)
                for m in request.messages
            ]
        )


def _add(servicer: object, server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Call": grpc.unary_unary_rpc_method_handler(_call),
            "Echo": grpc.stream_stream_rpc_method_handler(
                _echo,
                request_deserializer=broker_pb2.SendStreamRequest.FromString,
                response_serializer=broker_pb2.SendStreamResponse.SerializeToString,
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.empty_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True)
    eventloop.add_argument(parser, default="asyncio")
    args = parser.parse_args(argv)
    server = GrpcServer([Service(SERVICE_NAME, None, _add)], args.host, args.port)

    async def start() -> None:
        await server.start()
        await server.set_serving()
        info = {"grpc_port": server.port, "pid": os.getpid()}
        atomic_write_bytes(args.port_file, json.dumps(info).encode())

    async def stop() -> None:
        await server.stop(0.5)

    eventloop.run(lambda: run_until_signalled(start, stop), args.event_loop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
