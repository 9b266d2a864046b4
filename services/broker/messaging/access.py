"""Whether this broker takes a write or serves a read now, and the topic and
queue checks every use case shares: `BrokerPermission` (brokerPermission, the
one mutable value UpdateBrokerPermission sets and every reader sees) and
`BrokerAccess` (the one place that says "a slave refuses writes").

Used by the send, pull, pop and send-back use cases, so that one request is
refused alike whatever door it came through. Must never write anything nor
import a door (api/, remoting/) or failover/.
"""

from __future__ import annotations

from ferry.model import (
    PERM_READ,
    PERM_WRITE,
    PROPERTY_TIMER_DELIVER_MS,
    TopicConfig,
    check_topic,
    is_system_topic,
)
from ferry.runtime.errors import InvalidArgument, NotFound, PermissionDenied
from services.broker.messaging.contracts import Fence
from services.broker.messaging.rules import TopicLookup


class BrokerPermission:
    """brokerPermission (PERM_READ | PERM_WRITE bits): read by every check and
    report, changed by the admin use case (UpdateBrokerPermission)."""

    __slots__ = ("_value",)

    def __init__(self, value: int) -> None:
        self._value = value

    def get(self) -> int:
        return self._value

    def set(self, value: int) -> None:
        self._value = value


class BrokerAccess:
    def __init__(
        self,
        topics: TopicLookup,
        permission: BrokerPermission,
        is_slave: bool,
        broker_name: str = "",
        fence: Fence | None = None,
    ) -> None:
        """`fence` (automatic failover): refuses writes a deposed or expiring
        master must not take (None: no failover)."""
        self.topics = topics
        self.permission = permission
        self.is_slave = is_slave
        self.broker_name = broker_name
        self.fence = fence

    def check_writable(self) -> None:
        """Raises PermissionDenied unless this broker takes writes now (a
        master, brokerPermission with WRITE); Unavailable when it is fenced."""
        if self.is_slave:
            raise PermissionDenied(
                f"broker {self.broker_name} here is a SLAVE and takes no writes; send to its master"
            )
        if self.fence is not None:
            self.fence.check_accepting()
        perm = self.permission.get()
        if not perm & PERM_WRITE:
            raise PermissionDenied(
                f"broker {self.broker_name} is not writable (brokerPermission={perm}); "
                "it is being drained or is read-only"
            )

    def check_acknowledging(self) -> None:
        """Raises Unavailable when this master may no longer acknowledge what
        it stored (fenced)."""
        if self.fence is not None:
            self.fence.check_acknowledging()

    def writable_topic(self, topic: str, create: bool = False) -> TopicConfig:
        """The topic's config, if this broker takes sends to it now; with
        `create`, a missing topic gets a new config (one queue, read-write),
        which the caller creates once its send has passed every check."""
        check_topic(topic)
        if is_system_topic(topic):
            raise InvalidArgument(
                "topic",
                f"{topic} is a system topic of the broker's own and takes no sends (a delayed "
                f"or timed message goes to its real topic with DELAY or "
                f"{PROPERTY_TIMER_DELIVER_MS}, a transactional one with TRAN_MSG)",
            )
        self.check_writable()
        config = self.topics.get(topic)
        if config is None and create:
            config = TopicConfig(topic, read_queue_nums=1, write_queue_nums=1, perm=6)
        if config is None:
            raise NotFound(
                f"topic {topic!r} does not exist on broker {self.broker_name}; create it with "
                f"`ferry topic create {topic} -b BROKER`"
            )
        if not config.perm & PERM_WRITE:
            raise PermissionDenied(f"topic {topic!r} is not writable (perm={config.perm})")
        return config

    def readable_topic(self, topic: str) -> TopicConfig:
        """A topic consumers may read here (pulls and pops): it exists, and
        both it and the broker are readable."""
        check_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise NotFound(
                f"topic {topic!r} does not exist on broker {self.broker_name}; "
                f"create it with `ferry topic create {topic} -b BROKER`"
            )
        perm = self.permission.get()
        if not perm & PERM_READ:
            raise PermissionDenied(
                f"broker {self.broker_name} is not readable (brokerPermission={perm})"
            )
        if not config.perm & PERM_READ:
            raise PermissionDenied(f"topic {topic!r} is not readable (perm={config.perm})")
        return config

    def check_queue(self, config: TopicConfig, queue_id: int) -> None:
        count = config.queue_nums
        if not 0 <= queue_id < count:
            raise InvalidArgument(
                "queue_id",
                f"{queue_id} is out of range: topic {config.topic_name!r} has {count} queues "
                f"(0..{count - 1})",
            )

    def known_queue(self, topic: str, queue_id: int) -> TopicConfig:
        """The topic's config, if it exists here and has queue `queue_id`
        (offsets and lookups: no permission needed)."""
        check_topic(topic)
        config = self.topics.get(topic)
        if config is None:
            raise NotFound(f"topic {topic!r} does not exist on broker {self.broker_name}")
        self.check_queue(config, queue_id)
        return config
