"""`apache.rocketmq.v2` <-> `ferry.v1`: messages, properties and result codes.

What the SDKs send as system properties travels in ferry as message
properties, under the names RocketMQ's own proxy uses for them:

    | v2 system property   | ferry                                   |
    |----------------------|-----------------------------------------|
    | tag                  | `tags`                                  |
    | keys                 | `keys`, space-separated                 |
    | message_id           | property `UNIQ_KEY` (the client's id)   |
    | message_group        | property `__SHARDINGKEY`                |
    | delivery_timestamp   | property `TIMER_DELIVER_MS` (epoch ms)  |
    |                      | (both ways: a received timed message    |
    |                      | shows when it was due)                  |
    | born_timestamp       | `born_timestamp` (ms)                   |

A received message shows the client's id when it has one (`UNIQ_KEY`),
ferry's offset id otherwise. Its user properties are every property but the
system ones (`SYSTEM_PROPERTIES`: RocketMQ's `MessageConst.STRING_HASH_SET`, and
ferry's own `DLQ_DELIVERY_ATTEMPTS`); `__SHARDINGKEY` is not one of them, so a
FIFO message shows its group both as `message_group` and as a user property, as
RocketMQ's proxy shows it (`GrpcConverter.buildUserAttributes`). A dead letter's
origin (`DLQ_ORIGIN_TOPIC`, `DLQ_ORIGIN_MESSAGE_ID`) is its `dead_letter_queue`.
Its body digest is MD5, as RocketMQ's proxy sends it: the SDKs disagree on how a
CRC32 digest is written (Java and Go drop leading zeros, Python pads to eight
digits), so a CRC32 one is wrong for one SDK or the other on one body in 16.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from apache.rocketmq.v2 import definition_pb2 as v2
from ferry import record
from ferry.model import (
    PROPERTY_DELAY,
    PROPERTY_DLQ_DELIVERY_ATTEMPTS,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
)
from ferry.v1 import broker_pb2


class EnumInts:
    """A protobuf enum's values as plain int attributes, with its `Name` and `Value`:
    an attribute of protobuf's enum wrapper (EnumTypeWrapper.__getattr__) costs about a
    microsecond, and one send reads several codes."""

    def __init__(self, wrapper) -> None:
        for name, value in wrapper.items():
            setattr(self, name, value)
        self.Name = wrapper.Name
        self.Value = wrapper.Value


Code = EnumInts(v2.Code)
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
# RocketMQ's system properties (MessageConst.STRING_HASH_SET of 5.5.0, which
# __SHARDINGKEY is not; tests/compat checks this list against Apache's jar): what
# the broker or a proxy set. Never shown as user properties, and refused as the
# name of one in a send, as RocketMQ's proxy does.
ROCKETMQ_SYSTEM_PROPERTIES = frozenset(
    {
        "1ST_POP_TIME", "ARRIVE_TIME", "BORN_TIMESTAMP", "BUYER_ID", "CLUSTER",
        "CONSUME_START_TIME", "CORRECTION_FLAG", "CORRELATION_ID", "DELAY",
        "DLQ_ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "DUP_INFO", "EXTEND_UNIQ_INFO",
        "INNER_MULTI_QUEUE_OFFSET", "INSTANCE_ID", "KEYS", "MAX_OFFSET",
        "MAX_RECONSUME_TIMES", "MIN_OFFSET", "MQ2_FLAG", "MSG_REGION", "MSG_TYPE",
        "ORIGIN_GROUP", "ORIGIN_MESSAGE_ID", "PGROUP", "POP_CK", "POP_CK_OFFSET",
        "PUSH_REPLY_TIME", "REAL_QID", "REAL_TOPIC", "RECONSUME_TIME", "REPLY_TO_CLIENT",
        "RETRY_TOPIC", "TAGS", "TIMER_DELAY_LEVEL", "TIMER_DELAY_MS", "TIMER_DELAY_SEC",
        "TIMER_DELIVER_MS", "TIMER_DEL_UNIQKEY", "TIMER_DEQUEUE_MS", "TIMER_ENQUEUE_MS",
        "TIMER_OUT_MS", "TIMER_ROLL_TIMES", "TRACE_ON", "TRANSFER_FLAG", "TRAN_MSG",
        "TRAN_PREPARED_QUEUE_OFFSET", "TTL", "UNIQ_KEY", "WAIT", "_SYS_MSG_PRIORITY_",
        "__BORNHOST", "__CRC32#", "__LITE_TOPIC",
    }
)  # fmt: skip
# ...and the one ferry's brokers add (a dead letter's delivery count).
SYSTEM_PROPERTIES = ROCKETMQ_SYSTEM_PROPERTIES | {PROPERTY_DLQ_DELIVERY_ATTEMPTS}

SEND_CODES = {
    broker_pb2.SEND_OK: Code.OK,
    broker_pb2.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    broker_pb2.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    broker_pb2.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}
SEND_TEXT = {
    broker_pb2.SEND_OK: "OK",
    broker_pb2.FLUSH_DISK_TIMEOUT: "stored on the master, not flushed to disk in time",
    broker_pb2.FLUSH_SLAVE_TIMEOUT: "stored on the master, not acknowledged by a slave in time",
    broker_pb2.SLAVE_NOT_AVAILABLE: "stored on the master; no slave in sync to copy it",
}


def status(code: int, message: str = "OK") -> v2.Status:
    return v2.Status(code=code, message=message)


OK = status(Code.OK)

# What RocketMQ's 5.x proxy answers for a topic with no route, word for word: its
# route cache raises MQClientException(ResponseCode.TOPIC_NOT_EXIST (17), "No topic
# route info in name server for the topic: " + topic)
# (TopicRouteService.getCacheMessageQueueWrapper), whose message is "CODE: 17  DESC: "
# + that + FAQUrl.attachDefaultURL's tail, and ResponseBuilder answers
# TOPIC_NOT_FOUND with that message, in cluster and local mode alike.
_NO_ROUTE = (
    "CODE: 17  DESC: No topic route info in name server for the topic: {topic}\n"
    "For more information, please visit the url, "
    "https://rocketmq.apache.org/docs/bestPractice/06FAQ"
)


def topic_not_found(topic: str) -> v2.Status:
    """A topic without a route, answered as RocketMQ's proxy answers it."""
    return status(Code.TOPIC_NOT_FOUND, _NO_ROUTE.format(topic=topic))


