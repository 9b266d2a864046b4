"""Domain types and validation shared by the name server and brokers.

No gRPC and no generated code here: `convert.py` beside each servicer maps
between these and the `ferry.v1` messages.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ferry.runtime.errors import InvalidArgument

# RocketMQ PermName bits.
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE

MASTER_ID = 0
PERM_MAX = 15
MAX_QUEUE_NUMS = 65536
TOPIC_MAX_LENGTH = 127
NAME_MAX_LENGTH = 255

TOPIC_CHARS = r"[%|a-zA-Z0-9_-]"
TOPIC_PATTERN = re.compile(TOPIC_CHARS + "+")
NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_.:-]+")
HOST_PATTERN = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")

BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")


@dataclass(frozen=True, slots=True)
class DataVersion:
    """Version of a metadata table; equality compares all three fields."""

    timestamp: int = 0
    counter: int = 0
    state_version: int = 0

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(now_ms, self.counter + 1, self.state_version)


def perm_to_string(perm: int) -> str:
    return (
        ("R" if perm & PERM_READ else "-")
        + ("W" if perm & PERM_WRITE else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


def check_topic(topic: str, field: str = "topic") -> str:
    if not topic:
        raise InvalidArgument(field, "must not be empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidArgument(
            field, f"{topic[:40]!r}... is {len(topic)} characters; the limit is {TOPIC_MAX_LENGTH}"
        )
    if not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidArgument(field, f"{topic!r} has characters outside [%|a-zA-Z0-9_-]")
    return topic


def check_name(value: str, field: str) -> str:
    """A cluster, broker-group, consumer-group or KV name."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > NAME_MAX_LENGTH:
        raise InvalidArgument(field, f"is {len(value)} characters; the limit is {NAME_MAX_LENGTH}")
    if not NAME_PATTERN.fullmatch(value):
        raise InvalidArgument(field, f"{value!r} has characters outside [%|a-zA-Z0-9_.:-]")
    return value


def check_pop_group(group: str, topic: str, field: str = "consumer_group") -> str:
    """A consumer group that pops `topic`: a name (`check_name`) that also
    names valid topics for its retry and dead-letter queues (`retry_topic`,
    `dlq_topic`): the topic alphabet only. Their length is no limit (a name
    past TOPIC_MAX_LENGTH is fitted, `fit_topic_name`), as Apache serves such
    groups. Acks and offsets need only `check_name`."""
    check_name(group, field)
    if not TOPIC_PATTERN.fullmatch(group) or not TOPIC_PATTERN.fullmatch(topic):
        name = f"{RETRY_TOPIC_PREFIX}{group}_{topic}"
        raise InvalidArgument(
            field,
            f"{group!r} cannot name its retry/dead-letter topic {name[:60]!r}: pop "
            "groups use [%|a-zA-Z0-9_-] only",
        )
    return group


# Where the name servers are when no address is given (RocketMQ's NAMESRV_ADDR): their
# RocketMQ-protocol addresses, host:port;host:port. The broker, the proxy and the `ferry`
# command read the same variable.
NAMESRV_ADDR_ENV = "FERRY_NAMESRV_ADDR"
DEFAULT_NAMESRV_ADDR = "127.0.0.1:9876"


