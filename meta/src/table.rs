//! Table geometry, the reader's bucket lookup, and the seqlock write protocol.
//!
//! # Layout
//!
//! The table is `n_buckets` buckets of `slots_per_bucket` entries
//! ([`ENTRY_LEN`] bytes each), laid out back to back from offset 0 of one
//! registered memory region, with no header (the bootstrap reply describes it):
//!
//! ```text
//! offset(bucket, slot) = (bucket * slots_per_bucket + slot) * ENTRY_LEN
//! bucket_of(gid)       = xxh3_64_with_seed(gid, BUCKET_HASH_SEED) % n_buckets
//! ```
//!
//! A GID lives only in its own bucket (open addressing inside the bucket, no
//! overflow to other buckets), so a client finds an entry with ONE READ of
//! `bucket_len()` bytes at `bucket_offset(bucket_of(gid))` followed by
//! [`find_in_bucket`]. A registration into a full bucket is refused by the
//! server ([`crate::registry::TableError::BucketFull`]).

use crate::entry::{empty_image, EntryError, EntryRepr, EntryView, ENTRY_LEN};
use core::ops::Range;
use krcore_nic::Gid;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the bucket hash (ASCII "krcoremt"); part of the layout version.
pub const BUCKET_HASH_SEED: u64 = 0x6b72_636f_7265_6d74;
/// Entries per bucket unless configured otherwise: a 512-byte bucket READ.
pub const DEFAULT_SLOTS_PER_BUCKET: u32 = 8;
/// The most entries per bucket (a 4 KiB bucket READ).
pub const MAX_SLOTS_PER_BUCKET: u32 = 64;

/// The bucket of `gid` in a table of `n_buckets` buckets.
///
/// # Panics
/// If `n_buckets` is 0 (a programmer error: [`Geometry`] never holds 0).
pub fn bucket_of(gid: &Gid, n_buckets: u32) -> u32 {
    assert!(n_buckets > 0, "bucket_of: n_buckets must be non-zero");
    (xxh3_64_with_seed(gid.as_bytes(), BUCKET_HASH_SEED) % u64::from(n_buckets)) as u32
}

/// Why a table geometry is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GeometryError {
    /// A table needs at least one bucket.
    #[error("a table needs at least one bucket")]
    ZeroBuckets,
    /// Slots per bucket outside `1..=MAX_SLOTS_PER_BUCKET`.
    #[error("{got} slots per bucket is outside 1..={MAX_SLOTS_PER_BUCKET}")]
    SlotsPerBucket {
        /// The value asked for.
        got: u32,
    },
}

/// The shape of a table: how many buckets of how many entries.
///
/// Invariants: `n_buckets >= 1`, `1 <= slots_per_bucket <= MAX_SLOTS_PER_BUCKET`;
/// hence every offset below fits in a `u64` without overflow (at most 2^44 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    n_buckets: u32,
    slots_per_bucket: u32,
}

impl Geometry {
    /// A geometry of `n_buckets` buckets of `slots_per_bucket` entries.
    ///
    /// # Errors
    /// [`GeometryError`] when either value is out of range.
    pub fn new(n_buckets: u32, slots_per_bucket: u32) -> Result<Geometry, GeometryError> {
        if n_buckets == 0 {
            return Err(GeometryError::ZeroBuckets);
        }
        if slots_per_bucket == 0 || slots_per_bucket > MAX_SLOTS_PER_BUCKET {
            return Err(GeometryError::SlotsPerBucket {
                got: slots_per_bucket,
            });
        }
        Ok(Geometry {
            n_buckets,
            slots_per_bucket,
        })
    }

    /// A geometry of `n_buckets` buckets of [`DEFAULT_SLOTS_PER_BUCKET`] entries.
    ///
    /// # Errors
    /// [`GeometryError::ZeroBuckets`] when `n_buckets` is 0.
    pub fn with_buckets(n_buckets: u32) -> Result<Geometry, GeometryError> {
        Geometry::new(n_buckets, DEFAULT_SLOTS_PER_BUCKET)
    }

