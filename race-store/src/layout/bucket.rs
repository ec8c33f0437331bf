//! Buckets, bucket groups and combined buckets.
//!
//! A bucket is 64 B: an 8 B header and seven slots.
//!
//! ```text
//! bucket (64 B)
//!  0       4       8      16      24      32      40      48      56      64
//! +-------+-------+-------+-------+-------+-------+-------+-------+-------+
//! | local | suffix| slot0 | slot1 | slot2 | slot3 | slot4 | slot5 | slot6 |
//! | depth |  u32  |  u64  |  u64  |  u64  |  u64  |  u64  |  u64  |  u64  |
//! +-------+-------+-------+-------+-------+-------+-------+-------+-------+
//!
//! bucket group (192 B)            combined bucket = one 128 B READ
//! +-----------+-----------+-----------+
//! |  main 0   | overflow  |  main 2   |   Left  main: group bytes   0..128
//! +-----------+-----------+-----------+   Right main: group bytes  64..192
//! 0          64          128         192
//! ```
//!
//! The header of every bucket of a subtable holds the subtable's local depth
//! and suffix, so that a client that reached the bucket through a stale
//! directory cache sees that the key's hash no longer belongs here.
//!
//! Insertion picks the less loaded of the two candidate main buckets (one per
//! hash function), then the less loaded of their overflow buckets; slots never
//! move and nothing is evicted ([`choose_insert_slot`]).
//!
//! A subtable that has been split is *retired*: every bucket header gets the
//! local depth [`RETIRED_LOCAL_DEPTH`], which no valid header has, so that a
//! client that reaches it through a stale directory cache rejects it.

use core::num::NonZeroU8;

use crate::layout::error::{LayoutError, Result};
use crate::layout::slot::{Slot, SLOT_SIZE};
use crate::layout::suffix::Suffix;
use crate::layout::{read_u32, read_u64, write_array};

/// Size of a bucket in bytes.
pub const BUCKET_SIZE: usize = 64;
/// Size of the bucket header in bytes.
pub const BUCKET_HEADER_SIZE: usize = 8;
/// Slots in one bucket.
pub const SLOTS_PER_BUCKET: usize = 7;
/// Buckets in one group: `[main][overflow][main]`.
pub const BUCKETS_PER_GROUP: usize = 3;
/// Size of a bucket group in bytes.
pub const GROUP_SIZE: usize = BUCKET_SIZE * BUCKETS_PER_GROUP;
/// Size of a combined bucket (a main bucket and its shared overflow bucket).
pub const COMBINED_SIZE: usize = 2 * BUCKET_SIZE;
/// Offset of the overflow bucket inside its group.
pub const OVERFLOW_OFFSET_IN_GROUP: usize = BUCKET_SIZE;
/// The `local_depth` header field of a retired subtable (see the module docs).
pub const RETIRED_LOCAL_DEPTH: u32 = u32::MAX;

/// Byte ranges of the bucket fields.
pub mod field {
    use core::ops::Range;
    /// `local_depth: u32` (little-endian).
    pub const LOCAL_DEPTH: Range<usize> = 0..4;
    /// `suffix: u32` (little-endian).
    pub const SUFFIX: Range<usize> = 4..8;
    /// The seven slots.
    pub const SLOTS: Range<usize> = 8..64;
}

/// Byte offset of slot `index` inside its bucket, or `None` if `index >= 7`.
pub const fn slot_offset(index: usize) -> Option<usize> {
    if index < SLOTS_PER_BUCKET {
        Some(BUCKET_HEADER_SIZE + index * SLOT_SIZE)
    } else {
        None
    }
}

/// Which main bucket of a group: bucket 0 (left) or bucket 2 (right).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MainSide {
    /// Bucket 0 of the group; its combined bucket is group bytes `0..128`.
    Left,
    /// Bucket 2 of the group; its combined bucket is group bytes `64..192`.
    Right,
}

impl MainSide {
    /// Offset of this main bucket inside its group (0 or 128).
    pub const fn main_offset_in_group(self) -> usize {
        match self {
            MainSide::Left => 0,
            MainSide::Right => 2 * BUCKET_SIZE,
        }
    }

    /// Offset of this main bucket's combined bucket inside its group (0 or 64).
    pub const fn combined_offset_in_group(self) -> usize {
        match self {
            MainSide::Left => 0,
            MainSide::Right => BUCKET_SIZE,
        }
    }

