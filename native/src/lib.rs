//! `ferry_native`: the hot path of RocketMQ-protocol sends, in Rust — one native call
//! per read (every whole frame in the buffer), per send header (its checked fields),
//! per answer (its whole frame), per property string (decode or encode), and per
//! dispatcher step (the records of a commit-log chunk, `dispatch.rs`).
//!
//! Each function mirrors a named Python function and is held byte-for-byte equal to it
//! by `tests/unit/test_native.py` (`test_native_sends.py` for the send header,
//! `test_native_dispatch.py` for the dispatcher's walk):
//!
//! | here                | Python                                                  |
//! |---------------------|---------------------------------------------------------|
//! | `decode_frames`     | `ferry.remoting.codec.next_frame`, called until None    |
//! | `parse_send_header` | `services.broker.remoting.sends._parse_plain`           |
//! | `encode_json_frame` | `ferry.remoting.codec.encode` of a JSON `Command`       |
//! | `decode_properties` | `ferry.record.decode_properties`                        |
//! | `encode_properties` | `ferry.record.encode_properties`                        |
//! | `scan_dispatch`     | `ferry.record.scan_dispatch`                            |
//! | `encode_records`    | `CommitLog.append_many`'s layout of `record.encode_raw` |
//! | `index_records`     | `services.broker.store.indexfile.build_python`          |
//! | `AclFast.check`     | `ferry.acl.AclChecker.check`, for a remembered grant    |
//!
//! Every input this module is unsure of is deferred to the Python function (a
//! `(start, end)` pair instead of a decoded frame, or None), which then decides it
//! exactly as before: errors, leniency (numbers as extField values, `int()`'s signs,
//! underscores and non-ASCII digits, lone surrogates, ROCKETMQ binary headers) and
//! their messages live in Python only. Nothing here panics on any input; no unsafe code.

mod acl;
mod be;
mod dispatch;
mod door;
mod encode;
mod gather;
mod index;
mod select;

use std::borrow::Cow;
use std::io::Write;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyInt, PyList, PySet, PyString, PyTuple};

/// Apache's com.rocketmq.remoting.frameMaxLength, as `codec.MAX_FRAME`.
const MAX_FRAME: usize = 16 * 1024 * 1024;
/// Deeper JSON nesting (inside ignored header keys) is deferred.
const MAX_DEPTH: usize = 64;

// ---------------------------------------------------------------- decode_frames

/// Every whole frame of `buffer` from `pos`: a tuple `(code, opaque, flag, ext, body,
/// remark, language, version)` for a JSON header on the fast path, else `(start, end)`
/// (the frame's offsets, length word included) for Python to decode; the position past
/// the last frame listed; and `codec.frame_length`'s message when a length word is out
/// of range (the frames before it are listed).
#[pyfunction]
fn decode_frames<'py>(
    py: Python<'py>,
    buffer: &Bound<'py, PyAny>,
    pos: usize,
) -> PyResult<(Bound<'py, PyList>, usize, Option<String>)> {
    // A bytearray is copied: Python code (a finalizer run by an allocation) could
    // change it while it is borrowed. The copy costs far less than the parse.
    let data: Cow<[u8]> = if let Ok(bytes) = buffer.cast::<PyBytes>() {
        Cow::Borrowed(bytes.as_bytes())
    } else if let Ok(array) = buffer.cast::<PyByteArray>() {
        Cow::Owned(array.to_vec())
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "buffer must be bytes or bytearray",
        ));
    };
    let frames = PyList::empty(py);
    let mut pos = pos;
    let mut error = None;
    while data.len().saturating_sub(pos) >= 4 {
        let length = i32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]);
        if length < 4 || length as usize > MAX_FRAME {
            error = Some(format!("frame length {length} outside 4..{MAX_FRAME}"));
            break;
        }
        let end = pos + 4 + length as usize;
        if data.len() < end {
            break;
        }
        match decode_frame(&data[pos + 4..end]) {
            Some(command) => frames.append(command.into_tuple(py)?)?,
            None => frames.append((pos, end))?,
        }
        pos = end;
    }
    Ok((frames, pos, error))
}

