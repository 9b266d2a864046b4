"""Signed requests on the proxy: with an access key and secret key configured
(`ferry proxy --access-key AK --secret-key SK`, or $FERRY_PROXY_ACCESS_KEY and
$FERRY_PROXY_SECRET_KEY), every apache.rocketmq.v2 call must carry the
RocketMQ 5 SDKs' signature; health and reflection stay open. Without keys
everything is accepted, as RocketMQ's proxy does with ACL off.

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

import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2
from services.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

ENV_ACCESS_KEY = "FERRY_PROXY_ACCESS_KEY"
ENV_SECRET_KEY = "FERRY_PROXY_SECRET_KEY"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
CLIENT_ID = "x-mq-client-id"
ALGORITHM = "MQv2-HMAC-SHA1"
PROTECTED_PREFIX = "/apache.rocketmq.v2."
SHOWN_CHARS = 64  # of a client's access key in a refusal

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


class BadAuthorization(ValueError):
    """The authorization header is not the SDKs' MQv2-HMAC-SHA1 form."""


@dataclass(frozen=True)
class Authorization:
    algorithm: str
    access_key: str
    signed_headers: tuple[str, ...]
    signature: str  # hex, as sent


def parse_authorization(header: str) -> Authorization:
    """Read `MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=h1;h2, Signature=HEX`.

    Raises:
        BadAuthorization: another algorithm, or a part missing.
    """
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise BadAuthorization(f"the algorithm is {algorithm[:SHOWN_CHARS]!r}, not {ALGORITHM}")
    parts: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts[key] = value.strip()
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if k not in parts]
    if missing:
        raise BadAuthorization(f"it has no {', '.join(missing)}")
    return Authorization(
        algorithm=algorithm,
        # Early SDKs sent Credential=AK/region/service; RocketMQ reads the part before "/".
        access_key=parts["Credential"].split("/", 1)[0],
        signed_headers=tuple(h.strip().lower() for h in parts["SignedHeaders"].split(";")),
        signature=parts["Signature"],
    )


def _digest(secret_key: str, date_time: str) -> bytes:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).digest()


def sign(secret_key: str, date_time: str) -> str:
    """The signature an SDK sends: hex HMAC-SHA1 of the date-time, keyed by the secret key."""
    return _digest(secret_key, date_time).hex()


def signature_matches(secret_key: str, date_time: str, signature_hex: str) -> bool:
    try:
        given = bytes.fromhex(signature_hex)  # either case, as RocketMQ's proxy decodes it
    except ValueError:
        return False
    expected = _digest(secret_key, date_time)
    # compare_digest: how long it takes does not tell where the first wrong byte is.
    return hmac.compare_digest(given, expected)


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
    access_key: str, secret_key: str, metrics: ProxyMetrics | None = None
) -> Sequence[grpc.aio.ServerInterceptor]:
    """The signature check with both keys, none without; ValueError with only
    one. With `metrics`, its refusals are counted there."""
    check_keys(access_key, secret_key)
    if not access_key:
        return []
    return [SignatureInterceptor(access_key, secret_key, metrics=metrics)]
