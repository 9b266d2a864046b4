"""Automatic failover under test: a broker group that elects its master in a
real etcd, producers that remember every attempt, and a history checker in
the style of Jepsen.

- `FailoverGroup`: one name server and N members of broker-a
  (`enableFailover=true`, SYNC_MASTER, lease TTL 2 s, slaveTimeout 1 s, small
  commit-log files) as subprocesses on fixed loopback ports, so a restarted
  member comes back where its peers and the name server look. Optionally each
  member reaches etcd through its own `FaultProxy` (`etcd_proxies`), and each
  member's HA port is reached through a proxy on an address of its own
  (`ha_proxies`: the member advertises `brokerIP2=127.0.0.1<id>`, which the
  proxy listens on in front of its haListenPort, so slaves that learn the
  master's HA address from etcd go through it). It reads the group's keys
  straight from etcd (aetcd) and kills, pauses, restarts and stops members by
  PID. It never sleeps to wait: every wait polls a condition with a deadline.
- `Producers`: threads that send to whatever the name server says is
  broker-a's master (id 0), or to one pinned address (a probe of a deposed
  master), and record every attempt (`Attempt`): the message key, the
  attempt's own body, when the send started and when its answer came back
  (one monotonic clock for all), where it went, the status and what the
  broker said it stored (msg id, queue id, queue offset, commit offset). A
  message is retried, with a new body, until it is SEND_OK.
- The history checker (`check_history`, `check_no_overlap`): after the
  faults, every SEND_OK attempt is in the group's final log exactly once, at
  the commit offset and queue offset its producer was told; every record
  there was sent by someone; each queue's offsets run 0, 1, 2, ... in log
  order; the members' logs are byte-identical (`assert_identical`); and the
  SEND_OK answers of two masters never interleave.
- Scenario drivers (`kill_master`, `etcd_partition`, `lagging_replica`,
  `handover`, `ha_partition`, `pause_follower`, `freeze_leader`,
  `new_topics`, `run_fault`) and `check_final`, shared by
  tests/integration/test_failover.py (few rounds) and
  tests/chaos/test_failover_chaos.py (FERRY_CHAOS_ROUNDS). `new_topics`
  also checks the metadata: every topic and subscription group created
  during the run is on every live member and every topic in the name
  server's route (`wait_tables`).

Fixed ports come from a `PortRange` the caller owns (32000-32767: below the
ephemeral range and clear of the other suites' ranges, see PortRange).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry import record
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    ha_admin_pb2,
    ha_admin_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from services.broker.failover.etcd import Etcd, group_prefix
from services.broker.failover.node import IN_SYNC_HEALTH
from services.broker.store.commitlog import segment_name
from tests.chaos.harness import read_log
from tests.conftest import LoopThread, broker_options
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    BrokerServer,
    NamesrvProcess,
    PortRange,
    create_topic,
    pull_all,
    run_ferry,
    stop_pid,
)
from tests.waiting import wait_equal, wait_for

CLUSTER = "DefaultCluster"
BROKER = "broker-a"
PREFIX = group_prefix(CLUSTER, BROKER)
TTL_MS = 2000
TTL_S = TTL_MS / 1000
SLAVE_TIMEOUT_MS = 1000
PACE_S = 0.005  # a producer's pause between sends
SLAVE_TIMEOUT_S = SLAVE_TIMEOUT_MS / 1000
SLAVE_SYNC_INTERVAL_MS = 1000  # the members' default here (the broker's own: 10 s)
FILE_SIZE = 256 * 1024  # commit-log files roll over within a test
TOPIC = "Failover"
QUEUES = 4
SEND_TIMEOUT_S = 3.0
# Channels that reconnect fast to a member restarted on the same port.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
]
RECOVERED = "store recovered crashed="


# ---------------------------------------------------------------- the group


@dataclass
class Member:
    id: int
    port: int
    ha_port: int
    store: Path
    keys: dict[str, Any]
    server: BrokerServer
    remoting_port: int = 0  # RocketMQ's protocol (listenPort); `port` is gRPC
    etcd_proxy: FaultProxy | None = None
    ha_proxy: FaultProxy | None = None
    paused: bool = False

    @property
    def addr(self) -> str:
        """ferry.v1 gRPC."""
        return f"127.0.0.1:{self.port}"

    @property
    def remoting_addr(self) -> str:
        return f"127.0.0.1:{self.remoting_port}"

    @property
    def alive(self) -> bool:
        proc = self.server.proc
        return proc is not None and proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def log(self) -> str:
        return self.server.log() if self.server.log_path.exists() else ""

    def __repr__(self) -> str:
        return f"member {self.id} ({self.addr})"


@dataclass
class GroupView:
    """One read of the group's keys in etcd."""

    leader: dict | None
    epoch: int
    isr: dict | None
    members: dict[int, dict]

    @property
    def ready_leader(self) -> int | None:
        if self.leader and self.leader.get("ready"):
            return self.leader.get("id")
        return None

    @property
    def in_sync(self) -> list[int]:
        if not self.isr or self.isr.get("epoch") != self.epoch:
            return []
        return sorted(self.isr.get("members", []))

    def epoch_start(self) -> int:
        """Where the leader's epoch starts in the log (its history's last entry)."""
        assert self.leader is not None
        epoch, start = self.leader["history"][-1]
        assert epoch == self.leader["epoch"], self.leader
        return start


