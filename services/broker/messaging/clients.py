"""Who is connected: the producer and consumer groups clients announce in their
heartbeats, each member's subscriptions, and when each was last heard from
(RocketMQ's ProducerManager and ConsumerManager).

A member is a client id within a group, reached through an opaque channel
handle (the protocol adapter's connection; this module never looks inside it).
A client that reconnects heartbeats again from its new channel, which replaces
the old one. Members leave when they unregister, when their channel closes, or
when they have been silent for `expire_after_s` (RocketMQ: 120 s; clients
heartbeat every 30 s). Every change that a group's consumers must rebalance on
— a member joining or leaving, a topic subscribed or dropped, an expression
changed — is reported as the group's name, so the adapter can tell the
remaining members (NOTIFY_CONSUMER_IDS_CHANGED).

Pure tables: time is an argument (`now`, monotonic seconds), nothing here does
I/O, logs or awaits. Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

EXPIRE_AFTER_S = 120.0  # RocketMQ's ClientHousekeepingService channel expiry

TAG = "TAG"
SQL92 = "SQL92"


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic a consumer reads, and how it filters it (RocketMQ's
    SubscriptionData). `expression` is the client's text (`TagA || TagB`,
    `*`); `version` (subVersion) grows each time the client subscribes anew."""

    topic: str
    expression: str = "*"
    expression_type: str = TAG
    tags: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()
    version: int = 0

    def same_filter(self, other: Subscription) -> bool:
        return (self.expression, self.expression_type, self.tags) == (
            other.expression,
            other.expression_type,
            other.tags,
        )


@dataclass(frozen=True, slots=True)
class ConsumerData:
    """One consumer group of a heartbeat."""

    group: str
    subscriptions: tuple[Subscription, ...] = ()
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    # Heartbeat v2 (RocketMQ 5.x clients with com.rocketmq.heartbeat.v2): the client's
    # fingerprint of its heartbeat (0: a v1 heartbeat), and whether this one leaves the
    # subscriptions out because the broker has them (the member keeps what it had).
    fingerprint: int = 0
    without_sub: bool = False


@dataclass(slots=True)
class Member:
    client_id: str
    channel: Hashable
    last_seen: float
    language: str = ""
    version: int = 0
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""


@dataclass(frozen=True, slots=True)
class Expired:
    """What `ClientTables.expire` removed: consumer groups that changed (their
    remaining members must rebalance) and the channels nothing was heard on."""

    groups: tuple[str, ...] = ()
    channels: tuple[Hashable, ...] = ()


