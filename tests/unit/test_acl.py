"""ferry.acl: plain_acl.yml loading, the Java client's signature, and Apache 4.9's
PlainAccessValidator decisions (tests/compat/test_acl_apache.py checks the same against
Apache's broker and client)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.acl import (
    ACCESS_KEY,
    SECURITY_TOKEN,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    AclChecker,
    AclConfig,
    AclDenied,
    Grant,
    Perm,
    Reason,
    Resource,
    Unreadable,
    load_acl,
    parse_acl,
    parse_address_pattern,
    permits,
    required_permissions,
    sign,
)
from ferry.remoting import codes

ACL = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
      - topicD=PUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: "12345678"
    whiteRemoteAddress: 192.168.1.*
    admin: true
  - accessKey: rocketmq3
    secretKey: secret-of-3
    admin: true
    defaultTopicPerm: SUB
    topicPerms:
      - topicP=PUB
"""
SECRET = "12345678"


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return path


@pytest.fixture
def checker(acl_file: Path) -> AclChecker:
    return AclChecker(load_acl(acl_file))


def signed(fields: dict[str, str], body: bytes | None = None, key: str = "RocketMQ",
           secret: str = SECRET) -> dict[str, str]:  # fmt: skip
    out = dict(fields, **{ACCESS_KEY: key})
    out[SIGNATURE] = sign(secret, out, body)
    return out


# ---------------------------------------------------------------- loading
def test_the_file_loads_as_apache_reads_it(acl_file):
    config = load_acl(acl_file)
    assert sorted(config.accounts) == ["RocketMQ", "rocketmq2", "rocketmq3"]
    first = config.accounts["RocketMQ"]
    assert first.secret_key == SECRET  # YAML's number 12345678, as its digits
    assert not first.admin
    assert (first.default_topic_perm, first.default_group_perm) == (Perm.DENY, Perm.SUB)
    assert first.perms[Resource.topic("topicB")] == Perm.PUB | Perm.SUB
    assert first.perms[Resource.group("groupC")] == Perm.SUB
    assert not first.white_remote_address.matches("127.0.0.1")
    second = config.accounts["rocketmq2"]
    assert second.admin and second.white_remote_address.matches("192.168.1.7")
    # An absent default grants nothing.
    assert second.default_topic_perm == Perm.DENY == second.default_group_perm
    assert config.secret_of("rocketmq2") == SECRET and config.secret_of("nobody") is None
    assert config.globally_white("10.10.103.9") and not config.globally_white("10.10.104.9")


def test_an_empty_file_has_no_accounts(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text("")
    assert load_acl(path) == AclConfig(source=str(path))


def test_the_secret_never_shows(acl_file):
    config = load_acl(acl_file)
    account = config.accounts["rocketmq3"]
    assert "secret-of-3" not in repr(account)
    assert "secret-of-3" not in repr(config)
    assert "secret-of-3" not in str(account)


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_acl(path)
    message = str(e.value)
    assert str(path) in message
    return message


ACCOUNT = "accounts:\n  - accessKey: rocketmq9\n    secretKey: secret-nine\n"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            "    defaultTopicPerm: WRITE\n",
            ["accounts[0]", "rocketmq9", "defaultTopicPerm", "WRITE"],
        ),
        ("    topicPerms: [TopicA=PUBSUB]\n", ["topicPerms[0]", "PUBSUB", "PUB|SUB"]),
        ("    topicPerms: [TopicA]\n", ["topicPerms[0]", "name=PERM"]),
        ("    groupPerms: [G=SUB=PUB]\n", ["groupPerms[0]", "name=PERM"]),
        ("    whiteRemoteAddress: 192.168.*.5\n", ["whiteRemoteAddress", "192.168.*.5"]),
        ("    whiteRemoteAddress: '*.168.1.1'\n", ["whiteRemoteAddress", "plain"]),
        ("    whiteRemoteAddress: 192.168.1.300\n", ["whiteRemoteAddress", "192.168.1.300"]),
        ("    admin: maybe\n", ["admin", "maybe"]),
        ("    topicperms: [TopicA=PUB]\n", ["unknown key", "topicperms"]),
    ],
)
def test_bad_account_fields_name_the_file_account_and_field(tmp_path, extra, words):
    message = _error(tmp_path, ACCOUNT + extra)
    for word in words:
        assert word in message, (word, message)
    assert "secret-nine" not in message


