"""Topic attributes by RocketMQ's rules (AttributeParser, AttributeUtil,
TopicConfig.getTopicMessageType): what `ferry.model` parses, changes and reads."""

from __future__ import annotations

import pytest

from ferry.model import TopicConfig, alter_attributes, parse_attributes
from ferry.runtime.errors import InvalidArgument
from services.broker.metadata.tables import topic_from_json, topic_to_json

FIFO = (("message.type", "FIFO"),)


def test_a_topic_without_a_message_type_is_normal():
    assert TopicConfig("t").message_type == "NORMAL"
    assert TopicConfig("t", attributes=FIFO).message_type == "FIFO"


def test_an_old_topics_json_entry_loads_as_normal_and_a_typed_one_round_trips():
    old = {"topicName": "t", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    assert topic_from_json(old).message_type == "NORMAL"
    typed = TopicConfig("t", attributes=FIFO)
    assert topic_from_json(topic_to_json(typed)) == typed


def test_mqadmin_style_attribute_strings_parse():
    assert parse_attributes("") == {}
    assert parse_attributes("+message.type=FIFO,-reserve.time") == {
        "+message.type": "FIFO",
        "-reserve.time": "",
    }
    for bad in ("message.type=FIFO", "message.type", "+a=1,+a=2"):
        with pytest.raises(InvalidArgument):
            parse_attributes(bad)


def test_changes_add_replace_and_remove_and_keep_what_they_do_not_name():
    created = alter_attributes((), {"+message.type": "DELAY"}, create=True)
    assert created == (("message.type", "DELAY"),)
    assert alter_attributes(created, {}, create=False) == created
    assert alter_attributes(created, {"+message.type": "FIFO"}, create=False) == FIFO
    assert alter_attributes(FIFO, {"-message.type": ""}, create=False) == ()
    # Keys an older ferry stored are kept as they are.
    assert alter_attributes((("k", "v"),), {"+message.type": "FIFO"}, create=False) == (
        ("k", "v"),
        ("message.type", "FIFO"),
    )


@pytest.mark.parametrize(
    "changes, create, words",
    [
        ({"-message.type": ""}, True, "only add attribute is supported while creating topic"),
        ({"-message.type": ""}, False, "attempt to delete a nonexistent key: message.type"),
        ({"message.type": "FIFO"}, False, "wrong format key"),
        ({"+message.type": "fifo"}, True, "value is not in set"),
        ({"+queue.type": "BatchCQ"}, True, "unsupported key: queue.type"),
        ({"+message.type": "MIXED"}, True, "MIXED message type is not supported."),
    ],
)
def test_bad_changes_are_refused_in_rocketmqs_words(changes, create, words):
    with pytest.raises(InvalidArgument) as err:
        alter_attributes((), changes, create=create)
    assert words in str(err.value)


def test_mixed_is_allowed_when_the_broker_enables_it():
    assert alter_attributes((), {"+message.type": "MIXED"}, create=True, allow_mixed=True) == (
        ("message.type", "MIXED"),
    )
