"""What a run's store must hold before the run replicates or takes a send, as
the app opens it (`Incarnation.epoch_start`: `LeaderStart` or `FollowerStart`).

Owns two steps on the member's epoch history (services.broker.failover.epochs):
- `begin_epoch`: a new master records `(epoch, log end)` before its first write.
- `rejoin`: a follower cuts its log at the last offset it shares with its
  leader (`epochs.divergence`, Kafka's KIP-101), which never cuts an
  acknowledged message (the leader has all of them), and adopts the leader's
  history (it comes with the leader key in etcd).

Runs on the event loop, inside the app's start (the store is open, nothing is
served yet). Must never touch etcd or any other part of the app than its store.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ferry.runtime.errors import Unavailable
from services.broker.failover import epochs
from services.broker.failover.epochs import EpochHistory

if TYPE_CHECKING:
    from services.broker.failover.insync import InSyncSet

log = logging.getLogger(__name__)


class LeaderStart:
    """A master run's `EpochStart`: its in-sync set reads the opened store's
    log, and its epoch begins at the log's end (`begin_epoch`)."""

    def __init__(self, history: EpochHistory, epoch: int, in_sync: InSyncSet) -> None:
        self.history = history
        self.epoch = epoch
        self.in_sync = in_sync

    async def start_epoch(self, store) -> None:
        self.in_sync.open(store)
        begin_epoch(self.history, self.epoch, store)


class FollowerStart:
    """A follower run's `EpochStart`: its store rejoins `leader` (`rejoin`);
    with no leader known it stays as it is."""

    def __init__(self, history: EpochHistory, leader: dict | None) -> None:
        self.history = history
        self.leader = leader

    async def start_epoch(self, store) -> None:
        if self.leader is not None:
            await rejoin(self.history, store, self.leader)


def begin_epoch(history: EpochHistory, epoch: int, store) -> None:
    history.begin(epoch, store.max_offset)
    log.info(
        "epoch %d starts at offset %d (history %s)",
        epoch,
        store.max_offset,
        epochs.to_json(history.entries),
    )


async def rejoin(history: EpochHistory, store, leader: dict) -> None:
    """A follower's store before it replicates from `leader` (its key's value).

    Raises:
        Unavailable: the leader's history in etcd is unusable.
    """
    try:
        theirs = epochs.from_json(leader.get("history", []))
    except ValueError as exc:
        raise Unavailable(f"the leader's epoch history in etcd is unusable: {exc}") from None
    leader_end = max(e.start for e in epochs.with_base(theirs))
    # The leader's log end is at least its epoch's start; what it holds
    # past that is ours too as far as we got (same epoch, same bytes).
    point = epochs.divergence(
        history.entries, store.max_offset, theirs, max(leader_end, store.max_offset)
    )
    if point is None:
        log.warning("no epoch shared with the leader: copying its log from scratch")
        store.restart_at(0)
    elif point < store.max_offset:
        log.warning(
            "cutting this log at %d (it ended at %d): the rest was written by a master "
            "of an older epoch and never reached the new master",
            point,
            store.max_offset,
        )
        await store.truncate(point)
    history.adopt(theirs)
