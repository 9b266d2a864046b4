"""Bad requests over real gRPC: INVALID_ARGUMENT naming the field, and nothing changed."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from ferry.v1 import common_pb2, namesrv_pb2
from ferry.wire import body_crc32
from tests.conftest import RunningNamesrv
from tests.helpers import register_request
from tests.integration.support import register_group

MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"


def snapshot(ns: RunningNamesrv) -> tuple:
    """Everything a client can see of the route tables and the KV store."""
    info = ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    topics = ns.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest())
    routes = [
        ns.stub.GetRouteInfoByTopic(
            namesrv_pb2.GetRouteInfoByTopicRequest(topic=t)
        ).SerializeToString(deterministic=True)
        for t in topics.topic_list
    ]
    kv = ns.stub.GetKVListByNamespace(namesrv_pb2.GetKVListByNamespaceRequest(namespace="app"))
    kv_file = (ns.home / "kvConfig.json").read_bytes()
    return (
        info.SerializeToString(deterministic=True),
        list(topics.topic_list),
        routes,
        dict(kv.table),
        kv_file,
    )


@pytest.fixture
def seeded(ns: RunningNamesrv) -> RunningNamesrv:
    register_group(ns, {"TopicTest": 4, "Orders": 8})
    ns.stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="app", key="k", value="v"))
    return ns


def refuse(ns: RunningNamesrv, call: Callable, request, field: str) -> str:
    """`call(request)` fails with INVALID_ARGUMENT naming `field`; nothing changes."""
    before = snapshot(ns)
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    error = info.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert field in error.details(), f"{field!r} not named in {error.details()!r}"
    assert snapshot(ns) == before, "a refused request changed the tables"
    return error.details()


def with_topic(name: str, read: int = 4, write: int = 4, perm: int = 6):
    """A master re-registration (new DataVersion, so it would apply) carrying one extra topic."""

    def build() -> namesrv_pb2.RegisterBrokerRequest:
        request = register_request(
            addr=MASTER,
            topics={"TopicTest": 4, "Brand-New": 2},
            counter=2,
            broker_role="SYNC_MASTER",
        )
        request.body.topic_config.topic_config_table[name].CopyFrom(
            common_pb2.TopicConfig(
                topic_name=name, read_queue_nums=read, write_queue_nums=write, perm=perm
            )
        )
        request.body_crc32 = body_crc32(request.body)
        return request

    return build


def crc_mismatch() -> namesrv_pb2.RegisterBrokerRequest:
    request = register_request(addr=MASTER, topics={"TopicTest": 4}, counter=2)
    request.body.topic_config.topic_config_table["Sneaked"].CopyFrom(
        common_pb2.TopicConfig(topic_name="Sneaked", read_queue_nums=1, write_queue_nums=1, perm=6)
    )  # after the CRC was computed
    return request


REGISTRATION_CASES = {
    "empty cluster_name": (lambda: register_request(addr=MASTER, cluster=""), "cluster_name"),
    "broker_addr without port": (lambda: register_request(addr="localhost"), "broker_addr"),
    "broker_addr port out of range": (
        lambda: register_request(addr="127.0.0.1:70000"),
        "broker_addr",
    ),
    "broker_addr empty": (lambda: register_request(addr=""), "broker_addr"),
    "negative broker_id": (lambda: register_request(addr=SLAVE, broker_id=-1), "broker_id"),
    "SYNC_MASTER with broker_id 1": (
        lambda: register_request(addr=SLAVE, broker_id=1, broker_role="SYNC_MASTER"),
        "broker_id",
    ),
    "SLAVE with broker_id 0": (
        lambda: register_request(addr=MASTER, broker_id=0, broker_role="SLAVE"),
        "broker_id",
    ),
    "unknown broker_role": (
        lambda: register_request(addr=MASTER, broker_role="LEADER"),
        "broker_role",
    ),
    "empty broker_name": (lambda: register_request(addr=MASTER, broker_name=""), "broker_name"),
    "bad ha_server_addr": (
        lambda: register_request(addr=MASTER, ha_addr="not-an-address"),
        "ha_server_addr",
    ),
    "read_queue_nums -1": (with_topic("Bad", read=-1), "read_queue_nums"),
    "read_queue_nums 70000": (with_topic("Bad", read=70000), "read_queue_nums"),
    "write_queue_nums 70000": (with_topic("Bad", write=70000), "write_queue_nums"),
    "perm 16": (with_topic("Bad", perm=16), "perm"),
    "topic with a space": (with_topic("bad topic"), "topic_config_table"),
    "topic with a slash": (with_topic("a/b"), "topic_config_table"),
    "topic of 128 characters": (with_topic("T" * 128), "topic_config_table"),
    "negative heartbeat_timeout_ms": (
        lambda: register_request(addr=MASTER, heartbeat_timeout_ms=-1),
        "heartbeat_timeout_ms",
    ),
}


@pytest.mark.parametrize("case", list(REGISTRATION_CASES))
def test_bad_registration_is_refused_and_changes_nothing(seeded, case):
    build, field = REGISTRATION_CASES[case]
    refuse(seeded, seeded.stub.RegisterBroker, build(), field)


def test_crc32_mismatch_is_refused_and_changes_nothing(seeded):
    details = refuse(seeded, seeded.stub.RegisterBroker, crc_mismatch(), "body_crc32")
    assert "crc32 not match" in details


def test_crc32_zero_means_unchecked(seeded):
    request = crc_mismatch()
    request.body_crc32 = 0
    assert seeded.stub.RegisterBroker(request).topic_config_applied
    assert "Sneaked" in seeded.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest()).topic_list


def test_topic_name_differing_from_its_key_is_refused(seeded):
    request = register_request(addr=MASTER, topics={"TopicTest": 4}, counter=2)
    request.body.topic_config.topic_config_table["TopicTest"].topic_name = "Other"
    request.body_crc32 = body_crc32(request.body)
    refuse(seeded, seeded.stub.RegisterBroker, request, "topic_name")


def test_bad_unregister_query_and_heartbeat_are_refused(seeded):
    stub = seeded.stub
    refuse(
        seeded,
        stub.UnregisterBroker,
        namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="DefaultCluster", broker_addr="nohostport", broker_name="broker-a"
        ),
        "broker_addr",
    )
    refuse(
        seeded,
        stub.UnregisterBroker,
        namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="", broker_addr=MASTER, broker_name="broker-a"
        ),
        "cluster_name",
    )
    refuse(
        seeded,
        stub.QueryDataVersion,
        namesrv_pb2.QueryDataVersionRequest(
            cluster_name="DefaultCluster", broker_addr=MASTER, broker_name="broker-a", broker_id=-3
        ),
        "broker_id",
    )
    refuse(
        seeded,
        stub.BrokerHeartbeat,
        namesrv_pb2.BrokerHeartbeatRequest(cluster_name="DefaultCluster", broker_addr="x"),
        "broker_addr",
    )
    refuse(
        seeded,
        stub.WipeWritePermOfBroker,
        namesrv_pb2.WipeWritePermOfBrokerRequest(broker_name=""),
        "broker_name",
    )


@pytest.mark.parametrize(
    "topic",
    ["", "has space", "T" * 128, "semi;colon", "ünïcode"],
    ids=["empty", "space", "128 chars", "semicolon", "unicode"],
)
def test_bad_topic_in_get_route_is_invalid_argument(seeded, topic):
    refuse(
        seeded,
        seeded.stub.GetRouteInfoByTopic,
        namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic),
        "topic",
    )


def test_longest_legal_topic_is_just_not_found(seeded):
    with pytest.raises(grpc.RpcError) as info:
        seeded.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="T" * 127))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


KV_CASES = {
    "put empty namespace": ("PutKVConfig", dict(namespace="", key="k", value="v"), "namespace"),
    "put empty key": ("PutKVConfig", dict(namespace="app", key="", value="v"), "key"),
    "put namespace of 256 characters": (
        "PutKVConfig",
        dict(namespace="n" * 256, key="k", value="v"),
        "namespace",
    ),
    "put key of 256 characters": (
        "PutKVConfig",
        dict(namespace="app", key="k" * 256, value="v"),
        "key",
    ),
    "put value over 64 KiB": (
        "PutKVConfig",
        dict(namespace="app", key="k", value="v" * (64 * 1024 + 1)),
        "value",
    ),
    "get empty namespace": ("GetKVConfig", dict(namespace="", key="k"), "namespace"),
    "get empty key": ("GetKVConfig", dict(namespace="app", key=""), "key"),
    "delete empty namespace": ("DeleteKVConfig", dict(namespace="", key="k"), "namespace"),
    "delete empty key": ("DeleteKVConfig", dict(namespace="app", key=""), "key"),
    "list empty namespace": ("GetKVListByNamespace", dict(namespace=""), "namespace"),
}


@pytest.mark.parametrize("case", list(KV_CASES))
def test_bad_kv_names_are_refused_and_change_nothing(seeded, case):
    method, fields, field = KV_CASES[case]
    request_type = getattr(namesrv_pb2, method + "Request")
    refuse(seeded, getattr(seeded.stub, method), request_type(**fields), field)
