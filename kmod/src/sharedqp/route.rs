//! Completions: each one polled from the QP's CQ credits the send queue
//! and is delivered to its VQP ([`SharedQp::route`]), or, polled by a VQP
//! for itself, applied in place when it is that VQP's own success
//! ([`Poller::own`]). See the parent module's docs.

use krcore_nic::{Wc, WcStatus};

use super::state::{DciStats, Rec, SharedQp};
use super::vqps::VqpState;
use crate::credits::{CreditError, Posted, SendQueueCredits};
use crate::dccache::DcCache;
use crate::wrid::{PhysWrId, Slot, VqpId};

/// The buffer of the VQP that polls: its completions go there directly
/// while its ring is empty (see `deliver`).
#[derive(Debug)]
pub struct Sink<'a> {
    vqp: VqpId,
    out: &'a mut [Wc],
    /// Entries of `out` filled.
    n: usize,
}

impl<'a> Sink<'a> {
    /// The buffer `out` of the VQP `vqp`, its first `n` entries filled.
    #[inline]
    pub fn new(vqp: VqpId, out: &'a mut [Wc], n: usize) -> Sink<'a> {
        Sink { vqp, out, n }
    }

    /// Entries left.
    #[inline]
    pub fn room(&self) -> usize {
        self.out.len() - self.n
    }

    /// Entries filled.
    #[inline]
    pub fn filled(&self) -> usize {
        self.n
    }

    /// The `i`th entry of the buffer (filled or not).
    #[inline]
    pub(crate) fn entry(&self, i: usize) -> Wc {
        self.out[i]
    }

    /// The buffer and how many of its entries are filled.
    #[inline]
    pub fn into_parts(self) -> (&'a mut [Wc], usize) {
        (self.out, self.n)
    }
}

/// What a VQP polling for itself may touch, borrowed once per poll (see
/// [`SharedQp::poller`]): its own state, the account and the counters.
#[derive(Debug)]
pub(crate) struct Poller<'a> {
    credits: &'a mut SendQueueCredits<Rec>,
    sole: u32,
    stats: &'a mut DciStats,
    v: &'a mut VqpState,
    id: VqpId,
    needs_recovery: bool,
}

impl Poller<'_> {
    /// Moves up to `out.len()` completions out of the VQP's ring.
    #[inline(always)]
    pub fn pop(&mut self, out: &mut [Wc]) -> usize {
        if self.v.ring.is_empty() {
            0
        } else {
            self.v.pop(out)
        }
    }

    /// The QP is in ERR: every CQE must be routed (and the QP recovered).
    #[inline(always)]
    pub(crate) fn needs_recovery(&self) -> bool {
        self.needs_recovery
    }

    /// Applies `wc`, a CQE just polled, if it is this VQP's own success
    /// retiring only its own WRs: the oldest one on the QP, or any while
    /// all outstanding WRs are its own (`sole`). That is `route` then
    /// `deliver` for a success into the caller's buffer (the VQP's ring is
    /// empty, there is room): the earlier WRs were unsignaled and only
    /// leave the count.
    ///
    /// `Some(true)` when `wc` is now the user's completion (status, opcode
    /// and length as polled), `Some(false)` when the user did not ask for
    /// one; `None`, nothing changed, when the CQE needs
    /// [`SharedQp::route`].
    #[inline(always)]
    pub(crate) fn own(&mut self, wc: &mut Wc) -> Option<bool> {
        let id = self.id;
        let wr_id = PhysWrId::from_raw(wc.wr_id);
        if !wc.status.is_ok() || wr_id.vqp() != id {
            return None;
        }
        let head = self.credits.head();
        let (seq, rec) = self.credits.retire_signaled(wr_id, self.sole == id.get())?;
        self.stats.completions += 1;
        let retired = (seq - head) as u32 + 1;
        let v = &mut *self.v;
        let Some(left) = v.outstanding.checked_sub(retired) else {
            // Retired, but of an earlier attachment (see `deliver`):
            // nothing to deliver.
            self.stats.orphaned += u64::from(retired - v.outstanding);
            v.outstanding = 0;
            return Some(false);
        };
        v.outstanding = left;
        if !rec.user_signaled {
            return Some(false);
        }
        wc.wr_id = rec.user_wr_id;
        wc.imm = None;
        wc.qp_num = id.get();
        wc.src_qp = 0;
        Some(true)
    }
}

