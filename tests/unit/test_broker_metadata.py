"""The broker's metadata tables: RocketMQ's JSON shapes, a DataVersion bump on
every change, atomic replacement with a `.bak`, fallback and refusal."""

from __future__ import annotations

import json
import logging

import pytest

from ferry.model import DataVersion, SubscriptionGroupConfig, TopicConfig
from ferry.runtime.errors import CorruptFileError, InvalidArgument, NotFound
from services.broker.metadata.tables import BrokerMetadata


@pytest.fixture
def meta(tmp_path, fake_clock):
    return BrokerMetadata.open(tmp_path / "config", fake_clock)


def read(path):
    return json.loads(path.read_text())


def test_topics_json_has_rocketmqs_shape_and_every_change_bumps(meta, fake_clock, tmp_path):
    v1 = meta.topics.put(TopicConfig("Orders", 4, 4, 6))
    fake_clock.advance(1.5)
    v2 = meta.topics.put(TopicConfig("Orders", 8, 8, 6, order=True))
    assert (v1.counter, v2.counter) == (1, 2)
    assert v2.timestamp == v1.timestamp + 1500
    assert read(tmp_path / "config" / "topics.json") == {
        "dataVersion": {"counter": 2, "stateVersion": 0, "timestamp": v2.timestamp},
        "topicConfigTable": {
            "Orders": {
                "attributes": {},
                "order": True,
                "perm": 6,
                "readQueueNums": 8,
                "topicFilterType": "SINGLE_TAG",
                "topicName": "Orders",
                "topicSysFlag": 0,
                "writeQueueNums": 8,
            }
        },
    }
    # The previous content is kept as .bak.
    assert read(tmp_path / "config" / "topics.json.bak")["dataVersion"]["counter"] == 1
    v3 = meta.topics.delete("Orders")
    assert v3.counter == 3 and meta.topics.get("Orders") is None


def test_reload_gives_the_same_tables_and_versions(meta, fake_clock, tmp_path):
    meta.topics.put(TopicConfig("A", 2, 2, 6))
    meta.subscription_groups.put(SubscriptionGroupConfig("G", retry_max_times=3))
    meta.consumer_offsets.commit("G", "A", 1, 42)
    meta.delay_offsets.set(3, 7)
    meta.persist_all()
    again = BrokerMetadata.open(tmp_path / "config", fake_clock)
    assert again.topics.snapshot() == meta.topics.snapshot()
    assert again.subscription_groups.snapshot() == meta.subscription_groups.snapshot()
    assert again.consumer_offsets.snapshot() == meta.consumer_offsets.snapshot()
    assert again.delay_offsets.snapshot() == meta.delay_offsets.snapshot()
    assert read(tmp_path / "config" / "consumerOffset.json")["offsetTable"] == {"A@G": {"1": 42}}
    assert read(tmp_path / "config" / "delayOffset.json")["offsetTable"] == {"3": 7}
    group = read(tmp_path / "config" / "subscriptionGroup.json")["subscriptionGroupTable"]["G"]
    assert group["groupName"] == "G" and group["retryMaxTimes"] == 3
    assert group["consumeEnable"] is True


def test_offsets_are_persisted_when_dirty_only(meta, tmp_path):
    assert meta.consumer_offsets.persist() is False
    meta.consumer_offsets.commit("G", "T", 0, 1)
    assert meta.consumer_offsets.data_version.counter == 1
    assert meta.consumer_offsets.persist() is True
    assert meta.consumer_offsets.persist() is False


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (TopicConfig("bad topic"), "topic_name"),
        (TopicConfig("T", perm=16), "perm"),
        (TopicConfig("T", read_queue_nums=-1), "read_queue_nums"),
        (TopicConfig("T", write_queue_nums=70000), "write_queue_nums"),
        (TopicConfig("T", topic_filter_type="REGEX"), "topic_filter_type"),
    ],
)
def test_bad_topics_are_refused_and_the_file_is_unchanged(meta, tmp_path, config, field):
    meta.topics.put(TopicConfig("Keep"))
    before = (tmp_path / "config" / "topics.json").read_bytes()
    with pytest.raises(InvalidArgument, match=field):
        meta.topics.put(config)
    assert (tmp_path / "config" / "topics.json").read_bytes() == before
    assert meta.topics.data_version.counter == 1


