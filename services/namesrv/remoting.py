"""The name server's RocketMQ-protocol handlers (docs/reference/remoting.md,
"Name server"): each parses a request's header fields, reads or changes the
same route table and KV store as the `ferry.v1` servicer, and answers with
RocketMQ's codes and bodies.

`handlers(...)` is the whole table the name server's RemotingServer serves.
"""

from __future__ import annotations

from collections.abc import Callable

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.discovery import GRPC_PORT_KEY, NAMESPACE
from ferry.remoting.server import Connection, Handler
from services.namesrv.kvconfig import KVConfigStore
from services.namesrv.routes import RouteTable


def handlers(
    routes: RouteTable, kv: KVConfigStore, grpc_port: Callable[[], int]
) -> dict[int, Handler]:
    """`grpc_port`: the bound port of this name server's ferry.v1 server,
    answered for GET_KV_CONFIG ferry.v1/grpcPort (ferry.remoting.discovery)."""

    async def get_kv_config(connection: Connection, request: Command) -> Command:
        namespace = request.ext.get("namespace", "")
        key = request.ext.get("key", "")
        if namespace == NAMESPACE and key == GRPC_PORT_KEY:
            return request.answer(codes.SUCCESS, ext={"value": str(grpc_port())})
        value = kv.get(namespace, key)
        if value is None:
            return request.answer(
                codes.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return request.answer(codes.SUCCESS, ext={"value": value})

    return {codes.GET_KV_CONFIG: get_kv_config}
