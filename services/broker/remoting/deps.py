"""What the broker's RocketMQ-protocol handlers are built from: the broker's
use cases and tables, never the app itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from services.broker.messaging.clients import ClientTables
from services.broker.messaging.locks import QueueLocks
from services.broker.messaging.sendback import SendBack
from services.broker.remoting.routes import NameServerRoutes

if TYPE_CHECKING:
    from ferry.runtime.clock import Clock
    from services.broker.config import BrokerConfig
    from services.broker.messaging.admin import AdminService
    from services.broker.messaging.autocreate import TopicAutoCreate
    from services.broker.messaging.pull import PullService
    from services.broker.messaging.replication import ReplicationStatus
    from services.broker.messaging.send import SendService
    from services.broker.messaging.statistics import StatisticsService
    from services.broker.metadata.tables import BrokerMetadata
    from services.broker.pop import PopService
    from services.broker.transactions import TransactionService


class EpochHistory(Protocol):
    """A failover member's leader-epoch history (services.broker.failover.epochs):
    `entries`, each with `epoch` and `start` (its first commit offset), oldest first."""

    entries: Sequence[Any]


class RouteQueues(Protocol):
    """A topic's readable queues across the cluster (services.broker.remoting.routes)."""

    async def queues(self, topic: str) -> list[tuple[str, int]] | None: ...


class Gate(Protocol):
    """Open while the broker serves (services.broker.api.servicer.Gate)."""

    open: bool

    def check(self) -> None: ...


@dataclasses.dataclass
class Deps:
    config: BrokerConfig
    clock: Clock
    gate: Gate  # closed while starting and stopping: answer SERVICE_NOT_AVAILABLE
    sends: SendService  # every send, transactional halves included
    pulls: PullService
    admin: AdminService
    metadata: BrokerMetadata
    statistics: StatisticsService  # every figure mqadmin prints (the handlers only render)
    pop: PopService | None
    # Who is connected (heartbeats) and which orderly consumer holds which
    # queue: state of the RocketMQ door only, shared by its handler families
    # and the server's close hook (`services.broker.remoting.connection_closed`).
    # One Deps per broker: every port serving RocketMQ's protocol (listenPort
    # and the VIP port) must share it, or their member lists would differ.
    clients: ClientTables = dataclasses.field(default_factory=ClientTables)
    locks: QueueLocks = dataclasses.field(default_factory=QueueLocks)
    # A consumer's failed message back to its retry topic (built by the app).
    send_back: SendBack | None = None
    # RocketMQ's ACL checks every request (ferry.acl); the admin token then does not apply.
    acl_enabled: bool = False
    # Transactional messages (a master's; None on a slave): END_TRANSACTION (37) and
    # the check-backs (39). Prepared sends go through `sends`, as every send.
    transactions: TransactionService | None = None
    # A send naming a default topic (TBW102) creates its unknown topic (a master's).
    auto_create: TopicAutoCreate | None = None
    # brokerIP1:listenPort, as the routes give it (set once the port is bound).
    broker_addr: str = ""
    # Where replication stands (GET_BROKER_HA_STATUS 907).
    replication: ReplicationStatus | None = None
    # The leader-epoch history of a failover member (GET_BROKER_EPOCH_CACHE 1007);
    # None: the broker runs without automatic failover.
    epochs: EpochHistory | None = None
    # The name servers' routes (QUERY_ASSIGNMENT divides a topic's queues across
    # brokers); None: this broker's own queues.
    routes: RouteQueues | None = None

    @classmethod
    def from_app(cls, app) -> Deps:  # services.broker.app.BrokerApp, started
        """The app's use cases and tables; a failover member's run takes the
        member's connection tables (`Incarnation.remoting_clients` and
        `remoting_locks`), which outlive the run as its connections do."""
        incarnation = getattr(app, "incarnation", None)
        shared: dict[str, Any] = {}
        if incarnation is not None:
            shared["epochs"] = incarnation.epoch_start.history
        if incarnation is not None and incarnation.remoting_clients is not None:
            shared = {"clients": incarnation.remoting_clients, "locks": incarnation.remoting_locks}
        return cls(
            config=app.config,
            clock=app.clock,
            gate=app.gate,
            sends=app.sends,
            pulls=app.pulls,
            admin=app.admin,
            metadata=app.metadata,
            statistics=app.statistics,
            pop=app.pop,
            send_back=app.send_back,
            acl_enabled=app.config.acl_enable,
            transactions=getattr(app, "transactions", None),
            auto_create=getattr(app, "auto_create", None),
            replication=getattr(app, "ha_status", None),
            routes=NameServerRoutes(app.config.namesrv_addrs, app.clock)
            if app.config.namesrv_addrs
            else None,
            **shared,
        )