def test_keys_must_be_longer_than_six_characters(tmp_path):
    message = _error(tmp_path, "accounts:\n  - accessKey: rocketmq9\n    secretKey: 123456\n")
    assert "secretKey" in message and "at least 7" in message and "123456" not in message
    message = _error(tmp_path, "accounts:\n  - accessKey: short\n    secretKey: 1234567\n")
    assert "accessKey" in message and "short" in message
    ok = tmp_path / "ok.yml"
    ok.write_text("accounts:\n  - accessKey: rocketmq\n    secretKey: 1234567\n")
    assert load_acl(ok).secret_of("rocketmq") == "1234567"


def test_a_missing_secret_and_a_duplicate_key_are_errors(tmp_path):
    assert "secretKey is missing" in _error(tmp_path, "accounts:\n  - accessKey: rocketmq9\n")
    message = _error(tmp_path, ACCOUNT + "  - accessKey: rocketmq9\n    secretKey: other-one\n")
    assert "accounts[1]" in message and "already" in message and "rocketmq9" in message


def test_bad_yaml_and_a_missing_file_name_the_file(tmp_path):
    assert "not YAML" in _error(tmp_path, "accounts: [\n")
    with pytest.raises(ValueError, match="nowhere.yml"):
        load_acl(tmp_path / "nowhere.yml")
    assert "unknown key" in _error(tmp_path, "acounts: []\n")


def test_a_topic_perm_on_a_retry_topic_is_the_groups_as_in_apache():
    config = parse_acl(
        {
            "accounts": [
                {
                    "accessKey": "rocketmq9",
                    "secretKey": "secret-nine",
                    "groupPerms": ["G=SUB"],
                    "topicPerms": ["%RETRY%G=DENY"],
                }
            ]
        }
    )
    assert config.accounts["rocketmq9"].perm_of(Resource.group("G")) == Perm.DENY


# ---------------------------------------------------------------- permissions
@pytest.mark.parametrize(
    ("owned", "needed", "allowed"),
    [
        (Perm.DENY, Perm.PUB, False),
        (Perm.DENY, Perm.SUB, False),
        (Perm.DENY, Perm.ANY, False),
        (Perm.DENY | Perm.PUB, Perm.PUB, False),
        (Perm.PUB, Perm.PUB, True),
        (Perm.PUB, Perm.SUB, False),
        (Perm.PUB, Perm.ANY, True),
        (Perm.SUB, Perm.SUB, True),
        (Perm.SUB, Perm.PUB, False),
        (Perm.SUB, Perm.ANY, True),
        (Perm.PUB | Perm.SUB, Perm.PUB, True),
        (Perm.PUB | Perm.SUB, Perm.SUB, True),
        (Perm.PUB | Perm.SUB, Perm.ANY, True),
        (Perm.ANY, Perm.ANY, False),
    ],
)
def test_permits_is_apaches_check_permission(owned, needed, allowed):
    assert permits(owned, needed) is allowed


def test_a_retry_topic_is_its_group():
    assert Resource.topic("%RETRY%G") == Resource.group("G")
    assert Resource.topic("T") == Resource("topic", "T")


