"""The in-sync replica set of one master run, and the replica acknowledgements
it is counted from.

Owns, for one run of this member as master (a new `InSyncSet` per run):
- its `ReplicaAcks` (services.ha.sync), built here and handed to the run's app
  through its `Incarnation`: the app's HA master counts the slaves' acks in
  them, its SYNC_MASTER sends wait on them (services.broker.cluster.replication),
  and they confirm a send once every member of this set has acked it.
- the set itself, as published in the `isr` key: a slave joins once it has
  acked everything confirmed (counted at once when it comes within `JOIN_GAP`
  of the confirmed offset, published once it caught up); one that timed out a
  send or stayed disconnected for `slaveTimeout` leaves (published *before*
  anything is acknowledged without it).
- `LocalLog`: the run's store as its acks see it (its log end, the long polls
  to wake), given once the app has opened it (`open`).

Runs on the event loop: the HA master's ack callbacks and the node's
housekeeping call in; each change runs in a task of its own, one at a time
(`_lock`). Writes to etcd only through the `LeaderKey` (so only while this
member leads). Must never read the running broker app, and never change the
set once its run stops (`close`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable

import aetcd.exceptions
from prometheus_client import Gauge

from ferry.runtime.tasks import cancel_and_wait
from services.broker.failover.election import LeaderKey
from services.broker.failover.etcd import EtcdUnavailable, dumps
from services.ha.sync import ReplicaAcks

log = logging.getLogger(__name__)

# A slave this close to the confirmed offset is counted at once and published in
# the in-sync set when it has caught up (it has every acknowledged message).
JOIN_GAP = 4 << 20


def replica_key(member_id: int) -> tuple[str, int]:
    """How services.ha.master keys an authenticated replica's acks."""
    return ("replica", member_id)


def _replica_keys(members) -> frozenset[Hashable]:
    return frozenset(replica_key(m) for m in members)


class LocalLog:
    """The master's own log as its ReplicaAcks read it. The acks exist before
    the app opens its store (the store reads their confirmed offset), and are
    not asked before it is open (the HA master starts after)."""

    def __init__(self) -> None:
        self._store = None

    def set(self, store) -> None:
        self._store = store

    def end(self) -> int:
        assert self._store is not None, "the store is not open yet"
        return self._store.max_offset

    def notify_confirmed(self, _offset: int) -> None:
        assert self._store is not None, "the store is not open yet"
        self._store.notify_confirmed()


