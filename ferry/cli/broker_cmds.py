"""`ferry topic`, `ferry send`, `ferry consume`, `ferry runtime`: producers,
consumers and administration against running brokers (`ferry store` is in
store_cmds.py)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from ferry.cli.namesrv_cmds import add_admin_token_option, add_namesrv_option
from ferry.cli.namesrv_cmds import client as namesrv_client
from ferry.cli.output import message_json, table
from ferry.client.broker import BrokerClient, Consumer, NoRoute, Producer
from ferry.model import check_addr, check_topic
from ferry.runtime.errors import InvalidArgument, NotFound
from ferry.v1 import broker_pb2, common_pb2

_SEND_STATUS = {v: k for k, v in broker_pb2.SendStatus.items()}


def add_commands(sub: argparse._SubParsersAction) -> None:
    topic = sub.add_parser(
        "topic",
        help="create, update, delete or list topics",
        description="Manage topics. create/update/delete go to brokers (-b one broker, -c every "
        "master of a cluster, found through the name server); list asks the name server.",
    )
    tsub = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action in ("create", "update"):
        p = tsub.add_parser(action, help=f"{action} a topic on brokers")
        p.add_argument("topic")
        _target_options(p)
        p.add_argument("--read-queues", type=int, default=8, help="read queues (default 8)")
        p.add_argument("--write-queues", type=int, default=8, help="write queues (default 8)")
        p.add_argument(
            "--perm", type=int, default=6, help="6 read-write, 4 read-only, 2 write-only"
        )
        p.add_argument("--order", action="store_true", help="mark the topic as ordered")
        p.set_defaults(func=topic_update)
    p = tsub.add_parser("delete", help="delete a topic from brokers")
    p.add_argument("topic")
    _target_options(p)
    p.set_defaults(func=topic_delete)
    p = tsub.add_parser("list", help="list the topics the name server routes")
    add_namesrv_option(p)
    p.set_defaults(func=topic_list)

    p = sub.add_parser(
        "send",
        help="send messages to a topic",
        description="Send one message (--body or --file) or --count generated messages of --size "
        "bytes, one per RPC or --batch per RPC. Progress goes to stderr, a summary to stdout.",
    )
    p.add_argument("topic")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--body", help="message body text")
    source.add_argument("--file", type=Path, help="message body from a file")
    p.add_argument("--count", type=int, default=1, help="messages to send (default 1)")
    p.add_argument("--size", type=int, default=128, help="generated body size, bytes (default 128)")
    p.add_argument("--batch", type=int, default=1, help="messages per SendMessages RPC (default 1)")
    p.add_argument("--tags", default="", help="message tags")
    p.add_argument("--keys", default="", help="message keys (space-separated)")
    p.add_argument(
        "--delay-level", type=int, default=0, help="RocketMQ delay level 1..18 (1s ... 2h)"
    )
    add_namesrv_option(p)
    p.set_defaults(func=send)

    p = sub.add_parser(
        "consume",
        help="consume messages of a topic as a consumer group",
        description="Pull every queue of the topic as GROUP, print each message and commit the "
        "offsets. Without --max it runs until Ctrl-C (or --idle-exit-s of silence).",
    )
    p.add_argument("topic")
    p.add_argument("--group", "-g", required=True, help="consumer group")
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="a group with no committed offset starts at the oldest message (default: the newest)",
    )
    p.add_argument("--max", type=int, default=0, help="stop after this many messages")
    p.add_argument(
        "--wait-ms", type=int, default=1000, help="long-poll wait per round (default 1000)"
    )
    p.add_argument(
        "--idle-exit-s",
        type=float,
        default=0,
        help="stop after this long with no message (0: never)",
    )
    p.add_argument("--tags", default="", help="tag expression, e.g. 'a || b'")
    add_namesrv_option(p)
    p.set_defaults(func=consume)

    p = sub.add_parser(
        "ha-status",
        help="a broker's replication status",
        description="On a master: one row per slave connection (replica, address, ack offset, "
        "lag, in sync, transfer rate). On a slave: its master and how far it has read.",
    )
    p.add_argument("-b", "--broker", required=True, metavar="HOST:PORT", help="the broker")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=ha_status)

    p = sub.add_parser(
        "runtime",
        help="a broker's runtime figures",
        description="A broker's offsets, rates and role, then its disk use and retention "
        "settings (fileReservedTime, deleteWhen, the disk ratios) and what retention deleted.",
    )
    p.add_argument("-b", "--broker", required=True, metavar="HOST:PORT", help="the broker")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=runtime)


def _target_options(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("-b", "--broker", metavar="HOST:PORT", help="one broker")
    target.add_argument("-c", "--cluster", help="every master of this cluster")
    add_namesrv_option(p)
    add_admin_token_option(p)


def _targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(name, addr) of the brokers an admin command goes to."""
    if args.broker:
        check_addr(args.broker, "--broker")
        return [(args.broker, args.broker)]
    with namesrv_client(args) as ns:
        info = ns.cluster_info()
    names = []
    if args.cluster in info.cluster_addr_table:
        names = list(info.cluster_addr_table[args.cluster].broker_names)
    targets = []
    for name in sorted(names):
        addr = info.broker_addr_table[name].broker_addrs.get(0)
        if addr:
            targets.append((name, addr))
    if not targets:
        raise NotFound(f"cluster {args.cluster!r} has no live master on the name server")
    return targets


