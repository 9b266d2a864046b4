"""The broker's use cases for producers and consumers: send, pull, offsets.

Between the servicer (which only converts) and the message store (which
trusts its arguments) sit the rules: topic names, existence and permissions,
the broker's own permission and role, queue choice, size limits, the DELAY
property that diverts a message to the delay topic, tag filters and long
polling. Every check runs before anything is written, so a rejected request
changes nothing.

Runs on the event loop thread, like the store.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ferry import record
from ferry.model import (
    DEFAULT_RETRY_MAX_TIMES,
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_PREPARED,
    RETRY_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TopicConfig,
    check_name,
    check_topic,
    dlq_topic,
    is_system_topic,
)
from ferry.runtime import errors
from ferry.runtime.errors import (
    FerryError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from services.broker.messaging.rules import (
    GroupLookup,
    OffsetTable,
    TopicLookup,
    parse_sub_expression,
    real_destination,
)
from services.broker.messaging.stats import TrafficStats
from services.broker.store import (
    GetResult,
    GetStatus,
    KeyLookup,
    MessageIn,
    MessageStore,
    PutResult,
)

log = logging.getLogger(__name__)

DEFAULT_PULL_NUMS = 32
MAX_PULL_NUMS = 4096
MAX_WAIT_MS = 60_000
# Messages one lookup by key returns at most (RocketMQ's maxMsgsNumBatch), and by
# unique key (its defaultQueryMaxNum).
MAX_QUERY_NUM = 64
UNIQUE_QUERY_NUM = 32


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class MessageTooLarge(ResourceExhausted):
    """A body over maxMessageSize: refused wherever it is sent (unlike a full
    disk, which another broker may not have)."""


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class MessageLike(Protocol):
    """What a message to send must carry (an `OutgoingMessage`, or any object
    with these attributes: the servicer passes the requests' entries as they are)."""

    body: bytes
    tags: str
    keys: str
    properties: Mapping[str, str]
    flag: int
    born_timestamp: int


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class OutgoingMessage:
    """A message to send. Beyond `MessageLike`, what RocketMQ's own protocol
    carries per message and the record keeps: `sys_flag` (the compression
    bits), `born_host` (the producer's ("ip", port); None: the broker's
    default), `reconsume_times`; and `max_reconsume_times` (None: the group's
    retryMaxTimes), which decides where a send to a retry topic goes
    (`MessagingService.stage`). Messages without these attributes (ferry.v1's
    requests) count as 0 / None."""

    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp: int = 0
    sys_flag: int = 0
    born_host: tuple[str, int] | None = None
    reconsume_times: int = 0
    max_reconsume_times: int | None = None


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class SendOutcome:
    status: SendStatus
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    msg_ids: list[str]


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class Staged:
    """A send appended to the log and not yet waited for (`MessagingService.stage`)."""

    topic: str  # as the producer named it (a timed message is stored elsewhere)
    result: PutResult
    started: float  # perf_counter() at the append
    index: int | None = None  # one message of an append of several (`stage_each`)

    @property
    def count(self) -> int:
        return len(self.result.commit_offsets) if self.index is None else 1

    def outcome(self, status: SendStatus) -> SendOutcome:
        r, i = self.result, self.index
        if i is None:
            return SendOutcome(
                status, r.topic, r.queue_id, r.queue_offset, r.commit_offsets[0], r.msg_ids
            )
        return SendOutcome(
            status, r.topic, r.queue_id, r.queue_offset + i, r.commit_offsets[i], [r.msg_ids[i]]
        )


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class PullOutcome:
    result: GetResult
    suggest_which_broker_id: int = 0


# Replication (issue #4) plugs in here: given a stored batch, wait for a slave.
ReplicationWait = Callable[[PutResult], Awaitable[SendStatus]]


class MessagingService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicLookup,
        broker_permission: Callable[[], int],
        is_slave: bool,
        max_message_size: int,
        broker_name: str = "",
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        slave_read_enable: bool = False,
        groups: GroupLookup | None = None,
        hot_bytes: int | None = None,
        timer_max_delay_s: float = 3 * 86400,
        fence: Callable[[bool], None] | None = None,
        replication_wait: ReplicationWait | None = None,
        on_sent: Callable[[str, str, int, float, int], None] | None = None,
        create_topic: Callable[[TopicConfig], None] | None = None,
        on_lookup: Callable[[float], None] | None = None,
    ) -> None:
        """`replication_wait` (SYNC_MASTER): what a send waits for after its
        store, before SEND_OK (services.broker.cluster.replication);
        `on_sent` (metrics): (topic, status, messages, seconds, sends) after
        stored sends (`sends` of them, `messages` in all, each answered after
        `seconds`); `create_topic`: persists and announces a group's retry or
        dead-letter topic that a send needs and that does not exist yet (None:
        such a send is refused like any send to an unknown topic)."""
        self.create_topic = create_topic
        self.on_lookup = on_lookup  # metrics: seconds of each lookup by key
        self.timer_max_delay_ms = int(timer_max_delay_s * 1000)
        self.slave_read_enable = slave_read_enable
        self.groups = groups
        # RocketMQ's accessMessageInMemoryMaxRatio: a consumer further behind
        # than 40% of RAM reads from disk, and is sent to a slave if allowed.
        self.hot_bytes = hot_bytes if hot_bytes is not None else _ram_bytes() * 40 // 100
        self.store = store
        # Rates for RocketMQ's statistics codes (sampled by the app's task).
        self.stats = TrafficStats(
            time.monotonic, lambda: (store.put_message_count, store.get_message_count)
        )
        self.topics = topics
        self.broker_permission = broker_permission
        self.is_slave = is_slave
        self.max_message_size = max_message_size
        self.broker_name = broker_name
        self.replication_wait = replication_wait
        # Automatic failover: raises Unavailable while this master may not take
        # sends (`accepting=True`, checked before an append) or acknowledge them
        # (False, checked before SEND_OK and the like are answered).
        self.fence = fence
        self.on_sent = on_sent
        self._round_robin: dict[str, itertools.count] = {}
        self._born_host = record.pack_host(born_host)

    # ------------------------------------------------------------ send

    async def send(
        self,
        topic: str,
        queue_id: int | None,
        messages: Sequence[MessageLike],
        wait_store_msg_ok: bool = True,
        batch: bool = False,
    ) -> SendOutcome:
        staged = self.stage(topic, queue_id, messages, batch)
        status = await self.settle((staged,), wait_store_msg_ok)
        return staged.outcome(status)

    def stage(
        self,
        topic: str,
        queue_id: int | None,
        messages: Sequence[MessageLike],
        batch: bool = False,
    ) -> Staged:
        """Check a send and append it to the log, without waiting for a flush
        or a slave: `settle` does, once for any number of staged sends.

        A single message sent to a group's retry topic `%RETRY%<group>` (a
        consumer's own retry, as RocketMQ 4's clients send it) is routed as
        RocketMQ routes it: once its reconsume times reached its maximum, to
        the group's dead-letter topic `%DLQ%<group>` (queue 0, without DELAY);
        either topic is created on first use (`create_topic`).

        Raises the send's error (InvalidArgument, NotFound, PermissionDenied,
        ResourceExhausted), with nothing appended; Unavailable on a storage fault.
        """
        retry = topic.startswith(RETRY_TOPIC_PREFIX) and not batch and len(messages) == 1
        if retry:
            topic, queue_id, messages = self._retry_route(topic, queue_id, messages[0])
        config = self._writable(topic, create=retry)
        new_topic = retry and self.topics.get(topic) is None
        if not messages:
            raise InvalidArgument("messages", "a batch needs at least one message")
        queue_id = self._pick_queue(config, queue_id, _message_group(messages, batch))
        store_topic, store_queue = topic, queue_id
        encoded = []
        now = self.store.clock.wall_ms()
        timed = 0
        for index, message in enumerate(messages):
            where = f"messages[{index}]" if batch else "body"
            properties, delay_level, deliver_ms = self._properties(
                message, topic, queue_id, where, now, batch
            )
            if deliver_ms:
                timed += 1
                store_topic, store_queue = TIMER_TOPIC, 0
            if delay_level:
                if batch:
                    raise InvalidArgument(
                        f"messages[{index}].properties",
                        "DELAY is not supported in a batch; send delayed messages one by one",
                    )
                store_topic, store_queue = SCHEDULE_TOPIC, delay_level - 1
            encoded.append(self._message_in(message, properties, now))
        if timed and timed != len(encoded):
            raise InvalidArgument(
                "messages",
                f"{timed} of {len(encoded)} messages carry {PROPERTY_TIMER_DELIVER_MS}: a batch "
                "is timed as a whole or not at all; send them separately",
            )
        if new_topic and self.create_topic is not None:
            self.create_topic(config)  # the send passed every check: a refusal changes nothing
        started = time.perf_counter()
        result = self.store.append_sends(store_topic, store_queue, encoded)
        return Staged(topic, result, started)

    def stage_many(
        self, sends: Sequence[tuple[str, int | None, Sequence[MessageLike], bool]]
    ) -> list[Staged | FerryError]:
        """A run of sends (topic, queue id or None, messages, batch) as they
        arrived back to back, each checked on its own, a refusal taking its
        place in the answer. The single plain messages among them are
        appended together (`stage_each`); a batch, or a message to a retry
        topic (which `stage` may route to the dead-letter topic), is staged
        alone (`stage`) in its place in the order, after the single messages
        that came before it. `settle` then waits once for all of them.

        Raises Unavailable or StorageFault on a storage fault (nothing of the
        call is answered).
        """
        out: list[Staged | FerryError | None] = [None] * len(sends)
        singles: list[tuple[int, tuple[str, int | None, MessageLike]]] = []

        def append_singles() -> None:
            results = self.stage_each([send for _, send in singles])
            for (i, _), result in zip(singles, results, strict=True):
                out[i] = result
            singles.clear()

        for i, (topic, queue_id, messages, batch) in enumerate(sends):
            if not batch and len(messages) == 1 and not topic.startswith(RETRY_TOPIC_PREFIX):
                singles.append((i, (topic, queue_id, messages[0])))
                continue
            if singles:
                append_singles()
            try:
                out[i] = self.stage(topic, queue_id, messages, batch)
            except (errors.Unavailable, errors.StorageFault):
                raise
            except FerryError as exc:
                out[i] = exc
        if singles:
            append_singles()
        return out  # type: ignore[return-value]

    def stage_each(
        self, sends: Sequence[tuple[str, int | None, MessageLike]]
    ) -> list[Staged | FerryError]:
        """Independent single-message sends (topic, queue id or None, message),
        staged at once: each is checked on its own, and a refusal takes its
        place in the answer; the accepted ones bound for one queue are
        appended together, in their order, one append per queue. Plain
        messages of one topic that leave the queue to the broker all go to
        the one queue it picks for this call. Timed and delayed messages are
        appended one by one, as `stage` would.

        Raises Unavailable on a storage fault (nothing of the call is answered).
        """
        out: list[Staged | FerryError | None] = [None] * len(sends)
        groups: dict[tuple[str, int], list[tuple[int, MessageIn, str]]] = {}
        alone: list[tuple[int, str, int, MessageIn, str]] = []
        picked: dict[str, int] = {}
        writable: dict[str, TopicConfig | FerryError] = {}  # checked once per topic
        now = self.store.clock.wall_ms()
        for i, (topic, queue_id, message) in enumerate(sends):
            try:
                config = writable.get(topic)  # the hot path: the topic was checked already
                if type(config) is not TopicConfig:
                    config = self._writable_once(topic, writable)
                group = _group_of(message)
                if (queue_id is None or queue_id == -1) and not group:
                    queue = picked.get(topic)
                    if queue is None:
                        queue = picked[topic] = self._pick_queue(config, None)
                else:
                    queue = self._pick_queue(config, queue_id, group)
                properties, delay_level, deliver_ms = self._properties(
                    message, topic, queue, "body", now
                )
            except (errors.Unavailable, errors.StorageFault):
                raise
            except FerryError as exc:
                out[i] = exc
                continue
            encoded = self._message_in(message, properties, now)
            if deliver_ms:
                alone.append((i, TIMER_TOPIC, 0, encoded, topic))
            elif delay_level:
                alone.append((i, SCHEDULE_TOPIC, delay_level - 1, encoded, topic))
            else:
                groups.setdefault((topic, queue), []).append((i, encoded, topic))
        started = time.perf_counter()
        appends = list(groups.items())
        appends += [((st, sq), [(i, m, topic)]) for i, st, sq, m, topic in alone]
        for (store_topic, store_queue), members in appends:
            try:
                result = self.store.append_sends(
                    store_topic, store_queue, [m for _, m, _ in members]
                )
            except ResourceExhausted as exc:  # a full disk: each of them refused
                for i, _, _ in members:
                    out[i] = exc
                continue
            for k, (i, _, topic) in enumerate(members):
                out[i] = Staged(topic, result, started, k)
        return out  # type: ignore[return-value]

    def stage_halves(
        self, sends: Sequence[tuple[str, int | None, MessageLike]], half: str
    ) -> list[tuple[Staged, int] | FerryError]:
        """Transactional halves (services.broker.transactions): (topic, queue id
        or None, message) each checked as a send to its topic, and the accepted
        ones appended together to queue 0 of the system topic `half`, their
        real topic and queue in REAL_TOPIC / REAL_QID, where no consumer of the
        topic sees them. Each answer is (staged, record size) or the refusal.

        Raises Unavailable on a storage fault (nothing of the call is answered).
        """
        out: list[tuple[Staged, int] | FerryError | None] = [None] * len(sends)
        accepted: list[tuple[int, str, MessageIn]] = []
        writable: dict[str, TopicConfig | FerryError] = {}
        now = self.store.clock.wall_ms()
        half_bytes = len(half.encode())
        for i, (topic, queue_id, message) in enumerate(sends):
            try:
                config = self._writable_once(topic, writable)
                queue = self._pick_queue(config, queue_id, _group_of(message))
                properties, delay_level, deliver_ms = self._properties(
                    message, topic, queue, "body", now, half=True
                )
                if delay_level or deliver_ms:
                    raise InvalidArgument(
                        "body.properties", "a transactional message cannot be delayed or timed"
                    )
            except (errors.Unavailable, errors.StorageFault):
                raise
            except FerryError as exc:
                out[i] = exc
                continue
            accepted.append((i, topic, self._message_in(message, properties, now)))
        if accepted:
            started = time.perf_counter()
            try:
                result = self.store.append_sends(half, 0, [m for _, _, m in accepted])
            except ResourceExhausted as exc:  # a full disk: each of them refused
                for i, _, _ in accepted:
                    out[i] = exc
                return out  # type: ignore[return-value]
            for k, (i, topic, m) in enumerate(accepted):
                size = record.encoded_size(half_bytes, len(m.body), len(m.properties))
                out[i] = (Staged(topic, result, started, k), size)
        return out  # type: ignore[return-value]

    def _message_in(self, message: MessageLike, properties: bytes, now_ms: int) -> MessageIn:
        if type(message) is not OutgoingMessage:  # ferry.v1's entries: none of the extras
            return MessageIn(
                body=message.body,
                properties=properties,
                flag=message.flag,
                born_timestamp=message.born_timestamp or now_ms,
                born_host=self._born_host,
            )
        return MessageIn(  # positional: once per message sent
            message.body,
            properties,
            message.flag,
            message.born_timestamp or now_ms,
            self._born_host if message.born_host is None else packed_host(message.born_host),
            message.sys_flag,
            message.reconsume_times,
        )

    def _retry_route(
        self, topic: str, queue_id: int | None, message: MessageLike
    ) -> tuple[str, int | None, Sequence[MessageLike]]:
        """Where a message sent to `%RETRY%<group>` goes: there, or to the
        group's dead-letter topic once `reconsume_times` reached the maximum
        (the message's `max_reconsume_times`, else the group's retryMaxTimes)."""
        group = topic[len(RETRY_TOPIC_PREFIX) :]
        limit = getattr(message, "max_reconsume_times", None)
        if limit is None:
            config = self.groups.get(group) if self.groups is not None else None
            limit = config.retry_max_times if config is not None else DEFAULT_RETRY_MAX_TIMES
        if getattr(message, "reconsume_times", 0) < limit:
            return topic, queue_id, (message,)
        properties = dict(message.properties)
        properties.pop(PROPERTY_DELAY, None)
        dead = OutgoingMessage(
            body=message.body,
            tags=message.tags,
            keys=message.keys,
            properties=properties,
            flag=message.flag,
            born_timestamp=message.born_timestamp,
            sys_flag=getattr(message, "sys_flag", 0),
            born_host=getattr(message, "born_host", None),
            reconsume_times=getattr(message, "reconsume_times", 0),
        )
        return dlq_topic(group), 0, (dead,)

    def check_broker_writable(self) -> None:
        """Raises PermissionDenied unless this broker takes writes now (a
        master, not fenced, brokerPermission with WRITE)."""
        if self.is_slave:
            raise PermissionDenied(
                f"broker {self.broker_name} here is a SLAVE and takes no writes; send to its master"
            )
        if self.fence is not None:
            self.fence(True)
        perm = self.broker_permission()
        if not perm & PERM_WRITE:
            raise PermissionDenied(
                f"broker {self.broker_name} is not writable (brokerPermission={perm}); "
                "it is being drained or is read-only"
            )

    def _writable_once(
        self, topic: str, checked: dict[str, TopicConfig | FerryError]
    ) -> TopicConfig:
        """`_writable`, checked once per topic of a call (`checked` remembers the
        answers): each of the topic's messages is refused alike."""
        config = checked.get(topic)
        if config is None:
            try:
                config = self._writable(topic)
            except FerryError as exc:
                config = exc
            checked[topic] = config
        if isinstance(config, FerryError):
            raise config
        return config

    def _writable(self, topic: str, create: bool = False) -> TopicConfig:
        """The topic's config, if this broker takes sends to it now; with
        `create`, a missing topic gets a new config (one queue, read-write),
        which the caller creates once its send has passed every check."""
        check_topic(topic)
        if is_system_topic(topic):
            raise InvalidArgument(
                "topic",
                f"{topic} is a system topic of the broker's own and takes no sends (a delayed "
                f"or timed message goes to its real topic with DELAY or "
                f"{PROPERTY_TIMER_DELIVER_MS}, a transactional one with TRAN_MSG)",
            )
        self.check_broker_writable()
        config = self.topics.get(topic)
        if config is None and create and self.create_topic is not None:
            config = TopicConfig(topic, read_queue_nums=1, write_queue_nums=1, perm=6)
        if config is None:
            raise NotFound(
                f"topic {topic!r} does not exist on broker {self.broker_name}; create it with "
                f"`ferry topic create {topic} -b BROKER` (autoCreateTopic is off)"
            )
        if not config.perm & PERM_WRITE:
            raise PermissionDenied(f"topic {topic!r} is not writable (perm={config.perm})")
        return config

    async def settle(self, staged: Sequence[Staged], wait_store_msg_ok: bool = True) -> SendStatus:
        """Wait once for what covers every staged send: the flush (SYNC_FLUSH)
        and a slave's copy (SYNC_MASTER) up to the furthest of them. Their
        common status: a wait that timed out is reported for each of them,
        none of them having been confirmed in time.

        Raises:
            Unavailable: a storage fault; nothing more is acknowledged.
        """
        last = max(staged, key=lambda s: s.result.end_offset).result
        status = SendStatus.SEND_OK
        if not await self.store.wait_stored(last.end_offset, wait_store_msg_ok):
            status = SendStatus.FLUSH_DISK_TIMEOUT
        if self.replication_wait is not None and wait_store_msg_ok:
            replicated = await self.replication_wait(last)
            if status is SendStatus.SEND_OK:
                status = replicated
        if self.fence is not None:
            self.fence(False)
        if self.on_sent is not None:
            now = time.perf_counter()
            # One call per (topic, append): the sends of one append took the same time.
            runs: dict[tuple[str, float], list[int]] = {}
            for s in staged:
                run = runs.setdefault((s.topic, s.started), [0, 0])
                run[0] += s.count
                run[1] += 1
            for (topic, started), (messages, sends) in runs.items():
                self.on_sent(topic, status.value, messages, now - started, sends)
        return status

    def _pick_queue(
        self, config: TopicConfig, queue_id: int | None, message_group: str = ""
    ) -> int:
        count = config.write_queue_nums
        if count <= 0:
            raise PermissionDenied(f"topic {config.topic_name!r} has no write queues")
        if (queue_id is None or queue_id == -1) and message_group:
            # One message group, one queue: its messages stay in send order.
            return zlib.crc32(message_group.encode()) % count
        if queue_id is None or queue_id == -1:
            counter = self._round_robin.setdefault(config.topic_name, itertools.count())
            return next(counter) % count
        if not 0 <= queue_id < count:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {config.topic_name!r} has {count} write "
                f"queues (0..{count - 1}); use -1 to let the broker pick",
            )
        return queue_id

    def _properties(
        self,
        message: MessageLike,
        topic: str,
        queue_id: int,
        where: str,
        now_ms: int,
        batch: bool = False,
        half: bool = False,
    ) -> tuple[bytes, int, int]:
        """The encoded properties, the DELAY level (0: none) and the timer
        delivery time (0: not timed). A lone message already due is not timed;
        in a batch every entry with TIMER_DELIVER_MS goes through the timer
        (one that came due in transit is delivered at once)."""
        body = message.body
        if not body:
            raise InvalidArgument(
                where if where == "body" else f"{where}.body", "must not be empty"
            )
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"{where if where == 'body' else where + '.body'} is {len(body)} bytes; "
                f"maxMessageSize is {self.max_message_size}"
            )
        if not message.properties and not half:
            # The hot path: at most tags and keys.
            if not message.tags and not message.keys:
                return b"", 0, 0
            if _plain(message.tags) and _plain(message.keys):
                parts = []
                if message.tags:
                    parts.append(f"TAGS\x01{message.tags}\x02")
                if message.keys:
                    parts.append(f"KEYS\x01{message.keys}\x02")
                return "".join(parts).encode(), 0, 0
        properties = dict(message.properties)
        if not half and properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            # Stored as it is, it would reach consumers before any commit.
            raise InvalidArgument(
                f"{where}.properties",
                f"{PROPERTY_TRANSACTION_PREPARED}=true marks a transactional half message, "
                "which goes alone (Broker.SendMessage with PGROUP, or a prepared RocketMQ "
                "send), never in a batch or a send stream",
            )
        if message.tags:
            properties[record.PROPERTY_TAGS] = message.tags
        if message.keys:
            properties[record.PROPERTY_KEYS] = message.keys
        delay_level = 0
        raw_delay = properties.get(PROPERTY_DELAY)
        if raw_delay is not None:
            try:
                delay_level = int(raw_delay)
            except ValueError:
                raise InvalidArgument(
                    f"{where}.properties", f"DELAY {raw_delay[:20]!r} is not a level 1..18"
                ) from None
            levels = len(self.store.delay_levels_s)
            if delay_level <= 0:
                properties.pop(PROPERTY_DELAY)
                delay_level = 0
            else:
                delay_level = min(delay_level, levels)
                properties[PROPERTY_DELAY] = str(delay_level)
                properties[PROPERTY_REAL_TOPIC] = topic
                properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        deliver_ms = self._deliver_ms(properties, where, now_ms)
        if deliver_ms is not None and (batch or deliver_ms > now_ms):
            deliver_ms = max(deliver_ms, 1)
            if delay_level:
                raise InvalidArgument(
                    f"{where}.properties",
                    f"DELAY and {PROPERTY_TIMER_DELIVER_MS} together; use one of them",
                )
            properties[PROPERTY_REAL_TOPIC] = topic
            properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            properties.pop(PROPERTY_TIMER_OUT_MS, None)  # the timer's own: due at deliver_ms
        else:
            deliver_ms = 0
        if half:
            properties[PROPERTY_REAL_TOPIC] = topic
            properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        try:
            encoded = record.encode_properties(properties)
        except record.RecordError as exc:
            raise InvalidArgument(f"{where}.properties", str(exc)) from None
        if len(encoded) > record.MAX_PROPERTIES_BYTES:
            raise InvalidArgument(
                f"{where}.properties",
                f"{len(encoded)} bytes encoded; the limit is {record.MAX_PROPERTIES_BYTES}",
            )
        return encoded, delay_level, deliver_ms

    def _deliver_ms(self, properties: dict[str, str], where: str, now_ms: int) -> int | None:
        """TIMER_DELIVER_MS (epoch ms), checked against timerMaxDelaySec; None
        when absent."""
        raw = properties.get(PROPERTY_TIMER_DELIVER_MS)
        if raw is None:
            return None
        try:
            deliver_ms = int(raw)
        except ValueError:
            raise InvalidArgument(
                f"{where}.properties",
                f"{PROPERTY_TIMER_DELIVER_MS} {raw[:24]!r} is not epoch milliseconds",
            ) from None
        if deliver_ms - now_ms > self.timer_max_delay_ms:
            raise InvalidArgument(
                f"{where}.properties",
                f"{PROPERTY_TIMER_DELIVER_MS} is {(deliver_ms - now_ms) / 1000:.0f} s ahead; the "
                f"limit is timerMaxDelaySec={self.timer_max_delay_ms // 1000} s",
            )
        return deliver_ms

    # ------------------------------------------------------------ pull

    async def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_nums: int,
        max_wait_ms: int,
        sub_expression: str = "",
        *,
        raw: bool = False,
        max_count: int = MAX_PULL_NUMS,
        max_bytes: int | None = None,
        on_checked: Callable[[], None] | None = None,
    ) -> PullOutcome:
        """Up to `max_nums` messages (at most `max_count`, and `max_bytes`
        when given) of a queue from `queue_offset`, waiting up to
        `max_wait_ms` for one when there is none yet. `raw`: the records'
        bytes as stored (RocketMQ's pull body), not decoded. `on_checked`:
        called once the request has passed every check, before any read or
        wait (RocketMQ's pull commits the consumer's offset there)."""
        check_name(group, "consumer_group")
        config = self.readable_topic(topic)
        self.check_queue(config, queue_id)
        if queue_offset < 0:
            raise InvalidArgument("queue_offset", f"{queue_offset} is negative")
        if max_nums < 0:
            raise InvalidArgument("max_msg_nums", f"{max_nums} is negative")
        if max_wait_ms < 0:
            raise InvalidArgument("max_wait_ms", f"{max_wait_ms} is negative")
        tag_hashes = parse_sub_expression(sub_expression)
        if on_checked is not None:
            on_checked()
        count = min(max_nums or DEFAULT_PULL_NUMS, max_count, MAX_PULL_NUMS)
        get = self.store.get_messages
        result = await get(topic, queue_id, queue_offset, count, tag_hashes, raw, max_bytes)
        if result.status is GetStatus.NO_NEW_MSG and max_wait_ms > 0:
            await self.store.wait_for_messages(
                topic, queue_id, queue_offset, min(max_wait_ms, MAX_WAIT_MS) / 1000
            )
            result = await get(topic, queue_id, queue_offset, count, tag_hashes, raw, max_bytes)
        found = result.raw_count if raw else len(result.records)
        if found:
            self.stats.got(group, topic, found)
        return PullOutcome(result, self._suggest(group, result))

    def _suggest(self, group: str, result: GetResult) -> int:
        """Which broker id the consumer should pull from next (RocketMQ's
        suggestWhichBrokerId): the master unless slaves may serve reads; then
        the group's `whichBrokerWhenConsumeSlowly` when it reads cold data,
        else its `brokerId`."""
        if not self.slave_read_enable:
            return MASTER_ID
        config = self.groups.get(group) if self.groups is not None else None
        slow_id = config.which_broker_when_consume_slowly if config else 1
        normal_id = config.broker_id if config else MASTER_ID
        if result.last_commit_offset >= 0:
            behind = self.store.max_offset - result.last_commit_offset
            if behind > self.hot_bytes:
                return slow_id
        return normal_id

    def readable_topic(self, topic: str) -> TopicConfig:
        """A topic consumers may read here (pulls and pops): it exists, and
        both it and the broker are readable."""
        check_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise NotFound(
                f"topic {topic!r} does not exist on broker {self.broker_name}; "
                f"create it with `ferry topic create {topic} -b BROKER`"
            )
        perm = self.broker_permission()
        if not perm & PERM_READ:
            raise PermissionDenied(
                f"broker {self.broker_name} is not readable (brokerPermission={perm})"
            )
        if not config.perm & PERM_READ:
            raise PermissionDenied(f"topic {topic!r} is not readable (perm={config.perm})")
        return config

    def check_queue(self, config: TopicConfig, queue_id: int) -> None:
        count = config.queue_nums
        if not 0 <= queue_id < count:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {config.topic_name!r} has {count} queues "
                f"(0..{count - 1})",
            )

    # ------------------------------------------------------------ offsets

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets of one queue."""
        self._known_queue(topic, queue_id)
        return self.store.queue_min_offset(topic, queue_id), self.store.queue_max_offset(
            topic, queue_id
        )

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, upper: bool = False
    ) -> int:
        """The queue offset of the first message stored at or after
        `timestamp_ms` (the max offset when there is none); with `upper`, of the
        last one stored at or before it (the min offset when there is none)."""
        self._known_queue(topic, queue_id)
        return await self.store.offset_by_time(topic, queue_id, timestamp_ms, upper)

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """When the queue's oldest message still kept was stored (epoch ms), −1
        for an empty queue."""
        self._known_queue(topic, queue_id)
        return await self.store.earliest_store_time(topic, queue_id)

    async def stored_record(self, commit_offset: int) -> bytes:
        """The record that starts at `commit_offset`, as stored (RocketMQ's
        view by offset message id), if consumers may see it.

        Raises:
            InvalidArgument: a negative offset.
            NotFound: no record starts there, or retention deleted it.
        """
        if commit_offset < 0:
            raise InvalidArgument("offset", f"{commit_offset} is negative")
        data = await self.store.record_bytes(commit_offset)
        if data is None:
            raise NotFound(
                f"no message starts at commit offset {commit_offset} on broker "
                f"{self.broker_name} (the commit log holds "
                f"[{self.store.min_offset}, {self.store.confirm_offset})); it may have been "
                "deleted by retention, or the message id names another broker"
            )
        return data

    async def find_by_key(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique: bool = False,
    ) -> KeyLookup:
        """Messages of `topic` by key (RocketMQ's queryMsgByKey: one of their KEYS) or,
        with `unique`, by unique key (UNIQ_KEY, the producer's message id), stored in
        [begin_ms, end_ms]: the newest `max_num` (at most MAX_QUERY_NUM) the message
        index finds, in commit-offset order. A topic deleted since still answers.

        Raises:
            InvalidArgument: a bad topic name, an empty key, `max_num` below 1 or a
                time range that ends before it begins.
            FailedPrecondition: the broker's message index is off.
        """
        check_topic(topic)
        if not key:
            raise InvalidArgument("key", "is empty")
        if max_num < 1:
            raise InvalidArgument("max_num", f"{max_num} is below 1")
        if end_ms < begin_ms:
            raise InvalidArgument("end_timestamp", f"{end_ms} is before the begin {begin_ms}")
        started = time.monotonic()
        found = await self.store.find_by_key(
            topic, key, min(max_num, MAX_QUERY_NUM), begin_ms, end_ms, unique
        )
        if self.on_lookup is not None:
            self.on_lookup(time.monotonic() - started)
        return found

    def _known_queue(self, topic: str, queue_id: int) -> TopicConfig:
        check_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise NotFound(f"topic {topic!r} does not exist on broker {self.broker_name}")
        self.check_queue(config, queue_id)
        return config


def _message_group(messages: Sequence[MessageLike], batch: bool) -> str:
    """The message group (`__SHARDINGKEY`) of a send; a batch has one or none."""
    groups = {_group_of(m) for m in messages}
    if len(groups) > 1:
        raise InvalidArgument(
            "messages" if batch else "properties",
            f"a batch goes to one queue, so its messages need one {PROPERTY_SHARDING_KEY} "
            f"(message group); found {len(groups)}",
        )
    return groups.pop() if groups else ""


def _group_of(message: MessageLike) -> str:
    return (message.properties or {}).get(PROPERTY_SHARDING_KEY, "")


_HOSTS: dict[tuple[str, int], bytes] = {}


def packed_host(host: tuple[str, int]) -> bytes:
    """A producer's ("ip", port) as a record stores it (IPv4 only: any other
    address is stored as 127.0.0.1:0)."""
    packed = _HOSTS.get(host)
    if packed is None:
        try:
            packed = record.pack_host(host)
        except record.RecordError:
            packed = record.pack_host(("127.0.0.1", 0))
        if len(_HOSTS) > 4096:
            _HOSTS.clear()
        _HOSTS[host] = packed
    return packed


def _plain(text: str) -> bool:
    return "\x01" not in text and "\x02" not in text and len(text) < 8192


__all__ = [
    "GetStatus",
    "MessagingService",
    "OutgoingMessage",
    "PullOutcome",
    "SendOutcome",
    "SendStatus",
    "GroupLookup",
    "OffsetTable",
    "TopicLookup",
    "parse_sub_expression",
    "real_destination",
]
