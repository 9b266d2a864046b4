"""ferry.v1 admin calls on a broker with RocketMQ's ACL on (`aclEnable=true`, `aclFile`):
BrokerAdmin's changes take a call signed as the RocketMQ 5 SDKs sign (MQv2-HMAC-SHA1) by
an account with `admin: true` of the same plain_acl.yml the RocketMQ-protocol door reads
(tests/compat/acl_probe.py's ACL_YAML); the `ferry` commands sign with --access-key and
--secret-key (or $FERRY_ACCESS_KEY/$FERRY_SECRET_KEY). A key that is not admin is
PERMISSION_DENIED, none or a bad signature UNAUTHENTICATED, each saying what to do; the
admin token still works beside it; reads stay open. The file is re-read when it changes
(a bad edit keeps the accounts before), and a broker whose file is missing or invalid
does not start, naming aclFile."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from ferry.runtime import auth
from ferry.v1 import broker_admin_pb2, common_pb2
from tests.compat.acl_probe import ACL_YAML, ADMIN, LOCAL, PUB, SUB
from tests.conftest import broker_options, start_broker
from tests.integration import support
from tests.integration.support import run_ferry
from tests.waiting import wait_for

TOKEN = "acl-admin-token-1"
NO_ENV = {auth.ENV_ACCESS_KEY: "", auth.ENV_SECRET_KEY: "", auth.ENV_ADMIN_TOKEN: ""}


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return path


@pytest.fixture
def broker(loop_thread, tmp_path, acl_file):
    b = start_broker(
        loop_thread, tmp_path / "broker", aclEnable="true", aclFile=acl_file, adminToken=TOKEN
    )
    yield b
    b.stop()


def create(broker, topic: str, *args: str, env: dict[str, str] | None = None):
    return run_ferry(
        "topic", "create", topic, "-b", broker.addr, *args, env={**NO_ENV, **(env or {})}
    )


def topics(broker) -> set[str]:
    return set(broker.app.metadata.topics.snapshot()[0])


def test_the_cli_creates_a_topic_with_an_admin_key(broker):
    done = create(broker, "AdminMade", "--access-key", ADMIN[0], "--secret-key", ADMIN[1])
    assert done.returncode == 0, done.stderr
    assert "created topic AdminMade" in done.stdout
    assert "AdminMade" in topics(broker)
    # The same keys from the environment, the secret out of the process list.
    done = create(
        broker, "AdminEnv", env={auth.ENV_ACCESS_KEY: ADMIN[0], auth.ENV_SECRET_KEY: ADMIN[1]}
    )
    assert done.returncode == 0, done.stderr
    assert "AdminEnv" in topics(broker)


def test_a_key_that_is_not_admin_is_permission_denied(broker):
    done = create(broker, "NotAdmin", "--secret-key", PUB[1], "--access-key", PUB[0])
    assert done.returncode == 1
    assert "PERMISSION_DENIED" in done.stderr
    assert (
        "No permission: /ferry.v1.BrokerAdmin/UpdateAndCreateTopic needs an admin account and "
        'access key "aclprobe-pub" is not one' in done.stderr
    )
    assert "admin: true" in done.stderr  # what to do
    assert "NotAdmin" not in topics(broker)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "carries no 'authorization' metadata"),
        (("--access-key", ADMIN[0], "--secret-key", "not-the-secret"), "bad signature"),
        (("--access-key", "aclprobe-nobody", "--secret-key", "nobody-secret"), "is not in"),
    ],
    ids=["no-key", "wrong-secret", "unknown-key"],
)
def test_no_key_or_a_bad_one_is_unauthenticated(broker, args, said):
    done = create(broker, "Refused", *args)
    assert done.returncode == 1
    assert "UNAUTHENTICATED" in done.stderr and said in done.stderr, done.stderr
    what_to_do = "the secret key that goes with it" if said == "bad signature" else "--access-key"
    assert what_to_do in done.stderr
    assert "not-the-secret" not in done.stderr and ADMIN[1] not in done.stderr
    assert "Refused" not in topics(broker)


def test_the_admin_token_still_works_and_reads_stay_open(broker):
    done = create(broker, "TokenMade", "--admin-token", TOKEN)
    assert done.returncode == 0, done.stderr
    assert "TokenMade" in topics(broker)
    assert broker.admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest())


def test_every_admin_method_is_checked(broker):
    stub = broker.admin
    signed_by = {
        "admin": auth.signed(*ADMIN),
        "sub": auth.signed(*SUB),
    }
    config = common_pb2.TopicConfig(topic_name="Checked", read_queue_nums=1, write_queue_nums=1)
    with pytest.raises(grpc.RpcError) as err:
        stub.UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(topic_config=config),
            metadata=signed_by["sub"],
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stub.UpdateAndCreateTopic(
        broker_admin_pb2.UpdateAndCreateTopicRequest(topic_config=config),
        metadata=signed_by["admin"],
    )
    for name, request in (
        ("DeleteTopic", broker_admin_pb2.DeleteTopicRequest(topic="Checked")),
        (
            "UpdateBrokerPermission",
            broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=6),
        ),
    ):
        with pytest.raises(grpc.RpcError) as err:
            getattr(stub, name)(request)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        getattr(stub, name)(request, metadata=signed_by["admin"])


def test_an_accounts_white_address_skips_its_signature(broker):
    """As on the RocketMQ-protocol door (Apache 4.9's order): aclprobe-local from
    127.0.0.1 is not asked for its signature or its permissions."""
    done = create(broker, "FromLocal", "--access-key", LOCAL[0], "--secret-key", "wrong-secret")
    assert done.returncode == 0, done.stderr
    assert "FromLocal" in topics(broker)


def test_an_edit_of_the_file_applies_and_a_bad_edit_keeps_the_accounts(broker, acl_file, caplog):
    refused = create(broker, "Promoted", "--access-key", PUB[0], "--secret-key", PUB[1])
    assert refused.returncode == 1
    acl_file.write_text(ACL_YAML.replace("    admin: false\n", "    admin: true\n", 1))
    bump_mtime(acl_file)

    def promoted() -> bool:
        return (
            create(broker, "Promoted", "--access-key", PUB[0], "--secret-key", PUB[1]).returncode
            == 0
        )

    wait_for(promoted, 15, "the broker to re-read the ACL file", 0.3)
    with caplog.at_level(logging.WARNING):
        acl_file.write_text(ACL_YAML + "  - accessKey: short\n")
        bump_mtime(acl_file)

        def warned() -> bool:  # the file is looked at when a call is checked
            create(broker, "Probe", "--access-key", ADMIN[0], "--secret-key", ADMIN[1])
            return "cannot be used, keeping the accounts loaded before" in caplog.text

        wait_for(
            warned,
            15,
            "the broker to warn about the bad edit",
            0.3,
        )
    assert str(acl_file) in caplog.text
    for account in (ADMIN, PUB, SUB, LOCAL):
        assert account[1] not in caplog.text
    done = create(broker, "StillPromoted", "--access-key", PUB[0], "--secret-key", PUB[1])
    assert done.returncode == 0, done.stderr


def bump_mtime(path: Path) -> None:
    """A later modification time, even within the file system's timestamp granularity."""
    later = time.time_ns() + 2_000_000_000
    os.utime(path, ns=(later, later))


def start_broker_process(tmp_path: Path, **keys: object) -> subprocess.CompletedProcess:
    store = tmp_path / "store"
    args = [sys.executable, "-m", "services.broker"]
    for option in broker_options(store, **keys):
        args += ["-o", option]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=support.REPO,
        env=support.child_env(),
    )


