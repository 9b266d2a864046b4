"""An orderly handover of the master role (`ferry failover` writes the group's
`handover` key; services/broker/failover/etcd.py has its layout).

Owns `Handover.hand_over`: the master stops taking sends (the fence refuses
them), waits until the chosen in-sync slave has everything and every send taken
is confirmed by the whole in-sync set, then marks the request ready and deletes
its `leader` key in one transaction (only while it still holds that key); the
chosen slave campaigns first for a TTL (services.broker.failover.election). A
request it cannot honour gets `refused` written into it, saying why.

Runs on the event loop, in the node's leadership watch. Must never stop or
start a run of the broker app, nor read one (the node steps down when
`hand_over` returns True), and never choose a member outside the in-sync set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aetcd.exceptions

from services.broker.failover.election import LeaderKey
from services.broker.failover.etcd import Etcd, EtcdUnavailable, dumps
from services.broker.failover.insync import InSyncSet
from services.broker.failover.lease import Fence

log = logging.getLogger(__name__)


class Handover:
    def __init__(
        self, etcd: Etcd, leader: LeaderKey, prefix: str, fence: Fence, *, slave_timeout_s: float
    ) -> None:
        self.etcd = etcd
        self.leader = leader
        self.key = f"{prefix}handover".encode()
        self.fence = fence
        self.slave_timeout_s = slave_timeout_s

    async def hand_over(self, request: dict, in_sync: InSyncSet, epoch: int) -> bool:
        """Stop taking sends, let the target catch up, leave; True once the
        request is marked ready and the leader key is gone."""
        target = request.get("to")
        if target is None:
            target = in_sync.most_caught_up()
        if target is None or target not in in_sync.members:
            await self._refuse(
                request,
                f"member {target} is not in the in-sync set {sorted(in_sync.members)}"
                if target is not None
                else "no slave is in the in-sync set",
            )
            return False
        log.warning("handing the master role of epoch %d over to member %d", epoch, target)
        self.fence.begin_handover()
        deadline = time.monotonic() + max(self.slave_timeout_s * 2, 2.0)
        # Every send taken is answered before the role goes: confirmed by the
        # whole in-sync set, not only by the target (a send still waiting for
        # another slave would be cut off when this incarnation stops, answered
        # UNAVAILABLE though stored, and stored again by the producer's retry).
        while not in_sync.caught_up(target):
            if time.monotonic() > deadline or self.fence.fenced():
                self.fence.end_handover()
                await self._refuse(
                    request,
                    f"member {target} (or another in-sync member) did not catch up within "
                    "the handover deadline",
                )
                return False
            await asyncio.sleep(0.01)
        key, ready = self.key, {**request, "to": target, "ready": True, "epoch": epoch}
        leader_key = self.leader.key
        try:
            return await self.leader.write_if_held(
                lambda t: [t.put(key, dumps(ready)), t.delete(leader_key)]
            )
        except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
            self.fence.end_handover()
            log.warning("handover failed: %s", exc)
            return False

    async def _refuse(self, request: dict, why: str) -> None:
        log.warning("handover refused: %s", why)
        key = self.key
        with contextlib.suppress(EtcdUnavailable, aetcd.exceptions.ClientError):
            await self.etcd.call(lambda c: c.put(key, dumps({**request, "refused": why})))