class FailoverGroup:
    """A name server and `size` failover members of broker-a; see the module."""

    def __init__(
        self,
        root: Path,
        etcd_endpoint: str,
        ports: PortRange,
        loop: LoopThread,
        size: int = 2,
        etcd_proxies: bool = False,
        ha_proxies: bool = False,
        **keys: Any,
    ) -> None:
        self.root = root
        self.etcd_endpoint = etcd_endpoint
        self.loop = loop
        self.namesrv: NamesrvProcess | None = None
        self.members: list[Member] = []
        self._etcd_client = None
        self._channels: dict[str, grpc.Channel] = {}
        for i in range(1, size + 1):
            store = root / f"m{i}"
            member = Member(
                i, ports.take(), ports.take(), store, dict(keys), BrokerServer(store, []),
                remoting_port=ports.take(),
            )  # fmt: skip
            if etcd_proxies:
                host, _, port = etcd_endpoint.rpartition(":")
                member.etcd_proxy = FaultProxy(host, int(port))
            if ha_proxies:
                member.ha_proxy = FaultProxy("127.0.0.1", member.ha_port,
                                             host=f"127.0.0.1{i}", port=member.ha_port)  # fmt: skip
            self.members.append(member)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> FailoverGroup:
        self.namesrv = NamesrvProcess(self.root / "namesrv").wait_ready()
        for m in self.members:
            for proxy in (m.etcd_proxy, m.ha_proxy):
                if proxy is not None:
                    self.loop.run(proxy.start())
        for m in self.members:
            self._start(m)
        leader = self.wait_leader(timeout_s=20)
        self.wait_routed(leader)
        create_topic(self.channel(leader.addr), TOPIC, QUEUES)
        for m in self.members:
            wait_for(lambda m=m: self.has_topic(m), 15, f"{m} to have topic {TOPIC}")
        self.wait_isr(timeout_s=15)
        return self

    def _options(self, m: Member, **override: Any) -> list[str]:
        assert self.namesrv is not None
        keys: dict[str, Any] = {
            "brokerRole": "SYNC_MASTER",
            "brokerId": m.id,
            "enableFailover": "true",
            "etcdEndpoints": m.etcd_proxy.addr if m.etcd_proxy else self.etcd_endpoint,
            "failoverLeaseTtl": TTL_MS,
            "slaveTimeout": SLAVE_TIMEOUT_MS,
            "listenPort": m.remoting_port,
            "fastListenPort": -1,
            "grpcListenPort": m.port,
            "haListenPort": m.ha_port,
            "mappedFileSizeCommitLog": FILE_SIZE,
            "slaveSyncDelay": 100,
            "slaveSyncInterval": SLAVE_SYNC_INTERVAL_MS,
            "haReconnectInterval": 200,
            # The history checker needs every file: no retention (broker_options
            # already keeps a full test-machine disk from refusing sends).
            "cleanFileForciblyEnable": "false",
            **({"brokerIP2": m.ha_proxy.host} if m.ha_proxy else {}),
            **m.keys,
            **override,
        }
        return broker_options(m.store, self.namesrv.remoting_addr, **keys)

    def _start(self, m: Member, **override: Any) -> None:
        m.server.options = self._options(m, **override)
        m.paused = False
        m.server.start()
        assert m.server.grpc_port == m.port, (m, m.server.grpc_port)
        assert m.server.remoting_port == m.remoting_port, (m, m.server.remoting_port)

    def blackhole_etcd(self, m: Member) -> None:
        assert m.etcd_proxy is not None, "start the group with etcd_proxies=True"
        self.loop.call(m.etcd_proxy.blackhole)

    def heal_etcd(self, m: Member) -> None:
        assert m.etcd_proxy is not None
        self.loop.call(m.etcd_proxy.heal)

    def blackhole_ha(self, m: Member) -> None:
        """Nothing passes between `m`'s HA port (as a master) and its slaves."""
        assert m.ha_proxy is not None, "start the group with ha_proxies=True"
        self.loop.call(m.ha_proxy.blackhole)

    def heal_ha(self, m: Member) -> None:
        assert m.ha_proxy is not None
        self.loop.call(m.ha_proxy.heal)

    def kill(self, m: Member) -> None:
        """SIGKILL by PID (a crash)."""
        m.paused = False
        m.server.kill()

    def stop(self, m: Member) -> None:
        """SIGTERM by PID (a clean stop: the member gives its lease back)."""
        if m.paused:
            self.resume(m)
        m.server.stop()

    def restart(self, m: Member, **override: Any) -> None:
        """Start a stopped or killed member again, on the same ports and store;
        `override`: config keys for this run only."""
        if m.alive:
            self.stop(m)
        self._start(m, **override)

    def pause(self, m: Member) -> None:
        """SIGSTOP: the process stands still (a long GC pause, a frozen VM)."""
        os.kill(m.pid, signal.SIGSTOP)
        m.paused = True

    def resume(self, m: Member) -> None:
        os.kill(m.pid, signal.SIGCONT)
        m.paused = False

    def stop_all(self) -> None:
        """Every process by PID (SIGKILL: teardown needs no clean stop), then
        the proxies, channels and the etcd client."""
        for m in self.members:
            if m.server.proc is not None:
                stop_pid(m.server.proc, signal.SIGKILL)
        if self.namesrv is not None:
            self.namesrv.stop()
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        for m in self.members:
            for proxy in (m.etcd_proxy, m.ha_proxy):
                if proxy is not None:
                    self.loop.run(proxy.stop())
        if self._etcd_client is not None:
            client, self._etcd_client = self._etcd_client, None
            self.loop.run(client.close())

    @property
    def slave_sync_interval_s(self) -> float:
        """How often a follower pulls topics and groups from its master."""
        return int(self.members[0].keys.get("slaveSyncInterval", SLAVE_SYNC_INTERVAL_MS)) / 1000

    def member(self, member_id: int) -> Member:
        return next(m for m in self.members if m.id == member_id)

    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive and not m.paused]

    def channel(self, addr: str) -> grpc.Channel:
        if addr not in self._channels:
            self._channels[addr] = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        return self._channels[addr]

    def eligible(self, m: Member) -> str:
        """`m`'s in-sync readiness as a Kubernetes probe asks for it: a
        grpc.health.v1 Check of IN_SYNC_HEALTH ("SERVING", "NOT_SERVING", or
        the status code of a failed call, e.g. "NOT_FOUND")."""
        stub = health_pb2_grpc.HealthStub(self.channel(m.addr))
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service=IN_SYNC_HEALTH), timeout=5)
        except grpc.RpcError as exc:
            return exc.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def wait_eligible(
        self, yes: Iterable[Member], no: Iterable[Member] = (), timeout_s: float = 10
    ) -> None:
        """Until the in-sync readiness of `yes` is SERVING, of `no` NOT_SERVING."""
        expect = {m.id: "SERVING" for m in yes} | {m.id: "NOT_SERVING" for m in no}
        wait_equal(lambda: {i: self.eligible(self.member(i)) for i in expect}, expect,
                   timeout_s, "in-sync readiness")  # fmt: skip

    # ------------------------------------------------------------ etcd

    def view(self) -> GroupView:
        """The group's keys, read from etcd in one range request (the
        broker's own reader, services.broker.failover.etcd)."""
        if self._etcd_client is None:
            self._etcd_client = Etcd((self.etcd_endpoint,), timeout_s=5)
        state = self.loop.run(self._etcd_client.read_group(PREFIX), timeout_s=10)
        return GroupView(state.leader, state.epoch, state.isr, state.members)

    def leader(self) -> Member | None:
        """The member etcd names as the group's ready master, if any."""
        leader_id = self.view().ready_leader
        return self.member(leader_id) if leader_id is not None else None

    def wait_leader(self, exclude: Iterable[int] = (), timeout_s: float = TTL_S + 5) -> Member:
        """Until a ready leader other than `exclude` is in etcd."""
        excluded = set(exclude)

        def found():
            m = self.leader()
            return m if m is not None and m.id not in excluded else None

        return wait_for(found, timeout_s, f"a ready leader other than {sorted(excluded)}")

    def wait_leaderless(self, timeout_s: float = TTL_S + 3) -> None:
        wait_for(lambda: self.view().leader is None, timeout_s, "the leader key to lapse")

    def assert_no_leader(self, for_s: float, candidate: Member) -> None:
        """No leader key appears during the next `for_s` seconds (polled),
        while `candidate` holds an etcd lease (its member key) from start to
        end: it could have campaigned the whole time, so the absence means
        something even on a machine too loaded to run it much."""
        assert candidate.id in self.view().members, f"{candidate} holds no etcd lease"
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            view = self.view()
            assert view.leader is None, f"a leader was elected: {view.leader}"
            time.sleep(0.05)
        assert candidate.id in self.view().members, f"{candidate} lost its etcd lease"

    def wait_isr(self, ids: Iterable[int] | None = None, timeout_s: float = 15) -> GroupView:
        """Until the current epoch's published in-sync set is `ids` (default:
        every live member)."""
        want = sorted(ids) if ids is not None else sorted(m.id for m in self.live())

        def done():
            view = self.view()
            return view if view.ready_leader is not None and view.in_sync == want else None

        return wait_for(done, timeout_s, f"the in-sync set to be {want}")

    # ------------------------------------------------------------ the brokers

    def master_addr(self) -> str | None:
        """broker-a's master (id 0) as the name server routes it."""
        assert self.namesrv is not None
        stub = namesrv_pb2_grpc.NameServerStub(self.channel(self.namesrv.addr))
        try:
            info = stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=3)
        except grpc.RpcError:
            return None
        data = info.broker_addr_table.get(BROKER)
        return data.broker_addrs.get(0) if data is not None else None

    def wait_routed(self, m: Member, timeout_s: float = 10) -> None:
        wait_for(lambda: self.master_addr() == m.addr, timeout_s, f"{m} routed as id 0")

    def has_topic(self, m: Member) -> bool:
        stub = slave_sync_pb2_grpc.SlaveSyncStub(self.channel(m.addr))
        try:
            tables = stub.GetAllTopicConfig(slave_sync_pb2.GetAllTopicConfigRequest(), timeout=3)
        except grpc.RpcError:
            return False
        return TOPIC in tables.topic_config_table

    def tables(self, m: Member) -> tuple[set[str], set[str]] | None:
        """The topics and subscription groups `m` holds (its SlaveSync
        tables, what a slave copies), or None when it does not answer."""
        stub = slave_sync_pb2_grpc.SlaveSyncStub(self.channel(m.addr))
        try:
            topics = stub.GetAllTopicConfig(slave_sync_pb2.GetAllTopicConfigRequest(), timeout=3)
            groups = stub.GetAllSubscriptionGroupConfig(
                slave_sync_pb2.GetAllSubscriptionGroupConfigRequest(), timeout=3
            )
        except grpc.RpcError:
            return None
        return set(topics.topic_config_table), set(groups.subscription_group_table)

    def routed(self, topic: str) -> bool:
        """The name server routes `topic` to queues of broker-a."""
        assert self.namesrv is not None
        stub = namesrv_pb2_grpc.NameServerStub(self.channel(self.namesrv.addr))
        try:
            route = stub.GetRouteInfoByTopic(
                namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=3
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        return any(q.broker_name == BROKER for q in route.queue_datas)

    def tables_missing(
        self, topics: Iterable[str], groups: Iterable[str]
    ) -> list[tuple[str, str, str]]:
        """What of `topics` and `groups` a live member or the name server's
        route lacks, as (kind, name, where): ("topic", T, "member 2"),
        ("topic", T, "the route"), ("group", G, "member 1"), or ("tables",
        "", "member 3") for a member that does not answer. Empty: all there."""
        topics, groups = list(topics), list(groups)
        missing = []
        for m in self.live():
            where = f"member {m.id}"
            tables = self.tables(m)
            if tables is None:
                missing.append(("tables", "", where))
                continue
            missing += [("topic", t, where) for t in topics if t not in tables[0]]
            missing += [("group", g, where) for g in groups if g not in tables[1]]
        missing += [("topic", t, "the route") for t in topics if not self.routed(t)]
        return missing

    def ha_status(self, m: Member) -> ha_admin_pb2.HAStatus | None:
        stub = ha_admin_pb2_grpc.HAAdminStub(self.channel(m.addr))
        try:
            return stub.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=3)
        except grpc.RpcError:
            return None

    def wait_in_sync(self, timeout_s: float = 20) -> int:
        """Until every live follower has acked everything the leader holds
        (producers stopped); the leader's log end."""

        def caught_up():
            leader = self.leader()
            if leader is None or not leader.alive:
                return None
            st = self.ha_status(leader)
            if st is None or st.broker_role == "SLAVE":
                return None
            acks = {c.replica_id: c.ack_offset for c in st.connections}
            end = st.master_max_offset
            others = [m for m in self.live() if m is not leader]
            if all(acks.get(m.id) == end for m in others):
                return end or -1
            return None

        return max(wait_for(caught_up, timeout_s, "every live member to catch up"), 0)

    def pull(self, m: Member, topic: str = TOPIC) -> dict[tuple[int, int], bytes]:
        """What a consumer reads of `topic` from `m`: body by (queue id, queue
        offset); nothing when `m` has no such topic (NOT_FOUND)."""
        try:
            return pull_all(self.channel(m.addr), topic, QUEUES, group="failover-check")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return {}
            raise

    def pull_topics(
        self, m: Member, topics: Iterable[str]
    ) -> dict[str, dict[tuple[int, int], bytes]]:
        """`pull` of each of `topics`, by topic."""
        return {t: self.pull(m, t) for t in topics}

    def settled_images(self, timeout_s: float = 60) -> tuple[Member, int, dict[int, LogImage]]:
        """(leader, its log end, every member's log image) at a moment when every live
        member holds the leader's whole log. The producers are stopped, but the leader
        may still append on its own (a transaction's check copy every
        transactionCheckInterval while a half waits for an answer): when it did between
        the followers' catching up and the reading of the images, wait for them again."""
        deadline = time.monotonic() + timeout_s
        while True:
            end = self.wait_in_sync()
            leader = self.leader()
            assert leader is not None
            images = self.images()
            if all(images[m.id].end == end for m in self.live()) or time.monotonic() > deadline:
                return leader, end, images

    def images(self, members: Iterable[Member] | None = None) -> dict[int, LogImage]:
        return {m.id: read_image(m.store) for m in members or self.members}

    def recovered_after(self, m: Member, mark: int) -> tuple[int, int]:
        """The commit-log range the first store recovery after log position
        `mark` found: (start, end)."""
        text = m.log()[mark:]
        at = text.find(RECOVERED)
        assert at >= 0, f"{m} logged no store recovery after its restart"
        line = text[at : text.index("\n", at)]
        lo, hi = line.split("commit_log=[", 1)[1].split(")", 1)[0].split(",")
        return int(lo), int(hi)


