//! `gather_records`: a raw pull's walk over the records consume-queue entries point at,
//! the native twin of `ferry.record.gather_records`, held equal to it by
//! `tests/unit/test_native_gather.py`.
//!
//! Where the Python raises `RecordError` (an entry that points at no record of its
//! size), this returns None and the Python runs again to raise its own message; nothing
//! here panics on any bytes or entries.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const HEAD: usize = 8; // TOTALSIZE and MAGICCODE
const MIN_RECORD_SIZE: i64 = 88 + 1 + 2;

/// What `gather_records` answers: the records' bytes, entries taken, records kept (the
/// same: no tag filter here), the last one's commit offset, the budget left, whether an
/// entry was left.
type Gathered<'py> = (Bound<'py, PyBytes>, usize, usize, i64, i64, bool);

/// `record.gather_records(data, start, entries, confirm, budget, have)` without a tag
/// filter: `(records_bytes, taken, kept, last_commit_offset, budget_left, stopped)`,
/// `kept` always `taken`; None (defer) where the Python raises, for an entry that is not
/// three ints, or for a buffer that is not contiguous.
#[pyfunction]
pub fn gather_records<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    start: i64,
    entries: &Bound<'py, PyList>,
    confirm: i64,
    budget: i64,
    have: bool,
) -> PyResult<Option<Gathered<'py>>> {
    let buffer = PyBuffer::<u8>::get(data)?;
    if !buffer.is_c_contiguous() {
        return Ok(None);
    }
    // SAFETY: a C-contiguous buffer of `len_bytes` bytes, held (and so kept alive and
    // unresized: a bytearray with an exported buffer cannot be resized) until `buffer`
    // drops at the end of this function; only read here, with the GIL held throughout.
    let bytes: &[u8] =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    let Some(walked) = walk(bytes, start, entries, confirm, budget, have) else {
        return Ok(None);
    };
    let (out, taken, last, left, stopped) = walked;
    Ok(Some((
        PyBytes::new(py, &out),
        taken,
        taken,
        last,
        left,
        stopped,
    )))
}

type Walked = (Vec<u8>, usize, i64, i64, bool);

fn walk(
    bytes: &[u8],
    start: i64,
    entries: &Bound<'_, PyList>,
    confirm: i64,
    mut budget: i64,
    have: bool,
) -> Option<Walked> {
    let mut out = Vec::new();
    let mut taken = 0usize;
    let mut last = -1i64;
    for item in entries.iter() {
        let (commit_offset, size, _code) = item.extract::<(i64, i64, i64)>().ok()?;
        let beyond = commit_offset
            .checked_add(size)
            .is_none_or(|end| end > confirm);
        if beyond || (budget < size && (have || taken > 0)) {
            return Some((out, taken, last, budget, true));
        }
        if size < 0 {
            return None;
        }
        let at = usize::try_from(commit_offset.checked_sub(start)?).ok()?;
        let end = at.checked_add(usize::try_from(size).ok()?)?;
        if end > bytes.len() || at + HEAD > bytes.len() {
            return None;
        }
        let total = i32::from_be_bytes(bytes[at..at + 4].try_into().ok()?);
        let magic = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().ok()?);
        if magic != MESSAGE_MAGIC || i64::from(total) != size || size < MIN_RECORD_SIZE {
            return None;
        }
        out.extend_from_slice(&bytes[at..end]);
        taken += 1;
        last = commit_offset;
        budget -= size;
    }
    Some((out, taken, last, budget, false))
}
