"""The proxy's message conversion and send checks, as RocketMQ's 5.x proxy does them
(services/proxy/convert.py, services/proxy/validate.py); the same behaviour is checked on
the wire against Apache's proxy in tests/integration/test_proxy_sdk.py."""

from __future__ import annotations

import hashlib
import zlib

from google.protobuf import duration_pb2

from apache.rocketmq.v2 import definition_pb2 as v2
from ferry.v1 import broker_pb2
from services.proxy import convert, validate

NOW_MS = 1_800_000_000_000


def _received(body: bytes = b"x", **properties: str) -> v2.Message:
    return convert.received_message(
        broker_pb2.MessageExt(topic="T", body=body, properties=properties, msg_id="AB"), 30_000
    )


def _short_crc_body() -> bytes:
    """A body whose CRC32 has fewer than eight hex digits."""
    return next(b for i in range(1000) if zlib.crc32(b := b"body %d" % i) < 0x10000000)


def test_the_body_digest_is_md5_as_every_sdk_checks_it():
    """A CRC32 digest is written two ways by the SDKs (Java and Go drop leading zeros,
    Python pads to eight digits): one of them sees one body in 16 as corrupted, and the
    Java push consumer never hands such a message to its listener. RocketMQ's proxy sends
    MD5 (upper-case hex, always 32 digits)."""
    body = _short_crc_body()
    digest = _received(body).system_properties.body_digest
    assert (digest.type, digest.checksum) == (v2.MD5, hashlib.md5(body).hexdigest().upper())


def test_system_properties_are_not_user_properties():
    m = _received(
        colour="blue",
        __SHARDINGKEY="g",  # not a system property: RocketMQ's proxy shows it
        UNIQ_KEY="01AB",
        WAIT="true",
        PGROUP="producers",
        TRACE_ON="true",
        MAX_OFFSET="9",
        DLQ_DELIVERY_ATTEMPTS="3",
    )
    assert dict(m.user_properties) == {"colour": "blue", "__SHARDINGKEY": "g"}
    assert m.system_properties.message_id == "01AB"


def test_a_dead_letter_names_its_origin_and_hides_the_bookkeeping():
    m = _received(
        k="v",
        DLQ_ORIGIN_TOPIC="Orders",
        DLQ_ORIGIN_MESSAGE_ID="7F00000100002A9F0000000000000000",
        DLQ_DELIVERY_ATTEMPTS="3",
    )
    assert dict(m.user_properties) == {"k": "v"}
    dlq = m.system_properties.dead_letter_queue
    assert (dlq.topic, dlq.message_id) == ("Orders", "7F00000100002A9F0000000000000000")
    assert not _received(k="v").system_properties.HasField("dead_letter_queue")


def _message(**user_properties: str) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="T"), body=b"b", user_properties=user_properties)
    m.system_properties.message_id = "01AB"
    m.system_properties.message_type = v2.NORMAL
    return m


def _refusal(m: v2.Message) -> tuple[str, str] | None:
    status = validate.send_refusal(m, m.topic, 4 << 20, NOW_MS)
    return None if status is None else (v2.Code.Name(status.code), status.message)


def test_a_valid_message_passes():
    m = _message(colour="grün", seq="1")
    m.system_properties.tag = "TagA"
    m.system_properties.keys.extend(["k1", "k2"])
    m.system_properties.message_group = "g" * 63
    m.system_properties.delivery_timestamp.FromMilliseconds(NOW_MS + 86_400_000)
    assert _refusal(m) is None


def test_every_system_property_name_is_refused_as_a_user_property():
    """A user property named DELAY would make a message a delay-level message; UNIQ_KEY
    would replace its id."""
    for name in sorted(convert.ROCKETMQ_SYSTEM_PROPERTIES):
        assert _refusal(_message(**{name: "1"})) == (
            "ILLEGAL_MESSAGE_PROPERTY_KEY",
            f"property is used by system: {name}",
        )


def test_control_characters_are_refused_where_rocketmq_refuses_them():
    """\\x01 and \\x02 separate a stored message's properties."""
    assert _refusal(_message(**{"a\x01": "v"}))[0] == "ILLEGAL_MESSAGE_PROPERTY_KEY"
    assert _refusal(_message(k="v\x02"))[0] == "ILLEGAL_MESSAGE_PROPERTY_KEY"
    assert _refusal(_message(k="\x85"))[0] == "ILLEGAL_MESSAGE_PROPERTY_KEY"  # C1 too
    tagged = _message()
    tagged.system_properties.tag = "a\tb"
    assert _refusal(tagged) == ("ILLEGAL_MESSAGE_TAG", "tag cannot contain control character")


def test_a_delivery_time_sent_as_milliseconds_in_seconds_is_read_as_the_proxy_reads_it():
    """The Python SDK 5.1.2 puts milliseconds where seconds belong: 30 s ahead is fine."""
    m = _message()
    m.system_properties.delivery_timestamp.seconds = NOW_MS + 30_000
    assert _refusal(m) is None
    m.system_properties.delivery_timestamp.seconds = NOW_MS + 86_400_001
    assert _refusal(m)[0] == "ILLEGAL_DELIVERY_TIME"


def test_system_topics_are_not_for_clients():
    for topic in ("SCHEDULE_TOPIC_XXXX", "TBW102", "rmq_sys_REVIVE_LOG_x", "RMQ_SYS_TRACE_TOPIC"):
        assert validate.system_topic(topic) == "cannot access system topic"
    assert validate.system_topic("%DLQ%g") == validate.system_topic("Orders") == ""


def test_a_duration_past_int64_milliseconds_is_held_to_int64():
    """The v2 wire allows Durations of ±2^63 seconds; the broker's pop request
    holds int64 milliseconds, so the proxy's conversion must not overflow it."""
    assert convert.duration_ms(duration_pb2.Duration(seconds=30, nanos=5_000_000)) == 30_005
    huge = duration_pb2.Duration(seconds=-(2**63) + 1, nanos=-999_999_999)
    assert convert.duration_ms(huge) == convert.INT64_MIN
    assert convert.duration_ms(duration_pb2.Duration(seconds=2**63 - 1)) == convert.INT64_MAX
    broker_pb2.PopMessageRequest(invisible_ms=convert.duration_ms(huge))  # builds
