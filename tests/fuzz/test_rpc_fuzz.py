"""Every RPC of every service, fed hypothesis-generated requests: each field
gets random values of its type, mixed with values that mean something to ferry
(topic, broker and cluster names, addresses, limits), nested messages, lists
and maps. Against a live name server and broker:

- no answer is INTERNAL or UNKNOWN (a bad request is the client's error);
- the servers stay healthy;
- a rejected request changes nothing (the name server's tables and KV config,
  the broker's topic, subscription, offset tables, permission and log end).

The examples per RPC come from FERRY_FUZZ_EXAMPLES (default 50, what `make test` runs; `make fuzz`
runs 1,000). Long polls are kept short (fields named *_ms get small values)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    ha_admin_pb2,
    namesrv_pb2,
    namesrv_pb2_grpc,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from tests.conftest import LoopThread, start_broker, start_namesrv

EXAMPLES = int(os.environ.get("FERRY_FUZZ_EXAMPLES", "50"))
MODULES = (namesrv_pb2, broker_pb2, broker_admin_pb2, slave_sync_pb2, ha_admin_pb2)
METHODS = [
    (service, method)
    for module in MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
WORDS = [
    "", "TopicTest", "Fuzz", "broker-a", "broker-z", "DefaultCluster", "127.0.0.1:10911",
    "127.0.0.1:0", "127.0.0.1:99999", "localhost", "%RETRY%g", "SCHEDULE_TOPIC_XXXX",
    "ORDER_TOPIC_CONFIG", "g", "a" * 300, "x:y:z", "ü\x00\x01", "-1", "0", "*", "TAGS",
]  # fmt: skip
KV_NAMESPACES = ["ORDER_TOPIC_CONFIG", "g", "TopicTest", "Fuzz", "a"]
INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def scalar(field: FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        if field.name.endswith(("_ms", "_millis")):
            return st.integers(max(lo, -5), 200)  # no long waits
        return st.one_of(st.integers(max(lo, -3), 40), st.sampled_from([lo, hi]),
                         st.integers(lo, hi))  # fmt: skip
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64)
    if t == FieldDescriptor.TYPE_STRING:
        # Two parts words ferry knows to one part random text: deeper paths.
        return st.one_of(st.sampled_from(WORDS), st.sampled_from(WORDS), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"x" * 70000]))
    if t == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(values), st.integers(-2, 40))
    raise AssertionError(f"no strategy for {field.full_name}")


def field_strategy(field: FieldDescriptor, depth: int) -> st.SearchStrategy | None:
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and field.message_type.GetOptions().map_entry:
        key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]  # fmt: skip
        value = field_strategy(value_f, depth + 1)
        if value is None:
            return None
        return st.dictionaries(scalar(key_f), value, max_size=3)
    if is_message:
        if depth >= 3:
            return None
        one = message_strategy(field.message_type, depth + 1)
    else:
        one = scalar(field)
    if field.is_repeated:
        return st.lists(one, max_size=3)
    return one


_cache: dict[tuple[str, int], st.SearchStrategy] = {}


def message_strategy(desc, depth: int = 0) -> st.SearchStrategy:
    key = (desc.full_name, depth)
    if key not in _cache:
        cls = message_factory.GetMessageClass(desc)
        fields = {f.name: s for f in desc.fields if (s := field_strategy(f, depth)) is not None}

        def build(values: dict) -> object:
            msg = cls()
            for name, value in values.items():
                f = desc.fields_by_name[name]
                target = getattr(msg, name)
                if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
                    value_is_message = f.message_type.fields_by_name["value"].type == (
                        FieldDescriptor.TYPE_MESSAGE
                    )
                    for k, v in value.items():
                        if value_is_message:
                            target[k].CopyFrom(v)
                        else:
                            target[k] = v
                elif f.is_repeated:
                    if f.type == FieldDescriptor.TYPE_MESSAGE:
                        for v in value:
                            target.add().CopyFrom(v)
                    else:
                        target.extend(value)
                elif f.type == FieldDescriptor.TYPE_MESSAGE:
                    target.CopyFrom(value)
                else:
                    setattr(msg, name, value)
            return msg

        _cache[key] = st.fixed_dictionaries({}, optional=fields).map(build)
    return _cache[key]


class Servers:
    def __init__(self, root) -> None:
        self.loop = LoopThread()
        self.ns = start_namesrv(self.loop, root / "ns", metrics_port=-1)
        self.broker = start_broker(
            self.loop, root / "store", self.ns.remoting_addr, brokerName="broker-a"
        )
        broker_admin_pb2_grpc.BrokerAdminStub(self.broker.channel).UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name="TopicTest", read_queue_nums=4, write_queue_nums=4, perm=6
                )
            ),
            timeout=10,
        )
        broker_pb2_grpc.BrokerStub(self.broker.channel).SendMessage(
            broker_pb2.SendMessageRequest(topic="TopicTest", body=b"seed"), timeout=10
        )
        self.calls = 0

    def channel_for(self, service) -> grpc.Channel:
        return self.ns.channel if service.name == "NameServer" else self.broker.channel

    def snapshot(self, service) -> tuple:
        if service.name == "NameServer":
            stub = namesrv_pb2_grpc.NameServerStub(self.ns.channel)
            info = stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=5)
            info.ClearField("broker_live_table")  # heartbeat times move by themselves
            topics = stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest(), timeout=5)
            kv = [self._kv(stub, n) for n in KV_NAMESPACES]
            return (info.SerializeToString(deterministic=True), sorted(topics.topic_list), kv)
        sync = slave_sync_pb2_grpc.SlaveSyncStub(self.broker.channel)
        admin = broker_admin_pb2_grpc.BrokerAdminStub(self.broker.channel)
        runtime = admin.GetBrokerRuntimeInfo(
            broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=5
        )
        return (
            sync.GetAllTopicConfig(slave_sync_pb2.GetAllTopicConfigRequest(), timeout=5)
            .SerializeToString(deterministic=True),
            sync.GetAllConsumerOffset(slave_sync_pb2.GetAllConsumerOffsetRequest(), timeout=5)
            .SerializeToString(deterministic=True),
            sync.GetAllSubscriptionGroupConfig(
                slave_sync_pb2.GetAllSubscriptionGroupConfigRequest(), timeout=5
            ).SerializeToString(deterministic=True),
            sync.GetAllDelayOffset(slave_sync_pb2.GetAllDelayOffsetRequest(), timeout=5)
            .SerializeToString(deterministic=True),
            self.broker.app.store.max_offset,
            runtime.broker_permission,
        )  # fmt: skip

    @staticmethod
    def _kv(stub, namespace: str) -> bytes | None:
        try:
            table = stub.GetKVListByNamespace(
                namesrv_pb2.GetKVListByNamespaceRequest(namespace=namespace), timeout=5
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None  # an empty namespace
            raise
        return table.SerializeToString(deterministic=True)

    def healthy(self) -> bool:
        for ch in (self.ns.channel, self.broker.channel):
            answer = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            if answer.status != health_pb2.HealthCheckResponse.SERVING:
                return False
        return True

    def close(self) -> None:
        self.broker.stop()
        self.ns.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    s = Servers(tmp_path_factory.mktemp("fuzz"))
    yield s
    print(f"\nfuzz: {s.calls} requests over {len(METHODS)} RPCs")
    s.close()


BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def call(servers: Servers, service, method, request) -> grpc.StatusCode:
    channel = servers.channel_for(service)
    path = f"/{service.full_name}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    servers.calls += 1
    try:
        if method.client_streaming or method.server_streaming:
            stream = channel.stream_stream(
                path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=out_cls.FromString,
            )(iter(request), timeout=1.0)  # fmt: skip
            for _ in stream:
                pass
        else:
            channel.unary_unary(
                path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=out_cls.FromString,
            )(request, timeout=5)  # fmt: skip
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("service,method", METHODS, ids=[f"{s.name}.{m.name}" for s, m in METHODS])
def test_random_requests_never_break_a_server(servers, service, method):
    strategy = message_strategy(method.input_type)
    if method.client_streaming:
        strategy = st.lists(strategy, min_size=1, max_size=3)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=strategy)
    def run(request):
        before = servers.snapshot(service)
        code = call(servers, service, method, request)
        assert code not in BAD, f"{method.full_name} answered {code.name} to {request!r}"
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
            assert servers.snapshot(service) == before, (
                f"{method.full_name} rejected {request!r} with {code.name} but changed state"
            )

    run()
    assert servers.healthy()
