"""The broker's versioned metadata tables (docs/reference/contract.md, "Store
files"), each a JSON file under `config/` in RocketMQ's own shape:

- `topics.json`            {"dataVersion": {...}, "topicConfigTable": {name: {...}}}
- `subscriptionGroup.json` {"dataVersion": {...}, "subscriptionGroupTable": {name: {...}}}
- `consumerOffset.json`    {"dataVersion": {...}, "offsetTable": {"topic@group": {"0": 12}}}
- `delayOffset.json`       {"dataVersion": {...}, "offsetTable": {"3": 5}}
- `broker.json`            {"dataVersion": {...}, "brokerConfig": {"brokerPermission": 4}}
- `metadataLog.json`       {"dataVersion": {...}, "metadataLog": {"applied": {"0": 3}, ...}}
- `messageRequestMode.json` {"dataVersion": {...}, "messageRequestModeMap": {topic: {group:
  {"consumerGroup", "mode", "popShareQueueNum", "topic"}}}} (RocketMQ 5's
  `mqadmin setConsumeMode`: how a push consumer asking for its queues consumes)
  (enableFailover only: see `MetadataLogTable`)

`broker.json` is ferry's counterpart of RocketMQ's `config/broker.properties`:
broker settings changed at run time (today only `brokerPermission`, by
UpdateBrokerPermission), keyed by their broker.conf names. They win over
broker.conf at the next start. The file is the broker's own: a slave keeps
its own permission, and slave sync never writes this file.

Every change bumps the table's DataVersion (timestamp = now, counter + 1).
Topics and subscription groups are written (atomically, the previous file
kept as `.bak`) before the change returns; consumer and delay offsets change
on every commit, so they are marked dirty and persisted every few seconds and
at shutdown, as RocketMQ does. A corrupt file falls back to its `.bak` with a
warning; both unusable stops startup naming the file.

Ownership: the event loop thread. Tables are replaced, never mutated in
place, so a snapshot handed out stays as it was.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ferry.model import (
    PERM_MAX,
    TOPIC_FILTER_TYPES,
    DataVersion,
    SubscriptionGroupConfig,
    TopicConfig,
    check_name,
    check_perm,
    check_queue_nums,
    check_topic,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import InvalidArgument, NotFound, ResourceExhausted, StorageFault
from ferry.runtime.files import load_json_with_backup, write_json_with_backup

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
DELAY_OFFSET_FILE = "delayOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
BROKER_SETTINGS_FILE = "broker.json"
METADATA_LOG_FILE = "metadataLog.json"
MESSAGE_REQUEST_MODE_FILE = "messageRequestMode.json"
REQUEST_MODES = ("PULL", "POP")


# ---------------------------------------------------------------- JSON shapes


def version_to_json(dv: DataVersion) -> dict[str, int]:
    return {"counter": dv.counter, "stateVersion": dv.state_version, "timestamp": dv.timestamp}


def version_from_json(doc: Any) -> DataVersion:
    if not isinstance(doc, dict):
        raise ValueError("dataVersion is not an object")
    return DataVersion(
        timestamp=int(doc.get("timestamp", 0)),
        counter=int(doc.get("counter", 0)),
        state_version=int(doc.get("stateVersion", 0)),
    )


def topic_to_json(t: TopicConfig) -> dict[str, Any]:
    return {
        "attributes": dict(t.attributes),
        "order": t.order,
        "perm": t.perm,
        "readQueueNums": t.read_queue_nums,
        "topicFilterType": t.topic_filter_type,
        "topicName": t.topic_name,
        "topicSysFlag": t.topic_sys_flag,
        "writeQueueNums": t.write_queue_nums,
    }


def topic_from_json(doc: Any) -> TopicConfig:
    if not isinstance(doc, dict) or not isinstance(doc.get("topicName"), str):
        raise ValueError("a topic entry needs a topicName")
    return TopicConfig(
        topic_name=doc["topicName"],
        read_queue_nums=int(doc.get("readQueueNums", 8)),
        write_queue_nums=int(doc.get("writeQueueNums", 8)),
        perm=int(doc.get("perm", 6)),
        topic_filter_type=str(doc.get("topicFilterType", "SINGLE_TAG")),
        topic_sys_flag=int(doc.get("topicSysFlag", 0)),
        order=bool(doc.get("order", False)),
        attributes=tuple(
            sorted((str(k), str(v)) for k, v in (doc.get("attributes") or {}).items())
        ),
    )


_GROUP_FIELDS = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
    "group_sys_flag": "groupSysFlag",
    "consume_message_orderly": "consumeMessageOrderly",
}


def group_to_json(g: SubscriptionGroupConfig) -> dict[str, Any]:
    doc: dict[str, Any] = {key: getattr(g, name) for name, key in _GROUP_FIELDS.items()}
    doc["attributes"] = dict(g.attributes)
    return doc


def group_from_json(doc: Any) -> SubscriptionGroupConfig:
    if not isinstance(doc, dict) or not isinstance(doc.get("groupName"), str):
        raise ValueError("a subscription group entry needs a groupName")
    defaults = SubscriptionGroupConfig("x")
    values: dict[str, Any] = {}
    for f in fields(SubscriptionGroupConfig):
        if f.name == "attributes":
            values[f.name] = tuple(
                sorted((str(k), str(v)) for k, v in (doc.get("attributes") or {}).items())
            )
            continue
        raw = doc.get(_GROUP_FIELDS[f.name], getattr(defaults, f.name))
        values[f.name] = type(getattr(defaults, f.name))(raw)
    return SubscriptionGroupConfig(**values)


# ---------------------------------------------------------------- tables


class _Table:
    """A JSON-backed table with a DataVersion."""

    file_name = ""
    table_key = ""

    def __init__(
        self, path: Path, clock: Clock, on_fault: Callable[[StorageFault], None] | None = None
    ) -> None:
        self.path = Path(path)
        self.clock = clock
        self.on_fault = on_fault  # the broker's fail-stop
        self.dirty = False
        doc, source = load_json_with_backup(self.path, self._validate)
        self.loaded_from = source
        if doc is None:
            self._version = DataVersion()
            self._table: dict[Any, Any] = {}
        else:
            self._version = version_from_json(doc.get("dataVersion", {}))
            self._table = self._decode(doc.get(self.table_key) or {})
            if source == "backup":
                self._write()  # restore the main file from the backup

    @property
    def data_version(self) -> DataVersion:
        return self._version

    def _validate(self, doc: Any) -> None:
        if not isinstance(doc, dict):
            raise ValueError("the document is not a JSON object")
        table = doc.get(self.table_key, {})
        if not isinstance(table, dict):
            raise ValueError(f"{self.table_key} is not an object")
        version_from_json(doc.get("dataVersion", {}))
        try:
            self._decode(table)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"bad entry in {self.table_key}: {exc}") from None

    def _decode(self, table: dict[str, Any]) -> dict[Any, Any]:
        raise NotImplementedError

    def _encode(self) -> dict[str, Any]:
        raise NotImplementedError

    def _bump(self) -> DataVersion:
        self._version = self._version.next(self.clock.wall_ms())
        return self._version

    def _write(self) -> None:
        """Write the file atomically.

        Raises:
            ResourceExhausted: the disk is full; the file on disk is unchanged.
            StorageFault: any other failure (after calling `on_fault`): what is
                on disk is not known any more, the broker stops.
        """
        try:
            write_json_with_backup(
                self.path,
                {"dataVersion": version_to_json(self._version), self.table_key: self._encode()},
            )
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceExhausted(
                    f"the broker's disk is full: {self.path.name} could not be saved ({exc}); "
                    "free space on the store's disk and try again"
                ) from exc
            fault = StorageFault("write", str(self.path), exc)
            if self.on_fault is not None:
                self.on_fault(fault)
            raise fault from exc
        self.dirty = False

    def _set_entry(self, key: Any, value: Any) -> DataVersion:
        """Put `value` under `key` (None: remove it) in a new table, bump the
        version and write the file."""
        table = dict(self._table)
        if value is None:
            del table[key]
        else:
            table[key] = value
        self._table = table
        version = self._bump()
        self._write()
        return version

    def persist(self) -> bool:
        """Write the file if anything changed since the last write."""
        if not self.dirty:
            return False
        self._write()
        return True


class TopicTable(_Table):
    file_name = TOPICS_FILE
    table_key = "topicConfigTable"

    def _decode(self, table: dict[str, Any]) -> dict[str, TopicConfig]:
        return {name: topic_from_json(doc) for name, doc in table.items()}

    def _encode(self) -> dict[str, Any]:
        return {name: topic_to_json(t) for name, t in sorted(self._table.items())}

    def get(self, topic: str) -> TopicConfig | None:
        return self._table.get(topic)

    def snapshot(self) -> tuple[dict[str, TopicConfig], DataVersion]:
        return dict(self._table), self._version

    def put(self, config: TopicConfig) -> DataVersion:
        """Create or update a topic (a put equal to the stored one still bumps,
        as RocketMQ's does); persisted before returning."""
        self.check(config)
        return self._set_entry(config.topic_name, config)

    @staticmethod
    def check(config: TopicConfig) -> None:
        """What `put` refuses (InvalidArgument), checked without changing anything."""
        check_topic(config.topic_name, "topic_config.topic_name")
        check_queue_nums(config.read_queue_nums, "topic_config.read_queue_nums")
        check_queue_nums(config.write_queue_nums, "topic_config.write_queue_nums")
        check_perm(config.perm, "topic_config.perm")
        if config.topic_filter_type not in TOPIC_FILTER_TYPES:
            raise InvalidArgument(
                "topic_config.topic_filter_type", f"{config.topic_filter_type!r} is unknown"
            )

    def delete(self, topic: str) -> DataVersion:
        if topic not in self._table:
            raise NotFound(f"topic {topic!r} does not exist on this broker")
        return self._set_entry(topic, None)

    def touch(self) -> DataVersion:
        """Bump the version without changing a topic: what registers changed
        permissions with the name servers (RocketMQ does the same when
        brokerPermission changes)."""
        version = self._bump()
        self._write()
        return version

    def ensure_system_topic(self, config: TopicConfig) -> None:
        if config.topic_name not in self._table:
            self.put(config)

    def replace_all(self, table: Mapping[str, TopicConfig], version: DataVersion) -> None:
        """Slave sync: swap in the master's table and adopt its version."""
        self._table = dict(table)
        self._version = version
        self._write()


class SubscriptionGroupTable(_Table):
    file_name = SUBSCRIPTION_GROUP_FILE
    table_key = "subscriptionGroupTable"

    def _decode(self, table: dict[str, Any]) -> dict[str, SubscriptionGroupConfig]:
        return {name: group_from_json(doc) for name, doc in table.items()}

    def _encode(self) -> dict[str, Any]:
        return {name: group_to_json(g) for name, g in sorted(self._table.items())}

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def snapshot(self) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion]:
        return dict(self._table), self._version

    def put(self, config: SubscriptionGroupConfig) -> DataVersion:
        self.check(config)
        return self._set_entry(config.group_name, config)

    @staticmethod
    def check(config: SubscriptionGroupConfig) -> None:
        """What `put` refuses (InvalidArgument), checked without changing anything."""
        check_name(config.group_name, "config.group_name")
        for name in ("retry_queue_nums", "retry_max_times", "broker_id"):
            if getattr(config, name) < 0:
                raise InvalidArgument(f"config.{name}", f"{getattr(config, name)} is negative")

    def delete(self, group: str) -> DataVersion:
        if group not in self._table:
            raise NotFound(f"subscription group {group!r} does not exist on this broker")
        return self._set_entry(group, None)

    def replace_all(
        self, table: Mapping[str, SubscriptionGroupConfig], version: DataVersion
    ) -> None:
        self._table = dict(table)
        self._version = version
        self._write()


