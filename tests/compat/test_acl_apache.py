"""RocketMQ 4.x plain ACL with Apache RocketMQ 4.9 as the oracle.

One Apache 4.9 broker runs with `aclEnable=true` and tests/compat/acl_probe.py's ACL_YAML as
its `conf/plain_acl.yml`; Apache's 4.9.8 Java client (AclProbe49, AclClientRPCHook) sends
every case of `CASES` to it in one JVM. The tests show that:

- Apache allows and denies each case as the table says (`Case.apache`), and answers every
  denial with SYSTEM_ERROR (1) and a remark that starts with its AclException: what ferry
  answers instead (NO_PERMISSION, 16, with a message naming the missing permission) is a
  documented difference, not an accident;
- ferry's checker (`ferry.acl.AclChecker`, loaded from the same file) decides each request
  exactly as the probe sent it — ext fields, signature and body — as the table says for
  ferry (`Case.expected_ferry`: Apache's outcome, or ferry's stricter one where a note
  says why);
- `ferry.acl.sign` computes the Java client's signature (unicode values, an empty or binary
  body, a security token).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.acl import AclChecker, AclDenied, load_acl, sign
from tests.apache import ApacheBroker, ApacheNamesrv
from tests.compat.acl_probe import (
    ACL_YAML,
    APACHE_DENIAL,
    CASES,
    DENIED,
    Outcome,
    java_signatures,
    run_probe,
)

CASE_NAMES = [c.case for c in CASES]


@pytest.fixture(scope="module")
def apache_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    root = tmp_path_factory.mktemp("acl-apache")
    namesrv = ApacheNamesrv(root / "namesrv").start()
    broker = ApacheBroker(root / "broker", namesrv=namesrv.address, settings={"aclEnable": True})
    try:
        # PlainPermissionManager reads ROCKETMQ_HOME/conf/plain_acl.yml when the broker starts.
        (broker.home / "conf").mkdir(parents=True, exist_ok=True)
        (broker.home / "conf" / "plain_acl.yml").write_text(ACL_YAML)
        broker.start()
        yield run_probe(namesrv.address, root / "probe")
    finally:
        broker.stop()
        namesrv.stop()


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> AclChecker:
    path = tmp_path_factory.mktemp("acl-file") / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return AclChecker(load_acl(path))


@pytest.mark.parametrize("case", CASES, ids=CASE_NAMES)
def test_apache_decides_as_the_table_says(apache_outcomes, case):
    got = apache_outcomes[case.case]
    assert got.outcome == case.apache, f"{case.case}: {got}"


def test_apache_answers_a_denial_with_system_error_and_its_acl_exception(apache_outcomes):
    denied = {name: o for name, o in apache_outcomes.items() if o.outcome == DENIED}
    assert denied
    for name, got in denied.items():
        assert got.code == 1, (name, got)
        assert got.remark.startswith(APACHE_DENIAL), (name, got)
    # What the Java client reads, word for word (the stack frame after the comma varies).
    assert denied["send_v2_with_sub_only"].remark.startswith(
        APACHE_DENIAL + "No default permission for topic:AclTopicB, "
    )
    assert denied["pull_group_pub_only"].remark.startswith(
        APACHE_DENIAL + "No default permission for group:AclGroupB, "
    )
    assert denied["send_v2_wrong_secret"].remark.startswith(
        APACHE_DENIAL + "Check signature failed for accessKey=aclprobe-pub, "
    )
    assert denied["send_v2_unknown_key"].remark.startswith(
        APACHE_DENIAL + "No acl config for aclprobe-nobody, "
    )
    assert denied["send_v2_unsigned"].remark.startswith(
        APACHE_DENIAL + "No accessKey is configured, "
    )
    assert denied["create_topic_not_admin"].remark.startswith(
        APACHE_DENIAL + "Need admin permission for request code=17, but accessKey=aclprobe-pub "
        "is not, "
    )


def test_an_application_send_sees_the_denial_as_a_client_exception(apache_outcomes):
    got = apache_outcomes["producer_send_denied"]
    assert got.exception == "MQClientException", got
    assert (got.code, got.response_code) == (1, 1), got
    assert got.remark.startswith(APACHE_DENIAL + "No default permission for topic:AclTopicB")


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.op != "producer_send"], ids=lambda c: c.case
)
def test_ferry_decides_the_requests_apache_got_as_the_table_says(apache_outcomes, checker, case):
    request = apache_outcomes[case.case].request
    assert request is not None, case.case
    body = base64.b64decode(request["body"]) if request.get("body") is not None else None
    try:
        checker.check(request["code"], request["fields"], body, "127.0.0.1")
        outcome = "allowed"
    except AclDenied as e:
        outcome = DENIED
        assert str(e).startswith("No permission: "), e
    assert outcome == case.expected_ferry, f"{case.case}: apache {apache_outcomes[case.case]}"


SIGN_INPUTS = [
    {"code": 310, "fields": {"a": "G", "b": "TopicA", "c": "TBW102"}, "body": b"hello"},
    {"code": 10, "fields": {"topic": "Tópico-日本", "properties": "KEYS\x01k\x02"}, "body": b""},
    {"code": 34, "fields": {}, "body": bytes(range(256))},
    {"code": 11, "fields": {"consumerGroup": "G", "topic": "T", "Z": "last", "A": "first"},
     "body": None, "securityToken": "token-é"},
    {"code": 17, "fields": {"emoji": "\U0001f600", "\U0001f600": "astral key", "\uff5e": "bmp"},
     "body": b"\x00\xff"},
]  # fmt: skip


def test_ferry_signs_as_the_java_client(tmp_path: Path):
    inputs = [
        dict(item, accessKey="aclprobe-pub", secretKey="pub-secret-é") for item in SIGN_INPUTS
    ]
    answers = java_signatures(inputs, tmp_path)
    for item, fields in zip(inputs, answers, strict=True):
        assert fields["AccessKey"] == "aclprobe-pub"
        assert fields.get("SecurityToken") == item.get("securityToken")
        sent = {k: v for k, v in fields.items() if k != "Signature"}
        assert sign(item["secretKey"], sent, item["body"]) == fields["Signature"], item
