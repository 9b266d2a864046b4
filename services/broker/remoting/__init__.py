"""The broker's RocketMQ-protocol adapters (docs/reference/remoting.md): like
api/ for gRPC, each handler parses a request's header fields, calls one use
case, and answers with RocketMQ's response codes.

Owns: `deps` (what the handlers are built from), `convert` (header parsing and
the one FerryError → response-code table), and one module per family of
codes; `handlers(deps)` is the whole table the broker's RemotingServer serves.

May import: ferry.remoting, messaging/, metadata/, pop/, schedule/,
transactions/ (public surface). Must never import: store/ (every figure and record
comes through a use case), cluster/, failover/, app, `grpc` or `ferry.v1`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from ferry.remoting.server import Connection, Handler
    from services.broker.remoting.deps import Deps


def after_close() -> frozenset[int]:
    """The requests the broker's RemotingServer still handles when a client
    sent them just before its connection broke (ferry.remoting.server): those
    whose effect does not need the connection — sends (a oneway send is done,
    for its client, once written), offset commits, send-backs, unregistering.
    Not a heartbeat or a lock, which would tie the group to a closed channel."""
    from ferry.remoting import codes

    return frozenset(
        {
            codes.SEND_MESSAGE,
            codes.SEND_MESSAGE_V2,
            codes.SEND_BATCH_MESSAGE,
            codes.UPDATE_CONSUMER_OFFSET,
            codes.CONSUMER_SEND_MSG_BACK,
            codes.UNREGISTER_CLIENT,
            codes.END_TRANSACTION,  # oneway, often right before the producer shuts down
        }
    )


def handlers(deps: Deps) -> dict[int, Handler]:
    """Every request code the broker serves over RocketMQ's protocol."""
    from services.broker.remoting import (
        admin,
        assignment,
        consumers,
        diagnostics,
        offsets,
        pop_queries,
        pops,
        pulls,
        queries,
        sendback,
        sends,
        transactions,
    )

    table: dict[int, Handler] = {}
    for family in (
        sends,
        offsets,
        queries,
        consumers,
        pulls,
        pops,
        pop_queries,
        assignment,
        sendback,
        admin,
        diagnostics,
        transactions,
    ):
        table.update(family.handlers(deps))
    return table


def connection_closed(deps: Deps) -> Callable[[Connection], None]:
    """The broker RemotingServer's `on_close`: a closed client channel leaves
    its groups (their members are told) and frees its queue locks."""
    from services.broker.remoting import consumers

    return consumers.connection_closed(deps)


async def housekeeping(deps: Deps) -> None:
    """The task beside the broker's RemotingServer that expires clients silent
    for 120 s and dead queue locks (runs until cancelled)."""
    from services.broker.remoting import consumers

    await consumers.housekeeping(deps)
