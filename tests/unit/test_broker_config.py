"""broker.conf parsing: RocketMQ keys, -o overrides, unknown keys warned,
bad values refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.runtime.errors import ConfigError
from services.broker.config import (
    KNOWN_KEYS,
    BrokerConfig,
    describe_keys,
    load_config,
    parse_properties,
    shown_default,
)

CONF = """\
# broker-a master, as RocketMQ ships it
brokerClusterName = ProdCluster
brokerName=broker-b
brokerId:0
brokerRole   SYNC_MASTER
! another comment style
flushDiskType=SYNC_FLUSH
namesrvAddr=ns-0.ns:9876;ns-1.ns:9876
storePathRootDir=/data/store
registerNameServerPeriod=15000
syncFlushTimeout=2500
mappedFileSizeCommitLog=268435456
mappedFileSizeConsumeQueue=6000000
messageDelayLevel=1s 1m 1h 1d
slaveReadEnable=TRUE
"""


def test_defaults_are_rocketmqs():
    c = BrokerConfig()
    assert (c.listen_port, c.ha_listen_port, c.metrics_port) == (10911, 10912, 10913)
    assert c.commit_log_file_size == 1 << 30 and c.max_message_size == 4 << 20
    assert c.effective_register_period_s == 30 and c.sync_flush_timeout_s == 5
    assert len(c.message_delay_levels_s) == 18 and c.message_delay_levels_s[-1] == 7200


def test_a_realistic_broker_conf(tmp_path):
    path = tmp_path / "broker.conf"
    path.write_text(CONF)
    c, warnings = load_config(path, env={})
    assert warnings == []
    assert (c.cluster_name, c.broker_name, c.broker_id, c.broker_role) == (
        "ProdCluster",
        "broker-b",
        0,
        "SYNC_MASTER",
    )
    assert c.flush_disk_type == "SYNC_FLUSH"
    assert c.namesrv_addrs == ("ns-0.ns:9876", "ns-1.ns:9876")
    assert c.store_root == Path("/data/store") and c.commit_log_dir == Path("/data/store/commitlog")
    assert c.register_period_s == 15 and c.sync_flush_timeout_s == 2.5
    assert c.commit_log_file_size == 268435456 and c.consume_queue_entries_per_file == 300_000
    assert c.message_delay_levels_s == (1, 60, 3600, 86400)
    assert c.slave_read_enable is True


def test_overrides_win_over_the_file(tmp_path):
    path = tmp_path / "broker.conf"
    path.write_text(CONF)
    c, _ = load_config(path, ["listenPort=0", "brokerName=broker-z"], env={})
    assert (c.listen_port, c.broker_name) == (0, "broker-z")


def test_unknown_keys_are_warned_with_a_suggestion():
    _, warnings = load_config(None, ["brokerNmae=x", "totallyUnknown=1"], env={})
    assert warnings[0] == "unknown key 'brokerNmae' in -o, ignored (did you mean 'brokerName'?)"
    assert warnings[1].startswith("unknown key 'totallyUnknown'")


@pytest.mark.parametrize(
    ("option", "key", "text"),
    [
        ("brokerId=x", "brokerId", "'x' is not an integer"),
        ("brokerRole=LEADER", "brokerRole", "not one of"),
        ("flushDiskType=SOMETIMES", "flushDiskType", "not one of"),
        ("slaveReadEnable=yes", "slaveReadEnable", "not true or false"),
        ("listenPort=70000", "listenPort", "outside"),
        ("brokerPermission=16", "brokerPermission", "outside"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel", "'5x'"),
        ("namesrvAddr=host-without-port", "namesrvAddr", "host:port"),
        ("brokerName=bad name", "brokerName", "characters outside"),
        ("mappedFileSizeConsumeQueue=1001", "mappedFileSizeConsumeQueue", "multiple of 20"),
        ("listenPort", "listenPort", "key=value"),
        ("fastListenPort=-2", "fastListenPort", "outside"),
        ("listenPort=65533", "grpcListenPort", "65537 is not a port"),
        ("grpcListenPort=10911", "grpcListenPort", "also listenPort's port"),
        ("listenPort=10909", "metricsPort", "also grpcListenPort's port"),
        ("listenPort=10914", "haListenPort", "also fastListenPort's port"),
    ],
)
def test_bad_values_stop_startup_naming_the_key(option, key, text):
    with pytest.raises(ConfigError) as info:
        load_config(None, [option], env={})
    assert key in str(info.value) and text in str(info.value)


def test_role_and_id_must_agree():
    with pytest.raises(ConfigError, match="a SLAVE needs brokerId > 0"):
        load_config(None, ["brokerRole=SLAVE"], env={})
    with pytest.raises(ConfigError, match="a SYNC_MASTER must have brokerId 0, not 1"):
        load_config(None, ["brokerRole=SYNC_MASTER", "brokerId=1"], env={})
    c, _ = load_config(None, ["brokerRole=SLAVE", "brokerId=2"], env={})
    assert c.is_slave


def test_register_period_is_clamped_to_10_60_seconds():
    assert (
        load_config(None, ["registerNameServerPeriod=5000"], env={})[0].effective_register_period_s
        == 10
    )
    assert (
        load_config(None, ["registerNameServerPeriod=120000"], env={})[
            0
        ].effective_register_period_s
        == 60
    )


def test_max_message_size_must_fit_a_file():
    with pytest.raises(ConfigError, match="maxMessageSize"):
        load_config(None, ["mappedFileSizeCommitLog=65536"], env={})


def test_namesrv_from_the_environment_when_the_key_is_absent():
    c, _ = load_config(None, [], env={"FERRY_NAMESRV_ADDR": "a:1;b:2"})
    assert c.namesrv_addrs == ("a:1", "b:2")
    c, _ = load_config(None, ["namesrvAddr=c:3"], env={"FERRY_NAMESRV_ADDR": "a:1"})
    assert c.namesrv_addrs == ("c:3",)


def test_parse_properties_forms():
    assert parse_properties("a=1\nb : 2\nc 3\n#x=1\n\n d = x y ") == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "x y",
    }


def test_describe_keys_lists_every_key_with_its_default():
    text = describe_keys()
    assert "mappedFileSizeCommitLog" in text and "1073741824" in text
    assert "registerNameServerPeriod" in text and "30000" in text


@pytest.mark.parametrize("key", sorted(KNOWN_KEYS))
def test_the_default_shown_for_each_key_parses_back_to_the_default(key: str) -> None:
    """`ferry broker --help-keys` and docs/reference/broker-config.md show each
    default in the key's own unit (timerMaxDelaySec in seconds, the consume-queue
    file size in bytes): written into broker.conf, it means the default."""
    name, parse, _ = KNOWN_KEYS[key]
    shown = shown_default(key)
    default = getattr(BrokerConfig(), name)
    if shown == "":
        assert default in ("", (), None), f"{key}: shown empty, default {default!r}"
        return
    assert parse(key, shown) == default, f"{key}: {shown!r} parses to another value"


@pytest.mark.parametrize(
    ("options", "ports"),
    [
        # RocketMQ's defaults; gRPC beside them, clashing with none.
        ([], (10911, 10909, 10915)),
        (["listenPort=20911"], (20911, 20909, 20915)),
        # Port 0: every listener on a free port of its own.
        (["listenPort=0"], (0, 0, 0)),
        # Set explicitly: kept, whatever listenPort is.
        (["listenPort=20911", "grpcListenPort=7000", "fastListenPort=-1"], (20911, -1, 7000)),
        (["listenPort=0", "grpcListenPort=7000", "fastListenPort=7001"], (0, 7001, 7000)),
    ],
)
def test_the_ports_derive_from_listen_port_unless_set(options, ports):
    c, _ = load_config(None, options, env={})
    assert (c.listen_port, c.fast_port, c.grpc_port) == ports


def test_derived_ports_follow_a_replaced_listen_port():
    """A default is derived when read, so replacing listenPort (as a failover
    node does for each run) moves the ports that were not set."""
    from dataclasses import replace

    c = replace(BrokerConfig(), listen_port=30911)
    assert (c.fast_port, c.grpc_port) == (30909, 30915)
