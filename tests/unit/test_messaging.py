"""Send and pull rules on a real store: validation before anything is written,
queue choice, the DELAY diversion, tag expressions, and delayed delivery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ferry.model import PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC, TopicConfig
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from services.broker.messaging.access import BrokerAccess, BrokerPermission
from services.broker.messaging.outgoing import OutgoingMessage, SendStatus
from services.broker.messaging.pull import PullService
from services.broker.messaging.rules import parse_sub_expression
from services.broker.messaging.send import SendService, Settler
from services.broker.messaging.staging import Stager
from services.broker.schedule.delay import DelayScheduler
from services.broker.store import GetStatus, MessageStore, StoreConfig
from tests.waiting import wait_for_async


class Topics(dict):
    """The topic table's read side, as the messaging service sees it."""

    def get(self, topic: str) -> TopicConfig | None:  # type: ignore[override]
        return super().get(topic)


class Offsets(dict):
    def get(self, level: int) -> int:  # type: ignore[override]
        return super().get(level, 0)

    def set(self, level: int, offset: int) -> None:
        self[level] = offset


class Env:
    def __init__(self, root: Path, clock: FakeClock) -> None:
        self.root = root
        self.clock = clock
        self.loop = asyncio.new_event_loop()
        self.topics = Topics(
            T=TopicConfig("T", 4, 4, 6),
            RO=TopicConfig("RO", 2, 2, 4),
            **{SCHEDULE_TOPIC: TopicConfig(SCHEDULE_TOPIC, 18, 18, 6)},
        )
        self.permission = BrokerPermission(6)
        self.open()

    def open(self) -> None:
        self.store = MessageStore(
            StoreConfig(root=self.root, commit_log_file_size=1 << 20), self.clock
        )
        self.store.open()
        self.run(self.store.start())
        self.access = BrokerAccess(self.topics, self.permission, False, "broker-a")
        self.stager = Stager(self.store, self.access, 1024)
        self.service = SendService(self.stager, Settler(self.store), self.access)
        self.pulls = PullService(self.store, self.access)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def send(self, topic="T", queue_id=None, bodies=(b"x",), batch=False, **kw):
        messages = [OutgoingMessage(body=b, **kw) for b in bodies]
        return self.run(self.service.send(topic, queue_id, messages, batch=batch))

    def pull(self, queue_id, offset, topic="T", nums=32, wait_ms=0, expr=""):
        self.store.dispatcher.dispatch_all()
        return self.run(self.pulls.pull("g", topic, queue_id, offset, nums, wait_ms, expr)).result

    def restart(self) -> None:
        self.run(self.store.stop())
        self.open()

    def close(self) -> None:
        self.run(self.store.stop())
        self.loop.close()


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path / "store", FakeClock())
    yield e
    e.close()


def test_broker_picks_queues_round_robin(env):
    queues = [env.send().queue_id for _ in range(8)]
    assert queues == [0, 1, 2, 3, 0, 1, 2, 3]


def test_batch_is_one_unit_on_one_queue(env):
    outcome = env.send(queue_id=2, bodies=[b"a", b"b", b"c"], batch=True)
    assert outcome.status is SendStatus.SEND_OK
    assert (outcome.queue_id, outcome.queue_offset, len(outcome.msg_ids)) == (2, 0, 3)
    result = env.pull(2, 0)
    assert [r.body for r in result.records] == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"topic": "bad topic!"}, InvalidArgument, "characters outside"),
        ({"topic": "x" * 128}, InvalidArgument, "limit is 127"),
        ({"topic": "Nope"}, NotFound, "'Nope' does not exist"),
        ({"topic": "RO"}, PermissionDenied, "not writable"),
        ({"bodies": [b""]}, InvalidArgument, "body: must not be empty"),
        ({"bodies": [b"x" * 1025]}, ResourceExhausted, "maxMessageSize is 1024"),
        ({"queue_id": 4}, InvalidArgument, "4 is out of range"),
        ({"queue_id": -2}, InvalidArgument, "out of range"),
        ({"bodies": [b"a", b""], "batch": True}, InvalidArgument, r"messages\[1\].body"),
        ({"topic": SCHEDULE_TOPIC}, InvalidArgument, "system topic"),
        ({"properties": {"a\x01": "b"}}, InvalidArgument, "separator"),
        ({"properties": {"DELAY": "soon"}}, InvalidArgument, "DELAY"),
        (
            {"properties": {"DELAY": "1"}, "bodies": [b"a", b"b"], "batch": True},
            InvalidArgument,
            "batch",
        ),
    ],
)
def test_bad_sends_are_refused_and_store_nothing(env, kwargs, error, text):
    before = env.store.max_offset
    with pytest.raises(error, match=text):
        env.send(**kwargs)
    assert env.store.max_offset == before


