"""The real grpcurl binary against a running name server: reflection, health, JSON
requests with proto field names, and the exit status on gRPC errors (64 + code)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import RunningNamesrv
from tests.integration.support import grpcurl_path

REGISTER = {
    "cluster_name": "DefaultCluster",
    "broker_addr": "127.0.0.1:10911",
    "broker_name": "broker-a",
    "broker_id": 0,
    "ha_server_addr": "127.0.0.1:10912",
    "broker_role": "ASYNC_MASTER",
    "body": {
        "topic_config": {
            "topic_config_table": {
                "TopicTest": {
                    "topic_name": "TopicTest",
                    "read_queue_nums": 4,
                    "write_queue_nums": 4,
                    "perm": 6,
                }
            },
            "data_version": {"timestamp": "1700000000000", "counter": "1"},
        }
    },
}


def grpcurl(
    ns: RunningNamesrv, *args: str, data: dict | None = None
) -> subprocess.CompletedProcess:
    command = [grpcurl_path(), "-plaintext"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [ns.addr, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_list_shows_the_name_server_health_and_reflection(ns):
    result = grpcurl(ns, "list")
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {
        "ferry.v1.NameServer",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


def test_describe_name_server_lists_every_rpc(ns):
    result = grpcurl(ns, "describe", "ferry.v1.NameServer")
    assert result.returncode == 0, result.stderr
    assert "ferry.v1.NameServer is a service" in result.stdout
    for rpc in (
        "RegisterBroker",
        "UnregisterBroker",
        "QueryDataVersion",
        "BrokerHeartbeat",
        "KeepAlive",
        "GetRouteInfoByTopic",
        "GetBrokerClusterInfo",
        "GetAllTopicList",
        "PutKVConfig",
        "GetKVConfig",
        "DeleteKVConfig",
        "GetKVListByNamespace",
        "WipeWritePermOfBroker",
        "AddWritePermOfBroker",
    ):
        assert f"rpc {rpc} (" in result.stdout, rpc
    assert (
        "rpc KeepAlive ( stream .ferry.v1.KeepAliveRequest ) returns ( stream .ferry.v1.KeepAliveResponse )"
        in result.stdout
    )


def test_describe_a_message_shows_proto_field_names(ns):
    result = grpcurl(ns, "describe", "ferry.v1.RegisterBrokerRequest")
    assert result.returncode == 0, result.stderr
    for field in ("cluster_name = 1", "broker_addr = 2", "body_crc32 = 7", "instance_id = 9"):
        assert field in result.stdout


def test_register_then_route_with_json_requests(ns):
    registered = grpcurl(ns, "ferry.v1.NameServer/RegisterBroker", data=REGISTER)
    assert registered.returncode == 0, registered.stderr
    assert json.loads(registered.stdout) == {"topic_config_applied": True}

    routed = grpcurl(ns, "ferry.v1.NameServer/GetRouteInfoByTopic", data={"topic": "TopicTest"})
    assert routed.returncode == 0, routed.stderr
    assert json.loads(routed.stdout) == {
        "queue_datas": [
            {"broker_name": "broker-a", "read_queue_nums": 4, "write_queue_nums": 4, "perm": 6}
        ],
        "broker_datas": [
            {
                "cluster": "DefaultCluster",
                "broker_name": "broker-a",
                "broker_addrs": {"0": "127.0.0.1:10911"},
            }
        ],
    }

    cluster = grpcurl(ns, "ferry.v1.NameServer/GetBrokerClusterInfo")
    assert cluster.returncode == 0, cluster.stderr
    info = json.loads(cluster.stdout)
    assert info["cluster_addr_table"] == {"DefaultCluster": {"broker_names": ["broker-a"]}}
    live = info["broker_live_table"]["127.0.0.1:10911"]
    assert live["broker_role"] == "ASYNC_MASTER"
    assert live["data_version"] == {
        "timestamp": "1700000000000",
        "counter": "1",
    }  # int64 as strings


def test_health_check_is_serving(ns):
    overall = grpcurl(ns, "grpc.health.v1.Health/Check")
    assert overall.returncode == 0, overall.stderr
    assert json.loads(overall.stdout) == {"status": "SERVING"}
    service = grpcurl(ns, "grpc.health.v1.Health/Check", data={"service": "ferry.v1.NameServer"})
    assert json.loads(service.stdout) == {"status": "SERVING"}


def test_not_found_exits_69_with_the_message(ns):
    result = grpcurl(ns, "ferry.v1.NameServer/GetRouteInfoByTopic", data={"topic": "Missing"})
    assert result.returncode == 64 + 5, (result.stdout, result.stderr)
    assert "NotFound" in result.stderr
    assert "No topic route info in name server for the topic: Missing" in result.stderr


@pytest.mark.parametrize(
    ("method", "data", "code", "text"),
    [
        (
            "ferry.v1.NameServer/RegisterBroker",
            {**REGISTER, "broker_id": -1},
            3,
            "broker_id",
        ),
        ("ferry.v1.NameServer/GetRouteInfoByTopic", {"topic": "bad topic"}, 3, "topic"),
        (
            "ferry.v1.NameServer/GetKVConfig",
            {"namespace": "ns", "key": "missing"},
            5,
            "missing",
        ),
    ],
    ids=["invalid registration", "invalid topic", "missing kv"],
)
def test_errors_exit_64_plus_the_status_code(ns, method, data, code, text):
    result = grpcurl(ns, method, data=data)
    assert result.returncode == 64 + code, (result.stdout, result.stderr)
    assert text in result.stderr


def test_kv_round_trip(ns):
    put = grpcurl(
        ns,
        "ferry.v1.NameServer/PutKVConfig",
        data={"namespace": "ORDER_TOPIC_CONFIG", "key": "Orders", "value": "broker-a:4"},
    )
    assert put.returncode == 0, put.stderr
    listed = grpcurl(
        ns, "ferry.v1.NameServer/GetKVListByNamespace", data={"namespace": "ORDER_TOPIC_CONFIG"}
    )
    assert json.loads(listed.stdout) == {"table": {"Orders": "broker-a:4"}}
