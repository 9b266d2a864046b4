"""The plain_acl.yml a process checks requests with (ferry.acl), kept current, and
the log of what it refuses (`DenialLog`).

Loaded once at startup, where a missing or invalid file stops the process (the
caller turns the ValueError into its own startup error). After that, `config`
looks at the file's modification time and size at most once a second and, when
either changed, reads it again, as Apache's broker watches its file: a good edit
applies from the next request on; a bad one (or a file that went away) keeps the
previous accounts and is logged once as a warning naming the file and the error
(load_acl's messages never carry a secret key).

Owned by the event loop of its process: `config` is called there, on the hot path
of every checked request, so it costs one clock reading per call and one `stat`
per second; the reload itself (a small YAML file) happens on the loop too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ferry.acl import SHOWN_CHARS, AclChecker, AclConfig, AclDenied, Reason, load_acl

log = logging.getLogger(__name__)

RECHECK_S = 1.0


class AclFile:
    def __init__(
        self,
        path: str | Path,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ) -> None:
        """Load `path`; ValueError (naming the file, account and field) when it is
        missing or invalid."""
        self.path = Path(path)
        self._clock = clock
        self._recheck_s = recheck_s
        self._stamp = self._stat()
        self._config = load_acl(self.path)
        self._checker = AclChecker(self._config)
        # For the hot path: the current checker's `fast`, current until `next_check` (on
        # `clock`), when the file is looked at again.
        self.fast = self._checker.fast
        self.fast_many = self._checker.fast_many
        self.next_check = clock() + recheck_s
        self._failed_stamp: tuple[int, int] | None = None
        self.reloads = 0

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def config(self) -> AclConfig:
        """The accounts in force (re-read first when the file changed)."""
        now = self._clock()
        if now >= self.next_check:
            self.next_check = now + self._recheck_s
            self.refresh()
        return self._config

    @property
    def checker(self) -> AclChecker:
        """The RocketMQ-protocol check of the accounts in force."""
        self.config  # noqa: B018 - re-reads the file when due
        return self._checker

    def refresh(self) -> bool:
        """Read the file again if it changed; whether the accounts changed."""
        stamp = self._stat()
        if stamp == self._stamp or (stamp is not None and stamp == self._failed_stamp):
            return False
        if stamp is None:
            if self._failed_stamp != (-1, -1):
                self._failed_stamp = (-1, -1)
                log.warning(
                    "ACL file %s is gone; keeping the accounts loaded before until it is back",
                    self.path,
                )
            return False
        try:
            config = load_acl(self.path)
        except ValueError as exc:
            self._failed_stamp = stamp
            log.warning("ACL file %s changed but cannot be used, keeping the accounts loaded "
                        "before: %s", self.path, exc)  # fmt: skip
            return False
        self._stamp, self._failed_stamp = stamp, None
        self._config = config
        self._checker = AclChecker(config)
        self.fast = self._checker.fast
        self.fast_many = self._checker.fast_many
        self.reloads += 1
        log.info("ACL file %s reloaded: %d accounts", self.path, len(config.accounts))
        return True


class DenialLog:
    """Logs a denial at most once a minute per (access key, reason): a client retrying
    a refused call does not flood the log. Never logs a secret or a signature (a
    denial's message names neither)."""

    PERIOD_S = 60.0
    MAX_KEYS = 4096

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] | None = None) -> None:
        self._log = logger
        self._clock = clock or time.monotonic
        self._last: dict[tuple[str | None, Reason], float] = {}
        self.suppressed = 0

    def denied(self, denied: AclDenied, what: str, remote: str = "") -> bool:
        """Log `denied` unless its kind was logged in the last minute; whether it was."""
        now = self._clock()
        key = (None if denied.access_key is None else denied.access_key[:SHOWN_CHARS],
               denied.reason)  # fmt: skip
        last = self._last.get(key)
        if last is not None and now - last < self.PERIOD_S:
            self.suppressed += 1
            return False
        if len(self._last) >= self.MAX_KEYS:
            self._last = {k: t for k, t in self._last.items() if now - t < self.PERIOD_S}
            if len(self._last) >= self.MAX_KEYS:
                self._last.clear()
        self._last[key] = now
        self._log.warning(
            "ACL refused %s%s: %s (the same refusals are logged at most once a minute)",
            what,
            f" from {remote}" if remote else "",
            denied,
        )
        return True
