"""The name server over RocketMQ's protocol (an in-process NamesrvApp on
127.0.0.1:0: its own --port, `remoting_addr`, beside its ferry.v1 gRPC port):
every code it serves, bad input changing nothing, one route table for brokers
registered through either protocol (a real ferry broker registering itself),
removal when a broker's connection closes, and the admin token."""

from __future__ import annotations

import json
import socket
import zlib
from pathlib import Path

import pytest

from ferry.model import SCHEDULE_TOPIC
from ferry.remoting import codes
from ferry.remoting.client import recv_command
from ferry.remoting.codec import Command, encode
from ferry.v1 import namesrv_pb2
from services.broker.metadata.defaults import default_topics
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.helpers import register_request
from tests.integration import support
from tests.waiting import wait_for

JAVA_A = "127.0.0.1:30911"  # a RocketMQ broker (registers over RocketMQ's protocol)
JAVA_A_SLAVE = "127.0.0.1:30921"
FERRY_B_GRPC = "127.0.0.1:40915"  # a ferry broker registered by hand, without a
# RocketMQ-protocol address (real ferry brokers register their own: `ferry_broker`)
NO_ROUTE = (
    "No topic route info in name server for the topic: {}"
    "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
)


class Conn:
    """One blocking RocketMQ-protocol connection (a broker keeps one open)."""

    def __init__(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = bytearray()
        self.opaque = 0

    def request(self, code: int, ext: dict | None = None, body: bytes = b"") -> Command:
        self.opaque += 1
        command = Command(code, self.opaque, ext={k: str(v) for k, v in (ext or {}).items()})
        command.body = body
        self.sock.sendall(encode(command))
        answer = recv_command(self.sock, self.buffer)
        assert answer.is_response and answer.opaque == self.opaque
        return answer

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def rns(loop_thread: LoopThread, tmp_path: Path):
    ns = start_namesrv(loop_thread, tmp_path / "namesrv", metrics_port=-1)
    yield ns
    ns.stop()


@pytest.fixture
def conn(rns):
    c = Conn(rns.remoting_addr)
    yield c
    c.close()


def java_body(topics: dict[str, int], counter: int = 1, perm: int = 6) -> bytes:
    """RegisterBrokerBody as a 4.9 broker writes it (fastjson: fields sorted)."""
    table = {
        name: {
            "order": False,
            "perm": perm,
            "readQueueNums": queues,
            "topicFilterType": "SINGLE_TAG",
            "topicName": name,
            "topicSysFlag": 0,
            "writeQueueNums": queues,
        }
        for name, queues in topics.items()
    }
    doc = {
        "filterServerList": [],
        "topicConfigSerializeWrapper": {
            "dataVersion": {"counter": counter, "timestamp": 1700000000000 + counter},
            "topicConfigTable": table,
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def register_ext(addr=JAVA_A, broker_id=0, name="broker-a", cluster="JavaCluster", **more):
    ext = {
        "brokerAddr": addr,
        "brokerId": broker_id,
        "brokerName": name,
        "clusterName": cluster,
        "haServerAddr": addr.replace("09", "10"),
        "compressed": "false",
    }
    ext.update(more)
    return ext


def register(conn: Conn, topics=None, crc=True, **ext) -> Command:
    body = java_body({"TopicTest": 4} if topics is None else topics)
    fields = register_ext(**ext)
    if crc:
        fields["bodyCrc32"] = zlib.crc32(body) & 0x7FFFFFFF
    return conn.request(codes.REGISTER_BROKER, fields, body)


def route_body(conn: Conn, topic: str) -> bytes:
    answer = conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert answer.code == codes.SUCCESS, answer.remark
    return answer.body


def register_ferry_broker(rns, topics: dict[str, int], remoting_addr: str):
    return rns.stub.RegisterBroker(
        register_request(
            broker_name="broker-b",
            addr=FERRY_B_GRPC,
            topics=topics,
            cluster="FerryCluster",
            ha_addr="127.0.0.1:40912",
            instance_id="ferry-b",
            remoting_addr=remoting_addr,
        )
    )


def queue_nums(conn: Conn, topic: str) -> dict[str, int]:
    """brokerName -> writeQueueNums in the name server's route for `topic` ({}: none)."""
    answer = conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if answer.code != codes.SUCCESS:
        return {}
    return {q["brokerName"]: q["writeQueueNums"] for q in json.loads(answer.body)["queueDatas"]}


@pytest.fixture
def ferry_broker(rns, conn, loop_thread: LoopThread, tmp_path: Path):
    """A real ferry broker ("broker-b" in "FerryCluster", namesrvAddr = the name
    server's RocketMQ-protocol address) that registers itself, through ferry.v1
    with its RocketMQ-protocol address, once it has created `topics`."""
    started = []

    def start(topics: dict[str, int]):
        broker = start_broker(
            loop_thread, tmp_path / "broker-b", rns.remoting_addr,
            brokerName="broker-b", brokerClusterName="FerryCluster",
        )  # fmt: skip
        started.append(broker)
        for topic, queues in topics.items():
            support.create_topic(broker.channel, topic, queues)
        for topic, queues in topics.items():
            wait_for(
                lambda t=topic, q=queues: queue_nums(conn, t).get("broker-b") == q,
                10,
                f"broker-b's {topic} ({queues} queues) in the name server's route",
            )
        return broker

    yield start
    for broker in started:
        broker.stop()


def grpc_route(rns, topic: str):
    return rns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic))


# ---------------------------------------------------------------- routes


def test_a_registered_brokers_route_is_compact_quoted_json_with_its_address(conn):
    answer = register(conn, {"TopicTest": 4})
    assert answer.code == codes.SUCCESS, answer.remark
    assert "masterAddr" not in answer.ext and "haServerAddr" not in answer.ext
    assert answer.body == b""  # no ORDER_TOPIC_CONFIG namespace yet
    assert route_body(conn, "TopicTest") == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:30911"},"brokerName":"broker-a",'
        b'"cluster":"JavaCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
        b'"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
    )


