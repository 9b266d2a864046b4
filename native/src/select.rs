//! `property_values`: what an SQL92-filtered pull reads of each record, the native twin
//! of `ferry.record.property_values`, held equal to it by
//! `tests/unit/test_native_select.py`.
//!
//! For each consume-queue entry it finds the record the entry points at, checks it as
//! `record.properties_at` does, and picks the values of the named properties out of its
//! property string without building a dict of them all. Where the Python raises
//! `RecordError` (no record of the entry's size there, a property string that is not
//! UTF-8 or has an item without "\x01") this returns None and the Python runs again to
//! raise its own message; nothing here panics on any bytes or entries.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const HEAD_SIZE: usize = 88; // fields 1-14 and BODY's length
const MIN_RECORD_SIZE: usize = HEAD_SIZE + 1 + 2;

/// `record.property_values(data, start, entries, names)`: for each entry `(commit_offset,
/// size, tag_code)`, a tuple of the values of `names` (None: absent) in the record of
/// `size` bytes at `commit_offset - start` in `data`; None (defer) where the Python
/// raises, for an entry that is not three ints, a name that is not a str, or a buffer
/// that is not contiguous.
#[pyfunction]
pub fn property_values<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    start: i64,
    entries: &Bound<'py, PyList>,
    names: &Bound<'py, PyTuple>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let buffer = PyBuffer::<u8>::get(data)?;
    if !buffer.is_c_contiguous() {
        return Ok(None);
    }
    let mut wanted: Vec<String> = Vec::with_capacity(names.len());
    for name in names.iter() {
        let Ok(name) = name.cast_exact::<PyString>() else {
            return Ok(None);
        };
        wanted.push(name.to_str()?.to_owned());
    }
    // SAFETY: a C-contiguous buffer of `len_bytes` bytes, held (and so kept alive and
    // unresized: a bytearray with an exported buffer cannot be resized) until `buffer`
    // drops at the end of this function; only read here, with the GIL held throughout.
    let bytes: &[u8] =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    let out = PyList::empty(py);
    let mut found: Vec<Option<&str>> = vec![None; wanted.len()];
    for item in entries.iter() {
        let Ok((commit_offset, size, _code)) = item.extract::<(i64, i64, i64)>() else {
            return Ok(None);
        };
        let Some(text) = commit_offset
            .checked_sub(start)
            .and_then(|at| properties_text(bytes, at, size))
        else {
            return Ok(None);
        };
        found.iter_mut().for_each(|value| *value = None);
        for property in text.split('\x02').filter(|p| !p.is_empty()) {
            let Some((key, value)) = property.split_once('\x01') else {
                return Ok(None);
            };
            // The later of duplicate names wins, as in the Python's dict.
            if let Some(i) = wanted.iter().position(|name| name == key) {
                found[i] = Some(value);
            }
        }
        let values: Vec<Option<Bound<'py, PyString>>> = found
            .iter()
            .map(|value| value.map(|v| PyString::new(py, v)))
            .collect();
        out.append(PyTuple::new(py, values)?)?;
    }
    Ok(Some(out))
}

/// The property string of the record of `size` bytes at `at`, as `record.properties_at`
/// finds it; None where it raises.
fn properties_text(bytes: &[u8], at: i64, size: i64) -> Option<&str> {
    let at = usize::try_from(at).ok()?;
    let size = usize::try_from(size).ok()?;
    let end = at.checked_add(size)?;
    if size < MIN_RECORD_SIZE || end > bytes.len() {
        return None;
    }
    let total = i32::from_be_bytes(bytes[at..at + 4].try_into().ok()?);
    let magic = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().ok()?);
    if magic != MESSAGE_MAGIC || usize::try_from(total).ok()? != size {
        return None;
    }
    let body_len = i32::from_be_bytes(bytes[at + HEAD_SIZE - 4..at + HEAD_SIZE].try_into().ok()?);
    let mut pos = at
        .checked_add(HEAD_SIZE)?
        .checked_add(usize::try_from(body_len).ok()?)?;
    if pos.checked_add(3)? > end {
        return None;
    }
    pos += 1 + usize::from(bytes[pos]);
    if pos + 2 > end {
        return None;
    }
    let length = usize::from(u16::from_be_bytes(bytes[pos..pos + 2].try_into().ok()?));
    pos += 2;
    if pos + length > end {
        return None;
    }
    std::str::from_utf8(&bytes[pos..pos + length]).ok()
}
