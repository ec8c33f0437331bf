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
//! | [`usage`]     | a memory node's usage record, on every node        | 128 B         |
//!
//! All multi-byte integers are little-endian, which is also what RDMA atomics
//! see on little-endian hosts: a slot or directory word is CASed as the `u64`
//! whose little-endian bytes are stored.

pub mod bucket;
pub mod dir_header;
pub mod directory;
pub mod error;
pub mod extendible;
pub mod kv;
pub mod slot;
pub mod subtable;
pub mod suffix;
pub mod table;
pub mod usage;

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

// The workspace's one little-endian helper (no panic: zeros out of range,
// `false` for a write that does not fit).
pub(crate) use krcore_nic::le::{read_array, read_u16, read_u32, read_u64, write_array};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_mask_covers_every_depth() {
        assert_eq!(low_mask(0), 0);
        assert_eq!(low_mask(3), 7);
        assert_eq!(low_mask(64), u64::MAX);
    }
}