class InSyncSet:
    def __init__(
        self,
        leader: LeaderKey,
        prefix: str,
        member_id: int,
        epoch: int,
        gauge: Gauge,
        *,
        broker_name: str,
        max_gap: int,
        slave_timeout_s: float,
        poll_s: float,
    ) -> None:
        """
        Args:
            leader: the leader key this member holds; the set is published only
                while it holds it.
            prefix: the group's etcd keys (services.broker.failover.etcd).
            epoch: the epoch this run leads.
            gauge: ferry_ha_in_sync_replicas, set on every change published.
            max_gap: haMaxGapNotInSync, for the acks.
        """
        self.leader = leader
        self.key = f"{prefix}isr".encode()
        self.member_id = member_id
        self.epoch = epoch
        self.gauge = gauge
        self.broker_name = broker_name
        self.slave_timeout_s = slave_timeout_s
        self.poll_s = poll_s
        self.log = LocalLog()
        self.acks = ReplicaAcks(
            max_gap,
            on_confirmed=self.log.notify_confirmed,
            # What a new leader's log holds is its epoch's start.
            local_end=self.log.end,
            on_outsider_ack=self.on_outsider_ack,
        )
        self.members: frozenset[int] = frozenset()  # published, this master excluded
        self._active = False  # between `activate` and `stop`: the run serves
        self._lock = asyncio.Lock()
        self._pending: set[int] = set()
        self._disconnected_since: dict[int, float] = {}
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------ the run

    def open(self, store) -> None:
        """The run's store is open (before its HA master starts)."""
        self.log.set(store)

    def activate(self) -> None:
        """The run has started: changes to the set may begin."""
        self._active = True

    def close(self) -> None:
        """The run stops: no change begins; one under way gives up at its next
        step (a slave counted but not yet published is no longer required)."""
        self._active = False

    async def stop(self) -> None:
        """The member stops: `close`, and cancel the changes under way."""
        self.close()
        await cancel_and_wait(*self._tasks)

    # ------------------------------------------------------------ what others ask

    def most_caught_up(self) -> int | None:
        acks = self.acks.acks()
        ranked = sorted(self.members, key=lambda m: acks.get(replica_key(m), -1), reverse=True)
        return ranked[0] if ranked else None

    def caught_up(self, member: int) -> bool:
        """`member` has acked the whole log, and every in-sync member has
        (every send taken is confirmed)."""
        end = self.log.end()
        return self.acks.acks().get(replica_key(member), -1) >= end and self.acks.confirmed >= end

    # ------------------------------------------------------------ changes

    def on_outsider_ack(self, key: Hashable, offset: int) -> None:
        """A slave outside the set acked `offset`: once it is near the confirmed
        offset it starts counting, and it is published when it holds
        everything confirmed before that (see `_change`)."""
        if not self._active:
            return
        if not (isinstance(key, tuple) and key[0] == "replica"):
            return
        member = key[1]
        if member in self.members or member in self._pending:
            return
        if offset < self.acks.confirmed - JOIN_GAP:
            return
        self._pending.add(member)
        self._spawn(self._change(add={member}), f"isr-add-{member}")

    def on_slave_timeout(self, lagging: list[Hashable]) -> None:
        members = {k[1] for k in lagging if isinstance(k, tuple) and k[0] == "replica"}
        self._leave(members, "did not ack a send within slaveTimeout")

    def check(self) -> None:
        """Housekeeping: an in-sync slave disconnected for slaveTimeout leaves."""
        if not self._active:
            return
        connected = self.acks.acks()
        now = time.monotonic()
        gone = set()
        for member in self.members:
            if replica_key(member) in connected:
                self._disconnected_since.pop(member, None)
                continue
            since = self._disconnected_since.setdefault(member, now)
            if now - since >= self.slave_timeout_s:
                gone.add(member)
        self._leave(gone, "stayed disconnected for slaveTimeout")

    def _leave(self, members: set[int], why: str) -> None:
        """In-sync slaves that `why` go (published before anything is
        acknowledged without them); one already on its way is left alone."""
        members = (members & self.members) - self._pending
        if members:
            log.warning("in-sync slave(s) %s %s: leaving the in-sync set", sorted(members), why)
            self._pending |= members
            self._spawn(self._change(remove=members), f"isr-remove-{sorted(members)}")

    def _spawn(self, coro, name: str) -> None:
        """A task of this set, cancelled by `stop`, forgotten when done."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _change(self, add: set[int] = frozenset(), remove: set[int] = frozenset()) -> None:
        """Publish first for a removal (acks still need the member meanwhile);
        count a new member at once (its acks are needed before it is published)."""
        try:
            async with self._lock:
                if not self._active:
                    return
                acks = self.acks
                new = (self.members | add) - remove
                if new == self.members:
                    return
                if add:
                    acks.require(_replica_keys(self.members | add))
                    needed = acks.confirmed
                    deadline = time.monotonic() + self.slave_timeout_s
                    while any(acks.acks().get(replica_key(m), -1) < needed for m in add):
                        if time.monotonic() > deadline or not self._active:
                            log.info("member(s) %s did not catch up; not in sync yet", sorted(add))
                            acks.require(_replica_keys(self.members))
                            return
                        await asyncio.sleep(0.01)
                value = {
                    "epoch": self.epoch,
                    "leader": self.member_id,
                    "members": [self.member_id, *sorted(new)],
                }
                key, held = self.key, self.leader.raw
                while self._active:
                    try:
                        ok = await self.leader.write_if_held(
                            lambda t: [t.put(key, dumps(value))], expect=held
                        )
                        break
                    except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
                        log.warning("cannot publish the in-sync set: %s; retrying", exc)
                        await asyncio.sleep(self.poll_s)
                else:
                    return
                if not ok:
                    log.error("the in-sync set was not published: this member no longer leads")
                    acks.require(_replica_keys(self.members))
                    return
                self.members = new
                acks.require(_replica_keys(new))
                self.gauge.set(1 + len(new))
                log.warning(
                    "in-sync set of %s epoch %d is now %s",
                    self.broker_name,
                    self.epoch,
                    value["members"],
                )
        finally:
            self._pending -= set(add) | set(remove)
