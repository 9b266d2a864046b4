"""Late answers: a handler that answers after its caller stopped waiting.

A caller's deadline can pass while its call is being answered (a broker frozen
by a pause answers, when it resumes, the sends queued meanwhile; a stream's
write is still under way when the deadline comes). grpc aio then fails the
answer's batch in core and, unless it has already seen the caller go, logs
`ExecuteBatchError raised in core by servicer method [...]` at ERROR with a
traceback (`_handle_exceptions` in grpc/_cython/_cygrpc/aio/server.pyx.pxi).
Nothing is wrong on the server: the caller gave up and the answer is dropped.

grpc offers no hook between that failed batch and the log call (the batch is
sent by grpc's own code after the handler returned), so `LateAnswerFilter`, a
`logging.Filter` on grpc's `grpc._cython.cygrpc` logger, recognises that one
record, drops it, counts it (`ferry_grpc_late_answers_total`) and logs it here
at INFO without a traceback: the first one, then at most one line a minute
with the count since. Every other grpc record passes untouched.

The count is the process's (grpc's logger is one per process); every ferry
gRPC server registers `LateAnswersCollector` in its process's registry
(`ferry.runtime.server.GrpcServer`, through `register`: once per registry, however
many servers a process runs).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

GRPC_LOGGER = "grpc._cython.cygrpc"
_PREFIX = "ExecuteBatchError raised in core by servicer method"
LOG_EVERY_S = 60.0


class LateAnswerFilter(logging.Filter):
    """Drops, counts and summarises grpc's ERROR for a late answer (see the module)."""

    def __init__(
        self, log_every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.count = 0
        self._log_every_s = log_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._logged_at: float | None = None
        self._logged_count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_late_answer(record):
            return True
        now = self._clock()
        with self._lock:
            self.count += 1
            due = self._logged_at is None or now - self._logged_at >= self._log_every_s
            if due:
                since, self._logged_count = self.count - self._logged_count, self.count
                self._logged_at = now
        if due:
            method = record.getMessage().removeprefix(_PREFIX).strip(" []")
            log.info(
                "late answer: %s answered after its caller stopped waiting (deadline passed "
                "or call cancelled); the answer was dropped (%d since the last such line, "
                "%d in all; at most one line a minute)",
                method or "a call",
                since,
                self.count,
            )
        return False


def _is_late_answer(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return (
        exc is not None
        and type(exc).__name__ == "ExecuteBatchError"
        and isinstance(record.msg, str)
        and record.msg.startswith(_PREFIX)
    )


LATE_ANSWERS = LateAnswerFilter()  # the process's: grpc's logger is one per process
_install_lock = threading.Lock()


def install() -> None:
    """Put `LATE_ANSWERS` on grpc's logger (once per process; idempotent)."""
    logger = logging.getLogger(GRPC_LOGGER)
    with _install_lock:
        if LATE_ANSWERS not in logger.filters:
            logger.addFilter(LATE_ANSWERS)


class LateAnswersCollector(Collector):
    """`ferry_grpc_late_answers_total`: the process's late answers so far."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "ferry_grpc_late_answers",
            "Answers this process's gRPC handlers gave after their caller had stopped "
            "waiting (deadline passed or call cancelled); grpc dropped them.",
            value=LATE_ANSWERS.count,
        )


_registered: weakref.WeakSet = weakref.WeakSet()


def register(registry) -> None:
    """`LateAnswersCollector` in `registry`, unless it is there already (a broker's
    ferry.v1 server and its SDKs' door share one registry and one count)."""
    if registry not in _registered:
        registry.register(LateAnswersCollector())
        _registered.add(registry)
