"""Automatic failover: masters elected in etcd, epochs and the member that swaps
between master and slave incarnations of the broker.

Owns: `node` (FailoverNode: composes the parts below and moves between roles),
`runs` (the running app and the servers that outlive it), `election` (who may
campaign, the campaign, the leader key), `lease` (the etcd lease and its clock,
the fence), `insync` (a master run's in-sync set and its replica
acknowledgements), `handover` (`ferry failover`), `rejoin` (a run's store
before it serves), `role` (the member's role), `metrics` (the `ferry_ha_*`
series), `etcd` (the etcd client wrapper and the group's keys) and `epochs`
(the epoch history file). Only `runs` reads the running app.

May import: the app (it builds a BrokerApp per incarnation) and the
`Incarnation` contract the app side declares (services/broker/incarnation.py).
Must never import: the entry points (services/broker/cli.py, __main__, services/cli),
which are the only modules that import failover/.
"""
