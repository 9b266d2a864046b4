"""`Outcome`: what the scenarios measured (failover times, truncations, faults, notes,
the topics and groups created), for the asserts and the chaos report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.failover.config import TTL_S


@dataclass
class Outcome:
    """What the scenarios measured (for the asserts and the chaos report)."""

    failover_s: list[float] = field(default_factory=list)  # fault -> first SEND_OK, new master
    skipped: int = 0  # held kill rounds that came after the slaves left the set
    cuts: list[str] = field(default_factory=list)  # truncations of rejoining members
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)  # created by new_topics
    groups: list[str] = field(default_factory=list)  # subscription groups, likewise
    lost_topics: set[str] = field(default_factory=set)  # missing somewhere once steady
    lost_groups: set[str] = field(default_factory=set)

    def tables_note(self) -> str:
        return (
            f"topics/groups lost: {len(self.lost_topics)}/{len(self.lost_groups)} of "
            f"{len(self.topics)}/{len(self.groups)} created"
            + (f" ({sorted(self.lost_topics)}, {sorted(self.lost_groups)})"
               if self.lost_topics or self.lost_groups else "")
        )  # fmt: skip

    def failover_note(self) -> str:
        f = self.failover_s
        if not f:
            return "no failover measured"
        return (
            f"failover (fault -> first SEND_OK from the new master) over {len(f)}: "
            f"p50 {percentile(f, 0.5):.2f}s, p99 {percentile(f, 0.99):.2f}s, "
            f"max {max(f):.2f}s (lease TTL {TTL_S:g}s); each {[round(x, 2) for x in f]}"
            + (
                f"; {slow} over TTL + 5 s (a loaded machine?)"
                if (slow := sum(x > TTL_S + 5 for x in f))
                else ""
            )
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
