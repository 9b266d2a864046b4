"""Every RPC of `apache.rocketmq.v2.MessagingService`, fed hypothesis-generated
requests (the same generator as test_rpc_fuzz.py: random values of each
field's type mixed with names ferry knows), against a live proxy in front of a
name server and a broker:

- no call fails with INTERNAL or UNKNOWN, and every unary answer carries a v2
  status (the API's error channel);
- no method raised: the proxy answers an exception of its own with a v2
  INTERNAL_ERROR under gRPC OK, so its "unexpected error" log is checked;
- the proxy stays SERVING.

FERRY_FUZZ_EXAMPLES sets the examples per RPC (default 50)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import message_factory, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings

from apache.rocketmq.v2 import definition_pb2, service_pb2, service_pb2_grpc
from ferry.v1 import broker_pb2, broker_pb2_grpc
from services.proxy.app import ProxyApp, ProxyConfig
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.fuzz.test_rpc_fuzz import EXAMPLES, message_strategy
from tests.integration import support

SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


class Proxied:
    def __init__(self, root) -> None:
        self.loop = LoopThread()
        self.ns = start_namesrv(self.loop, root / "ns", metrics_port=-1)
        self.broker = start_broker(
            self.loop, root / "store", self.ns.remoting_addr, brokerName="broker-a"
        )
        support.create_topic(self.broker.channel, "TopicTest", 4)
        broker_pb2_grpc.BrokerStub(self.broker.channel).SendMessage(
            broker_pb2.SendMessageRequest(topic="TopicTest", body=b"seed"), timeout=10
        )
        self.app = ProxyApp(ProxyConfig((self.ns.remoting_addr,), host="127.0.0.1", port=0))
        self.loop.run(self.app.start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.app.port}")

    def healthy(self) -> bool:
        answer = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        self.channel.close()
        self.loop.run(self.app.stop())
        self.broker.stop()
        self.ns.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[Proxied]:
    p = Proxied(tmp_path_factory.mktemp("proxy-fuzz"))
    yield p
    p.close()


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=[m.name for m in SERVICE.methods])
def test_random_requests_never_break_the_proxy(proxied, method, caplog):
    path = f"/{SERVICE.full_name}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    serialize = lambda m: m.SerializeToString()  # noqa: E731

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(message_strategy(method.input_type))
    def one(request) -> None:
        try:
            if method.client_streaming:
                answers = list(
                    proxied.channel.stream_stream(
                        path, request_serializer=serialize, response_deserializer=out_cls.FromString
                    )(iter([request, request]), timeout=2.0)
                )
            elif method.server_streaming:
                answers = list(
                    proxied.channel.unary_stream(
                        path, request_serializer=serialize, response_deserializer=out_cls.FromString
                    )(request, timeout=2.0)
                )
                assert answers and answers[0].HasField("status"), "a stream starts with a status"
            else:
                answer = proxied.channel.unary_unary(
                    path, request_serializer=serialize, response_deserializer=out_cls.FromString
                )(request, timeout=5)
                assert answer.status.code != 0, f"{method.name} answered without a status"
        except grpc.RpcError as exc:
            assert exc.code() not in BAD, f"{method.name}: {exc.code()} {exc.details()}"

    with caplog.at_level(logging.ERROR, logger="services.proxy.metrics"):
        one()
    crashes = [r.getMessage() for r in caplog.records if r.name == "services.proxy.metrics"]
    assert not crashes, crashes[:3]
    assert proxied.healthy()


@pytest.mark.parametrize("seconds", [-(2**63), -1, 2**62])
def test_a_born_timestamp_that_is_no_date_is_a_bad_request(proxied, seconds):
    # Found by the fuzzer: it overflowed the broker's int64 and crashed the call.
    message = definition_pb2.Message(
        topic=definition_pb2.Resource(name="TopicTest"),
        body=b"x",
        system_properties=definition_pb2.SystemProperties(
            message_id="01ABC", born_timestamp=timestamp_pb2.Timestamp(seconds=seconds)
        ),
    )
    answer = service_pb2_grpc.MessagingServiceStub(proxied.channel).SendMessage(
        service_pb2.SendMessageRequest(messages=[message]), timeout=5
    )
    assert answer.entries[0].status.code == definition_pb2.BAD_REQUEST
    assert "born_timestamp" in answer.entries[0].status.message
