"""RocketMQ's admin and statistics codes on the broker: what `mqadmin`, the
RocketMQ Dashboard and `rocketmq-exporter` ask a broker
(docs/reference/remoting.md, "Broker: admin and statistics").

Tables (the same use cases as ferry.v1's BrokerAdmin, so a topic made with
`mqadmin updateTopic` is the topic `ferry topic create` makes):
UPDATE_AND_CREATE_TOPIC 17, DELETE_TOPIC_IN_BROKER 215,
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200, DELETE_SUBSCRIPTIONGROUP 207, and the
whole tables a RocketMQ slave copies from its master: GET_ALL_TOPIC_CONFIG 21,
GET_ALL_CONSUMER_OFFSET 43, GET_ALL_DELAY_OFFSET 45,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201; one topic, GET_TOPIC_CONFIG 351 (5.x), and
the broker's own topics, GET_SYSTEM_TOPIC_LIST_FROM_BROKER 305.

Configuration: GET_BROKER_CONFIG 26 (every key, as broker.conf writes it) and
UPDATE_BROKER_CONFIG 25 (only the keys ferry can change while it runs;
anything else is refused naming the key).

Statistics: GET_BROKER_RUNTIME_INFO 28, GET_TOPIC_STATS_INFO 202,
GET_CONSUME_STATS 208, GET_CONSUMER_CONNECTION_LIST 203,
GET_PRODUCER_CONNECTION_LIST 204, QUERY_TOPIC_CONSUME_BY_WHO 300, and
INVOKE_BROKER_TO_RESET_OFFSET 222 (the broker tells the group's connected
consumers where to start again, as Apache's does), and GET_CONSUMER_RUNNING_INFO
307 (asked of the consumer itself over its connection), CONSUME_MESSAGE_DIRECTLY 309
(one stored message handed to a consumer the same way), VIEW_BROKER_STATS_DATA 315.
The figures of 28, 202 and
208 are the statistics use case's (services.broker.messaging.statistics, which
ferry.v1's GetBrokerRuntimeInfo answers from too); this module only renders them.

Bodies are in the forms mqadmin parses (fastjson's, with MessageQueue objects
as map keys for 202, 208 and 222: `ferry.remoting.bodies.dumps_object_keyed`).
A malformed header or body is answered 1 SYSTEM_ERROR naming the field, as
Apache answers a header it cannot decode; nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ferry import __version__, record
from ferry.model import (
    SCHEDULE_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
    check_name,
    parse_attributes,
)
from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.broker.config import KNOWN_KEYS, parse_properties, shown_value
from services.broker.messaging.clients import Member
from services.broker.messaging.statistics import BrokerFigures
from services.broker.metadata.defaults import system_topic_names
from services.broker.metadata.tables import (
    group_from_json,
    group_to_json,
    topic_to_json,
    version_to_json,
)
from services.broker.remoting import convert
from services.broker.remoting.convert import boolean, integer, text
from services.broker.remoting.deps import Deps

log = logging.getLogger(__name__)

SLAVE_REMARK = (
    "Can't modify topic or subscription group from slave broker, please execute it from "
    "master broker."
)
# What UPDATE_BROKER_CONFIG may change while the broker runs (each has its use case).
RUNTIME_KEYS = ("brokerPermission",)
# Keys whose values GET_BROKER_CONFIG masks (tlsKey is a path, but a private one).
SECRET_KEYS = ("adminToken", "haSecret", "tlsKey")
# RocketMQ's version ordinal of 4.9.8, the protocol level ferry speaks (brokerVersion).
PROTOCOL_VERSION = 409
# Calls forwarded to a client (307): the oldest client version that answers them
# (V3_1_8_SNAPSHOT's ordinal), and how long it has to answer (Apache's Broker2Client).
MIN_CLIENT_VERSION_FOR_CALLS = 77
CLIENT_CALL_TIMEOUT_S = 10.0
# The codes that change the broker (an admin token or ACL admin guards them).
CHANGES = frozenset(
    {
        codes.UPDATE_AND_CREATE_TOPIC,
        codes.DELETE_TOPIC_IN_BROKER,
        codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        codes.DELETE_SUBSCRIPTIONGROUP,
        codes.UPDATE_BROKER_CONFIG,
        codes.INVOKE_BROKER_TO_RESET_OFFSET,
        codes.DELETE_EXPIRED_COMMITLOG,
    }
)


def queue_key(topic: str, broker_name: str, queue_id: int) -> dict[str, Any]:
    """A MessageQueue as fastjson writes it (fields in alphabetical order)."""
    return {"brokerName": broker_name, "queueId": queue_id, "topic": topic}


def human_bytes(n: int) -> str:
    """Bytes as RocketMQ's MixAll.humanReadableByteCount(n, false) writes them."""
    if n < 1024:
        return f"{n} B"
    exp = 0
    value = float(n)
    while value >= 1024 and exp < 6:
        value /= 1024
        exp += 1
    return f"{value:.1f} {'KMGTPE'[exp - 1]}iB"


