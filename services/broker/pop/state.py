"""Pop consumption's state and its durability: per (group, topic, queue) the
committed and pop offsets and the messages in flight, the open checkpoints and
their deadlines, the revive-record journal and its replay.

The pop room is three parts, put together by composition (each module imports
only the ones before it): `PopState` (this: state, journal, replay), the
`Reviver` (`revive.py`: expiry, retry or DLQ) that is given it, and the
`PopService` (`service.py`: pop, ack, change-invisible-time, status) that builds
both. The other two write revive records and open, reference and close
checkpoints only through PopState's public methods; they update a queue's own
fields (`QueueState`) in place. What the state means is in `service.py`'s
docstring.

Runs on the event loop thread, on masters only.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ferry import record
from ferry.model import (
    RETRY_TOPIC_PREFIX,
    SubscriptionGroupConfig,
)
from ferry.receipt_handle import (
    PopFormatError,
)
from ferry.runtime.errors import InvalidArgument, NotFound
from services.broker.messaging.rules import (
    GroupLookup,
    OffsetTable,
)
from services.broker.pop.records import Acks, Change, Checkpoint, decode_revive, encode_revive
from services.broker.store import MessageIn, MessageStore

log = logging.getLogger(__name__)

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE"
MIN_INVISIBLE_MS = 1_000  # a pop's
MIN_CHANGED_INVISIBLE_MS = 0  # a change's: a consumer's backoff may be short, or none
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
    # How far behind the log's end a message is still "in memory" (RocketMQ's
    # accessMessageInMemoryMaxRatio of RAM): decides where a group that does not
    # consume from the minimum starts a queue it never read (`PopState.queue`).
    hot_bytes: int = 1 << 62


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
    retry_backoff_ms: tuple[int, ...]  # by attempt: the wait after a failed delivery


class InFlight(NamedTuple):
    """Shared by the messages of one checkpoint; never changed in place."""

    checkpoint: int
    until_ms: int
    attempt: int  # ordered groups; 0 for normal groups (the record's reconsume times say)
    # The consumer set this deadline itself (ChangeInvisibleTime, a change record): the
    # message is due again then, with no backoff after it.
    chosen: bool = False


@dataclass(slots=True)
class Redelivery:
    """An ordered group's expired message, handed out again from `visible_ms`."""

    checkpoint: int
    attempt: int
    visible_ms: int


Key = tuple[str, str, int]  # (group, topic, queue id)


@dataclass(slots=True)
class OpenCheckpoint:
    """A checkpoint (one pop of one queue, or one re-timing) with messages unresolved."""

    key: Key
    offsets: tuple[int, ...]
    until_ms: int
    live: int = 0  # its offsets still in flight or waiting for redelivery
    # The pop checkpoint a re-timing descends from (its own id for a pop): a replay
    # must start there to know the queue's pop offset, not at the change record.
    origin: int = -1


@dataclass
class QueueState:
    key: Key
    committed: int
    pop_offset: int
    # Offsets enter `inflight` in increasing order (a queue is handed out
    # front to back; re-timing replaces a value in place; an ordered queue
    # hands out a batch again only while nothing of it is in flight), so its
    # first key is its lowest.
    inflight: dict[int, InFlight] = field(default_factory=dict)
    redeliver: dict[int, Redelivery] = field(default_factory=dict)
    # An ordered queue's last batch (one pop of it): offset -> attempt. The next
    # batch counts from it (`PopService._take`).
    batch: dict[int, int] = field(default_factory=dict)

    def low(self) -> int:
        """The lowest unresolved offset (the committed offset to be)."""
        low = next(iter(self.inflight), self.pop_offset)
        if self.redeliver:
            low = min(low, min(self.redeliver))
        return low


