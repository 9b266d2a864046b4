"""A transactional producer over ferry.v1 (docs/guides/transactional-messages.md).

    with TransactionProducer(namesrv, "orders-tx", checker=lookup_order) as producer:
        sent = producer.send("orders", body, run_local=write_order_row)

`send` stores the message as a prepared half (invisible to consumers), calls
`run_local(sent)` — the caller's local transaction, e.g. a database write —
and ends the transaction with what it returns: COMMIT delivers the message,
ROLLBACK discards it, UNKNOWN leaves it to the broker's check-back. An
exception from `run_local` counts as UNKNOWN (the caller's work may or may
not have happened: the checker decides later), and is raised again after.

Check-backs: for a half message left undecided for `transactionTimeOut` (a
producer that died, an UNKNOWN), the broker asks one producer of its group.
This producer watches `Transactions.WatchTransactionChecks` on every master
of the topics it sent to (or named in `topics`), one thread per broker name,
re-reading the route after an error (a failover's new master), and answers
each check with `checker(check)`.

Threads: `send` runs in the caller's thread; each watch runs in its own daemon
thread and calls `checker` there. `close` ends them.
"""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from ferry.client.broker import NoRoute, Producer, Sent
from ferry.client.namesrv import NamesrvClient
from ferry.model import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED, PROPERTY_UNIQ_KEY
from ferry.v1 import broker_pb2, transactions_pb2, transactions_pb2_grpc

log = logging.getLogger(__name__)

WATCH_RETRY_S = 1.0


class TransactionState(enum.Enum):
    COMMIT = transactions_pb2.COMMIT
    ROLLBACK = transactions_pb2.ROLLBACK
    UNKNOWN = transactions_pb2.UNKNOWN


@dataclass(frozen=True)
class TransactionSent:
    """A transactional send: where its half went, and how it was ended."""

    sent: Sent
    msg_id: str  # the message's unique id (UNIQ_KEY)
    state: TransactionState


@dataclass(frozen=True)
class Check:
    """A broker asking how a transaction ended."""

    producer_group: str
    msg_id: str
    transaction_id: str
    message: broker_pb2.MessageExt  # as it will be delivered (its real topic)


class TransactionProducer:
    def __init__(
        self,
        namesrv: NamesrvClient,
        group: str,
        checker: Callable[[Check], TransactionState] | None = None,
        topics: Iterable[str] = (),
        timeout_s: float = 10.0,
    ) -> None:
        """`group`: the producer group (PGROUP), whose producers the broker
        checks back with; `checker`: answers check-backs (None: this producer
        answers none, and watches nothing); `topics`: watch their brokers from
        the start (a new producer taking over from one that died)."""
        if not group:
            raise ValueError("a transactional producer needs a producer group")
        self.group = group
        self.checker = checker
        self.timeout_s = timeout_s
        self._producer = Producer(namesrv, timeout_s=timeout_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watched: dict[str, threading.Thread] = {}  # by broker name
        self._calls: set[grpc.Future] = set()
        self.checks_answered = 0
        for topic in topics:
            self._watch(topic)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            calls = list(self._calls)
            threads = list(self._watched.values())
        for call in calls:
            call.cancel()
        for thread in threads:
            thread.join(timeout=5)
        self._producer.close()

    def __enter__(self) -> TransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        body: bytes,
        run_local: Callable[[Sent], TransactionState],
        tags: str = "",
        keys: str = "",
        properties: Mapping[str, str] | None = None,
    ) -> TransactionSent:
        """Prepare, run the local transaction, end it (see the module docstring).

        Raises:
            grpc.RpcError: the half message was not stored (nothing to end).
            NoRoute: the topic has no route.
            Exception: what `run_local` raised, after the transaction was left UNKNOWN.
        """
        msg_id = uuid.uuid4().hex.upper()
        props = dict(properties or {})
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = self.group
        props[PROPERTY_UNIQ_KEY] = msg_id
        sent = self._producer.send(topic, body, tags, keys, props)
        if self.checker is not None:
            self._watch(topic)
        failure: BaseException | None = None
        try:
            state = run_local(sent)
        except Exception as exc:  # the checker decides later
            state, failure = TransactionState.UNKNOWN, exc
        self.end(sent, msg_id, state)
        if failure is not None:
            raise failure
        return TransactionSent(sent, msg_id, state)

    def end(self, sent: Sent, msg_id: str, state: TransactionState) -> None:
        """End a transaction whose half is `sent` (UNKNOWN: tell the broker
        nothing; it checks back)."""
        if state is TransactionState.UNKNOWN:
            return
        stub = transactions_pb2_grpc.TransactionsStub(
            self._producer.client(sent.broker_addr).channel
        )
        stub.EndTransaction(
            transactions_pb2.EndTransactionRequest(
                producer_group=self.group,
                commit_offset=sent.result.commit_offset,
                queue_offset=sent.result.queue_offset,
                msg_id=msg_id,
                transaction_id=msg_id,
                resolution=state.value,
            ),
            timeout=self.timeout_s,
        )

    # ------------------------------------------------------------ check-backs

    def _watch(self, topic: str) -> None:
        """Watch every broker name of the topic's route (once each)."""
        if self.checker is None:
            return
        try:
            route = self._producer.route(topic)
        except NoRoute:
            return
        names = {q.broker_name for q in route.write_queues()}
        with self._lock:
            for name in names - set(self._watched):
                thread = threading.Thread(
                    target=self._watch_broker,
                    args=(topic, name),
                    name=f"tx-checks-{name}",
                    daemon=True,
                )
                self._watched[name] = thread
                thread.start()

    def _watch_broker(self, topic: str, broker_name: str) -> None:
        refresh = False
        while not self._stop.is_set():
            try:
                route = self._producer.route(topic, refresh)
                addr = route.master(broker_name)
            except (NoRoute, grpc.RpcError):
                addr = None
            if addr is not None:
                self._serve_checks(addr)
            refresh = True
            self._stop.wait(WATCH_RETRY_S)

    def _serve_checks(self, addr: str) -> None:
        client = self._producer.client(addr)
        stub = transactions_pb2_grpc.TransactionsStub(client.channel)
        call = stub.WatchTransactionChecks(
            transactions_pb2.WatchTransactionChecksRequest(
                producer_groups=[self.group], client_id=f"ferry-client@{id(self):x}"
            )
        )
        with self._lock:
            if self._stop.is_set():
                call.cancel()
                return
            self._calls.add(call)
        try:
            for check in call:
                self._answer(stub, check)
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                log.debug("transaction checks from %s ended: %s", addr, exc.code())
        finally:
            with self._lock:
                self._calls.discard(call)

    def _answer(
        self, stub: transactions_pb2_grpc.TransactionsStub, check: transactions_pb2.TransactionCheck
    ) -> None:
        assert self.checker is not None
        try:
            state = self.checker(
                Check(check.producer_group, check.msg_id, check.transaction_id, check.message)
            )
        except Exception:
            log.exception("transaction checker failed for msgId=%s: left UNKNOWN", check.msg_id)
            return
        if state is TransactionState.UNKNOWN:
            return
        try:
            stub.EndTransaction(
                transactions_pb2.EndTransactionRequest(
                    producer_group=check.producer_group,
                    commit_offset=check.commit_offset,
                    queue_offset=check.queue_offset,
                    msg_id=check.msg_id,
                    transaction_id=check.transaction_id,
                    resolution=state.value,
                    from_check=True,
                ),
                timeout=self.timeout_s,
            )
            self.checks_answered += 1
        except grpc.RpcError as exc:
            log.warning("answering the check of msgId=%s failed: %s", check.msg_id, exc.details())