def running_for(ms: int) -> str:
    """`[ 0 days, 0 hours, 0 minutes, 16 seconds ]`, as RocketMQ's runtime key."""
    s = max(0, ms) // 1000
    return f"[ {s // 86400} days, {s % 86400 // 3600} hours, {s % 3600 // 60} minutes, {s % 60} seconds ]"


def rates(per_window: Sequence[float]) -> str:
    """`a b c`: a rate over 10 s, 60 s and 600 s, as RocketMQ writes putTps
    (clusterList reads the first)."""
    return " ".join(f"{rate:.4f}" for rate in per_window)


def runtime_table(figures: BrokerFigures) -> dict[str, str]:
    """RocketMQ's runtime KVTable with ferry's figures, plus ferry's own keys
    (docs/reference/remoting.md lists which RocketMQ keys ferry leaves out)."""
    info = figures.info
    # (the retention's used ratio, blocks in use over all blocks: what Java's
    # getTotalSpace and getFreeSpace give Apache's commitLogDiskRatio)
    used = f"{figures.disk_used_ratio:.2f}"
    table = {
        **info.table,
        "brokerVersionDesc": f"ferry-{__version__}",
        "brokerVersion": str(PROTOCOL_VERSION),
        "brokerRole": info.broker_role,
        "bootTimestamp": str(info.start_timestamp),
        "runtime": running_for(figures.uptime_ms),
        "putTps": rates(figures.put_tps),
        "getTransferedTps": rates(figures.get_tps),
        "getFoundTps": rates(figures.found_tps),
        "getMissTps": rates(figures.missed_tps),
        "getTotalTps": rates(
            tuple(f + m for f, m in zip(figures.found_tps, figures.missed_tps, strict=True))
        ),
        "putMessageTimesTotal": str(figures.put_total),
        "msgPutTotalTodayNow": str(figures.put_total),
        "msgGetTotalTodayNow": str(figures.get_total),
        "commitLogMinOffset": str(info.commit_log_min_offset),
        "commitLogMaxOffset": str(info.commit_log_max_offset),
        "confirmOffset": str(info.confirm_offset),
        "dispatchBehindBytes": str(info.dispatch_behind_bytes),
        "remainHowManyDataToFlush": human_bytes(figures.unflushed_bytes),
        "earliestMessageTimeStamp": str(figures.earliest_message_ms),
        "commitLogDiskRatio": used,
        "consumeQueueDiskRatio": used,
        "commitLogDirCapacity": (
            f"Total : {human_bytes(figures.disk_total_bytes)}, "
            f"Free : {human_bytes(figures.disk_free_bytes)}."
        ),
        # ferry handles requests on its event loop: no thread-pool queue to wait in,
        # no page-cache lock to wait for.
        "sendThreadPoolQueueSize": "0",
        "sendThreadPoolQueueHeadWaitTimeMills": "0",
        "pullThreadPoolQueueSize": "0",
        "pullThreadPoolQueueHeadWaitTimeMills": "0",
        "queryThreadPoolQueueSize": "0",
        "queryThreadPoolQueueHeadWaitTimeMills": "0",
        "pageCacheLockTimeMills": "0",
    }
    return dict(sorted(table.items()))


