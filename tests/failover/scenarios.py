"""The fault scenarios: `kill_master`, `etcd_partition`, `lagging_replica`, `handover`,
`ha_partition`, `pause_follower`, `freeze_leader` (the new-topic scenario is in
tables.py).

Each drives one kind of fault through `rounds` rounds on a started group with producers
running, asserts what must hold during the fault, and leaves the group steady (a ready
leader, every member alive and in sync) for the next round or the final
`faults.check_final`. tests/integration/test_failover.py runs them with few rounds,
tests/chaos/test_failover_chaos.py with FERRY_CHAOS_ROUNDS.
"""

from __future__ import annotations

import time
from collections.abc import Container

from tests.failover.config import BROKER, CLUSTER, PATIENCE_S, TTL_S
from tests.failover.group import FailoverGroup
from tests.failover.member import Member
from tests.failover.outcome import Outcome
from tests.failover.producers import Producers
from tests.failover.steps import deadline_left, freeze, note_cut, probe_name, rejoin
from tests.integration.support import run_ferry
from tests.waiting import wait_for


def _log_end(group: FailoverGroup, m: Member) -> int:
    st = group.ha_status(m)
    return st.master_max_offset if st is not None else -1


def kill_master(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    held: Container[int] = (),
) -> None:
    """SIGKILL the master under load. A new master answers SEND_OK (on an
    idle machine within lease TTL + a few seconds of the kill; the time is
    recorded in `out`, not asserted); every SEND_OK so far is read from it at its
    queue offset; the old master, restarted, follows it, cut back to the new
    epoch's start when it had an unacknowledged tail, and is in sync again.

    In the rounds numbered in `held` (from 0; the group needs ha_proxies) the
    master's HA link is blackholed first, and the kill comes once the master
    has appended sends after that (they never reach a slave; well within
    slaveTimeout, so the slaves are still in the in-sync set): the old master
    surely has a tail to cut."""
    for r in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        producers.wait_acked(30, addr=old.addr)
        if r in held:
            # A channel that is connected already: the waits below are short.
            wait_for(lambda o=old: group.ha_status(o), PATIENCE_S, f"{old} to answer GetHAStatus")
            group.blackhole_ha(old)
            # What is appended after this read of the log end never leaves the
            # proxy; the send below is (the workers may all be waiting).
            floor = _log_end(group, old)
            producers.send_async(old.addr)
            # (Should the machine be slower than slaveTimeout from here to the
            # kill, the slaves leave the in-sync set first: handled below.)
            wait_for(lambda o=old, f=floor: _log_end(group, o) > f >= 0, PATIENCE_S,
                     "a send appended after the link was cut", interval_s=0.005)  # fmt: skip
        killed = time.monotonic()
        group.kill(old)
        out.faults.append(f"kill member {old.id}" + (" holding sends" if r in held else ""))
        if r in held and group.view().in_sync == [old.id]:
            # The kill came after a held send timed out (a machine slower than
            # slaveTimeout): the slaves had left the in-sync set, so rightly
            # nobody may be elected. Expect that, then bring the master back.
            out.notes.append(f"round {r}: the held master was alone in sync when killed")
            out.skipped += 1
            group.restart(old)
            group.heal_ha(old)
            group.wait_leader(timeout_s=PATIENCE_S)
            continue
        new = group.wait_leader(exclude={old.id}, timeout_s=deadline_left(killed, PATIENCE_S))
        first = producers.wait_first_ok(new.addr, killed, deadline_left(killed, PATIENCE_S))
        out.failover_s.append(first.end - killed)
        acked = producers.acked()
        pulled = group.pull(new, producers.topic)
        unread = [str(a) for a in acked if pulled.get((a.queue_id, a.queue_offset)) != a.body]
        assert not unread, f"{len(unread)} SEND_OK not read from the new master: {unread[:5]}"
        start = group.view().epoch_start()
        mark = len(old.log())
        group.restart(old)
        cuts = len(out.cuts)
        rejoin(group, old, mark, start, out)
        if r in held:
            group.heal_ha(old)
            assert len(out.cuts) > cuts, f"{old} held an unacknowledged tail, yet cut nothing"


