"""The broker's RocketMQ-protocol adapters (docs/reference/remoting.md): like
api/ for gRPC, each handler parses a request's header fields, calls one use
case, and answers with RocketMQ's response codes.

Owns: `deps` (what the handlers are built from), `convert` (header parsing and
the one FerryError → response-code table), and one module per family of
codes; `handlers(deps)` is the whole table the broker's RemotingServer serves.

May import: ferry.remoting, messaging/, metadata/, pop/, schedule/, store/
(public surface). Must never import: cluster/, failover/, app, `grpc` or
`ferry.v1`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferry.remoting.server import Handler
    from services.broker.remoting.deps import Deps


def handlers(deps: Deps) -> dict[int, Handler]:
    """Every request code the broker serves over RocketMQ's protocol."""
    from services.broker.remoting import consumers, offsets, pulls, queries, sends

    table: dict[int, Handler] = {}
    for family in (sends, offsets, queries, consumers, pulls):
        table.update(family.handlers(deps))
    return table