def test_delete_of_unknown_entries_is_not_found(meta):
    with pytest.raises(NotFound):
        meta.topics.delete("Nope")
    with pytest.raises(NotFound):
        meta.subscription_groups.delete("Nope")


def test_corrupt_file_falls_back_to_bak_with_a_warning(meta, fake_clock, tmp_path, caplog):
    meta.topics.put(TopicConfig("First"))
    meta.topics.put(TopicConfig("Second"))
    (tmp_path / "config" / "topics.json").write_text('{"dataVersion": {"coun')  # torn
    with caplog.at_level(logging.WARNING):
        again = BrokerMetadata.open(tmp_path / "config", fake_clock)
    assert again.topics.get("First") is not None and again.topics.get("Second") is None
    assert again.topics.data_version.counter == 1
    assert "corrupt" in caplog.text and "topics.json" in caplog.text
    # The main file is whole again.
    assert read(tmp_path / "config" / "topics.json")["dataVersion"]["counter"] == 1


def test_wrong_shape_counts_as_corrupt(meta, fake_clock, tmp_path):
    meta.topics.put(TopicConfig("First"))
    meta.topics.put(TopicConfig("Second"))
    (tmp_path / "config" / "topics.json").write_text('{"topicConfigTable": []}')
    again = BrokerMetadata.open(tmp_path / "config", fake_clock)
    assert again.topics.get("First") is not None


def test_both_files_corrupt_stops_startup_naming_the_file(meta, fake_clock, tmp_path):
    meta.topics.put(TopicConfig("First"))
    meta.topics.put(TopicConfig("Second"))
    (tmp_path / "config" / "topics.json").write_text("garbage")
    (tmp_path / "config" / "topics.json.bak").write_text("garbage")
    with pytest.raises(CorruptFileError, match="topics.json"):
        BrokerMetadata.open(tmp_path / "config", fake_clock)


def test_slave_sync_replaces_tables_and_merges_offsets_max_wins(meta):
    meta.topics.put(TopicConfig("Local"))
    master_version = DataVersion(123, 9, 0)
    meta.topics.replace_all({"M": TopicConfig("M", 2, 2, 6)}, master_version)
    assert meta.topics.data_version == master_version
    assert set(meta.topics.snapshot()[0]) == {"M"}
    meta.consumer_offsets.commit("G", "T", 0, 10)
    meta.consumer_offsets.commit("G", "T", 1, 3)
    meta.consumer_offsets.merge_max({"T@G": {0: 5, 1: 8}, "U@G": {0: 1}}, DataVersion(5, 5, 0))
    assert meta.consumer_offsets.snapshot()[0] == {"T@G": {0: 10, 1: 8}, "U@G": {0: 1}}


def test_snapshots_do_not_change_afterwards(meta):
    meta.topics.put(TopicConfig("A"))
    table, version = meta.topics.snapshot()
    meta.topics.put(TopicConfig("B"))
    assert set(table) == {"A"} and version.counter == 1
    meta.consumer_offsets.commit("G", "A", 0, 1)
    offsets, _ = meta.consumer_offsets.snapshot()
    meta.consumer_offsets.commit("G", "A", 0, 2)
    assert offsets == {"A@G": {0: 1}}


def test_permission_touch_bumps_without_changing_topics(meta):
    meta.topics.put(TopicConfig("A"))
    table, version = meta.topics.snapshot()
    bumped = meta.topics.touch()
    assert bumped.counter == version.counter + 1
    assert meta.topics.snapshot()[0] == table