def etcd_partition(
    group: FailoverGroup, producers: Producers, rounds: int, out: Outcome
) -> list[Producers]:
    """Cut the master off from etcd (its etcd proxy blackholes) under load,
    with a probe producer pinned to it. It stops acknowledging within the
    lease TTL, telling the probe why; another member is elected and answers
    SEND_OK; the probe keeps trying the old master meanwhile; once healed the
    old master follows. Returns the probes (their records join the history)."""
    probes = []
    for _ in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        name = probe_name()  # keys unique across calls
        probe = Producers(lambda: None, count=1, pinned=old.addr, name=name).start()
        probes.append(probe)
        try:
            probe.wait_acked(5)
            producers.wait_acked(20, addr=old.addr)
            cut = time.monotonic()
            group.blackhole_etcd(old)
            out.faults.append(f"etcd partition of member {old.id}")
            new = group.wait_leader(exclude={old.id}, timeout_s=deadline_left(cut, PATIENCE_S))
            first = producers.wait_first_ok(new.addr, cut, deadline_left(cut, PATIENCE_S))
            out.failover_s.append(first.end - cut)
            # The probe tried the old master after the new one acknowledged.
            wait_for(lambda f=first, p=probe: any(a.start > f.end for a in p.snapshot()), PATIENCE_S,
                     "the probe to try the old master after the failover")  # fmt: skip
        finally:
            probe.stop()
            group.heal_etcd(old)
        from_old = [a for p in (producers, probe) for a in p.acked() if a.addr == old.addr]
        # A send decided no earlier than it started: one that started after
        # cut + TTL and was acknowledged proves the fence failed (answers
        # arriving late prove nothing).
        last = max(a.start for a in from_old)
        assert last <= cut + TTL_S, (
            f"the old master acknowledged a send started {last - cut:.2f}s after losing etcd "
            f"(TTL {TTL_S}s)"
        )
        fenced = [a for a in probe.snapshot()
                  if a.start > cut and a.status == "UNAVAILABLE" and "lease" in a.detail]  # fmt: skip
        assert fenced, f"the old master never refused for its lease: {probe.statuses()}"
        out.notes.append(
            f"etcd cut off member {old.id}: its last SEND_OK {last - cut:.2f}s after the cut, "
            f"first fence refusal {min(a.end for a in fenced) - cut:.2f}s, new master's first "
            f"SEND_OK {first.end - cut:.2f}s (a send started {first.start - last:.2f}s after "
            "the old master's last SEND_OK answer)"
        )
        group.wait_isr(timeout_s=PATIENCE_S)  # the old master is back, as an in-sync slave
        # ...and holds a lease again (its member key lives under it): it can be elected.
        wait_for(lambda o=old: o.id in group.view().members, PATIENCE_S,
                 f"{old} to hold an etcd lease again")  # fmt: skip
    return probes


def lagging_replica(group: FailoverGroup, producers: Producers, rounds: int, out: Outcome) -> None:
    """Three members. A follower is paused (SIGSTOP) until it leaves the
    in-sync set, and more is acknowledged without it. Then the master dies,
    the in-sync follower is paused and the lagging one resumed: alone for
    over a TTL after the leader key lapsed, the lagging one is not elected.
    The in-sync one, resumed, wins. The old master rejoins."""
    assert len(group.members) >= 3
    for r in range(rounds):
        group.wait_isr()
        master = group.wait_leader()
        followers = [m for m in group.members if m is not master]
        lagging, in_sync = followers[r % 2], followers[1 - r % 2]
        producers.wait_acked(20, addr=master.addr)
        group.pause(lagging)
        out.faults.append(f"pause member {lagging.id}, kill master {master.id}")
        group.wait_isr([master.id, in_sync.id], timeout_s=PATIENCE_S)
        producers.wait_acked(20, addr=master.addr)  # acknowledged without it
        killed = time.monotonic()
        group.kill(master)
        group.pause(in_sync)
        group.resume(lagging)
        try:
            group.wait_leaderless()
            group.assert_no_leader(TTL_S + 1, candidate=lagging)
            assert lagging.alive
        finally:
            group.resume(in_sync)
        new = group.wait_leader(timeout_s=PATIENCE_S)
        assert new is in_sync, f"{new} won; the in-sync {in_sync} should have"
        producers.wait_first_ok(new.addr, killed, PATIENCE_S)
        start = group.view().epoch_start()
        mark = len(master.log())
        group.restart(master)
        rejoin(group, master, mark, start, out)


