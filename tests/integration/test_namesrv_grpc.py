"""The name server over real gRPC (in-process server on 127.0.0.1:0): registration,
routes, cluster info, data versions, heartbeats, the unregister cascade, write
permissions, the KV store and its file, and a 100,000-topic registration."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from ferry.runtime.errors import CorruptFileError
from ferry.v1 import common_pb2, namesrv_pb2
from tests.conftest import LoopThread, RunningNamesrv, start_namesrv
from tests.helpers import register_request
from tests.integration.support import has_route

A_MASTER = "127.0.0.1:10911"
A_MASTER_HA = "127.0.0.1:10912"
A_SLAVE = "127.0.0.1:10921"
B_MASTER = "127.0.0.1:10931"


def route(ns: RunningNamesrv, topic: str) -> common_pb2.TopicRouteData:
    return ns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic))


def cluster_info(ns: RunningNamesrv) -> namesrv_pb2.ClusterInfo:
    return ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())


def topic_list(ns: RunningNamesrv) -> list[str]:
    return list(ns.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest()).topic_list)


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


# ---------------------------------------------------------------- registration and routes


def test_master_and_slave_registration_route_and_cluster_info(ns):
    master = ns.stub.RegisterBroker(
        register_request(
            addr=A_MASTER,
            ha_addr=A_MASTER_HA,
            topics={"TopicTest": 4, "Orders": 8},
            broker_role="SYNC_MASTER",
        )
    )
    assert master.master_addr == "" and master.ha_server_addr == ""
    assert master.topic_config_applied

    slave = ns.stub.RegisterBroker(
        register_request(
            broker_id=1,
            addr=A_SLAVE,
            ha_addr="127.0.0.1:10922",
            topics={"TopicTest": 4, "Orders": 8},
            broker_role="SLAVE",
        )
    )
    assert slave.master_addr == A_MASTER
    assert slave.ha_server_addr == A_MASTER_HA
    assert not slave.topic_config_applied  # only a master's topic table is applied

    data = route(ns, "Orders")
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in data.queue_datas
    ] == [("broker-a", 8, 8, 6)]
    assert len(data.broker_datas) == 1
    group = data.broker_datas[0]
    assert (group.cluster, group.broker_name) == ("DefaultCluster", "broker-a")
    assert dict(group.broker_addrs) == {0: A_MASTER, 1: A_SLAVE}

    info = cluster_info(ns)
    assert list(info.cluster_addr_table["DefaultCluster"].broker_names) == ["broker-a"]
    assert dict(info.broker_addr_table["broker-a"].broker_addrs) == {0: A_MASTER, 1: A_SLAVE}
    assert set(info.broker_live_table) == {A_MASTER, A_SLAVE}
    live = info.broker_live_table[A_MASTER]
    assert (live.cluster_name, live.broker_name, live.broker_id) == (
        "DefaultCluster",
        "broker-a",
        0,
    )
    assert live.ha_server_addr == A_MASTER_HA
    assert live.broker_role == "SYNC_MASTER"
    assert live.heartbeat_timeout_ms == 120_000
    assert abs(live.last_update_timestamp - time.time() * 1000) < 60_000
    assert info.broker_live_table[A_SLAVE].broker_id == 1

    assert topic_list(ns) == ["Orders", "TopicTest"]


def test_a_slave_promoted_on_the_same_address_keeps_one_record(ns):
    ns.stub.RegisterBroker(register_request(addr=A_MASTER))
    ns.stub.RegisterBroker(register_request(broker_id=1, addr=A_SLAVE, ha_addr="127.0.0.1:10922"))
    # The slave's host:port comes back as the master (id 0); the old master is replaced.
    promoted = ns.stub.RegisterBroker(
        register_request(addr=A_SLAVE, ha_addr="127.0.0.1:10922", counter=2)
    )
    assert promoted.topic_config_applied
    info = cluster_info(ns)
    assert dict(info.broker_addr_table["broker-a"].broker_addrs) == {0: A_SLAVE}
    assert set(info.broker_live_table) == {A_SLAVE}
    assert info.broker_live_table[A_SLAVE].broker_id == 0
    assert dict(route(ns, "TopicTest").broker_datas[0].broker_addrs) == {0: A_SLAVE}


def test_slave_registered_before_its_master_learns_no_master(ns):
    response = ns.stub.RegisterBroker(register_request(broker_id=1, addr=A_SLAVE))
    assert (response.master_addr, response.ha_server_addr) == ("", "")
    # The group exists but has no queues: no route yet.
    assert not has_route(ns.stub, "TopicTest")


def test_register_response_carries_the_order_topic_kv_namespace(ns):
    ns.stub.PutKVConfig(
        namesrv_pb2.PutKVConfigRequest(
            namespace="ORDER_TOPIC_CONFIG", key="Orders", value="broker-a:4"
        )
    )
    response = ns.stub.RegisterBroker(register_request())
    assert dict(response.kv_table) == {"Orders": "broker-a:4"}


def test_unknown_topic_is_not_found_with_the_rocketmq_message(ns):
    ns.stub.RegisterBroker(register_request())
    error = rpc_error(
        ns.stub.GetRouteInfoByTopic, namesrv_pb2.GetRouteInfoByTopicRequest(topic="NoSuchTopic")
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "No topic route info in name server for the topic: NoSuchTopic"


def test_route_of_a_topic_on_two_groups(ns):
    ns.stub.RegisterBroker(register_request(addr=A_MASTER, topics={"Shared": 4}))
    ns.stub.RegisterBroker(
        register_request(broker_name="broker-b", addr=B_MASTER, topics={"Shared": 2})
    )
    data = route(ns, "Shared")
    assert sorted((q.broker_name, q.read_queue_nums) for q in data.queue_datas) == [
        ("broker-a", 4),
        ("broker-b", 2),
    ]
    assert sorted(b.broker_name for b in data.broker_datas) == ["broker-a", "broker-b"]


def test_a_changed_data_version_replaces_the_masters_topics(ns):
    ns.stub.RegisterBroker(register_request(topics={"Old": 4, "Kept": 4}, counter=1))
    same = ns.stub.RegisterBroker(register_request(topics={"Ignored": 4}, counter=1))
    assert not same.topic_config_applied
    assert topic_list(ns) == ["Kept", "Old"]

    newer = ns.stub.RegisterBroker(register_request(topics={"Kept": 16}, counter=2))
    assert newer.topic_config_applied
    assert topic_list(ns) == ["Kept"]
    assert route(ns, "Kept").queue_datas[0].read_queue_nums == 16


def test_query_data_version_changed_and_unchanged(ns):
    request = register_request(counter=7)
    ns.stub.RegisterBroker(request)
    stored = request.body.topic_config.data_version

    def query(dv: common_pb2.DataVersion, addr: str = A_MASTER):
        return ns.stub.QueryDataVersion(
            namesrv_pb2.QueryDataVersionRequest(
                cluster_name="DefaultCluster",
                broker_addr=addr,
                broker_name="broker-a",
                broker_id=0,
                data_version=dv,
            )
        )

    unchanged = query(stored)
    assert unchanged.changed is False
    assert unchanged.data_version == stored

    changed = query(common_pb2.DataVersion(timestamp=stored.timestamp, counter=8))
    assert changed.changed is True
    assert changed.data_version == stored  # the one stored here, not the one asked about

    # state_version takes part in equality too.
    assert query(
        common_pb2.DataVersion(timestamp=stored.timestamp, counter=7, state_version=1)
    ).changed

    unknown = query(stored, addr="127.0.0.1:1")
    assert unknown.changed is True
    assert not unknown.HasField("data_version")


def test_broker_heartbeat_registered_true_and_false(ns):
    ns.stub.RegisterBroker(register_request())
    known = ns.stub.BrokerHeartbeat(
        namesrv_pb2.BrokerHeartbeatRequest(cluster_name="DefaultCluster", broker_addr=A_MASTER)
    )
    assert known.registered is True
    unknown = ns.stub.BrokerHeartbeat(
        namesrv_pb2.BrokerHeartbeatRequest(cluster_name="DefaultCluster", broker_addr=B_MASTER)
    )
    assert unknown.registered is False
    wrong_cluster = ns.stub.BrokerHeartbeat(
        namesrv_pb2.BrokerHeartbeatRequest(cluster_name="OtherCluster", broker_addr=A_MASTER)
    )
    assert wrong_cluster.registered is False


def test_heartbeat_refreshes_liveness_and_expiry_removes_the_silent(
    loop_thread: LoopThread, tmp_path: Path, fake_clock
):
    ns = start_namesrv(loop_thread, tmp_path / "ns", clock=fake_clock, metrics_port=-1)
    try:
        ns.stub.RegisterBroker(register_request(addr=A_MASTER, topics={"A": 4}))
        ns.stub.RegisterBroker(
            register_request(broker_name="broker-b", addr=B_MASTER, topics={"B": 4})
        )
        first = cluster_info(ns).broker_live_table[A_MASTER].last_update_timestamp

        loop_thread.call(fake_clock.advance, 100.0)
        assert ns.stub.BrokerHeartbeat(
            namesrv_pb2.BrokerHeartbeatRequest(cluster_name="DefaultCluster", broker_addr=A_MASTER)
        ).registered
        assert cluster_info(ns).broker_live_table[A_MASTER].last_update_timestamp == first + 100_000

        loop_thread.call(fake_clock.advance, 10.0)
        ns.stub.QueryDataVersion(
            namesrv_pb2.QueryDataVersionRequest(
                cluster_name="DefaultCluster",
                broker_addr=A_MASTER,
                broker_name="broker-a",
                broker_id=0,
            )
        )  # refreshes liveness too
        assert cluster_info(ns).broker_live_table[A_MASTER].last_update_timestamp == first + 110_000

        loop_thread.call(fake_clock.advance, 20.0)  # B silent for 130 s > 120 s; A for 20 s
        assert loop_thread.call(ns.app.expire_now) == 1
        assert set(cluster_info(ns).broker_live_table) == {A_MASTER}
        assert topic_list(ns) == ["A"]
    finally:
        ns.stop()


# ---------------------------------------------------------------- unregister cascade


def test_unregister_cascade(ns):
    stub = ns.stub
    stub.RegisterBroker(register_request(addr=A_MASTER, topics={"OnlyA": 4, "Shared": 4}))
    stub.RegisterBroker(register_request(broker_id=1, addr=A_SLAVE, topics={}))
    stub.RegisterBroker(
        register_request(
            broker_name="broker-b", addr=B_MASTER, topics={"Shared": 2}, cluster="OtherCluster"
        )
    )

    def unregister(addr, broker_name="broker-a", broker_id=0, cluster="DefaultCluster"):
        return stub.UnregisterBroker(
            namesrv_pb2.UnregisterBrokerRequest(
                cluster_name=cluster,
                broker_addr=addr,
                broker_name=broker_name,
                broker_id=broker_id,
            )
        )

    # The master leaves; its slave keeps the group and the topics routable.
    assert unregister(A_MASTER).removed
    info = cluster_info(ns)
    assert dict(info.broker_addr_table["broker-a"].broker_addrs) == {1: A_SLAVE}
    assert A_MASTER not in info.broker_live_table
    assert dict(route(ns, "OnlyA").broker_datas[0].broker_addrs) == {1: A_SLAVE}

    # Unregistering again is a no-op.
    assert not unregister(A_MASTER).removed

    # The slave leaves: the group, its cluster entry and its queues go.
    assert unregister(A_SLAVE, broker_id=1).removed
    info = cluster_info(ns)
    assert "broker-a" not in info.broker_addr_table
    assert "DefaultCluster" not in info.cluster_addr_table
    assert list(info.cluster_addr_table["OtherCluster"].broker_names) == ["broker-b"]
    assert topic_list(ns) == ["Shared"]
    assert not has_route(stub, "OnlyA")
    assert [q.broker_name for q in route(ns, "Shared").queue_datas] == ["broker-b"]

    # The last broker leaves: nothing is left.
    assert unregister(B_MASTER, broker_name="broker-b", cluster="OtherCluster").removed
    info = cluster_info(ns)
    assert (
        len(info.broker_addr_table),
        len(info.cluster_addr_table),
        len(info.broker_live_table),
    ) == (0, 0, 0)
    assert topic_list(ns) == []


def test_stale_unregister_with_an_old_instance_id_keeps_the_new_registration(ns):
    ns.stub.RegisterBroker(register_request(instance_id="run-1"))
    ns.stub.RegisterBroker(register_request(instance_id="run-2"))
    stale = ns.stub.UnregisterBroker(
        namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="DefaultCluster",
            broker_addr=A_MASTER,
            broker_name="broker-a",
            broker_id=0,
            instance_id="run-1",
        )
    )
    assert stale.removed is False
    assert cluster_info(ns).broker_live_table[A_MASTER].instance_id == "run-2"
    assert has_route(ns.stub, "TopicTest")


# ---------------------------------------------------------------- write permission


def test_wipe_and_add_write_perm_count_topics(ns):
    ns.stub.RegisterBroker(register_request(topics={"T1": 4, "T2": 4, "T3": 4}))
    ns.stub.RegisterBroker(
        register_request(broker_name="broker-b", addr=B_MASTER, topics={"T1": 4})
    )

    def perms(topic: str) -> dict[str, int]:
        return {q.broker_name: q.perm for q in route(ns, topic).queue_datas}

    wiped = ns.stub.WipeWritePermOfBroker(
        namesrv_pb2.WipeWritePermOfBrokerRequest(broker_name="broker-a")
    )
    assert wiped.wipe_topic_count == 3
    assert perms("T1") == {"broker-a": 4, "broker-b": 6}
    assert perms("T3") == {"broker-a": 4}
    again = ns.stub.WipeWritePermOfBroker(
        namesrv_pb2.WipeWritePermOfBrokerRequest(broker_name="broker-a")
    )
    assert again.wipe_topic_count == 0

    added = ns.stub.AddWritePermOfBroker(
        namesrv_pb2.AddWritePermOfBrokerRequest(broker_name="broker-a")
    )
    assert added.add_topic_count == 3
    assert perms("T1") == {"broker-a": 6, "broker-b": 6}
    assert (
        ns.stub.AddWritePermOfBroker(
            namesrv_pb2.AddWritePermOfBrokerRequest(broker_name="broker-a")
        ).add_topic_count
        == 0
    )
    assert (
        ns.stub.WipeWritePermOfBroker(
            namesrv_pb2.WipeWritePermOfBrokerRequest(broker_name="no-such-group")
        ).wipe_topic_count
        == 0
    )


# ---------------------------------------------------------------- KV config


def test_kv_put_get_list_delete(ns):
    stub = ns.stub
    stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns1", key="k1", value="v1"))
    stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns1", key="k2", value="v2"))
    stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns1", key="k1", value="v1b"))

    assert (
        stub.GetKVConfig(namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="k1")).value == "v1b"
    )
    table = stub.GetKVListByNamespace(namesrv_pb2.GetKVListByNamespaceRequest(namespace="ns1"))
    assert dict(table.table) == {"k1": "v1b", "k2": "v2"}

    missing_key = rpc_error(
        stub.GetKVConfig, namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="nope")
    )
    assert missing_key.code() == grpc.StatusCode.NOT_FOUND
    missing_ns = rpc_error(
        stub.GetKVListByNamespace, namesrv_pb2.GetKVListByNamespaceRequest(namespace="nope")
    )
    assert missing_ns.code() == grpc.StatusCode.NOT_FOUND

    assert stub.DeleteKVConfig(namesrv_pb2.DeleteKVConfigRequest(namespace="ns1", key="k1")).deleted
    assert not stub.DeleteKVConfig(
        namesrv_pb2.DeleteKVConfigRequest(namespace="ns1", key="k1")
    ).deleted
    assert (
        rpc_error(
            stub.GetKVConfig, namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="k1")
        ).code()
        == grpc.StatusCode.NOT_FOUND
    )
    stub.DeleteKVConfig(namesrv_pb2.DeleteKVConfigRequest(namespace="ns1", key="k2"))
    # The last key gone takes the namespace with it.
    assert (
        rpc_error(
            stub.GetKVListByNamespace, namesrv_pb2.GetKVListByNamespaceRequest(namespace="ns1")
        ).code()
        == grpc.StatusCode.NOT_FOUND
    )


def test_kv_is_persisted_and_reloaded_after_a_restart(loop_thread: LoopThread, tmp_path: Path):
    home = tmp_path / "ns"
    ns = start_namesrv(loop_thread, home, metrics_port=-1)
    try:
        ns.stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns1", key="k1", value="v1"))
        ns.stub.PutKVConfig(
            namesrv_pb2.PutKVConfigRequest(
                namespace="ORDER_TOPIC_CONFIG", key="Orders", value="a:4"
            )
        )
        ns.stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns1", key="gone", value="x"))
        ns.stub.DeleteKVConfig(namesrv_pb2.DeleteKVConfigRequest(namespace="ns1", key="gone"))
        assert json.loads((home / "kvConfig.json").read_text()) == {
            "configTable": {"ns1": {"k1": "v1"}, "ORDER_TOPIC_CONFIG": {"Orders": "a:4"}}
        }
    finally:
        ns.stop()

    again = start_namesrv(loop_thread, home, metrics_port=-1)
    try:
        assert (
            again.stub.GetKVConfig(namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="k1")).value
            == "v1"
        )
        assert dict(
            again.stub.GetKVListByNamespace(
                namesrv_pb2.GetKVListByNamespaceRequest(namespace="ORDER_TOPIC_CONFIG")
            ).table
        ) == {"Orders": "a:4"}
        assert (
            rpc_error(
                again.stub.GetKVConfig, namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="gone")
            ).code()
            == grpc.StatusCode.NOT_FOUND
        )
    finally:
        again.stop()


def test_corrupt_kv_file_starts_from_its_backup(loop_thread: LoopThread, tmp_path: Path):
    home = tmp_path / "ns"
    home.mkdir()
    (home / "kvConfig.json").write_text('{"configTable": {"ns1": {"k1": "NEW"')  # torn write
    (home / "kvConfig.json.bak").write_text(
        json.dumps({"configTable": {"ns1": {"k1": "from-backup"}}})
    )
    ns = start_namesrv(loop_thread, home, metrics_port=-1)
    try:
        assert (
            ns.stub.GetKVConfig(namesrv_pb2.GetKVConfigRequest(namespace="ns1", key="k1")).value
            == "from-backup"
        )
        # A valid main file is written again, and the corrupt one is kept aside.
        assert json.loads((home / "kvConfig.json").read_text()) == {
            "configTable": {"ns1": {"k1": "from-backup"}}
        }
        aside = list(home.glob("kvConfig.json.corrupt-*"))
        assert len(aside) == 1
        assert aside[0].read_text().startswith('{"configTable": {"ns1": {"k1": "NEW"')
    finally:
        ns.stop()


def test_corrupt_kv_file_without_backup_refuses_to_start(loop_thread: LoopThread, tmp_path: Path):
    home = tmp_path / "ns"
    home.mkdir()
    (home / "kvConfig.json").write_text("not json at all")
    with pytest.raises(CorruptFileError) as info:
        start_namesrv(loop_thread, home, metrics_port=-1)
    assert str(home / "kvConfig.json") in str(info.value)
    assert (home / "kvConfig.json").read_text() == "not json at all"  # left for the operator


# ---------------------------------------------------------------- big registrations


def test_a_registration_with_100000_topics(ns):
    topics = {f"Topic{i:06d}": 4 for i in range(100_000)}
    request = register_request(topics=topics)
    assert request.body_crc32 != 0  # checked over the whole 3.6 MB body
    response = ns.stub.RegisterBroker(request, timeout=60)
    assert response.topic_config_applied

    listed = ns.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest(), timeout=60)
    assert len(listed.topic_list) == 100_000
    assert set(listed.topic_list) == set(topics)
    assert route(ns, "Topic099999").queue_datas[0].broker_name == "broker-a"
    assert cluster_info(ns).broker_live_table["127.0.0.1:10911"].broker_name == "broker-a"
