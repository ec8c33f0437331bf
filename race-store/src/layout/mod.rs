//! Byte layouts of everything RACE keeps in remote memory.
//!
//! Every structure a client reads over RDMA has a checked view in the style of
//! smoltcp's `wire` module: named byte ranges, a `new_checked` constructor that
//! validates the length once, accessors that cannot panic afterwards, and
//! (where a structure has invariants beyond its length) a parsed `Repr` with
//! `parse` and `emit`.
//!
//! | module        | structure                                          | size          |
//! |---------------|----------------------------------------------------|---------------|
//! | [`slot`]      | slot word `fp 8 \| len 8 \| node 8 \| offset 40`   | 8 B           |
//! | [`bucket`]    | bucket `{local_depth, suffix, 7 slots}`, groups    | 64 B / 192 B  |
//! | [`subtable`]  | geometry, suffix algebra, split plans              | groups x 192 B|
//! | [`dir_header`]| directory header: global depth + leased lock       | 8 B           |
//! | [`directory`] | entry words, directory image and its consistency   | 64 B + 8 B x 2^g |
//! | [`extendible`]| entries of a suffix, split rewrites, doubling      | -             |
//! | [`kv`]        | out-of-place KV block with CRC32                   | 64 B x n      |
//! | [`table`]     | superblock, split log, fixed locations on node 0   | 64 B each     |
//!
//! All multi-byte integers are little-endian, which is also what RDMA atomics
//! see on little-endian hosts: a slot or directory word is CASed as the `u64`
//! whose little-endian bytes are stored.

pub mod bucket;
pub mod dir_header;
pub mod directory;
pub mod extendible;
pub mod kv;
pub mod slot;
pub mod subtable;
pub mod table;

/// Largest global depth of a directory, and so the largest local depth.
///
/// A directory at this depth has `2^20` entries (8 MiB of entry words). The
/// bound keeps every suffix inside the low 32 bits of the directory hash (the
/// bits above 32 choose buckets) and in the 6-bit depth fields of the words.
pub const MAX_GLOBAL_DEPTH: u8 = 20;

/// Mask of the low `depth` bits (`depth` <= 63).
#[inline]
pub(crate) const fn low_mask(depth: u8) -> u64 {
    if depth >= 64 {
        u64::MAX
    } else {
        (1u64 << depth) - 1
    }
}

/// Reads `N` bytes at `at`, or zeros if the range is outside `buf`.
///
/// Checked views validate their length once; this fallback only matters for a
/// buffer whose `AsRef` lies about its length between calls, and keeps even
/// that case from panicking.
#[inline]
pub(crate) fn read_array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .unwrap_or([0; N])
}

/// Writes `bytes` at `at`; returns false (writing nothing) if out of range.
#[inline]
pub(crate) fn write_array<const N: usize>(buf: &mut [u8], at: usize, bytes: [u8; N]) -> bool {
    match at.checked_add(N).and_then(|end| buf.get_mut(at..end)) {
        Some(dst) => {
            dst.copy_from_slice(&bytes);
            true
        }
        None => false,
    }
}

#[inline]
pub(crate) fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(read_array(buf, at))
}

#[inline]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(read_array(buf, at))
}

#[inline]
pub(crate) fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(read_array(buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_never_panic_out_of_range() {
        let buf = [1u8, 2, 3];
        assert_eq!(read_u16(&buf, 1), 0x0302);
        assert_eq!(read_u16(&buf, 2), 0);
        assert_eq!(read_u64(&buf, usize::MAX), 0);
        let mut out = [0u8; 4];
        assert!(write_array(&mut out, 0, [9u8; 4]));
        assert!(!write_array(&mut out, 1, [9u8; 4]));
        assert!(!write_array(&mut out, usize::MAX - 1, [9u8; 4]));
        assert_eq!(low_mask(0), 0);
        assert_eq!(low_mask(3), 7);
        assert_eq!(low_mask(64), u64::MAX);
    }
}
