"""Revival: in-flight messages past their deadline go to the group's retry topic
(through the timer, after the backoff) or, past `retry_max_times`, to its dead-letter
topic; an ordered group's expired message is handed out again in place.

Runs as one task on the event loop (`run`), on masters only. Imports `state.py`;
must never import `service.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging

from ferry import record
from ferry.model import (
    PROPERTY_DLQ_DELIVERY_ATTEMPTS,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    RETRY_TOPIC_PREFIX,
    TIMER_TOPIC,
    SubscriptionGroupConfig,
    dlq_topic,
    retry_topic,
)
from ferry.runtime.tasks import run_rounds
from services.broker.pop.records import Acks
from services.broker.pop.state import (
    REVIVE_BATCH,
    InFlight,
    Key,
    PopState,
    Redelivery,
    delivery_attempt,
)
from services.broker.store import MessageIn, copy_message

log = logging.getLogger(__name__)


class Reviver(PopState):
    # ------------------------------------------------------------ revive

    async def run(self) -> None:
        """Expire what was not acknowledged in time: redeliver or dead-letter it."""
        await run_rounds("pop revive", self._revive_round)

    async def _revive_round(self) -> None:
        if await self.revive_due():
            await asyncio.sleep(0)
            return
        now = self.clock.wall_ms()
        wait = 1.0
        for heap in (self._expiry, self._wakeups):
            if heap:
                wait = min(wait, max((heap[0][0] - now) / 1000, 0.005))
        self._wake.clear()
        self._sleeping_until = now + int(wait * 1000)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
        finally:
            self._sleeping_until = 0

    def _deadline_added(self, until_ms: int) -> None:
        """A new deadline: wake the reviver if it would sleep past it."""
        if until_ms < self._sleeping_until:
            self._wake.set()

    async def revive_due(self) -> int:
        """Handle every in-flight message past its deadline (up to a batch)."""
        now = self.clock.wall_ms()
        wakeups = self._wakeups
        while wakeups and wakeups[0][0] <= now:  # an ordered queue may hand out again
            _, key = heapq.heappop(wakeups)
            self.store.wake([(key[1], key[2])])
        expired: dict[Key, list[tuple[int, InFlight]]] = {}
        heap = self._expiry
        taken: list[tuple[int, int]] = []
        count = 0
        while heap and heap[0][0] <= now and count < REVIVE_BATCH:
            until, checkpoint = heapq.heappop(heap)
            ck = self._cks.get(checkpoint)
            state = self._queues.get(ck.key) if ck is not None else None
            if ck is None or state is None:
                continue
            taken.append((until, checkpoint))
            for offset in ck.offsets:
                inflight = state.inflight.get(offset)
                if inflight is not None and inflight.checkpoint == checkpoint:
                    expired.setdefault(ck.key, []).append((offset, inflight))
                    count += 1
        try:
            for key, items in expired.items():
                await self._expire(key, items)
        except BaseException:
            for entry in taken:  # not all handled: due again (handled ones are skipped)
                heapq.heappush(self._expiry, entry)
            raise
        return count

    async def _expire(self, key: Key, items: list[tuple[int, InFlight]]) -> None:
        group, topic, queue_id = key
        group_config = self._group(group)
        config = self.topics.get(topic)
        orderly = not topic.startswith(RETRY_TOPIC_PREFIX) and (
            group_config.consume_message_orderly or (config is not None and config.order)
        )
        state = self._queues[key]
        now = self.clock.wall_ms()
        if orderly:
            dead = []
            for offset, inflight in items:
                if inflight.attempt > group_config.retry_max_times:
                    dead.append((offset, inflight))
                    continue
                visible = inflight.until_ms + self._backoff_ms(inflight.attempt)
                state.inflight.pop(offset)
                state.redeliver[offset] = Redelivery(
                    inflight.checkpoint, inflight.attempt + 1, visible
                )
                self.redeliveries += 1
                heapq.heappush(self._wakeups, (visible, key))
            if dead:
                await self._dead_letter(key, dead, group_config)
            self._advance(state)
            self.store.wake([(topic, queue_id)])
            return
        messages = await self._records_of(key, items)
        retries: list[MessageIn] = []
        dead_letters: list[MessageIn] = []
        resolved: list[tuple[int, int]] = []
        origin = topic
        for (offset, inflight), message in zip(items, messages, strict=True):
            if state.inflight.get(offset) is not inflight:
                continue  # acknowledged or re-timed while reading
            resolved.append((offset, inflight.checkpoint))
            if message is None:
                continue  # deleted by retention: nothing to deliver again
            origin = message.properties.get(PROPERTY_RETRY_TOPIC, topic)
            reconsumed = delivery_attempt(topic, message) - 1
            if reconsumed >= group_config.retry_max_times:
                dead_letters.append(self._dlq_copy(message, origin, reconsumed + 1))
            else:
                retries.append(self._retry_copy(group, message, origin, reconsumed, now))
        if not resolved:
            return
        if retries:
            self._ensure_topic(retry_topic(group, origin))
            self.store.append_internal(TIMER_TOPIC, 0, retries)
            self.redeliveries += len(retries)
        self._send_to_dlq(group, dead_letters, group_config.retry_max_times)
        self._journal(Acks(group, topic, queue_id, tuple(resolved), "revive"))
        for offset, _ in resolved:
            self._resolve(state, offset)
        self._advance(state)

    async def _dead_letter(
        self, key: Key, items: list[tuple[int, InFlight]], group_config: SubscriptionGroupConfig
    ) -> None:
        """An ordered group's messages past retry_max_times: to the DLQ."""
        group, topic, queue_id = key
        state = self._queues[key]
        messages = await self._records_of(key, items)
        # Acknowledged while the records were read: done, not dead.
        live = [
            (offset, inflight, message)
            for (offset, inflight), message in zip(items, messages, strict=True)
            if state.inflight.get(offset) is inflight
        ]
        copies = [self._dlq_copy(m, topic, i.attempt) for _, i, m in live if m is not None]
        self._send_to_dlq(group, copies, group_config.retry_max_times)
        resolved = [(offset, inflight.checkpoint) for offset, inflight, _ in live]
        self._journal(Acks(group, topic, queue_id, tuple(resolved), "dlq"))
        for offset, _ in resolved:
            self._resolve(state, offset)

    async def _records_of(
        self, key: Key, items: list[tuple[int, InFlight]]
    ) -> list[record.StoredMessage | None]:
        """The stored message of each item (None: deleted by retention, or unreadable)."""
        cq = self.store.queue_view(key[1], key[2])
        entries = [
            cq.entry(offset) if cq is not None and offset >= cq.min_offset else None
            for offset, _ in items
        ]
        stored = iter(await self.store.read_entries([e for e in entries if e is not None]))
        return [next(stored) if e is not None else None for e in entries]

    def _send_to_dlq(self, group: str, copies: list[MessageIn], retry_max_times: int) -> None:
        if not copies:
            return
        topic = dlq_topic(group)
        self._ensure_topic(topic)
        self.store.append_internal(topic, 0, copies)
        self.dead_letters += len(copies)
        log.warning(
            "pop: %d messages of group %s went to %s after %d redeliveries",
            len(copies),
            group,
            topic,
            retry_max_times,
        )

    def _retry_copy(
        self, group: str, message: record.StoredMessage, origin: str, reconsumed: int, now: int
    ) -> MessageIn:
        properties = dict(message.properties)
        properties.setdefault(PROPERTY_RETRY_TOPIC, origin)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        properties[PROPERTY_REAL_TOPIC] = retry_topic(group, origin)
        properties[PROPERTY_REAL_QUEUE_ID] = "0"
        properties[PROPERTY_TIMER_DELIVER_MS] = str(now + self._backoff_ms(reconsumed + 1))
        return copy_message(message, properties, reconsumed + 1)

    def _dlq_copy(self, message: record.StoredMessage, origin: str, attempts: int) -> MessageIn:
        properties = dict(message.properties)
        properties.pop(PROPERTY_RETRY_TOPIC, None)
        origin_id = properties.pop(PROPERTY_ORIGIN_MESSAGE_ID, None) or message.msg_id
        properties[PROPERTY_DLQ_ORIGIN_TOPIC] = origin
        properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
        properties[PROPERTY_DLQ_DELIVERY_ATTEMPTS] = str(attempts)
        return copy_message(message, properties, attempts)

    def _backoff_ms(self, attempt: int) -> int:
        """The wait after delivery `attempt` failed, before the next one."""
        levels = self.config.backoff_s
        return int(levels[min(max(attempt, 1), len(levels)) - 1] * 1000)
