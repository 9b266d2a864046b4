"""ferry.runtime.swap on a real GrpcServer: servicers mounted behind one
server answer every kind of call; with nothing mounted a call is UNAVAILABLE,
with a mount lacking the service UNIMPLEMENTED; unmounting lets calls in
flight finish for the grace and ends the rest with UNAVAILABLE (never
CANCELLED), while a caller's own cancellation reaches the servicer as ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from apache.rocketmq.v2 import definition_pb2 as v2
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from ferry.runtime.server import GrpcServer
from ferry.runtime.swap import ServiceSwitch
from ferry.v1 import ha_admin_pb2, ha_admin_pb2_grpc
from tests.waiting import wait_for_async

MESSAGING = s.DESCRIPTOR.services_by_name["MessagingService"].full_name
HA_ADMIN = ha_admin_pb2.DESCRIPTOR.services_by_name["HAAdmin"].full_name
BETWEEN = "member 1 is changing its role; retry"


class Messaging(service_pb2_grpc.MessagingServiceServicer):
    """Answers carry `name` (which mount answered). QueryRoute of topic
    "slow" waits for `release`; every call's outcome lands in `outcomes`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = asyncio.Event()
        self.started = 0
        self.outcomes: list[str] = []

    async def QueryRoute(self, request, context):
        self.started += 1
        try:
            if request.topic.name == "slow":
                await self.release.wait()
        except asyncio.CancelledError:
            self.outcomes.append("cancelled")
            raise
        self.outcomes.append("answered")
        return s.QueryRouteResponse(status=v2.Status(message=self.name))

    async def ReceiveMessage(self, request, context) -> AsyncIterator[s.ReceiveMessageResponse]:
        for i in range(3):
            yield s.ReceiveMessageResponse(message=v2.Message(body=f"{self.name}{i}".encode()))
        if request.group.name == "slow":
            self.started += 1
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.outcomes.append("cancelled")
                raise

    async def Telemetry(self, request_iterator, context) -> AsyncIterator[s.TelemetryCommand]:
        async for command in request_iterator:
            yield s.TelemetryCommand(status=v2.Status(message=self.name + command.status.message))


class HAAdmin(ha_admin_pb2_grpc.HAAdminServicer):
    async def GetHAStatus(self, request, context):
        return ha_admin_pb2.HAStatus(broker_role="SLAVE")


def run(scenario: Callable[..., Awaitable[None]]) -> None:
    """`scenario(switch, server, stub, ha)` against a started server."""

    async def main() -> None:
        switch = ServiceSwitch(
            {
                MESSAGING: service_pb2_grpc.add_MessagingServiceServicer_to_server,
                HA_ADMIN: ha_admin_pb2_grpc.add_HAAdminServicer_to_server,
            },
            between=BETWEEN,
        )
        server = GrpcServer(switch.services, "127.0.0.1", 0)
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await scenario(
                    switch,
                    server,
                    service_pb2_grpc.MessagingServiceStub(channel),
                    ha_admin_pb2_grpc.HAAdminStub(channel),
                )
        finally:
            await server.stop(0)

    asyncio.run(main())


def route(topic: str = "t") -> s.QueryRouteRequest:
    return s.QueryRouteRequest(topic=v2.Resource(name=topic))


async def code_of(call: Awaitable) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_nothing_mounted_is_unavailable_a_missing_service_unimplemented():
    async def scenario(switch, server, stub, ha):
        assert await code_of(stub.QueryRoute(route(), timeout=5)) == (
            grpc.StatusCode.UNAVAILABLE,
            BETWEEN,
        )
        mount = switch.mount({HA_ADMIN: HAAdmin()})
        assert (await ha.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=5)).broker_role == (
            "SLAVE"
        )
        code, _ = await code_of(stub.QueryRoute(route(), timeout=5))
        assert code == grpc.StatusCode.UNIMPLEMENTED
        await switch.unmount(mount, grace_s=0)
        code, _ = await code_of(ha.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE

    run(scenario)


def test_every_kind_of_call_reaches_the_mounted_servicer():
    async def scenario(switch, server, stub, ha):
        for name in ("a", "b"):
            mount = switch.mount({MESSAGING: Messaging(name)})
            answer = await stub.QueryRoute(route(), timeout=5)
            assert answer.status.message == name
            bodies = [
                r.message.body
                async for r in stub.ReceiveMessage(s.ReceiveMessageRequest(), timeout=5)
            ]
            assert bodies == [f"{name}{i}".encode() for i in range(3)]
            commands = [s.TelemetryCommand(status=v2.Status(message=m)) for m in ("x", "y")]
            echoed = [c.status.message async for c in stub.Telemetry(iter(commands), timeout=5)]
            assert echoed == [name + "x", name + "y"]
            await switch.unmount(mount, grace_s=1)

    run(scenario)


def test_unmount_lets_calls_finish_for_the_grace_then_ends_them_unavailable():
    async def scenario(switch, server, stub, ha):
        # Within the grace: the call in flight gets its answer, new calls UNAVAILABLE.
        first = Messaging("a")
        mount = switch.mount({MESSAGING: first})
        call = asyncio.ensure_future(stub.QueryRoute(route("slow"), timeout=10))
        await wait_for_async(lambda: first.started == 1, 5, "the call to start")
        unmounting = asyncio.ensure_future(switch.unmount(mount, grace_s=10))
        assert (await code_of(stub.QueryRoute(route(), timeout=5)))[0] == (
            grpc.StatusCode.UNAVAILABLE
        )
        first.release.set()
        assert (await call).status.message == "a"
        await asyncio.wait_for(unmounting, 5)  # as soon as nothing is in flight
        # Past the grace: a unary and a streaming call are ended with UNAVAILABLE.
        second = Messaging("b")
        mount = switch.mount({MESSAGING: second})
        unary = asyncio.ensure_future(code_of(stub.QueryRoute(route("slow"), timeout=10)))
        stream = stub.ReceiveMessage(
            s.ReceiveMessageRequest(group=v2.Resource(name="slow")), timeout=10
        )
        received = [await stream.read() for _ in range(3)]
        assert [r.message.body for r in received] == [b"b0", b"b1", b"b2"]
        await wait_for_async(lambda: second.started == 2, 5, "both calls to be in flight")
        await switch.unmount(mount, grace_s=0.2)
        code, details = await unary
        assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
        assert BETWEEN in details
        assert await stream.code() == grpc.StatusCode.UNAVAILABLE
        assert second.outcomes == ["cancelled", "cancelled"]  # the servicer saw them end

    run(scenario)


def test_a_callers_own_cancellation_still_reaches_the_servicer():
    async def scenario(switch, server, stub, ha):
        servicer = Messaging("a")
        mount = switch.mount({MESSAGING: servicer})
        call = stub.QueryRoute(route("slow"), timeout=10)
        waiting = asyncio.ensure_future(call)
        await wait_for_async(lambda: servicer.started == 1, 5, "the call to start")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await call.code() == grpc.StatusCode.CANCELLED
        await wait_for_async(
            lambda: servicer.outcomes == ["cancelled"], 5, "the servicer to see it"
        )
        await wait_for_async(lambda: not mount.calls, 5, "the call to leave the mount")
        await switch.unmount(mount, grace_s=0)

    run(scenario)
