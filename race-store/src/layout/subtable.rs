//! Subtables: their geometry, their identity (a [`Suffix`]) and how they split.
//!
//! A subtable is `groups` bucket groups laid out back to back, so its size is
//! `groups * 192` bytes and every bucket, combined bucket and slot sits at a
//! fixed offset from the subtable's base ([`SubtableGeometry`]). The group
//! count is a parameter: the default suits a real deployment, tests use tiny
//! tables to force splits.
//!
//! In extendible hashing, a subtable of local depth `d` holds exactly the keys
//! whose directory hash (see [`crate::hash::KeyHash::dir_hash`]) ends in the
//! `d`-bit suffix `s`. Splitting it yields two subtables of depth `d + 1`:
//! suffix `s` (keys whose hash bit `d` is 0, they stay) and `s | 1 << d` (bit
//! `d` is 1, they move) ([`SplitPlan`]). A key keeps its bucket position in the
//! new subtable, because positions depend only on the hash and the geometry.

use crate::layout::bucket::{
    slot_offset, Bucket, BucketLoc, BucketRepr, BucketRole, CombinedBucket, BUCKETS_PER_GROUP,
    BUCKET_SIZE, COMBINED_SIZE, GROUP_SIZE, SLOTS_PER_BUCKET,
};
use crate::layout::error::{LayoutError, Result};
pub use crate::layout::suffix::Suffix;

/// The split of one subtable of local depth `d` into two of depth `d + 1`.
///
/// The old subtable keeps suffix [`SplitPlan::stay`]; the new one gets
/// [`SplitPlan::moved`]. A key of the old subtable moves iff bit `d` of its
/// directory hash is 1. See [`crate::layout::extendible::split_rewrites`] for the
/// directory entries to rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    old: Suffix,
    stay: Suffix,
    moved: Suffix,
}

impl SplitPlan {
    /// Plans the split of the subtable `old`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `old` is at the maximum depth.
    pub const fn new(old: Suffix) -> Result<Self> {
        match old.split() {
            Ok((stay, moved)) => Ok(Self { old, stay, moved }),
            Err(e) => Err(e),
        }
    }

    /// The suffix of the subtable before the split.
    pub const fn old(&self) -> Suffix {
        self.old
    }

    /// The old subtable's suffix after the split (hash bit `d` = 0).
    pub const fn stay(&self) -> Suffix {
        self.stay
    }

    /// The new subtable's suffix (hash bit `d` = 1).
    pub const fn moved(&self) -> Suffix {
        self.moved
    }

    /// Whether a key of the old subtable moves to the new one (hash bit `d`).
    pub const fn key_moves(&self, dir_hash: u64) -> bool {
        (dir_hash >> self.old.depth()) & 1 == 1
    }

    /// The suffix that holds `dir_hash` after the split, or `None` if the key
    /// does not belong to the old subtable at all.
    pub const fn destination(&self, dir_hash: u64) -> Option<Suffix> {
        if !self.old.contains(dir_hash) {
            None
        } else if self.key_moves(dir_hash) {
            Some(self.moved)
        } else {
            Some(self.stay)
        }
    }
}

/// The shape of every subtable of a table: how many bucket groups it has.
///
/// Invariant: `1 <= groups <= MAX_GROUPS`, so every offset fits in `u64` and
/// in the 40-bit offset field, and `2 * groups` main buckets fit in `u32`.
///
/// (De)serialized as its group count (a `u32`) through
/// [`SubtableGeometry::new`]: a count out of range is a deserialize error,
/// never a geometry that breaks the invariant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct SubtableGeometry {
    groups: u32,
}

impl TryFrom<u32> for SubtableGeometry {
    type Error = LayoutError;

    /// As [`SubtableGeometry::new`].
    fn try_from(groups: u32) -> Result<Self> {
        Self::new(groups)
    }
}

impl From<SubtableGeometry> for u32 {
    /// Its group count.
    fn from(geometry: SubtableGeometry) -> u32 {
        geometry.groups
    }
}

