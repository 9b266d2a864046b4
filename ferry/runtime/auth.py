"""The admin token: when a server has one, its state-changing RPCs require the
gRPC metadata `authorization: Bearer <token>`; reads stay open.

RocketMQ 4.x lets anyone who reaches a name server register a broker or wipe
a broker's write permission, and anyone who reaches a broker create or delete
topics. Here one shared token (a name server's `--admin-token` or
$FERRY_ADMIN_TOKEN, a broker's `adminToken`) closes that: a missing or wrong
token gets UNAUTHENTICATED before the servicer runs, so nothing changes. The
comparison takes the same time whatever the token's first wrong byte.

RocketMQ's ACL (a broker's `aclEnable`, ferry.acl) opens another way in: a call
signed as the RocketMQ 5 SDKs sign theirs (MQv2-HMAC-SHA1, below) by an account
of the broker's plain_acl.yml with `admin: true`. With ACL on, a protected method
takes either the token (when the broker has one) or such a signature; anything
else is UNAUTHENTICATED (no or a bad signature, an unknown key) or
PERMISSION_DENIED (an account that is not admin), with a message saying what to do.

The SDKs' signature, which the v5 proxy checks too (one implementation, here):

    x-mq-date-time: 20261105T101500Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(key=secret key, message=the x-mq-date-time value)>

Only the date-time is signed and nobody checks it against a clock (as RocketMQ):
the signature proves the caller was given the secret key; on plaintext gRPC anyone
who reads a call can replay its headers.

Never logs or echoes a secret key or a signature.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import grpc

from ferry.acl import AclConfig, AclDenied, Reason
from ferry.runtime.acl_file import DenialLog

if TYPE_CHECKING:
    from ferry.runtime.acl_file import AclFile

log = logging.getLogger(__name__)

METADATA_KEY = "authorization"
ENV_ADMIN_TOKEN = "FERRY_ADMIN_TOKEN"
ENV_ACCESS_KEY = "FERRY_ACCESS_KEY"
ENV_SECRET_KEY = "FERRY_SECRET_KEY"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
SHOWN_CHARS = 64  # of a client's access key in a refusal

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


# ---------------------------------------------------------------- MQv2-HMAC-SHA1


class BadAuthorization(ValueError):
    """The authorization header is not the SDKs' MQv2-HMAC-SHA1 form."""


@dataclasses.dataclass(frozen=True)
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


def sign_v2(secret_key: str, date_time: str) -> str:
    """The signature an SDK sends: hex HMAC-SHA1 of the date-time, keyed by the secret key."""
    return _digest(secret_key, date_time).hex()


def v2_signature_matches(secret_key: str, date_time: str, signature_hex: str) -> bool:
    try:
        given = bytes.fromhex(signature_hex)  # either case, as RocketMQ's proxy decodes it
    except ValueError:
        return False
    # compare_digest: how long it takes does not tell where the first wrong byte is.
    return hmac.compare_digest(given, _digest(secret_key, date_time))


