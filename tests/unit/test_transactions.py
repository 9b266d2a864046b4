"""Transactional messages on a real store with a fake clock: halves, commit and
rollback records as RocketMQ writes them, exactly-once decisions, check-back,
discard after transactionCheckMax, and the state rebuilt after a restart."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from ferry import record
from ferry.model import TopicConfig
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import (
    ConfigError,
    FailedPrecondition,
    FerryError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.broker.config import load_config
from services.broker.messaging.access import BrokerAccess, BrokerPermission
from services.broker.messaging.outgoing import OutgoingMessage
from services.broker.messaging.send import SendService, Settler
from services.broker.messaging.staging import Stager
from services.broker.store import MessageStore, StoreConfig
from services.broker.transactions import (
    CHECKPOINT_GROUP,
    HALF_TOPIC,
    OP_TOPIC,
    CheckRequest,
    Decision,
    EndResult,
    TransactionConfig,
    TransactionService,
)
from services.broker.transactions.service import CHECK_MAX_TOPIC

TIMEOUT_MS = 6_000


class Topics(dict):
    def get(self, topic: str) -> TopicConfig | None:  # type: ignore[override]
        return super().get(topic)


class Offsets:
    def __init__(self) -> None:
        self.table: dict[tuple[str, str, int], int] = {}

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table[(group, topic, queue_id)] = offset


class Env:
    def __init__(self, root: Path, clock: FakeClock, check_max: int = 3) -> None:
        self.root = root
        self.clock = clock
        self.loop = asyncio.new_event_loop()
        self.topics = Topics(T=TopicConfig("T", 4, 4, 6))
        self.offsets = Offsets()
        self.config = TransactionConfig(TIMEOUT_MS, 60_000, check_max)
        self.checks: list[CheckRequest] = []
        self.producer_online = True
        self.open()

    def open(self) -> None:
        self.store = MessageStore(
            StoreConfig(root=self.root, commit_log_file_size=1 << 20), self.clock
        )
        self.store.open()
        self.run(self.store.start())
        access = BrokerAccess(self.topics, BrokerPermission(6), False, "b")
        stager, settler = Stager(self.store, access, 4096), Settler(self.store)
        self.tx = TransactionService(
            self.store, stager, settler, self.topics, self.offsets, self.clock, self.config
        )
        self.messaging = SendService(stager, settler, access, self.tx)
        self.tx.register_checker(self._checker)
        self.run(self.tx.load())

    def _checker(self, request: CheckRequest) -> bool:
        if self.producer_online:
            self.checks.append(request)
        return self.producer_online

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def restart(self, checkpoint: bool = True) -> None:
        if checkpoint:
            self.tx.checkpoint()
        self.run(self.store.stop())
        self.open()

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()

    def prepare(
        self,
        body: bytes = b"order-1",
        group: str = "pg",
        queue_id: int = 1,
        born_host: tuple[str, int] | None = None,
        **props,
    ):
        properties = {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": f"U-{body.decode()}"}
        properties.update(props)
        message = OutgoingMessage(
            body=body,
            properties=properties,
            born_timestamp=self.clock.wall_ms(),
            sys_flag=0x4 | 0x2,
            born_host=born_host,
            flag=7,
            reconsume_times=2,
        )
        staged = self.tx.prepare("T", queue_id, message, group)
        self.run(self.messaging.settle([staged]))
        return staged.result

    def end(self, commit_offset: int, decision: Decision, group: str = "pg", **kw) -> EndResult:
        return self.run(self.tx.end(group, commit_offset, decision, **kw))

    def records(self, topic: str, queue_id: int = 0) -> list[record.Record]:
        self.store.dispatcher.dispatch_all()
        view = self.store.queue_view(topic, queue_id)
        if view is None:
            return []
        out = []
        for offset in range(view.min_offset, view.max_offset):
            commit_offset, size, _ = view.entry(offset)
            out.append(self.run(self.store.read_full(commit_offset, size)))
        return out

    def delivered(self) -> list[record.Record]:
        return [r for q in range(4) for r in self.records("T", q)]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path, FakeClock())
    yield e
    e.close()


def test_prepare_stores_a_half_nobody_sees(env: Env):
    half = env.prepare()
    assert env.delivered() == []
    [stored] = env.records(HALF_TOPIC)
    assert (stored.topic, stored.queue_id, stored.queue_offset) == (HALF_TOPIC, 0, 0)
    assert stored.commit_offset == half.commit_offsets[0]
    assert stored.sys_flag & 0xC == 0
    assert stored.properties["REAL_TOPIC"] == "T" and stored.properties["REAL_QID"] == "1"
    assert stored.properties["PGROUP"] == "pg" and stored.properties["TRAN_MSG"] == "true"
    assert env.tx.pending_count == 1


def test_a_half_without_a_producer_group_is_refused_in_its_place(env: Env):
    """Nobody could be asked about it: refused, the others of the run stored."""

    def half(body: bytes, group: str) -> OutgoingMessage:
        props = {"TRAN_MSG": "true", "UNIQ_KEY": body.decode()}
        if group:
            props["PGROUP"] = group
        return OutgoingMessage(body=body, properties=props)

    results = env.tx.prepare_many(
        [("T", 1, half(b"a", "pg"), "pg"), ("T", 1, half(b"b", ""), ""),
         ("T", 1, half(b"c", "pg"), "pg")]
    )  # fmt: skip
    assert isinstance(results[1], InvalidArgument)
    assert "producer group" in results[1].message
    assert [type(r).__name__ for r in (results[0], results[2])] == ["Staged", "Staged"]
    assert [r.body for r in env.records(HALF_TOPIC)] == [b"a", b"c"]
    assert env.tx.pending_count == 2


def test_the_send_use_case_routes_a_half_to_the_transactions(env: Env):
    """Every door makes the same call: a half (sysFlag prepared, or TRAN_MSG)
    goes to the transaction use case; its outcome names the half."""
    by_flag = OutgoingMessage(b"a", properties={"UNIQ_KEY": "A"}, sys_flag=0x4 | 0x1)
    outcome = env.run(env.messaging.send("T", 1, [by_flag], producer_group="pg"))
    by_property = OutgoingMessage(b"b", properties={"TRAN_MSG": "true", "PGROUP": "pg"})
    second = env.run(env.messaging.send("T", None, [by_property]))
    assert (outcome.half, second.half) == (True, True)
    assert (outcome.topic, second.topic) == (HALF_TOPIC, HALF_TOPIC)
    halves = env.records(HALF_TOPIC)
    assert [h.commit_offset for h in halves] == [outcome.commit_offset, second.commit_offset]
    assert [h.sys_flag for h in halves] == [0x1, 0]  # the type bits are not stored
    assert [h.properties["PGROUP"] for h in halves] == ["pg", "pg"]
    assert env.tx.pending_count == 2 and env.delivered() == []


def test_a_run_stages_its_halves_with_its_plain_sends(env: Env):
    """RocketMQ's run path: each send in its place, halves and plain sends
    answered from one stage_many and one settle."""
    half = OutgoingMessage(b"h", properties={"TRAN_MSG": "true"})
    plain = OutgoingMessage(b"p", properties={"UNIQ_KEY": "P"}, sys_flag=0x8)  # a stray type
    results = env.messaging.stage_many(
        [("T", 1, [plain], False, "pg"), ("T", 1, [half], False, "pg"),
         ("T", 1, [half], False, ""), ("T", 2, [plain, plain], True, "pg")]
    )  # fmt: skip
    assert isinstance(results[2], InvalidArgument)  # a half without its producer group
    staged = [r for r in results if not isinstance(r, FerryError)]
    assert [s.half for s in staged] == [False, True, False]
    env.run(env.messaging.settle(staged))
    assert [r.body for r in env.records(HALF_TOPIC)] == [b"h"]
    assert [(r.body, r.sys_flag) for r in env.records("T", 1)] == [(b"p", 0)]
    assert len(env.records("T", 2)) == 2


def test_a_batch_holds_no_half(env: Env):
    for marked in (
        OutgoingMessage(b"x", sys_flag=0x4),
        OutgoingMessage(b"x", properties={"TRAN_MSG": "true", "PGROUP": "pg"}),
    ):
        with pytest.raises(PermissionDenied, match="transactional"):
            env.run(env.messaging.send("T", 1, [OutgoingMessage(b"ok"), marked], batch=True))
    assert env.store.max_offset == 0


def test_a_slave_refuses_a_half_as_any_write(env: Env):
    access = BrokerAccess(env.topics, BrokerPermission(6), True, "b")
    slave = SendService(Stager(env.store, access, 4096), Settler(env.store), access)
    half = OutgoingMessage(b"h", properties={"TRAN_MSG": "true", "PGROUP": "pg"})
    refusals = []
    for send in ([half], [OutgoingMessage(b"p")]):
        with pytest.raises(PermissionDenied) as refused:
            env.run(slave.send("T", 1, send))
        refusals.append(refused.value.message)
    [result] = slave.stage_many([("T", 1, [half], False, "pg")])
    assert isinstance(result, PermissionDenied)
    assert refusals == [result.message] * 2
    assert "is a SLAVE and takes no writes" in result.message
    assert env.store.max_offset == 0


def test_commit_appends_the_message_and_its_op_record_together(env: Env):
    half = env.prepare()
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.DECIDED
    [message] = env.delivered()
    [op] = env.records(OP_TOPIC)
    assert (message.topic, message.queue_id, message.body) == ("T", 1, b"order-1")
    assert message.sys_flag & 0xC == 0x8
    assert message.prepared_transaction_offset == half.commit_offsets[0]
    for gone in ("REAL_TOPIC", "REAL_QID", "TRAN_MSG"):
        assert gone not in message.properties
    assert message.properties["UNIQ_KEY"] == "U-order-1"
    assert op.body == b"0" and op.properties["TAGS"] == "d"
    assert op.properties["FERRY_TRAN_DECISION"] == "COMMIT"
    # One append: the op record follows the committed message directly.
    assert op.commit_offset == message.commit_offset + len(record.encode(message))
    assert env.tx.pending_count == 0 and env.tx.counts["commit"] == 1


def test_a_fresh_commit_kept_in_memory_writes_what_a_commit_read_from_the_log_does(env: Env):
    """The usual commit, moments after its prepare, does not read the half back: the
    record it writes is the one a commit of a half read from the log writes."""
    host = ("10.1.2.3", 40000)
    fresh = env.prepare(b"same", born_host=host, KEYS="k1")
    read = env.prepare(b"same", born_host=host, KEYS="k1")
    assert len(env.tx._fresh) == 2
    env.tx._forget(read.queue_offset)  # as if it was too old to be kept
    env.end(fresh.commit_offsets[0], Decision.COMMIT)
    env.end(read.commit_offsets[0], Decision.COMMIT)
    a, b = env.delivered()
    assert a.prepared_transaction_offset == fresh.commit_offsets[0]
    assert b.prepared_transaction_offset == read.commit_offsets[0]
    same = ("topic", "queue_id", "body", "flag", "sys_flag", "born_timestamp", "born_host",
            "reconsume_times", "properties")  # fmt: skip
    assert [getattr(a, f) for f in same] == [getattr(b, f) for f in same]
    assert a.sys_flag == 0x8 | 0x2 and a.born_host == host and a.flag == 7
    assert env.tx._fresh == {} and env.tx._fresh_bytes == 0


def test_the_half_and_its_commit_carry_the_transaction_id_as_rocketmq_5(env: Env):
    """RocketMQ 5's broker writes `__transactionId__` = UNIQ_KEY on the half; the commit
    keeps it, from a fresh half kept in memory and from one read back from the log."""
    fresh = env.prepare(b"fresh")
    read = env.prepare(b"read")
    env.tx._forget(read.queue_offset)
    halves = env.records(HALF_TOPIC)
    assert [h.properties["__transactionId__"] for h in halves] == ["U-fresh", "U-read"]
    env.end(fresh.commit_offsets[0], Decision.COMMIT)
    env.end(read.commit_offsets[0], Decision.COMMIT)
    got = {m.body: m.properties.get("__transactionId__") for m in env.delivered()}
    assert got == {b"fresh": "U-fresh", b"read": "U-read"}


def test_a_pending_transaction_is_ended_by_its_message_id(env: Env):
    """How a proxy that does not know where a half lies ends a v5 SDK's transaction."""
    env.prepare(b"a")
    env.prepare(b"b")
    end = env.tx.end_by_msg_id
    assert env.run(end("pg", "U-b", Decision.COMMIT, wait=True)) is EndResult.DECIDED
    assert [m.body for m in env.delivered()] == [b"b"]
    assert env.run(end("pg", "U-b", Decision.ROLLBACK)) is EndResult.ALREADY_DECIDED
    with pytest.raises(FailedPrecondition):
        env.run(end("other", "U-a", Decision.COMMIT))
    assert env.run(end("pg", "U-a", Decision.UNKNOWN)) is EndResult.PENDING
    with pytest.raises(NotFound):
        env.run(end("pg", "U-nobody", Decision.COMMIT))
    env.restart()  # the pending one is found again from the log
    assert env.run(env.tx.end_by_msg_id("pg", "U-a", Decision.ROLLBACK)) is EndResult.DECIDED
    assert [m.body for m in env.delivered()] == [b"b"] and env.tx.pending_count == 0


