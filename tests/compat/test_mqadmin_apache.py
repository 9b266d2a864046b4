"""Apache's own `mqadmin` (rocketmq-tools 4.9.8) against a ferry cluster and an Apache 4.9 cluster.

Both sides are one broker group, an ASYNC_MASTER and its SLAVE
(`remoting_backends.ONE_GROUP`), with the same traffic from Apache's 4.9.8 Java client: 20
messages to `AdmTopic` (4 queues, message i to queue i mod 4), a push consumer group
`AdmGroup` that consumed them all and stays connected, and a producer group `LiveProducer`
that sent one more message and stays connected. Every mqadmin command runs against both
(one MqadminSession JVM per side) and the test compares what it printed: the fields that
mean the same must have the same values (offsets, queue counts, lags, roles, groups,
languages, versions). What differs by design — addresses, cluster names, timestamps, the
broker's version, Apache's own system topics — is left out of each comparison, and the
differences ferry documents (docs/reference/remoting.md) are asserted as such.

The tests share the module's clusters and run in this file's order (later ones see the
offsets the reset moved).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferry.remoting import codes
from ferry.remoting.bodies import loads
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.compat import clients
from tests.compat.clients import Client
from tests.compat.mqadmin import MqadminSession, Result
from tests.compat.remoting_backends import ONE_GROUP, RemotingBackend, start_remoting_backend
from tests.waiting import wait_for

TOPIC = "AdmTopic"
GROUP = "AdmGroup"
LIVE = "LiveProducer"
SENT = 20
SIDES = ("ferry", "apache")


@dataclass
class Side:
    name: str
    cluster: RemotingBackend
    mqadmin: MqadminSession
    consumer: Client
    live: Client
    offset_ids: list[str]
    cluster_name: str = ""
    unique_ids: list[str] = field(default_factory=list)  # the client's msgId (UNIQ_KEY)

    @property
    def master(self) -> str:
        return next(n.address for n in self.cluster.nodes if n.broker_id == 0)

    @property
    def slave(self) -> str:
        return next(n.address for n in self.cluster.nodes if n.broker_id != 0)

    def run(self, *args: str) -> Result:
        return self.mqadmin.run(*args, "-n", self.cluster.namesrv)

    def consume_stats(self) -> dict:
        answer = call(self.master, Command(codes.GET_CONSUME_STATS, ext={"consumerGroup": GROUP}))
        assert answer.code == codes.SUCCESS, (self.name, answer.code, answer.remark)
        return {
            int(q): (e["brokerOffset"], e["consumerOffset"])
            for q, e in re.findall(
                r'"queueId":(\d+),"topic":"AdmTopic"\}:(\{[^}]*\})', answer.body.decode()
            )
            for e in [loads(e.encode())]
        }


def _start(name: str, root: Path) -> Side:
    cluster = start_remoting_backend(name, ONE_GROUP, root / name)
    started: list = []
    try:
        cluster.create_topic(TOPIC, 4)
        sends = clients.produce(
            clients.java(
                "Producer49",
                ["--namesrv", cluster.namesrv, "--topic", TOPIC, "--count", str(SENT),
                 "--key-prefix", "adm", "--select", "mod", "--group", "AdmBatch",
                 # Both sides' JVMs start at once: on a loaded machine a first send once
                 # took longer than the default 5 s (a send to a chosen queue is not
                 # retried), and the module's setup failed.
                 "--timeout-ms", "20000"],
                root / f"{name}-producer",
            )
        )  # fmt: skip
        failed = [s for s in sends if s["status"] != "SEND_OK"]
        assert len(sends) == SENT and not failed, (len(sends), failed[:3])
        consumer = clients.java(
            "PushConsumer49",
            ["--namesrv", cluster.namesrv, "--topic", TOPIC, "--group", GROUP,
             "--instance", "c1", "--stdin-stop"],
            root / f"{name}-consumer",
        ).start()  # fmt: skip
        started.append(consumer)
        consumer.wait(lambda c: len(c.of("msg")) >= SENT, 90, f"{name}: {SENT} consumed")
        # One more message, then connected and idle: its group shows in producerConnection.
        live = clients.java(
            "Producer49",
            ["--namesrv", cluster.namesrv, "--topic", TOPIC, "--count", "2", "--select", "mod",
             "--key-prefix", "live", "--interval-ms", "600000", "--group", LIVE, "--stdin-stop"],
            root / f"{name}-live",
        ).start()  # fmt: skip
        started.append(live)
        live.wait(lambda c: len(c.of("send")) >= 1, 60, f"{name}: the live producer's send")
        consumer.wait(lambda c: len(c.of("msg")) >= SENT + 1, 60, f"{name}: all consumed")
        session = MqadminSession(root / f"{name}-mqadmin")
        side = Side(name, cluster, session, consumer, live, [s["offsetMsgId"] for s in sends])
        side.unique_ids = [s["msgId"] for s in sends]
        info = loads(call(cluster.namesrv, Command(codes.GET_BROKER_CLUSTER_INFO)).body)
        side.cluster_name = next(iter(info["clusterAddrTable"]))
        return side
    except BaseException:
        for client in started:
            client.stop()
        cluster.stop()
        raise


@pytest.fixture(scope="module")
def sides(tmp_path_factory) -> Iterator[dict[str, Side]]:
    root = tmp_path_factory.mktemp("mqadmin")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_start, name, root) for name in SIDES}
    started: dict[str, Side] = {}
    failure: BaseException | None = None
    for name, future in futures.items():
        try:
            started[name] = future.result()
        except BaseException as e:  # noqa: BLE001 - raised after the other side is stopped
            failure = failure or e
    try:
        if failure is not None:
            raise failure
        for side in started.values():  # every consumed offset committed, on both
            wait_for(
                lambda s=side: (
                    all(b == c for b, c in s.consume_stats().values())
                    and sum(b for b, _ in s.consume_stats().values()) == SENT + 1
                ),
                60,
                f"{side.name}: {GROUP}'s offsets committed",
            )
        yield started
    finally:
        for side in started.values():
            side.consumer.stop()
            side.live.stop()
            side.mqadmin.stop()
            side.cluster.stop()


def both(sides: dict[str, Side], *args: str, on: Callable[[Side], list[str]] | None = None):
    """The same mqadmin command on each side (`on` adds side-specific arguments, e.g. -b)."""
    return {name: side.run(*args, *(on(side) if on else [])) for name, side in sides.items()}


def rows(result: Result, skip_header: bool = True) -> list[list[str]]:
    lines = result.lines[1:] if skip_header else result.lines
    return [line.split() for line in lines]


def neutral(text: str, side: Side) -> str:
    """An output with the side's own addresses and cluster name replaced."""
    for addr, label in ((side.master, "MASTER"), (side.slave, "SLAVE"),
                        (side.cluster.namesrv, "NAMESRV")):  # fmt: skip
        text = text.replace(addr, label)
    return text.replace(side.cluster_name, "CLUSTER")


