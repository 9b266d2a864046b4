"""The name server's route tables, driven by a fake clock (no sockets, no sleeps)."""

from __future__ import annotations

import copy

import pytest

from ferry.model import DataVersion
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import FailedPrecondition, InvalidArgument, NotFound
from services.namesrv.routes import (
    CONNECTION_LOST,
    EXPIRED,
    Registration,
    RouteTable,
    TopicQueues,
)

A_MASTER = "10.0.0.1:10911"
A_SLAVE = "10.0.0.2:10911"
B_MASTER = "10.0.0.3:10911"


def reg(
    addr: str = A_MASTER,
    broker_id: int = 0,
    broker_name: str = "broker-a",
    topics: dict[str, int] | None = None,
    counter: int = 1,
    cluster: str = "DefaultCluster",
    **kw,
) -> Registration:
    topic_map = None if topics is None else {t: TopicQueues(n, n, 6) for t, n in topics.items()}
    return Registration(
        cluster_name=cluster,
        broker_addr=addr,
        broker_name=broker_name,
        broker_id=broker_id,
        ha_server_addr=addr.replace("10911", "10912"),
        data_version=DataVersion(1000 + counter, counter),
        topics=topic_map,
        **kw,
    )


@pytest.fixture
def table(fake_clock: FakeClock) -> RouteTable:
    return RouteTable(fake_clock, default_heartbeat_timeout_s=120)


def snapshot(t: RouteTable):
    return copy.deepcopy(
        (t.topic_queue_table, t.broker_addr_table, t.cluster_addr_table, t.live, t.filter_servers)
    )


def queue_nums(t: RouteTable, topic: str, group: str = "broker-a") -> int:
    return t.topic_queue_table[topic][group].read_queue_nums


# ---------------------------------------------------------------- registration


def test_master_registration_creates_route(table):
    result = table.register(reg(topics={"T1": 4, "T2": 8}))
    assert result.topic_config_applied
    assert (result.master_addr, result.ha_server_addr) == ("", "")
    route = table.route("T2")
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas
    ] == [("broker-a", 8, 8, 6)]
    assert [(g.cluster, g.broker_name, g.broker_addrs) for g in route.broker_datas] == [
        ("DefaultCluster", "broker-a", {0: A_MASTER})
    ]
    assert table.cluster_addr_table == {"DefaultCluster": {"broker-a"}}
    assert table.topics() == ["T1", "T2"]


def test_slave_learns_master_and_ha_address(table):
    table.register(reg(topics={"T1": 4}))
    result = table.register(reg(A_SLAVE, broker_id=1, topics={"T1": 4}))
    assert result.master_addr == A_MASTER
    assert result.ha_server_addr == "10.0.0.1:10912"
    assert table.broker_addr_table["broker-a"].broker_addrs == {0: A_MASTER, 1: A_SLAVE}


def test_slave_whose_master_is_not_registered_learns_nothing(table):
    result = table.register(reg(A_SLAVE, broker_id=1, topics={"T1": 4}))
    assert (result.master_addr, result.ha_server_addr) == ("", "")


def test_slave_whose_master_timed_out_learns_nothing(table, fake_clock):
    table.register(reg(topics={"T1": 4}, heartbeat_timeout_s=10))
    fake_clock.advance(11)  # past the master's timeout, before housekeeping ran
    result = table.register(reg(A_SLAVE, broker_id=1))
    assert (result.master_addr, result.ha_server_addr) == ("", "")


def test_topic_config_only_from_master(table):
    table.register(reg(topics={"T1": 4}))
    result = table.register(reg(A_SLAVE, broker_id=1, topics={"T1": 16, "SlaveOnly": 4}, counter=9))
    assert not result.topic_config_applied
    assert queue_nums(table, "T1") == 4
    assert "SlaveOnly" not in table.topic_queue_table


def test_topic_config_applied_on_first_registration_and_changed_version_only(table):
    assert table.register(reg(topics={"T1": 4}, counter=1)).topic_config_applied
    # Same DataVersion: the body is not applied even though it differs.
    assert not table.register(reg(topics={"T1": 8}, counter=1)).topic_config_applied
    assert queue_nums(table, "T1") == 4
    # Changed DataVersion: applied.
    assert table.register(reg(topics={"T1": 8}, counter=2)).topic_config_applied
    assert queue_nums(table, "T1") == 8


def test_data_version_compares_state_version_too(table):
    table.register(reg(topics={"T1": 4}))
    fenced = Registration(
        cluster_name="DefaultCluster",
        broker_addr=A_MASTER,
        broker_name="broker-a",
        broker_id=0,
        data_version=DataVersion(1001, 1, state_version=7),
        topics={"T1": TopicQueues(2, 2, 6)},
    )
    assert table.register(fenced).topic_config_applied
    assert queue_nums(table, "T1") == 2


