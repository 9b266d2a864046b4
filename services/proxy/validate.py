"""What RocketMQ's 5.x proxy refuses in a message before any broker sees it, with its codes
and texts (SendMessageActivity.buildMessage and buildMessageProperty, GrpcValidator, with
ProxyConfig's defaults), so that what one proxy refuses the other refuses too. Pure: no I/O,
no grpc; the servicer calls `send_refusal` per message and `system_topic` per request.
"""

from __future__ import annotations

from apache.rocketmq.v2 import definition_pb2 as v2
from services.proxy.convert import ROCKETMQ_SYSTEM_PROPERTIES, Code, delivery_ms, status

# ProxyConfig's defaults (RocketMQ 5.5.0).
MAX_USER_PROPERTIES = 128  # userPropertyMaxNum
MAX_USER_PROPERTY_BYTES = 16 * 1024  # maxUserPropertySize: keys, values, tag and keys
MAX_MESSAGE_GROUP_BYTES = 64  # maxMessageGroupSize (a group must be shorter)
MAX_DELAY_MS = 24 * 3600 * 1000  # maxDelayTimeMills

# TopicValidator.SYSTEM_TOPIC_SET of 5.5.0, and its prefix: not for clients.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_TOPICS = frozenset(
    {
        "BenchmarkTest", "CHECKPOINT_TOPIC", "OFFSET_MOVED_EVENT",
        "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "SCHEDULE_TOPIC_XXXX", "SELF_TEST_TOPIC", "TBW102", "TRANS_CHECK_MAX_TIME_TOPIC",
    }
)  # fmt: skip


def system_topic(topic: str) -> str:
    """Why a client may not use `topic`, or "" (GrpcValidator.validateTopic)."""
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        return "cannot access system topic"
    return ""


def send_refusal(
    message: v2.Message, topic: v2.Resource, max_body_bytes: int, now_ms: int
) -> v2.Status | None:
    """Why RocketMQ's proxy would refuse to send `message` (the first of its request being
    to `topic`), or None: the checks of buildMessage and buildMessageProperty, in their
    order, each with its code and text."""
    if message.topic != topic:
        return status(Code.MESSAGE_CORRUPTED, "topic in message is not same")
    if not message.body:
        return status(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(message.body) > max_body_bytes:
        return status(
            Code.MESSAGE_BODY_TOO_LARGE, f"message body cannot exceed the max {max_body_bytes}"
        )
    props = message.user_properties
    if len(props) > MAX_USER_PROPERTIES:
        return status(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"too many user properties, max is {MAX_USER_PROPERTIES}",
        )
    size = 0
    for key, value in props.items():
        if key in ROCKETMQ_SYSTEM_PROPERTIES:
            return status(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}")
        if _has_control(key):
            return status(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the key of property cannot contain control character",
            )
        if _has_control(value):
            return status(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the value of property cannot contain control character",
            )
        size += len(key.encode()) + len(value.encode())
    sp = message.system_properties
    tag = sp.tag
    if tag:
        if _blank(tag):
            return status(Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace")
        if "|" in tag:
            return status(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
        if _has_control(tag):
            return status(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")
    size += len(tag.encode())
    for key in sp.keys:
        if key and _blank(key):
            return status(Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace")
        if _has_control(key):
            return status(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")
        size += len(key.encode())
    if size > MAX_USER_PROPERTY_BYTES:
        return status(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"the total size of user property is too large, max is {MAX_USER_PROPERTY_BYTES}",
        )
    if _blank(sp.message_id):
        return status(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    if sp.HasField("delivery_timestamp") and delivery_ms(sp.delivery_timestamp) - now_ms > (
        MAX_DELAY_MS
    ):
        return status(
            Code.ILLEGAL_DELIVERY_TIME,
            f"the max delay time of message is too large, max is {MAX_DELAY_MS}",
        )
    group = sp.message_group
    if group:
        if _blank(group):
            return status(
                Code.ILLEGAL_MESSAGE_GROUP,
                "message group cannot be the char sequence of whitespace",
            )
        if len(group.encode()) >= MAX_MESSAGE_GROUP_BYTES:
            return status(
                Code.ILLEGAL_MESSAGE_GROUP,
                f"message group exceed the max size {MAX_MESSAGE_GROUP_BYTES}",
            )
        if _has_control(group):
            return status(
                Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character"
            )
    return None


def _blank(text: str) -> bool:
    """StringUtils.isBlank: empty or only whitespace."""
    return not text.strip()


def _has_control(text: str) -> bool:
    """Guava's CharMatcher.javaIsoControl: U+0000-U+001F and U+007F-U+009F."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)