def test_a_java_broker_and_a_ferry_broker_share_one_route(rns, conn, ferry_broker):
    assert register(conn, {"Shared": 4, "JavaOnly": 2}).code == codes.SUCCESS
    broker = ferry_broker({"Shared": 8, "FerryOnly": 1})
    ferry_b, ferry_b_grpc = broker.remoting_addr, broker.addr
    assert ferry_b != ferry_b_grpc

    shared = json.loads(route_body(conn, "Shared"))
    assert [(b["brokerName"], b["brokerAddrs"]) for b in shared["brokerDatas"]] == [
        ("broker-a", {"0": JAVA_A}),
        ("broker-b", {"0": ferry_b}),  # the RocketMQ-protocol address, not the gRPC one
    ]
    assert [(q["brokerName"], q["writeQueueNums"]) for q in shared["queueDatas"]] == [
        ("broker-a", 4),
        ("broker-b", 8),
    ]
    # ferry.v1 clients see the brokers they can reach through gRPC only.
    data = grpc_route(rns, "Shared")
    assert [(b.broker_name, dict(b.broker_addrs)) for b in data.broker_datas] == [
        ("broker-b", {0: ferry_b_grpc})
    ]
    assert [q.broker_name for q in data.queue_datas] == ["broker-b"]
    with pytest.raises(Exception, match="reached through RocketMQ's protocol only"):
        grpc_route(rns, "JavaOnly")

    info = json.loads(conn.request(codes.GET_BROKER_CLUSTER_INFO).body)
    assert info == {
        "brokerAddrTable": {
            "broker-a": {"brokerAddrs": {"0": JAVA_A}, "brokerName": "broker-a", "cluster": "JavaCluster"},
            "broker-b": {"brokerAddrs": {"0": ferry_b}, "brokerName": "broker-b", "cluster": "FerryCluster"},
        },
        "clusterAddrTable": {"FerryCluster": ["broker-b"], "JavaCluster": ["broker-a"]},
    }  # fmt: skip
    grpc_info = rns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    assert set(grpc_info.broker_addr_table) == {"broker-b"}
    assert set(grpc_info.broker_live_table) == {ferry_b_grpc}
    assert set(grpc_info.cluster_addr_table) == {"FerryCluster"}

    topics = json.loads(conn.request(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)
    # The ferry broker registers the topics it keeps by itself too, as a 4.9 broker does.
    own = [c.topic_name for c in default_topics(broker.app.config)]
    assert topics == {"topicList": sorted({"FerryOnly", "JavaOnly", "Shared", *own})}
    assert {SCHEDULE_TOPIC, "TBW102", "FerryCluster", "broker-b"} <= set(own)
    by_cluster = conn.request(codes.GET_TOPICS_BY_CLUSTER, {"cluster": "JavaCluster"})
    assert json.loads(by_cluster.body) == {"topicList": ["JavaOnly", "Shared"]}
    unknown = conn.request(codes.GET_TOPICS_BY_CLUSTER, {"cluster": "NoSuchCluster"})
    assert (unknown.code, json.loads(unknown.body)) == (codes.SUCCESS, {"topicList": []})


def test_a_ferry_broker_without_a_remoting_address_is_not_in_remoting_routes(rns, conn):
    # A ferry broker of before RocketMQ's protocol: registered without the address.
    register_ferry_broker(rns, {"FerryOnly": 2}, remoting_addr="")
    answer = conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "FerryOnly"})
    assert answer.code == codes.TOPIC_NOT_EXIST
    assert answer.remark.startswith("No topic route info in name server for the topic: FerryOnly")
    assert json.loads(conn.request(codes.GET_BROKER_CLUSTER_INFO).body) == {
        "brokerAddrTable": {},
        "clusterAddrTable": {},
    }
    assert len(grpc_route(rns, "FerryOnly").broker_datas) == 1


