"""Automatic failover (#16) end to end: real etcd, a real name server and
broker-a's members as `python -m services.broker` processes with
enableFailover=true, producers recording every attempt, and the Jepsen-style
history checker of tests/failover/history.py after every scenario: each
SEND_OK is in the final log exactly once at the offsets its producer was
told and read there by a consumer, every record was sent by someone, the
members' logs are byte-identical, and two masters' SEND_OKs never
interleave. Lease TTL 2 s, slaveTimeout 1 s; tests/chaos/test_failover_chaos.py
runs the same scenarios in more rounds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ferry import record
from services.broker.store.commitlog import segment_name
from tests.conftest import LoopThread
from tests.failover.config import FILE_SIZE, PATIENCE_S, QUEUES, TOPIC, TTL_S
from tests.failover.faults import check_final
from tests.failover.group import FailoverGroup
from tests.failover.history import check_history, check_no_overlap
from tests.failover.logs import assert_identical, read_image
from tests.failover.outcome import Outcome
from tests.failover.producers import Attempt, Producers
from tests.failover.scenarios import (
    etcd_partition,
    ha_partition,
    handover,
    kill_master,
    lagging_replica,
    pause_follower,
)
from tests.integration.support import PortRange, pull_all, run_ferry, sample, scrape
from tests.waiting import wait_equal, wait_for

# Fixed ports for members that restart (see PortRange for the suites' ranges).
PORTS = PortRange(32000, 32384)


class Rig:
    """Groups and producers of one test, stopped by PID afterwards."""

    def __init__(self, root: Path, etcd_endpoint: str, loop: LoopThread) -> None:
        self.root, self.etcd_endpoint, self.loop = root, etcd_endpoint, loop
        self.groups: list[FailoverGroup] = []
        self.producers: list[Producers] = []

    def group(self, size: int = 2, **options) -> FailoverGroup:
        g = FailoverGroup(self.root / f"group{len(self.groups)}", self.etcd_endpoint, PORTS,
                          self.loop, size=size, **options)  # fmt: skip
        self.groups.append(g)
        return g.start()

    def start_producers(self, group: FailoverGroup, count: int = 3) -> Producers:
        p = Producers(group.master_addr, count=count).start()
        self.producers.append(p)
        return p

    def close(self) -> None:
        for p in self.producers:
            p.stop()
        for g in self.groups:
            g.stop_all()
            for m in g.members:  # shown when the test fails
                lines = [
                    line
                    for line in m.log().splitlines()
                    if "WARNING" in line or "ERROR" in line or "failover" in line
                ]
                print(f"--- member {m.id} ({m.server.log_path})\n" + "\n".join(lines[-60:]))


@pytest.fixture
def rig(tmp_path: Path, etcd, loop_thread: LoopThread) -> Iterator[Rig]:
    r = Rig(tmp_path, etcd.endpoint, loop_thread)
    try:
        yield r
    finally:
        r.close()


def test_sigkill_master_under_load_new_master_has_every_send_ok(rig):
    """Two rounds: the master of three is SIGKILLed under SYNC load from
    three producers. Each time another member answers SEND_OK (the time is
    printed, not asserted), every SEND_OK so far is read from it at its queue
    offset, and the old master restarts, follows (cut back to the new epoch's
    start when it had an unacknowledged tail: its log says so) and is in sync
    again. In the second round the master's HA link is held up just before
    the kill, so it surely has such a tail. At the end the history holds and
    the logs are byte-identical."""
    group = rig.group(size=3, ha_proxies=True)
    producers = rig.start_producers(group)
    out = Outcome()
    kill_master(group, producers, rounds=2, out=out, held={1})
    result = check_final(group, [producers])
    assert len(out.failover_s) + out.skipped == 2, out.failover_note()
    print(out.failover_note(), out.cuts, result.summary(), sep="\n")


def test_master_cut_off_from_etcd_stops_acknowledging_before_a_new_one_does(rig):
    """The master of three loses etcd (a fault proxy in front of etcd's client
    port blackholes) under load, with a probe producer pinned to it.

    What a client can check: a broker decides SEND_OK somewhere between the
    start of a send and the arrival of its answer. So: the old master's last
    SEND_OK answer arrives within the lease TTL of the cut (it fenced itself:
    the probe is told UNAVAILABLE naming the lease); another member is
    elected and answers SEND_OK; and the last SEND_OK answer from the old
    master arrived before the first send the new master acknowledged even
    started. Then their acknowledging periods are disjoint: at no moment do
    two brokers both answer SEND_OK (for all traffic the producers and probe
    sent; unobserved sends are not covered). Healed, the old master follows,
    and the history holds."""
    group = rig.group(size=3, etcd_proxies=True)
    producers = rig.start_producers(group)
    out = Outcome()
    probes = etcd_partition(group, producers, rounds=1, out=out)
    result = check_final(group, [producers, *probes])
    print(*out.notes, out.failover_note(), result.summary(), sep="\n")


def test_ha_partition_slave_leaves_in_sync_set_and_is_not_elected(rig):
    """A SYNC master and its slave; the master's HA port is reached through a
    fault proxy (the master advertises the proxy's address in etcd). The link
    blackholes under load: a send answers FLUSH_SLAVE_TIMEOUT and the slave
    leaves the in-sync set published in etcd, and its in-sync readiness
    (grpc.health.v1 `ferry.failover.InSync`) turns NOT_SERVING. The master
    is then SIGKILLed: while only the slave is alive, for over a TTL after
    the leader key lapsed, no leader is elected. Restarted with
    allowLossyFailover=true the slave is elected (so the wait above could
    have failed), and loses only sends acknowledged after the partition
    began. The old master, restarted, follows it and cuts what it alone
    held."""
    group = rig.group(size=2, ha_proxies=True)
    producers = rig.start_producers(group, count=2)
    master = group.wait_leader()
    slave = next(m for m in group.members if m is not master)
    group.wait_eligible(yes=[master, slave])  # what the Kubernetes readiness probe asks
    producers.wait_acked(30)
    cut = time.monotonic()
    group.blackhole_ha(master)
    wait_for(lambda: any(a.status == "FLUSH_SLAVE_TIMEOUT" and a.end > cut
                         for a in producers.snapshot()),
             PATIENCE_S, "a send to answer FLUSH_SLAVE_TIMEOUT")  # fmt: skip
    group.wait_isr([master.id], timeout_s=PATIENCE_S)
    group.wait_eligible(yes=[master], no=[slave])
    answered = len(producers.snapshot())
    wait_for(
        lambda: len(producers.snapshot()) >= answered + 10, PATIENCE_S, "more sends after the fault"
    )
    group.kill(master)  # its link stays cut: what it alone held never reaches the slave
    group.wait_leaderless()
    group.assert_no_leader(TTL_S + 1, candidate=slave)
    assert slave.alive and group.view().isr["members"] == [master.id]

    group.restart(slave, allowLossyFailover="true")
    assert group.wait_leader(timeout_s=PATIENCE_S) is slave
    assert "allowLossyFailover=true: campaigning" in slave.log()
    start = group.view().epoch_start()
    lost = [a for a in producers.acked() if a.commit_offset >= start]
    early = [str(a) for a in lost if a.end <= cut]
    assert not early, f"acknowledged before the partition, yet not on the slave: {early[:5]}"

    mark = len(master.log())
    group.restart(master)
    wait_for(lambda: "cutting this log" in master.log()[mark:], PATIENCE_S, "the old master to cut")
    assert f"cutting this log at {start} " in master.log()[mark:]
    result = check_final(group, [producers], lost_allowed=lost)
    print(f"lossy election lost {len(lost)} SEND_OK, all after the partition", result.summary())


def test_lagging_replica_is_never_elected_over_an_in_sync_one(rig):
    """Three members: one falls out of the in-sync set (paused), the master
    dies, and the lagging one has the group to itself for over a TTL without
    being elected; the in-sync one, resumed, wins (see
    tests/failover/scenarios.py, lagging_replica). The history holds."""
    group = rig.group(size=3)
    producers = rig.start_producers(group, count=2)
    out = Outcome()
    lagging_replica(group, producers, rounds=1, out=out)
    result = check_final(group, [producers])
    print(out.cuts, result.summary())


def test_graceful_handover_under_load_loses_nothing_and_stores_nothing_twice(rig):
    """Three members; `ferry failover -c DefaultCluster -b broker-a --to ID`
    (the real CLI), twice, while three producers send: each time the command
    returns once the target is master; `ferry ha-status --json` agrees; no
    SEND_OK is lost; no message is answered SEND_OK twice, and none is even
    stored twice: the old master refuses new sends before storing them and
    answers every send it took before it leaves (a send cut off unanswered
    would be stored again by the producer's retry), and it cuts nothing when
    it follows. The members' failover metrics, scraped over HTTP, say the
    same as etcd."""
    group = rig.group(size=3, metricsPort=0)
    producers = rig.start_producers(group)
    out = Outcome()
    handover(group, producers, rounds=2, out=out, etcd_endpoint=rig.etcd_endpoint)
    new = group.leader()
    status = run_ferry("ha-status", "--etcd", rig.etcd_endpoint, "--json")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)
    assert (row["broker"], row["leader"]["id"], row["epoch"]) == ("broker-a", new.id, 3), row
    # Members 1, 2, 3 led epochs 1, 2, 3 in turn; each followed every leader
    # but itself, and the last two took over from another master.
    assert [m.id for m in group.members] == [1, 2, 3] and new.id == 3
    want = {
        m.id: {
            "ferry_ha_epoch": 3,
            "ferry_ha_leader": int(m is new),
            "ferry_ha_in_sync_replicas": 3 if m is new else 0,
            "ferry_ha_fenced": 0,
            "ferry_ha_leader_changes_total": 3,
            "ferry_ha_failovers_total": 0 if m.id == 1 else 1,
        }
        for m in group.members
    }
    wait_equal(lambda: {m.id: ha_metrics(m) for m in group.members}, want, PATIENCE_S,
               "the members' failover metrics to agree with etcd")  # fmt: skip
    result = check_final(group, [producers])
    assert result.keys_stored_twice == 0, result.summary()
    print(*out.notes, out.failover_note(), result.summary(), sep="\n")


def test_sends_to_members_changing_role_are_answered_never_cancelled(rig):
    """Three members; besides producers following the master, three producers
    pinned to each member send to it all along, through three handovers (the
    real CLI): each time the old master steps down and follows, the new one
    starts as master, and each member's gRPC server stays up across its runs
    (ferry.runtime.swap). Every send is answered for real or UNAVAILABLE
    (retry), never CANCELLED; the pinned producers saw the role change
    itself as UNAVAILABLE; a master that steps down runs nothing until it
    follows the new one (no run as a follower of nobody, as at start-up); the
    history holds."""
    group = rig.group(size=3)
    producers = rig.start_producers(group)
    pinned = [
        Producers(group.master_addr, count=3, pinned=m.addr, name=f"m{m.id}-").start()
        for m in group.members
    ]
    rig.producers.extend(pinned)
    out = Outcome()
    handover(group, producers, rounds=3, out=out, etcd_endpoint=rig.etcd_endpoint)
    result = check_final(group, [producers, *pinned])
    attempts = [a for p in (producers, *pinned) for a in p.snapshot()]
    cancelled = [f"{a}: {a.detail!r}" for a in attempts if a.status == "CANCELLED"]
    assert not cancelled, cancelled
    switching = [a for a in attempts if "is starting or changing its role" in a.detail]
    assert switching and all(a.status == "UNAVAILABLE" for a in switching), switching[:5]
    for m in group.members:
        runs = m.log().count(f"member {m.id} runs as slave (epoch 0)")
        assert runs == 1, f"{m} ran {runs} times as a follower of no leader"
    statuses = {f"member {m.id}": p.statuses() for m, p in zip(group.members, pinned, strict=True)}
    print(*out.notes, statuses, f"{len(switching)} told a role change", result.summary(), sep="\n")


def test_a_master_cut_off_from_etcd_serves_reads_again_after_a_ttl(rig):
    """A master that steps down runs nothing until it knows its next role;
    cut off from etcd it cannot learn it, so after a lease TTL without a
    leader it serves reads again (as a follower of nobody) while the other
    member leads: every acknowledged message is read from it. Healed, it
    follows the new master and is in sync."""
    group = rig.group(size=2, etcd_proxies=True)
    producers = rig.start_producers(group, count=1)
    old = group.wait_leader()
    producers.wait_acked(20)
    group.blackhole_etcd(old)
    new = group.wait_leader(exclude=[old.id])
    producers.stop()
    acked = {(a.queue_id, a.queue_offset): a.body for a in producers.acked() if a.addr == old.addr}
    assert acked, "no SEND_OK from the master before the cut"

    def reads() -> dict | None:
        try:
            return pull_all(group.channel(old.addr), TOPIC, QUEUES, group="after-step-down")
        except grpc.RpcError:
            return None  # UNAVAILABLE while it runs nothing

    wait_for(lambda: "serves nothing until its next role" in old.log(), PATIENCE_S,
             f"{old} to step down")  # fmt: skip
    got = wait_for(reads, PATIENCE_S, f"{old} to serve reads while cut off from etcd")
    assert {k: got.get(k) for k in acked} == acked
    assert "serving reads meanwhile" in old.log()
    group.heal_etcd(old)
    group.wait_isr([old.id, new.id], timeout_s=PATIENCE_S)


def ha_metrics(m) -> dict[str, float]:
    """`m`'s ferry_ha_* failover series, from its /metrics endpoint."""
    text = scrape(f"http://127.0.0.1:{m.server.metrics_port}/metrics")
    labels = f'broker_name="broker-a",cluster="DefaultCluster",member="{m.id}"'
    names = ("epoch", "leader", "in_sync_replicas", "fenced", "leader_changes_total",
             "failovers_total")  # fmt: skip
    return {f"ferry_ha_{n}": sample(text, f"ferry_ha_{n}", labels) for n in names}


def test_history_holds_after_a_sequence_of_faults(rig):
    """Three members, faults in a row under load: the master SIGKILLed and
    restarted, its HA link blackholed and healed, cut off from etcd and
    healed, a handover back to that member (it can lead again), a follower
    paused. After all of them every SEND_OK is in the group's log exactly
    once at its offsets, nothing else is, and the three logs are
    byte-identical."""
    group = rig.group(size=3, etcd_proxies=True, ha_proxies=True)
    producers = rig.start_producers(group)
    out = Outcome()
    kill_master(group, producers, 1, out)
    ha_partition(group, producers, out)
    cut_off = group.wait_leader()
    probes = etcd_partition(group, producers, 1, out)
    handover(group, producers, 1, out, rig.etcd_endpoint, to=cut_off)
    pause_follower(group, producers, out)
    result = check_final(group, [producers, *probes])
    # Elected: the first master, then after the kill, the etcd cut and the handover.
    assert group.view().epoch == 4, (group.view().epoch, out.faults)
    print(out.faults, out.cuts, out.failover_note(), result.summary(), sep="\n")


def test_rocketmq_protocol_connections_outlive_a_members_role_changes(rig):
    """A member's RocketMQ-protocol listener belongs to its failover node, as
    its gRPC server does: a connection opened before a handover is served by
    the next run on the same socket (the run's table: an unknown code is 3),
    and between two runs every request is answered SERVICE_NOT_AVAILABLE
    (14), never left unanswered or cut."""
    from ferry.remoting import codes
    from ferry.remoting.client import RemotingClient
    from ferry.remoting.codec import Command

    group = rig.group(size=2)
    old = group.wait_leader()
    new = next(m for m in group.members if m is not old)
    clients = {m.id: rig.loop.run(RemotingClient.connect(m.remoting_addr)) for m in group.members}

    def ask(m) -> int:
        return rig.loop.run(clients[m.id].request(Command(9999), timeout=5)).code

    try:
        assert {m.id: ask(m) for m in group.members} == {1: 3, 2: 3}
        done = run_ferry("failover", "-c", "DefaultCluster", "-b", "broker-a",
                         "--to", str(new.id), "--etcd", rig.etcd_endpoint, timeout_s=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert group.leader() is new
        for m in group.members:
            seen: list[int] = []
            wait_for(lambda m=m, seen=seen: seen.append(ask(m)) or seen[-1] == 3, PATIENCE_S,
                     f"{m}'s next run to serve the same connection")  # fmt: skip
            assert set(seen) <= {3, codes.SERVICE_NOT_AVAILABLE}, seen
            assert not clients[m.id].closed.is_set()
    finally:
        for client in clients.values():
            rig.loop.call(client.close)


def _fake_store(root: Path, records: list[tuple[bytes, int, int]]) -> tuple[Path, list]:
    """A store whose commit log holds `records` (body, queue id, queue
    offset) in order; returns it with their SEND_OK attempts."""
    (root / "commitlog").mkdir(parents=True)
    data, attempts = bytearray(), []
    for i, (body, queue_id, queue_offset) in enumerate(records):
        rec = record.Record(TOPIC, queue_id, body, queue_offset, len(data),
                            store_host=("127.0.0.1", 9))  # fmt: skip
        attempts.append(Attempt(0, f"k{i}", 1, body, "127.0.0.1:1", i, i + 0.5, "SEND_OK", "",
                                record.message_id(("127.0.0.1", 9), len(data)), queue_id,
                                queue_offset, len(data)))  # fmt: skip
        data += record.encode(rec)
    (root / "commitlog" / segment_name(0)).write_bytes(bytes(data) + bytes(FILE_SIZE - len(data)))
    return root, attempts


def test_history_checker_catches_what_it_claims_to(tmp_path):
    """The checker itself, on a hand-made log (no processes): a clean history
    passes; a lost, moved, duplicated or made-up record, a reused queue
    offset, differing logs and interleaved masters each fail it."""
    store, attempts = _fake_store(tmp_path / "a", [(b"m0", 0, 0), (b"m1", 1, 0), (b"m2", 0, 1)])
    image = read_image(store)
    assert (image.start, len(image.records)) == (0, 3)
    check_history(attempts, image).assert_ok()

    def problems(attempts_, records) -> list[str]:
        fake, _ = _fake_store(tmp_path / f"s{len(list(tmp_path.iterdir()))}", records)
        return check_history(attempts_, read_image(fake)).problems

    assert problems(attempts, [(b"m0", 0, 0), (b"m1", 1, 0)])  # m2 lost
    assert problems(attempts, [(b"m0", 0, 0), (b"m2", 0, 1), (b"m1", 1, 0)])  # moved
    assert problems(attempts[:2], [(b"m0", 0, 0), (b"m1", 1, 0), (b"m0", 0, 1)])  # twice
    assert problems(attempts, [*[(b"m0", 0, 0), (b"m1", 1, 0), (b"m2", 0, 1)], (b"x", 2, 0)])
    found = problems(attempts[:1], [(b"m0", 0, 0), (b"m1", 0, 0)])  # queue 0 offset 0 again
    assert any("the queue's next is" in p for p in found), found
    assert problems(attempts, [(b"m0", 0, 0), (b"m1", 1, 0), (b"m2", 0, 1)]) == []

    other, _ = _fake_store(tmp_path / "b", [(b"m0", 0, 0), (b"m1", 1, 0), (b"mX", 0, 1)])
    with pytest.raises(AssertionError, match="differ at offset"):
        assert_identical({1: image, 2: read_image(other)})

    a, b = attempts[0], attempts[1]
    a.commit_offset, b.commit_offset = 0, 100  # b's broker acknowledged later in the log
    b.addr = "127.0.0.1:2"
    b.start, b.end = a.end + 0.1, a.end + 0.2
    check_no_overlap([a, b])
    a.start = b.end + 0.01  # a's broker decided after b's had answered, for an earlier offset
    a.end = a.start + 0.1
    with pytest.raises(AssertionError, match="overlapping"):
        check_no_overlap([a, b])
