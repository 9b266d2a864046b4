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
