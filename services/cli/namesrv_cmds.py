"""`ferry route`, `ferry cluster`, `ferry kv`: ask any name server."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time

import grpc

from ferry.client.namesrv import NamesrvClient, parse_addrs
from ferry.model import DEFAULT_NAMESRV_ADDR, NAMESRV_ADDR_ENV, perm_to_string
from ferry.runtime import auth
from ferry.v1 import namesrv_pb2
from services.cli.output import message_json, table

# Commands that talk to one broker take its ferry.v1 gRPC address (what
# `ferry cluster` lists), not its RocketMQ-protocol listenPort.
BROKER_HELP = "the broker's ferry.v1 gRPC address (its grpcListenPort, 10915 by default)"


def add_namesrv_option(parser: argparse.ArgumentParser, json_output: bool = True) -> None:
    parser.add_argument(
        "-n",
        "--namesrv",
        default=None,
        metavar="'HOST:PORT;HOST:PORT'",
        help="name servers to ask, in order: their RocketMQ-protocol addresses (--port, what "
        "RocketMQ's namesrvAddr names), each asked for its ferry.v1 gRPC port "
        f"(default ${NAMESRV_ADDR_ENV}, else {DEFAULT_NAMESRV_ADDR})",
    )
    parser.add_argument(
        "--timeout", type=float, default=3.0, metavar="SECONDS", help="per name server (default 3)"
    )
    add_tls_options(parser)
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        default=None,
        help="connect with TLS, verifying servers with this CA ($FERRY_TLS_CA)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        default=None,
        help="client certificate, for servers that require one ($FERRY_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key",
        metavar="PEM",
        default=None,
        help="the client certificate's key ($FERRY_TLS_KEY)",
    )


def add_admin_token_option(parser: argparse.ArgumentParser) -> None:
    """--admin-token, --access-key and --secret-key: one `auth.AdminCredentials` in
    `args.admin_token` (None when none is given: the environment's)."""
    parser.add_argument(
        "--admin-token",
        action=auth.CredentialAction,
        part="token",
        default=None,
        metavar="TOKEN",
        help="the servers' admin token, for commands that change state (default "
        f"${auth.ENV_ADMIN_TOKEN}, which keeps it out of the process list)",
    )
    parser.add_argument(
        "--access-key",
        action=auth.CredentialAction,
        part="access_key",
        dest="admin_token",
        metavar="AK",
        help="with --secret-key: sign commands that change state as the RocketMQ 5 SDKs sign, "
        "for a broker with aclEnable=true (an account with admin: true in its plain_acl.yml); "
        f"used instead of the admin token (default ${auth.ENV_ACCESS_KEY})",
    )
    parser.add_argument(
        "--secret-key",
        action=auth.CredentialAction,
        part="secret_key",
        dest="admin_token",
        metavar="SK",
        help=f"the secret key of --access-key (default ${auth.ENV_SECRET_KEY}, which keeps it "
        "out of the process list)",
    )


def client(args: argparse.Namespace) -> NamesrvClient:
    return NamesrvClient(
        parse_addrs(args.namesrv),
        timeout_s=args.timeout,
        admin_token=getattr(args, "admin_token", None),
        discover=True,
    )


def route(args: argparse.Namespace) -> int:
    with client(args) as c:
        data = c.route(args.topic)
    if args.json:
        print(message_json(data))
        return 0
    print(f"topic {args.topic}")
    print(
        table(
            ["BROKER", "READ QUEUES", "WRITE QUEUES", "PERM"],
            [
                [
                    q.broker_name,
                    q.read_queue_nums,
                    q.write_queue_nums,
                    f"{q.perm} ({perm_to_string(q.perm)})",
                ]
                for q in sorted(data.queue_datas, key=lambda q: q.broker_name)
            ],
        )
    )
    print()
    print(
        table(
            ["CLUSTER", "BROKER", "ID", "ADDRESS"],
            [
                [b.cluster, b.broker_name, i, b.broker_addrs[i]]
                for b in sorted(data.broker_datas, key=lambda b: b.broker_name)
                for i in sorted(b.broker_addrs)
            ],
        )
    )
    return 0


def _age(ms: int) -> str:
    if not ms:
        return "-"
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{when} ({max(0.0, time.time() - ms / 1000):.0f}s ago)"


def cluster(args: argparse.Namespace) -> int:
    with client(args) as c:
        info = c.cluster_info()
    if args.json:
        print(message_json(info))
        return 0
    rows = []
    for cluster_name in sorted(info.cluster_addr_table):
        for name in info.cluster_addr_table[cluster_name].broker_names:
            group = info.broker_addr_table.get(name)
            if group is None:
                continue
            for broker_id in sorted(group.broker_addrs):
                addr = group.broker_addrs[broker_id]
                live = info.broker_live_table.get(addr)
                role = (
                    live.broker_role
                    if live and live.broker_role
                    else ("MASTER" if broker_id == 0 else "SLAVE")
                )
                rows.append(
                    [
                        cluster_name,
                        name,
                        broker_id,
                        addr,
                        role,
                        _age(live.last_update_timestamp if live else 0),
                    ]
                )
    if not rows:
        print("no brokers registered")
        return 0
    print(table(["CLUSTER", "BROKER", "ID", "ADDRESS", "ROLE", "LAST HEARTBEAT"], rows))
    return 0


def kv(args: argparse.Namespace) -> int:
    with client(args) as c:
        if args.kv_action == "get":
            value = c.call(
                "GetKVConfig",
                namesrv_pb2.GetKVConfigRequest(namespace=args.namespace, key=args.key),
            ).value
            print(json.dumps({"value": value}) if args.json else value)
        elif args.kv_action in ("put", "delete"):
            return _kv_write_all(c, args)
        else:
            items = dict(
                c.call(
                    "GetKVListByNamespace",
                    namesrv_pb2.GetKVListByNamespaceRequest(namespace=args.namespace),
                ).table
            )
            print(
                json.dumps(items, indent=2, sort_keys=True)
                if args.json
                else table(["KEY", "VALUE"], sorted(items.items()))
            )
    return 0


def _kv_write_all(c: NamesrvClient, args: argparse.Namespace) -> int:
    """Writes go to every name server: they do not share state."""
    if args.kv_action == "put":
        results = c.call_each(
            "PutKVConfig",
            namesrv_pb2.PutKVConfigRequest(
                namespace=args.namespace, key=args.key, value=args.value
            ),
        )
    else:
        results = c.call_each(
            "DeleteKVConfig",
            namesrv_pb2.DeleteKVConfigRequest(namespace=args.namespace, key=args.key),
        )
    failed = {a: _failure(r) for a, r in results.items() if isinstance(r, Exception)}
    if args.json:
        print(
            json.dumps(
                {
                    a: (
                        {"error": failed[a]}
                        if a in failed
                        else (
                            {"deleted": r.deleted} if args.kv_action == "delete" else {"ok": True}
                        )
                    )
                    for a, r in results.items()
                },
                indent=2,
            )
        )
    else:
        for addr, r in results.items():
            if addr in failed:
                print(f"{addr}: FAILED {failed[addr]}")
            elif args.kv_action == "put":
                print(f"{addr}: put {args.namespace}/{args.key}")
            else:
                print(
                    f"{addr}: "
                    + ("deleted" if r.deleted else "did not exist")
                    + f" {args.namespace}/{args.key}"
                )
    return 1 if failed else 0


def _failure(error: Exception) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error)  # its gRPC port could not be found


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "route",
        help="print a topic's route",
        description="Print which broker groups carry TOPIC, "
        "with their queues and addresses (GetRouteInfoByTopic).",
    )
    p.add_argument("topic")
    add_namesrv_option(p)
    p.set_defaults(func=route)

    p = sub.add_parser(
        "cluster",
        help="list clusters, broker groups and brokers",
        description="List every broker the name server knows, like mqadmin clusterList.",
    )
    add_namesrv_option(p)
    p.set_defaults(func=cluster)

    p = sub.add_parser(
        "kv",
        help="read and write the name servers' KV config",
        description="Namespaced key/value config kept by the name server (kvConfig.json). "
        "Reads ask the first name server that answers; put and delete go to every one.",
    )
    kv_sub = p.add_subparsers(dest="kv_action", required=True)
    for action, extra in (
        ("get", ["key"]),
        ("put", ["key", "value"]),
        ("delete", ["key"]),
        ("list", []),
    ):
        q = kv_sub.add_parser(action, help=f"{action} {'a key' if extra else 'a namespace'}")
        q.add_argument("namespace")
        for name in extra:
            q.add_argument(name)
        add_namesrv_option(q)
        if action in ("put", "delete"):
            add_admin_token_option(q)
        q.set_defaults(func=kv)
