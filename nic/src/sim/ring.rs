//! A bounded multi-producer multi-consumer ring in a shared segment (Vyukov's
//! bounded queue), used for completion queues and receive queues.
//!
//! Layout at `base` (all little words of 8 bytes):
//! ```text
//! +0    head (next position to dequeue)        own cache line
//! +64   tail (next position to enqueue)        own cache line
//! +128  flags (bit 0: overflowed)
//! +136  capacity (power of two)
//! +192  cells: capacity x cell_words words; word 0 of a cell is its sequence
//! ```
//! Protocol (per cell `c` at position `p`): a producer may write `c` when
//! `c.seq == p`, claims it by CAS on `tail`, writes the payload, then publishes
//! with `c.seq = p + 1` (Release). A consumer may read when `c.seq == p + 1`,
//! claims it by CAS on `head`, reads, then frees with `c.seq = p + capacity`.
//! The payload words are only written between a successful claim and the
//! publishing store, so a consumer that observed `seq == p + 1` with Acquire
//! reads a complete payload.

use super::shm::Segment;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

const HEAD: usize = 0;
const TAIL: usize = 64;
const FLAGS: usize = 128;
const CAP: usize = 136;
const CELLS: usize = 192;
const FLAG_OVERFLOW: u64 = 1;

/// Bytes a ring of `capacity` cells of `cell_words` words needs.
pub fn ring_bytes(capacity: u32, cell_words: usize) -> usize {
    CELLS + capacity as usize * cell_words * 8
}

/// A view of a ring living in `seg` at offset `base`.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'a> {
    seg: &'a Segment,
    base: usize,
    cell_words: usize,
    mask: u64,
}

impl<'a> Ring<'a> {
    /// Initializes a fresh (zeroed) ring. Must run before the ring is published.
    pub fn init(seg: &'a Segment, base: usize, capacity: u32, cell_words: usize) -> Ring<'a> {
        debug_assert!(capacity.is_power_of_two());
        seg.word(base + CAP).store(capacity as u64, Relaxed);
        let r = Ring {
            seg,
            base,
            cell_words,
            mask: capacity as u64 - 1,
        };
        for p in 0..capacity as u64 {
            r.cell_word(p, 0).store(p, Relaxed);
        }
        std::sync::atomic::fence(Release);
        r
    }

    /// Attaches to a ring that was initialized (possibly by another process).
    pub fn attach(seg: &'a Segment, base: usize, cell_words: usize) -> Ring<'a> {
        let cap = seg.word(base + CAP).load(Acquire).max(1);
        Ring {
            seg,
            base,
            cell_words,
            mask: cap.next_power_of_two() - 1,
        }
    }

    /// Number of cells.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    fn cell_word(&self, pos: u64, w: usize) -> &'a std::sync::atomic::AtomicU64 {
        let idx = (pos & self.mask) as usize;
        self.seg
            .word(self.base + CELLS + (idx * self.cell_words + w) * 8)
    }

    /// Entries currently queued (approximate under concurrency).
    pub fn len(&self) -> u64 {
        let t = self.seg.word(self.base + TAIL).load(Acquire);
        let h = self.seg.word(self.base + HEAD).load(Acquire);
        t.saturating_sub(h)
    }

    /// Whether the ring overflowed at some point (sticky).
    pub fn overflowed(&self) -> bool {
        self.seg.word(self.base + FLAGS).load(Acquire) & FLAG_OVERFLOW != 0
    }

    /// Marks the ring overflowed.
    pub fn set_overflowed(&self) {
        self.seg
            .word(self.base + FLAGS)
            .fetch_or(FLAG_OVERFLOW, AcqRel);
    }

    /// Enqueues `payload` (`cell_words - 1` words); `false` when full.
    pub fn push(&self, payload: &[u64]) -> bool {
        debug_assert_eq!(payload.len(), self.cell_words - 1);
        let tail = self.seg.word(self.base + TAIL);
        let mut pos = tail.load(Relaxed);
        loop {
            let seq = self.cell_word(pos, 0).load(Acquire);
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                match tail.compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed) {
                    Ok(_) => break,
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = tail.load(Relaxed);
            }
        }
        for (i, w) in payload.iter().enumerate() {
            self.cell_word(pos, i + 1).store(*w, Relaxed);
        }
        self.cell_word(pos, 0).store(pos + 1, Release);
        true
    }

