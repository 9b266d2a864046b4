"""RocketMQ 4.x's plain ACL: the `plain_acl.yml` accounts, the request signature Apache's
Java client computes, and the allow-or-deny decision of Apache RocketMQ 4.9's
`PlainAccessValidator`, as one pure module every door can use.

The file (Apache's names; any key missing means what the comment says):

    globalWhiteRemoteAddresses: ["10.10.*.*"]   # these addresses skip every check
    accounts:
      - accessKey: rocketmq2                    # more than 6 characters
        secretKey: "12345678"                   # more than 6 characters
        whiteRemoteAddress: 192.168.1.*         # this key from there skips the signature
        admin: false                            # and its permissions
        defaultTopicPerm: DENY                  # a topic not in topicPerms (absent: DENY)
        defaultGroupPerm: SUB                   # a group not in groupPerms (absent: DENY)
        topicPerms: ["TopicA=PUB|SUB", "TopicB=PUB"]
        groupPerms: ["GroupA=SUB"]

Permission words: DENY, PUB, SUB, PUB|SUB (or SUB|PUB). Address patterns: an address, `*`,
`192.168.*.*`, `192.168.1.1-10`, `192.168.1.{1,2}`, or a comma-separated list.

The signature (`sign`): Base64(HmacSHA1(key=UTF-8 secret key, message=the values of the
request's ext fields, all but `Signature`, concatenated in the order of their names, as
UTF-8, then the body)). The client's `AccessKey` and, when it has one, `SecurityToken` are
ext fields too, so they are signed; the request's header fields are ext fields as the
client sends them (`signature_matches` says what ferry does about `_UNIQUE_KEY_QUERY`).

What `AclChecker.check` decides, in Apache's order:
1. the permissions the request code needs, read from its ext fields and body
   (`required_permissions`); a request that cannot be read is denied;
2. an address in globalWhiteRemoteAddresses: allowed;
3. no AccessKey, or one the file does not list: denied;
4. the account's whiteRemoteAddress matches: allowed (no signature, no permissions);
5. a wrong signature: denied;
6. a send to RMQ_SYS_TRACE_TOPIC (message trace): allowed;
7. an admin-only code from a key that is not admin: denied;
8. each permission needed: the account's entry for that topic or group, else its default,
   must grant it (DENY grants nothing). An admin account without any topicPerms or
   groupPerms entry is granted everything.

Where ferry is stricter than Apache 4.9 (each named where it is decided): an unknown
permission word, a malformed `name=PERM` entry, a duplicate access key or an address pattern
Apache would misread is a load error here, not a silent DENY or a skipped account; a batch
send (SEND_BATCH_MESSAGE, 320) needs PUB on its topic, which Apache does not check; and
IPv6 wildcard and range patterns are refused. Where it is more lenient: a query by key
(QUERY_MESSAGE) signed as the Java client signs it passes, which Apache refuses.

Pure: no I/O besides `load_acl` reading its file, no logging, no clock. Never puts a
secret key in a message, exception or repr.
"""

from __future__ import annotations

import base64
import enum
import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ferry.model import RETRY_TOPIC_PREFIX
from ferry.remoting import codes
from ferry.remoting.bodies import BodyError, loads

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
MIN_KEY_CHARS = 7  # Apache refuses an access or secret key of 6 characters or fewer
SHOWN_CHARS = 64  # of a client's access key in a denial
WHITE_CACHE_SIZE = 4096  # client addresses whose global-white answer is kept


class Perm(enum.IntFlag):
    """Apache's permission bits. ANY is only ever needed (PUB or SUB satisfies it)."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


PERM_WORDS: Mapping[str, Perm] = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


def perm_word(perm: Perm) -> str:
    if perm & Perm.DENY:
        return "DENY"
    if perm & Perm.ANY:
        return "PUB or SUB"
    return "|".join(w for w, p in (("PUB", Perm.PUB), ("SUB", Perm.SUB)) if perm & p)


def permits(owned: Perm, needed: Perm) -> bool:
    """Apache's `Permission.checkPermission`: DENY grants nothing; ANY needs PUB or SUB;
    otherwise one shared bit is enough."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# ---------------------------------------------------------------- resources
