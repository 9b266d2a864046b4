"""A slave's metadata sync (docs/guides/replication.md, "Metadata"): `syncAll` from
its master's `SlaveSync` service `delay_s` after start and every `interval_s`,
paused while the master is unknown (its address comes from the registration
answer).

- topics and subscription groups: applied only when the master's DataVersion
  differs, by swapping in the whole table (readers never see it half-empty)
  and adopting the master's version; with failover on, only when the
  master's table is at or past the metadata-log records this member applied
  (services.broker.metadata.metadata_log);
- consumer offsets: merged, the highest offset winning per (topic@group,
  queue), so offsets committed on the slave while its master was away are
  not rewound;
- delay offsets: written as the master sends them.
Each table is persisted by the metadata module. A failed round is logged and
retried next period. A gRPC client adapter on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from ferry.model import DataVersion
from ferry.runtime.tasks import cancel_and_wait
from ferry.runtime.tls import ClientTLS, aio_channel
from ferry.v1 import common_pb2, slave_sync_pb2, slave_sync_pb2_grpc
from services.broker.api import convert

log = logging.getLogger(__name__)


def _version(msg: common_pb2.DataVersion) -> DataVersion:
    return DataVersion(msg.timestamp, msg.counter, msg.state_version)


class SlaveSyncLoop:
    def __init__(
        self,
        metadata,
        delay_s: float = 3.0,
        interval_s: float = 10.0,
        timeout_s: float = 10.0,
        tls: ClientTLS | None = None,
        journal=None,
    ) -> None:
        """`journal`: the failover member's metadata log
        (services.broker.metadata.metadata_log.MetadataLog), or None."""
        self.metadata = metadata
        self.journal = journal
        self.tls = tls
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.master_addr = ""
        self._known = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.rounds = 0
        self.failures = 0

    def set_master(self, addr: str) -> None:
        self.master_addr = addr
        if addr:
            self._known.set()
        else:
            self._known.clear()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="slave-sync")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        await asyncio.sleep(self.delay_s)
        while True:
            await self._known.wait()
            addr = self.master_addr
            try:
                await self.sync_all(addr)
            except grpc.aio.AioRpcError as exc:
                self.failures += 1
                log.warning(
                    "metadata sync from master %s failed: %s: %s",
                    addr,
                    exc.code().name,
                    exc.details(),
                )
            except Exception:
                self.failures += 1
                log.exception("metadata sync from master %s failed", addr)
            await asyncio.sleep(self.interval_s)

    def _accept(self, queue_id: int, position: int) -> bool:
        """With failover, a table older than the records this member's log
        already applied would undo a change: it waits for the next round."""
        return self.journal is None or self.journal.accept_snapshot(queue_id, position)

    async def sync_all(self, addr: str) -> None:
        async with aio_channel(
            addr, self.tls, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        ) as channel:
            stub = slave_sync_pb2_grpc.SlaveSyncStub(channel)
            t = self.timeout_s
            topics = await stub.GetAllTopicConfig(
                slave_sync_pb2.GetAllTopicConfigRequest(), timeout=t
            )
            offsets = await stub.GetAllConsumerOffset(
                slave_sync_pb2.GetAllConsumerOffsetRequest(), timeout=t
            )
            delays = await stub.GetAllDelayOffset(
                slave_sync_pb2.GetAllDelayOffsetRequest(), timeout=t
            )
            groups = await stub.GetAllSubscriptionGroupConfig(
                slave_sync_pb2.GetAllSubscriptionGroupConfigRequest(), timeout=t
            )
        meta, journal = self.metadata, self.journal
        version = _version(topics.data_version)
        if version != meta.topics.data_version and self._accept(0, topics.metadata_log_offset):
            meta.topics.replace_all(
                {name: convert.topic_config(tc) for name, tc in topics.topic_config_table.items()},
                version,
            )
            if journal is not None:
                journal.adopt_snapshot(0, topics.metadata_log_offset)
            log.info("synced %d topics from master %s", len(topics.topic_config_table), addr)
        version = _version(groups.data_version)
        if version != meta.subscription_groups.data_version and self._accept(
            1, groups.metadata_log_offset
        ):
            meta.subscription_groups.replace_all(
                {
                    name: convert.subscription_group(g)
                    for name, g in groups.subscription_group_table.items()
                },
                version,
            )
            if journal is not None:
                journal.adopt_snapshot(1, groups.metadata_log_offset)
        meta.consumer_offsets.merge_max(
            {key: dict(q.offsets) for key, q in offsets.offset_table.items()},
            _version(offsets.data_version),
        )
        meta.delay_offsets.replace_all(dict(delays.offset_table), _version(delays.data_version))
        self.rounds += 1