def test_rollback_writes_only_the_op_record(env: Env):
    half = env.prepare()
    assert env.end(half.commit_offsets[0], Decision.ROLLBACK) is EndResult.DECIDED
    assert env.delivered() == []
    [op] = env.records(OP_TOPIC)
    assert op.properties["FERRY_TRAN_DECISION"] == "ROLLBACK"
    assert env.tx.counts["rollback"] == 1


def test_a_duplicate_end_never_delivers_a_second_copy(env: Env):
    half = env.prepare()
    offset = half.commit_offsets[0]
    assert env.end(offset, Decision.COMMIT) is EndResult.DECIDED
    assert env.end(offset, Decision.COMMIT) is EndResult.ALREADY_DECIDED
    assert env.end(offset, Decision.ROLLBACK, from_check=True) is EndResult.ALREADY_DECIDED
    assert len(env.delivered()) == 1 and len(env.records(OP_TOPIC)) == 1


def test_two_ends_at_once_decide_once(env: Env):
    half = env.prepare()
    offset = half.commit_offsets[0]

    async def both():
        return await asyncio.gather(
            env.tx.end("pg", offset, Decision.COMMIT), env.tx.end("pg", offset, Decision.COMMIT)
        )

    assert sorted(r.value for r in env.run(both())) == ["ALREADY_DECIDED", "DECIDED"]
    assert len(env.delivered()) == 1