def test_drained_broker_refuses_writes_but_serves_reads(env):
    env.send(queue_id=0)
    env.permission.set(4)
    with pytest.raises(PermissionDenied, match="brokerPermission=4"):
        env.send()
    assert env.pull(0, 0).status is GetStatus.FOUND


def test_pull_argument_checks(env):
    with pytest.raises(InvalidArgument, match="queue_id"):
        env.pull(9, 0)
    with pytest.raises(InvalidArgument, match="queue_offset"):
        env.pull(0, -1)
    with pytest.raises(NotFound):
        env.pull(0, 0, topic="Nope")
    # Empty pieces are skipped, as Apache's FilterAPI skips them.
    assert parse_sub_expression("a ||") == parse_sub_expression("a") != None  # noqa: E711
    assert parse_sub_expression("a |||| b") == parse_sub_expression("b || a")
    assert parse_sub_expression("||") == frozenset()


def test_tag_expression_filters(env):
    for tag in ["a", "b", "c", "a"]:
        env.send(queue_id=0, tags=tag)
    result = env.pull(0, 0, expr="a || c")
    assert [r.tags for r in result.records] == ["a", "c", "a"]
    assert result.next_begin_offset == 4


def test_long_poll_answers_as_soon_as_a_message_arrives(env):
    async def scenario():
        pull = asyncio.create_task(env.pulls.pull("g", "T", 1, 0, 32, 30_000))
        await wait_for_async(
            lambda: env.store.long_polls.waiting_on("T", 1) == 1, 5, "the pull to wait"
        )
        assert not pull.done()
        await env.service.send("T", 1, [OutgoingMessage(body=b"wake")])
        return await asyncio.wait_for(pull, 5)

    outcome = env.run(scenario())
    assert outcome.result.status is GetStatus.FOUND
    assert outcome.result.records[0].body == b"wake"


def test_a_long_poll_when_the_store_stops_is_refused_not_answered_as_an_empty_queue(env):
    """A pull waiting at the end of a queue when its broker stops (a failover member
    changing its role keeps its listener and connections): the store closed under it must
    not answer "no such offset" (a RocketMQ consumer then moves its offset back to 0 and
    reads the whole queue again) but Unavailable, which every client retries as it was."""
    env.send(queue_id=1, bodies=[b"a", b"b", b"c"])
    env.store.dispatcher.dispatch_all()

    async def scenario():
        pull = asyncio.create_task(env.pulls.pull("g", "T", 1, 3, 32, 30_000))
        await wait_for_async(
            lambda: env.store.long_polls.waiting_on("T", 1) == 1, 5, "the pull to wait"
        )
        assert not pull.done()
        await env.store.stop()
        return await asyncio.wait_for(pull, 5)

    with pytest.raises(Unavailable, match="closed"):
        env.run(scenario())
    with pytest.raises(Unavailable, match="closed"):
        env.run(env.store.get_messages("T", 1, 0, 32))


def test_long_poll_times_out_with_no_new_message(env):
    result = env.pull(3, 0, wait_ms=50)
    assert result.status is GetStatus.NO_NEW_MSG


