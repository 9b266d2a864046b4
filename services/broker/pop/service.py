"""Pop consumption (RocketMQ 5): consumer groups that share work, with
invisibility, acknowledgements, redelivery with backoff, dead letters and
ordered (FIFO) groups.

State per (group, topic, queue), in memory:
- `committed`: every queue offset below it is resolved (acknowledged, or moved
  to the retry or dead-letter topic). It is the group's consumer offset
  (`consumerOffset.json`), and it only moves past resolved messages.
- `pop_offset`: the next offset never handed out.
- `inflight`: offsets handed out and not resolved, each with the checkpoint
  that issued it (its receipt handle names that checkpoint), a deadline and an
  attempt number. Every offset in [committed, pop_offset) not in flight (nor,
  for an ordered group, waiting for redelivery) is resolved.

Every change is first written to the commit log, as records of the revive
topic (`records.py`): a checkpoint per pop of a queue, an ack record per
acknowledgement batch or revival, a change record per re-timing. HA therefore
carries them to slaves, and a restart rebuilds the state by replaying the
revive queue from a checkpoint kept with the consumer offsets (every
checkpoint before it is resolved, and the committed offsets beside it cover
what those resolved). An acknowledgement is answered only once its record is
written (and, with SYNC_FLUSH, flushed): after a crash no acknowledged
message comes back, and every unacknowledged one does.

Redelivery. A message of a normal group still in flight at its deadline is
copied to the group's retry topic `%RETRY%<group>_<topic>` through the timer
(`schedule/timer.py`), due after the group's retry backoff — the broker's delay levels
(`messageDelayLevel`, 1s 5s 10s 30s 1m 2m ... 2h), by attempt — with
reconsume times + 1, so its next delivery says `delivery_attempt + 1`. After
`retry_max_times` redeliveries it is copied to `%DLQ%<group>` instead (one
queue, readable, with DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID and
DLQ_DELIVERY_ATTEMPTS). Pops read the retry topic before the topic itself.

Ordered groups (`consume_message_orderly`, or any group on a topic marked
ordered): a queue with a message in flight hands out nothing; an expired
message stays where it is and is handed out again, before anything after it,
once its backoff has passed — or goes to the dead-letter topic after
`retry_max_times`, letting the queue move on.

Runs on the event loop thread, on masters only; state changes happen between
awaits, never across one.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

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
    TOPIC_MAX_LENGTH,
    TOPIC_PATTERN,
    SubscriptionGroupConfig,
    TopicConfig,
    check_name,
    check_topic,
    dlq_topic,
    retry_topic,
)
from ferry.receipt_handle import (
    BadHandle,
    HandleReader,
    PopFormatError,
    ReceiptHandle,
    decode_handle,
    handle_prefix,
    handle_suffix,
    join_handle,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import FerryError, InvalidArgument, NotFound
from ferry.runtime.tasks import run_rounds
from services.broker.messaging.service import (
    GroupLookup,
    OffsetTable,
    TopicLookup,
    parse_sub_expression,
)
from services.broker.pop.records import Acks, Change, Checkpoint, decode_revive, encode_revive
from services.broker.store import MessageIn, MessageStore, copy_message

log = logging.getLogger(__name__)

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE"
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_POP_NUMS = 32
MAX_WAIT_MS = 60_000
SCAN_ENTRIES = 256  # consume-queue entries looked at per queue per pop (tag filters)
REVIVE_BATCH = 512
COMPACT_AT = 10_000  # checkpoint deadlines kept before the resolved ones are dropped


class GroupTable(GroupLookup, Protocol):
    def put(self, config: SubscriptionGroupConfig): ...


@dataclass(frozen=True)
class PopConfig:
    broker_name: str
    revive_topic: str
    backoff_s: tuple[float, ...]  # by attempt: the wait before redelivery n+1
    auto_create_group: bool = True


class Popped(NamedTuple):
    """One message handed out: the record and how the consumer sees it."""

    message: record.StoredMessage
    topic: str  # the topic the consumer asked for (a retry copy shows its origin)
    msg_id: str | None  # stable across redeliveries; None: the record's own
    receipt_handle: str
    delivery_attempt: int
    invisible_until_ms: int


class AckResult(NamedTuple):
    receipt_handle: str
    status: str  # OK, STALE, FOREIGN
    reason: str = ""


@dataclass(frozen=True)
class ChangeResult:
    receipt_handle: str
    status: str
    reason: str = ""
    invisible_until_ms: int = 0


@dataclass(frozen=True)
class QueueStatus:
    queue_id: int
    committed_offset: int
    pop_offset: int
    max_offset: int
    in_flight: int
    redeliveries_pending: int


@dataclass(frozen=True)
class GroupStatus:
    queues: list[QueueStatus]
    retries_pending: int
    dlq_messages: int
    orderly: bool
    retry_max_times: int
    retry_topic: str
    dlq_topic: str


class _InFlight(NamedTuple):
    """Shared by the messages of one checkpoint; never changed in place."""

    checkpoint: int
    until_ms: int
    attempt: int  # ordered groups; 0 for normal groups (the record's reconsume times say)


@dataclass(slots=True)
class _Redelivery:
    """An ordered group's expired message, handed out again from `visible_ms`."""

    checkpoint: int
    attempt: int
    visible_ms: int


