"""apache.rocketmq.v2: ferry's generated code is byte-identical to the official RocketMQ 5 SDK's.

protobuf keeps one default descriptor pool per process. It refuses a second, different file that
defines the same symbols ("duplicate symbol"), but accepts re-adding the same serialized
FileDescriptorProto under the same file name. ferry's proto/apache/rocketmq/v2/*.proto must
therefore compile to exactly the bytes the SDK (rocketmq-python-client 5.1.2) registers, so that
ferry's proxy and the SDK's clients can live in one test process.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from rocketmq.grpc_protocol import definition_pb2 as sdk_definition_pb2
from rocketmq.grpc_protocol import service_pb2 as sdk_service_pb2
from rocketmq.grpc_protocol import service_pb2_grpc as sdk_service_pb2_grpc

from apache.rocketmq.v2 import definition_pb2, service_pb2, service_pb2_grpc

SDK_PKG = "rocketmq.grpc_protocol"
FERRY_PKG = "apache.rocketmq.v2"
SERVICE = "apache.rocketmq.v2.MessagingService"

# The MessagingService methods and their kinds (as grpc channel factories), upstream's order.
EXPECTED_METHODS = {
    "QueryRoute": "unary_unary",
    "Heartbeat": "unary_unary",
    "SendMessage": "unary_unary",
    "QueryAssignment": "unary_unary",
    "ReceiveMessage": "unary_stream",
    "AckMessage": "unary_unary",
    "ForwardMessageToDeadLetterQueue": "unary_unary",
    "PullMessage": "unary_stream",
    "UpdateOffset": "unary_unary",
    "GetOffset": "unary_unary",
    "QueryOffset": "unary_unary",
    "EndTransaction": "unary_unary",
    "Telemetry": "stream_stream",
    "NotifyClientTermination": "unary_unary",
    "ChangeInvisibleDuration": "unary_unary",
    "RecallMessage": "unary_unary",
    "SyncLiteSubscription": "unary_unary",
}


def _sdk_registered_pb2_modules() -> list[str]:
    """The SDK's *_pb2 modules that `import rocketmq` loads, i.e. the files it registers.

    Asked of a fresh interpreter, so that nothing else this process imported counts.
    """
    code = (
        "import sys, rocketmq\n"
        f"p = {SDK_PKG + '.'!r}\n"
        "print(' '.join(sorted(n[len(p):] for n in sys.modules"
        " if n.startswith(p) and n.endswith('_pb2'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.split()


def test_ferry_generates_every_file_the_sdk_registers():
    registered = _sdk_registered_pb2_modules()
    # admin.proto ships in the SDK but is never imported by it, so ferry leaves it out.
    assert registered == ["definition_pb2", "service_pb2"]
    for name in registered:
        importlib.import_module(f"{FERRY_PKG}.{name}")


@pytest.mark.parametrize(
    ("ferry_module", "sdk_module", "file_name", "dependencies"),
    [
        (
            definition_pb2,
            sdk_definition_pb2,
            "definition.proto",
            ["google/protobuf/timestamp.proto", "google/protobuf/duration.proto"],
        ),
        (
            service_pb2,
            sdk_service_pb2,
            "service.proto",
            [
                "google/protobuf/duration.proto",
                "google/protobuf/timestamp.proto",
                "definition.proto",
            ],
        ),
    ],
    ids=["definition", "service"],
)
def test_serialized_descriptor_is_byte_identical(ferry_module, sdk_module, file_name, dependencies):
    ferry_bytes = ferry_module.DESCRIPTOR.serialized_pb
    assert ferry_bytes == sdk_module.DESCRIPTOR.serialized_pb
    fdp = descriptor_pb2.FileDescriptorProto.FromString(ferry_bytes)
    assert fdp.name == file_name
    assert fdp.package == "apache.rocketmq.v2"
    assert fdp.syntax == "proto3"
    assert list(fdp.dependency) == dependencies
    assert fdp.options.csharp_namespace == "Apache.Rocketmq.V2"
    assert fdp.options.java_package == "apache.rocketmq.v2"


# Imports both packages in the given order in a fresh interpreter and compares the bytes: the
# order within this process is whatever the first importer chose, so both orders run apart.
_ORDER_CHECK = """
import importlib, sys
first, second = sys.argv[1:3]
mods = {}
for pkg in (first, second):
    for name in ("definition_pb2", "service_pb2", "service_pb2_grpc"):
        mods[pkg, name] = importlib.import_module(pkg + "." + name)