# ---------------------------------------------------------------- cluster and broker


def test_cluster_list_shows_the_same_group_and_roles(sides):
    out = both(sides, "clusterList")
    for name, side in sides.items():
        table = {r[2]: r for r in rows(out[name])}  # by broker id
        assert sorted(table) == ["0", "1"], out[name].out
        assert table["0"][:4] == [side.cluster_name, "broker-a", "0", side.master]
        assert table["1"][:4] == [side.cluster_name, "broker-a", "1", side.slave]
        # #InTPS(LOAD) reads putTps, #SPACE commitLogDiskRatio: numbers on both.
        assert re.match(r"\d+\.\d\d\(", table["0"][5]), table["0"]
        assert 0.0 <= float(table["0"][-1]) <= 1.0
    assert rows(out["ferry"])[0][5].endswith("(0,0ms)")  # no thread-pool queue in ferry


def test_broker_status_has_the_keys_tools_read_with_ferrys_figures(sides):
    out = both(sides, "brokerStatus", on=lambda s: ["-b", s.master])
    tables = {
        name: dict(line.split(":", 1) for line in r.lines if ":" in line) for name, r in out.items()
    }
    tables = {n: {k.strip(): v.strip() for k, v in t.items()} for n, t in tables.items()}
    read_by_tools = {  # clusterList, brokerStatus users, rocketmq-exporter
        "putTps", "getTransferedTps", "sendThreadPoolQueueSize", "pullThreadPoolQueueSize",
        "sendThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
        "pageCacheLockTimeMills", "earliestMessageTimeStamp", "commitLogDiskRatio",
        "brokerVersionDesc", "commitLogMaxOffset", "commitLogMinOffset", "dispatchBehindBytes",
        "msgPutTotalTodayNow", "msgGetTotalTodayNow", "bootTimestamp", "runtime",
        "remainHowManyDataToFlush", "commitLogDirCapacity", "consumeQueueDiskRatio",
        "getFoundTps", "getMissTps", "getTotalTps",  # the Dashboard's broker charts
    }  # fmt: skip
    for name, table in tables.items():
        assert read_by_tools <= set(table), (name, read_by_tools - set(table))
    ferry = tables["ferry"]
    assert int(ferry["commitLogMaxOffset"]) > 0 and ferry["commitLogMinOffset"] == "0"
    assert int(ferry["msgPutTotalTodayNow"]) >= SENT + 1
    assert int(ferry["msgGetTotalTodayNow"]) >= SENT + 1
    assert int(ferry["earliestMessageTimeStamp"]) > 0  # Apache 4.9 answers -1 on a small store
    assert len(ferry["putTps"].split()) == 3  # 10 s, 60 s, 600 s, as Apache's
    # The Dashboard adds getTotalTps's three figures as BigDecimals: numbers on both.
    for name, table in tables.items():
        figures = [float(f) for f in table["getTotalTps"].split(" ")]
        assert len(figures) == 3 and min(figures) >= 0, (name, table["getTotalTps"])
    assert ferry["dispatchBehindBytes"] == "0"


