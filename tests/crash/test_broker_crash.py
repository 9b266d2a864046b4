"""SIGKILL a broker while producers send with SYNC_FLUSH: after a restart,
every acknowledged message is readable at its queue offset, byte-equal."""

from __future__ import annotations

import os
import threading
import time

import grpc

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, create_topic, pull_all
from tests.waiting import wait_for

PRODUCERS = 4
QUEUES = 4
SEND_WINDOW_S = 1.5  # producers run this long before the kill


def test_sigkill_under_sync_flush_loses_no_acknowledged_message(tmp_path):
    options = broker_options(
        tmp_path / "store", flushDiskType="SYNC_FLUSH", mappedFileSizeCommitLog=256 * 1024
    )
    server = BrokerServer(tmp_path / "store", options).start()
    acked: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []
    stop = threading.Event()
    killed = threading.Event()
    try:
        channel = grpc.insecure_channel(server.addr)
        broker = broker_pb2_grpc.BrokerStub(channel)
        create_topic(channel, "Crash", QUEUES)

        def produce(worker: int) -> None:
            n = 0
            while not stop.is_set():
                body = f"w{worker}-n{n}-".encode() + os.urandom(24 + n % 300)
                try:
                    r = broker.SendMessage(
                        broker_pb2.SendMessageRequest(topic="Crash", body=body), timeout=5
                    )
                except grpc.RpcError as exc:
                    if killed.is_set():  # in flight at the kill: not acknowledged
                        return
                    errors.append(f"{exc.code().name}: {exc.details()}")
                    return
                if r.status == broker_pb2.SEND_OK:
                    acked[(r.queue_id, r.queue_offset)] = body
                n += 1

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 200, 20, "200 acknowledged sends")
        time.sleep(SEND_WINDOW_S)  # keep sending right up to the kill
        killed.set()
        server.kill()
        stop.set()
        for t in threads:
            t.join(10)
        channel.close()
        assert not errors, errors[:3]
        assert len(acked) >= 200

        server.start()
        with grpc.insecure_channel(server.addr) as channel:
            found = pull_all(channel, "Crash", QUEUES)
        missing = [k for k in acked if k not in found]
        different = [k for k in acked if k in found and found[k] != acked[k]]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost"
        assert not different, f"{len(different)} messages differ"
        assert "crashed=True" in server.log()
    finally:
        stop.set()
        server.stop()
