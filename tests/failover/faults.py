"""Every fault by name (`FAULTS`, `run_fault`: what the chaos suite draws from) and the
check after them all (`check_final`): producers stopped, members in sync, logs identical,
the history checked, no two masters' SEND_OKs interleaved.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from tests.failover.config import TOPIC
from tests.failover.group import FailoverGroup
from tests.failover.history import HistoryResult, check_history, check_no_overlap
from tests.failover.logs import assert_identical
from tests.failover.outcome import Outcome
from tests.failover.producers import Attempt, Producers
from tests.failover.scenarios import (
    etcd_partition,
    freeze_leader,
    ha_partition,
    handover,
    kill_master,
    lagging_replica,
    pause_follower,
)
from tests.failover.tables import new_topics


def run_fault(
    name: str,
    group: FailoverGroup,
    producers: Producers,
    out: Outcome,
    etcd_endpoint: str,
    rng: random.Random | None = None,
) -> list[Producers]:
    """One fault of `FAULTS` by name (three members, etcd and HA proxies);
    returns the extra producers (probes, a new topic's producers) whose
    records join the history. `rng` draws a new topic's fault delay."""
    if name == "kill":
        kill_master(group, producers, 1, out, held={0} if len(out.faults) % 2 else ())
    elif name == "etcd":
        return etcd_partition(group, producers, 1, out)
    elif name == "ha":
        ha_partition(group, producers, out)
    elif name == "handover":
        handover(group, producers, 1, out, etcd_endpoint)
    elif name == "pause":
        pause_follower(group, producers, out)
    elif name == "lagging":
        lagging_replica(group, producers, 1, out)
    elif name == "leader-freeze":
        return freeze_leader(group, producers, 1, out)
    elif name == "new-topic":
        return new_topics(group, producers, 1, out, rng or random.Random(len(out.faults)))
    else:
        raise ValueError(f"no fault {name!r}")
    return []


FAULTS = ("kill", "etcd", "ha", "handover", "pause", "lagging", "leader-freeze", "new-topic")


def check_final(
    group: FailoverGroup,
    producers: Sequence[Producers],
    lost_allowed: Iterable[Attempt] = (),
    on_result: Callable[[HistoryResult], None] | None = None,
) -> HistoryResult:
    """After the faults: producers stopped, every member in sync, the logs
    byte-identical, the history checked against the leader's log and what a
    consumer reads from it (every topic the producers sent to), and no two
    masters' SEND_OKs interleaved. `on_result` sees the history's result
    before it is asserted on (a report keeps its figures when it fails)."""
    for p in producers:
        p.stop()
    dead = [str(m) for m in group.members if not m.alive]
    assert not dead, (
        f"member(s) {dead} died during the test: {[m.log()[-2000:] for m in group.members if not m.alive]}"
    )
    group.wait_isr()
    leader, end, images = group.settled_images()
    assert images[leader.id].end == end, (images[leader.id].end, end)
    assert_identical(images)
    attempts = [a for p in producers for a in p.snapshot()]
    pulled = group.pull_topics(leader, {a.topic for a in attempts} | {TOPIC})
    result = check_history(attempts, images[leader.id], pulled, lost_allowed)
    if on_result is not None:
        on_result(result)
    result.assert_ok()
    # Acknowledgements a lossy election gave up are in no log; their offsets
    # belong to the new master's messages.
    gone = {id(a) for a in lost_allowed or ()}
    result.handoffs = check_no_overlap([a for a in attempts if id(a) not in gone])
    return result
