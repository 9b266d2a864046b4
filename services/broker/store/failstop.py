"""Fail-stop: the store's one answer to a storage error it cannot account for.

A failed `fdatasync`/`fsync`, or a `pwrite` that failed for any reason but a
full disk, means the broker no longer knows what is on disk: Linux may have
dropped the dirty pages and will report the next sync as a success
("fsyncgate"). Retrying would acknowledge writes that may be lost. So, as
etcd and PostgreSQL do, the broker stops: the first fault is logged once at
CRITICAL (file and errno), every later write is refused, waiting SYNC_FLUSH
sends get an error, and the process exits non-zero so its supervisor
restarts it and recovery rebuilds a known state from the files.

`trip` is called from the event loop thread (the flusher, the appender, the
dispatcher, metadata writes). Components that must react at once (waiters to
fail) register with `on_trip`; the composition root waits on `wait()` to shut
the broker down. Full disks (ENOSPC, EDQUOT) are not faults: they are refused
with RESOURCE_EXHAUSTED where they happen and nothing is lost.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

from ferry.runtime.errors import StorageFault, Unavailable

log = logging.getLogger(__name__)

# A write that fails with one of these is refused and retried later: nothing
# already stored is in doubt.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full_disk(exc: OSError) -> bool:
    return exc.errno in FULL_DISK_ERRNOS


class FailStop:
    def __init__(self) -> None:
        self.fault: StorageFault | None = None
        self._listeners: list[Callable[[StorageFault], None]] = []
        self._event: asyncio.Event | None = None

    @property
    def tripped(self) -> bool:
        return self.fault is not None

    def on_trip(self, listener: Callable[[StorageFault], None]) -> None:
        self._listeners.append(listener)

    def trip(self, fault: StorageFault) -> None:
        """Record the first storage fault and stop taking writes (idempotent)."""
        if self.fault is not None:
            log.error("another storage fault after the first: %s", fault)
            return
        self.fault = fault
        log.critical(
            "STORAGE FAILURE: %s (errno %s). What is on disk is no longer known: this broker "
            "acknowledges nothing more, leaves its name servers and exits so that recovery "
            "runs at the next start. Check the disk (dmesg, SMART) before restarting it.",
            fault,
            fault.errno,
        )
        for listener in self._listeners:
            try:
                listener(fault)
            except Exception:
                log.exception("a fail-stop listener failed")
        if self._event is not None:
            self._event.set()

    def check(self) -> None:
        """Raise Unavailable once tripped: no write is taken after a fault."""
        if self.fault is not None:
            raise self.refusal()

    def refusal(self) -> Unavailable:
        return Unavailable(
            f"the broker stopped taking writes after a storage failure ({self.fault}); "
            "nothing more is acknowledged here; it is shutting down to recover — send to "
            "another broker"
        )

    async def wait(self) -> StorageFault:
        """Until the first fault; returns it."""
        if self._event is None:
            self._event = asyncio.Event()
        if self.fault is None:
            await self._event.wait()
        assert self.fault is not None
        return self.fault
