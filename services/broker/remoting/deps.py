"""What the broker's RocketMQ-protocol handlers are built from: the broker's
use cases and tables, never the app itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ferry.runtime.clock import Clock
    from services.broker.config import BrokerConfig
    from services.broker.messaging.admin import AdminService
    from services.broker.messaging.service import MessagingService
    from services.broker.metadata.tables import BrokerMetadata
    from services.broker.pop import PopService
    from services.broker.store import MessageStore


class Gate(Protocol):
    """Open while the broker serves (services.broker.api.servicer.Gate)."""

    open: bool

    def check(self) -> None: ...


@dataclasses.dataclass
class Deps:
    config: BrokerConfig
    clock: Clock
    gate: Gate  # closed while starting and stopping: answer SERVICE_NOT_AVAILABLE
    messaging: MessagingService
    admin: AdminService
    metadata: BrokerMetadata
    store: MessageStore
    pop: PopService | None
    # ("ip", port) written into records as their store host: this broker's
    # RocketMQ-protocol address (offsetMsgId decodes to it).
    store_host: Callable[[], tuple[str, int]]

    @classmethod
    def from_app(cls, app) -> Deps:  # services.broker.app.BrokerApp, started
        return cls(
            config=app.config,
            clock=app.clock,
            gate=app.gate,
            messaging=app.messaging,
            admin=app.admin,
            metadata=app.metadata,
            store=app.store,
            pop=app.pop,
            store_host=lambda: app.store.store_host,
        )
