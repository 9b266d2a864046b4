"""`FailoverGroup`: one name server and N members of broker-a (`enableFailover=true`,
SYNC_MASTER, lease TTL 2 s, slaveTimeout 1 s, small commit-log files) as subprocesses on
fixed loopback ports, so a restarted member comes back where its peers and the name
server look.

Optionally each member reaches etcd through its own `FaultProxy` (`etcd_proxies`), and
each member's HA port is reached through a proxy on an address of its own (`ha_proxies`:
the member advertises `brokerIP2=127.0.0.1<id>`, which the proxy listens on in front of
its haListenPort, so slaves that learn the master's HA address from etcd go through it).
It reads the group's keys straight from etcd (aetcd) and kills, pauses, restarts and stops
members by PID. It never sleeps to wait: every wait polls a condition with a deadline
(tests/waiting.py).

Fixed ports come from a `PortRange` the caller owns (32000-32767: below the ephemeral
range and clear of the other suites' ranges, see PortRange).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.v1 import (
    ha_admin_pb2,
    ha_admin_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from services.broker.failover.etcd import Etcd
from services.broker.failover.node import IN_SYNC_HEALTH
from tests.conftest import LoopThread, broker_options
from tests.failover.config import (
    BROKER,
    CHANNEL_OPTIONS,
    FILE_SIZE,
    PATIENCE_S,
    PREFIX,
    QUEUES,
    RECOVERED,
    SLAVE_SYNC_INTERVAL_MS,
    SLAVE_TIMEOUT_MS,
    TOPIC,
    TTL_MS,
)
from tests.failover.logs import LogImage, read_image
from tests.failover.member import GroupView, Member
from tests.faultproxy import FaultProxy
from tests.integration.support import (
    BrokerServer,
    NamesrvProcess,
    PortRange,
    create_topic,
    pull_all,
    stop_pid,
)
from tests.waiting import wait_equal, wait_for


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
        leader = self.wait_leader(timeout_s=PATIENCE_S)
        self.wait_routed(leader)
        create_topic(self.channel(leader.addr), TOPIC, QUEUES)
        for m in self.members:
            wait_for(lambda m=m: self.has_topic(m), PATIENCE_S, f"{m} to have topic {TOPIC}")
        self.wait_isr(timeout_s=PATIENCE_S)
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

    def wait_leader(self, exclude: Iterable[int] = (), timeout_s: float = PATIENCE_S) -> Member:
        """Until a ready leader other than `exclude` is in etcd."""
        excluded = set(exclude)

        def found():
            m = self.leader()
            return m if m is not None and m.id not in excluded else None

        return wait_for(found, timeout_s, f"a ready leader other than {sorted(excluded)}")

    def wait_leaderless(self, timeout_s: float = PATIENCE_S) -> None:
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

    def wait_isr(
        self, ids: Iterable[int] | None = None, timeout_s: float = PATIENCE_S
    ) -> GroupView:
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
