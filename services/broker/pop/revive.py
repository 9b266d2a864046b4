"""Revival: in-flight messages past their deadline go to the group's retry topic
(through the timer, after the backoff unless the consumer chose the deadline) or, past `retry_max_times`, to its dead-letter
topic; an ordered group's expired message is handed out again in place.

The `Reviver` is given the `PopState` it revives from (and the store, topics,
clock and config it needs); the service tells it of each new deadline
(`deadline_added`). Runs as one task on the event loop (`run`), on masters
only. Imports `state.py`; must never import `service.py`.
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
    PROPERTY_TIMER_OUT_MS,
    RETRY_TOPIC_PREFIX,
    TIMER_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
    dlq_topic,
    retry_topic,
)
from ferry.runtime.clock import Clock
from ferry.runtime.tasks import run_rounds
from services.broker.messaging.contracts import TopicCreator
from services.broker.messaging.rules import TopicLookup
from services.broker.pop.records import Acks
from services.broker.pop.state import (
    REVIVE_BATCH,
    InFlight,
    Key,
    PopConfig,
    PopState,
    Redelivery,
    delivery_attempt,
)
from services.broker.store import MessageIn, MessageStore, copy_message

log = logging.getLogger(__name__)


class Reviver:
    """Expires the in-flight messages of a `PopState`: to the retry topic, the
    DLQ, or (ordered groups) back in place after the backoff."""

    def __init__(
        self,
        state: PopState,
        store: MessageStore,
        topics: TopicLookup,
        clock: Clock,
        config: PopConfig,
        topic_creator: TopicCreator,
    ) -> None:
        self.state = state
        self.store = store
        self.topics = topics
        self.clock = clock
        self.config = config
        self.topic_creator = topic_creator  # persists + announces a retry or DLQ topic
        self._wakeups: list[tuple[int, Key]] = []  # (visible, ordered queue) redeliveries
        self._wake = asyncio.Event()
        # While the reviver sleeps: the wall ms it wakes at by itself (0: awake,
        # it looks at the heaps before it sleeps again). Only an earlier
        # deadline needs to wake it.
        self._sleeping_until = 0
        self.redeliveries = 0  # copies to a retry topic, and ordered re-deliveries
        self.dead_letters = 0

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
        for heap in (self.state.expiry, self._wakeups):
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

    def deadline_added(self, until_ms: int) -> None:
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
        expired, taken = self.state.take_expired(now, REVIVE_BATCH)
        try:
            for key, items in expired.items():
                await self._expire(key, items)
        except BaseException:
            self.state.put_back(taken)
            raise
        return sum(len(items) for items in expired.values())

    async def _expire(self, key: Key, items: list[tuple[int, InFlight]]) -> None:
        group, topic, queue_id = key
        pop_state = self.state
        group_config = pop_state.group(group)
        config = self.topics.get(topic)
        orderly = not topic.startswith(RETRY_TOPIC_PREFIX) and (
            group_config.consume_message_orderly or (config is not None and config.order)
        )
        state = pop_state.queues[key]
        now = self.clock.wall_ms()
        if orderly:
            dead = []
            for offset, inflight in items:
                if inflight.attempt > group_config.retry_max_times:
                    dead.append((offset, inflight))
                    continue
                visible = inflight.until_ms + self._backoff_ms(inflight.attempt, inflight.chosen)
                # Still referenced by its checkpoint, now as a redelivery.
                state.inflight.pop(offset)
                state.redeliver[offset] = Redelivery(
                    inflight.checkpoint, inflight.attempt + 1, visible
                )
                self.redeliveries += 1
                heapq.heappush(self._wakeups, (visible, key))
            if dead:
                await self._dead_letter(key, dead, group_config)
            pop_state.advance(state)
            self.store.wake([(topic, queue_id)])
            return
        messages = await pop_state.records_of(key, items)
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
                dead_letters.append(dlq_copy(message, origin, reconsumed + 1))
            else:
                due = now + self._backoff_ms(reconsumed + 1, inflight.chosen)
                retries.append(self._retry_copy(group, message, origin, reconsumed, due))
        if not resolved:
            return
        if retries:
            self._ensure_topic(retry_topic(group, origin))
            self.store.append_own(TIMER_TOPIC, 0, retries)
            self.redeliveries += len(retries)
        self.send_to_dlq(group, dead_letters, group_config.retry_max_times)
        pop_state.journal(Acks(group, topic, queue_id, tuple(resolved), "revive"))
        for offset, _ in resolved:
            pop_state.resolve(state, offset)
        pop_state.advance(state)

    async def _dead_letter(
        self, key: Key, items: list[tuple[int, InFlight]], group_config: SubscriptionGroupConfig
    ) -> None:
        """An ordered group's messages past retry_max_times: to the DLQ."""
        group, topic, queue_id = key
        pop_state = self.state
        state = pop_state.queues[key]
        messages = await pop_state.records_of(key, items)
        # Acknowledged while the records were read: done, not dead.
        live = [
            (offset, inflight, message)
            for (offset, inflight), message in zip(items, messages, strict=True)
            if state.inflight.get(offset) is inflight
        ]
        copies = [dlq_copy(m, topic, i.attempt) for _, i, m in live if m is not None]
        self.send_to_dlq(group, copies, group_config.retry_max_times)
        resolved = [(offset, inflight.checkpoint) for offset, inflight, _ in live]
        pop_state.journal(Acks(group, topic, queue_id, tuple(resolved), "dlq"))
        for offset, _ in resolved:
            pop_state.resolve(state, offset)

    def send_to_dlq(self, group: str, copies: list[MessageIn], retry_max_times: int) -> None:
        """Append dead-letter copies (`dlq_copy`) to the group's DLQ topic, created if needed."""
        if not copies:
            return
        topic = dlq_topic(group)
        self._ensure_topic(topic)
        self.store.append_own(topic, 0, copies)
        self.dead_letters += len(copies)
        log.warning(
            "pop: %d messages of group %s went to %s after %d redeliveries",
            len(copies),
            group,
            topic,
            retry_max_times,
        )

    def _ensure_topic(self, topic: str) -> None:
        if self.topics.get(topic) is None:
            self.topic_creator.create_system_topic(
                TopicConfig(topic, read_queue_nums=1, write_queue_nums=1, perm=6)
            )

    def _retry_copy(
        self, group: str, message: record.StoredMessage, origin: str, reconsumed: int, due: int
    ) -> MessageIn:
        properties = dict(message.properties)
        properties.setdefault(PROPERTY_RETRY_TOPIC, origin)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        properties[PROPERTY_REAL_TOPIC] = retry_topic(group, origin)
        properties[PROPERTY_REAL_QUEUE_ID] = "0"
        # Due after the backoff; the message's own TIMER_DELIVER_MS (a delay
        # message's) travels with it, as RocketMQ's retry copies keep every property.
        properties[PROPERTY_TIMER_OUT_MS] = str(due)
        return copy_message(message, properties, reconsumed + 1)

    def _backoff_ms(self, attempt: int, chosen: bool) -> int:
        """The wait after delivery `attempt` failed, before the next one: none when the
        consumer chose the deadline itself (`chosen`: ChangeInvisibleTime), as a v5 SDK's
        push consumer does with its own backoff, and as RocketMQ's pop, which never adds
        one, takes it."""
        if chosen:
            return 0
        levels = self.config.backoff_s
        return int(levels[min(max(attempt, 1), len(levels)) - 1] * 1000)


def dlq_copy(message: record.StoredMessage, origin: str, attempts: int) -> MessageIn:
    """The dead-letter copy of a message from topic `origin`, after `attempts` deliveries."""
    properties = dict(message.properties)
    properties.pop(PROPERTY_RETRY_TOPIC, None)
    origin_id = properties.pop(PROPERTY_ORIGIN_MESSAGE_ID, None) or message.msg_id
    properties[PROPERTY_DLQ_ORIGIN_TOPIC] = origin
    properties[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
    properties[PROPERTY_DLQ_DELIVERY_ATTEMPTS] = str(attempts)
    return copy_message(message, properties, attempts)
