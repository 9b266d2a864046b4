"""Steps the scenarios share: freeze a master until another is elected (`freeze`),
check a restarted member rejoins, cut back to the new epoch's start only when it ran past
it (`rejoin`), note a frozen master's truncation (`note_cut`), deadlines that one fault's
budget shares (`deadline_left`), and unique probe names (`probe_name`).
"""

from __future__ import annotations

import itertools
import time

from tests.failover.config import PATIENCE_S, RECOVERED
from tests.failover.group import FailoverGroup
from tests.failover.member import Member
from tests.failover.outcome import Outcome
from tests.failover.producers import Attempt, Producers
from tests.waiting import wait_for


def deadline_left(since: float, budget_s: float) -> float:
    return max(0.1, since + budget_s - time.monotonic())


def rejoin(group: FailoverGroup, m: Member, mark: int, epoch_start: int, out: Outcome) -> None:
    """`m` was restarted after log position `mark` while a newer epoch that
    starts at `epoch_start` leads: it follows, cut back to the epoch's start
    when its log ran past it (its unacknowledged tail), else untouched."""
    wait_for(lambda: RECOVERED in m.log()[mark:], PATIENCE_S, f"{m} to recover its store")
    _, end = group.recovered_after(m, mark)
    group.wait_isr()
    text = m.log()[mark:]
    assert end >= epoch_start, f"{m} recovered to {end}, before the new epoch's start {epoch_start}"
    if end > epoch_start:
        line = f"cutting this log at {epoch_start} (it ended at {end})"
        assert line in text, f"{m} ran past the new epoch's start but did not log {line!r}"
        out.cuts.append(f"member {m.id}: {end} -> {epoch_start}")
    else:
        assert "cutting this log" not in text, f"{m} cut a log that ended at the epoch's start"


def freeze(group: FailoverGroup, producers: Producers, old: Member, out: Outcome) -> Attempt:
    """SIGSTOP the master `old` and hold it until another member is elected
    and answers SEND_OK (`old` is past its lease then), then SIGCONT; returns
    that first SEND_OK."""
    frozen = time.monotonic()
    group.pause(old)
    try:
        new = group.wait_leader(exclude={old.id}, timeout_s=deadline_left(frozen, PATIENCE_S))
        first = producers.wait_first_ok(new.addr, frozen, deadline_left(frozen, PATIENCE_S))
    finally:
        group.resume(old)
    out.failover_s.append(first.end - frozen)
    return first


def note_cut(old: Member, mark: int, out: Outcome) -> None:
    if "cutting this log" in old.log()[mark:]:
        out.cuts.append(f"member {old.id} (frozen)")


_probes = itertools.count()


def probe_name() -> str:
    """Key prefix for a new probe producer, unique across a test run's probes."""
    return f"probe{next(_probes)}-"
