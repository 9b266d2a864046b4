"""`config/broker.json`, the broker settings changed at run time (today only
brokerPermission): persisted with a DataVersion and a `.bak`, reloaded, a
corrupt file falls back to its backup, and neither a bad value nor a failed
write changes the table or the broker's permission."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os

import pytest

from ferry.model import TopicConfig
from ferry.runtime.errors import CorruptFileError, InvalidArgument, ResourceExhausted, StorageFault
from services.broker.messaging.access import BrokerPermission
from services.broker.messaging.admin import AdminService
from services.broker.metadata import tables as metadata_module
from services.broker.metadata.tables import BrokerMetadata


@pytest.fixture
def meta(tmp_path, fake_clock):
    return BrokerMetadata.open(tmp_path / "config", fake_clock)


def read(path):
    return json.loads(path.read_text())


def test_a_fresh_broker_has_no_persisted_permission_and_no_file(meta, tmp_path):
    assert meta.settings.broker_permission is None
    assert meta.settings.data_version.counter == 0
    assert not (tmp_path / "config" / "broker.json").exists()


def test_permission_is_persisted_versioned_and_reloaded(meta, fake_clock, tmp_path):
    v1 = meta.settings.set_broker_permission(4)
    fake_clock.advance(2.0)
    v2 = meta.settings.set_broker_permission(6)
    assert (v1.counter, v2.counter) == (1, 2)
    assert v2.timestamp == v1.timestamp + 2000 == fake_clock.wall_ms()
    path = tmp_path / "config" / "broker.json"
    assert read(path) == {
        "brokerConfig": {"brokerPermission": 6},
        "dataVersion": {"counter": 2, "stateVersion": 0, "timestamp": v2.timestamp},
    }
    assert read(tmp_path / "config" / "broker.json.bak") == {
        "brokerConfig": {"brokerPermission": 4},
        "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": v1.timestamp},
    }
    again = BrokerMetadata.open(tmp_path / "config", fake_clock)
    assert again.settings.broker_permission == 6
    assert again.settings.data_version == v2


def test_setting_the_same_value_still_bumps(meta):
    v1 = meta.settings.set_broker_permission(4)
    v2 = meta.settings.set_broker_permission(4)
    assert v2.counter == v1.counter + 1


def test_corrupt_file_falls_back_to_bak_with_a_warning(meta, fake_clock, tmp_path, caplog):
    meta.settings.set_broker_permission(4)
    meta.settings.set_broker_permission(2)
    path = tmp_path / "config" / "broker.json"
    path.write_text('{"dataVersion": {"coun')  # torn
    with caplog.at_level(logging.WARNING):
        again = BrokerMetadata.open(tmp_path / "config", fake_clock)
    assert again.settings.broker_permission == 4
    assert again.settings.data_version.counter == 1
    assert "corrupt" in caplog.text and "broker.json" in caplog.text
    assert read(path)["brokerConfig"] == {"brokerPermission": 4}  # whole again


@pytest.mark.parametrize(
    "config",
    [
        {"brokerPermission": 16},
        {"brokerPermission": -1},
        {"brokerPermission": "4"},
        {"brokerPermission": True},
        {"brokerPermision": 4},  # a misspelt hand edit is not silently ignored
    ],
)
def test_a_bad_hand_edit_counts_as_corrupt(meta, fake_clock, tmp_path, config):
    path = tmp_path / "config" / "broker.json"
    path.write_text(json.dumps({"dataVersion": {"counter": 1}, "brokerConfig": config}))
    with pytest.raises(CorruptFileError, match="broker.json"):
        BrokerMetadata.open(tmp_path / "config", fake_clock)


@pytest.mark.parametrize("perm", [-1, 16, 1 << 31])
def test_a_bad_permission_is_refused_and_nothing_changes(meta, tmp_path, perm):
    version = meta.settings.set_broker_permission(4)
    before = (tmp_path / "config" / "broker.json").read_bytes()
    with pytest.raises(InvalidArgument, match="broker_permission"):
        meta.settings.set_broker_permission(perm)
    assert meta.settings.broker_permission == 4
    assert meta.settings.data_version == version
    assert (tmp_path / "config" / "broker.json").read_bytes() == before


def fail_writes(monkeypatch, errno_: int = 28):
    def refuse(path, document):
        raise OSError(errno_, os.strerror(errno_), str(path))

    monkeypatch.setattr(metadata_module, "write_json_with_backup", refuse)


def test_a_failed_write_leaves_the_table_as_it_was(meta, monkeypatch):
    version = meta.settings.set_broker_permission(6)
    fail_writes(monkeypatch)
    with pytest.raises(ResourceExhausted, match="disk is full"):
        meta.settings.set_broker_permission(4)
    assert meta.settings.broker_permission == 6
    assert meta.settings.data_version == version


def test_a_write_failing_for_another_reason_than_a_full_disk_trips_fail_stop(
    tmp_path, fake_clock, monkeypatch
):
    faults = []
    meta = BrokerMetadata.open(tmp_path / "config", fake_clock, on_fault=faults.append)
    fail_writes(monkeypatch, errno.EIO)
    with pytest.raises(StorageFault):
        meta.settings.set_broker_permission(4)
    assert [f.errno for f in faults] == [errno.EIO]
    assert "broker.json" in faults[0].path
    assert meta.settings.broker_permission is None


def test_a_failed_write_leaves_the_brokers_permission_as_it_was(meta, fake_clock, monkeypatch):
    permission = BrokerPermission(6)
    admin = AdminService(("c", "broker-a", 0, "ASYNC_MASTER"), meta, None, fake_clock, permission)
    fail_writes(monkeypatch)
    with pytest.raises(ResourceExhausted):
        asyncio.run(admin.update_permission(4))
    assert permission.get() == 6
    assert meta.settings.broker_permission is None


def test_update_permission_persists_before_it_returns(meta, fake_clock, tmp_path):
    permission = BrokerPermission(6)
    admin = AdminService(("c", "broker-a", 0, "SLAVE"), meta, None, fake_clock, permission)
    topics_version = meta.topics.data_version
    assert asyncio.run(admin.update_permission(4)) == (6, 4)
    assert permission.get() == 4
    assert read(tmp_path / "config" / "broker.json")["brokerConfig"] == {"brokerPermission": 4}
    assert meta.topics.data_version.counter == topics_version.counter + 1  # re-registers


def test_slave_sync_of_the_tables_leaves_the_settings_alone(meta):
    meta.settings.set_broker_permission(4)
    version = meta.settings.data_version
    _, topics_version = meta.topics.snapshot()
    meta.topics.replace_all({"A": TopicConfig("A")}, topics_version.next(1))
    meta.subscription_groups.replace_all({}, topics_version.next(2))
    meta.consumer_offsets.merge_max({"A@G": {0: 3}}, topics_version.next(3))
    meta.delay_offsets.replace_all({1: 2}, topics_version.next(4))
    assert meta.settings.broker_permission == 4
    assert meta.settings.data_version == version