def test_a_rolled_back_transaction_is_never_committed_later(env: Env):
    half = env.prepare()
    env.end(half.commit_offsets[0], Decision.ROLLBACK)
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED
    assert env.delivered() == []


def test_end_checks_the_group_and_the_offset(env: Env):
    half = env.prepare()
    with pytest.raises(FailedPrecondition, match="producer group wrong"):
        env.end(half.commit_offsets[0], Decision.COMMIT, group="other")
    with pytest.raises(NotFound, match="Find prepared transaction message failed"):
        env.end(half.commit_offsets[0] + 1, Decision.COMMIT)
    assert env.tx.pending_count == 1 and env.delivered() == []


def test_unknown_is_checked_back_after_the_timeout_then_committed_once(env: Env):
    half = env.prepare()
    assert env.end(half.commit_offsets[0], Decision.UNKNOWN) is EndResult.PENDING
    env.clock.advance(TIMEOUT_MS / 1000 - 1)
    assert env.run(env.tx.check_once()) == 0 and env.checks == []
    env.clock.advance(2)
    assert env.run(env.tx.check_once()) == 1
    [check] = env.checks
    assert (check.group, check.topic, check.msg_id) == ("pg", "T", "U-order-1")
    body = record.decode(check.body)
    assert (body.topic, body.queue_id, body.body) == ("T", 1, b"order-1")
    assert body.properties["TRANSACTION_CHECK_TIMES"] == "1"
    original, copy = env.records(HALF_TOPIC)
    assert copy.commit_offset == check.commit_offset and copy.queue_offset == check.queue_offset
    assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "0"
    assert check.offset_msg_id == record.message_id(env.store.store_host, copy.commit_offset)
    # Not checked again before another timeout has passed.
    assert env.run(env.tx.check_once()) == 0
    # The producer answers the check (naming the copy); a late answer naming the original too.
    assert env.end(check.commit_offset, Decision.COMMIT, from_check=True) is EndResult.DECIDED
    assert env.end(original.commit_offset, Decision.COMMIT) is EndResult.ALREADY_DECIDED
    [message] = env.delivered()
    assert message.prepared_transaction_offset == check.commit_offset
    assert env.records(OP_TOPIC)[0].body == b"0"  # the transaction's key: the original's offset
    assert env.tx.counts == {"commit": 1, "rollback": 0, "check": 1, "discard": 0}


