"""The one table from ferry's errors to gRPC status codes.

Servicers wrap their methods with `grpc_method` so a domain error becomes the
matching status with its message, and an unexpected exception is logged with
its traceback and answered as INTERNAL (the server keeps running).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from ferry.runtime import errors

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[errors.FerryError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StorageFault: grpc.StatusCode.UNAVAILABLE,  # the broker is stopping (fail-stop)
}


def status_of(error: errors.FerryError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        code = STATUS_BY_ERROR.get(cls)  # type: ignore[arg-type]
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


F = TypeVar("F", bound=Callable[..., Any])


def grpc_method(fn: F) -> F:
    """Map ferry errors raised by a unary `grpc.aio` servicer method to statuses."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except Exception as exc:
            await _abort(fn, context, exc)

    return wrapper  # type: ignore[return-value]


def grpc_stream_method(fn: F) -> F:
    """`grpc_method` for a method that yields its answers (server or bidirectional
    streaming): a ferry error ends the stream with its status."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for response in fn(self, request, context):
                yield response
        except Exception as exc:
            await _abort(fn, context, exc)

    return wrapper  # type: ignore[return-value]


async def _abort(fn: Callable[..., Any], context: grpc.aio.ServicerContext, exc: Exception) -> None:
    """End the call with the status of what `fn` raised (called while handling it)."""
    if isinstance(exc, errors.FerryError):
        await context.abort(status_of(exc), exc.message)
    log.exception("unexpected error in %s", fn.__qualname__)
    await context.abort(
        grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}; see the server log"
    )
