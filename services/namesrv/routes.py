"""The name server's route tables (RocketMQ's RouteInfoManager), following the rules
of docs/reference/contract.md, "Name server rules".

Tables:
  topic_queue_table   topic -> broker_name -> TopicQueues (a route answer adds the
                      broker name to make QueueData)
  broker_addr_table   broker_name -> BrokerGroup (cluster, broker_id -> address)
  cluster_addr_table  cluster -> set of broker names
  live                broker address -> LiveBroker (liveness, DataVersion, HA
                      address, instance id, generation, heartbeat timeout)
  filter_servers      broker address -> filter server addresses

Ownership and atomicity: every method is synchronous and the name server runs
one event loop, so each call applies completely before any other reader runs;
no reader ever sees a half-applied registration. Nothing here does I/O, logs
per request, or knows about gRPC.

Generations: a live entry carries a `generation`, new whenever an address is
registered by a different broker instance (or registered again after it was
removed). Removals that were decided earlier — a KeepAlive stream ending, an
expiry, an unregister naming an instance — only apply while the generation (or
instance) still matches, so they never remove a newer registration.

Epochs (automatic failover, RocketMQ's stateVersion fencing): a broker group
remembers the highest failover epoch any of its brokers registered with
(`BrokerGroup.epoch`). A master (id 0) registering with a lower epoch is a
deposed leader that has not noticed yet: it is refused (`StaleMaster`) before
anything changes. A master at or above it takes the group's id 0 at once. A
follower below it is accepted: it does not take writes and will catch up.
Epoch 0 means failover is off and is never fenced nor remembered.

Time: liveness uses the injected clock's monotonic reading; the wall clock is
only for the timestamps users see. `expire(now)` is a pure function of `now`.

Two protocols, one table: a broker registers through `ferry.v1` (ferry's
brokers: `broker_addr` is its gRPC address, `remoting_addr` its RocketMQ-protocol
address if it has one) or through RocketMQ's protocol (a RocketMQ 4.x broker:
`broker_addr` is its RocketMQ-protocol address and it has no gRPC address). The
address a broker is registered under identifies it in every table; a route or
cluster answer asks `LiveBroker.address(protocol)` for the address its clients
dial, and leaves out the brokers that have none in that protocol.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ferry.model import (
    MASTER_ID,
    MAX_QUEUE_NUMS,
    PERM_MAX,
    PERM_WRITE,
    TOPIC_CHARS,
    TOPIC_MAX_LENGTH,
    DataVersion,
    check_addr,
    check_broker_id,
    check_name,
    check_perm,
    check_queue_nums,
    check_role,
    check_topic,
)
from ferry.runtime.clock import Clock
from ferry.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

DEFAULT_HEARTBEAT_TIMEOUT_S = 120.0
MAX_HEARTBEAT_TIMEOUT_S = 24 * 3600.0

# The protocol a broker registered through, and the one an answer is for.
GRPC = "grpc"  # ferry.v1
REMOTING = "remoting"  # RocketMQ's TCP protocol
PROTOCOLS = (GRPC, REMOTING)

# Why a broker left the tables (the `reason` label of the unregister metric).
GRACEFUL = "graceful"
EXPIRED = "expired"
CONNECTION_LOST = "connection_lost"


class QueueData(NamedTuple):
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    attributes: tuple[tuple[str, str], ...] = ()


class TopicQueues(NamedTuple):
    """What a registration says about one topic (its attributes as the broker
    has them: the proxy reads a topic's message type there)."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class BrokerGroup:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    # The highest failover epoch registered in the group and the address that
    # registered it. It lives and dies with the group: once no broker of the
    # group is registered it is forgotten, as RocketMQ's name server forgets a
    # stateVersion with the last live entry holding it (nothing is left to
    # protect, and a group whose election state was reset can come back
    # without restarting the name servers).
    epoch: int = 0
    epoch_addr: str = ""


@dataclass(slots=True)
class LiveBroker:
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str
    last_update_mono: float
    last_update_wall_ms: int
    heartbeat_timeout_s: float
    data_version: DataVersion
    ha_server_addr: str
    instance_id: str
    generation: int
    broker_role: str = ""
    metrics_addr: str = ""
    keep_alive: bool = False
    epoch: int = 0
    remoting_addr: str = ""
    protocol: str = GRPC

    def alive_at(self, now_mono: float) -> bool:
        return now_mono - self.last_update_mono <= self.heartbeat_timeout_s

    def address(self, protocol: str) -> str:
        """Where a client of `protocol` reaches this broker; "" when it cannot."""
        if protocol == self.protocol:
            return self.broker_addr
        return self.remoting_addr if protocol == REMOTING else ""


@dataclass(frozen=True, slots=True)
class Registration:
    """A RegisterBroker request in plain values. `topics is None`: no topic body."""

    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str = ""
    data_version: DataVersion = DataVersion()
    topics: Mapping[str, TopicQueues] | None = None
    filter_servers: tuple[str, ...] = ()
    heartbeat_timeout_s: float = 0.0
    instance_id: str = ""
    broker_role: str = ""
    metrics_addr: str = ""
    incremental: bool = False
    epoch: int = 0
    # The broker's RocketMQ-protocol address ("": none). For a registration
    # through RocketMQ's protocol it is `broker_addr` itself.
    remoting_addr: str = ""
    protocol: str = GRPC
    # A full registration's topics replace the group's (ferry.v1). False: they
    # are added or updated and the others kept, as Apache's name server does
    # (a 4.9 broker that created a topic registers just that one, with a new
    # DataVersion; topics leave through DELETE_TOPIC_IN_NAMESRV).
    replace_topics: bool = True


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """`master_addr`: the master's address in the registering broker's protocol."""

    master_addr: str
    ha_server_addr: str
    topic_config_applied: bool
    # The group's epoch when this (follower's) registration was behind it, else 0.
    behind_epoch: int = 0
    # The address this master took id 0 from, if another one held it.
    replaced_master: str = ""


class StaleMaster(FailedPrecondition):
    """A master registered with a failover epoch below its group's: it lost a
    leader election it has not heard of yet."""

    def __init__(
        self, broker_name: str, broker_addr: str, epoch: int, group_epoch: int, group_addr: str
    ) -> None:
        super().__init__(
            f"stale master: {broker_name} ({broker_addr}) epoch {epoch} is older than epoch "
            f"{group_epoch} already registered by {group_addr}; this broker lost leadership "
            "and must follow the new master"
        )
        self.broker_name = broker_name
        self.broker_addr = broker_addr
        self.epoch = epoch
        self.group_epoch = group_epoch
        self.group_addr = group_addr


@dataclass(frozen=True, slots=True)
class Removal:
    broker_addr: str
    broker_name: str
    broker_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Route:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerGroup]
    filter_servers: dict[str, list[str]]