def expression_type(kind: int) -> str:
    """A FilterExpression's type as the broker's expression type: SQL is
    SQL92; TAG and an unset type are TAG (as Apache's proxy reads them)."""
    return "SQL92" if kind == v2.SQL else "TAG"


def error_code(exc: grpc.aio.AioRpcError) -> int:
    """A broker's gRPC error as the v2 code an SDK understands."""
    code, text = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.NOT_FOUND:
        return Code.TOPIC_NOT_FOUND if "topic" in text else Code.NOT_FOUND
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if text.startswith(("sub_expression:", "expression_type:")):
            return Code.ILLEGAL_FILTER_EXPRESSION  # first: a selector's text may say anything
        if "TIMER_DELIVER_MS" in text or "timerMaxDelaySec" in text:
            return Code.ILLEGAL_DELIVERY_TIME
        if "body" in text and ("large" in text or "exceeds" in text or "maxMessageSize" in text):
            return Code.MESSAGE_BODY_TOO_LARGE
        if "invisible" in text:
            return Code.ILLEGAL_INVISIBLE_TIME
        if "receipt_handle" in text:
            return Code.INVALID_RECEIPT_HANDLE
        if "topic" in text:
            return Code.ILLEGAL_TOPIC
        if "consumer_group" in text:
            return Code.ILLEGAL_CONSUMER_GROUP
        if "sub_expression" in text:
            return Code.ILLEGAL_FILTER_EXPRESSION
        return Code.BAD_REQUEST
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Code.FORBIDDEN
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "maxMessageSize" in text or "properties" in text and "bytes" in text:
            return Code.MESSAGE_BODY_TOO_LARGE  # the message itself is too large
        return Code.TOO_MANY_REQUESTS  # a full disk, a busy broker: the SDK backs off
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Code.PROXY_TIMEOUT
    if code == grpc.StatusCode.UNAVAILABLE:
        return Code.INTERNAL_SERVER_ERROR
    return Code.INTERNAL_ERROR


def topic_name(resource: v2.Resource) -> str:
    """RocketMQ's namespaces prefix names: `namespace%name`."""
    if resource.resource_namespace:
        return f"{resource.resource_namespace}%{resource.name}"
    return resource.name


