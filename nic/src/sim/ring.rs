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
//! Protocol (per cell `c` at position `p`, capacity `cap`): a producer may
//! write `c` when `c.seq == p`, claims it by CAS on `tail`, writes the
//! payload, then publishes with `c.seq = p + 1` (Release). A consumer may read
//! when `c.seq == p + 1`: it copies the payload, claims the entry by CAS on
//! `head` (`p -> p + 1`, Release), then frees the cell with a CAS of `c.seq`
//! from `p + 1` to `p + cap` (Release).
//!
//! **No refusal below capacity.** In Vyukov's original queue the cell stays
//! unusable between a consumer's claim and its free, so a producer at
//! position `p + cap` would report "full" although `head` has moved past `p`
//! (fewer than `cap` entries queued): a real NIC's queue with free room never
//! refuses a post. Here the producer *helps*: it sees `c.seq == p + 1` (the
//! previous lap, not freed), reads `head` (Acquire); if `head > p` the entry
//! was claimed, and its payload was copied before the claim, so the producer
//! frees the cell itself (the same CAS `p + 1 -> p + cap`) and goes on. The
//! late consumer's CAS then fails harmlessly: a cell's sequence only grows
//! (`p + 1`, `p + cap`, `p + cap + 1`, ...), so it cannot come back. Hence a
//! push fails only when `tail - head >= cap` (entries published, being
//! published, or unclaimed), which is "full".
//!
//! Ordering: the payload words are only written between a successful claim
//! of `tail` and the publishing store, so a consumer that observed
//! `seq == p + 1` with Acquire reads a complete payload; a consumer's payload
//! loads happen before its Release CAS of `head` (or of `seq`), which the
//! helping producer reads with Acquire before it may overwrite the payload.

use super::shm::Segment;
use std::sync::atomic::AtomicU64;
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
///
/// The head, tail and flags words and the whole cell array are resolved (one
/// bounds and alignment check) when the view is made, so a push or pop
/// touches no segment bookkeeping.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'a> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
    flags: &'a AtomicU64,
    /// `capacity * cell_words` words.
    cells: &'a [AtomicU64],
    cell_words: usize,
    mask: u64,
}

