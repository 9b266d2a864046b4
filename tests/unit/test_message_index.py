"""The message index over a real store (services/broker/store/index.py): every key of
100,000 messages found across several index files, unique keys exact, hash collisions
weeded out, rollbacks left out, and the index after a clean restart, a crash, a
truncation and retention."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from ferry import record
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import FailedPrecondition
from services.broker.store import IndexConfig, MessageIn, MessageStore, StoreConfig
from services.broker.store.retention import RetentionConfig

SMALL_INDEX = IndexConfig(max_hash_slot_num=40_000, max_index_num=60_000)


class Harness:
    def __init__(self, root: Path, index: IndexConfig = SMALL_INDEX, file_size: int = 1 << 20):
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(wall=1_700_000_000.0)
        self.config = StoreConfig(
            root=root,
            commit_log_file_size=file_size,
            index=index,
            preallocate=False,
            retention=RetentionConfig(
                delete_files_interval_s=0.0, check_interval_s=3600.0, delete_when_hours=()
            ),
        )
        self.store = self.open()

    def open(self) -> MessageStore:
        store = MessageStore(self.config, self.clock)
        self.report = store.open()
        self.run(store.start())
        return store

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def send(self, first: int, count: int, topic: str = "T", batch: int = 100, **props):
        """Messages `first`..`first+count` with UNIQ_KEY u<i> and KEYS "k<i> g<i%7>";
        returns their commit offsets."""
        offsets = []
        for at in range(first, first + count, batch):
            messages = [
                MessageIn(
                    body=b"body-%d" % i,
                    properties=record.encode_properties(
                        {"UNIQ_KEY": f"u{i}", "KEYS": f"k{i} g{i % 7}", **props}
                    ),
                )
                for i in range(at, min(at + batch, first + count))
            ]
            self.clock.advance(0.01)
            offsets += self.run(self.store.put(topic, at % 4, messages)).commit_offsets
        return offsets

    def indexed(self) -> None:
        self.run(asyncio.wait_for(self.store.wait_indexed(), 30))

    def find(self, key: str, topic: str = "T", unique: bool = False, max_num: int = 64, **kw):
        got = self.run(self.store.find_by_key(topic, key, max_num, unique=unique, **kw))
        return [m.commit_offset for _, m in got.found]

    def crash(self) -> None:
        self.store.abandon()
        self.store = self.open()

    def restart(self) -> None:
        self.run(self.store.stop())
        self.store = self.open()

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "store")
    yield harness
    harness.close()


def index_files(root: Path) -> list[str]:
    return sorted(os.listdir(root / "index"))


def test_100k_messages_every_key_found_across_files(h):
    offsets = h.send(0, 100_000, batch=500)
    h.indexed()
    index = h.store.index
    assert index is not None
    assert index.file_count == 6  # 300,000 keys, 59,999 a file
    assert index.entries == 300_000
    assert len(index_files(h.root)) == index.file_count
    slowest = []
    for i, offset in enumerate(offsets):
        started = time.perf_counter()
        candidates = index.lookup("T", f"k{i}", 0, 2**62, 64)
        slowest.append(time.perf_counter() - started)
        assert offset in candidates, i
        assert offset in index.lookup("T", f"u{i}", 0, 2**62, 64)
    slowest.sort()
    assert slowest[int(len(slowest) * 0.99)] < 0.010
    for i in range(0, 100_000, 997):  # the whole lookup, records read and checked
        assert h.find(f"k{i}") == [offsets[i]]
        assert h.find(f"u{i}", unique=True) == [offsets[i]]
        assert h.find(f"u{i}") == []  # a unique key is not one of the KEYS
    # A key many messages share: the newest 64, in commit-offset order.
    shared = h.find("g3")
    assert shared == [o for i, o in enumerate(offsets) if i % 7 == 3][-64:]
    assert h.find("g3", max_num=5) == shared[-5:]
    assert h.find("k5", topic="Other") == []


def test_time_range_and_last_update(h):
    early = h.send(0, 10)
    h.clock.advance(100)
    late = h.send(10, 10)
    h.indexed()
    cut = 1_700_000_000_000 + 50_000
    assert h.find("g1", begin_ms=0, end_ms=cut) == [early[1], early[8]]
    assert h.find("g1", begin_ms=cut, end_ms=2**62) == [late[5]]
    got = h.run(h.store.find_by_key("T", "k3", 10))
    assert got.last_update_commit_offset == late[-1]
    assert got.last_update_timestamp >= cut


def test_hash_collisions_and_rollbacks_are_left_out(h):
    assert record.tags_hash("T#Aa") == record.tags_hash("T#BB")
    put = h.run(
        h.store.put(
            "T",
            0,
            [
                MessageIn(body=b"a", properties=record.encode_properties({"KEYS": "Aa"})),
                MessageIn(body=b"b", properties=record.encode_properties({"KEYS": "BB"})),
                MessageIn(
                    body=b"r", properties=record.encode_properties({"KEYS": "Aa"}), sys_flag=0xC
                ),
                MessageIn(
                    body=b"c", properties=record.encode_properties({"KEYS": "Aa"}), sys_flag=0x8
                ),
            ],
        )
    )
    h.indexed()
    a, b, _rollback, commit = put.commit_offsets
    assert h.find("Aa") == [a, commit]
    assert h.find("BB") == [b]


def test_a_clean_restart_keeps_the_files_and_finds_each_message_once(h):
    offsets = h.send(0, 20_000, batch=500)
    h.indexed()
    files = index_files(h.root)
    h.restart()
    h.indexed()
    assert index_files(h.root) == files
    more = h.send(20_000, 100)
    h.indexed()
    assert h.find("k19999") == [offsets[-1]]
    assert h.find("k20050") == [more[50]]


def test_a_crash_drops_the_newest_file_and_indexes_it_again(h):
    offsets = h.send(0, 40_000, batch=500)
    h.indexed()
    files = index_files(h.root)
    assert len(files) >= 2
    newest = h.root / "index" / files[-1]
    with open(newest, "r+b") as f:  # what a torn write could leave
        f.seek(40)
        f.write(os.urandom(4000))
    h.crash()
    assert not (h.root / "index" / files[-1]).exists()
    h.indexed()
    for i in range(0, 40_000, 101):
        assert h.find(f"k{i}") == [offsets[i]], i
    assert h.find("k39999") == [offsets[-1]]


def test_truncation_forgets_what_was_cut(h):
    offsets = h.send(0, 1000)
    h.indexed()
    cut = offsets[600]
    h.run(h.store.truncate(cut))
    assert h.find("k600") == []
    h.indexed()  # rebuilt from the commit log up to the cut
    assert h.find("k599") == [offsets[599]]
    assert h.find("k600") == []
    # New records over the cut region carry other keys: the old ones stay gone.
    h.send(5000, 500)
    h.indexed()
    assert h.find("k700") == []
    assert h.find("k5100") != []
    assert h.find("k10") == [offsets[10]]


def test_retention_drops_index_files_below_the_log(tmp_path):
    h = Harness(tmp_path / "store", IndexConfig(max_hash_slot_num=100, max_index_num=2000), 1 << 17)
    try:
        offsets = h.send(0, 10_000)
        h.indexed()
        h.run(h.store.wait_dispatched())
        files_before = h.store.index.file_count
        log_files = h.store.commit_log.segment_starts()
        then = h.clock.wall() - 100 * 3600
        for start in log_files[:-1]:
            os.utime(h.store.commit_log.directory / f"{start:020d}", (then, then))
        h.run(h.store.clean_now())
        low = h.store.min_offset
        assert low > offsets[0]
        assert h.store.index.file_count < files_before
        assert len(index_files(h.root)) == h.store.index.file_count
        assert all(f.end_offset >= low for f in h.store.index.files[:-1])
        for i in range(0, 10_000, 37):
            assert h.find(f"k{i}") == ([offsets[i]] if offsets[i] >= low else []), i
        for i in range(0, 10_000, 37):
            found = h.store.index.lookup("T", f"k{i}", 0, 2**62, 8)
            assert all(o >= low for o in found)
    finally:
        h.close()


def test_index_off(tmp_path):
    h = Harness(tmp_path / "store", IndexConfig(enabled=False))
    try:
        h.send(0, 10)
        assert not (h.root / "index").exists()
        with pytest.raises(FailedPrecondition, match="messageIndexEnable"):
            h.find("k1")
    finally:
        h.close()


def test_broker_conf_keys() -> None:
    from ferry.runtime.errors import ConfigError
    from services.broker.config import load_config

    c, _ = load_config(None, [], env={})
    assert (c.message_index_enable, c.max_hash_slot_num, c.max_index_num) == (
        True,
        5_000_000,
        20_000_000,
    )
    c, _ = load_config(
        None, ["messageIndexEnable=false", "maxHashSlotNum=10", "maxIndexNum=20"], env={}
    )
    assert (c.message_index_enable, c.max_hash_slot_num, c.max_index_num) == (False, 10, 20)
    for bad, key in (
        ("maxHashSlotNum=0", "maxHashSlotNum"),
        ("maxIndexNum=1", "maxIndexNum"),
        ("messageIndexEnable=maybe", "messageIndexEnable"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad], env={})
    with pytest.raises(ConfigError, match="maxIndexNum.*2 GiB"):
        load_config(None, ["maxHashSlotNum=100000000", "maxIndexNum=100000000"], env={})
