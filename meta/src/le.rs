//! The meta crate's little-endian accessors: the workspace's one helper,
//! `krcore_nic::le` (no panic: zeros for a range outside the buffer,
//! nothing written for a write that does not fit), over the field ranges
//! the layouts name. Callers check lengths once (in a
//! `new_checked`/`check_len`), so the fallbacks never show in practice; a
//! write that does not fit is a layout bug, caught by a debug assertion.

use core::ops::Range;
use krcore_nic::le;

pub(crate) fn get_u16(b: &[u8], r: Range<usize>) -> u16 {
    debug_assert_eq!(r.len(), 2);
    le::read_u16(b, r.start)
}

pub(crate) fn get_u32(b: &[u8], r: Range<usize>) -> u32 {
    debug_assert_eq!(r.len(), 4);
    le::read_u32(b, r.start)
}

pub(crate) fn get_u64(b: &[u8], r: Range<usize>) -> u64 {
    debug_assert_eq!(r.len(), 8);
    le::read_u64(b, r.start)
}

pub(crate) fn get_gid(b: &[u8], r: Range<usize>) -> krcore_nic::Gid {
    debug_assert_eq!(r.len(), 16);
    le::read_gid(b, r.start)
}

pub(crate) fn put(b: &mut [u8], r: Range<usize>, bytes: &[u8]) {
    debug_assert_eq!(r.len(), bytes.len());
    let fits = le::write_bytes(b, r.start, bytes);
    debug_assert!(fits, "field {r:?} outside a buffer of {} bytes", b.len());
}
