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

- **Leadership** (`election`, `lease`). Each member holds an etcd lease
  (`failoverLeaseTtl`, renewed every third of it). The leader holds `leader`
  under its lease: id, addresses, epoch and epoch history. When the key is
  gone (the lease lapsed: the master died or lost etcd), the eligible members
  campaign with one transaction: the key is still absent, and the `epoch` and
  `isr` keys are as read. The winner takes epoch + 1 and the in-sync set
  {itself}, records `(epoch, log end)` in its store's history, starts as
  master and registers as the group's broker 0 with its epoch.
- **Eligibility** (`election`, `insync`). Only members of the published
  in-sync set (`isr`) campaign (`allowLossyFailover=true` lets the others
  campaign one TTL later). The master adds a slave to the set once it has
  acked everything confirmed (published first, counted right away), and
  removes one that timed out a send or stayed disconnected for `slaveTimeout`
  (published before a send is acknowledged without it). A SYNC_MASTER
  acknowledges a send once every in-sync slave has acked it
  (`ReplicaAcks.require`), so whoever can win has every acknowledged message.
  Each master run's `ReplicaAcks` are its `InSyncSet`'s: the node hands them
  to the run's app in its `Incarnation`.
- **Fencing** (`lease.Fence`). A master acknowledges nothing once
  `fence_margin_s` (10% of the TTL, at least 0.5 s: the clock-drift margin)
  separates it from the moment its lease could expire, counted from when it
  *sent* its last successful renewal; etcd cannot expire the lease before
  that. Name servers keep the registration with the highest epoch; a slave
  refuses an HA stream of another epoch (services.ha.protocol).
