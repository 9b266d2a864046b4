"""ferry_native.AclFast (native/src/acl.rs) against the Python it stands in for,
`ferry.acl`: it passes a request only when the Python checker would (a send or pull whose
code, access key, topic and group it was told are permitted, with the signature
`ferry.acl.sign` gives), and passes nothing else — another key, topic, group, secret,
body or field value, a lone surrogate, a body that is not bytes.

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from ferry import acl
from ferry.remoting import codes
from tests.native_twins import require_native

ferry_native = require_native()

KEY, SECRET = "twin-key", "twin-secret-1"
FIELDS = {codes.SEND_MESSAGE_V2: ("b", "a"), codes.PULL_MESSAGE: ("topic", "consumerGroup")}

names = st.text(min_size=1, max_size=12)
values = st.text(max_size=40)
bodies = st.one_of(st.none(), st.binary(max_size=300))


def fast(**remembered) -> object:
    checker = ferry_native.AclFast({KEY: SECRET.encode(), "other-key": b"other-secret"}, FIELDS)
    for code, first, second in remembered.get("allow", []):
        checker.allow(code, KEY, first, second)
    return checker


def signed(ext: dict[str, str], body: bytes | None, secret: str = SECRET) -> dict[str, str]:
    ext = {**ext, "AccessKey": KEY}
    ext["Signature"] = acl.sign(secret, ext, body)
    return ext


@given(st.dictionaries(names, values, max_size=14), bodies)
def test_it_passes_exactly_what_the_python_signature_and_grant_pass(extra, body):
    ext = signed({**extra, "b": "TopicA", "a": "GroupA"}, body)
    checker = fast(allow=[(codes.SEND_MESSAGE_V2, "TopicA", "GroupA")])
    python = acl.signature_matches(SECRET, ext, body)
    assert checker.check(codes.SEND_MESSAGE_V2, ext, body) == python
    # Not remembered: another topic, group or code; another key.
    assert not fast().check(codes.SEND_MESSAGE_V2, ext, body)
    assert not checker.check(codes.SEND_MESSAGE, ext, body)
    assert not checker.check(codes.SEND_MESSAGE_V2, {**ext, "b": "TopicB"}, body)


@given(st.dictionaries(names, values, min_size=1, max_size=8), st.binary(min_size=1, max_size=50))
def test_any_change_after_signing_fails(extra, body):
    ext = signed({**extra, "b": "T", "a": "G"}, body)
    checker = fast(allow=[(codes.SEND_MESSAGE_V2, "T", "G")])
    if not acl.signature_matches(SECRET, ext, body):
        return  # (a lone surrogate: the Python decides those)
    assert checker.check(codes.SEND_MESSAGE_V2, ext, body)
    assert not checker.check(codes.SEND_MESSAGE_V2, ext, body + b"x")
    assert not checker.check(
        codes.SEND_MESSAGE_V2, signed({**extra, "b": "T", "a": "G"}, body, "wrong"), body
    )
    name = next(iter(extra))
    assert not checker.check(
        codes.SEND_MESSAGE_V2, {**ext, name: ext[name] + "x"}, body
    ) or name in ("AccessKey", "Signature")


def test_what_it_leaves_to_the_python():
    body = b"payload"
    ext = signed({"topic": "T", "consumerGroup": "G", "queueId": "0"}, body)
    checker = fast(allow=[(codes.PULL_MESSAGE, "T", "G")])
    assert checker.check(codes.PULL_MESSAGE, ext, body)
    assert not checker.check(codes.PULL_MESSAGE, ext, bytearray(body))  # not bytes
    assert not checker.check(codes.PULL_MESSAGE, {**ext, "queueId": "\udc80"}, body)  # surrogate
    assert not checker.check(codes.PULL_MESSAGE, {**ext, "AccessKey": "nobody"}, body)
    assert not checker.check(
        codes.PULL_MESSAGE, {k: v for k, v in ext.items() if k != "Signature"}, body
    )
    assert not checker.check(codes.PULL_MESSAGE, {**ext, "queueId": 0}, body)  # not a str
    assert not checker.check(codes.PULL_MESSAGE, list(ext.items()), body)  # not a dict
    assert not checker.check(codes.HEART_BEAT, ext, body)  # not a code it decides
    nobody = signed({"topic": "T", "consumerGroup": "G"}, None)
    assert checker.check(codes.PULL_MESSAGE, nobody, None)


@dataclass
class Cmd:
    flag: int
    code: int
    ext: dict
    body: bytes | None


def test_check_many_is_check_over_a_read():
    body = b"m"
    good = signed({"b": "T", "a": "G"}, body)
    bad = {**good, "Signature": "AAAA"}
    checker = fast(allow=[(codes.SEND_MESSAGE_V2, "T", "G")])
    assert checker.check_many([Cmd(0, codes.SEND_MESSAGE_V2, good, body)] * 3) is None
    assert checker.check_many([]) is None
    read = [Cmd(0, codes.SEND_MESSAGE_V2, good, body), Cmd(0, codes.SEND_MESSAGE_V2, bad, body),
            Cmd(1, 0, {}, None), Cmd(0, codes.HEART_BEAT, good, body)]  # fmt: skip
    assert checker.check_many(read) == [True, False, True, False]