def test_a_missing_acl_file_stops_startup_naming_the_key(tmp_path):
    missing = tmp_path / "nowhere" / "plain_acl.yml"
    done = start_broker_process(tmp_path, aclEnable="true", aclFile=missing)
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "config aclFile: aclEnable=true and the ACL file cannot be used" in out
    assert f"{missing}: cannot read the ACL file" in out


def test_an_invalid_acl_file_stops_startup_naming_the_field(tmp_path):
    bad = tmp_path / "plain_acl.yml"
    bad.write_text(ACL_YAML.replace("AclTopicA=PUB\n", "AclTopicA=PUBLISH\n", 1))
    done = start_broker_process(tmp_path, aclEnable="true", aclFile=bad)
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "config aclFile" in out and f"{bad}: accounts[1]" in out, out
    for account in (ADMIN, PUB, SUB, LOCAL):
        assert account[1] not in out


def test_acl_enable_without_a_file_to_read_names_acl_file(tmp_path):
    env_free = {k: v for k, v in support.child_env().items() if k != "ROCKETMQ_HOME"}
    store = tmp_path / "store"
    args = [sys.executable, "-m", "services.broker"]
    for option in broker_options(store, aclEnable="true"):
        args += ["-o", option]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=60, cwd=support.REPO, env=env_free
    )
    assert done.returncode == 2
    assert "config aclFile: aclEnable=true needs a plain_acl.yml" in done.stdout + done.stderr
