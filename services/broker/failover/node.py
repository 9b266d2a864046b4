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
- **Rejoining** (`rejoin`). A follower adopts its leader's epoch history; before it
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

Owns: the composition of those parts (`runs` holds the running app and the
servers that outlive it), the member's `Role` and its `members/<id>` record,
and the loop that moves between roles. Runs on the event loop, in two tasks of
its own (the failover loop and the lease). Must never decide what a part
decides (who may campaign, who is in sync, whether the lease still holds), nor
read the running app but through `runs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

import aetcd.exceptions
from prometheus_client import CollectorRegistry

from services.broker.config import BrokerConfig
from services.broker.failover import epochs, rejoin
from services.broker.failover.election import Election, LeaderKey
from services.broker.failover.epochs import EpochHistory
from services.broker.failover.etcd import Etcd, EtcdUnavailable, GroupState, dumps, group_prefix
from services.broker.failover.handover import Handover
from services.broker.failover.insync import InSyncSet
from services.broker.failover.lease import Fence, Lease
from services.broker.failover.metrics import FailoverMetrics
from services.broker.failover.role import FOLLOWER, LEADER, NONE, Role
from services.broker.failover.runs import IN_SYNC_HEALTH, Runs

__all__ = ["IN_SYNC_HEALTH", "FailoverNode"]  # the readiness probe's health name, from runs

log = logging.getLogger(__name__)


class FailoverNode:
    def __init__(self, config: BrokerConfig, clock=None) -> None:
        self.config = config
        self.ttl_s = config.failover_lease_ttl_s
        self.poll_s = min(0.25, self.ttl_s / 20)
        self.member_id = config.broker_id
        self.prefix = group_prefix(config.cluster_name, config.broker_name)
        self.etcd = Etcd(config.etcd_endpoints, timeout_s=max(0.5, self.ttl_s / 4))
        self.history = EpochHistory.open(config.store_root)
        self.failed = asyncio.Event()
        self.stopping = False
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
        self.own_registry = CollectorRegistry()
        self.metrics = FailoverMetrics(
            self.own_registry, config.cluster_name, config.broker_name, self.member_id,
            fenced=self.fence.fenced,
        )  # fmt: skip
        self.runs = Runs(config, clock, self.own_registry, self.fence, self.failed)
        self.in_sync: InSyncSet | None = None  # the running incarnation's, while it leads
        self._idle_since = 0.0  # monotonic: when a step-down left this member without a run
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------ facade (like BrokerApp)

    @property
    def store(self):
        return self.runs.store

    @property
    def port(self) -> int:
        """The ferry.v1 gRPC port (bound)."""
        return self.runs.port

    @property
    def remoting_port(self) -> int:
        return self.runs.remoting_port

    @property
    def remoting_addr(self) -> str:
        return f"{self.config.broker_ip1}:{self.remoting_port}"

    async def start(self) -> None:
        cfg = self.config
        await self.runs.open()
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
        tasks = self._tasks
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.in_sync is not None:
            await self.in_sync.stop()
        await self.runs.close()
        await self.lease.revoke()  # leaving: the others elect now, not one TTL later
        await self.etcd.close()
        self.runs.close_metrics()

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
        if not self.runs.running and time.monotonic() - self._idle_since >= self.ttl_s:
            log.warning(
                "member %d: no leader for %.1f s after stepping down; serving reads meanwhile",
                self.member_id,
                time.monotonic() - self._idle_since,
            )
            await self._incarnate(FOLLOWER, epoch=0, leader=None)

    async def _campaign(self, state: GroupState) -> int:
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
        return {
            "id": self.member_id,
            "addr": f"{self.config.broker_ip1}:{self.port}",
            "remoting_addr": self.remoting_addr,
            "ha_addr": self.runs.ha_addr if ready else "",
            "epoch": epoch,
            "history": epochs.to_json(self.history.entries),
            "ready": ready,
            "lease": self.lease.id,
        }

    # ------------------------------------------------------------ leading

    async def _lead(self, epoch: int, state: GroupState) -> None:
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
        await self._stop_run()
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
            await self.runs.report_in_sync(
                isr.get("epoch") == epoch and self.member_id in state.isr_members
            )
            beat += 1
            if beat % 8 == 0:
                await self._put_member()

    # ------------------------------------------------------------ incarnations

    async def _incarnate(self, role: str, epoch: int, leader: dict | None) -> None:
        """Stop the current run of the app and start one in `role`."""
        await self._stop_run()
        self.role.set(role, epoch, leader.get("id") if leader else None)
        self.metrics.epoch.set(epoch)
        self.metrics.leader.set(1 if role == LEADER else 0)
        # A new master's published set is itself alone (the campaign wrote
        # it); a follower reports none (the gauge is the master's view).
        self.metrics.in_sync_replicas.set(1 if role == LEADER else 0)
        if role == LEADER:
            # This run's replica acknowledgements, counted by its in-sync set.
            in_sync = InSyncSet(
                self.leader_key,
                self.prefix,
                self.member_id,
                epoch,
                self.metrics.in_sync_replicas,
                broker_name=self.config.broker_name,
                max_gap=self.config.ha_max_gap_not_in_sync,
                slave_timeout_s=self.config.slave_timeout_s,
                poll_s=self.poll_s,
            )
            try:
                await self.runs.start(
                    epoch, None, rejoin.LeaderStart(self.history, epoch, in_sync), leading=True,
                    acks=in_sync.acks, slave_timeouts=in_sync,
                )  # fmt: skip
            except BaseException:
                with contextlib.suppress(Exception):
                    await in_sync.stop()
                raise
            self.in_sync = in_sync
            in_sync.activate()
        else:
            await self.runs.start(
                epoch, leader, rejoin.FollowerStart(self.history, leader), leading=False
            )
        await self.runs.report_in_sync(role == LEADER)
        if self.lease.id:
            await self._put_member()  # ferry ha-status shows the new role at once
        log.info(
            "member %d runs as %s (epoch %d%s)",
            self.member_id,
            "master" if role == LEADER else "slave",
            epoch,
            f", leader {self.role.leader_id} at {leader.get('addr')}" if leader else "",
        )

    async def _stop_run(self) -> None:
        """Stop the running incarnation, if any; its in-sync set changes no more."""
        in_sync, self.in_sync = self.in_sync, None
        if in_sync is not None:
            in_sync.close()
        await self.runs.stop()
