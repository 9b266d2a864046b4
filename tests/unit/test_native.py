"""ferry_native (native/, Rust) against the Python it mirrors, byte for byte:
`decode_frames` against a loop over `codec.next_frame`, `encode_json_frame` against
`codec.encode`, and the property codecs against `ferry.record`'s. A native answer must
equal Python's; a deferred one (a `(start, end)` pair or None) must be an input Python
decides itself, and the inputs every client sends must not be deferred.

Fails when ferry_native is missing, unless FERRY_NO_NATIVE=1 (tests/native_twins.py).
"""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry import record
from ferry.remoting import codec
from ferry.remoting.codec import Command, RemotingProtocolError
from tests.native_twins import require_native

ferry_native = require_native()

I64 = 2**63
any_text = st.text(max_size=20)  # lone surrogates and control characters included
plain_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
wide_int = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**65), 2**65))


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def commands(draw, text=any_text):
    """JSON commands with any ints and text, ROCKETMQ ones within its header's ranges."""
    if draw(st.booleans()):
        return Command(
            draw(wide_int), draw(wide_int), draw(wide_int),
            draw(st.dictionaries(text, text, max_size=5)), draw(st.binary(max_size=64)),
            draw(st.one_of(st.none(), text)),
            draw(st.one_of(st.sampled_from(codec.LANGUAGES), text)), draw(wide_int), codec.JSON,
        )  # fmt: skip
    return Command(
        draw(st.integers(-(2**15), 2**15 - 1)), draw(st.integers(-(2**31), 2**31 - 1)),
        draw(st.integers(-(2**31), 2**31 - 1)), draw(st.dictionaries(text, text, max_size=5)),
        draw(st.binary(max_size=64)), draw(st.one_of(st.none(), text)),
        draw(st.sampled_from(codec.LANGUAGES)), draw(st.integers(-(2**15), 2**15 - 1)),
        codec.ROCKETMQ,
    )  # fmt: skip


def _encoded(command: Command) -> bytes:
    try:
        return codec.encode(command)
    except RemotingProtocolError:  # an int beyond the header's range
        return codec.encode(Command(1, body=command.body))


def _fields(command: Command) -> tuple:
    c = command
    return (c.code, c.opaque, c.flag, c.ext, c.body, c.remark, c.language, c.version)


def check_decode_frames(buffer: bytes | bytearray, pos: int = 0) -> list:
    """decode_frames(buffer, pos) against codec.next_frame called until None; returns
    what native listed."""
    items, end, error = ferry_native.decode_frames(buffer, pos)
    assert ferry_native.decode_frames(bytearray(buffer), pos) == (items, end, error)
    at = pos
    for item in items:
        if len(item) == 2:  # deferred: a whole frame that Python decodes or refuses itself
            start, at = item
            assert at == start + 4 + codec.frame_length(buffer[start : start + 4]) <= len(buffer)
            with contextlib.suppress(RemotingProtocolError):
                codec.decode(memoryview(buffer)[start + 4 : at])
            continue
        found = codec.next_frame(buffer, at)
        assert found is not None
        command, at = found
        assert command.serialize_type == codec.JSON
        assert item == _fields(command)
        assert list(item[3].items()) == list(command.ext.items())
        assert type(item[3]) is dict and type(item[4]) is bytes
    assert end == at
    if error is None:
        assert codec.next_frame(buffer, end) is None
    else:
        with pytest.raises(RemotingProtocolError) as refused:
            codec.next_frame(buffer, end)
        assert str(refused.value) == error
    return items


def _frame(header: bytes, body: bytes = b"", kind: int = codec.JSON) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


# ---------------------------------------------------------------- decode_frames


@given(st.lists(commands(), max_size=5), st.binary(max_size=8), st.data())
@settings(max_examples=500, deadline=None)
def test_decode_frames_reads_what_next_frame_reads(commands, prefix, data):
    frames = [_encoded(c) for c in commands]
    buffer = prefix + b"".join(frames)
    check_decode_frames(buffer, len(prefix))
    cut = data.draw(st.integers(len(prefix), len(buffer)))
    check_decode_frames(buffer[:cut], len(prefix))


