"""Transactional messages under master kills (issue 30), with automatic failover on: the
members of broker-a (tests/failover/group.py's FailoverGroup, real etcd) take plain
sends (the history checker's producers) and, beside them, a transactional producer
(`TxDriver`) that prepares messages one after another on whatever the name server says
is the master, ends each with the decision its body names (even number: commit, odd:
rollback), and leaves every fifth undecided, as a producer that died between prepare and
commit would. A checker (`TxChecker`) watches the current master's check-backs and
answers with the same rule: the "local transaction" of each message.

Each round SIGKILLs the master while both run (`kill_master`); the kill lands between a
prepare and its end, or between an end and its answer, wherever the driver happens to be.
At the end, once every transaction acknowledged as prepared and meant to commit is
delivered: each is delivered exactly once, no message meant to roll back is ever
delivered, and the plain sends pass the usual history check. The row in the chaos report
(`failover-transactions`) counts what was prepared, ended, left to the check-back,
committed, and lost or delivered wrongly (both must be 0).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import grpc

from ferry.v1 import broker_pb2, broker_pb2_grpc, transactions_pb2, transactions_pb2_grpc
from tests.chaos.harness import ROUNDS, Pair, Report
from tests.chaos.test_failover_chaos import run  # noqa: F401 - the scenario's fixture
from tests.failover.config import CHANNEL_OPTIONS, TTL_S
from tests.failover.scenarios import kill_master
from tests.integration.support import create_topic, pull_all
from tests.waiting import wait_for

TX_TOPIC = "TxChaos"
TX_GROUP = "tx-chaos-producers"
CALL_TIMEOUT_S = 3.0
# A half left undecided is checked back 1 s after it was stored, in passes 0.5 s apart.
TX_KEYS = {"transactionTimeOut": 1000, "transactionCheckInterval": 500}
MasterAddr = Callable[[], str | None]  # the current master's ferry.v1 address, if any
ChannelFor = Callable[[str], grpc.Channel]


def commits(body: bytes) -> bool:
    """The local transaction's outcome, from the body alone: tx-<n>, even n commits."""
    return int(body.split(b"-")[1]) % 2 == 0


def _resolution(body: bytes) -> int:
    return transactions_pb2.COMMIT if commits(body) else transactions_pb2.ROLLBACK


