"""brokerPermission set by UpdateBrokerPermission survives a restart (it is
kept in `config/broker.json`), wins over the configured value, and is what
the broker registers with the name servers from its first registration on;
a slave keeps its own, whatever slave sync brings from its master."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2, namesrv_pb2
from tests.conftest import start_broker
from tests.integration.support import has_route

TOPIC = "Drained"


def create_topic(broker, name: str) -> None:
    broker.admin.UpdateAndCreateTopic(
        broker_admin_pb2.UpdateAndCreateTopicRequest(
            topic_config=common_pb2.TopicConfig(
                topic_name=name, read_queue_nums=2, write_queue_nums=2, perm=6
            )
        ),
        timeout=10,
    )


def set_permission(broker, perm: int) -> broker_admin_pb2.UpdateBrokerPermissionResponse:
    return broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=perm), timeout=10
    )


def runtime_permission(broker) -> int:
    info = broker.admin.GetBrokerRuntimeInfo(
        broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=5
    )
    return info.broker_permission


def route_perms(ns, topic: str, broker_name: str) -> list[int]:
    route = ns.stub.GetRouteInfoByTopic(
        namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=5
    )
    return [q.perm for q in route.queue_datas if q.broker_name == broker_name]


def send(broker, topic: str) -> broker_pb2.SendMessageResponse:
    return broker.broker.SendMessage(
        broker_pb2.SendMessageRequest(topic=topic, body=b"x"), timeout=10
    )


def persisted(store) -> dict:
    return json.loads((store / "config" / "broker.json").read_text())["brokerConfig"]


def test_a_drained_broker_stays_read_only_across_restarts(loop_thread, tmp_path, ns):
    store = tmp_path / "store"
    b = start_broker(loop_thread, store, ns.remoting_addr, brokerName="broker-p")
    try:
        create_topic(b, TOPIC)
        assert send(b, TOPIC).status == broker_pb2.SEND_OK
        answer = set_permission(b, 4)
        assert (answer.previous_permission, answer.broker_permission) == (6, 4)
        assert persisted(store) == {"brokerPermission": 4}  # durable before the answer
    finally:
        b.stop()
    assert not has_route(ns.stub, TOPIC)  # unregistered: the next route is the restart's

    b = start_broker(loop_thread, store, ns.remoting_addr, brokerName="broker-p")
    try:
        assert runtime_permission(b) == 4
        # Registered read-only by the first registration of the new run.
        assert route_perms(ns, TOPIC, "broker-p") == [4]
        with pytest.raises(grpc.RpcError) as refused:
            send(b, TOPIC)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "brokerPermission=4" in refused.value.details()
        set_permission(b, 6)
    finally:
        b.stop()

    b = start_broker(loop_thread, store, ns.remoting_addr, brokerName="broker-p")
    try:
        assert runtime_permission(b) == 6
        assert route_perms(ns, TOPIC, "broker-p") == [6]
        assert send(b, TOPIC).status == broker_pb2.SEND_OK
    finally:
        b.stop()


def test_the_persisted_permission_wins_over_the_config_with_a_warning(
    loop_thread, tmp_path, ns, caplog
):
    store = tmp_path / "store"
    b = start_broker(
        loop_thread, store, ns.remoting_addr, brokerName="broker-q", brokerPermission=4
    )
    try:
        assert runtime_permission(b) == 4  # no file yet: the configured value
        create_topic(b, TOPIC)
        assert route_perms(ns, TOPIC, "broker-q") == [4]
        set_permission(b, 6)
    finally:
        b.stop()
    with caplog.at_level(logging.WARNING, logger="services.broker.app"):
        b = start_broker(
            loop_thread, store, ns.remoting_addr, brokerName="broker-q", brokerPermission=4
        )
    try:
        assert runtime_permission(b) == 6
        assert route_perms(ns, TOPIC, "broker-q") == [6]
        assert send(b, TOPIC).status == broker_pb2.SEND_OK
        warnings = [r.getMessage() for r in caplog.records if r.name == "services.broker.app"]
        overrides = [m for m in warnings if "overrides" in m]
        assert len(overrides) == 1, warnings
        message = overrides[0]
        assert "brokerPermission=6" in message and "brokerPermission=4" in message
        assert str(store / "config" / "broker.json") in message
        assert "UpdateBrokerPermission" in message
    finally:
        b.stop()


def test_a_slave_keeps_its_own_permission_through_slave_sync_and_restarts(
    loop_thread, tmp_path, ns
):
    slave_keys = {"brokerName": "broker-s", "brokerRole": "SLAVE", "brokerId": 1,
                  "haListenPort": 10999}  # fmt: skip
    master = start_broker(loop_thread, tmp_path / "m", ns.remoting_addr, brokerName="broker-s")
    slave = start_broker(loop_thread, tmp_path / "s", ns.remoting_addr, **slave_keys)
    try:
        create_topic(master, TOPIC)
        set_permission(slave, 4)
        # One sync round from the master: its tables arrive, the permission stays.
        loop_thread.run(slave.app.slave_sync.sync_all(master.addr))
        assert slave.app.metadata.topics.get(TOPIC) is not None
        assert runtime_permission(slave) == 4 and runtime_permission(master) == 6
        assert persisted(tmp_path / "s") == {"brokerPermission": 4}
        assert not (tmp_path / "m" / "config" / "broker.json").exists()
        slave.stop()
        slave = start_broker(loop_thread, tmp_path / "s", ns.remoting_addr, **slave_keys)
        assert runtime_permission(slave) == 4
        assert runtime_permission(master) == 6
    finally:
        slave.stop()
        master.stop()
