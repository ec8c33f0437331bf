//! DCCache: the node-wide cache from a target's [`Gid`] to its DC metadata.
//!
//! `connect(gid)` is a lookup here; only a miss costs a one-sided READ of the
//! meta server. The cache is shared by every VQP of the node, read on every
//! connect, written on misses and invalidated on `REM_ACCESS_ERR`/bad target
//! and on a meta epoch change.
//!
//! # Placement: two choices of bucket
//!
//! Every GID hashes to two distinct buckets (one when the table has a
//! single bucket) and lives in at most one of them: an insert takes the
//! less occupied of the two, and evicts only when both are full; a lookup
//! scans the first, then the second. With one choice, 10,000 random GIDs
//! in 16,384 slots (8-way buckets) already overflow some buckets (9,777
//! held); with two, the fullest bucket holds about `mean + log2 ln(buckets)`
//! entries instead of `mean + O(log n / log log n)`. [`DcCache::new`] sizes
//! the table at [`HEADROOM_PCT`]% of the capacity asked for (mean 5 of 8
//! ways used at capacity): 10,000 random GIDs then all fit (0 overflows
//! in 300 simulated trials; the test `ten_thousand_random_gids_all_fit`
//! checks one seed), at 54.4 B per target.
//!
//! # Concurrency scheme: per-bucket seqlocks over fixed arrays of atomics
//!
//! The cache is a set-associative table of `buckets x` [`WAYS`] slots, all in
//! two boxed slices of `AtomicU64` allocated once by [`DcCache::new`]:
//!
//! ```text
//! headers: [ seq | ref ] per bucket                          (16 B / bucket)
//!   seq: bit 0 WRITER | bits 1..9 occupied ways | bits 9..12 clock hand
//!        | bits 12..64 version (52 bits)
//!   ref: bits 0..8 clock reference bit per way (set by readers on a hit)
//! slots: [ gid lo | gid hi | dc_key | dct_num (lo 32) + epoch (hi 32) ]
//!                                                            (32 B / slot)
//! ```
//!
//! - **Writers** (`insert`, `invalidate*`) take the bucket by CAS-ing `WRITER`
//!   into `seq` (the seqlock's odd state doubles as the bucket's writer lock),
//!   store the slot words with `Release`, and publish with one `Release` store
//!   of `seq` carrying the new occupancy, hand and `version + 1`.
//! - **Readers** (`lookup`) never write the slots or `seq`: load `seq`
//!   (`Acquire`), scan the occupied ways comparing the GID words, load the
//!   match, `fence(Acquire)`, and re-load `seq`. Equal and even: the snapshot
//!   is consistent. A reader that sees `WRITER` or a changed `seq` retries up
//!   to [`READ_RETRIES`] times and then reports [`Lookup::Contended`] (a miss
//!   for the caller), so a writer preempted mid-update never blocks a reader.
//!   Why the fence suffices: if a reader loaded any word a writer stored in a
//!   critical section, that `Release` store synchronizes with the reader's
//!   acquire fence, so the writer's earlier `WRITER` CAS happens-before the
//!   second `seq` load, which therefore differs. (The writer marks its
//!   stores `Release` instead of issuing a release fence after the CAS: plain
//!   moves on x86, and writers are rare.)
//! - **Two buckets**: writers take both of a GID's buckets, lower index
//!   first (no deadlock), so that the GID is found, replaced, placed or
//!   removed with no other writer of either bucket in between; an entry never
//!   moves from one bucket to the other (no cuckoo displacement). A reader
//!   validates each bucket on its own: a miss validated in both buckets is a
//!   true miss at some instant between the two reads (the entry cannot be in
//!   one bucket at the first read and the other at the second without being
//!   removed, and so absent, in between).
//! - **Eviction** is CLOCK within the GID's first bucket: a hit sets the way's reference
//!   bit (a load first, so the common hit writes nothing); an insert into a
//!   full bucket sweeps from the hand, clearing set bits, and takes the first
//!   way whose bit is clear (bounded to two sweeps).
//!
//! Why not crossbeam-epoch: an epoch-managed table needs a heap node per
//! target (plus allocator header and a pointer), leaves garbage alive until
//! the epoch advances, and pins (a fence plus a thread-local access) on every
//! read; its memory is neither bounded at every instant nor countable. Fixed
//! arrays make the footprint exactly [`DcCache::memory_bytes`], allocate
//! nothing after construction, and keep a hit to a handful of loads on one
//! bucket. Writes are rare (misses, invalidations), so a per-bucket writer
//! lock costs nothing measurable, and buckets are the shards: there is no
//! lock above a bucket.
//!
//! # Memory per target
//!
//! 16 B GID + 8 B `dc_key` + 4 B `dct_num` + 4 B epoch = 32 B per slot, plus
//! 16 B of header per 8-way bucket = 34 B per slot ([`BYTES_PER_SLOT`]); with
//! the headroom, **54.4 B per target** at capacity, independent of how many
//! QPs or VQPs exist. The GID is stored in full, so a hit is never another
//! target's entry.
//!
//! # Invariants
//!
//! 1. A lookup returns a miss or a `(gid, dct_num, dc_key, epoch)` that one
//!    `insert` stored for exactly that GID; never a torn or mixed entry.
//! 2. A GID occupies at most one slot, in one of its two buckets (writers of
//!    a bucket are serialized, an insert holds both of the GID's buckets and
//!    replaces the GID's slot in place).
//! 3. Capacity and memory are fixed at construction.
//! 4. Epochs never go backwards through `insert`: an insert older than the
//!    cached entry's epoch, or than the floor set by
//!    [`DcCache::invalidate_all_older_than`], is refused ([`Insert::Stale`]).
//! 5. Once `invalidate(gid)` returns, lookups that start after it miss that
//!    GID until it is inserted again; once `invalidate_all_older_than(e)`
//!    returns, no lookup that starts after it sees an epoch below `e`.
//! 6. A validated miss is a true miss at its linearization point; only
//!    [`Lookup::Contended`] may be spurious (a writer was in the bucket).
//!
//! Epochs are compared as plain `u32` (no wrap-around); the meta server's
//! epoch must fit in 32 bits.