# ---------------------------------------------------------------- producers


@dataclass
class Attempt:
    """One send, as its producer saw it (times: time.monotonic())."""

    worker: int
    key: str
    attempt: int
    body: bytes
    addr: str
    start: float
    end: float = 0.0
    status: str = ""  # a SendStatus name, or the gRPC status code's name
    detail: str = ""
    msg_id: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    commit_offset: int = -1
    topic: str = TOPIC

    @property
    def ok(self) -> bool:
        return self.status == "SEND_OK"

    def __str__(self) -> str:
        return (
            f"{self.key}#{self.attempt} ({self.topic}) to {self.addr} "
            f"[{self.start:.3f}, {self.end:.3f}] "
            f"{self.status} at {self.commit_offset} (queue {self.queue_id}:{self.queue_offset})"
        )


class Producers:
    """Threads sending one message at a time (SYNC: each waits for its answer)
    to `topic`; `name` prefixes their keys (unique across a test's producers)."""

    def __init__(
        self,
        resolve: Callable[[], str | None],
        count: int = 3,
        pinned: str | None = None,
        name: str = "p",
        topic: str = TOPIC,
    ) -> None:
        self.resolve = resolve
        self.count = count
        self.pinned = pinned
        self.name = name
        self.topic = topic
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = [0] * count
        self._futures: list[grpc.Future] = []
        self._channels: list[grpc.Channel] = []

    def start(self) -> Producers:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{self.name}{i}", daemon=True)
            for i in range(self.count)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(SEND_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in self._threads), "a producer thread did not stop"
        self._threads = []
        for future in self._futures:
            with contextlib.suppress(Exception):
                future.exception(SEND_TIMEOUT_S + 5)
        assert all(f.done() for f in self._futures), "an asynchronous send was never answered"
        for channel in self._channels:
            channel.close()
        self._futures, self._channels = [], []

    def send_async(self, addr: str) -> None:
        """One more send to `addr`, answered whenever (recorded then): a send
        that surely starts now, while the workers may all be waiting."""
        channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self._channels.append(channel)
        key = f"{self.name}async-{len(self._futures)}"
        a = Attempt(-1, key, 1, f"{key}#1|".encode(), addr, time.monotonic(), topic=self.topic)
        future = broker_pb2_grpc.BrokerStub(channel).SendMessage.future(
            broker_pb2.SendMessageRequest(topic=self.topic, body=a.body, keys=key),
            timeout=SEND_TIMEOUT_S,
        )

        def done(f) -> None:
            a.end = time.monotonic()
            try:
                r = f.result()
            except grpc.RpcError as exc:
                a.status, a.detail = exc.code().name, exc.details() or ""
            else:
                a.status = broker_pb2.SendStatus.Name(r.status)
                a.msg_id, a.queue_id = r.msg_id, r.queue_id
                a.queue_offset, a.commit_offset = r.queue_offset, r.commit_offset
            with self._lock:
                self.attempts.append(a)

        future.add_done_callback(done)
        self._futures.append(future)

    def _run(self, worker: int) -> None:
        channels: dict[str, grpc.Channel] = {}
        key, attempt, addr = "", 0, None
        try:
            while not self._stop.is_set():
                if not key:
                    self._seq[worker] += 1
                    key, attempt = f"{self.name}{worker}-{self._seq[worker]}", 0
                if addr is None:
                    addr = self.pinned or self.resolve()
                    if addr is None:
                        self._stop.wait(0.02)
                        continue
                attempt += 1
                body = f"{key}#{attempt}|".encode() + os.urandom(8).hex().encode() * (
                    1 + self._seq[worker] % 8
                )
                if addr not in channels:
                    channels[addr] = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
                stub = broker_pb2_grpc.BrokerStub(channels[addr])
                a = Attempt(worker, key, attempt, body, addr, time.monotonic(), topic=self.topic)
                try:
                    r = stub.SendMessage(
                        broker_pb2.SendMessageRequest(topic=self.topic, body=body, keys=key),
                        timeout=SEND_TIMEOUT_S,
                    )
                except grpc.RpcError as exc:
                    a.end = time.monotonic()
                    a.status, a.detail = exc.code().name, exc.details() or ""
                else:
                    a.end = time.monotonic()
                    a.status = broker_pb2.SendStatus.Name(r.status)
                    a.msg_id, a.queue_id = r.msg_id, r.queue_id
                    a.queue_offset, a.commit_offset = r.queue_offset, r.commit_offset
                with self._lock:
                    self.attempts.append(a)
                if a.ok:
                    key = ""
                    self._stop.wait(PACE_S)
                    continue
                if self.pinned is None:
                    addr = None  # ask the name server again
                self._stop.wait(0.02)
        finally:
            for ch in channels.values():
                ch.close()

    # ------------------------------------------------------------ reading the records

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def acked(self) -> list[Attempt]:
        return [a for a in self.snapshot() if a.ok]

    def wait_acked(self, n: int, timeout_s: float = 15, addr: str | None = None) -> None:
        """Until `n` more sends are SEND_OK (from `addr`, if given)."""

        def count() -> int:
            return sum(1 for a in self.acked() if addr is None or a.addr == addr)

        start = count()
        wait_for(lambda: count() >= start + n, timeout_s,
                 f"{n} more SEND_OK" + (f" from {addr}" if addr else ""))  # fmt: skip

    def first_ok(self, addr: str, after: float) -> Attempt | None:
        """The first SEND_OK answer from `addr` among sends started after `after`."""
        oks = [a for a in self.acked() if a.addr == addr and a.start > after]
        return min(oks, key=lambda a: a.end, default=None)

    def wait_first_ok(self, addr: str, after: float, timeout_s: float) -> Attempt:
        return wait_for(lambda: self.first_ok(addr, after), timeout_s,
                        f"a SEND_OK from {addr}")  # fmt: skip

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for a in self.snapshot():
            out[a.status] += 1
        return dict(out)

    def rare_details(self, below: int = 20) -> dict[str, list[str]]:
        """For each status answered fewer than `below` times (a surprise worth
        a look, e.g. CANCELLED): the address, the wall-clock time of the
        answer (to find it in the members' logs) and the detail of each."""
        wall = time.time() - time.monotonic()
        counts = self.statuses()
        out: dict[str, list[str]] = defaultdict(list)
        for a in self.snapshot():
            if counts[a.status] < below and a.status != "SEND_OK":
                at = datetime.fromtimestamp(wall + a.end).strftime("%H:%M:%S.%f")[:-3]
                out[a.status].append(f"{a.addr} at {at}: {a.detail!r}")
        return dict(out)


