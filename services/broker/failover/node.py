"""Automatic failover on etcd (enableFailover): one broker group elects its
master, and nothing a SYNC_MASTER acknowledged is lost on the way.

A `FailoverNode` is the broker process of one group member. It runs the
broker (`BrokerApp`) in the role etcd gives it and restarts it on every role
change (an *incarnation*: the store closes cleanly and reopens; a follower's
HA stream reconnects). One gRPC server serves every incarnation: the node
builds it once (ports, TLS, health, reflection) and each incarnation mounts
its servicers on it (`ferry.runtime.swap`); between two, calls get
UNAVAILABLE (retry), never CANCELLED. Likewise one RocketMQ-protocol server
(listenPort, fastListenPort) keeps its connections across roles, and what
they told it (consumers' heartbeats, orderly consumers' queue locks): each
incarnation installs its handler table on it; between two, every request is
answered SERVICE_NOT_AVAILABLE (14), which a RocketMQ producer retries at
another broker. A master that steps down serves
nothing until it knows its next role (the new leader is in etcd), or for
one lease TTL at most: then it serves reads as a follower of nobody.

- **Leadership.** Each member holds an etcd lease (`failoverLeaseTtl`, renewed
  every third of it). The leader holds `leader` under its lease: id,
  addresses, epoch and epoch history. When the key is gone (the lease
  lapsed: the master died or lost etcd), the eligible members campaign with
  one transaction: the key is still absent, and the `epoch` and `isr` keys
  are as read. The winner takes epoch + 1 and the in-sync set {itself},
  records `(epoch, log end)` in its store's history, starts as master and
  registers as the group's broker 0 with its epoch.
- **Eligibility.** Only members of the published in-sync set (`isr`) campaign
  (`allowLossyFailover=true` lets the others campaign one TTL later). The
  master adds a slave to the set once it has acked everything confirmed
  (published first, counted right away), and removes one that timed out a
  send or stayed disconnected for `slaveTimeout` (published before a send is
  acknowledged without it). A SYNC_MASTER acknowledges a send once every
  in-sync slave has acked it (`ReplicaAcks.require`), so whoever can win has
  every acknowledged message.
- **Fencing.** A master acknowledges nothing once `fence_margin_s` (10% of
  the TTL, at least 0.5 s: the clock-drift margin) separates it from the
  moment its lease could expire, counted from when it *sent* its last
  successful renewal; etcd cannot expire the lease before that. Name servers
  keep the registration with the highest epoch; a slave refuses an HA stream
  of another epoch (services.ha.protocol).
- **Rejoining.** A follower adopts its leader's epoch history; before it
  replicates it cuts its log at the last offset it shares with the leader
  (`epochs.divergence`, Kafka's KIP-101), which never cuts an acknowledged
  message (the leader has all of them).
- **Handover.** `ferry failover` writes `handover`; the master stops taking
  sends, waits until the chosen in-sync slave has everything, and revokes
  its lease; only that slave campaigns for a TTL.
- **Readiness.** The health name `ferry.failover.InSync` is SERVING while
  this member is master or in its master's published in-sync set, i.e. while
  it could be elected. Kubernetes probes it, so a rolling update restarts the
  next member only once a restarted one is eligible again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping

import aetcd.exceptions
from prometheus_client import CollectorRegistry, Counter, Gauge

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler, RemotingServer
from ferry.runtime.errors import Unavailable
from ferry.runtime.metrics_http import MetricsEndpoint, start_metrics_endpoint
from ferry.runtime.server import GrpcServer
from ferry.runtime.swap import ServiceSwitch
from services.broker.config import BrokerConfig
from services.broker.failover import epochs
from services.broker.failover.epochs import EpochHistory
from services.broker.failover.etcd import Etcd, EtcdUnavailable, GroupState, dumps, group_prefix
from services.broker.incarnation import Incarnation
from services.broker.messaging.clients import ClientTables
from services.broker.messaging.locks import QueueLocks

log = logging.getLogger(__name__)

IN_SYNC_HEALTH = "ferry.failover.InSync"  # grpc.health.v1 name: this member is eligible
SWITCH_GRACE_S = 0.5  # in-flight calls of an incarnation that hands over its role
# A slave this close to the confirmed offset is counted at once and published in
# the in-sync set when it has caught up (it has every acknowledged message).
JOIN_GAP = 4 << 20


def replica_key(member_id: int) -> tuple[str, int]:
    """How services.ha.master keys an authenticated replica's acks."""
    return ("replica", member_id)