def handover(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    etcd_endpoint: str,
    to: Member | None = None,
) -> None:
    """`ferry failover --to ID` (the real CLI) with producers running: the
    target (`to`, else the other members in turn) is the new master, ready
    when the command returns; it answers SEND_OK; the old master follows
    with nothing cut (it had handed over everything it stored)."""
    for r in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        others = [m for m in group.members if m is not old]
        target = to or others[r % len(others)]
        producers.wait_acked(20, addr=old.addr)
        mark = len(old.log())
        asked = time.monotonic()
        done = run_ferry("failover", "-c", CLUSTER, "-b", BROKER, "--to", str(target.id),
                         "--etcd", etcd_endpoint, timeout_s=60)  # fmt: skip
        took = time.monotonic() - asked
        out.faults.append(f"handover {old.id} -> {target.id}")
        assert done.returncode == 0, done.stderr
        assert f"member {target.id} at {target.addr} is master" in done.stdout, done.stdout
        assert group.leader() is target
        first = producers.wait_first_ok(target.addr, asked, PATIENCE_S)
        out.failover_s.append(first.end - asked)
        group.wait_isr()
        assert "cutting this log" not in old.log()[mark:], f"{old} cut its log after a handover"
        out.notes.append(f"handover {old.id} -> {target.id}: the command took {took:.2f}s")


def ha_partition(group: FailoverGroup, producers: Producers, out: Outcome) -> None:
    """The master's HA link is blackholed under load: a send times out
    (FLUSH_SLAVE_TIMEOUT), the slaves leave the published in-sync set, and
    once healed they catch up and are back in it (and report in-sync
    readiness again). No election."""
    group.wait_isr()
    master = group.wait_leader()
    producers.wait_acked(20, addr=master.addr)
    cut = time.monotonic()
    group.blackhole_ha(master)
    out.faults.append(f"HA partition of master {master.id}")
    try:
        wait_for(lambda: any(a.status == "FLUSH_SLAVE_TIMEOUT" and a.end > cut
                             for a in producers.snapshot()),
                 PATIENCE_S, "a send to time out for the slaves")  # fmt: skip
        group.wait_isr([master.id], timeout_s=PATIENCE_S)
    finally:
        group.heal_ha(master)
    group.wait_isr()
    assert group.leader() is master
    group.wait_eligible(yes=group.live())  # in-sync readiness is back for every slave


def pause_follower(group: FailoverGroup, producers: Producers, out: Outcome) -> None:
    """A follower stands still (SIGSTOP) for longer than slaveTimeout under
    load: it leaves the in-sync set, and resumed it is back in it."""
    group.wait_isr()
    master = group.wait_leader()
    follower = next(m for m in group.members if m is not master)
    producers.wait_acked(20, addr=master.addr)
    group.pause(follower)
    out.faults.append(f"pause follower {follower.id}")
    try:
        rest = sorted(m.id for m in group.members if m is not follower)
        group.wait_isr(rest, timeout_s=PATIENCE_S)
    finally:
        group.resume(follower)
    group.wait_isr()


def freeze_leader(
    group: FailoverGroup, producers: Producers, rounds: int, out: Outcome
) -> list[Producers]:
    """The master stands still (SIGSTOP: a long GC pause, a frozen VM) under
    load, with a probe producer pinned to it, until another member is elected
    and answers SEND_OK; then it is resumed (SIGCONT). It acknowledges no send
    started after the new master's first SEND_OK (the probe keeps trying it),
    and rejoins the in-sync set as a follower. Returns the probes (their
    records join the history)."""
    probes = []
    for _ in range(rounds):
        group.wait_isr()
        old = group.wait_leader()
        probe = Producers(lambda: None, count=1, pinned=old.addr, name=probe_name())
        probes.append(probe.start())
        try:
            probe.wait_acked(5)
            producers.wait_acked(20, addr=old.addr)
            mark = len(old.log())
            first = freeze(group, producers, old, out)
            resumed = time.monotonic()
            out.faults.append(f"freeze leader {old.id}")
            group.wait_isr(timeout_s=PATIENCE_S)
            wait_for(lambda p=probe, t=resumed: any(a.start > t for a in p.snapshot()), PATIENCE_S,
                     "the probe to try the resumed member")  # fmt: skip
        finally:
            probe.stop()
        note_cut(old, mark, out)
        late = [str(a) for p in (producers, probe) for a in p.acked()
                if a.addr == old.addr and a.start > first.end]  # fmt: skip
        assert not late, (
            f"the frozen master acknowledged {len(late)} send(s) started after the new master's "
            f"first SEND_OK: {late[:5]}"
        )
        out.notes.append(
            f"froze leader {old.id}: member at {first.addr} answered SEND_OK "
            f"{out.failover_s[-1]:.2f}s later; resumed, back in sync "
            f"{time.monotonic() - resumed:.2f}s after"
        )
    return probes
