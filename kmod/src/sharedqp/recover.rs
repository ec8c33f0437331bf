//! Recovery after an error completion, as the core sees it: the host has
//! reset the QP; [`SharedQp::reset`] reports the failing VQP's later WRs
//! flushed and hands back every other VQP's; once the host brought the QP
//! back, [`SharedQp::repost`] posts them again (or [`SharedQp::flush_all`]
//! reports them flushed). See the parent module's docs.

use krcore_nic::{SendFlags, SendWr, WcStatus};

use super::route::deliver;
use super::state::{copies_range, settle_copies, Doorbell, Rec, SharedQp, NO_SOLE};
use crate::dccache::DcCache;
use crate::wrid::{PhysWrId, Slot, VqpId};

/// The WRs of innocent VQPs that a reset flushed, in their order: posted
/// again by [`SharedQp::repost`] (each as it went to the NIC, with its
/// user's wr_id and flag).
pub type Reposts = Vec<(SendWr, Slot)>;

impl SharedQp {
    /// The host reset the QP (after an error completion made it enter
    /// ERR): every outstanding WR leaves the account. The failing VQP's
    /// (`guilty`, taken) are reported `WR_FLUSH_ERR` to it, as on a QP of
    /// its own; every other VQP's are returned, in order, for
    /// [`SharedQp::repost`]. The QP needs no recovery any more: the
    /// completions of the old incarnation still in the CQ match nothing
    /// (the host drains them, [`SharedQp::note_stale`]).
    pub fn reset(&mut self, cache: &DcCache) -> (Option<VqpId>, Reposts) {
        let guilty = self.guilty.take();
        let SharedQp {
            credits,
            copies,
            vqps,
            stats,
            needs_recovery,
            ..
        } = self;
        *needs_recovery = false;
        // Their copies are copied out: the re-post writes new copies over
        // them.
        let mask = credits.ring_mut().len() - 1;
        let mut again: Reposts = Vec::new();
        for seq in credits.reset_range() {
            let rec = *credits.record(seq);
            let (slot, kept) = (rec.slot(), rec.kept());
            let owner = PhysWrId::from_raw(rec.wr_id).vqp();
            // Never a WR posted in place (see `Rec::KEPT`); should one come
            // here, it is reported flushed, never re-posted from a copy of
            // another WR.
            debug_assert!(kept || Some(owner) == guilty, "re-post of a WR not kept");
            match vqps.get_mut(owner) {
                Some(_) if Some(owner) != guilty && kept => {
                    let wr = copies[(seq as usize) & mask];
                    debug_assert_eq!(wr.wr_id, rec.wr_id, "the copy is the record's WR");
                    again.push((wr, slot));
                }
                Some(v) => {
                    stats.flushed_by_reset += 1;
                    deliver(cache, owner, v, slot, WcStatus::WrFlushErr, None, None);
                }
                None => stats.flushed_by_reset += 1,
            }
        }
        (guilty, again)
    }

    /// Counts `k` completions of an old incarnation drained after a reset.
    pub fn note_stale(&mut self, k: usize) {
        self.stats.stale_completions += k as u64;
    }

    /// Posts (`ring`) the innocent VQPs' flushed WRs `again` on the QP the
    /// host brought back, in their order, under NEW physical sequences
    /// (same user wr_ids and flags), so that completions of the old
    /// incarnation, which a CQ may still return after the reset, match
    /// none of them; the last one signaled so that the queue's unsignaled
    /// tail stays bounded. They stay outstanding for their VQPs. WRs the
    /// NIC refuses are reported flushed to their owners. Counts the
    /// recovery.
    pub fn repost(&mut self, cache: &DcCache, again: &[(SendWr, Slot)], mut ring: impl Doorbell) {
        self.stats.recoveries += 1;
        if again.is_empty() {
            return;
        }
        // Several VQPs' WRs, possibly.
        self.sole = NO_SOLE;
        let SharedQp {
            credits,
            copies,
            stats,
            ..
        } = self;
        let n = again.len();
        let first = credits.next_seq();
        let recs = credits.ring_mut();
        let (len, mask) = (recs.len(), recs.len() - 1);
        // After the reset every credit is free, and the spare copies fit
        // any batch up to the depth.
        let room = n <= credits.free() as usize;
        let (Some(staged), true) = (copies.get_mut(copies_range(first, n, len)), room) else {
            return self.flush_all(cache, again);
        };
        let recs = credits.ring_mut();
        for (i, (copy, (wr, slot))) in staged.iter_mut().zip(again).enumerate() {
            let seq = first + i as u64;
            *copy = *wr;
            copy.wr_id = PhysWrId::new(PhysWrId::from_raw(wr.wr_id).vqp(), seq).raw();
            // Posted signaled as the copy is (its signal may have been
            // forced).
            recs[(seq as usize) & mask] = Rec::new(
                copy.wr_id,
                slot.user_wr_id,
                copy.is_signaled(),
                slot.user_signaled,
                true,
            );
        }
        if let Some(last) = staged.last_mut() {
            last.flags = last.flags | SendFlags::SIGNALED;
            recs[((first + n as u64 - 1) as usize) & mask].flags |= Rec::SIGNALED;
        }
        let posted = match ring.ring(staged) {
            Ok(()) => n,
            Err(e) => e.index.min(n),
        };
        settle_copies(copies, first, posted, len);
        credits.commit_placed(posted);
        stats.reposted += posted as u64;
        self.flush_all(cache, &again[posted..]);
    }

    /// Reports `wrs` (counted outstanding by their VQPs, not on the QP)
    /// flushed to their owners: the QP could not be brought back.
    pub fn flush_all(&mut self, cache: &DcCache, wrs: &[(SendWr, Slot)]) {
        for (wr, slot) in wrs {
            self.stats.flushed_by_reset += 1;
            let owner = PhysWrId::from_raw(wr.wr_id).vqp();
            if let Some(v) = self.vqps.get_mut(owner) {
                deliver(cache, owner, v, *slot, WcStatus::WrFlushErr, None, None);
            }
        }
    }
}