def test_full_registration_replaces_the_groups_topic_set(table):
    table.register(reg(topics={"T1": 4, "Gone": 4}, counter=1))
    table.register(reg(B_MASTER, broker_name="broker-b", topics={"Gone": 4}))
    table.register(reg(topics={"T1": 4}, counter=2))
    assert set(table.topic_queue_table["Gone"]) == {"broker-b"}


def test_registration_without_body_keeps_topics(table):
    table.register(reg(topics={"T1": 4}, counter=1))
    result = table.register(reg(topics=None, counter=2))
    assert not result.topic_config_applied
    assert queue_nums(table, "T1") == 4


def test_master_reregistering_after_expiry_counts_as_first(table, fake_clock):
    table.register(reg(topics={"T1": 4}, heartbeat_timeout_s=10))
    table.register(reg(A_SLAVE, broker_id=1, heartbeat_timeout_s=300))
    fake_clock.advance(11)
    assert [r.broker_addr for r in table.expire(fake_clock.monotonic())] == [A_MASTER]
    # Same DataVersion, but the master's id was gone: its topics apply again.
    assert table.register(reg(topics={"T1": 6})).topic_config_applied
    assert queue_nums(table, "T1") == 6


def test_role_switch_removes_old_id(table):
    table.register(reg(topics={"T1": 4}))
    table.register(reg(A_SLAVE, broker_id=1))
    # The slave's address comes back as the master (id 0), after the old master left.
    table.unregister("DefaultCluster", A_MASTER, "broker-a", 0)
    table.register(reg(A_SLAVE, broker_id=0, topics={"T1": 4}, counter=5))
    assert table.broker_addr_table["broker-a"].broker_addrs == {0: A_SLAVE}
    assert table.live[A_SLAVE].broker_id == 0


def test_new_master_address_replaces_old_one(table):
    table.register(reg(topics={"T1": 4}))
    table.register(reg("10.0.0.9:10911", broker_id=0, topics={"T1": 4}))
    assert table.broker_addr_table["broker-a"].broker_addrs == {0: "10.0.0.9:10911"}
    assert A_MASTER not in table.live


def test_address_moving_to_another_group_leaves_the_old_one(table):
    table.register(reg(topics={"T1": 4}))
    table.register(reg(A_MASTER, broker_name="broker-z", topics={"T9": 4}))
    assert "broker-a" not in table.broker_addr_table
    assert "T1" not in table.topic_queue_table
    assert table.cluster_addr_table == {"DefaultCluster": {"broker-z"}}


def test_filter_servers_stored_and_cleared(table):
    table.register(reg(topics={"T1": 4}, filter_servers=("10.0.0.1:40000",)))
    assert table.route("T1").filter_servers == {A_MASTER: ["10.0.0.1:40000"]}
    table.register(reg(topics={"T1": 4}))
    assert table.route("T1").filter_servers == {}


def test_incremental_registration_needs_a_full_one_first(table):
    with pytest.raises(FailedPrecondition, match="needs a full one first"):
        table.register(reg(topics={"New": 4}, incremental=True))
    assert table.topic_queue_table == {}
    table.register(reg(topics={"T1": 4}, counter=3))
    assert table.register(reg(topics={"New": 2}, counter=4, incremental=True)).topic_config_applied
    assert set(table.topic_queue_table) == {"T1", "New"}  # incremental adds, does not replace
    # The stored version stays the full registration's: the next full one with counter 4 applies.
    assert table.live[A_MASTER].data_version == DataVersion(1003, 3)
    assert table.register(reg(topics={"T1": 4, "New": 2}, counter=4)).topic_config_applied


