"""The metadata log (failover): topic and group changes as commit-log records
that a follower applies from its copy of the log, snapshots that never undo
an applied change, topics restored from their messages, and a record decoder
that distrusts its bytes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.model import SubscriptionGroupConfig, TopicConfig
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import NotFound, Unavailable
from services.broker.metadata.metadata_log import (
    GROUPS_QUEUE,
    METADATA_TOPIC,
    TOPICS_QUEUE,
    MetadataLog,
    MetadataRecordError,
    decode_change,
    encode_change,
)
from services.broker.metadata.tables import BrokerMetadata
from services.broker.store import MessageIn, MessageStore, StoreConfig


class Member:
    """One broker's store, tables and metadata log, on real files."""

    def __init__(self, root: Path, replicate=None, fence=None) -> None:
        self.root = root
        self.replicate, self.fence = replicate, fence

    async def open(self) -> Member:
        cfg = StoreConfig(root=self.root / "store", commit_log_file_size=1 << 20)
        self.store = MessageStore(cfg, FakeClock())
        await asyncio.to_thread(self.store.open)
        await self.store.start()
        self.metadata = BrokerMetadata.open(self.root / "config", FakeClock())
        self.log = MetadataLog(
            self.store, self.metadata, self.root / "config", FakeClock(), self.replicate,
            self.fence,
        )  # fmt: skip
        self.log.open()
        return self

    async def close(self) -> None:
        await self.store.stop()

    def copy_from(self, other: Member) -> None:
        """What HA does: the other's log bytes past ours, appended as they are."""
        start, end = self.store.max_offset, other.store.max_offset
        self.store.append_replicated(start, other.store.commit_log.read(start, end - start))

    def tables(self) -> tuple[dict, dict]:
        return self.metadata.topics.snapshot()[0], self.metadata.subscription_groups.snapshot()[0]


def run(coro):
    return asyncio.run(coro)


def test_a_follower_applies_the_masters_changes_in_order(tmp_path: Path) -> None:
    async def scenario():
        master = await Member(tmp_path / "m").open()
        follower = await Member(tmp_path / "f").open()
        await master.log.put_topic(TopicConfig("orders", 4, 4))
        await master.log.put_topic(TopicConfig("audit", 2, 2))
        await master.log.put_group(SubscriptionGroupConfig("billing"))
        await master.log.put_topic(TopicConfig("orders", 8, 8, perm=4))
        await master.log.delete_topic("audit")
        await master.log.put_group(SubscriptionGroupConfig("ledger", retry_max_times=3))
        await master.log.delete_group("billing")
        follower.copy_from(master)
        await follower.log.take_over()
        assert follower.tables() == master.tables()
        assert follower.metadata.topics.get("orders") == TopicConfig("orders", 8, 8, perm=4)
        assert follower.metadata.topics.get("audit") is None
        assert set(follower.tables()[1]) == {"ledger"}
        assert follower.log.position(TOPICS_QUEUE) == 4
        assert follower.log.position(GROUPS_QUEUE) == 3
        assert follower.log.table.deleted_topics == {"audit"}
        # Applied once: a second catch-up finds nothing new.
        assert await follower.log.catch_up() == 0
        await master.close()
        await follower.close()

    run(scenario())


def test_positions_survive_a_restart_and_a_cut_log_is_applied_again(tmp_path: Path) -> None:
    async def scenario():
        master = await Member(tmp_path / "m").open()
        await master.log.put_topic(TopicConfig("t1", 1, 1))
        await master.close()
        master = await Member(tmp_path / "m").open()
        assert master.log.position(TOPICS_QUEUE) == 1
        assert await master.log.catch_up() == 0
        cut = master.store.max_offset
        await master.log.put_topic(TopicConfig("t2", 1, 1))
        assert master.log.position(TOPICS_QUEUE) == 2
        # A follower's log cut at its leader's divergence point: the position
        # goes back with it, and the record written there again is applied.
        await master.store.truncate(cut)
        master.log.open()
        assert master.log.position(TOPICS_QUEUE) == 1
        await master.close()

    run(scenario())