def topic_update(args: argparse.Namespace) -> int:
    check_topic(args.topic)
    config = common_pb2.TopicConfig(
        topic_name=args.topic,
        read_queue_nums=args.read_queues,
        write_queue_nums=args.write_queues,
        perm=args.perm,
        order=args.order,
    )
    for name, addr in _targets(args):
        with BrokerClient(addr, admin_token=args.admin_token) as c:
            version = c.update_topic(config)
        print(
            f"{args.action}d topic {args.topic} on {name} ({addr}): {args.read_queues} read / "
            f"{args.write_queues} write queues, perm {args.perm}; topics version {version.counter}"
        )
    return 0


def topic_delete(args: argparse.Namespace) -> int:
    check_topic(args.topic)
    for name, addr in _targets(args):
        with BrokerClient(addr, admin_token=args.admin_token) as c:
            c.delete_topic(args.topic)
        print(f"deleted topic {args.topic} on {name} ({addr})")
    return 0


def topic_list(args: argparse.Namespace) -> int:
    with namesrv_client(args) as ns:
        topics = sorted(ns.topics())
    if args.json:
        print(json.dumps(topics))
    else:
        print("\n".join(topics))
    return 0


def _body(args: argparse.Namespace, index: int) -> bytes:
    if args.body is not None:
        return args.body.encode()
    if args.file is not None:
        return args.file.read_bytes()
    prefix = f"ferry-{index:09d}-".encode()
    return (prefix + b"x" * max(0, args.size - len(prefix)))[: max(args.size, 1)]


def send(args: argparse.Namespace) -> int:
    check_topic(args.topic)
    if args.count < 1 or args.batch < 1 or args.size < 1:
        raise InvalidArgument("--count/--batch/--size", "must be at least 1")
    if args.file is not None and not args.file.is_file():
        raise InvalidArgument("--file", f"{args.file} is not a readable file")
    properties = {"DELAY": str(args.delay_level)} if args.delay_level else {}
    statuses: dict[str, int] = {}
    sent = sent_bytes = 0
    started = last_report = time.monotonic()
    with namesrv_client(args) as ns, Producer(ns) as producer:
        try:
            while sent < args.count:
                n = min(args.batch, args.count - sent)
                if args.batch == 1:
                    body = _body(args, sent)
                    out = producer.send(args.topic, body, args.tags, args.keys, properties)
                    size = len(body)
                else:
                    entries = [
                        broker_pb2.SendEntry(
                            body=_body(args, sent + i),
                            tags=args.tags,
                            keys=args.keys,
                            properties=properties,
                        )
                        for i in range(n)
                    ]
                    out = producer.send_batch(args.topic, entries)
                    size = sum(len(e.body) for e in entries)
                status = _SEND_STATUS.get(out.result.status, str(out.result.status))
                statuses[status] = statuses.get(status, 0) + n
                sent += n
                sent_bytes += size
                now = time.monotonic()
                if args.count > 1 and now - last_report >= 1.0:
                    print(
                        f"  sent {sent}/{args.count} ({sent / (now - started):,.0f} msgs/s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    last_report = now
        except NoRoute as exc:
            raise NotFound(str(exc)) from None
    elapsed = max(time.monotonic() - started, 1e-9)
    if args.count == 1:
        r = out.result
        print(
            f"{status} msgId={r.msg_id} broker={out.broker_name} ({out.broker_addr}) "
            f"queueId={r.queue_id} queueOffset={r.queue_offset}"
        )
    else:
        summary = ", ".join(f"{k}={v}" for k, v in sorted(statuses.items()))
        print(
            f"sent {sent} messages ({sent_bytes} bytes) in {elapsed:.2f} s: "
            f"{sent / elapsed:,.0f} msgs/s, {sent_bytes / elapsed / 2**20:.2f} MiB/s; statuses: {summary}"
        )
    return 0 if set(statuses) == {"SEND_OK"} else 1


def _show(m: broker_pb2.MessageExt, broker_name: str, as_json: bool) -> str:
    try:
        text = m.body.decode()
        body = text if text.isprintable() else None
    except UnicodeDecodeError:
        body = None
    if as_json:
        doc = {
            "broker": broker_name,
            "queueId": m.queue_id,
            "queueOffset": m.queue_offset,
            "msgId": m.msg_id,
            "tags": m.tags,
            "keys": m.keys,
            "properties": dict(m.properties),
            "storeTimestamp": m.store_timestamp,
            "body": body if body is not None else None,
            "bodyBytes": len(m.body),
        }
        return json.dumps(doc, sort_keys=True)
    shown = body if body is not None else f"<{len(m.body)} bytes>"
    return f"{broker_name} q{m.queue_id} @{m.queue_offset} {m.msg_id} tags={m.tags or '-'} {shown}"


def consume(args: argparse.Namespace) -> int:
    check_topic(args.topic)
    if args.max < 0 or args.wait_ms < 0:
        raise InvalidArgument("--max/--wait-ms", "must not be negative")
    count = 0
    interrupted = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    last_message = time.monotonic()
    json_out = getattr(args, "json", False)
    try:
        with (
            namesrv_client(args) as ns,
            Consumer(
                ns,
                args.group,
                args.topic,
                from_beginning=args.from_beginning,
                sub_expression=args.tags,
            ) as consumer,
        ):
            try:
                while not interrupted and (not args.max or count < args.max):
                    batch = consumer.poll(
                        max_msgs=min(32, args.max - count) if args.max else 32, wait_ms=args.wait_ms
                    )
                    for item in batch:
                        print(_show(item.message, item.broker_name, json_out), flush=True)
                        count += 1
                    if batch:
                        last_message = time.monotonic()
                        consumer.commit()
                    elif args.idle_exit_s and time.monotonic() - last_message >= args.idle_exit_s:
                        break
            except NoRoute as exc:
                raise NotFound(str(exc)) from None
            finally:
                consumer.commit()
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"consumed {count} messages as group {args.group}", file=sys.stderr)
    return 0


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,.0f} B"


