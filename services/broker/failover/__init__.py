"""Automatic failover: masters elected in etcd, epochs and the member that swaps
between master and slave incarnations of the broker.

Owns: `node` (FailoverNode: campaign, step down, swap incarnations), `etcd` (the
etcd client wrapper and the group's keys) and `epochs` (the epoch history file).

Imports the app (it builds incarnations through `services.broker.app`). Nothing
imports failover/ except the entry points (services/broker/cli.py, ferry/cli);
the `Incarnation` contract it drives is declared by the app side.
"""
