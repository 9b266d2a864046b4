"""Failover epochs at the name server over real gRPC (RocketMQ's stateVersion
fencing): a deposed master is refused and changes nothing, a new master takes
id 0 at once, an old master rejoins as a slave, slaves are told only of the
current master, epoch 0 behaves as before; and the broker's Registrar sends its
epoch and reports a refusal through `on_fenced`."""

from __future__ import annotations

import dataclasses
import logging

import grpc
import pytest

from ferry.model import DataVersion, TopicConfig
from ferry.runtime.clock import SystemClock
from ferry.v1 import namesrv_pb2
from services.broker.cluster.registration import BrokerIdentity, Registrar
from services.broker.messaging.access import BrokerPermission
from tests.conftest import LoopThread, RunningNamesrv
from tests.helpers import register_request
from tests.waiting import wait_for

A = "127.0.0.1:10911"  # the first master
A_HA = "127.0.0.1:10912"
B = "127.0.0.1:10921"  # its follower, later the new master
B_HA = "127.0.0.1:10922"
C = "127.0.0.1:10931"  # another follower
C_HA = "127.0.0.1:10932"
HA = {A: A_HA, B: B_HA, C: C_HA}


def register(ns: RunningNamesrv, addr: str, broker_id: int, epoch: int, **fields):
    return ns.stub.RegisterBroker(
        register_request(addr=addr, ha_addr=HA[addr], broker_id=broker_id, epoch=epoch, **fields)
    )


def refused(ns: RunningNamesrv, request: namesrv_pb2.RegisterBrokerRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        ns.stub.RegisterBroker(request)
    return info.value


def cluster_info(ns: RunningNamesrv) -> namesrv_pb2.ClusterInfo:
    return ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())


def group_addrs(ns: RunningNamesrv, group: str = "broker-a") -> dict[int, str]:
    route = ns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="TopicTest"))
    return {
        i: a
        for g in route.broker_datas
        if g.broker_name == group
        for i, a in g.broker_addrs.items()
    }


def tables(ns: RunningNamesrv) -> tuple:
    """What a route or cluster answer shows, without heartbeat times (they move)."""
    info = cluster_info(ns)
    for live in info.broker_live_table.values():
        live.ClearField("last_update_timestamp")
    route = ns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="TopicTest"))
    topics = ns.stub.GetAllTopicList(namesrv_pb2.GetAllTopicListRequest()).topic_list
    return (
        info.SerializeToString(deterministic=True),
        route.SerializeToString(deterministic=True),
        sorted(topics),
    )


def messages(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "services.namesrv.servicer" and r.levelno == level and text in r.getMessage()
    ]


# ---------------------------------------------------------------- the name server


def test_a_stale_master_is_refused_and_changes_nothing(ns, caplog):
    caplog.set_level(logging.INFO)
    register(ns, A, 0, 4)
    register(ns, B, 1, 4)
    register(ns, B, 0, 5)  # B won election 5
    before = tables(ns)

    # A has not noticed: it registers as master of epoch 4, with another topic table.
    error = refused(
        ns,
        register_request(
            addr=A, ha_addr=A_HA, epoch=4, counter=9, topics={"TopicTest": 8, "Gone": 1}
        ),
    )

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == (
        f"stale master: broker-a ({A}) epoch 4 is older than epoch 5 already registered by {B}; "
        "this broker lost leadership and must follow the new master"
    )
    assert tables(ns) == before
    assert group_addrs(ns) == {0: B}
    assert A not in cluster_info(ns).broker_live_table
    [warning] = messages(caplog, logging.WARNING, "refused stale master")
    assert f"addr={A}" in warning and "epoch=4 group_epoch=5" in warning


def test_a_follower_ahead_of_its_master_fences_that_master(ns):
    """The group's epoch is the highest any member registered with: a follower of
    election 5 fences the master of election 4 before the new master registers."""
    register(ns, A, 0, 4)
    register(ns, C, 2, 5)
    before = tables(ns)

    full = refused(ns, register_request(addr=A, ha_addr=A_HA, epoch=4, counter=2))
    incremental = refused(
        ns, register_request(addr=A, ha_addr=A_HA, epoch=4, incremental=True, topics={"New": 2})
    )

    for error in (full, incremental):
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"epoch 4 is older than epoch 5 already registered by {C}" in error.details()
    assert tables(ns) == before
    assert cluster_info(ns).group_epoch_table["broker-a"] == 5


