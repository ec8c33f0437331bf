//! A memory node's pool of blocks that clients gave back.
//!
//! Clients carve KV blocks out of coarse blocks they take from the memory
//! nodes, and keep the blocks they free in free lists of their own (see
//! [`crate::client`]'s allocator). A client that closes gives what it still
//! holds back to the nodes ([`crate::remote::Transport::return_blocks`]):
//! its free blocks, the part of its coarse blocks it never carved, and its
//! retired blocks, with the time left of their grace period. The node keeps
//! them here, by block size, and hands them out before new heap memory
//! ([`ReturnPool::take`]) once that time has passed, so that clients that
//! come and go do not use up the node. A request of one size takes runs of
//! its size first, then runs of other sizes cut into its blocks, so that
//! memory freed under one value size serves another.
//!
//! # Invariants
//! * Every pooled run lies inside the node's heap as handed out so far
//!   (`floor..top`, [`ReturnPool::give`]'s bounds), is 64-byte aligned and a
//!   whole number of its size's blocks.
//! * No two pooled runs overlap: a return that overlaps a pooled run, or
//!   whose runs overlap each other, is refused whole ([`Refusal`]), so a
//!   block given back twice by mistake is never handed out twice by the
//!   pool (the pool cannot tell a block handed out and given back since
//!   from a duplicate, which is why clients give back only blocks they
//!   hold: free ones, uncarved ones, and retired ones with the rest of
//!   their grace period).
//! * Runs are handed out never before the time they were given back with
//!   (they wait in a cooling list until then); after it, runs of each
//!   block size first in, first out, split when a request needs less than
//!   the front run. A run cut into blocks of another size leaves its cut
//!   block's rest pooled as 64-byte blocks and its whole blocks where they
//!   were.
//! * Runs of 64-byte blocks (*rests*: the rests of cut blocks, and 64-byte
//!   blocks given back) are kept by address and merged with every rest
//!   next to them; a run of another size that comes next to a rest joins
//!   it as 64-byte blocks. A rest serves any block size without leaving a
//!   rest of its own, so the memory a change of value sizes leaves in cut
//!   blocks' rests comes back to larger blocks once their neighbours come
//!   back, instead of serving 64-byte values only. Rests are handed out
//!   smallest first among those that hold a block of the size asked.
//!
//! Plain data, no I/O, no lock and no clock: the node calls it under its
//! heap lock with its own time (any monotonic microseconds).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::layout::slot::LEN_UNIT;

/// Runs start and end on KV block units.
const BLOCK_ALIGN: u64 = LEN_UNIT as u64;

/// Most runs one grant of pooled blocks carries (it then fits one message
/// of a few KiB).
pub const MAX_GRANT_RUNS: usize = 256;

/// Why a return was refused (nothing of it was taken).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The block size is 0 or not a multiple of 64.
    #[error("block size {0} is not a positive multiple of 64")]
    BlockSize(u64),
    /// A run is empty, misaligned or not a whole number of blocks.
    #[error("run at {offset:#x}+{len} is empty, misaligned or not whole blocks")]
    Shape {
        /// Start of the run.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A run lies outside the heap handed out so far.
    #[error("run at {offset:#x}+{len} is outside the heap handed out")]
    Outside {
        /// Start of the run.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A run overlaps another of the return or a pooled run.
    #[error("run at {offset:#x}+{len} overlaps blocks the node holds")]
    Overlap {
        /// Start of the run.
        offset: u64,
        /// Its length.
        len: u64,
    },
}

/// Runs of a memory node's blocks given back, by block size (see the module
/// docs).
#[derive(Debug, Default)]
pub struct ReturnPool {
    /// Block size -> runs `(offset, len)`, first in first out (64-byte
    /// blocks are in `rests`).
    by_size: BTreeMap<u64, VecDeque<(u64, u64)>>,
    /// Usable runs of 64-byte blocks, start -> length, none next to
    /// another (merged when they meet).
    rests: BTreeMap<u64, u64>,
    /// The same rests by `(length, start)`, to find one that holds a block.
    rests_by_len: BTreeSet<(u64, u64)>,
    /// Block size -> at least the length of its longest run: a request for
    /// longer blocks does not walk that size's runs (converted runs leave
    /// their cut blocks' rests as short 64-byte runs, which pile up, and a
    /// request that walked them all was linear in the pile, under the
    /// node's heap lock). Exact after a walk of the whole queue.
    longest: BTreeMap<u64, u64>,
    /// Runs given back with time left of their grace period: `(usable
    /// from, block size, offset, len)`, in order of that time.
    cooling: BTreeMap<(u64, u64), (u64, u64)>,
    /// Start -> end of every pooled run (overlap checks).
    index: BTreeMap<u64, u64>,
    /// Bytes pooled now (cooling included).
    bytes: u64,
    /// Bytes cooling now.
    cooling_bytes: u64,
    /// Bytes given back so far.
    returned: u64,
    /// Bytes handed out again so far.
    reused: u64,
}

/// Figures of a [`ReturnPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes pooled now (handed out by the next requests of their sizes,
    /// `cooling` included).
    pub pooled: u64,
    /// Of `pooled`, bytes still in their grace period.
    pub cooling: u64,
    /// Bytes given back since the node started.
    pub returned: u64,
    /// Bytes handed out again since the node started.
    pub reused: u64,
}