impl SubtableGeometry {
    /// Largest group count (16 Mi groups, 3 GiB per subtable).
    pub const MAX_GROUPS: u32 = 1 << 24;
    /// Default group count: 4096 groups = 12288 buckets = 86016 slots, 768 KiB.
    pub const DEFAULT_GROUPS: u32 = 4096;
    /// The default geometry.
    pub const DEFAULT: SubtableGeometry = SubtableGeometry {
        groups: Self::DEFAULT_GROUPS,
    };

    /// A geometry of `groups` bucket groups.
    ///
    /// # Errors
    /// [`LayoutError::GeometryOutOfRange`] unless `1 <= groups <= MAX_GROUPS`.
    pub const fn new(groups: u32) -> Result<Self> {
        if groups == 0 || groups > Self::MAX_GROUPS {
            return Err(LayoutError::GeometryOutOfRange {
                groups: groups as u64,
                max: Self::MAX_GROUPS,
            });
        }
        Ok(Self { groups })
    }

    /// A geometry of `buckets` buckets (main and overflow).
    ///
    /// # Errors
    /// [`LayoutError::BucketsNotGroups`] unless `buckets` is a multiple of 3,
    /// then as [`SubtableGeometry::new`].
    pub const fn with_buckets(buckets: u64) -> Result<Self> {
        if buckets % BUCKETS_PER_GROUP as u64 != 0 {
            return Err(LayoutError::BucketsNotGroups { buckets });
        }
        let groups = buckets / BUCKETS_PER_GROUP as u64;
        if groups > Self::MAX_GROUPS as u64 {
            return Err(LayoutError::GeometryOutOfRange {
                groups,
                max: Self::MAX_GROUPS,
            });
        }
        Self::new(groups as u32)
    }

    /// Bucket groups per subtable.
    pub const fn groups(self) -> u32 {
        self.groups
    }

    /// Buckets per subtable (main and overflow).
    pub const fn buckets(self) -> u64 {
        self.groups as u64 * BUCKETS_PER_GROUP as u64
    }

    /// Main buckets per subtable (the range a hash function maps into).
    pub const fn main_buckets(self) -> u32 {
        self.groups * 2
    }

    /// Slots per subtable.
    pub const fn slots(self) -> u64 {
        self.buckets() * SLOTS_PER_BUCKET as u64
    }

    /// Bytes per subtable.
    pub const fn bytes(self) -> u64 {
        self.groups as u64 * GROUP_SIZE as u64
    }

    /// Offset of group `group` from the subtable base.
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] if `group >= groups`.
    pub const fn group_offset(self, group: u32) -> Result<u64> {
        if group >= self.groups {
            return Err(LayoutError::GroupOutOfRange {
                group,
                groups: self.groups,
            });
        }
        Ok(group as u64 * GROUP_SIZE as u64)
    }

    /// Offset of the 128 B combined bucket of `loc` (the READ address).
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] if the group is outside the subtable.
    pub const fn combined_offset(self, loc: BucketLoc) -> Result<u64> {
        match self.group_offset(loc.group) {
            Ok(g) => Ok(g + loc.side.combined_offset_in_group() as u64),
            Err(e) => Err(e),
        }
    }

    /// Offset of the bucket with `role` in the combined bucket of `loc`.
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] if the group is outside the subtable.
    pub const fn bucket_offset(self, loc: BucketLoc, role: BucketRole) -> Result<u64> {
        match self.combined_offset(loc) {
            Ok(c) => Ok(c + loc.side.offset_in_combined(role) as u64),
            Err(e) => Err(e),
        }
    }

    /// Offset of slot `index` of the bucket with `role` in the combined
    /// bucket of `loc` (the CAS address, relative to the subtable base).
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] or [`LayoutError::SlotIndexOutOfRange`].
    pub const fn slot_offset(self, loc: BucketLoc, role: BucketRole, index: usize) -> Result<u64> {
        let Some(in_bucket) = slot_offset(index) else {
            return Err(LayoutError::SlotIndexOutOfRange { index });
        };
        match self.bucket_offset(loc, role) {
            Ok(b) => Ok(b + in_bucket as u64),
            Err(e) => Err(e),
        }
    }
}

