"""Parsing a RocketMQ send request into messages (services/broker/remoting/sends.py):
both header forms, the checks, what the record keeps, and batches."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.remoting import batch, codes
from ferry.remoting.codec import Command
from ferry.runtime.errors import FerryError, InvalidArgument
from services.broker.messaging.outgoing import OutgoingMessage, is_half
from services.broker.remoting.convert import BadRequest
from services.broker.remoting.sends import (
    LONG_NAMES,
    SHORT_NAMES,
    _parse_checked,
    _parse_plain,
    born_host,
    kept_sys_flag,
    messages_of,
    parse_header,
)

V1 = {
    "producerGroup": "pg",
    "topic": "T",
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": "4",
    "queueId": "3",
    "sysFlag": "1",
    "bornTimestamp": "1700000000000",
    "flag": "5",
    "properties": "TAGS\x01a\x02WAIT\x01false\x02UNIQ_KEY\x01ID",
    "reconsumeTimes": "2",
    "unitMode": "false",
    "maxReconsumeTimes": "7",
    "batch": "false",
}
V2 = {SHORT_NAMES[k]: v for k, v in V1.items()}


def _messages_of(request: Command, header, remote: str, cluster: str = ""):
    """`messages_of` for a request as it came: its body, and its code saying a batch."""
    return messages_of(
        request.body, request.code == codes.SEND_BATCH_MESSAGE, header, remote, cluster
    )


def test_both_header_forms_mean_the_same():
    long_form = parse_header(V1, LONG_NAMES)
    assert long_form == parse_header(V2, SHORT_NAMES)
    assert (long_form.producer_group, long_form.topic, long_form.queue_id) == ("pg", "T", 3)
    assert (long_form.sys_flag, long_form.flag, long_form.born_timestamp) == (1, 5, 1700000000000)
    assert long_form.properties == {"TAGS": "a", "WAIT": "false", "UNIQ_KEY": "ID"}
    assert (long_form.reconsume_times, long_form.max_reconsume_times) == (2, 7)
    assert not long_form.batch


def test_optional_fields_and_a_negative_queue():
    ext = {k: v for k, v in V2.items() if k in "abefgh"}
    ext["e"] = "-1"
    header = parse_header(ext, SHORT_NAMES)
    assert header.queue_id is None  # the broker picks
    assert header.properties == {} and header.reconsume_times == 0
    assert header.max_reconsume_times is None and not header.batch


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("a", None, "producerGroup"),
        ("a", "bad group!", "producerGroup"),
        ("b", None, "topic"),
        ("e", None, "queueId"),
        ("e", "1.5", "queueId"),
        ("e", str(2**31), "queueId"),
        ("f", "x", "sysFlag"),
        ("g", "-1", "bornTimestamp"),
        ("h", None, "flag"),
        ("i", "no-separator", "properties"),
        ("j", "-3", "reconsumeTimes"),
        ("d", "many", "defaultTopicQueueNums"),
    ],
)
def test_malformed_fields_are_named_by_their_long_names(field, value, named):
    ext = dict(V2)
    if value is None:
        del ext[field]
    else:
        ext[field] = value
    with pytest.raises(InvalidArgument, match=named):  # MESSAGE_ILLEGAL
        parse_header(ext, SHORT_NAMES)


@given(st.dictionaries(st.sampled_from(sorted(V2)), st.text(max_size=30)))
def test_any_field_values_parse_or_raise_invalid_argument(garbage):
    with contextlib.suppress(InvalidArgument):
        parse_header({**V2, **garbage}, SHORT_NAMES)


field_value = st.one_of(
    st.text(max_size=30),
    st.integers(-5, 5).map(str),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63]).map(str),
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["", " 7", "0x10", "1_0", "+3", "-0", "TRUE", "true", "false", "\u0663"]),
    st.text("0", min_size=20, max_size=30),  # long but small: refused
)


@given(
    st.dictionaries(st.sampled_from(sorted(V2)), field_value, max_size=2),
    st.sets(st.sampled_from(sorted(V2)), max_size=2),
    st.sampled_from([SHORT_NAMES, LONG_NAMES]),
)
@settings(max_examples=500)
def test_the_plain_path_returns_what_the_checked_path_does(changes, removed, names):
    """parse_header's fast path answers only what the field-by-field path would, and
    leaves every refusal to it."""
    ext = {k: v for k, v in {**V2, **changes}.items() if k not in removed}
    ext = {names[long]: ext[short] for long, short in SHORT_NAMES.items() if short in ext}
    try:
        expected: object = _parse_checked(ext, names)
    except FerryError as e:
        expected = type(e)
    try:
        fast: object = _parse_plain(ext, names)
    except Exception:  # noqa: BLE001 - any refusal hands the header to the checked path
        return
    assert fast == expected


def test_the_plain_path_takes_the_common_header():
    _parse_checked(V2, SHORT_NAMES)  # the group has been checked once
    assert _parse_plain(V2, SHORT_NAMES) == _parse_checked(V2, SHORT_NAMES)
    assert _parse_plain(V1, LONG_NAMES) == _parse_checked(V1, LONG_NAMES)


def test_what_a_record_keeps_of_the_request():
    request = Command(codes.SEND_MESSAGE_V2, ext=V2, body=b"zipped")
    header = parse_header(V2, SHORT_NAMES)
    (message,), wait, is_batch = _messages_of(request, header, "10.1.2.3:4567")
    assert not wait and not is_batch  # WAIT=false: answer without waiting for the store
    assert message.properties == {"TAGS": "a", "UNIQ_KEY": "ID"}
    assert (message.body, message.flag, message.sys_flag) == (b"zipped", 5, 1)
    assert message.born_host == ("10.1.2.3", 4567)
    assert (message.reconsume_times, message.max_reconsume_times) == (2, 7)
    assert header.properties["WAIT"] == "false"  # the parsed header is left as it was


def test_the_broker_stamps_its_cluster_on_every_message_it_stores():
    """Apache's SendMessageProcessor puts CLUSTER = brokerClusterName on each send, and a
    batch's own properties reach every message of it."""
    single = Command(codes.SEND_MESSAGE_V2, ext=V2, body=b"b")
    (message,), _, _ = _messages_of(single, parse_header(V2, SHORT_NAMES), "", "C1")
    assert message.properties == {"TAGS": "a", "UNIQ_KEY": "ID", "CLUSTER": "C1"}
    as_batch = Command(
        codes.SEND_BATCH_MESSAGE,
        ext=V2,
        body=batch.encode([batch.BatchEntry(0, b"x", b"k\x01v"), batch.BatchEntry(0, b"y", b"")]),
    )
    messages, _, is_batch = _messages_of(as_batch, parse_header(V2, SHORT_NAMES), "", "C1")
    assert is_batch and [m.properties["CLUSTER"] for m in messages] == ["C1", "C1"]


