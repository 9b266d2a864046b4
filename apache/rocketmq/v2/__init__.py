"""Generated protobuf and gRPC code for `apache.rocketmq.v2` (`make proto` writes it).

The sources are proto/apache/rocketmq/v2/*.proto, wire-identical to apache/rocketmq-apis and
byte-identical to the descriptors of the official RocketMQ 5 Python SDK, so that both can be
imported in one process.
"""