# ---------------------------------------------------------------- the logs


@dataclass
class LogImage:
    """A store's commit log as its files hold it: the records from its first
    file to its end (the first zero header)."""

    store: Path
    start: int
    end: int
    records: list[record.Record] = field(default_factory=list)

    def bytes(self, lo: int, hi: int) -> bytes:
        return read_log(self.store, lo, hi, FILE_SIZE)


def _segments(store: Path) -> list[int]:
    directory = store / "commitlog"
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_image(store: Path) -> LogImage:
    """Every record of a store's commit log, read from its files.

    Raises:
        AssertionError: the files are not contiguous, or a record is not valid
            (a torn tail would be: read a log once its writer has caught up).
    """
    bases = _segments(store)
    if not bases:
        return LogImage(store, 0, 0)
    image = LogImage(store, bases[0], bases[0])
    for i, base in enumerate(bases):
        assert base == bases[0] + i * FILE_SIZE, f"{store}: commit-log files {bases} not contiguous"
        data = (store / "commitlog" / segment_name(base)).read_bytes()
        pos = 0
        while pos + record.BLANK_SIZE <= len(data):
            if data[pos : pos + record.BLANK_SIZE] == bytes(record.BLANK_SIZE):
                assert base == bases[-1], f"{store}: the log ends at {base + pos}, files follow"
                image.end = base + pos
                return image
            try:
                rec = record.decode(data, pos, max_size=FILE_SIZE)
            except record.RecordError as exc:
                raise AssertionError(f"{store}: commit log at {base + pos}: {exc}") from None
            if isinstance(rec, record.Blank):
                break
            assert rec.commit_offset == base + pos, (store, rec.commit_offset, base + pos)
            image.records.append(rec)
            pos += record.peek(data[pos : pos + record.BLANK_SIZE])  # its TOTALSIZE
        image.end = base + FILE_SIZE
    return image


def assert_identical(images: dict[int, LogImage]) -> int:
    """The members' logs end at the same offset and hold the same bytes from
    the latest first file on; returns the common end."""
    ends = {i: img.end for i, img in images.items()}
    assert len(set(ends.values())) == 1, f"the members' logs end at different offsets: {ends}"
    lo = max(img.start for img in images.values())
    end = next(iter(ends.values()))
    (ref_id, ref), *others = images.items()
    want = ref.bytes(lo, end)
    for other_id, img in others:
        got = img.bytes(lo, end)
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
            raise AssertionError(
                f"the logs of members {ref_id} and {other_id} differ at offset {lo + at} "
                f"(compared [{lo}, {end}))"
            )
    return end


# ---------------------------------------------------------------- the history checker


