"""Clients end without asyncio or grpc noise on stderr: the `ferry` commands
that send and consume, and PipelinedProducers closed one after another in one
process (as the benchmarks run them) — each producer's loop closes only after
its tasks and gRPC calls have ended. Before, a user saw "Task was destroyed
but it is pending!" after `ferry send --count N`, and "Exception in callback
PollerCompletionQueue._handle_events ... Event loop is closed" tracebacks
from a benchmark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ferry.client.namesrv import NamesrvClient
from tests.integration import support
from tests.waiting import wait_for

NOISE = ("Task was destroyed", "Exception in callback", "Event loop is closed", "Traceback")

# Eight producers at a time, each closed while the others' loops still run:
# grpc's process-wide poller hands a closed loop's late events to a live one.
PRODUCERS_CHILD = """
import sys
from ferry.client.namesrv import NamesrvClient
from ferry.client.producer import PipelinedProducer
from ferry.v1 import broker_pb2

namesrv, topic = sys.argv[1:3]
ok = 0
for _ in range(3):
    producers = [PipelinedProducer(NamesrvClient([namesrv]), max_in_flight=64) for _ in range(8)]
    futures = [p.send_async(topic, b"x" * 128) for _ in range(300) for p in producers]
    for p in producers:
        p.close()
    ok += sum(f.result().result.status == broker_pb2.SEND_OK for f in futures)
print(ok)
"""


def quiet(stderr: str) -> list[str]:
    return [noise for noise in NOISE if noise in stderr]


@pytest.fixture
def topic(two_brokers) -> tuple[object, str]:
    """(the name server, the topic)."""
    ns, brokers = two_brokers
    for b in brokers:
        support.create_topic(b.channel, "Quiet", 4)
    with NamesrvClient([ns.addr]) as nsc:
        wait_for(lambda: len(nsc.route("Quiet").queue_datas) == 2, 10, "Quiet's route")
    return ns, "Quiet"


def test_cli_send_and_consume_end_quietly(topic):
    namesrv, name = topic
    n = ("-n", namesrv.remoting_addr)
    runs = [
        # Pipelined (a PipelinedProducer on its own loop): three runs, as the
        # noise came at about one exit in three.
        *[("send", name, "--count", "2000", *n)] * 3,
        ("send", name, "--count", "200", "--batch", "50", *n),
        ("send", name, "--body", "one", *n),
        ("consume", name, "-g", "pull", "--pull", "--from-beginning", "--max", "100", *n),
        ("consume", name, "-g", "pop", "--max", "100", *n),
    ]
    for args in runs:
        result = support.run_ferry(*args, timeout_s=60)
        assert result.returncode == 0, (args, result.stderr)
        assert quiet(result.stderr) == [], (args, result.stderr)
    assert "SEND_OK=2000" in support.run_ferry("send", name, "--count", "2000", *n).stdout


def test_pipelined_producers_closed_in_one_process_end_quietly(topic):
    namesrv, name = topic
    result = subprocess.run(
        [sys.executable, "-c", PRODUCERS_CHILD, namesrv.addr, name],
        capture_output=True, text=True, timeout=120, cwd=support.REPO, env=support.child_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(3 * 8 * 300)]
    assert quiet(result.stderr) == [], result.stderr[-3000:]
