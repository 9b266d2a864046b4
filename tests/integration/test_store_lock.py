"""One broker per store: a second broker process pointed at a store another
broker holds stops before touching it, naming the store and the holder's PID;
the first goes on serving."""

from __future__ import annotations

import subprocess
import sys

import grpc

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.chaos.harness import QUEUES, TOPIC
from tests.conftest import broker_options
from tests.integration.support import REPO, BrokerServer, child_env, create_topic


def test_a_second_broker_on_a_locked_store_fails_at_once_and_the_first_is_untouched(tmp_path):
    store = tmp_path / "store"
    first = BrokerServer(store, broker_options(store))
    try:
        first.start()
        with grpc.insecure_channel(first.addr) as channel:
            create_topic(channel, TOPIC, QUEUES)
            stub = broker_pb2_grpc.BrokerStub(channel)
            before = stub.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"one"))
            files = sorted(p.name for p in (store / "commitlog").iterdir())
            # Another file size too: it must stop at the lock, before it reads
            # (and would refuse) the files.
            other = broker_options(store, mappedFileSizeCommitLog=2 << 20)
            second = subprocess.run(
                [sys.executable, "-m", "services.broker"]
                + [a for option in other for a in ("-o", option)],
                capture_output=True,
                text=True,
                timeout=60,  # a deadline for a process that must exit by itself
                cwd=REPO,
                env=child_env(),
            )
            assert second.returncode == 1, second.stderr
            assert f"the store {store} (storePathRootDir) is in use by another broker" in (
                second.stderr
            )
            assert f"PID {first.proc.pid}" in second.stderr
            # Nothing of the first broker's store changed, and it goes on.
            assert sorted(p.name for p in (store / "commitlog").iterdir()) == files
            after = stub.SendMessage(broker_pb2.SendMessageRequest(topic=TOPIC, body=b"two"))
            assert after.status == broker_pb2.SEND_OK
            assert after.commit_offset > before.commit_offset
    finally:
        first.stop()
