"""RocketMQ's TCP protocol on both servers, fed random and mutated frames for
every request code each one serves. The codes come from the server's handler
table at run time, so a code added later is fuzzed without an edit here.

Well-formed frames (hypothesis, per served code): header fields of every
shape — words ferry knows, random text, huge, negative and non-numeric
numbers, missing required fields, JSON numbers and booleans as values — in
both header forms, sometimes oneway or flagged as a response, with random
and structured bodies (messages, batches, JSON bodies). For each:

- a request is answered exactly once, with its opaque and its serialize type;
  a oneway request or a stray response never;
- no handler raised: nothing was logged at ERROR, and no SYSTEM_ERROR names a
  Python exception (the server's answer to a handler's bug);
- a refused request changed nothing: the broker's commit-log end, topics,
  groups, offsets and permission; the name server's routes and KV config.

Broken frames (seeded, one per connection): lengths out of range or lying,
header lengths past the frame, unknown serialize types, headers that are not
JSON or not the binary form, frames cut short, more than 16 MiB declared,
random and bit-flipped frames the codec refuses, a good frame behind a bad
one. The server writes not one byte, closes the connection (at once for a
frame that breaks the format, at EOF for one cut short), counts each
protocol error, stores nothing, and still answers a client that stayed
connected throughout and the next connection.

Both servers run with a fake clock: delayed and timed messages a fuzzed send
stores never come due during the run, so the commit log grows only from the
requests themselves. Before each code the topic and routes are put back (an
earlier code may have deleted them) and the fuzzing connection sends a good
heartbeat, so pulls, locks and group lookups get past "no such consumer".

FERRY_FUZZ_EXAMPLES sets the examples per code (default 50, what `make test` runs; `make fuzz`
runs 1,000); FERRY_REMOTING_FUZZ_FRAMES the broken frames per server (default
3,000; `make fuzz` runs 50,000)."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import json
import logging
import os
import random
import socket
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from ferry.model import SubscriptionGroupConfig, TopicConfig
from ferry.remoting import batch, codec, codes
from ferry.remoting.codec import FLAG_ONEWAY, FLAG_RESPONSE, MAX_FRAME, Command
from ferry.runtime.clock import FakeClock
from ferry.v1 import broker_pb2, namesrv_pb2
from services.broker.remoting.admin import CLIENT_CALL_TIMEOUT_S
from tests.conftest import LoopThread, RunningBroker, RunningNamesrv, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

EXAMPLES = int(os.environ.get("FERRY_FUZZ_EXAMPLES", "50"))
FRAMES = int(os.environ.get("FERRY_REMOTING_FUZZ_FRAMES", "3000"))
# Above the broker's own wait for a consumer it asks on a request's behalf (307, 309 to a
# client id that heartbeated and never answers: CLIENT_CALL_TIMEOUT_S, Apache's 10 s), so a
# request that waits it out is answered within the bound (at 10 s both, a oneway 309 was
# once "not handled" and its late answer then met the next check).
ANSWER_TIMEOUT_S = CLIENT_CALL_TIMEOUT_S + 10.0
TOPIC = "FuzzTopic"  # 4 queues, perm 6, one message at commit offset 0
NOW_MS = int(FakeClock().wall() * 1000)  # the servers' time: their fake clocks never move
CLIENT_ID = "127.0.0.1@fuzz"  # the fuzzing connection's client, a member of group "fuzz"

# ---------------------------------------------------------------- the servers


@dataclass
class Door:
    """One server's RocketMQ-protocol port, as the fuzzer sees it."""

    name: str  # the `server` label of its metrics
    port: int
    codes: list[int]  # every request code its handler table serves
    registry: CollectorRegistry  # the app's registry, where its RemotingMetrics live
    loop: LoopThread
    state: Callable[[], Any]  # what a refused request must not change; runs on the loop
    probe: Command  # a read-only request it answers SUCCESS
    reset: Callable[[], None]  # brings back what the fuzz may have deleted (the topic, routes)
    warmup: list[Command]  # sent on the fuzzing connection before each code (a heartbeat)

    def snapshot(self) -> Any:
        return self.loop.call(self.state)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"server": self.name, **labels}) or 0.0

    def handled(self, code: int) -> dict[str, float]:
        """Requests of `code` handled so far, by the response code answered."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for s in family.samples:
                if (
                    s.name == "ferry_remoting_requests_total"
                    and s.labels.get("server") == self.name
                    and s.labels.get("request_code") == str(code)
                ):
                    out[s.labels["response_code"]] = s.value
        return out


BROKER_PROBE = Command(codes.GET_MAX_OFFSET, ext={"topic": TOPIC, "queueId": "0"})
HEARTBEAT = Command(codes.HEART_BEAT, body=json.dumps({
    "clientID": CLIENT_ID,
    "producerDataSet": [{"groupName": "pg"}],
    "consumerDataSet": [{
        "groupName": "fuzz", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "expressionType": "TAG",
                                 "subVersion": NOW_MS, "tagsSet": [], "codeSet": [],
                                 "classFilterMode": False}],
    }],
}).encode())  # fmt: skip
AUTO_TOPIC = TopicConfig("", read_queue_nums=1, write_queue_nums=1, perm=6)


def broker_door(broker: RunningBroker) -> Door:
    """The broker app's own RocketMQ-protocol door (listenPort): its port, the
    codes of its handler table and its metrics registry."""
    app = broker.app
    assert app.remoting is not None, "the broker serves no RocketMQ-protocol port"
    return Door("broker", app.remoting_port, sorted(app.remoting.handlers), app.registry,
                broker.loop, lambda: broker_state(app), BROKER_PROBE,
                lambda: seed_broker(broker), [HEARTBEAT])  # fmt: skip


def _auto_created(config: TopicConfig) -> bool:
    """A topic as a send creates it on first use: from TBW102 (perm 7, 8 queues),
    its permission without INHERIT and at most its queues, no attributes."""
    return (
        config.perm == 6
        and config.read_queue_nums == config.write_queue_nums
        and 1 <= config.read_queue_nums <= 8
        and not config.attributes
    )


def broker_state(app) -> Any:
    """What a refused request must leave as it was. Three things are let pass,
    as Apache does them too: a send to `%RETRY%<group>` creates the group's
    retry (or dead-letter) topic on first use before the message is checked
    (`msgCheck`); a send to an unknown topic naming TBW102 creates the topic
    from it (`msgCheck` again) before the message is checked (its queue, its
    properties: refused with 13 after); and a request naming a group creates the
    group (autoCreateSubscriptionGroup) before the rest is checked. Topics and
    groups as created on first use, and those tables' versions, are left out."""
    md = app.metadata
    topics, _ = md.topics.snapshot()
    groups, _ = md.subscription_groups.snapshot()
    return (
        app.store.max_offset,
        {
            name: config
            for name, config in topics.items()
            if not (
                name.startswith(("%RETRY%", "%DLQ%"))
                and dataclasses.replace(config, topic_name="") == AUTO_TOPIC
            )
            and not (name != TOPIC and _auto_created(config))
        },
        md.consumer_offsets.snapshot(),
        {
            name: config
            for name, config in groups.items()
            if config != SubscriptionGroupConfig(name)
        },
        md.delay_offsets.snapshot(),
        md.settings.broker_permission,
    )