@dataclass(frozen=True)
class Resource:
    """A topic or a consumer group. Apache keys a group by its retry topic (`%RETRY%G`), so
    a topic named `%RETRY%G` is group G."""

    kind: str  # "topic" | "group"
    name: str

    @classmethod
    def topic(cls, name: str) -> Resource:
        if name.startswith(RETRY_TOPIC_PREFIX):
            return cls("group", name[len(RETRY_TOPIC_PREFIX) :])
        return cls("topic", name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls("group", name)

    @property
    def is_group(self) -> bool:
        return self.kind == "group"

    def __str__(self) -> str:
        return f'{self.kind} "{_shown(self.name)}"'


# ---------------------------------------------------------------- addresses
class _Match(enum.Enum):
    NEVER = "never"
    ALWAYS = "always"
    ONE_OF = "one of"
    RANGE = "range"


@dataclass(frozen=True)
class AddressPattern:
    """A whiteRemoteAddress or globalWhiteRemoteAddresses entry; `matches(ip)` takes the
    client's address without its port."""

    text: str
    kind: _Match
    addresses: frozenset[str] = frozenset()  # ONE_OF: normalised addresses
    head: str = ""  # RANGE: the fixed leading numbers with their dots ("192.168.")
    index: int = 0  # RANGE: which of the four numbers is the range
    low: int = 0
    high: int = 0

    def matches(self, ip: str) -> bool:
        if self.kind is _Match.ALWAYS:
            return True
        if self.kind is _Match.NEVER or not ip:
            return False
        if self.kind is _Match.ONE_OF:
            return _normalised(ip) in self.addresses
        parts = ip.split(".")
        if len(parts) != 4 or not ip.startswith(self.head) or not _is_ipv4(ip):
            return False
        return self.low <= int(parts[self.index]) <= self.high


def _is_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(_octet(p) is not None for p in parts)


def _octet(text: str) -> int | None:
    """0..255 written without sign or leading zero (commons-validator's IPv4 rule)."""
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return None
    value = int(text)
    return value if value <= 255 else None


def _normalised(ip: str) -> str | None:
    if _is_ipv4(ip):
        return ip
    try:
        return ipaddress.IPv6Address(ip).exploded.upper()
    except ValueError:
        return None


def parse_address_pattern(text: str | None) -> AddressPattern:
    """Apache's `RemoteAddressStrategyFactory` forms; ValueError for one it would misread
    or fail on."""
    if text is None or not text.strip():
        return AddressPattern(text or "", _Match.NEVER)
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return AddressPattern(text, _Match.ALWAYS)
    if text.endswith("}"):
        start = text.find("{")
        if start < 0 or (":" not in text and text.count(".") != 3) or "." in text[start:]:
            raise ValueError(
                f"{text!r}: write a brace list as the last part of the address, "
                "e.g. 192.168.1.{1,2}"
            )
        items = [i for i in text[start + 1 : -1].split(",") if i]
        return _one_of(text, [text[:start] + item for item in items])
    if "," in text:
        return _one_of(text, [i for i in text.split(",") if i])
    if "*" in text or "-" in text:
        return _range(text)
    return _one_of(text, [text])


def _one_of(text: str, items: list[str]) -> AddressPattern:
    addresses = set()
    for item in items:
        address = _normalised(item)
        if address is None:
            raise ValueError(f"{text!r}: {item!r} is not an IPv4 or IPv6 address")
        addresses.add(address)
    if not addresses:
        raise ValueError(f"{text!r} lists no address")
    return AddressPattern(text, _Match.ONE_OF, frozenset(addresses))


def _range(text: str) -> AddressPattern:
    if ":" in text:
        raise ValueError(
            f"{text!r}: ferry takes IPv6 white addresses whole or as a list, not with * or a range"
        )
    parts = text.split(".")
    if len(parts) != 4:
        raise ValueError(f"{text!r}: an IPv4 pattern has four numbers, e.g. 192.168.*.*")
    index = next((i for i, p in enumerate(parts) if p == "*" or "-" in p), 0)
    if index == 0 or any(_octet(p) is None for p in parts[:index]):
        raise ValueError(
            f"{text!r}: the numbers before the first * or range must be plain, "
            "e.g. 192.168.*.* or 192.168.1.1-10"
        )
    low, high = _span(text, parts[index])
    if any(p != "*" for p in parts[index + 1 :]):
        # Apache ignores what follows the range: 192.168.*.5 would admit all of 192.168.
        raise ValueError(
            f"{text!r}: only * may follow a * or a range (RocketMQ ignores the rest, so "
            f"this would match every address starting {'.'.join(parts[:index])}.); "
            "list the addresses instead"
        )
    head = "".join(p + "." for p in parts[:index])
    return AddressPattern(text, _Match.RANGE, head=head, index=index, low=low, high=high)


def _span(text: str, part: str) -> tuple[int, int]:
    if part == "*":
        return 0, 255
    low_text, _, high_text = part.partition("-")
    low, high = _octet(low_text), _octet(high_text)
    if low is None or high is None or low > high:
        raise ValueError(f"{text!r}: {part!r} is not a range like 1-10 within 0..255")
    return low, high


# ---------------------------------------------------------------- accounts
@dataclass(frozen=True)
class Account:
    """One `accounts:` entry. `perms` holds its topicPerms and groupPerms entries (a
    groupPerms entry overridden by a topicPerms one for `%RETRY%G`, as in Apache)."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern = field(
        default_factory=lambda: AddressPattern("", _Match.NEVER)
    )
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    perms: Mapping[Resource, Perm] = field(default_factory=dict)

    def perm_of(self, resource: Resource) -> Perm:
        """What this account holds on `resource`: its entry, else its default."""
        if resource in self.perms:
            return self.perms[resource]
        return self.default_group_perm if resource.is_group else self.default_topic_perm

    def allows(self, resource: Resource, needed: Perm) -> bool:
        """Whether this account may use `resource` so (an admin account without entries
        may use anything)."""
        if self.admin and not self.perms:
            return True
        return permits(self.perm_of(resource), needed)


@dataclass(frozen=True)
class AclConfig:
    """A loaded plain_acl.yml. `source` names the file in messages."""

    accounts: Mapping[str, Account] = field(default_factory=dict)
    global_white_addresses: tuple[AddressPattern, ...] = ()
    source: str = "plain_acl.yml"
    # globally_white's answers by address (a client's address is asked on every request).
    _white: dict[str, bool] = field(default_factory=dict, init=False, compare=False, repr=False)

    def account(self, access_key: str) -> Account | None:
        return self.accounts.get(access_key)

    def secret_of(self, access_key: str) -> str | None:
        """The secret key of `access_key` (for a door that signs differently, such as the
        v5 proxy's MQv2-HMAC-SHA1), None when the file does not list it."""
        account = self.accounts.get(access_key)
        return None if account is None else account.secret_key

    def globally_white(self, ip: str) -> bool:
        known = self._white.get(ip)
        if known is None:
            if len(self._white) >= WHITE_CACHE_SIZE:
                self._white.clear()
            known = self._white[ip] = any(p.matches(ip) for p in self.global_white_addresses)
        return known

    def authorize(
        self,
        access_key: str,
        needs: Mapping[Resource, Perm],
        *,
        admin_required: bool = False,
        what: str = "this request",
    ) -> Account:
        """Steps 7-8 of the module doc for an access key already authenticated by its door:
        the account, or AclDenied naming the first permission it lacks. `what` names the
        request in the admin message ("request code 17 (UPDATE_AND_CREATE_TOPIC)")."""
        account = self.accounts.get(access_key)
        if account is None:
            raise _unknown_key(access_key, self.source)
        if admin_required and not account.admin:
            raise AclDenied(
                Reason.ADMIN_REQUIRED,
                f'{what} needs an admin account and access key "{_shown(access_key)}" '
                f"is not one ({self.source}: admin: true on that account)",
                access_key=access_key,
            )
        if account.admin and not account.perms:
            return account
        for resource, needed in needs.items():
            if not account.allows(resource, needed):
                raise _lacks(account, resource, needed, self.source)
        return account


def _lacks(account: Account, resource: Resource, needed: Perm, source: str) -> AclDenied:
    plural = "groupPerms" if resource.is_group else "topicPerms"
    default = "defaultGroupPerm" if resource.is_group else "defaultTopicPerm"
    word = "SUB" if needed & Perm.ANY else perm_word(needed)
    if resource in account.perms:
        held = perm_word(account.perms[resource])
        hint = f'its {plural} entry "{_shown(resource.name)}={held}" grants no {word}'
    else:
        held = perm_word(account.perm_of(resource))
        hint = (
            f'add "{_shown(resource.name)}={word}" to its {plural}, or set {default} ({held} now)'
        )
    return AclDenied(
        Reason.NO_PERMISSION,
        f'access key "{_shown(account.access_key)}" lacks {perm_word(needed)} on {resource} '
        f"({source}: {hint})",
        access_key=account.access_key,
        resource=resource,
        needed=needed,
    )


def _unknown_key(access_key: str, source: str) -> AclDenied:
    return AclDenied(
        Reason.UNKNOWN_ACCESS_KEY,
        f'access key "{_shown(access_key)}" is not in {source} (give the client an access '
        "key the file lists, or add an account for it)",
        access_key=access_key,
    )


# ---------------------------------------------------------------- loading
_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_ACCOUNT_KEYS = frozenset(
    {
        "accessKey",
        "secretKey",
        "whiteRemoteAddress",
        "admin",
        "defaultTopicPerm",
        "defaultGroupPerm",
        "topicPerms",
        "groupPerms",
    }
)


def load_acl(path: str | Path) -> AclConfig:
    """Read and check a plain_acl.yml; ValueError naming the file, the account and the
    field for anything wrong. An empty file has no accounts (every signed request is
    denied)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: cannot read the ACL file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    return parse_acl(data, source=str(path))


def parse_acl(data: Any, source: str = "plain_acl.yml") -> AclConfig:
    """`load_acl` on what yaml.safe_load gave."""
    if data is None:
        return AclConfig(source=source)
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the top level must be a mapping of {sorted(_TOP_KEYS)}")
    unknown = set(map(str, data)) - _TOP_KEYS
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    white = tuple(
        _pattern(item, f"{source}: globalWhiteRemoteAddresses[{i}]")
        for i, item in enumerate(_list(data.get("globalWhiteRemoteAddresses"), source))
    )
    accounts: dict[str, Account] = {}
    for i, entry in enumerate(_list(data.get("accounts"), f"{source}: accounts")):
        account = _account(entry, f"{source}: accounts[{i}]")
        if account.access_key in accounts:
            raise ValueError(
                f'{source}: accounts[{i}]: access key "{account.access_key}" is already '
                "defined by an earlier account (RocketMQ keeps the first; give each key one "
                "account)"
            )
        accounts[account.access_key] = account
    return AclConfig(accounts, white, source)


def _list(value: Any, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _pattern(value: Any, where: str) -> AddressPattern:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: an address pattern is text, got {type(value).__name__}")
    try:
        return parse_address_pattern(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _account(entry: Any, where: str) -> Account:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: an account is a mapping with accessKey and secretKey")
    unknown = set(map(str, entry)) - _ACCOUNT_KEYS
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_ACCOUNT_KEYS)}"
        )
    access_key = _key(entry, "accessKey", where)
    where = f'{where} (accessKey "{access_key}")'
    secret_key = _key(entry, "secretKey", where)
    perms: dict[Resource, Perm] = {}
    for name, make in (("groupPerms", Resource.group), ("topicPerms", Resource.topic)):
        for i, item in enumerate(_list(entry.get(name), f"{where}: {name}")):
            resource, perm = _resource_perm(item, f"{where}: {name}[{i}]")
            perms[make(resource)] = perm
    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_remote_address=_pattern(
            entry.get("whiteRemoteAddress"), f"{where}: whiteRemoteAddress"
        ),
        admin=_flag(entry.get("admin", False), f"{where}: admin"),
        default_topic_perm=_perm(entry.get("defaultTopicPerm"), f"{where}: defaultTopicPerm"),
        default_group_perm=_perm(entry.get("defaultGroupPerm"), f"{where}: defaultGroupPerm"),
        perms=perms,
    )


def _key(entry: dict, name: str, where: str) -> str:
    value = entry.get(name)
    # YAML reads `secretKey: 12345678` as a number; Apache takes its digits.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"{where}: {name} is missing (a text of at least {MIN_KEY_CHARS} characters)"
        )
    if len(value) < MIN_KEY_CHARS:
        shown = f'"{value}"' if name == "accessKey" else "the one given"
        raise ValueError(
            f"{where}: {name} must be at least {MIN_KEY_CHARS} characters ({shown} has "
            f"{len(value)}; RocketMQ refuses 6 or fewer)"
        )
    return value


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{where}: expected true or false, got {value!r}")


def _perm(value: Any, where: str) -> Perm:
    if value is None:
        return Perm.DENY  # Apache: an absent default grants nothing
    word = str(value).strip() if isinstance(value, str) else None
    if word not in PERM_WORDS:
        raise ValueError(
            f"{where}: unknown permission {value!r}; use one of {', '.join(PERM_WORDS)} "
            "(RocketMQ would read it as DENY)"
        )
    return PERM_WORDS[word]


def _resource_perm(item: Any, where: str) -> tuple[str, Perm]:
    name, sep, word = item.partition("=") if isinstance(item, str) else ("", "", "")
    name = name.strip()
    if not sep or not name or "=" in word:
        raise ValueError(f'{where}: {item!r} is not "name=PERM", e.g. "TopicA=PUB|SUB"')
    return name, _perm(word, where)


# ---------------------------------------------------------------- signatures
def signed_content(fields: Mapping[str, str], body: bytes | None) -> bytes:
    """What the Java client signs: the values of every ext field but `Signature`, in the
    order of their names (Java's String order, by UTF-16 code unit), as UTF-8, then the
    body. A lone surrogate becomes "?", as Java's encoder writes it."""
    names = _signed_order(tuple(fields))
    text = "".join([fields[n] for n in names])
    return text.encode("utf-8", "replace") + (bytes(body) if body else b"")


@functools.lru_cache(maxsize=1024)
def _signed_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names signed, in Java's order: a client sends the same header fields in the
    same order request after request, so each list is sorted once."""
    return tuple(sorted((n for n in names if n != SIGNATURE), key=_java_order))


def signature_matches(secret: str, fields: Mapping[str, str], body: bytes | None) -> bool:
    """Whether the request's `Signature` is the one its other ext fields and body make with
    `secret`, compared in constant time. Apache's broker recomputes it without the field
    `_UNIQUE_KEY_QUERY`, which the Java client does sign (its QUERY_MESSAGE adds the field
    before signing), so Apache refuses every query by key; this accepts either content."""
    given = fields.get(SIGNATURE, "").encode("utf-8", "replace")
    contents = [signed_content(fields, body)]
    if UNIQUE_KEY_QUERY in fields:
        apache = {n: v for n, v in fields.items() if n != UNIQUE_KEY_QUERY}
        contents.append(signed_content(apache, body))
    return any(
        hmac.compare_digest(signature_of(secret, c).encode("ascii"), given) for c in contents
    )


def _java_order(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def sign(secret: str, fields: Mapping[str, str], body: bytes | None) -> str:
    """The `Signature` ext field the Java client (AclClientRPCHook) sends for these ext
    fields (AccessKey and SecurityToken among them) and body."""
    return signature_of(secret, signed_content(fields, body))


def signature_of(secret: str, content: bytes) -> str:
    inner, outer = _hmac_pads(secret)
    i = inner.copy()
    i.update(content)
    o = outer.copy()
    o.update(i.digest())
    return base64.b64encode(o.digest()).decode("ascii")


@functools.lru_cache(maxsize=256)
def _hmac_pads(secret: str) -> tuple[Any, Any]:
    """HMAC-SHA1 (RFC 2104) keyed by `secret`, its two padded key blocks already hashed:
    a request's signature then costs two copies and two short updates, not a key schedule
    each time (a third of the time hmac.digest takes for a send's ~300 bytes)."""
    key = secret.encode("utf-8", "replace")
    if len(key) > _SHA1_BLOCK:
        key = hashlib.sha1(key).digest()
    key = key.ljust(_SHA1_BLOCK, b"\0")
    return (
        hashlib.sha1(bytes(b ^ 0x36 for b in key)),
        hashlib.sha1(bytes(b ^ 0x5C for b in key)),
    )


_SHA1_BLOCK = 64


# ---------------------------------------------------------------- decisions
class Reason(enum.Enum):
    MALFORMED = "malformed"
    NO_ACCESS_KEY = "no access key"
    UNKNOWN_ACCESS_KEY = "unknown access key"
    BAD_SIGNATURE = "bad signature"
    ADMIN_REQUIRED = "admin required"
    NO_PERMISSION = "no permission"


class AclDenied(Exception):
    """A request the ACL refuses; the message says what was missing and what to do. The
    RocketMQ-protocol door answers NO_PERMISSION (16) with it."""

    retriable = False

    def __init__(
        self,
        reason: Reason,
        detail: str,
        *,
        access_key: str | None = None,
        resource: Resource | None = None,
        needed: Perm | None = None,
    ) -> None:
        super().__init__(f"No permission: {detail}")
        self.reason = reason
        self.access_key = access_key
        self.resource = resource
        self.needed = needed


class Grant(enum.Enum):
    GLOBAL_WHITE_LIST = "global white list"
    ACCOUNT_WHITE_LIST = "account white list"
    TRACE_TOPIC = "trace topic"
    PERMITTED = "permitted"


@dataclass(frozen=True)
class Decision:
    grant: Grant
    access_key: str | None = None


# Apache's Permission.ADMIN_CODE.
ADMIN_CODES: Mapping[int, str] = {
    codes.UPDATE_AND_CREATE_TOPIC: "UPDATE_AND_CREATE_TOPIC",
    codes.UPDATE_BROKER_CONFIG: "UPDATE_BROKER_CONFIG",
    codes.DELETE_TOPIC_IN_BROKER: "DELETE_TOPIC_IN_BROKER",
    codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    codes.DELETE_SUBSCRIPTIONGROUP: "DELETE_SUBSCRIPTIONGROUP",
}


class Unreadable(ValueError):
    """The ext fields or body do not say what the request needs."""


def required_permissions(
    code: int, ext: Mapping[str, str], body: bytes | None
) -> dict[Resource, Perm]:
    """The topics and groups a request uses and the permission each needs, read as Apache's
    `PlainAccessValidator.parse` reads them; a code not listed needs none (admin codes are
    checked by code). Unreadable for a header field that must be there or a heartbeat
    body that is not HeartbeatData."""
    needs: dict[Resource, Perm] = {}

    def need(resource: Resource | None, perm: Perm) -> None:
        if resource is not None:
            needs[resource] = perm

    def group(name: str | None) -> Resource | None:
        return None if name is None else Resource.group(name)

    if code in (codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2, codes.SEND_BATCH_MESSAGE):
        # Apache checks SEND_MESSAGE and SEND_MESSAGE_V2 only; ferry holds batches (whose
        # header is V2's) to the same rule, as a batch publishes just as a send does.
        topic_field, group_field = ("topic", "group") if code == codes.SEND_MESSAGE else ("b", "a")
        topic = ext.get(topic_field)
        if topic is not None and topic.startswith(RETRY_TOPIC_PREFIX):
            need(group(ext.get(group_field)), Perm.SUB)
        elif topic is not None:
            need(Resource.topic(topic), Perm.PUB)
    elif code == codes.CONSUMER_SEND_MSG_BACK:
        need(group(ext.get("group")), Perm.SUB)
    elif code in (codes.PULL_MESSAGE, codes.LITE_PULL_MESSAGE):
        topic = ext.get("topic")
        need(None if topic is None else Resource.topic(topic), Perm.SUB)
        need(group(ext.get("consumerGroup")), Perm.SUB)
    elif code == codes.QUERY_MESSAGE:
        topic = ext.get("topic")
        need(None if topic is None else Resource.topic(topic), Perm.SUB)
    elif code == codes.HEART_BEAT:
        for name, topics in _heartbeat_consumers(body):
            need(Resource.group(name), Perm.SUB)
            for topic in topics:
                need(Resource.topic(topic), Perm.SUB)
    elif code == codes.UNREGISTER_CLIENT:
        _required(ext, code, "clientID")
        need(group(ext.get("consumerGroup")), Perm.SUB)
    elif code == codes.GET_CONSUMER_LIST_BY_GROUP:
        need(group(_required(ext, code, "consumerGroup")), Perm.SUB)
    elif code == codes.UPDATE_CONSUMER_OFFSET:
        for name in ("queueId", "commitOffset"):
            if not _is_java_integer(_required(ext, code, name)):
                raise Unreadable(f"request code {code}: {name} is not a number")
        need(group(_required(ext, code, "consumerGroup")), Perm.SUB)
        need(Resource.topic(_required(ext, code, "topic")), Perm.SUB)
    return needs


def _required(ext: Mapping[str, str], code: int, name: str) -> str:
    value = ext.get(name)
    if value is None:
        raise Unreadable(f"request code {code} has no {name} header field")
    return value


def _is_java_integer(text: str) -> bool:
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()


def _heartbeat_consumers(body: bytes | None) -> Iterable[tuple[str, list[str]]]:
    """(group, its subscribed topics) for each consumer of a HeartbeatData body."""
    if not body:
        raise Unreadable("a heartbeat without a HeartbeatData body")
    try:
        doc = loads(body)
    except BodyError as e:
        raise Unreadable(f"heartbeat body: {e}") from None
    if not isinstance(doc, dict):
        raise Unreadable("heartbeat body is not a HeartbeatData object")
    consumers = doc.get("consumerDataSet") or []
    if not isinstance(consumers, list):
        raise Unreadable("heartbeat consumerDataSet is not a list")
    out = []
    for consumer in consumers:
        if not isinstance(consumer, dict) or not isinstance(consumer.get("groupName"), str):
            raise Unreadable("a heartbeat consumer without a groupName")
        subscriptions = consumer.get("subscriptionDataSet") or []
        if not isinstance(subscriptions, list):
            raise Unreadable("heartbeat subscriptionDataSet is not a list")
        topics = [s.get("topic") for s in subscriptions if isinstance(s, dict)]
        out.append((consumer["groupName"], [t for t in topics if isinstance(t, str)]))
    return out


# The codes whose needs (required_permissions) depend only on these two header fields.
_DECIDED_BY: dict[int, tuple[str, str]] = {
    codes.SEND_MESSAGE: ("topic", "group"),
    codes.SEND_MESSAGE_V2: ("b", "a"),
    codes.SEND_BATCH_MESSAGE: ("b", "a"),
    codes.PULL_MESSAGE: ("topic", "consumerGroup"),
    codes.LITE_PULL_MESSAGE: ("topic", "consumerGroup"),
}
DECISIONS_KEPT = 4096


def _never(code: int, ext: Mapping[str, str], body: bytes | None) -> bool:
    return False


def _none_passed(commands: list[Any]) -> list[bool]:
    return [bool(c.flag & 1) for c in commands]  # (responses pass: they are not checked)


def _native_fast(config: AclConfig) -> Any:
    from ferry.native import native

    if native is None:
        return None
    secrets = {k: a.secret_key.encode("utf-8", "replace") for k, a in config.accounts.items()}
    return native.AclFast(secrets, dict(_DECIDED_BY))


class AclChecker:
    """The RocketMQ-protocol door's check of one request (the module doc's steps)."""

    def __init__(self, config: AclConfig) -> None:
        self.config = config
        # ferry_native's AclFast, when built: a remembered grant and its signature check
        # in one native call (`fast`); None without the native module.
        self._fast = _native_fast(config)
        # Steps 6-8 for the hot codes (sends, pulls), whose needs depend only on two
        # header fields: (code, access key, field, field) -> the Decision or the AclDenied.
        # The config never changes under a checker (a reload makes a new one).
        self._granted: dict[tuple[int, str, str | None, str | None], Decision | AclDenied] = {}

    def check(
        self, request_code: int, ext: Mapping[str, str], body: bytes | None, remote_ip: str
    ) -> Decision:
        """The Decision to serve the request, or AclDenied. `remote_ip` is the client's
        address without its port."""
        access_key = ext.get(ACCESS_KEY)
        fields = _DECIDED_BY.get(request_code)
        key = known = None
        if fields is not None and access_key is not None:
            key = (request_code, access_key, ext.get(fields[0]), ext.get(fields[1]))
            known = self._granted.get(key)
        if known is None:
            try:
                # Apache reads nothing from a request without ext fields (so not its body).
                needs = required_permissions(request_code, ext, body) if ext else {}
            except Unreadable as e:
                raise AclDenied(Reason.MALFORMED, f"{e}", access_key=access_key) from None
        white = self._authenticate(access_key, ext, body, remote_ip)
        if white is not None:
            return white
        assert access_key is not None  # (_authenticate refuses a request without one)
        if known is not None:  # steps 6-8 as remembered for this code, key, topic and group
            if isinstance(known, AclDenied):
                raise known.with_traceback(None)
            return known
        try:
            decision = self._permitted(request_code, access_key, needs)
        except AclDenied as denied:
            if key is not None:
                self._remember(key, denied)
            raise
        if key is not None:
            self._remember(key, decision)
            if self._fast is not None:
                self._fast.allow(*key)
        return decision

    @property
    def fast(self) -> Callable[[int, Mapping[str, str], bytes | None], bool]:
        """`fast(code, ext, body)`: True when the request is a send or pull this checker
        already permitted for its code, key, topic and group, and its signature matches
        (what `check` would allow), decided in one native call. False says nothing: call
        `check`. Without the native module, always False."""
        return _never if self._fast is None else self._fast.check

    @property
    def fast_many(self) -> Callable[[list[Any]], list[bool] | None]:
        """`fast` over a read's requests (objects with `flag`, `code`, `ext`, `body`; a
        response passes): None when every one passed, else whether each did."""
        return _none_passed if self._fast is None else self._fast.check_many

    def _permitted(self, request_code: int, access_key: str, needs) -> Decision:
        """Steps 6-8, for an authenticated key."""
        if needs.get(Resource.topic(TRACE_TOPIC)) == Perm.PUB:
            return Decision(Grant.TRACE_TOPIC, access_key)
        admin_code = ADMIN_CODES.get(request_code)
        self.config.authorize(
            access_key,
            needs,
            admin_required=admin_code is not None,
            what=f"request code {request_code} ({admin_code})",
        )
        return Decision(Grant.PERMITTED, access_key)

    def _remember(self, key, outcome: Decision | AclDenied) -> None:
        if len(self._granted) >= DECISIONS_KEPT:
            self._granted.clear()
        self._granted[key] = outcome

    def _authenticate(
        self, access_key: str | None, ext: Mapping[str, str], body: bytes | None, remote_ip: str
    ) -> Decision | None:
        """Steps 2-5 (they depend on the address and the signature of this very request):
        a white list's Decision, None for a key the file lists that signed the request
        right, else AclDenied."""
        config = self.config
        if config.globally_white(remote_ip):
            return Decision(Grant.GLOBAL_WHITE_LIST, access_key)
        if access_key is None:
            raise AclDenied(
                Reason.NO_ACCESS_KEY,
                f"the request carries no AccessKey and {remote_ip} is not in "
                f"globalWhiteRemoteAddresses of {config.source} (sign requests with an access "
                "key the file lists; Java clients: new AclClientRPCHook(new "
                "SessionCredentials(accessKey, secretKey)))",
            )
        account = config.account(access_key)
        if account is None:
            raise _unknown_key(access_key, config.source)
        if account.white_remote_address.matches(remote_ip):
            return Decision(Grant.ACCOUNT_WHITE_LIST, access_key)
        if not signature_matches(account.secret_key, ext, body):
            raise AclDenied(
                Reason.BAD_SIGNATURE,
                f'the signature does not match access key "{_shown(access_key)}" (the '
                f"client's secret key differs from the one {config.source} has for it, or "
                "the request changed after it was signed)",
                access_key=access_key,
            )
        return None


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
