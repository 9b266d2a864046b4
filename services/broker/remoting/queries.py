"""Lookups over RocketMQ's protocol: VIEW_MESSAGE_BY_ID (33), the message
whose offset message id names this broker. `mqadmin queryMsgById` and the
dashboard decode the id into this broker's address and the commit offset,
and send the offset here; the answer's body is the record as stored, which
the client decodes as it decodes a pull.

QUERY_MESSAGE (12), by key through the message index (`mqadmin queryMsgByKey`;
with the ext field `_UNIQUE_KEY_QUERY=true`, by unique key: `queryMsgByUniqueKey`,
and `queryMsgById` for an id that is not an offset id): the body is the records
found, as stored, back to back, like a pull's. As Apache 4.9's broker, a unique-key
query returns at most 32 (defaultQueryMaxNum) whatever maxNum says, any other at
most 64 (maxMsgsNumBatch), the oldest left out beyond what one frame carries (16 MiB);
nothing found answers 22 QUERY_NOT_FOUND. Unlike Apache's, the records are checked
against the key before they are sent (Apache leaves hash collisions to the client).
"""

from __future__ import annotations

from ferry.remoting import codes
from ferry.remoting.codec import MAX_FRAME, Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime.errors import FailedPrecondition, FerryError, InvalidArgument, NotFound
from services.broker.messaging.pull import UNIQUE_QUERY_NUM
from services.broker.remoting.convert import BadRequest, error_answer, integer, text
from services.broker.remoting.deps import Deps

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG
NOT_FOUND_REMARK = "can not find message, maybe time range not correct"
MAX_BODY = MAX_FRAME - (1 << 20)  # room for the header


class Queries:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def view_message_by_id(self, connection: Connection, request: Command) -> Command:
        try:
            self.deps.gate.check()
            offset = integer(request.ext, "offset", low=0)
            data = await self.deps.pulls.stored_record(offset)
        except NotFound as exc:
            # Apache 4.9 answers SYSTEM_ERROR; TOPIC_NOT_EXIST would mislead.
            return request.answer(codes.SYSTEM_ERROR, exc.message)
        except FerryError as exc:
            return error_answer(request, exc)
        return request.answer(codes.SUCCESS, body=data)

    async def query_message(self, connection: Connection, request: Command) -> Command:
        ext = request.ext
        last = {"indexLastUpdateTimestamp": 0, "indexLastUpdatePhyoffset": 0}
        try:
            self.deps.gate.check()
            topic = text(ext, "topic")
            key = text(ext, "key")
            max_num = integer(ext, "maxNum", low=-(2**31), high=2**31 - 1)
            begin = integer(ext, "beginTimestamp")
            end = integer(ext, "endTimestamp")
            unique = ext.get(UNIQUE_KEY_QUERY) == "true"
            if unique:
                max_num = UNIQUE_QUERY_NUM
            found = await self.deps.pulls.find_by_key(topic, key, max_num, begin, end, unique)
        except BadRequest as exc:
            return request.answer(codes.SYSTEM_ERROR, exc.message, ext=last)
        except FailedPrecondition as exc:  # the index is off: Apache finds nothing
            return request.answer(codes.QUERY_NOT_FOUND, exc.message, ext=last)
        except InvalidArgument as exc:
            return request.answer(codes.QUERY_NOT_FOUND, exc.message, ext=last)
        except FerryError as exc:
            return error_answer(request, exc, ext=last)
        last = {
            "indexLastUpdateTimestamp": found.last_update_timestamp,
            "indexLastUpdatePhyoffset": found.last_update_commit_offset,
        }
        if not found.found:
            return request.answer(codes.QUERY_NOT_FOUND, NOT_FOUND_REMARK, ext=last)
        return request.answer(codes.SUCCESS, ext=last, body=_within_frame(found.found))


def _within_frame(found: list[tuple[bytes, object]]) -> bytes:
    """The records found, back to back, the oldest left out while they would not fit in
    one frame (a client refuses a frame over MAX_FRAME; the newest is always sent)."""
    pieces = [data for data, _ in found]
    total = sum(len(p) for p in pieces)
    while len(pieces) > 1 and total > MAX_BODY:
        total -= len(pieces.pop(0))
    return b"".join(pieces)


def handlers(deps: Deps) -> dict[int, Handler]:
    queries = Queries(deps)
    return {
        codes.VIEW_MESSAGE_BY_ID: queries.view_message_by_id,
        codes.QUERY_MESSAGE: queries.query_message,
    }