/// A JSON command on the fast path, borrowing from the frame where it can.
struct Command<'a> {
    code: i64,
    opaque: i64,
    flag: i64,
    version: i64,
    ext: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    remark: Option<Cow<'a, str>>,
    language: Cow<'a, str>,
    body: &'a [u8],
}

impl Command<'_> {
    fn into_tuple<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let ext = PyDict::new(py);
        for (key, value) in &self.ext {
            ext.set_item(PyString::new(py, key), PyString::new(py, value))?;
        }
        let remark = self.remark.map(|r| PyString::new(py, &r));
        (
            self.code,
            self.opaque,
            self.flag,
            ext,
            PyBytes::new(py, self.body),
            remark,
            PyString::new(py, &self.language),
            self.version,
        )
            .into_pyobject(py)
    }
}

/// The bytes after a length word, as `codec.decode` reads them; None unless JSON on
/// the fast path.
fn decode_frame(frame: &[u8]) -> Option<Command<'_>> {
    let word = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
    let header_len = (word & 0xFF_FFFF) as usize;
    if word >> 24 != 0 || header_len > frame.len() - 4 {
        return None;
    }
    let mut command = parse_header(&frame[4..4 + header_len])?;
    command.body = &frame[4 + header_len..];
    Some(command)
}

/// The fields of a JSON header, exactly as `codec._decode_json`'s orjson branch takes
/// them, or None (defer). Strict RFC 8259 JSON; the last of duplicate keys wins.
fn parse_header(header: &[u8]) -> Option<Command<'_>> {
    let mut p = Parser { s: header, i: 0 };
    let mut code = None;
    let mut command = Command {
        code: 0,
        opaque: 0,
        flag: 0,
        version: 0,
        ext: Vec::new(),
        remark: None,
        language: Cow::Borrowed("JAVA"),
        body: &[],
    };
    p.ws();
    p.eat(b'{')?;
    p.ws();
    if !p.eat_if(b'}') {
        loop {
            p.ws();
            let key = p.string()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            match &*key {
                "code" => code = Some(p.int()?),
                "opaque" => command.opaque = p.int()?,
                "flag" => command.flag = p.int()?,
                "version" => command.version = p.int()?,
                "remark" => command.remark = if p.null() { None } else { Some(p.string()?) },
                "language" => command.language = p.string()?,
                "extFields" => {
                    command.ext.clear();
                    if !p.null() {
                        p.ext_fields(&mut command.ext)?;
                    }
                }
                _ => p.skip_value(1)?,
            }
            p.ws();
            if p.eat_if(b'}') {
                break;
            }
            p.eat(b',')?;
        }
    }
    p.ws();
    if p.i != p.s.len() {
        return None;
    }
    command.code = code?;
    Some(command)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat_if(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.i += 1;
        }
        found
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        self.eat_if(byte).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self.s[self.i..].starts_with(word);
        if found {
            self.i += word.len();
        }
        found
    }

    fn null(&mut self) -> bool {
        self.literal(b"null")
    }

    /// `{"k":"v",...}` with string values only, appended in order.
    fn ext_fields(&mut self, ext: &mut Vec<(Cow<'a, str>, Cow<'a, str>)>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat_if(b'}') {
            return Some(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            ext.push((key, self.string()?));
            self.ws();
            if self.eat_if(b'}') {
                return Some(());
            }
            self.eat(b',')?;
        }
    }

    /// A JSON string; None on a raw control character, a bad escape, a lone
    /// surrogate escape or bytes that are not UTF-8.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.s.get(self.i)? {
                b'"' => {
                    let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                    self.i += 1;
                    return Some(Cow::Borrowed(text));
                }
                b'\\' => break,
                c if c < 0x20 => return None,
                _ => self.i += 1,
            }
        }
        let mut text = String::from(std::str::from_utf8(&self.s[start..self.i]).ok()?);
        loop {
            let run = self.i;
            loop {
                match *self.s.get(self.i)? {
                    b'"' | b'\\' => break,
                    c if c < 0x20 => return None,
                    _ => self.i += 1,
                }
            }
            text.push_str(std::str::from_utf8(&self.s[run..self.i]).ok()?);
            if self.eat_if(b'"') {
                return Some(Cow::Owned(text));
            }
            self.i += 1; // the backslash
            let escaped = *self.s.get(self.i)?;
            self.i += 1;
            text.push(match escaped {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let high = self.hex4()?;
                    if (0xD800..0xDC00).contains(&high) {
                        if !self.literal(b"\\u") {
                            return None;
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..0xE000).contains(&low) {
                            return None;
                        }
                        char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
                    } else {
                        char::from_u32(high)? // None for a lone low surrogate
                    }
                }
                _ => return None,
            });
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.i..self.i + 4)?;
        let mut value = 0;
        for &d in digits {
            value = value * 16 + (d as char).to_digit(16)?;
        }
        self.i += 4;
        Some(value)
    }

    /// A JSON number token: its text and whether it is an integer literal.
    fn number(&mut self) -> Option<(&'a str, bool)> {
        let start = self.i;
        self.eat_if(b'-');
        if !self.eat_if(b'0') {
            if !matches!(self.peek(), Some(b'1'..=b'9')) {
                return None;
            }
            self.digits();
        }
        let mut integer = true;
        if self.eat_if(b'.') {
            integer = false;
            self.digits1()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits1()?;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
        Some((text, integer))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn digits1(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// An integer literal that fits an i64 ("-0" is 0).
    fn int(&mut self) -> Option<i64> {
        match self.number()? {
            (text, true) => text.parse().ok(),
            _ => None,
        }
    }

    /// Any JSON value, checked and dropped.
    fn skip_value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'-' | b'0'..=b'9' => self.number().map(drop),
            b't' => self.literal(b"true").then_some(()),
            b'f' => self.literal(b"false").then_some(()),
            b'n' => self.null().then_some(()),
            open @ (b'{' | b'[') => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let close = if open == b'{' { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.eat_if(close) {
                    return Some(());
                }
                loop {
                    self.ws();
                    if open == b'{' {
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    self.skip_value(depth + 1)?;
                    self.ws();
                    if self.eat_if(close) {
                        return Some(());
                    }
                    self.eat(b',')?;
                }
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------- parse_send_header

const INT32_MAX: i64 = i32::MAX as i64;
const INT32_MIN: i64 = i32::MIN as i64;

/// `sends._parse_plain(ext, names)`: the fields of a send request's extFields as the
/// tuple it returns, under SEND_MESSAGE_V2's names ("a".."m") when `short`, else
/// SEND_MESSAGE's, for a producer group in `groups` (`sends._GROUPS_CHECKED`).
///
/// None (defer) wherever `_parse_plain` raises, and where it might not: `ext` not an
/// exact dict, a field read that is not an exact str, a number that is not a plain
/// ASCII decimal (`int()` also takes signs, spaces, underscores and other digits), a
/// non-ASCII batch, properties with a lone surrogate. Fields it does not read
/// (defaultTopic, unitMode) are not looked at, as there.
#[pyfunction]
fn parse_send_header<'py>(
    py: Python<'py>,
    ext: &Bound<'py, PyAny>,
    short: bool,
    groups: &Bound<'py, PySet>,
) -> Option<Bound<'py, PyTuple>> {
    let names = if short {
        [
            intern!(py, "a"),
            intern!(py, "b"),
            intern!(py, "d"),
            intern!(py, "e"),
            intern!(py, "f"),
            intern!(py, "g"),
            intern!(py, "h"),
            intern!(py, "i"),
            intern!(py, "j"),
            intern!(py, "l"),
            intern!(py, "m"),
        ]
    } else {
        [
            intern!(py, "producerGroup"),
            intern!(py, "topic"),
            intern!(py, "defaultTopicQueueNums"),
            intern!(py, "queueId"),
            intern!(py, "sysFlag"),
            intern!(py, "bornTimestamp"),
            intern!(py, "flag"),
            intern!(py, "properties"),
            intern!(py, "reconsumeTimes"),
            intern!(py, "maxReconsumeTimes"),
            intern!(py, "batch"),
        ]
    };
    let [group, topic, default_nums, queue_id, sys_flag, born_timestamp, flag, properties, reconsume_times, max_reconsume, batch] =
        names;
    let ext = ext.cast_exact::<PyDict>().ok()?;
    let group = field(ext, group)??;
    let topic = field(ext, topic)??;
    if topic.len().ok()? == 0 || !groups.contains(&group).ok()? {
        return None;
    }
    if let Some(value) = field(ext, default_nums)? {
        if value.len().ok()? > 0 {
            number(&value, 0, INT32_MAX)?;
        }
    }
    let queue_id = number(&field(ext, queue_id)??, INT32_MIN, INT32_MAX)?;
    let sys_flag = number(&field(ext, sys_flag)??, INT32_MIN, INT32_MAX)?;
    let born_timestamp = number(&field(ext, born_timestamp)??, 0, i64::MAX)?;
    let flag = number(&field(ext, flag)??, INT32_MIN, INT32_MAX)?;
    let properties = match field(ext, properties)? {
        Some(value) => properties_dict(py, value.to_str().ok()?).ok()??,
        None => PyDict::new(py),
    };
    let reconsume_times = match field(ext, reconsume_times)? {
        Some(value) if value.len().ok()? > 0 => number(&value, 0, INT32_MAX)?,
        _ => 0,
    };
    let max_reconsume = match field(ext, max_reconsume)? {
        Some(value) if value.len().ok()? > 0 => number(&value, INT32_MIN, INT32_MAX)?,
        _ => -1,
    };
    let batch = match field(ext, batch)? {
        Some(value) => {
            let value = value.to_str().ok()?;
            if !value.is_ascii() {
                return None; // str.lower() is Unicode's
            }
            value.eq_ignore_ascii_case("true")
        }
        None => false,
    };
    (
        group,
        topic,
        queue_id,
        sys_flag,
        born_timestamp,
        flag,
        properties,
        reconsume_times,
        max_reconsume,
        batch,
    )
        .into_pyobject(py)
        .ok()
}

/// `ext[key]`: Some(None) when absent, None (defer) when not an exact str.
fn field<'py>(
    ext: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
) -> Option<Option<Bound<'py, PyString>>> {
    match ext.get_item(key).ok()? {
        Some(value) => Some(Some(value.cast_into_exact::<PyString>().ok()?)),
        None => Some(None),
    }
}

/// `sends._number`: `value` as an int in `low..=high`; None (defer) when it is not
/// `-?[0-9]+` of at most 24 characters or out of range.
fn number(value: &Bound<'_, PyString>, low: i64, high: i64) -> Option<i64> {
    let text = value.to_str().ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    if text.len() > 24 || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number: i64 = text.parse().ok()?; // beyond an i64 is beyond every range here
    (low..=high).contains(&number).then_some(number)
}

// ---------------------------------------------------------------- encode_json_frame

/// The whole frame of a JSON command, as `codec.encode` writes it; None (defer) for
/// anything but exact ints that fit an i64, exact strs that are valid UTF-8 (no lone
/// surrogate), an exact dict of them, exact bytes, or a frame over 16 MiB.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn encode_json_frame<'py>(
    py: Python<'py>,
    code: &Bound<'py, PyAny>,
    opaque: &Bound<'py, PyAny>,
    flag: &Bound<'py, PyAny>,
    ext: &Bound<'py, PyAny>,
    body: &Bound<'py, PyAny>,
    remark: &Bound<'py, PyAny>,
    language: &Bound<'py, PyAny>,
    version: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    let ext = ext.cast_exact::<PyDict>().ok()?;
    let body = body.cast_exact::<PyBytes>().ok()?.as_bytes();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(b"{\"code\":");
    write!(out, "{}", exact_int(code)?).ok()?;
    if !ext.is_empty() {
        out.extend_from_slice(b",\"extFields\":{");
        for (n, (key, value)) in ext.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            quote(&mut out, exact_str(&key)?);
            out.push(b':');
            quote(&mut out, exact_str(&value)?);
        }
        out.push(b'}');
    }
    write!(out, ",\"flag\":{},\"language\":", exact_int(flag)?).ok()?;
    quote(&mut out, exact_str(language)?);
    write!(out, ",\"opaque\":{}", exact_int(opaque)?).ok()?;
    if !remark.is_none() {
        out.extend_from_slice(b",\"remark\":");
        quote(&mut out, exact_str(remark)?);
    }
    write!(
        out,
        ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":{}}}",
        exact_int(version)?
    )
    .ok()?;
    let header_len = out.len() - 8;
    let length = 4 + header_len + body.len();
    if length > MAX_FRAME {
        return None;
    }
    out[0..4].copy_from_slice(&(length as u32).to_be_bytes());
    out[4..8].copy_from_slice(&(header_len as u32).to_be_bytes()); // serialize type 0
    out.extend_from_slice(body);
    Some(PyBytes::new(py, &out))
}