def test_no_route_answers_17_with_apaches_remark(conn):
    answer = conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "Missing"})
    assert (answer.code, answer.remark) == (codes.TOPIC_NOT_EXIST, NO_ROUTE.format("Missing"))
    assert answer.body == b""


@pytest.mark.parametrize("topic", ["a b", "T" * 128, "a.b"])
def test_a_topic_name_that_cannot_exist_answers_17_saying_why(conn, topic):
    answer = conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert answer.code == codes.TOPIC_NOT_EXIST
    assert answer.remark.startswith("No topic route info in name server for the topic: ")
    assert "characters" in answer.remark
    assert answer.remark.endswith("for further details.")


def test_order_topic_conf_appears_only_when_set(conn):
    register(conn, {"Orders": 4})
    assert b"orderTopicConf" not in route_body(conn, "Orders")
    put = conn.request(
        codes.PUT_KV_CONFIG,
        {"namespace": "ORDER_TOPIC_CONFIG", "key": "Orders", "value": "broker-a:4"},
    )
    assert put.code == codes.SUCCESS
    assert json.loads(route_body(conn, "Orders"))["orderTopicConf"] == "broker-a:4"
    # A registration's answer carries the namespace as a KVTable.
    answer = register(conn, {"Orders": 4})
    assert json.loads(answer.body) == {"table": {"Orders": "broker-a:4"}}


def test_wipe_and_add_write_perm_and_delete_topic(conn):
    register(conn, {"T1": 4, "T2": 4})
    wiped = conn.request(codes.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert (wiped.code, wiped.ext["wipeTopicCount"]) == (codes.SUCCESS, "2")
    assert json.loads(route_body(conn, "T1"))["queueDatas"][0]["perm"] == 4
    added = conn.request(codes.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert (added.code, added.ext["addTopicCount"]) == (codes.SUCCESS, "2")
    assert json.loads(route_body(conn, "T1"))["queueDatas"][0]["perm"] == 6

    other = conn.request(codes.DELETE_TOPIC_IN_NAMESRV, {"topic": "T1", "clusterName": "Other"})
    assert other.code == codes.SUCCESS
    assert route_body(conn, "T1")  # another cluster's groups only: still routed
    assert conn.request(codes.DELETE_TOPIC_IN_NAMESRV, {"topic": "T1"}).code == codes.SUCCESS
    assert conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}).code == codes.TOPIC_NOT_EXIST
    assert route_body(conn, "T2")


# ---------------------------------------------------------------- KV config


def test_kv_config_put_get_list_delete(conn):
    ns = {"namespace": "ns1"}
    assert conn.request(codes.PUT_KV_CONFIG, {**ns, "key": "k1", "value": "v1"}).code == 0
    assert conn.request(codes.PUT_KV_CONFIG, {**ns, "key": "k0", "value": ""}).code == 0
    got = conn.request(codes.GET_KV_CONFIG, {**ns, "key": "k1"})
    assert (got.code, got.ext) == (codes.SUCCESS, {"value": "v1"})
    listed = conn.request(codes.GET_KVLIST_BY_NAMESPACE, ns)
    assert listed.body == b'{"table":{"k0":"","k1":"v1"}}'
    assert conn.request(codes.DELETE_KV_CONFIG, {**ns, "key": "k1"}).code == codes.SUCCESS
    assert conn.request(codes.DELETE_KV_CONFIG, {**ns, "key": "k1"}).code == codes.SUCCESS
    missing = conn.request(codes.GET_KV_CONFIG, {**ns, "key": "k1"})
    assert (missing.code, missing.remark) == (
        codes.QUERY_NOT_FOUND,
        "No config item, Namespace: ns1 Key: k1",
    )
    none = conn.request(codes.GET_KVLIST_BY_NAMESPACE, {"namespace": "nope"})
    assert (none.code, none.remark) == (codes.QUERY_NOT_FOUND, "No config item, Namespace: nope")


