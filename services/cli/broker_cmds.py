"""`ferry topic`, `ferry send`, `ferry consume`, `ferry runtime`: producers,
consumers and administration against running brokers (`ferry store` is in
store_cmds.py, `ferry group` in group_cmds.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import time
from pathlib import Path

from ferry.client.broker import BrokerClient, Consumer, NoRoute, Producer, message_properties
from ferry.client.pop import INVISIBLE_MAX_S, INVISIBLE_MIN_S, MAX_MSGS, PopConsumer, Received
from ferry.client.producer import PipelinedProducer
from ferry.client.sendstream import StreamSendError
from ferry.model import (
    MESSAGE_TYPE_ATTRIBUTE,
    MESSAGE_TYPES,
    check_addr,
    check_topic,
    parse_attributes,
)
from ferry.runtime.errors import InvalidArgument, NotFound
from ferry.v1 import broker_pb2, common_pb2
from services.cli import failover_cmds, stats_cmds, tx_cmds
from services.cli.namesrv_cmds import BROKER_HELP, add_admin_token_option, add_namesrv_option
from services.cli.namesrv_cmds import client as namesrv_client
from services.cli.output import message_json, table

_SEND_STATUS = {v: k for k, v in broker_pb2.SendStatus.items()}
MESSAGE_TYPE_CHOICES = [t for t in MESSAGE_TYPES if t != "UNSPECIFIED"]


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
        p.add_argument(
            "--order",
            action="store_true",
            help="mark the topic as ordered (consumed queue by queue in order; not the same as "
            "--message-type FIFO)",
        )
        p.add_argument(
            "--message-type",
            choices=MESSAGE_TYPE_CHOICES,
            default=None,
            help="RocketMQ 5's topic message type, what the RocketMQ 5 SDKs may send to it "
            "through the proxy: NORMAL, FIFO (with a message group), DELAY (with a delivery "
            "time), TRANSACTION, or MIXED (any; needs the broker's enableMixedMessageType). "
            "Same as -a +message.type=TYPE. A topic without one is NORMAL"
            + ("" if action == "create" else "; an update without it keeps the topic's"),
        )
        p.add_argument(
            "-a",
            "--attributes",
            default="",
            metavar="'+KEY=VALUE,-KEY'",
            help="topic attributes to set (+key=value) or remove (-key; write --attributes=-key), "
            "comma-separated, as RocketMQ's mqadmin updateTopic -a takes them; ferry knows "
            "message.type",
        )
        p.set_defaults(func=topic_update)
    p = tsub.add_parser("delete", help="delete a topic from brokers")
    p.add_argument("topic")
    _target_options(p)
    p.set_defaults(func=topic_delete)
    p = tsub.add_parser("list", help="list the topics the name server routes")
    add_namesrv_option(p)
    p.set_defaults(func=topic_list)
    stats_cmds.add_topic_commands(tsub)

    p = sub.add_parser(
        "send",
        help="send messages to a topic",
        description="Send one message (--body or --file) or --count generated messages of --size "
        "bytes. Several messages are pipelined over one Broker.SendStream per broker (up to "
        "--inflight unanswered per broker, each answered on its own); --inflight 1 sends them "
        "one at a time with a unary call each, --batch N as SendMessages batches of N. "
        "Progress goes to stderr, a summary to stdout.",
    )
    p.add_argument("topic")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--body", help="message body text")
    source.add_argument("--file", type=Path, help="message body from a file")
    p.add_argument("--count", type=int, default=1, help="messages to send (default 1)")
    p.add_argument("--size", type=int, default=128, help="generated body size, bytes (default 128)")
    p.add_argument("--batch", type=int, default=1, help="messages per SendMessages RPC (default 1)")
    p.add_argument(
        "--inflight",
        type=int,
        default=256,
        help="unanswered messages per broker when pipelining (default 256; 1: one at a time)",
    )
    p.add_argument(
        "--linger-ms",
        type=float,
        default=0.0,
        help="when pipelining, how long a message may wait for others to its queue to go out "
        "in one write (default 0: never waits)",
    )
    p.add_argument("--tags", default="", help="message tags")
    p.add_argument("--keys", default="", help="message keys (space-separated)")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument(
        "--delay-level", type=int, default=0, help="RocketMQ delay level 1..18 (1s ... 2h)"
    )
    timing.add_argument(
        "--delay-ms",
        type=int,
        default=None,
        metavar="MS",
        help="a timed message: deliver this long after the command starts (every message of "
        "the run gets the same delivery time; at most the broker's timerMaxDelaySec, 3 days "
        "by default)",
    )
    timing.add_argument(
        "--deliver-at",
        default=None,
        metavar="ISO8601",
        help="a timed message: deliver at this time, e.g. 2026-11-23T18:30:00 (local time) "
        "or 2026-11-23T17:30:00Z",
    )
    p.add_argument(
        "--message-group",
        default="",
        metavar="GROUP",
        help="FIFO message group (property __SHARDINGKEY): every message of a group goes to "
        "one queue, chosen by a stable hash of the group, so an orderly consumer group or an "
        "ordered topic (topic create --order) gets them in the order sent",
    )
    tx_cmds.add_options(p)
    add_namesrv_option(p)
    p.set_defaults(func=send)

    p = sub.add_parser(
        "consume",
        help="consume messages of a topic as a consumer group",
        description="Consume the topic as GROUP and print one line per message. By default by "
        "pop (RocketMQ 5): the brokers hand each message to one consumer of the group, so "
        "several `ferry consume` processes of one group split the work; each printed batch is "
        "acknowledged (unless --no-ack), and a message not acknowledged within --invisible-s "
        "comes back with its attempt number raised. A group new to a queue starts at its "
        "oldest message, otherwise where the group left off. With --pull: today's pull "
        "consumer, which reads every queue itself from the group's committed offset and "
        "commits what it printed. Without --max it runs until Ctrl-C (or --idle-exit-s of "
        "silence).",
    )
    p.add_argument("topic")
    p.add_argument("--group", "-g", required=True, help="consumer group")
    p.add_argument(
        "--pull",
        action="store_true",
        help="pull every queue instead of pop: this process alone reads the group's offsets",
    )
    p.add_argument("--max", type=int, default=0, help="stop after this many messages")
    p.add_argument(
        "--idle-exit-s",
        type=float,
        default=0,
        help="stop after this long with no message (0: never)",
    )
    p.add_argument("--tags", default="", help="tag expression, e.g. 'a || b'")
    pop = p.add_argument_group("pop (the default)")
    pop.add_argument(
        "--invisible-s",
        type=float,
        default=None,
        metavar="S",
        help="a received message is hidden from the group this long; not acknowledged by "
        "then, it is delivered again (1..43200, default 30)",
    )
    pop.add_argument(
        "--wait-s",
        type=float,
        default=None,
        metavar="S",
        help="long-poll wait per receive (default 1)",
    )
    pop.add_argument(
        "--no-ack",
        action="store_true",
        help="print but do not acknowledge: the messages come back after --invisible-s "
        "with attempt=2, 3, ...",
    )
    pull = p.add_argument_group("pull (--pull)")
    pull.add_argument(
        "--from-beginning",
        action="store_true",
        help="a group with no committed offset starts at the oldest message (default: the "
        "newest). Pop always starts a new group at the oldest message, so there it changes "
        "nothing",
    )
    pull.add_argument(
        "--wait-ms",
        type=int,
        default=None,
        metavar="MS",
        help="long-poll wait per round (default 1000)",
    )
    add_namesrv_option(p)
    p.set_defaults(func=consume)

    p = sub.add_parser(
        "ha-status",
        help="replication status: a broker's (-b), or the failover groups' (from etcd)",
        description="With -b, a broker's replication: on a master one row per slave connection "
        "(replica, address, ack offset, lag, in sync, transfer rate); on a slave its master and "
        "how far it has read. Without -b, automatic failover as published in etcd: each "
        "group's epoch, elected master, in-sync set and members (enableFailover=true).",
    )
    p.add_argument("-b", "--broker", default="", metavar="HOST:PORT", help=BROKER_HELP)
    failover_cmds.add_status_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=ha_status)

    p = sub.add_parser(
        "runtime",
        help="a broker's runtime figures",
        description="A broker's offsets, rates and role, then its disk use and retention "
        "settings (fileReservedTime, deleteWhen, the disk ratios) and what retention deleted.",
    )
    p.add_argument("-b", "--broker", required=True, metavar="HOST:PORT", help=BROKER_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=runtime)


def _target_options(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("-b", "--broker", metavar="HOST:PORT", help="one broker: " + BROKER_HELP)
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
    attributes = parse_attributes(args.attributes, "--attributes")
    if args.message_type:
        key = "+" + MESSAGE_TYPE_ATTRIBUTE
        if key in attributes or "-" + MESSAGE_TYPE_ATTRIBUTE in attributes:
            raise InvalidArgument("--message-type", "is also named in --attributes; use one")
        attributes[key] = args.message_type
    config = common_pb2.TopicConfig(
        topic_name=args.topic,
        read_queue_nums=args.read_queues,
        write_queue_nums=args.write_queues,
        perm=args.perm,
        order=args.order,
        attributes=attributes,
    )
    changes = ", attributes " + ",".join(k + (f"={v}" if v else "") for k, v in attributes.items())
    for name, addr in _targets(args):
        with BrokerClient(addr, admin_token=args.admin_token) as c:
            version = c.update_topic(config)
        print(
            f"{args.action}d topic {args.topic} on {name} ({addr}): {args.read_queues} read / "
            f"{args.write_queues} write queues, perm {args.perm}"
            f"{changes if attributes else ''}; topics version {version.counter}"
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
    if args.count < 1 or args.batch < 1 or args.size < 1 or args.inflight < 1:
        raise InvalidArgument("--count/--batch/--size/--inflight", "must be at least 1")
    if args.linger_ms < 0:
        raise InvalidArgument("--linger-ms", f"{args.linger_ms} is negative")
    if args.file is not None and not args.file.is_file():
        raise InvalidArgument("--file", f"{args.file} is not a readable file")
    if args.transaction is not None:
        return tx_cmds.send_transaction(args, _body(args, 0))
    deliver_at_ms = _deliver_at_ms(args)
    group = args.message_group
    properties = {"DELAY": str(args.delay_level)} if args.delay_level else {}
    if args.count > 1 and args.batch == 1 and args.inflight > 1:
        return _send_pipelined(args, properties, deliver_at_ms)
    statuses: dict[str, int] = {}
    sent = sent_bytes = 0
    started = last_report = time.monotonic()
    with namesrv_client(args) as ns, Producer(ns) as producer:
        try:
            while sent < args.count:
                n = min(args.batch, args.count - sent)
                if args.batch == 1:
                    body = _body(args, sent)
                    out = producer.send(
                        args.topic,
                        body,
                        args.tags,
                        args.keys,
                        properties,
                        message_group=group,
                        deliver_at_ms=deliver_at_ms,
                    )
                    size = len(body)
                else:
                    props = message_properties(properties, group, deliver_at_ms)
                    entries = [
                        broker_pb2.SendEntry(
                            body=_body(args, sent + i),
                            tags=args.tags,
                            keys=args.keys,
                            properties=props,
                        )
                        for i in range(n)
                    ]
                    out = producer.send_batch(args.topic, entries, message_group=group)
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
    extra = (f" messageGroup={group}" if group else "") + (
        f" deliverAt={_local_iso(deliver_at_ms)}" if deliver_at_ms is not None else ""
    )
    if args.count == 1:
        r = out.result
        print(
            f"{status} msgId={r.msg_id} broker={out.broker_name} ({out.broker_addr}) "
            f"queueId={r.queue_id} queueOffset={r.queue_offset}{extra}"
        )
    else:
        summary = ", ".join(f"{k}={v}" for k, v in sorted(statuses.items()))
        print(
            f"sent {sent} messages ({sent_bytes} bytes) in {elapsed:.2f} s: "
            f"{sent / elapsed:,.0f} msgs/s, {sent_bytes / elapsed / 2**20:.2f} MiB/s; statuses: {summary}"
            + (f";{extra}" if extra else "")
        )
    return 0 if set(statuses) == {"SEND_OK"} else 1


def _send_pipelined(
    args: argparse.Namespace, properties: dict[str, str], deliver_at_ms: int | None
) -> int:
    """--count messages handed to a PipelinedProducer without waiting; a
    summary of every message's answer (or error) at the end."""
    group = args.message_group
    futures = []
    size = 0
    started = last_report = time.monotonic()

    def progress(force: bool = False) -> None:
        nonlocal last_report
        now = time.monotonic()
        if force or now - last_report >= 1.0:
            done = sum(1 for f in futures if f.done())
            print(
                f"  handed over {len(futures)}/{args.count}, answered {done} "
                f"({done / max(now - started, 1e-9):,.0f} msgs/s)",
                file=sys.stderr,
                flush=True,
            )
            last_report = now

    with (
        namesrv_client(args) as ns,
        PipelinedProducer(ns, max_in_flight=args.inflight, linger_ms=args.linger_ms) as producer,
    ):
        for i in range(args.count):
            body = _body(args, i)
            size += len(body)
            futures.append(
                producer.send_async(
                    args.topic, body, args.tags, args.keys, properties,
                    message_group=group, deliver_at_ms=deliver_at_ms,
                )
            )  # fmt: skip
            if i % 1000 == 999:
                progress()
        while True:
            try:
                producer.flush(1.0)
                break
            except TimeoutError:
                progress(force=True)
    elapsed = max(time.monotonic() - started, 1e-9)
    outcomes: dict[str, int] = {}
    for f in futures:
        exc = f.exception()
        if exc is None:
            name = _SEND_STATUS.get(f.result().result.status, str(f.result().result.status))
        elif isinstance(exc, NoRoute):
            raise NotFound(str(exc))
        elif isinstance(exc, StreamSendError):
            name = exc.code().name + (" (may be stored)" if exc.maybe_stored else "")
        else:
            name = type(exc).__name__
        outcomes[name] = outcomes.get(name, 0) + 1
    summary = ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
    extra = (f" messageGroup={group}" if group else "") + (
        f" deliverAt={_local_iso(deliver_at_ms)}" if deliver_at_ms is not None else ""
    )
    print(
        f"sent {args.count} messages ({size} bytes) in {elapsed:.2f} s: "
        f"{args.count / elapsed:,.0f} msgs/s, {size / elapsed / 2**20:.2f} MiB/s, pipelined "
        f"(--inflight {args.inflight}); statuses: {summary}" + (f";{extra}" if extra else "")
    )
    first = next((f.exception() for f in futures if f.exception() is not None), None)
    if first is not None:
        print(f"first error: {first}", file=sys.stderr)
    return 0 if set(outcomes) == {"SEND_OK"} else 1


