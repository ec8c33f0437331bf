//! Receive work-request ids.
//!
//! A CQ may hold send and receive completions of many QPs. Verbs leaves the
//! opcode of an *error* completion undefined, so a flushed receive cannot be
//! told from a flushed send by its opcode. This provider therefore never
//! hands the user's `wr_id` to the device: send WRs carry their send-queue
//! sequence (bit 63 clear, see `qp`), receive WRs carry a tag from this
//! table (bit 63 set) that maps back to the user's `wr_id`.
//!
//! Tags are never reused: a tag is `1 << 63 | n` for the next `n` of a
//! device-wide 63-bit counter (2^63 receives: centuries at any rate a
//! device reaches). The table is a power-of-two array indexed by `n`'s low
//! bits, at most half full; `insert` skips counter values whose slot is
//! taken (so it ends within one lap), and growing keeps every entry's
//! index (`n mod 2c` differ when `n mod c` do). A slot holds the tag it was
//! given, and `take` resolves a tag only if its slot holds exactly that
//! tag: a stale tag (a completion left in a CQ after its receive was
//! released by a reset or a destroy, or with its QP number reused) always
//! misses, whatever happened to its slot since. (A per-slot generation
//! could wrap while a stale completion waits in an unpolled CQ.)

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// Bit 63 of a device `wr_id`: a receive tag.
pub(crate) const RECV_TAG: u64 = 1 << 63;

/// Initial table capacity.
const MIN_CAP: usize = 64;

#[derive(Default)]
struct Slot {
    /// The tag this slot was given, 0 when free.
    tag: u64,
    owner: u64,
    wr_id: u64,
    /// Outstanding-receive counter of the SRQ that holds it.
    srq_count: Option<Arc<AtomicU32>>,
}

struct Slab {
    /// Power-of-two length, at most half full.
    slots: Vec<Slot>,
    len: usize,
    /// The counter of the next tag (`RECV_TAG | next`), from 1.
    next: u64,
}

impl Default for Slab {
    fn default() -> Self {
        Slab {
            slots: (0..MIN_CAP).map(|_| Slot::default()).collect(),
            len: 0,
            next: 1,
        }
    }
}

impl Slab {
    #[inline]
    fn index(&self, tag: u64) -> usize {
        ((tag & !RECV_TAG) as usize) & (self.slots.len() - 1)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots = (0..old.len() * 2).map(|_| Slot::default()).collect();
        for s in old.into_iter().filter(|s| s.tag != 0) {
            let i = self.index(s.tag);
            debug_assert_eq!(self.slots[i].tag, 0, "live tags differ mod the capacity");
            self.slots[i] = s;
        }
    }

    /// A new, never used tag for `owner`'s receive `wr_id`.
    fn insert(&mut self, owner: u64, wr_id: u64, srq_count: Option<&Arc<AtomicU32>>) -> u64 {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        // At least half the slots are free and consecutive counter values
        // visit every slot once per lap: this ends within one lap.
        let i = loop {
            let n = self.next;
            self.next += 1;
            debug_assert!(n < RECV_TAG, "63-bit receive counter exhausted");
            let i = self.index(n);
            if self.slots[i].tag == 0 {
                break i;
            }
        };
        let tag = RECV_TAG | (self.next - 1);
        let slot = &mut self.slots[i];
        slot.tag = tag;
        slot.owner = owner;
        slot.wr_id = wr_id;
        slot.srq_count = srq_count.cloned();
        if let Some(c) = &slot.srq_count {
            c.fetch_add(1, Relaxed);
        }
        self.len += 1;
        tag
    }

    /// Frees slot `i` (occupied).
    fn free(&mut self, i: usize) -> u64 {
        let slot = &mut self.slots[i];
        slot.tag = 0;
        slot.owner = 0;
        if let Some(c) = slot.srq_count.take() {
            c.fetch_sub(1, Relaxed);
        }
        self.len -= 1;
        slot.wr_id
    }

    fn take(&mut self, tag: u64) -> Option<u64> {
        if tag & RECV_TAG == 0 {
            return None;
        }
        let i = self.index(tag);
        (self.slots[i].tag == tag).then(|| self.free(i))
    }
}