    /// Number of buckets.
    pub fn n_buckets(&self) -> u32 {
        self.n_buckets
    }

    /// Entries per bucket.
    pub fn slots_per_bucket(&self) -> u32 {
        self.slots_per_bucket
    }

    /// Total number of entry slots.
    pub fn n_slots(&self) -> u64 {
        u64::from(self.n_buckets) * u64::from(self.slots_per_bucket)
    }

    /// Bytes of one bucket: the length of the READ a lookup issues.
    pub fn bucket_len(&self) -> usize {
        self.slots_per_bucket as usize * ENTRY_LEN
    }

    /// Bytes of the whole table.
    pub fn table_len(&self) -> u64 {
        self.n_slots() * ENTRY_LEN as u64
    }

    /// The bucket of `gid`, in `0..n_buckets`.
    pub fn bucket_of(&self, gid: &Gid) -> u32 {
        bucket_of(gid, self.n_buckets)
    }

    /// Byte offset of `bucket` from the start of the table. Meaningful for
    /// `bucket < n_buckets`; never overflows for any `u32`.
    pub fn bucket_offset(&self, bucket: u32) -> u64 {
        u64::from(bucket) * self.bucket_len() as u64
    }

    /// Byte offset of entry `slot` of `bucket`. Meaningful for
    /// `bucket < n_buckets` and `slot < slots_per_bucket`.
    pub fn entry_offset(&self, bucket: u32, slot: u32) -> u64 {
        self.bucket_offset(bucket) + u64::from(slot) * ENTRY_LEN as u64
    }

    /// Byte range of `bucket` inside a local table image.
    pub fn bucket_range(&self, bucket: u32) -> Range<usize> {
        let start = self.bucket_offset(bucket) as usize;
        start..start + self.bucket_len()
    }
}

/// Why a bucket lookup found no usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The buffer is empty or not a whole number of entries.
    #[error("bucket buffer of {len} bytes is not a non-zero multiple of {ENTRY_LEN}")]
    BadLength {
        /// Length of the buffer given.
        len: usize,
    },
    /// No stable entry matched and a slot was being written while it was
    /// read: it may hold the GID. READ the bucket again.
    #[error("slot {slot} was being written (version head {head:#x}, tail {tail:#x}); retry")]
    Torn {
        /// Index of the first torn slot in the bucket.
        slot: usize,
        /// Its first version copy.
        head: u64,
        /// Its second version copy.
        tail: u64,
    },
    /// No stable entry matched, none was torn, and a slot failed its checksum
    /// or layout checks.
    #[error("slot {slot} is corrupt: {source}")]
    Corrupt {
        /// Index of the first corrupt slot in the bucket.
        slot: usize,
        /// What is wrong with it.
        #[source]
        source: EntryError,
    },
}

impl LookupError {
    /// Whether READing the bucket again may succeed: [`LookupError::Torn`]
    /// always; [`LookupError::Corrupt`] only for a checksum mismatch, and only a
    /// bounded number of times (see [`EntryError::Checksum`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            LookupError::BadLength { .. } => false,
            LookupError::Torn { .. } => true,
            LookupError::Corrupt { source, .. } => source.is_retryable(),
        }
    }
}

