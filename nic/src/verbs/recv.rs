//! Receive work-request ids.
//!
//! A CQ may hold send and receive completions of many QPs. Verbs leaves the
//! opcode of an *error* completion undefined, so a flushed receive cannot be
//! told from a flushed send by its opcode. This provider therefore never
//! hands the user's `wr_id` to the device: send WRs carry their send-queue
//! sequence (bit 63 clear, see `qp`), receive WRs carry a tag from this
//! table (bit 63 set) that maps back to the user's `wr_id`.
//!
//! Tag layout: `1 << 63 | generation (31 bits) << 32 | slot index (32 bits)`.
//! The generation makes a stale tag (a completion left in a CQ after its QP
//! was reset) miss instead of returning another receive's `wr_id`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// Bit 63 of a device `wr_id`: a receive tag.
pub(crate) const RECV_TAG: u64 = 1 << 63;

struct Slot {
    gen: u32,
    /// 0 when free.
    owner: u64,
    wr_id: u64,
    /// Outstanding-receive counter of the SRQ that holds it.
    srq_count: Option<Arc<AtomicU32>>,
}

#[derive(Default)]
struct Slab {
    slots: Vec<Slot>,
    free: Vec<u32>,
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
            let idx = match s.free.pop() {
                Some(i) => i,
                None => {
                    s.slots.push(Slot {
                        gen: 0,
                        owner: 0,
                        wr_id: 0,
                        srq_count: None,
                    });
                    (s.slots.len() - 1) as u32
                }
            };
            let slot = &mut s.slots[idx as usize];
            slot.gen = (slot.gen + 1) & 0x7fff_ffff;
            slot.owner = owner;
            slot.wr_id = wr_id;
            slot.srq_count = srq_count.cloned();
            if let Some(c) = &slot.srq_count {
                c.fetch_add(1, Relaxed);
            }
            *tag = RECV_TAG | (slot.gen as u64) << 32 | idx as u64;
        }
    }

    /// Frees tags that the device refused (after a failed post).
    pub(crate) fn cancel(&self, tags: &[u64]) {
        let mut s = self.slab.lock();
        for &t in tags {
            take_locked(&mut s, t);
        }
    }

    /// Resolves a completed receive's tag (and frees it).
    pub(crate) fn take(&self, tag: u64) -> Option<u64> {
        let mut s = self.slab.lock();
        take_locked(&mut s, tag)
    }

    /// Frees every receive of `owner` (its QP was reset or destroyed: the
    /// device discards them without completions).
    pub(crate) fn release_owner(&self, owner: u64) {
        let mut s = self.slab.lock();
        let mut freed = Vec::new();
        for (i, slot) in s.slots.iter_mut().enumerate() {
            if slot.owner == owner {
                slot.owner = 0;
                if let Some(c) = slot.srq_count.take() {
                    c.fetch_sub(1, Relaxed);
                }
                freed.push(i as u32);
            }
        }
        s.free.extend(freed);
    }
}

fn take_locked(s: &mut Slab, tag: u64) -> Option<u64> {
    if tag & RECV_TAG == 0 {
        return None;
    }
    let idx = (tag & 0xffff_ffff) as usize;
    let gen = ((tag >> 32) & 0x7fff_ffff) as u32;
    let slot = s.slots.get_mut(idx)?;
    if slot.owner == 0 || slot.gen != gen {
        return None;
    }
    slot.owner = 0;
    if let Some(c) = slot.srq_count.take() {
        c.fetch_sub(1, Relaxed);
    }
    let wr_id = slot.wr_id;
    s.free.push(idx as u32);
    Some(wr_id)
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
}
