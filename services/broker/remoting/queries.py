"""Lookups over RocketMQ's protocol: VIEW_MESSAGE_BY_ID (33), the message
whose offset message id names this broker. `mqadmin queryMsgById` and the
dashboard decode the id into this broker's address and the commit offset,
and send the offset here; the answer's body is the record as stored, which
the client decodes as it decodes a pull.
"""

from __future__ import annotations

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime.errors import FerryError, NotFound
from services.broker.remoting.convert import error_answer, integer
from services.broker.remoting.deps import Deps


class Queries:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def view_message_by_id(self, connection: Connection, request: Command) -> Command:
        try:
            self.deps.gate.check()
            offset = integer(request.ext, "offset", low=0)
            data = await self.deps.messaging.stored_record(offset)
        except NotFound as exc:
            # Apache 4.9 answers SYSTEM_ERROR; TOPIC_NOT_EXIST would mislead.
            return request.answer(codes.SYSTEM_ERROR, exc.message)
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS, body=data)


def handlers(deps: Deps) -> dict[int, Handler]:
    queries = Queries(deps)
    return {codes.VIEW_MESSAGE_BY_ID: queries.view_message_by_id}
