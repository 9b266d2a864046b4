//! `scan_dispatch`: the dispatcher's batch decode of commit-log records, the native twin
//! of `ferry.record.scan_dispatch`, held equal to it by
//! `tests/unit/test_native_dispatch.py`.
//!
//! The layout (offsets inside a record, big-endian) is `ferry.record`'s; this file reads
//! only the fields the dispatcher needs. Where the Python raises `RecordError`, this
//! returns None and the Python runs again to raise its own message; nothing here panics
//! on any bytes.

use crate::be::{i32_at, i64_at, u32_at};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const BLANK_MAGIC: u32 = 0xCBD4_3194;
const BLANK_SIZE: usize = 8;
const HEAD_SIZE: usize = 88;
const MIN_RECORD_SIZE: i32 = HEAD_SIZE as i32 + 1 + 2;
const PROPS_TAGS: &[u8] = b"TAGS\x01";
const PROPERTY_SEPARATOR: u8 = 2;

/// One record as the dispatcher takes it; `topic` and `tags` borrow from the chunk.
struct Entry<'a> {
    commit_offset: i64,
    size: i32,
    topic: &'a [u8],
    queue_id: i32,
    queue_offset: i64,
    store_timestamp: i64,
    tags: &'a [u8],
}

/// How the walk ended: at the end of the bytes (or a record past it), at a BLANK
/// marker, or at bytes the Python refuses.
enum Stop {
    End,
    Blank,
    Invalid,
}

/// `record.scan_dispatch(buf, pos)`: `(records, position, blank)`, each record
/// `(commit_offset, size, topic_bytes, queue_id, queue_offset, store_timestamp,
/// tags_bytes)`; None (defer) where the Python raises `RecordError` or `pos` is negative.
#[pyfunction]
pub fn scan_dispatch<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyBytes>,
    pos: isize,
) -> PyResult<Option<(Bound<'py, PyList>, isize, bool)>> {
    let Ok(start) = usize::try_from(pos) else {
        return Ok(None);
    };
    let data = buf.as_bytes();
    let mut entries = Vec::new();
    let (stop, end) = walk(data, start, &mut entries);
    let blank = match stop {
        Stop::End => false,
        Stop::Blank => true,
        Stop::Invalid => return Ok(None),
    };
    // A chunk holds one topic's records in a row, mostly with the same tags: the same
    // bytes object serves them all (the Python makes one per record; equal either way).
    let mut topic: Option<(&[u8], Bound<'py, PyBytes>)> = None;
    let mut tags: Option<(&[u8], Bound<'py, PyBytes>)> = None;
    let records = PyList::empty(py);
    for e in entries {
        let topic_bytes = shared(py, &mut topic, e.topic);
        let tags_bytes = shared(py, &mut tags, e.tags);
        records.append((
            e.commit_offset,
            e.size,
            topic_bytes,
            e.queue_id,
            e.queue_offset,
            e.store_timestamp,
            tags_bytes,
        ))?;
    }
    // `end` is `pos` or the end of a record inside `data`: it fits an isize.
    Ok(Some((records, end as isize, blank)))
}

/// A bytes object of `value`, the last one made when it has the same bytes.
fn shared<'a, 'py>(
    py: Python<'py>,
    last: &mut Option<(&'a [u8], Bound<'py, PyBytes>)>,
    value: &'a [u8],
) -> Bound<'py, PyBytes> {
    match last {
        Some((bytes, object)) if *bytes == value => object.clone(),
        _ => {
            let object = PyBytes::new(py, value);
            *last = Some((value, object.clone()));
            object
        }
    }
}

/// The Python loop, record by record: the entries it appends and where and why it stops.
fn walk<'a>(data: &'a [u8], mut pos: usize, out: &mut Vec<Entry<'a>>) -> (Stop, usize) {
    while data.len().saturating_sub(pos) >= BLANK_SIZE {
        let total = i32_at(data, pos);
        let magic = u32_at(data, pos + 4);
        if magic != MESSAGE_MAGIC {
            if magic == BLANK_MAGIC && total >= BLANK_SIZE as i32 {
                return (Stop::Blank, pos);
            }
            return (Stop::Invalid, pos);
        }
        if total < MIN_RECORD_SIZE {
            return (Stop::Invalid, pos);
        }
        let end = pos + total as usize;
        if end > data.len() {
            break;
        }
        let body_len = i32_at(data, pos + HEAD_SIZE - 4);
        if body_len < 0 {
            return (Stop::Invalid, pos);
        }
        let at = pos + HEAD_SIZE + body_len as usize;
        if at + 3 > end {
            return (Stop::Invalid, pos);
        }
        let topic_len = data[at] as usize;
        let props_at = at + 3 + topic_len;
        if props_at > end {
            return (Stop::Invalid, pos);
        }
        let props_len = u16::from_be_bytes([data[props_at - 2], data[props_at - 1]]) as usize;
        if props_at + props_len != end {
            return (Stop::Invalid, pos);
        }
        out.push(Entry {
            commit_offset: i64_at(data, pos + 28),
            size: total,
            topic: &data[at + 1..at + 1 + topic_len],
            queue_id: i32_at(data, pos + 12),
            queue_offset: i64_at(data, pos + 20),
            store_timestamp: i64_at(data, pos + 56),
            tags: tags(&data[props_at..end]),
        });
        pos = end;
    }
    (Stop::End, pos)
}

/// The value of TAGS as the Python finds it: only the first "TAGS\x01" counts, and only
/// at the start or right after a separator; the value runs to the next separator.
fn tags(props: &[u8]) -> &[u8] {
    let Some(i) = props
        .windows(PROPS_TAGS.len())
        .position(|w| w == PROPS_TAGS)
    else {
        return b"";
    };
    if i > 0 && props[i - 1] != PROPERTY_SEPARATOR {
        return b"";
    }
    let value = &props[i + PROPS_TAGS.len()..];
    match value.iter().position(|&b| b == PROPERTY_SEPARATOR) {
        Some(j) => &value[..j],
        None => value,
    }
}
