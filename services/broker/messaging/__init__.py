"""The send and pull use cases and the topic, queue and permission rules they share,
plus the admin and statistics use cases.

Owns: `rules` (the lookup protocols TopicLookup, GroupLookup and OffsetTable,
where a delayed message goes when due, tag sub-expressions: shared with pop and
schedule, and free of the store), `service` (MessagingService: send, staged sends
and their settlement, pull, the writable/readable topic and queue checks),
`admin` (AdminService: topic and group changes, broker settings, retention runs),
`statistics` (StatisticsService: the figures mqadmin and ferry.v1 report, over
`stats`' TrafficStats rates),
`clients` (ClientTables: producer and consumer groups by heartbeat, their
subscriptions, expiry), `locks` (QueueLocks: orderly consumers' queue locks) and
`sendback` (SendBack: a consumer's failed message to %RETRY%<group> through the
delay levels, or to %DLQ%<group>).

May import: store/, metadata/. Must never import: pop/, schedule/, api/, cluster/,
failover/, app, `grpc` or `ferry.v1` (no use case learns which door a request came
through).
"""
