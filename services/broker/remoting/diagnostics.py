"""RocketMQ's codes that look inside a broker (docs/reference/remoting.md, "Broker:
admin and statistics"): what mqadmin 5.5.0's `brokerConsumeStats`, `queryCq`,
`haStatus`, `getBrokerEpoch` and `getColdDataFlowCtrInfo` ask.

GET_BROKER_CONSUME_STATS 317 and QUERY_CONSUME_QUEUE 321 render the statistics use
case's figures (services.broker.messaging.statistics); GET_BROKER_HA_STATUS 907 the
replication use case's (services.broker.messaging.replication, which ferry.v1's
GetHAStatus answers from too) as Apache's HARuntimeInfo; GET_BROKER_EPOCH_CACHE 1007
a failover member's leader-epoch history as Apache's EpochEntryCache (a broker
without failover answers as Apache's outside controller mode). ferry has no
cold-data flow control: 2003 answers what Apache's broker answers with the feature
off (nothing throttled), and 2001/2002, which would configure it, are refused
with the reason. RocketMQ 5's ACL 2.0 codes (3001-3010: the Dashboard's ACL page)
are refused with what to do instead: ferry keeps ACL 1.0's plain_acl.yml.

Bodies are fastjson's field names, in its (alphabetical) order, so the Java tools
decode them into Apache's body classes. A malformed header is answered 1 naming
the field; nothing here changes the broker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from services.broker.messaging.statistics import ConsumeStats
from services.broker.remoting import convert
from services.broker.remoting.admin import subscription_json
from services.broker.remoting.convert import integer, text
from services.broker.remoting.deps import Deps

MAX_CQ_ENTRIES = 1000  # 321: entries one answer lists at most (mqadmin asks 10 by default)
JAVA_LONG_MAX = 2**63 - 1  # an epoch's endOffset while it is the newest (Apache's default)
# What Apache's broker reports with cold-data flow control off (BrokerConfig defaults).
CG_COLD_READ_THRESHOLD = 3 * 1024 * 1024
GLOBAL_COLD_READ_THRESHOLD = 100 * 1024 * 1024
NO_COLD_DATA_CONTROL = (
    "ferry has no cold-data flow control (RocketMQ 5's coldDataFlowControlEnable): no "
    "consumer group's cold reads are throttled, so there is nothing to configure; a slow "
    "consumer is seen in consumerProgress and ferry's metrics instead"
)
NO_ACL2 = (
    "request code {code}: RocketMQ 5's ACL 2.0 users and ACLs are not kept by ferry's "
    "brokers, which check RocketMQ's ACL 1.0 accounts of plain_acl.yml (aclEnable, aclFile). "
    "Edit that file instead; the broker re-reads it when it changes"
)


def _consume_stats_json(stats: ConsumeStats, broker_name: str) -> str:
    """A ConsumeStats as fastjson writes it (MessageQueue objects as map keys)."""
    pairs = [
        (
            {"brokerName": broker_name, "queueId": q.queue_id, "topic": q.topic},
            {
                "brokerOffset": q.broker_offset,
                "consumerOffset": q.consumer_offset,
                "lastTimestamp": q.last_timestamp_ms,
                # ferry keeps no pull offsets beyond the committed ones: nothing in flight
                "pullOffset": q.consumer_offset,
            },
        )
        for q in stats.queues
    ]
    return (
        '{"consumeTps":' + repr(round(stats.consume_tps, 4))
        + ',"offsetTable":' + bodies.dumps_object_keyed(pairs) + "}"
    )  # fmt: skip


class Diagnostics:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.broker_name = deps.config.broker_name

    async def broker_consume_stats(self, connection: Connection, request: Command) -> Command:
        """317: every subscription group's progress, per topic (ConsumeStatsList)."""
        order_only = text(request.ext, "isOrder").lower() == "true"  # Boolean.parseBoolean
        stats = await self.deps.statistics.broker_consume_stats(order_only, self.deps.clients)
        groups = ",".join(
            "{" + bodies.dumps(group).decode() + ":["
            + ",".join(_consume_stats_json(one, self.broker_name) for one in per_topic) + "]}"
            for group, per_topic in stats.groups
        )  # fmt: skip
        body = (
            '{"brokerAddr":' + bodies.dumps(self.deps.broker_addr).decode()
            + ',"consumeStatsList":[' + groups + "]"
            + ',"totalDiff":' + str(stats.total_diff) + ',"totalInflightDiff":0}'
        )  # fmt: skip
        return request.answer(codes.SUCCESS, body=body.encode())

    async def query_consume_queue(self, connection: Connection, request: Command) -> Command:
        """321: a slice of one consume queue (QueryConsumeQueueResponseBody)."""
        ext = request.ext
        topic = text(ext, "topic")
        queue_id = integer(ext, "queueId", low=-(2**31), high=2**31 - 1)
        index = integer(ext, "index")
        count = integer(ext, "count", low=-(2**31), high=2**31 - 1)
        group = ext.get("consumerGroup") or None
        found = self.deps.statistics.queue_entries(
            topic, queue_id, index, min(count, MAX_CQ_ENTRIES)
        )
        if found is None:
            return request.answer(codes.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        body: dict[str, Any] = {}
        if group is not None:
            sub = self.deps.clients.subscription(group, topic)
            if sub is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                # Apache's ConsumerFilterData exists for SQL92 only; a tag subscription's is null.
                body["filterData"] = "null" if sub.expression_type == "TAG" else bodies.dumps(
                    {"consumerGroup": group, "expression": sub.expression,
                     "expressionType": sub.expression_type, "topic": topic}
                ).decode()  # fmt: skip
                body["subscriptionData"] = subscription_json(sub)
        body["maxQueueIndex"] = found.max_offset
        body["minQueueIndex"] = found.min_offset
        body["queueData"] = [
            {"eval": False, "physicOffset": commit, "physicSize": size, "tagsCode": tags}
            for commit, size, tags in found.entries
        ]
        remark = None
        if not found.min_offset <= index < found.max_offset:
            remark = f"Index {index} of {queue_id}@{topic} is not exist!"
        return request.answer(codes.SUCCESS, remark, body=bodies.dumps(dict(sorted(body.items()))))

    async def ha_status(self, connection: Connection, request: Command) -> Command:
        """907: where replication stands, as Apache's HARuntimeInfo."""
        if self.deps.replication is None:
            return request.answer(codes.SYSTEM_ERROR, "Can not get HARuntimeInfo")
        figures = self.deps.replication.figures()
        following = figures.following
        client: dict[str, Any] = {
            "lastReadTimestamp": following.last_read_ms if following else 0,
            "lastWriteTimestamp": following.last_write_ms if following else 0,
            # RocketMQ 4.x's HA protocol, which ferry speaks, carries no flush offset
            # (Apache reports 0 outside controller mode too).
            "masterFlushOffset": 0,
            "maxOffset": figures.max_offset if following else 0,
            "transferredByteInSecond": 0,  # ferry's slave does not measure its intake
        }
        if following is not None:
            client["masterAddr"] = following.master_addr
        body = {
            "haClientRuntimeInfo": dict(sorted(client.items())),
            "haConnectionInfo": [
                {
                    "addr": r.addr,
                    "diff": r.lag,
                    "inSync": r.in_sync,
                    "slaveAckOffset": r.ack_offset,
                    "transferFromWhere": max(r.transfer_from, 0),
                    "transferredByteInSecond": int(r.bytes_per_second),
                }
                for r in figures.replicas
            ],
            "inSyncSlaveNums": figures.in_sync_replicas,
            "master": figures.is_master,
            "masterCommitLogMaxOffset": figures.max_offset if figures.is_master else 0,
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def epoch_cache(self, connection: Connection, request: Command) -> Command:
        """1007: a failover member's leader epochs, as Apache's EpochEntryCache."""
        history = self.deps.epochs
        if history is None:
            return request.answer(
                codes.SYSTEM_ERROR,
                "this request only for controllerMode (ferry: this broker runs without "
                "automatic failover, enableFailover, which keeps the leader-epoch history "
                "that getBrokerEpoch shows)",
            )
        entries = [(e.epoch, e.start) for e in history.entries]
        if not entries or entries[0][0] != 0:  # epoch 0 starts every history
            entries.insert(0, (0, 0))
        ends = [start for _, start in entries[1:]] + [JAVA_LONG_MAX]
        epoch_list = [
            {"endOffset": end, "epoch": epoch, "startOffset": start}
            for (epoch, start), end in zip(entries, ends, strict=True)
        ]
        info = self.deps.statistics.runtime_info()
        body = {
            "brokerId": info.broker_id,
            "brokerName": info.broker_name,
            "clusterName": info.cluster_name,
            "epochList": epoch_list,
            "maxOffset": info.commit_log_max_offset,
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def cold_data_info(self, connection: Connection, request: Command) -> Command:
        """2003: as Apache's ColdDataCgCtrService with the feature off (no group throttled)."""
        body = {
            "cgColdReadThreshold": CG_COLD_READ_THRESHOLD,
            "configTable": {},
            "globalAcc": 0,
            "globalColdReadThreshold": GLOBAL_COLD_READ_THRESHOLD,
            "runtimeTable": {},
        }
        return request.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def no_cold_data_control(self, connection: Connection, request: Command) -> Command:
        return request.answer(codes.SYSTEM_ERROR, NO_COLD_DATA_CONTROL)

    async def no_acl2(self, connection: Connection, request: Command) -> Command:
        return request.answer(codes.SYSTEM_ERROR, NO_ACL2.format(code=request.code))


def handlers(deps: Deps) -> dict[int, Handler]:
    d = Diagnostics(deps)
    table: dict[int, Callable[[Connection, Command], Awaitable[Command]]] = {
        codes.GET_BROKER_CONSUME_STATS: d.broker_consume_stats,
        codes.QUERY_CONSUME_QUEUE: d.query_consume_queue,
        codes.GET_BROKER_HA_STATUS: d.ha_status,
        codes.GET_BROKER_EPOCH_CACHE: d.epoch_cache,
        codes.GET_COLD_DATA_FLOW_CTR_INFO: d.cold_data_info,
        codes.UPDATE_COLD_DATA_FLOW_CTR_CONFIG: d.no_cold_data_control,
        codes.REMOVE_COLD_DATA_FLOW_CTR_CONFIG: d.no_cold_data_control,
        codes.AUTH_CREATE_USER: d.no_acl2,
        codes.AUTH_UPDATE_USER: d.no_acl2,
        codes.AUTH_DELETE_USER: d.no_acl2,
        codes.AUTH_GET_USER: d.no_acl2,
        codes.AUTH_LIST_USER: d.no_acl2,
        codes.AUTH_CREATE_ACL: d.no_acl2,
        codes.AUTH_UPDATE_ACL: d.no_acl2,
        codes.AUTH_DELETE_ACL: d.no_acl2,
        codes.AUTH_GET_ACL: d.no_acl2,
        codes.AUTH_LIST_ACL: d.no_acl2,
    }
    return {code: convert.answering_errors(fn, deps.gate) for code, fn in table.items()}
