"""`Producers`: threads that send to whatever the name server says is broker-a's master
(id 0), or to one pinned address (a probe of a deposed master), and record every attempt
(`Attempt`): the message key, the attempt's own body, when the send started and when its
answer came back (one monotonic clock for all), where it went, the status and what the
broker said it stored (msg id, queue id, queue offset, commit offset). A message is
retried, with a new body, until it is SEND_OK or the broker says it stored it short of
that (FLUSH_SLAVE_TIMEOUT and the like: Apache's producer does not resend those either).

The records are the history `history.check_history` judges; nothing here asserts on
the group.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import grpc

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.failover.config import CHANNEL_OPTIONS, PACE_S, PATIENCE_S, SEND_TIMEOUT_S, TOPIC
from tests.waiting import wait_for

# Answers that say the message is stored but not as durably as asked (its flush or its
# slaves did not confirm in time): the producer moves on, it does not resend.
STORED_UNACKNOWLEDGED = frozenset(
    {"FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}
)


@dataclass
class Attempt:
    """One send, as its producer saw it (times: time.monotonic())."""

    worker: int
    key: str
    attempt: int
    body: bytes
    addr: str
    start: float
    end: float = 0.0
    status: str = ""  # a SendStatus name, or the gRPC status code's name
    detail: str = ""
    msg_id: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    commit_offset: int = -1
    topic: str = TOPIC

    @property
    def ok(self) -> bool:
        return self.status == "SEND_OK"

    def __str__(self) -> str:
        return (
            f"{self.key}#{self.attempt} ({self.topic}) to {self.addr} "
            f"[{self.start:.3f}, {self.end:.3f}] "
            f"{self.status} at {self.commit_offset} (queue {self.queue_id}:{self.queue_offset})"
        )


class Producers:
    """Threads sending one message at a time (SYNC: each waits for its answer)
    to `topic`; `name` prefixes their keys (unique across a test's producers)."""

    def __init__(
        self,
        resolve: Callable[[], str | None],
        count: int = 3,
        pinned: str | None = None,
        name: str = "p",
        topic: str = TOPIC,
    ) -> None:
        self.resolve = resolve
        self.count = count
        self.pinned = pinned
        self.name = name
        self.topic = topic
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = [0] * count
        self._futures: list[grpc.Future] = []
        self._channels: list[grpc.Channel] = []

    def start(self) -> Producers:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{self.name}{i}", daemon=True)
            for i in range(self.count)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(SEND_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in self._threads), "a producer thread did not stop"
        self._threads = []
        for future in self._futures:
            with contextlib.suppress(Exception):
                future.exception(SEND_TIMEOUT_S + 5)
        assert all(f.done() for f in self._futures), "an asynchronous send was never answered"
        for channel in self._channels:
            channel.close()
        self._futures, self._channels = [], []

    def send_async(self, addr: str) -> None:
        """One more send to `addr`, answered whenever (recorded then): a send
        that surely starts now, while the workers may all be waiting."""
        channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self._channels.append(channel)
        key = f"{self.name}async-{len(self._futures)}"
        a = Attempt(-1, key, 1, f"{key}#1|".encode(), addr, time.monotonic(), topic=self.topic)
        future = broker_pb2_grpc.BrokerStub(channel).SendMessage.future(
            broker_pb2.SendMessageRequest(topic=self.topic, body=a.body, keys=key),
            timeout=SEND_TIMEOUT_S,
        )

        def done(f) -> None:
            a.end = time.monotonic()
            try:
                r = f.result()
            except grpc.RpcError as exc:
                a.status, a.detail = exc.code().name, exc.details() or ""
            else:
                a.status = broker_pb2.SendStatus.Name(r.status)
                a.msg_id, a.queue_id = r.msg_id, r.queue_id
                a.queue_offset, a.commit_offset = r.queue_offset, r.commit_offset
            with self._lock:
                self.attempts.append(a)

        future.add_done_callback(done)
        self._futures.append(future)

    def _run(self, worker: int) -> None:
        channels: dict[str, grpc.Channel] = {}
        key, attempt, addr = "", 0, None
        try:
            while not self._stop.is_set():
                if not key:
                    self._seq[worker] += 1
                    key, attempt = f"{self.name}{worker}-{self._seq[worker]}", 0
                if addr is None:
                    addr = self.pinned or self.resolve()
                    if addr is None:
                        self._stop.wait(0.02)
                        continue
                attempt += 1
                body = f"{key}#{attempt}|".encode() + os.urandom(8).hex().encode() * (
                    1 + self._seq[worker] % 8
                )
                if addr not in channels:
                    channels[addr] = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
                stub = broker_pb2_grpc.BrokerStub(channels[addr])
                a = Attempt(worker, key, attempt, body, addr, time.monotonic(), topic=self.topic)
                try:
                    r = stub.SendMessage(
                        broker_pb2.SendMessageRequest(topic=self.topic, body=body, keys=key),
                        timeout=SEND_TIMEOUT_S,
                    )
                except grpc.RpcError as exc:
                    a.end = time.monotonic()
                    a.status, a.detail = exc.code().name, exc.details() or ""
                else:
                    a.end = time.monotonic()
                    a.status = broker_pb2.SendStatus.Name(r.status)
                    a.msg_id, a.queue_id = r.msg_id, r.queue_id
                    a.queue_offset, a.commit_offset = r.queue_offset, r.commit_offset
                with self._lock:
                    self.attempts.append(a)
                if a.ok or a.status in STORED_UNACKNOWLEDGED:
                    # As Apache's producer by default (retryAnotherBrokerWhenNotStoreOK
                    # off): a message the broker says it stored, short of the promise,
                    # is not sent again; resending it would store it twice by choice.
                    key = ""
                    self._stop.wait(PACE_S)
                    continue
                if self.pinned is None:
                    addr = None  # ask the name server again
                self._stop.wait(0.02)
        finally:
            for ch in channels.values():
                ch.close()

    # ------------------------------------------------------------ reading the records

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def acked(self) -> list[Attempt]:
        return [a for a in self.snapshot() if a.ok]

    def wait_acked(self, n: int, timeout_s: float = PATIENCE_S, addr: str | None = None) -> None:
        """Until `n` more sends are SEND_OK (from `addr`, if given)."""

        def count() -> int:
            return sum(1 for a in self.acked() if addr is None or a.addr == addr)

        start = count()
        wait_for(lambda: count() >= start + n, timeout_s,
                 f"{n} more SEND_OK" + (f" from {addr}" if addr else ""))  # fmt: skip

    def first_ok(self, addr: str, after: float) -> Attempt | None:
        """The first SEND_OK answer from `addr` among sends started after `after`."""
        oks = [a for a in self.acked() if a.addr == addr and a.start > after]
        return min(oks, key=lambda a: a.end, default=None)

    def wait_first_ok(self, addr: str, after: float, timeout_s: float) -> Attempt:
        return wait_for(lambda: self.first_ok(addr, after), timeout_s,
                        f"a SEND_OK from {addr}")  # fmt: skip

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for a in self.snapshot():
            out[a.status] += 1
        return dict(out)

    def rare_details(self, below: int = 20) -> dict[str, list[str]]:
        """For each status answered fewer than `below` times (a surprise worth
        a look, e.g. CANCELLED): the address, the wall-clock time of the
        answer (to find it in the members' logs) and the detail of each."""
        wall = time.time() - time.monotonic()
        counts = self.statuses()
        out: dict[str, list[str]] = defaultdict(list)
        for a in self.snapshot():
            if counts[a.status] < below and a.status != "SEND_OK":
                at = datetime.fromtimestamp(wall + a.end).strftime("%H:%M:%S.%f")[:-3]
                out[a.status].append(f"{a.addr} at {at}: {a.detail!r}")
        return dict(out)
