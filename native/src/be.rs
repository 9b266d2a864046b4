//! Big-endian integers at byte positions of a slice: the record and index codecs'
//! readers and writers (the caller has checked that the bytes are there).

pub(crate) fn i32_at(data: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

pub(crate) fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

pub(crate) fn i64_at(data: &[u8], at: usize) -> i64 {
    let mut word = [0; 8];
    word.copy_from_slice(&data[at..at + 8]);
    i64::from_be_bytes(word)
}