def test_broker_config_reads_the_same_identity(sides):
    out = both(sides, "getBrokerConfig", on=lambda s: ["-b", s.master])
    for name, result in out.items():
        config = dict(
            (k.strip(), v.strip()) for k, _, v in (line.partition("=") for line in result.lines[1:])
        )
        assert result.lines[0] == f"============{sides[name].master}============"
        assert (config["brokerName"], config["brokerId"]) == ("broker-a", "0"), name
        assert config["brokerRole"] == "ASYNC_MASTER", name
        assert config["namesrvAddr"] == sides[name].cluster.namesrv, name
    assert "haSecret" in out["ferry"].out and "adminToken" in out["ferry"].out


def test_update_broker_config_changes_the_permission_on_both(sides):
    for value, perm in (("4", 4), ("6", 6)):
        out = both(sides, "updateBrokerConfig", "-k", "brokerPermission", "-v", value,
                   on=lambda s: ["-b", s.master])  # fmt: skip
        for name, result in out.items():
            assert result.lines == [f"update broker config success, {sides[name].master}"]
            wait_for(
                lambda s=sides[name], p=perm: _route_perm(s, TOPIC) == p,
                30,
                f"{name}: {TOPIC}'s route perm {perm}",
            )
    # A key ferry cannot change while it runs is refused, naming the key.
    refused = sides["ferry"].run(
        "updateBrokerConfig", "-b", sides["ferry"].master, "-k", "maxMessageSize", "-v", "1024"
    )
    assert "success" not in refused.out
    assert "maxMessageSize: not changeable at run time" in refused.err