def test_what_each_code_needs():
    topic, group = Resource.topic, Resource.group
    assert required_permissions(codes.SEND_MESSAGE, {"topic": "T", "group": "P"}, b"") == {
        topic("T"): Perm.PUB
    }
    for code in (codes.SEND_MESSAGE_V2, codes.SEND_BATCH_MESSAGE):
        assert required_permissions(code, {"a": "P", "b": "T"}, b"x") == {topic("T"): Perm.PUB}
        assert required_permissions(code, {"a": "G", "b": "%RETRY%G"}, b"x") == {
            group("G"): Perm.SUB
        }
    assert required_permissions(codes.SEND_MESSAGE, {"topic": "%RETRY%G", "group": "G"}, b"") == {
        group("G"): Perm.SUB
    }
    assert required_permissions(codes.CONSUMER_SEND_MSG_BACK, {"group": "G"}, None) == {
        group("G"): Perm.SUB
    }
    pull = {"topic": "T", "consumerGroup": "G", "queueId": "0"}
    assert required_permissions(codes.PULL_MESSAGE, pull, None) == {
        topic("T"): Perm.SUB,
        group("G"): Perm.SUB,
    }
    assert required_permissions(codes.QUERY_MESSAGE, {"topic": "T"}, None) == {topic("T"): Perm.SUB}
    heartbeat = {
        "clientID": "c",
        "producerDataSet": [{"groupName": "P"}],
        "consumerDataSet": [
            {"groupName": "G1", "subscriptionDataSet": [{"topic": "T1"}, {"topic": "%RETRY%G1"}]},
            {"groupName": "G2", "subscriptionDataSet": []},
        ],
    }
    assert required_permissions(codes.HEART_BEAT, {}, json.dumps(heartbeat).encode()) == {
        group("G1"): Perm.SUB,
        topic("T1"): Perm.SUB,
        group("G2"): Perm.SUB,
    }
    assert required_permissions(codes.UNREGISTER_CLIENT, {"clientID": "c"}, None) == {}
    assert required_permissions(
        codes.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "G"}, None
    ) == {group("G"): Perm.SUB}
    assert required_permissions(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}, None) == {
        group("G"): Perm.SUB
    }
    offset = {"consumerGroup": "G", "topic": "T", "queueId": "1", "commitOffset": "-1"}
    assert required_permissions(codes.UPDATE_CONSUMER_OFFSET, offset, None) == {
        group("G"): Perm.SUB,
        topic("T"): Perm.SUB,
    }
    # Admin codes are checked by their code; reads need nothing.
    for code in (codes.UPDATE_AND_CREATE_TOPIC, codes.GET_ROUTEINFO_BY_TOPIC, codes.GET_MAX_OFFSET):
        assert required_permissions(code, {"topic": "T"}, None) == {}


@pytest.mark.parametrize(
    ("code", "ext", "body"),
    [
        (codes.HEART_BEAT, {"x": "1"}, None),
        (codes.HEART_BEAT, {"x": "1"}, b"not json"),
        (codes.HEART_BEAT, {"x": "1"}, b'{"consumerDataSet": [{"subscriptionDataSet": []}]}'),
        (codes.UNREGISTER_CLIENT, {"consumerGroup": "G"}, None),
        (codes.GET_CONSUMER_LIST_BY_GROUP, {}, None),
        (codes.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T", "queueId": "1"}, None),
        (
            codes.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "G", "topic": "T", "queueId": "x", "commitOffset": "1"},
            None,
        ),
    ],
)
def test_an_unreadable_request_is_refused(checker, code, ext, body):
    with pytest.raises(Unreadable):
        required_permissions(code, ext, body)
    with pytest.raises(AclDenied) as e:
        checker.check(code, signed(ext, body), body, "10.10.103.1")  # even when white-listed
    assert e.value.reason is Reason.MALFORMED


# ---------------------------------------------------------------- signatures
def test_signatures_apaches_java_client_computed():
    # Each computed by AclClientRPCHook (rocketmq-acl 4.9.8) through AclProbe49's sign mode.
    fields = {ACCESS_KEY: "RocketMQ", "topic": "T", "zz": "é"}
    assert sign(SECRET, fields, b"\x00\x01\x02") == "2Hn/G3C6bU8m1cjIvysw7TJMGro="
    fields = {
        ACCESS_KEY: "RocketMQ",
        SECURITY_TOKEN: "87654321",
        "topic": "topicA",
        "producerGroup": "groupA",
    }
    assert sign(SECRET, fields, b"Hello") == "ta7vjwiC1oHq3LmgGps8NC4IRTQ="
    # Java orders names by UTF-16 unit: U+1F600 (D83D DE00) before U+FF5E.
    fields = {ACCESS_KEY: "aclprobe-pub", "\U0001f600": "astral", "\uff5e": "bmp", "a": "ä"}
    assert sign("pub-secret-é", fields, None) == "3FC6V2whZ4G/w+Y3d+GbxilDGpw="


