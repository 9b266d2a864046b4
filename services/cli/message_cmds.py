"""`ferry message query`: find messages by key, unique key or message id, as mqadmin's
queryMsgByKey, queryMsgByUniqueKey and queryMsgById do, over the same RocketMQ-protocol
requests: the topic's route from the name server (105), then each master's message
index (QUERY_MESSAGE, 12) or, for an offset message id, the broker it names
(VIEW_MESSAGE_BY_ID, 33). So it reads a ferry cluster, an Apache RocketMQ cluster, or a
mixed one alike. For one message (`--id`) it also says which consumer groups have
consumed past it, as mqadmin's message track does: the groups the broker knows for the
topic (300) and their committed offsets on the message's queue (208).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from ferry import record
from ferry.remoting import codes
from ferry.runtime.errors import FerryError, InvalidArgument, NotFound
from services.cli.stats_cmds import Remote, add_common, answer_body, human_time, offset_table

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
KEY_QUERY_MAX = 64  # what mqadmin queryMsgByKey asks for
UNIQUE_QUERY_MAX = 32
BODY_SHOWN = 4096


def add_commands(sub: argparse._SubParsersAction) -> None:
    message = sub.add_parser(
        "message",
        help="find messages by key or id",
        description="Messages as the brokers' message index finds them.",
    )
    msub = message.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = msub.add_parser(
        "query",
        help="messages by key (-k, with -t) or by id (-i): a unique key or an offset message id",
        description="With -k: the messages of TOPIC whose KEYS hold KEY, on every master of the "
        "topic's route (mqadmin queryMsgByKey), stored between --begin and --end. With -i: the "
        "message with that id — a unique key (UNIQ_KEY, the id a RocketMQ client returns; needs "
        "-t) or an offset message id (the broker's address and the commit offset, which the "
        "broker it names is asked for, as mqadmin queryMsgById does) — with the consumer "
        "groups that have consumed past it. Prints each message's ids, queue, offsets, store "
        "time, hosts, properties and body.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-k", "--key", help="a message key (one of KEYS)")
    what.add_argument("-i", "--id", help="a unique key or an offset message id")
    p.add_argument("-t", "--topic", help="topic (required with -k and for a unique key)")
    p.add_argument(
        "--begin",
        default="0",
        metavar="TIME",
        help="stored at or after: epoch ms or ISO-8601 local time (default: the beginning)",
    )
    p.add_argument(
        "--end", default="", metavar="TIME", help="stored at or before (default: no end)"
    )
    p.add_argument(
        "--max", type=int, default=KEY_QUERY_MAX, help="messages per broker with -k (default 64)"
    )
    add_common(p)
    p.set_defaults(func=query)


def query(args: argparse.Namespace) -> int:
    remote = Remote(args)
    begin = _when(args.begin, "--begin") if args.begin else 0
    end = _when(args.end, "--end") if args.end else 2**63 - 1
    if args.key is not None:
        if not args.topic:
            raise InvalidArgument("--topic", "-k needs the topic (-t)")
        found = _by_key(remote, args.topic, args.key, args.max, begin, end, unique=False)
        if not found:
            raise NotFound(f"no message of topic {args.topic!r} has key {args.key!r}")
        return _show(args, found, track=False, remote=remote)
    found = []
    if args.topic:
        found = _by_key(remote, args.topic, args.id, UNIQUE_QUERY_MAX, begin, end, unique=True)
        found = [(a, m) for a, m in found if m.properties.get("UNIQ_KEY") == args.id][:1]
    if not found:
        found = _by_offset_id(remote, args.id, args.topic)
    return _show(args, found, track=True, remote=remote)


def _when(text: str, option: str) -> int:
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InvalidArgument(
            option, f"{text!r} is neither epoch ms nor an ISO-8601 time"
        ) from None


def _records(body: bytes) -> list[record.StoredMessage]:
    out, pos = [], 0
    while pos + record.BLANK_SIZE <= len(body):
        size = record.peek(body[pos : pos + record.BLANK_SIZE])
        if not isinstance(size, int):
            break
        out.append(record.decode_stored(body, pos, size))
        pos += size
    return out


def _by_key(
    remote: Remote, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool
) -> list[tuple[str, record.StoredMessage]]:
    """(broker address, message) of each match on every master of the topic."""
    found: list[tuple[str, record.StoredMessage]] = []
    for _name, addr in remote.masters(topic):
        ext = {
            "topic": topic,
            "key": key,
            "maxNum": str(max_num),
            "beginTimestamp": str(begin),
            "endTimestamp": str(end),
        }
        if unique:
            ext[UNIQUE_KEY_QUERY] = "true"
        answer = remote.ask(addr, codes.QUERY_MESSAGE, ext)
        if answer.code == codes.QUERY_NOT_FOUND:
            continue
        if answer.code != codes.SUCCESS:
            raise FerryError(f"query on {addr}: code {answer.code}: {answer.remark}")
        for m in _records(answer.body):
            keys = m.properties.get(record.PROPERTY_KEYS, "").split(" ")
            if m.topic == topic and (
                m.properties.get("UNIQ_KEY") == key if unique else key in keys
            ):
                found.append((addr, m))
    found.sort(key=lambda item: item[1].store_timestamp)
    return found


def _by_offset_id(
    remote: Remote, msg_id: str, topic: str | None
) -> list[tuple[str, record.StoredMessage]]:
    try:
        (host, port), commit_offset = record.parse_message_id(msg_id)
    except record.RecordError:
        raise InvalidArgument(
            "--id", f"{msg_id!r} is neither a unique key nor an offset message id"
        ) from None
    addr = f"{host}:{port}"
    try:
        answer = remote.ask(addr, codes.VIEW_MESSAGE_BY_ID, {"offset": str(commit_offset)})
    except FerryError as exc:
        hint = "" if topic else " (for a unique key, name its topic with -t)"
        raise NotFound(f"message {msg_id}: {exc}{hint}") from None
    if answer.code != codes.SUCCESS:
        raise NotFound(f"message {msg_id}: {addr} answered {answer.code}: {answer.remark}")
    return [(addr, m) for m in _records(answer.body)]


def _consumed_by(remote: Remote, addr: str, m: record.StoredMessage) -> list[dict[str, Any]]:
    """The consumer groups that have offsets on the message's topic on its broker, each
    with its committed offset on the message's queue and whether that is past it."""
    groups = answer_body(
        remote.ask(addr, codes.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": m.topic}),
        f"consumer groups of {m.topic} on {addr}",
    ).get("groupList", [])
    out = []
    for group in sorted(groups):
        answer = remote.ask(
            addr, codes.GET_CONSUME_STATS, {"consumerGroup": group, "topic": m.topic}
        )
        try:
            _, pairs = offset_table(answer, f"consume stats of {group} on {addr}")
        except FerryError:
            continue
        for q, v in pairs:
            if q.get("topic") == m.topic and int(q.get("queueId", -1)) == m.queue_id:
                offset = int(v.get("consumerOffset", -1))
                out.append(
                    {"group": group, "consumerOffset": offset, "consumed": offset > m.queue_offset}
                )
    return out


def _doc(addr: str, m: record.StoredMessage) -> dict[str, Any]:
    try:
        body: str | None = m.body.decode()
    except UnicodeDecodeError:
        body = None
    return {
        "msgId": m.properties.get("UNIQ_KEY") or m.msg_id,
        "offsetMsgId": m.msg_id,
        "broker": addr,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "commitLogOffset": m.commit_offset,
        "storeTimestamp": m.store_timestamp,
        "bornTimestamp": m.born_timestamp,
        "storeHost": m.store_host,
        "bornHost": m.born_host,
        "reconsumeTimes": m.reconsume_times,
        "properties": m.properties,
        "body": body,
        "bodyHex": None if body is not None else m.body.hex(),
        "bodySize": len(m.body),
    }


def _show(
    args: argparse.Namespace,
    found: list[tuple[str, record.StoredMessage]],
    track: bool,
    remote: Remote,
) -> int:
    docs = []
    for addr, m in found:
        doc = _doc(addr, m)
        if track:
            doc["consumedBy"] = _consumed_by(remote, addr, m)
        docs.append(doc)
    if args.json:
        print(json.dumps(docs if not track else docs[0], indent=2, sort_keys=True))
        return 0
    out = []
    for i, doc in enumerate(docs):
        if i:
            out.append("")
        rows = [
            ("Message ID:", doc["msgId"]),
            ("Offset Message ID:", doc["offsetMsgId"]),
            ("Topic:", doc["topic"]),
            ("Broker:", doc["broker"]),
            ("Queue ID:", doc["queueId"]),
            ("Queue Offset:", doc["queueOffset"]),
            ("CommitLog Offset:", doc["commitLogOffset"]),
            ("Store Timestamp:", human_time(doc["storeTimestamp"])),
            ("Born Timestamp:", human_time(doc["bornTimestamp"])),
            ("Store Host:", doc["storeHost"]),
            ("Born Host:", doc["bornHost"]),
            ("Reconsume Times:", doc["reconsumeTimes"]),
            ("Properties:", json.dumps(doc["properties"], sort_keys=True)),
        ]
        out += [f"{k:<20} {v}" for k, v in rows]
        body = doc["body"] if doc["body"] is not None else "hex " + doc["bodyHex"]
        if len(body) > BODY_SHOWN:
            body = body[:BODY_SHOWN] + f"... ({doc['bodySize']} bytes)"
        out.append(f"{'Body:':<20} {body}")
        if track:
            consumed = doc["consumedBy"]
            if not consumed:
                out.append(f"{'Consumed by:':<20} no consumer group has offsets on this topic")
            for c in consumed:
                state = "consumed" if c["consumed"] else "not consumed yet"
                out.append(
                    f"{'Consumer group:':<20} {c['group']}: {state} (its offset on queue "
                    f"{doc['queueId']} is {c['consumerOffset']})"
                )
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0
