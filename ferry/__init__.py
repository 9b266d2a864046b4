"""ferry: a RocketMQ-style replicated message broker (shared library code).

`ferry.v1` holds the code generated from `proto/` (`make proto`); `ferry.runtime`
the pieces every process shares (gRPC server runtime, clock, atomic files, logging,
metrics endpoint); `ferry.client` the client library; `ferry.cli` the `ferry` command.
"""

__version__ = "0.1.0"
