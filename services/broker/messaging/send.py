"""The send use case: the one call every door makes (ferry.v1's SendMessage,
SendMessages and SendStream, RocketMQ's SEND_MESSAGE codes, and through
ferry.v1 the RocketMQ 5 proxy), and the wait that acknowledges a send.

- `SendService` takes a door's converted messages; a single message that is a
  transactional half (`outgoing.is_half`: sysFlag prepared or TRAN_MSG=true)
  goes to the transaction use case it was given (`Transactions.prepare_many`),
  everything else to the `Stager`. A run of sends (`stage_many`) keeps its
  halves with its plain sends, so one `settle` answers all of them. On a slave
  (no transaction use case) a half is refused as any write is
  (`BrokerAccess.check_writable`).
- `Settler` waits once for what covers any number of staged sends — the flush
  (SYNC_FLUSH), the in-sync slaves (SYNC_MASTER) — checks the fence before an
  acknowledgement, and reports to the send observer (metrics).

Must never check or encode a message (staging.py does), decide a
transaction (transactions/ does), or learn which door a send came through.

Runs on the event loop thread, like the store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ferry.runtime.errors import FerryError, PermissionDenied
from services.broker.messaging.access import BrokerAccess
from services.broker.messaging.contracts import Fence, Replication, SendObserver, Transactions
from services.broker.messaging.outgoing import (
    OutgoingMessage,
    SendOutcome,
    SendStatus,
    Staged,
    is_half,
)
from services.broker.messaging.staging import Send, Stager
from services.broker.store import MessageStore


class SendObservers:
    """Several send observers as one (the broker's metrics, the traffic figures)."""

    def __init__(self, *observers: SendObserver) -> None:
        self.observers = observers

    def observe_send(
        self, topic: str, status: str, messages: int, seconds: float, sends: int
    ) -> None:
        for observer in self.observers:
            observer.observe_send(topic, status, messages, seconds, sends)


class Settler:
    def __init__(
        self,
        store: MessageStore,
        fence: Fence | None = None,
        replication: Replication | None = None,
        observer: SendObserver | None = None,
    ) -> None:
        """`fence` (automatic failover): refuses to acknowledge once this
        master may not; `replication` (SYNC_MASTER): what a send waits for
        after its store, before SEND_OK; `observer` (metrics): the stored sends."""
        self.store = store
        self.fence = fence
        self.replication = replication
        self.observer = observer

    async def settle(self, staged: Sequence[Staged], wait_store_msg_ok: bool = True) -> SendStatus:
        """Wait once for what covers every staged send: the flush (SYNC_FLUSH)
        and a slave's copy (SYNC_MASTER) up to the furthest of them. Their
        common status: a wait that timed out is reported for each of them,
        none of them having been confirmed in time.

        Raises:
            Unavailable: a storage fault, or fenced; nothing more is acknowledged.
        """
        last = max(staged, key=lambda s: s.result.end_offset).result
        status = SendStatus.SEND_OK
        if not await self.store.wait_stored(last.end_offset, wait_store_msg_ok):
            status = SendStatus.FLUSH_DISK_TIMEOUT
        if self.replication is not None and wait_store_msg_ok:
            replicated = await self.replication.wait(last)
            if status is SendStatus.SEND_OK:
                status = replicated
        if self.fence is not None:
            self.fence.check_acknowledging()
        if self.observer is not None:
            now = time.perf_counter()
            # One call per (topic, append): the sends of one append took the same time.
            runs: dict[tuple[str, float], list[int]] = {}
            for s in staged:
                run = runs.setdefault((s.topic, s.started), [0, 0])
                run[0] += s.count
                run[1] += 1
            observe = self.observer.observe_send
            for (topic, started), (messages, sends) in runs.items():
                observe(topic, status.value, messages, now - started, sends)
        return status


class SendService:
    def __init__(
        self,
        stager: Stager,
        settler: Settler,
        access: BrokerAccess,
        transactions: Transactions | None = None,
    ) -> None:
        """`transactions`: where halves go (a master's; None on a slave)."""
        self.stager = stager
        self.settler = settler
        self.access = access
        self.transactions = transactions

    async def send(
        self,
        topic: str,
        queue_id: int | None,
        messages: Sequence[OutgoingMessage],
        wait_store_msg_ok: bool = True,
        batch: bool = False,
        producer_group: str = "",
    ) -> SendOutcome:
        """Stage and settle one send. A half's outcome names the half (what
        ends its transaction later)."""
        staged = self.stage(topic, queue_id, messages, batch, producer_group)
        status = await self.settler.settle((staged,), wait_store_msg_ok)
        return staged.outcome(status)

    def stage(
        self,
        topic: str,
        queue_id: int | None,
        messages: Sequence[OutgoingMessage],
        batch: bool = False,
        producer_group: str = "",
    ) -> Staged:
        """Check a send and append it, without waiting (`settle` does).
        `producer_group`: a half's, when its PGROUP property does not say.

        Raises the send's error, with nothing appended (`Stager.stage`,
        `Transactions.prepare_many`).
        """
        if not batch and len(messages) == 1 and is_half(messages[0]):
            [result] = self._prepare([(topic, queue_id, messages[0], producer_group)])
            if isinstance(result, FerryError):
                raise result
            return result
        return self.stager.stage(topic, queue_id, messages, batch)

    def stage_many(self, sends: Sequence[Send]) -> list[Staged | FerryError]:
        """A run of sends (topic, queue id or None, messages, batch, producer
        group) as they arrived back to back, each checked on its own, a refusal
        taking its place in the answer: the plain ones staged together
        (`Stager.stage_many`), then the halves among them together
        (`Transactions.prepare_many`). `settle` then waits once for all of them.

        Raises Unavailable or StorageFault on a storage fault or a fence
        (nothing of the call is answered).
        """
        halves: list[int] = []
        for i, (_, _, messages, batch, _) in enumerate(sends):
            if not batch and len(messages) == 1 and is_half(messages[0]):
                halves.append(i)
        if not halves:  # the hot path
            return self.stager.stage_many(sends)
        chosen = set(halves)
        plain = [i for i in range(len(sends)) if i not in chosen]
        out: list[Staged | FerryError | None] = [None] * len(sends)
        for i, result in zip(plain, self.stager.stage_many([sends[i] for i in plain]), strict=True):
            out[i] = result
        try:
            prepared = self._prepare(
                [(sends[i][0], sends[i][1], sends[i][2][0], sends[i][4]) for i in halves]
            )
        except FerryError as exc:  # a storage fault: the halves refused, the rest answered
            prepared = [exc] * len(halves)
        for i, result in zip(halves, prepared, strict=True):
            out[i] = result
        return out  # type: ignore[return-value]

    def stage_each(
        self, sends: Sequence[tuple[str, int | None, OutgoingMessage]]
    ) -> list[Staged | FerryError]:
        """Independent plain single-message sends, staged at once
        (`Stager.stage_each`: a send stream; a half is refused there)."""
        return self.stager.stage_each(sends)

    async def settle(self, staged: Sequence[Staged], wait_store_msg_ok: bool = True) -> SendStatus:
        """`Settler.settle`."""
        return await self.settler.settle(staged, wait_store_msg_ok)

    def _prepare(
        self, halves: Sequence[tuple[str, int | None, OutgoingMessage, str]]
    ) -> list[Staged | FerryError]:
        """Raises PermissionDenied: no transactions here (a slave)."""
        if self.transactions is None:
            self.access.check_writable()  # a slave's refusal, as for any write
            raise PermissionDenied(
                f"broker {self.access.broker_name} takes no transactional messages here"
            )
        return self.transactions.prepare_many(halves)
