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
  for an ordered group, waiting for redelivery) is resolved — an ordered
  group's may still be handed out again with its batch (below).

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
reconsume times + 1, so its next delivery says `delivery_attempt + 1`. A
deadline the consumer chose itself (ChangeInvisibleTime: a v5 SDK's push
consumer after a failure sets its own backoff so) is when the message is due
again, with no backoff after it, as in RocketMQ's pop. After
`retry_max_times` redeliveries it is copied to `%DLQ%<group>` instead (one
queue, readable, with DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID and
DLQ_DELIVERY_ATTEMPTS). Pops read the retry topic before the topic itself.

Ordered groups (`consume_message_orderly`, or any group on a topic marked
ordered), as Apache's ordered pop (ConsumerOrderInfoManager): a queue hands
out a batch and then nothing while any message of that batch is in flight.
Once every unacknowledged one has expired (and the first one's backoff has
passed; none after a deadline the consumer chose), the queue hands out again
from its first unacknowledged message — the whole batch again, acknowledged
messages after it included, each counted as one more delivery — and its
committed offset never passes that message. A message past `retry_max_times`
goes to the dead-letter topic instead, letting the queue move on. A consumer
whose tag filter does not match an expired message never gets it: the message
is resolved for the group then, as a fresh message its filter skips is
(RocketMQ's ordered pop reads the queue again through the consumer's filter).

Runs on the event loop thread, on masters only; state changes happen between
awaits, never across one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ferry import record
from ferry.model import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    RETRY_TOPIC_PREFIX,
    SubscriptionGroupConfig,
    TopicConfig,
    check_name,
    check_pop_group,
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
from services.broker.messaging.contracts import TopicCreator
from services.broker.messaging.filters import TAG, Filters, MessageFilter
from services.broker.messaging.rules import (
    OffsetTable,
    TopicLookup,
)
from services.broker.pop.records import Acks, Change, Checkpoint
from services.broker.pop.revive import Reviver, dlq_copy
from services.broker.pop.state import (
    MAX_POP_NUMS,
    MAX_WAIT_MS,
    MIN_CHANGED_INVISIBLE_MS,
    SCAN_ENTRIES,
    AckResult,
    ChangeResult,
    GroupStatus,
    GroupTable,
    InFlight,
    Key,
    PopConfig,
    Popped,
    PopState,
    QueueState,
    QueueStatus,
    check_invisible,
    delivery_attempt,
    stale_reason,
)
from services.broker.store import MessageStore

log = logging.getLogger(__name__)


class _Taken(NamedTuple):
    """Messages of one queue handed out under one in-flight record, in order."""

    key: Key
    inflight: InFlight
    offsets: Sequence[int]
    entries: list[tuple[int, int, int]]  # their consume-queue entries


class ReadAccess(Protocol):
    """Whether consumers may read a topic here (messaging's BrokerAccess)."""

    def readable_topic(self, topic: str) -> TopicConfig:
        """The topic's config; raises NotFound or PermissionDenied."""
        ...


class PendingTimers(Protocol):
    """Timed messages not yet delivered (schedule's TimerService)."""

    def pending_for(self, topic: str) -> int:
        """How many wait to be delivered to `topic`."""
        ...


