"""Apache RocketMQ 4.9's Java producer (`DefaultMQProducer`, unchanged, through
tests/compat/rocketmq4/src/.../Produce4.java) sends to a ferry broker over
RocketMQ's protocol, and ferry.v1 reads back the same messages: bodies (those
over 4 KiB arrive zlib-compressed and flagged, and come back inflated), tags,
keys, user properties, the producer's UNIQ_KEY as message id and the broker's
offset message id.

The name server here is a stand-in that answers only GET_ROUTEINFO_BY_TOPIC
with a route to the broker's RocketMQ-protocol door; the producer's
heartbeats, which the door does not serve yet, are answered "not supported",
which Java logs and gets over.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, RemotingServer
from tests.apache import run_java
from tests.compat.specs import json_lines, message_specs, pull_all, user_view, write_specs
from tests.conftest import LoopThread, start_broker
from tests.integration import support
from tests.integration.test_remoting_sends import Door, open_door

TOPIC = "JavaToFerry"
COUNT = 40
QUEUES = 4


class RouteOnlyNamesrv:
    """Answers GET_ROUTEINFO_BY_TOPIC for one topic with one broker; 17 otherwise."""

    def __init__(self, broker_addr: str) -> None:
        self.broker_addr = broker_addr
        self.server = RemotingServer("namesrv", {codes.GET_ROUTEINFO_BY_TOPIC: self.route})

    async def route(self, connection: Connection, request: Command) -> Command:
        if request.ext.get("topic") != TOPIC:
            return request.answer(codes.TOPIC_NOT_EXIST, f"no route for {request.ext.get('topic')}")
        route = {
            "brokerDatas": [
                {
                    "brokerAddrs": {"0": self.broker_addr},
                    "brokerName": "broker-j",
                    "cluster": "DefaultCluster",
                }
            ],
            "filterServerTable": {},
            "queueDatas": [
                {
                    "brokerName": "broker-j",
                    "perm": 6,
                    "readQueueNums": QUEUES,
                    "topicSysFlag": 0,
                    "writeQueueNums": QUEUES,
                }
            ],
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(route))


@pytest.fixture
def java_door(loop_thread: LoopThread, tmp_path) -> Iterator[tuple[Door, str]]:
    broker = start_broker(
        loop_thread,
        tmp_path / "store",
        brokerName="broker-j",
        mappedFileSizeCommitLog=4 << 20,
        maxMessageSize=1 << 20,
    )
    support.create_topic(broker.channel, TOPIC, QUEUES)
    door = open_door(loop_thread, broker)
    door_port = loop_thread.run(_port_of(door.server))
    namesrv = RouteOnlyNamesrv(f"127.0.0.1:{door_port}")
    ns_port = loop_thread.run(namesrv.server.listen("127.0.0.1", 0))
    yield door, f"127.0.0.1:{ns_port}"
    loop_thread.run(namesrv.server.stop())
    door.close()
    broker.stop()


async def _port_of(server: RemotingServer) -> int:
    return int(server._servers[0].sockets[0].getsockname()[1])


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
    host, port = door.deps.store_host()
    for spec, answer in zip(specs, sent, strict=True):
        message = stored[(answer["queueId"], answer["queueOffset"])]
        assert message.msg_id == answer["offsetMsgId"]
        assert message.store_host == f"{host}:{port}"
        assert message.body == base64.b64decode(spec["body"])
        assert (message.tags, message.keys) == (spec["tags"], spec["keys"])
        properties = user_view(dict(message.properties))
        assert properties.pop("UNIQ_KEY") == answer["msgId"]  # the producer's own id
        assert properties == spec["props"]
