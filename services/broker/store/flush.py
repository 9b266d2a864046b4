"""Flushing and the checkpoint: what makes the commit log and the consume
queues durable, and what records how far they are (docs/guides/broker.md,
"Durability" and "Recovery"; the `checkpoint` file: docs/reference/contract.md,
"Store files").

- ASYNC_FLUSH: every `flush_interval_s`, fdatasync the files written since the
  last flush, then write the checkpoint.
- SYNC_FLUSH: a send waits (`wait_flushed`) until its end offset is fsynced;
  one fdatasync serves every send waiting when it starts (group commit).

A failed fdatasync is a storage fault (`failstop.py`): the flushed offset and
the checkpoint never move past what could not be synced, waiting sends get an
error, and the flusher stops. A checkpoint that cannot be written because the
disk is full is retried (recovery then scans from the previous one); any other
failure to write it is a fault too.

Ownership: the flusher task owns `flushed_offset` and the waiters; fdatasync
and the checkpoint write run in worker threads on descriptors and snapshots
taken on the loop.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferry.runtime.clock import Clock, wait_event
from ferry.runtime.errors import StorageFault
from services.broker.store.checkpoint import Checkpoint, save_checkpoint
from services.broker.store.commitlog import CommitLog
from services.broker.store.consumequeue import ConsumeQueues, sync_fds
from services.broker.store.failstop import FailStop, is_full_disk

log = logging.getLogger(__name__)

# (commit offset, dispatched offset, descriptors to fdatasync) at one instant.
Snapshot = tuple[int, int, list[int]]


@dataclass(order=True)
class _FlushWaiter:
    offset: int
    future: asyncio.Future = field(compare=False)


class Flusher:
    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        dispatched_offset: Callable[[], int],
        checkpoint_path: Path,
        clock: Clock,
        interval_s: float,
        failstop: FailStop,
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.dispatched_offset = dispatched_offset
        self.checkpoint_path = checkpoint_path
        self.clock = clock
        self.interval_s = interval_s
        self.failstop = failstop
        self.flushed_offset = 0
        self._waiters: list[_FlushWaiter] = []
        self._wake: asyncio.Event | None = None
        self._checkpoint_lock = threading.Lock()
        # One sync at a time: a flushed offset moves only after the sync that
        # covers it (the flusher's and a truncation's `flush_now` never overlap).
        self._sync_lock = asyncio.Lock()
        self._checkpoint_written = (0, 0)
        failstop.on_trip(self._fail_waiters)

    # ------------------------------------------------------------ waiting sends

    async def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Wait until the commit log is fsynced up to `offset`; False on timeout.

        Raises:
            Unavailable: a storage fault: the bytes may never be durable.
        """
        self.failstop.check()
        if self.flushed_offset >= offset:
            return True
        future = asyncio.get_running_loop().create_future()
        bisect.insort(self._waiters, _FlushWaiter(offset, future))
        if self._wake is not None:
            self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
            return True
        except TimeoutError:
            return False

    def _release_waiters(self) -> None:
        flushed = self.flushed_offset
        waiters = self._waiters
        released = 0
        while released < len(waiters) and waiters[released].offset <= flushed:
            future = waiters[released].future
            if not future.done():
                future.set_result(True)
            released += 1
        del waiters[:released]

    def _fail_waiters(self, fault: StorageFault) -> None:
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(self.failstop.refusal())
        self._waiters.clear()

    # ------------------------------------------------------------ the task

    async def run(self) -> None:
        """ASYNC_FLUSH: flush every interval. SYNC_FLUSH: flush as soon as a
        waiter asks, sharing one fsync among all waiting sends (group commit);
        also every interval, for the consume queues and the checkpoint."""
        self._wake = asyncio.Event()
        interval = self.interval_s
        last_checkpoint = time.monotonic()
        checkpoint_failing = False
        try:
            while not self.failstop.tripped:
                await wait_event(self._wake, interval)
                self._wake.clear()
                now = time.monotonic()
                if now - last_checkpoint >= interval:
                    async with self._sync_lock:
                        snapshot = self.snapshot()
                        await asyncio.to_thread(sync_fds, snapshot[2])
                        self._advance(snapshot[0])
                    last_checkpoint = now
                    checkpoint_failing = await self._checkpoint(snapshot, checkpoint_failing)
                elif self._waiters:
                    async with self._sync_lock:
                        target = self.commit_log.max_offset
                        await asyncio.to_thread(sync_fds, self.commit_log.take_dirty())
                        self._advance(target)
        except StorageFault as fault:
            self.failstop.trip(fault)

    def _advance(self, offset: int) -> None:
        self.flushed_offset = max(self.flushed_offset, offset)
        self._release_waiters()

    async def flush_now(self) -> None:
        """Everything written so far made durable, and the checkpoint (a clean stop).

        Raises:
            StorageFault: a sync or the checkpoint write failed.
        """
        async with self._sync_lock:
            snapshot = self.snapshot()
            await asyncio.to_thread(sync_fds, snapshot[2])
            self._advance(snapshot[0])
        try:
            self.write_checkpoint_now(snapshot)
        except OSError as exc:
            raise StorageFault("write", str(self.checkpoint_path), exc) from exc

    def snapshot(self) -> Snapshot:
        return (
            self.commit_log.max_offset,
            self.dispatched_offset(),
            self.commit_log.take_dirty() + self.queues.take_dirty(),
        )

    # ------------------------------------------------------------ the checkpoint

    async def _checkpoint(self, snapshot: Snapshot, failing: bool) -> bool:
        """Write the checkpoint; True while the disk is too full for it. Its
        failure does not hold back commit-log flushes, only how far a recovery
        after a crash must scan.

        Raises:
            StorageFault: the write failed for another reason than a full disk.
        """
        try:
            await asyncio.to_thread(self.write_checkpoint_now, snapshot)
        except OSError as exc:
            if not is_full_disk(exc):
                raise StorageFault("write", str(self.checkpoint_path), exc) from exc
            if not failing:
                log.error(
                    "cannot write the checkpoint: %s; a recovery would scan from the last one "
                    "written; retrying every %.1f s",
                    exc,
                    self.interval_s,
                )
            return True
        if failing:
            log.info("checkpoint written again")
        return False

    def write_checkpoint_now(self, snapshot: Snapshot) -> None:
        """Write the checkpoint (from the flusher's thread or the loop: serialised).
        A late writer never moves it back; `reset` lets it move back on purpose."""
        now = self.clock.wall_ms()
        with self._checkpoint_lock:
            if snapshot[:2] < self._checkpoint_written:
                return
            self._checkpoint_written = snapshot[:2]
            save_checkpoint(
                self.checkpoint_path,
                Checkpoint(
                    flushed_offset=snapshot[0],
                    dispatched_offset=snapshot[1],
                    physic_msg_timestamp=now,
                    logics_msg_timestamp=now,
                ),
            )

    def paused(self) -> asyncio.Lock:
        """`async with flusher.paused():` no sync is in flight or starts inside
        (a truncation cuts the log there)."""
        return self._sync_lock

    def reset(self, flushed_offset: int, dispatched_offset: int) -> None:
        """The log was cut or restarted: the flushed offset and the checkpoint
        go back to what is still there (written before this returns)."""
        self.flushed_offset = min(self.flushed_offset, flushed_offset)
        with self._checkpoint_lock:
            self._checkpoint_written = (0, 0)
        self.write_checkpoint_now((self.flushed_offset, dispatched_offset, []))
