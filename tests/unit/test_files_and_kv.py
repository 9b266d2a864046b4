"""Atomic JSON files with .bak fallback, and the KV config store built on them."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from ferry.runtime.errors import CorruptFileError, InvalidArgument
from ferry.runtime.files import atomic_write_bytes, load_json_with_backup, write_json_with_backup
from services.namesrv.kvconfig import KVConfigStore


def test_atomic_write_replaces_content_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]


def test_previous_version_becomes_backup(tmp_path):
    path = tmp_path / "t.json"
    write_json_with_backup(path, {"v": 1})
    assert not (tmp_path / "t.json.bak").exists()
    write_json_with_backup(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert json.loads((tmp_path / "t.json.bak").read_text()) == {"v": 1}


def test_load_fresh_main_and_backup(tmp_path):
    path = tmp_path / "t.json"
    assert load_json_with_backup(path) == (None, "none")
    write_json_with_backup(path, {"v": 1})
    write_json_with_backup(path, {"v": 2})
    assert load_json_with_backup(path) == ({"v": 2}, "main")
    path.unlink()
    assert load_json_with_backup(path) == ({"v": 1}, "backup")


def test_corrupt_main_falls_back_and_is_kept_aside(tmp_path):
    path = tmp_path / "t.json"
    write_json_with_backup(path, {"v": 1})
    write_json_with_backup(path, {"v": 2})
    path.write_bytes(b'{"v": 2, trunc')
    assert load_json_with_backup(path) == ({"v": 1}, "backup")
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("t.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"v": 2, trunc'


def test_corrupt_without_backup_is_an_error_not_an_empty_start(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\x00\x01garbage")
    with pytest.raises(CorruptFileError, match="no backup"):
        load_json_with_backup(path)
    assert path.exists()


def test_wrong_shape_counts_as_corrupt(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("[1, 2]")

    def must_be_dict(doc):
        if not isinstance(doc, dict):
            raise ValueError("not an object")

    with pytest.raises(CorruptFileError, match="not an object"):
        load_json_with_backup(path, must_be_dict)


def test_kv_put_get_delete_persist_and_reload(tmp_path):
    path = tmp_path / "kvConfig.json"
    store = KVConfigStore(path)
    asyncio.run(store.put("ORDER_TOPIC_CONFIG", "TopicTest", "broker-a:4"))
    asyncio.run(store.put("ns2", "k", "v"))
    assert json.loads(path.read_text()) == {
        "configTable": {"ORDER_TOPIC_CONFIG": {"TopicTest": "broker-a:4"}, "ns2": {"k": "v"}}
    }
    assert asyncio.run(store.delete("ns2", "k")) is True
    assert asyncio.run(store.delete("ns2", "k")) is False
    reloaded = KVConfigStore(path)
    assert reloaded.get("ORDER_TOPIC_CONFIG", "TopicTest") == "broker-a:4"
    assert reloaded.namespace("ns2") is None
    assert reloaded.get("ORDER_TOPIC_CONFIG", "missing") is None


def test_kv_corrupt_file_falls_back_to_backup_and_rewrites_main(tmp_path):
    path = tmp_path / "kvConfig.json"
    store = KVConfigStore(path)
    asyncio.run(store.put("ns", "a", "1"))
    asyncio.run(store.put("ns", "b", "2"))
    path.write_text('{"configTable": {"ns": ')
    recovered = KVConfigStore(path)
    assert recovered.recovered_from_backup
    assert recovered.namespace("ns") == {"a": "1"}
    asyncio.run(recovered.save_if_recovered())
    assert json.loads(path.read_text()) == {"configTable": {"ns": {"a": "1"}}}


def test_kv_file_of_wrong_shape_without_backup_stops(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable": {"ns": {"k": 1}}}')
    with pytest.raises(CorruptFileError, match="kvConfig.json"):
        KVConfigStore(path)


@pytest.mark.parametrize(
    ("ns", "key", "value", "field"),
    [("", "k", "v", "namespace"), ("ns", "", "v", "key"), ("ns", "k", "x" * 70_000, "value")],
)
def test_kv_bad_input_changes_nothing(tmp_path, ns, key, value, field):
    path = tmp_path / "kvConfig.json"
    store = KVConfigStore(path)
    with pytest.raises(InvalidArgument, match=field):
        asyncio.run(store.put(ns, key, value))
    assert not path.exists()


def test_short_writes_are_completed_or_raise(tmp_path, monkeypatch):
    """pwrite on a file system that is filling up may write part of what it
    was given: a consume queue must hold every entry it counts (a short write
    once left zeroed entries inside a queue, which a pull then failed on)."""
    import errno

    from ferry.runtime import files
    from services.broker.store.consumequeue import ConsumeQueues

    real = os.pwrite
    calls = {"n": 0}

    def short_then_full(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 1:
            return real(fd, bytes(data)[:7], offset)  # 7 of 60 bytes
        return real(fd, data, offset)

    monkeypatch.setattr(files.os, "pwrite", short_then_full)
    queue = ConsumeQueues(tmp_path / "cq", 1000).get_or_create("T", 0)
    entries = [(100 * i, 50, i) for i in range(3)]
    queue.put(0, entries)
    assert [queue.entry(i) for i in range(3)] == entries
    assert calls["n"] == 2

    def no_space(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "pwrite", no_space)
    with pytest.raises(OSError):
        queue.put(3, [(300, 50, 3)])
    assert queue.max_offset == 3  # the failed entry is not counted
