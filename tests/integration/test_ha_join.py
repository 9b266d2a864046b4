"""How a slave joins: an empty slave starts at the master's last file (or its
oldest with haSyncFrom=minOffset); a slave behind the master's retention is
refused with a reason (legacy) or resyncs by itself (handshake); metadata
sync merges offsets without rewinding them and never shows a half table."""

from __future__ import annotations

import shutil
import threading

from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.integration.test_broker_grpc import create_topic
from tests.waiting import wait_for

FILE = 128 * 1024


def master_with_three_files(loop_thread, path, **keys):
    m = start_broker(
        loop_thread,
        path,
        brokerName="broker-j",
        mappedFileSizeCommitLog=FILE,
        haListenPort=0,
        **keys,
    )
    create_topic(m, "J", queues=1)
    while len(m.app.store.commit_log.segment_starts()) < 3:
        m.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="J", messages=[broker_pb2.SendEntry(body=b"x" * 500) for _ in range(20)]
            )
        )
    return m


def slave_of(loop_thread, path, master, **keys):
    return start_broker(
        loop_thread,
        path,
        brokerName="broker-j",
        brokerRole="SLAVE",
        brokerId=1,
        mappedFileSizeCommitLog=FILE,
        haMasterAddress=f"127.0.0.1:{master.app.ha_master.port}",
        haReconnectInterval=200,
        **keys,
    )


def test_empty_slave_starts_at_the_masters_last_file(loop_thread, tmp_path):
    master = master_with_three_files(loop_thread, tmp_path / "m")
    slave = slave_of(loop_thread, tmp_path / "s", master)
    try:
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to catch up")
        starts = master.app.store.commit_log.segment_starts()
        assert slave.app.store.commit_log.segment_starts() == starts[-1:]
        assert slave.app.store.min_offset == starts[-1]
        # Its consume queue begins where its log begins.
        wait_for(lambda: slave.app.store.dispatcher.behind_bytes == 0, 10, "dispatch")
        assert slave.app.store.queue_max_offset("J", 0) == master.app.store.queue_max_offset("J", 0)
        assert slave.app.store.queue_min_offset("J", 0) > 0
    finally:
        slave.stop()
        master.stop()


def test_sync_from_min_offset_copies_every_file(loop_thread, tmp_path):
    master = master_with_three_files(loop_thread, tmp_path / "m", haSyncFrom="minOffset")
    slave = slave_of(loop_thread, tmp_path / "s", master)
    try:
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to catch up")
        assert (
            slave.app.store.commit_log.segment_starts()
            == master.app.store.commit_log.segment_starts()
        )
    finally:
        slave.stop()
        master.stop()


def test_handshake_resyncs_a_slave_behind_retention(loop_thread, tmp_path):
    keys = {"haSecret": "s", "haSyncFrom": "minOffset"}
    master = master_with_three_files(loop_thread, tmp_path / "m", **keys)
    slave = slave_of(loop_thread, tmp_path / "s", master, haSecret="s")
    wait_for(lambda: slave.app.store.max_offset == master.app.store.max_offset, 10, "catch up")
    slave.stop()
    # The slave falls behind: more data, then retention drops what it has.
    for _ in range(3):
        master.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="J", messages=[broker_pb2.SendEntry(body=b"y" * 500) for _ in range(240)]
            )
        )
    master.stop()
    files = sorted((tmp_path / "m" / "commitlog").iterdir())
    slave_end_file = max(p.name for p in (tmp_path / "s" / "commitlog").iterdir())
    for f in files:
        if f.name <= slave_end_file:
            f.unlink()
    shutil.rmtree(tmp_path / "m" / "consumequeue")
    (tmp_path / "m" / "checkpoint").unlink()
    master = start_broker(
        loop_thread,
        tmp_path / "m",
        brokerName="broker-j",
        mappedFileSizeCommitLog=FILE,
        haListenPort=0,
        **keys,
    )
    slave = slave_of(loop_thread, tmp_path / "s", master, haSecret="s")
    try:
        assert master.app.store.min_offset > 0
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to resync")
        assert slave.app.ha_slave.resyncs == 1
        assert slave.app.store.min_offset == master.app.store.min_offset
        assert master.app.ha_master.out_of_range_closes == 1
    finally:
        slave.stop()
        master.stop()


