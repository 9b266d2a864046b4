"""Topic and subscription-group changes as records of the commit log
(enableFailover): a change is acknowledged once the in-sync set has it, and
whoever is elected next has every acknowledged change.

Without failover a slave copies its master's tables with the slave sync
(slave_sync.py), every 10 s. With failover that is not enough: a master
frozen or killed a few seconds after a topic was created leaves a follower
elected without the topic, whose full registration then removes the topic
from the name servers, with every acknowledged message in it. So a failover
master writes each change as a record of the system topic
`rmq_sys_ferry_metadata` (queue 0: topics, queue 1: subscription groups)
*before* it applies it, and answers the caller only once the records are
replicated as sends are (`replicate`: the SYNC_MASTER's in-sync wait).
Because the record precedes the change, every message sent to a new topic
follows the topic's record in the log: a member that holds the message holds
the record.

- **Record body** (UTF-8 JSON, no properties; this module owns the format):
  `{"op": "put", "topic": {...topics.json entry...}}`,
  `{"op": "delete", "topic": "NAME"}`, and the same with `"group"` for
  queue 1 (a subscriptionGroup.json entry, or the group's name).
- **Followers** apply the records in queue order as HA brings them
  (`follow`), and a member elected master applies whatever it has not yet
  (`catch_up`) before it takes a send. How far each queue is applied is
  kept in `metadataLog.json` (metadata.MetadataLogTable).
- **Slave sync still runs** (it is how a member whose log lacks old records
  gets them), but a table it brings replaces the local one only when the
  master's answer is at or past this member's applied position
  (`accept_snapshot`): a snapshot older than what the log already applied
  would undo a change.
- **Restoring topics.** A new master gives every topic its log has messages
  for a config if it has none (`restore_topics`, e.g. one created before
  failover was turned on), so its full registration never removes such a
  topic from the name servers. Topics the metadata log deleted stay deleted.

Not replicated this way: topics and groups the broker creates by itself
(retry and dead-letter topics, auto-created groups, system topics) and the
order flag from the name servers; a new master recreates them on use.
Ownership: the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from ferry.model import (
    SCHEDULE_TOPIC,
    DataVersion,
    SubscriptionGroupConfig,
    TopicConfig,
    is_system_topic,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import NotFound, Unavailable
from services.broker.metadata.tables import (
    METADATA_LOG_FILE,
    MetadataLogTable,
    group_from_json,
    group_to_json,
    topic_from_json,
    topic_to_json,
)
from services.broker.store import MessageIn, MessageStore, PutResult

log = logging.getLogger(__name__)

METADATA_TOPIC = "rmq_sys_ferry_metadata"
TOPICS_QUEUE = 0
GROUPS_QUEUE = 1
QUEUES = (TOPICS_QUEUE, GROUPS_QUEUE)
_KIND = {TOPICS_QUEUE: "topic", GROUPS_QUEUE: "group"}
_BATCH = 256
FOLLOW_WAIT_S = 1.0  # a follower's long poll on its queues (it wakes at each record)


class MetadataRecordError(ValueError):
    """A metadata record whose body is not one this module writes."""


# ---------------------------------------------------------------- the record body


def encode_change(
    queue_id: int, op: str, value: TopicConfig | SubscriptionGroupConfig | str
) -> bytes:
    kind = _KIND[queue_id]
    if op == "put":
        doc = topic_to_json(value) if queue_id == TOPICS_QUEUE else group_to_json(value)  # type: ignore[arg-type]
    else:
        doc = value
    return json.dumps({"op": op, kind: doc}, sort_keys=True).encode()


def decode_change(queue_id: int, body: bytes) -> tuple[str, Any]:
    """`(op, value)`: ("put", TopicConfig | SubscriptionGroupConfig) or
    ("delete", name).

    Raises:
        MetadataRecordError: anything else.
    """
    kind = _KIND.get(queue_id)
    if kind is None:
        raise MetadataRecordError(f"queue {queue_id} of {METADATA_TOPIC} holds no metadata")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataRecordError(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("op") not in ("put", "delete") or kind not in doc:
        raise MetadataRecordError(f"the body is not a {kind} put or delete")
    if doc["op"] == "delete":
        if not isinstance(doc[kind], str) or not doc[kind]:
            raise MetadataRecordError(f"a {kind} delete needs the {kind}'s name")
        return "delete", doc[kind]
    try:
        value = topic_from_json(doc[kind]) if kind == "topic" else group_from_json(doc[kind])
    except (TypeError, ValueError, KeyError) as exc:
        raise MetadataRecordError(f"bad {kind} entry: {exc}") from None
    return "put", value


# ---------------------------------------------------------------- the log


class Fence(Protocol):
    """Automatic failover's fence on a master: messaging's `Fence`
    (services.broker.messaging.contracts), declared again here since metadata/
    may not import messaging/."""

    def check_accepting(self) -> None: ...

    def check_acknowledging(self) -> None: ...


class MetadataLog:
    def __init__(
        self,
        store: MessageStore,
        metadata,  # services.broker.metadata.BrokerMetadata
        config_dir: Path,
        clock: Clock,
        replicate: Callable[[PutResult], Awaitable[bool]] | None = None,
        fence: Fence | None = None,
    ) -> None:
        """`replicate(result)`: True once the in-sync set has the record
        (None: nothing to wait for); `fence`: raises when this master must
        not take or acknowledge a change (services.broker.failover.lease.Fence)."""
        self.store = store
        self.metadata = metadata
        self.replicate = replicate
        self.fence = fence
        self.table = MetadataLogTable(
            Path(config_dir) / METADATA_LOG_FILE, clock, on_fault=store.failstop.trip
        )
        self.bad_records = 0

    def position(self, queue_id: int) -> int:
        """Records of `queue_id` applied here (a queue offset)."""
        return self.table.applied(queue_id)

    # ------------------------------------------------------------ opening

    def open(self) -> None:
        """After the store opened (and was cut to its leader's log, if it
        was): a position past the end of its queue goes back to that end, so
        the records written again after a cut are applied."""
        clamped = {}
        for queue_id in QUEUES:
            end = self._queue_end(queue_id)
            if self.position(queue_id) > end:
                log.info(
                    "metadata log: %ss applied up to %d, the log now ends at %d",
                    _KIND[queue_id], self.position(queue_id), end,
                )  # fmt: skip
                clamped[queue_id] = end
        if clamped:
            self.table.set(clamped)

    def _queue_end(self, queue_id: int) -> int:
        queue = self.store.queue_view(METADATA_TOPIC, queue_id)
        return queue.max_offset if queue is not None else 0

    # ------------------------------------------------------------ master: changes

    async def put_topic(self, config: TopicConfig) -> DataVersion:
        self.metadata.topics.check(config)
        deleted = self.table.deleted_topics - {config.topic_name}
        return await self._change(
            TOPICS_QUEUE, "put", config, lambda: self.metadata.topics.put(config), deleted
        )

    async def delete_topic(self, topic: str) -> DataVersion:
        if self.metadata.topics.get(topic) is None:
            raise NotFound(f"topic {topic!r} does not exist on this broker")
        return await self._change(
            TOPICS_QUEUE, "delete", topic, lambda: self._delete_topic(topic),
            self.table.deleted_topics | {topic},
        )  # fmt: skip

    async def put_group(self, config: SubscriptionGroupConfig) -> DataVersion:
        self.metadata.subscription_groups.check(config)
        return await self._change(
            GROUPS_QUEUE, "put", config, lambda: self.metadata.subscription_groups.put(config)
        )

    async def delete_group(self, group: str) -> DataVersion:
        if self.metadata.subscription_groups.get(group) is None:
            raise NotFound(f"subscription group {group!r} does not exist on this broker")
        return await self._change(GROUPS_QUEUE, "delete", group, lambda: self._delete_group(group))

    async def _change(
        self,
        queue_id: int,
        op: str,
        value,
        apply: Callable[[], DataVersion],
        deleted: frozenset[str] | None = None,
    ) -> DataVersion:
        """Append the record, apply the change, then wait for the in-sync set.
        Nothing awaits between the append and the apply: a send to a topic
        the change creates lands after its record."""
        if self.fence is not None:
            self.fence.check_accepting()
        body = encode_change(queue_id, op, value)
        result = self.store.append_own(
            METADATA_TOPIC, queue_id, [MessageIn(body=body, properties=b"")]
        )
        version = apply()
        self.table.set({queue_id: result.queue_offset + 1}, deleted)
        if not await self.store.wait_stored(result.end_offset):
            raise Unavailable(
                f"the {_KIND[queue_id]} change was applied on this master but its flush timed "
                "out; retry (the change is idempotent)"
            )
        if self.replicate is not None and not await self.replicate(result):
            raise Unavailable(
                f"the {_KIND[queue_id]} change was applied on this master but its in-sync "
                "replicas did not confirm it within slaveTimeout; retry (the change is "
                "idempotent)"
            )
        if self.fence is not None:
            self.fence.check_acknowledging()
        return version

    def _delete_topic(self, topic: str) -> DataVersion:
        version = self.metadata.topics.delete(topic)
        self.store.delete_topic(topic)
        self.metadata.consumer_offsets.remove_topic(topic)
        return version

    def _delete_group(self, group: str) -> DataVersion:
        version = self.metadata.subscription_groups.delete(group)
        self.metadata.consumer_offsets.remove_group(group)
        return version

    # ------------------------------------------------------------ applying

    async def catch_up(self) -> int:
        """Apply every record this member's log has and has not applied;
        returns how many were applied."""
        applied = 0
        for queue_id in QUEUES:
            while True:
                queue = self.store.queue_view(METADATA_TOPIC, queue_id)
                before = self.position(queue_id)
                if queue is None or before >= queue.max_offset:
                    break
                start = max(before, queue.min_offset)
                entries = queue.entries(start, _BATCH)
                if not entries:
                    break
                records = await self.store.read_entries(entries)
                if self.position(queue_id) != before:
                    continue  # a slave-sync snapshot moved the position meanwhile
                deleted = set(self.table.deleted_topics)
                for (commit_offset, _, _), rec in zip(entries, records, strict=True):
                    if rec is None:
                        log.error(
                            "metadata log: no readable record at commit offset %d; skipped",
                            commit_offset,
                        )
                        self.bad_records += 1
                        continue
                    try:
                        op, value = decode_change(queue_id, rec.body)
                    except MetadataRecordError as exc:
                        log.error(
                            "metadata log: record at commit offset %d skipped: %s",
                            commit_offset,
                            exc,
                        )
                        self.bad_records += 1
                        continue
                    self._apply(queue_id, op, value, deleted)
                    applied += 1
                self.table.set({queue_id: start + len(entries)}, frozenset(deleted))
        return applied

    def _apply(self, queue_id: int, op: str, value, deleted: set[str]) -> None:
        if queue_id == TOPICS_QUEUE:
            if op == "put":
                self.metadata.topics.put(value)
                deleted.discard(value.topic_name)
                log.info("metadata log: topic %s applied", value.topic_name)
            else:
                deleted.add(value)
                if self.metadata.topics.get(value) is not None:
                    self._delete_topic(value)
                else:
                    self.store.delete_topic(value)
                log.info("metadata log: topic %s deleted", value)
        elif op == "put":
            self.metadata.subscription_groups.put(value)
        elif self.metadata.subscription_groups.get(value) is not None:
            self._delete_group(value)

    async def follow(self) -> None:
        """A follower's task: apply records as HA brings them."""
        while True:
            await self.catch_up()
            waits = [
                asyncio.ensure_future(
                    self.store.wait_for_messages(METADATA_TOPIC, q, self.position(q), FOLLOW_WAIT_S)
                )
                for q in QUEUES
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    # ------------------------------------------------------------ a new master

    async def take_over(self) -> None:
        """A member elected master, before it takes a send: apply what its
        log has, then restore the topics it has messages for."""
        await self.store.wait_dispatched()  # recovery may leave a tail
        count = await self.catch_up()
        if count:
            log.warning("metadata log: applied %d change(s) before taking sends", count)
        self.restore_topics()

    def restore_topics(self) -> list[TopicConfig]:
        """Give a config to every topic this log has messages for and that has
        none (deleted ones excepted); returns those restored."""
        topics = self.metadata.topics
        deleted = self.table.deleted_topics
        queues: dict[str, set[int]] = {}
        for topic, queue_id, max_offset in self.store.queue_ends():
            if max_offset > 0:
                queues.setdefault(topic, set()).add(queue_id)
        restored = []
        for topic, ids in sorted(queues.items()):
            if (
                topic in deleted
                or topics.get(topic) is not None
                or topic in (METADATA_TOPIC, SCHEDULE_TOPIC)
                or is_system_topic(topic)
            ):
                continue
            count = max(ids) + 1
            config = TopicConfig(topic, read_queue_nums=count, write_queue_nums=count, perm=6)
            topics.put(config)
            restored.append(config)
            log.warning(
                "topic %s has messages in this log but no config here: restored with %d "
                "queues, perm 6 (check it with `ferry topic list`)",
                topic,
                count,
            )
        return restored

    # ------------------------------------------------------------ slave sync

    def accept_snapshot(self, queue_id: int, position: int) -> bool:
        """Whether a table the master sent at its `position` may replace ours."""
        return position >= self.position(queue_id)

    def adopt_snapshot(
        self, queue_id: int, position: int, deleted: frozenset[str] | None = None
    ) -> None:
        self.table.set({queue_id: position}, deleted)
