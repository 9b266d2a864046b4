"""Transactions over RocketMQ's protocol: END_TRANSACTION (37, which Java's
producer sends oneway) in, and the broker's own oneway CHECK_TRANSACTION_STATE
(39) out, to a producer connection of the half's group.

The prepared sends themselves are sends (`sends.py`, sysFlag 0x4 or
TRAN_MSG=true); everything else is `services.broker.transactions`. This
module only converts: header fields in, one `TransactionService.end` call,
a response code out; and a `CheckRequest` out as a command on a connection
that heartbeated for the group (`ClientTables.producers`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Batchable, Connection, Handler
from ferry.runtime.errors import FerryError
from services.broker.remoting import convert
from services.broker.remoting.convert import BadRequest, boolean, integer, text
from services.broker.remoting.deps import Deps
from services.broker.transactions import CheckRequest, Decision, TransactionService

log = logging.getLogger(__name__)

# commitOrRollback (RocketMQ's MessageSysFlag transaction types).
DECISIONS = {0x0: Decision.UNKNOWN, 0x8: Decision.COMMIT, 0xC: Decision.ROLLBACK}


def handlers(deps: Deps) -> dict[int, Handler]:
    service = deps.transactions
    if service is not None:
        service.register_checker(TcpChecker(deps))
    ends = Ends(deps)
    return {
        codes.END_TRANSACTION: Batchable(
            convert.answering_errors(ends.end_transaction, deps.gate), ends.end_many
        )
    }


# commitOrRollback as every producer writes it.
_DECISION_TEXT = {str(kind): decision for kind, decision in DECISIONS.items()}


def parse_end(request: Command) -> tuple[str, int, Decision, bool]:
    """(producer group, commit offset, decision, from a check) of an END_TRANSACTION.

    The header every producer sends (both offsets plain ASCII decimals that fit a
    long, a decision of "0", "8" or "12") is read directly; anything else, and every
    refusal, by `_parse_end_checked`.

    Raises:
        BadRequest: a field missing or malformed, or a commitOrRollback none of 0, 8, 12.
    """
    ext = request.ext
    group = ext.get("producerGroup")
    offset = ext.get("commitLogOffset")
    state = ext.get("tranStateTableOffset")
    decision = _DECISION_TEXT.get(ext.get("commitOrRollback", ""))
    if (
        group
        and decision is not None
        and offset is not None
        and state is not None
        and 0 < len(offset) < 19
        and 0 < len(state) < 19
        and offset.isascii()
        and offset.isdigit()
        and state.isascii()
        and state.isdigit()
    ):
        check = ext.get("fromTransactionCheck")
        return group, int(offset), decision, check is not None and check.lower() == "true"
    return _parse_end_checked(ext)


def _parse_end_checked(ext: Mapping[str, str]) -> tuple[str, int, Decision, bool]:
    """`parse_end` for any header, each field checked and a refusal naming it."""
    group = text(ext, "producerGroup")
    commit_offset = integer(ext, "commitLogOffset", low=0)
    integer(ext, "tranStateTableOffset", low=0)
    kind = integer(ext, "commitOrRollback", low=-(2**31), high=2**31 - 1)
    decision = DECISIONS.get(kind)
    if decision is None:
        raise BadRequest("commitOrRollback", f"{kind} is none of 0, 8 (commit), 12 (rollback)")
    return group, commit_offset, decision, boolean(ext, "fromTransactionCheck")


class Ends:
    """END_TRANSACTION, one by one or a run of them (one commit-log append)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def _service(self) -> TransactionService:
        service = self.deps.transactions
        if service is None:
            raise _OnSlave()
        return service

    async def end_transaction(self, connection: Connection, request: Command) -> Command | None:
        [answer] = await self.end_many(connection, [request])
        return answer

    async def end_many(
        self, connection: Connection, requests: list[Command]
    ) -> list[Command | None]:
        answers: list[Command | None] = [None] * len(requests)
        try:
            self.deps.gate.check()
            service = self._service()
        except _OnSlave:
            log.warning(
                "END_TRANSACTION from %s refused: this broker is a slave", connection.remote
            )
            return [r.answer(codes.SLAVE_NOT_AVAILABLE, SLAVE_REMARK) for r in requests]
        except FerryError as exc:
            return [convert.error_answer(r, exc) for r in requests]
        parsed: list[int] = []
        ends: list[tuple[str, int, Decision, bool]] = []
        for i, request in enumerate(requests):
            try:
                ends.append(parse_end(request))
            except FerryError as exc:
                answers[i] = request.answer(codes.SYSTEM_ERROR, exc.message)
                continue
            parsed.append(i)
        wait = any(not requests[i].is_oneway for i in parsed)
        try:
            results = await service.end_many(ends, wait)
        except FerryError as exc:  # a storage fault while waiting
            results = [exc] * len(ends)
        for i, result in zip(parsed, results, strict=True):
            if isinstance(result, FerryError):
                code = convert.code_of(result)
                if code in (codes.MESSAGE_ILLEGAL, codes.TOPIC_NOT_EXIST):
                    code = codes.SYSTEM_ERROR  # Apache: "Find prepared transaction message failed"
                answers[i] = requests[i].answer(code, result.message)
            elif requests[i].is_oneway:
                answers[i] = _ONEWAY_DONE  # never sent: counted in the metrics as 0
            else:
                answers[i] = requests[i].answer(codes.SUCCESS)
        return answers


# What a served oneway END_TRANSACTION "answers": the server only reads its code.
_ONEWAY_DONE = Command(codes.SUCCESS)


SLAVE_REMARK = "Message store is slave mode, so end transaction is forbidden."


class _OnSlave(Exception):
    """No transaction service: this broker is a slave."""


class TcpChecker:
    """The TCP door's `Checker`: CHECK_TRANSACTION_STATE, oneway, to one
    connected producer of the group (the next one each time)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._turn = itertools.count()

    def __call__(self, check: CheckRequest) -> bool:
        members = [
            m
            for m in self.deps.clients.producers(check.group)
            if isinstance(m.channel, Connection) and m.channel.is_open
        ]
        if not members:
            return False
        member = members[next(self._turn) % len(members)]
        member.channel.oneway(
            Command(
                codes.CHECK_TRANSACTION_STATE,
                ext={
                    "tranStateTableOffset": str(check.queue_offset),
                    "commitLogOffset": str(check.commit_offset),
                    "msgId": check.msg_id,
                    "transactionId": check.msg_id,
                    "offsetMsgId": check.offset_msg_id,
                },
                body=check.body,
                language="JAVA",
            )
        )
        log.info(
            "CHECK_TRANSACTION_STATE sent to %s (%s): group=%s topic=%s msgId=%s",
            member.client_id, member.channel.remote, check.group, check.topic, check.msg_id,
        )  # fmt: skip
        return True