def test_a_promoted_slave_replaces_the_old_master_at_once(ns, caplog):
    caplog.set_level(logging.INFO)
    register(ns, A, 0, 4)
    register(ns, B, 2, 4)
    assert group_addrs(ns) == {0: A, 2: B}

    register(ns, B, 0, 5, counter=2)

    # No waiting for A to time out; B keeps one id.
    assert group_addrs(ns) == {0: B}
    info = cluster_info(ns)
    assert dict(info.broker_addr_table["broker-a"].broker_addrs) == {0: B}
    assert set(info.broker_live_table) == {B}
    assert (info.broker_live_table[B].broker_id, info.broker_live_table[B].epoch) == (0, 5)
    assert dict(info.group_epoch_table) == {"broker-a": 5}
    [line] = messages(caplog, logging.INFO, "new master")
    assert f"addr={B}" in line and "epoch=5" in line and f"replaces addr={A}" in line


def test_a_master_of_the_same_epoch_may_register_again(ns):
    register(ns, A, 0, 4)
    again = register(ns, A, 0, 4, counter=2, topics={"TopicTest": 8})
    assert again.topic_config_applied
    assert group_addrs(ns) == {0: A}


def test_the_old_master_rejoins_as_a_slave(ns):
    register(ns, A, 0, 4)
    register(ns, B, 2, 4)
    register(ns, B, 0, 5)

    answer = register(ns, A, 1, 5)

    assert group_addrs(ns) == {0: B, 1: A}
    assert (answer.master_addr, answer.ha_server_addr) == (B, B_HA)
    assert cluster_info(ns).broker_live_table[A].broker_id == 1


def test_the_old_master_rejoining_first_leaves_id_0(ns):
    """A learns of election 5 before B registers as its master: A leaves id 0
    (the group has no master until B comes) rather than holding two ids."""
    register(ns, A, 0, 4)
    register(ns, B, 2, 4)

    answer = register(ns, A, 1, 5)

    assert group_addrs(ns) == {1: A, 2: B}
    assert (answer.master_addr, answer.ha_server_addr) == ("", "")
    register(ns, B, 0, 5)
    assert group_addrs(ns) == {0: B, 1: A}


def test_a_slave_is_told_only_of_the_highest_epoch_master(ns):
    register(ns, A, 0, 4)
    first = register(ns, C, 2, 4)
    assert (first.master_addr, first.ha_server_addr) == (A, A_HA)

    # C follows election 5; A (epoch 4) still holds id 0 until B registers.
    waiting = register(ns, C, 2, 5)
    assert (waiting.master_addr, waiting.ha_server_addr) == ("", "")

    register(ns, B, 0, 5)
    following = register(ns, C, 2, 5)
    assert (following.master_addr, following.ha_server_addr) == (B, B_HA)


def test_a_lagging_follower_is_accepted(ns, caplog):
    caplog.set_level(logging.INFO)
    register(ns, B, 0, 5)

    answer = register(ns, C, 2, 3)

    assert (answer.master_addr, answer.ha_server_addr) == (B, B_HA)
    assert group_addrs(ns) == {0: B, 2: C}
    assert cluster_info(ns).broker_live_table[C].epoch == 3
    assert cluster_info(ns).group_epoch_table["broker-a"] == 5
    [line] = messages(caplog, logging.INFO, "follower behind")
    assert f"addr={C}" in line and "epoch=3 group_epoch=5" in line
    assert not messages(caplog, logging.WARNING, "")


def test_epoch_0_is_never_fenced_nor_remembered(ns):
    register(ns, A, 0, 0)
    register(ns, B, 1, 0)
    info = cluster_info(ns)
    assert not info.group_epoch_table
    assert {a: live.epoch for a, live in info.broker_live_table.items()} == {A: 0, B: 0}

    # A failover master of epoch 5, then a broker without failover claiming id 0:
    # as before epochs existed, the latest master registration holds id 0.
    register(ns, B, 0, 5)
    answer = register(ns, A, 0, 0, counter=2)
    assert answer.topic_config_applied
    assert group_addrs(ns) == {0: A}
    assert cluster_info(ns).group_epoch_table["broker-a"] == 5
    # A slave is told of a master without failover even in a group with an epoch.
    slave = register(ns, C, 1, 5)
    assert (slave.master_addr, slave.ha_server_addr) == (A, A_HA)