def to_ms(ts: timestamp_pb2.Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


# Seconds past this are no date a timer can reach (year 5138): milliseconds put
# where seconds belong. The Python SDK 5.1.2 documents Message.delivery_timestamp
# in ms but copies it into Timestamp.seconds as it is.
_SECONDS_CEILING = 100_000_000_000


def delivery_ms(ts: timestamp_pb2.Timestamp) -> int:
    """A delivery time as epoch ms, also when a client sent ms as seconds."""
    if ts.seconds > _SECONDS_CEILING:
        return ts.seconds
    return to_ms(ts)


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def duration_ms(d: duration_pb2.Duration) -> int:
    """Milliseconds, held within int64: a Duration of ±2^63 seconds (the wire
    allows it) then still builds the broker's request, whose checks name it
    (ILLEGAL_INVISIBLE_TIME, a bad wait), instead of failing the call."""
    return max(INT64_MIN, min(d.seconds * 1000 + d.nanos // 1_000_000, INT64_MAX))


def duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def send_request(message: v2.Message, topic: str) -> broker_pb2.SendMessageRequest:
    """One v2 message as a ferry send (the broker picks the queue; a message
    group picks it by hash)."""
    sp = message.system_properties
    properties = dict(message.user_properties)
    if sp.message_id:
        properties[PROPERTY_UNIQ_KEY] = sp.message_id
    if sp.message_group:
        properties[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        properties[PROPERTY_TIMER_DELIVER_MS] = str(delivery_ms(sp.delivery_timestamp))
    return broker_pb2.SendMessageRequest(
        topic=topic,
        body=message.body,
        tags=sp.tag,
        keys=" ".join(sp.keys),
        properties=properties,
        born_timestamp=to_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
    )


# What a route's queues accept, by the topic's message.type (RouteActivity.
# parseTopicMessageType): one type, all four for MIXED, UNSPECIFIED for any other.
ACCEPTED_TYPES = {
    "NORMAL": (v2.NORMAL,),
    "FIFO": (v2.FIFO,),
    "DELAY": (v2.DELAY,),
    "TRANSACTION": (v2.TRANSACTION,),
    "MIXED": (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION),
}


def accepted_types(topic_type: str) -> tuple[int, ...]:
    return ACCEPTED_TYPES.get(topic_type, (v2.MESSAGE_TYPE_UNSPECIFIED,))


def type_conflict(topic_type: str, message_type_value: int) -> v2.Status | None:
    """None when a message of type `message_type_value` may go to a topic of
    `topic_type`; else RocketMQ's proxy's refusal, word for word
    (DefaultTopicMessageTypeValidator): a MIXED topic takes every type, any
    other only its own."""
    actual = v2.MessageType.Name(message_type_value)
    if topic_type == actual or topic_type == "MIXED":
        return None
    return status(
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"TopicMessageType validate failed, the expected type is {topic_type}, "
        f"but actual type is {actual}",
    )


def message_type(properties: Mapping[str, str]) -> int:
    """A stored message's type, as RocketMQ reads it from the properties
    (`TopicMessageType.parseFromMessageProperty`): a delay level or delivery
    time makes it DELAY before a message group makes it FIFO."""
    if (
        PROPERTY_DELAY in properties
        or PROPERTY_TIMER_DELIVER_MS in properties
        or PROPERTY_TIMER_DELAY_SEC in properties
        or PROPERTY_TIMER_DELAY_MS in properties
    ):
        return v2.DELAY
    if PROPERTY_SHARDING_KEY in properties:
        return v2.FIFO
    return v2.NORMAL


def received_message(m: broker_pb2.MessageExt, invisible_ms: int) -> v2.Message:
    """A message popped over ferry.v1 as the SDKs see it."""
    return _received(
        m.topic, m.body, m.properties, m.tags, m.keys, m.msg_id, m.born_timestamp,
        m.born_host, m.store_timestamp, m.store_host, m.receipt_handle, m.queue_id,
        m.queue_offset, invisible_ms, m.delivery_attempt,
    )  # fmt: skip


def popped_message(
    m: record.StoredMessage, topic: str, receipt_handle: str, invisible_ms: int, attempt: int
) -> v2.Message:
    """A record popped over RocketMQ's protocol as the SDKs see it, under the
    topic the SDK asked for (a redelivery's record is in the pop retry topic)."""
    props = m.properties
    return _received(
        topic, m.body, props, props.get(record.PROPERTY_TAGS, ""),
        props.get(record.PROPERTY_KEYS, ""), m.msg_id, m.born_timestamp, m.born_host,
        m.store_timestamp, m.store_host, receipt_handle, m.queue_id, m.queue_offset,
        invisible_ms, attempt,
    )  # fmt: skip


def _received(
    topic: str,
    body: bytes,
    props: Mapping[str, str],
    tags: str,
    keys: str,
    msg_id: str,
    born_timestamp: int,
    born_host: str,
    store_timestamp: int,
    store_host: str,
    receipt_handle: str,
    queue_id: int,
    queue_offset: int,
    invisible_ms: int,
    attempt: int,
) -> v2.Message:
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    out = v2.Message(topic=v2.Resource(name=topic), user_properties=user, body=body)
    sp = out.system_properties
    sp.tag = tags
    if keys:
        sp.keys.extend(keys.split())
    sp.message_id = props.get(PROPERTY_UNIQ_KEY) or msg_id
    sp.body_digest.type = v2.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = v2.IDENTITY
    sp.message_type = message_type(props)
    deliver_ms = props.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver_ms is not None and deliver_ms.isdigit():  # as RocketMQ's GrpcConverter
        sp.delivery_timestamp.FromMilliseconds(int(deliver_ms))
    sp.born_timestamp.FromMilliseconds(born_timestamp)
    sp.born_host = born_host
    sp.store_timestamp.FromMilliseconds(store_timestamp)
    sp.store_host = store_host
    sp.receipt_handle = receipt_handle
    sp.queue_id = queue_id
    sp.queue_offset = queue_offset
    sp.invisible_duration.FromMilliseconds(invisible_ms)
    sp.delivery_attempt = attempt
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        sp.message_group = group
    origin_topic = props.get(PROPERTY_DLQ_ORIGIN_TOPIC)
    origin_id = props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID)
    if origin_topic is not None and origin_id is not None:  # as RocketMQ's GrpcConverter
        sp.dead_letter_queue.topic = origin_topic
        sp.dead_letter_queue.message_id = origin_id
    return out