texts = st.text(max_size=20)


@given(st.dictionaries(texts, texts, max_size=6), st.binary(max_size=64), texts)
def test_a_signature_ignores_field_order_and_the_signature_field(fields, body, secret):
    reversed_fields = dict(reversed(list(fields.items())))
    with_signature = dict(fields, **{SIGNATURE: "anything"})
    assert sign(secret, fields, body) == sign(secret, reversed_fields, body)
    assert sign(secret, fields, body) == sign(secret, with_signature, body)
    assert sign(secret, fields, b"") == sign(secret, fields, None)


names = texts.filter(lambda name: name != SIGNATURE)


@given(st.dictionaries(names, texts, min_size=1, max_size=6), st.binary(max_size=64))
def test_a_changed_value_or_body_changes_the_signature(fields, body):
    name = sorted(fields)[0]
    changed = dict(fields, **{name: fields[name] + "x"})
    assert sign(SECRET, fields, body) != sign(SECRET, changed, body)
    assert sign(SECRET, fields, body) != sign(SECRET, fields, body + b"x")


def test_a_query_by_key_passes_signed_either_way(checker):
    ext = {"topic": "topicC", "key": "k", UNIQUE_KEY_QUERY: "false", ACCESS_KEY: "RocketMQ"}
    as_java = dict(ext, **{SIGNATURE: sign(SECRET, ext, None)})
    without = {k: v for k, v in ext.items() if k != UNIQUE_KEY_QUERY}
    as_apache = dict(ext, **{SIGNATURE: sign(SECRET, without, None)})
    for request in (as_java, as_apache):
        assert (
            checker.check(codes.QUERY_MESSAGE, request, None, "127.0.0.1").grant is Grant.PERMITTED
        )
    flipped = dict(as_java, **{UNIQUE_KEY_QUERY: "true"})
    with pytest.raises(AclDenied) as e:
        checker.check(codes.QUERY_MESSAGE, flipped, None, "127.0.0.1")
    assert e.value.reason is Reason.BAD_SIGNATURE


# ---------------------------------------------------------------- decisions
def _denied(checker: AclChecker, code: int, ext: dict, body: bytes | None = None,
            ip: str = "127.0.0.1") -> AclDenied:  # fmt: skip
    with pytest.raises(AclDenied) as e:
        checker.check(code, ext, body, ip)
    assert str(e.value).startswith("No permission: ")
    assert SECRET not in str(e.value) and "secret-of-3" not in str(e.value)
    return e.value


def send(topic: str, group: str = "P") -> dict[str, str]:
    return {"a": group, "b": topic, "c": "TBW102"}


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [("topicA", False), ("topicB", True), ("topicC", False), ("topicD", True), ("other", False)],
)
def test_a_send_needs_pub(checker, topic, allowed):
    ext = signed(send(topic), b"body")
    if allowed:
        decision = checker.check(codes.SEND_MESSAGE_V2, ext, b"body", "127.0.0.1")
        assert (decision.grant, decision.access_key) == (Grant.PERMITTED, "RocketMQ")
    else:
        denied = _denied(checker, codes.SEND_MESSAGE_V2, ext, b"body")
        assert (denied.reason, denied.resource, denied.needed) == (
            Reason.NO_PERMISSION,
            Resource.topic(topic),
            Perm.PUB,
        )