use std::fmt;

use krcore_nic::{DcTarget, Gid};

use crate::sync::{fence, spin_loop, AtomicU32, AtomicU64, Ordering};

/// A meta-server epoch. Larger is newer.
pub type MetaEpoch = u32;

/// Slots per bucket.
pub const WAYS: usize = 8;
/// Bytes of the cache per slot (per target at full occupancy): the 32-byte
/// slot plus its share of the 16-byte bucket header.
pub const BYTES_PER_SLOT: usize = SLOT_WORDS * 8 + HEADER_WORDS * 8 / WAYS;
/// Slots allocated per 100 targets of capacity asked for (see the module
/// docs: two-choice placement needs this headroom to fit every target).
pub const HEADROOM_PCT: usize = 160;
/// Attempts a lookup makes on a bucket that a writer is changing before it
/// reports [`Lookup::Contended`].
pub const READ_RETRIES: usize = 16;

const SLOT_WORDS: usize = 4;
const HEADER_WORDS: usize = 2;

const WRITER: u64 = 1;
const OCC_SHIFT: u32 = 1;
const HAND_SHIFT: u32 = 9;
const VERSION_SHIFT: u32 = 12;
const DEFAULT_SEED: u64 = 0x6b72_636f_7265_2d72; // "krcore-r"
/// Derives the second bucket's hash from the first's.
const SECOND_SEED: u64 = 0x2d63_6163_6865_3221;

// The header layout has 8 occupancy/reference bits and a 3-bit hand.
const _: () = assert!(WAYS == 8 && HAND_SHIFT - OCC_SHIFT == WAYS as u32);

/// A cached target with the meta epoch it was read at.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CachedTarget {
    /// The target's DC address.
    pub target: DcTarget,
    /// The meta epoch of the entry it came from.
    pub epoch: MetaEpoch,
}

/// The result of [`DcCache::lookup`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Lookup {
    /// The target is cached.
    Hit(CachedTarget),
    /// The target is not cached.
    Miss,
    /// A writer kept changing the bucket for [`READ_RETRIES`] attempts; treat
    /// as a miss.
    Contended,
}

impl Lookup {
    /// The hit, if any.
    pub fn hit(self) -> Option<CachedTarget> {
        match self {
            Lookup::Hit(t) => Some(t),
            Lookup::Miss | Lookup::Contended => None,
        }
    }
}

/// The result of [`DcCache::insert`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Insert {
    /// Stored in a free slot.
    Inserted,
    /// The GID was cached; its entry was replaced.
    Replaced {
        /// The entry it had.
        previous: CachedTarget,
    },
    /// The bucket was full; another target's entry was evicted.
    Evicted {
        /// The entry evicted.
        victim: CachedTarget,
    },
    /// Refused: the cache already holds (or requires) a newer epoch.
    Stale {
        /// The epoch the insert would have needed at least.
        newest: MetaEpoch,
    },
}

