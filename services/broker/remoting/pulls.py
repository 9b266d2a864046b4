"""Pulls over RocketMQ's protocol: PULL_MESSAGE (11) and LITE_PULL_MESSAGE
(361, 5.x's lite pull consumer; the same request).

A pull goes through the same use case as ferry.v1's PullMessage
(`PullService.pull`: readable topic and queue, slave reads and the
suggested broker id, long polling on the store's arrival signal, tag
filtering by consume-queue tag hash), asking for the records as stored: the
answer's body is the store's bytes, back to back, never re-encoded.

The request's `sysFlag`:
* 0x1 commit offset: `commitOffset` goes to the group's offset table (the
  same table ferry.v1 and QUERY/UPDATE_CONSUMER_OFFSET use), not on slaves;
* 0x2 suspend: wait up to `suspendTimeoutMillis` for a message;
* 0x4 subscription: filter by the request's `subscription` and
  `expressionType`; without it, by the subscription the group's heartbeats
  announced for the topic (none: 24 SUBSCRIPTION_NOT_EXIST, as RocketMQ).
An SQL92 subscription selects by the messages' properties when the broker
runs with enablePropertyFilter=true, as Apache's does; otherwise it is refused
with 1 and Apache's words. A selector that does not compile is answered 23
SUBSCRIPTION_PARSE_FAILED when the pull carries it, 27 FILTER_DATA_NOT_EXIST
when a heartbeat announced it (Apache's answers). Answers are capped as 4.9
caps them from memory: 32 messages, 256 KiB (the first record always fits).

Answers: 0 FOUND (body), 19 NOT_FOUND, 20 RETRY_IMMEDIATELY (the entries read
matched no tag), 21 OFFSET_MOVED (below the queue's first offset, or beyond
its last; a slave says 20 instead and keeps the consumer's offset, as
RocketMQ's slaves do); `suggestWhichBrokerId`, `nextBeginOffset`, `minOffset`
and `maxOffset` are filled on every answer, errors included (Java decodes
them whatever the code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.broker.messaging.clients import TAG
from services.broker.messaging.filters import SelectorRefused
from services.broker.messaging.pull import GetStatus
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
MAX_MESSAGES = 32  # 4.9's maxTransferCountOnMessageInMemory
MAX_BYTES = 256 * 1024  # 4.9's maxTransferBytesOnMessageInMemory

_CODES = {
    GetStatus.FOUND: codes.SUCCESS,
    GetStatus.NO_NEW_MSG: codes.PULL_NOT_FOUND,
    GetStatus.NO_MATCHED_MSG: codes.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_MOVED: codes.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_ILLEGAL: codes.PULL_OFFSET_MOVED,
}
# RocketMQ's GetMessageStatus names, as its answers' remarks carry them.
_REMARKS = {
    GetStatus.FOUND: "FOUND",
    GetStatus.NO_NEW_MSG: "OFFSET_OVERFLOW_ONE",
    GetStatus.NO_MATCHED_MSG: "NO_MATCHED_MESSAGE",
    GetStatus.OFFSET_MOVED: "OFFSET_TOO_SMALL",
    GetStatus.OFFSET_ILLEGAL: "OFFSET_OVERFLOW_BADLY",
}


# not frozen: one per send or pull, and frozen __init__ costs ~5x
@dataclasses.dataclass(slots=True)
class PullHeader:
    """PullMessageRequestHeader."""

    group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = MAX_MESSAGES
    sys_flag: int = 0
    commit_offset: int = -1
    suspend_timeout_ms: int = 0
    subscription: str = ""
    sub_version: int = 0
    expression_type: str = TAG

    @property
    def commits(self) -> bool:
        return bool(self.sys_flag & FLAG_COMMIT_OFFSET)

    @property
    def suspends(self) -> bool:
        return bool(self.sys_flag & FLAG_SUSPEND)

    @property
    def subscribes(self) -> bool:
        return bool(self.sys_flag & FLAG_SUBSCRIPTION)


def parse_pull_header(ext: Mapping[str, str]) -> PullHeader:
    """The pull's header fields, checked.

    Raises:
        BadRequest: naming the field that is missing or malformed.
    """
    i32 = {"low": -(2**31), "high": 2**31 - 1}
    return PullHeader(
        group=convert.text(ext, "consumerGroup"),
        topic=convert.text(ext, "topic"),
        queue_id=convert.integer(ext, "queueId", **i32),
        queue_offset=convert.integer(ext, "queueOffset"),
        max_msg_nums=convert.integer(
            ext, "maxMsgNums", required=False, default=MAX_MESSAGES, **i32
        ),
        sys_flag=convert.integer(ext, "sysFlag", required=False, **i32),
        commit_offset=convert.integer(ext, "commitOffset", required=False, default=-1),
        suspend_timeout_ms=convert.integer(ext, "suspendTimeoutMillis", required=False, low=0),
        subscription=convert.text(ext, "subscription", required=False),
        sub_version=convert.integer(ext, "subVersion", required=False),
        expression_type=convert.text(ext, "expressionType", required=False, default=TAG) or TAG,
    )


def handlers(deps: Deps) -> dict[int, Handler]:
    async def pull(connection: Connection, command: Command) -> Command:
        try:
            header = parse_pull_header(command.ext)
        except convert.BadRequest as e:
            return command.answer(codes.SYSTEM_ERROR, e.message, ext=_positions(command.ext))
        try:
            return await _pull(deps, command, header)
        except SelectorRefused as e:
            if header.subscribes:
                code, text = (
                    codes.SUBSCRIPTION_PARSE_FAILED,
                    "parse the consumer's subscription failed",
                )
            else:
                code = codes.FILTER_DATA_NOT_EXIST
                text = (
                    "The broker's consumer filter data is not exist!Your expression may be wrong!"
                )
            return command.answer(code, f"{text} ({e.why})", ext=_positions(command.ext))
        except errors.InvalidArgument as e:
            code = codes.SYSTEM_ERROR
            if e.field == "sub_expression":
                code = codes.SUBSCRIPTION_PARSE_FAILED
            return command.answer(code, e.message, ext=_positions(command.ext))
        except errors.FerryError as e:
            return convert.error_answer(command, e, ext=_positions(command.ext))

    return {codes.PULL_MESSAGE: pull, codes.LITE_PULL_MESSAGE: pull}


async def _pull(deps: Deps, command: Command, header: PullHeader) -> Command:
    deps.gate.check()
    pulls = deps.pulls
    if header.subscribes:
        expression, kind = header.subscription or "*", header.expression_type.upper()
    else:
        sub = deps.clients.subscription(header.group, header.topic)
        if sub is None:
            return command.answer(
                codes.SUBSCRIPTION_NOT_EXIST,
                f"the consumer's subscription not exist: no member of group {header.group} "
                f"announced a subscription to {header.topic} in a heartbeat to this broker; send "
                "HEART_BEAT first, or pull with the subscription flag (0x4)",
                ext=_positions(command.ext),
            )
        if sub.version < header.sub_version:
            return command.answer(
                codes.SUBSCRIPTION_NOT_LATEST,
                f"the consumer's subscription not latest: group {header.group} announced "
                f"subVersion {sub.version} for {header.topic}, the pull says "
                f"{header.sub_version}; heartbeat again",
                ext=_positions(command.ext),
            )
        expression, kind = sub.expression, sub.expression_type
    commit = None
    if header.commits and header.commit_offset >= 0 and not deps.config.is_slave:
        # Stored once the pull has passed its checks, before any wait: an
        # UPDATE_CONSUMER_OFFSET arriving while this pull waits must not be
        # overwritten by this older offset.
        def commit() -> None:
            deps.metadata.consumer_offsets.commit(
                header.group, header.topic, header.queue_id, header.commit_offset
            )

    outcome = await pulls.pull(
        header.group,
        header.topic,
        header.queue_id,
        header.queue_offset,
        max(header.max_msg_nums, 0),
        header.suspend_timeout_ms if header.suspends else 0,
        expression,
        expression_type=kind,
        raw=True,
        max_count=MAX_MESSAGES,
        max_bytes=MAX_BYTES,
        on_checked=commit,
    )
    result = outcome.result
    code = _CODES[result.status]
    next_offset = result.next_begin_offset
    if code == codes.PULL_OFFSET_MOVED and deps.config.is_slave:
        # A slave may lag its master: it does not move the consumer's offset.
        code, next_offset = codes.PULL_RETRY_IMMEDIATELY, header.queue_offset
    ext = {
        "suggestWhichBrokerId": outcome.suggest_which_broker_id,
        "nextBeginOffset": next_offset,
        "minOffset": result.min_offset,
        "maxOffset": result.max_offset,
    }
    return command.answer(code, _REMARKS[result.status], ext=ext, body=result.raw)


def _positions(ext: Mapping[str, str]) -> dict[str, object]:
    """The response fields an error answer carries too: the consumer stays
    where it was."""
    offset = ext.get("queueOffset", "0")
    return {
        "suggestWhichBrokerId": 0,
        "nextBeginOffset": offset if offset.lstrip("-").isdigit() else "0",
        "minOffset": 0,
        "maxOffset": 0,
    }
