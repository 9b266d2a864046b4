"""Signed requests on the proxy: with an access key and secret key configured
(`ferry proxy --access-key AK --secret-key SK`, or $FERRY_PROXY_ACCESS_KEY and
$FERRY_PROXY_SECRET_KEY), every apache.rocketmq.v2 call must carry the
RocketMQ 5 SDKs' signature; health and reflection stay open. Without keys
everything is accepted, as RocketMQ's proxy does with ACL off.

With a plain_acl.yml instead (`ferry proxy --acl-file PATH`, $FERRY_PROXY_ACL_FILE;
the brokers' `aclFile`, one file for every door), `AclInterceptor` checks each call
as RocketMQ 5's proxy did with its 4.x plain ACL (PlainAccessResource.parse for
gRPC, before RIP-77): the signature against the secret key the file has for the
call's access key, the global and the account's white addresses (which skip the
signature and the permissions, as on the brokers; an unsigned call from a global
white address passes, where Apache's proxy fails it), then the permissions the
call needs (`required_v2`): SendMessage, EndTransaction, RecallMessage: PUB on the
topic; ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue, QueryAssignment: SUB on topic and group;
QueryRoute: PUB or SUB on the topic; a consumer's Heartbeat and a
NotifyClientTermination naming a group: SUB on the group; Telemetry's settings:
PUB on each published topic, SUB on the subscription's group and topics. A wrong
or missing signature is UNAUTHORIZED, a missing permission FORBIDDEN (Apache's
proxy answered both with the gRPC status PERMISSION_DENIED), each with a message
naming what is missing and what to do; the file is re-read when it changes.

What the SDKs send (rocketmq-python-client's `v5/util/signature.py`; the Java,
Go and C++ SDKs build the same header), as call metadata:

    x-mq-date-time: 20261105T101500Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(key=secret key, message=the x-mq-date-time value)>

The proxy recomputes the HMAC with the secret key it has for that access key
and compares the digests in constant time. Only the date-time is signed, not
the request: the signature proves the client was given the secret key, and
anyone who can read a request (plaintext gRPC) can replay its headers.

No clock-skew window: RocketMQ's proxy does not check x-mq-date-time against
its clock, and neither does this. The Python SDK could not pass one anyway: it
signs its local time (`datetime.now()`) with a `Z` suffix, so outside UTC its
date-time is hours off.

A refused call is answered as RocketMQ's proxy answers it: the method's own
response with a v2 `Status` of UNAUTHORIZED (40100) and a message saying what
was wrong and what to do, under gRPC status OK. That `Status` is what the SDKs
check and turn into their UnauthorizedException; a gRPC error would reach them
as a bare transport error instead. The servicer is not called; the refusal is
counted in `ferry_proxy_requests_total` with code="UNAUTHORIZED", as every other
answer is counted by its v2 code.

Owns no state beyond the configured keys; never logs or echoes the secret key.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2
from ferry.acl import AclDenied, Perm, Reason, Resource
from ferry.runtime.acl_file import AclFile, DenialLog
from ferry.runtime.auth import (
    ALGORITHM,
    DATE_TIME,
    Authorization,
    BadAuthorization,
    Caller,
    authenticate_v2,
    parse_authorization,
    remote_ip,
)
from ferry.runtime.auth import METADATA_KEY as AUTHORIZATION
from ferry.runtime.auth import sign_v2 as sign
from ferry.runtime.auth import v2_signature_matches as signature_matches
from ferry.runtime.tls_sniff import PeerBook
from services.proxy import convert
from services.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

ENV_ACCESS_KEY = "FERRY_PROXY_ACCESS_KEY"
ENV_SECRET_KEY = "FERRY_PROXY_SECRET_KEY"
ENV_ACL_FILE = "FERRY_PROXY_ACL_FILE"
CLIENT_ID = "x-mq-client-id"
PROTECTED_PREFIX = "/apache.rocketmq.v2."
SHOWN_CHARS = 64  # of a client's access key in a refusal
__all__ = [
    "ALGORITHM",
    "AUTHORIZATION",
    "DATE_TIME",
    "AclInterceptor",
    "Authorization",
    "BadAuthorization",
    "SignatureInterceptor",
    "interceptors",
    "parse_authorization",
    "refusal_reason",
    "required_v2",
    "sign",
    "signature_matches",
]

_SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
# Full method name -> its response message, every one of which has a `status` field.
RESPONSE_TYPES: Mapping[str, type[Message]] = {
    f"/{_SERVICE.full_name}/{m.name}": GetMessageClass(m.output_type) for m in _SERVICE.methods
}

_WHAT_TO_DO = (
    "give the client this proxy's access key and secret key (RocketMQ SDKs: "
    "ClientConfiguration(endpoint, Credentials(access_key, secret_key)); the proxy's are "
    f"ferry proxy --access-key/--secret-key or ${ENV_ACCESS_KEY}/${ENV_SECRET_KEY})"
)


def refusal_reason(access_key: str, secret_key: str, metadata: Mapping[str, str]) -> str | None:
    """None when `metadata` carries a valid signature for `access_key`, else
    what is wrong and what to do, for the client to read."""
    header = metadata.get(AUTHORIZATION)
    if not header:
        return (
            f"the request has no '{AUTHORIZATION}' metadata: this proxy accepts signed "
            f"requests only; {_WHAT_TO_DO}"
        )
    try:
        auth = parse_authorization(header)
    except BadAuthorization as exc:
        return (
            f"the '{AUTHORIZATION}' metadata is not '{ALGORITHM} Credential=<access key>, "
            f"SignedHeaders={DATE_TIME}, Signature=<hex>' ({exc}); sign requests as the "
            f"RocketMQ 5 SDKs do and {_WHAT_TO_DO}"
        )
    if not auth.access_key:
        return (
            f"the request names no access key (the client's credentials are empty); {_WHAT_TO_DO}"
        )
    if not hmac.compare_digest(auth.access_key.encode(), access_key.encode()):
        return (
            f"access key {auth.access_key[:SHOWN_CHARS]!r} is unknown to this proxy; {_WHAT_TO_DO}"
        )
    if DATE_TIME not in auth.signed_headers:
        return (
            f"the signature does not cover {DATE_TIME} (SignedHeaders="
            f"{';'.join(auth.signed_headers)[:SHOWN_CHARS]}); sign it as the RocketMQ 5 SDKs do"
        )
    date_time = metadata.get(DATE_TIME)
    if not date_time:
        return f"the request has no '{DATE_TIME}' metadata, which the signature covers; send it"
    if not signature_matches(secret_key, date_time, auth.signature):
        return (
            f"bad signature for access key {auth.access_key!r}: the client's secret key is "
            "not the one this proxy has for that access key; give the client the secret key "
            f"that goes with it (the proxy's: --secret-key or ${ENV_SECRET_KEY})"
        )
    return None


def check_keys(access_key: str, secret_key: str) -> None:
    """Raises ValueError naming the bad setting."""
    if bool(access_key) != bool(secret_key):
        raise ValueError(
            "access key and secret key go together: set both (every request must then be "
            "signed) or neither (requests are not checked)"
        )
    bad = [c for c in ",/= \t\r\n" if c in access_key]
    if bad:
        raise ValueError(
            f"the access key must not contain {''.join(bad)!r}: the SDKs' authorization "
            "header could not carry it"
        )


class SignatureInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHORIZED to an apache.rocketmq.v2 call without a valid signature."""

    def __init__(
        self,
        access_key: str,
        secret_key: str,
        response_types: Mapping[str, type[Message]] = RESPONSE_TYPES,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        check_keys(access_key, secret_key)
        if not access_key:
            raise ValueError("a signature check needs an access key and a secret key")
        self._access_key = access_key
        self._secret_key = secret_key
        self._response_types = dict(response_types)
        self._metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(PROTECTED_PREFIX):
            return handler
        metadata = {
            k: v for k, v in (handler_call_details.invocation_metadata or ()) if isinstance(v, str)
        }
        why = refusal_reason(self._access_key, self._secret_key, metadata)
        if why is None:
            return handler
        log.warning(
            "refused %s client_id=%s: %s",
            method,
            metadata.get(CLIENT_ID, "")[:SHOWN_CHARS],
            why.partition(";")[0],
        )
        return _refusal(handler, self._response_types.get(method), why, self._counter(method))

    def _counter(self, method: str) -> Callable[[float], None] | None:
        """What counts a refusal of `method` (started at the given perf_counter)."""
        metrics = self._metrics
        if metrics is None:
            return None
        rpc = method.rsplit("/", 1)[-1]
        code = v2.Code.Name(v2.UNAUTHORIZED)

        def count(started: float) -> None:
            metrics.observe(rpc, code, time.perf_counter() - started)

        return count


def _refusal(
    handler: grpc.RpcMethodHandler,
    response_type: type[Message] | None,
    why: str,
    count: Callable[[float], None] | None = None,
) -> grpc.RpcMethodHandler:
    status = v2.Status(code=v2.UNAUTHORIZED, message=why)
    started = time.perf_counter()

    def answer() -> Message:
        if count is not None:
            count(started)
        return response_type(status=status)  # type: ignore[misc]

    if response_type is None:  # not a MessagingService method: no Status to answer with

        async def deny(request_or_iterator, context: grpc.aio.ServicerContext):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        unary, streamed = deny, deny
    else:

        async def unary(request_or_iterator, context):
            return answer()

        async def streamed(request_or_iterator, context):
            yield answer()

    behaviour = streamed if handler.response_streaming else unary
    kind = (
        ("stream_" if handler.request_streaming else "unary_")
        + ("stream" if handler.response_streaming else "unary")
        + "_rpc_method_handler"
    )
    return getattr(grpc, kind)(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def interceptors(
    access_key: str,
    secret_key: str,
    metrics: ProxyMetrics | None = None,
    acl: AclFile | None = None,
    peers: PeerBook | None = None,
) -> Sequence[grpc.aio.ServerInterceptor]:
    """The signature check with both keys, none without; ValueError with only
    one; with `acl` (and no keys), the plain_acl.yml check, which reads the
    clients' addresses from `peers` when a relay stands in front. With
    `metrics`, its refusals are counted there."""
    check_keys(access_key, secret_key)
    if acl is not None:
        if access_key:
            raise ValueError("give either --acl-file or --access-key/--secret-key, not both")
        return [AclInterceptor(acl, metrics=metrics, peers=peers)]
    if not access_key:
        return []
    return [SignatureInterceptor(access_key, secret_key, metrics=metrics)]


# ---------------------------------------------------------------- plain_acl.yml


class Unreadable(ValueError):
    """A request that does not say what it needs (a consumer heartbeat without a group)."""


def required_v2(rpc: str, request: Message) -> dict[Resource, Perm]:
    """The topics and groups an apache.rocketmq.v2 call uses and the permission each
    needs (the module doc's table); a call not listed needs none. Unreadable for a
    consumer's Heartbeat without a group or Telemetry settings that neither publish
    nor subscribe."""
    needs: dict[Resource, Perm] = {}

    def topic(resource: v2.Resource, perm: Perm) -> None:
        needs[Resource.topic(convert.topic_name(resource))] = perm

    def group(resource: v2.Resource) -> None:
        needs[Resource.group(convert.topic_name(resource))] = Perm.SUB

    r = request
    if rpc == "SendMessage":
        for message in r.messages:  # type: ignore[attr-defined]
            topic(message.topic, Perm.PUB)
    elif rpc in ("EndTransaction", "RecallMessage"):
        topic(r.topic, Perm.PUB)  # type: ignore[attr-defined]
    elif rpc == "ReceiveMessage":
        group(r.group)  # type: ignore[attr-defined]
        topic(r.message_queue.topic, Perm.SUB)  # type: ignore[attr-defined]
    elif rpc in (
        "AckMessage",
        "ChangeInvisibleDuration",
        "ForwardMessageToDeadLetterQueue",
        "QueryAssignment",
    ):
        group(r.group)  # type: ignore[attr-defined]
        topic(r.topic, Perm.SUB)  # type: ignore[attr-defined]
    elif rpc == "QueryRoute":
        topic(r.topic, Perm.ANY)  # type: ignore[attr-defined]
    elif rpc == "Heartbeat":
        if r.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER):  # type: ignore[attr-defined]
            if not r.HasField("group"):
                raise Unreadable("a consumer's heartbeat names no group")
            group(r.group)  # type: ignore[attr-defined]
    elif rpc == "NotifyClientTermination":
        if r.group.name.strip():  # type: ignore[attr-defined]
            group(r.group)  # type: ignore[attr-defined]
    elif rpc == "Telemetry" and r.WhichOneof("command") == "settings":
        settings = r.settings  # type: ignore[attr-defined]
        if not settings.HasField("publishing") and not settings.HasField("subscription"):
            raise Unreadable("telemetry settings that neither publish nor subscribe")
        for t in settings.publishing.topics:
            topic(t, Perm.PUB)
        if settings.HasField("subscription"):
            group(settings.subscription.group)
            for entry in settings.subscription.subscriptions:
                topic(entry.topic, Perm.SUB)
    return needs


_ACL_WHAT_TO_DO = (
    "give the client an access key and secret key of {source} (RocketMQ SDKs: "
    "ClientConfiguration(endpoint, Credentials(access_key, secret_key)))"
)


class AclInterceptor(grpc.aio.ServerInterceptor):
    """Checks every apache.rocketmq.v2 call against a plain_acl.yml (the module doc):
    the call's own response with UNAUTHORIZED or FORBIDDEN when refused, the servicer
    never called. A Telemetry stream is checked command by command; the first refused
    one ends it with that status."""

    def __init__(
        self,
        acl: AclFile,
        response_types: Mapping[str, type[Message]] = RESPONSE_TYPES,
        metrics: ProxyMetrics | None = None,
        peers: PeerBook | None = None,
    ) -> None:
        """`peers`: behind a permissive port's relay, where the clients really are
        (the server sees 127.0.0.1 for all of them; an ACL's remote-address rules
        must not)."""
        self._acl = acl
        self._response_types = dict(response_types)
        self._metrics = metrics
        self._denials = DenialLog(log)
        self._peers = peers

    def _peer(self, context) -> str:
        peer = context.peer()
        return peer if self._peers is None else self._peers.real(peer)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        response_type = self._response_types.get(method)
        if handler is None or response_type is None:
            return handler  # health, reflection, the broker's own services
        metadata = {
            k: v for k, v in (handler_call_details.invocation_metadata or ()) if isinstance(v, str)
        }
        return self._checked(handler, method, response_type, metadata)

    def _authenticate(
        self, method: str, metadata: Mapping[str, str], context
    ) -> Caller | v2.Status:
        config = self._acl.config
        try:
            return authenticate_v2(
                config,
                metadata,
                remote_ip(self._peer(context)),
                _ACL_WHAT_TO_DO.format(source=config.source),
            )
        except AclDenied as denied:
            self._denials.denied(denied, method, self._peer(context))
            return v2.Status(code=v2.UNAUTHORIZED, message=str(denied))

    def _authorize(
        self, method: str, caller: Caller, request: Message, context
    ) -> v2.Status | None:
        if caller.white:
            return None
        assert caller.access_key is not None
        try:
            try:
                needs = required_v2(method.rsplit("/", 1)[-1], request)
            except Unreadable as exc:
                raise AclDenied(Reason.MALFORMED, str(exc), access_key=caller.access_key) from None
            self._acl.config.authorize(caller.access_key, needs, what=method)
        except AclDenied as denied:
            self._denials.denied(denied, method, self._peer(context))
            return v2.Status(code=v2.FORBIDDEN, message=str(denied))
        return None

    def _checked(
        self,
        handler: grpc.RpcMethodHandler,
        method: str,
        response_type: type[Message],
        metadata: Mapping[str, str],
    ) -> grpc.RpcMethodHandler:
        rpc = method.rsplit("/", 1)[-1]

        def refused(status: v2.Status, started: float) -> Message:
            if self._metrics is not None:
                code = v2.Code.Name(status.code)
                self._metrics.observe(rpc, code, time.perf_counter() - started)
            return response_type(status=status)  # type: ignore[call-arg]

        def decide(request: Message, context) -> v2.Status | None:
            caller = self._authenticate(method, metadata, context)
            if isinstance(caller, v2.Status):
                return caller
            return self._authorize(method, caller, request, context)

        if not handler.request_streaming and not handler.response_streaming:
            unary = handler.unary_unary

            async def unary_unary(request, context):
                started = time.perf_counter()
                status = decide(request, context)
                if status is not None:
                    return refused(status, started)
                return await unary(request, context)

            behaviour, kind = unary_unary, grpc.unary_unary_rpc_method_handler
        elif not handler.request_streaming:
            stream = handler.unary_stream

            async def unary_stream(request, context):
                started = time.perf_counter()
                status = decide(request, context)
                if status is not None:
                    yield refused(status, started)
                    return
                async for answer in stream(request, context):
                    yield answer

            behaviour, kind = unary_stream, grpc.unary_stream_rpc_method_handler
        else:
            streams = handler.stream_stream if handler.response_streaming else None
            if streams is None:
                return handler  # MessagingService has no client-streaming unary method

            async def stream_stream(request_iterator, context):
                started = time.perf_counter()
                caller = self._authenticate(method, metadata, context)
                if isinstance(caller, v2.Status):
                    yield refused(caller, started)
                    return
                denial: list[v2.Status] = []

                async def allowed():
                    async for command in request_iterator:
                        status = self._authorize(method, caller, command, context)
                        if status is not None:
                            denial.append(status)
                            return
                        yield command

                async for answer in streams(allowed(), context):
                    yield answer
                if denial:
                    yield refused(denial[0], time.perf_counter())

            behaviour, kind = stream_stream, grpc.stream_stream_rpc_method_handler
        return kind(
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
