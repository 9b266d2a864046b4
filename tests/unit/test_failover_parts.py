"""The failover node's parts on their own, without etcd or a broker: the fence
(services.broker.failover.lease), eligibility (election) and the in-sync set's
acknowledgements (insync)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge

from ferry.runtime.errors import Unavailable
from services.broker.failover.election import Election, LeaderKey
from services.broker.failover.epochs import EpochHistory
from services.broker.failover.etcd import Etcd, GroupState
from services.broker.failover.insync import JOIN_GAP, InSyncSet, replica_key
from services.broker.failover.lease import Fence, Lease
from services.broker.failover.role import FOLLOWER, LEADER, Role

PREFIX = "/ferry/c/broker-a/"


def _etcd() -> Etcd:
    return Etcd(("127.0.0.1:1",), timeout_s=0.5)  # never called: no socket is opened


def _fence(valid_for_s: float, role: str = LEADER) -> Fence:
    lease = Lease(_etcd(), ttl_s=6.0, poll_s=0.25)
    lease.valid_until = time.monotonic() + valid_for_s
    r = Role()
    r.set(role, 3)
    return Fence(lease, r, "broker-a")


def test_a_leader_with_a_valid_lease_takes_and_acknowledges_sends():
    fence = _fence(10)
    fence.check_accepting()
    fence.check_acknowledging()
    assert not fence.fenced()


def test_a_leader_whose_lease_clock_ran_out_takes_and_acknowledges_nothing():
    fence = _fence(-1)
    assert fence.fenced()
    for check in (fence.check_accepting, fence.check_acknowledging):
        with pytest.raises(Unavailable, match="epoch 3.*cannot renew its etcd lease"):
            check()


def test_a_handing_over_leader_takes_no_send_but_acknowledges_the_ones_taken():
    fence = _fence(10)
    fence.begin_handover()
    with pytest.raises(Unavailable, match="handing its master role over"):
        fence.check_accepting()
    fence.check_acknowledging()
    fence.end_handover()
    fence.check_accepting()


def test_a_follower_is_never_fenced():
    fence = _fence(-1, role=FOLLOWER)
    fence.begin_handover()
    fence.check_accepting()
    fence.check_acknowledging()
    assert not fence.fenced()


def _election(tmp_path, member_id: int, allow_lossy: bool = False) -> Election:
    etcd = _etcd()
    return Election(
        etcd, LeaderKey(etcd, PREFIX), PREFIX, member_id, EpochHistory.open(tmp_path),
        ttl_s=6.0, allow_lossy=allow_lossy,
    )  # fmt: skip


def test_only_in_sync_members_campaign_and_lossy_ones_one_ttl_later(tmp_path):
    isr = GroupState(epoch=2, isr={"epoch": 2, "leader": 1, "members": [1, 2]})
    assert _election(tmp_path, 2).eligible(isr, 0)
    assert not _election(tmp_path, 3).eligible(isr, 100)
    assert not _election(tmp_path, 3, allow_lossy=True).eligible(isr, 5.9)
    assert _election(tmp_path, 3, allow_lossy=True).eligible(isr, 6.0)
    assert _election(tmp_path, 3).eligible(GroupState(), 0)  # the group's first election
    assert _election(tmp_path, 3).next_epoch(isr) == 3


def test_a_ready_handover_lets_its_target_go_first_for_a_ttl(tmp_path):
    state = GroupState(
        epoch=2,
        isr={"epoch": 2, "leader": 1, "members": [1, 2, 3]},
        handover={"epoch": 2, "to": 3, "ready": True},
    )
    assert _election(tmp_path, 3).eligible(state, 0)
    assert not _election(tmp_path, 2).eligible(state, 1)
    assert _election(tmp_path, 2).eligible(state, 6.0)


class _Store:
    def __init__(self, max_offset: int) -> None:
        self.max_offset = max_offset
        self.woken = 0

    def notify_confirmed(self) -> None:
        self.woken += 1


def test_the_in_sync_set_owns_its_runs_acks_and_counts_a_close_slave_at_once():
    async def main():
        etcd = _etcd()
        gauge = Gauge("g", "g", registry=CollectorRegistry())
        in_sync = InSyncSet(
            LeaderKey(etcd, PREFIX), PREFIX, 1, 4, gauge,
            broker_name="broker-a", max_gap=1 << 30, slave_timeout_s=0.05, poll_s=0.01,
        )  # fmt: skip
        store = _Store(max_offset=JOIN_GAP + 100)
        in_sync.open(store)
        acks = in_sync.acks
        acks.require(frozenset(), floor=store.max_offset)  # as the app does for a new leader
        assert acks.confirmed == store.max_offset  # the master alone confirms its log
        acks.connect(replica_key(2), 50)
        await asyncio.sleep(0)
        assert acks.required == frozenset()  # not active yet: the run has not started
        in_sync.activate()
        acks.ack(replica_key(2), 150)  # within JOIN_GAP of the confirmed offset
        await asyncio.sleep(0)
        assert acks.required == frozenset({replica_key(2)})  # counted at once
        assert in_sync.members == frozenset()  # published only once it has caught up
        assert not in_sync.caught_up(2)
        in_sync.close()  # the run stops before it caught up
        for _ in range(100):
            await asyncio.sleep(0.01)
            if acks.required == frozenset():
                break
        assert acks.required == frozenset()  # never published: no longer required
        assert in_sync.members == frozenset()
        await in_sync.stop()
        return store.woken

    assert asyncio.run(main()) >= 1
