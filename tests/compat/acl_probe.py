"""RocketMQ 4.x plain ACL cases, as Apache's 4.9 Java client meets them (tests/compat/client49's
AclProbe49), for any broker that serves RocketMQ's protocol: Apache's (test_acl_apache.py) and
ferry's.

`ACL_YAML` is the plain_acl.yml the broker under test must load; `CASES` is what each case
sends with which key, and the outcome Apache 4.9 gives (`apache`) and ferry gives (`ferry`,
the same but where ferry is deliberately stricter: `note` says why). `run_probe(namesrv,
directory)` runs every case in one JVM and returns {case: Outcome}; `outcome_of` is the one
rule that reads "allowed" or "denied" from a response, for both brokers (Apache answers a
denial with SYSTEM_ERROR and its AclException in the remark, ferry with NO_PERMISSION).
`java_signatures` has the Java client's hook sign requests, for comparing `ferry.acl.sign`.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.apache import java_program, run_java
from tests.compat.clients import JAVA_KIT, JAVA_PROPERTIES

PROBE = "ferry.compat.AclProbe49"
SYSTEM_ERROR = 1
NO_PERMISSION = 16
ALLOWED = "allowed"
DENIED = "denied"
APACHE_DENIAL = "org.apache.rocketmq.acl.common.AclException: "

ADMIN = ("aclprobe-admin", "admin-secret-1")
PUB = ("aclprobe-pub", "pub-secret-1")
SUB = ("aclprobe-sub", "sub-secret-1")
DEFAULTS = ("aclprobe-defaults", "defaults-secret")
LOCAL = ("aclprobe-local", "local-secret-1")
NOBODY = ("aclprobe-nobody", "nobody-secret")
WRONG_SECRET = (PUB[0], "not-the-secret")
NO_KEY = (None, None)

ACL_YAML = f"""\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.{{1,2}}
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {PUB[0]}
    secretKey: {PUB[1]}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclTopicA=PUB
      - AclTopicB=SUB
      - AclTopicC=DENY
    groupPerms:
      - AclGroupA=SUB
  - accessKey: {SUB[0]}
    secretKey: {SUB[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclTopicA=SUB
    groupPerms:
      - AclGroupA=SUB
      - AclGroupB=PUB
  - accessKey: {DEFAULTS[0]}
    secretKey: {DEFAULTS[1]}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms:
      - AclTopicC=DENY
  - accessKey: {LOCAL[0]}
    secretKey: {LOCAL[1]}
    whiteRemoteAddress: 127.0.0.1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""

BATCH_NOTE = (
    "Apache 4.9 checks no permission for SEND_BATCH_MESSAGE (320): any listed key with a right "
    "signature may batch-send to any topic; ferry asks PUB as for a send"
)
QUERY_NOTE = (
    "the Java client signs QUERY_MESSAGE with its _UNIQUE_KEY_QUERY field and Apache's broker "
    "checks the signature without it, so every query by key (mqadmin queryMsgByKey) fails "
    "'Check signature failed'; ferry accepts the signature over either content"
)


@dataclass(frozen=True)
class Case:
    """One request: `op` (see AclProbe49) with `key` = (access key, secret key); a key of
    (None, None) sends it unsigned."""

    case: str
    op: str
    key: tuple[str | None, str | None]
    apache: str
    topic: str | None = None
    group: str | None = None
    args: dict = field(default_factory=dict)
    ferry: str = ""  # "" = as apache
    note: str = ""

    @property
    def expected_ferry(self) -> str:
        return self.ferry or self.apache

    def to_json(self) -> dict:
        out = {
            "case": self.case,
            "op": self.op,
            "accessKey": self.key[0],
            "secretKey": self.key[1],
            "topic": self.topic,
            "group": self.group,
        }
        out.update(self.args)
        return out


A, B, C = "AclTopicA", "AclTopicB", "AclTopicC"
GA, GB, GZ = "AclGroupA", "AclGroupB", "AclGroupZ"
RETRY = "%RETRY%"

# In this order: the admin creates the topics and group the later cases use.
CASES: Sequence[Case] = (
    Case("admin_creates_topic_a", "create_topic", ADMIN, ALLOWED, topic=A),
    Case("admin_creates_topic_b", "create_topic", ADMIN, ALLOWED, topic=B),
    Case("admin_creates_topic_c", "create_topic", ADMIN, ALLOWED, topic=C),
    Case("admin_creates_group_a", "create_group", ADMIN, ALLOWED, group=GA),
    Case("create_topic_not_admin", "create_topic", PUB, DENIED, topic="AclTopicX"),
    Case("create_group_not_admin", "create_group", PUB, DENIED, group="AclGroupX"),
    Case("delete_topic_not_admin", "delete_topic", PUB, DENIED, topic=C),
    Case("delete_group_not_admin", "delete_group", SUB, DENIED, group=GA),
    Case(
        "update_broker_config_not_admin",
        "update_broker_config",
        DEFAULTS,
        DENIED,
        args={"body": "fileReservedTime=48\n"},
    ),
    Case("send_v2_with_pub", "send_v2", PUB, ALLOWED, topic=A),
    Case("send_v1_with_pub", "send_v1", PUB, ALLOWED, topic=A),
    Case("send_v2_with_sub_only", "send_v2", PUB, DENIED, topic=B),
    Case("send_v1_with_sub_only", "send_v1", PUB, DENIED, topic=B),
    Case("send_v2_topic_deny", "send_v2", PUB, DENIED, topic=C),
    Case("send_v2_default_deny", "send_v2", PUB, DENIED, topic="AclTopicD"),
    Case("send_v2_default_pub_sub", "send_v2", DEFAULTS, ALLOWED, topic=A),
    Case("send_v2_entry_deny_beats_default", "send_v2", DEFAULTS, DENIED, topic=C),
    Case(
        "send_v2_security_token",
        "send_v2",
        PUB,
        ALLOWED,
        topic=A,
        args={"securityToken": "token-1"},
    ),
    Case("send_v2_wrong_secret", "send_v2", WRONG_SECRET, DENIED, topic=A),
    Case("send_v2_unknown_key", "send_v2", NOBODY, DENIED, topic=A),
    Case("send_v2_unsigned", "send_v2", NO_KEY, DENIED, topic=A),
    Case(
        "send_v2_white_address_wrong_secret",
        "send_v2",
        (LOCAL[0], "not-the-secret"),
        ALLOWED,
        topic=A,
        note="an account's whiteRemoteAddress skips signature and perms",
    ),
    Case("send_v2_admin", "send_v2", ADMIN, ALLOWED, topic=A),
    Case("send_batch_with_pub", "send_batch", PUB, ALLOWED, topic=A),
    Case(
        "send_batch_with_sub_only",
        "send_batch",
        PUB,
        ALLOWED,
        topic=B,
        ferry=DENIED,
        note=BATCH_NOTE,
    ),
    Case("send_retry_topic_group_sub", "send_v2", PUB, ALLOWED, topic=RETRY + GA, group=GA),
    Case("send_retry_topic_group_pub_only", "send_v2", SUB, DENIED, topic=RETRY + GB, group=GB),
    Case("pull_with_sub", "pull", SUB, ALLOWED, topic=A, group=GA),
    Case("pull_topic_pub_only", "pull", PUB, DENIED, topic=A, group=GA),
    Case("pull_group_pub_only", "pull", SUB, DENIED, topic=A, group=GB),
    Case("heartbeat_with_sub", "heartbeat", SUB, ALLOWED, topic=A, group=GA),
    Case("heartbeat_topic_pub_only", "heartbeat", PUB, DENIED, topic=A, group=GA),
    Case("heartbeat_group_default_deny", "heartbeat", SUB, DENIED, topic=A, group=GZ),
    Case("send_back_group_sub", "send_back", SUB, ALLOWED, topic=A, group=GA),
    Case("send_back_group_default_deny", "send_back", PUB, DENIED, topic=A, group=GZ),
    Case("update_offset_with_sub", "update_offset", SUB, ALLOWED, topic=A, group=GA),
    Case("update_offset_group_pub_only", "update_offset", SUB, DENIED, topic=A, group=GB),
    Case("consumer_list_group_sub", "consumer_list", SUB, ALLOWED, group=GA),
    Case("consumer_list_group_default_deny", "consumer_list", PUB, DENIED, group=GZ),
    Case("unregister_group_sub", "unregister", SUB, ALLOWED, group=GA),
    Case("unregister_group_default_deny", "unregister", PUB, DENIED, group=GZ),
    Case(
        "query_message_topic_sub",
        "query_message",
        SUB,
        DENIED,
        topic=A,
        args={"key": "acl-probe", "unique": "false"},
        ferry=ALLOWED,
        note=QUERY_NOTE,
    ),
    Case(
        "query_message_topic_pub_only",
        "query_message",
        PUB,
        DENIED,
        topic=A,
        args={"key": "acl-probe", "unique": "false"},
    ),
    Case("producer_send_allowed", "producer_send", PUB, ALLOWED, topic=A),
    Case("producer_send_denied", "producer_send", PUB, DENIED, topic=B),
    Case("admin_deletes_topic_c", "delete_topic", ADMIN, ALLOWED, topic=C),
)


@dataclass(frozen=True)
class Outcome:
    """What the client saw: `outcome` (allowed, denied, or error when no answer came), the
    response `code` and `remark`, the request as sent (`request`: code, ext fields, body
    base64; absent for producer_send) and, for producer_send, what the send threw."""

    outcome: str
    code: int | None
    remark: str
    request: dict | None = None
    exception: str = ""
    response_code: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def outcome_of(code: int | None, remark: str) -> str:
    """allowed, or denied for Apache's (SYSTEM_ERROR, "...AclException: ...") or ferry's
    NO_PERMISSION; any other answer, even an error, got past the ACL."""
    if code is None:
        return "error"
    if code == NO_PERMISSION or (code == SYSTEM_ERROR and APACHE_DENIAL in remark):
        return DENIED
    return ALLOWED


def run_probe(
    namesrv: str, directory: Path, cases: Sequence[Case] = CASES, timeout_s: float = 120.0
) -> dict[str, Outcome]:
    """Every case through AclProbe49 in one JVM against the broker `namesrv` knows."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cases_file = directory / "cases.json"
    cases_file.write_text(json.dumps([c.to_json() for c in cases]))
    done = run_java(
        JAVA_KIT,
        PROBE,
        ["cases", "--namesrv", namesrv, "--cases", str(cases_file)],
        directory=directory,
        timeout_s=timeout_s,
        system_properties=JAVA_PROPERTIES,
        heap="128m",
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    out: dict[str, Outcome] = {}
    for e in events:
        if e.get("event") != "case":
            continue
        code = e.get("code")
        remark = e.get("remark", e.get("error", ""))
        out[e["case"]] = Outcome(
            outcome=outcome_of(code, remark) if "error" not in e else "error",
            code=code,
            remark=remark,
            request=e.get("request"),
            exception=e.get("exception", ""),
            response_code=e.get("responseCode"),
        )
    missing = [c.case for c in cases if c.case not in out]
    if missing:
        raise AssertionError(
            f"AclProbe49 printed no outcome for {missing}; it printed:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return out


def java_signatures(inputs: Sequence[dict], directory: Path, timeout_s: float = 60.0) -> list[dict]:
    """The ext fields (Signature included) Apache's AclClientRPCHook sends for each input:
    {"accessKey", "secretKey", "securityToken"?, "code", "fields": {...}, "body": bytes}."""
    command, env = java_program(
        JAVA_KIT,
        PROBE,
        ["sign"],
        directory=Path(directory),
        heap="128m",
        system_properties=JAVA_PROPERTIES,
    )
    lines = []
    for item in inputs:
        item = dict(item)
        body = item.pop("body", None)
        if body is not None:
            item["body"] = base64.b64encode(body).decode()
        lines.append(json.dumps(item))
    done = subprocess.run(
        command,
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=directory,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(answers) != len(inputs):
        raise AssertionError(
            f"AclProbe49 sign exited {done.returncode} with {len(answers)} of {len(inputs)} "
            f"answers:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return [a["fields"] for a in answers]
