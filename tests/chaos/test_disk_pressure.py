"""Retention under disk pressure on a real small file system: a broker whose
store is a tmpfs a few times smaller than what a producer writes keeps taking
every send as its oldest files go, its disk stays under the warning ratio,
and the newest messages stay readable. (Mounting needs root: skipped where it
is impossible; the same decisions are tested in-process, with an injected
disk, in tests/unit/test_retention.py.)"""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, broker_pb2, broker_pb2_grpc
from tests.chaos.harness import QUEUES, TOPIC
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, create_topic
from tests.waiting import wait_for

FS_BYTES = 64 << 20
FILE_BYTES = 1 << 20
WRITE_BYTES = 4 * FS_BYTES  # several times the file system
BODY = 16000
BATCH = 32


def _mount_tmpfs(path, size_bytes: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


def _used_ratio(path) -> float:
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    return used / (used + st.f_bavail)


def test_a_producer_writing_four_times_the_disk_keeps_succeeding_as_old_files_go(tmp_path):
    disk = tmp_path / "store"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, FS_BYTES):
        pytest.skip("cannot mount a tmpfs here (not root, or not allowed)")
    broker = BrokerServer(
        disk,
        broker_options(
            disk,
            mappedFileSizeCommitLog=FILE_BYTES,
            mappedFileSizeConsumeQueue=20 * 4096,
            maxMessageSize=64 * 1024,
            fileReservedTime=72,  # nothing expires: only disk pressure deletes
            cleanResourceInterval=200,
            deleteCommitLogFilesInterval=0,  # 1 MiB files: spacing them would cap deletion at the write rate
            # RocketMQ's defaults, which this test is about (broker_options raises them).
            diskMaxUsedSpaceRatio=75,
            diskSpaceCleanForciblyRatio=85,
            diskSpaceWarningLevelRatio=90,
        ),
    )
    try:
        broker.start()
        with grpc.insecure_channel(broker.addr) as channel:
            create_topic(channel, TOPIC, QUEUES)
            stub = broker_pb2_grpc.BrokerStub(channel)
            peak = 0.0
            written = 0
            last: dict[
                int, tuple[int, bytes]
            ] = {}  # queue -> (queue offset, body) of its last batch
            n = 0
            while written < WRITE_BYTES:
                queue_id = n % QUEUES
                body = (b"%08d" % n) * (BODY // 8)
                r = stub.SendMessages(
                    broker_pb2.SendMessagesRequest(
                        topic=TOPIC,
                        queue_id=queue_id,
                        messages=[broker_pb2.SendEntry(body=body)] * BATCH,
                    ),
                    timeout=30,
                )
                assert r.status == broker_pb2.SEND_OK, (n, r.status)
                last[queue_id] = (r.queue_offset + BATCH - 1, body)
                written += BATCH * BODY
                n += 1
                peak = max(peak, _used_ratio(disk))
                # Above diskMaxUsedSpaceRatio (75 %) retention deletes the oldest files at
                # each check (every 200 ms). On a loaded machine the writer can be scheduled
                # far more often than the cleaner: past 85 %, wait for its next deletion
                # rather than outrun it (the point is what retention does, not a race with
                # the scheduler). One batch (0.5 MiB, under 1 % of the file system) cannot
                # cross from 85 % to the 90 % warning ratio.
                if _used_ratio(disk) > 0.85:
                    wait_for(lambda: _used_ratio(disk) <= 0.85, 30, "retention to free files")
            assert peak < 0.90, f"the disk reached {peak:.1%}, above the 90 % warning ratio"
            info = broker_admin_pb2_grpc.BrokerAdminStub(channel).GetBrokerRuntimeInfo(
                broker_admin_pb2.GetBrokerRuntimeInfoRequest(), timeout=10
            )
            assert info.commit_log_min_offset > 0  # the oldest files went
            assert info.commit_log_max_offset >= WRITE_BYTES
            for queue_id, (offset, body) in last.items():
                pulled = stub.PullMessage(
                    broker_pb2.PullMessageRequest(
                        consumer_group="pressure", topic=TOPIC, queue_id=queue_id,
                        queue_offset=offset, max_msg_nums=1,
                    ),
                    timeout=10,
                )  # fmt: skip
                assert pulled.status == broker_pb2.FOUND and pulled.messages[0].body == body
            old = stub.PullMessage(
                broker_pb2.PullMessageRequest(
                    consumer_group="pressure", topic=TOPIC, queue_id=0, queue_offset=0,
                    max_msg_nums=1,
                ),
                timeout=10,
            )  # fmt: skip
            assert old.status == broker_pb2.OFFSET_MOVED and old.next_begin_offset > 0
        assert "retention deleted commit-log file" in broker.log()
        assert "refusing sends" not in broker.log()
    finally:
        broker.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