# ---------------------------------------------------------------- bad input changes nothing


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cluster_name": ""}, "cluster_name"),
        ({"broker_name": "bad name"}, "broker_name"),
        ({"broker_addr": "nohostport"}, "broker_addr"),
        ({"broker_addr": "host:99999"}, "broker_addr"),
        ({"broker_id": -1}, "broker_id"),
        ({"broker_role": "SYNC_MASTER", "broker_id": 1}, "broker_id"),
        ({"broker_role": "SLAVE", "broker_id": 0}, "broker_id"),
        ({"broker_role": "LEADER"}, "broker_role"),
        ({"ha_server_addr": "nope"}, "ha_server_addr"),
        ({"topics": {"T1": TopicQueues(-1, 4, 6)}}, "read_queue_nums"),
        ({"topics": {"T1": TopicQueues(4, 70000, 6)}}, "write_queue_nums"),
        ({"topics": {"T1": TopicQueues(4, 4, 99)}}, "perm"),
        ({"topics": {"bad topic!": TopicQueues(4, 4, 6)}}, "topic_config_table"),
        ({"topics": {"x" * 128: TopicQueues(4, 4, 6)}}, "topic_config_table"),
        (
            {"topics": {"T1": TopicQueues(4, 4, 6), "a\nb": TopicQueues(4, 4, 6)}},
            "topic_config_table",
        ),
        ({"topics": {"": TopicQueues(4, 4, 6)}}, "topic_config_table"),
        ({"heartbeat_timeout_s": -1.0}, "heartbeat_timeout_ms"),
    ],
)
def test_bad_registration_is_rejected_and_changes_nothing(table, changes, field):
    table.register(reg(topics={"T1": 4}))
    before = snapshot(table)
    good = reg(topics={"T1": 8}, counter=2)
    bad = Registration(**{**{f: getattr(good, f) for f in good.__dataclass_fields__}, **changes})
    with pytest.raises(InvalidArgument) as err:
        table.register(bad)
    assert field in str(err.value)
    assert snapshot(table) == before


def test_route_of_bad_or_unknown_topic(table):
    with pytest.raises(InvalidArgument, match="topic"):
        table.route("no spaces allowed")
    with pytest.raises(NotFound, match="No topic route info in name server for the topic: Missing"):
        table.route("Missing")


# ---------------------------------------------------------------- unregister cascade


def test_unregister_master_keeps_topic_with_slave_listed(table):
    table.register(reg(topics={"T1": 4}))
    table.register(reg(A_SLAVE, broker_id=1))
    removal = table.unregister("DefaultCluster", A_MASTER, "broker-a", 0)
    assert removal is not None and removal.broker_id == 0
    route = table.route("T1")
    assert [g.broker_addrs for g in route.broker_datas] == [{1: A_SLAVE}]
    assert A_MASTER not in table.live


def test_unregister_slave_does_not_touch_topics(table):
    table.register(reg(topics={"T1": 4}))
    table.register(reg(A_SLAVE, broker_id=1))
    table.unregister("DefaultCluster", A_SLAVE, "broker-a", 1)
    assert table.broker_addr_table["broker-a"].broker_addrs == {0: A_MASTER}
    assert queue_nums(table, "T1") == 4


def test_unregister_last_broker_removes_group_cluster_queues_and_empty_topics(table):
    table.register(reg(topics={"Shared": 4, "OnlyA": 4}))
    table.register(
        reg(B_MASTER, broker_name="broker-b", topics={"Shared": 4}, cluster="OtherCluster")
    )
    table.register(reg(A_SLAVE, broker_id=1))
    table.unregister("DefaultCluster", A_MASTER, "broker-a", 0)
    table.unregister("DefaultCluster", A_SLAVE, "broker-a", 1)
    assert "broker-a" not in table.broker_addr_table
    assert table.cluster_addr_table == {"OtherCluster": {"broker-b"}}
    assert "OnlyA" not in table.topic_queue_table
    assert set(table.topic_queue_table["Shared"]) == {"broker-b"}
    with pytest.raises(NotFound):
        table.route("OnlyA")


def test_unregister_unknown_broker_is_a_no_op(table):
    table.register(reg(topics={"T1": 4}))
    before = snapshot(table)
    assert table.unregister("DefaultCluster", "10.9.9.9:10911", "broker-a", 3) is None
    assert snapshot(table) == before


def test_stale_unregister_after_reregistration_changes_nothing(table):
    table.register(reg(topics={"T1": 4}, instance_id="run-1"))
    # The broker restarts as a new instance before the old instance's unregister arrives.
    table.register(reg(topics={"T1": 4}, instance_id="run-2", counter=2))
    before = snapshot(table)
    assert table.unregister("DefaultCluster", A_MASTER, "broker-a", 0, instance_id="run-1") is None
    assert snapshot(table) == before
    assert (
        table.unregister("DefaultCluster", A_MASTER, "broker-a", 0, instance_id="run-2") is not None
    )


def test_stale_stream_end_after_reregistration_changes_nothing(table):
    table.register(reg(topics={"T1": 4}, instance_id="run-1"))
    old_generation = table.bind_keep_alive("DefaultCluster", A_MASTER, "run-1")
    table.register(reg(topics={"T1": 4}, instance_id="run-2", counter=2))
    assert table.remove_if_current(A_MASTER, old_generation, CONNECTION_LOST) is None
    assert A_MASTER in table.live and queue_nums(table, "T1") == 4


