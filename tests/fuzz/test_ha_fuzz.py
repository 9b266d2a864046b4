"""Random and mutated HA traffic against a live master and a live slave.

- Master: raw connections to its HA port send random bytes, reports with
  random offsets and (with haSecret) HELLOs with flipped bits or cut short. The
  master must stay up, leave its commit log untouched, and still replicate to
  a real slave, byte-identical.
- Slave: a fake master (the test) answers each slave connection with frames
  that are valid (the next record at the slave's end) or bad (a wrong
  offset, a negative or oversized length, a header or body cut short, random
  bytes). The slave must append exactly the valid frames before the first bad
  one, nothing else, at exactly their offsets, and reconnect.

Inputs (frames, reports, handshakes) come from FERRY_HA_FUZZ_INPUTS (default
2,000 per side in `make test`; `make fuzz` runs 100,000). A frame whose header
is right but whose body bytes are wrong cannot be told from data at this layer
(RocketMQ's protocol has no frame checksum; the records' own CRCs are checked
when they are read), so bodies are mutated only together with their headers."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import struct

import pytest

from ferry import record
from ferry.v1 import broker_pb2
from services.ha import protocol
from tests.conftest import start_broker
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_ha_faults import FakeMaster
from tests.integration.test_replication import ha_status
from tests.waiting import wait_for

INPUTS = int(os.environ.get("FERRY_HA_FUZZ_INPUTS", "2000"))
FILE = 64 * 1024 * 1024
SECRET = "fuzz-secret"


def log_digest(store) -> str:
    h = hashlib.sha256()
    for f in sorted((store / "commitlog").iterdir()):
        h.update(f.read_bytes())
    return h.hexdigest()


def _master(loop_thread, path, **keys):
    return start_broker(
        loop_thread, path, brokerName="broker-h", brokerRole="ASYNC_MASTER", haListenPort=0,
        mappedFileSizeCommitLog=1 << 20, **keys,
    )  # fmt: skip


def _flip(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        i = rnd.randrange(len(b))
        b[i] ^= 1 << rnd.randrange(8)
    return bytes(b)


@pytest.mark.parametrize("secret", ["", SECRET], ids=["legacy", "handshake"])
def test_master_survives_random_and_mutated_ha_input(loop_thread, tmp_path, secret):
    keys = {"haSecret": secret} if secret else {}
    master = _master(loop_thread, tmp_path / "m", **keys)
    rnd = random.Random(f"master-{secret}")
    try:
        create_topic(master, "H", queues=1)
        for i in range(50):
            master.broker.SendMessage(broker_pb2.SendMessageRequest(topic="H", body=b"m%d" % i))
        end = master.app.store.max_offset
        digest = log_digest(tmp_path / "m")
        port = master.app.ha_master.port
        sent = connections = 0
        while sent < INPUTS:
            connections += 1
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(0.5)
                chunks = []
                if secret:
                    challenge = protocol.decode_challenge(s.recv(protocol.CHALLENGE_SIZE))
                    hello = protocol.encode_hello(
                        secret.encode(), challenge, "broker-h", 1, rnd.choice([0, end, end + 1])
                    )
                    kind = rnd.random()
                    if kind < 0.4:
                        chunks.append(_flip(hello, rnd))
                    elif kind < 0.7:
                        chunks.append(hello[: rnd.randrange(len(hello))])
                    else:
                        chunks.append(hello)  # a good one, then garbage reports
                    sent += 1
                for _ in range(rnd.randint(1, 40)):
                    kind = rnd.random()
                    if kind < 0.5:
                        offset = rnd.choice([-1, 0, end, end + 1, 2**63 - 1, -(2**63),
                                             rnd.randrange(-(2**63), 2**63)])  # fmt: skip
                        chunks.append(struct.pack(">q", offset))
                    else:
                        chunks.append(os.urandom(rnd.randint(1, 64)))
                    sent += 1
                try:
                    s.sendall(b"".join(chunks))
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):
                        pass
                except (TimeoutError, ConnectionResetError, BrokenPipeError):
                    pass
        print(f"\nha fuzz (master, {secret and 'handshake' or 'legacy'}): {sent} inputs over "
              f"{connections} connections")  # fmt: skip
        wait_for(lambda: not ha_status(master).connections, 10, "the fuzz connections to go")
        assert master.app.store.max_offset == end
        assert log_digest(tmp_path / "m") == digest  # not one byte of the log changed
        # And it still replicates to a real slave.
        slave = start_broker(
            loop_thread, tmp_path / "s", brokerName="broker-h", brokerRole="SLAVE", brokerId=1,
            mappedFileSizeCommitLog=1 << 20, haReconnectInterval=100, haSyncFrom="minOffset",
            haMasterAddress=f"127.0.0.1:{port}", **keys,
        )  # fmt: skip
        try:
            wait_for(lambda: slave.app.store.max_offset == end, 10, "a real slave to catch up")
            assert log_digest(tmp_path / "s") == digest
        finally:
            slave.stop()
    finally:
        master.stop()


def _record(commit_offset: int, n: int) -> bytes:
    return record.encode_raw(
        b"F", 0, n, 0, commit_offset, 0, 1, record.pack_host(("127.0.0.1", 1)),
        2, record.pack_host(("127.0.0.1", 2)), b"fuzz-%d" % n, b"",
    )  # fmt: skip


def test_slave_appends_exactly_the_valid_frames(loop_thread, tmp_path):
    fake = FakeMaster()
    slave = start_broker(
        loop_thread, tmp_path / "s", brokerName="broker-h", brokerRole="SLAVE", brokerId=1,
        mappedFileSizeCommitLog=FILE, haReconnectInterval=10,
        haMasterAddress=fake.addr, haMaxFrameSize=1 << 20,
    )  # fmt: skip
    rnd = random.Random("slave")
    expected = bytearray()
    sent = connections = valid = 0
    try:
        while sent < INPUTS:
            conn, end = fake.accept()
            connections += 1
            with conn:
                assert end == len(expected)  # it resumes from what it really has
                out = bytearray()
                bad = False
                for _ in range(rnd.randint(1, 40)):
                    sent += 1
                    rec = _record(end, sent)
                    frame = protocol.encode_header(end, len(rec)) + rec
                    kind = rnd.random()
                    if kind < 0.85:
                        out += frame
                        expected += rec
                        end += len(rec)
                        valid += 1
                        continue
                    if kind < 0.9:
                        out += protocol.encode_header(rnd.randrange(2**40), 0)  # heartbeat
                        continue
                    bad = True  # the slave must stop here and append nothing of it
                    if kind < 0.925:
                        shift = rnd.choice([-1, 1, 4096, -len(rec)])
                        out += struct.pack(">qi", end + shift, len(rec)) + rec
                    elif kind < 0.95:
                        size = rnd.choice([-1, -(2**31), 2**31 - 1, (1 << 20) + 1])
                        out += struct.pack(">qi", end, size)
                    elif kind < 0.975:
                        out += frame[: rnd.randrange(1, len(frame))]  # cut short, then EOF
                    else:
                        # Random bytes read as a header: an offset other than the
                        # slave's end (all but 1 in 2**64) or a bad size.
                        out += os.urandom(rnd.randint(1, 64))
                    break
                try:
                    conn.sendall(bytes(out))
                    if not bad:
                        target = len(expected)
                        wait_for(lambda t=target: slave.app.store.max_offset == t, 10,
                                 "the slave to apply the valid frames")  # fmt: skip
                    conn.shutdown(socket.SHUT_WR)
                    while conn.recv(65536):
                        pass
                except (TimeoutError, ConnectionResetError, BrokenPipeError):
                    pass
        wait_for(lambda: slave.app.store.max_offset == len(expected), 10, "the last frames")
        print(f"\nha fuzz (slave): {sent} frames over {connections} connections, {valid} valid")
        got = bytearray()
        for f in sorted((tmp_path / "s" / "commitlog").iterdir()):
            got += f.read_bytes()
        assert bytes(got[: len(expected)]) == bytes(expected)  # each byte where it belongs
        assert not any(got[len(expected) :])  # and nothing after them
    finally:
        slave.stop()
        fake.close()
