"""Builders for requests used across tests and benchmarks."""

from __future__ import annotations

from ferry.v1 import common_pb2, namesrv_pb2
from ferry.wire import body_crc32


def register_request(
    broker_name: str = "broker-a",
    broker_id: int = 0,
    addr: str = "127.0.0.1:10911",
    topics: dict[str, int] | None = None,
    counter: int = 1,
    cluster: str = "DefaultCluster",
    ha_addr: str = "127.0.0.1:10912",
    instance_id: str = "",
    with_crc: bool = True,
    **fields,
) -> namesrv_pb2.RegisterBrokerRequest:
    """A RegisterBroker request; `topics` maps topic -> queue count (perm 6)."""
    topics = {"TopicTest": 4} if topics is None else topics
    wrapper = common_pb2.TopicConfigSerializeWrapper(
        data_version=common_pb2.DataVersion(timestamp=1000 + counter, counter=counter)
    )
    for name, queues in topics.items():
        wrapper.topic_config_table[name].CopyFrom(
            common_pb2.TopicConfig(
                topic_name=name, read_queue_nums=queues, write_queue_nums=queues, perm=6
            )
        )
    body = namesrv_pb2.RegisterBrokerBody(topic_config=wrapper)
    request = namesrv_pb2.RegisterBrokerRequest(
        cluster_name=cluster,
        broker_addr=addr,
        broker_name=broker_name,
        broker_id=broker_id,
        ha_server_addr=ha_addr,
        body=body,
        instance_id=instance_id,
        **fields,
    )
    if with_crc:
        request.body_crc32 = body_crc32(body)
    return request