impl Default for SubtableGeometry {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A checked view of a whole subtable image (as held by a memory node, or
/// read in full by a splitting client).
///
/// Invariant after [`Subtable::new_checked`]: the buffer holds at least
/// `geometry.bytes()` bytes. No accessor panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subtable<T: AsRef<[u8]>> {
    buffer: T,
    geometry: SubtableGeometry,
}

impl<T: AsRef<[u8]>> Subtable<T> {
    /// Wraps `buffer` as a subtable of `geometry`.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`] if it is shorter than `geometry.bytes()`.
    pub fn new_checked(buffer: T, geometry: SubtableGeometry) -> Result<Self> {
        let got = buffer.as_ref().len();
        let need = usize::try_from(geometry.bytes()).unwrap_or(usize::MAX);
        if got < need {
            return Err(LayoutError::Truncated {
                what: "subtable",
                need,
                got,
            });
        }
        Ok(Self { buffer, geometry })
    }

    /// The geometry.
    pub fn geometry(&self) -> SubtableGeometry {
        self.geometry
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The combined bucket of `loc`.
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] if the group is outside the subtable.
    pub fn combined(&self, loc: BucketLoc) -> Result<CombinedBucket<&[u8]>> {
        let at = self.range(self.geometry.combined_offset(loc)?, COMBINED_SIZE);
        CombinedBucket::new_checked(self.buffer.as_ref().get(at).unwrap_or(&[]), loc.side)
    }