impl<'a> Ring<'a> {
    /// The view of the ring at `base` with `cap` cells (the stored capacity
    /// when `None`): two range checks, one for the header, one for the cells.
    #[inline]
    fn view(seg: &'a Segment, base: usize, cap: Option<u64>, cell_words: usize) -> Ring<'a> {
        let hdr = seg.words_array::<{ CELLS / 8 }>(base);
        let cap = match cap {
            Some(c) => {
                hdr[CAP / 8].store(c, Relaxed);
                c
            }
            None => hdr[CAP / 8].load(Acquire).max(1).next_power_of_two(),
        };
        Ring {
            head: &hdr[HEAD / 8],
            tail: &hdr[TAIL / 8],
            flags: &hdr[FLAGS / 8],
            // A range past the segment is a bug in the sim's own layout
            // (`words` panics, as `word` would on first use of the cell).
            cells: seg.words(base + CELLS, cap as usize * cell_words),
            cell_words,
            mask: cap - 1,
        }
    }

    /// Initializes a fresh (zeroed) ring. Must run before the ring is published.
    pub fn init(seg: &'a Segment, base: usize, capacity: u32, cell_words: usize) -> Ring<'a> {
        debug_assert!(capacity.is_power_of_two());
        let r = Ring::view(seg, base, Some(capacity as u64), cell_words);
        for p in 0..capacity as u64 {
            if let Some(seq) = r.seq(p) {
                seq.store(p, Relaxed);
            }
        }
        std::sync::atomic::fence(Release);
        r
    }

    /// Attaches to a ring that was initialized (possibly by another process).
    #[inline]
    pub fn attach(seg: &'a Segment, base: usize, cell_words: usize) -> Ring<'a> {
        Ring::view(seg, base, None, cell_words)
    }

    /// The sequence word and the first `N` payload words of the cell of
    /// `pos` (`N == cell_words - 1` for every caller). `None` is unreachable:
    /// `cells` holds `capacity` whole cells (checked when the view was made).
    #[inline]
    fn cell_n<const N: usize>(&self, pos: u64) -> Option<(&'a AtomicU64, &'a [AtomicU64; N])> {
        debug_assert_eq!(N + 1, self.cell_words);
        let start = (pos & self.mask) as usize * self.cell_words;
        let (seq, rest) = self.cells.get(start..)?.split_first()?;
        Some((seq, rest.first_chunk::<N>()?))
    }

    /// Number of cells.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// The sequence word of the cell of `pos` (`None` is unreachable, see
    /// `cell_n`).
    #[inline]
    fn seq(&self, pos: u64) -> Option<&'a AtomicU64> {
        self.cells.get((pos & self.mask) as usize * self.cell_words)
    }

    /// Entries currently queued (approximate under concurrency).
    pub fn len(&self) -> u64 {
        let t = self.tail.load(Acquire);
        let h = self.head.load(Acquire);
        t.saturating_sub(h)
    }

    /// Whether the ring overflowed at some point (sticky).
    pub fn overflowed(&self) -> bool {
        self.flags.load(Acquire) & FLAG_OVERFLOW != 0
    }

    /// Marks the ring overflowed.
    pub fn set_overflowed(&self) {
        self.flags.fetch_or(FLAG_OVERFLOW, AcqRel);
    }

    /// Enqueues `payload` (`cell_words - 1` words); `false` when full
    /// (`capacity` entries queued), never while there is room.
    pub fn push<const N: usize>(&self, payload: &[u64; N]) -> bool {
        let tail = self.tail;
        let cap = self.mask + 1;
        let mut pos = tail.load(Relaxed);
        let (seq_word, words) = loop {
            // A layout mismatch (unreachable, see `cell_n`) reads as full.
            let Some((cell, words)) = self.cell_n::<N>(pos) else {
                return false;
            };
            let seq = cell.load(Acquire);
            let dif = seq.wrapping_sub(pos) as i64;
            if dif == 0 {
                match tail.compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed) {
                    Ok(_) => break (cell, words),
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                // The previous lap's entry (position `pos - cap`) is still
                // in the cell. Claimed by a consumer that has not freed the
                // cell yet (`head` past it): free it on its behalf.
                let prev = pos.wrapping_sub(cap);
                let head = self.head.load(Acquire);
                if seq == prev.wrapping_add(1) && (head.wrapping_sub(prev) as i64) > 0 {
                    let _ = cell.compare_exchange(seq, pos, AcqRel, Acquire);
                    continue;
                }
                let now = tail.load(Relaxed);
                if now == pos {
                    return false;
                }
                pos = now;
            } else {
                pos = tail.load(Relaxed);
            }
        };
        for (cell, w) in words.iter().zip(payload) {
            cell.store(*w, Relaxed);
        }
        seq_word.store(pos + 1, Release);
        true
    }

    /// Claims the oldest entry, copied into `out`, if there is one and
    /// `ready(payload)` accepts it; returns its position, whose cell the
    /// caller must then [`Ring::free`] (a producer may free it first, see
    /// the module docs).
    fn claim<const N: usize>(
        &self,
        out: &mut [u64; N],
        ready: impl Fn(&[u64; N]) -> bool,
    ) -> Option<u64> {
        let head = self.head;
        let mut pos = head.load(Relaxed);
        loop {
            let (cell, words) = self.cell_n::<N>(pos)?;
            let seq = cell.load(Acquire);
            let dif = seq.wrapping_sub(pos + 1) as i64;
            if dif == 0 {
                for (o, w) in out.iter_mut().zip(words) {
                    *o = w.load(Relaxed);
                }
                if !ready(out) {
                    return None;
                }
                // Release: the payload loads above happen before a producer
                // that sees the new head may reuse the cell.
                match head.compare_exchange_weak(pos, pos + 1, Release, Relaxed) {
                    Ok(_) => return Some(pos),
                    Err(p) => pos = p,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = head.load(Relaxed);
            }
        }
    }

    /// Frees the cell of the entry claimed at `pos` (unless a producer
    /// already did).
    fn free(&self, pos: u64) {
        if let Some(seq) = self.seq(pos) {
            let _ = seq.compare_exchange(pos + 1, pos + self.mask + 1, Release, Relaxed);
        }
    }

    /// Dequeues one entry into `out` if there is one and `ready(payload)`
    /// accepts it (used to hide completions whose modeled time has not come).
    pub fn pop_if<const N: usize>(
        &self,
        out: &mut [u64; N],
        ready: impl Fn(&[u64; N]) -> bool,
    ) -> bool {
        match self.claim(out, ready) {
            Some(pos) => {
                // The payload copied before the claim is ours.
                self.free(pos);
                true
            }
            None => false,
        }
    }

    /// Dequeues one entry.
    pub fn pop<const N: usize>(&self, out: &mut [u64; N]) -> bool {
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

    /// A consumer that claimed an entry but has not freed its cell yet
    /// (preempted, or a slow process) must not make a push with free room
    /// fail: a real queue with room never refuses. Its late free must not
    /// disturb the entry the producer put in the cell meanwhile.
    #[test]
    fn push_with_room_succeeds_while_a_claimed_cell_is_not_freed() {
        let seg = Segment::anon(ring_bytes(4, 3)).unwrap();
        let r = Ring::init(&seg, 0, 4, 3);
        for i in 0..4 {
            assert!(r.push(&[i, i * 10]));
        }
        let mut out = [0u64; 2];
        let claimed = r.claim(&mut out, |_| true).expect("an entry to claim");
        assert_eq!((claimed, out), (0, [0, 0]));
        assert_eq!(r.len(), 3);
        // Three queued, capacity four: room for one, in the claimed cell.
        assert!(r.push(&[4, 40]), "a queue with free room refused a push");
        assert!(!r.push(&[5, 50]), "a full queue must refuse");
        // The consumer frees late: nothing changes.
        r.free(claimed);
        for i in 1..5 {
            assert!(r.pop(&mut out));
            assert_eq!(out, [i, i * 10]);
        }
        assert!(!r.pop(&mut out));
        // Back to normal: four pushes fit again, the fifth does not.
        for i in 0..4 {
            assert!(r.push(&[i, i]));
        }
        assert!(!r.push(&[9, 9]));
    }

    /// Producers push only with a reservation of free room (a counter of
    /// `capacity` tokens, returned by consumers right after their claim and
    /// before they free the cell, with a yield in between): every such push
    /// must succeed. Checked against the exact multiset and per-producer
    /// order of what was pushed.
    #[test]
    fn stress_push_with_room_never_fails() {
        use std::sync::atomic::AtomicI64;
        const CAP: u32 = 8;
        let seg = Arc::new(Segment::anon(ring_bytes(CAP, 3)).unwrap());
        Ring::init(&seg, 0, CAP, 3);
        let room = Arc::new(AtomicI64::new(i64::from(CAP)));
        let producers = 3u64;
        let per = 20_000u64;
        let mut hs = vec![];
        for p in 0..producers {
            let (seg, room) = (seg.clone(), room.clone());
            hs.push(std::thread::spawn(move || {
                let r = Ring::attach(&seg, 0, 3);
                let mut i = 0;
                while i < per {
                    if room.fetch_sub(1, AcqRel) > 0 {
                        assert!(r.push(&[p, i]), "push refused with room reserved");
                        i += 1;
                    } else {
                        room.fetch_add(1, AcqRel);
                        std::thread::yield_now();
                    }
                }
            }));
        }
        let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let total = producers * per;
        let mut cs = vec![];
        for c in 0..2u64 {
            let (seg, room, taken) = (seg.clone(), room.clone(), taken.clone());
            cs.push(std::thread::spawn(move || {
                let r = Ring::attach(&seg, 0, 3);
                let mut got = vec![];
                let mut out = [0u64; 2];
                let mut k = 0u64;
                while taken.load(Relaxed) < total {
                    match r.claim(&mut out, |_| true) {
                        Some(pos) => {
                            got.push((out[0], out[1]));
                            room.fetch_add(1, AcqRel);
                            k += 1;
                            if (k + c) % 3 == 0 {
                                std::thread::yield_now();
                            }
                            r.free(pos);
                            taken.fetch_add(1, Relaxed);
                        }
                        None => std::thread::yield_now(),
                    }
                }
                got
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        let per_consumer: Vec<Vec<(u64, u64)>> =
            cs.into_iter().map(|h| h.join().unwrap()).collect();
        for got in &per_consumer {
            for p in 0..producers {
                let seq: Vec<u64> = got.iter().filter(|e| e.0 == p).map(|e| e.1).collect();
                assert!(seq.windows(2).all(|w| w[0] < w[1]), "FIFO per producer");
            }
        }
        let mut all: Vec<(u64, u64)> = per_consumer.into_iter().flatten().collect();
        all.sort();
        let want: Vec<(u64, u64)> = (0..producers)
            .flat_map(|p| (0..per).map(move |i| (p, i)))
            .collect();
        assert_eq!(all, want, "every item exactly once");
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
