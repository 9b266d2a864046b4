"""Offsets over RocketMQ's protocol: a group's committed offsets
(QUERY_CONSUMER_OFFSET 14, UPDATE_CONSUMER_OFFSET 15, often oneway) and a
queue's offsets (SEARCH_OFFSET_BY_TIMESTAMP 29, GET_MAX_OFFSET 30,
GET_MIN_OFFSET 31, GET_EARLIEST_MSG_STORETIME 32).

The committed offsets are the broker's one table (consumerOffset.json), the
one ferry.v1's QueryConsumerOffset and UpdateConsumerOffset use; the queue
offsets come from the store through the messaging use case, with the same
checks (the topic exists here, the queue is one of its queues).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ferry.model import check_name
from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime.errors import FerryError
from services.broker.remoting.convert import BadRequest, error_answer, integer, text
from services.broker.remoting.deps import Deps

log = logging.getLogger(__name__)

INT32 = (-(2**31), 2**31 - 1)


def queue_of(ext: Mapping[str, str]) -> tuple[str, int]:
    """(topic, queueId) of a request."""
    return text(ext, "topic"), integer(ext, "queueId", low=0, high=INT32[1])


def group_of(ext: Mapping[str, str]) -> str:
    group = text(ext, "consumerGroup")
    check_name(group, "consumerGroup")
    return group


def boundary_is_upper(ext: Mapping[str, str]) -> bool:
    """RocketMQ 5's boundaryType of a search by time ("lower" when absent)."""
    value = ext.get("boundaryType", "").lower()
    if value not in ("", "lower", "upper"):
        raise BadRequest("boundaryType", f"{value[:20]!r} is neither LOWER nor UPPER")
    return value == "upper"


class Offsets:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.table = deps.metadata.consumer_offsets

    async def query_consumer_offset(self, connection: Connection, request: Command) -> Command:
        """The group's committed offset. A group with none gets 0 while the
        queue still starts at offset 0 (Apache 4.9's rule, so a new group reads
        a young queue from its start), else QUERY_NOT_FOUND (the client then
        applies its consumeFromWhere)."""
        try:
            self.deps.gate.check()
            group = group_of(request.ext)
            topic, queue_id = queue_of(request.ext)
            low, _ = self.deps.pulls.queue_offsets(topic, queue_id)
            offset = self.table.query(group, topic, queue_id)
        except FerryError as exc:
            return error_answer(request, exc)
        if offset is None:
            if low > 0:
                return request.answer(
                    codes.QUERY_NOT_FOUND,
                    f"consumer group {group!r} has no committed offset for {topic}/{queue_id}, "
                    f"whose messages now start at {low}",
                )
            offset = 0
        return request.answer(codes.SUCCESS, ext={"offset": offset})

    async def update_consumer_offset(self, connection: Connection, request: Command) -> Command:
        try:
            self.deps.gate.check()
            group = group_of(request.ext)
            topic, queue_id = queue_of(request.ext)
            offset = integer(request.ext, "commitOffset", low=0)
            self.deps.pulls.queue_offsets(topic, queue_id)
            self.table.commit(group, topic, queue_id, offset)
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS)

    async def clone_group_offset(self, connection: Connection, request: Command) -> Command:
        """314 CLONE_GROUP_OFFSET (mqadmin cloneGroupOffset -s SRC -d DEST [-t TOPIC] [-o]):
        DEST's committed offsets become SRC's, topic by topic: the one named, else
        every topic SRC has offsets for here. A topic this broker does not hold is
        skipped; unless offline, so is one SRC's connected consumers do not
        subscribe while they subscribe others (Apache's rules). Where no topic is
        named, Apache copies nothing (it clones the empty topic's offsets); ferry
        copies each topic's."""
        try:
            self.deps.gate.check()
            source = text(request.ext, "srcGroup")
            dest = text(request.ext, "destGroup")
            check_name(source, "srcGroup")
            check_name(dest, "destGroup")
            topic = text(request.ext, "topic", required=False).strip()
            offline = request.ext.get("offline", "false").strip().lower() == "true"
            topics = [topic] if topic else self.table.topics_of(source)
            clients = self.deps.clients
            subscribing = any(m.subscriptions for m in clients.consumers(source))
            cloned = 0
            table, _ = self.table.snapshot()
            for name in topics:
                if self.deps.metadata.topics.get(name) is None:
                    continue
                if not offline and subscribing and clients.subscription(source, name) is None:
                    continue
                for queue_id, offset in sorted(table.get(f"{name}@{source}", {}).items()):
                    self.table.commit(dest, name, queue_id, offset)
                    cloned += 1
        except FerryError as exc:
            return error_answer(request, exc)
        log.info("cloned %d committed offsets of group %s to %s", cloned, source, dest)
        return request.answer(codes.SUCCESS)

    async def search_offset_by_timestamp(self, connection: Connection, request: Command) -> Command:
        try:
            self.deps.gate.check()
            topic, queue_id = queue_of(request.ext)
            timestamp = integer(request.ext, "timestamp")
            upper = boundary_is_upper(request.ext)
            offset = await self.deps.pulls.offset_by_time(topic, queue_id, timestamp, upper)
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS, ext={"offset": offset})

    async def get_max_offset(self, connection: Connection, request: Command) -> Command:
        return self._queue_offset(request, high=True)

    async def get_min_offset(self, connection: Connection, request: Command) -> Command:
        return self._queue_offset(request, high=False)

    def _queue_offset(self, request: Command, high: bool) -> Command:
        try:
            self.deps.gate.check()
            low, top = self.deps.pulls.queue_offsets(*queue_of(request.ext))
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS, ext={"offset": top if high else low})

    async def get_earliest_msg_storetime(self, connection: Connection, request: Command) -> Command:
        try:
            self.deps.gate.check()
            timestamp = await self.deps.pulls.earliest_store_time(*queue_of(request.ext))
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS, ext={"timestamp": timestamp})


def handlers(deps: Deps) -> dict[int, Handler]:
    offsets = Offsets(deps)
    return {
        codes.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
        codes.CLONE_GROUP_OFFSET: offsets.clone_group_offset,
        codes.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
        codes.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset_by_timestamp,
        codes.GET_MAX_OFFSET: offsets.get_max_offset,
        codes.GET_MIN_OFFSET: offsets.get_min_offset,
        codes.GET_EARLIEST_MSG_STORETIME: offsets.get_earliest_msg_storetime,
    }