- **Rejoining.** A follower adopts its leader's epoch history; before it
  replicates it cuts its log at the last offset it shares with the leader
  (`epochs.divergence`, Kafka's KIP-101), which never cuts an acknowledged
  message (the leader has all of them).
- **Handover** (`handover`). `ferry failover` writes `handover`; the master
  stops taking sends, waits until the chosen in-sync slave has everything,
  and revokes its lease; only that slave campaigns for a TTL.
- **Readiness.** The health name `ferry.failover.InSync` is SERVING while
  this member is master or in its master's published in-sync set, i.e. while
  it could be elected. Kubernetes probes it, so a rolling update restarts the
  next member only once a restarted one is eligible again.

Owns: the composition of those parts; the servers that outlive the runs; the
running app (`app`: the node starts and stops every run, and no other part
reads it); the member's `Role` and its `members/<id>` record; the loop that
moves between roles. Runs on the event loop, in two tasks of its own (the
failover loop and the lease). Must never decide what a part decides (who may
campaign, who is in sync, whether the lease still holds), nor hand a part the
app.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

import aetcd.exceptions
from prometheus_client import CollectorRegistry

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler, RemotingServer
from ferry.runtime.errors import Unavailable
from ferry.runtime.metrics_http import MetricsEndpoint, start_metrics_endpoint
from ferry.runtime.server import GrpcServer
from ferry.runtime.swap import ServiceSwitch
from services.broker.config import BrokerConfig
from services.broker.failover import epochs
from services.broker.failover.election import Election, LeaderKey
from services.broker.failover.epochs import EpochHistory
from services.broker.failover.etcd import Etcd, EtcdUnavailable, dumps, group_prefix
from services.broker.failover.handover import Handover
from services.broker.failover.insync import InSyncSet
from services.broker.failover.lease import Fence, Lease
from services.broker.failover.metrics import FailoverMetrics
from services.broker.failover.role import FOLLOWER, LEADER, NONE, Role
from services.broker.incarnation import Incarnation
from services.broker.messaging.clients import ClientTables
from services.broker.messaging.locks import QueueLocks

log = logging.getLogger(__name__)

IN_SYNC_HEALTH = "ferry.failover.InSync"  # grpc.health.v1 name: this member is eligible
SWITCH_GRACE_S = 0.5  # in-flight calls of an incarnation that hands over its role


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
        self.poll_s = min(0.25, self.ttl_s / 20)
        self.member_id = config.broker_id
        self.prefix = group_prefix(config.cluster_name, config.broker_name)
        self.etcd = Etcd(config.etcd_endpoints, timeout_s=max(0.5, self.ttl_s / 4))
        self.history = EpochHistory.open(config.store_root)
        self.role = Role()
        self.lease = Lease(self.etcd, self.ttl_s, self.poll_s)
        self.fence = Fence(self.lease, self.role, config.broker_name)
        self.leader_key = LeaderKey(self.etcd, self.prefix)
        self.election = Election(
            self.etcd,
            self.leader_key,
            self.prefix,
            self.member_id,
            self.history,
            ttl_s=self.ttl_s,
            allow_lossy=config.allow_lossy_failover,
        )
        self.handover = Handover(
            self.etcd, self.leader_key, self.prefix, self.fence,
            slave_timeout_s=config.slave_timeout_s,
        )  # fmt: skip
        self.app = None  # services.broker.app.BrokerApp, the current incarnation
        self.in_sync: InSyncSet | None = None  # the current incarnation's, while it leads
        self.failed = asyncio.Event()
        self.stopping = False
        self._in_sync_reported: tuple[object, bool] | None = None
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
        self.metrics = FailoverMetrics(
            self.own_registry, config.cluster_name, config.broker_name, self.member_id,
            fenced=self.fence.fenced,
        )  # fmt: skip

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
        await self._incarnate(FOLLOWER, epoch=0, leader=None)
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
            self.lease.fence_margin_s,
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
        if self.in_sync is not None:
            await self.in_sync.stop()
        if self.app is not None:
            await self.app.stop()
        if self.remoting is not None:
            await self.remoting.stop()  # nothing is installed by now
        if self.server is not None:
            await self.server.stop(SWITCH_GRACE_S)  # nothing is mounted by now
        await self.lease.revoke()  # leaving: the others elect now, not one TTL later
        await self.etcd.close()
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()

    # ------------------------------------------------------------ the lease and the member record

    async def _keep_lease(self) -> None:
        while True:
            await self.lease.grant()
            await self._put_member()
            await self.lease.renew()  # returns once the lease has expired

    async def _put_member(self) -> None:
        store, in_sync = self.store, self.in_sync
        value = {
            "id": self.member_id,
            "addr": f"{self.config.broker_ip1}:{self.port}",
            "remoting_addr": self.remoting_addr,
            "role": self.role.name,
            "epoch": self.role.epoch,
            "max_offset": store.max_offset if store is not None else -1,
            "confirmed": in_sync.acks.confirmed if in_sync is not None else -1,
            "pid": os.getpid(),
        }
        key = f"{self.prefix}members/{self.member_id}".encode()
        lease = self.lease.id
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
                leaderless_s = time.monotonic() - leaderless_since
                if self.lease.id and self.election.eligible(state, leaderless_s):
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
            if leader.get("id") == self.member_id and state.leader_lease != self.lease.id:
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
            await self._incarnate(FOLLOWER, epoch=0, leader=None)

    async def _campaign(self, state) -> int:
        """One election; the new epoch if this member won, else 0."""
        epoch = self.election.next_epoch(state)
        record = self._leader_record(epoch, ready=False)
        if not await self.election.campaign(state, epoch, record, self.lease.id):
            return 0
        log.warning(
            "member %d won the election of %s/%s: epoch %d",
            self.member_id,
            self.config.cluster_name,
            self.config.broker_name,
            epoch,
        )
        return epoch

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
            "lease": self.lease.id,
        }

    # ------------------------------------------------------------ leading

    async def _lead(self, epoch: int, state) -> None:
        had_leader = state.epoch > 0
        self.fence.end_handover()
        await self._incarnate(LEADER, epoch=epoch, leader=None)
        self.metrics.leader_changes.inc()
        if had_leader:
            self.metrics.failovers.inc()
        # Announce: followers wait for `ready` and the HA address.
        record = self._leader_record(epoch, ready=True)
        if not await self.leader_key.replace(record, self.lease.id):
            await self._step_down("the leader key changed while this member started as master")
            return
        await self._put_member()
        try:
            await self._watch_leadership()
        finally:
            if self.role.leading and not self.stopping:
                await self._step_down("leadership ended")

    async def _watch_leadership(self) -> None:
        """Returns when this member must stop leading."""
        in_sync = self.in_sync
        assert in_sync is not None  # a leader's run is up
        beat = 0
        while True:
            if self.lease.lost.is_set():
                log.error("the etcd lease was lost: stepping down")
                return
            try:
                state = await self.etcd.read_group(self.prefix)
            except (EtcdUnavailable, aetcd.exceptions.ClientError):
                await asyncio.sleep(self.poll_s)  # fenced in time by the lease clock
                continue
            if not self.leader_key.held_in(state):
                log.error("the leader key is no longer this member's: stepping down")
                return
            handover = state.handover
            if (
                handover
                and handover.get("epoch") == self.role.epoch
                and not handover.get("ready")
                and handover.get("refused") is None
                and await self.handover.hand_over(handover, in_sync, self.role.epoch)
            ):
                return
            in_sync.check()
            beat += 1
            if beat % 8 == 0:
                await self._put_member()
            await asyncio.sleep(self.poll_s)

    async def _step_down(self, why: str) -> None:
        log.warning(
            "member %d steps down as master of epoch %d: %s", self.member_id, self.role.epoch, why
        )
        self.fence.end_handover()
        await self._stop_app()
        self._idle_since = time.monotonic()
        # No interim run as a follower of nobody: the loop starts the next one
        # once the role is known (a new leader in etcd, or this member elected),
        # or after a lease TTL without a leader (_serve_reads_if_idle).
        self.role.set(NONE, self.role.epoch)
        self.metrics.leader.set(0)
        self.metrics.in_sync_replicas.set(0)
        log.info("member %d serves nothing until its next role is known (UNAVAILABLE: retry)",
                 self.member_id)  # fmt: skip
        if self.lease.id:
            await self._put_member()

    # ------------------------------------------------------------ following

    async def _follow(self, leader: dict, raw: bytes) -> None:
        """Follow `leader` (its key's bytes `raw`) until the key changes."""
        epoch = int(leader.get("epoch", 0))
        role = self.role
        if role.name != FOLLOWER or role.epoch != epoch or role.leader_id != leader.get("id"):
            self.metrics.leader_changes.inc()
            await self._incarnate(FOLLOWER, epoch=epoch, leader=leader)
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
        self.role.set(role, epoch, leader.get("id") if leader else None)
        self.metrics.epoch.set(epoch)
        self.metrics.leader.set(1 if role == LEADER else 0)
        # A new master's published set is itself alone (the campaign wrote
        # it); a follower reports none (the gauge is the master's view).
        self.metrics.in_sync_replicas.set(1 if role == LEADER else 0)
        cfg = self.config
        common = dict(
            grpc_listen_port=self._port,
            listen_port=self._remoting_ports[0],
            fast_listen_port=self._remoting_ports[1],
            metrics_port=-1,
            enable_failover=False,
        )
        in_sync = None
        if role == LEADER:
            run_cfg = dataclasses.replace(cfg, broker_id=0, **common)
            # This run's replica acknowledgements, counted by its in-sync set.
            in_sync = InSyncSet(
                self.leader_key,
                self.prefix,
                self.member_id,
                epoch,
                self.metrics.in_sync_replicas,
                broker_name=cfg.broker_name,
                max_gap=cfg.ha_max_gap_not_in_sync,
                slave_timeout_s=cfg.slave_timeout_s,
                poll_s=self.poll_s,
            )
            on_open = self._open_as_leader(in_sync)
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
            fence=self.fence.fence,
            on_slave_timeout=in_sync.on_slave_timeout if in_sync is not None else None,
            acks=in_sync.acks if in_sync is not None else None,
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
            if in_sync is not None:
                with contextlib.suppress(Exception):
                    await in_sync.stop()
            raise
        self._port = app.port
        self.app, self.in_sync = app, in_sync
        if in_sync is not None:
            in_sync.activate()
        self._app_watch = asyncio.create_task(self._watch_app(app), name="failover-app-watch")
        await self._report_in_sync(role == LEADER)
        if self.lease.id:
            await self._put_member()  # ferry ha-status shows the new role at once
        log.info(
            "member %d runs as %s (epoch %d%s)",
            self.member_id,
            "master" if role == LEADER else "slave",
            epoch,
            f", leader {self.role.leader_id} at {leader.get('addr')}" if leader else "",
        )

    async def _stop_app(self) -> None:
        """Stop the running incarnation, if any: its servicers leave the server
        at once (new calls get UNAVAILABLE), its calls in flight get
        SWITCH_GRACE_S to finish; its in-sync set changes no more."""
        old, in_sync = self.app, self.in_sync
        if self._app_watch is not None:
            self._app_watch.cancel()
            self._app_watch = None
        if old is None:
            return
        self.app, self.in_sync = None, None
        if in_sync is not None:
            await in_sync.stop()
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

    def _open_as_leader(self, in_sync: InSyncSet) -> Callable[[object], Awaitable[None]]:
        async def open_(store) -> None:
            in_sync.open(store)
            epoch = self.role.epoch
            self.history.begin(epoch, store.max_offset)
            log.info(
                "epoch %d starts at offset %d (history %s)",
                epoch,
                store.max_offset,
                epochs.to_json(self.history.entries),
            )

        return open_

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