/// The node-wide DCCache. `Sync`: share it by reference or `Arc`.
pub struct DcCache {
    /// `buckets * WAYS * SLOT_WORDS` words.
    slots: Box<[AtomicU64]>,
    /// `buckets * HEADER_WORDS` words: `[seq, ref]` per bucket.
    headers: Box<[AtomicU64]>,
    buckets: usize,
    /// Targets the cache was sized for.
    capacity: usize,
    seed: u64,
    /// Inserts below this epoch are refused.
    floor: AtomicU32,
}

impl fmt::Debug for DcCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DcCache")
            .field("capacity", &self.capacity())
            .field("slots", &self.slots())
            .field("len", &self.len())
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

fn gid_words(gid: &Gid) -> (u64, u64) {
    let b = gid.as_bytes();
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&b[..8]);
    hi.copy_from_slice(&b[8..]);
    (u64::from_le_bytes(lo), u64::from_le_bytes(hi))
}

fn words_gid(lo: u64, hi: u64) -> Gid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&lo.to_le_bytes());
    b[8..].copy_from_slice(&hi.to_le_bytes());
    Gid(b)
}

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn occupied(seq: u64) -> u64 {
    (seq >> OCC_SHIFT) & ((1 << WAYS) - 1)
}

fn decode(key: (u64, u64), dc_key: u64, meta: u64) -> CachedTarget {
    CachedTarget {
        target: DcTarget {
            gid: words_gid(key.0, key.1),
            dct_num: meta as u32,
            dc_key,
        },
        epoch: (meta >> 32) as u32,
    }
}

/// A bucket held by a writer; publishes (or restores) `seq` on drop.
struct BucketGuard<'a> {
    cache: &'a DcCache,
    bucket: usize,
    /// `seq` as it was when taken (WRITER clear).
    taken: u64,
    occ: u64,
    hand: usize,
    changed: bool,
}

impl Drop for BucketGuard<'_> {
    fn drop(&mut self) {
        let seq = if self.changed {
            let version = (self.taken >> VERSION_SHIFT).wrapping_add(1);
            (version << VERSION_SHIFT)
                | ((self.hand as u64) << HAND_SHIFT)
                | (self.occ << OCC_SHIFT)
        } else {
            self.taken
        };
        self.cache.headers[self.bucket * HEADER_WORDS].store(seq, Ordering::Release);
    }
}

impl BucketGuard<'_> {
    fn find(&self, key: (u64, u64)) -> Option<usize> {
        (0..WAYS).find(|&way| {
            self.occ & (1 << way) != 0 && {
                let w = self.cache.slot(self.bucket, way);
                w[0].load(Ordering::Relaxed) == key.0 && w[1].load(Ordering::Relaxed) == key.1
            }
        })
    }

    fn read(&self, way: usize) -> CachedTarget {
        let w = self.cache.slot(self.bucket, way);
        let key = (w[0].load(Ordering::Relaxed), w[1].load(Ordering::Relaxed));
        decode(
            key,
            w[2].load(Ordering::Relaxed),
            w[3].load(Ordering::Relaxed),
        )
    }

    fn write(&mut self, way: usize, target: &DcTarget, epoch: MetaEpoch) {
        let (lo, hi) = gid_words(&target.gid);
        let w = self.cache.slot(self.bucket, way);
        // Release: a reader that sees any of these also sees WRITER (see the
        // module docs).
        w[0].store(lo, Ordering::Release);
        w[1].store(hi, Ordering::Release);
        w[2].store(target.dc_key, Ordering::Release);
        w[3].store(
            u64::from(target.dct_num) | (u64::from(epoch) << 32),
            Ordering::Release,
        );
        self.occ |= 1 << way;
        self.changed = true;
        self.cache
            .refs(self.bucket)
            .fetch_or(1 << way, Ordering::Relaxed);
    }

    fn remove(&mut self, way: usize) {
        self.occ &= !(1 << way);
        self.changed = true;
    }

    /// CLOCK: the first way from the hand whose reference bit is clear,
    /// clearing set bits on the way; two sweeps at most.
    fn victim(&mut self) -> usize {
        let refs = self.cache.refs(self.bucket);
        let mut way = self.hand;
        for _ in 0..2 * WAYS {
            let bit = 1 << way;
            if refs.load(Ordering::Relaxed) & bit == 0 {
                break;
            }
            refs.fetch_and(!bit, Ordering::Relaxed);
            way = (way + 1) % WAYS;
        }
        self.hand = (way + 1) % WAYS;
        way
    }
}

