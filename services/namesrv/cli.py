"""`ferry namesrv` / `python -m services.namesrv`: run a name server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
from pathlib import Path

from ferry.runtime import auth
from ferry.runtime.auth import ENV_ADMIN_TOKEN
from ferry.runtime.errors import ConfigError, CorruptFileError
from ferry.runtime.logs import setup_logging
from ferry.runtime.server import run_until_signalled
from ferry.runtime.tls import ServerTLS, server_ssl_context
from services.namesrv.app import DEFAULT_GRPC_PORT, DEFAULT_PORT, NamesrvApp, NamesrvConfig
from services.namesrv.remoting import parse_hosts

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--host",
        default=env("FERRY_NAMESRV_HOST", "0.0.0.0"),
        help="address to listen on (default 0.0.0.0; $FERRY_NAMESRV_HOST)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("FERRY_NAMESRV_PORT", str(DEFAULT_PORT))),
        help="RocketMQ-protocol port, what RocketMQ clients, mqadmin and brokers' namesrvAddr "
        f"name; 0 picks a free one (default {DEFAULT_PORT}; $FERRY_NAMESRV_PORT)",
    )
    grpc_port = env("FERRY_NAMESRV_GRPC_PORT")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=int(grpc_port) if grpc_port else None,
        help="ferry.v1 gRPC port (grpcurl, ferry's own clients; found through --port by "
        f"discovery); 0 picks a free one (default {DEFAULT_GRPC_PORT}, or a free one when "
        "--port is 0; $FERRY_NAMESRV_GRPC_PORT)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("FERRY_NAMESRV_METRICS_PORT", "9877")),
        help="Prometheus /metrics port, 0 picks a free one, -1 disables (default 9877)",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=Path(env("FERRY_NAMESRV_HOME", str(Path.home() / "ferry" / "namesrv"))),
        help="directory for kvConfig.json (default ~/ferry/namesrv; $FERRY_NAMESRV_HOME)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="expire a broker this long after its last registration or heartbeat, unless "
        "it asked for its own timeout (default 120)",
    )
    parser.add_argument(
        "--scan-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often expired brokers are removed (default 5)",
    )
    parser.add_argument(
        "--max-message-mb",
        type=int,
        default=64,
        help="largest gRPC message accepted, MiB; a registration of 100,000 topics is ~5 MiB (default 64)",
    )
    parser.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write {remoting_port, grpc_port, metrics_port, health_port, pid} as JSON here once "
        "serving (for scripts using port 0)",
    )
    parser.add_argument(
        "--admin-token",
        default=env(ENV_ADMIN_TOKEN, ""),
        metavar="TOKEN",
        help="require 'authorization: Bearer TOKEN' on state-changing RPCs (registration, "
        "heartbeats, KV writes, write-permission changes); reads stay open (default: none; "
        f"${ENV_ADMIN_TOKEN}, which keeps it out of the process list)",
    )
    parser.add_argument(
        "--broker-hosts",
        default=env("FERRY_NAMESRV_BROKER_HOSTS", ""),
        metavar="NETS",
        help="with --admin-token: the IP addresses or networks (comma-separated, e.g. "
        "10.0.0.0/8,127.0.0.1) whose RocketMQ-protocol connections may register and unregister "
        "brokers (Apache RocketMQ brokers register that way, without a token); other "
        "RocketMQ-protocol changes are refused while a token is set (default: none; "
        "$FERRY_NAMESRV_BROKER_HOSTS)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=-1,
        metavar="PORT",
        help="also serve grpc.health.v1 alone, in plaintext, on PORT, for probes that "
        "cannot speak TLS (the kubelet's); default -1: off",
    )
    parser.add_argument(
        "--tls-cert",
        default=env("FERRY_NAMESRV_TLS_CERT"),
        metavar="PEM",
        help="serve gRPC over TLS with this certificate (and --tls-key), and the "
        "RocketMQ-protocol port as --tls-server-mode says",
    )
    parser.add_argument(
        "--tls-key",
        default=env("FERRY_NAMESRV_TLS_KEY"),
        metavar="PEM",
        help="the certificate's private key",
    )
    parser.add_argument(
        "--tls-client-ca",
        default=env("FERRY_NAMESRV_TLS_CLIENT_CA"),
        metavar="PEM",
        help="require client certificates signed by this CA "
        "(mutual TLS; brokers then present theirs)",
    )
    parser.add_argument(
        "--tls-server-mode",
        choices=("disabled", "permissive", "enforcing"),
        default=env("FERRY_NAMESRV_TLS_SERVER_MODE") or "permissive",
        help="with --tls-cert, TLS on the RocketMQ-protocol port (--port) as Apache's "
        "tls.server.mode: permissive serves TLS and plaintext on the same port (the default, "
        "Apache's), enforcing TLS only, disabled plaintext only; no client certificate is asked "
        "there; $FERRY_NAMESRV_TLS_SERVER_MODE",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="DEBUG, INFO (default), WARNING or ERROR; $FERRY_LOG_LEVEL",
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    for flag, port in (("--port", args.port), ("--grpc-port", args.grpc_port)):
        if port is not None and not 0 <= port <= 65535:
            log.error("%s %d is not a port (0..65535)", flag, port)
            return 2
    if args.port and args.port == args.grpc_port:
        log.error("--port and --grpc-port are both %d: each protocol needs its own", args.port)
        return 2
    if args.heartbeat_timeout <= 0 or args.scan_interval <= 0 or args.max_message_mb <= 0:
        log.error("--heartbeat-timeout, --scan-interval and --max-message-mb must be positive")
        return 2
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        log.error("TLS needs both --tls-cert and --tls-key (and --tls-client-ca needs them too)")
        return 2
    try:
        tls = (
            ServerTLS.load(args.tls_cert, args.tls_key, args.tls_client_ca)
            if args.tls_cert
            else None
        )
    except ConfigError as exc:
        log.error("cannot start: %s", exc)
        return 2
    if args.tls_server_mode == "enforcing" and not args.tls_cert:
        log.error("--tls-server-mode enforcing serves TLS only: it needs --tls-cert and --tls-key")
        return 2
    remoting_tls = None
    if args.tls_cert and args.tls_server_mode != "disabled":
        try:
            remoting_tls = server_ssl_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            log.error("cannot start: --tls-cert/--tls-key: %s", exc)
            return 2
    auth.warn_if_placeholder(log, "the admin token", args.admin_token, "ferry-admin")
    broker_hosts = tuple(h.strip() for h in args.broker_hosts.split(",") if h.strip())
    try:
        parse_hosts(broker_hosts)
    except ValueError as exc:
        log.error("cannot start: --broker-hosts: %s", exc)
        return 2
    config = NamesrvConfig(
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        home=args.home.expanduser(),
        heartbeat_timeout_s=args.heartbeat_timeout,
        scan_interval_s=args.scan_interval,
        max_message_bytes=args.max_message_mb * 1024 * 1024,
        port_file=args.port_file,
        admin_token=args.admin_token,
        broker_hosts=broker_hosts,
        tls=tls,
        health_port=args.health_port,
        remoting_tls=remoting_tls,
        remoting_tls_mode=args.tls_server_mode,
    )

    async def main() -> None:
        app = NamesrvApp(config)
        await run_until_signalled(app.start, app.stop)

    try:
        asyncio.run(main())
    except CorruptFileError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.namesrv", description="Run a ferry name server."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