# Every name, one per line, by the same rule as `check_topic`.
_TOPIC_LINES = re.compile(rf"(?:{TOPIC_CHARS}{{1,{TOPIC_MAX_LENGTH}}}\n)*")


def _validate_topics(topics: Mapping[str, TopicQueues]) -> None:
    """Check every topic of a registration: one C-speed pass in the common case
    (a registration may carry 100,000 topics), field-by-field messages on failure."""
    lines = "\n".join(topics) + "\n"
    # A name holding "\n" would pass as two lines: the line count catches it.
    names_ok = lines.count("\n") == len(topics) and _TOPIC_LINES.fullmatch(lines) is not None
    limit = MAX_QUEUE_NUMS
    values_ok = all(
        0 <= q.read_queue_nums <= limit
        and 0 <= q.write_queue_nums <= limit
        and 0 <= q.perm <= PERM_MAX
        for q in topics.values()
    )
    if names_ok and values_ok:
        return
    for topic, q in topics.items():
        field_prefix = f"body.topic_config.topic_config_table[{topic[:40]!r}]"
        check_topic(topic, field_prefix)
        check_queue_nums(q.read_queue_nums, field_prefix + ".read_queue_nums")
        check_queue_nums(q.write_queue_nums, field_prefix + ".write_queue_nums")
        check_perm(q.perm, field_prefix + ".perm")