class ConsumerOffsetTable(_Table):
    file_name = CONSUMER_OFFSET_FILE
    table_key = "offsetTable"

    def _decode(self, table: dict[str, Any]) -> dict[str, dict[int, int]]:
        out = {}
        for key, queues in table.items():
            if "@" not in key or not isinstance(queues, dict):
                raise ValueError(f"offset key {key!r} is not topic@group with a queue map")
            out[key] = {int(q): int(o) for q, o in queues.items()}
        return out

    def _encode(self) -> dict[str, Any]:
        return {
            key: {str(q): o for q, o in sorted(queues.items())}
            for key, queues in sorted(self._table.items())
        }

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}@{group}"
        queues = dict(self._table.get(key, {}))
        queues[queue_id] = offset
        table = dict(self._table)
        table[key] = queues
        self._table = table
        self._bump()
        self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._table.get(f"{topic}@{group}", {}).get(queue_id)

    def snapshot(self) -> tuple[dict[str, dict[int, int]], DataVersion]:
        return {k: dict(v) for k, v in self._table.items()}, self._version

    def topics_of(self, group: str) -> list[str]:
        """The topics the group has committed offsets for (RocketMQ's whichTopicByConsumer)."""
        suffix = "@" + group
        return sorted(k[: -len(suffix)] for k in self._table if k.endswith(suffix))

    def groups_of(self, topic: str) -> list[str]:
        """The groups with committed offsets for the topic (RocketMQ's whichGroupByTopic)."""
        prefix = topic + "@"
        return sorted(k[len(prefix) :] for k in self._table if k.startswith(prefix))

    def merge_max(self, table: Mapping[str, Mapping[int, int]], version: DataVersion) -> None:
        """Slave sync: the highest offset wins per (topic@group, queue)."""
        merged = {k: dict(v) for k, v in self._table.items()}
        for key, queues in table.items():
            mine = merged.setdefault(key, {})
            for queue_id, offset in queues.items():
                if offset > mine.get(queue_id, -1):
                    mine[queue_id] = offset
        self._table = merged
        self._version = version
        self._write()

    def remove_topic(self, topic: str) -> None:
        self._remove(lambda key: key.split("@", 1)[0] == topic)

    def remove_group(self, group: str) -> None:
        self._remove(lambda key: key.split("@", 1)[1] == group)

    def _remove(self, match) -> None:
        keep = {k: v for k, v in self._table.items() if not match(k)}
        if len(keep) != len(self._table):
            self._table = keep
            self._bump()
            self._write()


