"""The broker's tables and the failover metadata log.

Owns: `tables` (BrokerMetadata: topics, subscription groups, consumer offsets,
delay offsets and broker settings, versioned and written atomically) and
`metadata_log` (the metadata changes a master appends to its own commit log, so a
slave that is promoted holds every table change with every acknowledged message).

May import: store/. Must never import: messaging/, pop/, schedule/, api/, cluster/,
failover/, app, `grpc` or `ferry.v1`.
"""