def signed(
    access_key: str, secret_key: str, now: dt.datetime | None = None
) -> list[tuple[str, str]]:
    """The call metadata of a call signed as the RocketMQ 5 SDKs sign (UTC date-time)."""
    when = now or dt.datetime.now(dt.UTC)
    date_time = when.strftime("%Y%m%dT%H%M%SZ")
    header = (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, "
        f"Signature={sign_v2(secret_key, date_time)}"
    )
    return [(METADATA_KEY, header), (DATE_TIME, date_time)]


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who a v2-signed call comes from. `white`: from an address a white list names, so
    neither its signature nor its permissions are checked (ferry.acl's steps 2 and 4)."""

    access_key: str | None
    white: bool = False


def authenticate_v2(
    config: AclConfig, metadata: Mapping[str, str], remote_ip: str, what_to_do: str
) -> Caller:
    """ferry.acl's steps 2-5 for a call signed MQv2-HMAC-SHA1: the caller, or AclDenied
    (NO_ACCESS_KEY, MALFORMED, UNKNOWN_ACCESS_KEY or BAD_SIGNATURE) saying what was
    wrong; `what_to_do` ends the messages about the credentials."""
    header = metadata.get(METADATA_KEY)
    access_key = None
    if header:
        try:
            auth = parse_authorization(header)
        except BadAuthorization as exc:
            if config.globally_white(remote_ip):
                return Caller(None, white=True)
            raise AclDenied(
                Reason.MALFORMED,
                f"the '{METADATA_KEY}' metadata is not '{ALGORITHM} Credential=<access key>, "
                f"SignedHeaders={DATE_TIME}, Signature=<hex>' ({exc}); {what_to_do}",
            ) from None
        access_key = auth.access_key or None
    if config.globally_white(remote_ip):
        return Caller(access_key, white=True)
    if not header:
        raise AclDenied(
            Reason.NO_ACCESS_KEY,
            f"the call carries no '{METADATA_KEY}' metadata and {remote_ip} is not in "
            f"globalWhiteRemoteAddresses of {config.source}; {what_to_do}",
        )
    if access_key is None:
        raise AclDenied(
            Reason.NO_ACCESS_KEY,
            f"the call names no access key (the client's credentials are empty); {what_to_do}",
        )
    account = config.account(access_key)
    shown = access_key[:SHOWN_CHARS]
    if account is None:
        raise AclDenied(
            Reason.UNKNOWN_ACCESS_KEY,
            f'access key "{shown}" is not in {config.source}; {what_to_do}',
            access_key=access_key,
        )
    if account.white_remote_address.matches(remote_ip):
        return Caller(access_key, white=True)
    date_time = metadata.get(DATE_TIME)
    if DATE_TIME not in auth.signed_headers or not date_time:
        raise AclDenied(
            Reason.MALFORMED,
            f"the signature must cover the '{DATE_TIME}' metadata, sent with the call; sign "
            "as the RocketMQ 5 SDKs do",
            access_key=access_key,
        )
    if not v2_signature_matches(account.secret_key, date_time, auth.signature):
        raise AclDenied(
            Reason.BAD_SIGNATURE,
            f'bad signature for access key "{shown}": the client\'s secret key is not the '
            f"one {config.source} has for it; give the client the secret key that goes with it",
            access_key=access_key,
        )
    return Caller(access_key)


def remote_ip(peer: str) -> str:
    """The address of a gRPC peer ("ipv4:1.2.3.4:5", "ipv6:[::1]:5") without its port."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition("]")[0].lstrip("[") if "]" in rest else rest.rpartition(":")[0]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


# ---------------------------------------------------------------- clients


@dataclasses.dataclass(frozen=True)
class AdminCredentials:
    """What a ferry command authorizes its admin calls with: the admin token and/or an
    ACL access key with its secret key (None: from $FERRY_ADMIN_TOKEN,
    $FERRY_ACCESS_KEY, $FERRY_SECRET_KEY)."""

    token: str | None = None
    access_key: str | None = None
    secret_key: str | None = dataclasses.field(default=None, repr=False)


def client_metadata(
    admin: str | AdminCredentials | None,
) -> tuple[tuple[str, str], ...]:
    """A client's call metadata: signed MQv2-HMAC-SHA1 when it has an access key and a
    secret key, else its admin token's Bearer header (a string is a token); what is not
    given comes from the environment."""
    creds = admin if isinstance(admin, AdminCredentials) else AdminCredentials(token=admin)
    env = os.environ.get
    access_key = env(ENV_ACCESS_KEY, "") if creds.access_key is None else creds.access_key
    secret_key = env(ENV_SECRET_KEY, "") if creds.secret_key is None else creds.secret_key
    if access_key and secret_key:
        return tuple(signed(access_key, secret_key))
    token = env(ENV_ADMIN_TOKEN, "") if creds.token is None else creds.token
    return tuple(bearer(token))


class CredentialAction(argparse.Action):
    """--admin-token, --access-key and --secret-key all land in one AdminCredentials
    (`dest`), in whatever order they are given."""

    def __init__(self, option_strings, dest, part: str = "token", **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.part = part

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest, None)
        if not isinstance(current, AdminCredentials):
            current = AdminCredentials(token=current)
        setattr(namespace, self.dest, dataclasses.replace(current, **{self.part: values}))


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


class AdminAclInterceptor(grpc.aio.ServerInterceptor):
    """With RocketMQ's ACL on: a protected method needs the admin token (when there is
    one) or an MQv2-HMAC-SHA1 signature of an admin account of the ACL file."""

    def __init__(self, acl: AclFile, methods: Collection[str], token: str = "") -> None:
        self._acl = acl
        self._methods = frozenset(methods)
        self._token = token
        self._denials = DenialLog(log)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in self._methods:
            return handler
        metadata = {
            k: v for k, v in (handler_call_details.invocation_metadata or ()) if isinstance(v, str)
        }
        if self._token and token_matches(self._token, metadata.get(METADATA_KEY)):
            return handler
        return _checked(handler, lambda context: self._refusal(method, metadata, context))

    def _refusal(
        self, method: str, metadata: Mapping[str, str], context: grpc.aio.ServicerContext
    ) -> tuple[grpc.StatusCode, str] | None:
        config = self._acl.config
        what_to_do = (
            f"sign admin calls with the access key and secret key of an account with admin: "
            f"true in {config.source} (ferry commands: --access-key/--secret-key or "
            f"${ENV_ACCESS_KEY}/${ENV_SECRET_KEY}" + (", or --admin-token)" if self._token else ")")
        )
        try:
            caller = authenticate_v2(config, metadata, remote_ip(context.peer()), what_to_do)
            if caller.white:
                return None
            assert caller.access_key is not None
            config.authorize(caller.access_key, {}, admin_required=True, what=method)
        except AclDenied as denied:
            self._denials.denied(denied, method, context.peer())
            code = (
                grpc.StatusCode.PERMISSION_DENIED
                if denied.reason in (Reason.ADMIN_REQUIRED, Reason.NO_PERMISSION)
                else grpc.StatusCode.UNAUTHENTICATED
            )
            return code, str(denied)
        return None


def _checked(
    handler: grpc.RpcMethodHandler,
    refusal: Callable[[grpc.aio.ServicerContext], tuple[grpc.StatusCode, str] | None],
) -> grpc.RpcMethodHandler:
    """`handler` (unary-unary) behind `refusal`, which sees the call's context."""
    if handler.request_streaming or handler.response_streaming:
        raise ValueError("only unary methods can be checked")
    behaviour = handler.unary_unary

    async def checked(request, context: grpc.aio.ServicerContext):
        why = refusal(context)
        if why is not None:
            await context.abort(*why)
        return await behaviour(request, context)

    return grpc.unary_unary_rpc_method_handler(
        checked,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def interceptors(
    token: str, methods: Collection[str], acl: AclFile | None = None
) -> Sequence[grpc.aio.ServerInterceptor]:
    """The admin-token check, or with `acl` (RocketMQ's ACL on) the check that takes the
    token or an admin account's signature."""
    if acl is not None:
        return [AdminAclInterceptor(acl, methods, token)]
    return [AdminTokenInterceptor(token, methods)] if token else []