    /// Offset of the main bucket inside the combined bucket (0 or 64).
    pub const fn main_offset_in_combined(self) -> usize {
        match self {
            MainSide::Left => 0,
            MainSide::Right => BUCKET_SIZE,
        }
    }

    /// Offset of the overflow bucket inside the combined bucket (64 or 0).
    pub const fn overflow_offset_in_combined(self) -> usize {
        match self {
            MainSide::Left => BUCKET_SIZE,
            MainSide::Right => 0,
        }
    }

    /// Offset of the bucket with `role` inside the combined bucket.
    pub const fn offset_in_combined(self, role: BucketRole) -> usize {
        match role {
            BucketRole::Main => self.main_offset_in_combined(),
            BucketRole::Overflow => self.overflow_offset_in_combined(),
        }
    }
}

/// The main bucket a hash function selects inside a subtable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketLoc {
    /// The bucket group, `< SubtableGeometry::groups()`.
    pub group: u32,
    /// Which main bucket of the group.
    pub side: MainSide,
}

/// A bucket's role inside a combined bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BucketRole {
    /// The main bucket the hash selected.
    Main,
    /// The overflow bucket shared with the group's other main bucket.
    Overflow,
}

/// A checked view of one bucket over a byte buffer.
///
/// Invariant after [`Bucket::new_checked`]: the buffer holds at least
/// [`BUCKET_SIZE`] bytes (only the first 64 are viewed). No accessor panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bucket<T> {
    /// Wraps `buffer` after checking its length.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`] if it is shorter than 64 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let got = buffer.as_ref().len();
        if got < BUCKET_SIZE {
            return Err(LayoutError::Truncated {
                what: "bucket",
                need: BUCKET_SIZE,
                got,
            });
        }
        Ok(Self { buffer })
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw `local_depth` header field (unvalidated).
    pub fn local_depth(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::LOCAL_DEPTH.start)
    }

    /// The raw `suffix` header field (unvalidated).
    pub fn suffix(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SUFFIX.start)
    }

    /// The header as a validated [`Suffix`].
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] or [`LayoutError::SuffixOutOfRange`] for
    /// a garbage header.
    pub fn header(&self) -> Result<Suffix> {
        Suffix::from_header(self.local_depth(), self.suffix())
    }

    /// Whether the header marks a retired subtable ([`RETIRED_LOCAL_DEPTH`]).
    pub fn is_retired(&self) -> bool {
        self.local_depth() == RETIRED_LOCAL_DEPTH
    }

    /// Slot `index`, or `None` if `index >= 7`. The word is unvalidated.
    pub fn slot(&self, index: usize) -> Option<Slot> {
        slot_offset(index).map(|at| Slot::from_raw(read_u64(self.buffer.as_ref(), at)))
    }

    /// All seven slots (unvalidated).
    pub fn slots(&self) -> [Slot; SLOTS_PER_BUCKET] {
        let buf = self.buffer.as_ref();
        core::array::from_fn(|i| Slot::from_raw(read_u64(buf, BUCKET_HEADER_SIZE + i * SLOT_SIZE)))
    }

    /// Number of non-empty slots (the bucket's load).
    pub fn load(&self) -> usize {
        self.slots().iter().filter(|s| !s.is_empty()).count()
    }

    /// The lowest-indexed empty slot, if any.
    pub fn first_free(&self) -> Option<usize> {
        self.slots().iter().position(|s| s.is_empty())
    }

    /// Indexes and words of the slots whose fingerprint is `fp`, in slot order.
    pub fn matching(&self, fp: NonZeroU8) -> impl Iterator<Item = (usize, Slot)> {
        self.slots()
            .into_iter()
            .enumerate()
            .filter(move |(_, s)| s.matches(fp))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bucket<T> {
    /// Writes the header fields `local_depth` and `suffix`.
    pub fn set_header(&mut self, header: Suffix) {
        let buf = self.buffer.as_mut();
        // Cannot fail after `new_checked`; a lying `AsRef` writes nothing.
        write_array(
            buf,
            field::LOCAL_DEPTH.start,
            u32::from(header.depth()).to_le_bytes(),
        );
        write_array(buf, field::SUFFIX.start, header.bits().to_le_bytes());
    }

    /// Marks the bucket's subtable retired (header only; slots untouched).
    pub fn set_retired(&mut self) {
        let buf = self.buffer.as_mut();
        write_array(
            buf,
            field::LOCAL_DEPTH.start,
            RETIRED_LOCAL_DEPTH.to_le_bytes(),
        );
        write_array(buf, field::SUFFIX.start, 0u32.to_le_bytes());
    }

    /// Writes slot `index`.
    ///
    /// # Errors
    /// [`LayoutError::SlotIndexOutOfRange`] if `index >= 7`.
    pub fn set_slot(&mut self, index: usize, slot: Slot) -> Result<()> {
        let at = slot_offset(index).ok_or(LayoutError::SlotIndexOutOfRange { index })?;
        write_array(self.buffer.as_mut(), at, slot.to_le_bytes());
        Ok(())
    }
}

/// A parsed, validated bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketRepr {
    /// The subtable's local depth and suffix.
    pub header: Suffix,
    /// The slots; each is empty or well formed.
    pub slots: [Slot; SLOTS_PER_BUCKET],
}

