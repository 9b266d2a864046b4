"""Staging a send: the rules a message must pass before anything is written,
and its append to the log (RocketMQ's putMessage side of SendMessageProcessor).

`Stager` checks a send (topic name, existence and permissions, the broker's
own permission and role through `BrokerAccess`, queue choice, size limits, the
DELAY and TIMER_DELIVER_MS properties that divert a message to the delay or
timer topic, the retry topic's dead-letter rule), encodes its properties and
appends it; the send use case (send.py) settles what it staged. Every check
runs before anything is written, so a rejected send changes nothing. Halves
are staged here too (`stage_halves`), for the transaction use case, which owns
what makes a message a half's record.

Must never wait for a flush or a slave (send.py's `Settler` does), route a
half (send.py does), or learn which door a send came through.

Runs on the event loop thread, like the store.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Sequence

from ferry import record
from ferry.model import (
    DEFAULT_RETRY_MAX_TIMES,
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TRANSACTION_PREPARED,
    RETRY_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TopicConfig,
    dlq_topic,
)
from ferry.runtime import errors
from ferry.runtime.errors import FerryError, InvalidArgument, PermissionDenied, ResourceExhausted
from services.broker.messaging.access import BrokerAccess
from services.broker.messaging.contracts import TopicCreator
from services.broker.messaging.outgoing import (
    TRANSACTION_PREPARED,
    TRANSACTION_TYPE,
    MessageTooLarge,
    OutgoingMessage,
    Staged,
    is_half,
    packed_host,
)
from services.broker.messaging.rules import GroupLookup
from services.broker.store import MessageIn, MessageStore

# A run of sends as the send use case takes them: (topic, queue id or None,
# messages, batch, producer group). The producer group only matters to a half.
Send = tuple[str, "int | None", Sequence[OutgoingMessage], bool, str]


class Stager:
    def __init__(
        self,
        store: MessageStore,
        access: BrokerAccess,
        max_message_size: int,
        groups: GroupLookup | None = None,
        topic_creator: TopicCreator | None = None,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        timer_max_delay_s: float = 3 * 86400,
    ) -> None:
        """`groups`: the consumer groups' configs (a retry's maximum);
        `topic_creator`: persists and announces a group's retry or dead-letter
        topic that a send needs and that does not exist yet (None: such a send
        is refused like any send to an unknown topic)."""
        self.store = store
        self.access = access
        self.max_message_size = max_message_size
        self.groups = groups
        self.topic_creator = topic_creator
        self.timer_max_delay_ms = int(timer_max_delay_s * 1000)
        self._round_robin: dict[str, itertools.count] = {}
        self._born_host = record.pack_host(born_host)

    def stage(
        self,
        topic: str,
        queue_id: int | None,
        messages: Sequence[OutgoingMessage],
        batch: bool = False,
    ) -> Staged:
        """Check a send and append it to the log, without waiting for a flush
        or a slave: `settle` does, once for any number of staged sends.

        A single message sent to a group's retry topic `%RETRY%<group>` (a
        consumer's own retry, as RocketMQ 4's clients send it) is routed as
        RocketMQ routes it: once its reconsume times reached its maximum, to
        the group's dead-letter topic `%DLQ%<group>` (queue 0, without DELAY);
        either topic is created on first use (`topic_creator`). A batch holds
        no transactional half (a half goes alone, through the send use case).

        Raises the send's error (InvalidArgument, NotFound, PermissionDenied,
        ResourceExhausted), with nothing appended; Unavailable on a storage fault.
        """
        if batch:
            _no_halves(messages)
        retry = topic.startswith(RETRY_TOPIC_PREFIX) and not batch and len(messages) == 1
        if retry:
            topic, queue_id, messages = self._retry_route(topic, queue_id, messages[0])
        access = self.access
        config = access.writable_topic(topic, create=retry and self.topic_creator is not None)
        new_topic = retry and access.topics.get(topic) is None
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
        if new_topic and self.topic_creator is not None:
            # The send passed every check: a refusal changes nothing.
            self.topic_creator.create_system_topic(config)
        started = time.perf_counter()
        result = self.store.append_sends(store_topic, store_queue, encoded)
        return Staged(topic, result, started)

    def stage_many(self, sends: Sequence[Send]) -> list[Staged | FerryError]:
        """A run of plain sends (topic, queue id or None, messages, batch, and
        a producer group this ignores) as they arrived back to back, each
        checked on its own, a refusal taking its place in the answer. The
        single plain messages among them are
        appended together (`stage_each`); a batch, or a message to a retry
        topic (which `stage` may route to the dead-letter topic), is staged
        alone (`stage`) in its place in the order, after the single messages
        that came before it. `settle` then waits once for all of them.

        Raises Unavailable or StorageFault on a storage fault (nothing of the
        call is answered).
        """
        out: list[Staged | FerryError | None] = [None] * len(sends)
        singles: list[tuple[int, tuple[str, int | None, OutgoingMessage]]] = []

        def append_singles() -> None:
            results = self.stage_each([send for _, send in singles])
            for (i, _), result in zip(singles, results, strict=True):
                out[i] = result
            singles.clear()

        for i, (topic, queue_id, messages, batch, _) in enumerate(sends):
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
        self, sends: Sequence[tuple[str, int | None, OutgoingMessage]]
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
        self, sends: Sequence[tuple[str, int | None, OutgoingMessage]], half: str
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
                out[i] = (Staged(topic, result, started, k, True), size)
        return out  # type: ignore[return-value]

    def _message_in(self, message: OutgoingMessage, properties: bytes, now_ms: int) -> MessageIn:
        return MessageIn(  # positional: once per message sent
            message.body,
            properties,
            message.flag,
            message.born_timestamp or now_ms,
            self._born_host if message.born_host is None else packed_host(message.born_host),
            message.sys_flag & ~TRANSACTION_TYPE,  # a record keeps no producer's type bits
            message.reconsume_times,
        )

    def _retry_route(
        self, topic: str, queue_id: int | None, message: OutgoingMessage
    ) -> tuple[str, int | None, Sequence[OutgoingMessage]]:
        """Where a message sent to `%RETRY%<group>` goes: there, or to the
        group's dead-letter topic once `reconsume_times` reached the maximum
        (the message's `max_reconsume_times`, else the group's retryMaxTimes)."""
        group = topic[len(RETRY_TOPIC_PREFIX) :]
        limit = message.max_reconsume_times
        if limit is None:
            config = self.groups.get(group) if self.groups is not None else None
            limit = config.retry_max_times if config is not None else DEFAULT_RETRY_MAX_TIMES
        if message.reconsume_times < limit:
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
            sys_flag=message.sys_flag,
            born_host=message.born_host,
            reconsume_times=message.reconsume_times,
        )
        return dlq_topic(group), 0, (dead,)

    def _writable_once(
        self, topic: str, checked: dict[str, TopicConfig | FerryError]
    ) -> TopicConfig:
        """`BrokerAccess.writable_topic`, checked once per topic of a call
        (`checked` remembers the answers): each of the topic's messages is
        refused alike."""
        config = checked.get(topic)
        if config is None:
            try:
                config = self.access.writable_topic(topic)
            except FerryError as exc:
                config = exc
            checked[topic] = config
        if isinstance(config, FerryError):
            raise config
        return config

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
        message: OutgoingMessage,
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
        deliver_ms, relative = self._deliver_ms(properties, where, now_ms)
        if deliver_ms is not None and (batch or deliver_ms > now_ms):
            deliver_ms = max(deliver_ms, 1)
            if delay_level:
                raise InvalidArgument(
                    f"{where}.properties",
                    f"DELAY and {PROPERTY_TIMER_DELIVER_MS} together; use one of them",
                )
            properties[PROPERTY_REAL_TOPIC] = topic
            properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            if relative:  # the timer's own note of when it is due (dropped from the copy)
                properties[PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
            else:
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

    def _deliver_ms(
        self, properties: dict[str, str], where: str, now_ms: int
    ) -> tuple[int | None, bool]:
        """When a timed message is due (epoch ms; None: not timed), checked
        against timerMaxDelaySec, and whether that was given relative to now.
        As RocketMQ 5 reads them: TIMER_DELAY_SEC first, then TIMER_DELAY_MS
        (both after the broker stores it), then TIMER_DELIVER_MS (absolute)."""
        relative = True
        name = PROPERTY_TIMER_DELAY_SEC
        raw = properties.get(name)
        scale = 1000
        if raw is None:
            name, scale = PROPERTY_TIMER_DELAY_MS, 1
            raw = properties.get(name)
        if raw is None:
            name, relative = PROPERTY_TIMER_DELIVER_MS, False
            raw = properties.get(name)
        if raw is None:
            return None, False
        try:
            value = int(raw)
        except ValueError:
            what = (
                "epoch milliseconds"
                if not relative
                else f"a whole number of {'seconds' if scale == 1000 else 'milliseconds'}"
            )
            raise InvalidArgument(
                f"{where}.properties", f"{name} {raw[:24]!r} is not {what}"
            ) from None
        deliver_ms = now_ms + value * scale if relative else value
        if deliver_ms - now_ms > self.timer_max_delay_ms:
            raise InvalidArgument(
                f"{where}.properties",
                f"{name} is {(deliver_ms - now_ms) / 1000:.0f} s ahead; the "
                f"limit is timerMaxDelaySec={self.timer_max_delay_ms // 1000} s",
            )
        return deliver_ms, relative


def _message_group(messages: Sequence[OutgoingMessage], batch: bool) -> str:
    """The message group (`__SHARDINGKEY`) of a send; a batch has one or none."""
    groups = {_group_of(m) for m in messages}
    if len(groups) > 1:
        raise InvalidArgument(
            "messages" if batch else "properties",
            f"a batch goes to one queue, so its messages need one {PROPERTY_SHARDING_KEY} "
            f"(message group); found {len(groups)}",
        )
    return groups.pop() if groups else ""


def _group_of(message: OutgoingMessage) -> str:
    return (message.properties or {}).get(PROPERTY_SHARDING_KEY, "")


def _plain(text: str) -> bool:
    return "\x01" not in text and "\x02" not in text and len(text) < 8192


def _no_halves(messages: Sequence[OutgoingMessage]) -> None:
    """Raises PermissionDenied when a batch holds a transactional half."""
    for index, message in enumerate(messages):
        if message.sys_flag & TRANSACTION_TYPE == TRANSACTION_PREPARED:
            raise PermissionDenied("a batch cannot be transactional: send each message on its own")
        if is_half(message):
            raise PermissionDenied(
                f"messages[{index}] is transactional ({PROPERTY_TRANSACTION_PREPARED}): a batch "
                "cannot be; send it alone"
            )
