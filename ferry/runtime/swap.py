"""Servicers swapped behind one long-lived gRPC server.

A failover member changes role without closing its port: its `GrpcServer`
(ports, TLS, interceptors, health, reflection) lives as long as the process,
and each run of the broker app *mounts* its servicers on a `ServiceSwitch`
and *unmounts* them when it stops. The switch registers a stand-in servicer
per service, built from the service's descriptor, whose every method forwards
the call to the mounted servicer of that service:

- nothing mounted (between two runs): UNAVAILABLE, saying the member is
  changing role and to retry;
- a mount without that service (e.g. the SDKs' MessagingService on a slave):
  UNIMPLEMENTED, as from a server that never had it;
- unmounting: new calls get UNAVAILABLE at once; calls in flight may finish
  for a grace period, then are ended with UNAVAILABLE (never CANCELLED: a
  client retries UNAVAILABLE). A caller's own cancellation propagates as ever.

The stand-in is one coroutine per method whatever its kind: a target that
returns a coroutine is awaited (unary answers, or the reader/writer streaming
API); an async generator's answers are written with `context.write`.

The switch is owned by the event loop: mounting, unmounting and the calls
themselves all run there. It never touches what the servicers serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf import descriptor_pool

from ferry.runtime.clock import within
from ferry.runtime.server import Service

END_TIMEOUT_S = 1.0  # for calls ended after the grace to send their UNAVAILABLE


class Mount:
    """One run's servicers on a switch, and its calls in flight."""

    def __init__(self, servicers: Mapping[str, Any]) -> None:
        self.servicers = dict(servicers)
        self.calls: set[asyncio.Task] = set()
        self.ended: set[asyncio.Task] = set()  # cancelled by `unmount`
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self, task: asyncio.Task) -> None:
        self.calls.add(task)
        self.idle.clear()

    def leave(self, task: asyncio.Task) -> None:
        self.calls.discard(task)
        self.ended.discard(task)
        if not self.calls:
            self.idle.set()


class ServiceSwitch:
    """Stand-in servicers for `services` (full name → the generated
    `add_*Servicer_to_server`); `between` is the UNAVAILABLE detail while
    nothing is mounted."""

    def __init__(
        self, services: Mapping[str, Callable[[Any, grpc.aio.Server], None]], between: str
    ) -> None:
        self.between = between
        self.current: Mount | None = None
        self.services = [Service(name, _StandIn(self, name), add) for name, add in services.items()]

    def mount(self, servicers: Mapping[str, Any]) -> Mount:
        """Serve `servicers` (full service name → servicer) from now on."""
        if self.current is not None:
            raise RuntimeError("a mount is still in place: unmount it first")
        unknown = set(servicers) - {s.name for s in self.services}
        if unknown:
            raise ValueError(f"no stand-in for {sorted(unknown)} on this server")
        self.current = Mount(servicers)
        return self.current

    async def unmount(self, mount: Mount, grace_s: float) -> None:
        """New calls get UNAVAILABLE now; calls in flight may finish for
        `grace_s`, then are ended with UNAVAILABLE."""
        if self.current is mount:
            self.current = None
        if mount.calls:
            with contextlib.suppress(TimeoutError):
                await within(mount.idle.wait(), grace_s)
        if mount.calls:
            for task in list(mount.calls):
                mount.ended.add(task)
                task.cancel()
            with contextlib.suppress(TimeoutError):
                await within(mount.idle.wait(), END_TIMEOUT_S)


class _StandIn:
    """What the server holds for one service: a forwarding method per RPC."""

    def __init__(self, switch: ServiceSwitch, service: str) -> None:
        descriptor = descriptor_pool.Default().FindServiceByName(service)
        for method in descriptor.methods:
            setattr(self, method.name, _forwarder(switch, service, method.name))


def _forwarder(switch: ServiceSwitch, service: str, name: str):
    async def forward(request: Any, context: grpc.aio.ServicerContext) -> Any:
        mount = switch.current
        if mount is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, switch.between)
        servicer = mount.servicers.get(service)
        if servicer is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        task = asyncio.current_task()
        assert task is not None
        mount.enter(task)
        answers = None
        try:
            result = getattr(servicer, name)(request, context)
            if inspect.isasyncgen(result):
                answers = result
                async for answer in answers:
                    await context.write(answer)
                return None
            return await result if inspect.isawaitable(result) else result
        except asyncio.CancelledError:
            if task not in mount.ended:
                raise  # the caller's own cancellation
            task.uncancel()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{switch.between} (this call was cut off by the change)",
            )
        finally:
            mount.leave(task)
            if answers is not None:
                await answers.aclose()

    forward.__name__ = forward.__qualname__ = name
    return forward
