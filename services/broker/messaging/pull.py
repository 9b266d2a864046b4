"""The pull and offsets use cases: a consumer's pull (RocketMQ's
PullMessageProcessor: checks, tag filters, long polling, which broker to pull
from next) and what a consumer or an admin asks of a queue without consuming
it (min/max offsets, offsets by time, the earliest store time, a record by its
commit offset, lookups by key).

Reads only: must never append, commit an offset (the door does, when a pull
asks it to: `on_checked`) or learn which door a request came through.

Runs on the event loop thread, like the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferry.model import MASTER_ID, check_name, check_topic
from ferry.runtime.errors import InvalidArgument, NotFound
from services.broker.messaging.access import BrokerAccess
from services.broker.messaging.contracts import LookupObserver
from services.broker.messaging.filters import TAG, Filters
from services.broker.messaging.rules import GroupLookup
from services.broker.messaging.stats import TrafficStats
from services.broker.store import GetResult, GetStatus, KeyLookup, MessageStore

DEFAULT_PULL_NUMS = 32
MAX_PULL_NUMS = 4096
MAX_WAIT_MS = 60_000
# Messages one lookup by key returns at most (RocketMQ's maxMsgsNumBatch), and by
# unique key (its defaultQueryMaxNum).
MAX_QUERY_NUM = 64
UNIQUE_QUERY_NUM = 32


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def hot_bytes_of(ratio_percent: int) -> int:
    """RocketMQ's accessMessageInMemoryMaxRatio as bytes: how far behind the
    commit log's end a message still counts as in memory (that share of RAM)."""
    return _ram_bytes() * ratio_percent // 100


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class PullOutcome:
    result: GetResult
    suggest_which_broker_id: int = 0