class TxDriver:
    """Prepares tx-0, tx-1, ... on the current master; ends four in five."""

    def __init__(self, master_addr: MasterAddr, channel: ChannelFor) -> None:
        self.master_addr, self.channel = master_addr, channel
        self.prepared: dict[bytes, broker_pb2.SendResult] = {}  # acknowledged halves
        self.tried: set[bytes] = set()  # every prepare sent (some stored, unacknowledged)
        self.ended: set[bytes] = set()  # EndTransaction answered OK
        self.left: set[bytes] = set()  # left to the check-back on purpose
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tx-driver", daemon=True)

    def start(self) -> TxDriver:
        self._thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            addr = self.master_addr()
            if addr is None:
                self.stop.wait(0.05)
                continue
            body = f"tx-{n}".encode()
            n += 1
            self.tried.add(body)
            channel = self.channel(addr)
            try:
                result = broker_pb2_grpc.BrokerStub(channel).SendMessage(
                    broker_pb2.SendMessageRequest(
                        topic=TX_TOPIC,
                        body=body,
                        properties={"TRAN_MSG": "true", "PGROUP": TX_GROUP,
                                    "UNIQ_KEY": body.decode()},
                    ),
                    timeout=CALL_TIMEOUT_S,
                )  # fmt: skip
            except grpc.RpcError:
                self.stop.wait(0.05)  # the master is down, say
                continue  # maybe stored: the check-back decides it
            if result.status != broker_pb2.SEND_OK:
                continue
            self.prepared[body] = result
            if n % 5 == 0:
                self.left.add(body)
                continue
            try:
                transactions_pb2_grpc.TransactionsStub(channel).EndTransaction(
                    transactions_pb2.EndTransactionRequest(
                        producer_group=TX_GROUP,
                        commit_offset=result.commit_offset,
                        queue_offset=result.queue_offset,
                        msg_id=body.decode(),
                        resolution=_resolution(body),
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                self.ended.add(body)
            except grpc.RpcError:
                pass  # the check-back decides it
            self.stop.wait(0.01)


class TxChecker:
    """Answers the current master's check-backs for TX_GROUP with `commits`."""

    def __init__(self, master_addr: MasterAddr, channel: ChannelFor) -> None:
        self.master_addr, self.channel = master_addr, channel
        self.answered: Counter[bytes] = Counter()
        self.stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, name="tx-checker", daemon=True)

    def start(self) -> TxChecker:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stop.is_set():
            addr = self.master_addr()
            if addr is None:
                self.stop.wait(0.1)
                continue
            channel = self.channel(addr)
            stub = transactions_pb2_grpc.TransactionsStub(channel)
            self._call = call = stub.WatchTransactionChecks(
                transactions_pb2.WatchTransactionChecksRequest(
                    producer_groups=[TX_GROUP], client_id="tx-chaos-checker"
                )
            )
            try:
                for check in call:
                    body = check.message.body
                    try:
                        stub.EndTransaction(
                            transactions_pb2.EndTransactionRequest(
                                producer_group=check.producer_group,
                                commit_offset=check.commit_offset,
                                queue_offset=check.queue_offset,
                                msg_id=check.msg_id,
                                resolution=_resolution(body),
                                from_check=True,
                            ),
                            timeout=CALL_TIMEOUT_S,
                        )
                        self.answered[body] += 1
                    except grpc.RpcError:
                        pass
            except grpc.RpcError:
                pass
            self.stop.wait(0.2)


def _delivered(channel: grpc.Channel) -> Counter[bytes]:
    pulled = pull_all(channel, TX_TOPIC, 1, group="tx-chaos-check")
    return Counter(pulled.values())


def _verdict(driver: TxDriver, checker: TxChecker, delivered: Counter[bytes]) -> str:
    """What happened, for the report; raises AssertionError on a wrong delivery."""
    want = {b for b in driver.prepared if commits(b)}
    twice = sorted(b for b, n in delivered.items() if n > 1)
    rolled_back = sorted(b for b in delivered if not commits(b))
    strays = sorted(b for b in delivered if b not in driver.tried)
    note = (
        f"transactions: {len(driver.tried)} prepares sent, {len(driver.prepared)} acknowledged "
        f"({len(driver.left)} left to the check-back), {len(driver.ended)} ended by the "
        f"producer, {sum(checker.answered.values())} check-backs answered; "
        f"{len(want)} meant to commit, {sum(delivered.values())} delivered, "
        f"{len(want - set(delivered))} lost; delivered twice {len(twice)}, rolled back yet "
        f"delivered {len(rolled_back)}"
    )
    assert want <= set(delivered), f"{note}; lost: {sorted(want - set(delivered))[:10]}"
    assert not twice, f"{note}; delivered more than once: {twice[:10]}"
    assert not rolled_back, f"{note}; rolled back, yet delivered: {rolled_back[:10]}"
    assert not strays, f"{note}; delivered, never prepared: {strays[:10]}"
    assert driver.left & want, f"{note}; no transaction was left to the check-back"
    return note


def test_failover_transactions_rounds(run):  # noqa: F811 - the imported fixture
    group, producers = run.start("failover-transactions", **TX_KEYS)
    leader = group.wait_leader()
    create_topic(group.channel(leader.addr), TX_TOPIC, 1)
    for m in group.members:
        wait_for(
            lambda m=m: (t := group.tables(m)) is not None and TX_TOPIC in t[0],
            15,
            f"{m} to have topic {TX_TOPIC}",
        )
    driver = TxDriver(group.master_addr, group.channel).start()
    checker = TxChecker(group.master_addr, group.channel).start()
    try:
        wait_for(lambda: len(driver.prepared) >= 20, 30, "20 prepared transactions")
        kill_master(group, producers, ROUNDS, run.out)
        run.report.rounds = ROUNDS
        wait_for(lambda: len(driver.prepared) >= 40, 30, "transactions after the kills")
        driver.join()
        leader = group.wait_leader(timeout_s=TTL_S + 15)
        want = {b for b in driver.prepared if commits(b)}
        channel = group.channel(leader.addr)
        # Every acknowledged commit is delivered once its end or its check-back is applied.
        wait_for(lambda: want <= set(_delivered(channel)), 120,
                 "every prepared transaction meant to commit delivered")  # fmt: skip
        delivered = _delivered(channel)
    finally:
        driver.join()
        checker.close()
    try:
        run.out.notes.append(_verdict(driver, checker, delivered))
    finally:
        run.finish()


def test_transactions_sigkill_master_restart_rounds(tmp_path):
    """Failover off: a SYNC_MASTER and its slave (harness.Pair); each round SIGKILLs the
    master under the same transactional load and restarts it. The decisions survive
    the restart and are applied once; the check-back resolves what was left."""
    report = Report("sigkill-master-transactions")
    pair = Pair(tmp_path, **TX_KEYS).start()
    channels: dict[str, grpc.Channel] = {}

    def channel(addr: str) -> grpc.Channel:
        if addr not in channels:
            channels[addr] = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
        return channels[addr]

    create_topic(channel(pair.master.addr), TX_TOPIC, 1)
    master = lambda: pair.master.addr  # noqa: E731 - the same port after each restart
    driver = TxDriver(master, channel).start()
    checker = TxChecker(master, channel).start()
    try:
        for r in range(ROUNDS):
            floor = len(driver.prepared)
            wait_for(lambda f=floor: len(driver.prepared) >= f + 20, 30, f"round {r}'s prepares")
            pair.master.kill()
            report.faults += 1
            pair.master.start()
            pair.wait_in_sync()
            report.rounds += 1
        floor = len(driver.prepared)
        wait_for(lambda: len(driver.prepared) >= floor + 20, 30, "prepares after the kills")
        driver.join()
        want = {b for b in driver.prepared if commits(b)}
        wait_for(lambda: want <= set(_delivered(channel(pair.master.addr))), 120,
                 "every prepared transaction meant to commit delivered")  # fmt: skip
        delivered = _delivered(channel(pair.master.addr))
        report.acknowledged = len(driver.prepared)
        report.notes.append(_verdict(driver, checker, delivered))
    finally:
        driver.join()
        checker.close()
        for c in channels.values():
            c.close()
        report.write()
        pair.stop()
