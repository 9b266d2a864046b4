"""Automatic failover: masters elected in etcd, epochs and the member that swaps
between master and slave incarnations of the broker.

Owns: `node` (FailoverNode: campaign, step down, swap incarnations), `etcd` (the
etcd client wrapper and the group's keys) and `epochs` (the epoch history file).

May import: the app (it builds a BrokerApp per incarnation) and the
`Incarnation` contract the app side declares (services/broker/incarnation.py).
Must never import: the entry points (services/broker/cli.py, __main__, services/cli),
which are the only modules that import failover/.
"""
