"""The metadata under failover: `new_topics` creates a topic and a subscription group on
the master, then freezes or kills it before the followers may have pulled them, and
checks that every topic and group created during the run is on every live member and
every topic in the name server's route (`wait_tables`).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from collections.abc import Sequence

import grpc

from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, common_pb2
from tests.failover.config import PATIENCE_S, QUEUES
from tests.failover.group import FailoverGroup
from tests.failover.outcome import Outcome
from tests.failover.producers import Producers
from tests.failover.steps import deadline_left, freeze, note_cut, rejoin
from tests.integration.support import create_topic
from tests.waiting import wait_for


def create_group(channel: grpc.Channel, name: str) -> common_pb2.DataVersion:
    """Creates subscription group `name` (defaults) on the broker behind `channel`."""
    response = broker_admin_pb2_grpc.BrokerAdminStub(channel).UpdateAndCreateSubscriptionGroup(
        broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
            config=common_pb2.SubscriptionGroupConfig(group_name=name)
        ),
        timeout=10,
    )
    return response.data_version


def wait_tables(
    group: FailoverGroup, topics: Sequence[str], groups: Sequence[str], timeout_s: float
) -> list[tuple[str, str, str]]:
    """Until every live member holds `topics` and `groups` and the name
    server routes `topics`; what is still missing at the deadline (see
    `FailoverGroup.tables_missing`), else nothing."""
    missing: list[tuple[str, str, str]] = []

    def complete() -> bool:
        nonlocal missing
        missing = group.tables_missing(topics, groups)
        return not missing

    with contextlib.suppress(AssertionError):
        wait_for(complete, timeout_s, "every topic and group everywhere", interval_s=0.1)
    return missing


def new_topics(
    group: FailoverGroup,
    producers: Producers,
    rounds: int,
    out: Outcome,
    rng: random.Random,
) -> list[Producers]:
    """Each round creates a topic and a subscription group on the master
    (`NewTopicN`, `NewGroupN`) and starts producers sending to that topic;
    after 5 of their SEND_OKs, and `rng`'s delay after the creation (within
    the slave-sync interval, at most 5 s: the followers may not have pulled
    the new tables yet), the master is frozen (SIGSTOP until another member
    is elected and answers SEND_OK, then SIGCONT) or, every other round,
    SIGKILLed and restarted. Once the group is steady, every topic and group
    created so far is on every live member and every topic in the name
    server's route (waiting one slave-sync interval + 5 s); what is not is
    counted lost in `out` (and not waited for again). Returns the topics'
    producers (their records join the history)."""
    window_s = min(5.0, group.slave_sync_interval_s)
    extra = []
    for _ in range(rounds):
        n = len(out.topics)
        how = ("freeze", "kill")[n % 2]
        group.wait_isr()
        old = group.wait_leader()
        topic, sub = f"NewTopic{n}", f"NewGroup{n}"
        delay = rng.uniform(0, window_s)
        channel = group.channel(old.addr)
        created = time.monotonic()
        create_topic(channel, topic, QUEUES)
        create_group(channel, sub)
        out.topics.append(topic)
        out.groups.append(sub)
        senders = Producers(group.master_addr, count=2, name=f"{topic}-", topic=topic).start()
        extra.append(senders)
        try:
            wait_for(lambda s=senders, t=created + delay: time.monotonic() >= t
                     and len(s.acked()) >= 5, window_s + 15,
                     f"5 SEND_OK to {topic}, {delay:.2f}s after creating it",
                     interval_s=0.005)  # fmt: skip
            had = {m.id: (t := group.tables(m)) is not None and topic in t[0] and sub in t[1]
                   for m in group.live() if m is not old}  # fmt: skip
            fault_at = time.monotonic() - created
            out.faults.append(f"{how} leader {old.id} after creating {topic}")
            mark = len(old.log())
            if how == "freeze":
                freeze(group, producers, old, out)
                group.wait_isr(timeout_s=PATIENCE_S)
                note_cut(old, mark, out)
            else:
                killed = time.monotonic()
                group.kill(old)
                new = group.wait_leader(exclude={old.id},
                                        timeout_s=deadline_left(killed, PATIENCE_S))  # fmt: skip
                first = producers.wait_first_ok(new.addr, killed,
                                                deadline_left(killed, PATIENCE_S))  # fmt: skip
                out.failover_s.append(first.end - killed)
                start = group.view().epoch_start()
                mark = len(old.log())
                group.restart(old)
                rejoin(group, old, mark, start, out)
        finally:
            senders.stop()
        gone = wait_tables(
            group,
            [t for t in out.topics if t not in out.lost_topics],
            [g for g in out.groups if g not in out.lost_groups],
            group.slave_sync_interval_s + 5,
        )
        out.lost_topics |= {name for kind, name, _ in gone if kind == "topic"}
        out.lost_groups |= {name for kind, name, _ in gone if kind == "group"}
        where: dict[str, list[str]] = defaultdict(list)
        for _, name, place in gone:
            where[name or "tables"].append(place)
        out.notes.append(
            f"{how} leader {old.id} {fault_at:.2f}s after creating {topic}/{sub} (drawn "
            f"{delay:.2f}s), {len(senders.acked())} SEND_OK to it; followers holding both "
            f"then: {had}; " + (f"missing once steady: {dict(where)}" if gone else "all kept")
        )
    return extra