NAMESRV_PROBE = Command(codes.GET_KV_CONFIG, ext={"namespace": "ferry.v1", "key": "grpcPort"})


def namesrv_door(ns: RunningNamesrv) -> Door:
    """The name server app's own RocketMQ-protocol door (--port): its port, the
    codes of its handler table and its metrics registry."""
    app = ns.app
    routes = app.routes

    def state() -> Any:
        return (
            routes.version,
            {t: dict(q) for t, q in routes.topic_queue_table.items()},
            sorted(routes.live),
            {c: sorted(names) for c, names in routes.cluster_addr_table.items()},
            {space: dict(t) for space, t in app.kv._table.items()},  # no "list all" method
        )

    return Door("namesrv", app.remoting_port, sorted(app.remoting.handlers), app.registry,
                ns.loop, state, NAMESRV_PROBE, lambda: seed_namesrv(ns), [])  # fmt: skip


def seed_broker(broker: RunningBroker) -> None:
    support.create_topic(broker.channel, TOPIC, 4)
    if broker.app.permission.get() != 6:  # UPDATE_BROKER_CONFIG may have changed it
        broker.loop.run(broker.app.admin.update_permission(6))


def seed_namesrv(ns: RunningNamesrv) -> None:
    """broker-a's master and slave, serving TOPIC over both protocols."""
    from tests.helpers import register_request

    members = ((0, "127.0.0.1:10915", "127.0.0.1:10911", "ASYNC_MASTER"),
               (1, "127.0.0.1:10925", "127.0.0.1:10921", "SLAVE"))  # fmt: skip
    for broker_id, addr, remoting, role in members:
        request = register_request(broker_id=broker_id, addr=addr, topics={TOPIC: 4},
                                   remoting_addr=remoting, broker_role=role)  # fmt: skip
        ns.stub.RegisterBroker(request)
    ns.stub.PutKVConfig(
        namesrv_pb2.PutKVConfigRequest(
            namespace="ORDER_TOPIC_CONFIG", key=TOPIC, value="broker-a:4"
        )
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[Door]:
    loop = LoopThread()
    running = start_broker(
        loop, tmp_path_factory.mktemp("fuzz-broker"), clock=FakeClock(), brokerName="broker-a"
    )
    seed_broker(running)
    running.broker.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"seed"))
    yield broker_door(running)
    running.stop()
    loop.close()


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory) -> Iterator[Door]:
    loop = LoopThread()
    running = start_namesrv(
        loop, tmp_path_factory.mktemp("fuzz-namesrv"), metrics_port=-1, clock=FakeClock()
    )
    seed_namesrv(running)
    yield namesrv_door(running)
    running.stop()
    loop.close()


# ---------------------------------------------------------------- what went wrong


class Errors(logging.Handler):
    """Every record at ERROR or above, from any logger (a handler's bug is
    logged by the server; a protocol callback's by asyncio)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        taken, self.records = self.records, []
        return [f"{r.name}: {self.format(r)}" for r in taken]


@pytest.fixture
def errors() -> Iterator[Errors]:
    handler = Errors()
    handler.setFormatter(logging.Formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@functools.cache
def _exception_names() -> frozenset[str]:
    names = {
        n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
    }
    todo = [BaseException]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(names | {"error", "struct.error"})


def names_an_exception(remark: str | None) -> bool:
    """The remark the server gives a handler's exception: "TypeError: ..."."""
    if not remark or ":" not in remark:
        return False
    return remark.split(":", 1)[0].strip() in _exception_names()


# ---------------------------------------------------------------- well-formed frames

TOPICS = [
    TOPIC, "NoSuchTopic", "%RETRY%fuzz", "%DLQ%fuzz", "TBW102", "SCHEDULE_TOPIC_XXXX",
    "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC", "DefaultCluster", "broker-a", "",
    "a" * 300, "bad topic!", "ü", "\udc80",
]  # fmt: skip
GROUPS = [
    "fuzz", "pg", "CID_RMQ_SYS_TIMER", "DEFAULT_PRODUCER", "TOOLS_CONSUMER", "%RETRY%fuzz", "",
    "a" * 300, "bad group!", "\x00",
]  # fmt: skip
WORDS = TOPICS + GROUPS + [
    "127.0.0.1:10911", "127.0.0.1:0", "x:y:z", "*", "TAGS", "ORDER_TOPIC_CONFIG", "ferry.v1",
    "grpcPort", "true", "false", "-1", "0", "1", "LOWER", "upper", "\udfff",
]  # fmt: skip
NUMBERS = [
    "0", "1", "3", "4", "-1", "2147483647", "2147483648", "-2147483649", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "1" + "0" * 30, "", "abc", "1.5", " 7",
    "0x10", "1e3", "+5", "-0", "\u0661\u0662", "1_0", "NaN", "9" * 5000,
]  # fmt: skip

texts = st.one_of(
    st.text(max_size=30),
    st.text(max_size=30),
    # Lone surrogates: JSON carries them (as \u escapes), UTF-8 does not.
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
)
numbers = st.one_of(
    st.sampled_from(NUMBERS),
    st.integers(-5, 40).map(str),
    st.integers(-(2**64), 2**64).map(str),
)
small_waits = st.one_of(  # long polls stay short: no huge values for waits
    st.integers(0, 300).map(str), st.sampled_from(["", "-1", "abc", "1.5", "-9223372036854775808"])
)
times = st.one_of(
    numbers, st.integers(NOW_MS - 10**9, NOW_MS + 10**9).map(str), st.just(str(NOW_MS))
)
flags = st.one_of(
    numbers,
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 12, 0x10, 0x20, 0x80, 0x100, 0x200, 0x300, 0x700]).map(
        str
    ),
)
booleans = st.one_of(
    st.sampled_from(["true", "false", "TRUE", "False", "1", "0", "", "yes"]), texts
)
addrs = st.one_of(
    st.sampled_from(["127.0.0.1:10911", "127.0.0.1:0", "", "x", "1.2.3.4:99999", "[::1]:1",
                     "a:b:c", "127.0.0.1:-1"]), texts,
)  # fmt: skip
PROPERTY_NAMES = [
    "TAGS", "KEYS", "WAIT", "DELAY", "UNIQ_KEY", "TRAN_MSG", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
    "TIMER_OUT_MS", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC", "PGROUP", "MAX_OFFSET", "MIN_OFFSET",
    "__STARTDELIVERTIME", "INSTANCE_ID", "MSG_REGION", "CONSUME_START_TIME", "", "x",
]  # fmt: skip
property_values = st.one_of(
    st.sampled_from(WORDS), st.sampled_from(NUMBERS[:12]), texts,
    st.sampled_from([str(NOW_MS), str(NOW_MS + 86_400_000), str(NOW_MS + 10**12), "1", "18", "99"]),
)  # fmt: skip
properties = st.one_of(
    st.lists(
        st.tuples(st.sampled_from(PROPERTY_NAMES), property_values, st.sampled_from(["\x02", "\x02", "\x01", ""])),
        max_size=5,
    ).map(lambda items: "".join(f"{k}\x01{v}{sep}" for k, v, sep in items)),
    texts,
    st.sampled_from(["\x01", "\x02", "a\x01b\x02c", "\x01\x01\x02\x02", "TAGS\x01\udc80\x02"]),
)  # fmt: skip

