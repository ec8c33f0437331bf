//! Recovery of a shared physical QP after an error completion: reset,
//! report the failing VQP's later WRs flushed, bring the QP back and
//! re-post every other VQP's WRs. See the parent module's docs.

use krcore_nic::{
    bring_up, Access, CompletionQueue, Nic, QueuePair, SendFlags, SendWr, Transition, Wc, WcStatus,
};

use super::super::error::VqpError;
use super::super::EngineInner;
use super::poll::deliver;
use super::{copies_range, settle_copies, Link, PhysQp, PhysState, Rec, NO_SOLE, POLL_BATCH};
use crate::wrid::{PhysWrId, Slot};

impl<N: Nic> PhysQp<N> {
    /// Brings a QP that reported an error back to RTS (see the module docs).
    pub(super) fn recover(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
    ) -> Result<(), VqpError> {
        let mut buf = [Wc::default(); POLL_BATCH];
        // The failing WR was delivered to its owner when its completion was
        // routed; the NIC flushes every later WR (none of them executed).
        // Reset: the flush completions still to come match nothing.
        if let Some(qp) = &st.qp {
            qp.modify(Transition::Reset)
                .map_err(VqpError::nic("reset a shared QP"))?;
        }
        let guilty = st.guilty.take();
        let target = self.rc_link().map(|l| l.gid);
        tracing::warn!(
            qpn = self.qpn,
            index = self.index,
            target_gid = target.map(tracing::field::display),
            guilty_vqp = guilty.map(tracing::field::display),
            "shared QP found in ERR, recovering"
        );
        let PhysState {
            credits,
            copies,
            vqps,
            stats,
            ..
        } = &mut *st;
        // The failing VQP's later WRs are flushed, as on a QP of its own;
        // every other VQP's are posted again, in their order (their copies
        // are copied out: the re-post writes new copies over them).
        let mask = credits.ring_mut().len() - 1;
        let mut again: Vec<(SendWr, Slot)> = Vec::new();
        for seq in credits.reset_range() {
            let rec = *credits.record(seq);
            let (slot, kept) = (rec.slot(), rec.kept());
            let owner = PhysWrId::from_raw(rec.wr_id).vqp();
            // Never a WR posted in place (see `Rec::kept`); should one
            // come here, it is reported flushed, never re-posted from a
            // copy of another WR.
            debug_assert!(kept || Some(owner) == guilty, "re-post of a WR not kept");
            match vqps.get_mut(owner) {
                Some(_) if Some(owner) != guilty && kept => {
                    let wr = copies[(seq as usize) & mask];
                    debug_assert_eq!(wr.wr_id, rec.wr_id, "the copy is the record's WR");
                    again.push((wr, slot));
                }
                Some(v) => {
                    stats.flushed_by_reset += 1;
                    deliver(&eng.cache, owner, v, slot, WcStatus::WrFlushErr, None, None);
                }
                None => stats.flushed_by_reset += 1,
            }
        }
        // Completions of the old incarnation still in the CQ match nothing.
        loop {
            let k = self
                .cq
                .poll(&mut buf)
                .map_err(VqpError::nic("poll a shared QP's CQ"))?;
            stats.stale_completions += k as u64;
            if k < buf.len() {
                break;
            }
        }
        st.needs_recovery = false;
        let up = match (&st.qp, &self.link) {
            (None, _) => false,
            (Some(qp), Link::Dci) => {
                if let Err(e) = bring_up(qp, Access::NONE, None) {
                    self.flush_all(eng, st, &again);
                    return Err(VqpError::nic("bring up a DCI")(e));
                }
                true
            }
            (Some(qp), Link::Rc(l)) => match super::super::rc::pair_up(eng, qp, l.handshake) {
                Ok(nonce) => {
                    st.nonce = nonce;
                    true
                }
                Err(e) => {
                    // The target did not answer (or the QP could not be
                    // brought up): close the pair. Its VQPs re-bind on their
                    // next post, and fail, typed, while the target is gone.
                    tracing::warn!(
                        qpn = self.qpn,
                        target_gid = %l.gid,
                        reason = %e,
                        flushed = again.len(),
                        "RC pair lost: re-handshake after an error failed, pair closed"
                    );
                    st.qp = None;
                    st.stats.lost += 1;
                    false
                }
            },
        };
        if !up {
            self.flush_all(eng, st, &again);
            return Ok(());
        }
        st.stats.recoveries += 1;
        let before = st.stats.reposted;
        self.repost(eng, st, &again);
        tracing::info!(
            qpn = self.qpn,
            target_gid = target.map(tracing::field::display),
            reposted = st.stats.reposted - before,
            refused = again.len() as u64 - (st.stats.reposted - before),
            "shared QP recovered"
        );
        Ok(())
    }

    /// Posts the innocent VQPs' flushed WRs again, in their order, under
    /// NEW physical sequences (same user wr_ids and flags), so that
    /// completions of the old incarnation, which a CQ may still return
    /// after the reset, match none of them; the last one signaled so that
    /// the queue's unsignaled tail stays bounded. They stay outstanding for
    /// their VQPs. WRs the NIC refuses are reported flushed to their owners.
    fn repost(&self, eng: &EngineInner<N>, st: &mut PhysState<N>, again: &[(SendWr, Slot)]) {
        if again.is_empty() {
            return;
        }
        // Several VQPs' WRs, possibly.
        st.sole = NO_SOLE;
        let PhysState {
            qp,
            credits,
            copies,
            stats,
            ..
        } = &mut *st;
        let n = again.len();
        let first = credits.next_seq();
        let recs = credits.ring_mut();
        let (len, mask) = (recs.len(), recs.len() - 1);
        // After the reset every credit is free, and the spare copies fit
        // any batch up to the depth.
        let room = n <= credits.free() as usize;
        let (Some(qp), Some(staged), true) = (
            qp.as_ref(),
            copies.get_mut(copies_range(first, n, len)),
            room,
        ) else {
            return self.flush_all(eng, st, again);
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
        let posted = match qp.post_send(staged) {
            Ok(()) => n,
            Err(e) => e.index.min(n),
        };
        settle_copies(copies, first, posted, len);
        credits.commit_placed(posted);
        stats.reposted += posted as u64;
        self.flush_all(eng, st, &again[posted..]);
    }

    /// Reports `wrs` (counted outstanding by their VQPs, not on the QP)
    /// flushed to their owners.
    fn flush_all(&self, eng: &EngineInner<N>, st: &mut PhysState<N>, wrs: &[(SendWr, Slot)]) {
        for (wr, slot) in wrs {
            st.stats.flushed_by_reset += 1;
            let owner = PhysWrId::from_raw(wr.wr_id).vqp();
            if let Some(v) = st.vqps.get_mut(owner) {
                deliver(
                    &eng.cache,
                    owner,
                    v,
                    *slot,
                    WcStatus::WrFlushErr,
                    None,
                    None,
                );
            }
        }
    }
}
