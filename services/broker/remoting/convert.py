"""Header fields in, response codes out: the one table from ferry's errors to
RocketMQ's response codes, and the checked readers of a request's extFields.

The codes are chosen for what a 4.9 producer does with them: it sends again
to another broker on 1, 14, 16 and 17, and gives up on 13 (and on 2, which
4.9 never retries: ferry does not answer 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.headers import BadRequest, integer, text
from ferry.remoting.server import Connection, Handler

__all__ = [
    "BadRequest",
    "answering_errors",
    "boolean",
    "code_of",
    "error_answer",
    "integer",
    "text",
]
from ferry.runtime import errors
from services.broker.messaging.outgoing import MessageTooLarge

if TYPE_CHECKING:
    from services.broker.remoting.deps import Gate

_CODE_BY_ERROR: dict[type[errors.FerryError], int] = {
    errors.InvalidArgument: codes.MESSAGE_ILLEGAL,
    MessageTooLarge: codes.MESSAGE_ILLEGAL,  # a ResourceExhausted no other broker takes either
    errors.NotFound: codes.TOPIC_NOT_EXIST,
    errors.AlreadyExists: codes.TOPIC_EXIST_ALREADY,
    errors.PermissionDenied: codes.NO_PERMISSION,
    # A full disk, a fenced or deposed master, a starting broker, fail-stop:
    # every one of these is "send it elsewhere" for a 4.9 producer.
    errors.ResourceExhausted: codes.SERVICE_NOT_AVAILABLE,
    errors.Unavailable: codes.SERVICE_NOT_AVAILABLE,
    errors.StorageFault: codes.SERVICE_NOT_AVAILABLE,
    errors.FailedPrecondition: codes.SYSTEM_ERROR,
}


def code_of(error: errors.FerryError) -> int:
    for cls in type(error).__mro__:
        code = _CODE_BY_ERROR.get(cls)  # type: ignore[arg-type]
        if code is not None:
            return code
    return codes.SYSTEM_ERROR


def error_answer(
    request: Command, error: errors.FerryError, ext: Mapping[str, object] | None = None
) -> Command:
    """The answer for `error`. `ext`: the response header fields the client
    decodes whatever the code (Java reads a pull's nextBeginOffset even on
    errors; a send's extFields must never be absent)."""
    return request.answer(code_of(error), error.message, ext=ext)


def boolean(ext: Mapping[str, str], key: str, default: bool = False) -> bool:
    """Lenient, unlike ferry.remoting.headers.boolean: anything but "true" is
    false (what Java's Boolean.parseBoolean does with a send's flags)."""
    value = ext.get(key)
    if value is None or value == "":
        return default
    return value.lower() == "true"


def answering_errors(handler: Handler, gate: Gate | None = None) -> Handler:
    """`handler` whose domain and body errors become answers (1 with the reason,
    or the table's code); anything else is the server's to log. With `gate`,
    its `check()` runs first (14 while the broker starts or stops)."""

    async def handle(connection: Connection, command: Command) -> Command | None:
        try:
            if gate is not None:
                gate.check()
            return await handler(connection, command)
        except bodies.BodyError as e:
            return command.answer(codes.SYSTEM_ERROR, f"request body: {e}")
        except errors.InvalidArgument as e:
            return command.answer(codes.SYSTEM_ERROR, e.message)
        except errors.FerryError as e:
            return error_answer(command, e)

    return handle
