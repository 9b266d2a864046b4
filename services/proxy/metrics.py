"""The proxy's Prometheus metrics: requests by RPC and result code, their
latency, and the streams open (receive long polls, client telemetry). The
decorators that count also stand between a bug and the client: an unexpected
exception is logged and answered as INTERNAL_ERROR in the response's status,
as the API reports errors, not as a bare gRPC UNKNOWN.

The code label is the v2 `Code` name a request was answered with (OK,
TOPIC_NOT_FOUND, MESSAGE_NOT_FOUND, ...; UNAUTHORIZED for the refusals of the
signature check, `auth.py`, which counts them here), or the gRPC status name
when the request failed before it could be answered with one."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from apache.rocketmq.v2 import definition_pb2 as v2

log = logging.getLogger(__name__)

# Receives long-poll for up to 30 s; sends take milliseconds.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "ferry_proxy_requests",
            "apache.rocketmq.v2 requests answered, by RPC and result code.",
            ["rpc", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "ferry_proxy_request_duration_seconds",
            "Time from a request's arrival to its answer (a stream's end), by RPC.",
            ["rpc"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.streams = Gauge(
            "ferry_proxy_streams_open",
            "Streams open now: ReceiveMessage long polls and Telemetry connections.",
            ["rpc"],
            registry=registry,
        )

        # Labelled children, looked up once: `labels()` costs more than the count.
        self._counts: dict[tuple[str, str], Any] = {}
        self._latencies: dict[str, Any] = {}

    def observe(self, rpc: str, code: str, seconds: float) -> None:
        count = self._counts.get((rpc, code))
        if count is None:
            count = self._counts[(rpc, code)] = self.requests.labels(rpc, code)
        latency = self._latencies.get(rpc)
        if latency is None:
            latency = self._latencies[rpc] = self.latency.labels(rpc)
        count.inc()
        latency.observe(seconds)


_CODE_NAMES = {value: name for name, value in v2.Code.items()}


def _code_name(status: v2.Status) -> str:
    code = status.code
    return _CODE_NAMES.get(code) or str(code)


def _internal(rpc: str, response_type: Any) -> Any:
    log.exception("unexpected error in %s", rpc)
    return response_type(
        status=v2.Status(
            code=v2.Code.INTERNAL_ERROR, message=f"internal error in {rpc}; see the proxy's log"
        )
    )


def unary(rpc: str, response_type: Any) -> Callable:
    """Count and time a unary method whose answer carries a v2 `status`."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def wrapper(self, request, context):
            started = time.perf_counter()
            code = "INTERNAL"
            try:
                try:
                    response = await method(self, request, context)
                except Exception:  # noqa: BLE001 - answered, never a bare UNKNOWN
                    response = _internal(rpc, response_type)
                code = _code_name(response.status)
                return response
            except BaseException as exc:
                code = _exception_code(exc)
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.observe(rpc, code, time.perf_counter() - started)

        return wrapper

    return wrap


def stream(rpc: str, response_type: Any) -> Callable:
    """Count, time and gauge a streaming method: the code of a ReceiveMessage
    is its stream's first status; a Telemetry stream's is OK when it ends."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def wrapper(self, request, context) -> AsyncIterator[Any]:
            metrics: ProxyMetrics | None = self.metrics
            started = time.perf_counter()
            code = "OK"
            first = True
            if metrics is not None:
                metrics.streams.labels(rpc).inc()
            try:
                try:
                    async for response in method(self, request, context):
                        if first and response.HasField("status"):
                            code, first = _code_name(response.status), False
                        yield response
                except Exception:  # noqa: BLE001 - answered, never a bare UNKNOWN
                    response = _internal(rpc, response_type)
                    code = _code_name(response.status)
                    yield response
            except BaseException as exc:
                code = _exception_code(exc)
                raise
            finally:
                if metrics is not None:
                    metrics.streams.labels(rpc).dec()
                    metrics.observe(rpc, code, time.perf_counter() - started)

        return wrapper

    return wrap


def _exception_code(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"  # the client went away
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            return code().name
        except Exception:  # noqa: BLE001 - any odd exception still gets a label
            pass
    return "INTERNAL"