def test_the_ferry_namespace_answers_the_grpc_port_and_cannot_be_changed(rns, conn):
    got = conn.request(codes.GET_KV_CONFIG, {"namespace": "ferry.v1", "key": "grpcPort"})
    assert got.ext == {"value": str(rns.app.port)}
    put = conn.request(
        codes.PUT_KV_CONFIG, {"namespace": "ferry.v1", "key": "grpcPort", "value": "1"}
    )
    assert put.code == codes.NO_PERMISSION
    gone = conn.request(codes.DELETE_KV_CONFIG, {"namespace": "ferry.v1", "key": "grpcPort"})
    assert gone.code == codes.NO_PERMISSION
    assert rns.app.kv.namespace("ferry.v1") is None


# ---------------------------------------------------------------- brokers


def test_a_slave_learns_its_masters_remoting_and_ha_addresses(conn, ferry_broker):
    master = ferry_broker({"T": 4})
    assert master.app.ha_addr.startswith("127.0.0.1:")
    slave = register(
        conn, {"T": 4}, addr=JAVA_A_SLAVE, broker_id=1, name="broker-b", cluster="FerryCluster"
    )
    assert slave.code == codes.SUCCESS, slave.remark
    assert slave.ext == {"masterAddr": master.remoting_addr, "haServerAddr": master.app.ha_addr}
    group = json.loads(route_body(conn, "T"))["brokerDatas"][0]
    assert group["brokerAddrs"] == {"0": master.remoting_addr, "1": JAVA_A_SLAVE}


def test_a_registration_adds_topics_and_keeps_the_others_as_apaches_does(conn):
    # A 4.9 broker that created a topic registers just that one, with a new DataVersion.
    assert register(conn, {"A": 4, "B": 4}).code == codes.SUCCESS
    body = java_body({"C": 2}, counter=2)
    ext = register_ext(bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF)
    assert conn.request(codes.REGISTER_BROKER, ext, body).code == codes.SUCCESS
    for topic in ("A", "B", "C"):
        assert route_body(conn, topic)
    topics = json.loads(conn.request(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)
    assert topics == {"topicList": ["A", "B", "C"]}


def test_a_compressed_registration_is_read(conn):
    version = json.dumps({"counter": 3, "timestamp": 1700000000003}).encode()
    parts = [len(version).to_bytes(4, "big"), version, (2).to_bytes(4, "big")]
    for line in (b"Zipped 4 4 6 SINGLE_TAG", b"Zipped2 2 1 4 MULTI_TAG"):
        parts += [len(line).to_bytes(4, "big"), line]
    parts += [(2).to_bytes(4, "big"), b"[]"]
    body = zlib.compress(b"".join(parts), 9)
    ext = register_ext(compressed="true", bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF)
    answer = conn.request(codes.REGISTER_BROKER, ext, body)
    assert answer.code == codes.SUCCESS, answer.remark
    queues = json.loads(route_body(conn, "Zipped2"))["queueDatas"]
    assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in queues] == [(2, 1, 4)]


