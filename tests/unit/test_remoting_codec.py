"""ferry.remoting's codec, bodies and server: round trips, golden bytes,
decoders that only ever raise their protocol error, and the server's
pipelining, oneway, unknown-code and bad-frame behaviour on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.remoting import bodies, codec, codes
from ferry.remoting.client import RemotingClient, call, recv_command
from ferry.remoting.codec import Command, RemotingProtocolError
from ferry.remoting.server import Batchable, RemotingServer
from tests.conftest import LoopThread
from tests.waiting import wait_for

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ext = st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1,
                              max_size=12), text, max_size=6)  # fmt: skip


@st.composite
def commands(draw, serialize_type=None):
    kind = (
        draw(st.sampled_from([codec.JSON, codec.ROCKETMQ]))
        if serialize_type is None
        else serialize_type
    )
    return Command(
        code=draw(st.integers(-32768, 32767)),
        opaque=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(0, 3)),
        ext=draw(ext),
        body=draw(st.binary(max_size=200)),
        remark=draw(st.one_of(st.none(), text.filter(bool))),
        language=draw(st.sampled_from(codec.LANGUAGES)),
        version=draw(st.integers(0, 32767)),
        serialize_type=kind,
    )


@given(commands())
@settings(max_examples=300, deadline=None)
def test_round_trip(command):
    frame = codec.encode(command)
    assert codec.frame_length(frame[:4]) == len(frame) - 4
    assert codec.decode(frame[4:]) == command


@given(st.binary(max_size=300))
@settings(max_examples=1000, deadline=None)
def test_random_bytes_only_raise_the_protocol_error(data):
    try:
        codec.frame_length(data[:4].ljust(4, b"\0"))
        codec.decode(data)
    except RemotingProtocolError:
        pass


@given(commands(), st.integers(0, 400), st.integers(0, 255))
@settings(max_examples=500, deadline=None)
def test_mutated_frames_only_raise_the_protocol_error(command, at, value):
    frame = bytearray(codec.encode(command)[4:])
    frame[at % len(frame)] = value
    with contextlib.suppress(RemotingProtocolError):
        codec.decode(frame)


def test_json_header_golden_bytes():
    frame = codec.encode(Command(310, 7, 0, {"a": "pg", "b": "T"}, b"hi", None, "JAVA", 409))
    header = b'{"code":310,"extFields":{"a":"pg","b":"T"},"flag":0,"language":"JAVA","opaque":7,' \
             b'"serializeTypeCurrentRPC":"JSON","version":409}'  # fmt: skip
    assert frame == struct.pack(">ii", 4 + len(header) + 2, len(header)) + header + b"hi"


def test_binary_header_golden_bytes():
    frame = codec.encode(
        Command(11, 5, 1, {"k": "v"}, b"", "r", "GO", 317, serialize_type=codec.ROCKETMQ)
    )
    header = (
        struct.pack(">hbhii", 11, 9, 317, 5, 1) + struct.pack(">i", 1) + b"r"
        + struct.pack(">i", 2 + 1 + 4 + 1) + struct.pack(">h", 1) + b"k" + struct.pack(">i", 1) + b"v"
    )  # fmt: skip
    assert frame == struct.pack(">ii", 4 + len(header), (1 << 24) | len(header)) + header


def test_lenient_json_decoding():
    """Numbers and booleans as extField values (some third-party clients),
    missing remark/extFields, a language given as its ordinal."""
    header = json.dumps({"code": 34, "extFields": {"n": 5, "t": True, "z": None},
                         "language": 9, "opaque": "12"}).encode()  # fmt: skip
    command = codec.decode(struct.pack(">i", len(header)) + header)
    assert command.ext == {"n": "5", "t": "true"}
    assert (command.language, command.opaque, command.flag, command.remark) == ("GO", 12, 0, None)


def test_a_lone_surrogate_becomes_a_question_mark():
    """A JSON header or body can carry a lone surrogate (a \\udc80 escape);
    UTF-8, protobuf and JSON answers cannot. Decoding makes it "?", what a
    Java client's binary header carries for it; an answer holding one still
    encodes (JSON escapes it, the binary header writes "?")."""
    header = b'{"code":101,"extFields":{"namespace":"n\\udc80","k\\ud800":"\\ud83d\\ude00"},' \
             b'"remark":"\\udfff"}'  # fmt: skip
    command = codec.decode(struct.pack(">i", len(header)) + header)
    assert command.ext == {"namespace": "n?", "k?": "\U0001f600"}  # a real pair stays
    assert command.remark == "?"
    assert bodies.loads(b'{"clientID":"\\udc80x","sets":[{"\\udc80":1}]}') == {
        "clientID": "?x",
        "sets": [{"?": 1}],
    }
    nested = b"[" * 900 + b'"\\udc80"' + b"]" * 900
    with pytest.raises(RemotingProtocolError):
        codec.decode(struct.pack(">i", len(nested)) + nested)
    with pytest.raises(bodies.BodyError):
        bodies.loads(nested)
    for kind in (codec.JSON, codec.ROCKETMQ):
        answer = Command(22, 1, 1, {"key": "k\udc80"}, b"", "no item \udc80", serialize_type=kind)
        back = codec.decode(codec.encode(answer)[4:])
        assert (back.ext, back.remark) == ({"key": "k?"}, "no item ?")
    assert bodies.dumps({"k": "\udc80"}) == b'{"k":"\\udc80"}'


@pytest.mark.parametrize(
    "header",
    [b"[1,2]", b'{"opaque":1}', b'{"code":"x"}', b'{"code":1,"extFields":[1]}',
     b'{"code":1,"extFields":{"a":{"b":1}}}', b"\xff\xfe", b"[" * 5000],
)  # fmt: skip
def test_bad_json_headers(header):
    with pytest.raises(RemotingProtocolError):
        codec.decode(struct.pack(">i", len(header)) + header)


def test_frame_limits():
    with pytest.raises(RemotingProtocolError):
        codec.frame_length(struct.pack(">i", codec.MAX_FRAME + 1))
    with pytest.raises(RemotingProtocolError):
        codec.frame_length(struct.pack(">i", 3))
    with pytest.raises(RemotingProtocolError, match="header length"):
        codec.decode(struct.pack(">i", 100) + b"{}")
    with pytest.raises(RemotingProtocolError, match="int16"):
        codec.encode(Command(200050, serialize_type=codec.ROCKETMQ))


def test_answers_use_the_request_serialize_type_and_string_values():
    request = Command(14, 9, serialize_type=codec.ROCKETMQ)
    answer = request.answer(0, ext={"offset": 5, "ok": True})
    assert (answer.opaque, answer.flag, answer.serialize_type) == (9, 1, codec.ROCKETMQ)
    assert answer.ext == {"offset": "5", "ok": "true"}


def test_bodies():
    assert bodies.dumps({"a": [1, "b"]}) == b'{"a":[1,"b"]}'
    assert bodies.loads(b'{"brokerAddrs":{0:"h:1",1:"h:2"},"s":"{2:3}"}') == {
        "brokerAddrs": {"0": "h:1", "1": "h:2"}, "s": "{2:3}"}  # fmt: skip
    assert bodies.dumps_object_keyed([({"queueId": 0}, {"o": 1})]) == '{{"queueId":0}:{"o":1}}'
    for bad in (b"\xff", b"{x}", b"[" * 10000):
        with pytest.raises(bodies.BodyError):
            bodies.loads(bad)


# ---------------------------------------------------------------- server


@pytest.fixture
def served():
    """A RemotingServer with an echo handler (code 1, answers after a delay
    given in the request) and a handler that raises (code 2)."""
    loop = LoopThread()
    seen: list[Command] = []

    async def echo(connection, command):
        seen.append(command)
        await asyncio.sleep(float(command.ext.get("delay", "0")))
        return command.answer(0, ext={"n": command.ext.get("n", "")}, body=command.body)

    async def broken(connection, command):
        raise RuntimeError("handler bug")

    server = RemotingServer("test", {1: echo, 2: broken})
    port = loop.run(server.listen("127.0.0.1", 0))
    yield loop, server, f"127.0.0.1:{port}", seen
    loop.run(server.stop())
    loop.close()


def test_pipelined_answers_match_by_opaque_in_any_order(served):
    loop, _, addr, _ = served

    async def go():
        client = await RemotingClient.connect(addr)
        requests = [Command(1, ext={"n": str(i), "delay": str((50 - i) / 1000)}) for i in range(50)]
        answers = await asyncio.gather(*(client.request(r) for r in requests))
        client.close()
        return answers

    answers = loop.run(go())
    assert [a.ext["n"] for a in answers] == [str(i) for i in range(50)]


def test_unknown_code_handler_error_and_oneway(served):
    loop, _, addr, seen = served
    answer = call(addr, Command(77))
    assert (answer.code, answer.remark) == (codes.REQUEST_CODE_NOT_SUPPORTED,
                                            " request type 77 not supported")  # fmt: skip
    answer = call(addr, Command(2))
    assert answer.code == codes.SYSTEM_ERROR and "handler bug" in answer.remark

    async def oneway():
        client = await RemotingClient.connect(addr)
        client.oneway(Command(1, ext={"n": "ow"}))
        answer = await client.request(Command(1, ext={"n": "after"}))
        client.close()
        return answer

    assert loop.run(oneway()).ext["n"] == "after"
    assert [c.ext["n"] for c in seen][-2:] == ["ow", "after"]  # the oneway ran, unanswered


@pytest.mark.parametrize(
    "junk",
    [struct.pack(">i", codec.MAX_FRAME + 1), struct.pack(">ii", 8, 100) + b"abcd",
     struct.pack(">ii", 6, 2) + b"{}", struct.pack(">ii", 4, 7 << 24)],
    ids=["oversized", "lying-header-length", "bad-json", "unknown-type"],
)  # fmt: skip
def test_bad_frames_close_only_their_connection(served, junk):
    loop, server, addr, _ = served
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(junk)
        assert sock.recv(100) == b""  # closed, no reply
    assert call(addr, Command(1, ext={"n": "next"})).ext["n"] == "next"


def test_server_requests_to_clients(served):
    loop, server, addr, _ = served

    async def go():
        client = await RemotingClient.connect(
            addr, on_request=lambda c: c.answer(0, ext={"r": "1"})
        )
        await client.request(Command(1))  # the server has the connection now
        (connection,) = server.connections
        answer = await connection.request(Command(40, ext={"consumerGroup": "g"}), timeout=5)
        connection.oneway(Command(40))
        client.close()
        await connection.closed.wait()
        return answer

    assert loop.run(go()).ext == {"r": "1"}


def test_runs_of_a_batchable_code_reach_its_handler_together_and_in_order():
    """Frames of a Batchable's code that arrive back to back in one read are one call
    of `many`; a frame of another code ends the run (the order is kept); a oneway in a
    run gets no answer; answers go out matched by opaque; a `many` that raises answers
    SYSTEM_ERROR to each of its run."""
    loop = LoopThread()
    calls: list[list[str]] = []
    order: list[str] = []

    async def one(connection, command):
        calls.append([command.ext["n"]])
        order.append(command.ext["n"])
        return command.answer(0, ext={"n": command.ext["n"]})

    async def many(connection, commands):
        calls.append([c.ext["n"] for c in commands])
        order.extend(c.ext["n"] for c in commands)
        if any(c.ext["n"] == "boom" for c in commands):
            raise RuntimeError("many failed")
        return [c.answer(0, ext={"n": c.ext["n"]}) for c in commands]

    async def plain(connection, command):
        order.append(command.ext["n"])
        return command.answer(0, ext={"n": command.ext["n"]})

    server = RemotingServer("test", {5: Batchable(one, many), 6: plain})
    port = loop.run(server.listen("127.0.0.1", 0))

    def frames(*items: tuple[int, str, int]) -> bytes:
        return b"".join(codec.encode(Command(c, opaque, flag, {"n": n})) for c, n, opaque, flag
                        in ((c, n, i + 1, flag) for i, (c, n, flag) in enumerate(items)))  # fmt: skip

    def answers(sock: socket.socket, count: int) -> dict[int, str]:
        got: dict[int, str] = {}
        buffer = bytearray()
        while len(got) < count:
            answer = recv_command(sock, buffer)
            got[answer.opaque] = (answer.code, answer.ext.get("n"))
        return got

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(frames((5, "a", 0), (5, "b", 0), (5, "ow", codec.FLAG_ONEWAY),
                                (6, "x", 0), (5, "c", 0)))  # fmt: skip
            got = answers(sock, 4)
            assert got == {1: (0, "a"), 2: (0, "b"), 4: (0, "x"), 5: (0, "c")}
            wait_for(lambda: len(order) == 5, what="every request handled")
            assert calls == [["a", "b", "ow"], ["c"]] and order == ["a", "b", "ow", "x", "c"]
            sock.sendall(frames((5, "boom", 0), (5, "d", 0)))
            assert answers(sock, 2) == {
                1: (codes.SYSTEM_ERROR, None),
                2: (codes.SYSTEM_ERROR, None),
            }
    finally:
        loop.run(server.stop())
        loop.close()


def test_a_oneway_request_of_another_batchable_code_does_not_break_a_run():
    """Java's producer writes END_TRANSACTION (oneway) between its sends: those wait
    aside in a run of their own code, dispatched after the run, each code in its order;
    a request of that code that expects an answer still ends the run, after the aside."""
    loop = LoopThread()
    calls: list[list[str]] = []

    async def many(connection, commands):
        calls.append([c.ext["n"] for c in commands])
        return [c.answer(0, ext={"n": c.ext["n"]}) for c in commands]

    async def one(connection, command):
        return (await many(connection, [command]))[0]

    server = RemotingServer("test", {5: Batchable(one, many), 7: Batchable(one, many)})
    port = loop.run(server.listen("127.0.0.1", 0))
    ow = codec.FLAG_ONEWAY

    def frames(*items: tuple[int, str, int]) -> bytes:
        return b"".join(
            codec.encode(Command(c, i + 1, flag, {"n": n})) for i, (c, n, flag) in enumerate(items)
        )

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(frames((5, "a", 0), (7, "e1", ow), (5, "b", 0), (7, "e2", ow),
                                (5, "c", 0)))  # fmt: skip
            wait_for(lambda: len(calls) == 2, what="two runs handled")
            assert calls == [["a", "b", "c"], ["e1", "e2"]]
            calls.clear()
            sock.sendall(frames((5, "a", 0), (7, "e1", ow), (7, "f", 0), (5, "b", 0)))
            wait_for(lambda: len(calls) == 4, what="four runs handled")
            assert calls == [["a"], ["e1"], ["f"], ["b"]]
    finally:
        loop.run(server.stop())
        loop.close()


def _reference_json_header(command: Command) -> bytes:
    """The JSON header as json.dumps writes it (what the hand-built encoder must match)."""
    fields: dict[str, object] = {"code": command.code}
    if command.ext:
        fields["extFields"] = command.ext
    fields.update(flag=command.flag, language=command.language, opaque=command.opaque)
    if command.remark is not None:
        fields["remark"] = command.remark
    fields.update(serializeTypeCurrentRPC="JSON", version=command.version)
    try:
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(fields, separators=(",", ":")).encode()


any_text = st.text(max_size=20)  # lone surrogates and control characters included


@given(commands(codec.JSON), st.dictionaries(any_text, any_text, max_size=4),
       st.one_of(st.none(), any_text))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_json_headers_are_what_json_dumps_writes(command, ext, remark):
    for c in (command, Command(command.code, ext=ext, remark=remark)):
        frame = codec.encode(c)
        assert frame[8:] == _reference_json_header(c) + c.body


def test_control_character_escapes_are_not_scrubbed():
    """A send's properties arrive as \\u0001/\\u0002 escapes: decoded as themselves, and
    the decoded extFields are the strings as parsed."""
    header = b'{"code":310,"extFields":{"i":"K\\u0001v\\u0002W\\u0001true","b":"T",' \
             b'"x":"\\\\ud800"},"opaque":3}'  # fmt: skip
    command = codec.decode(struct.pack(">i", len(header)) + header)
    assert command.ext == {"i": "K\x01v\x02W\x01true", "b": "T", "x": "\\ud800"}


def test_next_frame_waits_for_a_whole_frame_and_says_where_the_next_starts():
    one, two = codec.encode(Command(1, opaque=1)), codec.encode(Command(2, opaque=2, body=b"x"))
    buffer = one + two
    for cut in range(len(one)):
        assert codec.next_frame(buffer[:cut]) is None
    first, end = codec.next_frame(buffer)
    assert (first.code, end) == (1, len(one))
    second, end = codec.next_frame(buffer, end)
    assert (second.code, second.body, end) == (2, b"x", len(buffer))
    assert codec.next_frame(buffer, end) is None


json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    any_text,
)  # fmt: skip


@st.composite
def json_headers(draw) -> bytes:
    """JSON headers as clients write them and as they should not: numbers as floats or
    beyond 64 bits, extField values of any JSON type, lone surrogate escapes, fields
    missing, whitespace and a BOM."""
    fields: dict[str, object] = {}
    for key in ("code", "opaque", "flag", "version"):
        if draw(st.integers(0, 9)):
            fields[key] = draw(st.one_of(st.integers(-(2**31), 2**31 - 1), json_scalar))
    if draw(st.booleans()):
        fields["language"] = draw(st.one_of(st.sampled_from(codec.LANGUAGES), json_scalar))
    if draw(st.booleans()):
        fields["remark"] = draw(json_scalar)
    if draw(st.booleans()):
        fields["extFields"] = draw(
            st.one_of(
                st.dictionaries(any_text, any_text, max_size=5),
                st.dictionaries(any_text, json_scalar, max_size=5),
                json_scalar,
            )
        )
    text = json.dumps(fields, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:
        text = " " + text + "\n"
    raw = text.encode("utf-8", "surrogatepass") if not text.isascii() else text.encode()
    return (b"\xef\xbb\xbf" if draw(st.integers(0, 19)) == 0 else b"") + raw


def _decoded(decoder, header: bytes):
    try:
        c = decoder(header)
    except RemotingProtocolError:
        return "refused"
    return (c.code, c.opaque, c.flag, c.ext, c.remark, c.language, c.version)


@given(json_headers())
@settings(max_examples=500, deadline=None)
def test_orjson_decodes_json_headers_as_the_stdlib_path_does(header):
    """The fast path (orjson) only ever answers what the lenient stdlib path would:
    the same command, or the same refusal."""
    assert _decoded(codec._decode_json, header) == _decoded(codec._decode_json_lenient, header)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_read_frames_serves_whole_frames_then_stops_at_a_bad_one(monkeypatch, native):
    """read_frames with and without ferry_native: the whole frames of a buffer (a JSON
    header, a binary one, an answer), the position after the last, and the error that
    stops it at a frame that breaks the format (nothing after it is read)."""
    if not native:
        monkeypatch.setattr(codec, "_native", None)
    elif codec._native is None:
        pytest.skip("ferry_native is not installed (FERRY_NO_NATIVE=1 or a plain pip install)")
    first = Command(310, 1, 0, {"a": "g", "b": "T"}, b"body")
    second = Command(11, 2, 0, {"topic": "T"}, b"", serialize_type=codec.ROCKETMQ)
    third = Command(0, 3, codec.FLAG_RESPONSE, {}, b"", "ok")
    good = codec.encode(first) + codec.encode(second) + codec.encode(third)
    commands, pos, error = codec.read_frames(bytearray(good + b"\x00\x00"))
    assert [(c.code, c.opaque, c.ext, c.body, c.serialize_type) for c in commands] == [
        (310, 1, {"a": "g", "b": "T"}, b"body", codec.JSON),
        (11, 2, {"topic": "T"}, b"", codec.ROCKETMQ),
        (0, 3, {}, b"", codec.JSON),
    ]
    assert (pos, error) == (len(good), None)  # the 2 bytes after wait for more
    bad = struct.pack(">i", 3)  # a length below the header word's 4
    commands, pos, error = codec.read_frames(bytearray(good + bad + codec.encode(first)))
    assert len(commands) == 3 and pos == len(good)
    assert isinstance(error, RemotingProtocolError) and "frame length 3" in str(error)
    header = b"{not json"
    broken = struct.pack(">ii", 4 + len(header), len(header)) + header
    commands, pos, error = codec.read_frames(bytearray(codec.encode(first) + broken))
    assert len(commands) == 1 and pos == len(codec.encode(first))
    assert isinstance(error, RemotingProtocolError) and "does not parse" in str(error)
