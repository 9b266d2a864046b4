"""The pieces every ACL door shares, without a server: the ACL file kept current
(ferry.runtime.acl_file.AclFile, on a fake clock), the denial log's once-a-minute rule,
the SDKs' MQv2-HMAC-SHA1 signature checked against the file (authenticate_v2), the
`ferry` commands' credentials, and the permissions each apache.rocketmq.v2 call needs
(services.proxy.auth.required_v2, after Apache 5.x's PlainAccessResource.parse)."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
from pathlib import Path

import pytest

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from ferry.acl import AclDenied, Perm, Reason, Resource, parse_acl
from ferry.runtime import auth
from ferry.runtime.acl_file import AclFile, DenialLog
from ferry.runtime.clock import FakeClock
from services.proxy.auth import Unreadable, required_v2

YAML = """\
globalWhiteRemoteAddresses: ["10.10.*.*"]
accounts:
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
  - accessKey: pub-key-1
    secretKey: pub-secret-1
    whiteRemoteAddress: 192.168.1.*
    topicPerms: ["TopicA=PUB"]
"""
SECRETS = ("admin-secret", "pub-secret-1")


def bump(path: Path, text: str) -> None:
    path.write_text(text)
    later = os.stat(path).st_mtime_ns + 2_000_000_000
    os.utime(path, ns=(later, later))


def test_the_file_is_reread_at_most_once_a_second_and_a_bad_edit_keeps_the_accounts(
    tmp_path, caplog
):
    path = tmp_path / "plain_acl.yml"
    path.write_text(YAML)
    clock = FakeClock()
    acl = AclFile(path, clock=clock.monotonic)
    assert set(acl.config.accounts) == {"admin-key", "pub-key-1"}
    bump(path, YAML.replace("pub-key-1", "pub-key-2"))
    assert "pub-key-1" in acl.config.accounts  # not looked at within the second
    clock.advance(1.0)
    assert set(acl.config.accounts) == {"admin-key", "pub-key-2"}
    assert acl.checker.config is acl.config and acl.reloads == 1
    with caplog.at_level(logging.WARNING):
        bump(path, YAML + "  - accessKey: short\n")
        clock.advance(1.0)
        assert "pub-key-2" in acl.config.accounts
        clock.advance(1.0)
        acl.config  # noqa: B018 - the same bad file is not reported twice
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and "keeping the accounts loaded before" in warnings[0]
    assert "accounts[2]" in warnings[0]
    path.unlink()
    clock.advance(1.0)
    assert "pub-key-2" in acl.config.accounts  # a file that went away changes nothing
    bump(path, YAML)
    clock.advance(1.0)
    assert "pub-key-1" in acl.config.accounts
    assert not any(secret in caplog.text for secret in SECRETS)


def test_a_missing_or_invalid_file_raises_naming_it(tmp_path):
    with pytest.raises(ValueError, match="cannot read the ACL file"):
        AclFile(tmp_path / "none.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text(YAML.replace("TopicA=PUB", "TopicA=WRITE"))
    with pytest.raises(ValueError, match=r"bad.yml: accounts\[1\]"):
        AclFile(bad)


def test_denials_are_logged_once_a_minute_per_key_and_reason(caplog):
    clock = FakeClock()
    denials = DenialLog(logging.getLogger("test.acl"), clock=clock.monotonic)
    first = AclDenied(Reason.BAD_SIGNATURE, "bad", access_key="k1")
    with caplog.at_level(logging.WARNING, logger="test.acl"):
        assert denials.denied(first, "code 10")
        assert not denials.denied(first, "code 10")
        assert denials.denied(AclDenied(Reason.NO_PERMISSION, "x", access_key="k1"), "code 10")
        assert denials.denied(AclDenied(Reason.BAD_SIGNATURE, "bad", access_key="k2"), "c")
        clock.advance(60)
        assert denials.denied(first, "code 10")
    assert len(caplog.records) == 4 and denials.suppressed == 1


CONFIG = parse_acl(__import__("yaml").safe_load(YAML), source="plain_acl.yml")
WHAT = "what to do"


def signed(key: str, secret: str) -> dict[str, str]:
    when = dt.datetime(2026, 11, 5, 10, 15, tzinfo=dt.UTC)
    return dict(auth.signed(key, secret, when))


def test_a_v2_signature_is_checked_against_the_files_secret():
    caller = auth.authenticate_v2(CONFIG, signed("pub-key-1", "pub-secret-1"), "127.0.0.1", WHAT)
    assert caller == auth.Caller("pub-key-1", white=False)
    cases = [
        (signed("pub-key-1", "wrong"), Reason.BAD_SIGNATURE, "bad signature"),
        (signed("nobody-key", "x"), Reason.UNKNOWN_ACCESS_KEY, 'access key "nobody-key"'),
        ({}, Reason.NO_ACCESS_KEY, "no 'authorization' metadata"),
        ({"authorization": "Bearer t"}, Reason.MALFORMED, "is not 'MQv2-HMAC-SHA1"),
    ]
    for metadata, reason, said in cases:
        with pytest.raises(AclDenied) as err:
            auth.authenticate_v2(CONFIG, metadata, "127.0.0.1", WHAT)
        assert err.value.reason is reason and said in str(err.value), metadata
        assert not any(secret in str(err.value) for secret in SECRETS)


def test_white_addresses_skip_the_signature():
    assert auth.authenticate_v2(CONFIG, {}, "10.10.3.4", WHAT).white
    wrong = signed("pub-key-1", "wrong")
    assert auth.authenticate_v2(CONFIG, wrong, "192.168.1.9", WHAT) == auth.Caller(
        "pub-key-1", white=True
    )


@pytest.mark.parametrize(
    ("peer", "ip"),
    [("ipv4:127.0.0.1:5000", "127.0.0.1"), ("ipv6:[::1]:5000", "::1"), ("unix:/x", "unix:/x")],
)
def test_remote_ip(peer, ip):
    assert auth.remote_ip(peer) == ip


def test_the_signature_is_the_sdks(monkeypatch):
    from rocketmq.v5.util.signature import Signature

    metadata = signed("pub-key-1", "pub-secret-1")
    assert metadata["x-mq-date-time"] == "20261105T101500Z"
    assert metadata["authorization"] == (
        "MQv2-HMAC-SHA1 Credential=pub-key-1, SignedHeaders=x-mq-date-time, Signature="
        + Signature.sign("pub-secret-1", "20261105T101500Z")
    )


def test_the_commands_credentials_in_any_order_and_from_the_environment(monkeypatch):
    from services.cli.namesrv_cmds import add_admin_token_option

    parser = argparse.ArgumentParser()
    add_admin_token_option(parser)
    for name in (auth.ENV_ACCESS_KEY, auth.ENV_SECRET_KEY, auth.ENV_ADMIN_TOKEN):
        monkeypatch.delenv(name, raising=False)
    args = parser.parse_args(["--access-key", "ak", "--admin-token", "t", "--secret-key", "sk"])
    assert args.admin_token == auth.AdminCredentials("t", "ak", "sk")
    assert "sk" not in repr(args.admin_token)
    assert dict(auth.client_metadata(args.admin_token))["authorization"].startswith(
        "MQv2-HMAC-SHA1 Credential=ak,"
    )
    args = parser.parse_args(["--admin-token", "t"])
    assert auth.client_metadata(args.admin_token) == (("authorization", "Bearer t"),)
    assert parser.parse_args([]).admin_token is None
    assert auth.client_metadata(None) == ()
    monkeypatch.setenv(auth.ENV_ACCESS_KEY, "env-ak")
    monkeypatch.setenv(auth.ENV_SECRET_KEY, "env-sk")
    assert "Credential=env-ak," in dict(auth.client_metadata(None))["authorization"]
    assert auth.client_metadata("t") != (("authorization", "Bearer t"),)  # keys win


def topic(name: str) -> v2.Resource:
    return v2.Resource(name=name)


def test_what_each_v2_call_needs():
    t, g = Resource.topic, Resource.group
    sent = s.SendMessageRequest(
        messages=[v2.Message(topic=topic("A")), v2.Message(topic=topic("B"))]
    )
    assert required_v2("SendMessage", sent) == {t("A"): Perm.PUB, t("B"): Perm.PUB}
    receive = s.ReceiveMessageRequest(
        group=topic("G"), message_queue=v2.MessageQueue(topic=topic("A"))
    )
    assert required_v2("ReceiveMessage", receive) == {g("G"): Perm.SUB, t("A"): Perm.SUB}
    for rpc, request_type in (
        ("AckMessage", s.AckMessageRequest),
        ("ChangeInvisibleDuration", s.ChangeInvisibleDurationRequest),
        ("ForwardMessageToDeadLetterQueue", s.ForwardMessageToDeadLetterQueueRequest),
        ("QueryAssignment", s.QueryAssignmentRequest),
    ):
        request = request_type(group=topic("G"), topic=topic("A"))
        assert required_v2(rpc, request) == {g("G"): Perm.SUB, t("A"): Perm.SUB}, rpc
    route = s.QueryRouteRequest(topic=v2.Resource(name="A", resource_namespace="ns"))
    assert required_v2("QueryRoute", route) == {t("ns%A"): Perm.ANY}
    assert required_v2("EndTransaction", s.EndTransactionRequest(topic=topic("A"))) == {
        t("A"): Perm.PUB
    }
    consumer = s.HeartbeatRequest(client_type=v2.SIMPLE_CONSUMER, group=topic("G"))
    assert required_v2("Heartbeat", consumer) == {g("G"): Perm.SUB}
    assert required_v2("Heartbeat", s.HeartbeatRequest(client_type=v2.PRODUCER)) == {}
    with pytest.raises(Unreadable):
        required_v2("Heartbeat", s.HeartbeatRequest(client_type=v2.PUSH_CONSUMER))
    assert required_v2("NotifyClientTermination", s.NotifyClientTerminationRequest()) == {}
    publishing = v2.Settings(publishing=v2.Publishing(topics=[topic("P"), topic("Q")]))
    assert required_v2("Telemetry", s.TelemetryCommand(settings=publishing)) == {
        t("P"): Perm.PUB,
        t("Q"): Perm.PUB,
    }
    subscription = v2.Settings(
        subscription=v2.Subscription(
            group=topic("G"), subscriptions=[v2.SubscriptionEntry(topic=topic("S"))]
        ),
    )
    assert required_v2("Telemetry", s.TelemetryCommand(settings=subscription)) == {
        g("G"): Perm.SUB,
        t("S"): Perm.SUB,
    }
    with pytest.raises(Unreadable):
        required_v2("Telemetry", s.TelemetryCommand(settings=v2.Settings()))
    assert (
        required_v2("Telemetry", s.TelemetryCommand(thread_stack_trace=s.ThreadStackTrace())) == {}
    )
