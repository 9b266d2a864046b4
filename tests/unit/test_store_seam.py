"""The store/HA seam: truncation at every record boundary (commit log, consume
queues, next queue offsets and checkpoint stay consistent, and a reopened
store agrees), restarting empty at a file start, regions held for transfers,
wait-for-growth, one process per store, and the reads forgetting what a cut
removed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ferry.runtime.clock import FakeClock
from services.broker.store import GetStatus, MessageIn, MessageStore, StoreConfig
from services.broker.store.checkpoint import CHECKPOINT, load_checkpoint
from services.broker.store.storelock import StoreLockedError
from services.ha.replicated_log import ReplicatedLog
from tests.conftest import copy_store

FILE_SIZE = 2048


def config(root: Path) -> StoreConfig:
    return StoreConfig(root=root, commit_log_file_size=FILE_SIZE, consume_queue_entries_per_file=4)


class Opened:
    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = MessageStore(config(root), FakeClock())
        self.report = self.store.open()
        self.run(self.store.start())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()


def _fill(root: Path) -> list[tuple[int, int, int, bytes]]:
    """A small log over three files and three queues; returns (commit offset,
    queue id, queue offset, body) of every record, in log order."""
    s = Opened(root)
    records = []
    for i in range(24):
        body = b"r%03d-" % i + b"z" * (60 + 17 * (i % 5))
        r = s.run(s.store.put("T", i % 3, [MessageIn(body=body, properties=b"")]))
        records.append((r.commit_offsets[0], i % 3, r.queue_offset, body))
    s.close()
    return records


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, list[tuple[int, int, int, bytes]]]:
    root = tmp_path_factory.mktemp("seam") / "store"
    records = _fill(root)
    return root, records


def _open_copy(root: Path, work: Path) -> Opened:
    """A store opened on a copy of `root` made at `work` (`root` stays as it was)."""
    copy_store(root, work)
    return Opened(work)


def _read_queue(s: Opened, queue_id: int) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while True:
        result = s.run(s.store.get_messages("T", queue_id, offset, 1000))
        if result.status is not GetStatus.FOUND:
            return bodies
        bodies += [m.body for m in result.records]
        offset = result.next_begin_offset


def test_truncation_at_every_record_boundary_leaves_a_consistent_store(filled, tmp_path):
    root, records = filled
    boundaries = [c for c, *_ in records]
    probe = Opened(root)
    end = probe.store.max_offset
    probe.close()
    assert len({b // FILE_SIZE for b in boundaries}) >= 3
    for cut in [*boundaries, end]:
        work = tmp_path / f"cut-{cut}"
        s = _open_copy(root, work)
        log: ReplicatedLog = s.store.replica_log
        s.run(log.truncate(cut))
        kept = [r for r in records if r[0] < cut]
        assert log.max_offset == cut
        for queue_id in range(3):
            mine = [r for r in kept if r[1] == queue_id]
            assert s.store.queue_max_offset("T", queue_id) == len(mine), (cut, queue_id)
            assert _read_queue(s, queue_id) == [r[3] for r in mine]
        checkpoint = load_checkpoint(work / CHECKPOINT)
        assert checkpoint is not None
        assert checkpoint.flushed_offset <= cut and checkpoint.dispatched_offset <= cut
        assert s.store.flushed_offset <= cut
        # The next append follows on at the cut, with the queue's next offset.
        nxt = s.run(s.store.put("T", 0, [MessageIn(body=b"after the cut", properties=b"")]))
        expected_at = cut
        if FILE_SIZE - cut % FILE_SIZE < nxt.end_offset - nxt.commit_offsets[0] + 8:
            expected_at = cut - cut % FILE_SIZE + FILE_SIZE  # it rolled to the next file
        assert nxt.commit_offsets[0] == expected_at
        assert nxt.queue_offset == len([r for r in kept if r[1] == 0])
        s.close()
        # A reopen (clean or after a crash) agrees with what the truncation left.
        again = Opened(work)
        assert again.store.max_offset == nxt.end_offset
        assert _read_queue(again, 0)[-1] == b"after the cut"
        assert _read_queue(again, 1) == [r[3] for r in kept if r[1] == 1]
        again.close()


def test_truncation_refuses_an_offset_inside_a_record_or_outside_the_log(filled, tmp_path):
    root, records = filled
    s = _open_copy(root, tmp_path / "w")
    end = s.store.max_offset
    try:
        for bad in (records[3][0] + 5, end + 1, -1):
            with pytest.raises(ValueError):
                s.run(s.store.replica_log.truncate(bad))
        assert s.store.max_offset == end  # nothing cut
    finally:
        s.close()


def test_restart_at_drops_everything_and_starts_empty_at_a_file_start(filled, tmp_path):
    root, _ = filled
    work = tmp_path / "w"
    s = _open_copy(root, work)
    log: ReplicatedLog = s.store.replica_log
    log.restart_at(10 * FILE_SIZE)
    assert (log.min_offset, log.max_offset) == (10 * FILE_SIZE, 10 * FILE_SIZE)
    assert s.store.queues.all() == []
    with pytest.raises(ValueError):
        log.append(10 * FILE_SIZE + 1, b"x")
    s.close()
    again = Opened(work)
    assert again.store.max_offset in (0, 10 * FILE_SIZE)  # no file was written yet
    again.close()


def test_a_region_is_held_and_wait_for_growth_wakes_on_append(tmp_path):
    s = Opened(tmp_path / "s")
    log: ReplicatedLog = s.store.replica_log

    async def scenario():
        waiting = asyncio.create_task(log.wait_for_growth(0, 10.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        await s.store.put("T", 0, [MessageIn(body=b"grow", properties=b"")])
        assert await asyncio.wait_for(waiting, 5.0) is True
        assert await log.wait_for_growth(log.max_offset, 0.01) is False
        region = await log.read_region(0, 1 << 20)
        try:
            assert region.size == log.max_offset
            assert b"grow" in os.pread(region.fd, region.size, region.file_position)
        finally:
            log.release(region)

    s.run(scenario())
    s.close()


def test_a_second_store_on_a_locked_root_fails_at_once_and_the_first_goes_on(tmp_path):
    first = Opened(tmp_path / "s")
    try:
        other = StoreConfig(root=tmp_path / "s", commit_log_file_size=FILE_SIZE * 2)
        with pytest.raises(StoreLockedError) as locked:  # before it reads the files
            MessageStore(other, FakeClock())
        assert str(tmp_path / "s") in str(locked.value)
        assert f"PID {os.getpid()}" in str(locked.value)
        r = first.run(first.store.put("T", 0, [MessageIn(body=b"still mine", properties=b"")]))
        assert r.queue_offset == 0
    finally:
        first.close()
    # Released at a clean stop: the next open works.
    Opened(tmp_path / "s").close()


def test_a_store_time_read_before_a_cut_is_not_answered_after_it(tmp_path):
    """Store times are cached by commit offset (the statistics codes read the
    same records again and again): a cut forgets them, so the record written
    where a cut one was answers with its own store time."""
    loop = asyncio.new_event_loop()
    clock = FakeClock()
    store = MessageStore(config(tmp_path / "s"), clock)
    store.open()
    loop.run_until_complete(store.start())

    def append(body: bytes):
        result = loop.run_until_complete(store.put("T", 0, [MessageIn(body=body, properties=b"")]))
        loop.run_until_complete(store.wait_dispatched())
        return result

    try:
        first = append(b"cut")
        assert loop.run_until_complete(store.store_time_at("T", 0, 0)) == first.store_timestamp
        loop.run_until_complete(store.truncate(first.commit_offsets[0]))
        clock.advance(5)
        again = append(b"written over it")
        assert again.commit_offsets == first.commit_offsets and again.queue_offset == 0
        assert again.store_timestamp == first.store_timestamp + 5000
        assert loop.run_until_complete(store.store_time_at("T", 0, 0)) == again.store_timestamp
    finally:
        loop.run_until_complete(store.stop())
        loop.close()