class PopState:
    """The pop state of one broker and its journal (revive records).

    Its public methods are the operations the reviver and the service build on;
    every change to the checkpoints' reference counts and deadlines goes through
    them. `queues` (per (group, topic, queue id)) and `expiry` (the deadline
    heap) are read by both.
    """

    def __init__(
        self,
        store: MessageStore,
        groups: GroupTable,
        offsets: OffsetTable,
        config: PopConfig,
    ) -> None:
        self.store = store
        self.groups = groups
        self.offsets = offsets
        self.config = config
        self.queues: dict[Key, QueueState] = {}
        self._cks: dict[int, OpenCheckpoint] = {}  # checkpoint -> its unresolved messages
        self.expiry: list[tuple[int, int]] = []  # (until, checkpoint); stale ones skipped
        self.compact_at = COMPACT_AT  # heap size that triggers dropping resolved deadlines

    # ------------------------------------------------------------ durability

    def journal(self, item: Checkpoint | Acks | Change, end_only: bool = False) -> int:
        """Append one revive record; returns its revive-queue offset (the
        checkpoint id), or with `end_only` the commit offset just past it."""
        result = self.store.append_own(
            self.config.revive_topic, 0, [MessageIn(encode_revive(item), b"")], dispatch_now=False
        )
        return result.end_offset if end_only else result.queue_offset

    async def load(self) -> int:
        """Replay the revive queue from the checkpoint (before serving)."""
        start = self.offsets.query(REVIVE_GROUP, self.config.revive_topic, 0) or 0
        cq = self.store.queue_view(self.config.revive_topic, 0)
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
        for state in self.queues.values():
            self.advance(state)
        inflight = sum(len(s.inflight) for s in self.queues.values())
        log.info(
            "pop: replayed %d revive records from %d: %d messages in flight in %d queues",
            replayed,
            start,
            inflight,
            len(self.queues),
        )
        return replayed

    def apply(self, checkpoint_offset: int, item: Checkpoint | Acks | Change) -> None:
        """One revive record, replayed."""
        if isinstance(item, Checkpoint):
            state = self.queue(item.group, item.topic, item.queue_id, base=item.start)
            if any(item.attempts):  # an ordered queue's batch (a normal group's attempts are 0)
                self.start_batch(state, item.offsets, item.attempts, item.end)
            else:
                state.pop_offset = max(state.pop_offset, item.end)
            ck = self.new_checkpoint(
                checkpoint_offset, state.key, item.offsets, item.invisible_until_ms
            )
            for offset, attempt in zip(item.offsets, item.attempts, strict=True):
                if offset >= state.committed:
                    self.set_inflight(
                        state,
                        offset,
                        InFlight(checkpoint_offset, item.invisible_until_ms, attempt),
                    )
            if not ck.live:
                del self._cks[checkpoint_offset]
        elif isinstance(item, Acks):
            state = self.queues.get((item.group, item.topic, item.queue_id))
            if state is None:
                return
            for offset, checkpoint in item.resolved:
                inflight = state.inflight.get(offset)
                if inflight is not None and inflight.checkpoint == checkpoint:
                    self.resolve(state, offset)
        else:
            state = self.queues.get((item.group, item.topic, item.queue_id))
            inflight = state.inflight.get(item.queue_offset) if state else None
            if (
                state is not None
                and inflight is not None
                and inflight.checkpoint == item.old_checkpoint
            ):
                self.new_checkpoint(
                    checkpoint_offset,
                    state.key,
                    (item.queue_offset,),
                    item.invisible_until_ms,
                    origin=self.origin_of(item.old_checkpoint),
                )
                self.set_inflight(
                    state,
                    item.queue_offset,
                    InFlight(checkpoint_offset, item.invisible_until_ms, item.attempt, True),
                )

    def checkpoint(self) -> int:
        """Record where a restart replays from: the oldest checkpoint with an
        unresolved message (stored with the committed offsets it matches)."""
        cq = self.store.queue_view(self.config.revive_topic, 0)
        start = self._oldest() if self._cks else (cq.max_offset if cq else 0)
        if (self.offsets.query(REVIVE_GROUP, self.config.revive_topic, 0) or 0) != start:
            self.offsets.commit(REVIVE_GROUP, self.config.revive_topic, 0, start)
        return start

    def held_from(self) -> int | None:
        """The commit offset of the oldest revive record a restart would replay
        (what retention must keep), or None when nothing is unresolved."""
        if not self._cks:
            return None
        cq = self.store.queue_view(self.config.revive_topic, 0)
        oldest = self._oldest()
        if cq is None or not cq.min_offset <= oldest < cq.max_offset:
            return None
        return cq.entry(oldest)[0]

    def inflight_state(self) -> dict[Key, dict[int, tuple[int, int]]]:
        """(checkpoint, attempt) of every unresolved offset, per queue: what a
        replay of the same revive records on a slave must reproduce."""
        out = {}
        for key, state in self.queues.items():
            items = {o: (i.checkpoint, i.attempt) for o, i in state.inflight.items()}
            items.update({o: (r.checkpoint, r.attempt - 1) for o, r in state.redeliver.items()})
            if items:
                out[key] = items
        return out

    # ------------------------------------------------------------ operations

    def queue(self, group: str, topic: str, queue_id: int, base: int | None = None) -> QueueState:
        """The state of a group's queue, created (from its committed offset) on first use."""
        key = (group, topic, queue_id)
        state = self.queues.get(key)
        if state is None:
            committed = self.offsets.query(group, topic, queue_id)
            if committed is None:
                committed = base if base is not None else self._start_offset(group, topic, queue_id)
                self.offsets.commit(group, topic, queue_id, committed)
            state = self.queues[key] = QueueState(key, committed, committed)
        return state

    def has_message(self, group: str, topic: str, queue_id: int, now_ms: int) -> bool:
        """Whether the group's queue holds a message a pop could hand out now:
        one never handed out, or a redelivery past its backoff. Reads only."""
        high = self.store.queue_max_offset(topic, queue_id)
        state = self.queues.get((group, topic, queue_id))
        if state is None:
            committed = self.offsets.query(group, topic, queue_id)
            if committed is None:
                committed = self._start_offset(group, topic, queue_id)
            return high > committed
        if any(r.visible_ms <= now_ms for r in state.redeliver.values()):
            return True
        return high > max(state.pop_offset, self.store.queue_min_offset(topic, queue_id))

    def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where a group starts a queue it has no offset in, as RocketMQ 5's pop
        starts one: a group that consumes from the minimum (consumeFromMinEnable,
        and every retry topic) at the queue's first offset; any other (what the
        admin API's default SubscriptionGroupConfig says, and what RocketMQ's
        proxy asks for, ConsumeInitMode.MAX) at 0 while the queue still starts at
        0 and its first message is in memory (initPopOffsetByCheckMsgInMem), else
        at its last message (max - 1: the newest one is still delivered)."""
        store = self.store
        low = store.queue_min_offset(topic, queue_id)
        group_config = self.groups.get(group)
        from_min = group_config.consume_from_min_enable if group_config else True
        if from_min or topic.startswith(RETRY_TOPIC_PREFIX):
            return low
        high = store.queue_max_offset(topic, queue_id)
        if low == 0 < high:
            view = store.queue_view(topic, queue_id)
            if view is not None:
                commit_offset = view.entry(0)[0]
                if store.max_offset - commit_offset <= self.config.hot_bytes:
                    return 0
        return max(low, high - 1, 0)

    def _oldest(self) -> int:
        """The oldest revive record an open checkpoint needs replayed: its own, or for
        a re-timing the pop it descends from (`OpenCheckpoint.origin`)."""
        return min(ck.origin for ck in self._cks.values())

    def origin_of(self, checkpoint: int) -> int:
        """The pop checkpoint `checkpoint` (open) descends from."""
        ck = self._cks.get(checkpoint)
        return checkpoint if ck is None or ck.origin < 0 else ck.origin

    def new_checkpoint(
        self,
        checkpoint: int,
        key: Key,
        offsets: tuple[int, ...],
        until_ms: int,
        origin: int | None = None,
    ) -> OpenCheckpoint:
        """Open a checkpoint (no messages yet) and push its deadline; `origin`: the
        pop a re-timing descends from (`origin_of` the checkpoint it replaces)."""
        origin = checkpoint if origin is None else origin
        ck = self._cks[checkpoint] = OpenCheckpoint(key, offsets, until_ms, origin=origin)
        heapq.heappush(self.expiry, (until_ms, checkpoint))
        if len(self.expiry) > self.compact_at:
            self._compact_expiry()
        return ck

    def set_inflight(self, state: QueueState, offset: int, inflight: InFlight) -> None:
        """`offset` in flight under `inflight.checkpoint` (made by `new_checkpoint`)."""
        old = state.inflight.get(offset)
        if old is not None:
            self.unref(old.checkpoint)
        redelivery = state.redeliver.pop(offset, None)
        if redelivery is not None:
            self.unref(redelivery.checkpoint)
        state.inflight[offset] = inflight
        self._cks[inflight.checkpoint].live += 1

    def start_batch(
        self, state: QueueState, offsets: Sequence[int], attempts: Sequence[int], end: int
    ) -> None:
        """An ordered queue's new batch (`offsets`, read up to `end`), before its
        messages are put in flight: it replaces the last one, as Apache's
        ConsumerOrderInfoManager keeps one batch per queue. What of the last is
        still unresolved — waiting for redelivery, or on a replay still in flight
        under the old checkpoint — is let go; from `end` on the queue reads as
        never handed out. Live pops and a replay of their checkpoints do the same."""
        for offset in [*state.inflight, *state.redeliver]:
            self.resolve(state, offset)
        state.batch = dict(zip(offsets, attempts, strict=True))
        state.pop_offset = max(state.committed, end)

    def add_inflight(self, state: QueueState, offsets: list[int], inflight: InFlight) -> None:
        """Offsets never handed out, in flight under `inflight.checkpoint` at once."""
        state.inflight.update(dict.fromkeys(offsets, inflight))
        self._cks[inflight.checkpoint].live += len(offsets)

    def _compact_expiry(self) -> None:
        """Drop the deadlines of checkpoints already resolved (they stay in the
        heap when that happens): with long invisibility times and fast acks, the
        heap would otherwise hold every pop of the last hours."""
        live = [(ck.until_ms, checkpoint) for checkpoint, ck in self._cks.items()]
        heapq.heapify(live)
        self.expiry = live
        self.compact_at = max(COMPACT_AT, 4 * len(live))

    def take_expired(
        self, now: int, limit: int
    ) -> tuple[dict[Key, list[tuple[int, InFlight]]], list[tuple[int, int]]]:
        """The messages due by `now` (up to `limit`), per queue, and the deadlines popped."""
        expired: dict[Key, list[tuple[int, InFlight]]] = {}
        heap = self.expiry
        taken: list[tuple[int, int]] = []
        count = 0
        while heap and heap[0][0] <= now and count < limit:
            until, checkpoint = heapq.heappop(heap)
            ck = self._cks.get(checkpoint)
            state = self.queues.get(ck.key) if ck is not None else None
            if ck is None or state is None:
                continue
            taken.append((until, checkpoint))
            for offset in ck.offsets:
                inflight = state.inflight.get(offset)
                if inflight is not None and inflight.checkpoint == checkpoint:
                    expired.setdefault(ck.key, []).append((offset, inflight))
                    count += 1
        return expired, taken

    def put_back(self, deadlines: list[tuple[int, int]]) -> None:
        """Deadlines taken but not all handled: due again (handled ones are skipped)."""
        for entry in deadlines:
            heapq.heappush(self.expiry, entry)

    def resolve(self, state: QueueState, offset: int) -> None:
        """`offset` resolved: no longer in flight nor waiting for redelivery."""
        inflight = state.inflight.pop(offset, None)
        if inflight is not None:
            self.unref(inflight.checkpoint)
        redelivery = state.redeliver.pop(offset, None)
        if redelivery is not None:
            self.unref(redelivery.checkpoint)

    def unref(self, checkpoint: int, count: int = 1) -> None:
        """`count` messages of `checkpoint` resolved or re-timed; closed at none left."""
        ck = self._cks[checkpoint]
        ck.live -= count
        if ck.live <= 0:
            del self._cks[checkpoint]

    def advance(self, state: QueueState) -> None:
        """Move the committed offset up to the lowest unresolved one, and commit it."""
        low = state.low()
        if low > state.committed:
            state.committed = low
            group, topic, queue_id = state.key
            self.offsets.commit(group, topic, queue_id, low)

    def skip_deleted(self, state: QueueState, new_min: int) -> None:
        """Resolve what retention deleted below `new_min` before it was consumed."""
        log.warning(
            "pop: group %s skips %d messages of %s/%d that retention deleted before they "
            "were consumed",
            state.key[0],
            new_min - state.pop_offset,
            state.key[1],
            state.key[2],
        )
        for offset in [o for o in state.inflight if o < new_min]:
            self.resolve(state, offset)
        for offset in [o for o in state.redeliver if o < new_min]:
            self.resolve(state, offset)
        state.pop_offset = new_min
        self.advance(state)

    def group(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, created on first use when auto-creation is on."""
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

    async def records_of(
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


def delivery_attempt(queue_topic: str, message: record.StoredMessage) -> int:
    """Which delivery of a normal group this is: a retry copy counts the
    deliveries before it in its reconsume times; any other message (including
    a dead letter read back by another group) is on its first."""
    if queue_topic.startswith(RETRY_TOPIC_PREFIX):
        return message.reconsume_times + 1
    return 1


def check_invisible(invisible_ms: int, least_ms: int = MIN_INVISIBLE_MS) -> None:
    """A pop's invisibility (1 s .. 12 h), or with `least_ms` a change's (RocketMQ's
    ChangeInvisibleDuration takes anything from 0 to its 12 h)."""
    if not least_ms <= invisible_ms <= MAX_INVISIBLE_MS:
        raise InvalidArgument(
            "invisible_ms",
            f"{invisible_ms} is outside {least_ms}..{MAX_INVISIBLE_MS} "
            f"({least_ms / 1000:g} s .. 12 h)",
        )


def stale_reason(state: QueueState | None, queue_offset: int) -> str:
    if state is not None and queue_offset < state.committed:
        return "already resolved: acknowledged, or redelivered after its invisibility ended"
    if state is not None and queue_offset in state.redeliver:
        return "its invisibility ended; it will be delivered again with a new handle"
    return (
        "not in flight under this handle: acknowledged, redelivered, or replaced by "
        "ChangeInvisibleTime"
    )
