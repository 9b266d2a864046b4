"""Mapping between RocketMQ-protocol name-server requests (header fields and
JSON bodies, as RocketMQ 4.9 writes them) and the route-table domain; the
RocketMQ-protocol twin of `convert.py`. Pure: no I/O, no logging.

Bodies out are compact standard JSON with quoted keys, fields in alphabetical
order and maps sorted, for every client version (`ferry.remoting.bodies`:
the Go client splits `brokerAddrs` on "," and ":", so no spaces). Bodies in
go through `ferry.remoting.bodies.loads` and are type-checked field by field:
anything else is a `BodyError` naming the field, and nothing is applied.

RegisterBrokerBody comes in two forms (header `compressed`):
* JSON: `{"filterServerList":[...],"topicConfigSerializeWrapper":
  {"dataVersion":{"counter":n,"timestamp":ms},"topicConfigTable":{name:
  {"perm":6,"readQueueNums":4,"topicName":name,"topicSysFlag":0,
  "writeQueueNums":4,...}}}}`;
* compressed: zlib of int32 length + DataVersion JSON, int32 topic count,
  then per topic int32 length + "name read write perm filterType" (space
  separated, no topicSysFlag), then int32 length + the filter-server list
  as JSON. Integers big-endian.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from ferry.model import DataVersion
from ferry.remoting import bodies
from ferry.remoting.bodies import BodyError
from ferry.remoting.headers import INT32, boolean, integer, text
from services.namesrv.routes import REMOTING, BrokerGroup, Registration, Route, TopicQueues

# What a 4.9 broker assumes for a TopicConfig field it did not write.
DEFAULT_QUEUE_NUMS = 16
DEFAULT_PERM = 6
# A compressed registration inflates to at most this (100,000 topics are ~6 MB).
MAX_INFLATED = 64 * 1024 * 1024
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
_I32 = struct.Struct(">i")


class CrcMismatch(Exception):
    """bodyCrc32 does not match the body: it changed in transit."""


# ---------------------------------------------------------------- out


def route_json(route: Route, order_topic_conf: str | None = None) -> bytes:
    """TopicRouteData (105). `orderTopicConf` only when set."""
    doc: dict[str, Any] = {
        "brokerDatas": [_broker_data(g) for g in sorted(route.broker_datas, key=_name)],
        "filterServerTable": {
            a: list(route.filter_servers[a]) for a in sorted(route.filter_servers)
        },
    }
    if order_topic_conf:
        doc["orderTopicConf"] = order_topic_conf
    doc["queueDatas"] = [
        {
            "brokerName": q.broker_name,
            "perm": q.perm,
            "readQueueNums": q.read_queue_nums,
            "topicSysFlag": q.topic_sys_flag,
            "writeQueueNums": q.write_queue_nums,
        }
        for q in sorted(route.queue_datas, key=lambda q: q.broker_name)
    ]
    return bodies.dumps(doc)


def cluster_info_json(
    groups: Mapping[str, BrokerGroup], clusters: Mapping[str, list[str]]
) -> bytes:
    """ClusterInfo (106)."""
    return bodies.dumps(
        {
            "brokerAddrTable": {name: _broker_data(groups[name]) for name in sorted(groups)},
            "clusterAddrTable": {c: sorted(clusters[c]) for c in sorted(clusters)},
        }
    )


def topic_list_json(topics: Iterable[str]) -> bytes:
    """TopicList (206, 224): no `brokerAddr` (fastjson leaves a null out)."""
    return bodies.dumps({"topicList": sorted(topics)})


def kv_table_json(table: Mapping[str, str]) -> bytes:
    """KVTable (219, and the body of a 103 answer)."""
    return bodies.dumps({"table": {k: table[k] for k in sorted(table)}})


def data_version_json(dv: DataVersion) -> bytes:
    """DataVersion as 4.9 writes it; `stateVersion` (5.x) only when set."""
    doc: dict[str, int] = {"counter": dv.counter}
    if dv.state_version:
        doc["stateVersion"] = dv.state_version
    doc["timestamp"] = dv.timestamp
    return bodies.dumps(doc)


def _broker_data(group: BrokerGroup) -> dict[str, Any]:
    return {
        "brokerAddrs": {str(i): group.broker_addrs[i] for i in sorted(group.broker_addrs)},
        "brokerName": group.broker_name,
        "cluster": group.cluster,
    }


def _name(group: BrokerGroup) -> str:
    return group.broker_name


# ---------------------------------------------------------------- in


def registration(ext: Mapping[str, str], body: bytes, instance_id: str = "") -> Registration:
    """A REGISTER_BROKER request (103) as a Registration through RocketMQ's
    protocol. Raises headers.BadRequest for a header field, CrcMismatch, BodyError."""
    broker_addr = text(ext, "brokerAddr")
    crc = integer(ext, "bodyCrc32", required=False, low=INT32[0], high=INT32[1])
    compressed = boolean(ext, "compressed")
    heartbeat_ms = integer(ext, "heartbeatTimeoutMillis", required=False, low=0)
    registration_fields = {
        "cluster_name": text(ext, "clusterName"),
        "broker_name": text(ext, "brokerName"),
        "broker_id": integer(ext, "brokerId", low=0),
        "ha_server_addr": text(ext, "haServerAddr", required=False),
    }
    # Apache checks only a non-zero CRC, over the body as sent.
    if crc and zlib.crc32(body) & 0x7FFFFFFF != crc:
        raise CrcMismatch()
    data_version, topics, filter_servers = DataVersion(), None, ()
    if body:
        data_version, topics, filter_servers = register_body(body, compressed)
    return Registration(
        broker_addr=broker_addr,
        data_version=data_version,
        topics=topics,
        filter_servers=filter_servers,
        heartbeat_timeout_s=heartbeat_ms / 1000.0,
        instance_id=instance_id,
        remoting_addr=broker_addr,
        protocol=REMOTING,
        replace_topics=False,
        **registration_fields,
    )


def register_body(
    body: bytes, compressed: bool
) -> tuple[DataVersion, dict[str, TopicQueues] | None, tuple[str, ...]]:
    """(data version, topics or None when the body has no topic table, filter servers)."""
    if compressed:
        return _compressed_body(body)
    doc = bodies.loads(body)
    if not isinstance(doc, dict):
        raise BodyError(f"RegisterBrokerBody: expected a JSON object, got {_kind(doc)}")
    filter_servers = _filter_servers(doc.get("filterServerList"), "filterServerList")
    wrapper = doc.get("topicConfigSerializeWrapper")
    if wrapper is None:
        return DataVersion(), None, filter_servers
    field = "topicConfigSerializeWrapper"
    if not isinstance(wrapper, dict):
        raise BodyError(f"{field}: expected an object, got {_kind(wrapper)}")
    dv = data_version(wrapper.get("dataVersion"), f"{field}.dataVersion")
    table = wrapper.get("topicConfigTable")
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise BodyError(f"{field}.topicConfigTable: expected an object, got {_kind(table)}")
    topics = {
        name: _topic_config(name, tc, f"{field}.topicConfigTable") for name, tc in table.items()
    }
    return dv, topics, filter_servers


def data_version(value: Any, field: str = "dataVersion") -> DataVersion:
    """A DataVersion object (`counter`, `timestamp`, 5.x `stateVersion`);
    None (absent) is the zero version."""
    if value is None:
        return DataVersion()
    if not isinstance(value, dict):
        raise BodyError(f"{field}: expected an object, got {_kind(value)}")
    return DataVersion(
        timestamp=_int(value, "timestamp", field, 0),
        counter=_int(value, "counter", field, 0),
        state_version=_int(value, "stateVersion", field, 0),
    )


def data_version_body(body: bytes) -> DataVersion:
    """The body of QUERY_DATA_VERSION (322)."""
    if not body:
        raise BodyError("body: QUERY_DATA_VERSION needs the broker's DataVersion as JSON")
    return data_version(bodies.loads(body), "body")


def _topic_config(name: Any, tc: Any, field: str) -> TopicQueues:
    where = f"{field}[{str(name)[:40]!r}]"
    if not isinstance(tc, dict):
        raise BodyError(f"{where}: expected an object, got {_kind(tc)}")
    topic_name = tc.get("topicName")
    if topic_name is not None and topic_name != name:
        raise BodyError(f"{where}.topicName: {str(topic_name)[:40]!r} differs from its key")
    filter_type = tc.get("topicFilterType")
    if filter_type is not None and filter_type not in TOPIC_FILTER_TYPES:
        raise BodyError(
            f"{where}.topicFilterType: {str(filter_type)[:20]!r} is not one of {TOPIC_FILTER_TYPES}"
        )
    attributes = tc.get("attributes") or {}
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise BodyError(f"{where}.attributes: expected an object of strings")
    return TopicQueues(
        _int(tc, "readQueueNums", where, DEFAULT_QUEUE_NUMS, INT32),
        _int(tc, "writeQueueNums", where, DEFAULT_QUEUE_NUMS, INT32),
        _int(tc, "perm", where, DEFAULT_PERM, INT32),
        _int(tc, "topicSysFlag", where, 0, INT32),
        tuple(sorted(attributes.items())),
    )


def _filter_servers(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BodyError(f"{field}: expected a list of host:port strings")
    return tuple(value)


def _int(
    doc: dict, key: str, field: str, default: int, bounds: tuple[int, int] = (-(2**63), 2**63 - 1)
) -> int:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BodyError(f"{field}.{key}: expected an integer, got {_kind(value)}")
    if not bounds[0] <= value <= bounds[1]:
        raise BodyError(f"{field}.{key}: {value} is outside {bounds[0]}..{bounds[1]}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


# ---------------------------------------------------------------- compressed form


def _compressed_body(
    body: bytes,
) -> tuple[DataVersion, dict[str, TopicQueues], tuple[str, ...]]:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(body, MAX_INFLATED)
    except zlib.error as e:
        raise BodyError(f"body: compressed is true but the body is not zlib data ({e})") from None
    if inflater.unconsumed_tail:
        raise BodyError(f"body: inflates to more than {MAX_INFLATED} bytes")
    if not inflater.eof:
        raise BodyError("body: the zlib stream is truncated")
    reader = _Reader(data)
    dv = data_version(bodies.loads(reader.chunk("dataVersion")), "dataVersion")
    count = reader.int32("topic count")
    if count < 0 or count > len(data) // 4:
        raise BodyError(f"body: topic count {count} does not fit the {len(data)} inflated bytes")
    topics: dict[str, TopicQueues] = {}
    for i in range(count):
        line = reader.chunk(f"topic config #{i}")
        try:
            name, read, write, perm, filter_type = line.decode().split(" ")
            entry = (int(read), int(write), int(perm))
        except ValueError:
            raise BodyError(
                f"body: topic config #{i} is not 'name readQueueNums writeQueueNums perm "
                f"topicFilterType': {line[:80]!r}"
            ) from None
        if filter_type not in TOPIC_FILTER_TYPES:
            raise BodyError(
                f"body: topic config #{i}: {filter_type[:20]!r} is not one of {TOPIC_FILTER_TYPES}"
            )
        topics[name] = TopicQueues(*entry)
    filter_servers = _filter_servers(
        bodies.loads(reader.chunk("filterServerList")), "filterServerList"
    )
    if reader.remaining:
        raise BodyError(f"body: {reader.remaining} bytes after the filter-server list")
    return dv, topics, filter_servers


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def int32(self, what: str) -> int:
        if self.remaining < 4:
            raise BodyError(f"body: ends before the length of {what}")
        (value,) = _I32.unpack_from(self._data, self._pos)
        self._pos += 4
        return value

    def chunk(self, what: str) -> bytes:
        length = self.int32(what)
        if length < 0 or length > self.remaining:
            raise BodyError(f"body: {what} claims {length} bytes where {self.remaining} are left")
        value = bytes(self._data[self._pos : self._pos + length])
        self._pos += length
        return value
