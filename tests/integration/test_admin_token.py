"""The admin token: with one configured, every state-changing RPC of the name
server and the broker answers UNAUTHENTICATED to a missing or wrong token and
changes nothing; the right token works; reads stay open; brokers register with
it; the `ferry` commands send it from --admin-token or $FERRY_ADMIN_TOKEN."""

from __future__ import annotations

import grpc
import pytest

from ferry.runtime import auth
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    common_pb2,
    namesrv_pb2,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from tests.conftest import start_broker, start_namesrv
from tests.helpers import register_request
from tests.integration.support import run_ferry
from tests.waiting import wait_for

TOKEN = "s3cret-admin-token"
GOOD = auth.bearer(TOKEN)
WRONG = auth.bearer("not-" + TOKEN)


@pytest.fixture
def ns(loop_thread, tmp_path):
    server = start_namesrv(loop_thread, tmp_path / "ns", metrics_port=-1, admin_token=TOKEN)
    yield server
    server.stop()


def namesrv_writes():
    """(method, request) for every state-changing name server RPC."""
    return [
        ("RegisterBroker", register_request(addr="127.0.0.1:10911")),
        ("UnregisterBroker", namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="DefaultCluster", broker_addr="127.0.0.1:10911",
            broker_name="broker-a", broker_id=0)),
        ("BrokerHeartbeat", namesrv_pb2.BrokerHeartbeatRequest(
            cluster_name="DefaultCluster", broker_addr="127.0.0.1:10911")),
        ("PutKVConfig", namesrv_pb2.PutKVConfigRequest(namespace="ns", key="k", value="v")),
        ("DeleteKVConfig", namesrv_pb2.DeleteKVConfigRequest(namespace="ns", key="k")),
        ("WipeWritePermOfBroker", namesrv_pb2.WipeWritePermOfBrokerRequest(broker_name="broker-a")),
        ("AddWritePermOfBroker", namesrv_pb2.AddWritePermOfBrokerRequest(broker_name="broker-a")),
    ]  # fmt: skip


def state(ns) -> tuple:
    info = ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    try:
        kv = ns.stub.GetKVConfig(namesrv_pb2.GetKVConfigRequest(namespace="ns", key="k")).value
    except grpc.RpcError:
        kv = None
    return info.SerializeToString(deterministic=True), kv


def test_every_name_server_write_needs_the_token(ns):
    assert {m for m, _ in namesrv_writes()} | {"KeepAlive"} == {
        p.rsplit("/", 1)[1] for p in auth.NAMESRV_ADMIN_METHODS
    }
    # Something to unregister, wipe and delete, put with the token.
    ns.stub.RegisterBroker(register_request(addr="127.0.0.1:10911"), metadata=GOOD)
    ns.stub.PutKVConfig(namesrv_pb2.PutKVConfigRequest(namespace="ns", key="k", value="v0"),
                        metadata=GOOD)  # fmt: skip
    for method, request in namesrv_writes():
        before = state(ns)
        for metadata in ((), WRONG, [("authorization", TOKEN)], [("authorization", "Basic x")]):
            with pytest.raises(grpc.RpcError) as err:
                getattr(ns.stub, method)(request, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
            assert "admin token" in err.value.details()
            assert state(ns) == before, f"{method} changed state without the token"
    # KeepAlive, a stream, too.
    with pytest.raises(grpc.RpcError) as err:
        list(ns.stub.KeepAlive(iter([namesrv_pb2.KeepAliveRequest()]), timeout=5))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # The token opens them; reads never needed it.
    for method, request in namesrv_writes():
        getattr(ns.stub, method)(request, metadata=GOOD)
    ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    ns.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest())
    ns.stub.QueryDataVersion(
        namesrv_pb2.QueryDataVersionRequest(
            cluster_name="DefaultCluster", broker_addr="127.0.0.1:10911", broker_name="broker-a"
        )
    )


