"""The election of a group's master: who may campaign, the campaign
transaction, and the `leader` key this member holds once it won.

Owns:
- `LeaderKey`: the bytes of the `leader` key as this member last wrote it
  (campaign, announcement). Whatever a leader publishes in its own name (the
  in-sync set, a handover) goes through `write_if_held`: applied only while the
  key is still those bytes, so a deposed master never overwrites its
  successor's state.
- `Election`: eligibility (only members of the published in-sync set campaign;
  a handover's chosen member goes first for a TTL; `allowLossyFailover=true`
  lets the others campaign one TTL later) and the campaign transaction: the
  key is still absent and the `epoch` and `isr` keys are as read; the winner
  takes epoch + 1 and the in-sync set {itself}.

Runs on the event loop, in the node's failover loop (the in-sync set's and the
handover's writes read `LeaderKey` from their own tasks). Must never start or
stop a run of the broker app, nor read one: the node does that with the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aetcd.exceptions

from services.broker.failover.epochs import EpochHistory
from services.broker.failover.etcd import Etcd, EtcdUnavailable, GroupState, dumps

log = logging.getLogger(__name__)


class LeaderKey:
    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.key = f"{prefix}leader".encode()
        self._raw = b""

    @property
    def raw(self) -> bytes:
        """The key's value as this member last wrote it."""
        return self._raw

    def held_in(self, state: GroupState) -> bool:
        return state.leader_raw == self._raw

    def won(self, record: dict) -> None:
        """The campaign put `record` under the key."""
        self._raw = dumps(record)

    async def write_if_held(self, ops: Callable[[Any], list], expect: bytes | None = None) -> bool:
        """One transaction of `ops(etcd's transaction helpers)`, applied only
        while the key is `expect` (default: as last written); False if not.

        Raises:
            EtcdUnavailable, aetcd.exceptions.ClientError: etcd did not answer.
        """
        key, old = self.key, self._raw if expect is None else expect

        async def txn(c):
            t = c.transactions
            return await c.transaction(compare=[t.value(key) == old], failure=[], success=ops(t))

        ok, _ = await self.etcd.call(txn)
        return ok

    async def replace(self, record: dict, lease: int) -> bool:
        """`record` (under `lease`) for the value this member wrote before."""
        key = self.key
        try:
            ok = await self.write_if_held(lambda t: [t.put(key, dumps(record), lease=lease)])
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            log.warning("cannot update the leader key: %s", exc)
            return False
        if ok:
            self._raw = dumps(record)
        return ok


class Election:
    def __init__(
        self,
        etcd: Etcd,
        leader: LeaderKey,
        prefix: str,
        member_id: int,
        history: EpochHistory,
        *,
        ttl_s: float,
        allow_lossy: bool,
    ) -> None:
        self.etcd = etcd
        self.leader = leader
        self.prefix = prefix
        self.member_id = member_id
        self.history = history
        self.ttl_s = ttl_s
        self.allow_lossy = allow_lossy

    def eligible(self, state: GroupState, leaderless_s: float) -> bool:
        """May this member campaign, the group having had no leader for `leaderless_s`?"""
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
        if self.allow_lossy and leaderless_s >= self.ttl_s:
            log.warning(
                "member %d is outside the in-sync set %s but allowLossyFailover=true: "
                "campaigning (messages only the lost master had are lost)",
                self.member_id,
                state.isr_members,
            )
            return True
        return False

    def next_epoch(self, state: GroupState) -> int:
        return max(state.epoch, self.history.epoch) + 1

    async def campaign(self, state: GroupState, epoch: int, record: dict, lease: int) -> bool:
        """One election transaction for `epoch`, `record` the leader key's
        value under `lease`; True if this member won."""
        prefix, member_id = self.prefix, self.member_id

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
                        dumps({"epoch": epoch, "leader": member_id, "members": [member_id]}),
                    ),
                    t.delete(f"{prefix}handover".encode()),
                ],
            )

        try:
            won, _ = await self.etcd.call(txn)
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            log.warning("campaign for epoch %d failed: %s", epoch, exc)
            return False
        if won:
            self.leader.won(record)
        return bool(won)