def check_addr(value: str, field: str, required: bool = True) -> str:
    """A `host:port` address (IPv6 hosts in brackets); empty allowed when not required."""
    if not value:
        if required:
            raise InvalidArgument(field, "must not be empty; expected host:port")
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not HOST_PATTERN.fullmatch(host) or len(value) > NAME_MAX_LENGTH:
        raise InvalidArgument(field, f"{value!r} is not host:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(field, f"{value!r} has no valid port (1-65535)")
    return value


def check_broker_id(broker_id: int, field: str = "broker_id") -> int:
    if broker_id < 0:
        raise InvalidArgument(field, f"{broker_id} is negative; 0 is the master, > 0 a slave")
    return broker_id


def check_role(role: str, broker_id: int) -> str:
    """An optional brokerRole, consistent with the id (master 0, slave > 0)."""
    if not role:
        return role
    if role not in BROKER_ROLES:
        raise InvalidArgument("broker_role", f"{role!r} is not one of {', '.join(BROKER_ROLES)}")
    if role == "SLAVE" and broker_id == MASTER_ID:
        raise InvalidArgument("broker_id", "a SLAVE must have broker_id > 0")
    if role != "SLAVE" and broker_id != MASTER_ID:
        raise InvalidArgument("broker_id", f"a {role} must have broker_id 0, not {broker_id}")
    return role


def check_queue_nums(value: int, field: str) -> int:
    if value < 0 or value > MAX_QUEUE_NUMS:
        raise InvalidArgument(field, f"{value} is outside 0..{MAX_QUEUE_NUMS}")
    return value


def check_perm(value: int, field: str = "perm") -> int:
    if value < 0 or value > PERM_MAX:
        raise InvalidArgument(
            field, f"{value} is outside 0..15 (READ=4, WRITE=2, INHERIT=1, PRIORITY=8)"
        )
    return value


def order_brokers(order_topic_conf: str) -> set[str]:
    """The broker names in a topic's ORDER_TOPIC_CONFIG value
    (`brokerName:queues;brokerName:queues`): the brokers it is ordered on."""
    return {part.split(":", 1)[0] for part in order_topic_conf.split(";") if part}


SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ's default messageDelayLevel: level n (1-based) waits DELAY_LEVELS_S[n - 1].
DELAY_LEVELS_S = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")

# Timed delivery (RocketMQ 5's timer): queue 0 of TIMER_TOPIC holds messages
# waiting for their TIMER_DELIVER_MS; queue 1 records which of them the timer
# service has delivered.
TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
# RocketMQ 5's relative timers (Message.setDelayTimeSec / setDelayTimeMs): due that
# long after the broker stores the message; the broker notes the absolute time in
# TIMER_OUT_MS, as RocketMQ's HookUtils.transformTimerMessage does.
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
# When the timer delivers an entry, if not at its TIMER_DELIVER_MS (RocketMQ's wheel
# time): pop's retry copies, due after the group's backoff, carry it, so that the
# user's own TIMER_DELIVER_MS travels with them unchanged.
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
# A message's message group (FIFO): it picks the queue by a stable hash.
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
# RocketMQ 4's delay level (1..18) of a message sent with one.
PROPERTY_DELAY = "DELAY"
# Pop consumption: where redelivered and dead messages go, and what they keep.
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_DELIVERY_ATTEMPTS = "DLQ_DELIVERY_ATTEMPTS"
# Transactional messages: a half message says so and names its producer group, whose
# producers the broker checks back with; UNIQ_KEY is a message's unique id (its msgId).
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
# A half's transaction id, its UNIQ_KEY, kept by its committed copy: RocketMQ 5's broker
# writes it (TransactionalMessageBridge), and consumers of both doors see it.
PROPERTY_TRANSACTION_ID = "__transactionId__"


NAME_HASH_CHARS = 16  # hex digits of the hash a fitted topic name ends with


def fit_topic_name(name: str) -> str:
    """`name` itself when it fits a topic (TOPIC_MAX_LENGTH bytes, the commit-log
    record's one-byte topic length), else its first bytes, `_` and 16 hex digits
    of its SHA-256: deterministic, so every broker and the proxy name it alike,
    and still readable. Apache stores long names whole (its record's v2 layout
    has a two-byte topic length); ferry's v1 layout has one byte. The only
    builder of retry and dead-letter topic names (`retry_topic`, `dlq_topic`)."""
    raw = name.encode()
    if len(raw) <= TOPIC_MAX_LENGTH:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:NAME_HASH_CHARS]
    keep = raw[: TOPIC_MAX_LENGTH - NAME_HASH_CHARS - 1].decode(errors="ignore")
    return f"{keep}_{digest}"


def retry_topic(group: str, topic: str) -> str:
    """The topic a group's unacknowledged messages of `topic` are redelivered
    from (RocketMQ's per-topic retry topic, `%RETRY%<group>_<topic>`, fitted
    to TOPIC_MAX_LENGTH by `fit_topic_name`)."""
    return fit_topic_name(f"{RETRY_TOPIC_PREFIX}{group}_{topic}")


def dlq_topic(group: str) -> str:
    """A group's dead-letter topic, `%DLQ%<group>` (fitted by `fit_topic_name`)."""
    return fit_topic_name(f"{DLQ_TOPIC_PREFIX}{group}")


def revive_topic(cluster: str) -> str:
    """The system topic holding pop checkpoints and acks (one queue)."""
    safe = re.sub(r"[^a-zA-Z0-9_-]", "_", cluster)[:80]
    return f"rmq_sys_REVIVE_LOG_{safe}"


# Transactional messages' own topics (services.broker.transactions), as RocketMQ names them:
# halves, op records, and halves given up after transactionCheckMax checks.
TRANSACTION_SYSTEM_TOPICS = frozenset(
    {"RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"}
)


# The topics Apache's broker keeps by itself besides those (TopicValidator's names;
# services.broker.metadata.defaults builds them). TBW102 is what a producer routes an
# unknown topic's first sends by; a broker creates the topic from it (autoCreateTopicEnable).
AUTO_CREATE_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT_TOPIC = "OFFSET_MOVED_EVENT"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # msgTraceTopicName's default
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"  # <cluster>_REPLY_TOPIC: request-reply messages


def is_system_topic(topic: str) -> bool:
    """A topic of the broker's own, never sent to by clients (RocketMQ's
    TopicValidator.isNotAllowedSendTopic, and rmq_sys_ topics)."""
    return (
        topic.startswith("rmq_sys_")
        or topic in (SCHEDULE_TOPIC, SELF_TEST_TOPIC, OFFSET_MOVED_EVENT_TOPIC)
        or topic in TRANSACTION_SYSTEM_TOPICS
    )


