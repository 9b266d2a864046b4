"""Retention on a real store with small files: which commit-log files go when
(expiry, deleteWhen, disk pressure, forced cleaning), the consume queues that
follow, OFFSET_MOVED, sends refused above the warning ratio, files held by
readers, and the broker.conf keys. The disk's fullness is injected; the
files' ages are real file times set with os.utime."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import ConfigError, ResourceExhausted
from services.broker.config import load_config
from services.broker.store import GetStatus, MessageIn, MessageStore, StoreConfig
from services.broker.store import retention as retention_module
from services.broker.store.retention import RetentionConfig

FILE_SIZE = 4096
HOUR = 3600.0


def _other_hour() -> int:
    return (time.localtime().tm_hour + 12) % 24


class Disk:
    """The store's disk use, as the test says it is."""

    def __init__(self) -> None:
        self.ratio = 0.10

    def __call__(self) -> float:
        return self.ratio


class Store:
    def __init__(self, root: Path, disk: Disk, **retention) -> None:
        self.root = root
        self.disk = disk
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(wall=time.time())
        defaults = dict(
            file_reserved_time_s=HOUR,
            delete_when_hours=(_other_hour(),),
            delete_files_interval_s=0.0,
            check_interval_s=3600.0,  # passes run when the test says
        )
        defaults.update(retention)
        self.config = StoreConfig(
            root=root,
            commit_log_file_size=FILE_SIZE,
            consume_queue_entries_per_file=8,
            retention=RetentionConfig(**defaults),
        )
        self.store = self.open()

    def open(self) -> MessageStore:
        store = MessageStore(self.config, self.clock, disk_ratio=self.disk)
        store.open()
        self.run(store.start())
        return store

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def put(self, queue_id: int, body: bytes):
        return self.run(self.store.put("T", queue_id, [MessageIn(body=body, properties=b"")]))

    def fill(self, files: int) -> list[tuple[int, int, bytes, int]]:
        """Messages over two queues until the log has `files` files; returns
        (queue id, queue offset, body, commit offset) of each, everything
        flushed and dispatched."""
        sent = []
        i = 0
        while len(self.store.commit_log.segment_starts()) < files:
            body = b"m%04d-" % i + b"x" * 300
            r = self.put(i % 2, body)
            sent.append((i % 2, r.queue_offset, body, r.commit_offsets[0]))
            i += 1
        self.settle()
        return sent

    def settle(self) -> None:
        self.store.dispatcher.dispatch_all()
        self.run(self.store.flusher.flush_now())

    def age_all_but_newest(self, seconds: float) -> None:
        starts = self.store.commit_log.segment_starts()
        then = time.time() - seconds
        for start in starts[:-1]:
            os.utime(self.store.commit_log.directory / f"{start:020d}", (then, then))

    def clean(self, manual: bool = False):
        return self.run(self.store.retention.clean(manual=manual))

    def get(self, queue_id: int, offset: int):
        return self.run(self.store.get_messages("T", queue_id, offset, 1000))

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def store(tmp_path, disk):
    s = Store(tmp_path / "store", disk)
    yield s
    s.close()


def test_nothing_is_deleted_off_hours_with_room_on_the_disk(store):
    store.fill(4)
    store.age_all_but_newest(2 * HOUR)
    result = store.clean()
    assert result.deleted_files == 0 and store.store.min_offset == 0


def test_clean_now_deletes_expired_files_keeps_the_newest_and_moves_every_min_offset(store):
    sent = store.fill(5)
    starts = store.store.commit_log.segment_starts()
    store.age_all_but_newest(2 * HOUR)
    store.clock.advance(2 * HOUR)  # the newest is expired too, and still never deleted
    result = store.clean(manual=True)
    assert result.deleted_files == len(starts) - 1
    assert result.min_offset == starts[-1] == store.store.min_offset
    assert result.consume_queue_files > 0  # 8 entries a file: whole files went too
    assert sorted(p.name for p in store.store.commit_log.directory.iterdir()) == [
        f"{starts[-1]:020d}"
    ]
    for queue_id in (0, 1):
        mine = [(o, b, c) for q, o, b, c in sent if q == queue_id]
        survivors = [(o, b) for o, b, c in mine if c >= starts[-1]]
        low = store.store.queue_min_offset("T", queue_id)
        assert low == (survivors[0][0] if survivors else len(mine))
        moved = store.get(queue_id, 0)
        assert moved.status is GetStatus.OFFSET_MOVED and moved.next_begin_offset == low
        found = store.get(queue_id, low)
        assert [m.body for m in found.records] == [b for _, b in survivors]
    # The new minimums survive a restart.
    mins = {q: store.store.queue_min_offset("T", q) for q in (0, 1)}
    store.run(store.store.stop())
    store.store = store.open()
    assert store.store.min_offset == starts[-1]
    assert {q: store.store.queue_min_offset("T", q) for q in (0, 1)} == mins
    assert store.get(0, 0).status is GetStatus.OFFSET_MOVED