@pytest.mark.parametrize(
    ("group", "allowed"),
    [("groupA", False), ("groupB", True), ("groupC", True), ("other", True)],  # default SUB
)
def test_a_pull_needs_sub_on_its_group(checker, group, allowed):
    ext = signed({"topic": "topicC", "consumerGroup": group, "queueId": "0"})
    if allowed:
        assert checker.check(codes.PULL_MESSAGE, ext, None, "127.0.0.1").grant is Grant.PERMITTED
    else:
        assert _denied(checker, codes.PULL_MESSAGE, ext).resource == Resource.group(group)


def test_denials_say_what_is_missing_and_what_to_do(checker):
    denied = _denied(checker, codes.SEND_MESSAGE_V2, signed(send("other")))
    assert str(denied) == (
        'No permission: access key "RocketMQ" lacks PUB on topic "other" (plain_acl.yml: add '
        '"other=PUB" to its topicPerms, or set defaultTopicPerm (DENY now))'
    ).replace("plain_acl.yml", checker.config.source)
    denied = _denied(checker, codes.SEND_MESSAGE_V2, signed(send("topicC")))
    assert 'lacks PUB on topic "topicC"' in str(denied)
    assert 'its topicPerms entry "topicC=SUB" grants no PUB' in str(denied)
    denied = _denied(checker, codes.CONSUMER_SEND_MSG_BACK, signed({"group": "groupA"}))
    assert 'lacks SUB on group "groupA"' in str(denied) and "groupPerms" in str(denied)


def test_the_order_of_the_checks(checker):
    # A global white address skips everything, the access key included.
    assert checker.check(codes.SEND_MESSAGE_V2, send("topicA"), None, "10.10.103.5").grant is (
        Grant.GLOBAL_WHITE_LIST
    )
    assert _denied(checker, codes.SEND_MESSAGE_V2, send("topicB")).reason is Reason.NO_ACCESS_KEY
    unknown = signed(send("topicB"), key="nobody-at-all")
    assert _denied(checker, codes.SEND_MESSAGE_V2, unknown).reason is Reason.UNKNOWN_ACCESS_KEY
    # The account's white address skips the signature and the permissions.
    wrong = signed(send("anything"), key="rocketmq2", secret="not-the-secret")
    assert checker.check(codes.SEND_MESSAGE_V2, wrong, None, "192.168.1.9").grant is (
        Grant.ACCOUNT_WHITE_LIST
    )
    denied = _denied(checker, codes.SEND_MESSAGE_V2, wrong, ip="192.168.2.9")
    assert denied.reason is Reason.BAD_SIGNATURE
    tampered = dict(signed(send("topicB")), b="topicA")
    assert _denied(checker, codes.SEND_MESSAGE_V2, tampered).reason is Reason.BAD_SIGNATURE
    # Message trace skips the permissions (topicA... is DENY, RMQ_SYS_TRACE_TOPIC unlisted).
    trace = signed(send("RMQ_SYS_TRACE_TOPIC"))
    assert checker.check(codes.SEND_MESSAGE_V2, trace, None, "127.0.0.1").grant is (
        Grant.TRACE_TOPIC
    )


@pytest.mark.parametrize("code", sorted({17, 25, 215, 200, 207}))
def test_admin_codes_need_an_admin_account(checker, code):
    denied = _denied(checker, code, signed({"topic": "T"}))
    assert denied.reason is Reason.ADMIN_REQUIRED
    assert f"request code {code}" in str(denied) and "admin: true" in str(denied)
    admin = signed({"topic": "T"}, key="rocketmq3", secret="secret-of-3")
    assert checker.check(code, admin, None, "127.0.0.1").grant is Grant.PERMITTED


def test_an_admin_without_entries_may_do_anything_one_with_entries_is_checked(checker):
    config = checker.config
    assert config.accounts["rocketmq2"].allows(Resource.topic("any"), Perm.PUB)
    assert config.authorize("rocketmq2", {Resource.topic("any"): Perm.PUB}).admin
    third = config.accounts["rocketmq3"]
    assert third.allows(Resource.topic("topicP"), Perm.PUB)
    assert not third.allows(Resource.topic("other"), Perm.PUB)  # defaultTopicPerm SUB
    assert not third.allows(Resource.group("G"), Perm.SUB)  # defaultGroupPerm absent: DENY
    with pytest.raises(AclDenied, match='lacks PUB on topic "other"'):
        config.authorize("rocketmq3", {Resource.topic("other"): Perm.PUB})
    with pytest.raises(AclDenied) as e:
        config.authorize("RocketMQ", {}, admin_required=True, what="CreateTopic")
    assert e.value.reason is Reason.ADMIN_REQUIRED and "CreateTopic" in str(e.value)