def test_a_snapshot_older_than_the_applied_records_is_refused(tmp_path: Path) -> None:
    async def scenario():
        m = await Member(tmp_path / "m").open()
        await m.log.put_topic(TopicConfig("t1", 1, 1))
        await m.log.put_topic(TopicConfig("t2", 1, 1))
        assert not m.log.accept_snapshot(TOPICS_QUEUE, 1)
        assert m.log.accept_snapshot(TOPICS_QUEUE, 2)
        assert m.log.accept_snapshot(GROUPS_QUEUE, 0)
        await m.close()

    run(scenario())


def test_a_new_master_restores_topics_it_has_messages_for(tmp_path: Path) -> None:
    async def scenario():
        m = await Member(tmp_path / "m").open()
        one = [MessageIn(body=b"x", properties=b"")]
        m.store.append_own("legacy", 0, one)
        m.store.append_own("legacy", 5, one)
        m.store.append_own("%DLQ%g", 0, one)
        m.store.append_own("rmq_sys_wheel_timer", 0, one)
        await m.log.put_topic(TopicConfig("gone", 1, 1))
        m.store.append_own("gone", 0, one)
        await m.log.delete_topic("gone")
        # Recovery dispatching the deleted topic's record again must not revive it.
        m.store.append_own("gone", 0, one)
        await m.log.take_over()
        topics = m.metadata.topics
        assert topics.get("legacy") == TopicConfig("legacy", 6, 6, perm=6)
        assert topics.get("%DLQ%g") == TopicConfig("%DLQ%g", 1, 1, perm=6)
        assert topics.get("gone") is None
        assert topics.get("rmq_sys_wheel_timer") is None
        assert topics.get(METADATA_TOPIC) is None
        await m.close()

    run(scenario())


def test_a_change_the_in_sync_set_did_not_confirm_is_not_acknowledged(tmp_path: Path) -> None:
    async def refuse(result) -> bool:
        return False

    async def scenario():
        m = await Member(tmp_path / "m", replicate=refuse).open()
        with pytest.raises(Unavailable, match="in-sync replicas did not confirm"):
            await m.log.put_topic(TopicConfig("t1", 1, 1))
        # Applied and recorded all the same (a retry is idempotent).
        assert m.metadata.topics.get("t1") is not None
        assert m.log.position(TOPICS_QUEUE) == 1
        with pytest.raises(NotFound):
            await m.log.delete_group("nobody")
        await m.close()

    run(scenario())


def test_a_fenced_master_records_nothing(tmp_path: Path) -> None:
    class Fence:
        def check_accepting(self) -> None:
            raise Unavailable("lease expiring")

        def check_acknowledging(self) -> None:
            raise Unavailable("lease expired")

    async def scenario():
        m = await Member(tmp_path / "m", fence=Fence()).open()
        with pytest.raises(Unavailable):
            await m.log.put_topic(TopicConfig("t1", 1, 1))
        assert m.store.max_offset == 0
        assert m.metadata.topics.get("t1") is None
        await m.close()

    run(scenario())


def test_change_round_trip() -> None:
    topic = TopicConfig("orders", 3, 5, perm=4, order=True, attributes=(("k", "v"),))
    assert decode_change(TOPICS_QUEUE, encode_change(TOPICS_QUEUE, "put", topic)) == ("put", topic)
    group = SubscriptionGroupConfig("g", retry_max_times=2)
    assert decode_change(GROUPS_QUEUE, encode_change(GROUPS_QUEUE, "put", group)) == ("put", group)
    assert decode_change(GROUPS_QUEUE, encode_change(GROUPS_QUEUE, "delete", "g")) == (
        "delete",
        "g",
    )


@given(st.integers(min_value=-1, max_value=3), st.binary(max_size=200))
def test_random_bodies_only_raise_the_record_error(queue_id: int, body: bytes) -> None:
    with contextlib.suppress(MetadataRecordError):
        decode_change(queue_id, body)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                        max_size=3)))  # fmt: skip
def test_random_json_bodies_only_raise_the_record_error(doc) -> None:

    for wrapped in (doc, {"op": "put", "topic": doc}, {"op": "put", "group": doc}):
        for queue_id in (TOPICS_QUEUE, GROUPS_QUEUE):
            with contextlib.suppress(MetadataRecordError):
                decode_change(queue_id, json.dumps(wrapped).encode())
