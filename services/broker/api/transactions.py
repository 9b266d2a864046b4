"""`ferry.v1.Transactions`: ending transactions and watching check-backs
(proto/ferry/v1/transactions.proto).

Adapts only: EndTransaction is one `TransactionService.end` call (or
`end_by_msg_id` when the request names no commit offset); a
WatchTransactionChecks call registers a checker with the service for as long
as it lasts, and streams each check it is handed. A check goes to a watcher
whose queue has room (WATCH_QUEUE); a full queue (a watcher that stopped
reading) makes the service try its next way to a producer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import grpc

from ferry import record
from ferry.runtime.errors import InvalidArgument, PermissionDenied
from ferry.runtime.grpc_errors import grpc_method, grpc_stream_method
from ferry.v1 import transactions_pb2, transactions_pb2_grpc
from services.broker.api import convert
from services.broker.transactions import CheckRequest, Decision, EndResult, TransactionService

WATCH_QUEUE = 1024

_DECISIONS = {
    transactions_pb2.COMMIT: Decision.COMMIT,
    transactions_pb2.ROLLBACK: Decision.ROLLBACK,
    transactions_pb2.UNKNOWN: Decision.UNKNOWN,
}


class TransactionsServicer(transactions_pb2_grpc.TransactionsServicer):
    def __init__(self, transactions: TransactionService | None, gate, broker_name: str) -> None:
        """`transactions`: None on a SLAVE, which refuses every call."""
        self._transactions = transactions
        self.gate = gate  # services.broker.api.servicer.Gate
        self.broker_name = broker_name

    @property
    def transactions(self) -> TransactionService:
        if self._transactions is None:
            raise PermissionDenied(
                f"broker {self.broker_name} here is a SLAVE: transactions are ended and "
                "checked on its master"
            )
        return self._transactions

    @grpc_method
    async def EndTransaction(
        self, request: transactions_pb2.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> transactions_pb2.EndTransactionResponse:
        self.gate.check()
        decision = _DECISIONS.get(request.resolution)
        if decision is None:
            raise InvalidArgument("resolution", "must be COMMIT, ROLLBACK or UNKNOWN")
        if not request.producer_group:
            raise InvalidArgument("producer_group", "is required (the half message's PGROUP)")
        group = request.producer_group
        if request.HasField("commit_offset"):
            if request.commit_offset < 0:
                raise InvalidArgument("commit_offset", f"{request.commit_offset} is negative")
            end = functools.partial(self.transactions.end, group, request.commit_offset)
        elif request.msg_id:
            end = functools.partial(self.transactions.end_by_msg_id, group, request.msg_id)
        else:
            raise InvalidArgument("msg_id", "is required when commit_offset is absent")
        result = await end(decision, from_check=request.from_check, wait=True)
        return transactions_pb2.EndTransactionResponse(applied=result is EndResult.DECIDED)

    @grpc_stream_method
    async def WatchTransactionChecks(
        self,
        request: transactions_pb2.WatchTransactionChecksRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[transactions_pb2.TransactionCheck]:
        self.gate.check()
        transactions = self.transactions
        groups = set(request.producer_groups)
        if not groups or "" in groups:
            raise InvalidArgument("producer_groups", "name at least one group, none empty")
        checks: asyncio.Queue[CheckRequest] = asyncio.Queue(WATCH_QUEUE)

        def checker(check: CheckRequest) -> bool:
            if check.group not in groups or checks.full():
                return False
            checks.put_nowait(check)
            return True

        remove = transactions.register_checker(checker)
        try:
            while True:
                yield check_pb(await checks.get())
        finally:
            remove()


def check_pb(check: CheckRequest) -> transactions_pb2.TransactionCheck:
    stored = record.decode_stored(check.body, 0, len(check.body))
    return transactions_pb2.TransactionCheck(
        producer_group=check.group,
        commit_offset=check.commit_offset,
        queue_offset=check.queue_offset,
        msg_id=check.msg_id,
        transaction_id=check.msg_id,
        offset_msg_id=check.offset_msg_id,
        message=convert.message_ext_pb(stored),
    )
