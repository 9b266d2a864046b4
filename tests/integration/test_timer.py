"""Timed delivery at scale: 10,000 messages due at random moments in the next
30 s, the broker restarted in the middle: none early, none lost, none twice;
the p99 lateness is printed."""

from __future__ import annotations

import random
import time

from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.integration import support
from tests.waiting import wait_for

COUNT = 10_000
SPREAD_MS = 30_000


def test_10000_timed_messages_survive_a_restart_none_early_none_lost(loop_thread, tmp_path):
    store = tmp_path / "store"
    options = dict(brokerName="broker-t", mappedFileSizeCommitLog=16 << 20)
    b = start_broker(loop_thread, store, **options)
    rng = random.Random(11)
    due: dict[bytes, int] = {}
    try:
        support.create_topic(b.channel, "Timed", 4)
        now = int(time.time() * 1000)
        bodies = [b"timed-%05d" % i for i in range(COUNT)]
        for body in bodies:
            due[body] = now + 1000 + rng.randrange(SPREAD_MS)
        for i in range(0, COUNT, 500):
            r = b.broker.SendMessages(
                broker_pb2.SendMessagesRequest(
                    topic="Timed",
                    messages=[
                        broker_pb2.SendEntry(
                            body=body, properties={"TIMER_DELIVER_MS": str(due[body])}
                        )
                        for body in bodies[i : i + 500]
                    ],
                ),
                timeout=30,
            )
            assert r.status == broker_pb2.SEND_OK
        received: dict[bytes, int] = {}  # body -> store timestamp of the delivered copy
        duplicates = 0
        lateness: list[int] = []
        restarted = False

        def received_all() -> bool:
            nonlocal b, restarted, duplicates
            if not restarted and len(received) >= COUNT // 3:
                b.stop()  # a restart in the middle: pending timers come back from the log
                b = start_broker(loop_thread, store, **options)
                restarted = True
            r = b.broker.PopMessage(
                broker_pb2.PopMessageRequest(
                    consumer_group="timed",
                    topic="Timed",
                    max_msg_nums=32,
                    invisible_ms=60_000,
                    max_wait_ms=500,
                ),  # fmt: skip
                timeout=30,
            )
            if not r.messages:
                return False
            arrived = int(time.time() * 1000)
            for m in r.messages:
                if m.body in received:
                    duplicates += 1
                received[m.body] = m.store_timestamp
                lateness.append(arrived - due[m.body])
            b.broker.AckMessage(
                broker_pb2.AckMessageRequest(
                    consumer_group="timed",
                    topic="Timed",
                    receipt_handles=[m.receipt_handle for m in r.messages],
                )
            )
            return len(received) >= COUNT

        wait_for(received_all, SPREAD_MS / 1000 + 90,
                 lambda: f"{COUNT} timed messages ({len(received)} so far)",
                 interval_s=0)  # fmt: skip
        assert restarted
        missing = COUNT - len(received)
        assert missing == 0, f"{missing} timed messages lost"
        early = [body for body, stored in received.items() if stored < due[body]]
        assert not early, f"{len(early)} delivered early, e.g. {early[:3]}"
        assert duplicates == 0
        lateness.sort()
        p50, p99 = lateness[len(lateness) // 2], lateness[int(len(lateness) * 0.99)]
        print(
            f"\ntimer lateness (receive - due): p50 {p50} ms, p99 {p99} ms, max {lateness[-1]} ms"
        )
    finally:
        b.stop()
