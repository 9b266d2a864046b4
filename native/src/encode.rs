//! `encode_records`: the store's append of a run of messages, laid out as
//! `CommitLog.append_many` lays them out with `ferry.record.encode_raw` as each record's
//! encoder — the same bytes, held equal to it by `tests/unit/test_native_encode.py`.
//!
//! Records go one after the other from the log's write position; one that does not fit
//! in what is left of its file (with the 8 bytes a BLANK marker needs) is preceded by
//! that marker and starts the next file. The answer is one chunk of bytes per file
//! touched, for one write each.
//!
//! Anything the Python would refuse or treat otherwise (a record larger than a file, a
//! host not of 8 bytes, a topic over 255 bytes, properties over 65,535, a number out of
//! its field's range, an attribute of another type) makes this return None, and the
//! Python path then runs and decides, errors included. Nothing here panics on any input.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
const BLANK_MAGIC: u32 = 0xCBD4_3194;
const BLANK_SIZE: i64 = 8;
const HEAD_SIZE: usize = 88;

/// The fields of one record, read from its `(topic, queue_id, queue_offset, message)`.
struct Fields<'a> {
    topic: &'a [u8],
    queue_id: i32,
    queue_offset: i64,
    body: &'a [u8],
    properties: &'a [u8],
    flag: i32,
    born_timestamp: i64,
    born_host: &'a [u8],
    sys_flag: i32,
    reconsume_times: i32,
    prepared_offset: i64,
}

impl Fields<'_> {
    fn size(&self) -> usize {
        HEAD_SIZE + self.body.len() + 1 + self.topic.len() + 2 + self.properties.len()
    }
}

/// `(chunks, offsets)`: `chunks` a list of `(commit offset, bytes)`, one per file touched,
/// the first at `position`; `offsets` each record's commit offset. None: the Python
/// decides (see the module doc).
///
/// `records`: `(topic bytes, queue id, queue offset, message)` with `message` a
/// `MessageIn` (body, properties, flag, born_timestamp, born_host, sys_flag,
/// reconsume_times, prepared_offset).
#[pyfunction]
pub fn encode_records<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyList>,
    position: i64,
    file_size: i64,
    store_timestamp: i64,
    store_host: &Bound<'py, PyBytes>,
) -> PyResult<Option<(Bound<'py, PyList>, Bound<'py, PyList>)>> {
    let store_host = store_host.as_bytes();
    if store_host.len() != 8 || file_size <= BLANK_SIZE || position < 0 {
        return Ok(None);
    }
    let chunks = PyList::empty(py);
    let offsets = PyList::empty(py);
    let mut chunk: Vec<u8> = Vec::new();
    let mut chunk_start = position;
    let mut at = position;
    for item in records.iter() {
        let Ok(tuple) = item.cast::<PyTuple>() else {
            return Ok(None);
        };
        if tuple.len() != 4 {
            return Ok(None);
        }
        let topic = tuple.get_item(0)?;
        let queue_id = tuple.get_item(1)?;
        let queue_offset = tuple.get_item(2)?;
        let message = tuple.get_item(3)?;
        let body = message.getattr(intern!(py, "body"))?;
        let properties = message.getattr(intern!(py, "properties"))?;
        let born_host = message.getattr(intern!(py, "born_host"))?;
        let (Ok(topic), Ok(body), Ok(properties), Ok(born_host)) = (
            topic.cast::<PyBytes>(),
            body.cast::<PyBytes>(),
            properties.cast::<PyBytes>(),
            born_host.cast::<PyBytes>(),
        ) else {
            return Ok(None);
        };
        let (Ok(queue_id), Ok(queue_offset), Ok(flag), Ok(born_timestamp), Ok(sys_flag)) = (
            queue_id.extract::<i32>(),
            queue_offset.extract::<i64>(),
            message.getattr(intern!(py, "flag"))?.extract::<i32>(),
            message
                .getattr(intern!(py, "born_timestamp"))?
                .extract::<i64>(),
            message.getattr(intern!(py, "sys_flag"))?.extract::<i32>(),
        ) else {
            return Ok(None);
        };
        let (Ok(reconsume_times), Ok(prepared_offset)) = (
            message
                .getattr(intern!(py, "reconsume_times"))?
                .extract::<i32>(),
            message
                .getattr(intern!(py, "prepared_offset"))?
                .extract::<i64>(),
        ) else {
            return Ok(None);
        };
        let fields = Fields {
            topic: topic.as_bytes(),
            queue_id,
            queue_offset,
            body: body.as_bytes(),
            properties: properties.as_bytes(),
            flag,
            born_timestamp,
            born_host: born_host.as_bytes(),
            sys_flag,
            reconsume_times,
            prepared_offset,
        };
        if fields.topic.len() > 255
            || fields.properties.len() > 0xFFFF
            || fields.born_host.len() != 8
            || fields.body.len() > i32::MAX as usize
        {
            return Ok(None);
        }
        let size = fields.size() as i64;
        if size + BLANK_SIZE > file_size {
            return Ok(None); // too large for any file: the Python raises
        }
        let file_end = at - at % file_size + file_size;
        if size + BLANK_SIZE > file_end - at {
            if file_end - at < BLANK_SIZE {
                return Ok(None); // no room for the marker: the Python raises
            }
            let remaining = (file_end - at) as i32; // < file_size: fits (checked above)
            chunk.extend_from_slice(&remaining.to_be_bytes());
            chunk.extend_from_slice(&BLANK_MAGIC.to_be_bytes());
            chunks.append((chunk_start, PyBytes::new(py, &chunk)))?;
            chunk.clear();
            chunk_start = file_end;
            at = file_end;
        }
        write_record(&mut chunk, &fields, at, store_timestamp, store_host);
        offsets.append(at)?;
        at += size;
    }
    if !chunk.is_empty() {
        chunks.append((chunk_start, PyBytes::new(py, &chunk)))?;
    }
    Ok(Some((chunks, offsets)))
}

/// `record.encode_raw`'s bytes for `fields` at `commit_offset`.
fn write_record(
    out: &mut Vec<u8>,
    fields: &Fields<'_>,
    commit_offset: i64,
    store_timestamp: i64,
    store_host: &[u8],
) {
    let size = fields.size();
    out.reserve(size);
    out.extend_from_slice(&(size as i32).to_be_bytes());
    out.extend_from_slice(&MESSAGE_MAGIC.to_be_bytes());
    out.extend_from_slice(&(crc32fast::hash(fields.body) & 0x7FFF_FFFF).to_be_bytes());
    out.extend_from_slice(&fields.queue_id.to_be_bytes());
    out.extend_from_slice(&fields.flag.to_be_bytes());
    out.extend_from_slice(&fields.queue_offset.to_be_bytes());
    out.extend_from_slice(&commit_offset.to_be_bytes());
    out.extend_from_slice(&fields.sys_flag.to_be_bytes());
    out.extend_from_slice(&fields.born_timestamp.to_be_bytes());
    out.extend_from_slice(fields.born_host);
    out.extend_from_slice(&store_timestamp.to_be_bytes());
    out.extend_from_slice(store_host);
    out.extend_from_slice(&fields.reconsume_times.to_be_bytes());
    out.extend_from_slice(&fields.prepared_offset.to_be_bytes());
    out.extend_from_slice(&(fields.body.len() as i32).to_be_bytes());
    out.extend_from_slice(fields.body);
    out.push(fields.topic.len() as u8);
    out.extend_from_slice(fields.topic);
    out.extend_from_slice(&(fields.properties.len() as u16).to_be_bytes());
    out.extend_from_slice(fields.properties);
}