def test_a_broker_registers_with_the_token_and_guards_its_admin_rpcs(loop_thread, tmp_path, ns):
    broker = start_broker(loop_thread, tmp_path / "b", ns.remoting_addr, adminToken=TOKEN)
    stranger = start_broker(
        loop_thread, tmp_path / "x", ns.remoting_addr, brokerName="broker-x", adminToken="wrong"
    )
    try:
        names = lambda: set(  # noqa: E731
            ns.stub.GetBrokerClusterInfo(
                namesrv_pb2.GetBrokerClusterInfoRequest()
            ).broker_addr_table
        )
        wait_for(lambda: "broker-a" in names(), 10, "the broker with the token to register")
        assert "broker-x" not in names()  # a wrong token registers nothing
        admin = broker_admin_pb2_grpc.BrokerAdminStub(broker.channel)
        sync = slave_sync_pb2_grpc.SlaveSyncStub(broker.channel)
        topics = lambda: sync.GetAllTopicConfig(  # noqa: E731
            slave_sync_pb2.GetAllTopicConfigRequest()
        ).SerializeToString(deterministic=True)
        before = topics()
        create = broker_admin_pb2.UpdateAndCreateTopicRequest(
            topic_config=common_pb2.TopicConfig(
                topic_name="Guarded", read_queue_nums=1, write_queue_nums=1, perm=6
            )
        )
        writes = [
            ("UpdateAndCreateTopic", create),
            ("DeleteTopic", broker_admin_pb2.DeleteTopicRequest(topic="TBW102")),
            ("UpdateAndCreateSubscriptionGroup", broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
                config=common_pb2.SubscriptionGroupConfig(group_name="g"))),
            ("DeleteSubscriptionGroup", broker_admin_pb2.DeleteSubscriptionGroupRequest(group_name="g")),
            ("UpdateBrokerPermission", broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=4)),
            ("DeleteExpiredCommitLog", broker_admin_pb2.DeleteExpiredCommitLogRequest()),
        ]  # fmt: skip
        assert {m for m, _ in writes} == {p.rsplit("/", 1)[1] for p in auth.BROKER_ADMIN_METHODS}
        for method, request in writes:
            for metadata in ((), WRONG):
                with pytest.raises(grpc.RpcError) as err:
                    getattr(admin, method)(request, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
        assert topics() == before
        assert broker.app.permission.get() == 6
        admin.UpdateAndCreateTopic(create, metadata=GOOD)
        assert b"Guarded" in topics()
        # Producers, consumers and reads need no token.
        sent = broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Guarded", body=b"x"))
        assert sent.status == broker_pb2.SEND_OK
        admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest())
    finally:
        stranger.stop()
        broker.stop()


def test_ferry_commands_send_the_token(loop_thread, tmp_path, ns):
    broker = start_broker(loop_thread, tmp_path / "b", ns.remoting_addr, adminToken=TOKEN)
    try:
        refused = run_ferry("topic", "create", "Cli", "-b", broker.addr)
        assert refused.returncode != 0
        assert "admin token" in refused.stderr + refused.stdout
        ok = run_ferry("topic", "create", "Cli", "-b", broker.addr, "--admin-token", TOKEN)
        assert ok.returncode == 0, ok.stderr
        refused = run_ferry("kv", "put", "ns", "k", "v", "-n", ns.remoting_addr)
        assert refused.returncode != 0 and "admin token" in refused.stderr + refused.stdout
        ok = run_ferry(
            "kv", "put", "ns", "k", "v", "-n", ns.remoting_addr, env={"FERRY_ADMIN_TOKEN": TOKEN}
        )
        assert ok.returncode == 0, ok.stderr
        assert run_ferry("kv", "get", "ns", "k", "-n", ns.remoting_addr).stdout.strip() == "v"
    finally:
        broker.stop()


@pytest.mark.parametrize(
    "header,ok",
    [
        (f"Bearer {TOKEN}", True),
        (None, False),
        ("", False),
        (TOKEN, False),
        (f"bearer {TOKEN}", False),
        (f"Bearer {TOKEN}x", False),
        (f"Bearer {TOKEN[:-1]}", False),
        (f"Bearer  {TOKEN}", False),
    ],  # fmt: skip
)
def test_token_matching(header, ok):
    assert auth.token_matches(TOKEN, header) is ok