    /// Dequeues one entry into `out` if there is one and `ready(payload)`
    /// accepts it (used to hide completions whose modeled time has not come).
    pub fn pop_if(&self, out: &mut [u64], ready: impl Fn(&[u64]) -> bool) -> bool {
        debug_assert_eq!(out.len(), self.cell_words - 1);
        let head = self.seg.word(self.base + HEAD);
        let mut pos = head.load(Relaxed);
        loop {
            let seq = self.cell_word(pos, 0).load(Acquire);
            let dif = seq.wrapping_sub(pos + 1) as i64;
            if dif == 0 {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self.cell_word(pos, i + 1).load(Relaxed);
                }
                if !ready(out) {
                    return false;
                }
                match head.compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed) {
                    Ok(_) => break,
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = head.load(Relaxed);
            }
        }
        // The payload we copied before the claim is ours: producers cannot
        // rewrite the cell until we free it below.
        self.cell_word(pos, 0).store(pos + self.mask + 1, Release);
        true
    }

    /// Dequeues one entry.
    pub fn pop(&self, out: &mut [u64]) -> bool {
        self.pop_if(out, |_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_full_empty() {
        let seg = Segment::anon(ring_bytes(4, 3)).unwrap();
        let r = Ring::init(&seg, 0, 4, 3);
        let mut out = [0u64; 2];
        assert!(!r.pop(&mut out));
        for i in 0..4 {
            assert!(r.push(&[i, i * 10]));
        }
        assert!(!r.push(&[9, 9]), "full ring must refuse");
        for i in 0..4 {
            assert!(r.pop(&mut out));
            assert_eq!(out, [i, i * 10]);
        }
        assert!(!r.pop(&mut out));
        assert!(r.push(&[7, 70]));
        assert!(!r.pop_if(&mut out, |p| p[0] != 7), "not-ready entry stays");
        assert!(r.pop(&mut out));
        assert_eq!(out, [7, 70]);
    }

    #[test]
    fn mpmc_stress_exact_multiset() {
        let seg = Arc::new(Segment::anon(ring_bytes(64, 3)).unwrap());
        Ring::init(&seg, 0, 64, 3);
        let producers = 3u64;
        let per = 20_000u64;
        let mut hs = vec![];
        for p in 0..producers {
            let seg = seg.clone();
            hs.push(std::thread::spawn(move || {
                let r = Ring::attach(&seg, 0, 3);
                for i in 0..per {
                    while !r.push(&[p, i]) {
                        std::thread::yield_now();
                    }
                }
            }));
        }
        let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let total = producers * per;
        let mut cs = vec![];
        for _ in 0..2 {
            let seg = seg.clone();
            let taken = taken.clone();
            cs.push(std::thread::spawn(move || {
                let r = Ring::attach(&seg, 0, 3);
                let mut got = vec![];
                let mut out = [0u64; 2];
                while taken.load(Relaxed) < total {
                    if r.pop(&mut out) {
                        got.push((out[0], out[1]));
                        taken.fetch_add(1, Relaxed);
                    } else {
                        std::thread::yield_now();
                    }
                }
                got
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        let mut all: Vec<(u64, u64)> = cs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort();
        let want: Vec<(u64, u64)> = (0..producers)
            .flat_map(|p| (0..per).map(move |i| (p, i)))
            .collect();
        assert_eq!(all, want, "every item exactly once");
    }
}
