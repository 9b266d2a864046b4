//! `AclFast`: the common case of RocketMQ's ACL check on the broker's RocketMQ-protocol
//! door, in one call per request — a send or a pull signed by an access key whose decision
//! (this code, this key, this topic and group) the Python checker already made and found
//! permitted, with a signature that matches (`ferry.acl.signature_matches`: HMAC-SHA1 with
//! the account's secret key over every ext field's value but `Signature`, in the order of
//! the field names by UTF-16 code unit as Java sorts them, then the body, Base64).
//!
//! `check` answers true only then; anything else (no or an unknown access key, a decision
//! not remembered, a value that is not a str or holds a lone surrogate, a wrong signature)
//! is false and the Python checker decides it in full — refusals, their messages and every
//! white list live there. Held equal to the Python by `tests/unit/test_native_acl.py`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use hmac::{Hmac, Mac};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use sha1::Sha1;

const SIGNATURE: &str = "Signature";
const ACCESS_KEY: &str = "AccessKey";
/// RemotingCommand's response flag bit.
const RESPONSE: i64 = 1;
/// Remembered decisions at most (then forgotten, and made again in Python).
const KEPT: usize = 4096;

type Decision = (i64, String, Option<String>, Option<String>);

#[pyclass(module = "ferry_native")]
pub struct AclFast {
    /// access key -> HMAC-SHA1 keyed by its secret key (cloned per request: the key's
    /// padding is hashed once, not per request)
    macs: HashMap<String, Hmac<Sha1>>,
    /// code -> the two header fields its permissions depend on
    fields: HashMap<i64, (String, String)>,
    /// the decisions remembered, by a hash of the decision (compared whole on a hit)
    allowed: HashMap<u64, Vec<Decision>>,
    kept: usize,
}

fn key_hash(code: i64, access_key: &str, first: Option<&str>, second: Option<&str>) -> u64 {
    let mut hasher = DefaultHasher::new();
    (code, access_key, first, second).hash(&mut hasher);
    hasher.finish()
}

/// The str value of `key` in `ext`: Ok(None) when absent, Err(()) when not a valid str.
fn field<'py>(
    ext: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Result<Option<Bound<'py, PyString>>, ()>> {
    match ext.get_item(key)? {
        None => Ok(Ok(None)),
        Some(value) => Ok(value.cast_into::<PyString>().map(Some).map_err(|_| ())),
    }
}

#[pymethods]
impl AclFast {
    #[new]
    fn new(secrets: HashMap<String, Vec<u8>>, fields: HashMap<i64, (String, String)>) -> Self {
        let macs = secrets
            .into_iter()
            .filter_map(|(key, secret)| {
                Hmac::<Sha1>::new_from_slice(&secret).ok().map(|m| (key, m))
            })
            .collect();
        AclFast {
            macs,
            fields,
            allowed: HashMap::new(),
            kept: 0,
        }
    }

    /// Remember that this code, key and pair of header values is permitted.
    #[pyo3(signature = (code, access_key, first, second))]
    fn allow(
        &mut self,
        code: i64,
        access_key: String,
        first: Option<String>,
        second: Option<String>,
    ) {
        if self.kept >= KEPT {
            self.allowed.clear();
            self.kept = 0;
        }
        let hash = key_hash(code, &access_key, first.as_deref(), second.as_deref());
        let decision = (code, access_key, first, second);
        let same = self.allowed.entry(hash).or_default();
        if !same.contains(&decision) {
            same.push(decision);
            self.kept += 1;
        }
    }