# RocketMQ 5's topic message type: the topic attribute `message.type`
# (TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE), one of TopicMessageType's values.
# A topic without it is NORMAL, as RocketMQ's TopicConfig.getTopicMessageType reads
# it; MIXED (any type) is refused at creation unless the broker enables it
# (enableMixedMessageType). The message type is not the `order` flag: a FIFO topic
# takes messages with a message group, an ordered topic is consumed in order.
MESSAGE_TYPE_ATTRIBUTE = "message.type"
MESSAGE_TYPES = ("UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
DEFAULT_MESSAGE_TYPE = "NORMAL"
# The topic attributes ferry keeps (RocketMQ's others, queue.type, cleanup.policy and
# reserve.time, configure stores ferry does not have).
TOPIC_ATTRIBUTES = {MESSAGE_TYPE_ATTRIBUTE: MESSAGE_TYPES}


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic as a broker stores it (RocketMQ TopicConfig; one entry of topics.json)."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: tuple[tuple[str, str], ...] = ()

    @property
    def queue_nums(self) -> int:
        """Queues that exist on disk: the larger of the read and write counts."""
        return max(self.read_queue_nums, self.write_queue_nums)

    @property
    def message_type(self) -> str:
        """The topic's `message.type` attribute; NORMAL when it has none."""
        return topic_message_type(self.attributes)


def topic_message_type(attributes: tuple[tuple[str, str], ...]) -> str:
    """The `message.type` among a topic's attributes; NORMAL when absent."""
    for key, value in attributes:
        if key == MESSAGE_TYPE_ATTRIBUTE:
            return value
    return DEFAULT_MESSAGE_TYPE


def parse_attributes(text: str, field: str = "attributes") -> dict[str, str]:
    """`+key1=value1,+key2=value2,-key3`, as RocketMQ's mqadmin takes topic
    attributes (AttributeParser.parseToMap): the changes `alter_attributes` applies.

    Raises:
        InvalidArgument: a part that is neither `+key=value` nor `-key`, or a key twice.
    """
    out: dict[str, str] = {}
    for part in text.split(",") if text else ():
        key, eq, value = part.strip().partition("=")
        if eq and not key.startswith("+"):
            raise InvalidArgument(field, f"add/alter attribute format is wrong: {key!r}")
        if not eq and not key.startswith("-"):
            raise InvalidArgument(field, f"delete attribute format is wrong: {key!r}")
        if key in out:
            raise InvalidArgument(field, f"key duplication: {key}")
        out[key] = value
    return out


def alter_attributes(
    current: tuple[tuple[str, str], ...],
    changes: dict[str, str],
    create: bool,
    allow_mixed: bool = False,
    field: str = "topic_config.attributes",
) -> tuple[tuple[str, str], ...]:
    """A topic's attributes after a create or update asks for `changes`, by
    RocketMQ's rules (AttributeUtil.alterCurrentAttributes): `+key` adds or
    changes a key (the only form a create takes), `-key` removes one that
    exists; keys not named stay as they are. Only known keys with values in
    their set are accepted, and `+message.type=MIXED` only with `allow_mixed`
    (RocketMQ's enableMixedMessageType; its broker says "MIXED message type is
    not supported." otherwise).

    Raises:
        InvalidArgument: naming `field` and what is wrong, as RocketMQ words it.
    """
    result = dict(current)
    seen: set[str] = set()
    for key, value in changes.items():
        sign, name = key[:1], key[1:]
        if sign not in ("+", "-") or not name or "+" in name or "-" in name:
            raise InvalidArgument(
                field, f"wrong format key: {key!r} (+key adds or changes, -key removes)"
            )
        if name in seen:
            raise InvalidArgument(field, f"alter duplication key. key: {name}")
        seen.add(name)
        if create and sign != "+":
            raise InvalidArgument(
                field, f"only add attribute is supported while creating topic. key: {name}"
            )
        allowed = TOPIC_ATTRIBUTES.get(name)
        if allowed is None:
            raise InvalidArgument(
                field, f"unsupported key: {name} (ferry supports {', '.join(TOPIC_ATTRIBUTES)})"
            )
        if sign == "-":
            if name not in result:
                raise InvalidArgument(field, f"attempt to delete a nonexistent key: {name}")
            del result[name]
            continue
        if value not in allowed:
            raise InvalidArgument(field, f"{name}: value is not in set: [{', '.join(allowed)}]")
        if name == MESSAGE_TYPE_ATTRIBUTE and value == "MIXED" and not allow_mixed:
            raise InvalidArgument(field, "MIXED message type is not supported.")
        result[name] = value
    return tuple(sorted(result.items()))


DEFAULT_RETRY_MAX_TIMES = 16  # redeliveries before the dead-letter queue (RocketMQ's default)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    """A consumer group's settings (RocketMQ SubscriptionGroupConfig)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_message_orderly: bool = False
    attributes: tuple[tuple[str, str], ...] = ()
