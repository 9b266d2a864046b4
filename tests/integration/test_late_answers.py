"""A handler still answering when its caller's deadline passes: grpc aio logs
an ERROR with an `ExecuteBatchError` traceback for it (shown first, on a bare
grpc server, so this test notices when grpc stops doing so); a ferry
`GrpcServer` logs no such ERROR and counts the late answer in
`ferry_grpc_late_answers_total` instead.

The late answer is a server stream whose client does not read: the handler's
write waits for flow control when the deadline comes, which fails its batch in
core nearly every time (on a loaded machine grpc may notice the deadline
first, so the test repeats the late call until it is seen; a handler that
answers after a pause of the whole process, the case seen in failover tests,
races grpc's own cancellation and fails only sometimes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.runtime.late_answers import GRPC_LOGGER, LATE_ANSWERS
from ferry.runtime.server import GrpcServer, Service
from tests.waiting import wait_for_async

MESSAGING = s.DESCRIPTOR.services_by_name["MessagingService"].full_name
BODY = b"x" * (1 << 20)


class Flood(service_pb2_grpc.MessagingServiceServicer):
    async def ReceiveMessage(self, request, context) -> AsyncIterator[s.ReceiveMessageResponse]:
        for _ in range(1000):  # far more than flow control lets through unread
            yield s.ReceiveMessageResponse(message=v2.Message(body=BODY))


def batch_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == GRPC_LOGGER and r.levelno >= logging.ERROR and r.exc_info
    ]


async def answer_late(server_port: int) -> None:
    """Open the stream, read nothing, and let its deadline pass."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server_port}") as channel:
        call = service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(
            s.ReceiveMessageRequest(), timeout=0.3
        )
        assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def late_until(port: int, seen, what: str, attempts: int = 10) -> None:
    """Late answers until `seen()`: on a loaded machine grpc sometimes notices
    the deadline before the blocked write fails its batch, and logs nothing for
    that call; each attempt waits up to 2 s for `seen()`."""
    for _ in range(attempts):
        await answer_late(port)
        try:
            await wait_for_async(seen, 2, what)
            return
        except AssertionError:
            continue
    raise AssertionError(f"{what}: not seen after {attempts} late answers")


def late_answer_total(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("ferry_grpc_late_answers_total")


def test_grpc_logs_a_late_answer_as_an_error_and_ferry_counts_it_instead(caplog):
    caplog.set_level(logging.INFO)
    grpc_log = logging.getLogger(GRPC_LOGGER)

    async def bare() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Flood(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await late_until(port, lambda: bool(batch_errors(caplog)), "grpc's ERROR")
        finally:
            await server.stop(0)

    async def ferry() -> None:
        registry = CollectorRegistry()
        server = GrpcServer(
            [Service(MESSAGING, Flood(), service_pb2_grpc.add_MessagingServiceServicer_to_server)],
            "127.0.0.1",
            0,
            registry=registry,
        )
        before = late_answer_total(registry)
        assert before is not None
        port = await server.start()
        try:
            await late_until(
                port, lambda: late_answer_total(registry) > before, "the late answer to be counted"
            )
        finally:
            await server.stop(0)

    grpc_log.removeFilter(LATE_ANSWERS)  # as if ferry were not there
    asyncio.run(bare())
    assert "ExecuteBatchError" in batch_errors(caplog)[0].getMessage()
    caplog.clear()
    asyncio.run(ferry())
    assert LATE_ANSWERS in grpc_log.filters
    assert batch_errors(caplog) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