def _deliver_at_ms(args: argparse.Namespace) -> int | None:
    """The epoch ms of --delay-ms (from now) or --deliver-at (a naive time is local)."""
    if args.delay_ms is not None:
        if args.delay_ms < 0:
            raise InvalidArgument("--delay-ms", f"{args.delay_ms} is negative")
        return int(time.time() * 1000) + args.delay_ms
    if args.deliver_at is not None:
        try:
            when = dt.datetime.fromisoformat(args.deliver_at)
        except ValueError:
            raise InvalidArgument(
                "--deliver-at",
                f"{args.deliver_at!r} is not an ISO 8601 time; e.g. 2026-11-23T18:30:00 "
                "(local time) or 2026-11-23T17:30:00Z",
            ) from None
        return round(when.timestamp() * 1000)  # naive: local time
    return None


def _local_iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")


def _printable(body: bytes) -> str | None:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def _show(m: broker_pb2.MessageExt, broker_name: str, as_json: bool) -> str:
    body = _printable(m.body)
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


def _show_received(m: Received, as_json: bool) -> str:
    """A popped message: the pull line plus its delivery attempt (and message group)."""
    body = _printable(m.body)
    if as_json:
        doc = {
            "broker": m.broker_name,
            "topic": m.topic,
            "queueId": m.queue_id,
            "queueOffset": m.queue_offset,
            "msgId": m.msg_id,
            "tags": m.tags,
            "keys": m.keys,
            "properties": m.properties,
            "messageGroup": m.message_group,
            "storeTimestamp": m.store_timestamp,
            "deliveryAttempt": m.delivery_attempt,
            "invisibleUntilMs": m.invisible_until_ms,
            "receiptHandle": m.receipt_handle,
            "body": body,
            "bodyBytes": len(m.body),
        }
        return json.dumps(doc, sort_keys=True)
    shown = body if body is not None else f"<{len(m.body)} bytes>"
    group = f" group={m.message_group}" if m.message_group else ""
    return (
        f"{m.broker_name} q{m.queue_id} @{m.queue_offset} {m.msg_id} tags={m.tags or '-'} "
        f"attempt={m.delivery_attempt}{group} {shown}"
    )