class ClientTables:
    def __init__(self, expire_after_s: float = EXPIRE_AFTER_S) -> None:
        self.expire_after_s = expire_after_s
        self._consumers: dict[str, dict[str, Member]] = {}  # group -> client id -> member
        self._producers: dict[str, dict[str, Member]] = {}
        self._fingerprints: dict[str, int] = {}  # group -> its last heartbeat's fingerprint

    # ------------------------------------------------------------ changes

    def heartbeat(
        self,
        client_id: str,
        channel: Hashable,
        now: float,
        consumers: Sequence[ConsumerData] = (),
        producer_groups: Iterable[str] = (),
        language: str = "",
        version: int = 0,
    ) -> list[str]:
        """Record a heartbeat; returns the consumer groups whose members or
        subscriptions changed with it."""
        changed = []
        for data in consumers:
            members = self._consumers.setdefault(data.group, {})
            member = members.get(client_id)
            subscriptions = {s.topic: s for s in data.subscriptions}
            if member is None:
                member = members[client_id] = Member(client_id, channel, now)
                changed.append(data.group)
            elif data.without_sub:
                subscriptions = member.subscriptions
            elif _filters_differ(member.subscriptions, subscriptions):
                changed.append(data.group)
            member.channel = channel
            member.last_seen = now
            member.language, member.version = language, version
            member.subscriptions = subscriptions
            member.consume_type = data.consume_type
            member.message_model = data.message_model
            member.consume_from_where = data.consume_from_where
        for group in producer_groups:
            members = self._producers.setdefault(group, {})
            member = members.get(client_id)
            if member is None:
                members[client_id] = Member(client_id, channel, now, language, version)
            else:
                member.channel, member.last_seen = channel, now
        return changed

    def fingerprint_changed(self, group: str, fingerprint: int) -> bool:
        """Record a group's heartbeat fingerprint (heartbeat v2); True when the group
        had another one (a member's subscriptions may have changed), as Apache's
        broker keeps them: one per group, 0 for a v1 heartbeat."""
        before = self._fingerprints.get(group)
        self._fingerprints[group] = fingerprint
        return before is not None and before != fingerprint

    def unregister(
        self, client_id: str, producer_group: str = "", consumer_group: str = ""
    ) -> list[str]:
        """A client leaving its groups (UNREGISTER_CLIENT); returns the
        consumer group that changed, if any."""
        if producer_group:
            _remove(self._producers, producer_group, client_id)
        if consumer_group and _remove(self._consumers, consumer_group, client_id):
            return [consumer_group]
        return []

    def channel_closed(self, channel: Hashable) -> list[str]:
        """Forget every registration made through `channel`; returns the
        consumer groups that changed."""
        self._drop(self._producers, lambda m: m.channel == channel)
        return self._drop(self._consumers, lambda m: m.channel == channel)

    def expire(self, now: float) -> Expired:
        """Forget members silent for longer than `expire_after_s`."""
        deadline = now - self.expire_after_s
        silent_channels: dict[Hashable, None] = {}

        def silent(member: Member) -> bool:
            if member.last_seen < deadline:
                silent_channels[member.channel] = None
                return True
            return False

        self._drop(self._producers, silent)
        groups = self._drop(self._consumers, silent)
        # A channel still carrying a live registration stays open.
        live = {
            m.channel
            for table in (self._consumers, self._producers)
            for members in table.values()
            for m in members.values()
        }
        return Expired(tuple(groups), tuple(c for c in silent_channels if c not in live))

    @staticmethod
    def _drop(table: dict[str, dict[str, Member]], gone) -> list[str]:
        changed = []
        for group in list(table):
            members = table[group]
            leaving = [cid for cid, m in members.items() if gone(m)]
            for cid in leaving:
                del members[cid]
            if leaving:
                changed.append(group)
            if not members:
                del table[group]
        return changed

    # ------------------------------------------------------------ reads

    def consumer_ids(self, group: str) -> list[str]:
        """The group's members, sorted (every broker a group heartbeats to
        answers alike)."""
        return sorted(self._consumers.get(group, {}))

    def is_member(self, group: str, client_id: str) -> bool:
        return client_id in self._consumers.get(group, {})

    def consumers(self, group: str) -> list[Member]:
        return [m for _, m in sorted(self._consumers.get(group, {}).items())]

    def producers(self, group: str) -> list[Member]:
        return [m for _, m in sorted(self._producers.get(group, {}).items())]

    def consumer_groups(self) -> list[str]:
        return sorted(self._consumers)

    def channels(self, group: str) -> list[Hashable]:
        """The distinct channels of a consumer group's members."""
        return list(dict.fromkeys(m.channel for m in self.consumers(group)))

    def subscription(self, group: str, topic: str) -> Subscription | None:
        """The group's subscription to `topic`: the newest (highest version)
        any member announced, as RocketMQ's group table keeps the latest."""
        best = None
        for member in self._consumers.get(group, {}).values():
            sub = member.subscriptions.get(topic)
            if sub is not None and (best is None or sub.version > best.version):
                best = sub
        return best


def _filters_differ(old: dict[str, Subscription], new: dict[str, Subscription]) -> bool:
    if old.keys() != new.keys():
        return True
    return any(not old[t].same_filter(new[t]) for t in new)


def _remove(table: dict[str, dict[str, Member]], group: str, client_id: str) -> bool:
    members = table.get(group)
    if not members or client_id not in members:
        return False
    del members[client_id]
    if not members:
        del table[group]
    return True