impl ReturnPool {
    /// Every pooled run as `(start, end)`, cooling ones included, by
    /// address.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.index.iter().map(|(&s, &e)| (s, e))
    }

    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a usable run of blocks of `size` (its `index` entry made):
    /// last in its size's queue, or as a rest when its blocks are 64 bytes
    /// or a rest lies next to it.
    fn queue(&mut self, size: u64, offset: u64, len: u64) {
        let end = offset + len;
        let rest_before = self
            .rests
            .range(..offset)
            .next_back()
            .is_some_and(|(&s, &l)| s + l == offset);
        if size == BLOCK_ALIGN || rest_before || self.rests.contains_key(&end) {
            self.add_rest(offset, len);
            return;
        }
        self.by_size
            .entry(size)
            .or_default()
            .push_back((offset, len));
        let longest = self.longest.entry(size).or_default();
        *longest = (*longest).max(len);
    }

    /// Adds a rest (its `index` entry made), merged with the rests next to
    /// it.
    fn add_rest(&mut self, offset: u64, len: u64) {
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&s, &l)) = self.rests.range(..start).next_back() {
            if s + l == start {
                self.remove_rest(s);
                start = s;
            }
        }
        if self.rests.contains_key(&end) {
            end += self.remove_rest(end);
        }
        self.index.remove(&offset);
        self.index.insert(start, end);
        self.rests.insert(start, end - start);
        self.rests_by_len.insert((end - start, start));
    }

    /// Removes the rest at `start` (and its `index` entry); its length.
    fn remove_rest(&mut self, start: u64) -> u64 {
        let len = self.rests.remove(&start).unwrap_or(0);
        self.rests_by_len.remove(&(len, start));
        self.index.remove(&start);
        len
    }

    /// Hands out rests as blocks of `block_bytes`, up to `want` bytes, into
    /// `out` while it has fewer than `max_runs`: from the shortest rest
    /// that holds a block on; returns the bytes handed out.
    fn take_rests(
        &mut self,
        block_bytes: u64,
        want: u64,
        max_runs: usize,
        out: &mut Vec<(u64, u64)>,
    ) -> u64 {
        let mut got = 0;
        while got < want && out.len() < max_runs {
            let Some(&(len, start)) = self.rests_by_len.range((block_bytes, 0)..).next() else {
                break;
            };
            self.remove_rest(start);
            let need = (want - got).div_ceil(block_bytes) * block_bytes;
            let give = need.min(len / block_bytes * block_bytes);
            out.push((start, give));
            got += give;
            if len > give {
                // Its neighbours are not rests (rests are merged), and the
                // part handed out is nobody's pooled run.
                let (s, l) = (start + give, len - give);
                self.index.insert(s, s + l);
                self.rests.insert(s, l);
                self.rests_by_len.insert((l, s));
            }
        }
        got
    }

    /// Figures.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            pooled: self.bytes,
            cooling: self.cooling_bytes,
            returned: self.returned,
            reused: self.reused,
        }
    }

    /// Takes `runs` (`(offset, len)`) of blocks of `block_bytes`, each
    /// inside `floor..top`, to hand out from time `usable_from` on (the
    /// caller's microseconds, as `now` of [`ReturnPool::take`]); returns the
    /// bytes taken. All or nothing.
    ///
    /// # Errors
    /// The first [`Refusal`] (nothing is taken).
    pub fn give(
        &mut self,
        block_bytes: u64,
        runs: &[(u64, u64)],
        (floor, top): (u64, u64),
        usable_from: u64,
        now: u64,
    ) -> Result<u64, Refusal> {
        if block_bytes == 0 || block_bytes % BLOCK_ALIGN != 0 {
            return Err(Refusal::BlockSize(block_bytes));
        }
        let mut sorted: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for &(offset, len) in runs {
            if len == 0 || offset % BLOCK_ALIGN != 0 || len % block_bytes != 0 {
                return Err(Refusal::Shape { offset, len });
            }
            match offset.checked_add(len) {
                Some(end) if offset >= floor && end <= top => sorted.push((offset, end)),
                _ => return Err(Refusal::Outside { offset, len }),
            }
        }
        sorted.sort_unstable();
        let mut prev_end = 0;
        for &(start, end) in &sorted {
            let overlaps_pool = self
                .index
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start);
            if start < prev_end || overlaps_pool {
                return Err(Refusal::Overlap {
                    offset: start,
                    len: end - start,
                });
            }
            prev_end = end;
        }
        let mut taken = 0;
        for &(offset, len) in runs {
            self.index.insert(offset, offset + len);
            taken += len;
            if usable_from > now {
                // Unique key: runs do not overlap, so offsets differ.
                self.cooling
                    .insert((usable_from, offset), (block_bytes, len));
            } else {
                self.queue(block_bytes, offset, len);
            }
        }
        if usable_from > now {
            self.cooling_bytes += taken;
        }
        self.bytes += taken;
        self.returned += taken;
        Ok(taken)
    }

    /// Moves the runs whose grace period has passed at `now` to their
    /// sizes' queues.
    fn warm(&mut self, now: u64) {
        while let Some(entry) = self.cooling.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, offset), (block_bytes, len)) = entry.remove_entry();
            self.cooling_bytes -= len;
            self.queue(block_bytes, offset, len);
        }
    }

    /// Hands out pooled blocks of `block_bytes` usable at `now`: up to
    /// `want` bytes (whole blocks, at least one if any fits) in at most
    /// `max_runs` runs. Runs of that size first, first in first out; then,
    /// when they do not make `want`, runs of other sizes, cut into blocks
    /// of `block_bytes` (the pool converts: blocks freed under one size
    /// serve writes of another, so that a store whose values change size
    /// does not grow for it). A converted run's rest that makes no whole
    /// block of `block_bytes` stays pooled as 64-byte blocks. Empty when
    /// nothing pooled fits a block.
    ///
    /// Safe to convert: a pooled run is nobody's (its grace period over),
    /// and blocks start on any 64-byte boundary.
    pub fn take(
        &mut self,
        block_bytes: u64,
        want: u64,
        max_runs: usize,
        now: u64,
    ) -> Vec<(u64, u64)> {
        self.warm(now);
        let mut out = Vec::new();
        if block_bytes == 0 {
            return out;
        }
        let want = want.max(block_bytes);
        let mut got = self.take_sized(block_bytes, block_bytes, want, max_runs, &mut out);
        if got < want && out.len() < max_runs {
            // Rests next: cutting them leaves no rest.
            got += self.take_rests(block_bytes, want - got, max_runs, &mut out);
        }
        if got < want && out.len() < max_runs {
            // Other sizes, the largest first (their runs are the longest).
            let others: Vec<u64> = self
                .by_size
                .keys()
                .rev()
                .copied()
                .filter(|&b| b != block_bytes)
                .collect();
            for size in others {
                if got >= want || out.len() >= max_runs {
                    break;
                }
                got += self.take_sized(size, block_bytes, want - got, max_runs, &mut out);
            }
        }
        self.bytes -= got;
        self.reused += got;
        out
    }

    /// Hands out runs pooled under `size` (not rests) as blocks of
    /// `block_bytes` (see [`ReturnPool::take`]), up to `want` bytes, into
    /// `out` while it has fewer than `max_runs`; returns the bytes handed
    /// out.
    fn take_sized(
        &mut self,
        size: u64,
        block_bytes: u64,
        want: u64,
        max_runs: usize,
        out: &mut Vec<(u64, u64)>,
    ) -> u64 {
        if self.longest.get(&size).is_none_or(|&l| l < block_bytes) {
            return 0;
        }
        let Some(queue) = self.by_size.get_mut(&size) else {
            return 0;
        };
        let mut got = 0;
        let mut scraps = Vec::new();
        // Runs shorter than one block of `block_bytes` are passed over
        // where they are; a walk to the queue's end learns its longest.
        let mut at = 0;
        let mut passed = 0;
        while got < want && out.len() < max_runs {
            let Some(&(offset, len)) = queue.get(at) else {
                self.longest.insert(size, passed);
                break;
            };
            let need = (want - got).div_ceil(block_bytes) * block_bytes;
            let give = need.min(len / block_bytes * block_bytes);
            if give == 0 {
                passed = passed.max(len);
                at += 1;
                continue;
            }
            queue.remove(at);
            self.index.remove(&offset);
            out.push((offset, give));
            got += give;
            // The rest stays pooled: the rest of the block of its size
            // that was cut (if one was) as 64-byte blocks, the whole blocks
            // after it where the run was (first out next time).
            let whole_from = give.div_ceil(size) * size;
            if whole_from > give {
                let scrap = (offset + give, whole_from - give);
                self.index.insert(scrap.0, scrap.0 + scrap.1);
                scraps.push(scrap);
            }
            if len > whole_from {
                let rest = (offset + whole_from, len - whole_from);
                self.index.insert(rest.0, rest.0 + rest.1);
                queue.insert(at, rest);
            }
        }
        if queue.is_empty() {
            self.by_size.remove(&size);
            self.longest.remove(&size);
        }
        for (offset, len) in scraps {
            self.queue(BLOCK_ALIGN, offset, len);
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_come_back_first_in_first_out_and_split_to_the_request() {
        let mut p = ReturnPool::new();
        assert_eq!(
            p.give(128, &[(4096, 512), (8192, 128)], (4096, 1 << 20), 0, 0),
            Ok(640)
        );
        assert_eq!(p.take(128, 256, 8, 0), vec![(4096, 256)]);
        assert_eq!(
            p.take(128, 100, 8, 0),
            vec![(4352, 128)],
            "at least a block"
        );
        assert_eq!(p.take(128, 1 << 20, 8, 0), vec![(4480, 128), (8192, 128)]);
        assert_eq!(p.take(128, 1 << 20, 8, 0), vec![]);
        assert_eq!(
            p.stats(),
            PoolStats {
                pooled: 0,
                cooling: 0,
                returned: 640,
                reused: 640
            }
        );
        // Everything handed out: the same blocks may come back.
        assert_eq!(p.give(128, &[(4096, 512)], (4096, 1 << 20), 0, 0), Ok(512));
    }

    #[test]
    fn runs_of_other_sizes_are_cut_to_the_request_when_its_own_run_out() {
        let mut p = ReturnPool::new();
        let bounds = (4096, 1 << 20);
        // 1,024-byte blocks (a run of 4), 192-byte blocks (a run of 2),
        // 128-byte blocks (one).
        p.give(1024, &[(4096, 4096)], bounds, 0, 0).unwrap();
        p.give(192, &[(16384, 384)], bounds, 0, 0).unwrap();
        p.give(128, &[(20480, 128)], bounds, 0, 0).unwrap();
        // Its own size first, then the largest: 128 + 2 x 128 of the first
        // 1,024-byte block; the rest of that block (768 bytes) is pooled as
        // 64-byte blocks, the 3 blocks after it stay 1,024-byte ones.
        assert_eq!(p.take(128, 384, 8, 0), vec![(20480, 128), (4096, 256)]);
        assert_eq!(p.stats().pooled, 4096 - 256 + 384);
        // The 1,024-byte run's rest: 3 whole blocks, still first out for
        // its size; the cut block's 768 bytes serve 64-byte requests.
        assert_eq!(p.take(1024, 1 << 20, 8, 0), vec![(5120, 3072)]);
        assert_eq!(p.take(64, 128, 8, 0), vec![(4352, 128)]);
        // The 64-byte blocks (640 bytes left) serve a 320-byte request with
        // two blocks, then the 192-byte run (384 bytes) with one.
        assert_eq!(p.take(320, 1 << 20, 8, 0), vec![(4480, 640), (16384, 320)]);
        // Left: the 192-byte block that was cut, as a 64-byte block.
        assert_eq!(p.stats().pooled, 64);
        // A run shorter than a block is passed over, not cut.
        assert_eq!(p.take(128, 1 << 20, 8, 0), vec![]);
        assert_eq!(p.take(64, 1 << 20, 8, 0), vec![(16704, 64)]);
        assert_eq!(p.stats().pooled, 0);
        // Nothing overlapped: all of it may come back.
        p.give(
            64,
            &[(4096, 4096), (16384, 384), (20480, 128)],
            bounds,
            0,
            0,
        )
        .unwrap();
        // Cooling runs of another size are not converted before their time.
        let mut q = ReturnPool::new();
        q.give(1024, &[(4096, 1024)], bounds, 50, 0).unwrap();
        assert_eq!(q.take(64, 64, 8, 10), vec![]);
        assert_eq!(q.take(64, 64, 8, 50), vec![(4096, 64)]);
    }

    /// Random gives and takes of many sizes against a model of the pooled
    /// bytes: a take hands out only pooled bytes, each once, in whole
    /// blocks of the size asked, and the pool's figures add up.
    #[test]
    fn random_gives_and_takes_hand_out_each_pooled_byte_once() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeSet;
        const UNITS: u64 = 4096;
        for seed in 0..20u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut p = ReturnPool::new();
            // 64-byte units: pooled, and handed out (to clients).
            let mut pooled: BTreeSet<u64> = BTreeSet::new();
            let mut out: BTreeSet<u64> = (0..UNITS).collect();
            let sizes = [64u64, 128, 192, 320, 1024, 4096];
            for step in 0..400 {
                let now = step * 10;
                let size = sizes[rng.gen_range(0..sizes.len())];
                if rng.gen_bool(0.5) {
                    // Give back a run of handed-out units, whole blocks.
                    let blocks = rng.gen_range(1..8u64);
                    let len_units = blocks * size / 64;
                    let start = rng.gen_range(0..UNITS);
                    let units: Vec<u64> = (start..start + len_units).collect();
                    let ok = units.iter().all(|u| out.contains(u));
                    let usable = now + rng.gen_range(0..3u64) * 15;
                    let r = p.give(
                        size,
                        &[(start * 64, len_units * 64)],
                        (0, UNITS * 64),
                        usable,
                        now,
                    );
                    if ok {
                        assert!(r.is_ok(), "seed {seed} step {step}: {r:?}");
                        for u in units {
                            out.remove(&u);
                            pooled.insert(u);
                        }
                    } else {
                        // Partly pooled, or past the heap: refused whole.
                        assert!(r.is_err(), "seed {seed} step {step}");
                    }
                } else {
                    let want = rng.gen_range(1..16u64) * 64;
                    let runs = p.take(size, want, 4, now);
                    assert!(runs.len() <= 4);
                    for (offset, len) in runs {
                        assert_eq!(offset % 64, 0);
                        assert!(len > 0 && len % size == 0, "seed {seed}: {len} of {size}");
                        for u in offset / 64..(offset + len) / 64 {
                            assert!(pooled.remove(&u), "seed {seed} step {step}: unit {u}");
                            out.insert(u);
                        }
                    }
                }
                assert_eq!(p.stats().pooled, pooled.len() as u64 * 64, "seed {seed}");
                // Rests are merged, indexed both ways, and guarded.
                assert_eq!(p.rests.len(), p.rests_by_len.len());
                for (&s, &l) in &p.rests {
                    assert!(!p.rests.contains_key(&(s + l)), "seed {seed}: rests meet");
                    assert!(p.rests_by_len.contains(&(l, s)));
                    assert_eq!(p.index.get(&s), Some(&(s + l)));
                }
            }
            // Everything usable comes out in the end.
            for size in sizes {
                while !p.take(size, 1 << 20, 64, u64::MAX).is_empty() {}
            }
            assert_eq!(p.stats().pooled, 0, "seed {seed}");
        }
    }

    #[test]
    fn at_most_max_runs_per_take() {
        let mut p = ReturnPool::new();
        let runs: Vec<(u64, u64)> = (0..10).map(|i| (4096 + i * 256, 64)).collect();
        p.give(64, &runs, (0, 1 << 20), 0, 0).unwrap();
        assert_eq!(p.take(64, 1 << 20, 3, 0).len(), 3);
        assert_eq!(p.stats().pooled, 7 * 64);
    }

    #[test]
    fn bad_returns_are_refused_whole() {
        let mut p = ReturnPool::new();
        let (floor, top) = (4096, 65536);
        assert_eq!(
            p.give(100, &[(4096, 100)], (floor, top), 0, 0),
            Err(Refusal::BlockSize(100))
        );
        assert_eq!(
            p.give(0, &[], (floor, top), 0, 0),
            Err(Refusal::BlockSize(0))
        );
        for (offset, len) in [(4096, 0), (4100, 128), (4096, 192)] {
            assert_eq!(
                p.give(128, &[(offset, len)], (floor, top), 0, 0),
                Err(Refusal::Shape { offset, len })
            );
        }
        for (offset, len) in [(0, 128), (65536 - 64, 128), (u64::MAX - 63, 128)] {
            assert_eq!(
                p.give(64, &[(offset, len)], (floor, top), 0, 0),
                Err(Refusal::Outside { offset, len })
            );
        }
        // Overlapping each other: nothing taken, not even the good run.
        assert_eq!(
            p.give(
                64,
                &[(8192, 64), (4096, 256), (4160, 64)],
                (floor, top),
                0,
                0
            ),
            Err(Refusal::Overlap {
                offset: 4160,
                len: 64
            })
        );
        assert_eq!(p.stats().pooled, 0);
        p.give(64, &[(4096, 256)], (floor, top), 0, 0).unwrap();
        // Overlapping a pooled run, from either side, or inside it.
        for (offset, len) in [(4032, 128), (4288, 64), (4160, 64), (4096, 256)] {
            assert!(
                matches!(
                    p.give(64, &[(offset, len)], (0, top), 0, 0),
                    Err(Refusal::Overlap { .. })
                ),
                "{offset:#x}+{len}"
            );
        }
        // Adjacent on both sides is fine.
        p.give(64, &[(4032, 64), (4352, 64)], (0, top), 0, 0)
            .unwrap();
        assert_eq!(p.stats().pooled, 384);
    }

    #[test]
    fn a_split_run_still_guards_its_rest() {
        let mut p = ReturnPool::new();
        p.give(64, &[(4096, 1024)], (0, 1 << 20), 0, 0).unwrap();
        assert_eq!(p.take(64, 256, 1, 0), vec![(4096, 256)]);
        // The handed-out part may come back; the pooled rest may not.
        p.give(64, &[(4096, 256)], (0, 1 << 20), 0, 0).unwrap();
        assert!(p.give(64, &[(4352, 64)], (0, 1 << 20), 0, 0).is_err());
    }

    #[test]
    fn runs_in_their_grace_period_wait_for_it_and_still_guard_their_blocks() {
        let mut p = ReturnPool::new();
        let bounds = (4096, 1 << 20);
        // At time 100: one run usable at once, two cooling until 150 and 120.
        p.give(64, &[(4096, 128)], bounds, 100, 100).unwrap();
        p.give(64, &[(8192, 64)], bounds, 150, 100).unwrap();
        p.give(64, &[(12288, 64)], bounds, 120, 100).unwrap();
        assert_eq!(p.stats().cooling, 128);
        assert_eq!(p.stats().pooled, 256);
        // A cooling run is held: a return overlapping it is refused.
        assert!(p.give(64, &[(8192, 64)], bounds, 0, 100).is_err());
        assert_eq!(p.take(64, 1 << 20, 8, 100), vec![(4096, 128)]);
        assert_eq!(p.take(64, 1 << 20, 8, 119), vec![]);
        assert_eq!(p.take(64, 1 << 20, 8, 120), vec![(12288, 64)]);
        assert_eq!(p.take(64, 1 << 20, 8, 10_000), vec![(8192, 64)]);
        assert_eq!(p.stats().cooling, 0);
        assert_eq!(p.stats().pooled, 0);
    }

    /// Short runs of one size are walked once by a request for larger
    /// blocks, not by every one; a long run of that size queued later is
    /// found again.
    #[test]
    fn short_runs_are_not_walked_by_every_request_for_larger_blocks() {
        let mut p = ReturnPool::new();
        let bounds = (0, 1 << 30);
        // 1,000 runs of 128-byte blocks, 128..=896 bytes long, apart.
        let short: Vec<(u64, u64)> = (0..1000u64)
            .map(|i| (i * 4096, 128 + (i % 7) * 128))
            .collect();
        p.give(128, &short, bounds, 0, 0).unwrap();
        assert_eq!(p.longest.get(&128), Some(&896));
        // 1 KiB blocks: none is that long, and the request does not walk
        // them (the bound says so).
        assert_eq!(p.take(1024, 4096, 8, 0), vec![]);
        // A request that fits finds the first run long enough.
        assert_eq!(p.take(896, 896, 8, 0), vec![(6 * 4096, 896)]);
        assert_eq!(p.longest.get(&128), Some(&896));
        // A long run is found by a 1 KiB request; once taken, the bound is
        // stale until a walk to the queue's end.
        p.give(128, &[(1 << 29, 4096)], bounds, 0, 0).unwrap();
        assert_eq!(p.longest.get(&128), Some(&4096));
        assert_eq!(p.take(1024, 4096, 8, 0), vec![(1 << 29, 4096)]);
        assert_eq!(p.longest.get(&128), Some(&4096));
        assert_eq!(p.take(1024, 4096, 8, 0), vec![]);
        assert_eq!(p.longest.get(&128), Some(&896), "exact after the walk");
        let left: u64 = short.iter().map(|r| r.1).sum::<u64>() - 896;
        assert_eq!(p.stats().pooled, left);
    }

    /// Rests (64-byte blocks) are found by their length: a request for
    /// blocks no rest holds looks at none, one that fits takes the shortest
    /// rest that holds a block.
    #[test]
    fn rests_are_found_by_length_shortest_first() {
        let mut p = ReturnPool::new();
        let bounds = (0, 1 << 30);
        let rests: Vec<(u64, u64)> = (0..1000u64)
            .map(|i| (i * 4096, 128 + (i % 14) * 64))
            .collect();
        p.give(64, &rests, bounds, 0, 0).unwrap();
        assert_eq!(p.take(1024, 4096, 8, 0), vec![]);
        assert_eq!(p.take(960, 960, 8, 0), vec![(13 * 4096, 960)]);
        // 320 bytes: the first rest of 320 (i = 3), whole.
        assert_eq!(p.take(320, 320, 1, 0), vec![(3 * 4096, 320)]);
        // 64 bytes from the first 128-byte rest leaves 64 bytes of it.
        assert_eq!(p.take(64, 64, 1, 0), vec![(0, 64)]);
        assert_eq!(p.rests.get(&64), Some(&64));
        let left: u64 = rests.iter().map(|r| r.1).sum::<u64>() - 960 - 320 - 64;
        assert_eq!(p.stats().pooled, left);
    }

    /// The rest of a cut block comes back to larger blocks once the blocks
    /// handed out next to it come back: they join it.
    #[test]
    fn a_cut_blocks_rest_joins_its_neighbours_when_they_come_back() {
        let mut p = ReturnPool::new();
        let bounds = (0, 1 << 20);
        // Two 4 KiB blocks; 640-byte requests cut the first into six
        // blocks (3,840 bytes) and a 256-byte rest.
        p.give(4096, &[(4096, 8192)], bounds, 0, 0).unwrap();
        assert_eq!(p.take(640, 3840, 8, 0), vec![(4096, 3840)]);
        assert_eq!(p.rests.get(&(4096 + 3840)), Some(&256));
        // The second block is handed out whole; it cannot use the rest.
        assert_eq!(p.take(4096, 4096, 8, 0), vec![(8192, 4096)]);
        assert_eq!(p.take(512, 512, 8, 0), vec![]);
        // The six blocks come back, as 640-byte ones: they join the rest,
        // and the 4 KiB of the first block serve a 4 KiB request again.
        p.give(640, &[(4096, 3840)], bounds, 0, 0).unwrap();
        assert_eq!(p.rests.get(&4096), Some(&4096));
        // The second block comes back too and joins them.
        p.give(4096, &[(8192, 4096)], bounds, 0, 0).unwrap();
        assert_eq!(p.rests.get(&4096), Some(&8192));
        assert_eq!(p.take(4096, 8192, 8, 0), vec![(4096, 8192)]);
        assert_eq!(p.stats().pooled, 0);
        // All of it may come back: nothing overlapped.
        p.give(64, &[(4096, 8192)], bounds, 0, 0).unwrap();
        // A cooling run joins its neighbours only once usable.
        let mut q = ReturnPool::new();
        q.give(64, &[(4096, 64)], bounds, 0, 0).unwrap();
        q.give(128, &[(4160, 128)], bounds, 50, 0).unwrap();
        assert_eq!(q.take(128, 128, 8, 10), vec![]);
        assert_eq!(q.take(192, 192, 8, 50), vec![(4096, 192)]);
    }
}
