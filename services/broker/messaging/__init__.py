"""The send and pull use cases and the topic, queue and permission rules they share,
plus the admin use cases.

Owns: `service` (MessagingService: send, staged sends and their settlement, pull,
the writable/readable topic and queue checks, sub-expression parsing and the lookup
protocols (TopicLookup, GroupLookup, OffsetTable) that pop and schedule reuse) and
`admin` (AdminService: topic and group changes, broker settings, retention runs).

May import: store/, metadata/. Must never import: pop/, schedule/, api/, cluster/,
failover/, app, `grpc` or `ferry.v1` (no use case learns which door a request came
through).
"""
