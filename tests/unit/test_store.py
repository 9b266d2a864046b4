"""The message store on real files: appends, consume queues, reads, flushing,
and recovery from clean stops, crashes, torn tails and lost consume queues."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from ferry import record
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import Unavailable
from services.broker.store import (
    FlushDiskType,
    GetStatus,
    MessageIn,
    MessageStore,
    PutStatus,
    StoreConfig,
)
from services.broker.store import flush as flush_module
from services.broker.store.consumequeue import ENTRY_SIZE
from services.broker.store.recovery import RecoveryError
from tests.conftest import copy_store
from tests.waiting import wait_for_async

FILE_SIZE = 4096


def config(root: Path, **overrides) -> StoreConfig:
    base = dict(root=root, commit_log_file_size=FILE_SIZE, consume_queue_entries_per_file=16)
    base.update(overrides)
    return StoreConfig(**base)


def msg(body: bytes, tags: str = "") -> MessageIn:
    props = record.encode_properties({"TAGS": tags}) if tags else b""
    return MessageIn(body=body, properties=props)


def body(i: int, size: int = 40) -> bytes:
    return (b"m%05d-" % i + bytes([65 + i % 26]) * size)[:size]


class Harness:
    """One store on one event loop; `crash()` abandons it like SIGKILL would
    (no flush, no checkpoint, the abort marker left behind)."""

    def __init__(self, root: Path, **overrides) -> None:
        self.root = root
        self.overrides = overrides
        self.loop = asyncio.new_event_loop()
        self.store: MessageStore | None = None
        self.report = None

    def open(self) -> MessageStore:
        self.store = MessageStore(config(self.root, **self.overrides), FakeClock())
        self.report = self.store.open()
        self.run(self.store.start())
        return self.store

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def put(self, topic: str, queue_id: int, messages: list[MessageIn]):
        assert self.store is not None
        return self.run(self.store.put(topic, queue_id, messages))

    def dispatch(self) -> None:
        assert self.store is not None
        self.store.dispatcher.dispatch_all()

    def stop(self) -> None:
        assert self.store is not None
        self.run(self.store.stop())
        self.store = None

    def crash(self) -> None:
        assert self.store is not None
        self.store.abandon()
        self.run(asyncio.sleep(0))
        self.store = None

    def get(self, *args):
        assert self.store is not None
        return self.run(self.store.get_messages(*args))

    def close(self) -> None:
        if self.store is not None:
            self.stop()
        self.loop.close()


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path / "store")
    yield h
    h.close()


def read_all(h: Harness, topic: str, queue_id: int) -> list[record.Record]:
    out: list[record.Record] = []
    assert h.store is not None
    offset = h.store.queue_min_offset(topic, queue_id)
    while True:
        result = h.get(topic, queue_id, offset, 1000)
        if result.status is not GetStatus.FOUND:
            return out
        out.extend(result.records)
        offset = result.next_begin_offset


# ---------------------------------------------------------------- appends and reads


def test_put_assigns_queue_offsets_per_queue_and_reads_back(harness):
    store = harness.open()
    results = [harness.put("T", i % 2, [msg(body(i))]) for i in range(10)]
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(r.status is PutStatus.PUT_OK for r in results)
    harness.dispatch()
    got = read_all(harness, "T", 1)
    assert [r.body for r in got] == [body(i) for i in range(1, 10, 2)]
    assert [r.queue_offset for r in got] == [0, 1, 2, 3, 4]
    assert [r.commit_offset for r in got] == [results[i].commit_offsets[0] for i in range(1, 10, 2)]
    assert store.queue_max_offset("T", 1) == 5


def test_batch_is_contiguous_and_rolls_across_files(harness):
    store = harness.open()
    batch = [msg(body(i, 300)) for i in range(30)]  # ~12 KiB: three 4 KiB files
    result = harness.put("T", 0, batch)
    assert result.queue_offset == 0 and len(result.commit_offsets) == 30
    assert len(store.commit_log.segment_starts()) >= 3
    harness.dispatch()
    assert [r.body for r in read_all(harness, "T", 0)] == [m.body for m in batch]


def test_pull_statuses_and_next_offsets(harness):
    harness.open()
    for i in range(3):
        harness.put("T", 0, [msg(body(i))])
    harness.dispatch()
    assert harness.get("T", 0, 3, 10).status is GetStatus.NO_NEW_MSG
    illegal = harness.get("T", 0, 9, 10)
    assert (illegal.status, illegal.next_begin_offset, illegal.max_offset) == (
        GetStatus.OFFSET_ILLEGAL,
        3,
        3,
    )
    found = harness.get("T", 0, 1, 10)
    assert found.status is GetStatus.FOUND and found.next_begin_offset == 3
    assert harness.get("T", 5, 0, 10).status is GetStatus.NO_NEW_MSG
    # Apache's getFoundTps and getMissTps count reads: one found, three found nothing.
    assert harness.store.read_counts == (1, 3)


def test_tag_filter_skips_other_tags(harness):
    harness.open()
    for i in range(6):
        harness.put("T", 0, [msg(body(i), tags="a" if i % 3 == 0 else "b")])
    harness.dispatch()
    result = harness.get("T", 0, 0, 10, frozenset({record.tags_hash("a")}))
    assert [r.body for r in result.records] == [body(0), body(3)]
    assert result.next_begin_offset == 6
    none = harness.get("T", 0, 1, 2, frozenset({record.tags_hash("a")}))
    assert none.status is GetStatus.NO_MATCHED_MSG and none.next_begin_offset == 3
    assert harness.store.read_counts == (1, 1)  # a filter that matched nothing: a miss


def test_raw_reads_return_the_stored_bytes_and_keep_the_byte_budget(harness):
    store = harness.open()
    results = [
        harness.put("T", 0, [msg(body(i, 300), tags="a" if i % 2 else "b")]) for i in range(8)
    ]
    harness.dispatch()
    stored = [harness.run(store.record_bytes(r.commit_offsets[0])) for r in results]
    assert [record.decode(s).body for s in stored] == [body(i, 300) for i in range(8)]
    raw = harness.get("T", 0, 0, 32, frozenset({record.tags_hash("a")}), True)
    assert raw.status is GetStatus.FOUND and raw.records == []
    assert raw.raw == b"".join(stored[1::2]) and raw.raw_count == 4
    assert raw.last_commit_offset == results[7].commit_offsets[0]
    size = len(stored[0])
    capped = harness.get("T", 0, 0, 32, None, True, 2 * size + 10)
    assert capped.raw == b"".join(stored[:2]) and capped.next_begin_offset == 2
    assert harness.get("T", 0, 0, 32, None, True, 1).raw == stored[0]  # the first always fits


def test_record_bytes_only_where_a_record_starts(harness):
    store = harness.open()
    result = harness.put("T", 0, [msg(body(0))])
    at = result.commit_offsets[0]
    assert harness.run(store.record_bytes(at)) is not None
    for nowhere in (at + 4, result.end_offset, result.end_offset + 100, -1):
        assert harness.run(store.record_bytes(nowhere)) is None


async def long_poll_waiting(store: MessageStore, key: tuple[str, int]) -> None:
    """Until a long poll on `key` is waiting (a task's first step runs at the loop's
    next turn)."""
    await wait_for_async(lambda: store.long_polls.waiting_on(*key), 5,
                         f"a long poll waiting on {key}", interval_s=0)  # fmt: skip


def test_long_poll_returns_when_a_message_is_dispatched(harness):
    store = harness.open()

    async def scenario():
        waiter = asyncio.create_task(store.wait_for_messages("T", 0, 0, 10.0))
        await long_poll_waiting(store, ("T", 0))
        await store.put("T", 0, [msg(b"hello")])
        await asyncio.wait_for(waiter, 5.0)  # the dispatcher wakes it, long before 10 s
        return await store.get_messages("T", 0, 0, 10)

    result = harness.run(scenario())
    assert result.status is GetStatus.FOUND and result.records[0].body == b"hello"


def test_the_appends_of_one_loop_turn_are_dispatched_and_indexed_in_one_pass_after_it(harness):
    store = harness.open()
    harness.put("W", 0, [msg(b"warm")])  # the index makes its first file
    harness.run(wait_for_async(lambda: store.index.offset == store.max_offset, what="indexed"))
    passes = {"dispatch": 0, "index": 0}
    dispatch_some, build_some = store.dispatcher.dispatch_some, store.index.build_some

    def counted(name, step):
        def wrapper(*args, **kwargs):
            passes[name] += 1
            return step(*args, **kwargs)

        return wrapper

    store.dispatcher.dispatch_some = counted("dispatch", dispatch_some)
    store.index.build_some = counted("index", build_some)

    async def scenario():
        for queue_id in range(3):  # one turn, three appends
            store.append_sends("T", queue_id, [msg(body(queue_id))])
        before = [store.queue_max_offset("T", q) for q in range(3)]
        await asyncio.sleep(0)  # the next turn
        return before, [store.queue_max_offset("T", q) for q in range(3)]

    before, after = harness.run(scenario())
    assert before == [0, 0, 0] and after == [1, 1, 1]
    assert passes == {"dispatch": 1, "index": 1}
    assert store.index.offset == store.max_offset


def test_a_sync_masters_long_poll_waits_for_its_own_message_to_be_confirmed(harness):
    """With confirmed visibility (a SYNC_MASTER), a pull waiting at offset 1 returns only
    once the message at offset 1 is confirmed: not when a later one is dispatched, and
    not when the confirm offset moves past offset 0 alone (it would read nothing there,
    answer NOT_FOUND and come straight back)."""
    confirmed = [0]
    store = MessageStore(config(harness.root), FakeClock(), confirmed=lambda: confirmed[0])
    harness.store = store
    store.open()
    harness.run(store.start())

    async def scenario():
        results = [await store.put("T", 0, [msg(body(i))]) for i in range(3)]
        store.dispatcher.dispatch_all()
        confirmed[0] = results[0].end_offset  # offset 0 visible, 1 and 2 not
        assert (await store.get_messages("T", 0, 1, 10)).status is GetStatus.NO_NEW_MSG
        waiter = asyncio.create_task(store.wait_for_messages("T", 0, 1, 10.0))
        await long_poll_waiting(store, ("T", 0))
        store.notify_confirmed()  # what HA calls when the confirm offset moves
        # Woken, it looks again, finds offset 1 unconfirmed and waits again.
        await wait_for_async(lambda: store.long_polls.waiting_on("T", 0) == 1 or waiter.done(), 5,
                             "the pull to look again", interval_s=0)  # fmt: skip
        assert not waiter.done(), "woken while the message at offset 1 is unconfirmed"
        confirmed[0] = results[1].end_offset
        store.notify_confirmed()
        await asyncio.wait_for(waiter, 5.0)
        return await store.get_messages("T", 0, 1, 10)

    result = harness.run(scenario())
    assert result.status is GetStatus.FOUND and [r.queue_offset for r in result.records] == [1]


def test_a_sync_masters_dispatch_wakes_a_long_poll_when_its_ack_came_first(harness):
    """A SYNC_MASTER's dispatcher wakes no pull for records none of which is confirmed
    (the ack's notify_confirmed will), but records the slave confirmed before they were
    dispatched wake their pulls at dispatch: no ack is coming for them."""
    confirmed = [0]
    store = MessageStore(config(harness.root), FakeClock(), confirmed=lambda: confirmed[0])
    harness.store = store
    store.open()
    harness.run(store.start())

    woken: list[tuple[str, int]] = []  # every queue whose long polls were woken
    notify = store.long_polls.notify

    def spy(keys):
        keys = list(keys)
        woken.extend(keys)
        notify(keys)

    store.long_polls.notify = spy

    async def dispatched(end: int) -> None:
        await wait_for_async(lambda: store.dispatcher.offset >= end, 5,
                             f"the dispatcher to reach {end}", interval_s=0)  # fmt: skip

    async def scenario():
        waiter = asyncio.create_task(store.wait_for_messages("T", 0, 0, 10.0))
        await long_poll_waiting(store, ("T", 0))
        first = store.append_sends("T", 0, [msg(b"one")])
        await asyncio.wait_for(dispatched(first.end_offset), 5.0)
        # Nothing confirmed yet: the dispatch woke no one.
        assert woken == [] and not waiter.done()
        confirmed[0] = first.end_offset
        store.notify_confirmed()  # the ack: it wakes the pull
        await asyncio.wait_for(waiter, 5.0)
        woken.clear()
        waiter = asyncio.create_task(store.wait_for_messages("T", 0, 1, 10.0))
        await long_poll_waiting(store, ("T", 0))
        second = store.append_sends("T", 0, [msg(b"two")])
        confirmed[0] = second.end_offset  # acked before the dispatcher ran, nothing after
        await asyncio.wait_for(dispatched(second.end_offset), 5.0)
        # The dispatch step itself woke it (not the long poll's 1 s re-check).
        assert woken == [("T", 0)], "the dispatch did not wake the pull"
        await asyncio.wait_for(waiter, 5.0)
        return await store.get_messages("T", 0, 1, 10)

    result = harness.run(scenario())
    assert result.status is GetStatus.FOUND and [r.body for r in result.records] == [b"two"]


def test_a_long_poll_woken_by_the_stop_reads_nothing_from_the_closed_store(harness):
    # Not "no such queue" (OFFSET_ILLEGAL at 0, which a consumer would take as its new
    # offset): the store says it is closed.
    store = harness.open()

    async def scenario():
        await store.put("T", 0, [msg(b"one"), msg(b"two")])
        store.dispatcher.dispatch_all()
        waiter = asyncio.create_task(store.wait_for_messages("T", 0, 2, 10.0))
        await long_poll_waiting(store, ("T", 0))
        await store.stop()
        await asyncio.wait_for(waiter, 5.0)
        with pytest.raises(Unavailable, match="stopping"):
            await store.get_messages("T", 0, 2, 10)

    harness.run(scenario())
    harness.store = None


# ---------------------------------------------------------------- flushing


def test_sync_flush_shares_fsyncs_between_concurrent_sends(tmp_path, monkeypatch):
    calls = []
    real = flush_module.sync_fds

    def counting(fds):
        calls.append(len(fds))
        real(fds)

    monkeypatch.setattr(flush_module, "sync_fds", counting)
    h = Harness(tmp_path / "s", flush_disk_type=FlushDiskType.SYNC_FLUSH, flush_interval_s=30)
    store = h.open()

    async def scenario():
        return await asyncio.gather(*(store.put("T", 0, [msg(body(i))]) for i in range(50)))

    results = h.run(scenario())
    assert all(r.status is PutStatus.PUT_OK for r in results)
    assert store.flushed_offset >= max(r.end_offset for r in results)
    assert 1 <= len(calls) < 50  # group commit: far fewer fsyncs than sends
    h.close()


def test_sync_flush_timeout_reports_flush_disk_timeout_and_keeps_the_message(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(flush_module, "sync_fds", lambda fds: time.sleep(0.5))
    h = Harness(
        tmp_path / "s",
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        sync_flush_timeout_s=0.05,
        flush_interval_s=30,
    )
    h.open()
    result = h.put("T", 0, [msg(b"slow disk")])
    assert result.status is PutStatus.FLUSH_DISK_TIMEOUT
    h.dispatch()
    assert read_all(h, "T", 0)[0].body == b"slow disk"
    h.close()


# ---------------------------------------------------------------- recovery


def test_clean_restart_keeps_everything_and_continues_offsets(harness):
    harness.open()
    for i in range(20):
        harness.put("T", i % 3, [msg(body(i))])
    end = harness.store.max_offset
    harness.stop()
    assert not (harness.root / "abort").exists()
    harness.open()
    assert harness.report.crashed is False and harness.report.end_offset == end
    assert harness.put("T", 0, [msg(b"next")]).queue_offset == 7
    harness.dispatch()
    assert [r.body for r in read_all(harness, "T", 1)] == [body(i) for i in range(1, 20, 3)]


def test_crash_recovery_keeps_every_written_record(harness):
    harness.open()
    results = [harness.put("T", i % 2, [msg(body(i, 200))]) for i in range(60)]
    harness.crash()
    assert (harness.root / "abort").exists()
    harness.open()
    assert harness.report.crashed is True
    assert harness.report.end_offset == results[-1].end_offset
    got = read_all(harness, "T", 0) + read_all(harness, "T", 1)
    assert sorted(r.body for r in got) == sorted(body(i, 200) for i in range(60))


def test_missing_consume_queues_are_rebuilt(harness):
    harness.open()
    for i in range(30):
        harness.put("T", i % 4, [msg(body(i, 150))])
    harness.stop()
    shutil.rmtree(harness.root / "consumequeue")
    harness.open()
    assert harness.report.consume_queues_rebuilt is True
    for q in range(4):
        assert [r.body for r in read_all(harness, "T", q)] == [
            body(i, 150) for i in range(q, 30, 4)
        ]
    assert harness.put("T", 0, [msg(b"x")]).queue_offset == 8


def _snapshot(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    copy_store(src, dst)


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path):
    """Cut the last record at each of its bytes (the rest of the file zeros, as
    a preallocated file holds): recovery keeps every earlier record, drops only
    the torn one, and the consume queues agree."""
    original = tmp_path / "original"
    h = Harness(original)
    h.open()
    results = [h.put("T", i % 2, [msg(body(i, 60), tags="t")]) for i in range(12)]
    h.crash()
    h.close()
    last = results[-1]
    start, end = last.commit_offsets[0], last.end_offset
    segment = original / "commitlog" / f"{start - start % FILE_SIZE:020d}"
    work = tmp_path / "work"
    for cut in range(start, end):
        _snapshot(original, work)
        path = work / "commitlog" / segment.name
        with open(path, "r+b") as f:
            f.seek(cut - int(segment.name))
            f.write(bytes(end - cut))
        h = Harness(work)
        store = h.open()
        assert store.max_offset == start, f"cut at {cut}"
        q0 = read_all(h, "T", 0)
        q1 = read_all(h, "T", 1)
        assert [r.body for r in q0] == [body(i, 60) for i in range(0, 12, 2)], f"cut at {cut}"
        assert [r.body for r in q1] == [body(i, 60) for i in range(1, 11, 2)], f"cut at {cut}"
        assert store.queue_max_offset("T", 1) == 5  # the torn record's entry is gone
        assert h.put("T", 1, [msg(b"again")]).queue_offset == 5
        h.close()


def test_torn_tail_with_the_file_itself_cut_short(tmp_path):
    h = Harness(tmp_path / "s")
    h.open()
    results = [h.put("T", 0, [msg(body(i, 100))]) for i in range(5)]
    h.crash()
    h.close()
    last = results[-1].commit_offsets[0]
    path = tmp_path / "s" / "commitlog" / f"{0:020d}"
    os.truncate(path, last + 30)
    h = Harness(tmp_path / "s")
    store = h.open()
    assert store.max_offset == last
    assert len(read_all(h, "T", 0)) == 4
    h.close()


def test_consume_queue_entries_past_the_recovered_end_are_dropped(tmp_path):
    h = Harness(tmp_path / "s")
    h.open()
    results = [h.put("T", 0, [msg(body(i, 100))]) for i in range(6)]
    h.dispatch()
    h.crash()
    h.close()
    cut = results[3].commit_offsets[0]
    path = tmp_path / "s" / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(cut + 10)
        f.write(b"\xff" * 4)  # damage record 3: it and everything after it go
        f.seek(results[4].commit_offsets[0])
        f.write(bytes(results[5].end_offset - results[4].commit_offsets[0]))
    h = Harness(tmp_path / "s")
    store = h.open()
    assert store.max_offset == cut
    assert h.report.cq_entries_dropped == 3
    assert store.queue_max_offset("T", 0) == 3
    cq_file = tmp_path / "s" / "consumequeue" / "T" / "0" / f"{0:020d}"
    assert cq_file.read_bytes()[3 * ENTRY_SIZE : 6 * ENTRY_SIZE] == bytes(3 * ENTRY_SIZE)
    h.close()


def test_damage_before_later_files_with_data_stops_startup_naming_file_and_offset(tmp_path):
    h = Harness(tmp_path / "s")
    h.open()
    results = [h.put("T", 0, [msg(body(i, 300))]) for i in range(40)]  # several files
    h.stop()
    h.close()
    victim = results[2].commit_offsets[0]
    assert victim < FILE_SIZE
    path = tmp_path / "s" / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(victim + 100)
        f.write(b"corrupt!")  # inside the body: the CRC no longer matches
    # Make the checkpoint point at the first file so the scan starts there.
    (tmp_path / "s" / "checkpoint").unlink()
    h = Harness(tmp_path / "s")
    with pytest.raises(
        RecoveryError, match=f"00000000000000000000 has an invalid record at offset {victim}"
    ):
        h.open()
    before = path.read_bytes()
    assert before[victim + 100 : victim + 108] == b"corrupt!"  # nothing was cut
    h.loop.close()


@pytest.mark.parametrize("how", ["crash", "copied"])
def test_a_last_file_that_is_exactly_full_reopens_and_the_next_append_starts_a_file(tmp_path, how):
    # A crash between the BLANK that closes a file and the creation of the
    # next one leaves a last file with no room left; so does a copy of a
    # master's first file given to a slave. Recovery ends at the file's end
    # and the next record starts the next file.
    h = Harness(tmp_path / "s")
    store = h.open()
    results = []
    while len(store.commit_log.segment_starts()) < 2:
        results.append(h.put("T", 0, [msg(body(len(results), 300))]))
    second = store.commit_log.segment_starts()[1]
    kept = [r for r in results if r.commit_offsets[0] < second]
    h.crash()
    h.close()
    first = tmp_path / "s" / "commitlog" / f"{0:020d}"
    if how == "crash":
        (tmp_path / "s" / "commitlog" / f"{second:020d}").unlink()
        root = tmp_path / "s"
    else:
        root = tmp_path / "copy"
        (root / "commitlog").mkdir(parents=True)
        shutil.copyfile(first, root / "commitlog" / first.name)
    h = Harness(root)
    store = h.open()
    assert store.max_offset == second
    h.dispatch()
    assert [r.body for r in read_all(h, "T", 0)] == [body(i, 300) for i in range(len(kept))]
    after = h.put("T", 0, [msg(b"next")])
    assert after.commit_offsets[0] == second
    assert store.commit_log.segment_starts() == [0, second]
    h.close()


# ---------------------------------------------------------------- SQL92-selected reads


def test_a_selected_read_looks_at_up_to_800_entries_in_batches(harness):
    """A read with an SQL92 selector takes entries in growing batches until it has its
    messages or has looked at SELECTED_SCAN (800): a match at entry 700 is found from 0,
    one at 900 is not (the read ends at 800 with nothing, and the next one from there
    finds it); a read that has its count stops where it is."""
    from ferry.sql92 import compile_selector
    from services.broker.store.reads import SELECTED_SCAN

    harness.open()
    for i in range(1000):
        props = record.encode_properties({"a": str(i), "TAGS": "T" if i % 2 else "U"})
        harness.put("T", 0, [MessageIn(body=body(i), properties=props)])
    harness.dispatch()

    def get(text: str, offset: int, count: int, **kw):
        return harness.get("T", 0, offset, count, None, kw.get("raw", False), None,
                           compile_selector(text))  # fmt: skip

    found = get("a = '700'", 0, 32)
    assert found.status is GetStatus.FOUND and [r.body for r in found.records] == [body(700)]
    assert found.next_begin_offset == SELECTED_SCAN
    missed = get("a = '900'", 0, 32)
    assert not missed.records and missed.next_begin_offset == SELECTED_SCAN
    assert [r.body for r in get("a = '900'", SELECTED_SCAN, 32).records] == [body(900)]
    some = get("a IN ('1', '5', '9', '300')", 0, 3)
    assert [r.body for r in some.records] == [body(1), body(5), body(9)]
    assert some.next_begin_offset == 10
    raw = get("a > 995", SELECTED_SCAN, 32, raw=True)
    assert raw.raw_count == 4 and raw.next_begin_offset == 1000
    # With tags: entries of other tags are passed over unread.
    tagged = harness.run(
        harness.store.get_messages(
            "T", 0, 0, 2, frozenset({record.tags_hash("T")}), False, None,
            compile_selector("a > 10"),
        )
    )  # fmt: skip
    assert [r.body for r in tagged.records] == [body(11), body(13)]
    assert tagged.next_begin_offset == 14
