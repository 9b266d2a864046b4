"""The send use case's retry and dead-letter routing, what a record keeps of
a RocketMQ-protocol message, and the store's lookups (search by time, the
earliest store time, a record by its commit offset), on a real store."""

from __future__ import annotations

import pytest

from ferry import record
from ferry.model import SCHEDULE_TOPIC, SubscriptionGroupConfig, TopicConfig
from ferry.runtime.clock import FakeClock
from ferry.runtime.errors import InvalidArgument, NotFound, PermissionDenied
from services.broker.messaging.outgoing import OutgoingMessage
from tests.unit.test_messaging import Env


class Groups(dict):
    def get(self, group: str) -> SubscriptionGroupConfig | None:  # type: ignore[override]
        return super().get(group)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path / "store", FakeClock())
    e.created = []

    class Creator:
        def create_system_topic(self, config: TopicConfig) -> None:
            e.created.append(config)
            e.topics[config.topic_name] = config

    e.stager.topic_creator = Creator()
    e.stager.groups = Groups(strict=SubscriptionGroupConfig("strict", retry_max_times=2))
    yield e
    e.close()


def send_one(env, topic: str, **fields):
    queue_id = fields.pop("queue_id", None)
    message = OutgoingMessage(body=fields.pop("body", b"m"), **fields)
    return env.run(env.service.send(topic, queue_id, [message]))


def records(env, topic: str, queue_id: int = 0) -> list[record.StoredMessage]:
    env.store.dispatcher.dispatch_all()
    return env.run(env.store.get_messages(topic, queue_id, 0, 32)).records


def test_a_retry_below_its_maximum_stays_and_the_retry_topic_is_created(env):
    outcome = send_one(
        env, "%RETRY%g", reconsume_times=1, max_reconsume_times=3, properties={"DELAY": "2"}
    )
    assert [c.topic_name for c in env.created] == ["%RETRY%g"]
    assert env.created[0].queue_nums == 1 and env.created[0].perm == 6
    assert outcome.topic == SCHEDULE_TOPIC  # waits for its delay level, then %RETRY%g


@pytest.mark.parametrize(
    ("group", "fields", "dead"),
    [
        ("g", {"reconsume_times": 3, "max_reconsume_times": 3}, True),
        ("g", {"reconsume_times": 15}, False),  # an unknown group: 16 as RocketMQ's default
        ("g", {"reconsume_times": 16}, True),
        ("strict", {"reconsume_times": 2}, True),  # the group's retryMaxTimes
        ("strict", {"reconsume_times": 2, "max_reconsume_times": 5}, False),  # the message's
    ],
)
def test_where_a_retry_goes(env, group, fields, dead):
    outcome = send_one(env, f"%RETRY%{group}", properties={"DELAY": "3", "k": "v"}, **fields)
    if dead:
        assert (outcome.topic, outcome.queue_id) == (f"%DLQ%{group}", 0)
        (stored,) = records(env, f"%DLQ%{group}")
        assert stored.properties == {"k": "v"}  # no DELAY: a dead letter waits for no one
        assert stored.reconsume_times == fields["reconsume_times"]
    else:
        assert outcome.topic == SCHEDULE_TOPIC


def test_no_topic_is_created_where_sends_are_refused(env):
    env.permission.set(4)
    with pytest.raises(PermissionDenied):
        send_one(env, "%RETRY%g", reconsume_times=20)
    assert env.created == []
    env.permission.set(6)
    env.stager.topic_creator = None
    with pytest.raises(NotFound, match="%RETRY%g"):
        send_one(env, "%RETRY%g")


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"queue_id": 5}, "queue_id"),  # the new topic has one queue
        ({"properties": {"TIMER_DELIVER_MS": "soon"}}, "epoch milliseconds"),
    ],
)
def test_a_retry_refused_for_its_message_creates_no_topic(env, fields, refused):
    """Nothing changes for a refused send, the retry topic included (found by
    tests/fuzz/test_rpc_fuzz.py: a SendMessage to %RETRY%g with a bad queue id)."""
    with pytest.raises(InvalidArgument, match=refused):
        send_one(env, "%RETRY%g", **fields)
    assert env.created == [] and "%RETRY%g" not in env.topics


def test_a_batch_to_a_retry_topic_is_not_rerouted(env):
    env.topics["%RETRY%g"] = TopicConfig("%RETRY%g", 1, 1, 6)
    messages = [OutgoingMessage(b"a", reconsume_times=99), OutgoingMessage(b"b")]
    outcome = env.run(env.service.send("%RETRY%g", None, messages, batch=True))
    assert outcome.topic == "%RETRY%g" and env.created == []


def test_the_record_keeps_sys_flag_born_host_and_reconsume_times(env):
    send_one(env, "T", queue_id=1, sys_flag=0x1, born_host=("10.9.8.7", 4321), reconsume_times=4)
    send_one(env, "T", queue_id=1, born_host=("::1", 5))  # not IPv4: the default host
    first, second = records(env, "T", 1)
    assert (first.born_host, first.reconsume_times) == ("10.9.8.7:4321", 4)
    assert second.born_host == "127.0.0.1:0"
    raw = env.run(env.pulls.stored_record(first.commit_offset))
    decoded = record.decode(raw, 0)
    assert isinstance(decoded, record.Record) and decoded.sys_flag == 0x1


def test_stored_record_refuses_what_is_not_a_record_start(env):
    send_one(env, "T", queue_id=0, body=b"abc")
    (stored,) = records(env, "T")
    raw = env.run(env.pulls.stored_record(stored.commit_offset))
    assert len(raw) == stored.size
    for offset in (stored.commit_offset + 4, stored.size, 10**12):
        with pytest.raises(NotFound, match=f"commit offset {offset}"):
            env.run(env.pulls.stored_record(offset))
    with pytest.raises(InvalidArgument):
        env.run(env.pulls.stored_record(-1))


def test_search_by_time(env):
    start = env.clock.wall_ms()
    for step in (0, 1, 1, 0, 2):  # stored at +0, +1 s, +2 s, +2 s, +4 s
        env.clock.advance(step)
        send_one(env, "T", queue_id=2)
    env.store.dispatcher.dispatch_all()

    def search(seconds: float, upper: bool = False) -> int:
        ts = start + int(seconds * 1000)
        return env.run(env.pulls.offset_by_time("T", 2, ts, upper))

    assert [search(s) for s in (-1, 0, 0.5, 1, 2, 3, 4, 5)] == [0, 0, 1, 1, 2, 4, 4, 5]
    assert [search(s, True) for s in (-1, 0, 0.5, 1, 2, 3, 4, 5)] == [0, 0, 0, 1, 3, 3, 4, 4]
    assert env.run(env.pulls.offset_by_time("T", 3, start, False)) == 0  # never written
    assert env.run(env.pulls.earliest_store_time("T", 2)) == start
    assert env.run(env.pulls.earliest_store_time("T", 3)) == -1
    with pytest.raises(NotFound):
        env.run(env.pulls.offset_by_time("Nope", 0, start))
    with pytest.raises(InvalidArgument, match="queue_id"):
        env.run(env.pulls.earliest_store_time("T", 4))