@dataclass(frozen=True, slots=True)
class RequestMode:
    """How one group consumes one topic through RocketMQ 5's server-side assignment
    (SetMessageRequestModeRequestBody): PULL or POP, and for POP how many other
    consumers' queues each consumer shares (≤ 0: every queue)."""

    topic: str
    group: str
    mode: str = "PULL"
    pop_share_queue_num: int = 0

    def to_json(self) -> dict[str, Any]:
        # fastjson's order: keys sorted
        return {
            "consumerGroup": self.group,
            "mode": self.mode,
            "popShareQueueNum": self.pop_share_queue_num,
            "topic": self.topic,
        }


class MessageRequestModeTable(_Table):
    file_name = MESSAGE_REQUEST_MODE_FILE
    table_key = "messageRequestModeMap"

    def _decode(self, table: dict[str, Any]) -> dict[tuple[str, str], RequestMode]:
        out = {}
        for topic, groups in table.items():
            if not isinstance(groups, dict):
                raise ValueError(f"the modes of topic {topic!r} are not an object")
            for group, doc in groups.items():
                mode = str(doc.get("mode", "PULL"))
                if mode not in REQUEST_MODES:
                    raise ValueError(f"mode {mode!r} of {topic}/{group} is not PULL or POP")
                out[(topic, group)] = RequestMode(
                    topic, group, mode, int(doc.get("popShareQueueNum", 0))
                )
        return out

    def _encode(self) -> dict[str, Any]:
        out: dict[str, dict[str, Any]] = {}
        for (topic, group), mode in sorted(self._table.items()):
            out.setdefault(topic, {})[group] = mode.to_json()
        return out

    def get(self, topic: str, group: str) -> RequestMode | None:
        return self._table.get((topic, group))

    def put(self, mode: RequestMode) -> DataVersion:
        if mode.mode not in REQUEST_MODES:
            raise ValueError(f"mode {mode.mode!r} is not PULL or POP")
        return self._set_entry((mode.topic, mode.group), mode)

    def as_json(self) -> dict[str, Any]:
        """GET_ALL_MESSAGE_REQUEST_MODE's body (what a RocketMQ slave copies)."""
        return {"messageRequestModeMap": self._encode()}

    def replace_all(self, table: Mapping[tuple[str, str], RequestMode]) -> None:
        self._table = dict(table)
        self._bump()
        self._write()