def test_a_heartbeat_needs_sub_on_each_group_and_topic(checker):
    body = json.dumps(
        {"consumerDataSet": [{"groupName": "groupB", "subscriptionDataSet": [{"topic": "topicB"}]}]}
    ).encode()
    assert checker.check(codes.HEART_BEAT, signed({}, body), body, "127.0.0.1").grant is (
        Grant.PERMITTED
    )
    body = body.replace(b"topicB", b"topicD")  # PUB only
    assert _denied(checker, codes.HEART_BEAT, signed({}, body), body).resource == Resource.topic(
        "topicD"
    )


def test_a_batch_send_needs_pub_unlike_apache(checker):
    assert _denied(checker, codes.SEND_BATCH_MESSAGE, signed(send("topicC"))).needed == Perm.PUB


# ---------------------------------------------------------------- addresses
@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("192.168.0.1", ["192.168.0.1"], ["192.168.0.10", "192.168.0.11"]),
        ("*", ["1.2.3.4", "::1"], []),
        ("*.*.*.*", ["1.2.3.4"], []),
        ("", [], ["1.2.3.4"]),
        ("192.168.*.*", ["192.168.0.1", "192.168.255.255"], ["192.169.0.1", "10.192.168.1"]),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.77"], ["192.168.2.1"]),
        ("192.*.*.*", ["192.0.0.1"], ["193.0.0.1"]),
        ("192.168.1.1-10", ["192.168.1.1", "192.168.1.10"], ["192.168.1.0", "192.168.1.11"]),
        ("192.168.1-10.*", ["192.168.1.200", "192.168.10.0"], ["192.168.11.0", "192.168.0.1"]),
        ("192.168.0.{1,2}", ["192.168.0.1", "192.168.0.2"], ["192.168.0.3", "192.168.0.12"]),
        ("192.168.0.1,10.0.0.1", ["192.168.0.1", "10.0.0.1"], ["10.0.0.2"]),
        ("1050:0000:0000:0000:0005:0600:300c:326b", ["1050::5:600:300c:326b"], ["1050::5"]),
        ("::1,::2", ["0:0:0:0:0:0:0:1", "::2"], ["::3"]),
    ],
)
def test_address_patterns(pattern, inside, outside):
    compiled = parse_address_pattern(pattern)
    for ip in inside:
        assert compiled.matches(ip), (pattern, ip)
    for ip in outside:
        assert not compiled.matches(ip), (pattern, ip)


@pytest.mark.parametrize(
    "pattern",
    [
        "192.168.1",
        "192.168.1.256",
        "192.168.01.1",
        "*.168.1.1",
        "192.168.*.5",
        "192.168.1.10-1",
        "192.168.1.-1",
        "192.168.1.1-300",
        "192.168.1.{1,x}",
        "192.168.{1,2}.1",
        "1::*",
        "1::1-20",
        "example.com",
        "1.2.3.4,nope",
    ],
)
def test_bad_address_patterns(pattern):
    with pytest.raises(ValueError, match="e.g.|not|only|IPv6|four|list"):
        parse_address_pattern(pattern)


@given(
    st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
    st.integers(0, 255),
)  # fmt: skip
def test_a_range_holds_exactly_its_numbers(low, high, a, b, last):
    low, high = min(low, high), max(low, high)
    pattern = parse_address_pattern(f"10.{a}.{b}.{low}-{high}")
    assert pattern.matches(f"10.{a}.{b}.{last}") is (low <= last <= high)
    assert not pattern.matches(f"11.{a}.{b}.{last}")
