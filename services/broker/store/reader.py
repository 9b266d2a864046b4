"""Commit-log reads that never make the event loop wait on the disk.

A read first tries `preadv(RWF_NOWAIT)` on the loop: when the page cache holds
every byte (the usual case: consumers read what was just written) that is the
whole cost. When it does not (a consumer far behind, a slave catching up on
old data), the read goes to one of a few reader threads, and the loop serves
sends, HA and keep-alives meanwhile. The file is pinned while a thread reads
it, so retention cannot close its descriptor (and the number be reused) under
the read; the last reader of a deleted file closes it, in a thread, since
that is what frees its blocks.

Ownership: pins are taken and released on the event loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

from services.broker.store.commitlog import CommitLog, _Segment


class LogReader:
    def __init__(self, commit_log: CommitLog, threads: int) -> None:
        self.commit_log = commit_log
        self.threads = threads
        self.cold_reads = 0  # reads that went to a thread
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._nowait = True  # RWF_NOWAIT works on this file system

    def start(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.threads, thread_name_prefix="store-read"
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    async def read(self, offset: int, size: int) -> bytes | bytearray:
        """`size` bytes at `offset` (inside one file, below the write position)."""
        region = self.commit_log.pin_range(offset, size)
        try:
            if self._nowait:
                buf = bytearray(size)
                try:
                    if os.preadv(region.fd, [buf], region.file_position, os.RWF_NOWAIT) == size:
                        return buf
                except BlockingIOError:
                    pass
                except OSError:
                    self._nowait = False  # not supported here: always use the threads
            self.cold_reads += 1
            return await self.in_thread(_pread_all, region.fd, size, region.file_position)
        finally:
            self.unpin(region.segment)

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking read in a reader thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def unpin(self, segment: _Segment) -> None:
        fd = self.commit_log.unpin(segment)
        if fd is not None:  # the last reader of a deleted file: closing frees its blocks
            asyncio.get_running_loop().run_in_executor(None, os.close, fd)


def _pread_all(fd: int, size: int, position: int) -> bytes:
    data = os.pread(fd, size, position)
    if len(data) != size:
        raise OSError(f"read {len(data)} of {size} bytes at file position {position}")
    return data