def test_query_data_version_and_unregister(rns, conn):
    register(conn, {"T": 4})
    ext = {
        k: v
        for k, v in register_ext().items()
        if k in ("brokerAddr", "brokerId", "brokerName", "clusterName")
    }
    same = conn.request(codes.QUERY_DATA_VERSION, ext, b'{"counter":1,"timestamp":1700000000001}')
    assert (same.code, same.ext) == (codes.SUCCESS, {"changed": "false"})
    assert json.loads(same.body) == {"counter": 1, "timestamp": 1700000000001}
    newer = conn.request(codes.QUERY_DATA_VERSION, ext, b'{"counter":2,"timestamp":1700000000002}')
    assert newer.ext == {"changed": "true"}
    stranger = conn.request(
        codes.QUERY_DATA_VERSION,
        {**ext, "brokerAddr": "127.0.0.1:1"},
        b'{"counter":1,"timestamp":1}',
    )
    assert (stranger.ext, stranger.body) == ({"changed": "true"}, b"")

    assert conn.request(codes.UNREGISTER_BROKER, ext).code == codes.SUCCESS
    assert conn.request(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == codes.TOPIC_NOT_EXIST
    assert JAVA_A not in rns.app.routes.live
    assert conn.request(codes.UNREGISTER_BROKER, ext).code == codes.SUCCESS  # twice: still fine


def test_a_broker_whose_connection_closes_leaves_the_routes(rns, loop_thread):
    live = rns.app.routes.live
    first = Conn(rns.remoting_addr)
    assert register(first, {"T": 4}).code == codes.SUCCESS
    second = Conn(rns.remoting_addr)
    try:
        # The same broker registering again on a new connection (it reconnected):
        # the old connection's end no longer removes it.
        assert register(second, {"T": 4}).code == codes.SUCCESS
        first.close()
        connections = rns.app.remoting.connections
        wait_for(lambda: loop_thread.call(lambda: len(connections)) == 1, 5, "the first close")
        assert loop_thread.call(lambda: JAVA_A in live)
    finally:
        second.close()
    wait_for(lambda: loop_thread.call(lambda: JAVA_A not in live), 5, "the broker's removal")
    assert loop_thread.call(lambda: "T" not in rns.app.routes.topic_queue_table)


# ---------------------------------------------------------------- bad input


def snapshot(rns, loop_thread):
    routes = rns.app.routes

    def take():
        return (
            repr(routes.topic_queue_table),
            repr(routes.broker_addr_table),
            sorted(routes.live),
            routes.version,
        )

    return loop_thread.call(take)


BAD_REGISTRATIONS = [
    # (what, header changes, body) — body None: a valid one
    ("no brokerAddr", {"brokerAddr": None}, None),
    ("brokerAddr without port", {"brokerAddr": "127.0.0.1"}, None),
    ("brokerId not a number", {"brokerId": "one"}, None),
    ("negative brokerId", {"brokerId": "-1"}, None),
    ("no clusterName", {"clusterName": None}, None),
    ("bad brokerName", {"brokerName": "a b"}, None),
    ("compressed not a boolean", {"compressed": "yes"}, None),
    ("bodyCrc32 not an int32", {"bodyCrc32": str(2**40)}, None),
    ("body not JSON", {}, b"{not json"),
    ("body a list", {}, b"[]"),
    ("wrapper a string", {}, b'{"topicConfigSerializeWrapper":"x"}'),
    ("table a list", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":[]}}'),
    ("queue count a string", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":"4"}}}}'),
    ("queue count a bool", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":true}}}}'),
    ("perm out of range", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":99}}}}'),
    ("topicName differs", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicName":"U"}}}}'),
    ("bad topic name", {}, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"a b":{}}}}'),
    ("counter a string", {}, b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":"1"}}}'),
    ("filter servers not strings", {}, b'{"filterServerList":[1]}'),
    ("compressed but not zlib", {"compressed": "true"}, b"plain"),
    ("body not UTF-8", {}, b"\xff\xfe"),
]  # fmt: skip


@pytest.mark.parametrize(
    "what,changes,body", BAD_REGISTRATIONS, ids=[b[0] for b in BAD_REGISTRATIONS]
)
def test_a_bad_registration_answers_an_error_and_changes_nothing(
    rns, conn, loop_thread, what, changes, body
):
    assert register(conn, {"Kept": 4}).code == codes.SUCCESS
    before = snapshot(rns, loop_thread)
    ext = register_ext(addr="127.0.0.1:30931", name="broker-c")
    for key, value in changes.items():
        if value is None:
            ext.pop(key)
        else:
            ext[key] = value
    body = java_body({"New": 4}) if body is None else body
    answer = conn.request(codes.REGISTER_BROKER, ext, body)
    assert answer.code == codes.SYSTEM_ERROR
    assert answer.remark
    assert snapshot(rns, loop_thread) == before


def test_a_body_that_does_not_match_its_crc_is_refused_as_apache_does(rns, conn, loop_thread):
    before = snapshot(rns, loop_thread)
    body = java_body({"T": 4})
    ext = register_ext(bodyCrc32=(zlib.crc32(body) & 0x7FFFFFFF) ^ 1)
    answer = conn.request(codes.REGISTER_BROKER, ext, body)
    assert (answer.code, answer.remark) == (codes.SYSTEM_ERROR, "crc32 not match")
    assert snapshot(rns, loop_thread) == before


@pytest.mark.parametrize(
    "code,ext",
    [
        (codes.GET_ROUTEINFO_BY_TOPIC, {}),
        (codes.PUT_KV_CONFIG, {"namespace": "n", "key": "k"}),
        (codes.PUT_KV_CONFIG, {"namespace": "n", "value": "v"}),
        (codes.PUT_KV_CONFIG, {"namespace": "n" * 300, "key": "k", "value": "v"}),
        (codes.GET_KV_CONFIG, {"namespace": "n"}),
        (codes.DELETE_KV_CONFIG, {"key": "k"}),
        (codes.GET_KVLIST_BY_NAMESPACE, {}),
        (codes.WIPE_WRITE_PERM_OF_BROKER, {}),
        (codes.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "a b"}),
        (codes.DELETE_TOPIC_IN_NAMESRV, {}),
        (codes.DELETE_TOPIC_IN_NAMESRV, {"topic": "a b"}),
        (codes.GET_TOPICS_BY_CLUSTER, {}),
        (codes.UNREGISTER_BROKER, {"brokerAddr": JAVA_A, "brokerName": "broker-a", "clusterName": "c"}),
        (codes.QUERY_DATA_VERSION, {"brokerAddr": JAVA_A, "brokerName": "b", "clusterName": "c", "brokerId": "0"}),
    ],
)  # fmt: skip
def test_bad_headers_answer_system_error_naming_the_field(rns, conn, loop_thread, code, ext):
    register(conn, {"T": 4})
    before = snapshot(rns, loop_thread)
    kv_before = loop_thread.call(lambda: rns.app.kv.namespace("n"))
    answer = conn.request(code, ext)
    assert answer.code == codes.SYSTEM_ERROR
    assert answer.remark and ":" in answer.remark
    assert snapshot(rns, loop_thread) == before
    assert loop_thread.call(lambda: rns.app.kv.namespace("n")) == kv_before


def test_a_bad_data_version_body_is_refused(conn):
    ext = {
        k: v
        for k, v in register_ext().items()
        if k in ("brokerAddr", "brokerId", "brokerName", "clusterName")
    }
    for body in (b"[1]", b'{"counter":"x"}', b"nope"):
        answer = conn.request(codes.QUERY_DATA_VERSION, ext, body)
        assert answer.code == codes.SYSTEM_ERROR, body


# ---------------------------------------------------------------- admin token


@pytest.fixture
def guarded(loop_thread: LoopThread, tmp_path: Path):
    def start(broker_hosts=()):
        server = start_namesrv(
            loop_thread,
            tmp_path / f"ns{len(started)}",
            metrics_port=-1,
            admin_token="s3cret",
            broker_hosts=tuple(broker_hosts),
        )
        started.append(server)
        return server

    started: list = []
    yield start
    for server in started:
        server.stop()


def test_with_an_admin_token_remoting_changes_are_refused_and_reads_served(guarded):
    rns = guarded()
    c = Conn(rns.remoting_addr)
    try:
        for code, ext in [
            (codes.PUT_KV_CONFIG, {"namespace": "n", "key": "k", "value": "v"}),
            (codes.DELETE_KV_CONFIG, {"namespace": "n", "key": "k"}),
            (codes.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "b"}),
            (codes.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "b"}),
            (codes.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
            (codes.UNREGISTER_BROKER, {}),
            (codes.QUERY_DATA_VERSION, {}),
        ]:
            answer = c.request(code, ext)
            assert answer.code == codes.NO_PERMISSION, code
            assert "admin token" in answer.remark
        answer = register(c)
        assert answer.code == codes.NO_PERMISSION
        assert "broker hosts" in answer.remark
        assert rns.app.kv.namespace("n") is None and not rns.app.routes.live
        assert c.request(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).code == codes.SUCCESS
        assert (
            c.request(codes.GET_KV_CONFIG, {"namespace": "ferry.v1", "key": "grpcPort"}).code == 0
        )
    finally:
        c.close()


def test_with_an_admin_token_brokers_register_from_their_hosts_only(guarded):
    rns = guarded(broker_hosts=["127.0.0.0/8"])
    c = Conn(rns.remoting_addr)
    try:
        assert register(c).code == codes.SUCCESS
        assert (
            c.request(codes.PUT_KV_CONFIG, {"namespace": "n", "key": "k", "value": "v"}).code
            == codes.NO_PERMISSION
        )
        assert route_body(c, "TopicTest")
    finally:
        c.close()
    with pytest.raises(ValueError, match="neither an IP address nor a network"):
        guarded(broker_hosts=["brokers.example"])
