"""The next commit-log file, allocated before the appender needs it
(RocketMQ's AllocateMappedFileService).

Creating and preallocating a 1 GiB file takes long enough to stall every
send, HA transfer and keep-alive of the process if it ran on the event loop.
So after each roll (`wake`) this task allocates the next file in a worker
thread, under a hidden name (`CommitLog.allocate_file`), and hands it to the
commit log (`adopt_spare`), which renames it into place when it rolls. When
allocation fails (a full disk) it is retried at the next roll, and the
appender creates the file itself if it must (refusing the send if it cannot).

Ownership: the allocator task, on the event loop; only the allocation itself
runs in a thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.broker.store.commitlog import CommitLog, CommitLogError

log = logging.getLogger(__name__)


class SegmentAllocator:
    def __init__(
        self, commit_log: CommitLog, preallocate: bool, is_open: Callable[[], bool]
    ) -> None:
        self.commit_log = commit_log
        self.preallocate = preallocate
        self.is_open = is_open
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        log_ = self.commit_log
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            start = log_.spare_start
            if start is None:
                continue
            try:
                path = await asyncio.to_thread(
                    CommitLog.allocate_file, log_.directory, start, log_.file_size, self.preallocate
                )
            except (OSError, CommitLogError) as exc:
                log.warning("could not allocate the next commit-log file %d: %s", start, exc)
                continue
            if not self.is_open() or not log_.adopt_spare(start, path):
                path.unlink(missing_ok=True)
                self._wake.set()
