"""Receive, ack, change-invisible-time and dead-lettering on a broker's
RocketMQ-protocol port, as Apache's proxy does them: POP_MESSAGE (200050),
ACK_MESSAGE (200051), BATCH_ACK_MESSAGE (200151), CHANGE_MESSAGE_INVISIBLETIME
(200053) and CONSUMER_SEND_MSG_BACK (36), over the one pipelined connection per broker that
sends use (`RemotingSends.call`).

The SDK's receipt handle is then Apache's proxy's (ReceiptHandle.encode): nine
space-separated fields, "startOffset retrieveTime invisibleTime reviveQid
topicType brokerName queueId offset commitLogOffset", built from the pop
answer's header (popTime, invisibleTime, reviveQid, startOffsetInfo) and the
record. Its first eight fields are the POP_CK a broker reads from an ack's
`extraInfo`; topicType is 1 for a message of the group's pop retry topic. A
ferry.v1 handle has eight fields (`ferry.receipt_handle`), so the two never
mix: `PopHandle.decode` answers None for anything but nine fields.

A broker's refusal raises `SendRefused`, read as the ferry.v1 error the broker
gives for the same refusal, so the servicer maps both doors' errors with one
table (`convert.error_code`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

import grpc

from ferry import record
from ferry.model import retry_topic
from ferry.remoting import bodies, codes, pop_formats
from services.proxy.remoting_sends import RemotingSends, SendRefused, refusal_status

RETRY_TOPIC_TYPE = pop_formats.RETRY_MARK  # ReceiptHandle.RETRY_TOPIC: the pop retry topic
MAX_HANDLE_CHARS = 1024
MAX_BATCH_BITS = 1 << 16  # a BatchAck's bit set past this: acknowledged one by one


class PopHandle(NamedTuple):
    """Apache's proxy's receipt handle (ReceiptHandle)."""

    start_offset: int
    retrieve_time: int  # the pop's popTime, epoch ms
    invisible_ms: int
    revive_qid: int
    topic_type: str  # "0" the topic, "1" its pop retry topic
    broker_name: str
    queue_id: int
    offset: int
    commit_offset: int

    def encode(self) -> str:
        return " ".join(map(str, self))

    @property
    def visible_at_ms(self) -> int:
        return self.retrieve_time + self.invisible_ms

    def real_topic(self, group: str, topic: str) -> str:
        """The topic the message is in: its pop retry topic for a redelivery."""
        return retry_topic(group, topic) if self.topic_type == RETRY_TOPIC_TYPE else topic

    @classmethod
    def decode(cls, text: object) -> PopHandle | None:
        """The handle, or None when `text` is not one (a ferry.v1 handle, junk)."""
        if not isinstance(text, str) or len(text) > MAX_HANDLE_CHARS:
            return None
        parts = text.split(" ")
        if len(parts) != 9 or not parts[5]:
            return None
        numbers = parts[:5] + parts[6:]
        if not all(p.isascii() and p.lstrip("-").isdecimal() and len(p) <= 20 for p in numbers):
            return None
        start, retrieve, invisible, revive, _, queue_id, offset, commit = map(int, numbers)
        return cls(start, retrieve, invisible, revive, parts[4], parts[5], queue_id, offset, commit)


class Popped(NamedTuple):
    message: record.StoredMessage
    handle: PopHandle
    attempt: int  # this delivery's number, 1 for the first


class RemotingPops:
    def __init__(self, links: RemotingSends) -> None:
        self._links = links

    async def pop(
        self,
        addr: str,
        broker_name: str,
        group: str,
        topic: str,
        max_nums: int,
        invisible_ms: int,
        wait_ms: int,
        expression: str,
        expression_type: str,
        timeout_s: float,
    ) -> list[Popped]:
        """Up to `max_nums` messages of every queue of the broker, waiting up to
        `wait_ms` for one; [] when none came. Raises SendRefused."""
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": "-1",  # every queue of the broker, as Apache's proxy pops
            "maxMsgNums": str(max_nums),
            "invisibleTime": str(invisible_ms),
            "pollTime": str(wait_ms),
            "bornTime": str(int(time.time() * 1000)),
            "initMode": "1",  # ConsumeInitMode.MAX, what Apache's proxy asks
            "expType": expression_type or "TAG",
            "exp": expression or "*",
            "order": "false",
        }
        answer = await self._links.call(
            addr, codes.POP_MESSAGE, ext, timeout_s=timeout_s, what="pop"
        )
        if answer.code == codes.POLLING_TIMEOUT:
            return []
        if answer.code != codes.SUCCESS:
            raise _refused(answer.code, answer.remark)
        try:
            return _popped(answer.ext, answer.body, broker_name)
        except (KeyError, ValueError, record.RecordError) as exc:
            raise SendRefused(
                grpc.StatusCode.INTERNAL, f"{addr} answered a pop this proxy cannot read: {exc}"
            ) from None

    async def ack(self, addr: str, group: str, topic: str, handle: PopHandle) -> None:
        """Raises SendRefused."""
        answer = await self._links.call(
            addr, codes.ACK_MESSAGE, _named(group, topic, handle), what="ack"
        )
        if answer.code != codes.SUCCESS:
            raise _refused(answer.code, answer.remark)

    async def batch_ack(
        self, addr: str, group: str, topic: str, handles: Sequence[PopHandle]
    ) -> None:
        """Acknowledge several messages of one broker in one BATCH_ACK_MESSAGE
        (200151), as Apache's proxy does with batch acks on: one BatchAck per
        (topic type, queue, start offset, pop) with the offsets as a bit set from the
        start offset. The broker answers for the batch, not per message (an ack of a
        message no longer in flight changes nothing there, as a single ack's).
        Raises SendRefused."""
        answer = await self._links.call(
            addr,
            codes.BATCH_ACK_MESSAGE,
            {},
            bodies.dumps(batch_ack_body(group, topic, handles)),
            what="batch ack",
        )
        if answer.code != codes.SUCCESS:
            raise _refused(answer.code, answer.remark)

    async def change_invisible(
        self, addr: str, group: str, topic: str, handle: PopHandle, invisible_ms: int
    ) -> PopHandle:
        """The message's new handle. Raises SendRefused."""
        ext = _named(group, topic, handle)
        ext["invisibleTime"] = str(invisible_ms)
        answer = await self._links.call(
            addr, codes.CHANGE_MESSAGE_INVISIBLETIME, ext, what="invisible-time change"
        )
        if answer.code != codes.SUCCESS:
            raise _refused(answer.code, answer.remark)
        try:
            pop_time = int(answer.ext["popTime"])
            invisible = int(answer.ext["invisibleTime"])
            revive_qid = int(answer.ext.get("reviveQid", "0"))
        except (KeyError, ValueError):
            raise SendRefused(
                grpc.StatusCode.INTERNAL, f"{addr} answered a re-timing without its popTime"
            ) from None
        return handle._replace(
            retrieve_time=pop_time, invisible_ms=invisible, revive_qid=revive_qid
        )

    async def to_dead_letters(
        self, addr: str, group: str, topic: str, handle: PopHandle, message_id: str
    ) -> None:
        """Copy the message to the group's DLQ (CONSUMER_SEND_MSG_BACK, delay level
        -1), then acknowledge it, as Apache's proxy does. Raises SendRefused."""
        ext = {
            "offset": str(handle.commit_offset),
            "group": group,
            "delayLevel": "-1",
            "originMsgId": message_id,
            "originTopic": handle.real_topic(group, topic),
            "unitMode": "false",
            "maxReconsumeTimes": "0",
        }
        answer = await self._links.call(
            addr, codes.CONSUMER_SEND_MSG_BACK, ext, what="dead-letter copy"
        )
        if answer.code != codes.SUCCESS:
            raise _refused(answer.code, answer.remark)
        await self.ack(addr, group, topic, handle)


def batch_ack_body(group: str, topic: str, handles: Sequence[PopHandle]) -> dict:
    """BatchAckMessageRequestBody (ferry.remoting.pop_formats): one BatchAck per
    (topic type, queue, start offset, pop), `t` the topic the consumer asked for."""
    runs: dict[tuple[str, int, int, int, int, int], list[int]] = {}
    for h in handles:
        key = (h.topic_type, h.queue_id, h.start_offset, h.retrieve_time, h.invisible_ms,
               h.revive_qid)  # fmt: skip
        runs.setdefault(key, []).append(h.offset - h.start_offset)
    acks = [
        pop_formats.BatchAck(
            group, topic, kind, start, queue_id, revive_qid, pop_time, invisible, tuple(bits)
        ).to_json()
        for (kind, queue_id, start, pop_time, invisible, revive_qid), bits in runs.items()
    ]
    return {"acks": acks}


def batchable(handle: PopHandle) -> bool:
    """Whether a handle's offset fits a BatchAck's bit set (its start offset is the
    lowest of its queue in that pop, so the bit is small)."""
    return 0 <= handle.offset - handle.start_offset < MAX_BATCH_BITS


def _named(group: str, topic: str, handle: PopHandle) -> dict[str, str]:
    """The header fields naming one in-flight message (ack and re-timing)."""
    return {
        "consumerGroup": group,
        "topic": handle.real_topic(group, topic),
        "queueId": str(handle.queue_id),
        "extraInfo": handle.encode(),
        "offset": str(handle.offset),
    }


def _refused(code: int, remark: str) -> SendRefused:
    remark = remark or f"refused with code {code}"
    if code == codes.SUBSCRIPTION_PARSE_FAILED:
        # As the broker's ferry.v1 port words a selector it cannot compile.
        return SendRefused(grpc.StatusCode.INVALID_ARGUMENT, f"sub_expression: {remark}")
    if code in (codes.INVALID_PARAMETER, codes.MESSAGE_ILLEGAL):
        return SendRefused(grpc.StatusCode.INVALID_ARGUMENT, remark)
    if code == codes.NO_MESSAGE:
        return SendRefused(grpc.StatusCode.FAILED_PRECONDITION, remark)
    if code == codes.SUBSCRIPTION_GROUP_NOT_EXIST:
        return SendRefused(grpc.StatusCode.NOT_FOUND, f"consumer group: {remark}")
    return SendRefused(refusal_status(code, remark), remark)


def _popped(ext: dict[str, str], body: bytes, broker_name: str) -> list[Popped]:
    """The messages of a pop answer, each with its handle and delivery number."""
    pop_time = int(ext["popTime"])
    invisible = int(ext["invisibleTime"])
    revive_qid = int(ext.get("reviveQid", "0"))
    starts = pop_formats.decode_start_offsets(ext.get("startOffsetInfo", ""))
    orders = pop_formats.decode_order_counts(ext.get("orderCountInfo", ""))
    out: list[Popped] = []
    pos = 0
    while pos < len(body):
        size = record.peek(body[pos : pos + 64])
        if not isinstance(size, int) or size <= 0 or pos + size > len(body):
            raise ValueError(f"no whole record at byte {pos} of the pop's body")
        m = record.decode_stored(body, pos, size)
        pos += size
        mark = pop_formats.mark_of(m.topic)
        start = starts.get((mark, m.queue_id), m.queue_offset)
        handle = PopHandle(
            start, pop_time, invisible, revive_qid, mark, broker_name,
            m.queue_id, m.queue_offset, m.commit_offset,
        )  # fmt: skip
        before = orders.get((mark, m.queue_id, m.queue_offset), m.reconsume_times)
        out.append(Popped(m, handle, before + 1))
    return out