class RouteTable:
    def __init__(
        self, clock: Clock, default_heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    ) -> None:
        self._clock = clock
        self._default_timeout_s = default_heartbeat_timeout_s
        self.topic_queue_table: dict[str, dict[str, TopicQueues]] = {}
        self.broker_addr_table: dict[str, BrokerGroup] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.live: dict[str, LiveBroker] = {}
        self.filter_servers: dict[str, list[str]] = {}
        self._next_generation = 1
        # Bumped on every change a route answer could show; lets callers cache.
        self.version = 0

    # ------------------------------------------------------------------ writes

    def register(self, reg: Registration) -> RegisterResult:
        """Apply a RegisterBroker (docs/reference/contract.md, "Name server rules").
        Validates everything before changing anything."""
        self._validate(reg)
        now_mono = self._clock.monotonic()
        addr = reg.broker_addr
        previous = self.live.get(addr)

        if reg.incremental and (previous is None or previous.broker_name != reg.broker_name):
            raise FailedPrecondition(
                f"broker {addr} ({reg.broker_name}) is not registered here; an incremental "
                "registration needs a full one first"
            )
        group = self.broker_addr_table.get(reg.broker_name)
        if group is not None and reg.broker_id == MASTER_ID and 0 < reg.epoch < group.epoch:
            raise StaleMaster(reg.broker_name, addr, reg.epoch, group.epoch, group.epoch_addr)
        # The same address registered in another group or cluster: leave that one first.
        if previous is not None and (
            previous.broker_name != reg.broker_name or previous.cluster_name != reg.cluster_name
        ):
            self._drop(addr, previous.broker_name)
            previous = None

        self.cluster_addr_table.setdefault(reg.cluster_name, set()).add(reg.broker_name)
        group = self.broker_addr_table.get(reg.broker_name)  # _drop above may have removed it
        first = group is None
        if group is None:
            group = self.broker_addr_table[reg.broker_name] = BrokerGroup(
                reg.cluster_name, reg.broker_name
            )
        elif group.cluster != reg.cluster_name:
            self.cluster_addr_table.get(group.cluster, set()).discard(reg.broker_name)
            self._discard_empty_cluster(group.cluster)
            group.cluster = reg.cluster_name
        if reg.epoch > group.epoch:
            group.epoch, group.epoch_addr = reg.epoch, addr
        # Role switch: one host:port has one id in its group (a slave promoted to
        # master leaves its slave id; a deposed master rejoining as a slave leaves id 0).
        for other_id in [
            i for i, a in group.broker_addrs.items() if a == addr and i != reg.broker_id
        ]:
            del group.broker_addrs[other_id]
        old_addr = group.broker_addrs.get(reg.broker_id)
        group.broker_addrs[reg.broker_id] = addr
        first = first or old_addr is None
        replaced = ""
        if old_addr is not None and old_addr != addr:
            # Another address held this id (e.g. a new master): the old one lost its place.
            self.live.pop(old_addr, None)
            self.filter_servers.pop(old_addr, None)
            replaced = old_addr

        applied = False
        if reg.topics is not None and reg.broker_id == MASTER_ID:
            if reg.incremental:
                self._apply_topics(reg.broker_name, reg.topics, replace=False)
                applied = True
            elif first or previous is None or previous.data_version != reg.data_version:
                self._apply_topics(reg.broker_name, reg.topics, replace=reg.replace_topics)
                applied = True

        if previous is not None and reg.instance_id and previous.instance_id == reg.instance_id:
            generation, keep_alive = previous.generation, previous.keep_alive
        else:
            generation, keep_alive = self._new_generation(), False
        data_version = reg.data_version
        if reg.incremental and previous is not None:
            data_version = previous.data_version  # only a full registration sets the version
        self.live[addr] = LiveBroker(
            cluster_name=reg.cluster_name,
            broker_name=reg.broker_name,
            broker_id=reg.broker_id,
            broker_addr=addr,
            last_update_mono=now_mono,
            last_update_wall_ms=self._clock.wall_ms(),
            heartbeat_timeout_s=reg.heartbeat_timeout_s or self._default_timeout_s,
            data_version=data_version,
            ha_server_addr=reg.ha_server_addr,
            instance_id=reg.instance_id,
            generation=generation,
            broker_role=reg.broker_role,
            metrics_addr=reg.metrics_addr,
            keep_alive=keep_alive,
            epoch=reg.epoch,
            remoting_addr=reg.remoting_addr,
            protocol=reg.protocol,
        )
        if reg.filter_servers:
            self.filter_servers[addr] = list(reg.filter_servers)
        else:
            self.filter_servers.pop(addr, None)
        self.version += 1

        master_addr = ha_addr = ""
        if reg.broker_id != MASTER_ID:
            candidate = group.broker_addrs.get(MASTER_ID)
            master = self.live.get(candidate) if candidate else None
            # A master behind the group's epoch has been deposed: following it would
            # copy a log the new master may overwrite. The slave waits for the new one.
            deposed = master is not None and 0 < master.epoch < group.epoch
            if master is not None and master.alive_at(now_mono) and not deposed:
                master_addr, ha_addr = master.address(reg.protocol), master.ha_server_addr
        behind = group.epoch if 0 < reg.epoch < group.epoch else 0
        return RegisterResult(
            master_addr,
            ha_addr,
            applied,
            behind_epoch=behind,
            replaced_master=replaced if reg.broker_id == MASTER_ID else "",
        )

    def unregister(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        instance_id: str = "",
    ) -> Removal | None:
        """Remove a broker (docs/reference/contract.md, "Name server rules"). With
        `instance_id`, only that instance's registration."""
        check_name(cluster_name, "cluster_name")
        check_addr(broker_addr, "broker_addr")
        check_name(broker_name, "broker_name")
        check_broker_id(broker_id)
        live = self.live.get(broker_addr)
        if live is not None and instance_id and live.instance_id != instance_id:
            return None  # a newer instance registered since: this unregister is stale
        if live is not None and live.broker_name != broker_name:
            return None  # the address belongs to another group now
        group = self.broker_addr_table.get(broker_name)
        if live is None and (group is None or broker_addr not in group.broker_addrs.values()):
            return None
        return self._drop(broker_addr, broker_name, reason=GRACEFUL, broker_id=broker_id)

    def remove_if_current(self, broker_addr: str, generation: int, reason: str) -> Removal | None:
        """Remove a broker only if its registration is still `generation`."""
        live = self.live.get(broker_addr)
        if live is None or live.generation != generation:
            return None
        return self._drop(broker_addr, live.broker_name, reason=reason, broker_id=live.broker_id)

    def expire(self, now_mono: float) -> list[Removal]:
        """Remove every broker whose last update is older than its heartbeat timeout."""
        stale = [(a, b.generation) for a, b in self.live.items() if not b.alive_at(now_mono)]
        removed = []
        for addr, generation in stale:
            removal = self.remove_if_current(addr, generation, EXPIRED)
            if removal is not None:
                removed.append(removal)
        return removed

    def query_data_version(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        data_version: DataVersion,
    ) -> tuple[bool, DataVersion | None]:
        """(changed, stored version); refreshes the broker's liveness when known."""
        check_name(cluster_name, "cluster_name")
        check_addr(broker_addr, "broker_addr")
        check_name(broker_name, "broker_name")
        check_broker_id(broker_id)
        live = self.live.get(broker_addr)
        if live is None:
            return True, None
        self._touch(live)
        return live.data_version != data_version, live.data_version

    def heartbeat(self, cluster_name: str, broker_addr: str) -> bool:
        """Refresh liveness; False when the broker is not registered here."""
        check_name(cluster_name, "cluster_name")
        check_addr(broker_addr, "broker_addr")
        live = self.live.get(broker_addr)
        if live is None or live.cluster_name != cluster_name:
            return False
        self._touch(live)
        return True

    def bind_keep_alive(self, cluster_name: str, broker_addr: str, instance_id: str = "") -> int:
        """Attach a KeepAlive stream to the current registration; returns its generation."""
        check_name(cluster_name, "cluster_name")
        check_addr(broker_addr, "broker_addr")
        live = self.live.get(broker_addr)
        if live is None or live.cluster_name != cluster_name:
            raise FailedPrecondition(
                f"broker {broker_addr} of cluster {cluster_name} is not registered here; register first"
            )
        if instance_id and live.instance_id != instance_id:
            raise FailedPrecondition(
                f"broker {broker_addr} is registered by instance {live.instance_id!r}, not {instance_id!r}; register again"
            )
        live.keep_alive = True
        self._touch(live)
        return live.generation

    def touch_generation(self, broker_addr: str, generation: int) -> bool:
        live = self.live.get(broker_addr)
        if live is None or live.generation != generation:
            return False
        self._touch(live)
        return True

    def delete_topic(self, topic: str, cluster_name: str = "") -> int:
        """Forget `topic`'s queues: on every group, or with `cluster_name` only on
        that cluster's groups. Returns how many groups' queues were removed. A
        broker that still has the topic brings it back with its next full
        registration whose DataVersion changed (as in RocketMQ)."""
        check_topic(topic)
        if cluster_name:
            check_name(cluster_name, "cluster_name")
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return 0
        if cluster_name:
            names = [n for n in self.cluster_addr_table.get(cluster_name, ()) if n in queues]
        else:
            names = list(queues)
        for name in names:
            del queues[name]
        if not queues:
            del self.topic_queue_table[topic]
        if names:
            self.version += 1
        return len(names)

    def wipe_write_perm(self, broker_name: str) -> int:
        """Drain a group: clear WRITE on its queues of every topic; returns topics changed."""
        return self._change_write_perm(broker_name, wipe=True)

    def add_write_perm(self, broker_name: str) -> int:
        """Undrain a group: set WRITE on its queues of every topic; returns topics changed."""
        return self._change_write_perm(broker_name, wipe=False)

    # ------------------------------------------------------------------ reads

    def route(self, topic: str, protocol: str = GRPC) -> Route:
        """The route of `topic` for clients of `protocol`: each group with the
        addresses of its brokers in that protocol; groups with none are left
        out (their brokers registered through the other protocol only)."""
        check_topic(topic)
        queues = self.topic_queue_table.get(topic)
        groups = []
        for name in queues or ():
            group = self.broker_addr_table.get(name)
            view = self.group_view(group, protocol) if group is not None else None
            if view is not None and view.broker_addrs:
                groups.append(view)
        if not groups:
            message = f"No topic route info in name server for the topic: {topic}"
            if queues:
                other = "ferry.v1" if protocol == REMOTING else "RocketMQ's protocol"
                message += f" (its brokers can be reached through {other} only)"
            raise NotFound(message)
        filter_servers = {}
        if self.filter_servers:
            for group in groups:
                for broker_id, addr in group.broker_addrs.items():
                    own = self.broker_addr_table[group.broker_name].broker_addrs.get(broker_id)
                    if own in self.filter_servers:
                        filter_servers[addr] = list(self.filter_servers[own])
        names = {g.broker_name for g in groups}
        assert queues is not None
        queue_datas = [QueueData(name, *q) for name, q in queues.items() if name in names]
        return Route(queue_datas, groups, filter_servers)

    def group_view(self, group: BrokerGroup, protocol: str) -> BrokerGroup:
        """A copy of `group` with its brokers' addresses in `protocol`, by id,
        leaving out brokers without one."""
        addrs = {}
        for broker_id in sorted(group.broker_addrs):
            addr = self.address(group.broker_addrs[broker_id], protocol)
            if addr:
                addrs[broker_id] = addr
        return BrokerGroup(group.cluster, group.broker_name, addrs, group.epoch, group.epoch_addr)

    def address(self, broker_addr: str, protocol: str) -> str:
        """The address in `protocol` of the broker registered as `broker_addr`
        ("" when it has none). An address with no live entry is a gRPC one."""
        live = self.live.get(broker_addr)
        if live is None:
            return broker_addr if protocol == GRPC else ""
        return live.address(protocol)

    def cluster_view(self, protocol: str) -> tuple[dict[str, BrokerGroup], dict[str, list[str]]]:
        """(groups by name, sorted group names by cluster) for clients of
        `protocol`; groups with no broker reachable in it are left out."""
        groups = {}
        for name in sorted(self.broker_addr_table):
            view = self.group_view(self.broker_addr_table[name], protocol)
            if view.broker_addrs:
                groups[name] = view
        clusters = {}
        for cluster in sorted(self.cluster_addr_table):
            names = sorted(n for n in self.cluster_addr_table[cluster] if n in groups)
            if names:
                clusters[cluster] = names
        return groups, clusters

    def topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster_name: str) -> list[str]:
        """Topics with queues on a group of `cluster_name` (none for an unknown cluster)."""
        check_name(cluster_name, "cluster")
        names = self.cluster_addr_table.get(cluster_name, set())
        return sorted(
            t for t, queues in self.topic_queue_table.items() if not names.isdisjoint(queues)
        )

    def live_count(self) -> int:
        return len(self.live)

    # ------------------------------------------------------------------ internals

    def _validate(self, reg: Registration) -> None:
        check_name(reg.cluster_name, "cluster_name")
        check_addr(reg.broker_addr, "broker_addr")
        check_name(reg.broker_name, "broker_name")
        check_broker_id(reg.broker_id)
        check_role(reg.broker_role, reg.broker_id)
        check_addr(reg.ha_server_addr, "ha_server_addr", required=False)
        check_addr(reg.metrics_addr, "metrics_addr", required=False)
        check_addr(reg.remoting_addr, "remoting_addr", required=False)
        if reg.protocol not in PROTOCOLS:
            raise InvalidArgument("protocol", f"{reg.protocol!r} is not one of {PROTOCOLS}")
        for i, fs in enumerate(reg.filter_servers):
            check_addr(fs, f"body.filter_server_list[{i}]")
        if reg.heartbeat_timeout_s < 0 or reg.heartbeat_timeout_s > MAX_HEARTBEAT_TIMEOUT_S:
            raise InvalidArgument(
                "heartbeat_timeout_ms",
                f"{int(reg.heartbeat_timeout_s * 1000)} is outside 0..{int(MAX_HEARTBEAT_TIMEOUT_S * 1000)}",
            )
        if reg.epoch < 0:
            raise InvalidArgument(
                "epoch",
                f"{reg.epoch} is negative; 0 means failover is off, > 0 is an election epoch",
            )
        if len(reg.instance_id) > 128:
            raise InvalidArgument("instance_id", "is longer than 128 characters")
        if reg.topics:
            _validate_topics(reg.topics)

    def _apply_topics(
        self, broker_name: str, topics: Mapping[str, TopicQueues], replace: bool
    ) -> None:
        table = self.topic_queue_table
        for topic, q in topics.items():
            queues = table.get(topic)
            if queues is None:
                queues = table[topic] = {}
            queues[broker_name] = q
        if replace:
            # A full registration is the master's whole table: topics it no longer has leave.
            gone = [t for t, queues in table.items() if broker_name in queues and t not in topics]
            self._remove_group_from_topics(broker_name, gone)

    def _drop(
        self, addr: str, broker_name: str, reason: str = GRACEFUL, broker_id: int | None = None
    ) -> Removal:
        """The unregister cascade for one address of one group."""
        live = self.live.pop(addr, None)
        self.filter_servers.pop(addr, None)
        group = self.broker_addr_table.get(broker_name)
        removed_id = live.broker_id if live is not None else broker_id
        if group is not None:
            for i in [i for i, a in group.broker_addrs.items() if a == addr]:
                del group.broker_addrs[i]
            if not group.broker_addrs:
                del self.broker_addr_table[broker_name]
                self.cluster_addr_table.get(group.cluster, set()).discard(broker_name)
                self._discard_empty_cluster(group.cluster)
                self._remove_group_from_topics(broker_name, list(self.topic_queue_table))
        self.version += 1
        return Removal(addr, broker_name, -1 if removed_id is None else removed_id, reason)

    def _remove_group_from_topics(self, broker_name: str, topics: Iterable[str]) -> None:
        table = self.topic_queue_table
        for topic in topics:
            queues = table.get(topic)
            if queues is not None and queues.pop(broker_name, None) is not None and not queues:
                del table[topic]

    def _discard_empty_cluster(self, cluster: str) -> None:
        if not self.cluster_addr_table.get(cluster, True):
            del self.cluster_addr_table[cluster]

    def _change_write_perm(self, broker_name: str, wipe: bool) -> int:
        check_name(broker_name, "broker_name")
        changed = 0
        for queues in self.topic_queue_table.values():
            q = queues.get(broker_name)
            if q is None:
                continue
            perm = q.perm & ~PERM_WRITE if wipe else q.perm | PERM_WRITE
            if perm != q.perm:
                queues[broker_name] = q._replace(perm=perm)
                changed += 1
        if changed:
            self.version += 1
        return changed

    def _touch(self, live: LiveBroker) -> None:
        live.last_update_mono = self._clock.monotonic()
        live.last_update_wall_ms = self._clock.wall_ms()

    def _new_generation(self) -> int:
        generation = self._next_generation
        self._next_generation += 1
        return generation