def test_expired_files_go_at_a_delete_when_hour_and_unexpired_ones_stay(tmp_path, disk):
    s = Store(tmp_path / "s", disk, delete_when_hours=(time.localtime().tm_hour,))
    try:
        s.fill(5)
        starts = s.store.commit_log.segment_starts()
        then = time.time() - 2 * HOUR
        for start in starts[:2]:  # the two oldest expired, the rest young
            os.utime(s.store.commit_log.directory / f"{start:020d}", (then, then))
        result = s.clean()
        assert result.deleted_files == 2 and s.store.min_offset == starts[2]
    finally:
        s.close()


def test_a_disk_above_max_used_deletes_expired_files_at_once_but_no_young_one(store, disk):
    store.fill(5)
    starts = store.store.commit_log.segment_starts()
    then = time.time() - 2 * HOUR
    os.utime(store.store.commit_log.directory / f"{starts[0]:020d}", (then, then))
    disk.ratio = 0.80  # above 75 %, below 85 %
    result = store.clean()
    assert result.deleted_files == 1 and store.store.min_offset == starts[1]


def test_above_the_forcibly_ratio_the_oldest_files_go_down_to_the_max_used_ratio(store, disk):
    store.fill(8)
    starts = store.store.commit_log.segment_starts()

    # Each deletion frees 3 % of the disk in this pretend world.
    def freed() -> float:
        return 0.87 - 0.03 * (len(starts) - len(store.store.commit_log.segment_starts()))

    store.store.retention.disk_ratio = freed
    result = store.clean()
    assert result.deleted_files == 4  # 87 % -> 84 -> 81 -> 78 -> 75 (not above 75 %: stop)
    assert store.store.min_offset == starts[4]


def test_forced_cleaning_can_be_turned_off(tmp_path, disk):
    s = Store(tmp_path / "s", disk, clean_file_forcibly_enable=False)
    try:
        s.fill(4)
        disk.ratio = 0.88
        assert s.clean().deleted_files == 0
    finally:
        s.close()


def test_above_the_warning_ratio_sends_are_refused_and_reads_go_on_until_space_returns(store, disk):
    sent = store.fill(3)
    disk.ratio = 0.95
    store.clean()  # the pass sees the disk (nothing expired; forced: the oldest go)
    assert store.store.retention.disk_full
    with pytest.raises(ResourceExhausted) as refused:
        store.put(0, b"one more")
    assert "nearly full" in str(refused.value) and "diskSpaceWarningLevelRatio" in str(
        refused.value
    )
    low = store.store.queue_min_offset("T", 0)
    assert store.get(0, low).status is GetStatus.FOUND  # reads go on
    disk.ratio = 0.50
    store.clean()
    assert not store.store.retention.disk_full
    assert store.put(0, b"room again").queue_offset == max(o for q, o, *_ in sent if q == 0) + 1


def test_a_file_a_reader_holds_is_closed_only_when_the_reader_lets_go(store):
    store.fill(3)
    log = store.store.commit_log
    region = log.region(0, 100)
    store.age_all_but_newest(2 * HOUR)
    store.clean(manual=True)
    assert log.min_offset > 0
    assert os.pread(region.fd, 100, 0)[:4] == os.pread(region.fd, 4, 0)  # still open
    fd = log.unpin(region.segment)
    assert fd == region.fd  # the last reader closes it
    os.close(fd)


def test_a_file_whose_age_cannot_be_read_stops_the_pass_and_deletes_nothing(store, monkeypatch):
    store.fill(3)
    store.age_all_but_newest(2 * HOUR)

    def unreadable(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(retention_module, "_last_write", unreadable)
    assert store.clean(manual=True).deleted_files == 0
    assert store.store.min_offset == 0


def test_files_not_yet_in_the_consume_queues_are_never_deleted(store):
    store.fill(3)
    store.age_all_but_newest(2 * HOUR)
    store.store.dispatcher.offset = 0  # as if nothing had been dispatched yet
    assert store.clean(manual=True).deleted_files == 0
    store.store.dispatcher.dispatch_all()
    assert store.clean(manual=True).deleted_files == 2


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("deleteWhen", "4am", "hours of the day"),
        ("deleteWhen", "24", "hours of the day"),
        ("fileReservedTime", "-1", "positive"),
        ("fileReservedTime", "three", "number of hours"),
        ("diskMaxUsedSpaceRatio", "120", "outside 1..99"),
        ("diskSpaceWarningLevelRatio", "80", "below diskSpaceCleanForciblyRatio"),
        ("cleanFileForciblyEnable", "yes", "true or false"),
    ],
)
def test_bad_retention_keys_stop_startup_naming_the_key(key, value, says):
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"{key}={value}"], env={})
    assert error.value.key == key and says in error.value.reason


def test_retention_keys_parse_as_rocketmq_writes_them():
    config, _ = load_config(
        None,
        [
            "fileReservedTime=0.001",
            "deleteWhen=04;16",
            "diskMaxUsedSpaceRatio=70",
            "deleteCommitLogFilesInterval=250",
        ],
        env={},
    )
    assert config.file_reserved_time_s == pytest.approx(3.6)
    assert config.delete_when_hours == (4, 16)
    assert config.disk_max_used_space_ratio == pytest.approx(0.70)
    assert config.delete_commit_log_files_interval_s == pytest.approx(0.25)
