"""`ferry topic status`, `ferry group progress` and `ferry broker status`: the
statistics operators read with mqadmin's topicStatus, consumerProgress and
brokerStatus, printed in the same columns, from the same answers.

They speak RocketMQ's protocol, as mqadmin does: routes from the name server
(105, 206), then each broker's statistics codes (202 topic stats, 208 consume
stats, 203 consumer connections, 28 runtime info). So they read a ferry
cluster, an Apache RocketMQ cluster, or a mixed one alike. With an access key
(--access-key/--secret-key, or $FERRY_ACCESS_KEY/$FERRY_SECRET_KEY) every
request is signed as RocketMQ's Java client signs it (RocketMQ's ACL).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ferry import acl
from ferry.model import DEFAULT_NAMESRV_ADDR, NAMESRV_ADDR_ENV, RETRY_TOPIC_PREFIX
from ferry.remoting import codes
from ferry.remoting.bodies import BodyError, loads, loads_object_keyed
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.runtime.auth import ENV_ACCESS_KEY, ENV_SECRET_KEY
from ferry.runtime.errors import FerryError, NotFound, PermissionDenied

MASTER = "0"


class Unreachable(FerryError):
    """No name server or broker answered."""


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n",
        "--namesrv",
        default=None,
        metavar="'HOST:PORT;HOST:PORT'",
        help="name servers' RocketMQ-protocol addresses, asked in order "
        f"(default ${NAMESRV_ADDR_ENV}, else {DEFAULT_NAMESRV_ADDR})",
    )
    p.add_argument(
        "--timeout", type=float, default=5.0, metavar="SECONDS", help="per request (default 5)"
    )
    p.add_argument(
        "--access-key",
        default=None,
        help=f"sign requests with this ACL access key (default ${ENV_ACCESS_KEY})",
    )
    p.add_argument(
        "--secret-key",
        default=None,
        help=f"the access key's secret (default ${ENV_SECRET_KEY})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of mqadmin's table")


def add_topic_commands(topic_sub: argparse._SubParsersAction) -> None:
    """`ferry topic status`."""
    p = topic_sub.add_parser(
        "status",
        help="each queue's min and max offset and last update (mqadmin topicStatus)",
        description="Ask every broker group serving TOPIC (its master) for the topic's queues: "
        "min offset, max offset and when the last message was stored, in mqadmin topicStatus's "
        "columns.",
    )
    p.add_argument("topic", nargs="?", help="topic (or -t)")
    p.add_argument("-t", dest="topic_opt", metavar="TOPIC", help="topic, as mqadmin takes it")
    add_common(p)
    p.set_defaults(func=topic_status)


def add_group_commands(group_sub: argparse._SubParsersAction) -> None:
    """`ferry group progress`."""
    p = group_sub.add_parser(
        "progress",
        help="a group's offsets and lag per queue, or every group's summary "
        "(mqadmin consumerProgress)",
        description="With -g: every queue the group consumes on every broker of its retry "
        "topic's route: broker offset, consumer offset, diff (lag) and the store time of the "
        "last message consumed; then the group's consume TPS and total diff. Without -g: one "
        "line per group (each %%RETRY%% topic the name server knows): connected clients, their "
        "lowest version, type, model, TPS and total diff. mqadmin consumerProgress's columns.",
    )
    p.add_argument("-g", "--group", default="", help="consumer group (default: every group)")
    add_common(p)
    p.set_defaults(func=group_progress)


def add_broker_commands(sub: argparse._SubParsersAction) -> None:
    """`ferry broker-status`, which `ferry broker status` runs (`ferry broker`
    itself runs a broker)."""
    p = sub.add_parser(
        "broker-status",
        prog="ferry broker status",
        help="a broker's runtime statistics (also `ferry broker status`; mqadmin brokerStatus)",
        description="A broker's runtime key/value table (GET_BROKER_RUNTIME_INFO), sorted by "
        "key, as mqadmin brokerStatus prints it: -b one broker, -c every broker of a cluster.",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "-b",
        "--broker",
        metavar="HOST:PORT",
        help="the broker's RocketMQ-protocol address (its listenPort)",
    )
    target.add_argument("-c", "--cluster", help="every broker of this cluster")
    add_common(p)
    p.set_defaults(func=broker_status)


# ---------------------------------------------------------------- requests


class Remote:
    def __init__(self, args: argparse.Namespace) -> None:
        text = args.namesrv or os.environ.get(NAMESRV_ADDR_ENV) or DEFAULT_NAMESRV_ADDR
        self.namesrvs = [a.strip() for a in text.split(";") if a.strip()]
        self.timeout = args.timeout
        self.access_key = args.access_key or os.environ.get(ENV_ACCESS_KEY, "")
        secret = (
            args.secret_key if args.secret_key is not None else os.environ.get(ENV_SECRET_KEY, "")
        )
        if self.access_key and not secret:
            raise PermissionDenied(
                f"--access-key {self.access_key} needs its --secret-key (or ${ENV_SECRET_KEY})"
            )
        self._secret = secret

    def ask(self, addr: str, code: int, ext: dict[str, str] | None = None) -> Command:
        fields = dict(ext or {})
        if self.access_key:
            fields["AccessKey"] = self.access_key
            fields["Signature"] = acl.sign(self._secret, fields, b"")
        try:
            return call(addr, Command(code, ext=fields), self.timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise Unreachable(f"{addr} did not answer request {code}: {exc}") from None

    def namesrv(self, code: int, ext: dict[str, str] | None = None) -> Command:
        """The first name server's answer (the next one when one does not answer)."""
        failures = []
        for addr in self.namesrvs:
            try:
                return self.ask(addr, code, ext)
            except Unreachable as exc:
                failures.append(str(exc))
        raise Unreachable("no name server answered: " + "; ".join(failures))

    def route(self, topic: str) -> dict[str, Any]:
        answer = self.namesrv(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if answer.code == codes.TOPIC_NOT_EXIST:
            raise NotFound(f"no route for topic {topic!r}: the name servers do not know it")
        return answer_body(answer, f"route of {topic}")

    def masters(self, topic: str) -> list[tuple[str, str]]:
        """(broker name, master address) of each group serving the topic."""
        route = self.route(topic)
        out = []
        for broker in sorted(route.get("brokerDatas", []), key=lambda b: b["brokerName"]):
            addr = broker.get("brokerAddrs", {}).get(MASTER)
            if addr:
                out.append((broker["brokerName"], addr))
        return out


def answer_body(answer: Command, what: str) -> Any:
    if answer.code == codes.NO_PERMISSION:
        raise PermissionDenied(f"{what}: {answer.remark}")
    if answer.code != codes.SUCCESS:
        raise FerryError(f"{what}: code {answer.code}: {answer.remark}")
    try:
        return loads(answer.body) if answer.body else {}
    except BodyError as exc:
        raise FerryError(f"{what}: unreadable answer: {exc}") from None


def offset_table(answer: Command, what: str) -> tuple[dict[str, Any], list[tuple[dict, Any]]]:
    """A 202/208 answer: (its other fields, the offsetTable's (queue, value) pairs)."""
    if answer.code == codes.NO_PERMISSION:
        raise PermissionDenied(f"{what}: {answer.remark}")
    if answer.code != codes.SUCCESS:
        raise FerryError(f"{what}: code {answer.code}: {answer.remark}")
    text = bytes(answer.body).decode(errors="replace")
    head, sep, _ = text.partition('"offsetTable":')
    if not sep:
        raise FerryError(f"{what}: no offsetTable in the answer")
    try:
        pairs, end = loads_object_keyed(text, len(head) + len(sep))
        rest = loads((head.rstrip(",") + text[end:]).encode()) if head.strip("{ ,") else {}
    except BodyError as exc:
        raise FerryError(f"{what}: unreadable answer: {exc}") from None
    return rest, pairs


def _mq_order(pair: tuple[dict, Any]) -> tuple[str, str, int]:
    """RocketMQ's MessageQueue order: topic, broker name, queue id."""
    q = pair[0]
    return (q.get("topic", ""), q.get("brokerName", ""), int(q.get("queueId", 0)))


def human_time(ms: int) -> str:
    """UtilAll.timeMillisToHumanString2: local time, 2026-11-26 22:48:16,596."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f",{ms % 1000:03d}"


def _time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def version_desc(ordinal: int) -> str:
    """RocketMQ's MQVersion name of a client's version ordinal (V4_9_8 = 409):
    from V4_0_0_SNAPSHOT (212) to V5_9_9 (611) the names go by twos, a
    snapshot then its release."""
    if 212 <= ordinal <= 611:
        n, release = divmod(ordinal - 212, 2)
        name = f"V{4 + n // 100}_{n // 10 % 10}_{n % 10}"
        return name if release else name + "_SNAPSHOT"
    return "HIGHER_VERSION" if ordinal > 611 else f"V3({ordinal})"


def _emit(args: argparse.Namespace, doc: Any, lines: Sequence[str]) -> int:
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


# ---------------------------------------------------------------- commands


def topic_status(args: argparse.Namespace) -> int:
    topic = args.topic_opt or args.topic
    if not topic:
        print("ferry topic status: a topic is required (TOPIC or -t TOPIC)", file=sys.stderr)
        return 2
    remote = Remote(args)
    pairs: list[tuple[dict, Any]] = []
    for name, addr in remote.masters(topic):
        answer = remote.ask(addr, codes.GET_TOPIC_STATS_INFO, {"topic": topic})
        pairs += offset_table(answer, f"topic stats of {topic} on {name} ({addr})")[1]
    pairs.sort(key=_mq_order)
    lines = [
        f"{'#Broker Name':<32}  {'#QID':<4}  {'#Min Offset':<20}  {'#Max Offset':<20}    #Last Updated"
    ]
    doc = []
    for q, v in pairs:
        last = int(v.get("lastUpdateTimestamp", 0))
        shown = human_time(last) if last > 0 else ""
        lines.append(
            f"{q['brokerName']:<32}  {q['queueId']:<4}  {v.get('minOffset', 0):<20}  "
            f"{v.get('maxOffset', 0):<20}    {shown}"
        )
        doc.append({"brokerName": q["brokerName"], "queueId": q["queueId"],
                    "minOffset": v.get("minOffset", 0), "maxOffset": v.get("maxOffset", 0),
                    "lastUpdateTimestamp": last})  # fmt: skip
    return _emit(args, doc, lines)


def _consume_stats(remote: Remote, group: str) -> tuple[float, list[tuple[dict, dict]]]:
    tps = 0.0
    pairs: list[tuple[dict, dict]] = []
    for name, addr in remote.masters(RETRY_TOPIC_PREFIX + group):
        answer = remote.ask(addr, codes.GET_CONSUME_STATS, {"consumerGroup": group})
        rest, found = offset_table(answer, f"consume stats of {group} on {name} ({addr})")
        tps += float(rest.get("consumeTps", 0.0))
        pairs += found
    pairs.sort(key=_mq_order)
    return tps, pairs


def group_progress(args: argparse.Namespace) -> int:
    remote = Remote(args)
    if args.group:
        tps, pairs = _consume_stats(remote, args.group)
        lines = [
            f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  "
            f"{'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime"
        ]
        total = 0
        doc_queues = []
        for q, v in pairs:
            broker, consumer = int(v.get("brokerOffset", 0)), int(v.get("consumerOffset", 0))
            diff = broker - consumer
            total += diff
            last = int(v.get("lastTimestamp", 0))
            lines.append(
                f"{q['topic']:<64}  {q['brokerName']:<32}  {q['queueId']:<4}  {broker:<20}  "
                f"{consumer:<20}  {diff:<20}  {_time(last) if last else 'N/A'}"
            )
            doc_queues.append({**q, "brokerOffset": broker, "consumerOffset": consumer,
                               "diff": diff, "lastTimestamp": last})  # fmt: skip
        lines += ["", f"Consume TPS: {tps:.2f}", f"Diff Total: {total}"]
        doc = {"group": args.group, "consumeTps": tps, "diffTotal": total, "queues": doc_queues}
        return _emit(args, doc, lines)
    lines = [
        f"{'#Group':<64}  {'#Count':<6}  {'#Version':<24} {'#Type':<5}  {'#Model':<14}  "
        f"{'#TPS':<7}  #Diff Total"
    ]
    topics = answer_body(remote.namesrv(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list")
    doc = []
    for topic in topics.get("topicList", []):
        if not topic.startswith(RETRY_TOPIC_PREFIX):
            continue
        group = topic[len(RETRY_TOPIC_PREFIX) :]
        try:
            tps, pairs = _consume_stats(remote, group)
        except FerryError:
            tps, pairs = 0.0, []
        diff = sum(
            int(v.get("brokerOffset", 0)) - int(v.get("consumerOffset", 0)) for _, v in pairs
        )
        connection = _connections(remote, group)
        members = connection.get("connectionSet", [])
        count = len(members)
        version = version_desc(min(m.get("version", 0) for m in members)) if members else "OFFLINE"
        kind = {"CONSUME_PASSIVELY": "PUSH", "CONSUME_ACTIVELY": "PULL"}.get(
            connection.get("consumeType", ""), ""
        )
        model = connection.get("messageModel", "") if members else ""
        lines.append(
            f"{group:<64}  {count:<6}  {version:<24} {kind:<5}  {model:<14}  {int(tps):<7}  {diff}"
        )
        doc.append({"group": group, "count": count, "version": version, "type": kind,
                    "model": model, "consumeTps": tps, "diffTotal": diff})  # fmt: skip
    return _emit(args, doc, lines)


def _connections(remote: Remote, group: str) -> dict[str, Any]:
    """The group's consumer connections as one broker of its retry topic sees them
    ({} when none is online)."""
    try:
        masters = remote.masters(RETRY_TOPIC_PREFIX + group)
    except FerryError:
        return {}
    for _, addr in masters:
        answer = remote.ask(addr, codes.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        if answer.code == codes.SUCCESS:
            return answer_body(answer, f"connections of {group}")
    return {}


def broker_status(args: argparse.Namespace) -> int:
    remote = Remote(args)
    if args.broker:
        addrs = [args.broker]
    else:
        info = answer_body(remote.namesrv(codes.GET_BROKER_CLUSTER_INFO), "cluster info")
        names = info.get("clusterAddrTable", {}).get(args.cluster)
        if not names:
            raise NotFound(f"cluster {args.cluster!r} is not known to the name servers")
        addrs = [
            addr
            for name in sorted(names)
            for _, addr in sorted(
                info["brokerAddrTable"][name]["brokerAddrs"].items(), key=lambda kv: int(kv[0])
            )
        ]
    lines: list[str] = []
    doc: dict[str, Any] = {}
    for addr in addrs:
        table = answer_body(
            remote.ask(addr, codes.GET_BROKER_RUNTIME_INFO), f"runtime info of {addr}"
        )
        entries = sorted(table.get("table", {}).items())
        doc[addr] = dict(entries)
        for key, value in entries:
            lines.append(
                f"{addr:<24} {key:<32}: {value}" if args.cluster else f"{key:<32}: {value}"
            )
    return _emit(args, doc if args.cluster else doc[addrs[0]], lines)