# What kind of value each header field carries (send fields under their long
# and their SEND_MESSAGE_V2 names).
KINDS = {
    "topic": "topic b defaultTopic c originTopic retryTopic",
    "group": "producerGroup a consumerGroup group groupName",
    "number": "queueId e defaultTopicQueueNums d readQueueNums writeQueueNums maxMsgNums maxNum "
    "reconsumeTimes j maxReconsumeTimes l delayLevel brokerId subVersion queueOffset commitOffset "
    "offset tranStateTableOffset commitLogOffset commitOrRollback perm bodyCrc32 maxMsgBytes "
    "initMode flag h",
    "flags": "sysFlag f topicSysFlag",
    "time": "timestamp bornTimestamp g beginTimestamp endTimestamp bornTime",
    "wait": "suspendTimeoutMillis pollTime invisibleTime heartbeatTimeoutMillis timeoutMillis",
    "boolean": "unitMode k batch m acceptStandardJsonOnly compressed fromTransactionCheck "
    "enableActingMaster _UNIQUE_KEY_QUERY removeOffset order isUnitTopic",
    "properties": "properties i",
    "addr": "brokerAddr haServerAddr",
}
KIND = {name: kind for kind, names in KINDS.items() for name in names.split()}
VALUES: dict[str, st.SearchStrategy[str]] = {
    "topic": st.one_of(st.sampled_from(TOPICS), st.sampled_from(TOPICS), texts),
    "group": st.one_of(st.sampled_from(GROUPS), st.sampled_from(GROUPS), texts),
    "number": numbers,
    "flags": flags,
    "time": times,
    "wait": small_waits,
    "boolean": booleans,
    "properties": properties,
    "addr": addrs,
    "text": st.one_of(st.sampled_from(WORDS), st.sampled_from(NUMBERS[:12]), texts),
}


def spoiled(name: str) -> st.SearchStrategy[str]:
    return VALUES[KIND.get(name, "text")]


# Values a client would send, by field name: a request made of these gets
# past the header checks, so the fuzz reaches what lies behind them.
GOOD_VALUES = {
    "producerGroup a": ["pg", "fuzz"],
    "topic b originTopic": [TOPIC, TOPIC, TOPIC, "%RETRY%fuzz", "NoSuchTopic"],
    "defaultTopic c": ["TBW102"],
    "defaultTopicQueueNums d readQueueNums writeQueueNums": ["4"],
    "queueId e": ["0", "1", "2", "3"],
    "sysFlag f": ["0", "0", "2"],
    "bornTimestamp g timestamp subVersion": [str(NOW_MS)],
    "flag h reconsumeTimes j brokerId delayLevel": ["0"],
    "properties i": ["", "TAGS\x01a\x02", "KEYS\x01k1 k2\x02TAGS\x01b\x02", "WAIT\x01false\x02",
                     "DELAY\x013\x02", "UNIQ_KEY\x01AC1100010000\x02"],
    "unitMode k batch m compressed": ["false"],
    "maxReconsumeTimes l": ["16", "0"],
    "bname n brokerName": ["broker-a"],
    "consumerGroup group groupName": ["fuzz"],
    "queueOffset commitOffset offset": ["0", "1", "2"],
    "maxMsgNums maxNum": ["32"],
    "suspendTimeoutMillis pollTime": ["0", "50"],
    "subscription": ["*", "a || b"],
    "expressionType": ["TAG"],
    "boundaryType": ["lower", "upper"],
    "namespace": ["ORDER_TOPIC_CONFIG", "ferry.v1", "fuzz"],
    "key": [TOPIC, "grpcPort", "k"],
    "value": ["v"],
    "brokerAddr": ["127.0.0.1:10911", "127.0.0.1:10999"],
    "clusterName cluster": ["DefaultCluster"],
    "haServerAddr": ["127.0.0.1:10912"],
    "clientID": [CLIENT_ID],
    "acceptStandardJsonOnly": ["true", "false"],
    "perm": ["6"],
    "topicFilterType": ["SINGLE_TAG", "MULTI_TAG"],
    "isForce removeOffset isOrder": ["true", "false"],
    "index count": ["0", "1", "10"],
    # (never the fuzzing client: 307 and 309 would be forwarded to it, which never answers)
    "clientId": ["127.0.0.1@elsewhere"],
    "msgId": ["7F00000100002A9F0000000000000000", "0000000000000000"],
    "username subject filter": ["u", ""],
}  # fmt: skip
GOOD = {n: st.sampled_from(vs) for names, vs in GOOD_VALUES.items() for n in names.split()}
# Where a field means something else for a code: a pull's sysFlag is
# PullSysFlag (commit offset 1, suspend 2, subscription in the header 4).
PULL_GOOD = {"sysFlag": st.sampled_from(["0", "1", "2", "4", "5", "6"])}
GOOD_BY_CODE = {codes.PULL_MESSAGE: PULL_GOOD, codes.LITE_PULL_MESSAGE: PULL_GOOD}