def test_delayed_message_is_hidden_until_due_then_delivered_once(env):
    offsets = Offsets()
    scheduler = DelayScheduler(env.store, offsets, env.topics, env.clock)
    outcome = env.send(queue_id=3, properties={"DELAY": "2"}, bodies=[b"later"])  # level 2: 5 s
    assert (outcome.topic, outcome.queue_id) == (SCHEDULE_TOPIC, 1)
    env.store.dispatcher.dispatch_all()
    assert env.run(scheduler.deliver_due()) == 0
    assert env.pull(3, 0).status is GetStatus.NO_NEW_MSG
    env.clock.advance(4.9)
    assert env.run(scheduler.deliver_due()) == 0
    env.clock.advance(0.2)
    assert env.run(scheduler.deliver_due()) == 1
    result = env.pull(3, 0)
    assert [r.body for r in result.records] == [b"later"]
    # The copy keeps DELAY, REAL_TOPIC and REAL_QID, as Apache 4.9's copy does.
    assert result.records[0].properties == {"DELAY": "2", PROPERTY_REAL_TOPIC: "T", "REAL_QID": "3"}
    assert env.run(scheduler.deliver_due()) == 0  # once
    assert offsets.get(2) == 1


def test_delay_levels_are_clamped_and_zero_means_now(env):
    assert env.send(properties={"DELAY": "99"}).queue_id == 17
    assert env.send(properties={"DELAY": "0"}, queue_id=1).topic == "T"


def test_delayed_delivery_resumes_after_a_restart_without_repeats(tmp_path):
    from services.broker.metadata.tables import BrokerMetadata

    clock = FakeClock()
    env = Env(tmp_path / "store", clock)
    try:
        meta = BrokerMetadata.open(tmp_path / "config", clock)
        scheduler = DelayScheduler(env.store, meta.delay_offsets, env.topics, clock)
        env.send(queue_id=2, properties={"DELAY": "1"}, bodies=[b"after 1s"])
        env.send(queue_id=2, properties={"DELAY": "3"}, bodies=[b"after 10s"])
        env.store.dispatcher.dispatch_all()
        clock.advance(1.5)
        assert env.run(scheduler.deliver_due()) == 1
        meta.persist_all()  # what the broker does every few seconds and at shutdown
        env.restart()
        meta = BrokerMetadata.open(tmp_path / "config", clock)
        assert meta.delay_offsets.get(1) == 1
        scheduler = DelayScheduler(env.store, meta.delay_offsets, env.topics, clock)
        assert env.run(scheduler.deliver_due()) == 0  # level 1 done, level 3 not due
        clock.advance(9.0)
        assert env.run(scheduler.deliver_due()) == 1
        bodies = [r.body for r in env.pull(2, 0).records]
        assert bodies == [b"after 1s", b"after 10s"]
    finally:
        env.close()


def test_pull_suggests_which_broker_to_read_from_next(env):
    from ferry.model import SubscriptionGroupConfig

    env.send(bodies=[b"x" * 100] * 10, queue_id=0)

    def suggest(slave_read_enable, hot_bytes, groups=None):
        env.pulls.slave_read_enable = slave_read_enable
        env.pulls.hot_bytes = hot_bytes
        env.pulls.groups = groups
        env.store.dispatcher.dispatch_all()
        return env.run(env.pulls.pull("g", "T", 0, 0, 1, 0, "")).suggest_which_broker_id

    # Without slaveReadEnable a consumer always stays on the master.
    assert suggest(False, hot_bytes=0) == 0
    # A consumer close to the head reads from the master ...
    assert suggest(True, hot_bytes=1 << 20) == 0
    # ... one further behind than the hot window is sent to a slave (id 1).
    assert suggest(True, hot_bytes=100) == 1
    # The group's own settings choose the ids.
    groups = {"g": SubscriptionGroupConfig("g", broker_id=2, which_broker_when_consume_slowly=3)}
    assert suggest(True, hot_bytes=1 << 20, groups=groups) == 2
    assert suggest(True, hot_bytes=100, groups=groups) == 3