impl BucketRepr {
    /// An empty bucket of the subtable `header`.
    pub const fn empty(header: Suffix) -> Self {
        Self {
            header,
            slots: [Slot::EMPTY; SLOTS_PER_BUCKET],
        }
    }

    /// Parses and validates a bucket: a valid header and well-formed slots.
    ///
    /// # Errors
    /// The header errors of [`Bucket::header`] or [`LayoutError::MalformedSlot`].
    pub fn parse<T: AsRef<[u8]>>(bucket: &Bucket<T>) -> Result<Self> {
        let header = bucket.header()?;
        let slots = bucket.slots();
        for s in slots {
            s.validate()?;
        }
        Ok(Self { header, slots })
    }

    /// Writes this bucket into `bucket`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bucket: &mut Bucket<T>) {
        bucket.set_header(self.header);
        for (i, s) in self.slots.iter().enumerate() {
            // Indexes are < 7 by construction.
            let _ = bucket.set_slot(i, *s);
        }
    }

    /// Bytes needed to emit (always [`BUCKET_SIZE`]).
    pub const fn buffer_len(&self) -> usize {
        BUCKET_SIZE
    }
}

/// A checked view of a combined bucket: a main bucket and its group's shared
/// overflow bucket, as fetched by one 128 B READ.
///
/// Invariant after [`CombinedBucket::new_checked`]: the buffer holds at least
/// [`COMBINED_SIZE`] bytes. No accessor panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombinedBucket<T: AsRef<[u8]>> {
    buffer: T,
    side: MainSide,
}