def test_check_immunity_time_is_honoured(env: Env):
    env.prepare(CHECK_IMMUNITY_TIME_IN_SECONDS="60")
    env.clock.advance(30)
    assert env.run(env.tx.check_once()) == 0
    env.clock.advance(31)
    assert env.run(env.tx.check_once()) == 1


def test_after_check_max_the_transaction_is_discarded(env: Env, caplog):
    half = env.prepare()
    env.producer_online = False  # nobody answers
    for _ in range(3):
        env.clock.advance(TIMEOUT_MS / 1000 + 1)
        assert env.run(env.tx.check_once()) == 1
    assert env.tx.counts["check"] == 0  # none reached a producer
    env.clock.advance(TIMEOUT_MS / 1000 + 1)
    with caplog.at_level("WARNING"):
        assert env.run(env.tx.check_once()) == 1
    assert "discarded after 3 checks" in caplog.text and "group=pg topic=T msgId=U-order-1" in (
        caplog.text
    )
    assert env.tx.counts["discard"] == 1 and env.tx.pending_count == 0
    assert env.delivered() == []
    [kept] = env.records(CHECK_MAX_TOPIC)
    assert kept.body == b"order-1"
    assert env.records(OP_TOPIC)[0].properties["FERRY_TRAN_DECISION"] == "DISCARD"
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED
    assert env.delivered() == []


