"""The `ferry` console command (a subprocess) against real name servers: route,
cluster and kv with tables and --json, exit statuses, and failover between two
independent name servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferry.v1 import namesrv_pb2
from tests.conftest import LoopThread, RunningNamesrv, start_namesrv
from tests.helpers import register_request
from tests.integration.support import HeldPort, run_ferry
from tests.integration.support import register_group as support_register_group

MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"


def register_group(ns: RunningNamesrv) -> None:
    support_register_group(ns, {"TopicTest": 4, "Orders": 2})


@pytest.fixture
def populated(ns: RunningNamesrv) -> RunningNamesrv:
    register_group(ns)
    return ns


def ok(result) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def rows(text: str) -> list[list[str]]:
    """A table printed by `ferry` as cells (columns are separated by 2+ spaces)."""
    return [[c for c in line.split("  ") if c] for line in text.strip().splitlines()]


def test_route_prints_queues_and_addresses(populated):
    out = ok(run_ferry("route", "TopicTest", "-n", populated.remoting_addr))
    lines = out.splitlines()
    assert lines[0] == "topic TopicTest"
    queue_table, addr_table = out.split("\n\n")
    assert [c.strip() for c in rows(queue_table)[1]] == [
        "BROKER",
        "READ QUEUES",
        "WRITE QUEUES",
        "PERM",
    ]
    assert [c.strip() for c in rows(queue_table)[2]] == ["broker-a", "4", "4", "6 (RW-)"]
    assert [[c.strip() for c in r] for r in rows(addr_table)] == [
        ["CLUSTER", "BROKER", "ID", "ADDRESS"],
        ["DefaultCluster", "broker-a", "0", MASTER],
        ["DefaultCluster", "broker-a", "1", SLAVE],
    ]


def test_route_json(populated):
    data = json.loads(ok(run_ferry("route", "Orders", "-n", populated.remoting_addr, "--json")))
    assert data["queueDatas"] == [
        {
            "brokerName": "broker-a",
            "readQueueNums": 2,
            "writeQueueNums": 2,
            "perm": 6,
            "topicSysFlag": 0,
            "attributes": {},  # the topic's attributes (message.type), none here
        }
    ]
    assert data["brokerDatas"] == [
        {
            "cluster": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerAddrs": {"0": MASTER, "1": SLAVE},
            # ferry's field: each broker's RocketMQ-protocol port, by broker id (the
            # proxy sends there). These brokers registered over gRPC without one.
            "remotingAddrs": {},
        }
    ]


def test_route_of_a_missing_topic_exits_1_with_the_message(populated):
    result = run_ferry("route", "Missing", "-n", populated.remoting_addr)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr
    assert "No topic route info in name server for the topic: Missing" in result.stderr


def test_cluster_table(populated):
    out = ok(run_ferry("cluster", "-n", populated.remoting_addr))
    table = [[c.strip() for c in r] for r in rows(out)]
    assert table[0] == ["CLUSTER", "BROKER", "ID", "ADDRESS", "ROLE", "LAST HEARTBEAT"]
    assert [r[:5] for r in table[1:]] == [
        ["DefaultCluster", "broker-a", "0", MASTER, "SYNC_MASTER"],
        ["DefaultCluster", "broker-a", "1", SLAVE, "SLAVE"],
    ]
    assert all(r[5].endswith("s ago)") for r in table[1:])


def test_cluster_json(populated):
    info = json.loads(ok(run_ferry("cluster", "-n", populated.remoting_addr, "--json")))
    assert info["clusterAddrTable"] == {"DefaultCluster": {"brokerNames": ["broker-a"]}}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": MASTER, "1": SLAVE}
    assert set(info["brokerLiveTable"]) == {MASTER, SLAVE}
    assert info["brokerLiveTable"][SLAVE]["brokerRole"] == "SLAVE"


def test_cluster_with_no_brokers(ns):
    assert ok(run_ferry("cluster", "-n", ns.remoting_addr)).strip() == "no brokers registered"


def test_kv_put_get_list_delete_round_trip(ns):
    n = ("-n", ns.remoting_addr)
    assert ok(run_ferry("kv", "put", "app", "color", "blue", *n)).strip() == (
        f"{ns.remoting_addr}: put app/color"
    )
    assert json.loads(ok(run_ferry("kv", "put", "app", "size", "XL", *n, "--json"))) == {
        ns.remoting_addr: {"ok": True}
    }
    assert ok(run_ferry("kv", "get", "app", "color", *n)).strip() == "blue"
    assert json.loads(ok(run_ferry("kv", "get", "app", "size", *n, "--json"))) == {"value": "XL"}

    listed = [[c.strip() for c in r] for r in rows(ok(run_ferry("kv", "list", "app", *n)))]
    assert listed == [["KEY", "VALUE"], ["color", "blue"], ["size", "XL"]]
    assert json.loads(ok(run_ferry("kv", "list", "app", *n, "--json"))) == {
        "color": "blue",
        "size": "XL",
    }

    assert json.loads(ok(run_ferry("kv", "delete", "app", "color", *n, "--json"))) == {
        ns.remoting_addr: {"deleted": True}
    }
    again = ok(run_ferry("kv", "delete", "app", "color", *n))
    assert again.strip() == f"{ns.remoting_addr}: did not exist app/color"

    missing = run_ferry("kv", "get", "app", "color", *n)
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr
    # What the CLI wrote is what the server holds.
    table = ns.stub.GetKVListByNamespace(namesrv_pb2.GetKVListByNamespaceRequest(namespace="app"))
    assert dict(table.table) == {"size": "XL"}


def test_no_name_server_listening_exits_3(tmp_path):
    with HeldPort() as held:
        result = run_ferry("cluster", "-n", held.addr, "--timeout", "2")
    assert result.returncode == 3
    assert "no name server answered" in result.stderr
    assert held.addr in result.stderr
    assert result.stdout == ""


def test_bad_namesrv_address_is_a_usage_error():
    result = run_ferry("cluster", "-n", "not-an-address")
    assert result.returncode == 2
    assert "namesrv" in result.stderr


# ---------------------------------------------------------------- two name servers


def test_two_independent_name_servers_and_failover(loop_thread: LoopThread, tmp_path: Path):
    a = start_namesrv(loop_thread, tmp_path / "a", metrics_port=-1)
    b = start_namesrv(loop_thread, tmp_path / "b", metrics_port=-1)
    a_running = True
    try:
        # Brokers register with every name server; each holds the same routes.
        register_group(a)
        register_group(b)
        for topic in ("TopicTest", "Orders"):
            request = namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic)
            assert a.stub.GetRouteInfoByTopic(request) == b.stub.GetRouteInfoByTopic(request)
        info_a = a.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
        info_b = b.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
        assert info_a.broker_addr_table == info_b.broker_addr_table
        assert info_a.cluster_addr_table == info_b.cluster_addr_table

        both = f"{a.remoting_addr};{b.remoting_addr}"
        # Writes go to every name server.
        put = json.loads(ok(run_ferry("kv", "put", "app", "k", "v", "-n", both, "--json")))
        assert put == {a.remoting_addr: {"ok": True}, b.remoting_addr: {"ok": True}}
        for ns in (a, b):
            got = ns.stub.GetKVConfig(namesrv_pb2.GetKVConfigRequest(namespace="app", key="k"))
            assert got.value == "v"

        # They do not share state: a broker registered with b only is unknown to a.
        b.stub.RegisterBroker(
            register_request(broker_name="broker-b", addr="127.0.0.1:10931", topics={"OnlyB": 1})
        )
        assert (
            "OnlyB" not in a.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest()).topic_list
        )

        a.stop()
        a_running = False
        with HeldPort(int(a.remoting_addr.rsplit(":", 1)[1])):
            route = json.loads(ok(run_ferry("route", "TopicTest", "-n", both, "--json")))
            assert route["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER, "1": SLAVE}
            assert "OnlyB" in ok(run_ferry("route", "OnlyB", "-n", both))
            assert ok(run_ferry("kv", "get", "app", "k", "-n", both)).strip() == "v"

            # A write with one name server down reports it and exits 1.
            partial = run_ferry("kv", "put", "app", "k2", "v2", "-n", both)
            assert partial.returncode == 1
            assert f"{a.remoting_addr}: FAILED cannot ask {a.remoting_addr}" in partial.stdout
            assert f"{b.remoting_addr}: put app/k2" in partial.stdout
    finally:
        if a_running:
            a.stop()
        b.stop()