fn exact_int(value: &Bound<'_, PyAny>) -> Option<i64> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    value.extract().ok()
}

fn exact_str<'a>(value: &'a Bound<'_, PyAny>) -> Option<&'a str> {
    value.cast_exact::<PyString>().ok()?.to_str().ok()
}

/// `text` as a JSON string the way Python's `json.dumps(..., ensure_ascii=False)`
/// writes it.
fn quote(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut run = 0;
    let mut unicode = *b"\\u00xx";
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => {
                unicode[4] = HEX[(b >> 4) as usize];
                unicode[5] = HEX[(b & 15) as usize];
                &unicode
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(escape);
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

// ---------------------------------------------------------------- properties

/// `record.decode_properties`: "k\x01v\x02..." into a dict; None (defer) when `data`
/// is not exact bytes of UTF-8 or an item has no "\x01".
#[pyfunction]
fn decode_properties<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Ok(data) = data.cast_exact::<PyBytes>() else {
        return Ok(None);
    };
    let Ok(text) = std::str::from_utf8(data.as_bytes()) else {
        return Ok(None);
    };
    properties_dict(py, text)
}

/// A property string as `record.decode_properties` reads it (the later of duplicate
/// names wins, in the earlier one's place); None when an item has no "\x01".
fn properties_dict<'py>(py: Python<'py>, text: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
    let properties = PyDict::new(py);
    for item in text.split('\x02').filter(|item| !item.is_empty()) {
        let Some((key, value)) = item.split_once('\x01') else {
            return Ok(None);
        };
        properties.set_item(PyString::new(py, key), PyString::new(py, value))?;
    }
    Ok(Some(properties))
}

