"""Timed delivery: messages that become visible in their topic at any moment
(property TIMER_DELIVER_MS, epoch ms), RocketMQ 5's timer.

A send with a future delivery time is stored in queue 0 of the system topic
`rmq_sys_wheel_timer`, its real topic and queue in REAL_TOPIC / REAL_QID. This
service tails that queue into an in-memory heap ordered by delivery time and,
when one is due, appends a copy to the real topic and queue. The copy keeps
TIMER_DELIVER_MS, as RocketMQ's timer does (`TimerMessageStore.convertMessage`
drops only REAL_TOPIC / REAL_QID): consumers see when it was due, and RocketMQ's
proxy shows it as the message's `delivery_timestamp`. The redelivery copies of
pop consumption (`pop/revive.py`) come through here too, due at their
TIMER_OUT_MS (the end of the group's retry backoff), which their copy drops.

Which timed messages were delivered is recorded in the commit log itself:
after each batch of copies, a record in queue 1 of the timer topic lists the
timer-queue offsets delivered. Everything is therefore replicated to slaves by
HA and survives restarts. The checkpoint — the lowest undelivered timer-queue
offset and the first done record still needed — is kept in the consumer-offset
table (`consumerOffset.json`, group `CID_RMQ_SYS_TIMER`), so a restart reads
only what is still pending. A crash between a batch of copies and its done
record delivers that batch again after restart (at least once, as RocketMQ);
no message is ever delivered early, and none is lost.

Limit: retention does not know about pending timers. A timed message whose
commit-log file is deleted (fileReservedTime shorter than the delay, or forced
cleaning) is lost and logged.

Runs on the event loop thread, on masters only.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter, deque
from collections.abc import Mapping
from typing import Protocol

from ferry import record
from ferry.model import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    RETRY_TOPIC_PREFIX,
    TIMER_TOPIC,
)
from ferry.receipt_handle import PopFormatError
from ferry.runtime.clock import Clock
from ferry.runtime.tasks import run_rounds
from services.broker.messaging.rules import OffsetTable, TopicLookup, real_destination
from services.broker.schedule.timer_done import decode_timer_done, encode_timer_done
from services.broker.store import MessageIn, MessageStore, copy_message

log = logging.getLogger(__name__)


class DeliveryObserver(Protocol):
    """Metrics of timed deliveries (the broker's metrics implement it)."""

    def observe_timer_delivery(self, lateness_s: float) -> None:
        """A timed message delivered `lateness_s` after its delivery time."""


CHECKPOINT_GROUP = "CID_RMQ_SYS_TIMER"
PENDING_QUEUE = 0
DONE_QUEUE = 1
BATCH = 1024
SCAN_BATCH = 2048


class TimerService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicLookup,
        checkpoints: OffsetTable,
        clock: Clock,
        observer: DeliveryObserver | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.checkpoints = checkpoints
        self.clock = clock
        self.observer = observer  # metrics: each delivery's lateness
        # (deliver_ms, timer queue offset, commit offset, size, target topic)
        self._heap: list[tuple[int, int, int, int, str]] = []
        self._pending: set[int] = set()
        self._low: list[int] = []  # min-heap of pending offsets (lazy)
        self.pending_by_topic: Counter[str] = Counter()
        self.scanned = 0  # next timer-queue offset to read into the heap
        self._done_marks: deque[tuple[int, int]] = deque()  # (done offset, max listed)
        self.delivered = 0
        self._loaded = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def pending_for(self, topic: str) -> int:
        """Timed messages not yet delivered to `topic` (pop's PendingTimers)."""
        return self.pending_by_topic.get(topic, 0)

    # ------------------------------------------------------------ startup

    async def load(self) -> int:
        """Rebuild the pending set from the checkpoint: every timer-queue entry
        from the low mark on that no done record lists. Returns how many are pending."""
        low = self.checkpoints.query(CHECKPOINT_GROUP, TIMER_TOPIC, PENDING_QUEUE) or 0
        done_from = self.checkpoints.query(CHECKPOINT_GROUP, TIMER_TOPIC, DONE_QUEUE) or 0
        pending_q = self.store.queue_view(TIMER_TOPIC, PENDING_QUEUE)
        done_q = self.store.queue_view(TIMER_TOPIC, DONE_QUEUE)
        if pending_q is not None and low < pending_q.min_offset:
            log.error(
                "timer: %d timed messages were deleted by retention before delivery",
                pending_q.min_offset - low,
            )
            low = pending_q.min_offset
        done: set[int] = set()
        if done_q is not None:
            offset = max(done_from, done_q.min_offset)
            while offset < done_q.max_offset:
                entries = done_q.entries(offset, SCAN_BATCH)
                if not entries:
                    break
                for i, stored in enumerate(await self.store.read_entries(entries)):
                    listed: tuple[int, ...] = ()
                    if stored is not None:
                        try:
                            listed = decode_timer_done(stored.body)
                        except PopFormatError as exc:
                            log.error("timer: unreadable done record at %d: %s", offset + i, exc)
                    done.update(o for o in listed if o >= low)
                    self._done_marks.append((offset + i, max(listed, default=-1)))
                offset += len(entries)
        self.scanned = low
        await self._scan(skip=done)
        self._loaded = True
        log.info("timer: %d timed messages pending (from timer queue offset %d)", self.pending, low)
        return self.pending

    # ------------------------------------------------------------ run

    async def run(self) -> None:
        if not self._loaded:
            await self.load()
        await run_rounds("timer delivery", self._round)

    async def _round(self) -> None:
        await self._scan()
        if await self.deliver_due():
            await asyncio.sleep(0)
            return
        wait = 1.0
        if self._heap:
            wait = min(wait, max((self._heap[0][0] - self.clock.wall_ms()) / 1000, 0.005))
        await self.store.wait_for_any([(TIMER_TOPIC, PENDING_QUEUE)], wait)

    async def _scan(self, skip: set[int] | None = None) -> None:
        """Read timer-queue entries past `scanned` into the heap."""
        queue = self.store.queue_view(TIMER_TOPIC, PENDING_QUEUE)
        if queue is None:
            return
        self.scanned = max(self.scanned, queue.min_offset)
        while self.scanned < queue.max_offset:
            start = self.scanned
            entries = queue.entries(start, SCAN_BATCH)
            if not entries:
                return
            stored = await self.store.read_entries(entries)
            for i, (entry, message) in enumerate(zip(entries, stored, strict=True)):
                offset = start + i
                if skip is not None and offset in skip:
                    continue
                commit_offset, size, _ = entry
                target = ""
                deliver_ms = 0  # unreadable: due at once (and dropped, logged, then)
                if message is not None:
                    target = message.properties.get(PROPERTY_REAL_TOPIC, "")
                    deliver_ms = due_ms(message.properties)
                heapq.heappush(self._heap, (deliver_ms, offset, commit_offset, size, target))
                self._pending.add(offset)
                heapq.heappush(self._low, offset)
                self.pending_by_topic[target] += 1
            self.scanned = start + len(entries)

    async def deliver_due(self) -> int:
        """Copy every due timed message (at most BATCH) to its topic; returns how many."""
        now = self.clock.wall_ms()
        confirm = self.store.confirm_offset
        batch = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(batch) < BATCH:
            if heap[0][2] + heap[0][3] > confirm:
                break  # a SYNC_MASTER shows (and delivers) only what a slave has
            batch.append(heapq.heappop(heap))
        if not batch:
            return 0
        try:
            stored = await self.store.read_entries([(c, s, 0) for _, _, c, s, _ in batch])
            targets: dict[tuple[str, int], list[MessageIn]] = {}
            for item, message in zip(batch, stored, strict=True):
                copy = self._copy(item, message)
                if copy is not None:
                    targets.setdefault(copy[0], []).append(copy[1])
            for (topic, queue_id), messages in targets.items():
                self.store.append_own(topic, queue_id, messages)
            offsets = [item[1] for item in batch]
            done = self.store.append_own(
                TIMER_TOPIC, DONE_QUEUE, [MessageIn(encode_timer_done(offsets), b"")]
            )
        except BaseException:
            for item in batch:  # not delivered: due again at once
                heapq.heappush(heap, item)
            raise
        self._done_marks.append((done.queue_offset, max(offsets)))
        delivered_at = self.clock.wall_ms()
        for deliver_ms, offset, _, _, target in batch:
            self._pending.discard(offset)
            self.pending_by_topic[target] -= 1
            if self.pending_by_topic[target] <= 0:
                del self.pending_by_topic[target]
            if self.observer is not None:
                self.observer.observe_timer_delivery(max(0, delivered_at - deliver_ms) / 1000)
        self.delivered += len(batch)
        return len(batch)

    def _copy(
        self, item: tuple[int, int, int, int, str], message: record.StoredMessage | None
    ) -> tuple[tuple[str, int], MessageIn] | None:
        if message is None:
            log.error("timer: timed message at commit offset %d is unreadable; dropped", item[2])
            return None
        properties = dict(message.properties)
        if properties.pop(PROPERTY_TIMER_OUT_MS, None) is None and properties.get(
            PROPERTY_REAL_TOPIC, ""
        ).startswith(RETRY_TOPIC_PREFIX):
            # A retry copy written before TIMER_OUT_MS: its TIMER_DELIVER_MS is the backoff.
            properties.pop(PROPERTY_TIMER_DELIVER_MS, None)
        destination = real_destination(properties, self.topics)
        if destination is None:
            log.warning(
                "timer: the topic %r of the timed message at commit offset %d is gone; dropped",
                message.properties.get(PROPERTY_REAL_TOPIC, ""),
                message.commit_offset,
            )
            return None
        return destination, copy_message(message, properties)

    def _lowest_pending(self) -> int:
        """The lowest timer-queue offset not yet delivered (`scanned` when none)."""
        low_heap = self._low
        while low_heap and low_heap[0] not in self._pending:
            heapq.heappop(low_heap)
        return low_heap[0] if low_heap else self.scanned

    def held_from(self) -> int | None:
        """The lowest commit offset a pending timed message is stored at (what
        retention must keep), or None when nothing is pending."""
        queue = self.store.queue_view(TIMER_TOPIC, PENDING_QUEUE)
        low = self._lowest_pending()
        if queue is None or low >= queue.max_offset or low < queue.min_offset:
            return None
        return queue.entry(low)[0]

    # ------------------------------------------------------------ checkpoint

    def checkpoint(self) -> tuple[int, int]:
        """Record (in the consumer-offset table, persisted with it) where a
        restart must start reading: the lowest undelivered timer offset and the
        first done record that lists anything at or above it."""
        low = self._lowest_pending()
        marks = self._done_marks
        while marks and marks[0][1] < low:
            marks.popleft()
        done_q = self.store.queue_view(TIMER_TOPIC, DONE_QUEUE)
        done_from = marks[0][0] if marks else (done_q.max_offset if done_q else 0)
        table = self.checkpoints
        # An absent entry means 0: a broker that never timed anything writes nothing.
        if (table.query(CHECKPOINT_GROUP, TIMER_TOPIC, PENDING_QUEUE) or 0) != low:
            table.commit(CHECKPOINT_GROUP, TIMER_TOPIC, PENDING_QUEUE, low)
        if (table.query(CHECKPOINT_GROUP, TIMER_TOPIC, DONE_QUEUE) or 0) != done_from:
            table.commit(CHECKPOINT_GROUP, TIMER_TOPIC, DONE_QUEUE, done_from)
        return low, done_from


def due_ms(properties: Mapping[str, str]) -> int:
    """When a timer entry is due (epoch ms): its TIMER_OUT_MS, else its
    TIMER_DELIVER_MS; 0 (due at once) when that does not read as a number."""
    raw = properties.get(PROPERTY_TIMER_OUT_MS) or properties.get(PROPERTY_TIMER_DELIVER_MS)
    try:
        return int(raw or 0)
    except ValueError:
        return 0