def test_sys_flag_bits():
    assert kept_sys_flag(0x1 | 0x2 | 0x300, {}) == 0x303
    assert kept_sys_flag(0x10 | 0x20 | 0x40, {}) == 0  # hosts, unwrap
    # The transaction type reaches the send use case, which routes a half by it
    # (and stores none of it: tests/unit/test_messaging.py).
    assert kept_sys_flag(0x4, {"TRAN_MSG": "true"}) == 0x4
    assert kept_sys_flag(0x8, {}) == 0x8

    def half(sys_flag: int, properties: dict[str, str]) -> bool:
        return is_half(OutgoingMessage(b"b", properties=properties, sys_flag=sys_flag))

    assert half(0x4, {}) and half(0, {"TRAN_MSG": "true"}) and half(0x2, {"TRAN_MSG": "TRUE"})
    assert not half(0x8, {}) and not half(0xC, {"TRAN_MSG": "false"}) and not half(0x1, {})
    with pytest.raises(BadRequest, match="autoBatch"):
        kept_sys_flag(0x80, {})


def test_born_host():
    assert born_host("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert born_host("::ffff:10.0.0.1:7") == ("10.0.0.1", 7)
    assert born_host("::1:5000") is None
    assert born_host("?") is None


def test_a_batch_merges_the_batch_properties_into_each_message():
    body = batch.encode(
        [
            batch.BatchEntry(1, b"one", b"UNIQ_KEY\x01A\x02WAIT\x01true\x02KEYS\x01k1"),
            batch.BatchEntry(2, b"two", b"UNIQ_KEY\x01B"),
        ]
    )
    ext = {**V2, "m": "true", "f": "1", "i": "WAIT\x01true\x02shared\x01s"}
    request = Command(codes.SEND_BATCH_MESSAGE, ext=ext, body=body)
    messages, wait, is_batch = _messages_of(request, parse_header(ext, SHORT_NAMES), "1.2.3.4:5")
    assert wait and is_batch
    assert [m.properties for m in messages] == [
        {"UNIQ_KEY": "A", "KEYS": "k1", "shared": "s"},
        {"UNIQ_KEY": "B", "shared": "s"},
    ]
    assert [(m.body, m.flag, m.sys_flag) for m in messages] == [(b"one", 1, 0), (b"two", 2, 0)]


def test_a_batch_is_told_by_its_code_or_its_flag():
    body = batch.encode([batch.BatchEntry(0, b"x", b"")])
    as_320 = Command(codes.SEND_BATCH_MESSAGE, ext=V2, body=body)
    assert _messages_of(as_320, parse_header(V2, SHORT_NAMES), "")[2]
    flagged = {**V2, "m": "true"}
    as_310 = Command(codes.SEND_MESSAGE_V2, ext=flagged, body=body)
    assert _messages_of(as_310, parse_header(flagged, SHORT_NAMES), "")[2]


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00" * 21, batch.encode([batch.BatchEntry(0, b"x", b"no-separator")])],
)
def test_bad_batch_bodies_are_bad_requests(body):
    request = Command(codes.SEND_BATCH_MESSAGE, ext=V2, body=body)
    with pytest.raises(FerryError) as info:
        _messages_of(request, parse_header(V2, SHORT_NAMES), "")
    assert isinstance(info.value, BadRequest)