def test_same_instance_reregistering_keeps_its_stream(table):
    table.register(reg(topics={"T1": 4}, instance_id="run-1"))
    generation = table.bind_keep_alive("DefaultCluster", A_MASTER, "run-1")
    table.register(
        reg(topics={"T1": 4}, instance_id="run-1", counter=2)
    )  # periodic re-registration
    assert table.live[A_MASTER].keep_alive
    removal = table.remove_if_current(A_MASTER, generation, CONNECTION_LOST)
    assert removal is not None and removal.reason == CONNECTION_LOST
    with pytest.raises(NotFound):
        table.route("T1")


def test_keep_alive_requires_registration(table):
    with pytest.raises(FailedPrecondition, match="register first"):
        table.bind_keep_alive("DefaultCluster", A_MASTER)
    table.register(reg(topics={"T1": 4}, instance_id="run-1"))
    with pytest.raises(FailedPrecondition, match="register again"):
        table.bind_keep_alive("DefaultCluster", A_MASTER, "run-0")


# ---------------------------------------------------------------- expiry


def test_expiry_after_timeout_and_not_before(table, fake_clock):
    table.register(reg(topics={"T1": 4}))  # default timeout 120 s
    table.register(reg(B_MASTER, broker_name="broker-b", topics={"T1": 4}, heartbeat_timeout_s=10))
    fake_clock.advance(10)
    assert table.expire(fake_clock.monotonic()) == []  # exactly at the timeout: still alive
    fake_clock.advance(0.5)
    assert [(r.broker_addr, r.reason) for r in table.expire(fake_clock.monotonic())] == [
        (B_MASTER, EXPIRED)
    ]
    fake_clock.advance(109)
    assert table.expire(fake_clock.monotonic()) == []
    fake_clock.advance(1)
    assert [r.broker_addr for r in table.expire(fake_clock.monotonic())] == [A_MASTER]
    assert (
        table.topic_queue_table == {}
        and table.broker_addr_table == {}
        and table.cluster_addr_table == {}
    )


def test_heartbeat_and_query_data_version_postpone_expiry(table, fake_clock):
    table.register(reg(topics={"T1": 4}, heartbeat_timeout_s=10))
    table.register(reg(B_MASTER, broker_name="broker-b", topics={"T1": 4}, heartbeat_timeout_s=10))
    fake_clock.advance(8)
    assert table.heartbeat("DefaultCluster", A_MASTER)
    table.query_data_version("DefaultCluster", B_MASTER, "broker-b", 0, DataVersion(1001, 1))
    fake_clock.advance(8)
    assert table.expire(fake_clock.monotonic()) == []
    fake_clock.advance(3)
    assert len(table.expire(fake_clock.monotonic())) == 2


def test_heartbeat_of_unknown_broker(table):
    assert not table.heartbeat("DefaultCluster", A_MASTER)


# ---------------------------------------------------------------- data version, write permission


def test_query_data_version_changed_and_unchanged(table):
    assert table.query_data_version(
        "DefaultCluster", A_MASTER, "broker-a", 0, DataVersion(1, 1)
    ) == (True, None)
    table.register(reg(topics={"T1": 4}, counter=3))
    assert table.query_data_version(
        "DefaultCluster", A_MASTER, "broker-a", 0, DataVersion(1003, 3)
    ) == (
        False,
        DataVersion(1003, 3),
    )
    assert table.query_data_version(
        "DefaultCluster", A_MASTER, "broker-a", 0, DataVersion(1004, 4)
    ) == (
        True,
        DataVersion(1003, 3),
    )


def test_wipe_and_add_write_perm(table):
    table.register(reg(topics={"T1": 4, "T2": 4, "T3": 4}))
    table.register(reg(B_MASTER, broker_name="broker-b", topics={"T1": 4}))
    assert table.wipe_write_perm("broker-a") == 3
    assert {t: q["broker-a"].perm for t, q in table.topic_queue_table.items()} == {
        "T1": 4,
        "T2": 4,
        "T3": 4,
    }
    assert table.topic_queue_table["T1"]["broker-b"].perm == 6
    assert table.wipe_write_perm("broker-a") == 0  # already drained
    assert table.add_write_perm("broker-a") == 3
    assert {t: q["broker-a"].perm for t, q in table.topic_queue_table.items()} == {
        "T1": 6,
        "T2": 6,
        "T3": 6,
    }
    assert table.add_write_perm("broker-unknown") == 0


def test_route_table_version_moves_on_every_route_change(table):
    v0 = table.version
    table.register(reg(topics={"T1": 4}))
    v1 = table.version
    table.wipe_write_perm("broker-a")
    v2 = table.version
    table.unregister("DefaultCluster", A_MASTER, "broker-a", 0)
    assert v0 < v1 < v2 < table.version