def ha_status(args: argparse.Namespace) -> int:
    check_addr(args.broker, "--broker")
    with BrokerClient(args.broker) as c:
        status = c.ha_status()
    if args.json:
        print(message_json(status))
        return 0
    print(
        f"{status.broker_role}  max offset {status.master_max_offset:,}  "
        f"confirmed {status.confirm_offset:,}"
    )
    if status.broker_role == "SLAVE":
        s = status.slave
        print(
            table(
                ["MASTER HA", "CONNECTED", "LOCAL END", "MASTER END", "BEHIND", "LAST READ"],
                [
                    [
                        s.master_addr or "-",
                        "yes" if s.connected else "no",
                        f"{s.max_offset:,}",
                        f"{s.master_max_offset:,}",
                        _mib(max(0, s.master_max_offset - s.max_offset)),
                        _when(s.last_read_timestamp),
                    ]
                ],
            )
        )
        return 0
    rows = [
        [
            c.replica_id or "-",
            c.addr,
            f"{c.ack_offset:,}",
            _mib(c.diff),
            "yes" if c.in_sync else "NO",
            f"{c.transferred_bytes_per_second / 2**20:,.1f} MiB/s",
        ]
        for c in status.connections
    ]
    if not rows:
        print("no slave connected")
        return 0
    print(f"in-sync slaves: {status.in_sync_slave_nums}")
    print(table(["REPLICA", "ADDRESS", "ACK OFFSET", "LAG", "IN SYNC", "RATE"], rows))
    return 0


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return f"{max(0.0, time.time() - ms / 1000):.1f}s ago"


# GetBrokerRuntimeInfo's disk and retention entries, in the order `ferry runtime`
# shows them, with what each means.
_RETENTION_ROWS = (
    ("diskUsedRatio", "of the file system holding the store"),
    ("sendsRefusedDiskFull", "true above diskSpaceWarningLevelRatio: sends are refused"),
    ("fileReservedTime", "a commit-log file is kept this long after its last write"),
    ("deleteWhen", "hours of the day when expired files are deleted"),
    ("diskMaxUsedSpaceRatio", "above it, expired files are deleted at any hour"),
    ("diskSpaceCleanForciblyRatio", "above it, the oldest files go even unexpired"),
    ("diskSpaceWarningLevelRatio", "above it, sends are refused"),
    ("cleanFileForciblyEnable", "whether diskSpaceCleanForciblyRatio applies"),
    ("deletedCommitLogFiles", "deleted by retention since the broker started"),
    ("deletedConsumeQueueFiles", "deleted with them"),
)


def runtime(args: argparse.Namespace) -> int:
    check_addr(args.broker, "--broker")
    with BrokerClient(args.broker) as c:
        info = c.runtime_info()
    if args.json:
        print(message_json(info))
        return 0
    rows = [
        [field.name, getattr(info, field.name)]
        for field in info.DESCRIPTOR.fields
        if field.name != "table"
    ]
    retention = {key for key, _ in _RETENTION_ROWS}
    rows += [[k, v] for k, v in sorted(info.table.items()) if k not in retention]
    print(table(["FIELD", "VALUE"], rows))
    disk = [[k, info.table[k], meaning] for k, meaning in _RETENTION_ROWS if k in info.table]
    if disk:
        print()
        print(table(["DISK AND RETENTION", "VALUE", ""], disk))
    return 0
