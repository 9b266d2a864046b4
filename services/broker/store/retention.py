"""Retention: deleting old commit-log files, and the consume-queue files that
pointed into them (RocketMQ's CleanCommitLogService and CleanConsumeQueueService).

A pass runs every `check_interval_s` (`cleanResourceInterval`), whenever the
commit log starts a new file, and on demand (`clean_now`, the admin RPC). It
deletes commit-log files oldest first, one at a time, `delete_files_interval_s`
apart, and stops at the first file it may not delete:

- a file is *expired* when its last write is `file_reserved_time_s` old;
- expired files go when the hour of day is one of `delete_when_hours`, when
  the store's disk is fuller than `disk_max_used_space_ratio`, or on demand;
- above `disk_space_clean_forcibly_ratio` (with `clean_file_forcibly_enable`)
  the oldest files go even unexpired, until the disk is back down to
  `disk_max_used_space_ratio` (a low-water mark: room for the files being
  written while the next pass comes);
- with a commit-log file go the message index's files whose every offset is
  below the log's new first offset (`after_delete`);
- never the file being written (the newest), and never a file holding bytes
  not yet in the consume queues (the dispatcher reads them). Flushing does not
  hold a file back: deleting it loses nothing a flush would have saved;
- an expired file that holds the broker's own pending state — timed messages
  not yet delivered, pop checkpoints a restart still replays (`holds`, each a
  callable giving the lowest commit offset it needs, or None) — is kept. Only
  forced cleaning deletes it, and says what is lost.

Above `disk_space_warning_level_ratio` the store refuses sends
(RESOURCE_EXHAUSTED) until a pass brings the disk back under it; reads go on.
A periodic pass deletes at most `max_files_per_pass` files (RocketMQ's batch of
10); an on-demand pass deletes every file it may.

Only files the commit log and the consume queues hold open are ever deleted
(they were checked as segments when the store opened); a file whose age cannot
be read is logged and the pass stops there. Unlinking and closing a large
file frees its blocks, which takes time: that runs in a worker thread, and a
file a reader still holds (a cold pull, an HA transfer) is closed by that
reader's release, never under it.

Ownership: the retention task and `clean_now` run on the event loop, one pass
at a time; `disk_full` is read by the appender.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ferry.runtime.clock import Clock, wait_event
from ferry.runtime.errors import ResourceExhausted
from services.broker.store.commitlog import CommitLog
from services.broker.store.consumequeue import ConsumeQueues

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionConfig:
    file_reserved_time_s: float = 72 * 3600.0  # fileReservedTime (hours in broker.conf)
    delete_when_hours: tuple[int, ...] = (4,)  # deleteWhen "04;16"
    disk_max_used_space_ratio: float = 0.75  # diskMaxUsedSpaceRatio (percent in broker.conf)
    disk_space_clean_forcibly_ratio: float = 0.85  # diskSpaceCleanForciblyRatio
    disk_space_warning_level_ratio: float = 0.90  # diskSpaceWarningLevelRatio
    clean_file_forcibly_enable: bool = True  # cleanFileForciblyEnable
    delete_files_interval_s: float = 0.1  # deleteCommitLogFilesInterval (ms)
    check_interval_s: float = 10.0  # cleanResourceInterval (ms)
    max_files_per_pass: int = 10


@dataclass(frozen=True)
class CleanResult:
    """What a pass did (the answer of `deleteExpiredCommitLog`)."""

    deleted_files: int  # commit-log files
    min_offset: int  # the commit log's oldest offset after the pass
    consume_queue_files: int = 0
    disk_used_ratio: float = 0.0  # after the pass, 0..1


@dataclass(frozen=True)
class RetentionStatus:
    """Retention's figures for metrics and runtime info, read in one go."""

    config: RetentionConfig
    disk_used_ratio: float  # 0..1, read now
    disk_full: bool  # above the warning ratio: sends refused
    deleted_files_total: int  # commit-log files since the broker started
    deleted_queue_files_total: int  # consume-queue files since the broker started


