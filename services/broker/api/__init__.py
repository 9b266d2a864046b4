"""The gRPC adapters of the broker: the only broker modules (with app.py and the
gRPC clients in cluster/) that import `grpc` or `ferry.v1`.

Owns: `servicer` (the BrokerService/BrokerAdmin/SlaveSync servicers: convert the
request, call one use case, convert the result), `convert` (the protobuf <->
domain mapping and the one error -> status table) and `sendstream` (the
client-streaming send session: protobuf batches in, staged sends, acks out).

May import: messaging/, metadata/, pop/, schedule/, store/ (public surface). Must
never import: cluster/, failover/, app.
"""