/// Finds `gid` in the bytes of one bucket, as copied by one READ.
///
/// - `Ok(Some(entry))`: a stable slot holds `gid`. If several do (a reader's
///   copy can span a deregistration and a re-registration into another slot),
///   the one with the highest epoch, i.e. the newest registration, wins.
/// - `Ok(None)`: every slot is stable and valid, and none holds `gid`.
/// - `Err(Torn)`: no stable match, and some slot was being written.
/// - `Err(Corrupt)`: no stable match, nothing torn, a slot is invalid.
///
/// Never panics, whatever the bytes.
///
/// # Errors
/// See [`LookupError`].
pub fn find_in_bucket(bucket: &[u8], gid: &Gid) -> Result<Option<EntryRepr>, LookupError> {
    let len = bucket.len();
    if len == 0 || len % ENTRY_LEN != 0 {
        return Err(LookupError::BadLength { len });
    }
    let mut found: Option<EntryRepr> = None;
    let mut torn: Option<LookupError> = None;
    let mut corrupt: Option<LookupError> = None;
    for (slot, bytes) in bucket.chunks_exact(ENTRY_LEN).enumerate() {
        let parsed = EntryView::new_checked(bytes).and_then(|v| EntryRepr::parse(&v));
        match parsed {
            Ok(e) if e.gid == *gid => {
                if found.is_none_or(|f| e.epoch > f.epoch) {
                    found = Some(e);
                }
            }
            Ok(_) | Err(EntryError::Empty { .. }) => {}
            Err(EntryError::Torn { head, tail }) => {
                torn.get_or_insert(LookupError::Torn { slot, head, tail });
            }
            Err(source) => {
                corrupt.get_or_insert(LookupError::Corrupt { slot, source });
            }
        }
    }
    match (found, torn, corrupt) {
        (Some(e), _, _) => Ok(Some(e)),
        (None, Some(t), _) => Err(t),
        (None, None, Some(c)) => Err(c),
        (None, None, None) => Ok(None),
    }
}

/// The memory holding a table image, written by the server one aligned 8-byte
/// word at a time.
///
/// The real server implements it over its registered RDMA memory with atomic
/// stores (`AtomicU64::store(.., Release)` or stronger, so that a remote NIC
/// never sees a later store of one [`SeqlockWrite`] without the earlier ones);
/// tests implement it with wrappers that snapshot the image between stores.
///
/// Contract: offsets are multiples of 8 and `offset + 8 <= len_bytes()`; the
/// engine never passes others. Implementations may panic on a violation.
/// Words are little-endian in the image.
pub trait TableMemory {
    /// Length of the memory in bytes.
    fn len_bytes(&self) -> usize;
    /// Loads the word at `offset`.
    fn load_u64(&self, offset: usize) -> u64;
    /// Stores `value` at `offset`, visible to readers before any later store.
    fn store_u64(&mut self, offset: usize, value: u64);

    /// Copies `buf.len()` bytes from `offset` (both multiples of 8) word by word.
    fn read_words(&self, offset: usize, buf: &mut [u8]) {
        for (i, w) in buf.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&self.load_u64(offset + i * 8).to_le_bytes());
        }
    }
}

fn slice_load(b: &[u8], offset: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[offset..offset + 8]);
    u64::from_le_bytes(w)
}