impl DcCache {
    /// A cache sized to hold `capacity` targets: [`HEADROOM_PCT`]% as many
    /// slots, in whole buckets of [`WAYS`] (at least one bucket).
    pub fn new(capacity: usize) -> DcCache {
        DcCache::with_seed(capacity, DEFAULT_SEED)
    }

    /// [`DcCache::new`] with the seed of the bucket hash given.
    pub fn with_seed(capacity: usize, seed: u64) -> DcCache {
        let slots = capacity.saturating_mul(HEADROOM_PCT).div_ceil(100);
        let mut c = DcCache::with_buckets(slots.div_ceil(WAYS), seed);
        c.capacity = capacity;
        c
    }

    /// A cache of exactly `buckets` buckets (at least one), no headroom
    /// added: [`DcCache::capacity`] is then `buckets * WAYS`.
    pub fn with_buckets(buckets: usize, seed: u64) -> DcCache {
        let buckets = buckets.max(1);
        DcCache {
            capacity: buckets * WAYS,
            slots: (0..buckets * WAYS * SLOT_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            headers: (0..buckets * HEADER_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            buckets,
            seed,
            floor: AtomicU32::new(0),
        }
    }

    /// Targets the cache was sized for (what [`DcCache::new`] was given).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots: the most targets the cache can ever hold at once.
    pub fn slots(&self) -> usize {
        self.buckets * WAYS
    }

    /// Bytes the cache occupies: the struct and both arrays. Constant for the
    /// cache's life.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<DcCache>()
            + std::mem::size_of_val(&*self.slots)
            + std::mem::size_of_val(&*self.headers)
    }

    /// Targets cached now (a snapshot; O(buckets)).
    pub fn len(&self) -> usize {
        (0..self.buckets)
            .map(|b| occupied(self.seq(b).load(Ordering::Acquire)).count_ones() as usize)
            .sum()
    }

    /// Whether no target is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The epoch below which inserts are refused.
    pub fn epoch_floor(&self) -> MetaEpoch {
        self.floor.load(Ordering::Acquire)
    }

    /// The GID's two buckets, distinct unless there is only one.
    fn buckets_of(&self, key: (u64, u64)) -> (usize, usize) {
        let h = mix(key.0 ^ mix(key.1 ^ self.seed));
        // Lemire's multiply-shift range reduction: no division, any count.
        let reduce = |h: u64, n: usize| ((u128::from(h) * n as u128) >> 64) as usize;
        let first = reduce(h, self.buckets);
        if self.buckets == 1 {
            return (first, first);
        }
        // Uniform over the other buckets.
        let second = reduce(mix(h ^ SECOND_SEED), self.buckets - 1);
        (first, second + usize::from(second >= first))
    }

    /// The two buckets `gid` may live in (first, second): equal only when
    /// the cache has one bucket. For tests and models that need GIDs with a
    /// given placement.
    pub fn buckets_for(&self, gid: &Gid) -> (usize, usize) {
        self.buckets_of(gid_words(gid))
    }

    /// Takes both buckets, lower index first; the second guard is `None`
    /// when they are the same bucket.
    fn lock_pair(&self, (b1, b2): (usize, usize)) -> (BucketGuard<'_>, Option<BucketGuard<'_>>) {
        if b1 == b2 {
            (self.lock(b1), None)
        } else if b1 < b2 {
            let g1 = self.lock(b1);
            (g1, Some(self.lock(b2)))
        } else {
            let g2 = self.lock(b2);
            (self.lock(b1), Some(g2))
        }
    }

    fn seq(&self, bucket: usize) -> &AtomicU64 {
        &self.headers[bucket * HEADER_WORDS]
    }

    fn refs(&self, bucket: usize) -> &AtomicU64 {
        &self.headers[bucket * HEADER_WORDS + 1]
    }

    fn slot(&self, bucket: usize, way: usize) -> &[AtomicU64] {
        let at = (bucket * WAYS + way) * SLOT_WORDS;
        &self.slots[at..at + SLOT_WORDS]
    }

    fn lock(&self, bucket: usize) -> BucketGuard<'_> {
        let seq = self.seq(bucket);
        loop {
            let s = seq.load(Ordering::Relaxed);
            if s & WRITER == 0
                && seq
                    .compare_exchange_weak(s, s | WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return BucketGuard {
                    cache: self,
                    bucket,
                    taken: s,
                    occ: occupied(s),
                    hand: ((s >> HAND_SHIFT) & 0x7) as usize,
                    changed: false,
                };
            }
            spin_loop();
        }
    }

