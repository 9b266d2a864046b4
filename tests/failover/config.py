"""The failover group's settings, shared by the harness and the tests that drive it.

Lease TTL 2 s and slaveTimeout 1 s keep elections within a test's patience; small
commit-log files make the logs roll over within a test. Nothing here runs anything.
"""

from __future__ import annotations

from services.broker.failover.etcd import group_prefix

CLUSTER = "DefaultCluster"
BROKER = "broker-a"
PREFIX = group_prefix(CLUSTER, BROKER)
TTL_MS = 2000
TTL_S = TTL_MS / 1000
SLAVE_TIMEOUT_MS = 1000
PACE_S = 0.005  # a producer's pause between sends
SLAVE_TIMEOUT_S = SLAVE_TIMEOUT_MS / 1000
SLAVE_SYNC_INTERVAL_MS = 1000  # the members' default here (the broker's own: 10 s)
FILE_SIZE = 256 * 1024  # commit-log files roll over within a test
TOPIC = "Failover"
QUEUES = 4
SEND_TIMEOUT_S = 3.0
# Channels that reconnect fast to a member restarted on the same port.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
]
RECOVERED = "store recovered crashed="
# How long a test waits for what a group does after a fault or a restart (a new master,
# its first SEND_OK, a member back in sync): on an idle machine a few seconds past the
# lease TTL, on a loaded one (CI, three test workers and JVMs on two cores) much longer.
# The times are measured and reported (Outcome.failover_note, `make chaos`'s report,
# `make bench`'s failover figures), never asserted: a wait ends as soon as it holds.
PATIENCE_S = 60.0
