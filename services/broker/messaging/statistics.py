"""The figures operators read about a broker, computed once for every door: what
`mqadmin brokerStatus`, `topicStatus` and `consumerProgress` print (RocketMQ's codes
28, 202 and 208, services.broker.remoting.admin), what ferry.v1's GetBrokerRuntimeInfo
answers (services.broker.api.servicer) and so what `ferry runtime` shows.

Owns: StatisticsService and the plain dataclasses it answers with — RuntimeInfo
(ferry.v1's BrokerRuntimeInfo fields), BrokerFigures (the rest of RocketMQ's runtime
table), QueueStats (a topic's queue), ConsumeStats and GroupQueueStats (a group's
progress), BrokerConsumeStats (every group's, code 317) and QueueEntries (a slice
of one consume queue, code 321) — read from the store, the metadata tables and the traffic rates
(messaging/stats.py's TrafficStats, sampled by the app's task). Rates are those of
the same windows on every door: ferry.v1's put_tps and get_tps are the first (10 s)
of the RocketMQ door's putTps and getTransferedTps.

Must never: change the store or the tables (it reads them; `forget_group` only drops
a deleted group's rates); render a wire format (JSON keys, RocketMQ's "a b c" rates
and byte counts, protobuf: the doors do); learn which door asked. Runs on the
event-loop thread, which owns the store and tables it reads; the only I/O is one
statfs of the store's disk and the store's own async reads of records and store
times.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Protocol

from ferry import __version__, record
from ferry.runtime import errors
from ferry.runtime.clock import Clock
from services.broker.messaging.clients import ClientTables
from services.broker.messaging.stats import WINDOWS_S, StatsWindow, TrafficStats
from services.broker.store import MessageStore


class BrokerIdentity(Protocol):
    """Who this broker is and what it allows (AdminService)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    role: str  # this run's: with failover, the role of the run, not of broker.conf
    started_ms: int
    master_addr: str  # on a slave, as the name servers report it

    @property
    def permission(self) -> int: ...


@dataclass(frozen=True)
class RuntimeInfo:
    broker_role: str
    cluster_name: str
    broker_name: str
    broker_id: int
    commit_log_min_offset: int
    commit_log_max_offset: int
    confirm_offset: int
    dispatch_behind_bytes: int
    put_tps: float
    get_tps: float
    topic_count: int
    flush_disk_type: str
    broker_permission: int
    start_timestamp: int
    version: str
    master_addr: str
    table: dict[str, str]


@dataclass(frozen=True)
class BrokerFigures:
    """RuntimeInfo and the further figures of RocketMQ's runtime table."""

    info: RuntimeInfo
    uptime_ms: int  # since the broker started, by the injected clock
    put_tps: tuple[float, ...]  # messages stored per second over each of WINDOWS_S
    get_tps: tuple[float, ...]  # messages handed to consumers, likewise
    found_tps: tuple[float, ...]  # reads that found messages, likewise (getFoundTps)
    missed_tps: tuple[float, ...]  # reads that found none, likewise (getMissTps)
    put_total: int  # messages stored since the store opened
    get_total: int  # messages handed to consumers since then
    unflushed_bytes: int  # commit log written and not yet flushed
    earliest_message_ms: int  # store time of the commit log's first kept record; −1: none
    disk_used_ratio: float  # the retention's: blocks in use over all blocks
    disk_total_bytes: int
    disk_free_bytes: int


@dataclass(frozen=True)
class QueueStats:
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int  # store time of the queue's newest message; 0: none


@dataclass(frozen=True)
class GroupQueueStats:
    topic: str
    queue_id: int
    broker_offset: int  # the queue's max offset
    consumer_offset: int  # the group's committed offset (0 for none)
    last_timestamp_ms: int  # store time of the last message consumed; 0: none


@dataclass(frozen=True)
class ConsumeStats:
    queues: tuple[GroupQueueStats, ...]
    consume_tps: float  # messages the group took per second over the last minute


@dataclass(frozen=True)
class BrokerConsumeStats:
    """Every subscription group's progress on this broker (`mqadmin brokerConsumeStats`):
    per group, one ConsumeStats per topic it has offsets in, each over the topic's write
    queues."""

    groups: tuple[tuple[str, tuple[ConsumeStats, ...]], ...]

    @property
    def total_diff(self) -> int:
        return sum(
            q.broker_offset - q.consumer_offset
            for _, stats in self.groups
            for one in stats
            for q in one.queues
        )


@dataclass(frozen=True)
class QueueEntries:
    """A slice of one consume queue (`mqadmin queryCq`): its offsets and, from the
    asked index, its entries as (commit offset, size, tag hash) in queue order."""

    min_offset: int
    max_offset: int
    entries: tuple[tuple[int, int, int], ...]