@dataclass
class HistoryResult:
    acked: int = 0  # SEND_OK attempts
    lost: int = 0  # SEND_OK attempts not in the log where they were acknowledged
    differing: int = 0  # there, but twice, or at other queue offsets, ids or consumer reads
    unacked_stored: int = 0  # attempts not answered SEND_OK whose body is in the log
    unacked_absent: int = 0
    keys_stored_twice: int = 0  # messages whose retries were stored more than once
    problems: list[str] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)  # set by check_final

    def assert_ok(self) -> None:
        if self.problems:
            shown = "\n  ".join(self.problems[:20])
            raise AssertionError(
                f"{len(self.problems)} history violation(s) ({self.lost} lost, "
                f"{self.differing} different; {self.summary()}):\n  {shown}"
            )

    def summary(self) -> str:
        return (
            f"{self.acked} acknowledged, {self.unacked_stored} unacknowledged but stored, "
            f"{self.unacked_absent} unacknowledged and absent, "
            f"{self.keys_stored_twice} messages stored twice"
        )


def check_history(
    attempts: Sequence[Attempt],
    image: LogImage,
    pulled: dict[str, dict[tuple[int, int], bytes]] | None = None,
    lost_allowed: Iterable[Attempt] = (),
) -> HistoryResult:
    """The Jepsen-style check of a group's final log against every attempt,
    over the topics the attempts were sent to.

    - every SEND_OK attempt (but `lost_allowed`) is in the log exactly once,
      at the commit offset, queue id, queue offset and msg id it was told,
      and, given `pulled` (what a consumer reads from the final master, by
      topic), a consumer reads it at that queue offset of its topic;
    - every record of those topics in the log was sent by some attempt
      (nothing made up, no bytes of two messages spliced);
    - each queue's offsets run 0, 1, 2, ... in log order (truncations and
      elections never reuse or skip a queue offset).
    """
    out = HistoryResult()
    skip = {id(a) for a in lost_allowed}
    sent = {a.body: a for a in attempts}
    topics = {a.topic for a in attempts} or {TOPIC}
    at_offset: dict[int, record.Record] = {}
    offsets_of: dict[bytes, list[int]] = defaultdict(list)
    next_queue_offset: dict[tuple[str, int], int] = {}
    keys: dict[str, int] = defaultdict(int)
    for rec in image.records:
        if rec.topic not in topics:
            continue
        at_offset[rec.commit_offset] = rec
        offsets_of[rec.body].append(rec.commit_offset)
        if rec.body not in sent:
            out.problems.append(f"record at {rec.commit_offset} was never sent: {rec.body[:40]!r}")
        else:
            keys[sent[rec.body].key] += 1
        # A log copied from a later file on starts its queues anywhere.
        queue = (rec.topic, rec.queue_id)
        want = next_queue_offset.get(queue, 0 if image.start == 0 else rec.queue_offset)
        if rec.queue_offset != want:
            out.problems.append(
                f"record at {rec.commit_offset} has queue offset {rec.topic} "
                f"{rec.queue_id}:{rec.queue_offset}, the queue's next is {want}"
            )
        next_queue_offset[queue] = rec.queue_offset + 1
    out.keys_stored_twice = sum(1 for n in keys.values() if n > 1)
    for a in attempts:
        if not a.ok:
            if offsets_of.get(a.body):
                out.unacked_stored += 1
            else:
                out.unacked_absent += 1
            continue
        if id(a) in skip:
            continue
        out.acked += 1
        rec = at_offset.get(a.commit_offset)
        found = offsets_of.get(a.body, [])
        if rec is None or rec.body != a.body:
            out.lost += 1
            out.problems.append(f"acknowledged {a}: not in the log there (found at {found})")
            continue
        wrong = []
        if len(found) != 1:
            wrong.append(f"in the log {len(found)} times, at {found}")
        if (rec.topic, rec.queue_id, rec.queue_offset) != (a.topic, a.queue_id, a.queue_offset):
            wrong.append(f"the log has it at {rec.topic} queue {rec.queue_id}:{rec.queue_offset}")
        if record.message_id(rec.store_host, rec.commit_offset) != a.msg_id:
            wrong.append(f"msg id {a.msg_id} does not match the record")
        read = pulled.get(a.topic, {}) if pulled is not None else None
        if read is not None and read.get((a.queue_id, a.queue_offset)) != a.body:
            wrong.append("a consumer does not read it at its queue offset")
        if wrong:
            out.differing += 1
            out.problems += [f"acknowledged {a}: {w}" for w in wrong]
    return out


@dataclass
class Handoff:
    """Two masters in turn, from the producers' records: `gap_s` from the
    latest start of a send the first answered SEND_OK to the earliest answer
    of a send the next answered SEND_OK (negative: the first acknowledged a
    send after the next one had)."""

    before: str
    after: str
    last_start: float
    last_answer: float
    first_answer: float

    @property
    def gap_s(self) -> float:
        return self.first_answer - self.last_start

    @property
    def unavailable_s(self) -> float:
        """Last SEND_OK answer of one master -> first of the next."""
        return self.first_answer - self.last_answer


def handoffs(attempts: Sequence[Attempt]) -> list[Handoff]:
    """Split the SEND_OK attempts into runs by answering broker, in the order
    of the commit offsets they were acknowledged at (the order of the group's
    one log), and give each change of broker."""
    oks = sorted((a for a in attempts if a.ok), key=lambda a: a.commit_offset)
    runs: list[list[Attempt]] = []
    for a in oks:
        if runs and runs[-1][0].addr == a.addr:
            runs[-1].append(a)
        else:
            runs.append([a])
    return [
        Handoff(
            x[0].addr,
            y[0].addr,
            max(a.start for a in x),
            max(a.end for a in x),
            min(a.end for a in y),
        )
        for x, y in zip(runs, runs[1:], strict=False)
    ]


def check_no_overlap(attempts: Sequence[Attempt]) -> list[Handoff]:
    """At no moment do two brokers both acknowledge, from the producers' own
    records. Every SEND_OK carries the commit offset it was stored at, and
    check_history proves they all sit in the group's one log; a master only
    acknowledges what its own log holds, so in log order the acknowledging
    brokers take turns. A turn is proven over when a send the earlier broker
    acknowledged *started* only after a send the next broker acknowledged at
    a later offset had already been *answered*: then the earlier broker
    decided after the next one did, and the check fails. Client delays only
    widen the intervals, so a loaded machine cannot make it fail wrongly.
    Returns the handoffs (their gaps are reported).
    """
    found = handoffs(attempts)
    bad = [h for h in found if h.gap_s <= 0]
    assert not bad, "two brokers answered SEND_OK at overlapping times: " + "; ".join(
        f"{h.before} acknowledged a send started at {h.last_start:.3f}, after {h.after} "
        f"had answered SEND_OK at {h.first_answer:.3f} for a later offset"
        for h in bad
    )
    return found


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# ---------------------------------------------------------------- scenarios
#
# Each drives one kind of fault through `rounds` rounds on a started group
# with producers running, asserts what must hold during the fault, and leaves
# the group steady (a ready leader, every member alive and in sync) for the
# next round or the final `check_final`. The integration tests run them with
# few rounds, the chaos suite with FERRY_CHAOS_ROUNDS.


