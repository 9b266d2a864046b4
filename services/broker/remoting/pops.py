"""RocketMQ 5's pop consumption over RocketMQ's protocol: POP_MESSAGE (200050),
ACK_MESSAGE (200051), BATCH_ACK_MESSAGE (200151) and CHANGE_MESSAGE_INVISIBLETIME
(200053), as Apache 5.5.0's broker answers them, over the one pop use case (`PopService`) that
ferry.v1's PopMessage, AckMessage and ChangeInvisibleTime call: one pop state,
whichever door a consumer comes through.

RocketMQ's clients never see ferry's receipt handle. A pop answer's header
carries `popTime`, `invisibleTime`, `reviveQid`, `restNum` and, per queue the
messages came from, `startOffsetInfo` ("<retry> <queueId> <startOffset>",
joined by ";") and `msgOffsetInfo` ("<retry> <queueId> <o1>,<o2>,..."), where
<retry> is 0 for the topic and 1 for its pop retry topic `%RETRY%<group>_<topic>`;
the body is the records as stored, back to back, in that order. The client
builds each message's POP_CK from these ("startOffset popTime invisibleTime
reviveQid retry brokerName queueId queueOffset") and sends it back as an ack's
or a re-timing's `extraInfo`, with the real topic (the retry topic for a
redelivery), `queueId` and `offset`. popTime + invisibleTime is the deadline
the pop state holds for that message (`PopService.handle_at`): that is how an
ack names the in-flight record, and an ack of a message no longer in flight
under that deadline (acknowledged, expired, re-timed since) changes nothing
and is answered 0, as Apache's is.

Answers: a pop 0 with messages, 210 POLLING_TIMEOUT when none came within
`pollTime` (the client's "no new message"), 29 INVALID_PARAMETER for more than
32 messages, 17 / 16 / 23 for an unknown topic, a forbidden read and a selector
that does not compile; an ack or re-timing 17 for an unknown topic, 13 for a
queue id out of range or an `extraInfo` that does not parse, 208 NO_MESSAGE for
an offset outside the queue.

The assignment codes (400, 401, 402) that tell a 5.x push consumer to pop are
served by assignment.py; BATCH_ACK_MESSAGE (200151) is served here, PEEK,
NOTIFICATION and POLLING_INFO by pop_queries.py. A pop whose `bornTime` and
`pollTime` ended more than 500 ms ago is answered 210 "timeout too much", as
Apache's is (the client has given up on it); a `bornTime` of 0 is not checked.

Partial (issue 44): the pop's `initMode` is not read (a group without an offset
starts where its group's consumeFromMinEnable says); the request's `order` flag does not make a pop ordered (a group or
topic configured ordered does); `restNum` is 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ferry.model import retry_topic
from ferry.remoting import bodies, codes, pop_formats
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.broker.messaging.filters import TAG, SelectorRefused
from services.broker.pop import Popped, PopService
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps

MAX_POP_NUMS = 32  # Apache's limit on a pop's maxMsgNums
ORDER_REVIVE_QID = 999  # reviveQid of an ordered pop (KeyBuilder.POP_ORDER_REVIVE_QUEUE)
TIMEOUT_TOO_MUCH_MS = 500  # a pop this late past bornTime + pollTime: the client gave up
_I32 = {"low": -(2**31), "high": 2**31 - 1}


def handlers(deps: Deps) -> dict[int, Handler]:
    async def pop(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _pop)

    async def ack(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _ack)

    async def change(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _change)

    async def batch_ack(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _batch_ack)

    return {
        codes.POP_MESSAGE: pop,
        codes.ACK_MESSAGE: ack,
        codes.CHANGE_MESSAGE_INVISIBLETIME: change,
        codes.BATCH_ACK_MESSAGE: batch_ack,
    }


async def guarded(deps: Deps, command: Command, handle) -> Command:
    """`handle(deps, deps.pop, command)` on a master, with the pop codes' refusals
    (a slave: 16; bad fields, bodies and selectors: Apache's codes)."""
    try:
        deps.gate.check()
        if deps.pop is None:
            raise errors.PermissionDenied(
                f"broker {deps.config.broker_name} is a SLAVE: pop consumption is served by "
                "its master"
            )
        return await handle(deps, deps.pop, command)
    except convert.BadRequest as e:
        return command.answer(codes.MESSAGE_ILLEGAL, e.message)
    except bodies.BodyError as e:
        return command.answer(codes.SYSTEM_ERROR, f"the request's body does not parse: {e}")
    except SelectorRefused as e:
        return command.answer(
            codes.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed ({e.why})"
        )
    except errors.InvalidArgument as e:
        code = (
            codes.SUBSCRIPTION_PARSE_FAILED
            if e.field == "sub_expression"
            else codes.INVALID_PARAMETER
        )
        return command.answer(code, e.message)
    except errors.FerryError as e:
        return convert.error_answer(command, e)


# ---------------------------------------------------------------- pop


async def _pop(deps: Deps, pops: PopService, command: Command) -> Command:
    ext = command.ext
    group = convert.text(ext, "consumerGroup")
    topic = convert.text(ext, "topic")
    queue_id = convert.integer(ext, "queueId", **_I32)
    max_nums = convert.integer(ext, "maxMsgNums", **_I32)
    invisible_ms = convert.integer(ext, "invisibleTime", low=0)
    poll_ms = convert.integer(ext, "pollTime", required=False, low=0)
    expression = convert.text(ext, "exp", required=False) or "*"
    kind = (convert.text(ext, "expType", required=False) or TAG).upper()
    order = convert.boolean(ext, "order")
    revive_qid = ORDER_REVIVE_QID if order else 0
    born_ms = convert.integer(ext, "bornTime", required=False, low=0)
    if born_ms and deps.clock.wall_ms() - born_ms - poll_ms > TIMEOUT_TOO_MUCH_MS:
        return command.answer(
            codes.POLLING_TIMEOUT,
            f"the broker[{deps.config.broker_name}] pop message is timeout too much",
        )
    if max_nums > MAX_POP_NUMS:
        return command.answer(
            codes.INVALID_PARAMETER,
            f"the broker[{deps.config.broker_name}] pop message's num is greater than "
            f"{MAX_POP_NUMS}",
        )
    popped = await pops.pop(
        group,
        topic,
        None if queue_id < 0 else queue_id,
        max_nums,
        invisible_ms,
        poll_ms,
        expression,
        expression_type=kind,
    )
    records = await pops.record_bytes(popped) if popped else []
    kept = [(p, r) for p, r in zip(popped, records, strict=True) if r is not None]
    if not kept:
        return command.answer(
            codes.POLLING_TIMEOUT,
            "NO_MESSAGE_IN_QUEUE",
            ext=_pop_header(deps.clock.wall_ms(), invisible_ms, revive_qid, "", ""),
        )
    pop_time = kept[0][0].invisible_until_ms - invisible_ms
    start, offsets = _offset_infos([p for p, _ in kept])
    header = _pop_header(pop_time, invisible_ms, revive_qid, start, offsets)
    if order or any(p.delivery_attempt != p.message.reconsume_times + 1 for p, _ in kept):
        # Also without `order`: a group or topic configured ordered pops in order
        # here, and its redeliveries count in the pop state, not in the record's
        # reconsume times (ferry's proxy reads the count from here).
        header["orderCountInfo"] = _order_counts([p for p, _ in kept])
    return command.answer(codes.SUCCESS, "FOUND", ext=header, body=b"".join(r for _, r in kept))


def _pop_header(
    pop_time: int, invisible_ms: int, revive_qid: int, start: str, offsets: str
) -> dict[str, object]:
    return {
        "popTime": pop_time,
        "invisibleTime": invisible_ms,
        "reviveQid": revive_qid,
        "restNum": 0,
        "startOffsetInfo": start,
        "msgOffsetInfo": offsets,
    }


def _offset_infos(popped: Sequence[Popped]) -> tuple[str, str]:
    """startOffsetInfo and msgOffsetInfo of the messages, in the body's order."""
    return pop_formats.encode_offset_infos(
        (pop_formats.mark_of(p.message.topic), p.message.queue_id, p.message.queue_offset)
        for p in popped
    )


def _order_counts(popped: Sequence[Popped]) -> str:
    """orderCountInfo: per message its deliveries before this one (the client
    takes it as the message's reconsume times)."""
    return pop_formats.encode_order_counts(
        (
            pop_formats.mark_of(p.message.topic),
            p.message.queue_id,
            p.message.queue_offset,
            max(p.delivery_attempt - 1, 0),
        )
        for p in popped
    )


# ---------------------------------------------------------------- ack / change


def _named(ext: Mapping[str, str]) -> tuple[str, str, int, int, int]:
    """(group, topic, queue id, offset, deadline) an ack or re-timing names, from its
    header and `extraInfo`."""
    group = convert.text(ext, "consumerGroup")
    topic = convert.text(ext, "topic")
    queue_id = convert.integer(ext, "queueId", **_I32)
    offset = convert.integer(ext, "offset")
    extra = convert.text(ext, "extraInfo").split(" ")
    if len(extra) < 3:
        raise convert.BadRequest(
            "extraInfo", "not a POP_CK (expected 'startOffset popTime invisibleTime ...')"
        )
    pop_time = _number(extra[1], "extraInfo popTime")
    invisible = _number(extra[2], "extraInfo invisibleTime")
    return group, topic, queue_id, offset, pop_time + invisible


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.lstrip("-").isdecimal()) or len(text) > 20:
        raise convert.BadRequest(what, f"not an integer: {text[:24]!r}")
    return int(text)


