"""RocketMQ's TCP protocol ("remoting"): the frame and its two header forms.
Encode/decode only: no sockets, logging or config. All integers big-endian.

A frame:

| field       | bytes | meaning                                                   |
|-------------|-------|-----------------------------------------------------------|
| length      | 4     | bytes that follow (header word + header + body)           |
| header word | 4     | high byte: serialize type (0 JSON, 1 ROCKETMQ); low 24    |
|             |       | bits: header length H                                     |
| header      | H     | the command's fields, in the serialize type's form        |
| body        | rest  | length − 4 − H bytes, possibly none                       |

The JSON header (every client's default) is one object: `code`, `language`
(an enum name such as "JAVA"), `version`, `opaque`, `flag` (bit 0 response,
bit 1 oneway), optional `remark` and `extFields` (string → string). Decoding is
lenient where clients differ (missing fields, numbers and booleans as extField
values, which become the strings Java would print; a lone surrogate escape
becomes "?", what the binary form of a Java client carries for it); encoding
is strict (every extField value a string, compact, no spaces).

The ROCKETMQ binary header:

| field    | bytes                                                           |
|----------|-----------------------------------------------------------------|
| code     | int16                                                           |
| language | int8 (the enum's ordinal)                                       |
| version  | int16                                                           |
| opaque   | int32                                                           |
| flag     | int32                                                           |
| remark   | int32 length + UTF-8 (length 0: none)                           |
| ext      | int32 length of the pairs, then pairs of int16 key length + key, |
|          | int32 value length + value                                      |

An answer goes back in the serialize type of its request. Every failure to
decode is a `RemotingProtocolError`; the connection carrying it is closed
without a reply.

`ferry.native` (compiled, optional) reads the frames of a buffer and writes a
JSON frame in one call each when it is installed; it takes only the common
case (a JSON header as every client writes it) and hands anything else back to
the Python below, which decides it as it would alone.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Mapping
from json.encoder import encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]

import orjson

from ferry.native import native as _native
from ferry.remoting.bodies import scrub

MAX_FRAME = 16 * 1024 * 1024  # Apache's com.rocketmq.remoting.frameMaxLength
JSON = 0
ROCKETMQ = 1
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
VERSION = 409  # MQVersion.Version.V4_9_8's ordinal: what ferry answers with
LANGUAGES = (
    "JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY",
    "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST",
)  # fmt: skip
_LANGUAGE_CODE = {name: code for code, name in enumerate(LANGUAGES)}

_LENGTH = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")  # length, header word
_BINARY_HEAD = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class RemotingProtocolError(Exception):
    """Bytes that break RocketMQ's frame or header format; the connection must
    be closed."""


@dataclasses.dataclass(slots=True)
class Command:
    """One request or response. `ext` values are strings on the way out."""

    code: int
    opaque: int = 0
    flag: int = 0
    ext: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    language: str = "PYTHON"
    version: int = VERSION
    serialize_type: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def answer(
        self,
        code: int,
        remark: str | None = None,
        ext: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> Command:
        """The response to this request: its opaque, its serialize type, the
        response flag; `ext` values as the strings Java would print."""
        ext_text = {k: _text(v) for k, v in ext.items()} if ext else {}
        return self.answer_text(code, ext_text, body, remark)

    def answer_text(
        self, code: int, ext: dict[str, str], body: bytes = b"", remark: str | None = None
    ) -> Command:
        """`answer` for an `ext` whose values are strings already, taken as it is
        (every send's answer: no conversion pass)."""
        return Command(
            code, self.opaque, FLAG_RESPONSE, ext, body, remark, "JAVA", VERSION,
            self.serialize_type,
        )  # fmt: skip


def _text(value: object) -> str:
    """A header value as the string Java would print for it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


# ---------------------------------------------------------------- encode


def encode(command: Command) -> bytes:
    """The whole frame for `command`, length prefix included."""
    if _native is not None and command.serialize_type == JSON:
        frame = _native.encode_json_frame(
            command.code, command.opaque, command.flag, command.ext, command.body,
            command.remark, command.language, command.version,
        )  # fmt: skip
        if frame is not None:
            return frame
    if command.serialize_type == ROCKETMQ:
        header = _encode_binary(command)
    else:
        header = _encode_json(command)
    body = command.body
    length = 4 + len(header) + len(body)
    if length > MAX_FRAME:
        raise RemotingProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return b"".join(
        (_PREFIX.pack(length, (command.serialize_type << 24) | len(header)), header, body)
    )


def _encode_json(command: Command) -> bytes:
    """The header as `json.dumps(fields, separators=(",", ":"), ensure_ascii=False)`
    writes it, keys in this order. orjson writes those same bytes in a quarter of the
    time (every send's answer passes here); what it refuses (a lone surrogate, which
    UTF-8 cannot carry; a value that is not yet a string) goes the hand-built way."""
    fields: dict[str, object] = {"code": command.code}
    if command.ext:
        fields["extFields"] = command.ext
    fields["flag"] = command.flag
    fields["language"] = command.language
    fields["opaque"] = command.opaque
    if command.remark is not None:
        fields["remark"] = command.remark
    fields["serializeTypeCurrentRPC"] = "JSON"
    fields["version"] = command.version
    if _plain(fields):
        try:
            return orjson.dumps(fields)
        except TypeError:  # a lone surrogate
            pass
    try:
        return _json_header(command, encode_basestring).encode()
    except UnicodeEncodeError:
        # A lone surrogate (a JSON request can carry one as a \u escape, and
        # an answer may echo it): only the escaped form is valid UTF-8.
        return _json_header(command, encode_basestring_ascii).encode()


def _plain(fields: dict[str, object]) -> bool:
    """Every value as the header writes it: ints for the numbers (not bools), strings
    for the rest and for every extField."""
    for key in ("code", "flag", "opaque", "version"):
        if type(fields[key]) is not int:
            return False
    if type(fields["language"]) is not str or type(fields.get("remark", "")) is not str:
        return False
    ext = fields.get("extFields")
    return ext is None or all(type(v) is str for v in ext.values())  # type: ignore[attr-defined]


def _json_header(command: Command, quote) -> str:
    parts = ['{"code":', str(int(command.code))]
    if command.ext:
        parts.append(',"extFields":{')
        parts.append(",".join([f"{quote(k)}:{quote(_text(v))}" for k, v in command.ext.items()]))
        parts.append("}")
    parts += [',"flag":', str(int(command.flag)), ',"language":', quote(command.language)]
    parts += [',"opaque":', str(int(command.opaque))]
    if command.remark is not None:
        parts += [',"remark":', quote(command.remark)]
    parts += [',"serializeTypeCurrentRPC":"JSON","version":', str(int(command.version)), "}"]
    return "".join(parts)


def _encode_binary(command: Command) -> bytes:
    if not -32768 <= command.code <= 32767:
        raise RemotingProtocolError(
            f"code {command.code} does not fit the ROCKETMQ header's int16; use JSON"
        )
    parts = [
        _BINARY_HEAD.pack(
            command.code,
            _LANGUAGE_CODE.get(command.language, _LANGUAGE_CODE["OTHER"]),
            command.version,
            command.opaque,
            command.flag,
        )
    ]
    remark = _utf8_out(command.remark or "")
    parts += [_I32.pack(len(remark)), remark]
    pairs = []
    for key, value in command.ext.items():
        k, v = _utf8_out(key), _utf8_out(value)
        pairs += [_I16.pack(len(k)), k, _I32.pack(len(v)), v]
    ext = b"".join(pairs)
    parts += [_I32.pack(len(ext)), ext]
    return b"".join(parts)


def _utf8_out(text: str) -> bytes:
    """UTF-8 for the binary header; a lone surrogate, which UTF-8 cannot
    carry, becomes "?"."""
    return text.encode("utf-8", "replace")


# ---------------------------------------------------------------- decode


def frame_length(prefix: bytes | bytearray | memoryview) -> int:
    """The length word of a frame (the bytes after it), checked against the
    frame limit. `prefix` holds at least 4 bytes."""
    (length,) = _LENGTH.unpack_from(prefix)
    if length < 4 or length > MAX_FRAME:
        raise RemotingProtocolError(f"frame length {length} outside 4..{MAX_FRAME}")
    return length


def next_frame(buffer: bytes | bytearray, pos: int = 0) -> tuple[Command, int] | None:
    """The command whose frame (length word included) starts at `pos` of
    `buffer`, and the position just past it; None while the frame is not
    whole yet. Raises RemotingProtocolError as `frame_length` and `decode`."""
    if len(buffer) - pos < 4:
        return None
    view = memoryview(buffer)
    length = frame_length(view[pos : pos + 4])
    end = pos + 4 + length
    if len(buffer) < end:
        return None
    return decode(view[pos + 4 : end]), end


def read_frames(
    buffer: bytes | bytearray, pos: int = 0
) -> tuple[list[Command], int, RemotingProtocolError | None]:
    """Every whole frame of `buffer` from `pos` on: the commands, the position just
    past the last of them, and the error that stopped the reading at that position
    (None: the rest is a frame not yet whole). As `next_frame` in a loop."""
    commands: list[Command] = []
    if _native is None:
        try:
            while (found := next_frame(buffer, pos)) is not None:
                command, pos = found
                commands.append(command)
        except RemotingProtocolError as e:
            return commands, pos, e
        return commands, pos, None
    items, end, error = _native.decode_frames(buffer, pos)
    for item in items:
        if len(item) == 2:  # not the common case: decided here
            start, stop = item
            try:
                commands.append(decode(bytes(buffer[start + 4 : stop])))
            except RemotingProtocolError as e:
                return commands, start, e
        else:
            commands.append(Command(*item))
    return commands, end, None if error is None else RemotingProtocolError(error)


def decode(frame: bytes | bytearray | memoryview) -> Command:
    """A command from the bytes after the length word."""
    if len(frame) < 4:
        raise RemotingProtocolError("frame shorter than its header word")
    (word,) = _I32.unpack_from(frame)
    serialize_type = (word >> 24) & 0xFF
    header_len = word & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise RemotingProtocolError(
            f"header length {header_len} exceeds the frame's {len(frame) - 4} bytes"
        )
    header = bytes(frame[4 : 4 + header_len])
    body = bytes(frame[4 + header_len :])
    if serialize_type == JSON:
        command = _decode_json(header)
    elif serialize_type == ROCKETMQ:
        command = _decode_binary(header)
    else:
        raise RemotingProtocolError(f"unknown serialize type {serialize_type}")
    command.body = body
    return command


def _int(fields: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = fields.get(key, default)
    if isinstance(value, bool) or value is None:
        raise RemotingProtocolError(f"header field {key!r} missing or not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise RemotingProtocolError(f"header field {key!r} is not an integer: {value!r}")


# Only a \uD800-\uDFFF escape makes a lone surrogate. (Every send's properties carry
# \u0001 and \u0002 escapes: the fast path must not hinge on "\u" alone.)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _decode_json(header: bytes) -> Command:
    """orjson parses the header when it is what every client writes: an object whose
    numbers are ints and whose remark, language and extFields are strings (orjson turns
    an int beyond 64 bits into a float, and refuses NaN, a BOM or a lone surrogate).
    Anything else goes to the stdlib's lenient path, which decides it exactly as before."""
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError:
        return _decode_json_lenient(header)
    if type(fields) is not dict:
        return _decode_json_lenient(header)
    ext = fields.get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict or not all(type(v) is str for v in ext.values()):
        return _decode_json_lenient(header)
    code = fields.get("code")
    opaque = fields.get("opaque", 0)
    flag = fields.get("flag", 0)
    version = fields.get("version", 0)
    remark = fields.get("remark")
    language = fields.get("language", "JAVA")
    if (
        type(code) is not int
        or type(opaque) is not int
        or type(flag) is not int
        or type(version) is not int
        or (remark is not None and type(remark) is not str)
        or type(language) is not str
    ):
        return _decode_json_lenient(header)
    return Command(code, opaque, flag, ext, b"", remark, language, version, JSON)


def _decode_json_lenient(header: bytes) -> Command:
    try:
        fields = json.loads(header)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise RemotingProtocolError(f"JSON header does not parse: {e}") from None
    if _SURROGATE_ESCAPE.search(header) is not None:
        try:
            fields = scrub(fields)
        except RecursionError:
            raise RemotingProtocolError("JSON header nests too deeply") from None
    if not isinstance(fields, dict):
        raise RemotingProtocolError("JSON header is not an object")
    raw_ext = fields.get("extFields") or {}
    if not isinstance(raw_ext, dict):
        raise RemotingProtocolError("extFields is not an object")
    ext: dict[str, str] = raw_ext
    for value in raw_ext.values():
        if type(value) is not str:  # not what Java sends: the lenient path
            ext = {}
            for key, value in raw_ext.items():
                if isinstance(value, (dict, list)):
                    raise RemotingProtocolError(f"extFields[{key!r}] is not a scalar")
                if value is not None:
                    ext[key] = _text(value)
            break
    remark = fields.get("remark")
    language = fields.get("language", "JAVA")
    if isinstance(language, int) and not isinstance(language, bool):
        language = LANGUAGES[language] if 0 <= language < len(LANGUAGES) else "OTHER"
    return Command(
        code=_int(fields, "code"),
        opaque=_int(fields, "opaque", 0),
        flag=_int(fields, "flag", 0),
        ext=ext,
        remark=None if remark is None else _text(remark),
        language=language if isinstance(language, str) else "OTHER",
        version=_int(fields, "version", 0),
        serialize_type=JSON,
    )


def _decode_binary(header: bytes) -> Command:
    view = memoryview(header)
    if len(view) < _BINARY_HEAD.size:
        raise RemotingProtocolError("ROCKETMQ header shorter than its fixed fields")
    code, language, version, opaque, flag = _BINARY_HEAD.unpack_from(view)
    pos = _BINARY_HEAD.size
    remark, pos = _sized(view, pos, _I32, "remark")
    ext_bytes, pos = _sized(view, pos, _I32, "extFields")
    if pos != len(view):
        raise RemotingProtocolError(f"{len(view) - pos} stray bytes after the ROCKETMQ header")
    ext: dict[str, str] = {}
    p = 0
    while p < len(ext_bytes):
        key, p = _sized(ext_bytes, p, _I16, "extFields key")
        value, p = _sized(ext_bytes, p, _I32, "extFields value")
        ext[_utf8(key)] = _utf8(value)
    return Command(
        code=code,
        opaque=opaque,
        flag=flag,
        ext=ext,
        remark=_utf8(remark) if remark else None,
        language=LANGUAGES[language] if 0 <= language < len(LANGUAGES) else "OTHER",
        version=version,
        serialize_type=ROCKETMQ,
    )


def _sized(view: memoryview, pos: int, size: struct.Struct, what: str) -> tuple[memoryview, int]:
    if pos + size.size > len(view):
        raise RemotingProtocolError(f"ROCKETMQ header ends inside the length of {what}")
    (n,) = size.unpack_from(view, pos)
    pos += size.size
    if n < 0 or pos + n > len(view):
        raise RemotingProtocolError(f"{what} length {n} runs past the header")
    return view[pos : pos + n], pos + n


def _utf8(data: memoryview) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise RemotingProtocolError(f"header text is not UTF-8: {e}") from None