for name in ("definition_pb2", "service_pb2"):
    a = mods[first, name].DESCRIPTOR.serialized_pb
    b = mods[second, name].DESCRIPTOR.serialized_pb
    assert a == b, name
import rocketmq
assert rocketmq.Producer and rocketmq.SimpleConsumer and rocketmq.PushConsumer
print("ok")
"""


@pytest.mark.parametrize(
    ("first", "second"),
    [(SDK_PKG, FERRY_PKG), (FERRY_PKG, SDK_PKG)],
    ids=["sdk-first", "ferry-first"],
)
def test_sdk_and_ferry_coexist_in_either_import_order(first, second):
    result = subprocess.run(
        [sys.executable, "-c", _ORDER_CHECK, first, second],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


class _RecordingChannel:
    """Stands in for a grpc.Channel: records which multicallable a stub asks for, per path."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def _record(self, kind: str):
        def factory(path: str, *args: Any, **kwargs: Any) -> str:
            self.calls[path] = kind
            return path

        return factory

    def __getattr__(self, kind: str):
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


def _stub_calls(module) -> dict[str, str]:
    channel = _RecordingChannel()
    module.MessagingServiceStub(channel)
    return channel.calls


def test_ferry_stub_makes_the_same_calls_as_the_sdk_stub():
    expected = {f"/{SERVICE}/{name}": kind for name, kind in EXPECTED_METHODS.items()}
    assert _stub_calls(sdk_service_pb2_grpc) == expected
    assert _stub_calls(service_pb2_grpc) == expected


def test_messaging_service_descriptor_methods_and_streaming_kinds():
    service = definition_pb2.DESCRIPTOR.pool.FindServiceByName(SERVICE)
    assert service.file.name == "service.proto"
    kinds = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }
    methods = {m.name: kinds[m.client_streaming, m.server_streaming] for m in service.methods}
    assert list(methods) == list(EXPECTED_METHODS)
    assert methods == EXPECTED_METHODS
    assert methods["ReceiveMessage"] == "unary_stream"
    assert methods["Telemetry"] == "stream_stream"
    by_name = service.methods_by_name
    assert by_name["Telemetry"].input_type.full_name == "apache.rocketmq.v2.TelemetryCommand"
    assert by_name["Telemetry"].output_type.full_name == "apache.rocketmq.v2.TelemetryCommand"
    assert by_name["SendMessage"].input_type is service_pb2.SendMessageRequest.DESCRIPTOR


def test_ferry_servicer_registers_every_method():
    class _Server:
        def __init__(self) -> None:
            self.handlers: list[Any] = []

        def add_generic_rpc_handlers(self, handlers) -> None:
            self.handlers.extend(handlers)

        def add_registered_method_handlers(self, service_name, method_handlers) -> None:
            assert service_name == SERVICE
            self.methods = method_handlers

    server = _Server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(
        service_pb2_grpc.MessagingServiceServicer(), server
    )
    assert set(server.methods) == set(EXPECTED_METHODS)
    for name, kind in EXPECTED_METHODS.items():
        handler = server.methods[name]
        assert (handler.request_streaming, handler.response_streaming) == (
            kind.startswith("stream"),
            kind.endswith("stream"),
        )


def test_messages_round_trip_between_sdk_and_ferry():
    # The same descriptors, so a message built with one parses with the other.
    msg = definition_pb2.Message(body=b"hi", user_properties={"k": "v"})
    msg.topic.name = "t"
    msg.system_properties.tag = "a"
    sdk_msg = sdk_definition_pb2.Message.FromString(msg.SerializeToString())
    assert sdk_msg.body == b"hi"
    assert sdk_msg.topic.name == "t"
    assert dict(sdk_msg.user_properties) == {"k": "v"}
    assert sdk_msg.system_properties.HasField("tag")