# The header fields of each code (docs/reference/remoting.md; RocketMQ's
# CommandCustomHeaders). A served code not listed draws from all of them.
SEND_LONG = (
    "producerGroup topic defaultTopic defaultTopicQueueNums queueId sysFlag bornTimestamp flag "
    "properties reconsumeTimes unitMode maxReconsumeTimes batch bname"
)
PULL = (
    "consumerGroup topic queueId queueOffset maxMsgNums sysFlag commitOffset suspendTimeoutMillis "
    "subscription subVersion expressionType maxMsgBytes"
)
BROKER_ID = "brokerName brokerAddr clusterName brokerId"
FIELD_NAMES = {
    codes.SEND_MESSAGE: SEND_LONG,
    codes.SEND_MESSAGE_V2: "a b c d e f g h i j k l m n",
    codes.SEND_BATCH_MESSAGE: "a b c d e f g h i j k l m n",
    codes.PULL_MESSAGE: PULL,
    codes.LITE_PULL_MESSAGE: PULL,
    codes.QUERY_MESSAGE: "topic key maxNum beginTimestamp endTimestamp _UNIQUE_KEY_QUERY",
    codes.QUERY_CONSUMER_OFFSET: "consumerGroup topic queueId",
    codes.UPDATE_CONSUMER_OFFSET: "consumerGroup topic queueId commitOffset",
    codes.SEARCH_OFFSET_BY_TIMESTAMP: "topic queueId timestamp boundaryType",
    codes.GET_MAX_OFFSET: "topic queueId",
    codes.GET_MIN_OFFSET: "topic queueId",
    codes.GET_EARLIEST_MSG_STORETIME: "topic queueId",
    codes.VIEW_MESSAGE_BY_ID: "offset",
    codes.HEART_BEAT: "",
    codes.UNREGISTER_CLIENT: "clientID producerGroup consumerGroup",
    codes.CONSUMER_SEND_MSG_BACK: "offset group delayLevel originMsgId originTopic unitMode "
    "maxReconsumeTimes",
    codes.END_TRANSACTION: "producerGroup tranStateTableOffset commitLogOffset commitOrRollback "
    "fromTransactionCheck msgId transactionId",
    codes.GET_CONSUMER_LIST_BY_GROUP: "consumerGroup",
    codes.LOCK_BATCH_MQ: "",
    codes.UNLOCK_BATCH_MQ: "",
    codes.CHECK_CLIENT_CONFIG: "",
    codes.UPDATE_AND_CREATE_TOPIC: "topic defaultTopic readQueueNums writeQueueNums perm "
    "topicFilterType topicSysFlag order",
    codes.GET_TOPIC_STATS_INFO: "topic",
    codes.GET_CONSUMER_CONNECTION_LIST: "consumerGroup",
    codes.GET_PRODUCER_CONNECTION_LIST: "producerGroup",
    codes.GET_CONSUME_STATS: "consumerGroup topic",
    codes.QUERY_TOPIC_CONSUME_BY_WHO: "topic",
    codes.DELETE_TOPIC_IN_BROKER: "topic",
    codes.DELETE_SUBSCRIPTIONGROUP: "groupName removeOffset",
    codes.INVOKE_BROKER_TO_RESET_OFFSET: "topic group timestamp isForce",
    codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "",
    codes.UPDATE_BROKER_CONFIG: "",
    codes.GET_BROKER_CONFIG: "",
    codes.GET_BROKER_RUNTIME_INFO: "",
    codes.GET_ALL_TOPIC_CONFIG: "",
    codes.GET_ALL_CONSUMER_OFFSET: "",
    codes.GET_ALL_DELAY_OFFSET: "",
    codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: "",
    codes.GET_BROKER_CONSUME_STATS: "isOrder",
    codes.QUERY_CONSUME_QUEUE: "topic queueId index count consumerGroup",
    codes.CONSUME_MESSAGE_DIRECTLY: "consumerGroup clientId msgId topic brokerName",
    codes.CLONE_GROUP_OFFSET: "srcGroup destGroup topic offline",
    codes.GET_BROKER_HA_STATUS: "",
    codes.GET_BROKER_EPOCH_CACHE: "",
    codes.GET_COLD_DATA_FLOW_CTR_INFO: "",
    codes.UPDATE_COLD_DATA_FLOW_CTR_CONFIG: "",
    codes.REMOVE_COLD_DATA_FLOW_CTR_CONFIG: "consumerGroup",
    codes.AUTH_GET_USER: "username",
    codes.AUTH_LIST_USER: "filter",
    codes.AUTH_GET_ACL: "subject",
    codes.AUTH_LIST_ACL: "subjectFilter resourceFilter",
    # The name server.
    codes.GET_ROUTEINFO_BY_TOPIC: "topic acceptStandardJsonOnly",
    codes.PUT_KV_CONFIG: "namespace key value",
    codes.GET_KV_CONFIG: "namespace key",
    codes.DELETE_KV_CONFIG: "namespace key",
    codes.GET_KVLIST_BY_NAMESPACE: "namespace",
    codes.REGISTER_BROKER: f"{BROKER_ID} haServerAddr compressed bodyCrc32 "
    "heartbeatTimeoutMillis enableActingMaster",
    codes.UNREGISTER_BROKER: BROKER_ID,
    codes.QUERY_DATA_VERSION: BROKER_ID,
    codes.WIPE_WRITE_PERM_OF_BROKER: "brokerName",
    codes.ADD_WRITE_PERM_OF_BROKER: "brokerName",
    codes.DELETE_TOPIC_IN_NAMESRV: "topic clusterName",
    codes.GET_TOPICS_BY_CLUSTER: "cluster",
    # RocketMQ 5's pop (JSON only: the codes do not fit the binary header).
    200050: "consumerGroup topic queueId maxMsgNums invisibleTime pollTime bornTime initMode "
    "expType exp order attemptId",
    200051: "consumerGroup topic queueId extraInfo offset",
    200053: "consumerGroup topic queueId extraInfo offset invisibleTime",
}
FIELDS = {code: names.split() for code, names in FIELD_NAMES.items()}
ALL_FIELDS = sorted({f for fields in FIELDS.values() for f in fields} | {"AccessKey", "Signature"})

# Answers after which a request may have changed the state (a send stored
# with a flush or slave timeout still stored; a pull commits the offset it
# carries whatever it finds).
KEEPS = {codes.SUCCESS, codes.FLUSH_DISK_TIMEOUT, codes.SLAVE_NOT_AVAILABLE,
         codes.FLUSH_SLAVE_TIMEOUT}  # fmt: skip
PULL_KEEPS = {codes.PULL_NOT_FOUND, codes.PULL_RETRY_IMMEDIATELY, codes.PULL_OFFSET_MOVED}


def may_change(code: int, answer: int) -> bool:
    if answer in KEEPS:
        return True
    return code in (codes.PULL_MESSAGE, codes.LITE_PULL_MESSAGE) and answer in PULL_KEEPS


# ---- bodies

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 40), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(WORDS), texts,
)  # fmt: skip
JSON_KEYS = [
    "clientID", "clientId", "producerDataSet", "consumerDataSet", "groupName", "consumeType",
    "messageModel", "consumeFromWhere", "subscriptionDataSet", "topic", "subString", "tagsSet",
    "codeSet", "subVersion", "expressionType", "unitMode", "consumerGroup", "mqSet", "brokerName",
    "queueId", "group", "subscriptionData", "topicConfigSerializeWrapper", "topicConfigTable",
    "dataVersion", "timestamp", "counter", "filterServerList", "readQueueNums", "writeQueueNums",
    "perm", "order", "topicName", "classFilterMode", "lockOKMQSet",
]  # fmt: skip
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(JSON_KEYS), texts), inner, max_size=4),
    ),
    max_leaves=12,
)