def _check_queue(
    deps: Deps, command: Command, topic: str, queue_id: int, offset: int
) -> Command | None:
    """Apache's checks before an ack or a re-timing: the topic, the queue id, the offset."""
    config = deps.metadata.topics.get(topic)
    if config is None:
        return command.answer(
            codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
        )
    if not 0 <= queue_id < config.read_queue_nums:
        return command.answer(
            codes.MESSAGE_ILLEGAL,
            f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
            f"[{config.read_queue_nums}]",
        )
    low, high = deps.pulls.queue_offsets(topic, queue_id)
    if not low <= offset <= high:
        return command.answer(
            codes.NO_MESSAGE,
            f"offset is illegal, key:{topic}@{queue_id}, commit:{offset}, store:{low}~{high}",
        )
    return None


async def _ack(deps: Deps, pops: PopService, command: Command) -> Command:
    group, topic, queue_id, offset, until = _named(command.ext)
    refused = _check_queue(deps, command, topic, queue_id, offset)
    if refused is not None:
        return refused
    handle = pops.handle_at(group, topic, queue_id, offset, until)
    if handle is not None:
        await pops.ack(group, topic, [handle])
    return command.answer(codes.SUCCESS)


async def _batch_ack(deps: Deps, pops: PopService, command: Command) -> Command:
    """BATCH_ACK_MESSAGE: body `{"brokerName", "acks": [BatchAck]}`, each BatchAck
    in fastjson's short names: c group, t topic, r retry ("1": the group's pop
    retry topic of t), so start offset, q queue id, rq revive queue id, pt pop
    time, it invisible time, b the acknowledged offsets as Java's
    BitSet.toByteArray in Base64 (bit i: offset so + i). As Apache's: 208 with
    no acks; otherwise 0, and an entry for an unknown topic or queue, or an
    offset outside the queue, is skipped."""
    doc = bodies.loads(command.body) if command.body else None
    acks = doc.get("acks") if isinstance(doc, dict) else None
    if not isinstance(acks, list) or not acks:
        return command.answer(codes.NO_MESSAGE)
    handles: dict[tuple[str, str], list[str]] = {}
    for entry in acks:
        try:
            batch = pop_formats.BatchAck.from_json(entry)
        except pop_formats.PopFieldError as exc:
            raise convert.BadRequest(exc.field, exc.reason) from None
        group, topic, queue_id = batch.group, batch.topic, batch.queue_id
        if batch.mark == pop_formats.RETRY_MARK:
            topic = retry_topic(group, topic)
        until = batch.pop_time + batch.invisible_ms
        config = deps.metadata.topics.get(topic)
        if config is None or not 0 <= queue_id < config.read_queue_nums:
            continue
        low, high = deps.pulls.queue_offsets(topic, queue_id)
        for bit in batch.bits:
            offset = batch.start_offset + bit
            if not low <= offset <= high:
                continue
            handle = pops.handle_at(group, topic, queue_id, offset, until)
            if handle is not None:
                handles.setdefault((group, topic), []).append(handle)
    for (group, topic), named in handles.items():
        await pops.ack(group, topic, named)
    return command.answer(codes.SUCCESS)


async def _change(deps: Deps, pops: PopService, command: Command) -> Command:
    group, topic, queue_id, offset, until = _named(command.ext)
    invisible_ms = convert.integer(command.ext, "invisibleTime", low=0)
    refused = _check_queue(deps, command, topic, queue_id, offset)
    if refused is not None:
        return refused
    handle = pops.handle_at(group, topic, queue_id, offset, until)
    if handle is None:
        return command.answer(
            codes.NO_MESSAGE,
            f"the message at {topic}@{queue_id}:{offset} is not in flight for group {group} "
            "under that pop (acknowledged, expired or re-timed since): pop it again",
        )
    result = await pops.change_invisible_time(group, topic, handle, invisible_ms)
    if result.status != "OK":
        return command.answer(codes.NO_MESSAGE, result.reason)
    return command.answer(
        codes.SUCCESS,
        ext={
            "popTime": result.invisible_until_ms - invisible_ms,
            "invisibleTime": invisible_ms,
            "reviveQid": 0,
        },
    )
