"""The SYNC_MASTER ack tracker: the strict-< gap rule, waiters released by
offset, per-request deadlines, per-replica acks, a confirmed offset that never
goes down."""

from __future__ import annotations

import asyncio

from services.ha.sync import ReplicaAcks

GAP = 256 * 1024 * 1024


def test_slave_ok_needs_a_replica_and_a_gap_strictly_below_the_limit():
    acks = ReplicaAcks(GAP)
    assert not acks.slave_ok(10)  # no slave connected
    acks.connect("r1", 1000)
    assert acks.slave_ok(1000 + GAP - 1)
    assert not acks.slave_ok(1000 + GAP)  # exactly the gap: not in sync (strict <)
    acks.disconnect("r1")
    assert not acks.slave_ok(1000)


def test_each_ack_releases_every_waiter_at_or_below_it_and_no_other():
    async def scenario():
        acks = ReplicaAcks(GAP)
        acks.connect("r1", 0)
        waits = {o: asyncio.create_task(acks.wait(o, 5)) for o in (300, 100, 200, 400)}
        await asyncio.sleep(0.01)
        acks.ack("r1", 250)
        await asyncio.sleep(0.01)
        done = {o for o, t in waits.items() if t.done()}
        assert done == {100, 200}
        acks.ack("r1", 400)
        return [await waits[o] for o in (100, 200, 300, 400)]

    assert asyncio.run(scenario()) == [True] * 4


def test_a_slow_request_times_out_alone():
    async def scenario():
        acks = ReplicaAcks(GAP)
        acks.connect("r1", 0)
        slow = asyncio.create_task(acks.wait(1000, 0.05))
        fast = asyncio.create_task(acks.wait(10, 5))
        await asyncio.sleep(0.01)
        acks.ack("r1", 10)
        assert await fast is True  # released long before the slow one's deadline
        return await slow

    assert asyncio.run(scenario()) is False


def test_already_confirmed_returns_at_once_and_confirmed_never_drops():
    async def scenario():
        acks = ReplicaAcks(GAP)
        acks.connect("a", 500)
        assert await acks.wait(400, 0) is True
        acks.disconnect("a")
        assert acks.confirmed == 500
        acks.connect("b", 100)
        assert acks.confirmed == 500 and acks.best_ack == 100

    asyncio.run(scenario())


def test_acks_are_per_replica():
    acks = ReplicaAcks(GAP)
    acks.connect("a", 10)
    acks.connect("b", 50)
    acks.ack("a", 40)
    assert acks.acks() == {"a": 40, "b": 50}
    assert acks.best_ack == 50 and acks.in_sync(60) == 2