@dataclass
class Outcome:
    """What the scenarios measured (for the asserts and the chaos report)."""

    failover_s: list[float] = field(default_factory=list)  # fault -> first SEND_OK, new master
    skipped: int = 0  # held kill rounds that came after the slaves left the set
    cuts: list[str] = field(default_factory=list)  # truncations of rejoining members
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)  # created by new_topics
    groups: list[str] = field(default_factory=list)  # subscription groups, likewise
    lost_topics: set[str] = field(default_factory=set)  # missing somewhere once steady
    lost_groups: set[str] = field(default_factory=set)

    def tables_note(self) -> str:
        return (
            f"topics/groups lost: {len(self.lost_topics)}/{len(self.lost_groups)} of "
            f"{len(self.topics)}/{len(self.groups)} created"
            + (f" ({sorted(self.lost_topics)}, {sorted(self.lost_groups)})"
               if self.lost_topics or self.lost_groups else "")
        )  # fmt: skip

    def failover_note(self) -> str:
        f = self.failover_s
        if not f:
            return "no failover measured"
        return (
            f"failover (fault -> first SEND_OK from the new master) over {len(f)}: "
            f"p50 {percentile(f, 0.5):.2f}s, p99 {percentile(f, 0.99):.2f}s, "
            f"max {max(f):.2f}s (lease TTL {TTL_S:g}s); each {[round(x, 2) for x in f]}"
        )


def _deadline_left(since: float, budget_s: float) -> float:
    return max(0.1, since + budget_s - time.monotonic())


def _rejoin(group: FailoverGroup, m: Member, mark: int, epoch_start: int, out: Outcome) -> None:
    """`m` was restarted after log position `mark` while a newer epoch that
    starts at `epoch_start` leads: it follows, cut back to the epoch's start
    when its log ran past it (its unacknowledged tail), else untouched."""
    wait_for(lambda: RECOVERED in m.log()[mark:], 10, f"{m} to recover its store")
    _, end = group.recovered_after(m, mark)
    group.wait_isr()
    text = m.log()[mark:]
    assert end >= epoch_start, f"{m} recovered to {end}, before the new epoch's start {epoch_start}"
    if end > epoch_start:
        line = f"cutting this log at {epoch_start} (it ended at {end})"
        assert line in text, f"{m} ran past the new epoch's start but did not log {line!r}"
        out.cuts.append(f"member {m.id}: {end} -> {epoch_start}")
    else:
        assert "cutting this log" not in text, f"{m} cut a log that ended at the epoch's start"


def _log_end(group: FailoverGroup, m: Member) -> int:
    st = group.ha_status(m)
    return st.master_max_offset if st is not None else -1


def kill_master(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    held: Container[int] = (),
) -> None:
    """SIGKILL the master under load. A new master answers SEND_OK within
    lease TTL + 5 s of the kill; every SEND_OK so far is read from it at its
    queue offset; the old master, restarted, follows it, cut back to the new
    epoch's start when it had an unacknowledged tail, and is in sync again.

    In the rounds numbered in `held` (from 0; the group needs ha_proxies) the
    master's HA link is blackholed first, and the kill comes once the master
    has appended sends after that (they never reach a slave; well within
    slaveTimeout, so the slaves are still in the in-sync set): the old master
    surely has a tail to cut."""
    for r in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        producers.wait_acked(30, addr=old.addr)
        if r in held:
            # A channel that is connected already: the waits below are short.
            wait_for(lambda o=old: group.ha_status(o), 5, f"{old} to answer GetHAStatus")
            group.blackhole_ha(old)
            # What is appended after this read of the log end never leaves the
            # proxy; the send below is (the workers may all be waiting).
            floor = _log_end(group, old)
            producers.send_async(old.addr)
            # (Should the machine be slower than slaveTimeout from here to the
            # kill, the slaves leave the in-sync set first: handled below.)
            wait_for(lambda o=old, f=floor: _log_end(group, o) > f >= 0, 15,
                     "a send appended after the link was cut", interval_s=0.005)  # fmt: skip
        killed = time.monotonic()
        group.kill(old)
        out.faults.append(f"kill member {old.id}" + (" holding sends" if r in held else ""))
        if r in held and group.view().in_sync == [old.id]:
            # The kill came after a held send timed out (a machine slower than
            # slaveTimeout): the slaves had left the in-sync set, so rightly
            # nobody may be elected. Expect that, then bring the master back.
            out.notes.append(f"round {r}: the held master was alone in sync when killed")
            out.skipped += 1
            group.restart(old)
            group.heal_ha(old)
            group.wait_leader(timeout_s=TTL_S * 3 + 15)
            continue
        new = group.wait_leader(exclude={old.id}, timeout_s=_deadline_left(killed, TTL_S + 5))
        first = producers.wait_first_ok(new.addr, killed, _deadline_left(killed, TTL_S + 5))
        out.failover_s.append(first.end - killed)
        acked = producers.acked()
        pulled = group.pull(new, producers.topic)
        unread = [str(a) for a in acked if pulled.get((a.queue_id, a.queue_offset)) != a.body]
        assert not unread, f"{len(unread)} SEND_OK not read from the new master: {unread[:5]}"
        start = group.view().epoch_start()
        mark = len(old.log())
        group.restart(old)
        cuts = len(out.cuts)
        _rejoin(group, old, mark, start, out)
        if r in held:
            group.heal_ha(old)
            assert len(out.cuts) > cuts, f"{old} held an unacknowledged tail, yet cut nothing"


_probes = itertools.count()


def etcd_partition(
    group: FailoverGroup, producers: Producers, rounds: int, out: Outcome
) -> list[Producers]:
    """Cut the master off from etcd (its etcd proxy blackholes) under load,
    with a probe producer pinned to it. It stops acknowledging within the
    lease TTL, telling the probe why; another member is elected and answers
    SEND_OK; the probe keeps trying the old master meanwhile; once healed the
    old master follows. Returns the probes (their records join the history)."""
    probes = []
    for _ in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        name = f"probe{next(_probes)}-"  # keys unique across calls
        probe = Producers(lambda: None, count=1, pinned=old.addr, name=name).start()
        probes.append(probe)
        try:
            probe.wait_acked(5)
            producers.wait_acked(20, addr=old.addr)
            cut = time.monotonic()
            group.blackhole_etcd(old)
            out.faults.append(f"etcd partition of member {old.id}")
            new = group.wait_leader(exclude={old.id}, timeout_s=_deadline_left(cut, TTL_S + 5))
            first = producers.wait_first_ok(new.addr, cut, _deadline_left(cut, TTL_S + 5))
            out.failover_s.append(first.end - cut)
            # The probe tried the old master after the new one acknowledged.
            wait_for(lambda f=first, p=probe: any(a.start > f.end for a in p.snapshot()), 10,
                     "the probe to try the old master after the failover")  # fmt: skip
        finally:
            probe.stop()
            group.heal_etcd(old)
        from_old = [a for p in (producers, probe) for a in p.acked() if a.addr == old.addr]
        # A send decided no earlier than it started: one that started after
        # cut + TTL and was acknowledged proves the fence failed (answers
        # arriving late prove nothing).
        last = max(a.start for a in from_old)
        assert last <= cut + TTL_S, (
            f"the old master acknowledged a send started {last - cut:.2f}s after losing etcd "
            f"(TTL {TTL_S}s)"
        )
        fenced = [a for a in probe.snapshot()
                  if a.start > cut and a.status == "UNAVAILABLE" and "lease" in a.detail]  # fmt: skip
        assert fenced, f"the old master never refused for its lease: {probe.statuses()}"
        out.notes.append(
            f"etcd cut off member {old.id}: its last SEND_OK {last - cut:.2f}s after the cut, "
            f"first fence refusal {min(a.end for a in fenced) - cut:.2f}s, new master's first "
            f"SEND_OK {first.end - cut:.2f}s (a send started {first.start - last:.2f}s after "
            "the old master's last SEND_OK answer)"
        )
        group.wait_isr(timeout_s=TTL_S + 15)  # the old master is back, as an in-sync slave
        # ...and holds a lease again (its member key lives under it): it can be elected.
        wait_for(lambda o=old: o.id in group.view().members, TTL_S + 5,
                 f"{old} to hold an etcd lease again")  # fmt: skip
    return probes


