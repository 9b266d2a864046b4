"""The broker's place in its cluster: name-server registration, the slave's
metadata sync from its master, and the replication policy (how a SYNC_MASTER waits
for its slaves' acknowledgement).

Owns: `registration` (Registrar: the registration loop), `slave_sync`
(SlaveSyncLoop: the gRPC client that pulls metadata from the master) and
`replication` (the SYNC_MASTER acknowledgement wait handed to messaging).

May import: store/, metadata/, messaging/, api/ (convert, for the slave-sync
client), `services/ha`, `grpc` and `ferry.v1` (its gRPC clients). Must never import:
pop/, schedule/, failover/, app.
"""
