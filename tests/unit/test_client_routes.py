"""`ferry.client.routes`: one topic route, read by ferry's clients and the proxy
alike, and the cache both keep it in (a fake clock, no sockets)."""

from __future__ import annotations

from ferry.client.routes import BrokerQueues, QueueRef, RouteCache, TopicRoute, group_broker
from ferry.model import MASTER_ID, MESSAGE_TYPE_ATTRIBUTE, PERM_READ, PERM_WRITE
from ferry.v1 import common_pb2

RW = PERM_READ | PERM_WRITE


def route_data(order_conf: str = "") -> common_pb2.TopicRouteData:
    """broker-b: master and slave; broker-a: master, FIFO; broker-c: a slave alone."""
    return common_pb2.TopicRouteData(
        queue_datas=[
            common_pb2.QueueData(broker_name="broker-b", read_queue_nums=2, write_queue_nums=2,
                                 perm=RW),
            common_pb2.QueueData(broker_name="broker-a", read_queue_nums=1, write_queue_nums=3,
                                 perm=RW, attributes={MESSAGE_TYPE_ATTRIBUTE: "FIFO"}),
            common_pb2.QueueData(broker_name="broker-c", read_queue_nums=1, write_queue_nums=1,
                                 perm=RW),
        ],
        broker_datas=[
            common_pb2.BrokerData(broker_name="broker-a", broker_addrs={MASTER_ID: "a:0"}),
            common_pb2.BrokerData(broker_name="broker-b",
                                  broker_addrs={MASTER_ID: "b:0", 1: "b:1"}),
            common_pb2.BrokerData(broker_name="broker-c", broker_addrs={2: "c:2"}),
        ],
        order_topic_conf=order_conf,
    )  # fmt: skip


def test_a_route_from_the_name_servers_keeps_every_group_and_its_addresses():
    route = TopicRoute.from_data("T", route_data())
    assert [q.broker_name for q in route.queues] == ["broker-a", "broker-b", "broker-c"]
    assert route.queues[2] == BrokerQueues("broker-c", "", 1, 1, RW)
    assert [b.broker_name for b in route.brokers] == ["broker-a", "broker-b"]
    assert route.broker("broker-b") == BrokerQueues("broker-b", "b:0", 2, 2, RW)
    assert route.broker("broker-c") is None  # no master: not a broker to send to
    assert route.master("broker-b") == "b:0" and route.master("broker-c") is None
    assert route.read_addr("broker-b", prefer=1) == "b:1"
    assert route.read_addr("broker-b", prefer=7) == "b:0"
    assert route.read_addr("broker-c") == "c:2"  # the master gone: the lowest slave
    assert route.message_type == "FIFO"  # the first master by name says
    assert not route.ordered


def test_writes_go_to_masters_reads_to_any_broker_of_a_group():
    route = TopicRoute.from_data("T", route_data())
    assert route.write_queues() == [
        QueueRef("broker-a", 0), QueueRef("broker-a", 1), QueueRef("broker-a", 2),
        QueueRef("broker-b", 0), QueueRef("broker-b", 1),
    ]  # fmt: skip
    assert route.read_queues() == [
        QueueRef("broker-a", 0), QueueRef("broker-b", 0), QueueRef("broker-b", 1),
        QueueRef("broker-c", 0),
    ]  # fmt: skip


def test_a_topic_is_ordered_only_on_a_routed_master():
    assert TopicRoute.from_data("T", route_data("broker-a:3")).ordered
    assert not TopicRoute.from_data("T", route_data("broker-c:1")).ordered


def test_a_message_group_always_picks_the_same_broker_by_name():
    route = TopicRoute.from_data("T", route_data())
    picked = group_broker(route.write_queues(), "orders-17")
    assert picked == group_broker(reversed(route.brokers), "orders-17")
    assert {group_broker(route.brokers, f"g{i}") for i in range(50)} == {"broker-a", "broker-b"}


def test_the_cache_keeps_a_route_for_ttl_s_and_remembers_masters(fake_clock):
    cache = RouteCache(ttl_s=30.0, clock=fake_clock)
    route = cache.put(TopicRoute.from_data("T", route_data()))
    fake_clock.advance(30.0)
    assert cache.fresh("T") is route
    fake_clock.advance(0.001)
    assert cache.fresh("T") is None
    assert cache.master_addr("broker-b") == "b:0" and cache.master_addr("broker-c") is None
    cache.put(route)
    cache.forget("T")
    assert cache.fresh("T") is None and cache.fresh("Other") is None
    assert cache.master_addr("broker-a") == "a:0"  # last seen, whatever the topic
