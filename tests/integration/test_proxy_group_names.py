"""The proxy names consumer groups and topics by the brokers' own rules, from
ferry.model: a group acks and changes invisibility under any name
`check_name` accepts (up to 255 characters, `.` and `:` included, as the
brokers do), and pops under one `check_pop_group` accepts (its retry and
dead-letter topics must be topic names: the topic alphabet; a name past 127
bytes is fitted, `fit_topic_name`, as Apache serves such groups). Checked
against a real broker's answers: the proxy refuses (ILLEGAL_CONSUMER_GROUP,
before asking a broker) exactly what the broker would. (The proxy used to
apply a rule of its own: 127 bytes of the topic alphabet for every call, so
acks of groups the brokers accept were refused and pops the brokers refuse
went through.)"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.model import NAME_MAX_LENGTH, TOPIC_MAX_LENGTH, check_topic
from ferry.runtime.errors import InvalidArgument
from ferry.v1 import broker_pb2
from services.proxy.servicer import _bad_group, _bad_pop_group, _bad_topic
from tests.conftest import LoopThread, start_broker
from tests.integration import support

TOPIC = "Named"
# The longest group that can pop TOPIC: %RETRY%<group>_Named in 127 bytes.
LONGEST_POP = TOPIC_MAX_LENGTH - len(f"%RETRY%_{TOPIC}")
GROUPS = ["g", "g" * LONGEST_POP, "g" * (LONGEST_POP + 1), "g" * 127, "g" * 128,
          "g" * NAME_MAX_LENGTH, "g" * (NAME_MAX_LENGTH + 1), "app.orders:v2", "ns%group",
          "", "bad group", "grüppe", "a/b"]  # fmt: skip
IDS = [f"{g[:10]}({len(g)})" for g in GROUPS]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker serving the RocketMQ 5 API itself (enableProxy: the proxy's
    servicer in local mode), with one message in TOPIC."""
    loop = LoopThread()
    b = start_broker(loop, tmp_path_factory.mktemp("names") / "b", enableProxy="true")
    support.create_topic(b.channel, TOPIC, 1)
    sent = b.broker.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"hello"))
    assert sent.status == broker_pb2.SEND_OK
    try:
        yield b
    finally:
        b.stop()
        loop.close()


def broker_refuses(call) -> bool:
    """Whether the broker refuses the call's consumer group (an error about
    anything else, e.g. the receipt handle, means it took the name)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.details().startswith(
            "consumer_group"
        )
    return False


@pytest.mark.parametrize("group", GROUPS, ids=IDS)
def test_the_proxy_refuses_exactly_the_pop_groups_the_broker_refuses(broker, group):
    # invisible_ms=1 is refused after the name is checked: no pop takes the message.
    pop = broker_pb2.PopMessageRequest(
        consumer_group=group, topic=TOPIC, max_msg_nums=1, invisible_ms=1, max_wait_ms=0
    )
    refused = broker_refuses(lambda: broker.broker.PopMessage(pop, timeout=10))
    assert (_bad_pop_group(group, TOPIC) != "") is refused


@pytest.mark.parametrize("group", GROUPS, ids=IDS)
def test_the_proxy_refuses_exactly_the_ack_groups_the_broker_refuses(broker, group):
    ack = broker_pb2.AckMessageRequest(consumer_group=group, topic=TOPIC, receipt_handles=["x"])
    refused = broker_refuses(lambda: broker.broker.AckMessage(ack, timeout=10))
    assert (_bad_group(group) != "") is refused


@pytest.mark.parametrize("topic", ["t", "t" * 127, "t" * 128, "a.b", "", "bad topic"])
def test_the_proxy_accepts_exactly_the_topics_the_brokers_accept(topic):
    try:
        check_topic(topic)
        accepted = True
    except InvalidArgument:
        accepted = False
    assert (_bad_topic(topic) == "") is accepted


def receive(broker, group: str) -> list[s.ReceiveMessageResponse]:
    stub = service_pb2_grpc.MessagingServiceStub(broker.channel)
    request = s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=1,
        invisible_duration=duration_pb2.Duration(seconds=30),
        long_polling_timeout=duration_pb2.Duration(seconds=1),
    )
    return list(stub.ReceiveMessage(request, timeout=20))


def test_pop_groups_whose_retry_topic_passes_127_bytes_receive(broker):
    # %RETRY%<group>_Named past 127 bytes (once refused with ILLEGAL_CONSUMER_GROUP):
    # served, as Apache serves it; the retry topic's name is fitted.
    for group in ("g" * (LONGEST_POP + 1), "h" * NAME_MAX_LENGTH):
        answers = receive(broker, group)
        assert answers[0].status.code == v2.OK, answers[0].status.message
        assert [a.message.body for a in answers if a.HasField("message")] == [b"hello"]
    [refused] = receive(broker, "app.orders:v2")  # the alphabet is still the rule
    assert refused.status.code == v2.ILLEGAL_CONSUMER_GROUP
    assert "[%|a-zA-Z0-9_-] only" in refused.status.message
