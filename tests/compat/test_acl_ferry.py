"""RocketMQ 4.x plain ACL on ferry's broker, met by Apache's 4.9.8 Java client.

A ferry name server and broker, each its own process, the broker with `aclEnable=true`
and `aclFile` = tests/compat/acl_probe.py's ACL_YAML (the file test_acl_apache.py gives
Apache's broker). AclProbe49 (AclClientRPCHook) sends every case of `CASES` to it, finding
the broker through the name server's cluster info as it does Apache's; the tests show:

- each case is allowed or denied as the table's `ferry` column says (Apache's outcome,
  or ferry's stricter one where the case's note says why);
- every denial is answered NO_PERMISSION (16) with a message that starts "No permission:"
  and names what is missing (the Java client's remark);
- the broker's log has a line for the refusals, and no line of it holds a secret key or
  a signature.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.compat.acl_probe import ACL_YAML, CASES, DENIED, NO_PERMISSION, Outcome, run_probe
from tests.conftest import broker_options
from tests.integration import support

CASE_NAMES = [c.case for c in CASES]


class AclCluster:
    def __init__(self, root: Path) -> None:
        self.acl_file = root / "plain_acl.yml"
        self.acl_file.write_text(ACL_YAML)
        self.namesrv = support.NamesrvProcess(root / "namesrv").wait_ready()
        store = root / "broker"
        self.broker = support.BrokerServer(
            store,
            broker_options(
                store, self.namesrv.remoting_addr, aclEnable="true", aclFile=self.acl_file
            ),
        )
        try:
            self.broker.start()
        except BaseException:
            self.namesrv.stop()
            raise

    def stop(self) -> None:
        self.broker.stop()
        self.namesrv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclCluster]:
    c = AclCluster(tmp_path_factory.mktemp("acl-ferry"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def outcomes(cluster: AclCluster, tmp_path_factory) -> dict[str, Outcome]:
    return run_probe(cluster.namesrv.remoting_addr, tmp_path_factory.mktemp("probe"))


@pytest.mark.parametrize("case", CASES, ids=CASE_NAMES)
def test_ferry_decides_as_the_table_says(outcomes, case):
    got = outcomes[case.case]
    assert got.outcome == case.expected_ferry, f"{case.case}: {got}"


def test_every_denial_is_no_permission_naming_what_is_missing(outcomes):
    denied = {name: o for name, o in outcomes.items() if o.outcome == DENIED}
    assert len(denied) >= 20
    for name, got in denied.items():
        if name == "producer_send_denied":  # the producer's exception: checked below
            continue
        assert got.code == NO_PERMISSION, (name, got)
        assert got.remark.startswith("No permission: "), (name, got)
    remarks = {name: o.remark for name, o in denied.items()}
    assert remarks["send_v2_with_sub_only"].startswith(
        'No permission: access key "aclprobe-pub" lacks PUB on topic "AclTopicB" ('
    )
    assert 'its topicPerms entry "AclTopicB=SUB" grants no PUB' in remarks["send_v2_with_sub_only"]
    assert 'lacks SUB on group "AclGroupB"' in remarks["pull_group_pub_only"]
    assert "the signature does not match access key" in remarks["send_v2_wrong_secret"]
    assert 'access key "aclprobe-nobody" is not in' in remarks["send_v2_unknown_key"]
    assert "carries no AccessKey" in remarks["send_v2_unsigned"]
    assert remarks["create_topic_not_admin"].startswith(
        "No permission: request code 17 (UPDATE_AND_CREATE_TOPIC) needs an admin account"
    )
    producer = outcomes["producer_send_denied"]
    assert producer.response_code == NO_PERMISSION, producer
    assert "lacks PUB on topic" in producer.remark


def secrets() -> list[str]:
    return [a["secretKey"] for a in yaml.safe_load(ACL_YAML)["accounts"]] + ["not-the-secret"]


def test_the_broker_logs_refusals_without_secrets_or_signatures(cluster, outcomes):
    log = cluster.broker.log()
    assert "ACL refused request code" in log
    assert 'access key "aclprobe-pub" lacks PUB on topic "AclTopicB"' in log
    for secret in secrets():
        assert secret not in log, f"a secret key is in {cluster.broker.log_path}"
    # The Java client's signatures: Base64 of 20 bytes (28 characters ending in "=").
    signatures = [r.request["fields"].get("Signature") for r in outcomes.values() if r.request]
    assert any(signatures)
    for signature in filter(None, signatures):
        assert signature not in log
    assert not re.search(r"Signature\W", log)
