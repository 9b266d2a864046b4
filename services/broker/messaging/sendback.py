"""A consumer's failed message, sent back (RocketMQ 4's CONSUMER_SEND_MSG_BACK):
the broker copies the stored message to the group's retry topic
`%RETRY%<group>`, due after a delay level, or — once it has been reconsumed
`maxReconsumeTimes` times, or when the consumer asks (a negative level) — to
the group's dead-letter topic `%DLQ%<group>`.

The copy is made as RocketMQ makes it: the stored body, flag, birth and
properties, reconsume times + 1, `RETRY_TOPIC` (the topic it was first sent
to, kept across retries) and `ORIGIN_MESSAGE_ID` (the first copy's offset
message id, kept across retries). A retry goes through the delay levels:
stored in the schedule topic with `DELAY`, `REAL_TOPIC` = the retry topic and
`REAL_QID`, and re-published there when due (schedule/delay.py); level 0 means
3 + the reconsume times so far. Retry and dead-letter topics are created on
first use (one queue per the group's retryQueueNums, readable and writable),
as pop's revival creates them (pop/revive.py), and announced to the name
servers through the admin use case.

The same checks as a send: the broker writable, not a slave, not fenced;
the copy is settled like a send (metrics, fencing), without waiting for a
flush or a slave, as RocketMQ sets waitStoreMsgOK=false here.

Runs on the event loop thread.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ferry import record
from ferry.model import (
    DLQ_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    RETRY_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
    check_name,
    dlq_topic,
)
from ferry.runtime.errors import FailedPrecondition, NotFound, PermissionDenied
from services.broker.messaging.access import BrokerAccess
from services.broker.messaging.outgoing import SendStatus, Staged
from services.broker.messaging.rules import GroupLookup
from services.broker.messaging.send import Settler
from services.broker.store import MessageStore, copy_message

log = logging.getLogger(__name__)

DLQ_QUEUE_NUMS = 1  # RocketMQ's DLQ_NUMS_PER_GROUP
FIRST_RETRY_LEVEL = 3  # a delay level of 0 means 3 + the reconsume times so far


def group_retry_topic(group: str) -> str:
    """RocketMQ 4's retry topic of a consumer group (one per group, every topic
    it consumes; pop's `ferry.model.retry_topic` is one per group and topic)."""
    return f"{RETRY_TOPIC_PREFIX}{group}"


class GroupNotFound(NotFound):
    """The consumer group has no config here and may not be created on use."""


@dataclass(frozen=True, slots=True)
class SendBackOutcome:
    topic: str  # where the copy went: %RETRY%<group> (through the delay) or %DLQ%<group>
    delay_level: int  # 0 for the DLQ
    reconsume_times: int  # of the copy
    status: SendStatus


class TableChanges(Protocol):
    """The topics and groups the broker creates on first use, in its tables
    and announced (the admin use case; not through the metadata log, as
    RocketMQ does not replicate them either)."""

    async def create_own_topic(self, config: TopicConfig) -> None: ...

    def create_own_group(self, config: SubscriptionGroupConfig) -> None: ...