    /// Bucket `index` (0, 1 = overflow, 2) of group `group`.
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`], or [`LayoutError::Truncated`] if
    /// `index >= 3`.
    pub fn bucket(&self, group: u32, index: usize) -> Result<Bucket<&[u8]>> {
        let at = self.bucket_range(group, index)?;
        Bucket::new_checked(self.buffer.as_ref().get(at).unwrap_or(&[]))
    }

    fn bucket_range(&self, group: u32, index: usize) -> Result<core::ops::Range<usize>> {
        let g = self.geometry.group_offset(group)?;
        if index >= BUCKETS_PER_GROUP {
            return Err(LayoutError::Truncated {
                what: "bucket group",
                need: (index + 1) * BUCKET_SIZE,
                got: GROUP_SIZE,
            });
        }
        Ok(self.range(g + (index * BUCKET_SIZE) as u64, BUCKET_SIZE))
    }

    /// `start..start + len` as `usize`; offsets are below `bytes()`, which
    /// fits in `usize` after `new_checked`.
    fn range(&self, start: u64, len: usize) -> core::ops::Range<usize> {
        let start = usize::try_from(start).unwrap_or(usize::MAX - len);
        start..start.saturating_add(len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Subtable<T> {
    /// The combined bucket of `loc`, writable.
    ///
    /// # Errors
    /// [`LayoutError::GroupOutOfRange`] if the group is outside the subtable.
    pub fn combined_mut(&mut self, loc: BucketLoc) -> Result<CombinedBucket<&mut [u8]>> {
        let at = self.range(self.geometry.combined_offset(loc)?, COMBINED_SIZE);
        let bytes = match self.buffer.as_mut().get_mut(at) {
            Some(b) => b,
            None => &mut [],
        };
        CombinedBucket::new_checked(bytes, loc.side)
    }

    /// Bucket `index` of group `group`, writable.
    ///
    /// # Errors
    /// As [`Subtable::bucket`].
    pub fn bucket_mut(&mut self, group: u32, index: usize) -> Result<Bucket<&mut [u8]>> {
        let at = self.bucket_range(group, index)?;
        let bytes = match self.buffer.as_mut().get_mut(at) {
            Some(b) => b,
            None => &mut [],
        };
        Bucket::new_checked(bytes)
    }

    /// Initializes an empty subtable: every bucket gets `header` and seven
    /// empty slots.
    pub fn init_empty(&mut self, header: Suffix) {
        let empty = BucketRepr::empty(header);
        for group in 0..self.geometry.groups {
            for index in 0..BUCKETS_PER_GROUP {
                if let Ok(mut b) = self.bucket_mut(group, index) {
                    empty.emit(&mut b);
                }
            }
        }
    }

    /// Marks every bucket header retired (see
    /// [`crate::layout::bucket::RETIRED_LOCAL_DEPTH`]); slots are untouched.
    pub fn set_retired(&mut self) {
        for group in 0..self.geometry.groups {
            for index in 0..BUCKETS_PER_GROUP {
                if let Ok(mut b) = self.bucket_mut(group, index) {
                    b.set_retired();
                }
            }
        }
    }

    /// Rewrites the header of every bucket (the last step of a split, which
    /// tells clients with a stale directory cache that keys have moved).
    pub fn set_headers(&mut self, header: Suffix) {
        for group in 0..self.geometry.groups {
            for index in 0..BUCKETS_PER_GROUP {
                if let Ok(mut b) = self.bucket_mut(group, index) {
                    b.set_header(header);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::bucket::MainSide;
    use crate::layout::MAX_GLOBAL_DEPTH;

    #[test]
    fn suffix_construction() {
        assert_eq!(Suffix::new(0, 0), Ok(Suffix::ROOT));
        assert!(Suffix::new(7, 3).is_ok());
        assert_eq!(
            Suffix::new(8, 3),
            Err(LayoutError::SuffixOutOfRange {
                suffix: 8,
                depth: 3
            })
        );
        assert_eq!(
            Suffix::new(1, 0),
            Err(LayoutError::SuffixOutOfRange {
                suffix: 1,
                depth: 0
            })
        );
        let max = Suffix::new((1 << 20) - 1, MAX_GLOBAL_DEPTH).unwrap();
        assert_eq!(max.depth(), 20);
        assert_eq!(
            Suffix::new(0, 21),
            Err(LayoutError::DepthOutOfRange { depth: 21, max: 20 })
        );
        assert_eq!(
            Suffix::from_header(u32::MAX, 0),
            Err(LayoutError::DepthOutOfRange {
                depth: u32::MAX,
                max: 20
            })
        );
        assert_eq!(Suffix::from_header(2, 3), Suffix::new(3, 2));
        assert_eq!(Suffix::of_hash(0xFFFF_FFF5, 3), Suffix::new(5, 3));
        assert!(Suffix::of_hash(0, 21).is_err());
    }

    #[test]
    fn suffix_algebra() {
        let s = Suffix::new(0b01, 2).unwrap();
        assert!(s.contains(0b1101));
        assert!(!s.contains(0b1110));
        assert!(Suffix::ROOT.contains(u64::MAX));
        let (a, b) = s.split().unwrap();
        assert_eq!((a.bits(), a.depth()), (0b001, 3));
        assert_eq!((b.bits(), b.depth()), (0b101, 3));
        assert!(s.covers(a) && s.covers(b) && s.covers(s));
        assert!(!a.covers(s) && !a.covers(b));
        let max = Suffix::new(0, MAX_GLOBAL_DEPTH).unwrap();
        assert!(matches!(
            max.split(),
            Err(LayoutError::DepthOutOfRange { .. })
        ));
        assert!(SplitPlan::new(max).is_err());
    }

    #[test]
    fn split_plan() {
        let old = Suffix::new(0b10, 2).unwrap();
        let plan = SplitPlan::new(old).unwrap();
        assert_eq!(plan.old(), old);
        assert_eq!(plan.stay(), Suffix::new(0b010, 3).unwrap());
        assert_eq!(plan.moved(), Suffix::new(0b110, 3).unwrap());
        assert!(!plan.key_moves(0b1010));
        assert!(plan.key_moves(0b1110));
        assert_eq!(plan.destination(0b1010), Some(plan.stay()));
        assert_eq!(plan.destination(0b1110), Some(plan.moved()));
        assert_eq!(plan.destination(0b1111), None);
    }

    #[test]
    fn geometry() {
        let g = SubtableGeometry::new(4).unwrap();
        assert_eq!(g.groups(), 4);
        assert_eq!(g.buckets(), 12);
        assert_eq!(g.main_buckets(), 8);
        assert_eq!(g.slots(), 84);
        assert_eq!(g.bytes(), 768);
        assert_eq!(SubtableGeometry::with_buckets(12), Ok(g));
        assert_eq!(
            SubtableGeometry::with_buckets(13),
            Err(LayoutError::BucketsNotGroups { buckets: 13 })
        );
        assert!(matches!(
            SubtableGeometry::with_buckets(0),
            Err(LayoutError::GeometryOutOfRange { groups: 0, .. })
        ));
        assert!(SubtableGeometry::with_buckets(3 * (1 << 40)).is_err());
        assert!(SubtableGeometry::new(0).is_err());
        assert!(SubtableGeometry::new(SubtableGeometry::MAX_GROUPS).is_ok());
        assert!(SubtableGeometry::new(SubtableGeometry::MAX_GROUPS + 1).is_err());
        assert_eq!(SubtableGeometry::default().bytes(), 4096 * 192);
        let max = SubtableGeometry::new(SubtableGeometry::MAX_GROUPS).unwrap();
        assert!(max.bytes() <= crate::layout::slot::MAX_OFFSET);
    }

    #[test]
    fn geometry_offsets() {
        let g = SubtableGeometry::new(4).unwrap();
        let left = BucketLoc {
            group: 3,
            side: MainSide::Left,
        };
        let right = BucketLoc {
            group: 3,
            side: MainSide::Right,
        };
        assert_eq!(g.group_offset(3), Ok(576));
        assert_eq!(
            g.group_offset(4),
            Err(LayoutError::GroupOutOfRange {
                group: 4,
                groups: 4
            })
        );
        assert_eq!(g.combined_offset(left), Ok(576));
        assert_eq!(g.combined_offset(right), Ok(640));
        assert_eq!(g.bucket_offset(left, BucketRole::Main), Ok(576));
        assert_eq!(g.bucket_offset(left, BucketRole::Overflow), Ok(640));
        assert_eq!(g.bucket_offset(right, BucketRole::Main), Ok(704));
        assert_eq!(g.bucket_offset(right, BucketRole::Overflow), Ok(640));
        assert_eq!(g.slot_offset(right, BucketRole::Main, 6), Ok(704 + 56));
        assert_eq!(
            g.slot_offset(right, BucketRole::Main, 7),
            Err(LayoutError::SlotIndexOutOfRange { index: 7 })
        );
        let out = BucketLoc { group: 4, ..left };
        assert!(g.combined_offset(out).is_err());
        assert!(g.slot_offset(out, BucketRole::Main, 0).is_err());
    }

    #[test]
    fn subtable_view() {
        let g = SubtableGeometry::new(2).unwrap();
        let mut buf = vec![0xAAu8; 384];
        let header = Suffix::new(1, 1).unwrap();
        let mut st = Subtable::new_checked(&mut buf[..], g).unwrap();
        st.init_empty(header);
        let loc = BucketLoc {
            group: 1,
            side: MainSide::Right,
        };
        let slot = crate::layout::slot::Slot::from_raw(0x0101_0000_0000_0040);
        st.combined_mut(loc)
            .unwrap()
            .bucket_mut(BucketRole::Overflow)
            .set_slot(2, slot)
            .unwrap();
        let st = Subtable::new_checked(&buf[..], g).unwrap();
        assert_eq!(st.geometry(), g);
        for group in 0..2 {
            for index in 0..3 {
                let b = st.bucket(group, index).unwrap();
                assert_eq!(b.header(), Ok(header));
            }
        }
        assert_eq!(st.bucket(1, 1).unwrap().slot(2), Some(slot));
        assert_eq!(st.combined(loc).unwrap().header(), Ok(header));
        assert!(st.bucket(1, 3).is_err());
        assert!(st.bucket(2, 0).is_err());
        let at = g.slot_offset(loc, BucketRole::Overflow, 2).unwrap() as usize;
        assert_eq!(&buf[at..at + 8], &slot.to_le_bytes());

        let mut st = Subtable::new_checked(&mut buf[..], g).unwrap();
        let (stay, _) = header.split().unwrap();
        st.set_headers(stay);
        assert_eq!(st.bucket(0, 2).unwrap().header(), Ok(stay));
        assert_eq!(st.bucket(1, 1).unwrap().slot(2), Some(slot));
        st.set_retired();
        assert!(st.bucket(1, 2).unwrap().is_retired());
        assert_eq!(st.bucket(1, 1).unwrap().slot(2), Some(slot));
        assert!(matches!(
            Subtable::new_checked(&buf[..383], g),
            Err(LayoutError::Truncated { need: 384, .. })
        ));
        assert_eq!(
            Subtable::new_checked(&buf[..], g)
                .unwrap()
                .into_inner()
                .len(),
            384
        );
    }
}
