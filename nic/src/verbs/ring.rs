//! The send ring: per posted send WR, the caller's `wr_id` and the WR's
//! opcode, by send-queue sequence number, readable by pollers without the
//! QP's send lock.
//!
//! Protocol (a seqlock per slot, sequence numbers never reused):
//! - One writer at a time: `record` and `clear` are called only under the
//!   QP's send lock. `record` runs before the WR is handed to the device:
//!   it marks the slot `BUSY`, then writes `wr_id` and `opcode`, then
//!   publishes `seq` with Release.
//! - Any number of readers: `lookup(seq)` reads `seq` (Acquire), the data,
//!   then `seq` again after an Acquire fence; it returns the data only if
//!   both reads saw `seq`. A reader that read any data written by a later
//!   `record` of the same slot synchronizes, through the fences, with that
//!   record's `BUSY` store, so its second read cannot see `seq` any more:
//!   no torn `(wr_id, opcode)` pair is ever returned, and since a slot's
//!   sequence only grows (`s`, `BUSY`, `s + len`, ...), there is no ABA.
//! - A slot is reused for `seq + len` (len = `max_send_wr` rounded up to a
//!   power of two) only after `seq` has been completed or discarded
//!   (credits). Completions are translated under their CQ's poll lock, in
//!   the order the device queued them, which for one send queue is
//!   sequence order (see `cq`): when `seq` is looked up, no later
//!   completion of its QP has freed its slot yet, so a completion of a WR
//!   that is still outstanding always finds its slot intact, with any
//!   number of pollers.
//! - A lookup misses (`None`, a stale completion) only for work that was
//!   discarded: the QP was reset (`clear` empties every slot) or destroyed
//!   (the QP is no longer in the CQ's table; a new QP with its number
//!   starts past its sequences, see `cq`).
//!
//! A device completion carries the sequence the device was given, which
//! `record` published (Release) before the device could see the WR, and the
//! completion reaches the poller through the device and `ibv_poll_cq`'s
//! locks, so an intact slot is always seen by `lookup`.

use crate::types::WcOpcode;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};

/// A slot's `seq` while `record` rewrites it.
const BUSY: u64 = u64::MAX;

struct Slot {
    seq: AtomicU64,
    wr_id: AtomicU64,
    opcode: AtomicU8,
}

/// The ring of a QP's send queue (see the module docs).
pub(crate) struct SendRing {
    slots: Box<[Slot]>,
    mask: u64,
}

impl SendRing {
    /// A ring for `depth` outstanding WRs (rounded up to a power of two).
    pub(crate) fn new(depth: u32) -> SendRing {
        let len = (depth.max(1) as usize).next_power_of_two();
        SendRing {
            slots: (0..len)
                .map(|_| Slot {
                    seq: AtomicU64::new(BUSY),
                    wr_id: AtomicU64::new(0),
                    opcode: AtomicU8::new(0),
                })
                .collect(),
            mask: len as u64 - 1,
        }
    }