    /// Looks `gid` up without taking any lock: its first bucket, then its
    /// second.
    pub fn lookup(&self, gid: &Gid) -> Lookup {
        let key = gid_words(gid);
        let (b1, b2) = self.buckets_of(key);
        match self.lookup_in(b1, key) {
            Lookup::Miss if b2 != b1 => self.lookup_in(b2, key),
            found => found,
        }
    }

    /// One bucket's seqlock read (see the module docs).
    fn lookup_in(&self, bucket: usize, key: (u64, u64)) -> Lookup {
        let seq = self.seq(bucket);
        for _ in 0..READ_RETRIES {
            let s1 = seq.load(Ordering::Acquire);
            if s1 & WRITER != 0 {
                spin_loop();
                continue;
            }
            let occ = occupied(s1);
            let mut hit = None;
            for way in 0..WAYS {
                if occ & (1 << way) == 0 {
                    continue;
                }
                let w = self.slot(bucket, way);
                if w[0].load(Ordering::Relaxed) == key.0 && w[1].load(Ordering::Relaxed) == key.1 {
                    hit = Some((
                        way,
                        w[2].load(Ordering::Relaxed),
                        w[3].load(Ordering::Relaxed),
                    ));
                    break;
                }
            }
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) != s1 {
                spin_loop();
                continue;
            }
            return match hit {
                Some((way, dc_key, meta)) => {
                    let refs = self.refs(bucket);
                    if refs.load(Ordering::Relaxed) & (1 << way) == 0 {
                        refs.fetch_or(1 << way, Ordering::Relaxed);
                    }
                    Lookup::Hit(decode(key, dc_key, meta))
                }
                None => Lookup::Miss,
            };
        }
        Lookup::Contended
    }

    /// [`DcCache::lookup`] as an `Option` (contention counts as a miss).
    pub fn get(&self, gid: &Gid) -> Option<CachedTarget> {
        self.lookup(gid).hit()
    }

    /// Caches `target` as read at meta epoch `epoch`, evicting by CLOCK when
    /// its bucket is full.
    pub fn insert(&self, target: DcTarget, epoch: MetaEpoch) -> Insert {
        let key = gid_words(&target.gid);
        let (mut g1, mut g2) = self.lock_pair(self.buckets_of(key));
        // Read under the bucket locks: see `invalidate_all_older_than`.
        let floor = self.floor.load(Ordering::Acquire);
        if epoch < floor {
            return Insert::Stale { newest: floor };
        }
        for g in std::iter::once(&mut g1).chain(g2.as_mut()) {
            if let Some(way) = g.find(key) {
                let previous = g.read(way);
                if epoch < previous.epoch {
                    return Insert::Stale {
                        newest: previous.epoch,
                    };
                }
                g.write(way, &target, epoch);
                return Insert::Replaced { previous };
            }
        }
        // The less occupied bucket (the first on a tie).
        let g = match g2.as_mut() {
            Some(g2) if g2.occ.count_ones() < g1.occ.count_ones() => g2,
            _ => &mut g1,
        };
        if let Some(way) = (0..WAYS).find(|&w| g.occ & (1 << w) == 0) {
            g.write(way, &target, epoch);
            return Insert::Inserted;
        }
        // Both full: evict from the first.
        let g = &mut g1;
        let way = g.victim();
        let victim = g.read(way);
        g.write(way, &target, epoch);
        Insert::Evicted { victim }
    }

    /// Drops `gid`'s entry (after `REM_ACCESS_ERR` or a bad target). Returns
    /// whether it was cached.
    pub fn invalidate(&self, gid: &Gid) -> bool {
        let key = gid_words(gid);
        let (mut g1, mut g2) = self.lock_pair(self.buckets_of(key));
        for g in std::iter::once(&mut g1).chain(g2.as_mut()) {
            if let Some(way) = g.find(key) {
                g.remove(way);
                return true;
            }
        }
        false
    }

    /// Drops every entry older than `epoch` and refuses older inserts from now
    /// on (a meta epoch change). Returns how many entries were dropped.
    /// O(capacity); takes each bucket's writer lock in turn.
    pub fn invalidate_all_older_than(&self, epoch: MetaEpoch) -> usize {
        // Raise the floor first: an insert that takes a bucket after this
        // sweep released it sees the new floor; one that took it before left
        // its entry for the sweep to find.
        self.floor.fetch_max(epoch, Ordering::AcqRel);
        let mut dropped = 0;
        for bucket in 0..self.buckets {
            let mut g = self.lock(bucket);
            for way in 0..WAYS {
                if g.occ & (1 << way) != 0 && g.read(way).epoch < epoch {
                    g.remove(way);
                    dropped += 1;
                }
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests;