class PopService:
    """Pop, ack, change-invisible-time and status: builds the pop state
    (`PopState`, `state.py`) and its revival (`Reviver`, `revive.py`), works on
    the state through its public methods and tells the reviver of each new
    deadline."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicLookup,
        groups: GroupTable,
        offsets: OffsetTable,
        clock: Clock,
        config: PopConfig,
        access: ReadAccess,
        topic_creator: TopicCreator,
        timers: PendingTimers | None = None,
        filters: Filters | None = None,
    ) -> None:
        self.store = store
        self.filters = filters if filters is not None else Filters()  # enablePropertyFilter
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.clock = clock
        self.config = config
        self.access = access  # the topic, if consumers may read it here (messaging's rule)
        self.timers = timers  # timed copies waiting, by target topic (None: no timer)
        self.state = PopState(store, groups, offsets, config)
        # topic_creator: persists + announces a retry or DLQ topic (the reviver makes them).
        self.reviver = Reviver(self.state, store, topics, clock, config, topic_creator)
        self._next_queue: dict[tuple[str, str], int] = {}
        self._names_ok: set[tuple[str, str]] = set()  # (group, topic) pairs that name valid topics
        self._polling: Counter[tuple[str, str, int]] = Counter()  # pops waiting, by queue

    # ------------------------------------------------------------ lifecycle

    async def load(self) -> int:
        """Replay the revive queue from the checkpoint (before serving)."""
        return await self.state.load()

    async def run(self) -> None:
        """Expire what was not acknowledged in time: redeliver or dead-letter it."""
        await self.reviver.run()

    async def revive_due(self) -> int:
        """Handle every in-flight message past its deadline (up to a batch)."""
        return await self.reviver.revive_due()

    def checkpoint(self) -> int:
        """Record where a restart replays from (see `PopState.checkpoint`)."""
        return self.state.checkpoint()

    def held_from(self) -> int | None:
        """The commit offset of the oldest revive record a restart would replay."""
        return self.state.held_from()

    def inflight_state(self) -> dict[Key, dict[int, tuple[int, int]]]:
        """(checkpoint, attempt) of every unresolved offset, per queue."""
        return self.state.inflight_state()

    @property
    def redeliveries(self) -> int:
        """Copies to a retry topic, and ordered re-deliveries, since the start."""
        return self.reviver.redeliveries

    @property
    def dead_letters(self) -> int:
        """Messages moved to a dead-letter topic since the start."""
        return self.reviver.dead_letters

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
        expression_type: str = TAG,
    ) -> list[Popped]:
        config = self.access.readable_topic(topic)
        self._check_group_name(group, topic)
        if queue_id is not None and queue_id != -1 and not 0 <= queue_id < config.read_queue_nums:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {topic!r} has {config.read_queue_nums} "
                f"readable queues (0..{config.read_queue_nums - 1}); -1 pops from any",
            )
        if not 1 <= max_nums <= MAX_POP_NUMS:
            raise InvalidArgument("max_msg_nums", f"{max_nums} is outside 1..{MAX_POP_NUMS}")
        check_invisible(invisible_ms)
        if max_wait_ms < 0:
            raise InvalidArgument("max_wait_ms", f"{max_wait_ms} is negative")
        chosen = self.filters.build(sub_expression, expression_type)
        tag_hashes = chosen.tag_hashes
        group_config = self.state.group(group)
        orderly = group_config.consume_message_orderly or config.order
        keys = self._keys(group, topic, config.read_queue_nums, queue_id, orderly)
        deadline = time.monotonic() + min(max_wait_ms, MAX_WAIT_MS) / 1000
        polling = (group, topic, -1 if queue_id is None else queue_id)
        while True:
            judged = None
            if chosen.selector is not None:
                judged = await self._judge(group, keys, max_nums, chosen, orderly)
            taken = self._take(group, keys, max_nums, invisible_ms, tag_hashes, orderly, judged)
            if taken:
                return await self._read(group, topic, taken, judged)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._polling[polling] += 1
            try:
                await self.store.wait_for_any(keys, min(remaining, 1.0))
            finally:
                self._polling[polling] -= 1
                if self._polling[polling] <= 0:
                    del self._polling[polling]

    def _keys(
        self, group: str, topic: str, queue_count: int, queue_id: int | None, orderly: bool
    ) -> list[tuple[str, int]]:
        """The queues a pop looks at, in order: the group's retry topic first
        (unless ordered), then one queue or every queue, from a start that
        moves round with each pop."""
        if queue_id is None or queue_id == -1:
            start = self._next_queue.get((group, topic), 0) % max(queue_count, 1)
            self._next_queue[(group, topic)] = start + 1
            queue_ids = [(start + i) % queue_count for i in range(queue_count)]
        else:
            queue_ids = [queue_id]
        keys = [(topic, q) for q in queue_ids]
        if not orderly:
            keys.insert(0, (retry_topic(group, topic), 0))
        return keys

    def polling(self, group: str, topic: str, queue_id: int) -> int:
        """How many pops of (group, topic, queue id; -1: any queue) wait for a
        message now (RocketMQ 5's POLLING_INFO)."""
        return self._polling.get((group, topic, queue_id), 0)

    async def wait_message(self, group: str, topic: str, queue_id: int, wait_ms: int) -> bool:
        """Whether a pop of (group, topic, queue id; -1: any queue) would find
        a message, waiting up to `wait_ms` for one to arrive (RocketMQ 5's
        NOTIFICATION). Takes nothing and creates no state."""
        config = self.access.readable_topic(topic)
        self._check_group_name(group, topic)
        if queue_id != -1 and not 0 <= queue_id < config.read_queue_nums:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {topic!r} has {config.read_queue_nums} "
                "readable queues",
            )
        orderly = self.state.group(group).consume_message_orderly or config.order
        keys = self._keys(group, topic, config.read_queue_nums, queue_id, orderly)
        deadline = time.monotonic() + min(max(wait_ms, 0), MAX_WAIT_MS) / 1000
        while True:
            now = self.clock.wall_ms()
            if any(self.state.has_message(group, t, q, now) for t, q in keys):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.store.wait_for_any(keys, min(remaining, 1.0))

    def _take(
        self,
        group: str,
        keys: Sequence[tuple[str, int]],
        max_nums: int,
        invisible_ms: int,
        tag_hashes: frozenset[int] | None,
        orderly: bool,
        judged: dict[int, record.StoredMessage | None] | None = None,
    ) -> list[_Taken]:
        """Reserve up to `max_nums` messages (synchronously: no other pop can
        take them) and write one checkpoint per queue they came from.
        `judged` (an SQL92 subscription): the records `_judge` read, None for
        those that do not match; a queue's scan stops at a record it did not
        judge."""
        pop_state = self.state
        now = self.clock.wall_ms()
        until = now + invisible_ms
        confirm = self.store.confirm_offset
        budget = self.store.max_pull_bytes
        out: list[_Taken] = []
        count = 0
        for topic, queue_id in keys:
            if count >= max_nums or budget <= 0:
                break
            cq = self.store.queue_view(topic, queue_id)
            if cq is None:
                continue
            state = pop_state.queue(group, topic, queue_id)
            if state.pop_offset < cq.min_offset:
                pop_state.skip_deleted(state, cq.min_offset)
            want = max_nums - count
            scan_from = state.pop_offset
            if orderly:
                if state.inflight:
                    continue  # locked: nothing goes out while a message of its batch is in flight
                if state.redeliver:
                    head = min(state.redeliver)
                    if state.redeliver[head].visible_ms > now:
                        continue  # the head waits for its backoff; so does the queue
                    # As Apache's ordered pop: the batch again from its first
                    # unacknowledged message, the acknowledged ones after it included.
                    scan_from = state.low()
            # Offsets from scan_from on, through the filter: an ordered queue's
            # batch again (below pop_offset), then messages never handed out.
            fresh: list[int] = []
            fresh_entries: list[tuple[int, int, int]] = []
            filtered: list[tuple[int, int]] = []  # expired ones the filter skips: resolved
            for offset in [o for o in state.redeliver if o < cq.min_offset]:
                filtered.append((offset, state.redeliver[offset].checkpoint))  # deleted
            scan_end = scan_from = max(scan_from, cq.min_offset)
            if want > 0:
                filtering = tag_hashes is not None or judged is not None
                scan = max(SCAN_ENTRIES, want) if filtering else want
                if scan_from < state.pop_offset:
                    scan = max(scan, state.pop_offset - scan_from)
                for entry in cq.entries(scan_from, scan):
                    commit_offset, size, code = entry
                    if commit_offset + size > confirm:
                        break  # a SYNC_MASTER hands out only what a slave has
                    if fresh and size > budget:
                        break
                    if judged is not None and commit_offset not in judged:
                        break  # not judged (stored since, or a later queue): the next pop
                    scan_end += 1
                    if (judged is not None and judged[commit_offset] is None) or (
                        tag_hashes is not None and code not in tag_hashes
                    ):
                        redelivery = state.redeliver.get(scan_end - 1)
                        if redelivery is not None:
                            filtered.append((scan_end - 1, redelivery.checkpoint))
                        continue  # filtered out: resolved for this group
                    fresh.append(scan_end - 1)
                    fresh_entries.append(entry)
                    budget -= size
                    want -= 1
                    if want <= 0 or budget <= 0:
                        break
            if filtered:
                try:
                    self._resolve_filtered(state, filtered)
                except FerryError:
                    if out:
                        break  # hand out what is already checkpointed
                    raise
            if not fresh:
                if scan_end > state.pop_offset:
                    state.pop_offset = scan_end
                pop_state.advance(state)
                continue
            if orderly:
                # Delivery n + 1 of what the last batch held (acknowledged or not), as
                # Apache counts an ordered queue's consumptions per offset.
                attempts = [state.batch.get(offset, 0) + 1 for offset in fresh]
            else:
                attempts = [0] * len(fresh)
            ck = Checkpoint(
                group,
                topic,
                queue_id,
                fresh[0],
                scan_end,
                tuple(fresh),
                tuple(attempts),
                until,
            )
            try:
                checkpoint = pop_state.journal(ck)
            except FerryError:
                if out:
                    break  # hand out what is already checkpointed
                raise
            pop_state.new_checkpoint(checkpoint, state.key, ck.offsets, until)
            if orderly:
                # The new batch replaces the last: what of it is not taken again is
                # read again later as if never handed out (a replay does the same,
                # `PopState.apply`); the queue's offset is the new batch's end.
                pop_state.start_batch(state, ck.offsets, ck.attempts, scan_end)
            else:
                state.pop_offset = max(state.pop_offset, scan_end)
            # One record for every message of the checkpoint (per attempt): none is
            # ever changed in place, a re-timing replaces it. Handed out in offset
            # order, one _Taken per run of one attempt.
            shared: dict[int, InFlight] = {}
            run_start = 0
            for i in range(len(fresh) + 1):
                if i < len(fresh) and (i == 0 or attempts[i] == attempts[i - 1]):
                    continue
                attempt = attempts[run_start]
                inflight = shared.get(attempt)
                if inflight is None:
                    inflight = shared[attempt] = InFlight(checkpoint, until, attempt)
                run = fresh[run_start:i]
                pop_state.add_inflight(state, run, inflight)
                out.append(_Taken(state.key, inflight, run, fresh_entries[run_start:i]))
                run_start = i
            count += len(fresh)
            pop_state.advance(state)
        if out:
            self.reviver.deadline_added(until)
        return out

    def _resolve_filtered(self, state: QueueState, filtered: list[tuple[int, int]]) -> None:
        """An ordered queue's expired messages that the popping consumer's tag
        filter does not match: resolved for the group, as a fresh message the
        filter skips is, never handed to it. RocketMQ's ordered pop does the same:
        it reads the queue again from the group's offset through the consumer's
        filter and commits the offset past what does not match
        (`PopMessageProcessor.popMsgFromQueue`, NO_MATCHED_MESSAGE). Journaled
        as an ack (the record has no reason for it), so a restart or a slave
        agrees; nothing waits for it to be durable: lost in a crash, the message
        expires again and is filtered again. The caller advances the committed
        offset once the batch read with it is in flight (an acknowledged message
        after it may be handed out again)."""
        key = state.key
        self.state.journal(Acks(*key, tuple(filtered)))
        for offset, _ in filtered:
            self.state.resolve(state, offset)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "pop: group %s resolved %d expired messages of %s/%d its filter does not match",
                key[0],
                len(filtered),
                key[1],
                key[2],
            )

    async def _judge(
        self,
        group: str,
        keys: Sequence[tuple[str, int]],
        max_nums: int,
        chosen: MessageFilter,
        orderly: bool,
    ) -> dict[int, record.StoredMessage | None]:
        """The records the next `_take` may look at for an SQL92 subscription,
        by commit offset, each with whether it matches: an ordered queue's
        messages due again and each queue's next entries (as many as `_take`
        scans: an ordered queue's from its first expired message), queue by
        queue until `max_nums` match. Reads them (off the loop
        when cold), so `_take` itself stays synchronous; None for a record that
        does not match, nothing for one that is gone."""
        judged: dict[int, record.StoredMessage | None] = {}
        matched = 0
        for topic, queue_id in keys:
            if matched >= max_nums:
                break
            cq = self.store.queue_view(topic, queue_id)
            if cq is None:
                continue
            state = self.state.queue(group, topic, queue_id)  # as _take would make it
            start = state.low() if orderly and state.redeliver else state.pop_offset
            scan = max(SCAN_ENTRIES, max_nums, state.pop_offset - start)
            entries = cq.entries(max(start, cq.min_offset), scan)
            if not entries:
                continue
            for entry, stored in zip(entries, await self.store.read_entries(entries), strict=True):
                if stored is None:
                    continue  # gone: not judged (a scan stops there, a redelivery is read)
                if chosen.selects(entry[2], stored.properties):
                    judged[entry[0]] = stored
                    matched += 1
                else:
                    judged[entry[0]] = None
        return judged

    async def _read(
        self,
        group: str,
        topic: str,
        taken: list[_Taken],
        judged: dict[int, record.StoredMessage | None] | None = None,
    ) -> list[Popped]:
        """The popped messages of what `_take` reserved, read (those `_judge`
        read already are not read again)."""
        entries = [entry for t in taken for entry in t.entries]
        if judged is None:
            stored = iter(await self.store.read_entries(entries))
        else:
            missing = [e for e in entries if judged.get(e[0]) is None]
            fresh = iter(await self.store.read_entries(missing) if missing else ())
            stored = iter([judged.get(e[0]) or next(fresh) for e in entries])
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
                        inflight.attempt or delivery_attempt(key[1], message),
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
        pop_state = self.state
        results: list[AckResult] = []
        # Per queue named (the fields its handles share): why its handles are
        # foreign, or its state and what this request resolves in it.
        queues: dict[tuple[str, str, str, int], tuple[str, QueueState | None, dict[int, int]]] = {}
        for text, (head, offset, checkpoint) in zip(handles, parsed, strict=True):
            slot = queues.get(head)
            if slot is None:
                foreign = self._foreign(head[0], head[1], head[2], group, topic)
                state = None if foreign else pop_state.queues.get((group, head[2], head[3]))
                slot = queues[head] = (foreign, state, {})
            foreign, state, resolved = slot
            if foreign:
                results.append(AckResult(text, "FOREIGN", foreign))
                continue
            inflight = state.inflight.get(offset) if state is not None else None
            if inflight is None or inflight.checkpoint != checkpoint:
                results.append(AckResult(text, "STALE", stale_reason(state, offset)))
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
            end = pop_state.journal(Acks(*key, tuple(resolved.items())), end_only=True)
            inflight_of = state.inflight
            for offset in resolved:
                del inflight_of[offset]
            for checkpoint, count in Counter(resolved.values()).items():
                pop_state.unref(checkpoint, count)
            pop_state.advance(state)
            self.store.wake([(key[1], key[2])])
        if end:
            await self.store.wait_durable(end)
        return results

    async def change_invisible_time(
        self, group: str, topic: str, handle_text: str, invisible_ms: int
    ) -> ChangeResult:
        check_invisible(invisible_ms, MIN_CHANGED_INVISIBLE_MS)
        found = self._one_in_flight(group, topic, handle_text)
        if isinstance(found, AckResult):
            return ChangeResult("", found.status, found.reason)
        handle, key, state, inflight = found
        until = self.clock.wall_ms() + invisible_ms
        pop_state = self.state
        checkpoint = pop_state.journal(
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
        pop_state.new_checkpoint(
            checkpoint,
            key,
            (handle.queue_offset,),
            until,
            origin=pop_state.origin_of(handle.checkpoint),
        )
        pop_state.set_inflight(
            state, handle.queue_offset, InFlight(checkpoint, until, inflight.attempt, True)
        )
        self.reviver.deadline_added(until)
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

    def handle_at(
        self, group: str, topic: str, queue_id: int, queue_offset: int, until_ms: int
    ) -> str | None:
        """The receipt handle of the message at (`topic`, `queue_id`,
        `queue_offset`) if it is in flight for `group` with deadline `until_ms`;
        None if it is not (acknowledged, expired or re-timed since: a stale
        name). RocketMQ's pop clients name a message by its queue, offset, pop
        time and invisible time, not by ferry's handle: their sum is the
        deadline the in-flight record holds, so one pop state serves both."""
        state = self.state.queues.get((group, topic, queue_id))
        inflight = state.inflight.get(queue_offset) if state is not None else None
        if inflight is None or inflight.until_ms != until_ms:
            return None
        prefix = handle_prefix(self.config.broker_name, group, topic, queue_id)
        return join_handle(prefix, queue_offset, handle_suffix(inflight.checkpoint, until_ms))

    async def record_bytes(self, popped: Sequence[Popped]) -> list[bytes | None]:
        """The popped messages' records as stored (RocketMQ's pop answer carries
        them so); None for one deleted meanwhile. Read again, in spans (from the
        page cache: `pop` has just decoded them there)."""
        return await self.store.records_as_stored(
            [(p.message.commit_offset, p.message.size) for p in popped]
        )

    async def forward_to_dlq(self, group: str, topic: str, handle_text: str) -> AckResult:
        """Move one in-flight message to the group's dead-letter topic now and
        resolve it (a consumer giving up on it), as an expiry past
        retry_max_times would."""
        found = self._one_in_flight(group, topic, handle_text)
        if isinstance(found, AckResult):
            return found
        handle, key, state, inflight = found
        offset = handle.queue_offset
        pop_state = self.state
        (message,) = await pop_state.records_of(key, [(offset, inflight)])
        if state.inflight.get(offset) is not inflight:  # acknowledged or re-timed meanwhile
            return AckResult(handle_text, "STALE", stale_reason(state, offset))
        group_config = pop_state.group(group)
        if message is not None:
            origin = message.properties.get(PROPERTY_RETRY_TOPIC, topic)
            attempts = inflight.attempt or delivery_attempt(handle.topic, message)
            self.reviver.send_to_dlq(
                group, [dlq_copy(message, origin, attempts)], group_config.retry_max_times
            )
        end = pop_state.journal(Acks(*key, ((offset, inflight.checkpoint),), "dlq"), end_only=True)
        pop_state.resolve(state, offset)
        pop_state.advance(state)
        self.store.wake([(key[1], key[2])])
        await self.store.wait_durable(end)
        return AckResult(handle_text, "OK")

    def _one_in_flight(
        self, group: str, topic: str, handle_text: str
    ) -> tuple[ReceiptHandle, Key, QueueState, InFlight] | AckResult:
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
        state = self.state.queues.get(key)
        inflight = state.inflight.get(handle.queue_offset) if state else None
        if state is None or inflight is None or inflight.checkpoint != handle.checkpoint:
            return AckResult(handle_text, "STALE", stale_reason(state, handle.queue_offset))
        return handle, key, state, inflight

    def _check_group_name(self, group: str, topic: str) -> None:
        if (group, topic) in self._names_ok:
            return
        check_pop_group(group, topic)  # one rule, shared with the proxy
        if len(self._names_ok) >= 65536:
            self._names_ok.clear()
        self._names_ok.add((group, topic))

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
            state = self.state.queues.get((group, topic, queue_id))
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
            tuple(int(s * 1000) for s in self.config.backoff_s),
        )

    def retries_pending(self, group: str, topic: str) -> int:
        """Retry copies waiting for their backoff or for a consumer."""
        retry = retry_topic(group, topic)
        waiting = self.timers.pending_for(retry) if self.timers is not None else 0
        state = self.state.queues.get((group, retry, 0))
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
        for (group, topic, _), state in self.state.queues.items():
            inflight[group] += len(state.inflight) + len(state.redeliver)
            if not topic.startswith(RETRY_TOPIC_PREFIX):
                topics.add((group, topic))
        for group, topic in topics:
            retries[group] += self.retries_pending(group, topic)
        return {g: (inflight[g], retries[g], self._dlq_size(g)) for g in {g for g, _ in topics}}