class _StopSignal:
    """SIGINT/SIGTERM ask the consume loop to stop: it finishes its round
    (printing, acknowledging or committing what it got) and exits."""

    def __init__(self) -> None:
        self.requested = False

    def __enter__(self) -> _StopSignal:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def consume(args: argparse.Namespace) -> int:
    check_topic(args.topic)
    if args.max < 0:
        raise InvalidArgument("--max", "must not be negative")
    if args.pull:
        for option, given in (
            ("--invisible-s", args.invisible_s is not None),
            ("--wait-s", args.wait_s is not None),
            ("--no-ack", args.no_ack),
        ):
            if given:
                raise InvalidArgument(
                    option, "is for pop consumption (the default); --pull commits offsets instead"
                )
        return _consume_pull(args)
    if args.wait_ms is not None:
        raise InvalidArgument(
            "--wait-ms", "is the --pull wait; pop consumption (the default) waits --wait-s seconds"
        )
    return _consume_pop(args)


def _consume_pull(args: argparse.Namespace) -> int:
    wait_ms = 1000 if args.wait_ms is None else args.wait_ms
    if wait_ms < 0:
        raise InvalidArgument("--wait-ms", "must not be negative")
    count = 0
    last_message = time.monotonic()
    json_out = getattr(args, "json", False)
    with (
        _StopSignal() as stop,
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
            while not stop.requested and (not args.max or count < args.max):
                batch = consumer.poll(
                    max_msgs=min(32, args.max - count) if args.max else 32, wait_ms=wait_ms
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
    print(f"consumed {count} messages as group {args.group}", file=sys.stderr)
    return 0


def _consume_pop(args: argparse.Namespace) -> int:
    invisible_s = 30.0 if args.invisible_s is None else args.invisible_s
    wait_s = 1.0 if args.wait_s is None else args.wait_s
    if not INVISIBLE_MIN_S <= invisible_s <= INVISIBLE_MAX_S:
        raise InvalidArgument(
            "--invisible-s", f"{invisible_s:g} is outside {INVISIBLE_MIN_S:g}..{INVISIBLE_MAX_S:g}"
        )
    if wait_s < 0:
        raise InvalidArgument("--wait-s", "must not be negative")
    count = acked = 0
    last_message = time.monotonic()
    with (
        _StopSignal() as stop,
        namesrv_client(args) as ns,
        PopConsumer(
            ns, args.group, args.topic, sub_expression=args.tags, invisible_s=invisible_s
        ) as consumer,
    ):
        try:
            while not stop.requested and (not args.max or count < args.max):
                batch = consumer.receive(
                    max_msgs=min(MAX_MSGS, args.max - count) if args.max else MAX_MSGS,
                    wait_s=wait_s,
                )
                for m in batch:
                    print(_show_received(m, args.json), flush=True)
                count += len(batch)
                if batch:
                    last_message = time.monotonic()
                    if not args.no_ack:
                        acked += _ack(consumer, batch)
                elif args.idle_exit_s and time.monotonic() - last_message >= args.idle_exit_s:
                    break
        except NoRoute as exc:
            raise NotFound(str(exc)) from None
    how = (
        f"none acknowledged (--no-ack): they come back after {invisible_s:g} s"
        if args.no_ack
        else f"{acked} acknowledged"
    )
    print(f"consumed {count} messages as group {args.group} by pop; {how}", file=sys.stderr)
    return 0


def _ack(consumer: PopConsumer, batch: list[Received]) -> int:
    """Acknowledge a printed batch; says which were not (they will come again)."""
    done = 0
    for m, outcome in zip(batch, consumer.ack(batch), strict=True):
        if outcome.ok:
            done += 1
        else:
            print(
                f"ferry: {m.msg_id} not acknowledged ({outcome.status}: {outcome.reason}); "
                "it is delivered again",
                file=sys.stderr,
            )
    return done


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,.0f} B"


def ha_status(args: argparse.Namespace) -> int:
    if not args.broker:
        return failover_cmds.group_status(args)
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