impl<T: AsRef<[u8]>> CombinedBucket<T> {
    /// Wraps `buffer`, the combined bucket of the main bucket on `side`.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`] if it is shorter than 128 bytes.
    pub fn new_checked(buffer: T, side: MainSide) -> Result<Self> {
        let got = buffer.as_ref().len();
        if got < COMBINED_SIZE {
            return Err(LayoutError::Truncated {
                what: "combined bucket",
                need: COMBINED_SIZE,
                got,
            });
        }
        Ok(Self { buffer, side })
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Which main bucket of the group this combined bucket belongs to.
    pub fn side(&self) -> MainSide {
        self.side
    }

    /// The bucket with `role`.
    pub fn bucket(&self, role: BucketRole) -> Bucket<&[u8]> {
        let at = self.side.offset_in_combined(role);
        // In range after `new_checked`; an empty view reads as zeros otherwise.
        let bytes = self
            .buffer
            .as_ref()
            .get(at..at + BUCKET_SIZE)
            .unwrap_or(&[]);
        Bucket { buffer: bytes }
    }

    /// The main bucket.
    pub fn main(&self) -> Bucket<&[u8]> {
        self.bucket(BucketRole::Main)
    }

    /// The overflow bucket.
    pub fn overflow(&self) -> Bucket<&[u8]> {
        self.bucket(BucketRole::Overflow)
    }

    /// The header both buckets agree on.
    ///
    /// # Errors
    /// [`LayoutError::HeaderMismatch`] if the two headers differ (a torn read
    /// across a split, or garbage), or the errors of [`Bucket::header`].
    pub fn header(&self) -> Result<Suffix> {
        let (m, o) = (self.main(), self.overflow());
        let main = (m.local_depth(), m.suffix());
        let overflow = (o.local_depth(), o.suffix());
        if main != overflow {
            return Err(LayoutError::HeaderMismatch { main, overflow });
        }
        m.header()
    }

    /// Whether either bucket carries the retired header.
    pub fn is_retired(&self) -> bool {
        self.main().is_retired() || self.overflow().is_retired()
    }

    /// Total non-empty slots in both buckets.
    pub fn load(&self) -> usize {
        self.main().load() + self.overflow().load()
    }

    /// Offset of slot `index` of the bucket with `role` inside the combined
    /// bucket, or `None` if `index >= 7`.
    pub fn slot_offset(&self, role: BucketRole, index: usize) -> Option<usize> {
        slot_offset(index).map(|at| self.side.offset_in_combined(role) + at)
    }

    /// Slots with fingerprint `fp`: main bucket first, then overflow, each in
    /// slot order.
    pub fn matching(&self, fp: NonZeroU8) -> impl Iterator<Item = (BucketRole, usize, Slot)> {
        let main = self.main().slots().into_iter().enumerate();
        let over = self.overflow().slots().into_iter().enumerate();
        main.map(|(i, s)| (BucketRole::Main, i, s))
            .chain(over.map(|(i, s)| (BucketRole::Overflow, i, s)))
            .filter(move |(_, _, s)| s.matches(fp))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CombinedBucket<T> {
    /// The bucket with `role`, writable.
    pub fn bucket_mut(&mut self, role: BucketRole) -> Bucket<&mut [u8]> {
        let at = self.side.offset_in_combined(role);
        let bytes = match self.buffer.as_mut().get_mut(at..at + BUCKET_SIZE) {
            Some(b) => b,
            None => &mut [],
        };
        Bucket { buffer: bytes }
    }
}

/// Where to insert: which candidate, which bucket of it, which slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsertTarget {
    /// Index of the chosen candidate (0: first hash, 1: second hash).
    pub candidate: usize,
    /// Main or overflow bucket of that combined bucket.
    pub role: BucketRole,
    /// The empty slot's index in that bucket.
    pub slot: usize,
}

/// Chooses the empty slot for an insert among the two candidate combined
/// buckets: the less loaded main bucket that has a free slot, else the less
/// loaded overflow bucket that has one; ties go to candidate 0, and inside a
/// bucket the lowest free slot is taken. `None` if all four buckets are full
/// (the subtable must be split).
///
/// Both candidates may be the same combined bucket (both hashes chose it).
pub fn choose_insert_slot<T: AsRef<[u8]>>(
    candidates: [&CombinedBucket<T>; 2],
) -> Option<InsertTarget> {
    choose_insert_slot_except(candidates, |_| false)
}

/// [`choose_insert_slot`] among the empty slots that `taken` does not
/// claim (a batch's writes that chose empty slots of the same buckets
/// before, which the images read do not show yet); claimed slots count in
/// the loads.
pub fn choose_insert_slot_except<T: AsRef<[u8]>>(
    candidates: [&CombinedBucket<T>; 2],
    taken: impl Fn(&InsertTarget) -> bool,
) -> Option<InsertTarget> {
    for role in [BucketRole::Main, BucketRole::Overflow] {
        let free = |candidate: usize| -> Vec<InsertTarget> {
            let Some(c) = candidates.get(candidate) else {
                return Vec::new();
            };
            c.bucket(role)
                .slots()
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_empty())
                .map(|(slot, _)| InsertTarget {
                    candidate,
                    role,
                    slot,
                })
                .filter(|t| !taken(t))
                .collect()
        };
        let frees = [free(0), free(1)];
        // The less loaded bucket first (fewer free slots: more loaded).
        let order = if frees[1].len() > frees[0].len() {
            [1, 0]
        } else {
            [0, 1]
        };
        for candidate in order {
            if let Some(t) = frees.get(candidate).and_then(|f| f.first()) {
                return Some(*t);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::slot::RemotePtr;

    fn occupied(n: u64) -> Slot {
        let fp = NonZeroU8::new((n % 255 + 1) as u8).unwrap();
        Slot::new(fp, 1, RemotePtr::new(0, n * 64).unwrap()).unwrap()
    }

    fn bucket_with(header: Suffix, used: usize) -> [u8; BUCKET_SIZE] {
        let mut buf = [0u8; BUCKET_SIZE];
        let mut repr = BucketRepr::empty(header);
        for i in 0..used {
            repr.slots[i] = occupied(i as u64 + 1);
        }
        repr.emit(&mut Bucket::new_checked(&mut buf[..]).unwrap());
        buf
    }

    #[test]
    fn offsets() {
        assert_eq!(slot_offset(0), Some(8));
        assert_eq!(slot_offset(6), Some(56));
        assert_eq!(slot_offset(7), None);
        assert_eq!(MainSide::Left.main_offset_in_group(), 0);
        assert_eq!(MainSide::Right.main_offset_in_group(), 128);
        assert_eq!(MainSide::Left.combined_offset_in_group(), 0);
        assert_eq!(MainSide::Right.combined_offset_in_group(), 64);
        for side in [MainSide::Left, MainSide::Right] {
            // The combined bucket covers the main bucket and the overflow bucket.
            let c = side.combined_offset_in_group();
            assert_eq!(
                c + side.main_offset_in_combined(),
                side.main_offset_in_group()
            );
            assert_eq!(
                c + side.overflow_offset_in_combined(),
                OVERFLOW_OFFSET_IN_GROUP
            );
            assert!(c + COMBINED_SIZE <= GROUP_SIZE);
        }
    }

    #[test]
    fn bucket_round_trip_and_le_layout() {
        let header = Suffix::new(0b101, 3).unwrap();
        let mut repr = BucketRepr::empty(header);
        repr.slots[0] = occupied(1);
        repr.slots[6] = occupied(2);
        let mut buf = [0xFFu8; BUCKET_SIZE];
        repr.emit(&mut Bucket::new_checked(&mut buf[..]).unwrap());
        assert_eq!(&buf[0..8], &[3, 0, 0, 0, 5, 0, 0, 0]);
        assert_eq!(&buf[56..64], &occupied(2).to_le_bytes());
        let view = Bucket::new_checked(&buf[..]).unwrap();
        assert_eq!(view.local_depth(), 3);
        assert_eq!(view.suffix(), 5);
        assert_eq!(BucketRepr::parse(&view), Ok(repr));
        assert_eq!(view.load(), 2);
        assert_eq!(view.first_free(), Some(1));
        assert_eq!(view.slot(7), None);
        let fp = NonZeroU8::new(occupied(2).fingerprint()).unwrap();
        assert_eq!(
            view.matching(fp).collect::<Vec<_>>(),
            vec![(6, occupied(2))]
        );
        assert_eq!(repr.buffer_len(), BUCKET_SIZE);
    }

    #[test]
    fn bucket_errors() {
        assert_eq!(
            Bucket::new_checked(&[0u8; 63][..]),
            Err(LayoutError::Truncated {
                what: "bucket",
                need: 64,
                got: 63
            })
        );
        let mut buf = [0u8; BUCKET_SIZE];
        let mut b = Bucket::new_checked(&mut buf[..]).unwrap();
        assert_eq!(
            b.set_slot(7, Slot::EMPTY),
            Err(LayoutError::SlotIndexOutOfRange { index: 7 })
        );
        // Depth above the maximum.
        buf[0] = 21;
        let view = Bucket::new_checked(&buf[..]).unwrap();
        assert!(matches!(
            BucketRepr::parse(&view),
            Err(LayoutError::DepthOutOfRange { depth: 21, .. })
        ));
        // Suffix with bits at or above the depth.
        buf[0] = 2;
        buf[4] = 4;
        let view = Bucket::new_checked(&buf[..]).unwrap();
        assert!(matches!(
            BucketRepr::parse(&view),
            Err(LayoutError::SuffixOutOfRange {
                suffix: 4,
                depth: 2
            })
        ));
        // A malformed slot.
        buf[4] = 0;
        buf[8..16].copy_from_slice(&0x0001_0000_0000_0000u64.to_le_bytes());
        let view = Bucket::new_checked(&buf[..]).unwrap();
        assert!(matches!(
            BucketRepr::parse(&view),
            Err(LayoutError::MalformedSlot { .. })
        ));
    }

    #[test]
    fn combined_views_both_sides() {
        let header = Suffix::new(1, 1).unwrap();
        let mut group = [0u8; GROUP_SIZE];
        group[0..64].copy_from_slice(&bucket_with(header, 1));
        group[64..128].copy_from_slice(&bucket_with(header, 2));
        group[128..192].copy_from_slice(&bucket_with(header, 3));
        for (side, main_load) in [(MainSide::Left, 1), (MainSide::Right, 3)] {
            let at = side.combined_offset_in_group();
            let c = CombinedBucket::new_checked(&group[at..at + COMBINED_SIZE], side).unwrap();
            assert_eq!(c.side(), side);
            assert_eq!(c.main().load(), main_load);
            assert_eq!(c.overflow().load(), 2);
            assert_eq!(c.load(), main_load + 2);
            assert_eq!(c.header(), Ok(header));
            let off = c.slot_offset(BucketRole::Main, 0).unwrap();
            assert_eq!(off, side.main_offset_in_combined() + 8);
            assert_eq!(c.slot_offset(BucketRole::Overflow, 7), None);
            let fp = NonZeroU8::new(occupied(1).fingerprint()).unwrap();
            let hits: Vec<_> = c.matching(fp).collect();
            assert_eq!(
                hits,
                vec![
                    (BucketRole::Main, 0, occupied(1)),
                    (BucketRole::Overflow, 0, occupied(1))
                ]
            );
        }
        assert!(matches!(
            CombinedBucket::new_checked(&group[..127], MainSide::Left),
            Err(LayoutError::Truncated {
                need: 128,
                got: 127,
                ..
            })
        ));
    }

    #[test]
    fn combined_header_mismatch_and_mut() {
        let mut buf = [0u8; COMBINED_SIZE];
        let mut c = CombinedBucket::new_checked(&mut buf[..], MainSide::Right).unwrap();
        c.bucket_mut(BucketRole::Main)
            .set_header(Suffix::new(1, 1).unwrap());
        c.bucket_mut(BucketRole::Overflow)
            .set_slot(3, occupied(9))
            .unwrap();
        assert_eq!(buf[0..8], [0u8; 8]);
        assert_eq!(&buf[64..72], &[1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&buf[32..40], &occupied(9).to_le_bytes());
        let c = CombinedBucket::new_checked(&buf[..], MainSide::Right).unwrap();
        assert_eq!(
            c.header(),
            Err(LayoutError::HeaderMismatch {
                main: (1, 1),
                overflow: (0, 0)
            })
        );
        assert_eq!(c.into_inner().len(), COMBINED_SIZE);
    }

    #[test]
    fn retired_header() {
        let mut buf = combined(3, 1);
        let c = CombinedBucket::new_checked(&buf[..], MainSide::Left).unwrap();
        assert!(!c.is_retired());
        let mut c = CombinedBucket::new_checked(&mut buf[..], MainSide::Left).unwrap();
        c.bucket_mut(BucketRole::Overflow).set_retired();
        let c = CombinedBucket::new_checked(&buf[..], MainSide::Left).unwrap();
        assert!(c.is_retired() && c.overflow().is_retired() && !c.main().is_retired());
        assert!(c.header().is_err());
        assert!(c.overflow().header().is_err());
        // Slots are untouched.
        assert_eq!(c.load(), 4);
    }

    fn combined(main_used: usize, over_used: usize) -> [u8; COMBINED_SIZE] {
        let h = Suffix::ROOT;
        let mut buf = [0u8; COMBINED_SIZE];
        buf[..64].copy_from_slice(&bucket_with(h, main_used));
        buf[64..].copy_from_slice(&bucket_with(h, over_used));
        buf
    }

    #[test]
    fn insert_choice() {
        let pick = |a: (usize, usize), b: (usize, usize)| {
            let (ba, bb) = (combined(a.0, a.1), combined(b.0, b.1));
            let ca = CombinedBucket::new_checked(&ba[..], MainSide::Left).unwrap();
            let cb = CombinedBucket::new_checked(&bb[..], MainSide::Left).unwrap();
            choose_insert_slot([&ca, &cb]).map(|t| (t.candidate, t.role, t.slot))
        };
        use BucketRole::*;
        assert_eq!(pick((0, 0), (0, 0)), Some((0, Main, 0)));
        assert_eq!(pick((3, 0), (2, 0)), Some((1, Main, 2)));
        assert_eq!(pick((2, 0), (3, 0)), Some((0, Main, 2)));
        assert_eq!(pick((7, 0), (6, 7)), Some((1, Main, 6)));
        assert_eq!(pick((7, 5), (7, 4)), Some((1, Overflow, 4)));
        assert_eq!(pick((7, 6), (7, 7)), Some((0, Overflow, 6)));
        assert_eq!(pick((7, 7), (7, 7)), None);
    }
}