def either(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the right shape, sometimes any JSON value."""
    return st.one_of(good, good, good, json_values)


def obj(required: dict[str, st.SearchStrategy], optional: dict | None = None) -> st.SearchStrategy:
    return st.fixed_dictionaries(
        {k: either(v) for k, v in required.items()},
        optional={k: either(v) for k, v in (optional or {}).items()},
    )


j_topic = st.one_of(st.just(TOPIC), st.sampled_from(TOPICS), texts)
j_group = st.one_of(st.just("fuzz"), st.sampled_from(GROUPS), texts)
j_client = st.one_of(st.just(CLIENT_ID), st.just(CLIENT_ID), texts)
j_int = st.one_of(st.integers(-2, 8), st.integers(-(2**63), 2**63))
subscription = obj(
    {"topic": j_topic, "subString": st.one_of(st.sampled_from(["*", "a||b", "", "a > 1", "(("]), texts)},
    {"expressionType": st.sampled_from(["TAG", "SQL92", "x", ""]), "subVersion": j_int,
     "tagsSet": st.lists(texts, max_size=3), "codeSet": st.lists(j_int, max_size=3),
     "classFilterMode": st.booleans()},
)  # fmt: skip
queue = obj({"topic": j_topic, "brokerName": st.sampled_from(["broker-a", "broker-z", ""]),
             "queueId": j_int})  # fmt: skip
heartbeat = obj(
    {"clientID": j_client},
    {
        "producerDataSet": st.lists(obj({"groupName": j_group}), max_size=3),
        "consumerDataSet": st.lists(
            obj(
                {"groupName": j_group},
                {"consumeType": st.sampled_from(["CONSUME_PASSIVELY", "CONSUME_ACTIVELY", "x"]),
                 "messageModel": st.sampled_from(["CLUSTERING", "BROADCASTING", "x"]),
                 "consumeFromWhere": st.sampled_from(["CONSUME_FROM_LAST_OFFSET",
                                                      "CONSUME_FROM_TIMESTAMP", "x"]),
                 "subscriptionDataSet": st.lists(subscription, max_size=3),
                 "unitMode": st.booleans()},
            ),
            max_size=3,
        ),
    },
)  # fmt: skip
lock = obj({"consumerGroup": j_group, "clientId": j_client, "mqSet": st.lists(queue, max_size=4)},
           {"onlyThisBroker": st.booleans()})  # fmt: skip
client_config = obj({"clientId": j_client, "group": j_group, "subscriptionData": subscription})
data_version = obj({"timestamp": j_int, "counter": j_int})
register = obj(
    {"topicConfigSerializeWrapper": obj(
        {"topicConfigTable": st.dictionaries(j_topic, obj(
            {"topicName": j_topic, "readQueueNums": j_int, "writeQueueNums": j_int, "perm": j_int},
            {"order": st.booleans(), "topicFilterType": st.just("SINGLE_TAG"),
             "topicSysFlag": j_int}), max_size=3),
         "dataVersion": data_version})},
    {"filterServerList": st.lists(texts, max_size=2)},
)  # fmt: skip
group_config = obj(
    {"groupName": j_group},
    {"consumeEnable": st.booleans(), "retryQueueNums": j_int, "retryMaxTimes": j_int,
     "brokerId": j_int, "whichBrokerWhenConsumeSlowly": j_int,
     "consumeBroadcastEnable": st.booleans(), "groupSysFlag": j_int,
     "attributes": st.dictionaries(texts, texts, max_size=2)},
)  # fmt: skip
TEMPLATES = {
    codes.HEART_BEAT: heartbeat,
    codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: group_config,
    codes.LOCK_BATCH_MQ: lock,
    codes.UNLOCK_BATCH_MQ: lock,
    codes.CHECK_CLIENT_CONFIG: client_config,
    codes.REGISTER_BROKER: register,
    codes.QUERY_DATA_VERSION: data_version,
}


def dumped(values: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    return values.map(lambda v: json.dumps(v).encode())


junk_bodies = st.one_of(
    st.just(b""), st.binary(max_size=64), dumped(json_values),
    st.sampled_from([b"{", b"null", b"[]", b"\xff\xfe", b"{}" * 1000, b"[" * 5000]),
)  # fmt: skip
batch_entries = st.lists(
    st.builds(
        batch.BatchEntry,
        flag=st.integers(-(2**31), 2**31 - 1),
        body=st.one_of(st.binary(min_size=1, max_size=40), st.just(b"")),
        properties=properties.map(lambda p: p.encode("utf-8", "surrogatepass")),
    ),
    min_size=1,
    max_size=4,
)


@st.composite
def batch_bodies(draw) -> bytes:
    entries = draw(batch_entries)
    try:
        data = bytearray(batch.encode(entries))
    except (batch.BatchError, struct.error, ValueError):
        return draw(st.binary(max_size=100))
    how = draw(st.sampled_from(["as is", "as is", "cut", "flip", "tail"]))
    if how == "cut" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "tail":
        data += draw(st.binary(min_size=1, max_size=30))
    return bytes(data)


message_bodies = st.one_of(
    st.binary(min_size=1, max_size=200),
    st.sampled_from([b"", b"x" * (64 * 1024), b"x" * (64 * 1024 + 1)]),  # maxMessageSize 64 KiB
    st.binary(max_size=200).map(zlib.compress),
    batch_bodies(),
)


good_batches = st.lists(
    st.builds(batch.BatchEntry, flag=st.just(0), body=st.binary(min_size=1, max_size=40),
              properties=st.sampled_from([b"", b"TAGS\x01a\x02"])),
    min_size=1, max_size=4,
).map(batch.encode)  # fmt: skip


@functools.cache
def bodies(code: int) -> st.SearchStrategy[bytes]:
    if code == codes.SEND_BATCH_MESSAGE:
        return st.one_of(good_batches, good_batches, message_bodies)
    if code in (codes.SEND_MESSAGE, codes.SEND_MESSAGE_V2):
        good = st.binary(min_size=1, max_size=100)
        return st.one_of(good, good, message_bodies)
    if code == codes.UPDATE_BROKER_CONFIG:  # key=value lines
        lines = st.sampled_from(
            [
                b"brokerPermission=6\n",
                b"brokerPermission=4\n",
                b"brokerPermission=99\n",
                b"brokerPermission=abc",
                b"maxMessageSize=1\n",
                b"=\n",
                b"\xff\xfe",
                b"# c\n",
            ]
        )
        return st.one_of(lines, lines, junk_bodies)  # fmt: skip
    template = TEMPLATES.get(code)
    if template is not None:
        return st.one_of(dumped(template), dumped(template), junk_bodies)
    return junk_bodies


# ---- headers


def _utf8(value: str) -> str:
    return value.encode("utf-8", "replace").decode()


DIGITS = st.integers(0, 9)
FLAGS = st.sampled_from([0] * 8 + [FLAG_ONEWAY] * 3 + [FLAG_RESPONSE, 4, 0x7FFFFFFC, -4])
OPAQUES = st.integers(-(2**31), 2**31 - 1)
WIDE_OPAQUES = st.one_of(OPAQUES, OPAQUES, st.integers(-(2**63), 2**64))  # JSON has no int32
VERSIONS = st.one_of(st.sampled_from([409, 317, 121, 0, 479]), st.integers(-(2**15), 2**15 - 1))
LANGUAGES = st.sampled_from([*codec.LANGUAGES, "KOTLIN", ""])
REMARKS = st.one_of(st.none(), texts)
EXTRA = st.one_of(
    st.just({}), st.just({}),
    st.dictionaries(st.one_of(st.sampled_from(ALL_FIELDS), texts), spoiled(""), max_size=2),
)  # fmt: skip
ANY_NAMES = st.lists(st.sampled_from(ALL_FIELDS), max_size=8, unique=True)


@functools.cache
def field_strategies(code: int, names: tuple[str, ...]) -> tuple[st.SearchStrategy, ...]:
    """(good values for every field, up to three fields to spoil, any subset
    of fields with any values). Built once: hypothesis is slow to build."""
    good = {**GOOD, **GOOD_BY_CODE.get(code, {})}
    return (
        st.fixed_dictionaries({n: good.get(n, spoiled(n)) for n in names}),
        st.lists(st.sampled_from(names), max_size=3, unique=True),
        st.fixed_dictionaries({}, optional={n: spoiled(n) for n in names}),
    )


@st.composite
def header_fields(draw, code: int) -> dict[str, str]:
    names = FIELDS.get(code)
    if names is None:  # a code this table does not know yet: any fields
        names = draw(ANY_NAMES)
    if not names:
        return draw(EXTRA)
    good, spoil, anything = field_strategies(code, tuple(names))
    if draw(DIGITS) < 7:  # mostly a good request with up to three fields spoiled or left out
        ext = draw(good)
        for name in draw(spoil):
            if draw(st.booleans()):
                del ext[name]
            else:
                ext[name] = draw(spoiled(name))
    else:
        ext = draw(anything)
    ext.update(draw(EXTRA))
    return ext


@st.composite
def requests(draw, code: int) -> tuple[bytes, Command]:
    """A frame that decodes, for `code`, and the command the server reads from it."""
    ext = draw(header_fields(code))
    flag = draw(FLAGS)
    version = draw(VERSIONS)
    language = draw(LANGUAGES)
    remark = draw(REMARKS)
    body = draw(bodies(code))
    if code < 2**15 and draw(DIGITS) < 3:
        command = Command(
            code, draw(OPAQUES), flag, {_utf8(k): _utf8(v) for k, v in ext.items()}, body,
            None if remark is None else _utf8(remark), language, version, codec.ROCKETMQ,
        )  # fmt: skip
        frame = codec.encode(command)
        return frame, codec.decode(frame[4:])
    # JSON, written here rather than by the codec: fields left out, numbers
    # as strings and strings as numbers or booleans, as clients send them.
    header: dict[str, Any] = {"code": code}
    for key, value in (("opaque", draw(WIDE_OPAQUES)), ("flag", flag), ("version", version)):
        shape = draw(DIGITS)
        if shape == 0:
            continue  # absent: 0
        header[key] = str(value) if shape == 1 else value
    if draw(DIGITS):
        header["language"] = language if draw(DIGITS) else codec.LANGUAGES.index("GO")
    if remark is not None:
        header["remark"] = remark
    if ext or draw(st.booleans()):
        loose: dict[str, Any] = {}
        for key, value in ext.items():
            shape = draw(DIGITS)
            if shape == 0 and value in ("true", "false"):
                loose[key] = value == "true"
            elif (
                shape == 0 and value.lstrip("-").isdecimal() and value.isascii() and len(value) < 30
            ):
                loose[key] = int(value)
            elif shape == 1:
                loose[key] = None  # dropped: the field is missing
            else:
                loose[key] = value
        header["extFields"] = loose
    if draw(DIGITS) == 0:
        header["serializeTypeCurrentRPC"] = "JSON"
        header["unknownField"] = draw(json_values)
    try:
        text = json.dumps(header, ensure_ascii=draw(st.booleans())).encode()
    except UnicodeEncodeError:  # a lone surrogate: only JSON's \u escape carries it
        text = json.dumps(header).encode()
    frame = struct.pack(">ii", 4 + len(text) + len(body), len(text)) + text + body
    return frame, codec.decode(frame[4:])


# ---------------------------------------------------------------- the wire


class Wire:
    """A blocking client socket that reads whole frames."""

    def __init__(self, port: int, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # two small writes
        self.buffer = bytearray()
        self.received = 0
        self.requests: list[Command] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> Command:
        """The next answer the server wrote (ConnectionError at EOF). Requests
        of the server's own (a broker's NOTIFY_CONSUMER_IDS_CHANGED) are set
        aside in `requests`."""
        while True:
            found = codec.next_frame(self.buffer)
            if found is not None:
                command, end = found
                del self.buffer[:end]
                if command.is_response:
                    return command
                self.requests.append(command)
                continue
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.received += len(chunk)
            self.buffer += chunk

    def call(self, command: Command) -> Command:
        self.send(codec.encode(command))
        answer = self.read()
        assert answer.is_response and answer.opaque == command.opaque, answer
        return answer

    def close(self) -> None:
        self.sock.close()


SENTINEL = 32000  # a code neither server serves: answered 3 at once


def serves_the_next_connection(door: Door) -> int:
    """Its probe is answered SUCCESS on a fresh connection; the bytes the
    answer took."""
    wire = Wire(door.port, timeout_s=10)
    try:
        answer = wire.call(Command(door.probe.code, 424242, ext=dict(door.probe.ext)))
        assert answer.code == codes.SUCCESS, (answer.code, answer.remark)
        return wire.received
    finally:
        wire.close()


class Exchange:
    """One request at a time on a kept connection, with every check that
    needs the server's side."""

    def __init__(self, door: Door, errors: Errors) -> None:
        assert SENTINEL not in door.codes
        self.door = door
        self.errors = errors
        self.wire = Wire(door.port)
        self.sentinels = 0
        self.answers: dict[int, dict[int, int]] = {}  # code -> response code -> count

    def warm(self) -> None:
        """The door's warm-up requests (answered whatever their code)."""
        for opaque, command in enumerate(self.door.warmup, start=2**30):
            self.wire.call(dataclasses.replace(command, opaque=opaque))
        logged = self.errors.take()
        assert not logged, "a warm-up request logged an error:\n" + "\n".join(logged)

    def quiet(self) -> None:
        """Nothing came back but the answer to a request behind it."""
        self.sentinels += 1
        opaque = 2**31 - self.sentinels
        self.wire.send(codec.encode(Command(SENTINEL, opaque)))
        answer = self.wire.read()
        assert answer.opaque == opaque and answer.code == codes.REQUEST_CODE_NOT_SUPPORTED, (
            f"answered a request that wants no answer: code {answer.code} "
            f"remark {answer.remark!r} opaque {answer.opaque}"
        )

    def run(self, frame: bytes, request: Command) -> None:
        try:
            self._run(frame, request)
        except (ConnectionError, TimeoutError) as e:
            self.wire.close()
            self.wire = Wire(self.door.port)  # the next example starts afresh
            raise AssertionError(
                f"code {request.code}: no answer to a well-formed request ({e!r})"
            ) from e

    def _run(self, frame: bytes, request: Command) -> None:
        code = request.code
        before = self.door.snapshot()
        handled = self.door.handled(code)
        self.wire.send(frame)
        if request.is_response:
            self.quiet()  # a stray response reaches no handler and gets no answer
            answered = None
        elif request.is_oneway:
            counted = wait_for(
                lambda: (now := self.door.handled(code)) != handled and now,
                ANSWER_TIMEOUT_S,
                f"the oneway {code} to be handled",
                interval_s=0.001,
            )
            self.quiet()
            label = next(k for k, v in counted.items() if v != handled.get(k, 0.0))
            answered = None if label == "none" else int(label)  # "none": it returned nothing
        else:
            answer = self.wire.read()
            assert answer.is_response, answer
            assert answer.opaque == request.opaque, (answer.opaque, request.opaque)
            assert answer.serialize_type == request.serialize_type
            assert not names_an_exception(answer.remark) or answer.code != codes.SYSTEM_ERROR, (
                f"code {code}: a handler raised: {answer.remark}"
            )
            answered = answer.code
        logged = self.errors.take()
        assert not logged, f"code {code}: logged an error:\n" + "\n".join(logged)
        if answered is not None:
            counts = self.answers.setdefault(code, {})
            counts[answered] = counts.get(answered, 0) + 1
            if not may_change(code, answered):
                assert self.door.snapshot() == before, (
                    f"code {code} refused with {answered} but changed the state"
                )

    def close(self) -> None:
        self.wire.close()