def lagging_replica(group: FailoverGroup, producers: Producers, rounds: int, out: Outcome) -> None:
    """Three members. A follower is paused (SIGSTOP) until it leaves the
    in-sync set, and more is acknowledged without it. Then the master dies,
    the in-sync follower is paused and the lagging one resumed: alone for
    over a TTL after the leader key lapsed, the lagging one is not elected.
    The in-sync one, resumed, wins. The old master rejoins."""
    assert len(group.members) >= 3
    for r in range(rounds):
        group.wait_isr()
        master = group.wait_leader()
        followers = [m for m in group.members if m is not master]
        lagging, in_sync = followers[r % 2], followers[1 - r % 2]
        producers.wait_acked(20, addr=master.addr)
        group.pause(lagging)
        out.faults.append(f"pause member {lagging.id}, kill master {master.id}")
        group.wait_isr([master.id, in_sync.id], timeout_s=SLAVE_TIMEOUT_S + 5)
        producers.wait_acked(20, addr=master.addr)  # acknowledged without it
        killed = time.monotonic()
        group.kill(master)
        group.pause(in_sync)
        group.resume(lagging)
        try:
            group.wait_leaderless()
            group.assert_no_leader(TTL_S + 1, candidate=lagging)
            assert lagging.alive
        finally:
            group.resume(in_sync)
        new = group.wait_leader(timeout_s=2 * TTL_S + 5)
        assert new is in_sync, f"{new} won; the in-sync {in_sync} should have"
        producers.wait_first_ok(new.addr, killed, 15)
        start = group.view().epoch_start()
        mark = len(master.log())
        group.restart(master)
        _rejoin(group, master, mark, start, out)


def handover(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    etcd_endpoint: str,
    to: Member | None = None,
) -> None:
    """`ferry failover --to ID` (the real CLI) with producers running: the
    target (`to`, else the other members in turn) is the new master, ready
    when the command returns; it answers SEND_OK; the old master follows
    with nothing cut (it had handed over everything it stored)."""
    for r in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        others = [m for m in group.members if m is not old]
        target = to or others[r % len(others)]
        producers.wait_acked(20, addr=old.addr)
        mark = len(old.log())
        asked = time.monotonic()
        done = run_ferry("failover", "-c", CLUSTER, "-b", BROKER, "--to", str(target.id),
                         "--etcd", etcd_endpoint, timeout_s=60)  # fmt: skip
        took = time.monotonic() - asked
        out.faults.append(f"handover {old.id} -> {target.id}")
        assert done.returncode == 0, done.stderr
        assert f"member {target.id} at {target.addr} is master" in done.stdout, done.stdout
        assert group.leader() is target
        first = producers.wait_first_ok(target.addr, asked, 15)
        out.failover_s.append(first.end - asked)
        group.wait_isr()
        assert "cutting this log" not in old.log()[mark:], f"{old} cut its log after a handover"
        out.notes.append(f"handover {old.id} -> {target.id}: the command took {took:.2f}s")


def ha_partition(group: FailoverGroup, producers: Producers, out: Outcome) -> None:
    """The master's HA link is blackholed under load: a send times out
    (FLUSH_SLAVE_TIMEOUT), the slaves leave the published in-sync set, and
    once healed they catch up and are back in it (and report in-sync
    readiness again). No election."""
    group.wait_isr()
    master = group.wait_leader()
    producers.wait_acked(20, addr=master.addr)
    cut = time.monotonic()
    group.blackhole_ha(master)
    out.faults.append(f"HA partition of master {master.id}")
    try:
        wait_for(lambda: any(a.status == "FLUSH_SLAVE_TIMEOUT" and a.end > cut
                             for a in producers.snapshot()),
                 SLAVE_TIMEOUT_S + 5, "a send to time out for the slaves")  # fmt: skip
        group.wait_isr([master.id], timeout_s=5)
    finally:
        group.heal_ha(master)
    group.wait_isr()
    assert group.leader() is master
    group.wait_eligible(yes=group.live())  # in-sync readiness is back for every slave


def pause_follower(group: FailoverGroup, producers: Producers, out: Outcome) -> None:
    """A follower stands still (SIGSTOP) for longer than slaveTimeout under
    load: it leaves the in-sync set, and resumed it is back in it."""
    group.wait_isr()
    master = group.wait_leader()
    follower = next(m for m in group.members if m is not master)
    producers.wait_acked(20, addr=master.addr)
    group.pause(follower)
    out.faults.append(f"pause follower {follower.id}")
    try:
        rest = sorted(m.id for m in group.members if m is not follower)
        group.wait_isr(rest, timeout_s=SLAVE_TIMEOUT_S + 5)
    finally:
        group.resume(follower)
    group.wait_isr()


def _freeze(group: FailoverGroup, producers: Producers, old: Member, out: Outcome) -> Attempt:
    """SIGSTOP the master `old` and hold it until another member is elected
    and answers SEND_OK (`old` is past its lease then), then SIGCONT; returns
    that first SEND_OK."""
    frozen = time.monotonic()
    group.pause(old)
    try:
        new = group.wait_leader(exclude={old.id}, timeout_s=_deadline_left(frozen, TTL_S + 5))
        first = producers.wait_first_ok(new.addr, frozen, _deadline_left(frozen, TTL_S + 5))
    finally:
        group.resume(old)
    out.failover_s.append(first.end - frozen)
    return first


def _note_cut(old: Member, mark: int, out: Outcome) -> None:
    if "cutting this log" in old.log()[mark:]:
        out.cuts.append(f"member {old.id} (frozen)")


def freeze_leader(
    group: FailoverGroup, producers: Producers, rounds: int, out: Outcome
) -> list[Producers]:
    """The master stands still (SIGSTOP: a long GC pause, a frozen VM) under
    load, with a probe producer pinned to it, until another member is elected
    and answers SEND_OK; then it is resumed (SIGCONT). It acknowledges no send
    started after the new master's first SEND_OK (the probe keeps trying it),
    and rejoins the in-sync set as a follower. Returns the probes (their
    records join the history)."""
    probes = []
    for _ in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        probe = Producers(lambda: None, count=1, pinned=old.addr, name=f"probe{next(_probes)}-")
        probes.append(probe.start())
        try:
            probe.wait_acked(5)
            producers.wait_acked(20, addr=old.addr)
            mark = len(old.log())
            first = _freeze(group, producers, old, out)
            resumed = time.monotonic()
            out.faults.append(f"freeze leader {old.id}")
            group.wait_isr(timeout_s=TTL_S + 15)
            wait_for(lambda p=probe, t=resumed: any(a.start > t for a in p.snapshot()), 10,
                     "the probe to try the resumed member")  # fmt: skip
        finally:
            probe.stop()
        _note_cut(old, mark, out)
        late = [str(a) for p in (producers, probe) for a in p.acked()
                if a.addr == old.addr and a.start > first.end]  # fmt: skip
        assert not late, (
            f"the frozen master acknowledged {len(late)} send(s) started after the new master's "
            f"first SEND_OK: {late[:5]}"
        )
        out.notes.append(
            f"froze leader {old.id}: member at {first.addr} answered SEND_OK "
            f"{out.failover_s[-1]:.2f}s later; resumed, back in sync "
            f"{time.monotonic() - resumed:.2f}s after"
        )
    return probes


