"""This member's etcd lease, the clock that says how long it may still
acknowledge, and the fence its sends pass while it leads.

Owns:
- `Lease`: the etcd lease its keys live under (`members/<id>`, and `leader`
  while it leads): granted for `failoverLeaseTtl`, renewed every third of it.
  `valid_until` is the monotonic moment from which this member acknowledges
  nothing: `fence_margin_s` (10% of the TTL, at least 0.5 s: the clock-drift
  margin) before the lease could expire, counted from when its last
  successful renewal was *sent* (etcd cannot expire the lease before that).
  `lost` is set once the lease has expired, or must have by now.
- `Fence`: what the running app asks before it takes a send
  (`check_accepting`) or acknowledges one (`check_acknowledging`): a leader
  refuses both once its lease clock has run out, and takes no send while it
  hands its role over.

Runs on the event loop. Only the node's lease task (`Lease.grant`,
`Lease.renew`) writes the lease state; the fence only reads it and the
member's `Role`. Must never read the running broker app, nor write a key of
the group (the callers put their keys under `Lease.id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aetcd.exceptions

from ferry.runtime.errors import Unavailable
from services.broker.failover.etcd import Etcd, EtcdUnavailable
from services.broker.failover.role import Role

log = logging.getLogger(__name__)


class Lease:
    def __init__(self, etcd: Etcd, ttl_s: float, poll_s: float) -> None:
        self.etcd = etcd
        self.ttl_s = ttl_s
        self.fence_margin_s = max(0.5, 0.1 * ttl_s)
        self.poll_s = poll_s
        self.id = 0  # 0: none granted (yet, or any more)
        self.valid_until = 0.0  # monotonic: acknowledge nothing at or after this
        self.lost = asyncio.Event()

    def may_ack(self) -> bool:
        return time.monotonic() < self.valid_until

    async def grant(self) -> None:
        """A new lease; retries until etcd grants one."""
        while True:
            started = time.monotonic()
            try:
                lease = await self.etcd.call(lambda c: c.lease(max(1, round(self.ttl_s))))
            except (EtcdUnavailable, aetcd.exceptions.ClientError) as exc:
                log.warning("cannot get an etcd lease: %s; retrying", exc)
                await asyncio.sleep(self.poll_s * 4)
                continue
            self.id = lease.id
            self.valid_until = started + self.ttl_s - self.fence_margin_s
            self.lost.clear()
            return

    async def renew(self) -> None:
        """Renew the lease every third of its TTL (every poll while the clock
        has run out); returns once it has expired, with `lost` set."""
        interval = self.ttl_s / 3
        while True:
            await asyncio.sleep(interval if self.may_ack() else self.poll_s)
            lease = self.id
            sent = time.monotonic()
            try:
                reply = await self.etcd.call(
                    lambda c, lease=lease: c.refresh_lease(lease), timeout_s=interval
                )
            except EtcdUnavailable as exc:
                log.warning(
                    "cannot renew the etcd lease: %s (acknowledgements stop in %.1f s)",
                    exc,
                    max(0.0, self.valid_until - time.monotonic()),
                )
                if time.monotonic() > self.valid_until + self.fence_margin_s:
                    self.lost.set()  # it has expired by now
                continue
            except aetcd.exceptions.ClientError as exc:
                log.warning("etcd refused to renew the lease %x: %s", lease, exc)
                reply = None
            if reply is None or reply.TTL <= 0:
                log.warning("the etcd lease %x has expired; getting a new one", lease)
                self.lost.set()
                self.valid_until = 0.0
                return
            self.valid_until = sent + reply.TTL - self.fence_margin_s
            if self.lost.is_set():
                # Renewed after all (etcd was away less than the TTL).
                self.lost.clear()

    async def revoke(self) -> None:
        """Leaving: the keys under the lease go now, not one TTL later."""
        lease, self.id = self.id, 0
        if lease:
            with contextlib.suppress(Exception):
                await self.etcd.call(lambda c: c.revoke_lease(lease), timeout_s=1.0)


class Fence:
    """What a deposed, expiring or handing-over master must not do."""

    def __init__(self, lease: Lease, role: Role, broker_name: str) -> None:
        self.lease = lease
        self.role = role
        self.broker_name = broker_name
        self._handing_over = False

    @property
    def handing_over(self) -> bool:
        return self._handing_over

    def begin_handover(self) -> None:
        """`ferry failover`: take no more sends (acknowledge the ones taken)."""
        self._handing_over = True

    def end_handover(self) -> None:
        self._handing_over = False

    def fenced(self) -> bool:
        """This master holds back acknowledgements (its lease may be expiring)."""
        return self.role.leading and not self.lease.may_ack()

    def check_accepting(self) -> None:
        """Before a send (or a metadata change) is taken.

        Raises:
            Unavailable: this master hands its role over, or its lease may expire.
        """
        if not self.role.leading:
            return
        if self._handing_over:
            raise Unavailable(
                f"{self.broker_name} is handing its master role over (ferry failover); "
                "retry: the new master takes sends in a few seconds"
            )
        self._check_lease()

    def check_acknowledging(self) -> None:
        """Before a send taken is acknowledged.

        Raises:
            Unavailable: this master's lease may expire.
        """
        if self.role.leading:
            self._check_lease()

    def _check_lease(self) -> None:
        if not self.lease.may_ack():
            raise Unavailable(
                f"{self.broker_name}'s master (epoch {self.role.epoch}) cannot renew its etcd "
                "lease and no longer acknowledges sends: the group may be electing a new master; "
                "retry (the message may have been stored, but it is not acknowledged)"
            )
