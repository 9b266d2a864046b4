"""The broker's etcd client for automatic failover: aetcd (the maintained
asyncio etcd v3 client, on grpc.aio like the broker) over every endpoint of
`etcdEndpoints`, one at a time: a call that fails or takes longer than its
deadline moves to the next endpoint, and raises `EtcdUnavailable` when none
answered. Every call is bounded (`timeout_s`): the failover controller's
clock, not the network's, decides when a lease may have expired.

Keys of a broker group (`prefix` = `/ferry/<cluster>/<brokerName>/`):

| key            | value (JSON)                                          | lease        |
|----------------|-------------------------------------------------------|--------------|
| `leader`       | id, addr, ha_addr, epoch, history, ready               | the leader's |
| `epoch`        | {"epoch": the newest epoch granted}                   | none         |
| `isr`          | {"epoch", "leader", "members": [ids]}: the in-sync set | none         |
| `members/<id>` | id, addr, role, epoch, max_offset, confirmed          | the member's |
| `handover`     | {"epoch", "from", "to", "ready"} or {"refused": why}   | none         |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

from ferry.runtime.clock import within

log = logging.getLogger(__name__)

T = TypeVar("T")


class EtcdUnavailable(Exception):
    """No etcd endpoint answered in time."""


ROOT = "/ferry/"


def group_prefix(cluster: str, broker_name: str) -> str:
    return f"{ROOT}{cluster}/{broker_name}/"


@dataclass
class GroupState:
    """One consistent read of a group's keys (a single range request)."""

    leader: dict | None = None
    leader_lease: int = 0
    leader_raw: bytes = b""
    epoch: int = 0
    epoch_mod: int = 0
    isr: dict | None = None
    isr_mod: int = 0
    handover: dict | None = None
    members: dict[int, dict] = field(default_factory=dict)

    @property
    def isr_members(self) -> list[int]:
        return list(self.isr.get("members", [])) if self.isr else []


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        log.warning("ignoring %s in etcd: not JSON (%r...)", what, raw[:40])
        return None


class Etcd:
    def __init__(self, endpoints: tuple[str, ...], timeout_s: float) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self._index = 0
        self._client: aetcd.Client | None = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._index]

    async def call(
        self, op: Callable[[aetcd.Client], Awaitable[T]], timeout_s: float | None = None
    ) -> T:
        """`op` on one endpoint after another until one answers within the deadline."""
        last: BaseException | None = None
        for _ in range(len(self.endpoints)):
            client = self._client
            if client is None:
                host, _, port = self.endpoint.rpartition(":")
                client = self._client = aetcd.Client(host=host, port=int(port))
            try:
                async with asyncio.timeout(timeout_s or self.timeout_s):
                    return await op(client)
            except (TimeoutError, aetcd.exceptions.ConnectionFailedError,
                    aetcd.exceptions.ConnectionTimeoutError, aetcd.exceptions.InternalError,
                    asyncio.CancelledError) as exc:  # fmt: skip
                current = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and current and current.cancelling():
                    raise  # this caller is cancelled
                # Else a CancelledError is grpc.aio's for a call whose channel
                # closed: another call on the shared client timed out and
                # dropped it. A failure of the endpoint, never the caller's end.
                last = (
                    ConnectionError("the client was closed when another call on it timed out")
                    if isinstance(exc, asyncio.CancelledError)
                    else exc
                )
                if self._client is client:  # not one another call made since
                    await self._drop()
                    self._index = (self._index + 1) % len(self.endpoints)
        raise EtcdUnavailable(
            f"no etcd endpoint of {';'.join(self.endpoints)} answered within "
            f"{timeout_s or self.timeout_s:.1f} s ({type(last).__name__}: {last})"
        )

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await within(client.close(), 1.0)

    async def close(self) -> None:
        await self._drop()

    # ------------------------------------------------------------ group reads

    async def read_group(self, prefix: str) -> GroupState:
        result = await self.call(lambda c: c.get_prefix(prefix.encode()))
        state = GroupState()
        for kv in result or ():
            _apply(state, kv.key.decode(errors="replace")[len(prefix) :], kv)
        return state

    async def read_groups(self, cluster: str = "", broker_name: str = "") -> dict:
        """Every failover group under ROOT (of `cluster`, named `broker_name`,
        when given) in one range read: {(cluster, brokerName): GroupState}."""
        result = await self.call(lambda c: c.get_prefix(f"{ROOT}{cluster}".encode()))
        groups: dict[tuple[str, str], GroupState] = {}
        for kv in result or ():
            parts = kv.key.decode(errors="replace")[len(ROOT) :].split("/", 2)
            if len(parts) < 3 or (cluster and parts[0] != cluster):
                continue
            if broker_name and parts[1] != broker_name:
                continue
            state = groups.setdefault((parts[0], parts[1]), GroupState())
            _apply(state, parts[2], kv)
        return dict(sorted(groups.items()))


def _apply(state: GroupState, name: str, kv) -> None:
    """One key of a group (`name` relative to its prefix) into `state`."""
    if name == "leader":
        value = _json(kv.value, "the leader key")
        if isinstance(value, dict):
            state.leader, state.leader_lease, state.leader_raw = value, kv.lease, kv.value
    elif name == "epoch":
        value = _json(kv.value, "the epoch key")
        state.epoch = int(value.get("epoch", 0)) if isinstance(value, dict) else 0
        state.epoch_mod = kv.mod_revision
    elif name == "isr":
        value = _json(kv.value, "the in-sync set")
        state.isr = value if isinstance(value, dict) else None
        state.isr_mod = kv.mod_revision
    elif name == "handover":
        value = _json(kv.value, "the handover request")
        state.handover = value if isinstance(value, dict) else None
    elif name.startswith("members/"):
        value = _json(kv.value, f"member {name}")
        if isinstance(value, dict) and isinstance(value.get("id"), int):
            state.members[value["id"]] = value


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