    #[inline]
    fn slot(&self, seq: u64) -> &Slot {
        let i = (seq & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots.len()` is a power of two and `mask` is
        // `slots.len() - 1` (both set once in `new`), so `i <= mask` is in
        // bounds.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Remembers WR `seq`. Only one thread at a time (the QP's send lock),
    /// before the WR is posted.
    #[inline]
    pub(crate) fn record(&self, seq: u64, wr_id: u64, opcode: WcOpcode) {
        let s = self.slot(seq);
        s.seq.store(BUSY, Ordering::Relaxed);
        fence(Ordering::Release);
        s.wr_id.store(wr_id, Ordering::Relaxed);
        s.opcode.store(opcode as u8, Ordering::Relaxed);
        s.seq.store(seq, Ordering::Release);
    }

    /// Empties every slot (the QP was reset: its outstanding WRs are
    /// discarded). Only under the QP's send lock, like `record`.
    pub(crate) fn clear(&self) {
        for s in self.slots.iter() {
            s.seq.store(BUSY, Ordering::Release);
        }
    }

    /// The `wr_id` and opcode recorded for `seq`, or `None` when its slot
    /// holds another sequence (a stale completion).
    #[inline]
    pub(crate) fn lookup(&self, seq: u64) -> Option<(u64, WcOpcode)> {
        if seq == BUSY {
            return None;
        }
        let s = self.slot(seq);
        if s.seq.load(Ordering::Acquire) != seq {
            return None;
        }
        let wr_id = s.wr_id.load(Ordering::Relaxed);
        let op = s.opcode.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        Some((wr_id, WcOpcode::from_u8(op)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// What the writer records for `seq`: every pair is distinct, so a torn
    /// read (wr_id of one record, opcode of another) is caught.
    fn expected(seq: u64) -> (u64, WcOpcode) {
        let op = match seq % 5 {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            _ => WcOpcode::FetchAdd,
        };
        (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5a5a, op)
    }

    #[test]
    fn lookup_finds_recorded_and_misses_stale() {
        let r = SendRing::new(3); // 4 slots
        assert!(r.lookup(0).is_none(), "nothing recorded yet");
        for s in 0..4 {
            r.record(s, 100 + s, WcOpcode::RdmaRead);
        }
        assert_eq!(r.lookup(2), Some((102, WcOpcode::RdmaRead)));
        r.record(6, 7, WcOpcode::CompSwap);
        assert!(r.lookup(2).is_none(), "slot reused by 6");
        assert_eq!(r.lookup(6), Some((7, WcOpcode::CompSwap)));
        assert!(r.lookup(10).is_none(), "never recorded");
        assert!(r.lookup(BUSY).is_none());
        // A failed post records the same sequence again: still found.
        r.record(7, 1, WcOpcode::Send);
        r.record(7, 2, WcOpcode::RdmaWrite);
        assert_eq!(r.lookup(7), Some((2, WcOpcode::RdmaWrite)));
        r.clear();
        for s in 4..8 {
            assert!(r.lookup(s).is_none(), "cleared {s}");
        }
        r.record(8, 3, WcOpcode::Send);
        assert_eq!(r.lookup(8), Some((3, WcOpcode::Send)));
    }

    /// One writer records sequences as fast as it can (no credits: it laps
    /// the readers on purpose, the worst case for torn reads); readers look
    /// up recent sequences. Reference check: every `Some` a reader gets is
    /// exactly what was recorded for that sequence.
    #[test]
    fn stress_lookups_never_tear() {
        const WRITES: u64 = 200_000;
        let ring = Arc::new(SendRing::new(4));
        let head = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|k| {
                let (ring, head, done) = (ring.clone(), head.clone(), done.clone());
                std::thread::spawn(move || {
                    let (mut hits, mut misses) = (0u64, 0u64);
                    let mut i = k as u64;
                    while !done.load(Ordering::Acquire) {
                        let h = head.load(Ordering::Acquire);
                        i = i
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        // Recent sequences, some of them already overwritten.
                        let seq = h.saturating_sub(1 + (i >> 33) % 8);
                        match ring.lookup(seq) {
                            Some(got) => {
                                assert_eq!(got, expected(seq), "torn read of {seq}");
                                hits += 1;
                            }
                            None => misses += 1,
                        }
                    }
                    (hits, misses)
                })
            })
            .collect();
        for seq in 0..WRITES {
            let (w, op) = expected(seq);
            ring.record(seq, w, op);
            head.store(seq + 1, Ordering::Release);
            if seq % 64 == 0 {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
        let mut hits = 0;
        for r in readers {
            hits += r.join().expect("reader").0;
        }
        assert!(hits > 0, "the readers found nothing");
        // Quiescent: the last `len` sequences are all intact.
        for seq in WRITES - 4..WRITES {
            assert_eq!(ring.lookup(seq), Some(expected(seq)));
        }
    }

    /// The provider's shape: a writer bounded by credits (`posted - done <
    /// depth`) hands each sequence to a "device" (a channel) after recording
    /// it; a poller resolves them in order and frees credits. Reference
    /// check: every completion resolves, to exactly what was recorded.
    #[test]
    fn stress_with_credits_every_completion_resolves() {
        const WRITES: u64 = 100_000;
        const DEPTH: u64 = 3;
        let ring = Arc::new(SendRing::new(DEPTH as u32));
        let done = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let poller = {
            let (ring, done) = (ring.clone(), done.clone());
            std::thread::spawn(move || {
                for (want, seq) in rx.into_iter().enumerate() {
                    assert_eq!(seq, want as u64);
                    assert_eq!(ring.lookup(seq), Some(expected(seq)), "seq {seq}");
                    done.fetch_max(seq + 1, Ordering::AcqRel);
                }
            })
        };
        for seq in 0..WRITES {
            let mut spins = 0u64;
            while seq - done.load(Ordering::Acquire) >= DEPTH {
                spins += 1;
                assert!(spins < 1 << 32, "no credits");
                std::hint::spin_loop();
                if spins % 128 == 0 {
                    std::thread::yield_now();
                }
            }
            let (w, op) = expected(seq);
            ring.record(seq, w, op);
            tx.send(seq).expect("poller alive");
        }
        drop(tx);
        poller.join().expect("poller");
        assert_eq!(done.load(Ordering::Acquire), WRITES);
    }
}