def _route_perm(side: Side, topic: str) -> int:
    answer = call(side.cluster.namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
    return loads(answer.body)["queueDatas"][0]["perm"]


# ---------------------------------------------------------------- topics


def test_topic_list_route_and_status_agree(sides):
    listed = both(sides, "topicList")
    for result in listed.values():
        assert {TOPIC, f"%RETRY%{GROUP}"} <= set(result.lines)
    by_cluster = both(sides, "topicList", "-c")
    for name, result in by_cluster.items():
        line = next(r for r in rows(result) if r[1] == TOPIC)
        assert line == [sides[name].cluster_name, TOPIC, GROUP], result.out
    routes = both(sides, "topicRoute", "-t", TOPIC)
    assert neutral(routes["ferry"].out, sides["ferry"]) == neutral(
        routes["apache"].out, sides["apache"]
    )
    status = both(sides, "topicStatus", "-t", TOPIC)
    expected = [["broker-a", str(q), "0", str(SENT // 4 + (q == 0))] for q in range(4)]
    for name, result in status.items():
        assert [r[:4] for r in rows(result)] == expected, (name, result.out)
        assert all(len(r) == 6 for r in rows(result)), result.out  # a last-updated time each


def test_update_and_delete_topic_print_the_same(sides):
    created = both(sides, "updateTopic", "-t", "NewTopic", "-r", "3", "-w", "3",
                   on=lambda s: ["-b", s.master])  # fmt: skip
    assert neutral(created["ferry"].out, sides["ferry"]) == neutral(
        created["apache"].out, sides["apache"]
    )
    assert "readQueueNums=3, writeQueueNums=3, perm=RW-" in created["ferry"].out
    for side in sides.values():
        wait_for(lambda s=side: _has_route(s, "NewTopic"), 30, f"{side.name}: NewTopic routed")
    status = both(sides, "topicStatus", "-t", "NewTopic")
    assert (
        rows(status["ferry"])
        == rows(status["apache"])
        == [["broker-a", str(q), "0", "0"] for q in range(3)]
    )
    deleted = both(sides, "deleteTopic", "-t", "NewTopic", on=lambda s: ["-c", s.cluster_name])
    for name, result in deleted.items():
        assert neutral(result.out, sides[name]).splitlines() == [
            "delete topic [NewTopic] from cluster [CLUSTER] success.",
            "delete topic [NewTopic] from NameServer success.",
        ], result.out
        assert not _has_route(sides[name], "NewTopic")
    gone = both(sides, "topicStatus", "-t", "NewTopic")
    assert gone["ferry"].lines == gone["apache"].lines


def _has_route(side: Side, topic: str) -> bool:
    answer = call(side.cluster.namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
    return answer.code == codes.SUCCESS


# ---------------------------------------------------------------- groups


def test_update_and_delete_subscription_group_print_the_same(sides):
    created = both(sides, "updateSubGroup", "-g", "NewGroup", "-r", "2", "-q", "3",
                   on=lambda s: ["-b", s.master])  # fmt: skip
    assert neutral(created["ferry"].out, sides["ferry"]) == neutral(
        created["apache"].out, sides["apache"]
    )
    for side in sides.values():
        assert _group_config(side, "NewGroup")["retryQueueNums"] == 3
        assert _group_config(side, "NewGroup")["retryMaxTimes"] == 2
    deleted = both(sides, "deleteSubGroup", "-g", "NewGroup", on=lambda s: ["-b", s.master])
    for name, result in deleted.items():
        assert neutral(result.out, sides[name]).strip() == (
            "delete subscription group [NewGroup] from broker [MASTER] success."
        )
        assert _group_config(sides[name], "NewGroup") is None


def _group_config(side: Side, group: str) -> dict | None:
    answer = call(side.master, Command(codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    return loads(answer.body)["subscriptionGroupTable"].get(group)


def test_consumer_progress_shows_the_same_offsets_and_lag(sides):
    out = both(sides, "consumerProgress", "-g", GROUP)
    for name, result in out.items():
        table = [r[:6] for r in rows(result) if r[0] in (TOPIC, f"%RETRY%{GROUP}")]
        assert table == [
            [f"%RETRY%{GROUP}", "broker-a", "0", "0", "0", "0"],
            *[[TOPIC, "broker-a", str(q), str(5 + (q == 0)), str(5 + (q == 0)), "0"]
              for q in range(4)],
        ], (name, result.out)  # fmt: skip
        assert "Diff Total: 0" in result.lines
    groups = both(sides, "consumerProgress")
    for result in groups.values():
        line = next(r for r in rows(result) if r[0] == GROUP)
        assert line == [GROUP, "1", "V4_9_8", "PUSH", "CLUSTERING", line[5], "0"], result.out


def test_consumer_and_producer_connections_agree(sides):
    consumers = both(sides, "consumerConnection", "-g", GROUP)
    for name, result in consumers.items():
        lines = result.lines
        client = lines[1].split()
        assert client[2:] == ["JAVA", "V4_9_8"] and client[0].endswith("@c1"), lines
        assert lines[2:] == [
            "Below is subscription:",
            "#Topic               #SubExpression",
            f"%RETRY%{GROUP}      *",
            f"{TOPIC}             *",
            "ConsumeType: CONSUME_PASSIVELY",
            "MessageModel: CLUSTERING",
            "ConsumeFromWhere: CONSUME_FROM_FIRST_OFFSET",
        ], (name, lines)
    for name, side in sides.items():
        # The live producer is known from its heartbeats (every 30 s): a loaded machine
        # once had a side answer none, so ask again until its next heartbeat is in.
        result = wait_for(
            lambda side=side: (
                (r := side.run("producerConnection", "-g", LIVE, "-t", TOPIC))
                and len(r.lines) == 1
                and r
            ),
            45,
            f"{name}: the live producer's connection",
            interval_s=1.0,
        )
        assert result.lines[0].split()[-2:] == ["JAVA", "V4_9_8"]
    missing = both(sides, "consumerConnection", "-g", "NobodyHere")  # no %RETRY% route
    causes = {
        n: [ln for ln in r.err.splitlines() if ln.startswith("Caused by")]
        for n, r in missing.items()
    }
    assert (
        causes["ferry"]
        == causes["apache"]
        == [
            "Caused by: org.apache.rocketmq.client.exception.MQClientException: CODE: 17  DESC: "
            "No topic route info in name server for the topic: %RETRY%NobodyHere"
        ]
    )


def test_query_message_by_id_prints_the_same_message(sides):
    def fields(side: Side) -> dict[str, str]:
        result = side.run("queryMsgById", "-i", side.offset_ids[0])
        return {
            k.strip(): v.strip()
            for k, _, v in (line.partition(":") for line in result.lines)
            if k.strip() in ("Topic", "Keys", "Queue ID", "Queue Offset", "Reconsume Times",
                             "System Flag", "Tags")
        } | {"track": next((ln for ln in result.lines if ln.startswith("MessageTrack")), "")}  # fmt: skip

    ferry, apache = (fields(sides[n]) for n in SIDES)
    assert ferry == apache
    assert ferry["Keys"] == "[adm-0]" and ferry["Queue ID"] == "0"
    assert (
        ferry["track"]
        == f"MessageTrack [consumerGroup={GROUP}, trackType=CONSUMED, exceptionDesc=null]"
    )


SHOWN = ("Topic", "Tags", "Keys", "Queue ID", "Queue Offset", "Reconsume Times", "System Flag")


def _shown(result: Result) -> dict[str, str]:
    """The fields of showMessage (queryMsgByUniqueKey) or printMsg (queryMsgById) that mean the
    same on both sides, and the message track line."""
    fields = {
        k.strip(): v.strip()
        for k, _, v in (line.partition(":") for line in result.lines)
        if k.strip() in SHOWN
    }
    track = [ln.strip() for ln in result.lines if ln.strip().startswith("MessageTrack")]
    return fields | {"track": " ".join(track)}


def test_query_message_by_key_finds_the_same_message(sides):
    out = both(sides, "queryMsgByKey", "-t", TOPIC, "-k", "adm-6")
    for name, result in out.items():
        assert result.lines[0].split() == ["#Message", "ID", "#QID", "#Offset"], result.out
        # The client's message id (UNIQ_KEY), the queue (6 mod 4) and its offset there.
        assert rows(result) == [[sides[name].unique_ids[6], "2", "1"]], (name, result.out)
    missing = both(sides, "queryMsgByKey", "-t", TOPIC, "-k", "no-such-key")
    for name, result in missing.items():
        assert not rows(result), (name, result.out)
        assert "query message by key finished, but no message" in result.err, (name, result.err)


def test_query_message_by_unique_key_prints_the_same_message(sides):
    shown = {
        name: _shown(side.run("queryMsgByUniqueKey", "-t", TOPIC, "-i", side.unique_ids[9]))
        for name, side in sides.items()
    }
    assert shown["ferry"] == shown["apache"]
    assert shown["ferry"]["Keys"] == "[adm-9]" and shown["ferry"]["Queue ID"] == "1"
    assert shown["ferry"]["Queue Offset"] == "2"
    assert shown["ferry"]["track"] == (
        f"MessageTrack [consumerGroup={GROUP}, trackType=CONSUMED, exceptionDesc=null]"
    )


def test_query_message_by_ids_prints_the_same_messages(sides):
    shown = {}
    for name, side in sides.items():
        result = side.run("queryMsgById", "-i", f"{side.offset_ids[7]},{side.offset_ids[12]}")
        blocks = result.out.split("OffsetID:")[1:]
        assert len(blocks) == 2, (name, result.out)
        shown[name] = [_shown(Result([], block, "", 0.0)) for block in blocks]
    assert shown["ferry"] == shown["apache"]
    assert [s["Keys"] for s in shown["ferry"]] == ["[adm-7]", "[adm-12]"]


def test_ferry_message_query_reads_both_clusters(sides, capsys):
    """`ferry message query` over RocketMQ's protocol finds the same message on Apache's
    brokers as on ferry's."""
    import json

    for side in sides.values():
        ns = ["-n", side.cluster.namesrv]
        (doc,) = json.loads("\n".join(ferry_cli(capsys, "message", "query", "-k", "adm-5",
                                                "-t", TOPIC, "--json", *ns)))  # fmt: skip
        assert (doc["queueId"], doc["queueOffset"], doc["msgId"]) == (1, 1, side.unique_ids[5])
        assert doc["body"].startswith("adm-5 payload")
        tracked = json.loads(
            "\n".join(
                ferry_cli(capsys, "message", "query", "-i", side.offset_ids[5], "--json", *ns)
            )
        )
        assert tracked["offsetMsgId"] == side.offset_ids[5]
        assert {c["group"]: c["consumed"] for c in tracked["consumedBy"]}[GROUP] is True
        by_unique = json.loads(
            "\n".join(ferry_cli(capsys, "message", "query", "-i", side.unique_ids[5], "-t", TOPIC,
                                "--json", *ns))
        )  # fmt: skip
        assert by_unique["offsetMsgId"] == side.offset_ids[5]


def test_apaches_index_file_is_what_ferry_builds_from_its_commit_log(sides):
    """The Apache master's own index file, byte for byte, against ferry's index
    (services/broker/store/indexfile.py) built from that master's commit log."""
    import struct

    from services.broker.store import indexfile

    (store,) = sides["apache"].cluster.dir.glob("broker-a-0-*/store")  # type: ignore[attr-defined]
    slots, entries = 5_000_000, 20_000_000  # Apache's defaults, ferry's too

    def same() -> bool:
        (apache_file,) = sorted((store / "index").iterdir())
        apache = apache_file.read_bytes()
        log = b"".join(p.read_bytes() for p in sorted((store / "commitlog").iterdir()))
        end = 0
        while end + 8 <= len(log) and struct.unpack_from(">I", log, end + 4)[0] == 0xDAA320A7:
            end += struct.unpack_from(">i", log, end)[0]
        mine = bytearray(indexfile.file_size(slots, entries))
        struct.pack_into(">i", mine, 36, 1)
        built = indexfile.IndexFile(mine, slots, entries)
        indexfile.build(built, log[:end], 0, 0)
        used = indexfile.HEADER_SIZE + 4 * slots + 20 * built.index_count
        return built.entries >= 2 * SENT and apache[:used] == bytes(mine[:used])

    wait_for(same, 30, "ferry's index of Apache's commit log equal to Apache's index file")
    # And ferry reads Apache's file: a key's chain leads to its message.
    (apache_file,) = sorted((store / "index").iterdir())
    theirs = indexfile.IndexFile.open(apache_file, slots, entries)
    try:
        found: list[int] = []
        theirs.lookup(indexfile.key_hash(TOPIC, "adm-3"), 0, 2**62, 4, found, set())
        assert found == [int(sides["apache"].offset_ids[3][16:], 16)]
    finally:
        theirs.close()


def test_reset_offset_by_time_rewinds_the_connected_consumer(sides):
    out = both(sides, "resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "0")
    for result in out.values():
        assert result.lines[0].startswith(f"rollback consumer offset by specified group[{GROUP}]")
        assert rows(result)[1:] == [["broker-a", str(q), "0"] for q in range(4)], result.out
    # The consumer was told to start again at 0: it gets every message a second time.
    for side in sides.values():
        side.consumer.wait(
            lambda c: len(c.of("msg")) >= 2 * (SENT + 1), 60, f"{side.name}: consumed again"
        )
        wait_for(
            lambda s=side: all(b == c for b, c in s.consume_stats().values()),
            60,
            f"{side.name}: offsets committed again",
        )


def test_wipe_and_add_write_perm_of_the_group(sides):
    for command, word in (("wipeWritePerm", "wipe"), ("addWritePerm", "add")):
        out = both(sides, command, "-b", "broker-a")
        for name, result in out.items():
            assert re.fullmatch(
                rf"{word} write perm of broker\[broker-a\] in name server\[NAMESRV\] OK, \d+",
                neutral(result.out, sides[name]).strip(),
            ), result.out
    for side in sides.values():
        assert _route_perm(side, TOPIC) & 2


# ---------------------------------------------------------------- ferry's CLI, same columns


def ferry_cli(capsys, *argv: str) -> list[str]:
    from services.cli.main import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_ferry_cli_prints_what_mqadmin_prints_on_both_clusters(sides, capsys):
    """`ferry topic status`, `ferry group progress` and `ferry broker status` read the same
    statistics as mqadmin, from ferry's brokers and from Apache's alike."""
    for side in sides.values():
        ns = ["-n", side.cluster.namesrv]
        assert (
            ferry_cli(capsys, "topic", "status", TOPIC, *ns)
            == side.run("topicStatus", "-t", TOPIC).lines
        )
        ours = ferry_cli(capsys, "group", "progress", "-g", GROUP, *ns)
        theirs = side.run("consumerProgress", "-g", GROUP).lines
        # (the TPS line is a rate measured at two moments)
        assert [ln for ln in ours if "TPS" not in ln] == [ln for ln in theirs if "TPS" not in ln]
        ours = ferry_cli(capsys, "group", "progress", *ns)
        theirs = side.run("consumerProgress").lines
        assert ours[0] == theirs[0]
        strip_tps = lambda line: line.split()[:5] + line.split()[6:]  # noqa: E731
        assert [strip_tps(ln) for ln in ours[1:]] == [strip_tps(ln) for ln in theirs[1:]]
        ours = ferry_cli(capsys, "broker", "status", "-b", side.master, *ns)
        theirs = side.run("brokerStatus", "-b", side.master).lines
        keys = lambda lines: [ln.split(":", 1)[0] for ln in lines]  # noqa: E731
        assert keys(ours) == keys(theirs), side.name


def test_a_slave_refuses_changes_as_apaches_does(sides):
    out = both(sides, "updateTopic", "-t", "OnSlave", on=lambda s: ["-b", s.slave])
    causes = {
        name: [neutral(ln, sides[name]) for ln in r.err.splitlines() if ln.startswith("Caused by")]
        for name, r in out.items()
    }
    assert causes["ferry"] == causes["apache"], causes
    assert "Can't modify topic or subscription group from slave broker" in causes["ferry"][0]
    for side in sides.values():
        assert not _has_route(side, "OnSlave")


def test_clone_group_offset_copies_the_committed_offsets(sides):
    """mqadmin cloneGroupOffset (314): the new group starts where GROUP is, queue by
    queue, on both (the topic named: with none, Apache 4.9/5.x copies nothing, a bug of
    theirs ferry does not copy)."""
    clone = "ClonedFromGroup"

    def offsets(side: Side, group: str) -> dict[int, int | None]:
        got = {}
        for q in range(4):
            ext = {"consumerGroup": group, "topic": TOPIC, "queueId": str(q)}
            answer = call(side.master, Command(codes.QUERY_CONSUMER_OFFSET, ext=ext))
            got[q] = int(answer.ext["offset"]) if answer.code == codes.SUCCESS else None
        return got

    for name, side in sides.items():
        before = offsets(side, GROUP)
        assert all(o is not None for o in before.values()), (name, before)
        result = side.run("cloneGroupOffset", "-s", GROUP, "-d", clone, "-t", TOPIC, "-o", "true")
        assert "clone group offset success" in result.out.lower(), (name, result.out)
        assert offsets(side, clone) == before, name