def test_legacy_master_refuses_a_slave_behind_retention(loop_thread, tmp_path):
    master = master_with_three_files(loop_thread, tmp_path / "m", haSyncFrom="minOffset")
    slave = slave_of(loop_thread, tmp_path / "s", master)
    wait_for(lambda: slave.app.store.max_offset == master.app.store.max_offset, 10, "catch up")
    slave.stop()
    for _ in range(3):
        master.broker.SendMessages(
            broker_pb2.SendMessagesRequest(
                topic="J", messages=[broker_pb2.SendEntry(body=b"y" * 500) for _ in range(240)]
            )
        )
    master.stop()
    slave_end_file = max(p.name for p in (tmp_path / "s" / "commitlog").iterdir())
    for f in sorted((tmp_path / "m" / "commitlog").iterdir()):
        if f.name <= slave_end_file:
            f.unlink()
    shutil.rmtree(tmp_path / "m" / "consumequeue")
    (tmp_path / "m" / "checkpoint").unlink()
    master = start_broker(
        loop_thread, tmp_path / "m", brokerName="broker-j", mappedFileSizeCommitLog=FILE, haListenPort=0,
        haSyncFrom="minOffset",
    )  # fmt: skip
    slave = slave_of(loop_thread, tmp_path / "s", master)
    try:
        wait_for(lambda: master.app.ha_master.out_of_range_closes >= 1, 10, "the refusal")
        before = slave.app.store.max_offset
        assert before < master.app.store.min_offset  # nothing appended out of place
        assert not master.app.ha_master.connections
    finally:
        slave.stop()
        master.stop()


def test_slave_offsets_are_merged_max_wins_and_topics_never_half_visible(loop_thread, tmp_path, ns):
    common = {
        "mappedFileSizeCommitLog": FILE,
        "haListenPort": 0,
        "slaveSyncDelay": 0,
        "slaveSyncInterval": 100,
    }
    master = start_broker(
        loop_thread, tmp_path / "m", ns.remoting_addr, brokerName="broker-o", **common
    )
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerName="broker-o", brokerRole="SLAVE", brokerId=1,
        slaveReadEnable="true", **common,
    )  # fmt: skip
    try:
        for i in range(20):
            create_topic(master, f"T{i}", queues=2)
        wait_for(
            lambda: slave.app.metadata.topics.get("T19") is not None, 10, "topics on the slave"
        )
        # Readers on the slave while the master keeps changing its table.
        missing = []
        stop = threading.Event()

        def read():
            while not stop.is_set():
                if loop_thread.call(lambda: slave.app.metadata.topics.get("T0")) is None:
                    missing.append(1)

        reader = threading.Thread(target=read)
        reader.start()
        for i in range(20, 30):
            create_topic(master, f"T{i}", queues=2)
        wait_for(lambda: slave.app.metadata.topics.get("T29") is not None, 10, "new topics")
        stop.set()
        reader.join()
        assert not missing
        # An offset committed on the master, then a higher one on the slave.
        master.broker.UpdateConsumerOffset(
            broker_pb2.UpdateConsumerOffsetRequest(
                consumer_group="G", topic="T1", queue_id=0, offset=5
            )
        )
        wait_for(
            lambda: slave.app.metadata.consumer_offsets.query("G", "T1", 0) == 5, 10, "offset sync"
        )
        slave.broker.UpdateConsumerOffset(
            broker_pb2.UpdateConsumerOffsetRequest(
                consumer_group="G", topic="T1", queue_id=0, offset=9
            )
        )
        rounds = slave.app.slave_sync.rounds
        wait_for(lambda: slave.app.slave_sync.rounds >= rounds + 2, 10, "two more sync rounds")
        assert slave.app.metadata.consumer_offsets.query("G", "T1", 0) == 9  # not rewound to 5
    finally:
        slave.stop()
        master.stop()


