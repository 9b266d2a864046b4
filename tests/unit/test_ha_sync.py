"""The SYNC_MASTER ack tracker: the strict-< gap rule, waiters released by
offset, per-request deadlines, per-replica acks, a confirmed offset that never
goes down."""

from __future__ import annotations

import asyncio

from services.broker.cluster.replication import SyncReplication
from services.broker.messaging.outgoing import SendStatus
from services.broker.store import PutResult, PutStatus
from services.ha.sync import ReplicaAcks
from tests.waiting import wait_for_async

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
        await wait_for_async(lambda: acks.waiting == 4, 5, "four sends to wait")
        acks.ack("r1", 250)
        await wait_for_async(lambda: waits[100].done() and waits[200].done(), 5,
                             "the ack to release the waiters at or below it")  # fmt: skip
        assert acks.waiting == 2
        done = {o for o, t in waits.items() if t.done()}
        assert done == {100, 200}
        acks.ack("r1", 400)
        return [await waits[o] for o in (100, 200, 300, 400)]

    assert asyncio.run(scenario()) == [True] * 4


def test_a_slow_request_times_out_alone():
    async def scenario():
        acks = ReplicaAcks(GAP)
        acks.connect("r1", 0)
        fast = asyncio.create_task(acks.wait(10, 5))
        await wait_for_async(lambda: acks.waiting == 1, 5, "the fast send to wait")
        slow = asyncio.create_task(acks.wait(1000, 0.05))
        # Both wait, unless the slow one's 50 ms have run out already on a busy machine.
        await wait_for_async(lambda: acks.waiting == 2 or slow.done(), 5, "the slow send to wait")
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


class _NoWaiters:
    def notify_confirmed(self) -> None:
        pass


class _Pushes:
    """The HA master's push, counted: the confirmed offset at each push."""

    def __init__(self, acks: ReplicaAcks) -> None:
        self.acks = acks
        self.seen: list[int] = []

    def push_now(self) -> None:
        self.seen.append(self.acks.confirmed)


def test_a_sync_send_pushes_its_bytes_before_waiting_and_only_when_unconfirmed():
    """SyncReplication asks the HA master to send the new bytes now (push) right
    before a send waits for its slave; a send already confirmed neither pushes nor
    waits, and one with no slave in sync is refused without a push."""

    def put(end: int) -> PutResult:
        return PutResult(PutStatus.PUT_OK, "T", 0, 0, [0], "7F00000100002A9F", end, 0)

    async def scenario():
        acks = ReplicaAcks(GAP)
        push = _Pushes(acks)
        pushes = push.seen
        replication = SyncReplication(acks, 5.0, _NoWaiters(), push=push)
        assert await replication.wait(put(100)) == SendStatus.SLAVE_NOT_AVAILABLE
        assert pushes == []
        acks.connect("r1", 0)
        waiting = asyncio.create_task(replication.wait(put(100)))
        await wait_for_async(lambda: acks.waiting, 5, "the send to wait", interval_s=0)
        assert pushes == [0]  # pushed before it waited
        acks.ack("r1", 100)
        assert await waiting == SendStatus.SEND_OK
        assert await replication.wait(put(50)) == SendStatus.SEND_OK  # confirmed already
        assert pushes == [0]

    asyncio.run(scenario())