def fuzz_every_code(door: Door, errors: Errors) -> None:
    started = time.monotonic()
    exchange = Exchange(door, errors)
    try:
        for code in door.codes:
            door.reset()
            exchange.warm()

            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(pair=requests(code))
            def one(pair: tuple[bytes, Command]) -> None:
                exchange.run(*pair)

            one()
            door.reset()  # (a delete or a permission change may have succeeded)
            serves_the_next_connection(door)
    finally:
        exchange.close()
    print(
        f"\nremoting fuzz ({door.name}): {len(door.codes)} codes x {EXAMPLES} examples in "
        f"{time.monotonic() - started:.1f} s; answers by code: {exchange.answers}"
    )


@pytest.mark.timeout(max(300, EXAMPLES * 3))
def test_broker_answers_every_well_formed_frame(broker, errors):
    fuzz_every_code(broker, errors)


@pytest.mark.timeout(max(300, EXAMPLES * 3))
def test_namesrv_answers_every_well_formed_frame(namesrv, errors):
    fuzz_every_code(namesrv, errors)


# ---------------------------------------------------------------- broken frames

BROKEN = "broken"  # the server must close the connection by itself
CUT = "cut"  # a frame not yet whole: the server waits, and closes at EOF


def first_frame(data: bytes) -> str:
    """What the server makes of the first frame of `data`: BROKEN, CUT or "whole"."""
    if len(data) < 4:
        return CUT
    try:
        length = codec.frame_length(data[:4])
    except codec.RemotingProtocolError:
        return BROKEN
    if len(data) - 4 < length:
        return CUT
    try:
        codec.decode(data[4 : 4 + length])
    except codec.RemotingProtocolError:
        return BROKEN
    return "whole"


