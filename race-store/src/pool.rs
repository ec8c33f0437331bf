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
//! come and go do not use up the node.
//!
//! # Invariants
//! * Every pooled run lies inside the node's heap as handed out so far
//!   (`floor..top`, [`ReturnPool::give`]'s bounds), is 64-byte aligned and a
//!   whole number of its size's blocks.
//! * No two pooled runs overlap: a return that overlaps a pooled run, or
//!   whose runs overlap each other, is refused whole ([`Refusal`]), so a
//!   block given back twice by mistake is never handed out twice by the
//!   pool (the pool cannot tell a block handed out and given back since
//!   from a duplicate, which is why clients give back only at close).
//! * Runs are handed out first in, first out, split when a request needs
//!   less than the front run, and never before the time they were given
//!   back with (they wait in a cooling list until then).
//!
//! Plain data, no I/O, no lock and no clock: the node calls it under its
//! heap lock with its own time (any monotonic microseconds).

use std::collections::{BTreeMap, VecDeque};

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
    /// Block size -> runs `(offset, len)`, first in first out.
    by_size: BTreeMap<u64, VecDeque<(u64, u64)>>,
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
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
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
                self.by_size
                    .entry(block_bytes)
                    .or_default()
                    .push_back((offset, len));
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
            self.by_size
                .entry(block_bytes)
                .or_default()
                .push_back((offset, len));
        }
    }

    /// Hands out pooled blocks of `block_bytes` usable at `now`: up to
    /// `want` bytes (whole blocks, at least one if any is pooled) in at most
    /// `max_runs` runs. Empty when none of that size is.
    pub fn take(
        &mut self,
        block_bytes: u64,
        want: u64,
        max_runs: usize,
        now: u64,
    ) -> Vec<(u64, u64)> {
        self.warm(now);
        let mut out = Vec::new();
        let Some(queue) = self.by_size.get_mut(&block_bytes) else {
            return out;
        };
        let want = want.max(block_bytes);
        let mut got = 0;
        while got < want && out.len() < max_runs {
            let Some((offset, len)) = queue.pop_front() else {
                break;
            };
            self.index.remove(&offset);
            let need = (want - got).div_ceil(block_bytes) * block_bytes;
            if len > need {
                // Split: the rest stays at the front, first out next time.
                queue.push_front((offset + need, len - need));
                self.index.insert(offset + need, offset + len);
                out.push((offset, need));
                got += need;
            } else {
                out.push((offset, len));
                got += len;
            }
        }
        if queue.is_empty() {
            self.by_size.remove(&block_bytes);
        }
        self.bytes -= got;
        self.reused += got;
        out
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
        assert_eq!(p.take(64, 1024, 8, 0), vec![], "no block of another size");
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
}
