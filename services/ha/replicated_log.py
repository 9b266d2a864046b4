"""What the HA data plane needs of a commit log — and nothing more.

The master streams regions of its log to slaves; a slave appends what it
receives at its log's end, or starts over at an offset the master names.
Failover (a later step) cuts a divergent tail with `truncate`. HA depends on
this protocol only; the broker's store implements it
(`services.broker.store.replica_log.StoreReplicaLog`), so `services/ha` never opens
a segment file, computes a file boundary or touches the consume queues.

Offsets are commit offsets (bytes). Every method runs on the event loop.
"""

from __future__ import annotations

from typing import Protocol


class LogRegion(Protocol):
    """Part of one log file, readable while held: `fd` at `file_position`,
    `size` bytes, starting at commit offset `offset`."""

    @property
    def fd(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def file_position(self) -> int: ...

    @property
    def size(self) -> int: ...


class ReplicatedLog(Protocol):
    @property
    def min_offset(self) -> int:
        """The oldest offset still held (retention moves it)."""
        ...

    @property
    def max_offset(self) -> int:
        """The end: where the next byte goes."""
        ...

    def file_start(self, offset: int) -> int:
        """The start of the file that holds `offset` (a fresh slave starts at
        the start of its master's newest file)."""
        ...

    async def read_region(self, offset: int, max_bytes: int) -> LogRegion:
        """Up to `max_bytes` from `offset`, within one file and below the end,
        held (the file cannot be closed or reused under it) and in the page
        cache (read in a worker thread first when it was not), so that it can
        be sent with `sendfile` from the event loop. Release it with `release`."""
        ...

    def release(self, region: LogRegion) -> None: ...

    def read_now(self, offset: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` from `offset`, within one file and below the end,
        read at once (bytes just appended: in the page cache)."""
        ...

    async def wait_for_growth(self, offset: int, timeout_s: float) -> bool:
        """True once the log ends past `offset`; False after `timeout_s`."""
        ...

    def append(self, offset: int, data: bytes | memoryview) -> int:
        """A slave's replicated bytes, at `offset`, which must be the log's end —
        or, for an empty log, a file start. Returns the new end.

        Raises:
            ValueError: `offset` is not where the bytes can go.
            OSError: the bytes could not be written (nothing was appended).
        """
        ...

    def restart_at(self, offset: int) -> None:
        """Drop everything and start empty at `offset`, a file start (a slave
        whose log fell out of its master's range)."""
        ...

    async def truncate(self, offset: int) -> None:
        """Cut the log at `offset`, a record boundary at or below the end: the
        bytes after it, the index entries pointing past it and the durable
        checkpoint all go back to it."""
        ...
