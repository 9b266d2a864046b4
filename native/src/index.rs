//! `index_records`: the message index's build step, the native twin of
//! `services.broker.store.indexfile.build_python` (which walks with
//! `ferry.record.scan_index` and puts with `IndexFile.put`), held equal to it by
//! `tests/unit/test_native_index.py`.
//!
//! It walks whole commit-log records as `scan_index` does and writes each record's keys
//! into an index file's writable buffer (an mmap), layout as `indexfile.py`'s docstring.
//! Where the Python raises (`RecordError`, `IndexFileError`), or the buffer is not the
//! file it should be, this returns None and the Python runs again to raise its own
//! message; nothing here panics on any bytes.

use crate::be::{i32_at, i64_at, u32_at};

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const BLANK_MAGIC: u32 = 0xCBD4_3194;
const BLANK_SIZE: usize = 8;
const HEAD_SIZE: usize = 88;
const MIN_RECORD_SIZE: i32 = HEAD_SIZE as i32 + 1 + 2;
const HEADER_SIZE: usize = 40;
const ENTRY_SIZE: usize = 20;
const TRANSACTION_MASK: i32 = 0xC;

/// `(position, skip, blank, full)`, as `indexfile.build`.
type Built = (isize, usize, bool, bool);

/// `indexfile.build_python(file, chunk, pos, skip)` on `file`'s buffer; None (defer)
/// where the Python raises, for a negative `pos`, or for a buffer that is read-only,
/// not contiguous or not `40 + 4 * slots + 20 * entries` bytes.
#[pyfunction]
pub fn index_records(
    chunk: &Bound<'_, PyBytes>,
    pos: isize,
    file: &Bound<'_, PyAny>,
    slots: u32,
    entries: u32,
    skip: usize,
) -> PyResult<Option<Built>> {
    let Ok(start) = usize::try_from(pos) else {
        return Ok(None);
    };
    let buffer = PyBuffer::<u8>::get(file)?;
    let size = HEADER_SIZE + slots as usize * 4 + entries as usize * ENTRY_SIZE;
    if buffer.readonly() || !buffer.is_c_contiguous() || buffer.len_bytes() != size {
        return Ok(None);
    }
    if slots == 0 || entries <= 1 {
        return Ok(None);
    }
    // SAFETY: a writable C-contiguous buffer of `size` bytes, held (so kept mapped: an
    // mmap with an exported buffer cannot be closed or resized) until `buffer` drops at
    // the end of this function; only this function touches it meanwhile (the GIL is
    // held throughout and no Python code runs).
    let out: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(buffer.buf_ptr() as *mut u8, size) };
    let mut file = File {
        buf: out,
        slots,
        entries,
    };
    let count = file.index_count();
    if count > entries as i32 {
        return Ok(None);
    }
    let hash_slot_count = i32_at(file.buf, 32);
    if !(0..=slots as i32).contains(&hash_slot_count) {
        return Ok(None);
    }
    Ok(walk(chunk.as_bytes(), start, &mut file, skip))
}

/// One whole record as the walk takes it; `topic` and `props` borrow from the chunk.
struct Entry<'a> {
    pos: usize,
    commit_offset: i64,
    store_ts: i64,
    sys_flag: i32,
    topic: &'a [u8],
    props: &'a [u8],
}

/// The Python: `scan_index` walks every record first (so bytes it refuses change
/// nothing in the file), then each record's keys go in from `skip` on.
fn walk(data: &[u8], start: usize, file: &mut File<'_>, mut skip: usize) -> Option<Built> {
    let mut records = Vec::new();
    let (end, blank) = scan(data, start, &mut records)?;
    for e in records {
        if e.sys_flag & TRANSACTION_MASK != TRANSACTION_MASK && !e.props.is_empty() {
            let keys = index_keys(e.props);
            for (i, key) in keys.iter().enumerate().skip(skip) {
                let hash = positive_hash(java_hash(e.topic, key));
                if !file.put(hash, e.commit_offset, e.store_ts) {
                    return Some((e.pos as isize, i, false, true));
                }
            }
        }
        skip = 0;
    }
    Some((end as isize, 0, blank, file.full()))
}

