"""StatisticsService on a real MessageStore in a temp dir: the figures mqadmin and
ferry.v1 report (services.broker.messaging.statistics), with a fake clock and
traffic rates sampled by hand."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ferry import record
from ferry.model import TopicConfig
from ferry.runtime.clock import FakeClock
from services.broker.messaging.access import BrokerPermission
from services.broker.messaging.admin import AdminService
from services.broker.messaging.clients import ClientTables, ConsumerData, Subscription
from services.broker.messaging.statistics import (
    GroupQueueStats,
    QueueStats,
    StatisticsService,
)
from services.broker.messaging.stats import WINDOWS_S, TrafficStats
from services.broker.metadata.tables import BrokerMetadata
from services.broker.store import MessageIn, MessageStore, StoreConfig

TOPIC = "T"


class World:
    """A store with TOPIC (2 read and 3 write queues), its metadata and the use case."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        config = StoreConfig(root=root / "store", commit_log_file_size=1 << 16)
        self.store = MessageStore(config, self.clock)
        self.store.open()
        self.run(self.store.start())
        self.metadata = BrokerMetadata.open(root / "config", self.clock)
        self.metadata.topics.put(TopicConfig(TOPIC, read_queue_nums=2, write_queue_nums=3))
        self.now = [0.0]
        store = self.store
        self.traffic = TrafficStats(
            lambda: self.now[0], lambda: (store.put_message_count, store.get_message_count)
        )
        identity = ("c", "broker-a", 0, "ASYNC_MASTER")
        self.admin = AdminService(identity, self.metadata, store, self.clock, BrokerPermission(6))
        self.stats = StatisticsService(
            store, self.metadata, self.traffic, self.admin, self.clock, "ASYNC_FLUSH", root
        )

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def put(self, queue_id: int, count: int) -> list[int]:
        """`count` messages into a queue, 1 s apart; their store times."""
        times = []
        for i in range(count):
            times.append(self.clock.wall_ms())
            self.run(self.store.put(TOPIC, queue_id, [MessageIn(b"m%d" % i, b"")]))
            self.clock.advance(1.0)
        self.store.dispatcher.dispatch_all()
        return times

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


def test_an_empty_broker(world):
    figures = world.run(world.stats.broker_figures())
    assert figures.earliest_message_ms == -1
    assert (figures.put_total, figures.get_total, figures.unflushed_bytes) == (0, 0, 0)
    assert figures.put_tps == figures.get_tps == (0.0,) * len(WINDOWS_S)
    assert world.run(world.stats.topic_stats("Nope")) is None
    assert world.run(world.stats.consume_stats("g")).queues == ()


def test_runtime_figures_are_the_stores(world):
    started = world.clock.wall_ms()
    times = world.put(0, 3)
    world.admin.master_addr = "10.0.0.1:10911"
    figures = world.run(world.stats.broker_figures())
    info = figures.info
    store = world.store
    assert (info.broker_role, info.cluster_name, info.broker_name, info.broker_id) == (
        "ASYNC_MASTER", "c", "broker-a", 0,
    )  # fmt: skip
    assert (info.commit_log_min_offset, info.commit_log_max_offset) == (0, store.max_offset)
    assert info.confirm_offset == store.max_offset > 0
    assert info.dispatch_behind_bytes == 0
    assert (info.broker_permission, info.master_addr) == (6, "10.0.0.1:10911")
    assert info.start_timestamp == started and figures.uptime_ms == 3000
    assert info.flush_disk_type == "ASYNC_FLUSH" and info.topic_count == 1
    assert info.table["putMessageTotal"] == "3" and info.table["consumeQueues"] == "1"
    assert figures.put_total == 3 and figures.earliest_message_ms == times[0]
    assert figures.unflushed_bytes == store.max_offset - store.flushed_offset
    assert 0.0 <= figures.disk_used_ratio <= 1.0
    assert 0 < figures.disk_free_bytes <= figures.disk_total_bytes


def test_both_doors_rates_are_the_same_windows(world):
    world.traffic.sample()
    world.put(0, 2)
    world.now[0] = 2.0
    world.traffic.sample()
    world.put(0, 30)
    world.now[0] = 20.0
    world.traffic.sample()
    figures = world.run(world.stats.broker_figures())
    assert figures.put_tps == (30 / 18, 32 / 20, 32 / 20)
    assert world.stats.runtime_info().put_tps == figures.put_tps[0] == figures.info.put_tps
    assert figures.info.get_tps == figures.get_tps[0] == 0.0


def test_topic_stats_are_each_write_queues_offsets_and_newest_store_time(world):
    times = world.put(1, 2)
    assert world.run(world.stats.topic_stats(TOPIC)) == [
        QueueStats(0, 0, 0, 0),
        QueueStats(1, 0, 2, times[1]),
        QueueStats(2, 0, 0, 0),
    ]


def test_consume_stats_are_the_groups_offsets_in_each_read_queue(world):
    times = world.put(0, 3)
    world.metadata.consumer_offsets.commit("g", TOPIC, 0, 2)
    expected = (GroupQueueStats(TOPIC, 0, 3, 2, times[1]), GroupQueueStats(TOPIC, 1, 0, 0, 0))
    assert world.run(world.stats.consume_stats("g", TOPIC)).queues == expected
    assert world.run(world.stats.consume_stats("g")).queues == expected  # topics it committed in
    assert world.run(world.stats.consume_stats("g", "Nope")).queues == ()

    online = ClientTables()
    assert world.run(world.stats.consume_stats("g", TOPIC, online)).queues == expected
    reading = [ConsumerData("g", (Subscription("Other"),))]
    online.heartbeat("c1", "channel", 0.0, consumers=reading)
    assert world.run(world.stats.consume_stats("g", TOPIC, online)).queues == ()
    reading = [ConsumerData("g", (Subscription(TOPIC),))]
    online.heartbeat("c1", "channel", 0.0, consumers=reading)
    assert world.run(world.stats.consume_stats("g", online=online)).queues == expected


def test_consume_tps_is_the_groups_rate_over_a_minute(world):
    world.metadata.consumer_offsets.commit("g", TOPIC, 0, 0)
    world.traffic.sample()
    world.traffic.got("g", TOPIC, 12)
    world.now[0] = 4.0
    world.traffic.sample()
    assert world.run(world.stats.consume_stats("g")).consume_tps == 3.0
    world.stats.forget_group("g")
    world.now[0] = 5.0
    world.traffic.sample()
    assert world.run(world.stats.consume_stats("g")).consume_tps == 0.0


def test_the_earliest_message_is_the_first_kept_records_store_time(world):
    times = world.put(0, 2)
    assert world.run(world.stats.earliest_message_time()) == times[0]
    data = world.run(world.store.record_bytes(0))
    assert data is not None and record.store_timestamp(data) == times[0]
