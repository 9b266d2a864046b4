"""The broker store seen through `services.ha.replicated_log.ReplicatedLog`:
what the HA master and slave may do with it.

Also here: a slave's catch-up hint. While replicated bytes arrive in bulk
(more than BULK_BYTES within BULK_WINDOW_S) the dispatcher steps aside between
its slices, so the HA stream gets the CPU first (RocketMQ's reput lags the
same way); the store asks `receiving_bulk()`.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

from services.broker.store.commitlog import CommitLog, Region
from services.broker.store.reader import LogReader

BULK_BYTES = 1 << 20
BULK_WINDOW_S = 0.05
_PROBE = bytearray(1)  # page-cache probes land here (contents unused)


class ReplicaSource(Protocol):
    """What StoreReplicaLog uses of the message store (declared here, so this
    module never imports the store that builds it)."""

    commit_log: CommitLog
    reader: LogReader

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    async def wait_for_growth(self, offset: int, timeout_s: float) -> bool: ...

    def append_replicated(self, commit_offset: int, data: bytes | memoryview) -> int: ...

    def restart_at(self, start_offset: int) -> None: ...

    async def truncate(self, offset: int) -> None: ...


class StoreReplicaLog:
    def __init__(self, store: ReplicaSource) -> None:
        self._store = store
        self._window_start = 0.0
        self._window_bytes = 0

    @property
    def min_offset(self) -> int:
        return self._store.min_offset

    @property
    def max_offset(self) -> int:
        return self._store.max_offset

    def file_start(self, offset: int) -> int:
        return offset - offset % self._store.commit_log.file_size

    async def read_region(self, offset: int, max_bytes: int) -> Region:
        store = self._store
        region = store.commit_log.region(offset, max_bytes)
        try:
            if not _cached(region.fd, region.file_position, region.size):
                # Cold (a slave catching up on old data): fault it into the page
                # cache in a thread, so sendfile on the loop does not wait on the disk.
                await store.reader.in_thread(os.pread, region.fd, region.size, region.file_position)
        except BaseException:
            self.release(region)
            raise
        return region

    def release(self, region: Region) -> None:  # type: ignore[override]
        self._store.reader.unpin(region.segment)

    def read_now(self, offset: int, max_bytes: int) -> bytes:
        region = self._store.commit_log.region(offset, max_bytes)
        try:
            return os.pread(region.fd, region.size, region.file_position)
        finally:
            self.release(region)

    async def wait_for_growth(self, offset: int, timeout_s: float) -> bool:
        return await self._store.wait_for_growth(offset, timeout_s)

    def append(self, offset: int, data: bytes | memoryview) -> int:
        now = time.monotonic()
        if now - self._window_start > BULK_WINDOW_S:
            self._window_start, self._window_bytes = now, 0
        self._window_bytes += len(data)
        return self._store.append_replicated(offset, data)

    def receiving_bulk(self) -> bool:
        return (
            self._window_bytes >= BULK_BYTES
            and time.monotonic() - self._window_start < BULK_WINDOW_S
        )

    def restart_at(self, offset: int) -> None:
        self._store.restart_at(offset)

    async def truncate(self, offset: int) -> None:
        await self._store.truncate(offset)


def _cached(fd: int, position: int, size: int) -> bool:
    """Whether the region's first and last bytes are in the page cache (a read
    with RWF_NOWAIT returns nothing rather than wait for the disk). The log is
    written and read sequentially, so the pages between go with them; two
    one-byte probes cost far less than copying the region to look."""
    if size <= 0:
        return True
    for at in (position, position + size - 1):
        try:
            if os.preadv(fd, [_PROBE], at, os.RWF_NOWAIT) != 1:
                return False
        except OSError:  # BlockingIOError: on disk; EOPNOTSUPP: cannot tell
            return False
    return True
