"""Mapping between `ferry.v1` name-server messages and the route-table domain."""

from __future__ import annotations

from collections.abc import Callable

from ferry.model import DataVersion
from ferry.runtime.errors import InvalidArgument
from ferry.v1 import common_pb2, namesrv_pb2
from ferry.wire import body_crc32
from services.namesrv.routes import (
    GRPC,
    LiveBroker,
    QueueData,
    RegisterResult,
    Registration,
    Route,
    RouteTable,
    TopicQueues,
)


def data_version(msg: common_pb2.DataVersion) -> DataVersion:
    return DataVersion(msg.timestamp, msg.counter, msg.state_version)


def data_version_pb(dv: DataVersion) -> common_pb2.DataVersion:
    return common_pb2.DataVersion(
        timestamp=dv.timestamp, counter=dv.counter, state_version=dv.state_version
    )


def registration(req: namesrv_pb2.RegisterBrokerRequest) -> Registration:
    if req.body_crc32 and body_crc32(req.body) != req.body_crc32:
        raise InvalidArgument(
            "body_crc32", "crc32 not match: the body was changed or truncated in transit"
        )
    if req.heartbeat_timeout_ms < 0:
        raise InvalidArgument("heartbeat_timeout_ms", f"{req.heartbeat_timeout_ms} is negative")
    topics = None
    dv = DataVersion()
    if req.HasField("body") and req.body.HasField("topic_config"):
        wrapper = req.body.topic_config
        dv = data_version(wrapper.data_version)
        topics = {}
        for name, tc in wrapper.topic_config_table.items():
            if tc.topic_name and tc.topic_name != name:
                raise InvalidArgument(
                    f"body.topic_config.topic_config_table[{name[:40]!r}].topic_name",
                    f"{tc.topic_name[:40]!r} differs from its key",
                )
            topics[name] = TopicQueues(
                tc.read_queue_nums,
                tc.write_queue_nums,
                tc.perm,
                tc.topic_sys_flag,
                tuple(sorted(tc.attributes.items())) if tc.attributes else (),
            )
    return Registration(
        cluster_name=req.cluster_name,
        broker_addr=req.broker_addr,
        broker_name=req.broker_name,
        broker_id=req.broker_id,
        ha_server_addr=req.ha_server_addr,
        data_version=dv,
        topics=topics,
        filter_servers=tuple(req.body.filter_server_list),
        heartbeat_timeout_s=req.heartbeat_timeout_ms / 1000.0,
        instance_id=req.instance_id,
        broker_role=req.broker_role,
        metrics_addr=req.metrics_addr,
        incremental=req.incremental,
        epoch=req.epoch,
        remoting_addr=req.remoting_addr,
    )


def register_response(
    result: RegisterResult, kv_table: dict[str, str]
) -> namesrv_pb2.RegisterBrokerResponse:
    return namesrv_pb2.RegisterBrokerResponse(
        master_addr=result.master_addr,
        ha_server_addr=result.ha_server_addr,
        kv_table=kv_table,
        topic_config_applied=result.topic_config_applied,
    )


def _queue_data_pb(q: QueueData) -> common_pb2.QueueData:
    return common_pb2.QueueData(
        broker_name=q.broker_name,
        read_queue_nums=q.read_queue_nums,
        write_queue_nums=q.write_queue_nums,
        perm=q.perm,
        topic_sys_flag=q.topic_sys_flag,
        attributes=dict(q.attributes),
    )


def route_pb(
    route: Route, remoting_of: Callable[[str], str] | None = None
) -> common_pb2.TopicRouteData:
    """`route` as ferry.v1 gives it; `remoting_of(addr)`, when given, is the
    RocketMQ-protocol address of the broker at gRPC address `addr` ("" for none)."""
    msg = common_pb2.TopicRouteData(
        queue_datas=[_queue_data_pb(q) for q in route.queue_datas],
        broker_datas=[
            common_pb2.BrokerData(
                cluster=g.cluster,
                broker_name=g.broker_name,
                broker_addrs=g.broker_addrs,
                remoting_addrs={i: r for i, a in g.broker_addrs.items() if (r := remoting_of(a))}
                if remoting_of is not None
                else {},
            )
            for g in route.broker_datas
        ],
    )
    for addr, servers in route.filter_servers.items():
        msg.filter_server_table[addr].filter_servers.extend(servers)
    return msg


def _live_pb(live: LiveBroker) -> namesrv_pb2.BrokerLiveInfo:
    return namesrv_pb2.BrokerLiveInfo(
        cluster_name=live.cluster_name,
        broker_name=live.broker_name,
        broker_id=live.broker_id,
        last_update_timestamp=live.last_update_wall_ms,
        heartbeat_timeout_ms=int(live.heartbeat_timeout_s * 1000),
        data_version=data_version_pb(live.data_version),
        ha_server_addr=live.ha_server_addr,
        broker_role=live.broker_role,
        metrics_addr=live.metrics_addr,
        instance_id=live.instance_id,
        keep_alive=live.keep_alive,
        epoch=live.epoch,
    )


def cluster_info_pb(routes: RouteTable) -> namesrv_pb2.ClusterInfo:
    """The cluster as ferry.v1 clients see it: brokers with a gRPC address only
    (a RocketMQ broker registered through RocketMQ's protocol has none)."""
    groups, clusters = routes.cluster_view(GRPC)
    msg = namesrv_pb2.ClusterInfo()
    for name, group in groups.items():
        entry = msg.broker_addr_table[name]
        entry.cluster = group.cluster
        entry.broker_name = group.broker_name
        entry.broker_addrs.update(group.broker_addrs)
        if group.epoch:
            msg.group_epoch_table[name] = group.epoch
    for cluster, names in clusters.items():
        msg.cluster_addr_table[cluster].broker_names.extend(names)
    for addr, live in routes.live.items():
        if live.address(GRPC):
            msg.broker_live_table[addr].CopyFrom(_live_pb(live))
    return msg
