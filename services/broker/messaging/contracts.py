"""The collaborators messaging/'s use cases are handed, as contracts this
package owns (as etcd's raft owns its `Storage`): each a small Protocol with
named methods, implemented by a layer messaging/ never imports — the failover
node (`Fence`), cluster/'s SyncReplication (`Replication`), the broker's
metrics (`SendObserver`, `LookupObserver`), the admin use case
(`TopicCreator`), transactions/ (`Transactions`), the app's name-server
registration (`TopicAnnouncer`).

Owns the contracts only: no behaviour. Must never import what implements them
(failover/, cluster/, transactions/, metrics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ferry.model import TopicConfig
from ferry.runtime.errors import FerryError
from services.broker.messaging.outgoing import OutgoingMessage, SendStatus, Staged
from services.broker.store import PutResult


class Fence(Protocol):
    """Automatic failover's fence on a master (services.broker.failover.node).

    The same contract is declared by metadata/metadata_log.py and by
    incarnation.py, which may not import messaging/ (tests/unit/test_wiring.py
    checks that the three agree)."""

    def check_accepting(self) -> None:
        """Raises Unavailable unless this master may take a write now (before
        anything is appended): it is not handing over, and its lease is valid."""

    def check_acknowledging(self) -> None:
        """Raises Unavailable unless this master may still acknowledge what it
        stored (before SEND_OK and the like are answered): its lease is valid."""


class Replication(Protocol):
    """SYNC_MASTER's acknowledgement policy (services.broker.cluster.replication)."""

    async def wait(self, result: PutResult) -> SendStatus:
        """Wait for the in-sync slaves to hold `result`; the send's status."""
        ...


class SendObserver(Protocol):
    """Metrics of stored sends."""

    def observe_send(
        self, topic: str, status: str, messages: int, seconds: float, sends: int
    ) -> None:
        """`sends` sends to `topic` (`messages` messages in all) answered
        `status` after `seconds`."""


class LookupObserver(Protocol):
    """Metrics of lookups by key."""

    def observe_lookup(self, seconds: float) -> None: ...


class TopicCreator(Protocol):
    """Creates a group's retry or dead-letter topic that a send needs and that
    does not exist yet (persisted and announced to the name servers)."""

    def create_system_topic(self, config: TopicConfig) -> None: ...


class TopicAnnouncer(Protocol):
    """Registers topic changes with the name servers at once (the broker's
    registration), so that a producer can use a topic as soon as the admin
    call that changed it returns."""

    async def announce_topics(self, configs: Sequence[TopicConfig]) -> None:
        """Created or changed topics: registered incrementally."""

    async def announce_all(self) -> None:
        """Every topic again, in full (a topic is gone, or brokerPermission
        changed and every topic's perm with it)."""


class Transactions(Protocol):
    """Where the send use case routes transactional halves
    (services.broker.transactions.TransactionService)."""

    def prepare_many(
        self, sends: Sequence[tuple[str, int | None, OutgoingMessage, str]]
    ) -> list[Staged | FerryError]:
        """Halves (topic, queue id or None, message, producer group), each
        checked as a send to its topic and appended together; a refusal in
        its place. Raises Unavailable on a storage fault."""
        ...