Key = tuple[str, str, int]  # (group, topic, queue id)


class _Taken(NamedTuple):
    """Messages of one queue handed out under one in-flight record, in order."""

    key: Key
    inflight: _InFlight
    offsets: Sequence[int]
    entries: list[tuple[int, int, int]]  # their consume-queue entries


@dataclass(slots=True)
class _Ck:
    """A checkpoint (one pop of one queue, or one re-timing) with messages unresolved."""

    key: Key
    offsets: tuple[int, ...]
    until_ms: int
    live: int = 0  # its offsets still in flight or waiting for redelivery


@dataclass
class _Queue:
    key: Key
    committed: int
    pop_offset: int
    # Offsets enter `inflight` in increasing order (a queue is handed out
    # front to back; re-timing replaces a value in place; an ordered queue
    # re-delivers only while nothing else of it is in flight), so its first
    # key is its lowest.
    inflight: dict[int, _InFlight] = field(default_factory=dict)
    redeliver: dict[int, _Redelivery] = field(default_factory=dict)

    def low(self) -> int:
        """The lowest unresolved offset (the committed offset to be)."""
        low = next(iter(self.inflight), self.pop_offset)
        if self.redeliver:
            low = min(low, min(self.redeliver))
        return low


class PopService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicLookup,
        groups: GroupTable,
        offsets: OffsetTable,
        clock: Clock,
        config: PopConfig,
        readable: Callable[[str], TopicConfig],
        create_topic: Callable[[TopicConfig], None],
        timer_pending: Callable[[str], int] = lambda topic: 0,
    ) -> None:
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clock = clock
        self.config = config
        self.readable = readable  # the topic, if consumers may read it here (messaging's rule)
        self.create_topic = create_topic  # persist + announce a retry or DLQ topic
        self.timer_pending = timer_pending  # timed copies waiting, by target topic
        self._queues: dict[Key, _Queue] = {}
        self._cks: dict[int, _Ck] = {}  # checkpoint -> its unresolved messages
        self._expiry: list[tuple[int, int]] = []  # (until, checkpoint); stale ones skipped
        self._wakeups: list[tuple[int, Key]] = []  # (visible, ordered queue) redeliveries
        self._compact_at = COMPACT_AT
        self._wake = asyncio.Event()
        # While the reviver sleeps: the wall ms it wakes at by itself (0: awake,
        # it looks at the heaps before it sleeps again). Only an earlier
        # deadline needs to wake it.
        self._sleeping_until = 0
        self._next_queue: dict[tuple[str, str], int] = {}
        self._names_ok: set[tuple[str, str]] = set()  # (group, topic) pairs that name valid topics
        self.redeliveries = 0  # copies to a retry topic, and ordered re-deliveries
        self.dead_letters = 0

    # ------------------------------------------------------------ pop

    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_nums: int,
        invisible_ms: int,
        max_wait_ms: int,
        sub_expression: str = "",
    ) -> list[Popped]:
        config = self.readable(topic)
        self._check_group_name(group, topic)
        if queue_id is not None and queue_id != -1 and not 0 <= queue_id < config.read_queue_nums:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {topic!r} has {config.read_queue_nums} "
                f"readable queues (0..{config.read_queue_nums - 1}); -1 pops from any",
            )
        if not 1 <= max_nums <= MAX_POP_NUMS:
            raise InvalidArgument("max_msg_nums", f"{max_nums} is outside 1..{MAX_POP_NUMS}")
        _check_invisible(invisible_ms)
        if max_wait_ms < 0:
            raise InvalidArgument("max_wait_ms", f"{max_wait_ms} is negative")
        tag_hashes = parse_sub_expression(sub_expression)
        group_config = self._group(group)
        orderly = group_config.consume_message_orderly or config.order
        if queue_id is None or queue_id == -1:
            count = config.read_queue_nums
            start = self._next_queue.get((group, topic), 0) % max(count, 1)
            self._next_queue[(group, topic)] = start + 1
            queue_ids = [(start + i) % count for i in range(count)]
        else:
            queue_ids = [queue_id]
        keys = [(topic, q) for q in queue_ids]
        retry = retry_topic(group, topic)
        if not orderly:
            keys.insert(0, (retry, 0))
        deadline = time.monotonic() + min(max_wait_ms, MAX_WAIT_MS) / 1000
        while True:
            taken = self._take(group, keys, max_nums, invisible_ms, tag_hashes, orderly)
            if taken:
                return await self._read(group, topic, taken)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await self.store.long_polls.wait_any(keys, min(remaining, 1.0))

    def _take(
        self,
        group: str,
        keys: Sequence[tuple[str, int]],
        max_nums: int,
        invisible_ms: int,
        tag_hashes: frozenset[int] | None,
        orderly: bool,
    ) -> list[_Taken]:
        """Reserve up to `max_nums` messages (synchronously: no other pop can
        take them) and write one checkpoint per queue they came from."""
        now = self.clock.wall_ms()
        until = now + invisible_ms
        confirm = self.store.confirm_offset
        budget = self.store.config.max_pull_bytes
        out: list[_Taken] = []
        count = 0
        for topic, queue_id in keys:
            if count >= max_nums or budget <= 0:
                break
            cq = self.store.queues.get(topic, queue_id)
            if cq is None:
                continue
            state = self._queue(group, topic, queue_id)
            if state.pop_offset < cq.min_offset:
                self._skip_deleted(state, cq.min_offset)
            want = max_nums - count
            # An ordered queue's expired messages, handed out again: (offset, entry, attempt).
            again: list[tuple[int, tuple[int, int, int], int]] = []
            if orderly:
                if state.inflight:
                    continue  # locked: nothing after an in-flight message goes out
                if state.redeliver:
                    ready = sorted(state.redeliver)
                    if state.redeliver[ready[0]].visible_ms > now:
                        continue  # the head waits for its backoff; so does the queue
                    for offset in ready[:want]:
                        if cq.min_offset <= offset < cq.max_offset:
                            again.append(
                                (offset, cq.entry(offset), state.redeliver[offset].attempt)
                            )
                    want = 0 if len(ready) > want else want - len(ready)
            # Offsets from pop_offset on were never handed out: all fresh.
            fresh: list[int] = []
            fresh_entries: list[tuple[int, int, int]] = []
            scan_end = scan_from = state.pop_offset
            if want > 0:
                scan = want if tag_hashes is None else max(SCAN_ENTRIES, want)
                for entry in cq.entries(scan_from, scan):
                    commit_offset, size, code = entry
                    if commit_offset + size > confirm:
                        break  # a SYNC_MASTER hands out only what a slave has
                    if (fresh or again) and size > budget:
                        break
                    scan_end += 1
                    if tag_hashes is not None and code not in tag_hashes:
                        continue  # filtered out: resolved for this group
                    fresh.append(scan_end - 1)
                    fresh_entries.append(entry)
                    budget -= size
                    want -= 1
                    if want <= 0 or budget <= 0:
                        break
            if not fresh and not again:
                if scan_end > state.pop_offset:
                    state.pop_offset = scan_end
                    self._advance(state)
                continue
            offsets = [offset for offset, _, _ in again] + fresh
            fresh_attempt = 1 if orderly else 0
            ck = Checkpoint(
                group,
                topic,
                queue_id,
                min(offsets),
                max(scan_end, max(offsets) + 1),
                tuple(offsets),
                tuple([attempt for _, _, attempt in again] + [fresh_attempt] * len(fresh)),
                until,
            )
            try:
                checkpoint = self._journal(ck)
            except FerryError:
                if out:
                    break  # hand out what is already checkpointed
                raise
            state.pop_offset = max(state.pop_offset, scan_end)
            self._new_checkpoint(checkpoint, state.key, ck.offsets, until)
            # One record for every message of the checkpoint (per attempt):
            # none is ever changed in place, a re-timing replaces it.
            shared: dict[int, _InFlight] = {}
            for offset, entry, attempt in again:
                inflight = shared.get(attempt)
                if inflight is None:
                    inflight = shared[attempt] = _InFlight(checkpoint, until, attempt)
                self._set_inflight(state, offset, inflight)
                out.append(_Taken(state.key, inflight, (offset,), [entry]))
            if fresh:
                inflight = _InFlight(checkpoint, until, fresh_attempt)
                state.inflight.update(dict.fromkeys(fresh, inflight))
                self._cks[checkpoint].live += len(fresh)
                out.append(_Taken(state.key, inflight, fresh, fresh_entries))
            count += len(offsets)
            self._advance(state)
        if out:
            self._deadline_added(until)
        return out

    async def _read(self, group: str, topic: str, taken: list[_Taken]) -> list[Popped]:
        stored = iter(await self.store.read_entries([entry for t in taken for entry in t.entries]))
        out = []
        broker = self.config.broker_name
        for key, inflight, offsets, _ in taken:
            prefix = handle_prefix(broker, *key)
            suffix = handle_suffix(inflight.checkpoint, inflight.until_ms)
            until = inflight.until_ms
            own = key[1] == topic
            for offset in offsets:
                message = next(stored)
                if message is None:
                    continue  # deleted meanwhile: it expires and is resolved by the reviver
                handle = join_handle(prefix, offset, suffix)
                if own:
                    out.append(Popped(message, topic, None, handle, inflight.attempt or 1, until))
                    continue
                # A retry copy: shown as the message it copies, its attempt from
                # its reconsume times.
                props = message.properties
                out.append(
                    Popped(
                        message,
                        props.get(PROPERTY_RETRY_TOPIC, topic),
                        props.get(PROPERTY_ORIGIN_MESSAGE_ID),
                        handle,
                        inflight.attempt or _attempt(key[1], message),
                        until,
                    )
                )
        return out

    # ------------------------------------------------------------ ack / change

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[AckResult]:
        check_name(group, "consumer_group")
        check_topic(topic)
        if not handles:
            raise InvalidArgument("receipt_handles", "name at least one handle")
        # Nothing changes until every handle has parsed (a bad one fails the call).
        try:
            parsed = HandleReader().read_all(handles)
        except BadHandle as exc:
            raise InvalidArgument(
                f"receipt_handles[{exc.index}]", f"does not parse: {exc}"
            ) from None
        results: list[AckResult] = []
        # Per queue named (the fields its handles share): why its handles are
        # foreign, or its state and what this request resolves in it.
        queues: dict[tuple[str, str, str, int], tuple[str, _Queue | None, dict[int, int]]] = {}
        for text, (head, offset, checkpoint) in zip(handles, parsed, strict=True):
            slot = queues.get(head)
            if slot is None:
                foreign = self._foreign(head[0], head[1], head[2], group, topic)
                state = None if foreign else self._queues.get((group, head[2], head[3]))
                slot = queues[head] = (foreign, state, {})
            foreign, state, resolved = slot
            if foreign:
                results.append(AckResult(text, "FOREIGN", foreign))
                continue
            inflight = state.inflight.get(offset) if state is not None else None
            if inflight is None or inflight.checkpoint != checkpoint:
                results.append(AckResult(text, "STALE", _stale_reason(state, offset)))
            elif offset in resolved:
                results.append(AckResult(text, "STALE", "named twice in this request"))
            else:
                resolved[offset] = checkpoint
                results.append(AckResult(text, "OK"))
        end = 0
        for _, state, resolved in queues.values():
            if not resolved or state is None:
                continue
            key = state.key
            end = self._journal(Acks(*key, tuple(resolved.items())), end_only=True)
            inflight_of = state.inflight
            for offset in resolved:
                del inflight_of[offset]
            for checkpoint, count in Counter(resolved.values()).items():
                self._unref(checkpoint, count)
            self._advance(state)
            self.store.long_polls.notify([(key[1], key[2])])
        if end:
            await self.store.wait_durable(end)
        return results

    async def change_invisible_time(
        self, group: str, topic: str, handle_text: str, invisible_ms: int
    ) -> ChangeResult:
        _check_invisible(invisible_ms)
        found = self._one_in_flight(group, topic, handle_text)
        if isinstance(found, AckResult):
            return ChangeResult("", found.status, found.reason)
        handle, key, state, inflight = found
        until = self.clock.wall_ms() + invisible_ms
        checkpoint = self._journal(
            Change(
                group,
                handle.topic,
                handle.queue_id,
                handle.queue_offset,
                handle.checkpoint,
                until,
                inflight.attempt,
            )
        )
        self._new_checkpoint(checkpoint, key, (handle.queue_offset,), until)
        self._set_inflight(
            state, handle.queue_offset, _InFlight(checkpoint, until, inflight.attempt)
        )
        self._deadline_added(until)
        new = ReceiptHandle(
            self.config.broker_name,
            group,
            handle.topic,
            handle.queue_id,
            handle.queue_offset,
            checkpoint,
            until,
        )
        return ChangeResult(new.encode(), "OK", "", until)

    async def forward_to_dlq(self, group: str, topic: str, handle_text: str) -> AckResult:
        """Move one in-flight message to the group's dead-letter topic now and
        resolve it (a consumer giving up on it), as an expiry past
        retry_max_times would."""
        found = self._one_in_flight(group, topic, handle_text)
        if isinstance(found, AckResult):
            return found
        handle, key, state, inflight = found
        offset = handle.queue_offset
        (message,) = await self._records_of(key, [(offset, inflight)])
        if state.inflight.get(offset) is not inflight:  # acknowledged or re-timed meanwhile
            return AckResult(handle_text, "STALE", _stale_reason(state, offset))
        group_config = self._group(group)
        if message is not None:
            origin = message.properties.get(PROPERTY_RETRY_TOPIC, topic)
            attempts = inflight.attempt or _attempt(handle.topic, message)
            self._send_to_dlq(
                group, [self._dlq_copy(message, origin, attempts)], group_config.retry_max_times
            )
        end = self._journal(Acks(*key, ((offset, inflight.checkpoint),), "dlq"), end_only=True)
        self._resolve(state, offset)
        self._advance(state)
        self.store.long_polls.notify([(key[1], key[2])])
        await self.store.wait_durable(end)
        return AckResult(handle_text, "OK")

    def _one_in_flight(
        self, group: str, topic: str, handle_text: str
    ) -> tuple[ReceiptHandle, Key, _Queue, _InFlight] | AckResult:
        """The message one handle names, if it is in flight under that handle;
        otherwise why not (FOREIGN or STALE).

        Raises:
            InvalidArgument: a bad group or topic name, or a handle that does not parse.
        """
        check_name(group, "consumer_group")
        check_topic(topic)
        try:
            handle = decode_handle(handle_text)
        except PopFormatError as exc:
            raise InvalidArgument("receipt_handle", f"does not parse: {exc}") from None
        verdict = self._foreign(handle.broker_name, handle.group, handle.topic, group, topic)
        if verdict:
            return AckResult(handle_text, "FOREIGN", verdict)
        key = (group, handle.topic, handle.queue_id)
        state = self._queues.get(key)
        inflight = state.inflight.get(handle.queue_offset) if state else None
        if state is None or inflight is None or inflight.checkpoint != handle.checkpoint:
            return AckResult(handle_text, "STALE", _stale_reason(state, handle.queue_offset))
        return handle, key, state, inflight

    def _foreign(
        self, handle_broker: str, handle_group: str, handle_topic: str, group: str, topic: str
    ) -> str:
        """Why a handle with these fields is not this broker's for (group, topic); "" if it is."""
        if handle_broker != self.config.broker_name:
            return (
                f"issued by broker {handle_broker}, this is {self.config.broker_name}: "
                "acknowledge on the broker the message came from"
            )
        if handle_group != group:
            return f"issued to group {handle_group}, not {group}"
        if handle_topic not in (topic, retry_topic(group, topic)):
            return f"issued for topic {handle_topic}, not {topic}"
        return ""

    # ------------------------------------------------------------ status

    def status(self, group: str, topic: str) -> GroupStatus:
        config = self.topics.get(check_topic(topic))
        if config is None:
            raise NotFound(f"topic {topic!r} does not exist on broker {self.config.broker_name}")
        check_name(group, "consumer_group")
        group_config = self.groups.get(group) or SubscriptionGroupConfig(group)
        queues = []
        for queue_id in range(config.read_queue_nums):
            state = self._queues.get((group, topic, queue_id))
            max_offset = self.store.queue_max_offset(topic, queue_id)
            if state is None:
                committed = self.offsets.query(group, topic, queue_id)
                committed = committed if committed is not None else -1
                queues.append(QueueStatus(queue_id, committed, committed, max_offset, 0, 0))
                continue
            queues.append(
                QueueStatus(
                    queue_id,
                    state.committed,
                    state.pop_offset,
                    max_offset,
                    len(state.inflight),
                    len(state.redeliver),
                )
            )
        return GroupStatus(
            queues,
            self.retries_pending(group, topic),
            self._dlq_size(group),
            group_config.consume_message_orderly or config.order,
            group_config.retry_max_times,
            retry_topic(group, topic),
            dlq_topic(group),
        )

    def retries_pending(self, group: str, topic: str) -> int:
        """Retry copies waiting for their backoff or for a consumer."""
        retry = retry_topic(group, topic)
        waiting = self.timer_pending(retry)
        state = self._queues.get((group, retry, 0))
        backlog = self.store.queue_max_offset(retry, 0) - (state.committed if state else 0)
        return waiting + max(0, backlog)

    def _dlq_size(self, group: str) -> int:
        topic = dlq_topic(group)
        return self.store.queue_max_offset(topic, 0) - self.store.queue_min_offset(topic, 0)

    def snapshot(self) -> dict[str, tuple[int, int, int]]:
        """Per group: (in flight, retries pending, dead letters), for metrics."""
        inflight: Counter[str] = Counter()
        retries: Counter[str] = Counter()
        topics: set[tuple[str, str]] = set()
        for (group, topic, _), state in self._queues.items():
            inflight[group] += len(state.inflight) + len(state.redeliver)
            if not topic.startswith(RETRY_TOPIC_PREFIX):
                topics.add((group, topic))
        for group, topic in topics:
            retries[group] += self.retries_pending(group, topic)
        return {g: (inflight[g], retries[g], self._dlq_size(g)) for g in {g for g, _ in topics}}

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
            self.store.long_polls.notify([(key[1], key[2])])
        expired: dict[Key, list[tuple[int, _InFlight]]] = {}
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

    async def _expire(self, key: Key, items: list[tuple[int, _InFlight]]) -> None:
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
                state.redeliver[offset] = _Redelivery(
                    inflight.checkpoint, inflight.attempt + 1, visible
                )
                self.redeliveries += 1
                heapq.heappush(self._wakeups, (visible, key))
            if dead:
                await self._dead_letter(key, dead, group_config)
            self._advance(state)
            self.store.long_polls.notify([(topic, queue_id)])
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
            reconsumed = _attempt(topic, message) - 1
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
        self, key: Key, items: list[tuple[int, _InFlight]], group_config: SubscriptionGroupConfig
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
        self, key: Key, items: list[tuple[int, _InFlight]]
    ) -> list[record.StoredMessage | None]:
        """The stored message of each item (None: deleted by retention, or unreadable)."""
        cq = self.store.queues.get(key[1], key[2])
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

    # ------------------------------------------------------------ durability

    def _journal(self, item: Checkpoint | Acks | Change, end_only: bool = False) -> int:
        """Append one revive record; returns its revive-queue offset (the
        checkpoint id), or with `end_only` the commit offset just past it."""
        result = self.store.append_internal(
            self.config.revive_topic, 0, [MessageIn(encode_revive(item), b"")], dispatch_now=False
        )
        return result.end_offset if end_only else result.queue_offset

    async def load(self) -> int:
        """Replay the revive queue from the checkpoint (before serving)."""
        start = self.offsets.query(REVIVE_GROUP, self.config.revive_topic, 0) or 0
        cq = self.store.queues.get(self.config.revive_topic, 0)
        if cq is None:
            return 0
        if start < cq.min_offset:
            log.error(
                "pop: revive records %d..%d were deleted by retention; messages in flight "
                "then count as resolved",
                start,
                cq.min_offset,
            )
            start = cq.min_offset
        offset = start
        replayed = 0
        while offset < cq.max_offset:
            entries = cq.entries(offset, 4096)
            if not entries:
                break
            for i, message in enumerate(await self.store.read_entries(entries)):
                if message is None:
                    continue
                try:
                    item = decode_revive(message.body)
                except PopFormatError as exc:
                    log.error("pop: revive record %d unreadable (%s); skipped", offset + i, exc)
                    continue
                self.apply(offset + i, item)
                replayed += 1
            offset += len(entries)
        for state in self._queues.values():
            self._advance(state)
        inflight = sum(len(s.inflight) for s in self._queues.values())
        log.info(
            "pop: replayed %d revive records from %d: %d messages in flight in %d queues",
            replayed,
            start,
            inflight,
            len(self._queues),
        )
        return replayed

    def apply(self, checkpoint_offset: int, item: Checkpoint | Acks | Change) -> None:
        """One revive record, replayed."""
        if isinstance(item, Checkpoint):
            state = self._queue(item.group, item.topic, item.queue_id, base=item.start)
            state.pop_offset = max(state.pop_offset, item.end)
            ck = self._new_checkpoint(
                checkpoint_offset, state.key, item.offsets, item.invisible_until_ms
            )
            for offset, attempt in zip(item.offsets, item.attempts, strict=True):
                if offset >= state.committed:
                    self._set_inflight(
                        state,
                        offset,
                        _InFlight(checkpoint_offset, item.invisible_until_ms, attempt),
                    )
            if not ck.live:
                del self._cks[checkpoint_offset]
        elif isinstance(item, Acks):
            state = self._queues.get((item.group, item.topic, item.queue_id))
            if state is None:
                return
            for offset, checkpoint in item.resolved:
                inflight = state.inflight.get(offset)
                if inflight is not None and inflight.checkpoint == checkpoint:
                    self._resolve(state, offset)
        else:
            state = self._queues.get((item.group, item.topic, item.queue_id))
            inflight = state.inflight.get(item.queue_offset) if state else None
            if (
                state is not None
                and inflight is not None
                and inflight.checkpoint == item.old_checkpoint
            ):
                self._new_checkpoint(
                    checkpoint_offset, state.key, (item.queue_offset,), item.invisible_until_ms
                )
                self._set_inflight(
                    state,
                    item.queue_offset,
                    _InFlight(checkpoint_offset, item.invisible_until_ms, item.attempt),
                )

    def checkpoint(self) -> int:
        """Record where a restart replays from: the oldest checkpoint with an
        unresolved message (stored with the committed offsets it matches)."""
        cq = self.store.queues.get(self.config.revive_topic, 0)
        start = min(self._cks) if self._cks else (cq.max_offset if cq else 0)
        if (self.offsets.query(REVIVE_GROUP, self.config.revive_topic, 0) or 0) != start:
            self.offsets.commit(REVIVE_GROUP, self.config.revive_topic, 0, start)
        return start

    def held_from(self) -> int | None:
        """The commit offset of the oldest revive record a restart would replay
        (what retention must keep), or None when nothing is unresolved."""
        if not self._cks:
            return None
        cq = self.store.queues.get(self.config.revive_topic, 0)
        oldest = min(self._cks)
        if cq is None or not cq.min_offset <= oldest < cq.max_offset:
            return None
        return cq.entry(oldest)[0]

    def inflight_state(self) -> dict[Key, dict[int, tuple[int, int]]]:
        """(checkpoint, attempt) of every unresolved offset, per queue: what a
        replay of the same revive records on a slave must reproduce."""
        out = {}
        for key, state in self._queues.items():
            items = {o: (i.checkpoint, i.attempt) for o, i in state.inflight.items()}
            items.update({o: (r.checkpoint, r.attempt - 1) for o, r in state.redeliver.items()})
            if items:
                out[key] = items
        return out

    # ------------------------------------------------------------ internals

    def _queue(self, group: str, topic: str, queue_id: int, base: int | None = None) -> _Queue:
        key = (group, topic, queue_id)
        state = self._queues.get(key)
        if state is None:
            committed = self.offsets.query(group, topic, queue_id)
            if committed is None:
                if base is not None:
                    committed = base
                else:
                    group_config = self.groups.get(group)
                    from_min = group_config.consume_from_min_enable if group_config else True
                    committed = (
                        self.store.queue_min_offset(topic, queue_id)
                        if from_min
                        else self.store.queue_max_offset(topic, queue_id)
                    )
                self.offsets.commit(group, topic, queue_id, committed)
            state = self._queues[key] = _Queue(key, committed, committed)
        return state

    def _new_checkpoint(
        self, checkpoint: int, key: Key, offsets: tuple[int, ...], until_ms: int
    ) -> _Ck:
        ck = self._cks[checkpoint] = _Ck(key, offsets, until_ms)
        heapq.heappush(self._expiry, (until_ms, checkpoint))
        if len(self._expiry) > self._compact_at:
            self._compact_expiry()
        return ck

    def _set_inflight(self, state: _Queue, offset: int, inflight: _InFlight) -> None:
        """`offset` in flight under `inflight.checkpoint` (made by `_new_checkpoint`)."""
        old = state.inflight.get(offset)
        if old is not None:
            self._unref(old.checkpoint)
        redelivery = state.redeliver.pop(offset, None)
        if redelivery is not None:
            self._unref(redelivery.checkpoint)
        state.inflight[offset] = inflight
        self._cks[inflight.checkpoint].live += 1

    def _compact_expiry(self) -> None:
        """Drop the deadlines of checkpoints already resolved (they stay in the
        heap when that happens): with long invisibility times and fast acks, the
        heap would otherwise hold every pop of the last hours."""
        live = [(ck.until_ms, checkpoint) for checkpoint, ck in self._cks.items()]
        heapq.heapify(live)
        self._expiry = live
        self._compact_at = max(COMPACT_AT, 4 * len(live))

    def _resolve(self, state: _Queue, offset: int) -> None:
        inflight = state.inflight.pop(offset, None)
        if inflight is not None:
            self._unref(inflight.checkpoint)
        redelivery = state.redeliver.pop(offset, None)
        if redelivery is not None:
            self._unref(redelivery.checkpoint)

    def _unref(self, checkpoint: int, count: int = 1) -> None:
        ck = self._cks[checkpoint]
        ck.live -= count
        if ck.live <= 0:
            del self._cks[checkpoint]

    def _advance(self, state: _Queue) -> None:
        low = state.low()
        if low > state.committed:
            state.committed = low
            group, topic, queue_id = state.key
            self.offsets.commit(group, topic, queue_id, low)

    def _skip_deleted(self, state: _Queue, new_min: int) -> None:
        log.warning(
            "pop: group %s skips %d messages of %s/%d that retention deleted before they "
            "were consumed",
            state.key[0],
            new_min - state.pop_offset,
            state.key[1],
            state.key[2],
        )
        for offset in [o for o in state.inflight if o < new_min]:
            self._resolve(state, offset)
        for offset in [o for o in state.redeliver if o < new_min]:
            self._resolve(state, offset)
        state.pop_offset = new_min
        self._advance(state)

    def _check_group_name(self, group: str, topic: str) -> None:
        if (group, topic) in self._names_ok:
            return
        check_name(group, "consumer_group")
        for name in (retry_topic(group, topic), dlq_topic(group)):
            if len(name.encode()) > TOPIC_MAX_LENGTH or not TOPIC_PATTERN.fullmatch(name):
                raise InvalidArgument(
                    "consumer_group",
                    f"{group!r} cannot name its retry/dead-letter topic {name[:60]!r}: pop "
                    f"groups use [%|a-zA-Z0-9_-] only, and {name[:20]}... must fit in "
                    f"{TOPIC_MAX_LENGTH} bytes",
                )
        if len(self._names_ok) >= 65536:
            self._names_ok.clear()
        self._names_ok.add((group, topic))

    def _group(self, group: str) -> SubscriptionGroupConfig:
        config = self.groups.get(group)
        if config is not None:
            return config
        if not self.config.auto_create_group:
            raise NotFound(
                f"consumer group {group!r} does not exist on broker {self.config.broker_name} "
                "and autoCreateSubscriptionGroup is off; create it with "
                "BrokerAdmin/UpdateAndCreateSubscriptionGroup"
            )
        config = SubscriptionGroupConfig(group)
        self.groups.put(config)
        log.info("pop: consumer group %s created on first use", group)
        return config

    def _ensure_topic(self, topic: str) -> None:
        if self.topics.get(topic) is None:
            self.create_topic(TopicConfig(topic, read_queue_nums=1, write_queue_nums=1, perm=6))


def _attempt(queue_topic: str, message: record.StoredMessage) -> int:
    """Which delivery of a normal group this is: a retry copy counts the
    deliveries before it in its reconsume times; any other message (including
    a dead letter read back by another group) is on its first."""
    if queue_topic.startswith(RETRY_TOPIC_PREFIX):
        return message.reconsume_times + 1
    return 1


def _check_invisible(invisible_ms: int) -> None:
    if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
        raise InvalidArgument(
            "invisible_ms",
            f"{invisible_ms} is outside {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} (1 s .. 12 h)",
        )


def _stale_reason(state: _Queue | None, queue_offset: int) -> str:
    if state is not None and queue_offset < state.committed:
        return "already resolved: acknowledged, or redelivered after its invisibility ended"
    if state is not None and queue_offset in state.redeliver:
        return "its invisibility ended; it will be delivered again with a new handle"
    return (
        "not in flight under this handle: acknowledged, redelivered, or replaced by "
        "ChangeInvisibleTime"
    )


def message_group_queue(message_group: str, queue_count: int) -> int:
    """The queue a message group's messages share: a stable hash (CRC32)."""
    return zlib.crc32(message_group.encode()) % queue_count