impl SharedQp {
    /// The VQP `id`'s view for a poll of its own, `None` when this QP does
    /// not hold its state.
    #[inline(always)]
    pub(crate) fn poller(&mut self, id: VqpId) -> Option<Poller<'_>> {
        let SharedQp {
            credits,
            vqps,
            stats,
            sole,
            needs_recovery,
            ..
        } = self;
        let (_, v) = vqps.find(id)?;
        Some(Poller {
            credits,
            sole: *sole,
            stats,
            v,
            id,
            needs_recovery: *needs_recovery,
        })
    }

    /// Moves up to `out.len()` completions out of the VQP `id`'s ring (a
    /// recovery may have reported flushes there).
    pub fn pop(&mut self, id: VqpId, out: &mut [Wc]) -> usize {
        self.vqps.get_mut(id).map_or(0, |v| v.pop(out))
    }

    /// Applies one polled completion: credits the shared queue and
    /// delivers every WR it retires to its VQP (the polling VQP's into
    /// `sink`). An error completion puts the QP in ERR
    /// ([`SharedQp::needs_recovery`]); a completion of an old incarnation
    /// changes nothing but the stale count.
    #[inline]
    pub fn route(&mut self, cache: &DcCache, wc: &Wc, sink: Option<&mut Sink<'_>>) {
        let SharedQp {
            credits,
            vqps,
            stats,
            needs_recovery,
            guilty,
            window,
            ..
        } = self;
        stats.completions += 1;
        if !wc.status.is_ok() {
            stats.error_completions += 1;
            if *needs_recovery && wc.status == WcStatus::WrFlushErr {
                // A later WR the NIC flushed after the failing one:
                // recovery re-posts it (or reports it, if it is the failing
                // VQP's).
                return;
            }
        }
        let wr_id = PhysWrId::from_raw(wc.wr_id);
        let retired = match credits.resolve(wr_id) {
            Some(seq) => credits.complete_range(seq, wc.status),
            None => Err(CreditError::UnknownWrId { wr_id }),
        };
        let Ok(retired) = retired else {
            // Of an old incarnation (before a reset): re-posted WRs carry
            // new wr_ids, so this matches nothing and changes nothing.
            stats.stale_completions += 1;
            return;
        };
        if !wc.status.is_ok() {
            // The QP is in ERR now (verbs: any error completion); this WR's
            // VQP is the one that failed.
            *needs_recovery = true;
            *guilty = Some(wr_id.vqp());
            // No fast post until recovered (see `SharedQp::window`).
            *window = None;
        }
        // Every WR before the completed one completed silently: it was
        // unsignaled (or its completion would have come first), so the user
        // did not ask for its completion either (the core only ever adds
        // signals): it only leaves its VQP's count. One VQP lookup per run
        // of one VQP's WRs, not per WR; only the last WR delivers a
        // completion.
        let last = retired.end - 1;
        let mut seq = retired.start;
        while seq < last {
            let id = credits.record(seq).wr_id().vqp();
            let mut run = 1;
            while seq + run < last && credits.record(seq + run).wr_id().vqp() == id {
                run += 1;
            }
            seq += run;
            match vqps.get_mut(id) {
                Some(v) if v.outstanding >= run as u32 => v.outstanding -= run as u32,
                _ => stats.orphaned += run,
            }
        }
        let id = wr_id.vqp();
        let slot = credits.record(last).slot();
        let delivered = vqps
            .get_mut(id)
            .and_then(|v| deliver(cache, id, v, slot, wc.status, Some(wc), sink));
        if delivered.is_none() {
            stats.orphaned += 1;
        }
    }
}

/// Retires one WR of the VQP `id` (state `v`) and, when the user asked for
/// a completion or the WR failed, hands the user's completion to the VQP:
/// into `sink` when it is the polling VQP's, its ring is empty (so nothing
/// older waits there) and the sink has room; to the VQP's ring otherwise.
/// `None` when the VQP has no WR outstanding (the record is of an earlier
/// attachment of the VQP to this QP: it moves only when drained, see
/// [`SharedQp::detach_drained`], so this never happens; nothing is
/// delivered then).
#[inline]
pub(crate) fn deliver(
    cache: &DcCache,
    id: VqpId,
    v: &mut VqpState,
    slot: Slot,
    status: WcStatus,
    wc: Option<&Wc>,
    sink: Option<&mut Sink<'_>>,
) -> Option<()> {
    v.outstanding = v.outstanding.checked_sub(1)?;
    if slot.user_signaled || !status.is_ok() {
        let user = Wc {
            wr_id: slot.user_wr_id,
            status,
            opcode: wc.map(|w| w.opcode).unwrap_or_default(),
            byte_len: wc.map_or(0, |w| w.byte_len),
            imm: None,
            qp_num: id.get(),
            src_qp: 0,
        };
        match sink {
            Some(s) if s.vqp == id && s.n < s.out.len() && v.ring.is_empty() => {
                s.out[s.n] = user;
                s.n += 1;
            }
            _ => v.ring.push_back(user),
        }
    }
    if matches!(status, WcStatus::RemAccessErr | WcStatus::RetryExcErr) {
        // The target refused us (stale dc_key, vanished MR) or is gone: its
        // cached metadata may be stale. The VQP must connect again.
        if let Some(t) = v.target.take() {
            cache.invalidate(&t.target.gid);
        }
    }
    Some(())
}
