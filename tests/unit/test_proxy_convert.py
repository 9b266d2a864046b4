"""The proxy's message conversion, as RocketMQ's 5.x proxy does it
(services/proxy/convert.py)."""

from __future__ import annotations

import hashlib
import zlib

from apache.rocketmq.v2 import definition_pb2 as v2
from ferry.v1 import broker_pb2
from services.proxy import convert


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
