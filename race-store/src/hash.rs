//! Key hashing: two independent hash functions, the fingerprint, and where a
//! key lives (directory entry, then two candidate buckets).
//!
//! A key is hashed twice with xxh3-64 under two fixed seeds, `h1` and `h2`.
//! Their 128 bits are split into disjoint fields so that each decision is
//! independent of the others:
//!
//! ```text
//! h1: 63 ........... 32 | 31 ........ 20 | 19 ........... 0
//!     bucket of hash 1  |     unused     | directory suffix (<= MAX_GLOBAL_DEPTH bits)
//! h2: 63 ........... 32 | 31 ........................... 0
//!     bucket of hash 2  |  fingerprint source
//! ```
//!
//! * The directory index is the low `global_depth` bits of `h1` (the
//!   directory hash); a subtable of local depth `d` holds the keys whose low
//!   `d` bits equal its suffix. Both candidate buckets are in that subtable.
//! * Each candidate main bucket is chosen by reducing the high 32 bits of its
//!   hash onto `2 * groups` main buckets by multiply-shift (each of the `n`
//!   main buckets receives `floor(2^32 / n)` or `ceil(2^32 / n)` of the 2^32
//!   values, for any group count, with no division): main bucket `m` is group
//!   `m / 2`, side `m % 2` (left = bucket 0, right = bucket 2 of the group).
//! * The fingerprint maps the low 32 bits of `h2` onto `1..=255`, never 0,
//!   because the slot word 0 means empty.
//!
//! The seeds are part of the on-memory format: changing them relocates every
//! key of an existing table.

use core::num::NonZeroU8;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::layout::bucket::{BucketLoc, MainSide};
use crate::layout::error::{LayoutError, Result};
use crate::layout::subtable::SubtableGeometry;
use crate::layout::{low_mask, MAX_GLOBAL_DEPTH};

/// Seed of the first hash function (directory and first bucket).
pub const SEED_H1: u64 = 0x5241_4345_2d68_3101; // "RACE-h1" + 0x01
/// Seed of the second hash function (second bucket and fingerprint).
pub const SEED_H2: u64 = 0x5241_4345_2d68_3202; // "RACE-h2" + 0x02

/// The hashes of one key and everything derived from them.
///
/// Invariant: the fingerprint is never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash {
    h1: u64,
    h2: u64,
}

impl KeyHash {
    /// Hashes `key` with both hash functions.
    pub fn of(key: &[u8]) -> Self {
        Self {
            h1: xxh3_64_with_seed(key, SEED_H1),
            h2: xxh3_64_with_seed(key, SEED_H2),
        }
    }

    /// A hash with given raw values (for simulations and tests that need to
    /// control where a key lands).
    pub const fn from_raw(h1: u64, h2: u64) -> Self {
        Self { h1, h2 }
    }

    /// The first hash value.
    pub const fn h1(&self) -> u64 {
        self.h1
    }

    /// The second hash value.
    pub const fn h2(&self) -> u64 {
        self.h2
    }

    /// The directory hash: the value whose low bits select the directory entry
    /// and decide splits (bit `d` on a split at local depth `d`).
    pub const fn dir_hash(&self) -> u64 {
        self.h1
    }

    /// The 8-bit fingerprint stored in the slot, in `1..=255`.
    pub const fn fingerprint(&self) -> NonZeroU8 {
        fingerprint_from(self.h2 as u32)
    }

    /// The directory index at `global_depth`: the low `global_depth` bits of
    /// the directory hash.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `global_depth > MAX_GLOBAL_DEPTH`.
    pub const fn dir_index(&self, global_depth: u8) -> Result<usize> {
        dir_index(self.h1, global_depth)
    }

    /// The two candidate main buckets in a subtable of `geometry`: from the
    /// first and from the second hash. They may coincide.
    pub const fn bucket_locs(&self, geometry: SubtableGeometry) -> [BucketLoc; 2] {
        [bucket_loc(self.h1, geometry), bucket_loc(self.h2, geometry)]
    }
}

/// Maps 32 hash bits onto a fingerprint in `1..=255` (multiply-shift onto 255
/// values, plus one).
pub const fn fingerprint_from(bits: u32) -> NonZeroU8 {
    let v = ((bits as u64 * 255) >> 32) as u8 + 1;
    match NonZeroU8::new(v) {
        Some(fp) => fp,
        None => NonZeroU8::MIN,
    }
}

/// The directory index of `dir_hash` at `global_depth` (its low bits).
///
/// # Errors
/// [`LayoutError::DepthOutOfRange`] if `global_depth > MAX_GLOBAL_DEPTH`.
pub const fn dir_index(dir_hash: u64, global_depth: u8) -> Result<usize> {
    if global_depth > MAX_GLOBAL_DEPTH {
        return Err(LayoutError::DepthOutOfRange {
            depth: global_depth as u32,
            max: MAX_GLOBAL_DEPTH,
        });
    }
    Ok((dir_hash & low_mask(global_depth)) as usize)
}

