//! Little-endian field accessors over byte ranges. Callers check lengths once
//! (in a `new_checked`/`check_len`); these then index within bounds.

use core::ops::Range;

pub(crate) fn get_u16(b: &[u8], r: Range<usize>) -> u16 {
    let mut w = [0u8; 2];
    w.copy_from_slice(&b[r]);
    u16::from_le_bytes(w)
}

pub(crate) fn get_u32(b: &[u8], r: Range<usize>) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[r]);
    u32::from_le_bytes(w)
}

pub(crate) fn get_u64(b: &[u8], r: Range<usize>) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[r]);
    u64::from_le_bytes(w)
}

pub(crate) fn get_gid(b: &[u8], r: Range<usize>) -> krcore_nic::Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[r]);
    krcore_nic::Gid(g)
}

pub(crate) fn put(b: &mut [u8], r: Range<usize>, bytes: &[u8]) {
    b[r].copy_from_slice(bytes);
}