def test_decisions_and_pending_halves_survive_a_restart(env: Env):
    committed = env.prepare(b"a")
    rolled_back = env.prepare(b"b")
    pending = env.prepare(b"c")
    env.end(committed.commit_offsets[0], Decision.COMMIT)
    env.end(rolled_back.commit_offsets[0], Decision.ROLLBACK)
    env.clock.advance(TIMEOUT_MS / 1000 + 1)
    env.run(env.tx.check_once())  # c: checked once
    env.restart()
    assert env.offsets.query(CHECKPOINT_GROUP, HALF_TOPIC, 0) == 3  # c's check copy
    assert env.tx.pending_count == 1
    for half in (committed, rolled_back):
        assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED
    [check] = env.checks
    env.clock.advance(TIMEOUT_MS / 1000 + 1)
    env.run(env.tx.check_once())  # c again, its count read back from the log
    assert (
        env.checks[-1].body
        and record.decode(env.checks[-1].body).properties["TRANSACTION_CHECK_TIMES"] == "2"
    )
    assert env.end(check.commit_offset, Decision.COMMIT, from_check=True) is EndResult.DECIDED
    assert sorted(m.body for m in env.delivered()) == [b"a", b"c"]
    env.restart()
    assert env.tx.pending_count == 0
    assert env.end(pending.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED
    assert sorted(m.body for m in env.delivered()) == [b"a", b"c"]


def test_the_state_is_rebuilt_without_a_checkpoint(env: Env):
    half = env.prepare(b"a")
    env.end(half.commit_offsets[0], Decision.COMMIT)
    env.prepare(b"b")
    env.restart(checkpoint=False)
    assert env.tx.pending_count == 1
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED


def test_a_commit_whose_op_record_was_cut_off_gets_it_at_start(env: Env):
    half = env.prepare()
    env.end(half.commit_offsets[0], Decision.COMMIT)
    [message] = env.delivered()
    [op] = env.records(OP_TOPIC)
    # A crash (or a replication cut) between the two: the log ends with the commit.
    env.run(env.store.truncate(op.commit_offset))
    assert env.records(OP_TOPIC) == []
    env.restart(checkpoint=False)
    [op] = env.records(OP_TOPIC)
    assert op.body == b"0" and op.properties["FERRY_TRAN_DECISION"] == "COMMIT"
    assert env.tx.pending_count == 0
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.ALREADY_DECIDED
    assert [m.commit_offset for m in env.delivered()] == [message.commit_offset]


def test_a_half_cut_off_with_its_commit_is_checked_again(env: Env):
    """The commit and its op both lost (the replica had neither): still pending."""
    half = env.prepare()
    env.end(half.commit_offsets[0], Decision.COMMIT)
    env.run(env.store.truncate(env.delivered()[0].commit_offset))
    env.restart(checkpoint=False)
    assert env.tx.pending_count == 1 and env.delivered() == []
    assert env.end(half.commit_offsets[0], Decision.COMMIT) is EndResult.DECIDED
    assert len(env.delivered()) == 1


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("transactionCheckMax=0", "transactionCheckMax: 0 is outside 1..10000"),
        ("transactionTimeOut=soon", "transactionTimeOut: 'soon' is not an integer"),
        ("transactionCheckInterval=-1", "transactionCheckInterval: -1 is outside 1..inf"),
    ],
)
def test_bad_transaction_keys_stop_the_broker_naming_the_key(option: str, said: str):
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(None, [option], env={})


def test_transaction_keys_reach_the_config():
    config, _ = load_config(
        None,
        ["transactionTimeOut=1000", "transactionCheckInterval=200", "transactionCheckMax=3"],
        env={},
    )
    assert (
        config.transaction_timeout_ms,
        config.transaction_check_interval_ms,
        config.transaction_check_max,
    ) == (1000, 200, 3)
    defaults = load_config(None, [], env={})[0]
    assert (defaults.transaction_timeout_ms, defaults.transaction_check_interval_ms) == (
        6000,
        60000,
    )
    assert defaults.transaction_check_max == 15
