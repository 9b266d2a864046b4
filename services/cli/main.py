"""The `ferry` command: run ferry's processes and talk to a running cluster."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import grpc

from ferry.client.namesrv import NoNameServerAnswered
from ferry.runtime import tls
from ferry.runtime.errors import ConfigError, FerryError, InvalidArgument
from services.cli import (
    broker_cmds,
    failover_cmds,
    group_cmds,
    message_cmds,
    namesrv_cmds,
    pipeline_cmds,
    stats_cmds,
    store_cmds,
)
from services.cli.dev import run as dev

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


# The commands that run a server, with the module that defines their options and runs them.
# A module is imported only when its command runs (or for the whole parser): each imports its
# whole service, ~0.35 s of CPU that every client command (`ferry topic create` ...) paid.
SERVERS = {
    "namesrv": (
        "services.namesrv.cli",
        "run a name server",
        "Run a name server until SIGTERM/Ctrl-C.",
    ),
    "broker": (
        "services.broker.cli",
        "run a broker",
        "Run a broker until SIGTERM/Ctrl-C: `ferry broker -c broker.conf [-o key=value ...]`. "
        "See --help-keys for the broker.conf keys. (`ferry broker status -b HOST:PORT` shows a "
        "running broker's statistics.)",
    ),
    "proxy": (
        "services.proxy.cli",
        "run the RocketMQ 5 proxy (apache.rocketmq.v2, for the official SDKs)",
        "Run the RocketMQ 5 proxy until SIGTERM/Ctrl-C: apache.rocketmq.v2.MessagingService "
        "for the official RocketMQ 5 SDKs, backed by the brokers the name servers know.",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `command`, the server commands other than that one
    get their name and help only (what `ferry --help` lists), not their options."""
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="ferry: a RocketMQ-style replicated message broker. "
        "Run `ferry COMMAND --help` for each command's options.",
        epilog="Exit status: 0 ok, 1 the server refused or found nothing, 2 bad usage, 3 no server answered.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, (module, summary, description) in SERVERS.items():
        p = sub.add_parser(name, help=summary, description=description)
        if command is None or command == name:
            server_cli = importlib.import_module(module)
            server_cli.add_arguments(p)
            p.set_defaults(func=server_cli.run)

    namesrv_cmds.add_commands(sub)
    broker_cmds.add_commands(sub)
    stats_cmds.add_broker_commands(sub)
    group_cmds.add_commands(sub)
    message_cmds.add_commands(sub)
    store_cmds.add_commands(sub)
    failover_cmds.add_commands(sub)
    pipeline_cmds.add_commands(sub)
    dev.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["broker", "status"]:  # `ferry broker` alone runs a broker
        argv = ["broker-status", *argv[2:]]
    # The top-level parser has no options of its own but -h: a first word that is not an
    # option names the command.
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    # A client command's --tls-ca/--tls-cert/--tls-key: every client it makes
    # uses them (servers, `ferry namesrv`, have no --tls-ca and keep theirs).
    if hasattr(args, "tls_ca"):
        for name, env in (("tls_ca", tls.ENV_CA), ("tls_cert", tls.ENV_CERT),
                          ("tls_key", tls.ENV_KEY)):  # fmt: skip
            if getattr(args, name):
                os.environ[env] = getattr(args, name)
    try:
        return args.func(args)
    except (NoNameServerAnswered, stats_cmds.Unreachable) as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except grpc.RpcError as exc:
        print(f"ferry: {exc.code().name}: {exc.details()}", file=sys.stderr)
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            hint = _rocketmq_port_hint(getattr(args, "broker", None))
            if hint:
                print(f"ferry: {hint}", file=sys.stderr)
            return EXIT_UNREACHABLE
        return EXIT_ERROR
    except (InvalidArgument, ConfigError) as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FerryError as exc:  # NOT_FOUND and other refusals
        print(f"ferry: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _rocketmq_port_hint(addr: object) -> str:
    """When -b names a port that answers RocketMQ's protocol (a broker's
    listenPort, not its gRPC port), say so: gRPC only reports "Socket closed"."""
    if not isinstance(addr, str) or not addr:
        return ""
    from ferry.remoting import codes
    from ferry.remoting.client import call
    from ferry.remoting.codec import Command

    try:
        call(addr, Command(codes.GET_KV_CONFIG), timeout=1.0)
    except Exception:  # noqa: BLE001 - no answer in RocketMQ's protocol: no hint
        return ""
    return (
        f"{addr} speaks RocketMQ's protocol (a broker's listenPort); -b wants the broker's "
        "ferry.v1 gRPC address, its grpcListenPort (10915 by default; `ferry cluster` lists it)"
    )


if __name__ == "__main__":
    sys.exit(main())
