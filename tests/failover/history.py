"""The history checker, in the style of Jepsen: pure functions of the producers'
attempts and a member's log image.

- `check_history`: every SEND_OK attempt is in the group's final log exactly once, at the
  commit offset and queue offset its producer was told; every record there was sent by
  someone; each queue's offsets run 0, 1, 2, ... in log order.
- `check_no_overlap`: the SEND_OK answers of two masters never interleave (`handoffs`
  gives each change of master, with its gap).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ferry import record
from tests.failover.config import TOPIC
from tests.failover.logs import LogImage
from tests.failover.producers import Attempt


@dataclass
class HistoryResult:
    acked: int = 0  # SEND_OK attempts
    lost: int = 0  # SEND_OK attempts not in the log where they were acknowledged
    differing: int = 0  # there, but twice, or at other queue offsets, ids or consumer reads
    unacked_stored: int = 0  # attempts not answered SEND_OK whose body is in the log
    unacked_absent: int = 0
    keys_stored_twice: int = 0  # messages whose retries were stored more than once
    problems: list[str] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)  # set by check_final

    def assert_ok(self) -> None:
        if self.problems:
            shown = "\n  ".join(self.problems[:20])
            raise AssertionError(
                f"{len(self.problems)} history violation(s) ({self.lost} lost, "
                f"{self.differing} different; {self.summary()}):\n  {shown}"
            )

    def summary(self) -> str:
        return (
            f"{self.acked} acknowledged, {self.unacked_stored} unacknowledged but stored, "
            f"{self.unacked_absent} unacknowledged and absent, "
            f"{self.keys_stored_twice} messages stored twice"
        )


def check_history(
    attempts: Sequence[Attempt],
    image: LogImage,
    pulled: dict[str, dict[tuple[int, int], bytes]] | None = None,
    lost_allowed: Iterable[Attempt] = (),
) -> HistoryResult:
    """The Jepsen-style check of a group's final log against every attempt,
    over the topics the attempts were sent to.

    - every SEND_OK attempt (but `lost_allowed`) is in the log exactly once,
      at the commit offset, queue id, queue offset and msg id it was told,
      and, given `pulled` (what a consumer reads from the final master, by
      topic), a consumer reads it at that queue offset of its topic;
    - every record of those topics in the log was sent by some attempt
      (nothing made up, no bytes of two messages spliced);
    - each queue's offsets run 0, 1, 2, ... in log order (truncations and
      elections never reuse or skip a queue offset).
    """
    out = HistoryResult()
    skip = {id(a) for a in lost_allowed}
    sent = {a.body: a for a in attempts}
    topics = {a.topic for a in attempts} or {TOPIC}
    at_offset: dict[int, record.Record] = {}
    offsets_of: dict[bytes, list[int]] = defaultdict(list)
    next_queue_offset: dict[tuple[str, int], int] = {}
    keys: dict[str, int] = defaultdict(int)
    for rec in image.records:
        if rec.topic not in topics:
            continue
        at_offset[rec.commit_offset] = rec
        offsets_of[rec.body].append(rec.commit_offset)
        if rec.body not in sent:
            out.problems.append(f"record at {rec.commit_offset} was never sent: {rec.body[:40]!r}")
        else:
            keys[sent[rec.body].key] += 1
        # A log copied from a later file on starts its queues anywhere.
        queue = (rec.topic, rec.queue_id)
        want = next_queue_offset.get(queue, 0 if image.start == 0 else rec.queue_offset)
        if rec.queue_offset != want:
            out.problems.append(
                f"record at {rec.commit_offset} has queue offset {rec.topic} "
                f"{rec.queue_id}:{rec.queue_offset}, the queue's next is {want}"
            )
        next_queue_offset[queue] = rec.queue_offset + 1
    out.keys_stored_twice = sum(1 for n in keys.values() if n > 1)
    for a in attempts:
        if not a.ok:
            if offsets_of.get(a.body):
                out.unacked_stored += 1
            else:
                out.unacked_absent += 1
            continue
        if id(a) in skip:
            continue
        out.acked += 1
        rec = at_offset.get(a.commit_offset)
        found = offsets_of.get(a.body, [])
        if rec is None or rec.body != a.body:
            out.lost += 1
            out.problems.append(f"acknowledged {a}: not in the log there (found at {found})")
            continue
        wrong = []
        if len(found) != 1:
            wrong.append(f"in the log {len(found)} times, at {found}")
        if (rec.topic, rec.queue_id, rec.queue_offset) != (a.topic, a.queue_id, a.queue_offset):
            wrong.append(f"the log has it at {rec.topic} queue {rec.queue_id}:{rec.queue_offset}")
        if record.message_id(rec.store_host, rec.commit_offset) != a.msg_id:
            wrong.append(f"msg id {a.msg_id} does not match the record")
        read = pulled.get(a.topic, {}) if pulled is not None else None
        if read is not None and read.get((a.queue_id, a.queue_offset)) != a.body:
            wrong.append("a consumer does not read it at its queue offset")
        if wrong:
            out.differing += 1
            out.problems += [f"acknowledged {a}: {w}" for w in wrong]
    return out


@dataclass
class Handoff:
    """Two masters in turn, from the producers' records: `gap_s` from the
    latest start of a send the first answered SEND_OK to the earliest answer
    of a send the next answered SEND_OK (negative: the first acknowledged a
    send after the next one had)."""

    before: str
    after: str
    last_start: float
    last_answer: float
    first_answer: float

    @property
    def gap_s(self) -> float:
        return self.first_answer - self.last_start

    @property
    def unavailable_s(self) -> float:
        """Last SEND_OK answer of one master -> first of the next."""
        return self.first_answer - self.last_answer


def handoffs(attempts: Sequence[Attempt]) -> list[Handoff]:
    """Split the SEND_OK attempts into runs by answering broker, in the order
    of the commit offsets they were acknowledged at (the order of the group's
    one log), and give each change of broker."""
    oks = sorted((a for a in attempts if a.ok), key=lambda a: a.commit_offset)
    runs: list[list[Attempt]] = []
    for a in oks:
        if runs and runs[-1][0].addr == a.addr:
            runs[-1].append(a)
        else:
            runs.append([a])
    return [
        Handoff(
            x[0].addr,
            y[0].addr,
            max(a.start for a in x),
            max(a.end for a in x),
            min(a.end for a in y),
        )
        for x, y in zip(runs, runs[1:], strict=False)
    ]


def check_no_overlap(attempts: Sequence[Attempt]) -> list[Handoff]:
    """At no moment do two brokers both acknowledge, from the producers' own
    records. Every SEND_OK carries the commit offset it was stored at, and
    check_history proves they all sit in the group's one log; a master only
    acknowledges what its own log holds, so in log order the acknowledging
    brokers take turns. A turn is proven over when a send the earlier broker
    acknowledged *started* only after a send the next broker acknowledged at
    a later offset had already been *answered*: then the earlier broker
    decided after the next one did, and the check fails. Client delays only
    widen the intervals, so a loaded machine cannot make it fail wrongly.
    Returns the handoffs (their gaps are reported).
    """
    found = handoffs(attempts)
    bad = [h for h in found if h.gap_s <= 0]
    assert not bad, "two brokers answered SEND_OK at overlapping times: " + "; ".join(
        f"{h.before} acknowledged a send started at {h.last_start:.3f}, after {h.after} "
        f"had answered SEND_OK at {h.first_answer:.3f} for a later offset"
        for h in bad
    )
    return found
