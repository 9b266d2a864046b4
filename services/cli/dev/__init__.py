"""`ferry dev` (what `make run` starts): a Kubernetes topology, run locally on loopback.

Owns: `topology` (the overlays' broker.conf files read as the brokers read them,
mapped to this machine's ports and paths), `etcd` (the one-member etcd of a
failover topology) and `run` (the command: start every process, wait until the
cluster is ready, print how to use it, stop everything on Ctrl-C).

Imports: `ferry`, the broker's config reader (`services.broker.config`) and the
`ferry failover` command's names (`services.cli.failover_cmds`). Must never import
any other module of a service: each process it runs is a child with its own
command line (`python -m services.broker`, ...).
"""