class StatisticsService:
    def __init__(
        self,
        store: MessageStore,
        metadata,  # services.broker.metadata.BrokerMetadata
        traffic: TrafficStats,
        broker: BrokerIdentity,
        clock: Clock,
        flush_disk_type: str,
        disk_path: str | os.PathLike[str],
    ) -> None:
        """`disk_path`: a directory on the disk the store is on (storePathRootDir),
        whose size and free space the runtime table reports."""
        self.store = store
        self.metadata = metadata
        self.traffic = traffic
        self.broker = broker
        self.clock = clock
        self.flush_disk_type = flush_disk_type
        self.disk_path = disk_path

    # ------------------------------------------------------------ the broker

    def runtime_info(self) -> RuntimeInfo:
        store = self.store
        broker = self.broker
        topics, _ = self.metadata.topics.snapshot()
        return RuntimeInfo(
            broker_role=broker.role,
            cluster_name=broker.cluster_name,
            broker_name=broker.broker_name,
            broker_id=broker.broker_id,
            commit_log_min_offset=store.min_offset,
            commit_log_max_offset=store.max_offset,
            confirm_offset=store.confirm_offset,
            dispatch_behind_bytes=store.dispatch_behind_bytes,
            put_tps=self.traffic.put_tps(WINDOWS_S[0]),
            get_tps=self.traffic.got_tps(WINDOWS_S[0]),
            topic_count=len(topics),
            flush_disk_type=self.flush_disk_type,
            broker_permission=broker.permission,
            start_timestamp=broker.started_ms,
            version=__version__,
            master_addr=broker.master_addr,
            table={
                "flushedOffset": str(store.flushed_offset),
                "dispatchedOffset": str(store.dispatched_offset),
                "putMessageTotal": str(store.put_message_count),
                "getMessageTotal": str(store.get_message_count),
                "commitLogFiles": str(store.commit_log_files),
                "consumeQueues": str(store.queue_count),
                **self._retention_table(),
            },
        )

    def _retention_table(self) -> dict[str, str]:
        """Disk use and the retention settings, as broker.conf writes them
        (fileReservedTime in hours, ratios in percent)."""
        retention = self.store.retention_status()
        cfg = retention.config
        return {
            "diskUsedRatio": f"{retention.disk_used_ratio * 100:.1f}%",
            "fileReservedTime": f"{cfg.file_reserved_time_s / 3600:g}h",
            "deleteWhen": ";".join(f"{h:02d}" for h in cfg.delete_when_hours),
            "diskMaxUsedSpaceRatio": f"{cfg.disk_max_used_space_ratio * 100:g}%",
            "diskSpaceCleanForciblyRatio": f"{cfg.disk_space_clean_forcibly_ratio * 100:g}%",
            "diskSpaceWarningLevelRatio": f"{cfg.disk_space_warning_level_ratio * 100:g}%",
            "cleanFileForciblyEnable": str(cfg.clean_file_forcibly_enable).lower(),
            "deletedCommitLogFiles": str(retention.deleted_files_total),
            "deletedConsumeQueueFiles": str(retention.deleted_queue_files_total),
            "sendsRefusedDiskFull": str(retention.disk_full).lower(),
        }

    async def broker_figures(self) -> BrokerFigures:
        """RuntimeInfo with the rest of what RocketMQ's runtime table reports."""
        store = self.store
        info = self.runtime_info()
        disk = shutil.disk_usage(self.disk_path)
        return BrokerFigures(
            info=info,
            uptime_ms=self.clock.wall_ms() - info.start_timestamp,
            put_tps=tuple(self.traffic.put_tps(w) for w in WINDOWS_S),
            get_tps=tuple(self.traffic.got_tps(w) for w in WINDOWS_S),
            found_tps=tuple(self.traffic.found_tps(w) for w in WINDOWS_S),
            missed_tps=tuple(self.traffic.missed_tps(w) for w in WINDOWS_S),
            put_total=store.put_message_count,
            get_total=store.get_message_count,
            unflushed_bytes=max(0, store.max_offset - store.flushed_offset),
            earliest_message_ms=await self.earliest_message_time(),
            disk_used_ratio=store.retention_status().disk_used_ratio,
            disk_total_bytes=disk.total,
            disk_free_bytes=disk.free,
        )

    async def earliest_message_time(self) -> int:
        """The store time of the commit log's first kept record; −1 for none."""
        store = self.store
        if store.min_offset >= store.confirm_offset:
            return -1
        try:
            data = await store.record_bytes(store.min_offset)
        except errors.FerryError:
            return -1
        if data is None:
            return -1
        try:
            return record.store_timestamp(data)
        except record.RecordError:
            return -1

    # ------------------------------------------------------------ topics and groups

    def forget_group(self, group: str) -> None:
        """A deleted group's consume rates go with it."""
        self.traffic.forget_group(group)

    def stats_item(self, name: str, key: str) -> dict[str, StatsWindow] | None:
        """One of Apache's broker stats items (TOPIC_PUT_NUMS by topic,
        GROUP_GET_NUMS by `topic@group`): its minute, hour and day; None when
        it never counted anything (stats.py's `StatsItems`)."""
        return self.traffic.stats_item(name, key)

    async def topic_stats(self, topic: str) -> list[QueueStats] | None:
        """Each write queue of `topic`; None when the topic does not exist here."""
        config = self.metadata.topics.get(topic)
        if config is None:
            return None
        store = self.store
        out = []
        for queue_id in range(config.write_queue_nums):
            low = store.queue_min_offset(topic, queue_id)
            high = store.queue_max_offset(topic, queue_id)
            last = await store.store_time_at(topic, queue_id, high - 1) if high > 0 else 0
            out.append(QueueStats(queue_id, low, high, max(last, 0)))
        return out

    async def consume_stats(
        self, group: str, topic: str = "", online: ClientTables | None = None
    ) -> ConsumeStats:
        """`group`'s progress in each read queue of `topic` (empty: of every topic
        it has committed offsets in). With consumers of the group `online` that
        announced subscriptions, only the topics they read count."""
        topics = [topic] if topic else self.metadata.consumer_offsets.topics_of(group)
        queues: list[GroupQueueStats] = []
        tps = 0.0
        for name in topics:
            config = self.metadata.topics.get(name)
            if config is None or not self._reads(group, name, online):
                continue
            queues += await self._progress(group, name, config.read_queue_nums)
            tps += self.traffic.group_tps(group, name)
        return ConsumeStats(tuple(queues), tps)

    async def broker_consume_stats(
        self, order_only: bool, online: ClientTables | None = None
    ) -> BrokerConsumeStats:
        """Every subscription group's progress, topic by topic, over each topic's
        write queues (Apache's GET_BROKER_CONSUME_STATS); `order_only`: orderly
        topics only. A topic an online group does not subscribe to is left out."""
        groups, _ = self.metadata.subscription_groups.snapshot()
        out = []
        for group in sorted(groups):
            per_topic = []
            for name in self.metadata.consumer_offsets.topics_of(group):
                config = self.metadata.topics.get(name)
                if config is None or (order_only and not config.order):
                    continue
                if not self._reads(group, name, online):
                    continue
                queues = await self._progress(group, name, config.write_queue_nums)
                per_topic.append(ConsumeStats(tuple(queues), self.traffic.group_tps(group, name)))
            out.append((group, tuple(per_topic)))
        return BrokerConsumeStats(tuple(out))

    def queue_entries(
        self, topic: str, queue_id: int, index: int, count: int
    ) -> QueueEntries | None:
        """Up to `count` entries of one consume queue from queue offset `index`
        (none when `index` is outside the queue); None for a queue the topic does
        not have. A queue never written reads as empty."""
        config = self.metadata.topics.get(topic)
        if config is None or not 0 <= queue_id < config.queue_nums:
            return None
        view = self.store.queue_view(topic, queue_id)
        if view is None:
            return QueueEntries(0, 0, ())
        low, high = view.min_offset, view.max_offset
        found: list[tuple[int, int, int]] = []
        at, end = index, min(high, index + max(count, 0))
        while low <= at < end:
            batch = view.entries(at, end - at)  # within one file: a few reads at most
            if not batch:
                break
            found += batch
            at += len(batch)
        return QueueEntries(low, high, tuple(found))

    def _reads(self, group: str, topic: str, online: ClientTables | None) -> bool:
        """Whether `topic` counts for `group`: always, unless the group's online
        consumers announced subscriptions and none of them is to `topic`."""
        if online is None or not any(m.subscriptions for m in online.consumers(group)):
            return True
        return online.subscription(group, topic) is not None

    async def _progress(self, group: str, topic: str, queue_nums: int) -> list[GroupQueueStats]:
        offsets = self.metadata.consumer_offsets
        store = self.store
        queues = []
        for queue_id in range(queue_nums):
            broker_offset = store.queue_max_offset(topic, queue_id)
            consumer_offset = max(offsets.query(group, topic, queue_id) or 0, 0)
            last = 0
            if consumer_offset > 0:
                last = max(await store.store_time_at(topic, queue_id, consumer_offset - 1), 0)
            queues.append(GroupQueueStats(topic, queue_id, broker_offset, consumer_offset, last))
        return queues
