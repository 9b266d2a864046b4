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