fn slice_store(b: &mut [u8], offset: usize, value: u64) {
    b[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

impl TableMemory for [u8] {
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn load_u64(&self, offset: usize) -> u64 {
        slice_load(self, offset)
    }
    fn store_u64(&mut self, offset: usize, value: u64) {
        slice_store(self, offset, value)
    }
}

impl TableMemory for Vec<u8> {
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn load_u64(&self, offset: usize) -> u64 {
        slice_load(self, offset)
    }
    fn store_u64(&mut self, offset: usize, value: u64) {
        slice_store(self, offset, value)
    }
}

impl<M: TableMemory + ?Sized> TableMemory for &mut M {
    fn len_bytes(&self) -> usize {
        (**self).len_bytes()
    }
    fn load_u64(&self, offset: usize) -> u64 {
        (**self).load_u64(offset)
    }
    fn store_u64(&mut self, offset: usize, value: u64) {
        (**self).store_u64(offset, value)
    }
}

/// One aligned 8-byte store of a [`SeqlockWrite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordStore {
    /// Byte offset in the table (a multiple of 8).
    pub offset: usize,
    /// The little-endian word to store.
    pub value: u64,
}

/// The ten word stores that rewrite one entry under its seqlock, in order.
///
/// From a stable version `v` (even) to `v + 2`:
///
/// ```text
/// 1. head := v+1     2. tail := v+1                  (open: odd)
/// 3-7. words at 8, 16, 24, 32, 48                    (gid, dct/lid/flags, dc_key, lease)
/// 8. word at 40                                      (epoch + checksum for v+2)
/// 9. tail := v+2    10. head := v+2                  (close: even)
/// ```
///
/// A reader accepts the copy only if `head == tail`, even, and the checksum
/// (computed over the fields and the version) matches ([`EntryRepr::parse`]).
///
/// Both copies are odd from before the first body store until after the
/// last one. So for a reader that loads one copy first and the other last:
///
/// - Ascending address order (what NICs do in practice): head, body, tail.
///   If it sees `head == tail == v`, its tail load preceded step 2, so every
///   body load preceded step 3: the old value. If it sees `v+2` twice, its
///   head load followed step 10, so every body load did too, and they
///   preceded the next write's step 3 because its tail load preceded the
///   next write's step 2: the new value. Any other pair is odd or unequal:
///   torn.
/// - Descending order: the same argument with head and tail swapped.
///   (Which copy is closed first does not matter; opening both before the
///   body does. A test removes either opening store and sees a mix.)
/// - Any other order is covered by the checksum, which includes the version:
///   a mix of old and new fields under matching versions fails it (up to a
///   2^-32 collision) and is reported as [`EntryError::Checksum`].
///
/// Versions only grow, so a slot never returns to an earlier (version, value)
/// pair (no ABA); a deregistered slot keeps its version and holds the empty
/// image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqlockWrite {
    steps: [WordStore; SeqlockWrite::STEPS],
    new_version: u64,
}

impl SeqlockWrite {
    /// Number of word stores in one write.
    pub const STEPS: usize = 10;

    /// The write that turns the entry at `entry_offset` (version `old_version`)
    /// into the stable image of `entry`.
    pub fn for_entry(entry_offset: usize, old_version: u64, entry: &EntryRepr) -> SeqlockWrite {
        let new_version = next_version(old_version);
        Self::from_image(entry_offset, new_version, &entry.to_image(new_version))
    }

    /// The write that empties the entry at `entry_offset` (version `old_version`).
    pub fn for_empty(entry_offset: usize, old_version: u64) -> SeqlockWrite {
        let new_version = next_version(old_version);
        Self::from_image(entry_offset, new_version, &empty_image(new_version))
    }

    fn from_image(base: usize, new_version: u64, img: &[u8; ENTRY_LEN]) -> SeqlockWrite {
        let busy = new_version - 1;
        let word = |off: usize| WordStore {
            offset: base + off,
            value: slice_load(img, off),
        };
        let at = |off: usize, value: u64| WordStore {
            offset: base + off,
            value,
        };
        SeqlockWrite {
            steps: [
                at(0, busy),
                at(56, busy),
                word(8),
                word(16),
                word(24),
                word(32),
                word(48),
                word(40),
                at(56, new_version),
                at(0, new_version),
            ],
            new_version,
        }
    }

    /// The stores, in the order they must become visible.
    pub fn steps(&self) -> &[WordStore] {
        &self.steps
    }

    /// The (even) version of the entry once every step is applied.
    pub fn new_version(&self) -> u64 {
        self.new_version
    }

    /// Applies every step to `mem`, in order.
    pub fn apply<M: TableMemory + ?Sized>(&self, mem: &mut M) {
        for s in &self.steps {
            mem.store_u64(s.offset, s.value);
        }
    }
}

/// The even version after the one a write from `old` produces: `old` rounded
/// up to odd (the "being written" value), plus one.
fn next_version(old: u64) -> u64 {
    (old | 1) + 1
}
