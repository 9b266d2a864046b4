"""`ferry proxy` / `python -m services.proxy`: run the RocketMQ 5 proxy."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from pathlib import Path

from ferry.acl import load_acl
from ferry.client.namesrv import parse_addrs
from ferry.model import DEFAULT_NAMESRV_ADDR, NAMESRV_ADDR_ENV
from ferry.runtime import eventloop
from ferry.runtime.errors import ConfigError, FerryError
from ferry.runtime.logs import setup_logging
from ferry.runtime.server import run_until_signalled
from ferry.runtime.tls import ServerTLS, server_ssl_context
from services.proxy import auth
from services.proxy.app import BROKER_PROTOCOLS, DOORS, TLS_MODES, ProxyApp, ProxyConfig
from services.proxy.servicer import MIN_INVISIBLE_MS

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--host",
        default=env("FERRY_PROXY_HOST", "0.0.0.0"),
        help="address to listen on (default 0.0.0.0; $FERRY_PROXY_HOST)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("FERRY_PROXY_PORT", "8081")),
        help="gRPC port for apache.rocketmq.v2, 0 picks a free one (default 8081, "
        "RocketMQ's proxy port; $FERRY_PROXY_PORT)",
    )
    parser.add_argument(
        "-n",
        "--namesrv",
        default=None,
        metavar="ADDRS",
        help="name servers' RocketMQ-protocol addresses (their --port), 'host:port;host:port'; "
        f"each is asked for its ferry.v1 gRPC port (default ${NAMESRV_ADDR_ENV}, else "
        f"{DEFAULT_NAMESRV_ADDR})",
    )
    parser.add_argument(
        "--advertise-host",
        default=env("FERRY_PROXY_ADVERTISE_HOST", ""),
        help="the host routes point SDKs at when a client does not say which it used "
        "(default: --host, or 127.0.0.1 for 0.0.0.0)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("FERRY_PROXY_METRICS_PORT", "-1")),
        help="Prometheus /metrics port, 0 picks a free one, -1 disables (default -1)",
    )
    parser.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write {grpc_port, metrics_port, pid} as JSON here once serving",
    )
    parser.add_argument(
        "--access-key",
        default=env(auth.ENV_ACCESS_KEY, ""),
        metavar="AK",
        help="with --secret-key: every apache.rocketmq.v2 request must be signed with this "
        "access key and its secret key, as RocketMQ's proxy with ACL on (the SDKs: "
        "ClientConfiguration(endpoint, Credentials(AK, SK))); unsigned or badly signed requests "
        "get the v2 status UNAUTHORIZED; health and reflection stay open (default: none, "
        f"nothing is checked; ${auth.ENV_ACCESS_KEY})",
    )
    parser.add_argument(
        "--secret-key",
        default=env(auth.ENV_SECRET_KEY, ""),
        metavar="SK",
        help="the secret key that goes with --access-key; prefer "
        f"${auth.ENV_SECRET_KEY}, which keeps it out of the process list",
    )
    parser.add_argument(
        "--acl-file",
        type=Path,
        default=env(auth.ENV_ACL_FILE) or None,
        metavar="PATH",
        help="check every apache.rocketmq.v2 request against this plain_acl.yml (RocketMQ's "
        "ACL; the brokers' aclFile): the signature with the secret key of the request's access "
        "key, then the permissions the call needs (SendMessage: PUB on the topic; receive, ack: "
        "SUB on topic and group); a bad signature gets UNAUTHORIZED, a missing permission "
        "FORBIDDEN; re-read when it changes; instead of --access-key/--secret-key "
        f"(${auth.ENV_ACL_FILE})",
    )
    parser.add_argument(
        "--topic-message-type-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refuse a send whose type (NORMAL, FIFO, DELAY, TRANSACTION) is not its topic's "
        "message.type (ferry topic create --message-type; a topic without one is NORMAL) with "
        "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, and have the SDKs check it first, as RocketMQ's "
        "proxy with enableTopicMessageTypeCheck (default: on)",
    )
    parser.add_argument(
        "--min-invisible-time-ms",
        type=int,
        default=MIN_INVISIBLE_MS,
        metavar="MS",
        help="the least invisible time a ReceiveMessage may ask for, unless it lets the proxy "
        'renew (auto_renew); less is refused with ILLEGAL_INVISIBLE_TIME "the invisibleTime '
        "is too small\", as RocketMQ's proxy's minInvisibleTimeMillsForRecv "
        f"(default {MIN_INVISIBLE_MS})",
    )
    parser.add_argument(
        "--tls-cert",
        default=env("FERRY_PROXY_TLS_CERT"),
        metavar="PEM",
        help="serve apache.rocketmq.v2 over TLS with this certificate (and --tls-key), as "
        "--tls-server-mode says; the RocketMQ 5 Java SDK before 5.1 always dials TLS "
        "(default: none, plaintext only; $FERRY_PROXY_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key",
        default=env("FERRY_PROXY_TLS_KEY"),
        metavar="PEM",
        help="the certificate's private key ($FERRY_PROXY_TLS_KEY)",
    )
    parser.add_argument(
        "--tls-server-mode",
        choices=TLS_MODES,
        default=env("FERRY_PROXY_TLS_SERVER_MODE") or "permissive",
        help="with --tls-cert, TLS on --port as Apache's proxy's tlsMode: permissive serves "
        "TLS and plaintext on the same port, told apart by a connection's first byte (the "
        "default, Apache's), enforcing TLS only, disabled plaintext only; health and "
        "reflection are served alike ($FERRY_PROXY_TLS_SERVER_MODE)",
    )
    parser.add_argument(
        "--door",
        choices=DOORS,
        default=env("FERRY_PROXY_DOOR") or "native",
        help="what serves the SDKs' HTTP/2 and TLS: native (ferry_native's door, in Rust, on "
        "a thread of its own; the default) or grpcio (grpcio's core, ~200 us more CPU per "
        "call; a permissive TLS port then runs a relay in front) ($FERRY_PROXY_DOOR)",
    )
    parser.add_argument(
        "--broker-protocol",
        choices=BROKER_PROTOCOLS,
        default=env("FERRY_PROXY_BROKER_PROTOCOL") or "remoting",
        help="how sends, receives, acks and re-timings reach the brokers: remoting "
        "(RocketMQ's protocol on each broker's RocketMQ port, pipelined, as Apache's proxy "
        "calls them; the default) or grpc (ferry.v1, sends batched); a transaction's half "
        "always goes over ferry.v1 ($FERRY_PROXY_BROKER_PROTOCOL)",
    )
    parser.add_argument(
        "--broker-access-key",
        metavar="AK",
        default=env("FERRY_PROXY_BROKER_ACCESS_KEY") or "",
        help="with --broker-secret-key: sign the sends to brokers' RocketMQ ports with this "
        "account of their plain_acl.yml (brokers with aclEnable=true check every request; "
        "it needs PUB on the topics). Without it, a broker that refuses unsigned sends gets "
        "them over ferry.v1 ($FERRY_PROXY_BROKER_ACCESS_KEY)",
    )
    parser.add_argument(
        "--broker-secret-key",
        metavar="SK",
        default=env("FERRY_PROXY_BROKER_SECRET_KEY") or "",
        help="the secret key of --broker-access-key; prefer $FERRY_PROXY_BROKER_SECRET_KEY, "
        "which keeps it out of the process list",
    )
    eventloop.add_argument(parser)
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING or ERROR")


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        addrs = parse_addrs(args.namesrv)
    except FerryError as exc:
        log.error("bad --namesrv: %s", exc)
        return 2
    try:
        auth.check_keys(args.access_key, args.secret_key)
    except ValueError as exc:
        log.error("bad --access-key/--secret-key: %s", exc)
        return 2
    if bool(args.broker_access_key) != bool(args.broker_secret_key):
        log.error("--broker-access-key and --broker-secret-key go together: give both or neither")
        return 2
    if args.min_invisible_time_ms < 0:
        log.error("bad --min-invisible-time-ms: %d is negative", args.min_invisible_time_ms)
        return 2
    if (problem := eventloop.check(args.event_loop)) is not None:
        log.error("%s", problem)
        return 2
    if bool(args.tls_cert) != bool(args.tls_key):
        log.error("TLS needs both --tls-cert and --tls-key")
        return 2
    if args.tls_server_mode == "enforcing" and not args.tls_cert:
        log.error("--tls-server-mode enforcing serves TLS only: it needs --tls-cert and --tls-key")
        return 2
    tls = None
    if args.tls_cert:
        try:
            tls = ServerTLS.load(args.tls_cert, args.tls_key)
            server_ssl_context(args.tls_cert, args.tls_key)  # the key must match the certificate
        except ConfigError as exc:
            log.error("cannot start: %s", exc)
            return 2
        except (OSError, ssl.SSLError) as exc:
            log.error("cannot start: --tls-cert/--tls-key: %s", exc)
            return 2
        if args.tls_server_mode == "disabled":
            log.info("--tls-server-mode disabled: plaintext only, --tls-cert is not used")
    if args.acl_file is not None:
        if args.access_key:
            log.error("give either --acl-file or --access-key/--secret-key, not both")
            return 2
        try:
            accounts = len(load_acl(args.acl_file).accounts)
        except ValueError as exc:
            log.error("bad --acl-file: %s", exc)
            return 2
        log.info("requests are checked against %s (%d accounts; re-read when it changes)",
                 args.acl_file, accounts)  # fmt: skip
    elif args.access_key:
        log.info("requests must be signed with access key %s", args.access_key)
    else:
        log.info("no --access-key/--secret-key or --acl-file: requests are not checked")
    config = ProxyConfig(
        namesrv_addrs=tuple(addrs),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        advertise_host=args.advertise_host,
        port_file=args.port_file,
        access_key=args.access_key,
        secret_key=args.secret_key,
        acl_file=args.acl_file,
        topic_message_type_check=args.topic_message_type_check,
        min_invisible_ms=args.min_invisible_time_ms,
        tls=tls,
        tls_mode=args.tls_server_mode,
        door=args.door,
        broker_protocol=args.broker_protocol,
        broker_access_key=args.broker_access_key,
        broker_secret_key=args.broker_secret_key,
    )

    async def main() -> None:
        app = ProxyApp(config)
        await run_until_signalled(app.start, app.stop)

    try:
        eventloop.run(main, args.event_loop)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.proxy",
        description="Run ferry's RocketMQ 5 proxy: apache.rocketmq.v2.MessagingService for the "
        "official RocketMQ SDKs, backed by the brokers the name servers know.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