/// `record.scan_index`: the records from `pos`, where the walk stopped and whether at a
/// BLANK; None where the Python raises.
fn scan<'a>(data: &'a [u8], mut pos: usize, out: &mut Vec<Entry<'a>>) -> Option<(usize, bool)> {
    while data.len().saturating_sub(pos) >= BLANK_SIZE {
        let total = i32_at(data, pos);
        let magic = u32_at(data, pos + 4);
        if magic != MESSAGE_MAGIC {
            if magic == BLANK_MAGIC && total >= BLANK_SIZE as i32 {
                return Some((pos, true));
            }
            return None;
        }
        if total < MIN_RECORD_SIZE {
            return None;
        }
        let end = pos + total as usize;
        if end > data.len() {
            break;
        }
        let body_len = i32_at(data, pos + HEAD_SIZE - 4);
        if body_len < 0 {
            return None;
        }
        let at = pos + HEAD_SIZE + body_len as usize;
        if at + 3 > end {
            return None;
        }
        let topic_len = data[at] as usize;
        let props_at = at + 3 + topic_len;
        if props_at > end {
            return None;
        }
        let props_len = u16::from_be_bytes([data[props_at - 2], data[props_at - 1]]) as usize;
        if props_at + props_len != end {
            return None;
        }
        out.push(Entry {
            pos,
            commit_offset: i64_at(data, pos + 28),
            store_ts: i64_at(data, pos + 56),
            sys_flag: i32_at(data, pos + 36),
            topic: &data[at + 1..at + 1 + topic_len],
            props: &data[props_at..end],
        });
        pos = end;
    }
    Some((pos, false))
}

/// `indexfile.index_keys`: UNIQ_KEY, then KEYS' non-empty words (later names win).
fn index_keys(props: &[u8]) -> Vec<&[u8]> {
    let mut uniq: &[u8] = b"";
    let mut keys: &[u8] = b"";
    for item in props.split(|&b| b == 2) {
        let Some(i) = item.iter().position(|&b| b == 1) else {
            continue;
        };
        let (name, value) = (&item[..i], &item[i + 1..]);
        if name == b"UNIQ_KEY" {
            uniq = value;
        } else if name == b"KEYS" {
            keys = value;
        }
    }
    let mut out = Vec::with_capacity(2);
    if !uniq.is_empty() {
        out.push(uniq);
    }
    out.extend(keys.split(|&b| b == b' ').filter(|k| !k.is_empty()));
    out
}

/// Java's `String.hashCode()` of `topic#key`, the bytes read as UTF-8 (invalid
/// sequences replaced, as Python's `errors="replace"`).
fn java_hash(topic: &[u8], key: &[u8]) -> i32 {
    let mut h: i32 = 0;
    let mut add = |part: &[u8]| {
        if part.is_ascii() {
            for &b in part {
                h = h.wrapping_mul(31).wrapping_add(b as i32);
            }
        } else {
            for unit in String::from_utf8_lossy(part).encode_utf16() {
                h = h.wrapping_mul(31).wrapping_add(unit as i32);
            }
        }
    };
    add(topic);
    add(b"#");
    add(key);
    h
}

fn positive_hash(h: i32) -> i32 {
    if h == i32::MIN {
        0
    } else {
        h.abs()
    }
}

/// An index file's bytes and geometry.
struct File<'a> {
    buf: &'a mut [u8],
    slots: u32,
    entries: u32,
}

impl File<'_> {
    fn index_count(&self) -> i32 {
        i32_at(self.buf, 36).max(1)
    }

    fn full(&self) -> bool {
        self.index_count() >= self.entries as i32
    }

    /// `IndexFile.put`.
    fn put(&mut self, hash: i32, commit_offset: i64, store_ts: i64) -> bool {
        let count = self.index_count();
        if count >= self.entries as i32 {
            return false;
        }
        let slot_at = HEADER_SIZE + (hash as u32 % self.slots) as usize * 4;
        let mut previous = i32_at(self.buf, slot_at);
        if previous <= 0 || previous >= count {
            previous = 0;
        }
        if count <= 1 {
            put_i64(self.buf, 0, store_ts);
            put_i64(self.buf, 16, commit_offset);
        }
        let begin = i64_at(self.buf, 0);
        let diff = if begin <= 0 {
            0
        } else {
            (store_ts.saturating_sub(begin).div_euclid(1000)).clamp(0, i32::MAX as i64) as i32
        };
        let at = HEADER_SIZE + self.slots as usize * 4 + count as usize * ENTRY_SIZE;
        put_i32(self.buf, at, hash);
        put_i64(self.buf, at + 4, commit_offset);
        put_i32(self.buf, at + 12, diff);
        put_i32(self.buf, at + 16, previous);
        put_i32(self.buf, slot_at, count);
        if previous == 0 {
            let used = i32_at(self.buf, 32);
            put_i32(self.buf, 32, used.wrapping_add(1));
        }
        put_i32(self.buf, 36, count + 1);
        put_i64(self.buf, 24, commit_offset);
        put_i64(self.buf, 8, store_ts);
        true
    }
}

fn put_i32(data: &mut [u8], at: usize, value: i32) {
    data[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

fn put_i64(data: &mut [u8], at: usize, value: i64) {
    data[at..at + 8].copy_from_slice(&value.to_be_bytes());
}
