"""The broker's administration use cases: topics, subscription groups, the
broker's permission, an on-demand retention pass. (The figures the broker reports
about itself are statistics.py's.)

Every change is persisted (by the metadata table) before the call returns,
and topic changes are registered with the name servers at once through the
`TopicAnnouncer` (the broker's registration), so a producer can use a topic as
soon as `ferry topic create` returns. A slave mirrors its master's tables and
refuses changes. With failover on, topic and group changes go through the
metadata log (metadata_log.py): recorded in the commit log and answered once
the in-sync set has them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

from ferry.model import (
    SCHEDULE_TOPIC,
    DataVersion,
    SubscriptionGroupConfig,
    TopicConfig,
    alter_attributes,
    check_perm,
    check_topic,
    order_brokers,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import InvalidArgument, PermissionDenied
from services.broker.messaging.access import BrokerPermission
from services.broker.messaging.contracts import TopicAnnouncer
from services.broker.metadata.metadata_log import MetadataLog
from services.broker.store import CleanResult, MessageStore

log = logging.getLogger(__name__)


class AdminService:
    def __init__(
        self,
        identity: tuple[str, str, int, str],  # cluster, broker name, broker id, role
        metadata,  # services.broker.metadata.BrokerMetadata
        store: MessageStore,
        clock: Clock,
        permission: BrokerPermission,
        announcer: TopicAnnouncer | None = None,
        journal: MetadataLog | None = None,
        allow_mixed_message_type: bool = False,
    ) -> None:
        """`announcer`: registers topic changes with the name servers (None:
        nobody is told). `journal`: a failover master's metadata log, through
        which topic and group changes go (replicated before they are
        acknowledged); None changes the tables directly. `allow_mixed_message_type`: topics may be
        created with `+message.type=MIXED` (enableMixedMessageType)."""
        self.journal = journal
        self.allow_mixed_message_type = allow_mixed_message_type
        self.cluster_name, self.broker_name, self.broker_id, self.role = identity
        self.metadata = metadata
        self.store = store
        self.clock = clock
        self._permission = permission  # shared with every check and report
        self.announcer = announcer
        self.started_ms = clock.wall_ms()
        self.master_addr = ""
        self._announcing: set[asyncio.Task] = set()

    @property
    def permission(self) -> int:
        return self._permission.get()

    def create_system_topic(self, config: TopicConfig) -> None:
        """A group's retry or dead-letter topic, created on first use (a send,
        a pop revival) and announced to the name servers (so `ferry consume
        %DLQ%group` finds it); messaging's `TopicCreator`. Put in the table
        directly, as RocketMQ creates them, not through the metadata log."""
        self.metadata.topics.put(config)
        log.info("created topic %s (%d queue)", config.topic_name, config.queue_nums)
        if self.announcer is not None:
            task = asyncio.get_running_loop().create_task(self.announcer.announce_topics([config]))
            self._announcing.add(task)
            task.add_done_callback(self._announced)

    async def create_own_topic(self, config: TopicConfig) -> None:
        """A group's retry or dead-letter topic that a consumer's heartbeat or
        send-back creates (messaging/sendback.py): put in the table directly,
        as RocketMQ creates it, not through the metadata log (a new master
        recreates it on use), and registered with the name servers before this
        returns. A heartbeat is answered only then, as Apache answers it after
        its registerBrokerAll: a consumer that looks the retry topic up after
        its heartbeats finds every master that has it. (Waiting for the
        metadata log's in-sync replicas here made a new group's heartbeat ~30 ms
        on a master; a consumer whose own notified rebalance looked up the
        route in that window missed a master's retry queue until its next
        route poll, 30 s later.)"""
        self._writable_tables()
        self.metadata.topics.put(config)
        log.info("created topic %s (%d queues)", config.topic_name, config.queue_nums)
        if self.announcer is not None:
            await self.announcer.announce_topics([config])

    def create_own_group(self, config: SubscriptionGroupConfig) -> None:
        """A consumer group met for the first time (autoCreateSubscriptionGroup):
        put in the table directly, as RocketMQ creates it, not through the
        metadata log (a new master recreates it on use)."""
        self._writable_tables()
        self.metadata.subscription_groups.put(config)

    async def create_auto_topic(self, config: TopicConfig) -> None:
        """A topic a RocketMQ producer's first send creates from its default
        topic (messaging/autocreate.py's `AutoTopicCreator`): persisted (with
        failover on, through the metadata log, replicated before the send goes
        on), then announced to the name servers without waiting."""
        self._writable_tables()
        if self.journal is not None:
            await self.journal.put_topic(config)
        else:
            self.metadata.topics.put(config)
        log.info(
            "created topic %s by its first send (%d queues, perm %d)",
            config.topic_name,
            config.queue_nums,
            config.perm,
        )
        if self.announcer is not None:
            task = asyncio.get_running_loop().create_task(self.announcer.announce_topics([config]))
            self._announcing.add(task)
            task.add_done_callback(self._announced)

    def _announced(self, task: asyncio.Task) -> None:
        self._announcing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not announce a new topic: %s", task.exception())

    def apply_order_topics(self, table: Mapping[str, str]) -> None:
        """ORDER_TOPIC_CONFIG from the name servers (topic ->
        "brokerName:queues;..."; the registrar's `OrderTopics`): a topic listed
        with this broker's name is an ordered topic here (every group reads it
        in order). Put in the table directly, not through the metadata log."""
        for topic, value in table.items():
            config = self.metadata.topics.get(topic)
            if self.broker_name in order_brokers(value) and config is not None and not config.order:
                self.metadata.topics.put(dataclasses.replace(config, order=True))
                log.info("topic %s is ordered (ORDER_TOPIC_CONFIG on the name server)", topic)

    def _writable_tables(self) -> None:
        if self.role == "SLAVE":
            raise PermissionDenied(
                f"broker {self.broker_name} here is a SLAVE: its topics and groups mirror its "
                "master's; change them on the master"
            )

    async def update_topic(self, config: TopicConfig) -> DataVersion:
        """Create a topic or replace its settings. Its attributes are not
        replaced but changed, as RocketMQ's are: `config.attributes` holds the
        changes (`+message.type`: `FIFO` sets the message type, `-message.type`
        removes it; see `ferry.model.alter_attributes`), and what the topic had
        and the request does not name stays."""
        self._writable_tables()
        check_topic(config.topic_name, "topic_config.topic_name")
        if config.topic_name == SCHEDULE_TOPIC:
            raise InvalidArgument("topic_config.topic_name", f"{SCHEDULE_TOPIC} is a system topic")
        current = self.metadata.topics.get(config.topic_name)
        attributes = alter_attributes(
            current.attributes if current is not None else (),
            dict(config.attributes),
            create=current is None,
            allow_mixed=self.allow_mixed_message_type,
        )
        config = dataclasses.replace(config, attributes=attributes)
        if self.journal is not None:
            version = await self.journal.put_topic(config)
        else:
            version = self.metadata.topics.put(config)
        log.info(
            "topic updated topic=%s read=%d write=%d perm=%d message_type=%s",
            config.topic_name,
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
            config.message_type,
        )
        if self.announcer is not None:
            await self.announcer.announce_topics(
                [self.metadata.topics.get(config.topic_name) or config]
            )
        return version

    async def delete_topic(self, topic: str) -> DataVersion:
        self._writable_tables()
        check_topic(topic)
        if topic == SCHEDULE_TOPIC:
            raise InvalidArgument("topic", f"{SCHEDULE_TOPIC} is a system topic")
        if self.journal is not None:
            version = await self.journal.delete_topic(topic)
        else:
            version = self.metadata.topics.delete(topic)
            self.store.delete_topic(topic)
            self.metadata.consumer_offsets.remove_topic(topic)
        log.info("topic deleted topic=%s", topic)
        if self.announcer is not None:
            await self.announcer.announce_all()
        return version

    async def update_group(self, config: SubscriptionGroupConfig) -> DataVersion:
        self._writable_tables()
        if self.journal is not None:
            return await self.journal.put_group(config)
        return self.metadata.subscription_groups.put(config)

    async def delete_group(self, group: str) -> DataVersion:
        self._writable_tables()
        if self.journal is not None:
            return await self.journal.delete_group(group)
        version = self.metadata.subscription_groups.delete(group)
        self.metadata.consumer_offsets.remove_group(group)
        return version

    async def update_permission(self, perm: int) -> tuple[int, int]:
        """Set brokerPermission, on a master or a slave (each keeps its own).

        The new value is persisted in `config/broker.json` (fsynced) before it
        takes effect and before this returns, and wins over broker.conf at the
        next start. A bad value or a failed write (of `broker.json`, or of the
        topics' DataVersion bump that comes first) leaves the permission as it
        was. Then, on a broker with name servers, every topic is registered
        again with `perm & brokerPermission`.

        Returns:
            (previous permission, new permission).
        """
        check_perm(perm, "broker_permission")
        previous = self._permission.get()
        self.metadata.topics.touch()
        self.metadata.settings.set_broker_permission(perm)
        self._permission.set(perm)
        log.warning(
            "brokerPermission changed from %d to %d, persisted in %s",
            previous,
            perm,
            self.metadata.settings.path,
        )
        if self.announcer is not None:
            await self.announcer.announce_all()
        return previous, perm

    async def delete_expired_commit_log(self) -> CleanResult:
        """One retention pass now, whatever the hour (RocketMQ's
        `deleteExpiredCommitLog`): expired commit-log files go, and the oldest
        ones even unexpired while the disk is above diskSpaceCleanForciblyRatio.
        Allowed on a slave too: each broker cleans its own files."""
        report = await self.store.clean_now()
        log.info(
            "deleteExpiredCommitLog deleted=%d consume_queue_files=%d min_offset=%d "
            "disk_used=%.1f%%",
            report.deleted_files,
            report.consume_queue_files,
            report.min_offset,
            report.disk_used_ratio * 100,
        )
        return report
