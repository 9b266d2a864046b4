"""`ferry ha-status` and `ferry failover`: automatic failover as an operator
sees it, read from (and requested through) etcd, where the groups elect
their masters (services.broker.failover.node).

- `ferry ha-status [-c CLUSTER] [-g BROKER_NAME]` (without `-b HOST:PORT`): per group, the epoch, the
  leader (id, address, whether it is ready), the published in-sync set and
  every live member with its log end.
- `ferry failover -c CLUSTER -b BROKER [--to ID]`: a graceful handover. The
  master stops taking sends, waits until the chosen in-sync member (or the
  one furthest ahead) has everything, and gives up its lease; that member is
  elected with the next epoch. Waits for the new master and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from ferry.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from services.cli.output import table

ENV_ETCD = "FERRY_ETCD_ENDPOINTS"

_FAILOVER_HELP = """\
Hand a broker group's master role over to an in-sync member, gracefully:

  1. the master stops taking sends (producers are told UNAVAILABLE and retry);
  2. it waits until the new master has every message it stored;
  3. it gives up its etcd lease; only the chosen member campaigns, and wins
     with the next epoch; the old master follows it as a slave.

No acknowledged message is lost and none is answered twice; sends are refused
for a few seconds. The target must be in the group's in-sync set (see
`ferry ha-status`). Exit status 0 once the new master is ready.

example:
  ferry failover -c DefaultCluster -b broker-a --to 2 --etcd 127.0.0.1:2379
"""


def add_status_options(p: argparse.ArgumentParser) -> None:
    """`ferry ha-status` without --broker: the failover groups in etcd."""
    p.add_argument("-c", "--cluster", default="", help="failover view: only this cluster")
    p.add_argument(
        "-g", "--group", default="", metavar="NAME", help="failover view: only this brokerName"
    )
    _add_etcd(p)


def _add_etcd(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--etcd",
        default=os.environ.get(ENV_ETCD, "127.0.0.1:2379"),
        metavar="HOST:PORT[;HOST:PORT]",
        help=f"etcd endpoints (default ${ENV_ETCD} or 127.0.0.1:2379; make run's)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for etcd (default 5)",
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "failover",
        help="hand a group's master role over to an in-sync member (gracefully)",
        description=_FAILOVER_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-c", "--cluster", required=True, help="the cluster (brokerClusterName)")
    p.add_argument("-b", "--broker", required=True, help="the broker group (brokerName)")
    p.add_argument(
        "--to", type=int, default=None, metavar="ID", help="the member to hand over to (brokerId)"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the new master (default 30)",
    )
    _add_etcd(p)
    p.set_defaults(func=failover)


def _endpoints(text: str) -> tuple[str, ...]:
    from ferry.model import check_addr

    endpoints = tuple(e.strip() for e in text.split(";") if e.strip())
    if not endpoints:
        raise InvalidArgument("--etcd", "no etcd endpoint given")
    for e in endpoints:
        check_addr(e, "--etcd")
    return endpoints


def group_status(args: argparse.Namespace) -> int:
    from services.broker.failover.etcd import Etcd, EtcdUnavailable

    async def run() -> dict:
        etcd = Etcd(_endpoints(args.etcd), args.timeout)
        try:
            return await etcd.read_groups(args.cluster, args.group)
        except EtcdUnavailable as exc:
            raise Unavailable(str(exc)) from None
        finally:
            await etcd.close()

    groups = asyncio.run(run())
    if not groups:
        raise NotFound(
            f"no failover group in etcd {args.etcd}"
            + (f" for cluster {args.cluster!r}" if args.cluster else "")
            + (f" and group {args.group!r}" if args.group else "")
            + " (are the brokers running with enableFailover=true and these etcdEndpoints?)"
        )
    if args.json:
        out = []
        for (cluster, broker), s in groups.items():
            out.append({
                "cluster": cluster, "broker": broker, "epoch": s.epoch,
                "leader": s.leader, "in_sync": s.isr_members,
                "members": [s.members[k] for k in sorted(s.members)],
            })  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for (cluster, broker), s in groups.items():
        leader = s.leader or {}
        lead = (
            f"{leader.get('id')} {leader.get('addr')}"
            + ("" if leader.get("ready") else " (starting)")
            if leader
            else "none (election pending)"
        )
        rows.append([
            cluster, broker, s.epoch, lead,
            ",".join(map(str, s.isr_members)) or "-",
            " ".join(
                f"{m['id']}:{m.get('role', '?')}@{m.get('max_offset', '?')}"
                for _, m in sorted(s.members.items())
            ) or "-",
        ])  # fmt: skip
    print(
        table(
            ["CLUSTER", "BROKER", "EPOCH", "MASTER", "IN-SYNC", "MEMBERS (id:role@log end)"], rows
        )
    )
    return 0


def failover(args: argparse.Namespace) -> int:
    from services.broker.failover.etcd import Etcd, EtcdUnavailable, dumps, group_prefix

    prefix = group_prefix(args.cluster, args.broker)

    async def run() -> int:
        etcd = Etcd(_endpoints(args.etcd), args.timeout)
        try:
            state = await etcd.read_group(prefix)
            leader = state.leader
            if leader is None or not leader.get("ready"):
                raise FailedPrecondition(
                    f"{args.cluster}/{args.broker} has no ready master in etcd {args.etcd} "
                    "(an election may be under way; see `ferry ha-status`)"
                )
            if args.to is not None:
                if args.to == leader.get("id"):
                    raise InvalidArgument("--to", f"member {args.to} is already the master")
                if args.to not in state.isr_members:
                    raise FailedPrecondition(
                        f"member {args.to} is not in the in-sync set {state.isr_members} of "
                        f"{args.broker}: it may lack acknowledged messages; wait until it "
                        "catches up (`ferry ha-status`)"
                    )
            request = {"epoch": state.epoch, "from": leader.get("id"), "to": args.to}
            started = time.monotonic()
            await etcd.call(lambda c: c.put(f"{prefix}handover".encode(), dumps(request)))
            print(
                f"asked master {leader.get('id')} (epoch {state.epoch}) of {args.broker} to hand "
                f"over to {args.to if args.to is not None else 'the most up-to-date in-sync member'}",
                file=sys.stderr,
            )
            while time.monotonic() - started < args.wait:
                await asyncio.sleep(0.1)
                now = await etcd.read_group(prefix)
                refused = (now.handover or {}).get("refused")
                if refused:
                    raise FailedPrecondition(f"the master refused the handover: {refused}")
                new = now.leader
                if new and new.get("ready") and now.epoch > state.epoch:
                    print(
                        f"{args.broker}: member {new.get('id')} at {new.get('addr')} is master, "
                        f"epoch {now.epoch} ({time.monotonic() - started:.1f} s)"
                    )
                    return 0
            raise Unavailable(
                f"no new master of {args.broker} within {args.wait:g} s; see `ferry ha-status`"
            )
        except EtcdUnavailable as exc:
            raise Unavailable(str(exc)) from None
        finally:
            await etcd.close()

    return asyncio.run(run())
