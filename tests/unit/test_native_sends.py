"""ferry_native.parse_send_header (native/, Rust) against the Python it mirrors,
`services.broker.remoting.sends._parse_plain`: a native tuple must equal Python's (the
properties in the same order, every field of the same type); a deferred one (None)
is a header Python decides itself, and the header every Java producer sends must not
be deferred. `parse_header` must answer the same with and without the module.

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.broker.remoting import sends
from services.broker.remoting.sends import LONG_NAMES, SHORT_NAMES, _parse_plain, parse_header
from tests.native_twins import require_native

ferry_native = require_native()

GROUP = "producer_group"
PROPERTIES = "UNIQ_KEY\x0189AB0000000000000000000000000001\x02WAIT\x01true\x02TAGS\x01TagA\x02"
# The Java client's SEND_MESSAGE_V2 header, as decode_frames hands it over.
JAVA_HEADER = {
    "a": GROUP, "b": "TopicTest", "c": "TBW102", "d": "4", "e": "3", "f": "0",
    "g": "1764150000000", "h": "0", "i": PROPERTIES, "j": "0", "k": "false", "m": "false",
}  # fmt: skip
LONG_OF = {short: long for long, short in SHORT_NAMES.items()}


def _long(ext: dict) -> dict:
    return {LONG_OF.get(k, k): v for k, v in ext.items()}


@contextlib.contextmanager
def _groups_checked(groups):
    """sends._GROUPS_CHECKED holding exactly `groups` (it is what _parse_plain reads)."""
    checked = sends._GROUPS_CHECKED
    saved = set(checked)
    checked.clear()
    checked.update(groups)
    try:
        yield checked
    finally:
        checked.clear()
        checked.update(saved)


def check(ext, short: bool, groups=(GROUP,)):
    """parse_send_header against _parse_plain: equal, or None where Python decides
    (always where _parse_plain raises). Also parse_header with and without the module:
    the same header, or the same error."""
    names = SHORT_NAMES if short else LONG_NAMES
    with _groups_checked(groups) as checked:
        native = ferry_native.parse_send_header(ext, short, checked)
        try:
            python = _parse_plain(ext, names)
        except Exception:
            python = None
        if native is not None:
            assert python is not None
            assert native == python
            assert [type(f) for f in native] == [type(f) for f in python]
            assert list(native[6].items()) == list(python[6].items())
    outcomes = []
    for module in (ferry_native, None):
        with _groups_checked(groups), mock.patch.object(sends, "_native", module):
            try:
                outcomes.append(parse_header(ext, names))
            except Exception as exc:
                outcomes.append((type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]
    return native


NUMBERS = [
    "0", "-0", "007", "-007", "1", "-1", " 5", "5 ", "+5", "1_000", "\u0663", "\uff15",
    "5\n", "1e3", "0x10", "1.0", "--1", "-", "abc", "\ud800", "5\x00",
    str(2**31 - 1), str(2**31), str(-(2**31)), str(-(2**31) - 1),
    str(2**63 - 1), str(2**63), str(-(2**63)), "9" * 24, "9" * 25, "0" * 24, "0" * 25,
    "-" + "0" * 23, "-" + "0" * 24,
]  # fmt: skip
BATCHES = [
    "true", "TRUE", "True", "tRuE", "false", "False", " true", "true ", "1", "yes", "t",
    "\uff54rue", "tr\u00fce", "\u0130", "\u212a", "\ud800", "true\x00",
]  # fmt: skip
PROPERTY_STRINGS = [
    "", "\x02", "\x02\x02", "a\x01b", "a\x01b\x02a\x01c\x02", "a\x01\x01b\x02", "\x01\x02",
    "a\x02", "a\x01b\x02c", "\ud800\x01a\x02", "a\x01\udfff", "\u00e9\x01\U0001f600\x02",
    PROPERTIES, PROPERTIES + "TRAN_MSG\x01true",
]  # fmt: skip
NOT_STR = [None, 0, 5, 1.0, b"4", True, ["4"]]


class _Str(str):
    pass


def _property_string(items: list[tuple[str, str]]) -> str:
    """Items as "k\x01v\x02", an empty value as an item without its separator."""
    return "".join(f"{k}\x01{v}\x02" if v else k + "\x02" for k, v in items)


@st.composite
def values(draw, field: str):
    """A mutation of the Java header's `field`: numbers in and out of range and as
    int() reads them only, odd batch spellings, bad property strings, lone
    surrogates, not-str values and any text."""
    choices = [st.text(max_size=12), st.sampled_from(NOT_STR), st.just(""), st.just(" ")]
    if field in "defghjl":
        choices += [
            st.sampled_from(NUMBERS),
            st.integers(-(2**70), 2**70).map(str),
            st.integers(-(2**32), 2**32).map(str),
        ]
    elif field == "i":
        items = st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=4)
        choices += [st.sampled_from(PROPERTY_STRINGS), items.map(_property_string)]
    elif field == "m":
        choices += [st.sampled_from(BATCHES)]
    elif field in "ab":
        choices += [st.sampled_from([GROUP, "other_group", "TopicTest", "\ud800", _Str(GROUP)])]
    return draw(st.one_of(*choices))


@st.composite
def headers(draw) -> dict:
    """The Java header with a few fields mutated or taken out, and sometimes extra keys."""
    ext = dict(JAVA_HEADER)
    if draw(st.booleans()):
        ext["l"] = draw(st.sampled_from(["16", "-1", ""]))
    for field in draw(st.lists(st.sampled_from("abcdefghijklm"), max_size=4)):
        if draw(st.integers(0, 4)) == 0:
            ext.pop(field, None)
        else:
            ext[field] = draw(values(field))
    ext.update(draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)))
    return ext


group_sets = st.sampled_from([(GROUP,), (), ("other_group",), (GROUP, "other_group", "")])


@given(headers(), st.booleans(), group_sets)
@settings(max_examples=1000, deadline=None)
def test_parse_send_header_returns_what_parse_plain_returns(ext, short, groups):
    check(ext if short else _long(ext), short, groups)


@given(st.dictionaries(st.sampled_from("abcdefghijklm"), values("e"), max_size=13), st.booleans())
@settings(max_examples=300, deadline=None)
def test_parse_send_header_of_any_fields(ext, short):
    groups = (GROUP, *(v for v in ext.values() if type(v) is str))
    check(ext if short else _long(ext), short, groups)


@pytest.mark.parametrize("short", [True, False])
def test_the_java_header_is_taken_natively(short):
    ext = JAVA_HEADER if short else _long(JAVA_HEADER)
    fields = check(ext, short)
    assert fields == (GROUP, "TopicTest", 3, 0, 1764150000000, 0,
                      {"UNIQ_KEY": "89AB0000000000000000000000000001", "WAIT": "true",
                       "TAGS": "TagA"}, 0, -1, False)  # fmt: skip
    assert fields[0] is ext["a" if short else "producerGroup"]  # not copied


def test_parse_header_takes_the_native_path(monkeypatch):
    def not_called(ext, names):
        raise AssertionError("_parse_plain called for the Java header")

    monkeypatch.setattr(sends, "_parse_plain", not_called)
    monkeypatch.setattr(sends, "_native", ferry_native)
    with _groups_checked((GROUP,)):
        for ext, names in ((JAVA_HEADER, SHORT_NAMES), (_long(JAVA_HEADER), LONG_NAMES)):
            assert parse_header(ext, names).queue_id == 3


@pytest.mark.parametrize(
    "field, value, taken",
    [
        ("d", "", True), ("d", str(2**31 - 1), True), ("d", "-1", False), ("d", str(2**31), False),
        ("d", " 4", False),
        ("e", "-0", True), ("e", "007", True), ("e", str(-(2**31)), True),
        ("e", str(-(2**31) - 1), False), ("e", str(2**31), False), ("e", "", False),
        ("e", "+5", False), ("e", "1_000", False), ("e", "\u0663", False), ("e", " 5", False),
        ("e", "0" * 24, True), ("e", "0" * 25, False), ("e", "9" * 24, False),
        ("g", str(2**63 - 1), True), ("g", str(2**63), False), ("g", "-1", False),
        ("g", "0", True),
        ("h", str(2**31 - 1), True), ("h", str(2**31), False),
        ("i", "", True), ("i", "\x02\x02", True), ("i", "a\x01b\x02a\x01c", True),
        ("i", "a\x02", False), ("i", "a\x01\ud800", False), ("i", "\u00e9\x01\U0001f600", True),
        ("j", "", True), ("j", str(2**31 - 1), True), ("j", "-1", False), ("j", str(2**31), False),
        ("l", "", True), ("l", "-1", True), ("l", str(-(2**31)), True),
        ("l", str(-(2**31) - 1), False),
        ("m", "", True), ("m", "TRUE", True), ("m", "tRuE", True), ("m", " true", True),
        ("m", "\uff54rue", False), ("m", "\u0130", False), ("m", "\ud800", False),
        ("b", "", False), ("b", "\ud800", True), ("a", "other_group", False),
        ("a", _Str(GROUP), False), ("e", _Str("3"), False), ("m", None, False),
        ("c", None, True), ("k", 5, True),  # fields _parse_plain does not read
    ],
)  # fmt: skip
def test_parse_send_header_edge_cases(field, value, taken):
    ext = {**JAVA_HEADER, field: value}
    for short in (True, False):
        fields = check(ext if short else _long(ext), short)
        assert (fields is not None) == taken


@pytest.mark.parametrize("field", "abefgh")
def test_parse_send_header_defers_a_missing_required_field(field):
    ext = {k: v for k, v in JAVA_HEADER.items() if k != field}
    assert check(ext, True) is None


def test_parse_send_header_without_optional_fields():
    ext = {k: v for k, v in JAVA_HEADER.items() if k in "abefgh"}
    assert check(ext, True)[6:] == ({}, 0, -1, False)


class _Collides:
    """A key that collides with "a" and cannot be compared."""

    def __hash__(self):
        return hash("a")

    def __eq__(self, other):
        raise RuntimeError("no comparing")


class _Dict(dict):
    pass


def test_parse_send_header_defers_odd_containers_and_never_raises_for_their_contents():
    assert ferry_native.parse_send_header({_Collides(): "x"}, True, {GROUP}) is None
    assert ferry_native.parse_send_header({**JAVA_HEADER, 1: "x"}, True, {GROUP}) is not None
    assert ferry_native.parse_send_header(_Dict(JAVA_HEADER), True, {GROUP}) is None
    assert ferry_native.parse_send_header(list(JAVA_HEADER.items()), True, {GROUP}) is None
    assert ferry_native.parse_send_header({**JAVA_HEADER, "a": ["x"]}, True, {GROUP}) is None
    with pytest.raises(TypeError):
        ferry_native.parse_send_header(JAVA_HEADER, True, [GROUP])
    with pytest.raises(TypeError):
        ferry_native.parse_send_header(JAVA_HEADER, 1, {GROUP})