/// The device-wide table of posted receives.
#[derive(Default)]
pub(crate) struct RecvTable {
    slab: Mutex<Slab>,
}

impl RecvTable {
    /// Inserts receives of `owner` (a QP or SRQ id) and writes their device
    /// tags into `tags`.
    pub(crate) fn insert(
        &self,
        owner: u64,
        wr_ids: impl Iterator<Item = u64>,
        srq_count: Option<&Arc<AtomicU32>>,
        tags: &mut [u64],
    ) {
        let mut s = self.slab.lock();
        for (wr_id, tag) in wr_ids.zip(tags.iter_mut()) {
            *tag = s.insert(owner, wr_id, srq_count);
        }
    }

    /// Frees tags that the device refused (after a failed post).
    pub(crate) fn cancel(&self, tags: &[u64]) {
        let mut s = self.slab.lock();
        for &t in tags {
            s.take(t);
        }
    }

    /// Resolves a completed receive's tag (and frees it); `None` for a
    /// stale tag.
    pub(crate) fn take(&self, tag: u64) -> Option<u64> {
        self.slab.lock().take(tag)
    }

    /// Frees every receive of `owner` (its QP was reset or destroyed: the
    /// device discards them without completions).
    pub(crate) fn release_owner(&self, owner: u64) {
        let mut s = self.slab.lock();
        for i in 0..s.slots.len() {
            if s.slots[i].tag != 0 && s.slots[i].owner == owner {
                s.free(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_go_stale() {
        let t = RecvTable::default();
        let mut tags = [0u64; 2];
        t.insert(7, [10u64, 11].into_iter(), None, &mut tags);
        assert!(tags.iter().all(|x| x & RECV_TAG != 0));
        assert_eq!(t.take(tags[1]), Some(11));
        assert!(t.take(tags[1]).is_none(), "a tag resolves once");
        t.release_owner(7);
        assert!(t.take(tags[0]).is_none(), "released with its owner");
        let mut again = [0u64; 1];
        t.insert(8, [12u64].into_iter(), None, &mut again);
        assert!(t.take(tags[0]).is_none() && t.take(tags[1]).is_none());
        assert_eq!(t.take(again[0]), Some(12));
    }

    #[test]
    fn srq_counts_follow_the_entries() {
        let t = RecvTable::default();
        let c = Arc::new(AtomicU32::new(0));
        let mut tags = [0u64; 3];
        t.insert(1, [1u64, 2, 3].into_iter(), Some(&c), &mut tags);
        assert_eq!(c.load(Relaxed), 3);
        t.take(tags[0]);
        t.cancel(&tags[1..2]);
        assert_eq!(c.load(Relaxed), 1);
        t.release_owner(1);
        assert_eq!(c.load(Relaxed), 0);
    }

    /// A stale tag (released with its owner) never resolves, however often
    /// its slot is reused since (every slot here is reused hundreds of
    /// times); no tag is ever handed out twice; live tags survive the
    /// table's growth and wrap-around. Reference check: a map of live tags.
    #[test]
    fn stale_tags_never_resolve_and_growth_keeps_live_ones() {
        let t = RecvTable::default();
        let mut stale = [0u64; 4];
        t.insert(1, [1u64, 2, 3, 4].into_iter(), None, &mut stale);
        t.release_owner(1);
        let mut live = std::collections::HashMap::new();
        let mut all = std::collections::HashSet::new();
        let mut tag = [0u64; 1];
        for i in 0..200_000u64 {
            t.insert(2, std::iter::once(i), None, &mut tag);
            assert!(all.insert(tag[0]), "tag {:#x} reused", tag[0]);
            live.insert(tag[0], i);
            // Keep a varying number live (growth, wrap-around), free the
            // rest at once.
            if live.len() > (i % 300) as usize {
                let k = *live.keys().next().unwrap();
                assert_eq!(t.take(k), live.remove(&k));
            }
            if i % 4096 == 0 {
                for s in stale {
                    assert!(t.take(s).is_none(), "stale tag resolved at {i}");
                }
            }
        }
        for (k, v) in live {
            assert_eq!(t.take(k), Some(v));
        }
        for s in stale {
            assert!(t.take(s).is_none());
        }
    }
}
