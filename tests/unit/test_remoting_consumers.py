"""The broker's client tables, queue locks and the RocketMQ-protocol consumer
headers and bodies, without sockets: expiry is driven by a time argument."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.remoting.bodies import BodyError
from services.broker.messaging.clients import ClientTables, ConsumerData, Subscription
from services.broker.messaging.locks import QueueKey, QueueLocks
from services.broker.remoting.consumers import parse_heartbeat, parse_lock_body
from services.broker.remoting.convert import BadRequest
from services.broker.remoting.pulls import PullHeader, parse_pull_header

T0 = 1000.0


def consumer(group: str, *subs: Subscription) -> ConsumerData:
    return ConsumerData(group, subs)


# ---------------------------------------------------------------- ClientTables


def test_first_heartbeat_of_a_member_changes_its_group_and_a_repeat_does_not():
    tables = ClientTables()
    sub = Subscription("T", "A", version=1)
    assert tables.heartbeat("c1", "ch1", T0, [consumer("g", sub)], ["pg"]) == ["g"]
    assert tables.heartbeat("c1", "ch1", T0 + 30, [consumer("g", sub)], ["pg"]) == []
    assert tables.consumer_ids("g") == ["c1"]
    assert [m.client_id for m in tables.producers("pg")] == ["c1"]
    assert tables.heartbeat("c2", "ch2", T0 + 31, [consumer("g", sub)]) == ["g"]
    assert tables.consumer_ids("g") == ["c1", "c2"]
    assert tables.channels("g") == ["ch1", "ch2"]


def test_a_changed_expression_or_topic_set_changes_the_group_a_new_version_alone_does_not():
    tables = ClientTables()
    tables.heartbeat("c1", "ch", T0, [consumer("g", Subscription("T", "A", version=1))])
    assert (
        tables.heartbeat("c1", "ch", T0, [consumer("g", Subscription("T", "A", version=2))]) == []
    )
    assert tables.heartbeat("c1", "ch", T0, [consumer("g", Subscription("T", "B", version=3))]) == [
        "g"
    ]
    two = consumer("g", Subscription("T", "B", version=3), Subscription("U", version=3))
    assert tables.heartbeat("c1", "ch", T0, [two]) == ["g"]
    assert tables.heartbeat("c1", "ch", T0, [consumer("g", Subscription("U", version=3))]) == ["g"]
    assert tables.subscription("g", "T") is None


def test_the_group_subscription_is_the_newest_any_member_announced():
    tables = ClientTables()
    tables.heartbeat("c1", "ch1", T0, [consumer("g", Subscription("T", "A", version=5))])
    tables.heartbeat("c2", "ch2", T0, [consumer("g", Subscription("T", "B", version=9))])
    assert tables.subscription("g", "T") == Subscription("T", "B", version=9)
    assert tables.subscription("g", "U") is None
    assert tables.subscription("other", "T") is None


def test_a_reconnected_client_is_reached_through_its_new_channel():
    tables = ClientTables()
    tables.heartbeat("c1", "old", T0, [consumer("g")])
    assert tables.heartbeat("c1", "new", T0 + 1, [consumer("g")]) == []
    assert tables.channels("g") == ["new"]
    assert tables.channel_closed("old") == []
    assert tables.consumer_ids("g") == ["c1"]


def test_unregister_and_channel_close_leave_the_group():
    tables = ClientTables()
    tables.heartbeat("c1", "ch1", T0, [consumer("g"), consumer("h")], ["pg"])
    tables.heartbeat("c2", "ch2", T0, [consumer("g")])
    assert tables.unregister("c1", consumer_group="g") == ["g"]
    assert tables.unregister("c1", consumer_group="g") == []
    assert tables.unregister("c1", producer_group="pg") == []
    assert tables.producers("pg") == []
    assert tables.consumer_ids("g") == ["c2"]
    assert tables.channel_closed("ch1") == ["h"]
    assert tables.consumer_groups() == ["g"]
    assert tables.channel_closed("ch2") == ["g"]
    assert tables.consumer_groups() == []


def test_members_silent_for_120_s_expire_and_their_channels_are_named():
    tables = ClientTables()
    tables.heartbeat("c1", "ch1", T0, [consumer("g")], ["pg"])
    tables.heartbeat("c2", "ch2", T0, [consumer("g")])
    tables.heartbeat("c2", "ch2", T0 + 100, [consumer("g")])
    nothing = tables.expire(T0 + 120)
    assert nothing.groups == () and nothing.channels == ()
    expired = tables.expire(T0 + 120.5)
    assert expired.groups == ("g",)
    assert expired.channels == ("ch1",)
    assert tables.consumer_ids("g") == ["c2"]
    assert tables.producers("pg") == []
    assert tables.expire(T0 + 220.5).channels == ("ch2",)
    assert tables.consumer_groups() == []


def test_a_channel_with_a_live_registration_is_not_named_for_closing():
    tables = ClientTables(expire_after_s=10)
    tables.heartbeat("c1", "shared", T0, [consumer("g")])
    tables.heartbeat("c2", "shared", T0 + 9, [consumer("h")])
    expired = tables.expire(T0 + 11)
    assert expired.groups == ("g",)
    assert expired.channels == ()


# ---------------------------------------------------------------- QueueLocks

Q0, Q1, Q2 = (QueueKey("T", "broker-a", i) for i in range(3))


def test_locks_are_exclusive_between_clients_and_renewed_by_their_owner():
    locks = QueueLocks()
    assert locks.lock("g", "c1", "ch1", [Q1, Q0], T0) == [Q0, Q1]
    assert locks.lock("g", "c2", "ch2", [Q1, Q2], T0 + 1) == [Q2]
    assert locks.lock("other", "c2", "ch2", [Q1], T0 + 1) == [Q1]  # groups are apart
    assert locks.lock("g", "c1", "ch1", [Q0, Q1, Q2], T0 + 50) == [Q0, Q1]
    assert locks.owner("g", Q1, T0 + 100) == "c1"  # renewed at +50


def test_a_lock_expires_60_s_after_its_last_renewal():
    locks = QueueLocks()
    locks.lock("g", "c1", "ch1", [Q0], T0)
    assert locks.lock("g", "c2", "ch2", [Q0], T0 + 60) == []
    assert locks.owner("g", Q0, T0 + 60.5) is None
    assert locks.lock("g", "c2", "ch2", [Q0], T0 + 60.5) == [Q0]
    assert locks.owner("g", Q0, T0 + 61) == "c2"
    assert locks.expire(T0 + 200) == 1


def test_unlock_frees_only_the_owners_locks_and_a_closed_channel_frees_all_its_locks():
    locks = QueueLocks()
    locks.lock("g", "c1", "ch1", [Q0, Q1], T0)
    locks.unlock("g", "c2", [Q0])
    assert locks.owner("g", Q0, T0) == "c1"
    locks.unlock("g", "c1", [Q0])
    assert locks.owner("g", Q0, T0) is None
    assert locks.channel_closed("ch1") == 1
    assert locks.lock("g", "c2", "ch2", [Q1], T0 + 1) == [Q1]


# ---------------------------------------------------------------- headers and bodies


def test_pull_header_with_every_field():
    ext = {
        "consumerGroup": "g", "topic": "T", "queueId": "3", "queueOffset": "17",
        "maxMsgNums": "32", "sysFlag": "7", "commitOffset": "15",
        "suspendTimeoutMillis": "15000", "subscription": "A || B", "subVersion": "99",
        "expressionType": "TAG",
    }  # fmt: skip
    header = parse_pull_header(ext)
    assert header == PullHeader("g", "T", 3, 17, 32, 7, 15, 15000, "A || B", 99, "TAG")
    assert header.commits and header.suspends and header.subscribes


def test_pull_header_defaults_what_old_clients_leave_out():
    header = parse_pull_header(
        {"consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "0"}
    )
    assert (header.max_msg_nums, header.sys_flag, header.commit_offset) == (32, 0, -1)
    assert header.expression_type == "TAG" and not header.suspends


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("consumerGroup", "", "consumerGroup"),
        ("queueId", "x", "queueId: not an integer"),
        ("queueId", str(2**31), "queueId"),
        ("queueOffset", "1.5", "queueOffset"),
        ("suspendTimeoutMillis", "-1", "suspendTimeoutMillis"),
    ],
)
def test_pull_header_errors_name_the_field(key, value, says):
    ext = {"consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "0", key: value}
    with pytest.raises(BadRequest, match=says):
        parse_pull_header(ext)


def test_heartbeat_body_as_java_sends_it():
    body = {
        "clientID": "10.0.0.5@12345#8876543210",
        "consumerDataSet": [{
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
            "groupName": "g", "messageModel": "CLUSTERING", "unitMode": False,
            "subscriptionDataSet": [{
                "classFilterMode": False, "codeSet": [2598919], "expressionType": "TAG",
                "subString": "TagA", "subVersion": 1700000000000, "tagsSet": ["TagA"],
                "topic": "T",
            }],
        }],
        "producerDataSet": [{"groupName": "pg"}, {"groupName": "CLIENT_INNER_PRODUCER"}],
    }  # fmt: skip
    client_id, consumers, producers = parse_heartbeat(json.dumps(body).encode())
    assert client_id == "10.0.0.5@12345#8876543210"
    assert producers == ["pg", "CLIENT_INNER_PRODUCER"]
    [data] = consumers
    assert data.group == "g" and data.consume_type == "CONSUME_PASSIVELY"
    assert data.subscriptions == (
        Subscription("T", "TagA", "TAG", ("TagA",), (2598919,), 1700000000000),
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "clientID"),
        ({"clientID": "c", "consumerDataSet": {}}, "consumerDataSet"),
        ({"clientID": "c", "consumerDataSet": [{"subscriptionDataSet": []}]}, "groupName"),
        (
            {"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [
                {"topic": "T", "codeSet": ["x"]}]}]},
            "codeSet",
        ),
        (
            {"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [
                {"topic": "T", "expressionType": "REGEX"}]}]},
            "expressionType",
        ),
    ],
)  # fmt: skip
def test_heartbeat_body_errors_name_the_field(body, says):
    with pytest.raises(BadRequest, match=says):
        parse_heartbeat(json.dumps(body).encode())


def test_lock_body():
    body = {
        "consumerGroup": "g", "clientId": "c1",
        "mqSet": [{"brokerName": "b", "queueId": 1, "topic": "T"}],
    }  # fmt: skip
    assert parse_lock_body(json.dumps(body).encode()) == ("g", "c1", [QueueKey("T", "b", 1)])
    body["mqSet"][0]["queueId"] = "1"
    with pytest.raises(BadRequest, match="queueId"):
        parse_lock_body(json.dumps(body).encode())


@given(st.binary(max_size=200))
def test_random_bodies_only_ever_raise_the_documented_errors(data):
    for parse in (parse_heartbeat, parse_lock_body):
        with contextlib.suppress(BodyError, BadRequest):
            parse(data)


_KEYS = (
    "clientID", "consumerDataSet", "producerDataSet", "groupName", "subscriptionDataSet",
    "topic", "subString", "expressionType", "tagsSet", "codeSet", "subVersion",
    "consumerGroup", "clientId", "mqSet", "brokerName", "queueId",
)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4) | st.sampled_from(_KEYS),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5)
    ),
    max_leaves=25,
)


@given(_JSON)
def test_json_of_any_shape_only_ever_raises_the_documented_errors(doc):
    data = json.dumps(doc).encode()
    for parse in (parse_heartbeat, parse_lock_body):
        with contextlib.suppress(BodyError, BadRequest):
            parse(data)
