"""Delayed messages: the scheduler that re-publishes them when due.

A send with the `DELAY` property (level 1..18) is stored in the system topic
`SCHEDULE_TOPIC_XXXX`, queue `level - 1`, with its real topic and queue in the
`REAL_TOPIC` / `REAL_QID` properties; the dispatcher puts the time it is due
(store time + the level's delay, ms) in its consume-queue entry. This
scheduler walks each level's queue in order and, for every entry that is due,
appends a copy to the real topic and queue and advances that level's offset in the delay-offset table (`delayOffset.json`,
what `SlaveSync.GetAllDelayOffset` serves). Within a level, messages are due
in queue order, so the walk stops at the first entry not yet due.

The copy keeps every property, `DELAY`, `REAL_TOPIC` and `REAL_QID` included, as
Apache 4.9's copy does (its ScheduleMessageService writes the property string it
took before clearing DELAY): consumers and tests that read a delayed message's
DELAY find it.

Delivery is at least once: the table is persisted every few seconds and at
shutdown, so a crash between a re-publish and the next persist re-publishes
those messages after restart (RocketMQ behaves the same way).

Runs on the event loop thread; a master runs it, a slave does not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ferry import record
from ferry.model import PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from ferry.runtime.clock import Clock
from services.broker.messaging.rules import TopicLookup, real_destination
from services.broker.store import MessageIn, MessageStore

log = logging.getLogger(__name__)

BATCH = 256


class DelayOffsets(Protocol):
    def get(self, level: int) -> int: ...

    def set(self, level: int, offset: int) -> None: ...


class DelayScheduler:
    def __init__(
        self,
        store: MessageStore,
        offsets: DelayOffsets,
        topics: TopicLookup,
        clock: Clock,
        poll_interval_s: float = 0.1,
    ) -> None:
        self.store = store
        self.offsets = offsets
        self.topics = topics
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.delivered = 0
        self.dropped = 0

    @property
    def levels(self) -> int:
        return len(self.store.delay_levels_s)

    async def run(self) -> None:
        while True:
            try:
                await self.deliver_due()
            except Exception:  # keep delivering; the next round retries
                log.exception("delay scheduler round failed")
            await asyncio.sleep(self.poll_interval_s)

    async def deliver_due(self) -> int:
        """Re-publish every message due now; returns how many."""
        now = self.clock.wall_ms()
        delivered = 0
        for level in range(1, self.levels + 1):
            delivered += await self._deliver_level(level, now)
        return delivered

    def pending(self, level: int) -> int:
        """Messages of a level not yet re-published."""
        return max(
            0, self.store.queue_max_offset(SCHEDULE_TOPIC, level - 1) - self.offsets.get(level)
        )

    async def _deliver_level(self, level: int, now: int) -> int:
        queue = self.store.queue_view(SCHEDULE_TOPIC, level - 1)
        if queue is None:
            return 0
        offset = max(self.offsets.get(level), queue.min_offset)
        delivered = 0
        while offset < queue.max_offset:
            entries = queue.entries(offset, BATCH)
            if not entries:
                break
            for commit_offset, size, due_ms in entries:
                if due_ms > now:
                    return delivered
                if commit_offset + size > self.store.confirm_offset:
                    return delivered
                self._republish(self.store.read_record(commit_offset, size), level)
                offset += 1
                self.offsets.set(level, offset)
                delivered += 1
            await asyncio.sleep(0)
        return delivered

    def _republish(self, stored: record.Record, level: int) -> None:
        properties = dict(stored.properties)
        destination = real_destination(dict(properties), self.topics)
        if destination is None:
            self.dropped += 1
            log.warning(
                "delayed message at commit offset %d: its topic %r is gone; dropped",
                stored.commit_offset,
                stored.properties.get(PROPERTY_REAL_TOPIC, ""),
            )
            return
        real_topic, queue_id = destination
        message = MessageIn(
            body=stored.body,
            properties=record.encode_properties(properties),
            flag=stored.flag,
            born_timestamp=stored.born_timestamp,
            born_host=record.pack_host(stored.born_host),
            # The body as stored: a client-compressed one stays compressed,
            # so its sysFlag (compression bits) travels with it.
            sys_flag=stored.sys_flag,
            reconsume_times=stored.reconsume_times,
        )
        self.store.append_due(real_topic, queue_id, [message])
        self.delivered += 1
        log.debug("delayed message level=%d delivered to %s/%d", level, real_topic, queue_id)