def create_group(channel: grpc.Channel, name: str) -> common_pb2.DataVersion:
    """Creates subscription group `name` (defaults) on the broker behind `channel`."""
    response = broker_admin_pb2_grpc.BrokerAdminStub(channel).UpdateAndCreateSubscriptionGroup(
        broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
            config=common_pb2.SubscriptionGroupConfig(group_name=name)
        ),
        timeout=10,
    )
    return response.data_version


def wait_tables(
    group: FailoverGroup, topics: Sequence[str], groups: Sequence[str], timeout_s: float
) -> list[tuple[str, str, str]]:
    """Until every live member holds `topics` and `groups` and the name
    server routes `topics`; what is still missing at the deadline (see
    `FailoverGroup.tables_missing`), else nothing."""
    missing: list[tuple[str, str, str]] = []

    def complete() -> bool:
        nonlocal missing
        missing = group.tables_missing(topics, groups)
        return not missing

    with contextlib.suppress(AssertionError):
        wait_for(complete, timeout_s, "every topic and group everywhere", interval_s=0.1)
    return missing


def new_topics(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    rng: random.Random,
) -> list[Producers]:
    """Each round creates a topic and a subscription group on the master
    (`NewTopicN`, `NewGroupN`) and starts producers sending to that topic;
    after 5 of their SEND_OKs, and `rng`'s delay after the creation (within
    the slave-sync interval, at most 5 s: the followers may not have pulled
    the new tables yet), the master is frozen (SIGSTOP until another member
    is elected and answers SEND_OK, then SIGCONT) or, every other round,
    SIGKILLed and restarted. Once the group is steady, every topic and group
    created so far is on every live member and every topic in the name
    server's route (waiting one slave-sync interval + 5 s); what is not is
    counted lost in `out` (and not waited for again). Returns the topics'
    producers (their records join the history)."""
    window_s = min(5.0, group.slave_sync_interval_s)
    extra = []
    for _ in range(rounds):
        n = len(out.topics)
        how = ("freeze", "kill")[n % 2]
        group.wait_isr()
        old = group.wait_leader()
        topic, sub = f"NewTopic{n}", f"NewGroup{n}"
        delay = rng.uniform(0, window_s)
        channel = group.channel(old.addr)
        created = time.monotonic()
        create_topic(channel, topic, QUEUES)
        create_group(channel, sub)
        out.topics.append(topic)
        out.groups.append(sub)
        senders = Producers(group.master_addr, count=2, name=f"{topic}-", topic=topic).start()
        extra.append(senders)
        try:
            wait_for(lambda s=senders, t=created + delay: time.monotonic() >= t
                     and len(s.acked()) >= 5, window_s + 15,
                     f"5 SEND_OK to {topic}, {delay:.2f}s after creating it",
                     interval_s=0.005)  # fmt: skip
            had = {m.id: (t := group.tables(m)) is not None and topic in t[0] and sub in t[1]
                   for m in group.live() if m is not old}  # fmt: skip
            fault_at = time.monotonic() - created
            out.faults.append(f"{how} leader {old.id} after creating {topic}")
            mark = len(old.log())
            if how == "freeze":
                _freeze(group, producers, old, out)
                group.wait_isr(timeout_s=TTL_S + 15)
                _note_cut(old, mark, out)
            else:
                killed = time.monotonic()
                group.kill(old)
                new = group.wait_leader(exclude={old.id},
                                        timeout_s=_deadline_left(killed, TTL_S + 5))  # fmt: skip
                first = producers.wait_first_ok(new.addr, killed,
                                                _deadline_left(killed, TTL_S + 5))  # fmt: skip
                out.failover_s.append(first.end - killed)
                start = group.view().epoch_start()
                mark = len(old.log())
                group.restart(old)
                _rejoin(group, old, mark, start, out)
        finally:
            senders.stop()
        gone = wait_tables(
            group,
            [t for t in out.topics if t not in out.lost_topics],
            [g for g in out.groups if g not in out.lost_groups],
            group.slave_sync_interval_s + 5,
        )
        out.lost_topics |= {name for kind, name, _ in gone if kind == "topic"}
        out.lost_groups |= {name for kind, name, _ in gone if kind == "group"}
        where: dict[str, list[str]] = defaultdict(list)
        for _, name, place in gone:
            where[name or "tables"].append(place)
        out.notes.append(
            f"{how} leader {old.id} {fault_at:.2f}s after creating {topic}/{sub} (drawn "
            f"{delay:.2f}s), {len(senders.acked())} SEND_OK to it; followers holding both "
            f"then: {had}; " + (f"missing once steady: {dict(where)}" if gone else "all kept")
        )
    return extra


def run_fault(
    name: str,
    group: FailoverGroup,
    producers: Producers,
    out: Outcome,
    etcd_endpoint: str,
    rng: random.Random | None = None,
) -> list[Producers]:
    """One fault of `FAULTS` by name (three members, etcd and HA proxies);
    returns the extra producers (probes, a new topic's producers) whose
    records join the history. `rng` draws a new topic's fault delay."""
    if name == "kill":
        kill_master(group, producers, 1, out, held={0} if len(out.faults) % 2 else ())
    elif name == "etcd":
        return etcd_partition(group, producers, 1, out)
    elif name == "ha":
        ha_partition(group, producers, out)
    elif name == "handover":
        handover(group, producers, 1, out, etcd_endpoint)
    elif name == "pause":
        pause_follower(group, producers, out)
    elif name == "lagging":
        lagging_replica(group, producers, 1, out)
    elif name == "leader-freeze":
        return freeze_leader(group, producers, 1, out)
    elif name == "new-topic":
        return new_topics(group, producers, 1, out, rng or random.Random(len(out.faults)))
    else:
        raise ValueError(f"no fault {name!r}")
    return []


FAULTS = ("kill", "etcd", "ha", "handover", "pause", "lagging", "leader-freeze", "new-topic")


def check_final(
    group: FailoverGroup,
    producers: Sequence[Producers],
    lost_allowed: Iterable[Attempt] = (),
    on_result: Callable[[HistoryResult], None] | None = None,
) -> HistoryResult:
    """After the faults: producers stopped, every member in sync, the logs
    byte-identical, the history checked against the leader's log and what a
    consumer reads from it (every topic the producers sent to), and no two
    masters' SEND_OKs interleaved. `on_result` sees the history's result
    before it is asserted on (a report keeps its figures when it fails)."""
    for p in producers:
        p.stop()
    dead = [str(m) for m in group.members if not m.alive]
    assert not dead, (
        f"member(s) {dead} died during the test: {[m.log()[-2000:] for m in group.members if not m.alive]}"
    )
    group.wait_isr()
    leader, end, images = group.settled_images()
    assert images[leader.id].end == end, (images[leader.id].end, end)
    assert_identical(images)
    attempts = [a for p in producers for a in p.snapshot()]
    pulled = group.pull_topics(leader, {a.topic for a in attempts} | {TOPIC})
    result = check_history(attempts, images[leader.id], pulled, lost_allowed)
    if on_result is not None:
        on_result(result)
    result.assert_ok()
    # Acknowledgements a lossy election gave up are in no log; their offsets
    # belong to the new master's messages.
    gone = {id(a) for a in lost_allowed or ()}
    result.handoffs = check_no_overlap([a for a in attempts if id(a) not in gone])
    return result