class _Unavailable(Mapping[int, Handler]):
    """The RocketMQ-protocol table between two incarnations: every code is
    answered SERVICE_NOT_AVAILABLE, saying why (RocketMQ's producers send to
    another broker, its consumers try again)."""

    def __init__(self, why: str) -> None:
        self.why = why

        async def answer(connection: Connection, request: Command) -> Command:
            return request.answer(codes.SERVICE_NOT_AVAILABLE, self.why)

        self._answer = answer

    def __getitem__(self, code: int) -> Handler:
        return self._answer

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Delegating:
    """The node's /metrics: its own series and the current incarnation's."""

    def __init__(self, node: FailoverNode) -> None:
        self.node = node

    def collect(self):
        yield from self.node.own_registry.collect()
        app = self.node.app
        if app is not None:
            yield from app.registry.collect()


class FailoverNode:
    def __init__(self, config: BrokerConfig, clock=None) -> None:
        self.config = config
        self.clock = clock
        self.ttl_s = config.failover_lease_ttl_s
        self.fence_margin_s = max(0.5, 0.1 * self.ttl_s)
        self.poll_s = min(0.25, self.ttl_s / 20)
        self.member_id = config.broker_id
        self.prefix = group_prefix(config.cluster_name, config.broker_name)
        self.etcd = Etcd(config.etcd_endpoints, timeout_s=max(0.5, self.ttl_s / 4))
        self.history = EpochHistory.open(config.store_root)
        self.app = None  # services.broker.app.BrokerApp, the current incarnation
        self.failed = asyncio.Event()
        self.stopping = False
        # Lease state.
        self.lease_id = 0
        self.valid_until = 0.0  # monotonic: acknowledge nothing at or after this
        self._lease_lost = asyncio.Event()
        # Role state.
        self.role = "none"  # "leader", "follower" or "none"
        self.epoch = 0  # led or followed
        self.leader_id: int | None = None
        self.isr: frozenset[int] = frozenset()
        self.handing_over = False
        self._in_sync_reported: tuple[object, bool] | None = None
        self._leader_raw = b""
        self._isr_lock = asyncio.Lock()
        self._isr_pending: set[int] = set()
        self._disconnected_since: dict[int, float] = {}
        self._port = config.grpc_port  # 0 until the server binds one, then kept
        self.server: GrpcServer | None = None  # one for all incarnations
        self.switch: ServiceSwitch | None = None
        # RocketMQ's protocol, one listener for all incarnations: (listenPort,
        # fastListenPort) once bound, fast -1 when off.
        self.remoting: RemotingServer | None = None
        self._remoting_ports = (config.listen_port, config.fast_port)
        # What the connections on that listener said (heartbeats) and hold
        # (orderly consumers' queue locks): theirs, so kept across runs too.
        self.remoting_clients = ClientTables()
        self.remoting_locks = QueueLocks()
        self._between = _Unavailable(
            f"member {self.member_id} of {config.broker_name} is starting or changing its role "
            "(automatic failover); try another broker"
        )
        self._idle_since = 0.0  # monotonic: when a step-down left this member without a run
        self._tasks: list[asyncio.Task] = []
        self._app_watch: asyncio.Task | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self.own_registry = CollectorRegistry()
        labels = (config.cluster_name, config.broker_name, str(self.member_id))

        def series(kind, name: str, doc: str):
            ids = ("cluster", "broker_name", "member")
            return kind(name, doc, ids, registry=self.own_registry).labels(*labels)

        self.m_epoch = series(
            Gauge,
            "ferry_ha_epoch",
            "The leader epoch this member leads or follows (0: none known yet).",
        )
        self.m_failovers = series(
            Counter,
            "ferry_ha_failovers_total",
            "Elections this member won after another master (a failover to it).",
        )
        self.m_leader = series(
            Gauge, "ferry_ha_leader", "1 while this member is its group's elected master."
        )
        self.m_leader_changes = series(
            Counter,
            "ferry_ha_leader_changes_total",
            "Leaders this member has seen take over its group (its own elections included).",
        )
        self.m_isr = series(
            Gauge,
            "ferry_ha_in_sync_replicas",
            "Members of the published in-sync set, the master included (as its master sees it).",
        )
        self.m_fenced = series(
            Gauge,
            "ferry_ha_fenced",
            "1 while this master holds back acknowledgements (its lease may be expiring).",
        )
        self.m_fenced.set_function(lambda: 1 if self.role == "leader" and not self.may_ack() else 0)

    # ------------------------------------------------------------ facade (like BrokerApp)

    @property
    def store(self):
        return self.app.store if self.app is not None else None

    @property
    def port(self) -> int:
        """The ferry.v1 gRPC port (bound)."""
        return self._port

    @property
    def remoting_port(self) -> int:
        return self._remoting_ports[0]

    @property
    def remoting_addr(self) -> str:
        return f"{self.config.broker_ip1}:{self.remoting_port}"

    def _serve_remoting(
        self,
        table: Mapping[int, Handler] | None,
        on_close: Callable[[Connection], None] | None = None,
    ) -> None:
        """An incarnation's table on the node's listener; None: answer 14 (a
        connection that closes meanwhile still leaves its groups and locks)."""
        if self.remoting is not None:
            if table is None:
                self.remoting.serve(self._between, self._closed_between_runs)
            else:
                self.remoting.serve(table, on_close)

    def _closed_between_runs(self, connection: Connection) -> None:
        """A connection closed between two runs: its registrations and locks go
        (its groups' other members see it at their next rebalance: with no run,
        nobody is notified)."""
        self.remoting_clients.channel_closed(connection)
        self.remoting_locks.channel_closed(connection)

    async def start(self) -> None:
        from services.broker.app import (
            grpc_server,
            listen_remoting,
            load_acl_file,
            remoting_server,
            servable,
        )

        cfg = self.config
        acl = load_acl_file(cfg)  # the node's servers check every run's requests
        self.switch = ServiceSwitch(
            servable(cfg),
            between=f"member {self.member_id} of {cfg.broker_name} is starting or changing its "
            "role (automatic failover); retry",
        )
        self.server = grpc_server(cfg, self.switch.services, self.own_registry, acl)
        self._port = await self.server.start()
        self.remoting = remoting_server(self.own_registry, self._between, acl=acl)
        self._remoting_ports = await listen_remoting(cfg, self.remoting)
        if cfg.metrics_port >= 0:
            self._metrics_endpoint = start_metrics_endpoint(
                cfg.bind_host, cfg.metrics_port, _Delegating(self),  # type: ignore[arg-type]
                loop=asyncio.get_running_loop(),
            )  # fmt: skip
        # Serve reads as a follower of nobody until etcd names a leader.
        await self._incarnate("follower", epoch=0, leader=None)
        self._tasks = [
            asyncio.create_task(self._keep_lease(), name="failover-lease"),
            asyncio.create_task(self._run(), name="failover"),
        ]
        log.info(
            "failover on: member %d of %s/%s, etcd %s, lease TTL %.1f s (acks stop %.1f s early)",
            self.member_id,
            cfg.cluster_name,
            cfg.broker_name,
            ";".join(cfg.etcd_endpoints),
            self.ttl_s,
            self.fence_margin_s,
        )

    async def stop(self) -> None:
        self.stopping = True
        tasks = [*self._tasks, *([self._app_watch] if self._app_watch else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.app is not None:
            await self.app.stop()
        if self.remoting is not None:
            await self.remoting.stop()  # nothing is installed by now
        if self.server is not None:
            await self.server.stop(SWITCH_GRACE_S)  # nothing is mounted by now
        if self.lease_id:
            # Leaving: let the others elect now instead of one TTL later.
            lease, self.lease_id = self.lease_id, 0
            with contextlib.suppress(Exception):
                await self.etcd.call(lambda c: c.revoke_lease(lease), timeout_s=1.0)
        await self.etcd.close()
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()

    # ------------------------------------------------------------ fencing

    def may_ack(self) -> bool:
        return time.monotonic() < self.valid_until

    def check_accepting(self) -> None:
        """messaging's Fence: raises Unavailable before a write this master must not take."""
        self.fence(True)

    def check_acknowledging(self) -> None:
        """messaging's Fence: raises Unavailable before an answer this master may not give."""
        self.fence(False)

    def fence(self, accepting: bool) -> None:
        """Refuse sends a deposed or expiring master must not take."""
        if self.role != "leader":
            return
        if accepting and self.handing_over:
            raise Unavailable(
                f"{self.config.broker_name} is handing its master role over (ferry failover); "
                "retry: the new master takes sends in a few seconds"
            )
        if not self.may_ack():
            raise Unavailable(
                f"{self.config.broker_name}'s master (epoch {self.epoch}) cannot renew its etcd "
                "lease and no longer acknowledges sends: the group may be electing a new master; "
                "retry (the message may have been stored, but it is not acknowledged)"
            )

    # ------------------------------------------------------------ lease

    async def _grant(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            try:
                lease = await self.etcd.call(lambda c: c.lease(max(1, round(self.ttl_s))))
            except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
                log.warning("cannot get an etcd lease: %s; retrying", exc)
                await asyncio.sleep(self.poll_s * 4)
                continue
            self.lease_id = lease.id
            self.valid_until = started + self.ttl_s - self.fence_margin_s
            self._lease_lost.clear()
            await self._put_member()
            return

    async def _keep_lease(self) -> None:
        await self._grant()
        interval = self.ttl_s / 3
        while True:
            await asyncio.sleep(interval if self.may_ack() else self.poll_s)
            lease = self.lease_id
            sent = time.monotonic()
            try:
                reply = await self.etcd.call(
                    lambda c, lease=lease: c.refresh_lease(lease), timeout_s=interval
                )
            except EtcdUnavailable as exc:
                log.warning(
                    "cannot renew the etcd lease: %s (acknowledgements stop in %.1f s)",
                    exc,
                    max(0.0, self.valid_until - time.monotonic()),
                )
                if time.monotonic() > self.valid_until + self.fence_margin_s:
                    self._lease_lost.set()  # it has expired by now
                continue
            except aetcd.exceptions.ClientError as exc:
                log.warning("etcd refused to renew the lease %x: %s", lease, exc)
                reply = None
            if reply is None or reply.TTL <= 0:
                log.warning("the etcd lease %x has expired; getting a new one", lease)
                self._lease_lost.set()
                self.valid_until = 0.0
                await self._grant()
                continue
            self.valid_until = sent + reply.TTL - self.fence_margin_s
            if self._lease_lost.is_set():
                # Renewed after all (etcd was away less than the TTL).
                self._lease_lost.clear()

    async def _put_member(self) -> None:
        store = self.store
        value = {
            "id": self.member_id,
            "addr": f"{self.config.broker_ip1}:{self.port}",
            "remoting_addr": self.remoting_addr,
            "role": self.role,
            "epoch": self.epoch,
            "max_offset": store.max_offset if store is not None else -1,
            "confirmed": self.app.acks.confirmed if self.app and self.app.acks else -1,
            "pid": os.getpid(),
        }
        key = f"{self.prefix}members/{self.member_id}".encode()
        lease = self.lease_id
        with contextlib.suppress(EtcdUnavailable, aetcd.exceptions.ClientError):
            await self.etcd.call(lambda c: c.put(key, dumps(value), lease=lease))

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        try:
            await self._elect_and_serve()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the failover loop failed: stopping this broker")
            self.failed.set()

    async def _elect_and_serve(self) -> None:
        leaderless_since: float | None = None
        while True:
            try:
                state = await self.etcd.read_group(self.prefix)
            except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
                log.warning("cannot read the group's keys from etcd: %s; retrying", exc)
                await self._serve_reads_if_idle()
                await asyncio.sleep(self.poll_s * 4)
                continue
            if state.leader is None:
                leaderless_since = leaderless_since or time.monotonic()
                if self.lease_id and self._eligible(state, time.monotonic() - leaderless_since):
                    epoch = await self._campaign(state)
                    if epoch:
                        leaderless_since = None
                        await self._lead(epoch, state)
                        continue
                await self._serve_reads_if_idle()
                await asyncio.sleep(self.poll_s)
                continue
            leaderless_since = None
            leader = state.leader
            if leader.get("id") == self.member_id and state.leader_lease != self.lease_id:
                # A key of this member's previous life (a crash): nobody else can
                # hold its lease (the store lock makes this process the only one).
                log.info("revoking the leader key of this member's previous run")
                with contextlib.suppress(EtcdUnavailable, aetcd.exceptions.ClientError):
                    await self.etcd.call(lambda c, old=state.leader_lease: c.revoke_lease(old))
                continue
            if not leader.get("ready"):
                await asyncio.sleep(self.poll_s)  # elected, starting: its key is leased
                continue
            await self._follow(leader, state.leader_raw)

    async def _serve_reads_if_idle(self) -> None:
        """A member that stepped down serves nothing until it knows its next
        role, which normally takes well under a lease TTL; when no leader shows
        up for a whole TTL (etcd away, no eligible member), it serves reads
        again as a follower of nobody, as it does at start-up."""
        if self.app is None and time.monotonic() - self._idle_since >= self.ttl_s:
            log.warning(
                "member %d: no leader for %.1f s after stepping down; serving reads meanwhile",
                self.member_id,
                time.monotonic() - self._idle_since,
            )
            await self._incarnate("follower", epoch=0, leader=None)

    def _eligible(self, state: GroupState, leaderless_s: float) -> bool:
        handover = state.handover
        if handover and handover.get("ready") and handover.get("epoch") == state.epoch:
            if handover.get("to") == self.member_id:
                return True
            if leaderless_s < self.ttl_s:
                return False  # the chosen member goes first
        if state.isr is None:
            return True  # the group's first election
        if self.member_id in state.isr_members:
            return True
        if self.config.allow_lossy_failover and leaderless_s >= self.ttl_s:
            log.warning(
                "member %d is outside the in-sync set %s but allowLossyFailover=true: "
                "campaigning (messages only the lost master had are lost)",
                self.member_id,
                state.isr_members,
            )
            return True
        return False

    async def _campaign(self, state: GroupState) -> int:
        """One election transaction; the new epoch if this member won, else 0."""
        epoch = max(state.epoch, self.history.epoch) + 1
        record = self._leader_record(epoch, ready=False)
        prefix = self.prefix
        lease = self.lease_id

        async def txn(c):
            t = c.transactions
            return await c.transaction(
                compare=[
                    t.create(f"{prefix}leader".encode()) == 0,
                    t.mod(f"{prefix}epoch".encode()) == state.epoch_mod,
                    t.mod(f"{prefix}isr".encode()) == state.isr_mod,
                ],
                failure=[],
                success=[
                    t.put(f"{prefix}leader".encode(), dumps(record), lease=lease),
                    t.put(f"{prefix}epoch".encode(), dumps({"epoch": epoch})),
                    t.put(
                        f"{prefix}isr".encode(),
                        dumps(
                            {"epoch": epoch, "leader": self.member_id, "members": [self.member_id]}
                        ),
                    ),  # fmt: skip
                    t.delete(f"{prefix}handover".encode()),
                ],
            )

        try:
            won, _ = await self.etcd.call(txn)
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            log.warning("campaign for epoch %d failed: %s", epoch, exc)
            return 0
        if won:
            self._leader_raw = dumps(record)
            log.warning(
                "member %d won the election of %s/%s: epoch %d",
                self.member_id,
                self.config.cluster_name,
                self.config.broker_name,
                epoch,
            )
        return epoch if won else 0

    def _leader_record(self, epoch: int, ready: bool) -> dict:
        ha_addr = ""
        if ready and self.app is not None and self.app.ha_master is not None:
            ha_addr = self.app.ha_addr
        return {
            "id": self.member_id,
            "addr": f"{self.config.broker_ip1}:{self.port}",
            "remoting_addr": self.remoting_addr,
            "ha_addr": ha_addr,
            "epoch": epoch,
            "history": epochs.to_json(self.history.entries),
            "ready": ready,
            "lease": self.lease_id,
        }

    # ------------------------------------------------------------ leading

    async def _lead(self, epoch: int, state: GroupState) -> None:
        had_leader = state.epoch > 0
        self.isr = frozenset()
        self.handing_over = False
        self._disconnected_since.clear()
        await self._incarnate("leader", epoch=epoch, leader=None)
        self.m_leader_changes.inc()
        if had_leader:
            self.m_failovers.inc()
        # Announce: followers wait for `ready` and the HA address.
        record = self._leader_record(epoch, ready=True)
        if not await self._replace_leader(record):
            await self._step_down("the leader key changed while this member started as master")
            return
        await self._put_member()
        try:
            await self._watch_leadership()
        finally:
            if self.role == "leader" and not self.stopping:
                await self._step_down("leadership ended")

    async def _replace_leader(self, record: dict) -> bool:
        prefix, lease, old = self.prefix, self.lease_id, self._leader_raw

        async def txn(c):
            t = c.transactions
            return await c.transaction(
                compare=[t.value(f"{prefix}leader".encode()) == old],
                failure=[],
                success=[t.put(f"{prefix}leader".encode(), dumps(record), lease=lease)],
            )

        try:
            ok, _ = await self.etcd.call(txn)
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            log.warning("cannot update the leader key: %s", exc)
            return False
        if ok:
            self._leader_raw = dumps(record)
        return ok

    async def _watch_leadership(self) -> None:
        """Returns when this member must stop leading."""
        beat = 0
        while True:
            if self._lease_lost.is_set():
                log.error("the etcd lease was lost: stepping down")
                return
            try:
                state = await self.etcd.read_group(self.prefix)
            except (EtcdUnavailable, aetcd.exceptions.ClientError):
                await asyncio.sleep(self.poll_s)  # fenced in time by the lease clock
                continue
            if state.leader_raw != self._leader_raw:
                log.error("the leader key is no longer this member's: stepping down")
                return
            handover = state.handover
            if (
                handover
                and handover.get("epoch") == self.epoch
                and not handover.get("ready")
                and handover.get("refused") is None
                and await self._hand_over(handover)
            ):
                return
            self._check_isr()
            beat += 1
            if beat % 8 == 0:
                await self._put_member()
            await asyncio.sleep(self.poll_s)

    async def _step_down(self, why: str) -> None:
        log.warning(
            "member %d steps down as master of epoch %d: %s", self.member_id, self.epoch, why
        )
        self.handing_over = False
        await self._stop_app()
        self._idle_since = time.monotonic()
        # No interim run as a follower of nobody: the loop starts the next one
        # once the role is known (a new leader in etcd, or this member elected),
        # or after a lease TTL without a leader (_serve_reads_if_idle).
        self.role, self.leader_id = "none", None
        self.m_leader.set(0)
        self.m_isr.set(0)
        log.info("member %d serves nothing until its next role is known (UNAVAILABLE: retry)",
                 self.member_id)  # fmt: skip
        if self.lease_id:
            await self._put_member()

    # ------------------------------------------------------------ in-sync set

    def _on_outsider_ack(self, key: Hashable, offset: int) -> None:
        """A slave outside the set acked `offset`: once it is near the confirmed
        offset it starts counting, and it is published when it holds
        everything confirmed before that (see `_change_isr`)."""
        app = self.app
        if self.role != "leader" or app is None or app.acks is None:
            return
        if not (isinstance(key, tuple) and key[0] == "replica"):
            return
        member = key[1]
        if member in self.isr or member in self._isr_pending:
            return
        if offset < app.acks.confirmed - JOIN_GAP:
            return
        self._isr_pending.add(member)
        self._spawn(self._change_isr(add={member}), f"isr-add-{member}")

    def _on_slave_timeout(self, lagging: list[Hashable]) -> None:
        if self.role == "leader":
            members = {k[1] for k in lagging if isinstance(k, tuple) and k[0] == "replica"}
            self._leave_isr(members, "did not ack a send within slaveTimeout")

    def _check_isr(self) -> None:
        """Housekeeping: an in-sync slave disconnected for slaveTimeout leaves."""
        app = self.app
        if app is None or app.acks is None:
            return
        connected = app.acks.acks()
        now = time.monotonic()
        gone = set()
        for member in self.isr:
            if replica_key(member) in connected:
                self._disconnected_since.pop(member, None)
                continue
            since = self._disconnected_since.setdefault(member, now)
            if now - since >= self.config.slave_timeout_s:
                gone.add(member)
        self._leave_isr(gone, "stayed disconnected for slaveTimeout")

    def _leave_isr(self, members: set[int], why: str) -> None:
        """In-sync slaves that `why` go (published before anything is
        acknowledged without them); one already on its way is left alone."""
        members = (members & self.isr) - self._isr_pending
        if members:
            log.warning("in-sync slave(s) %s %s: leaving the in-sync set", sorted(members), why)
            self._isr_pending |= members
            self._spawn(self._change_isr(remove=members), f"isr-remove-{sorted(members)}")

    def _spawn(self, coro, name: str) -> None:
        """A task of this node, cancelled at stop, forgotten when done."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _change_isr(
        self, add: set[int] = frozenset(), remove: set[int] = frozenset()
    ) -> None:
        """Publish first for a removal (acks still need the member meanwhile);
        count a new member at once (its acks are needed before it is published)."""
        try:
            async with self._isr_lock:
                app = self.app
                if self.role != "leader" or app is None or app.acks is None:
                    return
                new = (self.isr | add) - remove
                if new == self.isr:
                    return
                if add:
                    acks = app.acks
                    acks.require(frozenset(replica_key(m) for m in self.isr | add))
                    needed = acks.confirmed
                    deadline = time.monotonic() + self.config.slave_timeout_s
                    while any(acks.acks().get(replica_key(m), -1) < needed for m in add):
                        if time.monotonic() > deadline or self.app is not app:
                            log.info("member(s) %s did not catch up; not in sync yet", sorted(add))
                            acks.require(frozenset(replica_key(m) for m in self.isr))
                            return
                        await asyncio.sleep(0.01)
                value = {
                    "epoch": self.epoch,
                    "leader": self.member_id,
                    "members": [self.member_id, *sorted(new)],
                }
                prefix, old = self.prefix, self._leader_raw

                async def txn(c):
                    t = c.transactions
                    return await c.transaction(
                        compare=[t.value(f"{prefix}leader".encode()) == old],
                        failure=[],
                        success=[t.put(f"{prefix}isr".encode(), dumps(value))],
                    )

                while self.role == "leader" and self.app is app:
                    try:
                        ok, _ = await self.etcd.call(txn)
                        break
                    except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
                        log.warning("cannot publish the in-sync set: %s; retrying", exc)
                        await asyncio.sleep(self.poll_s)
                else:
                    return
                if not ok:
                    log.error("the in-sync set was not published: this member no longer leads")
                    app.acks.require(frozenset(replica_key(m) for m in self.isr))
                    return
                self.isr = new
                app.acks.require(frozenset(replica_key(m) for m in new))
                self.m_isr.set(1 + len(new))
                log.warning(
                    "in-sync set of %s epoch %d is now %s",
                    self.config.broker_name,
                    self.epoch,
                    value["members"],
                )
        finally:
            self._isr_pending -= set(add) | set(remove)

    # ------------------------------------------------------------ handover

    async def _hand_over(self, request: dict) -> bool:
        """`ferry failover`: stop taking sends, let the target catch up, leave."""
        app = self.app
        target = request.get("to")
        if target is None:
            acks = app.acks.acks() if app and app.acks else {}
            ranked = sorted(self.isr, key=lambda m: acks.get(replica_key(m), -1), reverse=True)
            target = ranked[0] if ranked else None
        if target is None or target not in self.isr:
            await self._refuse_handover(
                request,
                f"member {target} is not in the in-sync set {sorted(self.isr)}"
                if target is not None
                else "no slave is in the in-sync set",
            )
            return False
        log.warning("handing the master role of epoch %d over to member %d", self.epoch, target)
        self.handing_over = True
        store = app.store
        deadline = time.monotonic() + max(self.config.slave_timeout_s * 2, 2.0)
        # Every send taken is answered before the role goes: confirmed by the
        # whole in-sync set, not only by the target (a send still waiting for
        # another slave would be cut off when this incarnation stops, answered
        # UNAVAILABLE though stored, and stored again by the producer's retry).
        while (
            app.acks.acks().get(replica_key(target), -1) < store.max_offset
            or app.acks.confirmed < store.max_offset
        ):
            if time.monotonic() > deadline or not self.may_ack():
                self.handing_over = False
                await self._refuse_handover(
                    request,
                    f"member {target} (or another in-sync member) did not catch up within "
                    "the handover deadline",
                )
                return False
            await asyncio.sleep(0.01)
        prefix, old = self.prefix, self._leader_raw
        ready = {**request, "to": target, "ready": True, "epoch": self.epoch}

        async def txn(c):
            t = c.transactions
            return await c.transaction(
                compare=[t.value(f"{prefix}leader".encode()) == old],
                failure=[],
                success=[
                    t.put(f"{prefix}handover".encode(), dumps(ready)),
                    t.delete(f"{prefix}leader".encode()),
                ],
            )

        try:
            ok, _ = await self.etcd.call(txn)
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            self.handing_over = False
            log.warning("handover failed: %s", exc)
            return False
        return ok

    async def _refuse_handover(self, request: dict, why: str) -> None:
        log.warning("handover refused: %s", why)
        key = f"{self.prefix}handover".encode()
        with contextlib.suppress(EtcdUnavailable, aetcd.exceptions.ClientError):
            await self.etcd.call(lambda c: c.put(key, dumps({**request, "refused": why})))

    # ------------------------------------------------------------ following

    async def _follow(self, leader: dict, raw: bytes) -> None:
        """Follow `leader` (its key's bytes `raw`) until the key changes."""
        epoch = int(leader.get("epoch", 0))
        if self.role != "follower" or self.epoch != epoch or self.leader_id != leader.get("id"):
            self.m_leader_changes.inc()
            await self._incarnate("follower", epoch=epoch, leader=leader)
        beat = 0
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                state = await self.etcd.read_group(self.prefix)
            except (EtcdUnavailable, aetcd.exceptions.ClientError):
                continue
            if state.leader_raw != raw or state.leader is None:
                return
            isr = state.isr or {}
            await self._report_in_sync(
                isr.get("epoch") == epoch and self.member_id in state.isr_members
            )
            beat += 1
            if beat % 8 == 0:
                await self._put_member()

    # ------------------------------------------------------------ incarnations

    async def _incarnate(self, role: str, epoch: int, leader: dict | None) -> None:
        """Stop the current broker app and start one in `role`, on the node's server."""
        from services.broker.app import BrokerApp

        await self._stop_app()
        self.role, self.epoch = role, epoch
        self.leader_id = leader.get("id") if leader else None
        self.m_epoch.set(epoch)
        self.m_leader.set(1 if role == "leader" else 0)
        # A new master's published set is itself alone (the campaign wrote
        # it); a follower reports none (the gauge is the master's view).
        self.m_isr.set(1 if role == "leader" else 0)
        cfg = self.config
        common = dict(
            grpc_listen_port=self._port,
            listen_port=self._remoting_ports[0],
            fast_listen_port=self._remoting_ports[1],
            metrics_port=-1,
            enable_failover=False,
        )
        if role == "leader":
            run_cfg = dataclasses.replace(cfg, broker_id=0, **common)
            on_open = self._open_as_leader
        else:
            run_cfg = dataclasses.replace(
                cfg,
                broker_role="SLAVE",
                ha_master_address=(leader or {}).get("ha_addr", ""),
                # Topics and groups reach a new follower soon (they come only
                # with the slave sync; one it lacks is missing if it is elected).
                slave_sync_delay_s=min(cfg.slave_sync_delay_s, 0.5),
                **common,
            )
            on_open = self._open_as_follower(leader)
        incarnation = Incarnation(
            epoch=epoch,
            on_store_open=on_open,
            fence=self,
            on_slave_timeout=self._on_slave_timeout,
            on_outsider_ack=self._on_outsider_ack,
            metrics_port=self._metrics_endpoint.port if self._metrics_endpoint else -1,
            server=self.server,
            switch=self.switch,
            serve_remoting=self._serve_remoting,
            remoting_clients=self.remoting_clients,
            remoting_locks=self.remoting_locks,
        )
        app = BrokerApp(run_cfg, clock=self.clock, incarnation=incarnation)
        try:
            await app.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await app.stop(grace_s=0)
            raise
        self._port = app.port
        self.app = app
        self._app_watch = asyncio.create_task(self._watch_app(app), name="failover-app-watch")
        await self._report_in_sync(role == "leader")
        if self.lease_id:
            await self._put_member()  # ferry ha-status shows the new role at once
        log.info(
            "member %d runs as %s (epoch %d%s)",
            self.member_id,
            "master" if role == "leader" else "slave",
            epoch,
            f", leader {self.leader_id} at {leader.get('addr')}" if leader else "",
        )

    async def _stop_app(self) -> None:
        """Stop the running incarnation, if any: its servicers leave the server
        at once (new calls get UNAVAILABLE), its calls in flight get
        SWITCH_GRACE_S to finish."""
        old = self.app
        if self._app_watch is not None:
            self._app_watch.cancel()
            self._app_watch = None
        if old is None:
            return
        self.app = None
        await old.stop(grace_s=SWITCH_GRACE_S)
        if old.store is not None and old.store.failstop.tripped:
            self.failed.set()
            raise asyncio.CancelledError

    async def _report_in_sync(self, in_sync: bool) -> None:
        """IN_SYNC_HEALTH of the running incarnation (NOT_SERVING until set)."""
        app = self.app
        if app is None or app.server is None or self._in_sync_reported == (app, in_sync):
            return
        self._in_sync_reported = (app, in_sync)
        await app.server.set_health(IN_SYNC_HEALTH, in_sync)
        log.info("member %d %s eligible for election", self.member_id,
                 "is" if in_sync else "is not")  # fmt: skip

    async def _watch_app(self, app) -> None:
        await app.failed.wait()
        if self.app is app:
            self.failed.set()

    async def _open_as_leader(self, store) -> None:
        self.history.begin(self.epoch, store.max_offset)
        log.info(
            "epoch %d starts at offset %d (history %s)",
            self.epoch,
            store.max_offset,
            epochs.to_json(self.history.entries),
        )

    def _open_as_follower(self, leader: dict | None) -> Callable[[object], Awaitable[None]]:
        async def open_(store) -> None:
            if leader is None:
                return
            try:
                theirs = epochs.from_json(leader.get("history", []))
            except ValueError as exc:
                raise Unavailable(
                    f"the leader's epoch history in etcd is unusable: {exc}"
                ) from None
            leader_end = max(e.start for e in epochs.with_base(theirs))
            # The leader's log end is at least its epoch's start; what it holds
            # past that is ours too as far as we got (same epoch, same bytes).
            point = epochs.divergence(
                self.history.entries, store.max_offset, theirs, max(leader_end, store.max_offset)
            )
            if point is None:
                log.warning("no epoch shared with the leader: copying its log from scratch")
                store.restart_at(0)
            elif point < store.max_offset:
                log.warning(
                    "cutting this log at %d (it ended at %d): the rest was written by a master "
                    "of an older epoch and never reached the new master",
                    point,
                    store.max_offset,
                )
                await store.truncate(point)
            self.history.adopt(theirs)

        return open_
