"""SIGKILL a broker whose message index spans several files: after the restart the newest
index file is dropped and indexed again from the commit log, and every key is found."""

from __future__ import annotations

import grpc

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.conftest import broker_options
from tests.integration.support import BrokerServer, create_topic
from tests.waiting import wait_for

MESSAGES = 6000
BATCH = 500


def query(broker: broker_pb2_grpc.BrokerStub, key: str) -> list[int]:
    request = broker_pb2.QueryMessageByKeyRequest(topic="Idx", key=key)
    return [m.commit_offset for m in broker.QueryMessageByKey(request, timeout=5).messages]


def test_sigkill_then_the_index_is_rebuilt(tmp_path):
    options = broker_options(
        tmp_path / "store",
        mappedFileSizeCommitLog=256 * 1024,
        maxHashSlotNum=500,
        maxIndexNum=2500,
    )
    server = BrokerServer(tmp_path / "store", options).start()
    offsets: list[int] = []
    try:
        with grpc.insecure_channel(server.addr) as channel:
            broker = broker_pb2_grpc.BrokerStub(channel)
            create_topic(channel, "Idx", 2)
            for first in range(0, MESSAGES, BATCH):
                r = broker.SendMessages(
                    broker_pb2.SendMessagesRequest(
                        topic="Idx",
                        messages=[
                            broker_pb2.SendEntry(body=b"m%d" % i, keys=f"k{i}")
                            for i in range(first, first + BATCH)
                        ],
                    ),
                    timeout=10,
                )
                offsets += [int(m[16:], 16) for m in r.msg_ids]
            wait_for(lambda: query(broker, f"k{MESSAGES - 1}"), 20, "the last key indexed")
        files = sorted(p.name for p in (tmp_path / "store" / "index").iterdir())
        assert len(files) >= 3
        server.kill()

        server.start()
        with grpc.insecure_channel(server.addr) as channel:
            broker = broker_pb2_grpc.BrokerStub(channel)
            wait_for(lambda: query(broker, f"k{MESSAGES - 1}"), 20, "the last key indexed again")
            for i in range(0, MESSAGES, 7):
                assert query(broker, f"k{i}") == [offsets[i]], i
        log = server.log()
        assert "crashed=True" in log
        assert f"index: dropping {files[-1]} (the broker did not stop cleanly)" in log
    finally:
        server.stop()
