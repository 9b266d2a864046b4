"""A topic created by its first send (Apache's `createTopicInSendMessageMethod`,
autoCreateTopicEnable): a RocketMQ producer that finds no route for a topic
routes it by a default topic (`TBW102`, or its `createTopicKey`) and names
that topic in its send header; the broker then creates the topic from it,
before the send is checked, when the default topic exists here with the
INHERIT bit: min(the producer's defaultTopicQueueNums, the default topic's
write queues) read and write queues, the default topic's permission without
INHERIT, its filter type, and the header's topic sysFlag.

`TBW102` gives no topic while autoCreateTopicEnable is off, whatever its
permission in topics.json says (Apache's rule). Only a master that takes
writes now creates one; anything else leaves the send to be refused as it
would be (TOPIC_NOT_EXIST, a slave's refusal). The topic is created through
the admin use case (`AutoTopicCreator`: with failover on, through the
metadata log, so it is replicated like any other) and registered with the
name servers.

Used by the RocketMQ-protocol door, the only one whose sends name a default
topic (ferry.v1 and RocketMQ 5's proxy answer an unknown topic with
TOPIC_NOT_EXIST / TOPIC_NOT_FOUND, as Apache's proxy does).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ferry.model import AUTO_CREATE_TOPIC, PERM_INHERIT, TopicConfig, check_topic, is_system_topic
from ferry.runtime.errors import FerryError
from services.broker.messaging.access import BrokerAccess

log = logging.getLogger(__name__)


class AutoTopicCreator(Protocol):
    """The admin use case's creation of a topic a send needs (persisted, with
    failover through the metadata log, and announced to the name servers)."""

    async def create_auto_topic(self, config: TopicConfig) -> None: ...


class TopicAutoCreate:
    def __init__(self, access: BrokerAccess, creator: AutoTopicCreator, enabled: bool) -> None:
        """`enabled`: autoCreateTopicEnable (TBW102 may give a topic)."""
        self.access = access
        self.creator = creator
        self.enabled = enabled
        self._creating: dict[str, asyncio.Future[None]] = {}

    def needed(self, topic: str, default_topic: str) -> bool:
        """Whether a send to `topic` naming `default_topic` should first call
        `ensure`: cheap, once per send."""
        return bool(default_topic) and self.access.topics.get(topic) is None

    async def ensure(
        self, topic: str, default_topic: str, queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """Create `topic` from `default_topic` if it may be; the topic's config
        afterwards (None: it does not exist, and the send will say why).
        Sends to one new topic that arrive together create it once."""
        topics = self.access.topics
        existing = topics.get(topic)
        if existing is not None:
            return existing
        pending = self._creating.get(topic)
        if pending is not None:
            await asyncio.shield(pending)
            return topics.get(topic)
        config = self._config(topic, default_topic, queue_nums, topic_sys_flag)
        if config is None:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creating[topic] = future
        try:
            await self.creator.create_auto_topic(config)
        except FerryError as exc:
            log.warning("could not create topic %s from %s: %s", topic, default_topic, exc)
        finally:
            del self._creating[topic]
            future.set_result(None)
        return topics.get(topic)

    def _config(
        self, topic: str, default_topic: str, queue_nums: int, topic_sys_flag: int
    ) -> TopicConfig | None:
        try:
            check_topic(topic)
            self.access.check_writable()
        except FerryError:
            return None  # the send says why
        if is_system_topic(topic):
            return None
        default = self.access.topics.get(default_topic)
        if default is None:
            log.debug("topic %s not created: its default topic %s does not exist here",
                      topic, default_topic)  # fmt: skip
            return None
        perm = default.perm
        if default_topic == AUTO_CREATE_TOPIC and not self.enabled:
            perm &= ~PERM_INHERIT
        if not perm & PERM_INHERIT:
            log.debug("topic %s not created: its default topic %s has no INHERIT (perm %d)%s",
                      topic, default_topic, perm,
                      "; autoCreateTopicEnable is off" if not self.enabled else "")  # fmt: skip
            return None
        queues = min(queue_nums, default.write_queue_nums)
        if queues < 1:
            return None
        return TopicConfig(
            topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=perm & ~PERM_INHERIT,
            topic_filter_type=default.topic_filter_type,
            topic_sys_flag=topic_sys_flag,
        )
