"""`ferry broker` / `python -m services.broker`: run a broker.

Configuration comes from a RocketMQ-style `broker.conf` (`-c`), overridden by
`-o key=value` (repeatable); `--help-keys` lists every key with its default.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
from pathlib import Path

from ferry.runtime import auth, eventloop
from ferry.runtime.errors import ConfigError, CorruptFileError
from ferry.runtime.logs import setup_logging
from ferry.runtime.memory import retain_freed_memory
from ferry.runtime.server import run_until_signalled
from services.broker.config import BrokerConfig, describe_keys, load_config
from services.broker.store import (
    CommitLogError,
    ConsumeQueueError,
    RecoveryError,
    StoreLockedError,
)

log = logging.getLogger(__name__)

# The exit status after a storage fault (fail-stop): non-zero, so that the
# supervisor (Kubernetes, systemd) restarts the broker and recovery runs.
EXIT_STORAGE = 3

# The broker's event loop unless --event-loop or $FERRY_EVENT_LOOP says otherwise:
# asyncio's own (ferry/runtime/eventloop.py says why), but uvloop for a broker that serves
# the RocketMQ 5 SDKs itself (enableProxy). There each call passes through several
# callbacks and tasks (the native door's hand-off, the proxy's handler, the in-process
# link's run, the store's settle), and the loop's own Python is a share of it: local-mode
# sends of the apache benchmark's Go SDK load (8 senders, 128 B, 12 s windows, three
# alternating pairs, 2026-12-07) cost 192, 189 and 234 µs of the broker's CPU per message
# on uvloop against 291, 239 and 289 on asyncio's loop.
BROKER_LOOP = "asyncio"
LOCAL_MODE_LOOP = "uvloop"


def event_loop_of(requested: str | None, config: BrokerConfig) -> str:
    """The loop asked for (--event-loop, $FERRY_EVENT_LOOP), else the broker's default
    for this configuration."""
    if requested:
        return requested
    return LOCAL_MODE_LOOP if config.enable_proxy else BROKER_LOOP


class StoppedOnStorageFault(Exception):
    """The broker stopped itself after a storage fault."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=None,
        metavar="broker.conf",
        help="RocketMQ-style properties file (brokerClusterName, brokerName, brokerId, "
        "brokerRole, namesrvAddr, listenPort, storePathRootDir, ...)",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one broker.conf key, overriding the file (repeatable), e.g. -o listenPort=0",
    )
    parser.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write {remoting_port, fast_port, grpc_port, metrics_port, ha_port, health_port, "
        "pid} as JSON here once serving",
    )
    parser.add_argument(
        "--help-keys", action="store_true", help="list every broker.conf key with its default"
    )
    eventloop.add_argument(
        parser, None, default_text=f"{BROKER_LOOP}, {LOCAL_MODE_LOOP} with enableProxy"
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="DEBUG, INFO (default), WARNING or ERROR; $FERRY_LOG_LEVEL",
    )


def run(args: argparse.Namespace) -> int:
    if args.help_keys:
        print(describe_keys())
        return 0
    setup_logging(args.log_level)
    if args.event_loop is not None and (problem := eventloop.check(args.event_loop)) is not None:
        log.error("%s", problem)
        return 2
    try:
        config, _ = load_config(args.config, args.option, warn=log.warning)
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot start: cannot read %s: %s", args.config, exc)
        return 2
    if args.port_file is not None:
        config = dataclasses.replace(config, port_file=args.port_file)
    auth.warn_if_placeholder(log, "haSecret", config.ha_secret, "ferry-ha")
    auth.warn_if_placeholder(log, "adminToken", config.admin_token, "ferry-admin")
    log.info("%s", retain_freed_memory())

    from services.broker.app import BrokerApp  # imported here: `ferry --help` stays fast

    started = False

    async def main() -> None:
        nonlocal started
        if config.enable_failover:
            from services.broker.failover.node import FailoverNode

            app = FailoverNode(config)  # runs a BrokerApp in the role etcd gives it
        else:
            app = BrokerApp(config)

        async def start() -> None:
            nonlocal started
            await app.start()
            started = True
            # This process is the broker: startup objects are long-lived, so move
            # them out of the collector's way, and collect the young generation
            # less often (the send path allocates many short-lived objects).
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 20, 20)

        await run_until_signalled(start, app.stop, until=app.failed)
        if app.store is not None and app.store.failstop.tripped:
            raise StoppedOnStorageFault(app.store.failstop.fault)

    try:
        eventloop.run(main, event_loop_of(args.event_loop, config))
    except StoppedOnStorageFault as exc:
        # Not CRITICAL: failstop.py logged the fault itself, once, at CRITICAL.
        log.error("broker stopped after a storage failure: %s; exiting %d", exc, EXIT_STORAGE)
        return EXIT_STORAGE
    except (
        CorruptFileError,
        CommitLogError,
        ConsumeQueueError,
        RecoveryError,
        StoreLockedError,
    ) as exc:
        log.error("cannot start: %s", exc)
        return 1
    except ConfigError as exc:  # e.g. a TLS file that cannot be read
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        log.error("%s: %s", "failed while stopping" if started else "cannot start", exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.broker", description="Run a ferry broker."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