def framed(header: bytes, body: bytes = b"", kind: int = codec.JSON) -> bytes:
    return (
        struct.pack(">iI", 4 + len(header) + len(body), (kind << 24) | len(header)) + header + body
    )


def binary_header(rnd: random.Random) -> bytes:
    """A ROCKETMQ header that breaks its own layout."""
    fixed = struct.pack(">hbhii", rnd.choice([10, 310, 105, 101]), 0, 409, rnd.randrange(2**31), 0)
    remark, ext = b"oops", struct.pack(">h", 1) + b"k" + struct.pack(">i", 1) + b"v"
    good = fixed + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext
    how = rnd.randrange(7)
    if how == 0:
        return fixed[: rnd.randrange(len(fixed))]  # shorter than the fixed fields
    if how == 1:
        n = rnd.choice([-1, -(2**31), len(remark) + 1, 2**31 - 1])
        return fixed + struct.pack(">i", n) + remark + struct.pack(">i", len(ext)) + ext
    if how == 2:
        n = rnd.choice([-1, len(ext) + 1, 2**31 - 1])
        return fixed + struct.pack(">i", len(remark)) + remark + struct.pack(">i", n) + ext
    if how == 3:  # a pair whose own lengths lie
        pair = struct.pack(">h", rnd.choice([-1, 50])) + b"k" + struct.pack(">i", 1) + b"v"
        if rnd.random() < 0.5:
            pair = struct.pack(">h", 1) + b"k" + struct.pack(">i", rnd.choice([-1, 50])) + b"v"
        return fixed + struct.pack(">i", 0) + struct.pack(">i", len(pair)) + pair
    if how == 4:
        return good + rnd.randbytes(rnd.randint(1, 8))  # stray bytes after it
    if how == 5:  # text that is not UTF-8
        bad = b"\xff\xfe"
        return fixed + struct.pack(">i", len(bad)) + bad + struct.pack(">i", 0)
    return good[: rnd.randrange(len(fixed), len(good))]  # ends inside a length or a field


def json_header(rnd: random.Random) -> bytes:
    """A JSON header the codec must refuse."""
    good = {"code": 105, "flag": 0, "language": "JAVA", "opaque": 1, "version": 409,
            "extFields": {"topic": TOPIC}}  # fmt: skip
    how = rnd.randrange(9)
    if how == 0:
        return rnd.randbytes(rnd.randint(1, 64))
    if how == 1:
        return b"\xff" + json.dumps(good).encode()  # not UTF-8
    if how == 2:
        text = json.dumps(good).encode()
        return text[: rnd.randrange(1, len(text))]
    if how == 3:
        return rnd.choice([b"[]", b"1", b'"code"', b"null", b"true", b'[{"code": 1}]'])
    if how == 4:  # a field that is no integer
        bad = dict(good)
        bad[rnd.choice(["code", "opaque", "flag", "version"])] = rnd.choice(
            ["x", 1.5, True, None, [], {}, "0x10", "9" * 5000]
        )
        if bad.get("code", 0) is None or "code" not in bad:
            bad["code"] = "x"
        return json.dumps(bad).encode()
    if how == 5:
        bad = dict(good)
        del bad["code"]
        return json.dumps(bad).encode()
    if how == 6:
        bad = dict(good)
        bad["extFields"] = rnd.choice([["x"], "topic", 7, True])  # ([] reads as none)
        return json.dumps(bad).encode()
    if how == 7:
        bad = dict(good)
        bad["extFields"] = {"topic": rnd.choice([[TOPIC], {"a": 1}])}
        return json.dumps(bad).encode()
    depth = rnd.choice([2000, 100_000])
    return b"[" * depth + b"]" * depth  # nested past the parser's recursion limit