def disk_used_ratio(path: Path) -> float:
    """How full the file system holding `path` is, as `df` counts it
    (blocks reserved for root count as unavailable)."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    usable = used + st.f_bavail
    return used / usable if usable > 0 else 0.0


class Retention:
    def __init__(
        self,
        config: RetentionConfig,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        safe_end: Callable[[], int],
        clock: Clock,
        disk_ratio: Callable[[], float],
        after_delete: Callable[[int], list[Path]] | None = None,
    ) -> None:
        """`after_delete`: told the commit log's new first offset after a file went
        (the message index closes its files below it and returns their paths, which
        are unlinked here with the commit-log file)."""
        self.config = config
        self.after_delete = after_delete
        self.commit_log = commit_log
        self.queues = queues
        self.safe_end = safe_end  # the dispatched offset: no file reaching past it is deleted
        self.clock = clock
        self.disk_ratio = disk_ratio
        self.deleted_files_total = 0
        self.deleted_queue_files_total = 0
        self.disk_full = False  # above the warning ratio: sends refused
        self.last_ratio = 0.0
        # What else needs old files: name -> the lowest commit offset it needs (None: nothing).
        self.holds: dict[str, Callable[[], int | None]] = {}
        self._held_logged: int | None = None
        self._pass_lock = asyncio.Lock()
        self._wake: asyncio.Event | None = None

    def status(self) -> RetentionStatus:
        return RetentionStatus(
            self.config,
            self.disk_ratio(),
            self.disk_full,
            self.deleted_files_total,
            self.deleted_queue_files_total,
        )

    # ------------------------------------------------------------ the appender's check

    def check_writable(self) -> None:
        """Raise ResourceExhausted while the disk is above the warning ratio.
        Once refusing, each send looks at the disk again (a statvfs: cheap), so
        sends resume as soon as space returns, not at the next pass."""
        if self.disk_full and self.used_ratio() > self.config.disk_space_warning_level_ratio:
            cfg = self.config
            raise ResourceExhausted(
                f"the broker's disk is nearly full ({self.last_ratio:.0%} used, above "
                f"diskSpaceWarningLevelRatio={cfg.disk_space_warning_level_ratio:.0%}): sends are "
                "refused until retention frees space; reads go on. Free space on the store's "
                "disk, lower fileReservedTime, or send to another broker"
            )

    def used_ratio(self) -> float:
        """The disk's use now (also refreshes `disk_full`)."""
        ratio = self.disk_ratio()
        self._set_full(ratio)
        return ratio

    # ------------------------------------------------------------ passes

    def wake(self) -> None:
        """Run a pass soon (the commit log started a new file)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Passes every `check_interval_s` and when woken; every second while
        sends are refused, so they resume soon after space returns."""
        self._wake = asyncio.Event()
        while True:
            interval = self.config.check_interval_s
            if self.disk_full:
                interval = min(interval, 1.0)
            await wait_event(self._wake, interval)
            self._wake.clear()
            try:
                await self.clean(manual=False)
            except Exception:
                log.exception("retention pass failed; trying again in %.1f s", interval)

    async def clean_now(self) -> CleanResult:
        """One pass now, whatever the hour (`deleteExpiredCommitLog`)."""
        return await self.clean(manual=True)

    async def clean(self, manual: bool) -> CleanResult:
        async with self._pass_lock:
            return await self._pass(manual)

    async def _pass(self, manual: bool) -> CleanResult:
        """One pass. Whether sends are refused is decided at its end, on the
        disk as the pass leaves it (not while it is still deleting)."""
        cfg = self.config
        ratio = self.disk_ratio()
        now = self.clock.wall()
        time_up = time.localtime(now).tm_hour in cfg.delete_when_hours
        space_high = ratio > cfg.disk_max_used_space_ratio
        forcibly = cfg.clean_file_forcibly_enable and ratio > cfg.disk_space_clean_forcibly_ratio
        if not (manual or time_up or space_high or forcibly):
            self._set_full(ratio)
            return CleanResult(0, self.commit_log.min_offset, 0, ratio)
        limit = None if manual else cfg.max_files_per_pass
        deleted = queue_files = 0
        while limit is None or deleted < limit:
            if deleted:
                await asyncio.sleep(cfg.delete_files_interval_s)
                now = self.clock.wall()
            oldest = self.commit_log.oldest_removable()
            if oldest is None:
                break
            start, path, fd = oldest
            if self.commit_log.file_end(start) > self.safe_end():
                break  # holds bytes not yet in the consume queues
            try:
                modified = _last_write(fd)
            except OSError as exc:
                log.warning(
                    "retention: cannot read the age of %s (%s); skipping this pass", path, exc
                )
                break
            age = now - modified
            expired = age >= cfg.file_reserved_time_s
            if not expired and not forcibly:
                break
            holder = self._holder(self.commit_log.file_end(start))
            if holder is not None:
                if not forcibly:
                    if self._held_logged != start:
                        self._held_logged = start
                        log.info(
                            "retention keeps expired commit-log file %s: it holds %s",
                            path.name,
                            holder,
                        )
                    break
                log.error(
                    "retention deletes commit-log file %s forcibly (disk %.0f%% full) although it "
                    "holds %s: those are lost",
                    path.name,
                    ratio * 100,
                    holder,
                )
            why = "expired" if expired else f"disk {ratio:.0%} full: cleaning forcibly"
            queue_files += await self._delete_oldest(why, age)
            deleted += 1
            ratio = self.disk_ratio()
            # Once forced, go on down to the low-water mark.
            forcibly = forcibly and ratio > cfg.disk_max_used_space_ratio
        ratio = self.used_ratio()
        return CleanResult(deleted, self.commit_log.min_offset, queue_files, ratio)

    async def _delete_oldest(self, why: str, age_s: float) -> int:
        """Delete the commit log's oldest file and the consume-queue files below
        the new minimum; returns how many of those there were."""
        path, fd = self.commit_log.remove_oldest()
        minimum = self.commit_log.min_offset
        queue_files = self.queues.delete_below(minimum)
        self.deleted_files_total += 1
        self.deleted_queue_files_total += queue_files
        log.info(
            "retention deleted commit-log file %s (%s; last written %.0f s ago) and %d "
            "consume-queue files; the commit log now starts at %d",
            path.name,
            why,
            age_s,
            queue_files,
            minimum,
        )
        others = self.after_delete(minimum) if self.after_delete is not None else []
        await asyncio.to_thread(_unlink_and_close, path, fd)
        for other in others:
            await asyncio.to_thread(_unlink_and_close, other, None)
        return queue_files

    # ------------------------------------------------------------ internals

    def _holder(self, file_end: int) -> str | None:
        """What needs bytes below `file_end` (a description), or None."""
        for name, lowest in self.holds.items():
            offset = lowest()
            if offset is not None and offset < file_end:
                return f"{name} (from commit offset {offset})"
        return None

    def _set_full(self, ratio: float) -> None:
        self.last_ratio = ratio
        full = ratio > self.config.disk_space_warning_level_ratio
        if full and not self.disk_full:
            log.error(
                "the store's disk is %.1f%% full, above diskSpaceWarningLevelRatio=%.0f%%: "
                "refusing sends until retention brings it back under",
                ratio * 100,
                self.config.disk_space_warning_level_ratio * 100,
            )
        elif self.disk_full and not full:
            log.warning("the store's disk is %.1f%% full: taking sends again", ratio * 100)
        self.disk_full = full


def _last_write(fd: int) -> float:
    """When the file was last written (its mtime, as RocketMQ's lastModified)."""
    return os.fstat(fd).st_mtime


# A deleted file's pages are freed this many bytes at a time, with a pause
# between: freeing 1 GiB of page cache at once keeps a core busy for most of a
# second, which on a small machine the senders feel.
RELEASE_STEP_BYTES = 32 << 20
RELEASE_PAUSE_S = 0.002


def _unlink_and_close(path: Path, fd: int | None) -> None:
    """Unlink a deleted file, then give its blocks back a slice at a time
    (worker thread). A file a reader still holds (`fd` None) is freed by that
    reader's close instead."""
    try:
        path.unlink()
    except OSError as exc:
        log.warning("retention: could not unlink %s: %s", path, exc)
    if fd is None:
        return
    try:
        size = os.fstat(fd).st_size
        while size > 0:
            size = max(0, size - RELEASE_STEP_BYTES)
            os.ftruncate(fd, size)
            time.sleep(RELEASE_PAUSE_S)
    except OSError as exc:
        log.debug("retention: releasing %s: %s", path, exc)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
