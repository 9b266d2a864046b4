"""`ferry group status`: a consumer group's pop-consumption state on a topic,
asked of every master broker in the topic's route (GetGroupStatus)."""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from ferry.client.broker import BrokerClient, NoRoute
from ferry.model import MASTER_ID, check_name, check_topic
from ferry.runtime.errors import NotFound
from ferry.v1 import broker_pb2
from services.cli import stats_cmds
from services.cli.namesrv_cmds import add_namesrv_option
from services.cli.namesrv_cmds import client as namesrv_client
from services.cli.output import table


def add_commands(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser(
        "group",
        help="consumer groups' state",
        description="Consumer groups as the brokers see them (pop consumption).",
    )
    gsub = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = gsub.add_parser(
        "status",
        help="a group's offsets, in-flight messages, retries and dead letters on a topic",
        description="Ask every master broker carrying TOPIC for GROUP's state. Per queue: "
        "COMMITTED (everything below is acknowledged, or moved to retry or the DLQ), POP "
        "OFFSET (the next message never yet handed out), MAX (the queue's end), IN FLIGHT "
        "(handed out, not yet acknowledged, not yet expired) and LAG (MAX - COMMITTED; '-' "
        "offsets: the group never consumed the queue, and its lag is all the queue holds). Per "
        "broker: RETRIES PENDING (unacknowledged messages waiting to be delivered again), "
        "DLQ MESSAGES (in %DLQ%GROUP after the retries ran out), whether the group is "
        "orderly, and its retry max times.",
    )
    p.add_argument("-g", "--group", required=True, help="consumer group")
    p.add_argument("-t", "--topic", required=True, help="topic")
    add_namesrv_option(p)
    p.set_defaults(func=status)
    stats_cmds.add_group_commands(gsub)


def _masters(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(broker name, master address or None) of each broker carrying the topic."""
    with namesrv_client(args) as ns:
        try:
            route = ns.route(args.topic)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(str(NoRoute(args.topic))) from None
            raise
    addrs = {b.broker_name: b.broker_addrs.get(MASTER_ID) for b in route.broker_datas}
    names = sorted({q.broker_name for q in route.queue_datas})
    if not names:
        raise NotFound(str(NoRoute(args.topic)))
    return [(name, addrs.get(name)) for name in names]


def status(args: argparse.Namespace) -> int:
    check_topic(args.topic, "--topic")
    check_name(args.group, "--group")
    answers: list[tuple[str, str, broker_pb2.GetGroupStatusResponse]] = []
    errors: list[tuple[str, str, str]] = []
    first_error: grpc.RpcError | None = None
    queues: list[dict] = []
    for name, addr in _masters(args):
        if addr is None:
            errors.append((name, "-", "its master is not registered (only slaves are)"))
            continue
        try:
            with BrokerClient(addr) as c:
                answer = c.group_status(args.group, args.topic)
                queues += [_queue_row(c, args.topic, name, q) for q in answer.queues]
            answers.append((name, addr, answer))
        except grpc.RpcError as exc:
            first_error = first_error or exc
            errors.append((name, addr, f"{exc.code().name}: {exc.details()}"))
    if not answers and first_error is not None:
        raise first_error
    if not answers:
        raise NotFound(f"topic {args.topic!r}: no master is alive to ask; see `ferry cluster`")
    queues.sort(key=lambda q: (q["broker"], q["queueId"]))
    brokers = [
        {
            "broker": name,
            "addr": addr,
            "retriesPending": a.retries_pending,
            "dlqMessages": a.dlq_messages,
            "orderly": a.orderly,
            "retryMaxTimes": a.retry_max_times,
            "retryTopic": a.retry_topic,
            "dlqTopic": a.dlq_topic,
        }
        for name, addr, a in answers
    ]
    failed = [{"broker": n, "addr": a, "error": e} for n, a, e in errors]
    if args.json:
        doc = {
            "group": args.group,
            "topic": args.topic,
            "queues": queues,
            "brokers": brokers,
            "errors": failed,
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _print_tables(args, queues, brokers)
    for e in failed:
        print(f"ferry: {e['broker']} ({e['addr']}) did not answer: {e['error']}", file=sys.stderr)
    return 1 if failed else 0


def _queue_row(
    client: BrokerClient, topic: str, broker: str, q: broker_pb2.GroupQueueStatus
) -> dict:
    """One queue's figures; None for the offsets of a queue the group never
    consumed (the broker says -1), whose lag is all the queue still holds."""
    consumed = q.committed_offset >= 0
    start = q.committed_offset if consumed else client.min_offset(topic, q.queue_id)
    return {
        "broker": broker,
        "queueId": q.queue_id,
        "committedOffset": q.committed_offset if consumed else None,
        "popOffset": q.pop_offset if q.pop_offset >= 0 else None,
        "maxOffset": q.max_offset,
        "inFlight": q.in_flight,
        "redeliveriesPending": q.redeliveries_pending,
        "lag": max(0, q.max_offset - start),
    }


def _print_tables(args: argparse.Namespace, queues: list[dict], brokers: list[dict]) -> None:
    print(f"group {args.group} on topic {args.topic}")
    print(
        table(
            ["BROKER", "QUEUE", "COMMITTED", "POP OFFSET", "MAX", "IN FLIGHT", "LAG"],
            [
                [
                    q["broker"],
                    q["queueId"],
                    _or_dash(q["committedOffset"]),
                    _or_dash(q["popOffset"]),
                    q["maxOffset"],
                    q["inFlight"],
                    q["lag"],
                ]
                for q in queues
            ],
        )
    )
    print()
    print(
        table(
            ["BROKER", "RETRIES PENDING", "DLQ MESSAGES", "ORDERLY", "RETRY MAX TIMES"],
            [
                [
                    b["broker"],
                    b["retriesPending"],
                    b["dlqMessages"],
                    "yes" if b["orderly"] else "no",
                    b["retryMaxTimes"],
                ]
                for b in brokers
            ],
        )
    )
    topics = {(b["retryTopic"], b["dlqTopic"]) for b in brokers if b["retryTopic"]}
    for retry, dlq in sorted(topics):
        print(f"\nretries wait in {retry}; dead letters go to {dlq}")


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