def valid_frames(door: Door) -> list[bytes]:
    out = []
    for serialize_type in (codec.JSON, codec.ROCKETMQ):
        for code in door.codes:
            if serialize_type == codec.ROCKETMQ and code >= 2**15:
                continue  # the binary header's code is an int16
            ext = {"topic": TOPIC, "queueId": "0", "a": "pg", "b": TOPIC, "namespace": "n"}
            command = Command(code, 7, 0, ext, b"body", None, "JAVA", 409, serialize_type)
            out.append(codec.encode(command))
    return out


def broken_input(rnd: random.Random, valid: list[bytes]) -> tuple[bytes, str, str]:
    """(bytes, BROKEN or CUT, what) — or "whole" for random bytes that parse."""
    good = rnd.choice(valid)
    how = rnd.randrange(13)
    tail = rnd.randbytes(rnd.randint(0, 32))
    if how == 0:
        n = rnd.choice([-1, 0, 1, 2, 3, -(2**31), rnd.randint(-(2**31), 3)])
        return struct.pack(">i", n) + tail, BROKEN, f"length {n}"
    if how == 1:
        n = rnd.choice([MAX_FRAME + 1, 2**31 - 1, rnd.randint(MAX_FRAME + 1, 2**31 - 1)])
        data = struct.pack(">ii", n, rnd.randint(0, 0xFFFFFF)) + rnd.randbytes(rnd.randint(0, 4096))
        return data, BROKEN, f"{n} bytes declared"
    if how == 2:
        length = rnd.randint(4, 200)
        header_len = rnd.choice([length - 3, length, 0xFFFFFF, rnd.randint(length - 3, 0xFFFFFF)])
        word = (rnd.choice([0, 1]) << 24) | header_len
        return (
            struct.pack(">ii", length, word) + rnd.randbytes(length - 4),
            BROKEN,
            "header past frame",
        )
    if how == 3:
        header = json.dumps({"code": 105, "opaque": 1}).encode()
        return framed(header, b"", rnd.randint(2, 255)), BROKEN, "serialize type"
    if how == 4:
        return framed(json_header(rnd), rnd.randbytes(rnd.randint(0, 16))), BROKEN, "JSON header"
    if how == 5:
        return (
            framed(binary_header(rnd), rnd.randbytes(rnd.randint(0, 16)), codec.ROCKETMQ),
            BROKEN,
            "ROCKETMQ header",
        )
    if how == 6:
        return good[: rnd.randrange(1, len(good))], CUT, "cut short"
    if how == 7:
        (length,) = struct.unpack(">i", good[:4])
        more = min(MAX_FRAME, length + rnd.randint(1, 1 << 20))
        return struct.pack(">i", more) + good[4:], CUT, "length past what was sent"
    if how == 8:  # a bad frame, then a good one the server must not answer
        bad, _, what = broken_input(rnd, valid)
        while first_frame(bad) != BROKEN:
            bad, _, what = broken_input(rnd, valid)
        return bad + good, BROKEN, f"{what}, then a good frame"
    if how in (9, 10):
        data = bytearray(good)
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        data = bytes(data)
        return data, first_frame(data), "bits flipped"
    if how == 11:
        data = bytes(rnd.choice([0, 0, 0xFF, rnd.randrange(256)]) for _ in range(rnd.randint(1, 4)))
        data += rnd.randbytes(rnd.randint(0, 300))
        return data, first_frame(data), "random bytes"
    n = rnd.randint(MAX_FRAME + 1, MAX_FRAME + 4096)  # just over the limit
    return struct.pack(">ii", n, 0) + b"\0" * 8192, BROKEN, f"{n} bytes declared (just over)"


def closed_without_a_word(door: Door, data: bytes, kind: str) -> bytes:
    """Send `data` on a fresh connection; everything the server wrote before
    the connection ended."""
    got = bytearray()
    with socket.create_connection(("127.0.0.1", door.port), timeout=10) as s:
        try:
            s.sendall(data)
            if kind == CUT:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server closed first, with our bytes unread: closed all the same
        except TimeoutError:
            raise AssertionError(f"the server kept a connection open after {kind} input") from None
    return bytes(got)


def fuzz_broken_frames(door: Door, errors: Errors) -> None:
    rnd = random.Random(f"remoting-{door.name}")
    valid = valid_frames(door)
    for data in valid:  # the generators' ground truth
        assert first_frame(data) == "whole"
    before = door.snapshot()
    sent_bytes = door.metric("ferry_remoting_sent_bytes_total")
    protocol_errors = door.metric("ferry_remoting_protocol_errors_total")
    connections = door.metric("ferry_remoting_connections")
    broken = cut = skipped = probe_bytes = 0
    kept = Wire(door.port)  # a client that stays connected throughout
    started = time.monotonic()
    for i in range(FRAMES):
        data, kind, what = broken_input(rnd, valid)
        if kind == "whole":
            skipped += 1  # mutated into a frame that parses: the well-formed test's job
            continue
        assert first_frame(data) == kind, f"{what}: the codec reads {first_frame(data)}"
        got = closed_without_a_word(door, data, kind)
        assert not got, f"{door.name} answered {what} ({data[:64]!r}...) with {got[:200]!r}"
        broken += kind == BROKEN
        cut += kind == CUT
        if i % 250 == 249:
            probe_bytes += serves_the_next_connection(door)
        logged = errors.take()
        assert not logged, f"{what}: logged an error:\n" + "\n".join(logged)
    probe_bytes += serves_the_next_connection(door)
    answer = kept.call(Command(door.probe.code, 424243, ext=dict(door.probe.ext)))
    assert answer.code == codes.SUCCESS, (answer.code, answer.remark)
    probe_bytes += kept.received
    kept.close()
    # Not one byte went out but the answers to the probes (a reply the socket
    # lost to a reset would still show here).
    assert door.metric("ferry_remoting_sent_bytes_total") - sent_bytes == probe_bytes
    wait_for(
        lambda: door.metric("ferry_remoting_protocol_errors_total") - protocol_errors == broken,
        10,
        f"{broken} protocol errors counted",
    )
    wait_for(
        lambda: door.metric("ferry_remoting_connections") == connections,
        10,
        "every fuzz connection to be gone",
    )
    assert door.snapshot() == before, "broken frames changed the state"
    print(
        f"\nremoting fuzz ({door.name}): {broken} broken and {cut} cut-short frames "
        f"({skipped} mutations parsed, skipped) in {time.monotonic() - started:.1f} s"
    )


def test_broker_closes_on_every_broken_frame(broker, errors):
    fuzz_broken_frames(broker, errors)


def test_namesrv_closes_on_every_broken_frame(namesrv, errors):
    fuzz_broken_frames(namesrv, errors)
