"""Apache RocketMQ 4.9's Java producer (`DefaultMQProducer`, unchanged, through
tests/compat/rocketmq4/src/.../Produce4.java) sends to a ferry broker over
RocketMQ's protocol, and ferry.v1 reads back the same messages: bodies (those
over 4 KiB arrive zlib-compressed and flagged, and come back inflated), tags,
keys, user properties, the producer's UNIQ_KEY as message id and the broker's
offset message id.

The producer finds the broker as it would in production: through a real ferry
name server (its RocketMQ-protocol port), with which the ferry broker
(namesrvAddr = that address) has registered itself; the route (105) gives the
broker's RocketMQ-protocol address, where the producer sends.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from ferry.remoting import bodies, codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.apache import run_java
from tests.compat.specs import json_lines, message_specs, pull_all, user_view, write_specs
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.integration.test_remoting_sends import Door, connect_door
from tests.waiting import wait_for

TOPIC = "JavaToFerry"
COUNT = 40
QUEUES = 4


def route(namesrv: str, topic: str) -> dict | None:
    """The name server's GET_ROUTEINFO_BY_TOPIC answer for `topic` (None: no route)."""
    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), 10)
    return bodies.loads(answer.body) if answer.code == codes.SUCCESS else None


@pytest.fixture
def java_door(loop_thread: LoopThread, tmp_path) -> Iterator[tuple[Door, str]]:
    ns = start_namesrv(loop_thread, tmp_path / "namesrv", metrics_port=-1)
    broker = start_broker(
        loop_thread,
        tmp_path / "store",
        ns.remoting_addr,
        brokerName="broker-j",
        mappedFileSizeCommitLog=4 << 20,
        maxMessageSize=1 << 20,
    )
    support.create_topic(broker.channel, TOPIC, QUEUES)
    door = connect_door(loop_thread, broker)
    # The broker registered itself: the route names it by its RocketMQ-protocol address.
    wait_for(
        lambda: (
            (r := route(ns.remoting_addr, TOPIC)) is not None
            and [q["writeQueueNums"] for q in r["queueDatas"]] == [QUEUES]
        ),
        10,
        f"broker-j's {TOPIC} in the name server's route",
    )
    got = route(ns.remoting_addr, TOPIC)
    assert got is not None
    assert [(b["brokerName"], b["cluster"], b["brokerAddrs"]) for b in got["brokerDatas"]] == [
        ("broker-j", "DefaultCluster", {"0": broker.remoting_addr})
    ]
    assert broker.remoting_addr != broker.addr
    yield door, ns.remoting_addr
    door.close()
    broker.stop()
    ns.stop()


@pytest.mark.parametrize(
    ("smart", "code"), [(True, codes.SEND_MESSAGE_V2), (False, codes.SEND_MESSAGE)]
)
def test_java_producer_messages_read_back_through_ferry_v1(java_door, tmp_path, smart, code):
    """sendSmartMsg (the default) sends 310 with a-n names; off, 10 with long names."""
    door, namesrv = java_door
    specs = message_specs(TOPIC, COUNT, delays=False)
    spec_file = write_specs(tmp_path / "specs.jsonl", specs)
    result = run_java(
        "rocketmq4",
        "ferry.compat.Produce4",
        [namesrv, "java-producer", str(spec_file)],
        directory=tmp_path / "java",
        system_properties=[f"-Dorg.apache.rocketmq.client.sendSmartMsg={str(smart).lower()}"],
        check=False,
    )
    sent = json_lines(result.stdout)
    assert len(sent) == COUNT, result.stdout[-2000:] + result.stderr[-3000:]
    assert all(s["status"] == "SEND_OK" for s in sent), [s for s in sent if "error" in s][:3]
    assert result.returncode == 0
    assert door.requests(code) == COUNT

    stored = pull_all(door.broker, TOPIC, range(QUEUES))
    assert len(stored) == COUNT
    host, port = door.broker.app.store.store_host
    for spec, answer in zip(specs, sent, strict=True):
        message = stored[(answer["queueId"], answer["queueOffset"])]
        assert message.msg_id == answer["offsetMsgId"]
        assert message.store_host == f"{host}:{port}"
        assert message.body == base64.b64decode(spec["body"])
        assert (message.tags, message.keys) == (spec["tags"], spec["keys"])
        properties = user_view(dict(message.properties))
        assert properties.pop("UNIQ_KEY") == answer["msgId"]  # the producer's own id
        assert properties.pop("CLUSTER") == "DefaultCluster"  # stamped by the broker, as Apache's
        assert properties == spec["props"]