/// The main bucket that hash value `hash` selects in a subtable of `geometry`,
/// from its high 32 bits.
pub const fn bucket_loc(hash: u64, geometry: SubtableGeometry) -> BucketLoc {
    let main = ((hash >> 32) * geometry.main_buckets() as u64) >> 32;
    BucketLoc {
        group: (main / 2) as u32,
        side: if main % 2 == 0 {
            MainSide::Left
        } else {
            MainSide::Right
        },
    }
}

impl SubtableGeometry {
    /// The two candidate main buckets of a key (see [`KeyHash::bucket_locs`]).
    /// Here, beside the hashing, so that the subtable's layout does not
    /// import it.
    pub fn locate(self, hash: &KeyHash) -> [BucketLoc; 2] {
        hash.bucket_locs(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seeded() {
        let a = KeyHash::of(b"user:42");
        assert_eq!(a, KeyHash::of(b"user:42"));
        assert_ne!(a.h1(), a.h2());
        assert_eq!(a.h1(), xxh3_64_with_seed(b"user:42", SEED_H1));
        assert_eq!(a.dir_hash(), a.h1());
        assert_ne!(a, KeyHash::of(b"user:43"));
    }

    #[test]
    fn fingerprint_never_zero_and_covers_range() {
        assert_eq!(fingerprint_from(0).get(), 1);
        assert_eq!(fingerprint_from(u32::MAX).get(), 255);
        let mut seen = [false; 256];
        for i in 0..=255u64 {
            seen[fingerprint_from((i << 24) as u32 | 0x7f_ffff).get() as usize] = true;
        }
        assert!(!seen[0]);
        assert!(
            seen[1..].iter().all(|&s| s),
            "every fingerprint 1..=255 reachable"
        );
        for k in 0..10_000u32 {
            assert_ne!(KeyHash::of(&k.to_le_bytes()).fingerprint().get(), 0);
        }
    }

    #[test]
    fn dir_index_bits() {
        let h = KeyHash::from_raw(0b1011_0110, 0);
        assert_eq!(h.dir_index(0), Ok(0));
        assert_eq!(h.dir_index(3), Ok(0b110));
        assert_eq!(h.dir_index(8), Ok(0b1011_0110));
        assert_eq!(
            h.dir_index(MAX_GLOBAL_DEPTH + 1),
            Err(LayoutError::DepthOutOfRange {
                depth: 21,
                max: MAX_GLOBAL_DEPTH
            })
        );
    }

    #[test]
    fn bucket_locs_in_range_and_extremes() {
        let g = SubtableGeometry::new(5).unwrap();
        let low = KeyHash::from_raw(0, u64::MAX);
        assert_eq!(
            low.bucket_locs(g),
            [
                BucketLoc {
                    group: 0,
                    side: MainSide::Left
                },
                BucketLoc {
                    group: 4,
                    side: MainSide::Right
                }
            ]
        );
        // The directory bits do not influence the bucket.
        let a = KeyHash::from_raw(0x1234_5678_0000_0000, 0);
        let b = KeyHash::from_raw(0x1234_5678_FFFF_FFFF, 0);
        assert_eq!(a.bucket_locs(g)[0], b.bucket_locs(g)[0]);
        let one = SubtableGeometry::new(1).unwrap();
        for k in 0..1000u32 {
            let h = KeyHash::of(&k.to_be_bytes());
            for loc in h.bucket_locs(g) {
                assert!(loc.group < 5);
            }
            assert!(one.locate(&h).iter().all(|l| l.group == 0));
        }
    }

    #[test]
    fn buckets_spread_evenly_and_hashes_independent() {
        let g = SubtableGeometry::new(16).unwrap();
        let n = 32_000u32;
        let mut counts = [[0u32; 32]; 2];
        let mut same = 0;
        for k in 0..n {
            let locs = KeyHash::of(format!("key{k}").as_bytes()).bucket_locs(g);
            for (h, loc) in locs.iter().enumerate() {
                let m = loc.group as usize * 2 + usize::from(loc.side == MainSide::Right);
                counts[h][m] += 1;
            }
            same += u32::from(locs[0] == locs[1]);
        }
        // 1000 expected per main bucket; allow a generous +-20%.
        for c in counts.iter().flatten() {
            assert!((800..1200).contains(c), "{c}");
        }
        // Independent hashes coincide on 1 in 32 keys (1000 expected).
        assert!((700..1300).contains(&same), "{same}");
    }
}