def subscription_json(sub) -> dict[str, Any]:
    return {
        "classFilterMode": False,
        "codeSet": list(sub.codes),
        "expressionType": sub.expression_type,
        "subString": sub.expression,
        "subVersion": sub.version,
        "tagsSet": list(sub.tags),
        "topic": sub.topic,
    }


def _connection_json(member: Member) -> dict[str, Any]:
    return {
        "clientAddr": getattr(member.channel, "remote", ""),
        "clientId": member.client_id,
        "language": member.language or "JAVA",
        "version": member.version,
    }


_GROUP_TYPES = {
    "groupName": str,
    "consumeEnable": bool,
    "consumeFromMinEnable": bool,
    "consumeBroadcastEnable": bool,
    "retryQueueNums": int,
    "retryMaxTimes": int,
    "brokerId": int,
    "whichBrokerWhenConsumeSlowly": int,
    "notifyConsumerIdsChangedEnable": bool,
    "groupSysFlag": int,
    "consumeMessageOrderly": bool,
}


def group_from_body(body: bytes) -> SubscriptionGroupConfig:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body (SubscriptionGroupConfig JSON),
    each known field of its JSON type; unknown fields are ignored, as fastjson does.

    Raises:
        BodyError: not JSON, not an object, or a field of the wrong type.
    """
    doc = bodies.loads(body)
    if not isinstance(doc, dict):
        raise bodies.BodyError("a SubscriptionGroupConfig must be a JSON object")
    for key, kind in _GROUP_TYPES.items():
        if key not in doc:
            continue
        value = doc[key]
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not ok:
            raise bodies.BodyError(f"{key} must be a {kind.__name__}, not {value!r:.40}")
        if kind is int and not -(2**31) <= value < 2**31:
            raise bodies.BodyError(f"{key} {value} is out of range")
    if not isinstance(doc.get("groupName"), str):
        raise bodies.BodyError("groupName is required")
    check_name(doc["groupName"], "groupName")
    attributes = doc.get("attributes")
    if attributes is not None and not (
        isinstance(attributes, dict) and all(isinstance(v, str) for v in attributes.values())
    ):
        raise bodies.BodyError("attributes must be an object of strings")
    return group_from_json({k: v for k, v in doc.items() if k in _GROUP_TYPES or k == "attributes"})


class AdminCodes:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.metadata = deps.metadata
        self.broker_name = deps.config.broker_name

    @property
    def _slave(self) -> bool:
        """This run is a slave (with failover, the role of the run, not of broker.conf)."""
        return self.deps.admin.role == "SLAVE"

    # ------------------------------------------------------------ tables

    async def update_topic(self, connection: Connection, request: Command) -> Command:
        ext = request.ext
        topic = text(ext, "topic")
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=integer(ext, "readQueueNums", low=0, high=1024),
            write_queue_nums=integer(ext, "writeQueueNums", low=0, high=1024),
            perm=integer(ext, "perm", low=0, high=15),
            topic_filter_type=self._filter_type(ext),
            topic_sys_flag=integer(ext, "topicSysFlag", required=False, low=0, high=2**31 - 1),
            order=boolean(ext, "order"),
            attributes=tuple(parse_attributes(ext.get("attributes", "")).items()),
        )
        if self._slave:
            return request.answer(codes.SYSTEM_ERROR, SLAVE_REMARK)
        if topic == SCHEDULE_TOPIC:
            return request.answer(
                codes.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        log.info("UPDATE_AND_CREATE_TOPIC %s from %s", topic, connection.remote)
        await self.deps.admin.update_topic(config)
        return request.answer(codes.SUCCESS)

    @staticmethod
    def _filter_type(ext: Mapping[str, str]) -> str:
        value = ext.get("topicFilterType") or "SINGLE_TAG"
        if value not in ("SINGLE_TAG", "MULTI_TAG"):
            raise convert.BadRequest(
                "topicFilterType", f"{value[:20]!r} is not SINGLE_TAG or MULTI_TAG"
            )
        return value

    async def delete_topic(self, connection: Connection, request: Command) -> Command:
        topic = text(request.ext, "topic")
        if self._slave:
            return request.answer(codes.SYSTEM_ERROR, SLAVE_REMARK)
        if topic == SCHEDULE_TOPIC:
            return request.answer(
                codes.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        log.info("DELETE_TOPIC_IN_BROKER %s from %s", topic, connection.remote)
        if self.metadata.topics.get(topic) is not None:  # an unknown topic is deleted already
            await self.deps.admin.delete_topic(topic)
        return request.answer(codes.SUCCESS)

    async def update_group(self, connection: Connection, request: Command) -> Command:
        config = group_from_body(request.body)
        if self._slave:
            return request.answer(codes.SYSTEM_ERROR, SLAVE_REMARK)
        log.info(
            "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP %s from %s", config.group_name, connection.remote
        )
        await self.deps.admin.update_group(config)
        return request.answer(codes.SUCCESS)

    async def delete_group(self, connection: Connection, request: Command) -> Command:
        group = text(request.ext, "groupName")
        if self._slave:
            return request.answer(codes.SYSTEM_ERROR, SLAVE_REMARK)
        log.info("DELETE_SUBSCRIPTIONGROUP %s from %s", group, connection.remote)
        if self.metadata.subscription_groups.get(group) is not None:
            # (ferry removes the group's offsets with it, whatever removeOffset says)
            await self.deps.admin.delete_group(group)
        elif boolean(request.ext, "removeOffset"):
            self.metadata.consumer_offsets.remove_group(group)
        self.deps.statistics.forget_group(group)
        return request.answer(codes.SUCCESS)

    async def all_topic_config(self, connection: Connection, request: Command) -> Command:
        table, version = self.metadata.topics.snapshot()
        body = {
            "dataVersion": version_to_json(version),
            "topicConfigTable": {name: topic_to_json(t) for name, t in sorted(table.items())},
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def topic_config(self, connection: Connection, request: Command) -> Command:
        """GET_TOPIC_CONFIG (351, 5.x): one topic's config as its JSON entry
        (TopicConfigAndQueueMapping; ferry has no static-topic mapping, so no
        `mappingDetail`, as Apache leaves it out when `lo` is not set)."""
        topic = text(request.ext, "topic")
        config = self.metadata.topics.get(topic)
        if config is None:
            return request.answer(
                codes.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"
            )  # (Apache's remark)
        return request.answer(codes.SUCCESS, body=bodies.dumps(topic_to_json(config)))

    async def system_topics(self, connection: Connection, request: Command) -> Command:
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): the topics this broker
        counts as its own (metadata/defaults.py); the admin API adds them to
        the name server's answer to 304."""
        names = system_topic_names(self.deps.config)
        return request.answer(codes.SUCCESS, body=bodies.dumps({"topicList": names}))

    async def all_group_config(self, connection: Connection, request: Command) -> Command:
        table, version = self.metadata.subscription_groups.snapshot()
        body = {
            "dataVersion": version_to_json(version),
            "subscriptionGroupTable": {n: group_to_json(g) for n, g in sorted(table.items())},
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def all_consumer_offset(self, connection: Connection, request: Command) -> Command:
        table, _ = self.metadata.consumer_offsets.snapshot()
        body = {
            "offsetTable": {
                key: {str(q): o for q, o in sorted(queues.items())}
                for key, queues in sorted(table.items())
            }
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def all_delay_offset(self, connection: Connection, request: Command) -> Command:
        table, _ = self.metadata.delay_offsets.snapshot()
        body = {"offsetTable": {str(level): o for level, o in sorted(table.items())}}
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    # ------------------------------------------------------------ configuration

    async def get_broker_config(self, connection: Connection, request: Command) -> Command:
        config = self.deps.config
        values = {key: shown_value(key, config) for key in KNOWN_KEYS}
        values["brokerPermission"] = str(self.deps.admin.permission)
        for key in SECRET_KEYS:  # never sent: set or not, they read as a mask
            values[key] = "******" if values.get(key) else ""
        lines = "".join(f"{key}={value}\n" for key, value in values.items())
        _, version = self.metadata.topics.snapshot()
        ext = {"version": bodies.dumps(version_to_json(version)).decode()}
        return request.answer(codes.SUCCESS, ext=ext, body=lines.encode())

    async def update_broker_config(self, connection: Connection, request: Command) -> Command:
        try:
            changes = parse_properties(bytes(request.body).decode())
        except UnicodeDecodeError:
            return request.answer(codes.SYSTEM_ERROR, "request body: not UTF-8 key=value lines")
        for key in changes:
            if key not in RUNTIME_KEYS:
                known = (
                    "a key ferry does not know"
                    if key not in KNOWN_KEYS
                    else "not changeable at run time"
                )
                return request.answer(
                    codes.SYSTEM_ERROR,
                    f"{key[:80]}: {known}; ferry changes only {', '.join(RUNTIME_KEYS)} while it "
                    "runs. Set other keys in broker.conf and restart the broker",
                )
        if "brokerPermission" in changes:
            value = changes["brokerPermission"]
            if not value.isdigit():
                raise convert.BadRequest("brokerPermission", f"{value[:20]!r} is not a number")
            log.info("UPDATE_BROKER_CONFIG brokerPermission=%s from %s", value, connection.remote)
            await self.deps.admin.update_permission(int(value))
        return request.answer(codes.SUCCESS)

    # ------------------------------------------------------------ statistics

    async def runtime_info(self, connection: Connection, request: Command) -> Command:
        table = runtime_table(await self.deps.statistics.broker_figures())
        return request.answer(codes.SUCCESS, body=bodies.dumps({"table": table}))

    async def topic_stats(self, connection: Connection, request: Command) -> Command:
        topic = text(request.ext, "topic")
        queues = await self.deps.statistics.topic_stats(topic)
        if queues is None:
            return request.answer(codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        pairs = [
            (
                queue_key(topic, self.broker_name, q.queue_id),
                {
                    "lastUpdateTimestamp": q.last_update_ms,
                    "maxOffset": q.max_offset,
                    "minOffset": q.min_offset,
                },
            )
            for q in queues
        ]
        body = '{"offsetTable":' + bodies.dumps_object_keyed(pairs) + "}"
        return request.answer(codes.SUCCESS, body=body.encode())

    async def consume_stats(self, connection: Connection, request: Command) -> Command:
        group = text(request.ext, "consumerGroup")
        asked = request.ext.get("topic") or ""
        stats = await self.deps.statistics.consume_stats(group, asked, self.deps.clients)
        pairs = [
            (
                queue_key(q.topic, self.broker_name, q.queue_id),
                {
                    "brokerOffset": q.broker_offset,
                    "consumerOffset": q.consumer_offset,
                    "lastTimestamp": q.last_timestamp_ms,
                },
            )
            for q in stats.queues
        ]
        body = (
            '{"consumeTps":' + repr(round(stats.consume_tps, 4)) + ',"offsetTable":'
            + bodies.dumps_object_keyed(pairs) + "}"
        )  # fmt: skip
        return request.answer(codes.SUCCESS, body=body.encode())

    async def consumer_connections(self, connection: Connection, request: Command) -> Command:
        group = text(request.ext, "consumerGroup")
        members = self.deps.clients.consumers(group)
        if not members:
            return request.answer(
                codes.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        first = members[0]
        subscriptions: dict[str, Any] = {}
        for member in members:
            for topic, sub in member.subscriptions.items():
                newest = subscriptions.get(topic)
                if newest is None or sub.version > newest["subVersion"]:
                    subscriptions[topic] = subscription_json(sub)
        body = {
            "connectionSet": [_connection_json(m) for m in members],
            "consumeFromWhere": first.consume_from_where,
            "consumeType": first.consume_type,
            "messageModel": first.message_model,
            "subscriptionTable": subscriptions,
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def consumer_running_info(self, connection: Connection, request: Command) -> Command:
        """GET_CONSUMER_RUNNING_INFO (307: `mqadmin consumerStatus`, `consumerProgress
        -s`, the Dashboard's consumer detail): asked of the consumer itself, over the
        connection it heartbeats on, and its answer handed back as it gave it, as
        Apache's broker does (same header and body; 10 s for the client to answer)."""
        group = text(request.ext, "consumerGroup")
        client_id = text(request.ext, "clientId")
        forwarded = Command(request.code, ext=dict(request.ext), body=request.body)
        return await self._call_consumer(request, group, client_id, forwarded)

    async def consume_message_directly(self, connection: Connection, request: Command) -> Command:
        """CONSUME_MESSAGE_DIRECTLY (309: `mqadmin consumeMessage`, the Dashboard's
        "resend message" on a message's page): the message that offset id `msgId` names
        is handed to one consumer, which consumes it and says how that went, as
        Apache's broker does: the header gains `brokerName` (and the topic's and group's
        sys flags), the body is the record as stored."""
        ext = dict(request.ext)
        group = text(ext, "consumerGroup")
        client_id = text(ext, "clientId")
        msg_id = text(ext, "msgId")
        try:
            _, commit_offset = record.parse_message_id(msg_id)
        except record.RecordError as exc:
            raise convert.BadRequest("msgId", str(exc)) from None
        try:
            data = await self.deps.pulls.stored_record(commit_offset)
        except errors.NotFound as exc:  # not "topic not exist" (17), which would mislead
            return request.answer(codes.SYSTEM_ERROR, exc.message)
        ext["brokerName"] = self.broker_name
        topic = self.metadata.topics.get(ext.get("topic") or "")
        if topic is not None:
            ext["topicSysFlag"] = str(topic.topic_sys_flag)
        group_config = self.metadata.subscription_groups.get(group)
        if group_config is not None:
            ext["groupSysFlag"] = str(group_config.group_sys_flag)
        forwarded = Command(request.code, ext=ext, body=data)
        return await self._call_consumer(request, group, client_id, forwarded)

    async def _call_consumer(
        self, request: Command, group: str, client_id: str, forwarded: Command
    ) -> Command:
        """`forwarded` asked of `client_id` of `group` over its heartbeat's connection,
        and its answer handed back unchanged (Apache's Broker2Client.callClient)."""
        member = next(
            (m for m in self.deps.clients.consumers(group) if m.client_id == client_id), None
        )
        if member is None or not isinstance(member.channel, Connection):
            return request.answer(
                codes.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        if member.version < MIN_CLIENT_VERSION_FOR_CALLS:
            return request.answer(
                codes.SYSTEM_ERROR,
                f"The Consumer <{group}> Version <{member.version}> too low to finish, please "
                "upgrade it to V3_1_8_SNAPSHOT",
            )
        try:
            answer = await member.channel.request(forwarded, CLIENT_CALL_TIMEOUT_S)
        except TimeoutError:
            return request.answer(
                codes.CONSUME_MSG_TIMEOUT,
                f"consumer <{group}> <{client_id}> Timeout: no answer within "
                f"{CLIENT_CALL_TIMEOUT_S:.0f} s",
            )
        except (ConnectionError, OSError) as exc:
            return request.answer(
                codes.SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {exc}"
            )
        return request.answer_text(answer.code, dict(answer.ext), answer.body, answer.remark)

    async def broker_stats(self, connection: Connection, request: Command) -> Command:
        """VIEW_BROKER_STATS_DATA (315: `mqadmin statsAll`, the Dashboard's topic
        charts): statsName TOPIC_PUT_NUMS with statsKey a topic, or GROUP_GET_NUMS
        with `topic@group`; its sum, tps and avgpt over the last minute, hour and
        day. An item that never counted anything (or one ferry does not keep)
        is answered as Apache answers one it does not have."""
        name = text(request.ext, "statsName")
        key = text(request.ext, "statsKey")
        windows = self.deps.statistics.stats_item(name, key)
        if windows is None:
            return request.answer(codes.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        body = {
            f"stats{window.capitalize()}": {"avgpt": w.avgpt, "sum": w.sum, "tps": w.tps}
            for window, w in windows.items()
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def delete_expired_commit_log(self, connection: Connection, request: Command) -> Command:
        """DELETE_EXPIRED_COMMITLOG (329, `mqadmin deleteExpiredCommitLog`): one
        retention pass now, as `ferry store clean` runs it."""
        log.info("DELETE_EXPIRED_COMMITLOG from %s", connection.remote)
        await self.deps.admin.delete_expired_commit_log()
        return request.answer(codes.SUCCESS)

    async def nothing_left_to_clean(self, connection: Connection, request: Command) -> Command:
        """CLEAN_EXPIRED_CONSUMEQUEUE (306) and CLEAN_UNUSED_TOPIC (316): on ferry
        there is nothing to do on request. Retention removes a consume queue's
        files with the commit-log files they point into, and deleting a topic
        removes its queues, so no expired or orphaned consume queue is left to
        clean; answered SUCCESS, as Apache answers after cleaning."""
        return request.answer(codes.SUCCESS)

    async def producer_connections(self, connection: Connection, request: Command) -> Command:
        group = text(request.ext, "producerGroup")
        members = self.deps.clients.producers(group)
        if not members:
            return request.answer(codes.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": [_connection_json(m) for m in members]}
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def consumed_by(self, connection: Connection, request: Command) -> Command:
        topic = text(request.ext, "topic")
        clients = self.deps.clients
        groups = {g for g in clients.consumer_groups() if clients.subscription(g, topic)}
        groups.update(self.metadata.consumer_offsets.groups_of(topic))
        return request.answer(codes.SUCCESS, body=bodies.dumps({"groupList": sorted(groups)}))

    async def reset_offset(self, connection: Connection, request: Command) -> Command:
        """Where each queue of the topic starts again for the group: the first
        message stored at or after `timestamp` (−1: the queue's end); with
        `isForce` false, never later than the group's committed offset. The
        group's connected consumers are told (oneway
        RESET_CONSUMER_CLIENT_OFFSET 220) and commit the new offsets
        themselves, as with Apache; a group with none connected answers 206,
        and mqadmin then sets the offsets itself (15, per queue)."""
        ext = request.ext
        topic = text(ext, "topic")
        group = text(ext, "group")
        timestamp = integer(ext, "timestamp", low=-1)
        force = boolean(ext, "isForce")
        config = self.metadata.topics.get(topic)
        if config is None:
            return request.answer(
                codes.SYSTEM_ERROR,
                f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}",
            )
        offsets = self.metadata.consumer_offsets
        messaging = self.deps.pulls
        pairs = []
        for queue_id in range(config.write_queue_nums):
            current = offsets.query(group, topic, queue_id)
            if current is None:
                return request.answer(
                    codes.SYSTEM_ERROR, f"THe consumer group <{group}> not exist"
                )  # (sic: Apache's remark)
            if timestamp == -1:
                target = messaging.queue_offsets(topic, queue_id)[1]
            else:
                target = await messaging.offset_by_time(topic, queue_id, timestamp)
            target = max(target, 0)
            pairs.append(
                (
                    queue_key(topic, self.broker_name, queue_id),
                    target if force or target < current else current,
                )
            )
        members = self.deps.clients.consumers(group)
        if not members:
            return request.answer(
                codes.CONSUMER_NOT_ONLINE,
                f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                f"Timestamp: {timestamp}",
            )
        body = ('{"offsetTable":' + bodies.dumps_object_keyed(pairs) + "}").encode()
        log.info(
            "INVOKE_BROKER_TO_RESET_OFFSET group=%s topic=%s timestamp=%d force=%s from %s",
            group, topic, timestamp, force, connection.remote,
        )  # fmt: skip
        for channel in dict.fromkeys(m.channel for m in members):
            if isinstance(channel, Connection) and channel.is_open:
                channel.oneway(
                    Command(
                        codes.RESET_CONSUMER_CLIENT_OFFSET,
                        ext={
                            "topic": topic,
                            "group": group,
                            "timestamp": str(timestamp),
                            "isForce": str(force).lower(),
                        },
                        body=body,
                        language="JAVA",
                    )
                )
        return request.answer(codes.SUCCESS, body=body)


def guarded_by_token(token: str, handler: Handler) -> Handler:
    """With an admin token and no ACL: a change over RocketMQ's protocol,
    which cannot carry the token, is refused (16), as on the name server."""

    async def refuse(connection: Connection, request: Command) -> Command:
        return request.answer(
            codes.NO_PERMISSION,
            f"request code {request.code} changes the broker and requires an admin token, which "
            "RocketMQ's protocol cannot carry: use ferry.v1 with the admin token, or turn on "
            "RocketMQ's ACL (aclEnable) and sign with an admin access key",
        )

    return refuse if token else handler


def handlers(deps: Deps) -> dict[int, Handler]:
    admin = AdminCodes(deps)
    table: dict[int, Callable[[Connection, Command], Awaitable[Command]]] = {
        codes.UPDATE_AND_CREATE_TOPIC: admin.update_topic,
        codes.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
        codes.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.update_group,
        codes.DELETE_SUBSCRIPTIONGROUP: admin.delete_group,
        codes.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
        codes.GET_TOPIC_CONFIG: admin.topic_config,
        codes.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: admin.system_topics,
        codes.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.all_group_config,
        codes.GET_ALL_CONSUMER_OFFSET: admin.all_consumer_offset,
        codes.GET_ALL_DELAY_OFFSET: admin.all_delay_offset,
        codes.GET_BROKER_CONFIG: admin.get_broker_config,
        codes.UPDATE_BROKER_CONFIG: admin.update_broker_config,
        codes.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
        codes.GET_TOPIC_STATS_INFO: admin.topic_stats,
        codes.GET_CONSUME_STATS: admin.consume_stats,
        codes.GET_CONSUMER_CONNECTION_LIST: admin.consumer_connections,
        codes.GET_CONSUMER_RUNNING_INFO: admin.consumer_running_info,
        codes.CONSUME_MESSAGE_DIRECTLY: admin.consume_message_directly,
        codes.VIEW_BROKER_STATS_DATA: admin.broker_stats,
        codes.DELETE_EXPIRED_COMMITLOG: admin.delete_expired_commit_log,
        codes.CLEAN_EXPIRED_CONSUMEQUEUE: admin.nothing_left_to_clean,
        codes.CLEAN_UNUSED_TOPIC: admin.nothing_left_to_clean,
        codes.GET_PRODUCER_CONNECTION_LIST: admin.producer_connections,
        codes.QUERY_TOPIC_CONSUME_BY_WHO: admin.consumed_by,
        codes.INVOKE_BROKER_TO_RESET_OFFSET: admin.reset_offset,
    }
    token = deps.config.admin_token if not deps.acl_enabled else ""
    out: dict[int, Handler] = {}
    for code, fn in table.items():
        handler = convert.answering_errors(fn, deps.gate)
        out[code] = guarded_by_token(token, handler) if code in CHANGES else handler
    return out
