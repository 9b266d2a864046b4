"""SIGKILL a master with popped messages in flight: after a restart no
acknowledged message is delivered again and every unacknowledged one is. The
slave's copy of the revive records rebuilds the same in-flight state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from ferry.model import revive_topic
from ferry.runtime.clock import SystemClock
from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, broker_pb2, broker_pb2_grpc
from services.broker.metadata.tables import BrokerMetadata
from services.broker.pop import PopConfig, PopService
from services.broker.store import MessageStore, StoreConfig
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, create_topic, free_port
from tests.waiting import wait_for

FILE = 1 << 20
MESSAGES = 2000


def _pop(broker, n=32, invisible_ms=5000, wait_ms=0):
    return broker.PopMessage(
        broker_pb2.PopMessageRequest(
            consumer_group="crashers",
            topic="Crash",
            max_msg_nums=n,
            invisible_ms=invisible_ms,
            max_wait_ms=wait_ms,
        ),  # fmt: skip
        timeout=30,
    ).messages


def _ack(broker, messages):
    return broker.AckMessage(
        broker_pb2.AckMessageRequest(
            consumer_group="crashers",
            topic="Crash",
            receipt_handles=[m.receipt_handle for m in messages],
        ),
        timeout=30,
    ).results


def _max_offset(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        admin = broker_admin_pb2_grpc.BrokerAdminStub(ch)
        info = admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=5)
        return info.commit_log_max_offset


def test_sigkill_with_messages_in_flight_loses_none_and_repeats_no_ack(tmp_path):
    ha_port = free_port()
    master_options = broker_options(
        tmp_path / "m", brokerName="broker-c", mappedFileSizeCommitLog=FILE,
        haListenPort=ha_port, haSyncFrom="minOffset", messageDelayLevel="1s 1s",
    )  # fmt: skip
    master = BrokerServer(tmp_path / "m", master_options).start()
    slave = BrokerServer(
        tmp_path / "s",
        broker_options(
            tmp_path / "s",
            brokerName="broker-c",
            brokerRole="SLAVE",
            brokerId=1,
            mappedFileSizeCommitLog=FILE,
            haMasterAddress=f"127.0.0.1:{ha_port}",
            haReconnectInterval=200,
        ),  # fmt: skip
    ).start()
    try:
        channel = grpc.insecure_channel(master.addr)
        broker = broker_pb2_grpc.BrokerStub(channel)
        create_topic(channel, "Crash", 4)
        for i in range(0, MESSAGES, 100):
            broker.SendMessages(
                broker_pb2.SendMessagesRequest(
                    topic="Crash",
                    messages=[broker_pb2.SendEntry(body=b"m%05d" % j) for j in range(i, i + 100)],
                ),
                timeout=30,
            )
        acked: set[bytes] = set()
        unacked: set[bytes] = set()
        turns = [0]

        def popped_all() -> bool:
            got = _pop(broker, wait_ms=1000)
            turns[0] += 1
            if turns[0] % 2:  # every other batch is acknowledged, the rest stays in flight
                results = _ack(broker, got)
                assert all(r.status == broker_pb2.OK for r in results)
                acked.update(m.body for m in got)
            else:
                unacked.update(m.body for m in got)
            return len(acked) + len(unacked) >= MESSAGES

        wait_for(popped_all, 90, lambda: f"all {MESSAGES} popped ({len(acked | unacked)} so far)",
                 interval_s=0)  # fmt: skip
        assert not acked & unacked and len(acked | unacked) == MESSAGES
        channel.close()
        master.kill()
        master.start()
        assert "crashed=True" in master.log()

        channel = grpc.insecure_channel(master.addr)
        broker = broker_pb2_grpc.BrokerStub(channel)
        again: list[bytes] = []
        attempts: set[int] = set()

        def popped_again() -> bool:
            got = _pop(broker, invisible_ms=60_000, wait_ms=1000)
            again.extend(m.body for m in got)
            attempts.update(m.delivery_attempt for m in got)
            if got:
                _ack(broker, got)
            return not set(again) < unacked

        wait_for(popped_again, 90, lambda: f"the {len(unacked)} unacknowledged ones again "
                 f"({len(unacked - set(again))} not yet)", interval_s=0)  # fmt: skip
        repeated = [body for body in again if body in acked]
        assert not repeated, f"{len(repeated)} acknowledged messages delivered again"
        assert set(again) == unacked, f"{len(unacked - set(again))} unacknowledged ones lost"
        assert len(again) == len(unacked), "each unacknowledged message once"
        assert attempts == {2}
        assert not _pop(broker, wait_ms=2500), "nothing else comes back"

        # Leave some in flight, let the slave catch up, and compare the state
        # each copy of the revive records rebuilds.
        broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="Crash",
                messages=[broker_pb2.SendEntry(body=b"late%d" % i) for i in range(64)],
            ),
            timeout=30,
        )
        in_flight = _pop(broker, invisible_ms=600_000, wait_ms=1000)
        assert in_flight
        end = _max_offset(master.addr)
        wait_for(lambda: _max_offset(slave.addr) == end, 30, "the slave to catch up")
        channel.close()
        master.stop()
        slave.stop()
        on_master = asyncio.run(_replayed(tmp_path / "m", tmp_path / "mcfg"))
        on_slave = asyncio.run(_replayed(tmp_path / "s", tmp_path / "scfg"))
        assert on_master == on_slave
        key_offsets = {o for per_queue in on_master.values() for o in per_queue}
        assert len(key_offsets) and sum(len(v) for v in on_master.values()) == len(in_flight)
    finally:
        master.stop()
        slave.stop()


class _Readable:
    """Every topic of the table is readable (pop's ReadAccess)."""

    def __init__(self, topics) -> None:
        self.topics = topics

    def readable_topic(self, topic: str):
        return self.topics.get(topic)


class _NoTopics:
    """Creates nothing (messaging's TopicCreator): the replay only reads."""

    def create_system_topic(self, config) -> None:
        pass


async def _replayed(store_root: Path, config_dir: Path) -> dict:
    """The in-flight state a broker rebuilds from this store's revive records
    alone (fresh metadata: replay from the first record)."""
    clock = SystemClock()
    store = MessageStore(StoreConfig(root=store_root, commit_log_file_size=FILE), clock)
    await asyncio.to_thread(store.open)
    store.reader.start()
    try:
        metadata = BrokerMetadata.open(config_dir, clock)
        pop = PopService(
            store,
            metadata.topics,
            metadata.subscription_groups,
            metadata.consumer_offsets,
            clock,
            PopConfig("broker-c", revive_topic("DefaultCluster"), (1.0,)),
            access=_Readable(metadata.topics),
            topic_creator=_NoTopics(),
        )
        assert await pop.load() > 0
        return pop.inflight_state()
    finally:
        await store.stop()