class SendBack:
    def __init__(
        self,
        store: MessageStore,
        access: BrokerAccess,
        settler: Settler,
        groups: GroupLookup | None,
        tables: TableChanges,
        auto_create_group: bool = False,
        choose: Callable[[int], int] = random.randrange,
    ) -> None:
        """`tables`: creates and announces a new retry or dead-letter topic,
        and a consumer group met for the first time when `auto_create_group`
        (autoCreateSubscriptionGroup; else an operator creates it).
        `choose(n)`: the retry queue among n."""
        self.store = store
        self.access = access
        self.settler = settler
        self.groups = groups
        self.tables = tables
        self.auto_create_group = auto_create_group
        self.choose = choose
        self.sent_back = 0
        self.dead_letters = 0

    async def group(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, created on first use when that is allowed.

        Raises:
            GroupNotFound: none, and autoCreateSubscriptionGroup is off.
        """
        check_name(group, "group")
        groups = self.groups
        config = groups.get(group) if groups is not None else None
        if config is not None:
            return config
        if not self.auto_create_group or self.access.is_slave:
            raise GroupNotFound(
                f"consumer group {group!r} does not exist on broker "
                f"{self.access.broker_name} and autoCreateSubscriptionGroup is off; create "
                "it with BrokerAdmin/UpdateAndCreateSubscriptionGroup"
            )
        config = SubscriptionGroupConfig(group)
        self.tables.create_own_group(config)
        log.info("consumer group %s created on first use", group)
        return config

    async def ensure_retry_topic(self, group: str) -> None:
        """A consumer group announced itself (a heartbeat): its retry topic
        exists from then on, so its consumers find a route for it. Masters only;
        a group that may not be created is left alone."""
        if self.access.is_slave:
            return
        try:
            config = await self.group(group)
        except GroupNotFound:
            return
        if config.retry_queue_nums > 0:
            await self._ensure_topic(group_retry_topic(group), config.retry_queue_nums)

    async def send_back(
        self,
        group: str,
        commit_offset: int,
        delay_level: int,
        max_reconsume_times: int | None = None,
    ) -> SendBackOutcome | None:
        """Copy the message stored at `commit_offset` to the group's retry or
        dead-letter topic. None when the group keeps no retries
        (retryQueueNums 0: the message is dropped, as RocketMQ drops it).

        Raises:
            GroupNotFound, PermissionDenied (a slave, a read-only broker or
            topic), Unavailable (fenced, storage fault), ResourceExhausted (a
            full disk), FailedPrecondition (no message at `commit_offset`).
        """
        store = self.store
        config = await self.group(group)
        self.access.check_writable()
        if config.retry_queue_nums <= 0:
            return None
        data = await store.record_bytes(commit_offset)
        if data is None:
            raise FailedPrecondition(
                f"no message at commit offset {commit_offset} on broker {self.access.broker_name} "
                "(deleted by retention, or not an offset a pull returned)"
            )
        message = record.decode_stored(data, 0, len(data))
        properties = dict(message.properties)
        properties.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        properties.pop(PROPERTY_DELAY, None)
        limit = config.retry_max_times if max_reconsume_times is None else max_reconsume_times
        levels = len(store.delay_levels_s)
        if message.reconsume_times >= limit or delay_level < 0:
            topic, queue_id = dlq_topic(group), 0
            await self._ensure_topic(topic, DLQ_QUEUE_NUMS)
            store_topic, store_queue, level = topic, queue_id, 0
        else:
            topic = group_retry_topic(group)
            retry_config = await self._ensure_topic(topic, config.retry_queue_nums)
            queue_id = self.choose(max(1, retry_config.write_queue_nums))
            level = min(delay_level or FIRST_RETRY_LEVEL + message.reconsume_times, levels)
            if level > 0:
                properties[PROPERTY_DELAY] = str(level)
                properties[PROPERTY_REAL_TOPIC] = topic
                properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
                store_topic, store_queue = SCHEDULE_TOPIC, level - 1
            else:  # no delay levels configured: straight to the retry topic
                store_topic, store_queue = topic, queue_id
        copy = copy_message(message, properties, message.reconsume_times + 1)
        started = time.perf_counter()
        result = store.append_sends(store_topic, store_queue, [copy])
        status = await self.settler.settle(
            (Staged(topic, result, started),), wait_store_msg_ok=False
        )
        if topic.startswith(DLQ_TOPIC_PREFIX):
            self.dead_letters += 1
            log.warning(
                "message at commit offset %d of group %s went to %s after %d reconsumes",
                commit_offset,
                group,
                topic,
                message.reconsume_times,
            )
        else:
            self.sent_back += 1
        return SendBackOutcome(topic, level, message.reconsume_times + 1, status)

    async def _ensure_topic(self, topic: str, queue_nums: int) -> TopicConfig:
        config = self.access.topics.get(topic)
        if config is None:
            config = TopicConfig(
                topic,
                read_queue_nums=queue_nums,
                write_queue_nums=queue_nums,
                perm=PERM_READ | PERM_WRITE,
            )
            await self.tables.create_own_topic(config)
        elif not config.perm & PERM_WRITE:
            raise PermissionDenied(f"topic {topic!r} is not writable (perm={config.perm})")
        return config