def test_slave_started_before_its_master_finds_it_without_waiting_a_period(
    loop_thread, tmp_path, ns
):
    """Pods start in parallel: a slave whose master had not registered yet asks
    the name server again within seconds, not after registerNameServerPeriod."""
    from services.broker.cluster import registration

    common = {"mappedFileSizeCommitLog": FILE, "haListenPort": 0, "brokerName": "broker-p"}
    slave = start_broker(
        loop_thread, tmp_path / "s", ns.remoting_addr, brokerRole="SLAVE", brokerId=1,
        registerNameServerPeriod=30_000, haReconnectInterval=200, **common,
    )  # fmt: skip
    master = None
    try:
        assert slave.app.config.register_period_s == 30.0
        master = start_broker(loop_thread, tmp_path / "m", ns.remoting_addr, **common)
        create_topic(master, "P", queues=1)
        master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="P", body=b"p"))
        end = master.app.store.max_offset
        # Within two re-registrations (plus the reconnect), far below the 30 s period.
        limit = 2 * registration.MASTERLESS_REREGISTER_S + 3
        wait_for(lambda: slave.app.store.max_offset == end, limit, "the slave to find its master")
    finally:
        if master is not None:
            master.stop()
        slave.stop()


def test_a_master_only_one_name_server_knows_is_kept(loop_thread, tmp_path, ns):
    """Name servers do not talk to each other: while one has not heard from the
    master, its answer ("no master") must not override the one that has."""
    from tests.conftest import start_namesrv

    other = start_namesrv(loop_thread, tmp_path / "namesrv-2", metrics_port=-1)
    common = {"mappedFileSizeCommitLog": FILE, "haListenPort": 0, "brokerName": "broker-q"}
    master = start_broker(
        loop_thread, tmp_path / "m", ns.remoting_addr, **common
    )  # only `ns` knows it
    slave = start_broker(
        loop_thread, tmp_path / "s", f"{other.remoting_addr};{ns.remoting_addr}", brokerRole="SLAVE",
        brokerId=1, haReconnectInterval=200, **common,
    )  # fmt: skip
    try:
        ha = f"127.0.0.1:{master.app.ha_master.port}"
        for _ in range(5):  # each round gets both answers, in either order
            loop_thread.run(slave.app.registrar.register_all(force=True))
            assert slave.app.ha_slave.master_addr == ha
        create_topic(master, "Q", queues=1)
        master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Q", body=b"q"))
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to replicate")
    finally:
        slave.stop()
        master.stop()
        other.stop()


def test_master_known_then_unknown_in_one_turn_does_not_stop_replication(loop_thread, tmp_path):
    """Two registration answers in one event-loop turn (a master address, then
    none) once killed the slave's HA task; the next address must still work."""
    master = master_with_three_files(loop_thread, tmp_path / "m")
    slave = start_broker(
        loop_thread, tmp_path / "s", brokerName="broker-j", brokerRole="SLAVE", brokerId=1,
        mappedFileSizeCommitLog=FILE, haReconnectInterval=200,
    )  # fmt: skip
    try:
        ha = f"127.0.0.1:{master.app.ha_master.port}"
        hs = slave.app.ha_slave
        loop_thread.call(lambda: (hs.set_master(ha), hs.set_master("")))
        # The HA task, woken by the first answer, was queued on the loop before this
        # call: when it returns, the task has run and found no master.
        loop_thread.call(lambda: None)
        assert not hs._task.done(), hs._task
        loop_thread.call(lambda: hs.set_master(ha))
        end = master.app.store.max_offset
        wait_for(lambda: slave.app.store.max_offset == end, 10, "the slave to catch up")
    finally:
        slave.stop()
        master.stop()
