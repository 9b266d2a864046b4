"""Apache RocketMQ 4.x's own client API (MQClientAPIImpl, under the push consumer) against a
ferry broker's own RocketMQ-protocol port (listenPort), without a name server: heartbeat, member
list, a push consumer's pull decoded by the client's MessageDecoder, send-back and the
retry copy, queue locks and the SQL92 refusal (tests/compat/rocketmq4/.../ConsumerWire4)."""

from __future__ import annotations

import pytest

from ferry.v1 import broker_pb2
from tests.apache import ApacheUnavailable, classpath, run_java
from tests.compat.specs import json_lines
from tests.conftest import start_broker
from tests.integration import support

TOPIC = "WireTopic"
GROUP = "wire-group"
BROKER = "broker-w"


@pytest.fixture
def door(loop_thread, tmp_path):
    try:
        classpath("rocketmq4")
    except ApacheUnavailable as e:
        pytest.skip(str(e))
    b = start_broker(
        loop_thread, tmp_path / "store", brokerName=BROKER, messageDelayLevel="1s 1s 1s"
    )
    yield b, b.remoting_addr
    b.stop()


def test_the_java_client_api_heartbeats_pulls_sends_back_and_locks(door, tmp_path):
    broker, addr = door
    support.create_topic(broker.channel, TOPIC, 2)
    for tags in ("TagA", "TagB", "TagC"):
        r = broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(topic=TOPIC, queue_id=0, body=tags.encode(), tags=tags),
            timeout=10,
        )
        assert r.status == broker_pb2.SEND_OK
    result = run_java(
        "rocketmq4", "ferry.compat.ConsumerWire4", [addr, BROKER, TOPIC, GROUP],
        directory=tmp_path / "java",
    )  # fmt: skip
    # The client's own logger may print after the answer: take the JSON line.
    [seen] = json_lines(result.stdout)

    assert seen["heartbeatVersion"] == 409
    [client_id] = seen["consumerIds"]
    assert "@" in client_id
    assert seen["pullStatus"] == "FOUND"
    assert (seen["nextBeginOffset"], seen["maxOffset"]) == (3, 3)
    found = seen["found"]
    assert [(m["body"], m["tags"], m["queueOffset"]) for m in found] == [
        ("TagA", "TagA", 0),
        ("TagC", "TagC", 2),
    ]
    [retry] = seen["retried"]
    assert retry["topic"] == f"%RETRY%{GROUP}"
    assert (retry["body"], retry["reconsumeTimes"]) == ("TagA", 1)
    assert retry["retryTopic"] == TOPIC
    assert retry["originMsgId"] == found[0]["offsetMsgId"]
    assert seen["locked"] == [0, 1]
    assert seen["lockedByOther"] == []
    assert seen["lockedByOtherAfterUnlock"] == [1]
    # enablePropertyFilter is off on this broker, as on Apache by default.
    assert "does not support consumer to filter message by SQL92" in seen["sql92"]