def test_a_negative_epoch_is_invalid(ns):
    error = refused(ns, register_request(addr=A, ha_addr=A_HA, epoch=-1))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("epoch: -1 is negative")
    assert not cluster_info(ns).broker_live_table


def test_a_groups_epoch_is_forgotten_with_its_last_broker(ns):
    register(ns, A, 0, 5)
    ns.stub.UnregisterBroker(
        namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="DefaultCluster", broker_addr=A, broker_name="broker-a", broker_id=0
        )
    )
    assert not cluster_info(ns).group_epoch_table

    register(ns, B, 0, 1)  # an election state that was reset starts over
    assert group_addrs(ns) == {0: B}
    assert dict(cluster_info(ns).group_epoch_table) == {"broker-a": 1}


# ---------------------------------------------------------------- the broker's Registrar


class _Topics:
    def snapshot(self) -> tuple[dict[str, TopicConfig], DataVersion]:
        return {"TopicTest": TopicConfig("TopicTest", 4, 4, 6)}, DataVersion(1, 1)


class _Fenced:
    """The registrar's FenceListener: each refusal's message, in `messages`."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = messages

    def on_fenced(self, message: str) -> None:
        self.messages.append(message)


def registrar(ns: RunningNamesrv, identity: BrokerIdentity, fenced: list[str]) -> Registrar:
    return Registrar(
        [ns.remoting_addr],
        identity,
        topics=_Topics(),
        permission=BrokerPermission(6),
        clock=SystemClock(),
        period_s=30.0,
        timeout_s=5.0,
        fence_listener=_Fenced(fenced),
    )


def master_identity(addr: str, ha_addr: str, epoch: int) -> BrokerIdentity:
    return BrokerIdentity(
        cluster_name="DefaultCluster",
        broker_name="broker-a",
        broker_id=0,
        broker_addr=addr,
        ha_server_addr=ha_addr,
        broker_role="SYNC_MASTER",
        epoch=epoch,
    )


def test_the_registrar_sends_its_epoch_in_full_and_incremental_registrations(
    loop_thread: LoopThread, ns
):
    fenced: list[str] = []

    async def start() -> Registrar:
        r = registrar(ns, master_identity(A, A_HA, 7), fenced)
        await r.start()
        return r

    r = loop_thread.run(start())
    try:
        assert cluster_info(ns).broker_live_table[A].epoch == 7
        r.identity = dataclasses.replace(r.identity, epoch=8)
        loop_thread.run(r.register_topics([TopicConfig("Another", 2, 2, 6)]))
        info = cluster_info(ns)
        assert info.broker_live_table[A].epoch == 8
        assert info.group_epoch_table["broker-a"] == 8
        assert fenced == []
    finally:
        loop_thread.run(r.stop())


def test_a_fenced_registrar_calls_on_fenced_and_can_rejoin_as_a_slave(
    loop_thread: LoopThread, ns, caplog
):
    caplog.set_level(logging.WARNING)
    register(ns, B, 0, 5)  # B won election 5; A still believes it leads epoch 4
    fenced: list[str] = []

    async def start() -> Registrar:
        r = registrar(ns, master_identity(A, A_HA, 4), fenced)
        await r.start()  # a refusal is reported, not raised
        return r

    r = loop_thread.run(start())
    try:
        assert fenced[0].startswith(f"stale master: broker-a ({A}) epoch 4 is older than epoch 5")
        assert group_addrs(ns) == {0: B}
        assert A not in cluster_info(ns).broker_live_table
        assert any(
            rec.name == "services.broker.cluster.registration"
            and "stale master" in rec.getMessage()
            for rec in caplog.records
        )
        # Its KeepAlive task does not ask again before the period (30 s) is up.
        assert (len(fenced), r.registrations) == (1, 0)

        # What the failover controller does on the callback: follow the new master.
        r.identity = dataclasses.replace(r.identity, broker_id=1, broker_role="SLAVE", epoch=5)
        assert loop_thread.run(r.register_all()) == {ns.remoting_addr: True}
        assert group_addrs(ns) == {0: B, 1: A}
        # The KeepAlive task, idle while fenced, opens its stream once registered.
        wait_for(
            lambda: cluster_info(ns).broker_live_table[A].keep_alive,
            10,
            "the rejoined broker's KeepAlive stream",
        )
        assert len(fenced) == 1
    finally:
        loop_thread.run(r.stop())
