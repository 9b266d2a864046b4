"""The name server's RocketMQ-protocol side without sockets: golden bytes of the
bodies it writes, the RegisterBrokerBody forms it reads (and every way they can be
wrong), the header readers, and the route table's per-protocol views."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from ferry.model import DataVersion
from ferry.remoting.bodies import BodyError
from ferry.remoting.headers import BadRequest, boolean, integer, text
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import InvalidArgument, NotFound
from services.namesrv import remoting_convert as rc
from services.namesrv.routes import (
    GRPC,
    REMOTING,
    BrokerGroup,
    QueueData,
    Registration,
    Route,
    RouteTable,
    TopicQueues,
)

# ---------------------------------------------------------------- bodies out


def test_route_json_golden_bytes():
    route = Route(
        queue_datas=[QueueData("b", 2, 2, 4, 0), QueueData("a", 8, 4, 6, 1)],
        broker_datas=[
            BrokerGroup("c2", "b", {0: "10.0.0.3:10911"}),
            BrokerGroup("c1", "a", {10: "10.0.0.9:10911", 0: "10.0.0.1:10911", 2: "10.0.0.2:10911"}),
        ],
        filter_servers={"10.0.0.1:10911": ["10.0.0.1:40000"]},
    )  # fmt: skip
    assert rc.route_json(route) == (
        b'{"brokerDatas":['
        b'{"brokerAddrs":{"0":"10.0.0.1:10911","2":"10.0.0.2:10911","10":"10.0.0.9:10911"},'
        b'"brokerName":"a","cluster":"c1"},'
        b'{"brokerAddrs":{"0":"10.0.0.3:10911"},"brokerName":"b","cluster":"c2"}],'
        b'"filterServerTable":{"10.0.0.1:10911":["10.0.0.1:40000"]},'
        b'"queueDatas":['
        b'{"brokerName":"a","perm":6,"readQueueNums":8,"topicSysFlag":1,"writeQueueNums":4},'
        b'{"brokerName":"b","perm":4,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}]}'
    )
    with_order = rc.route_json(route, "a:4;b:2")
    assert (
        b'"filterServerTable":{"10.0.0.1:10911":["10.0.0.1:40000"]},"orderTopicConf":"a:4;b:2",'
        in with_order
    )


def test_route_json_splits_the_way_the_go_client_splits_it():
    # rocketmq-client-go cuts brokerAddrs' text on "," then on the first ":".
    route = Route([QueueData("a", 4, 4, 6, 0)], [BrokerGroup("c", "a", {0: "h:1", 1: "h:2"})], {})
    text_ = rc.route_json(route).decode()
    inner = text_[text_.index('"brokerAddrs":{') + 15 : text_.index("}")]
    pairs = dict(item.split(":", 1) for item in inner.split(","))
    assert pairs == {'"0"': '"h:1"', '"1"': '"h:2"'}
    assert " " not in text_


def test_cluster_info_topic_list_kv_table_and_data_version_golden_bytes():
    groups = {
        "b": BrokerGroup("c1", "b", {0: "h:2"}),
        "a": BrokerGroup("c1", "a", {1: "h:3", 0: "h:1"}),
    }
    assert rc.cluster_info_json(groups, {"c1": ["b", "a"]}) == (
        b'{"brokerAddrTable":{"a":{"brokerAddrs":{"0":"h:1","1":"h:3"},"brokerName":"a",'
        b'"cluster":"c1"},"b":{"brokerAddrs":{"0":"h:2"},"brokerName":"b","cluster":"c1"}},'
        b'"clusterAddrTable":{"c1":["a","b"]}}'
    )
    assert rc.topic_list_json(["b", "a"]) == b'{"topicList":["a","b"]}'
    assert rc.topic_list_json([]) == b'{"topicList":[]}'
    assert rc.kv_table_json({"k2": "v", "k1": "ü"}) == '{"table":{"k1":"ü","k2":"v"}}'.encode()
    assert rc.data_version_json(DataVersion(1700, 3)) == b'{"counter":3,"timestamp":1700}'
    assert rc.data_version_json(DataVersion(1700, 3, 2)) == (
        b'{"counter":3,"stateVersion":2,"timestamp":1700}'
    )


# ---------------------------------------------------------------- bodies in


def java_json(table: dict, version=None, filters=None) -> bytes:
    wrapper = {"topicConfigTable": table}
    if version is not None:
        wrapper["dataVersion"] = version
    doc: dict = {"topicConfigSerializeWrapper": wrapper}
    if filters is not None:
        doc["filterServerList"] = filters
    return json.dumps(doc).encode()


def test_a_json_body_as_a_49_broker_writes_it():
    body = java_json(
        {
            "T": {"order": False, "perm": 7, "readQueueNums": 8, "topicFilterType": "SINGLE_TAG",
                  "topicName": "T", "topicSysFlag": 1, "writeQueueNums": 4},
            "Defaults": {},
        },
        version={"counter": 5, "timestamp": 1700},
        filters=["10.0.0.1:40000"],
    )  # fmt: skip
    dv, topics, filters = rc.register_body(body, compressed=False)
    assert dv == DataVersion(1700, 5)
    assert topics == {"T": TopicQueues(8, 4, 7, 1), "Defaults": TopicQueues(16, 16, 6, 0)}
    assert filters == ("10.0.0.1:40000",)
    # fastjson's unquoted numeric keys, 5.x attributes, a body without a wrapper.
    _, topics, _ = rc.register_body(
        b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"attributes":{"+a":"b"}}}}}',
        False,
    )
    assert topics["T"].attributes == (("+a", "b"),)
    assert rc.register_body(b'{"filterServerList":null}', False) == (DataVersion(), None, ())


def compressed(
    version: bytes, lines: list[bytes], filters: bytes = b"[]", extra: bytes = b""
) -> bytes:
    parts = [struct.pack(">i", len(version)), version, struct.pack(">i", len(lines))]
    for line in lines:
        parts += [struct.pack(">i", len(line)), line]
    parts += [struct.pack(">i", len(filters)), filters, extra]
    return zlib.compress(b"".join(parts))


def test_the_compressed_form():
    body = compressed(
        b'{"counter":2,"timestamp":9}', [b"T 8 4 6 SINGLE_TAG", b"U 1 1 2 MULTI_TAG"], b'["h:1"]'
    )
    dv, topics, filters = rc.register_body(body, compressed=True)
    assert dv == DataVersion(9, 2)
    assert topics == {"T": TopicQueues(8, 4, 6), "U": TopicQueues(1, 1, 2)}
    assert filters == ("h:1",)


BAD_COMPRESSED = [
    ("not zlib", b"plain text", "not zlib"),
    ("truncated zlib", zlib.compress(b"x" * 100)[:-6], "truncated"),
    ("no version length", zlib.compress(b"\x00\x00"), "ends before"),
    ("version longer than the rest", zlib.compress(struct.pack(">i", 99) + b"{}"), "claims 99 bytes"),
    ("negative length", zlib.compress(struct.pack(">i", -1)), "claims -1 bytes"),
    ("topic count too big", zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 10**6)), "topic count"),
    ("four fields", compressed(b"{}", [b"T 8 4 6"]), "is not 'name"),
    ("not numbers", compressed(b"{}", [b"T x 4 6 SINGLE_TAG"]), "is not 'name"),
    ("bad filter type", compressed(b"{}", [b"T 8 4 6 NO_TAG"]), "is not one of"),
    ("bad version json", compressed(b"{no", []), "not JSON"),
    ("filters not a list", compressed(b"{}", [], b'{"a":1}'), "filterServerList"),
    ("trailing bytes", compressed(b"{}", [], b"[]", b"more"), "bytes after"),
]  # fmt: skip


@pytest.mark.parametrize("what,body,message", BAD_COMPRESSED, ids=[b[0] for b in BAD_COMPRESSED])
def test_a_bad_compressed_body_says_what_is_wrong(what, body, message):
    with pytest.raises(BodyError, match=message):
        rc.register_body(body, compressed=True)


def test_a_compressed_body_that_inflates_too_far_is_refused(monkeypatch):
    monkeypatch.setattr(rc, "MAX_INFLATED", 1000)
    with pytest.raises(BodyError, match="inflates to more than 1000"):
        rc.register_body(zlib.compress(b"\x00" * 5000), compressed=True)


BAD_JSON = [
    (b"[]", "expected a JSON object"),
    (b'{"topicConfigSerializeWrapper":[]}', "expected an object"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":"x"}}', "topicConfigTable"),
    (b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":1.5}}}', "counter: expected an integer"),
    (b'{"topicConfigSerializeWrapper":{"dataVersion":[]}}', "dataVersion: expected an object"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":[]}}}', "expected an object, got a list"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"6"}}}}', "perm: expected an integer"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":2147483648}}}}', "outside"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicName":"U"}}}}', "differs from its key"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicFilterType":1}}}}', "topicFilterType"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"attributes":{"a":1}}}}}', "attributes"),
    (b'{"filterServerList":"h:1"}', "filterServerList"),
    (b"\xff", "not UTF-8"),
]  # fmt: skip


@pytest.mark.parametrize("body,message", BAD_JSON)
def test_a_bad_json_body_says_what_is_wrong(body, message):
    with pytest.raises(BodyError, match=message):
        rc.register_body(body, compressed=False)


def header(**changes):
    ext = {
        "brokerAddr": "h:1",
        "brokerName": "b",
        "clusterName": "c",
        "brokerId": "0",
        "haServerAddr": "h:2",
    }
    ext.update(changes)
    return {k: v for k, v in ext.items() if v is not None}


def test_registration_from_a_header_and_body():
    body = java_json(
        {"T": {"readQueueNums": 2, "writeQueueNums": 2}}, {"counter": 1, "timestamp": 5}
    )
    reg = rc.registration(header(bodyCrc32=str(zlib.crc32(body) & 0x7FFFFFFF)), body, "i-1")
    assert reg == Registration(
        cluster_name="c", broker_addr="h:1", broker_name="b", broker_id=0, ha_server_addr="h:2",
        data_version=DataVersion(5, 1), topics={"T": TopicQueues(2, 2, 6)}, instance_id="i-1",
        remoting_addr="h:1", protocol=REMOTING, replace_topics=False,
    )  # fmt: skip
    empty = rc.registration(header(haServerAddr=None, heartbeatTimeoutMillis="30000"), b"")
    assert (empty.topics, empty.ha_server_addr, empty.heartbeat_timeout_s) == (None, "", 30.0)
    with pytest.raises(rc.CrcMismatch):
        rc.registration(header(bodyCrc32="12345"), body)
    for bad in ({"brokerAddr": None}, {"brokerId": "x"}, {"brokerId": "-1"}, {"compressed": "1"},
                {"bodyCrc32": "4294967296"}, {"heartbeatTimeoutMillis": "-5"}):  # fmt: skip
        with pytest.raises(BadRequest):
            rc.registration(header(**bad), body)


def test_data_version_body():
    assert rc.data_version_body(b'{"counter":2,"timestamp":7}') == DataVersion(7, 2)
    for body, message in ((b"", "needs the broker's DataVersion"), (b"[]", "expected an object")):
        with pytest.raises(BodyError, match=message):
            rc.data_version_body(body)


def test_header_readers():
    ext = {"s": "x", "e": "", "n": "42", "big": "9" * 30, "t": "TRUE", "f": "false", "bad": "yes"}
    assert text(ext, "s") == "x"
    assert text(ext, "e", allow_empty=True) == ""
    assert text(ext, "missing", required=False, default="d") == "d"
    with pytest.raises(BadRequest, match="e: missing"):
        text(ext, "e")
    assert integer(ext, "n", low=0, high=42) == 42
    with pytest.raises(BadRequest, match="outside"):
        integer(ext, "n", high=41)
    with pytest.raises(BadRequest, match="not an integer"):
        integer(ext, "big")
    with pytest.raises(BadRequest, match="not an integer"):
        integer(ext, "s")
    assert integer(ext, "missing", required=False, default=-1) == -1
    assert (boolean(ext, "t"), boolean(ext, "f"), boolean(ext, "missing", default=True)) == (
        True, False, True,
    )  # fmt: skip
    with pytest.raises(BadRequest, match="neither true nor false"):
        boolean(ext, "bad")


# ---------------------------------------------------------------- one table, two protocols


@pytest.fixture
def table() -> RouteTable:
    return RouteTable(FakeClock(), default_heartbeat_timeout_s=120)


def ferry_broker(
    name="broker-f",
    addr="10.0.0.1:10915",
    remoting="10.0.0.1:10911",
    broker_id=0,
    topics=None,
    **kw,
):
    fields = dict(
        cluster_name="c", broker_addr=addr, broker_name=name, broker_id=broker_id,
        ha_server_addr="10.0.0.1:10912", data_version=DataVersion(1, 1),
        topics={"T": TopicQueues(4, 4, 6)} if topics is None else topics,
        remoting_addr=remoting,
    )  # fmt: skip
    return Registration(**{**fields, **kw})


def java_broker(name="broker-j", addr="10.0.0.2:10911", broker_id=0, topics=None, counter=1):
    return Registration(
        cluster_name="c", broker_addr=addr, broker_name=name, broker_id=broker_id,
        ha_server_addr="10.0.0.2:10912", data_version=DataVersion(counter, counter),
        topics={"T": TopicQueues(2, 2, 6)} if topics is None else topics,
        remoting_addr=addr, protocol=REMOTING, replace_topics=False,
    )  # fmt: skip


def addrs(route: Route) -> dict[str, dict[int, str]]:
    return {g.broker_name: g.broker_addrs for g in route.broker_datas}


def test_each_protocol_sees_the_addresses_it_can_dial(table):
    table.register(ferry_broker())
    table.register(ferry_broker(name="broker-g", addr="10.0.0.3:10915", remoting=""))
    table.register(java_broker())
    assert addrs(table.route("T", REMOTING)) == {
        "broker-f": {0: "10.0.0.1:10911"},
        "broker-j": {0: "10.0.0.2:10911"},
    }
    assert addrs(table.route("T", GRPC)) == {
        "broker-f": {0: "10.0.0.1:10915"},
        "broker-g": {0: "10.0.0.3:10915"},
    }
    assert [q.broker_name for q in table.route("T", GRPC).queue_datas] == ["broker-f", "broker-g"]
    groups, clusters = table.cluster_view(REMOTING)
    assert sorted(groups) == ["broker-f", "broker-j"] and clusters == {
        "c": ["broker-f", "broker-j"]
    }
    # The tables themselves keep each broker under the address it registered with.
    assert table.broker_addr_table["broker-f"].broker_addrs == {0: "10.0.0.1:10915"}


def test_a_topic_reachable_through_the_other_protocol_only_says_so(table):
    table.register(java_broker(topics={"J": TopicQueues(1, 1, 6)}))
    with pytest.raises(NotFound, match="reached through RocketMQ's protocol only"):
        table.route("J", GRPC)
    table.register(ferry_broker(topics={"F": TopicQueues(1, 1, 6)}, remoting=""))
    with pytest.raises(NotFound, match="reached through ferry.v1 only"):
        table.route("F", REMOTING)
    with pytest.raises(NotFound, match="topic: Nothing$"):
        table.route("Nothing", REMOTING)


def test_a_slave_is_told_its_masters_address_in_its_own_protocol(table):
    table.register(ferry_broker(name="g"))
    slave = table.register(java_broker(name="g", broker_id=1, topics={}))
    assert (slave.master_addr, slave.ha_server_addr) == ("10.0.0.1:10911", "10.0.0.1:10912")
    grpc_slave = table.register(
        ferry_broker(name="g", addr="10.0.0.4:10915", remoting="", broker_id=1)
    )
    assert grpc_slave.master_addr == "10.0.0.1:10915"
    # A RocketMQ master: a ferry slave has no gRPC address to follow.
    table.register(java_broker(name="h"))
    assert (
        table.register(ferry_broker(name="h", addr="10.0.0.5:10915", broker_id=1)).master_addr == ""
    )


def test_remoting_registrations_add_topics_grpc_ones_replace_them(table):
    table.register(java_broker(topics={"A": TopicQueues(1, 1, 6), "B": TopicQueues(1, 1, 6)}))
    table.register(java_broker(topics={"C": TopicQueues(1, 1, 6)}, counter=2))
    assert table.topics() == ["A", "B", "C"]
    table.register(ferry_broker(topics={"X": TopicQueues(1, 1, 6), "Y": TopicQueues(1, 1, 6)}))
    table.register(ferry_broker(topics={"Y": TopicQueues(1, 1, 6)}, data_version=DataVersion(2, 2)))
    assert table.topics() == ["A", "B", "C", "Y"]


def test_delete_topic_and_topics_by_cluster(table):
    table.register(java_broker(topics={"T": TopicQueues(1, 1, 6), "U": TopicQueues(1, 1, 6)}))
    table.register(ferry_broker(name="other", topics={"T": TopicQueues(1, 1, 6)}, cluster_name="d"))
    assert table.topics_by_cluster("c") == ["T", "U"]
    assert table.topics_by_cluster("d") == ["T"]
    assert table.topics_by_cluster("none") == []
    version = table.version
    assert table.delete_topic("T", "d") == 1
    assert table.version > version
    assert [q.broker_name for q in table.route("T", REMOTING).queue_datas] == ["broker-j"]
    assert table.delete_topic("T", "none") == 0
    assert table.delete_topic("T") == 1
    assert table.delete_topic("T") == 0
    assert table.topics() == ["U"]
    with pytest.raises(InvalidArgument):
        table.delete_topic("a b")
    with pytest.raises(InvalidArgument):
        table.topics_by_cluster("")


def test_a_registration_with_an_unknown_protocol_or_bad_remoting_address_is_refused(table):
    for bad in (ferry_broker(remoting="no-port"), ferry_broker(protocol="http")):
        with pytest.raises(InvalidArgument):
            table.register(bad)
    assert not table.live