class DelayOffsetTable(_Table):
    file_name = DELAY_OFFSET_FILE
    table_key = "offsetTable"

    def _decode(self, table: dict[str, Any]) -> dict[int, int]:
        return {int(level): int(offset) for level, offset in table.items()}

    def _encode(self) -> dict[str, Any]:
        return {str(level): offset for level, offset in sorted(self._table.items())}

    def get(self, level: int) -> int:
        return self._table.get(level, 0)

    def set(self, level: int, offset: int) -> None:
        table = dict(self._table)
        table[level] = offset
        self._table = table
        self._bump()
        self.dirty = True

    def snapshot(self) -> tuple[dict[int, int], DataVersion]:
        return dict(self._table), self._version

    def replace_all(self, table: Mapping[int, int], version: DataVersion) -> None:
        self._table = dict(table)
        self._version = version
        self._write()


class MetadataLogTable(_Table):
    """`metadataLog.json` (enableFailover, services.broker.metadata.metadata_log): how
    far this broker has applied the metadata log's two queues (topics,
    subscription groups), and the topics that log deleted (never restored
    from messages that recovery dispatched again). Written atomically after
    each applied batch; a crash in between applies a batch twice, which
    changes nothing (every record is a whole put or a delete)."""

    file_name = METADATA_LOG_FILE
    table_key = "metadataLog"

    def _decode(self, table: dict[str, Any]) -> dict[str, Any]:
        applied = table.get("applied", {})
        deleted = table.get("deletedTopics", [])
        if not isinstance(applied, dict) or not isinstance(deleted, list):
            raise ValueError("applied must be an object and deletedTopics a list")
        return {
            "applied": {int(q): int(o) for q, o in applied.items()},
            "deletedTopics": sorted(str(t) for t in deleted),
        }

    def _encode(self) -> dict[str, Any]:
        return {
            "applied": {str(q): o for q, o in sorted(self._table.get("applied", {}).items())},
            "deletedTopics": list(self._table.get("deletedTopics", [])),
        }

    def applied(self, queue_id: int) -> int:
        return self._table.get("applied", {}).get(queue_id, 0)

    @property
    def deleted_topics(self) -> frozenset[str]:
        return frozenset(self._table.get("deletedTopics", ()))

    def set(self, applied: Mapping[int, int], deleted: frozenset[str] | None = None) -> None:
        """Record positions (and the deleted topics); persisted before returning."""
        table = {
            "applied": {**self._table.get("applied", {}), **applied},
            "deletedTopics": sorted(self.deleted_topics if deleted is None else deleted),
        }
        if table == self._table:
            return
        self._table = table
        self._bump()
        self._write()