@given(st.lists(commands(plain_text), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_decode_frames_does_not_defer_what_clients_send(commands):
    """JSON commands of ints within 64 bits and text without lone surrogates are decoded
    natively; only ROCKETMQ frames are deferred."""
    commands = [c for c in commands if c.serialize_type == codec.ROCKETMQ or
                all(-I64 <= n < I64 for n in (c.code, c.opaque, c.flag, c.version))]  # fmt: skip
    items = check_decode_frames(b"".join(codec.encode(c) for c in commands))
    assert [len(item) for item in items] == [
        8 if c.serialize_type == codec.JSON else 2 for c in commands
    ]


@given(st.lists(commands(), min_size=1, max_size=3), st.integers(0, 2**16), st.binary(max_size=4))
@settings(max_examples=500, deadline=None)
def test_decode_frames_of_mutated_buffers(commands, at, value):
    buffer = bytearray(b"".join(_encoded(c) for c in commands))
    at %= len(buffer)
    buffer[at : at + len(value)] = value
    check_decode_frames(bytes(buffer))


@given(st.binary(max_size=300), st.integers(0, 8))
@settings(max_examples=500, deadline=None)
def test_decode_frames_of_random_bytes(data, pos):
    check_decode_frames(data, pos)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_decode_frames_of_random_json_headers(header):
    check_decode_frames(_frame(b'{"code":1,"x":"' + header + b'"}', b"b") + _frame(header))


json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    any_text,
)  # fmt: skip
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(any_text, inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def json_headers(draw) -> bytes:
    """JSON headers as clients write them and as they should not (as in
    test_remoting_codec), plus ignored keys of any JSON value, duplicate keys and
    whitespace."""
    fields: list[tuple[str, object]] = []
    for key in ("code", "opaque", "flag", "version", "language", "remark", "extFields"):
        for _ in range(draw(st.integers(0, 2))):
            if key == "extFields":
                value = draw(st.one_of(st.dictionaries(any_text, any_text, max_size=4),
                                       st.dictionaries(any_text, json_scalar, max_size=3),
                                       json_scalar))  # fmt: skip
            elif key in ("language", "remark"):
                value = draw(st.one_of(any_text, json_scalar))
            else:
                value = draw(st.one_of(st.integers(-(2**31), 2**31), json_scalar))
            fields.append((key, value))
    fields += draw(st.lists(st.tuples(any_text, json_value), max_size=3))
    fields = draw(st.permutations(fields))
    ascii_ = draw(st.booleans())
    space = draw(st.sampled_from(["", " ", "\n\t\r "]))
    text = (
        "{" + space
        + f"{space},{space}".join(
            json.dumps(k, ensure_ascii=ascii_) + space + ":" + space
            + json.dumps(v, ensure_ascii=ascii_)
            for k, v in fields
        )
        + space + "}"
    )  # fmt: skip
    return text.encode("utf-8", "surrogatepass")


@given(json_headers(), st.binary(max_size=16))
@settings(max_examples=500, deadline=None)
def test_decode_frames_of_generated_json_headers(header, body):
    check_decode_frames(_frame(header, body))


SEND_HEADER = (
    b'{"code":310,"extFields":{"a":"producer_group","b":"TopicTest","c":"TBW102","d":"4",'
    b'"e":"3","f":"0","g":"1764150000000","h":"0","i":"UNIQ_KEY\\u000189AB00000000000000000000'
    b'00000001\\u0002WAIT\\u0001true\\u0002TAGS\\u0001TagA\\u0002","j":"0","k":"false",'
    b'"m":"false"},"flag":0,"language":"JAVA","opaque":12345,"serializeTypeCurrentRPC":"JSON",'
    b'"version":399}'
)

FAST_HEADERS = [
    SEND_HEADER,
    b'{"code":1}',
    b' \t\r\n{ "code" : 1 ,\n"opaque"\t:2 }\r\n ',
    b'{"code":1,"code":2,"opaque":3,"opaque":-4}',
    b'{"code":1,"extFields":{"a":"1","b":"2","a":"3"}}',
    b'{"code":1,"extFields":{"a":"1"},"extFields":{"b":"2"}}',
    b'{"code":1,"extFields":{"a":"1"},"extFields":null}',
    b'{"code":1,"extFields":{}}',
    b'{"co\\u0064e":5,"ext\\u0046ields":{"k\\"\\\\":"v\\/\\b\\f\\n\\r\\t"}}',
    b'{"code":1,"remark":"\\ud83d\\ude00 \\uD83D\\uDE00","language":"\\u00e9"}',
    '{"code":1,"remark":"é😀\x7f\u2028","language":"日本"}'.encode(),
    b'{"code":1,"remark":"x","remark":null}',
    b'{"code":1,"remark":null,"remark":"x"}',
    b'{"code":-0,"flag":-0,"version":0}',
    b'{"code":9223372036854775807,"opaque":-9223372036854775808}',
    b'{"code":1,"x":[1.5e10,-0.0,1E+2,2e-3,{"y":[true,false,null]},"\\u0000"],"z":{},"w":[]}',
    b'{"code":1,"x":123456789012345678901234567890,"y":1e400,"language":"GO"}',
    b'{"code":1,"extFields":{"i":"K\\u0001v\\u0002W\\u0001true"}}',
    b'{"code":1,"":"","\\u0000":0}',
    b'{"code":1,"x":' + b"[" * 60 + b"]" * 60 + b"}",
]


@pytest.mark.parametrize("header", FAST_HEADERS)
def test_decode_frames_of_json_headers_on_the_fast_path(header):
    (item,) = check_decode_frames(_frame(header, b"body"))
    assert len(item) == 8


DEFERRED_HEADERS = [
    b"",
    b"\xef\xbb\xbf" + b'{"code":1}',  # BOM
    b'{"code":1} x',
    b'{"code":1}{}',
    b'{"code":1,}',
    b'{"code":1,,"flag":0}',
    b'{"code" 1}',
    b"{'code':1}",
    b'{"code":1/*c*/}',
    b'\x0b{"code":1}',
    b'\x0c{"code":1}',
    b'{"code":1}\x00',
    '{"code":1}'.encode("utf-16-le"),
    '{"code":1}'.encode("utf-16"),
    b"[]",
    b"1",
    b"{}",
    b'{"opaque":1}',
    b'{"code":1.0}',
    b'{"code":1e2}',
    b'{"code":"1"}',
    b'{"code":true}',
    b'{"code":null}',
    b'{"code":01}',
    b'{"code":-}',
    b'{"code":+1}',
    b'{"code":1.}',
    b'{"code":.5}',
    b'{"code":9223372036854775808}',
    b'{"code":-9223372036854775809}',
    b'{"code":1,"opaque":18446744073709551615}',
    b'{"code":1,"flag":1.5}',
    b'{"code":1,"version":"409"}',
    b'{"code":1,"extFields":{"a":1}}',
    b'{"code":1,"extFields":{"a":"1","b":true}}',
    b'{"code":1,"extFields":{"a":null}}',
    b'{"code":1,"extFields":{"a":{}}}',
    b'{"code":1,"extFields":[]}',
    b'{"code":1,"extFields":"x"}',
    b'{"code":1,"remark":"\\ud800"}',
    b'{"code":1,"remark":"\\udc00"}',
    b'{"code":1,"remark":"\\ud800\\u0041"}',
    b'{"code":1,"remark":"\\ude00\\ud83d"}',
    b'{"code":1,"extFields":{"a":"\\ud800x"}}',
    b'{"code":1,"extFields":{"\\udfff":"x"}}',
    b'{"code":1,"x":"\\ud800"}',
    b'{"code":1,"remark":"\xff"}',
    b'{"code":1,"remark":"\xed\xa0\x80"}',  # a surrogate in UTF-8 form
    b'{"code":1,"remark":"\xc3"}',
    b'{"code":1,"remark":"a\nb"}',
    b'{"code":1,"remark":"a\x1fb"}',
    b'{"code":1,"remark":5}',
    b'{"code":1,"remark":true}',
    b'{"code":1,"language":null}',
    b'{"code":1,"language":3}',
    b'{"code":1,"x":NaN}',
    b'{"code":1,"x":Infinity}',
    b'{"code":1,"x":-Infinity}',
    b'{"code":1,"x":"\\x"}',
    b'{"code":1,"x":"\\u12"}',
    b'{"code":1,"x":"\\u12g4"}',
    b'{"code":1,"x":"\\U0041"}',
    b'{"code":1,"x":tru}',
    b'{"code":1,"x":[1,]}',
    b'{"code":1,"x":[1 2]}',
    b'{"code":1,"x":{"a"}}',
    b'{"code":1,"x":' + b"[" * 100 + b"]" * 100 + b"}",
    b'{"code":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"code":1,"remark":"unterminated}',
    b'{"code":1',
]


@pytest.mark.parametrize("header", DEFERRED_HEADERS)
def test_decode_frames_defers_json_headers_off_the_fast_path(header):
    (item,) = check_decode_frames(_frame(header, b"body"))
    assert item == (0, 4 + 4 + len(header) + 4)


@pytest.mark.parametrize(
    "buffer, listed, error",
    [
        (b"", 0, None),
        (b"\x00\x00\x00", 0, None),
        (b"\x00\x00\x00\x08\x00\x00\x00\x00\x7b", 0, None),  # not whole yet
        (struct.pack(">i", 3), 0, "frame length 3 outside 4..16777216"),
        (struct.pack(">i", -1), 0, "frame length -1 outside 4..16777216"),
        (struct.pack(">i", -(2**31)), 0, f"frame length {-(2**31)} outside 4..16777216"),
        (struct.pack(">i", 16 * 1024 * 1024 + 1), 0, "frame length 16777217 outside 4..16777216"),
        (struct.pack(">i", 16 * 1024 * 1024), 0, None),  # in range, not whole yet
        (struct.pack(">ii", 4, 0), 1, None),  # an empty JSON header: deferred
        (struct.pack(">ii", 4, 5), 1, None),  # the header runs past the frame
        (struct.pack(">ii", 4, 1 << 24), 1, None),  # ROCKETMQ
        (struct.pack(">ii", 4, 2 << 24), 1, None),  # an unknown serialize type
        (struct.pack(">ii", 4, -1), 1, None),
        (_frame(b'{"code":1}') * 3 + struct.pack(">i", 2), 3, "frame length 2 outside 4..16777216"),
        (_frame(b'{"code":1}') + _frame(b"{}") + _frame(b'{"code":2}'), 3, None),
    ],
)
def test_decode_frames_at_the_frame_level(buffer, listed, error):
    items = check_decode_frames(buffer)
    assert len(items) == listed
    assert ferry_native.decode_frames(buffer, 0)[2] == error


def test_decode_frames_from_any_position():
    buffer = _frame(b'{"code":1}', b"x") * 2
    for pos in range(len(buffer) + 2):
        check_decode_frames(buffer, pos)
    with pytest.raises(OverflowError):
        ferry_native.decode_frames(buffer, -1)
    with pytest.raises(TypeError):
        ferry_native.decode_frames(memoryview(buffer), 0)


def test_decode_frames_of_a_typical_send():
    body = bytes(range(128))
    ((code, opaque, flag, ext, got_body, remark, language, version),), end, error = (
        ferry_native.decode_frames(_frame(SEND_HEADER, body), 0)
    )
    assert (code, opaque, flag, remark, language, version) == (310, 12345, 0, None, "JAVA", 399)
    properties = "UNIQ_KEY\x0189AB0000000000000000000000000001\x02WAIT\x01true\x02TAGS\x01TagA\x02"
    assert ext["i"] == properties
    assert list(ext) == ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m"]
    assert (got_body, end, error) == (body, 4 + 4 + len(SEND_HEADER) + 128, None)


# ---------------------------------------------------------------- encode_json_frame


def check_encode_json_frame(c: Command) -> bytes | None:
    """encode_json_frame against codec.encode: equal bytes, or None exactly where the
    fast path stops (a lone surrogate, an int beyond 64 bits, a frame over 16 MiB)."""
    native = ferry_native.encode_json_frame(
        c.code, c.opaque, c.flag, c.ext, c.body, c.remark, c.language, c.version
    )
    texts = [c.language, *c.ext, *c.ext.values()] + ([] if c.remark is None else [c.remark])
    ints = (c.code, c.opaque, c.flag, c.version)
    try:
        python = codec.encode(c)
    except RemotingProtocolError:
        python = None
    if all(map(_utf8, texts)) and all(-I64 <= n < I64 for n in ints) and python is not None:
        assert native == python
    else:
        assert native is None
    return native


@given(commands())
@settings(max_examples=500, deadline=None)
def test_encode_json_frame_writes_what_encode_writes(command):
    command.serialize_type = codec.JSON
    check_encode_json_frame(command)


def test_encode_json_frame_of_every_character_below_0x80_and_beyond():
    text = "".join(map(chr, range(0x80))) + "é\u2028\ufeff😀\U0010ffff"
    for c in (
        Command(1, ext={text: text}, remark=text, language=text),
        Command(1, ext={"": ""}, remark="", language=""),
        Command(-(2**63), -(2**63), 2**63 - 1, {}, b"", None, "JAVA", 2**63 - 1),
        Command(0, 12345, 1, {"msgId": "7F00000100002A9F0000000000001234"}, b"", None, "", 409),
    ):
        assert check_encode_json_frame(c) is not None


@pytest.mark.parametrize(
    "args",
    [
        (True, 0, 0, {}, b"", None, "JAVA", 0),  # a bool is not written as an int
        (1, 0, 0, {"a": 1}, b"", None, "JAVA", 0),  # not yet a string
        (1, 0, 0, {1: "a"}, b"", None, "JAVA", 0),
        (1, 0, 0, {"a": "\ud800"}, b"", None, "JAVA", 0),
        (1, 0, 0, {"\udfff": "a"}, b"", None, "JAVA", 0),
        (1, 0, 0, {}, b"", "\ud83d", "JAVA", 0),
        (1, 0, 0, {}, b"", None, "\udc00", 0),
        (1, 0, 0, {}, b"", None, None, 0),
        (1, 0, 0, {}, b"", 5, "JAVA", 0),
        (1, 0, 0, {}, bytearray(b"x"), None, "JAVA", 0),
        (1, 0, 0, [], b"", None, "JAVA", 0),
        (2**63, 0, 0, {}, b"", None, "JAVA", 0),
        (1, -(2**63) - 1, 0, {}, b"", None, "JAVA", 0),
        (1, 0, 1.0, {}, b"", None, "JAVA", 0),
        (1, 0, 0, {}, b"x" * (16 * 1024 * 1024), None, "JAVA", 0),  # over 16 MiB
    ],
)
def test_encode_json_frame_defers(args):
    assert ferry_native.encode_json_frame(*args) is None


def test_encode_json_frame_up_to_the_frame_limit():
    header_len = len(codec.encode(Command(1))) - 8
    body = b"x" * (16 * 1024 * 1024 - 4 - header_len)
    assert check_encode_json_frame(Command(1, body=body)) is not None
    assert check_encode_json_frame(Command(1, body=body + b"x")) is None


# ---------------------------------------------------------------- properties


def _python(function, argument):
    try:
        return function(argument)
    except (record.RecordError, UnicodeError, TypeError):
        return None


@given(st.dictionaries(any_text, any_text, max_size=6))
@settings(max_examples=500, deadline=None)
def test_encode_properties_writes_what_record_writes(properties):
    encoded = ferry_native.encode_properties(properties)
    assert encoded == _python(record.encode_properties, properties)
    if encoded is not None:
        decoded = ferry_native.decode_properties(encoded)
        assert list(decoded.items()) == list(properties.items())


@given(st.lists(st.tuples(any_text, any_text), max_size=6), st.binary(max_size=8), st.data())
@settings(max_examples=500, deadline=None)
def test_decode_properties_reads_what_record_reads(items, noise, data):
    text = "".join(f"{k}\x01{v}\x02" if data.draw(st.booleans()) else k + "\x02" for k, v in items)
    raw = text.encode("utf-8", "surrogatepass")
    at = data.draw(st.integers(0, len(raw)))
    for blob in (raw, raw[:at] + noise + raw[at:], noise):
        decoded = ferry_native.decode_properties(blob)
        python = _python(record.decode_properties, blob)
        assert decoded == python
        if decoded is not None:
            assert list(decoded.items()) == list(python.items())


@pytest.mark.parametrize(
    "data",
    [b"", b"\x02\x02", b"a\x01b", b"a\x01b\x02a\x01c\x02", b"a\x01\x01b\x02", b"\x01\x02",
     b"a\x02", b"a\x01b\x02c", b"\xff\x01a\x02", b"\xed\xa0\x80\x01a\x02", "é\x01😀\x02".encode()],
)  # fmt: skip
def test_decode_properties_edge_cases(data):
    assert ferry_native.decode_properties(data) == _python(record.decode_properties, data)
    assert ferry_native.decode_properties(bytearray(data)) is None  # not bytes: deferred


@pytest.mark.parametrize(
    "properties",
    [{}, {"": ""}, {"a\x01": "b"}, {"a": "b\x02"}, {"a": "\ud800"}, {"a": 1}, {1: "a"}, [("a", 1)]],
)  # fmt: skip
def test_encode_properties_edge_cases(properties):
    python = _python(record.encode_properties, properties) if type(properties) is dict else None
    assert ferry_native.encode_properties(properties) == python