    /// `check` for every request of a read (RocketMQ `Command`s: `flag`, `code`, `ext`,
    /// `body`; a response passes): None when every one passed, else a list of whether each
    /// did (those that did not go to the Python checker).
    #[pyo3(signature = (commands))]
    fn check_many(&self, commands: &Bound<'_, PyList>) -> PyResult<Option<Vec<bool>>> {
        let py = commands.py();
        let mut out: Option<Vec<bool>> = None;
        let n = commands.len();
        for (i, command) in commands.iter().enumerate() {
            let flag: i64 = command.getattr(intern!(py, "flag"))?.extract().unwrap_or(0);
            let passed = flag & RESPONSE != 0 || {
                let code: i64 = command
                    .getattr(intern!(py, "code"))?
                    .extract()
                    .unwrap_or(-1);
                self.check(
                    code,
                    &command.getattr(intern!(py, "ext"))?,
                    &command.getattr(intern!(py, "body"))?,
                )?
            };
            if !passed {
                out.get_or_insert_with(|| vec![true; n])[i] = false;
            }
        }
        Ok(out)
    }

    /// True when the request is permitted by a remembered decision and its signature
    /// matches; false: let the Python checker decide.
    #[pyo3(signature = (code, ext, body))]
    fn check(&self, code: i64, ext: &Bound<'_, PyAny>, body: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Some((first_name, second_name)) = self.fields.get(&code) else {
            return Ok(false);
        };
        let Ok(ext) = ext.cast::<PyDict>() else {
            return Ok(false);
        };
        let body: Option<&[u8]> = match body.cast::<PyBytes>() {
            Ok(bytes) => Some(bytes.as_bytes()),
            Err(_) if body.is_none() => None,
            Err(_) => return Ok(false), // (a bytearray or memoryview: the Python decides)
        };
        let (Ok(Some(access_key)), Ok(first), Ok(second), Ok(Some(given))) = (
            field(ext, ACCESS_KEY)?,
            field(ext, first_name)?,
            field(ext, second_name)?,
            field(ext, SIGNATURE)?,
        ) else {
            return Ok(false);
        };
        let (Ok(access_key), Ok(given)) = (access_key.to_str(), given.to_str()) else {
            return Ok(false);
        };
        let first = match &first {
            None => None,
            Some(s) => match s.to_str() {
                Ok(s) => Some(s),
                Err(_) => return Ok(false),
            },
        };
        let second = match &second {
            None => None,
            Some(s) => match s.to_str() {
                Ok(s) => Some(s),
                Err(_) => return Ok(false),
            },
        };
        let Some(mac) = self.macs.get(access_key) else {
            return Ok(false);
        };
        let Some(same) = self.allowed.get(&key_hash(code, access_key, first, second)) else {
            return Ok(false);
        };
        let known = same.iter().any(|(c, k, f, s)| {
            *c == code && k == access_key && f.as_deref() == first && s.as_deref() == second
        });
        if !known {
            return Ok(false);
        }
        Ok(signature(mac, ext, body)?.is_some_and(|s| same_bytes(s.as_bytes(), given.as_bytes())))
    }
}

/// The Base64 HMAC-SHA1 of the request as the Java client signs it; None for what the
/// Python decides (a key or value that is not a str, or not valid UTF-8 text).
fn signature(
    mac: &Hmac<Sha1>,
    ext: &Bound<'_, PyDict>,
    body: Option<&[u8]>,
) -> PyResult<Option<String>> {
    let mut pairs: Vec<(Bound<'_, PyString>, Bound<'_, PyString>)> = Vec::with_capacity(ext.len());
    for (key, value) in ext.iter() {
        let (Ok(key), Ok(value)) = (key.cast_into::<PyString>(), value.cast_into::<PyString>())
        else {
            return Ok(None);
        };
        pairs.push((key, value));
    }
    let mut named: Vec<(&str, &str)> = Vec::with_capacity(pairs.len());
    for (key, value) in &pairs {
        let (Ok(key), Ok(value)) = (key.to_str(), value.to_str()) else {
            return Ok(None);
        };
        if key != SIGNATURE {
            named.push((key, value));
        }
    }
    named.sort_unstable_by(|a, b| java_order(a.0, b.0));
    let mut mac = mac.clone();
    for (_, value) in &named {
        mac.update(value.as_bytes());
    }
    if let Some(body) = body {
        mac.update(body);
    }
    Ok(Some(base64(&mac.finalize().into_bytes())))
}

/// Java's String.compareTo: by UTF-16 code unit (byte order for ASCII names).
fn java_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.cmp(b)
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