class BrokerSettingsTable(_Table):
    """`broker.json`: settings changed at run time, keyed by their broker.conf
    names; a setting absent here is broker.conf's. Only `brokerPermission` so
    far: an unknown key or a value out of range makes the file corrupt (a hand
    edit that would otherwise be ignored without a word)."""

    file_name = BROKER_SETTINGS_FILE
    table_key = "brokerConfig"

    def _decode(self, table: dict[str, Any]) -> dict[str, int]:
        for key, value in table.items():
            if key != "brokerPermission":
                raise ValueError(f"unknown setting {key!r} (known: brokerPermission)")
            if type(value) is not int or not 0 <= value <= PERM_MAX:
                raise ValueError(f"brokerPermission {value!r} is not an integer in 0..{PERM_MAX}")
        return dict(table)

    def _encode(self) -> dict[str, Any]:
        return dict(sorted(self._table.items()))

    @property
    def broker_permission(self) -> int | None:
        """The persisted permission, or None when broker.conf's applies."""
        return self._table.get("brokerPermission")

    def set_broker_permission(self, perm: int) -> DataVersion:
        """Persist `perm` (written and fsynced before returning). A failed
        write raises and leaves the table as it was."""
        check_perm(perm, "broker_permission")
        before = self._table, self._version
        self._table = {**self._table, "brokerPermission": perm}
        version = self._bump()
        try:
            self._write()
        except BaseException:
            self._table, self._version = before
            raise
        return version


class BrokerMetadata:
    """The tables of one broker."""

    def __init__(
        self,
        topics: TopicTable,
        consumer_offsets: ConsumerOffsetTable,
        delay_offsets: DelayOffsetTable,
        subscription_groups: SubscriptionGroupTable,
        settings: BrokerSettingsTable,
        request_modes: MessageRequestModeTable,
    ) -> None:
        self.topics = topics
        self.consumer_offsets = consumer_offsets
        self.delay_offsets = delay_offsets
        self.subscription_groups = subscription_groups
        self.settings = settings
        self.request_modes = request_modes

    @classmethod
    def open(
        cls,
        config_dir: Path,
        clock: Clock,
        on_fault: Callable[[StorageFault], None] | None = None,
    ) -> BrokerMetadata:
        """Load every table; `on_fault` (the broker's fail-stop) hears of a
        write that failed for another reason than a full disk."""
        config_dir = Path(config_dir)
        config_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            TopicTable(config_dir / TOPICS_FILE, clock, on_fault),
            ConsumerOffsetTable(config_dir / CONSUMER_OFFSET_FILE, clock, on_fault),
            DelayOffsetTable(config_dir / DELAY_OFFSET_FILE, clock, on_fault),
            SubscriptionGroupTable(config_dir / SUBSCRIPTION_GROUP_FILE, clock, on_fault),
            BrokerSettingsTable(config_dir / BROKER_SETTINGS_FILE, clock, on_fault),
            MessageRequestModeTable(config_dir / MESSAGE_REQUEST_MODE_FILE, clock, on_fault),
        )

    def persist_all(self) -> None:
        self.consumer_offsets.persist()
        self.delay_offsets.persist()
