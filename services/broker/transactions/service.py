"""The transaction use cases: prepare, end (commit, rollback, unknown) and the
check-back of halves left undecided — RocketMQ's TransactionalMessageService,
with exactly-once decisions.

Records, as RocketMQ 4.9 writes them:
- a **half**: the producer's message in queue 0 of `RMQ_SYS_TRANS_HALF_TOPIC`,
  its real topic and queue in REAL_TOPIC / REAL_QID, the transaction bits
  cleared from its sysflag, PGROUP = the producer group, TRAN_MSG=true, and
  (as RocketMQ 5 writes it) `__transactionId__` = its UNIQ_KEY, which the
  committed copy keeps;
- a **commit**: the half copied to its real topic and queue with sysflag
  commit type (0x8), PREPAREDTRANSACTIONOFFSET = the half's commit offset,
  without REAL_TOPIC, REAL_QID and TRAN_MSG;
- an **op record** in queue 0 of `RMQ_SYS_TRANS_OP_HALF_TOPIC`, tag `d`, body
  = the transaction's queue offset in the half queue as text; ferry adds
  FERRY_TRAN_DECISION (COMMIT, ROLLBACK, DISCARD);
- a **check copy**: each check-back appends the half again with
  TRANSACTION_CHECK_TIMES + 1 and TRAN_PREPARED_QUEUE_OFFSET = the original's
  queue offset, so the count survives restarts and replicates to slaves.

A transaction is known by its original half's queue offset (its *key*): every
copy maps back to it. A pending one is found by its message id too (UNIQ_KEY,
what RocketMQ 5's SDKs call the transaction id: `end_by_msg_id`). A commit and its op record are one commit-log append
(`MessageStore.append_decisions`), so a crash or a cut replication stream can
separate them only at the very end of the log; `load` writes the missing op of
such a tail commit. A decision is taken once: the key leaves the pending table
before anything awaits, and a second END for it (a duplicate, a late answer
after a check, a retry after failover) finds it decided and changes nothing.
A rollback writes only its op record: nothing reaches the real topic.

Progress is RocketMQ's: group `CID_RMQ_SYS_TRANS` in the consumer-offset table
holds, for the half queue, the lowest queue offset a restart must read, and for
the op queue the first op record that can matter to those halves. `load`
rebuilds the pending table from there (on every start as master, failover
included).

Runs on the event loop thread, on a master only; one task (`run`) checks back.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ferry import record
from ferry.model import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import FailedPrecondition, FerryError, InvalidArgument, NotFound
from ferry.runtime.tasks import run_rounds
from services.broker.messaging.outgoing import OutgoingMessage, Staged, packed_host
from services.broker.messaging.rules import OffsetTable, TopicLookup, real_destination
from services.broker.messaging.send import Settler
from services.broker.messaging.staging import Stager
from services.broker.store import MessageIn, MessageStore

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # where a discarded half is kept, as Apache
CHECKPOINT_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"

PROPERTY_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_DECISION = "FERRY_TRAN_DECISION"

# sysFlag transaction types (RocketMQ's MessageSysFlag).
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC

SCAN_BATCH = 1024
FRESH_MAX_BYTES = 64 << 20  # commits kept ready for halves not yet decided (`_remember`)
RECENT_DECIDED = 65_536  # commit offsets (and msg ids) of decided ones, for cheap duplicates


class Decision(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"
    DISCARD = "DISCARD"  # checked transactionCheckMax times without an answer


class EndResult(enum.Enum):
    DECIDED = "DECIDED"  # this call decided it
    ALREADY_DECIDED = "ALREADY_DECIDED"  # decided before: nothing changed
    PENDING = "PENDING"  # UNKNOWN: still waiting, checked back later


@dataclass(frozen=True)
class TransactionConfig:
    """RocketMQ's broker keys: transactionTimeOut, transactionCheckInterval,
    transactionCheckMax."""

    timeout_ms: int = 6_000
    check_interval_ms: int = 60_000
    check_max: int = 15


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """One check-back, as every door needs it: RocketMQ's
    CHECK_TRANSACTION_STATE header fields and body."""

    group: str
    topic: str  # the real topic
    body: bytes  # the half as a record under its real topic and queue
    queue_offset: int  # tranStateTableOffset: this copy's half-queue offset
    commit_offset: int  # this copy's commit offset
    msg_id: str  # UNIQ_KEY (the client's id), also the transaction id
    offset_msg_id: str


# A door's way to its producers: True when the check went to a live producer
# of the group (RocketMQ's TCP protocol: services.broker.remoting.transactions).
Checker = Callable[[CheckRequest], bool]


@dataclass(slots=True)
class Half:
    """A pending transaction: its key and its latest half copy."""

    key: int
    queue_offset: int
    commit_offset: int
    size: int
    born_ms: int
    stored_ms: int
    check_times: int
    immunity_ms: int
    group: str
    topic: str
    uniq: str
    copies: list[int] = dataclasses.field(default_factory=list)  # commit offsets, oldest first


class TransactionService:
    def __init__(
        self,
        store: MessageStore,
        stager: Stager,
        settler: Settler,
        topics: TopicLookup,
        checkpoints: OffsetTable,
        clock: Clock,
        config: TransactionConfig = TransactionConfig(),  # noqa: B008 - frozen
    ) -> None:
        """`stager`: checks a half as a send to its topic and appends it;
        `settler`: waits for a commit as for a send (flush, slaves, fence)."""
        self.store = store
        self.stager = stager
        self.settler = settler
        self.topics = topics
        self.checkpoints = checkpoints
        self.clock = clock
        self.config = config
        # Since this run started (metrics read them at scrape time).
        self.counts = {"commit": 0, "rollback": 0, "check": 0, "discard": 0}
        self._pending: dict[int, Half] = {}  # key -> latest copy
        self._deciding: dict[int, Half] = {}  # taken out of pending, not yet written
        self._keys: dict[int, int] = {}  # commit offset of a pending key's copy -> key
        self._recent: dict[int, int] = {}  # commit offset of a decided copy -> key
        self._by_uniq: dict[str, int] = {}  # UNIQ_KEY of a pending half -> key
        self._recent_uniq: dict[str, int] = {}  # UNIQ_KEY of a decided one -> key
        self._fresh: dict[int, tuple[str, int, MessageIn]] = {}  # key -> its commit, ready
        self._fresh_bytes = 0
        self._checkers: list[Checker] = []
        self._loaded = False

    # ------------------------------------------------------------ doors

    def register_checker(self, checker: Checker) -> Callable[[], None]:
        """Add a door's way to reach producers; returns its removal."""
        self._checkers.append(checker)

        def remove() -> None:
            if checker in self._checkers:
                self._checkers.remove(checker)

        return remove

    @property
    def pending_count(self) -> int:
        return len(self._pending) + len(self._deciding)

    # ------------------------------------------------------------ prepare

    def prepare(
        self, topic: str, queue_id: int | None, message: OutgoingMessage, producer_group: str
    ) -> Staged:
        """Check a prepared send as any send to `topic` and append its half
        (not waited for: the send use case's `settle` does). The outcome's
        msg ids, queue offset and commit offset are the half's.

        Raises the send's errors (messaging's `Stager`), nothing appended.
        """
        [result] = self.prepare_many([(topic, queue_id, message, producer_group)])
        if isinstance(result, FerryError):
            raise result
        return result

    def prepare_many(
        self, sends: Sequence[tuple[str, int | None, OutgoingMessage, str]]
    ) -> list[Staged | FerryError]:
        """`prepare` for a run of prepared sends (topic, queue id or None,
        message, producer group): each checked on its own, a refusal taking its
        place in the answer, the halves appended together.

        Raises Unavailable on a storage fault (nothing of the call is answered).
        """
        halves: list[tuple[str, int | None, OutgoingMessage]] = []
        refused: dict[int, FerryError] = {}
        for i, (topic, queue_id, message, group) in enumerate(sends):
            if not (group or message.properties.get(PROPERTY_PRODUCER_GROUP)):
                refused[i] = InvalidArgument(
                    "producerGroup", "a transactional message needs its producer group"
                )
                continue
            props = message.properties
            uniq = props.get(PROPERTY_UNIQ_KEY)
            if (
                props.get(PROPERTY_PRODUCER_GROUP) != group
                or props.get(PROPERTY_TRANSACTION_PREPARED) != "true"
                or (uniq and props.get(PROPERTY_TRANSACTION_ID) != uniq)
            ):
                props = dict(props)
                props.setdefault(PROPERTY_PRODUCER_GROUP, group)
                props[PROPERTY_TRANSACTION_PREPARED] = "true"
                if uniq:
                    props[PROPERTY_TRANSACTION_ID] = uniq
                message = dataclasses.replace(message, properties=props)
            message.sys_flag &= ~TRANSACTION_TYPE_MASK
            halves.append((topic, queue_id, message))
        out: list[Staged | FerryError] = []
        timeout_ms = self.config.timeout_ms
        results = self.stager.stage_halves(halves, HALF_TOPIC)
        for (topic, queue_id, message), result in zip(halves, results, strict=True):
            if isinstance(result, FerryError):
                out.append(result)
                continue
            staged, size = result
            r, k = staged.result, staged.index or 0
            key = r.queue_offset + k
            commit_offset = r.commit_offsets[k]
            props = message.properties
            if queue_id is not None:
                self._remember(key, topic, queue_id, message)
            self._add(
                Half(  # positional: one per transaction (key, queue offset, commit offset, size,
                    # born, stored, checks, immunity, group, topic, uniq)
                    key,
                    key,
                    commit_offset,
                    size,
                    message.born_timestamp or r.store_timestamp,
                    r.store_timestamp,
                    0,
                    self._immunity_ms(props) if PROPERTY_CHECK_IMMUNITY_S in props else timeout_ms,
                    props[PROPERTY_PRODUCER_GROUP],
                    topic,
                    props.get(PROPERTY_UNIQ_KEY, ""),
                )
            )
            out.append(staged)
        if refused:  # put the refusals back in their places
            staged_in_order = iter(out)
            out = [refused.get(i) or next(staged_in_order) for i in range(len(sends))]
        return out

    # ------------------------------------------------------------ end

    async def end(
        self,
        producer_group: str,
        commit_offset: int,
        decision: Decision,
        from_check: bool = False,
        wait: bool = False,
    ) -> EndResult:
        """The producer's decision on the transaction whose half (or check
        copy) starts at `commit_offset`. COMMIT appends the message to its
        real topic and the op record together; ROLLBACK the op record only;
        UNKNOWN changes nothing. A transaction decided before is left as it
        is. `wait`: return once the records are stored as a send's would be.

        Raises:
            NotFound: no half starts at `commit_offset`.
            FailedPrecondition: the half belongs to another producer group.
            ResourceExhausted, Unavailable: not written (still pending).
        """
        [result] = await self.end_many(
            [(producer_group, commit_offset, decision, from_check)], wait
        )
        if isinstance(result, FerryError):
            raise result
        return result

    async def end_by_msg_id(
        self,
        producer_group: str,
        msg_id: str,
        decision: Decision,
        from_check: bool = False,
        wait: bool = False,
    ) -> EndResult:
        """`end` for the transaction whose half carries UNIQ_KEY = `msg_id`, as
        RocketMQ 5's SDKs name it (a proxy that does not know where the half
        lies asks each master). Of two pending halves with one id (a send
        retried), the latest.

        Raises:
            NotFound: no transaction of that id is pending here, nor was decided
                lately (a restart or a failover forgets the decided ones).
            and `end`'s errors.
        """
        key = self._by_uniq.get(msg_id) if msg_id else None
        half = self._pending.get(key) if key is not None else None
        if half is None:
            if key is not None or msg_id in self._recent_uniq:
                return EndResult.ALREADY_DECIDED  # being written, or written
            raise NotFound(f"no pending transaction with message id {msg_id[:80]!r} here")
        return await self.end(producer_group, half.commit_offset, decision, from_check, wait)

    async def end_many(
        self, ends: Sequence[tuple[str, int, Decision, bool]], wait: bool = False
    ) -> list[EndResult | FerryError]:
        """`end` for a run of decisions (producer group, commit offset,
        decision, from a check) as they arrived: each checked on its own, a
        refusal taking its place in the answer; those that decide something
        are written in one commit-log append. Two decisions on one
        transaction in the run: the first one counts."""
        out: list[EndResult | FerryError | None] = [None] * len(ends)
        chosen: list[tuple[int, Half, Decision]] = []
        pending, keys = self._pending, self._keys
        for i, (group, commit_offset, decision, from_check) in enumerate(ends):
            # The usual END: a pending copy, its own group, a decision.
            half = pending.get(keys.get(commit_offset, -1))
            if half is None or half.group != group or decision is Decision.UNKNOWN:
                try:
                    half = await self._resolve(group, commit_offset, decision, from_check)
                except FerryError as exc:
                    out[i] = exc
                    continue
                if isinstance(half, EndResult):
                    out[i] = half
                    continue
            self._take(half)  # before any await: a concurrent END finds it decided
            chosen.append((i, half, decision))
        if chosen:
            try:
                staged = await self._write([(h, d) for _, h, d in chosen])
            except FerryError as exc:
                for i, _, _ in chosen:
                    out[i] = exc
            else:
                for i, _, _ in chosen:
                    out[i] = EndResult.DECIDED
                if wait:
                    await self._settle(staged)
        return out  # type: ignore[return-value]

    async def _resolve(
        self, producer_group: str, commit_offset: int, decision: Decision, from_check: bool
    ) -> Half | EndResult:
        """The pending transaction an END names, or what to answer without
        writing anything (decided before, or UNKNOWN)."""
        key = self._keys.get(commit_offset)
        if key is None:
            key = self._recent.get(commit_offset)
            if key is None:
                key = await self._key_at(commit_offset)
        half = self._pending.get(key)
        if half is None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "END_TRANSACTION %s for transaction %d (commit offset %d, group %s): "
                    "decided before, nothing to do",
                    decision.value, key, commit_offset, producer_group,
                )  # fmt: skip
            return EndResult.ALREADY_DECIDED
        if half.group != producer_group:
            raise FailedPrecondition(
                f"The producer group wrong: the transaction at commit offset {commit_offset} "
                f"belongs to {half.group!r}, not {producer_group!r}"
            )
        if decision is Decision.UNKNOWN:
            if from_check:
                log.info(
                    "transaction still unknown to its producer: group=%s topic=%s msgId=%s "
                    "checks=%d",
                    half.group, half.topic, half.uniq, half.check_times,
                )  # fmt: skip
            return EndResult.PENDING
        return half

    async def _decide(self, half: Half, decision: Decision) -> list[Staged]:
        """Write the decision on `half` (taken out of the pending table here)."""
        self._take(half)
        return await self._write([(half, decision)])

    async def _write(self, decided: Sequence[tuple[Half, Decision]]) -> list[Staged]:
        """Write decisions on halves already taken out of the pending table
        (COMMIT, ROLLBACK or DISCARD) in one append; on failure they are
        pending again. The committed messages' appends, for `_settle`."""
        try:
            parts: list[tuple[str, int, list[MessageIn]]] = []
            commits: list[int] = []  # indexes of committed messages among the parts
            now_ms = self.clock.wall_ms()
            for half, decision in decided:
                fresh = self._forget(half.key)
                if decision is Decision.COMMIT and fresh is not None and not half.check_times:
                    topic, queue_id, message = fresh
                    if self.topics.get(topic) is not None:
                        message.prepared_offset = half.commit_offset
                        commits.append(len(parts))
                        parts.append((topic, queue_id, [message]))
                        parts.append((OP_TOPIC, 0, [self._op(half.key, decision, now_ms)]))
                        continue
                if decision in (Decision.COMMIT, Decision.DISCARD):
                    stored = await self.store.read_full(half.commit_offset, half.size)
                    if stored is None:
                        raise NotFound(
                            f"the half of transaction {half.key} at commit offset "
                            f"{half.commit_offset} is gone (deleted by retention?)"
                        )
                    if decision is Decision.DISCARD:
                        copy = _copy(stored, dict(stored.properties))
                        parts.append((CHECK_MAX_TOPIC, 0, [copy]))
                    elif (committed := self._committed(stored, half.commit_offset)) is not None:
                        commits.append(len(parts))
                        parts.append(committed)
                    else:
                        log.error(
                            "transaction committed but its topic %r is gone: group=%s msgId=%s; "
                            "recorded as decided, nothing delivered",
                            half.topic, half.group, half.uniq,
                        )  # fmt: skip
                parts.append((OP_TOPIC, 0, [self._op(half.key, decision, now_ms)]))
            started = time.perf_counter()
            results = self.store.append_decisions(parts, check_space=bool(commits))
        except BaseException:
            for half, _ in decided:
                self._untake(half)
            raise
        counts = self.counts
        for half, decision in decided:
            self._done(half)
            counts[_COUNTED[decision]] += 1
        staged = [Staged(results[i].topic, results[i], started) for i in commits]
        return staged or [Staged(OP_TOPIC, results[-1], started)]

    async def _settle(self, staged: list[Staged]) -> None:
        """Wait for the decisions' records as a send waits (flush, slave)."""
        if staged[0].result.topic == OP_TOPIC:
            await self.store.wait_stored(staged[0].result.end_offset)
        else:
            await self.settler.settle(staged)

    async def _key_at(self, commit_offset: int) -> int:
        """The key of the half copy that starts at `commit_offset`, read from the log.

        Raises:
            NotFound: no half starts there (Apache: "Find prepared transaction message failed").
        """
        stored = await self.store.read_full(commit_offset)
        if stored is None or stored.topic != HALF_TOPIC:
            raise NotFound(
                f"Find prepared transaction message failed: no half message at commit offset "
                f"{commit_offset}"
            )
        return _key_of(stored.properties, stored.queue_offset)

    def _remember(self, key: int, topic: str, queue_id: int, message: OutgoingMessage) -> None:
        """Keep what a commit of a fresh half appends, so that the usual commit
        (moments after the prepare) does not read the half back from the log.
        Bounded by FRESH_MAX_BYTES; what is not kept is read when needed."""
        if (
            self._fresh_bytes > FRESH_MAX_BYTES
            or message.born_host is None
            or not message.born_timestamp
            or "DELAY" in message.properties  # the store drops a DELAY of 0 or less
        ):
            return
        properties = dict(message.properties)
        properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
        if message.tags:
            properties[record.PROPERTY_TAGS] = message.tags
        if message.keys:
            properties[record.PROPERTY_KEYS] = message.keys
        committed = MessageIn(  # positional: once per transaction
            message.body,
            record.encode_properties(properties),
            message.flag,
            message.born_timestamp,
            packed_host(message.born_host),  # as the half stores it
            (message.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT,
            message.reconsume_times,
        )
        self._fresh[key] = (topic, queue_id, committed)
        self._fresh_bytes += len(message.body) + len(committed.properties)

    def _forget(self, key: int) -> tuple[str, int, MessageIn] | None:
        fresh = self._fresh.pop(key, None)
        if fresh is not None:
            self._fresh_bytes -= len(fresh[2].body) + len(fresh[2].properties)
        return fresh

    def _committed(
        self, stored: record.Record, half_offset: int
    ) -> tuple[str, int, list[MessageIn]] | None:
        properties = dict(stored.properties)
        destination = real_destination(properties, self.topics)
        if destination is None:
            return None
        properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
        message = _copy(stored, properties)
        message.sys_flag = (stored.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT
        message.prepared_offset = half_offset
        return destination[0], destination[1], [message]

    def _op(self, key: int, decision: Decision, now_ms: int) -> MessageIn:
        return MessageIn(
            str(key).encode(), _OP_PROPERTIES[decision], 0, now_ms, self.store.packed_store_host
        )

    # ------------------------------------------------------------ check-back

    async def run(self) -> None:
        if not self._loaded:
            await self.load()
        await run_rounds("transaction check", self._round)

    async def _round(self) -> None:
        await self.check_once()
        await asyncio.sleep(self.config.check_interval_ms / 1000)

    async def check_once(self) -> int:
        """One pass over the pending transactions: each one past its immunity
        time (transactionTimeOut, or its CHECK_IMMUNITY_TIME_IN_SECONDS), and
        at least transactionTimeOut after its last check, is checked back —
        or discarded once it was checked transactionCheckMax times. Returns
        how many were checked or discarded."""
        now = self.clock.wall_ms()
        confirm = self.store.confirm_offset
        timeout = self.config.timeout_ms
        done = 0
        for half in list(self._pending.values()):
            if now - half.born_ms < half.immunity_ms:
                continue
            if half.check_times and now - half.stored_ms < timeout:
                continue
            if half.commit_offset + half.size > confirm:
                continue  # not acknowledged yet (SYNC_MASTER): not the producer's either
            if self._pending.get(half.key) is not half:
                continue  # decided meanwhile
            if half.check_times >= self.config.check_max:
                await self._discard(half)
            else:
                await self._check(half)
            done += 1
        return done

    async def _discard(self, half: Half) -> None:
        await self._decide(half, Decision.DISCARD)
        log.warning(
            "transaction discarded after %d checks without an answer: group=%s topic=%s msgId=%s "
            "(kept in %s)",
            half.check_times, half.group, half.topic, half.uniq, CHECK_MAX_TOPIC,
        )  # fmt: skip

    async def _check(self, half: Half) -> None:
        """Append the next check copy of `half` and ask a producer of its group."""
        stored = await self.store.read_full(half.commit_offset, half.size)
        if self._pending.get(half.key) is not half:
            return  # decided while reading
        if stored is None:
            log.error(
                "transaction %d: its half at commit offset %d is gone; dropped",
                half.key, half.commit_offset,
            )  # fmt: skip
            self._take(half)
            self._done(half)
            return
        self._forget(half.key)  # a commit after a check copies the check copy, as Apache
        properties = dict(stored.properties)
        properties[PROPERTY_CHECK_TIMES] = str(half.check_times + 1)
        properties[PROPERTY_PREPARED_QUEUE_OFFSET] = str(half.key)
        copy = _copy(stored, properties)
        copy.sys_flag = stored.sys_flag
        result = self.store.append_due(HALF_TOPIC, 0, [copy])
        commit_offset = result.commit_offsets[0]
        half.queue_offset = result.queue_offset
        half.commit_offset = commit_offset
        half.size = result.end_offset - commit_offset
        half.stored_ms = result.store_timestamp
        half.check_times += 1
        half.copies.append(commit_offset)
        self._keys[commit_offset] = half.key
        try:
            queue_id = int(properties.get("REAL_QID", "0"))
        except ValueError:
            queue_id = 0
        body = record.encode(
            dataclasses.replace(
                stored,
                topic=half.topic,
                queue_id=queue_id,
                queue_offset=result.queue_offset,
                commit_offset=commit_offset,
                store_timestamp=result.store_timestamp,
                properties=properties,
                body_crc=-1,
            )
        )
        request = CheckRequest(
            group=half.group,
            topic=half.topic,
            body=body,
            queue_offset=result.queue_offset,
            commit_offset=commit_offset,
            msg_id=half.uniq,
            offset_msg_id=result.msg_ids[0],
        )
        sent = False
        for checker in list(self._checkers):
            try:
                sent = checker(request)
            except Exception:
                log.exception("transaction check through %r failed", checker)
            if sent:
                break
        if sent:
            self.counts["check"] += 1
        else:
            log.warning(
                "transaction check %d not sent: no producer of group %s is connected "
                "(topic=%s msgId=%s)",
                half.check_times, half.group, half.topic, half.uniq,
            )  # fmt: skip

    # ------------------------------------------------------------ state

    def _add(self, half: Half) -> None:
        old = self._pending.get(half.key)
        if old is None:
            half.copies = [half.commit_offset]
        else:
            half.copies = [*old.copies, half.commit_offset]
        self._pending[half.key] = half
        self._keys[half.commit_offset] = half.key
        if half.uniq:
            self._by_uniq[half.uniq] = half.key

    def _take(self, half: Half) -> None:
        del self._pending[half.key]
        self._deciding[half.key] = half

    def _untake(self, half: Half) -> None:
        self._deciding.pop(half.key, None)
        self._pending[half.key] = half

    def _done(self, half: Half) -> None:
        key = half.key
        self._deciding.pop(key, None)
        self._forget(key)
        keys, recent = self._keys, self._recent
        for offset in half.copies:
            keys.pop(offset, None)
            recent[offset] = key
        if len(recent) > RECENT_DECIDED:
            for offset in list(self._recent)[: RECENT_DECIDED // 2]:
                del self._recent[offset]
        uniq = half.uniq
        if uniq:
            if self._by_uniq.get(uniq) == key:
                del self._by_uniq[uniq]
            self._recent_uniq[uniq] = key
            if len(self._recent_uniq) > RECENT_DECIDED:
                for stale in list(self._recent_uniq)[: RECENT_DECIDED // 2]:
                    del self._recent_uniq[stale]

    def _immunity_ms(self, properties: Mapping[str, str]) -> int:
        """How long after its birth a half is left unchecked: its
        CHECK_IMMUNITY_TIME_IN_SECONDS when that reads as seconds, else
        transactionTimeOut (Apache's rule)."""
        raw = properties.get(PROPERTY_CHECK_IMMUNITY_S)
        if raw:
            try:
                seconds = int(raw)
            except ValueError:
                seconds = -1
            if seconds >= 0:
                return seconds * 1000
        return self.config.timeout_ms

    def held_from(self) -> int | None:
        """The lowest commit offset a pending half copy is stored at (what
        retention must keep), or None when nothing is pending."""
        halves = [*self._pending.values(), *self._deciding.values()]
        return min((h.commit_offset for h in halves), default=None)

    # ------------------------------------------------------------ load, checkpoint

    async def load(self) -> int:
        """Rebuild the pending table from the checkpoint (every half from the
        half-queue mark on whose key no op record names), then give a commit
        left without its op record at the log's end its op. Returns how many
        transactions are pending."""
        self._pending.clear()
        self._deciding.clear()
        self._keys.clear()
        self._by_uniq.clear()
        self._fresh.clear()
        self._fresh_bytes = 0
        half_from = self.checkpoints.query(CHECKPOINT_GROUP, HALF_TOPIC, 0) or 0
        op_from = self.checkpoints.query(CHECKPOINT_GROUP, OP_TOPIC, 0) or 0
        decided: set[int] = set()
        async for _, stored in self._scan(OP_TOPIC, op_from):
            try:
                decided.add(int(stored.body))
            except ValueError:
                log.error("transactions: unreadable op record at %d", stored.commit_offset)
        async for queue_offset, stored in self._scan(HALF_TOPIC, half_from):
            key = _key_of(stored.properties, queue_offset)
            if key in decided:
                continue
            props = stored.properties
            try:
                check_times = int(props.get(PROPERTY_CHECK_TIMES, "0"))
            except ValueError:
                check_times = 0
            self._add(
                Half(
                    key=key,
                    queue_offset=queue_offset,
                    commit_offset=stored.commit_offset,
                    size=stored.size,
                    born_ms=stored.born_timestamp,
                    stored_ms=stored.store_timestamp,
                    check_times=check_times,
                    immunity_ms=self._immunity_ms(props),
                    group=props.get(PROPERTY_PRODUCER_GROUP, ""),
                    topic=props.get("REAL_TOPIC", ""),
                    uniq=props.get(PROPERTY_UNIQ_KEY, ""),
                )
            )
        await self._repair_tail()
        self._loaded = True
        if self._pending:
            log.info(
                "transactions: %d pending (half queue from %d, op queue from %d)",
                len(self._pending), half_from, op_from,
            )  # fmt: skip
        return len(self._pending)

    async def _scan(self, topic: str, start: int):
        queue = self.store.queue_view(topic, 0)
        if queue is None:
            return
        offset = max(start, queue.min_offset)
        while offset < queue.max_offset:
            entries = queue.entries(offset, SCAN_BATCH)
            if not entries:
                return
            for i, stored in enumerate(await self.store.read_entries(entries)):
                if stored is not None:
                    yield offset + i, stored
            offset += len(entries)

    async def _repair_tail(self) -> None:
        """A commit is appended with its op record; only the last record of
        the log can be a commit whose op record was cut off (a crash, or a
        replication stream cut between the two). Write that op now."""
        await self.store.wait_dispatched()
        last: tuple[int, int, str] | None = None
        for topic, queue_id, max_offset in self.store.queue_ends():
            view = self.store.queue_view(topic, queue_id)
            if view is None or max_offset <= view.min_offset:
                continue
            commit_offset, size, _ = view.entry(max_offset - 1)
            if last is None or commit_offset > last[0]:
                last = (commit_offset, size, topic)
        if last is None or last[2] in (HALF_TOPIC, OP_TOPIC):
            return
        commit_offset, size, _ = last
        if commit_offset + size != self.store.max_offset:
            return
        stored = await self.store.read_full(commit_offset, size)
        if stored is None or stored.sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_COMMIT:
            return
        try:
            key = await self._key_at(stored.prepared_transaction_offset)
        except NotFound:
            return
        half = self._pending.get(key)
        if half is None:
            return
        self._take(half)
        try:
            self.store.append_decisions(
                [(OP_TOPIC, 0, [self._op(key, Decision.COMMIT, self.clock.wall_ms())])],
                check_space=False,
            )
        except BaseException:
            self._untake(half)
            raise
        self._done(half)
        log.warning(
            "transactions: the commit at the log's end (commit offset %d, group %s, msgId %s) "
            "had no op record; written now",
            commit_offset, half.group, half.uniq,
        )  # fmt: skip

    def checkpoint(self) -> tuple[int, int]:
        """Record (in the consumer-offset table, persisted and synced to slaves
        with it) where `load` starts: the lowest half-queue offset of a pending
        transaction's latest copy, and the first op record written after it."""
        half_q = self.store.queue_view(HALF_TOPIC, 0)
        op_q = self.store.queue_view(OP_TOPIC, 0)
        halves = [*self._pending.values(), *self._deciding.values()]
        half_max = half_q.max_offset if half_q is not None else 0
        low = min((h.queue_offset for h in halves), default=half_max)
        if op_q is None:
            op_from = 0
        elif half_q is None or low >= half_q.max_offset or low < half_q.min_offset:
            op_from = op_q.max_offset
        else:
            after = half_q.entry(low)[0]
            first = op_q.min_offset
            op_from = first + bisect.bisect_right(_EntryOffsets(op_q, first), after)
        table = self.checkpoints
        if (table.query(CHECKPOINT_GROUP, HALF_TOPIC, 0) or 0) != low:
            table.commit(CHECKPOINT_GROUP, HALF_TOPIC, 0, low)
        if (table.query(CHECKPOINT_GROUP, OP_TOPIC, 0) or 0) != op_from:
            table.commit(CHECKPOINT_GROUP, OP_TOPIC, 0, op_from)
        return low, op_from


class _EntryOffsets:
    """A queue's entries' commit offsets as a sorted sequence (for bisect)."""

    def __init__(self, queue, first: int) -> None:
        self.queue = queue
        self.first = first

    def __len__(self) -> int:
        return self.queue.max_offset - self.first

    def __getitem__(self, i: int) -> int:
        return self.queue.entry(self.first + i)[0]


# The `counts` key of each decision written.
_COUNTED = {decision: decision.value.lower() for decision in Decision}

_OP_PROPERTIES = {
    decision: record.encode_properties(
        {record.PROPERTY_TAGS: REMOVE_TAG, PROPERTY_DECISION: decision.value}
    )
    for decision in Decision
}


def _key_of(properties: Mapping[str, str], queue_offset: int) -> int:
    raw = properties.get(PROPERTY_PREPARED_QUEUE_OFFSET)
    if raw:
        try:
            return int(raw)
        except ValueError:
            pass
    return queue_offset


def _copy(stored: record.Record, properties: Mapping[str, str]) -> MessageIn:
    return MessageIn(
        body=stored.body,
        properties=record.encode_properties(properties),
        flag=stored.flag,
        born_timestamp=stored.born_timestamp,
        born_host=record.pack_host(stored.born_host),
        sys_flag=stored.sys_flag & ~TRANSACTION_TYPE_MASK,
        reconsume_times=stored.reconsume_times,
    )
