"""ferry: a RocketMQ-style replicated message broker (shared library code).

`ferry.v1` holds the code generated from `proto/` (`make proto`); `ferry.runtime`
the pieces every process shares (gRPC server runtime, clock, atomic files, logging,
metrics endpoint); `ferry.client` the client library.

Must never import: `services` (tests/unit/test_imports.py). `ferry/` is the library and
the client; the launchers, the services and the `ferry` command (`services.cli`) import it.
"""

__version__ = "0.1.0"