/// `record.encode_properties`: an exact dict of exact strs as "k\x01v\x02..." in
/// dict order; None (defer) on a separator inside a key or value or a lone surrogate.
#[pyfunction]
fn encode_properties<'py>(
    py: Python<'py>,
    properties: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    let properties = properties.cast_exact::<PyDict>().ok()?;
    let mut out = Vec::with_capacity(64 * properties.len());
    for (key, value) in properties.iter() {
        let (key, value) = (exact_str(&key)?, exact_str(&value)?);
        if key.bytes().chain(value.bytes()).any(|b| b == 1 || b == 2) {
            return None;
        }
        out.extend_from_slice(key.as_bytes());
        out.push(1);
        out.extend_from_slice(value.as_bytes());
        out.push(2);
    }
    Some(PyBytes::new(py, &out))
}

#[pymodule]
fn ferry_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(decode_frames, module)?)?;
    module.add_function(wrap_pyfunction!(parse_send_header, module)?)?;
    module.add_function(wrap_pyfunction!(encode_json_frame, module)?)?;
    module.add_function(wrap_pyfunction!(decode_properties, module)?)?;
    module.add_function(wrap_pyfunction!(encode_properties, module)?)?;
    module.add_function(wrap_pyfunction!(dispatch::scan_dispatch, module)?)?;
    module.add_function(wrap_pyfunction!(encode::encode_records, module)?)?;
    module.add_function(wrap_pyfunction!(gather::gather_records, module)?)?;
    module.add_function(wrap_pyfunction!(index::index_records, module)?)?;
    module.add_function(wrap_pyfunction!(select::property_values, module)?)?;
    module.add_class::<acl::AclFast>()?;
    module.add_class::<door::Door>()?;
    Ok(())
}
