"""One process per store: an exclusive `flock` on `storePathRootDir/lock`.

Two brokers appending to one commit log would interleave records and corrupt
it; RocketMQ guards its store the same way (a file lock at startup). The lock
is taken before anything in the store is read or written and held for the
process's life; the kernel releases it when the process dies, however it
dies, so a crash never leaves a stale lock. The file holds the holder's PID,
for the message a second broker prints.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ferry.runtime.errors import FerryError

LOCK_FILE = "lock"


class StoreLockedError(FerryError):
    """Another process holds the store."""


class StoreLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, root: Path) -> StoreLock:
        """Take the lock or raise StoreLockedError naming the store and the holder."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        path = root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"the store {root} (storePathRootDir) is in use by another broker, PID "
                f"{holder}: two brokers on one store would corrupt it. Stop that broker first, "
                "or give this one its own storePathRootDir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = -1
