"""The admin token: when a server has one, its state-changing RPCs require the
gRPC metadata `authorization: Bearer <token>`; reads stay open.

RocketMQ 4.x lets anyone who reaches a name server register a broker or wipe
a broker's write permission, and anyone who reaches a broker create or delete
topics. Here one shared token (a name server's `--admin-token` or
$FERRY_ADMIN_TOKEN, a broker's `adminToken`) closes that: a missing or wrong
token gets UNAUTHENTICATED before the servicer runs, so nothing changes. The
comparison takes the same time whatever the token's first wrong byte.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Collection, Sequence

import grpc

log = logging.getLogger(__name__)

METADATA_KEY = "authorization"
ENV_ADMIN_TOKEN = "FERRY_ADMIN_TOKEN"

# Full method names (/package.Service/Method) that change state.
NAMESRV_ADMIN_METHODS = frozenset(
    f"/ferry.v1.NameServer/{m}"
    for m in (
        "RegisterBroker",
        "UnregisterBroker",
        "BrokerHeartbeat",
        "KeepAlive",
        "PutKVConfig",
        "DeleteKVConfig",
        "WipeWritePermOfBroker",
        "AddWritePermOfBroker",
    )
)
BROKER_ADMIN_METHODS = frozenset(
    f"/ferry.v1.BrokerAdmin/{m}"
    for m in (
        "UpdateAndCreateTopic",
        "DeleteTopic",
        "UpdateAndCreateSubscriptionGroup",
        "DeleteSubscriptionGroup",
        "UpdateBrokerPermission",
        "DeleteExpiredCommitLog",
    )
)


def bearer(token: str) -> list[tuple[str, str]]:
    """The call metadata a client sends (none without a token)."""
    return [(METADATA_KEY, f"Bearer {token}")] if token else []


def client_metadata(admin_token: str | None) -> tuple[tuple[str, str], ...]:
    """A client's call metadata: its token, or with None $FERRY_ADMIN_TOKEN's."""
    token = os.environ.get(ENV_ADMIN_TOKEN, "") if admin_token is None else admin_token
    return tuple(bearer(token))


# deploy/k8s/base ships its Secrets (ferry-ha, ferry-admin) with values that
# start with this: a process that runs with one says so.
PLACEHOLDER_PREFIX = "REPLACE-ME"


def warn_if_placeholder(logger: logging.Logger, what: str, value: str, secret: str) -> None:
    if value.startswith(PLACEHOLDER_PREFIX):
        logger.warning(
            "%s is the placeholder shipped in deploy/k8s (%s...): anyone who has read the "
            "manifests knows it. Set the %s Secret to a random value (docs/guides/kubernetes.md)",
            what,
            PLACEHOLDER_PREFIX,
            secret,
        )


def token_matches(expected: str, header: str | None) -> bool:
    scheme, _, given = (header or "").partition(" ")
    # compare_digest: how long it takes does not tell where the first wrong byte is.
    return scheme == "Bearer" and hmac.compare_digest(given.encode(), expected.encode())


class AdminTokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to a protected method called without the token."""

    def __init__(self, token: str, methods: Collection[str]) -> None:
        if not token:
            raise ValueError("an admin token must not be empty")
        self._token = token
        self._methods = frozenset(methods)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in self._methods:
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        if token_matches(self._token, metadata.get(METADATA_KEY)):
            return handler
        why = "missing" if METADATA_KEY not in metadata else "wrong"
        log.warning("refused %s: %s admin token", method, why)
        return _refusal(handler, method, why)


def _refusal(handler: grpc.RpcMethodHandler, method: str, why: str) -> grpc.RpcMethodHandler:
    message = (
        f"{method} changes state and this server requires an admin token: the token is "
        f"{why}; send the metadata 'authorization: Bearer <token>' (ferry commands: "
        f"--admin-token or ${ENV_ADMIN_TOKEN}; brokers: adminToken in broker.conf)"
    )

    async def deny(request_or_iterator, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kind = (
        ("stream_" if handler.request_streaming else "unary_")
        + ("stream" if handler.response_streaming else "unary")
        + "_rpc_method_handler"
    )
    return getattr(grpc, kind)(
        deny,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def interceptors(token: str, methods: Collection[str]) -> Sequence[grpc.aio.ServerInterceptor]:
    return [AdminTokenInterceptor(token, methods)] if token else []
