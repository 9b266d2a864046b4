"""The rules send, pull, pop and delayed delivery share, and nothing that needs the
store: the lookups they read topics, groups and committed offsets through
(protocols the metadata tables implement), where a delayed or timed message goes
when due, and RocketMQ's tag sub-expressions.

Pure functions and protocols: no I/O, no logging, no state.
"""

from __future__ import annotations

from typing import Protocol

from ferry import record
from ferry.model import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
)


class TopicLookup(Protocol):
    def get(self, topic: str) -> TopicConfig | None: ...


class GroupLookup(Protocol):
    def get(self, group: str) -> SubscriptionGroupConfig | None: ...


class OffsetTable(Protocol):
    """Committed offsets by (group, topic, queue): `consumerOffset.json`."""

    def query(self, group: str, topic: str, queue_id: int) -> int | None: ...

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...


def real_destination(properties: dict[str, str], topics: TopicLookup) -> tuple[str, int] | None:
    """Take REAL_TOPIC / REAL_QID (where a delayed or timed message goes when
    due) out of `properties`: the topic and a queue id within its write queues
    (wrapped when the topic shrank meanwhile), or None when the topic is gone."""
    topic = properties.pop(PROPERTY_REAL_TOPIC, "")
    raw_queue = properties.pop(PROPERTY_REAL_QUEUE_ID, "0")
    config = topics.get(topic)
    if config is None:
        return None
    try:
        queue_id = int(raw_queue)
    except ValueError:
        queue_id = 0
    count = config.write_queue_nums
    if count and not 0 <= queue_id < count:
        queue_id %= count
    return topic, queue_id


def parse_sub_expression(expression: str) -> frozenset[int] | None:
    """RocketMQ's tag expression `a || b`: the tag hashes to keep, None for all.
    Empty pieces are skipped, as Apache's FilterAPI skips them (`a |||| b` is
    `a || b`); an expression of nothing but separators keeps no tag at all."""
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = [t.strip() for t in text.split("||")]
    return frozenset(record.tags_hash(t) for t in tags if t)
