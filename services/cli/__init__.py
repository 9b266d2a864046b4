"""The `ferry` command: one launcher for every process and every admin request.

Owns: the argument parser and the subcommands (`main.py` dispatches; a module per
family of commands, `*_cmds.py`), `ferry dev` and the topologies it starts (the
`dev/` room), and the text and JSON the commands print (`output.py`). A command
converts its arguments, calls the client library (`ferry.client`, `ferry.remoting`)
or a service's entry point, and renders the answer.

Imports: `ferry` (the library), each service's entry point (`services.*.cli`), the
broker's config reader (a topology is a set of broker.conf files) and the failover
state in etcd (`ferry failover`): tests/unit/test_imports.py lists these edges.
Must never import: any other module of a service (its stores, use cases or servicers).
Nothing under `ferry/` imports this package.
"""