class PullService:
    def __init__(
        self,
        store: MessageStore,
        access: BrokerAccess,
        groups: GroupLookup | None = None,
        lookups: LookupObserver | None = None,
        slave_read_enable: bool = False,
        hot_bytes: int | None = None,
        filters: Filters | None = None,
    ) -> None:
        """`groups`: the consumer groups' configs (which broker a slow
        consumer is sent to); `lookups` (metrics): the time of each lookup by
        key; `filters`: the broker's compiled subscriptions (enablePropertyFilter)."""
        self.store = store
        self.filters = filters if filters is not None else Filters()
        self.access = access
        # Rates for RocketMQ's statistics codes (sampled by the app's task).
        self.stats = TrafficStats(
            time.monotonic,
            lambda: (store.put_message_count, store.get_message_count),
            lambda: store.read_counts,
        )
        self.groups = groups
        self.lookups = lookups
        self.slave_read_enable = slave_read_enable
        # RocketMQ's accessMessageInMemoryMaxRatio: a consumer further behind
        # than 40% of RAM reads from disk, and is sent to a slave if allowed.
        self.hot_bytes = hot_bytes if hot_bytes is not None else hot_bytes_of(40)

    async def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_nums: int,
        max_wait_ms: int,
        sub_expression: str = "",
        *,
        expression_type: str = TAG,
        raw: bool = False,
        max_count: int = MAX_PULL_NUMS,
        max_bytes: int | None = None,
        on_checked: Callable[[], None] | None = None,
    ) -> PullOutcome:
        """Up to `max_nums` messages (at most `max_count`, and `max_bytes`
        when given) of a queue from `queue_offset`, waiting up to
        `max_wait_ms` for one when there is none yet; `sub_expression` of
        `expression_type` (TAG or SQL92: `Filters.build`) says which. `raw`: the records'
        bytes as stored (RocketMQ's pull body), not decoded. `on_checked`:
        called once the request has passed every check, before any read or
        wait (RocketMQ's pull commits the consumer's offset there)."""
        check_name(group, "consumer_group")
        access = self.access
        config = access.readable_topic(topic)
        access.check_queue(config, queue_id)
        if queue_offset < 0:
            raise InvalidArgument("queue_offset", f"{queue_offset} is negative")
        if max_nums < 0:
            raise InvalidArgument("max_msg_nums", f"{max_nums} is negative")
        if max_wait_ms < 0:
            raise InvalidArgument("max_wait_ms", f"{max_wait_ms} is negative")
        chosen = self.filters.build(sub_expression, expression_type)
        tag_hashes, selector = chosen.tag_hashes, chosen.selector
        if on_checked is not None:
            on_checked()
        count = min(max_nums or DEFAULT_PULL_NUMS, max_count, MAX_PULL_NUMS)
        get = self.store.get_messages
        result = await get(
            topic, queue_id, queue_offset, count, tag_hashes, raw, max_bytes, selector
        )
        if result.status is GetStatus.NO_NEW_MSG and max_wait_ms > 0:
            await self.store.wait_for_messages(
                topic, queue_id, queue_offset, min(max_wait_ms, MAX_WAIT_MS) / 1000
            )
            result = await get(
                topic, queue_id, queue_offset, count, tag_hashes, raw, max_bytes, selector
            )
        found = result.raw_count if raw else len(result.records)
        if found:
            self.stats.got(group, topic, found)
        return PullOutcome(result, self._suggest(group, result))

    def _suggest(self, group: str, result: GetResult) -> int:
        """Which broker id the consumer should pull from next (RocketMQ's
        suggestWhichBrokerId): the master unless slaves may serve reads; then
        the group's `whichBrokerWhenConsumeSlowly` when it reads cold data,
        else its `brokerId`."""
        if not self.slave_read_enable:
            return MASTER_ID
        config = self.groups.get(group) if self.groups is not None else None
        slow_id = config.which_broker_when_consume_slowly if config else 1
        normal_id = config.broker_id if config else MASTER_ID
        if result.last_commit_offset >= 0:
            behind = self.store.max_offset - result.last_commit_offset
            if behind > self.hot_bytes:
                return slow_id
        return normal_id

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets of one queue."""
        self.access.known_queue(topic, queue_id)
        return self.store.queue_min_offset(topic, queue_id), self.store.queue_max_offset(
            topic, queue_id
        )

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, upper: bool = False
    ) -> int:
        """The queue offset of the first message stored at or after
        `timestamp_ms` (the max offset when there is none); with `upper`, of the
        last one stored at or before it (the min offset when there is none)."""
        self.access.known_queue(topic, queue_id)
        return await self.store.offset_by_time(topic, queue_id, timestamp_ms, upper)

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """When the queue's oldest message still kept was stored (epoch ms), −1
        for an empty queue."""
        self.access.known_queue(topic, queue_id)
        return await self.store.earliest_store_time(topic, queue_id)

    async def stored_record(self, commit_offset: int) -> bytes:
        """The record that starts at `commit_offset`, as stored (RocketMQ's
        view by offset message id), if consumers may see it.

        Raises:
            InvalidArgument: a negative offset.
            NotFound: no record starts there, or retention deleted it.
        """
        if commit_offset < 0:
            raise InvalidArgument("offset", f"{commit_offset} is negative")
        data = await self.store.record_bytes(commit_offset)
        if data is None:
            raise NotFound(
                f"no message starts at commit offset {commit_offset} on broker "
                f"{self.access.broker_name} (the commit log holds "
                f"[{self.store.min_offset}, {self.store.confirm_offset})); it may have been "
                "deleted by retention, or the message id names another broker"
            )
        return data

    async def find_by_key(
        self,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        unique: bool = False,
    ) -> KeyLookup:
        """Messages of `topic` by key (RocketMQ's queryMsgByKey: one of their KEYS) or,
        with `unique`, by unique key (UNIQ_KEY, the producer's message id), stored in
        [begin_ms, end_ms]: the newest `max_num` (at most MAX_QUERY_NUM) the message
        index finds, in commit-offset order. A topic deleted since still answers.

        Raises:
            InvalidArgument: a bad topic name, an empty key, `max_num` below 1 or a
                time range that ends before it begins.
            FailedPrecondition: the broker's message index is off.
        """
        check_topic(topic)
        if not key:
            raise InvalidArgument("key", "is empty")
        if max_num < 1:
            raise InvalidArgument("max_num", f"{max_num} is below 1")
        if end_ms < begin_ms:
            raise InvalidArgument("end_timestamp", f"{end_ms} is before the begin {begin_ms}")
        started = time.monotonic()
        found = await self.store.find_by_key(
            topic, key, min(max_num, MAX_QUERY_NUM), begin_ms, end_ms, unique
        )
        if self.lookups is not None:
            self.lookups.observe_lookup(time.monotonic() - started)
        return found
