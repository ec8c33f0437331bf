//! Polling a shared physical QP: the inline synchronous case, the drain
//! of its CQ and the routing of each completion to its VQP. See the
//! parent module's docs.

use std::ops::Range;

use krcore_nic::{CompletionQueue, Nic, Wc, WcStatus};

use super::super::error::VqpError;
use super::super::vqp::VqpState;
use super::super::EngineInner;
use super::{DciStats, PhysQp, PhysState, Rec, POLL_BATCH};
use crate::credits::{CreditError, Posted, SendQueueCredits};
use crate::dccache::DcCache;
use crate::wrid::{PhysWrId, Slot, VqpId};

impl<N: Nic> PhysQp<N> {
    /// Polls up to `out.len()` completions of the VQP `id` (see
    /// [`crate::engine::Vqp::poll`]): its ring first, then the CQ drained
    /// and routed. `None` when this QP does not hold the VQP's state.
    ///
    /// The common case is inlined: the CQ is polled straight into the
    /// caller's free entries, and each CQE that is this VQP's own success,
    /// retiring only its own WRs (the oldest WR on the QP, or any while all
    /// outstanding WRs are its own), is rewritten in place into the user's
    /// completion (no other VQP's WR is involved, nothing to route). The
    /// first CQE that is anything else (another VQP's, an error, one the
    /// credits cannot retire alone) continues in [`PhysQp::poll_rest`] with
    /// every CQE read after it, in order. A poll that fills its free entries
    /// with CQEs, not all of them delivered (unsignaled by the user), polls
    /// again, as the drain would. One free entry, or one CQE read (the
    /// synchronous cases), take the same steps without the loop.
    #[inline(always)]
    pub(crate) fn poll(
        &self,
        eng: &EngineInner<N>,
        id: VqpId,
        out: &mut [Wc],
    ) -> Result<Option<usize>, VqpError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let PhysState {
            credits,
            vqps,
            stats,
            sole,
            needs_recovery,
            ..
        } = st;
        let Some((_, v)) = vqps.find(id) else {
            return Ok(None);
        };
        let n = if v.ring.is_empty() { 0 } else { v.pop(out) };
        if n == out.len() {
            return Ok(Some(n));
        }
        // The ring is empty now: this VQP's completions go straight into
        // `out` (no ring round trip) until it is full.
        if *needs_recovery {
            return self.poll_rest(eng, st, id, out, n, n..n);
        }
        if out.len() - n == 1 {
            // One CQE, read straight into the caller's last entry.
            match self.cq.poll(&mut out[n..]) {
                Ok(0) => return Ok(Some(n)),
                Ok(_) => {}
                Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
                Err(_) => return Ok(Some(n)),
            }
            return match own(credits, *sole, stats, v, id, &mut out[n]) {
                Some(true) => Ok(Some(n + 1)),
                Some(false) => self.poll_rest(eng, st, id, out, n, n..n),
                None => self.poll_rest(eng, st, id, out, n, n..n + 1),
            };
        }
        // CQEs read straight into the caller's free entries: rewritten in
        // place into the user's completions below, or handed on.
        let mut k = match self.cq.poll(&mut out[n..]) {
            Ok(0) => return Ok(Some(n)),
            Ok(k) => k,
            Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
            Err(_) => return Ok(Some(n)),
        };
        if k == 1 {
            // The usual case: one CQE (the synchronous one).
            return match own(credits, *sole, stats, v, id, &mut out[n]) {
                Some(true) => Ok(Some(n + 1)),
                // Room was left (more than one entry was free): the CQ
                // had no more.
                Some(false) => Ok(Some(n)),
                None => self.poll_rest(eng, st, id, out, n, n..n + 1),
            };
        }
        // Entries of `out` filled; free entries the last CQ poll asked for.
        let mut n = n;
        let mut room = out.len() - n;
        loop {
            let end = n + k;
            // The next CQE read and not yet applied (`n <= r`: each CQE
            // delivers at most one completion).
            let mut r = n;
            while r < end {
                match own(credits, *sole, stats, v, id, &mut out[r]) {
                    Some(true) => {
                        if n != r {
                            out[n] = out[r];
                        }
                        n += 1;
                    }
                    Some(false) => {}
                    None => return self.poll_rest(eng, st, id, out, n, r..end),
                }
                r += 1;
            }
            // Full, or the CQ had no more than asked for: done. Otherwise
            // (user-unsignaled WRs took entries) the CQ may hold more.
            if n == out.len() || k < room {
                return Ok(Some(n));
            }
            room = out.len() - n;
            k = match self.cq.poll(&mut out[n..]) {
                Ok(0) => return Ok(Some(n)),
                Ok(k) => k,
                Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
                Err(_) => return Ok(Some(n)),
            };
        }
    }

    /// The rest of [`PhysQp::poll`]: `n` entries of `out` filled, the
    /// VQP's ring empty; `out[polled]` CQEs read and not yet applied, in
    /// order (`n <= polled.start`). Routes them, then drains the CQ into
    /// `out` (recovering the QP if needed).
    #[cold]
    #[inline(never)]
    fn poll_rest(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        id: VqpId,
        out: &mut [Wc],
        n: usize,
        polled: Range<usize>,
    ) -> Result<Option<usize>, VqpError> {
        debug_assert!(n <= polled.start && polled.end <= out.len());
        let mut sink = Sink { vqp: id, out, n };
        if !polled.is_empty() {
            // Routed as the drain would. Each delivers at most one
            // completion into the sink, so the sink's next entry never
            // passes the next CQE to read.
            for r in polled {
                let wc = sink.out[r];
                route(&eng.cache, st, &wc, Some(&mut sink));
            }
            if sink.room() == 0 && !st.needs_recovery {
                return Ok(Some(sink.n));
            }
        }
        let drained = self.drain_for(eng, st, Some(&mut sink));
        let Sink { out, mut n, .. } = sink;
        match drained {
            Ok(_) => {}
            Err(e) if n == 0 => return Err(e),
            Err(_) => return Ok(Some(n)),
        }
        if n < out.len() {
            // A recovery may have reported flushes to the ring.
            if let Some(v) = st.vqps.get_mut(id) {
                n += v.pop(&mut out[n..]);
            }
        }
        Ok(Some(n))
    }

    /// Polls the CQ until it is empty, routing each completion; recovers the
    /// QP if one of them was an error.
    pub(super) fn drain(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
    ) -> Result<usize, VqpError> {
        self.drain_for(eng, st, None)
    }

    /// [`PhysQp::drain`], delivering the completions of the polling VQP
    /// (`sink`) straight into its buffer while its ring is empty, and
    /// stopping early once that buffer is full (a poll needs no more; the
    /// rest stays in the CQ, in order, for the next drain). The first CQ
    /// poll asks for just the room left, so a synchronous poll costs one
    /// CQE read, like a raw one.
    fn drain_for(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        mut sink: Option<&mut Sink<'_>>,
    ) -> Result<usize, VqpError> {
        let mut buf = std::mem::take(&mut st.buf);
        let want = sink.as_ref().map_or(usize::MAX, |s| s.room());
        let mut chunk = want.clamp(1, POLL_BATCH);
        let mut total = 0;
        let polled = loop {
            let k = match self.cq.poll(&mut buf[..chunk]) {
                Ok(k) => k,
                Err(e) => break Err(e),
            };
            for wc in &buf[..k] {
                route(&eng.cache, st, wc, sink.as_deref_mut());
            }
            let enough = sink.as_ref().is_some_and(|s| s.room() == 0);
            total += k;
            if k < chunk || enough || st.needs_recovery {
                break Ok(());
            }
            chunk = POLL_BATCH;
        };
        st.buf = buf;
        polled.map_err(VqpError::nic("poll a shared QP's CQ"))?;
        if st.needs_recovery {
            self.recover(eng, st)?;
        }
        Ok(total)
    }
}

/// The buffer of the VQP that polls: its completions go there directly
/// while its ring is empty (see [`deliver`]).
pub(crate) struct Sink<'a> {
    vqp: VqpId,
    out: &'a mut [Wc],
    /// Entries of `out` filled.
    n: usize,
}

impl Sink<'_> {
    fn room(&self) -> usize {
        self.out.len() - self.n
    }
}

/// Applies one polled completion: credits the shared queue and delivers
/// every WR it retires to its VQP (the polling VQP's into `sink`).
#[inline]
fn route<N: Nic>(cache: &DcCache, st: &mut PhysState<N>, wc: &Wc, sink: Option<&mut Sink<'_>>) {
    let PhysState {
        credits,
        vqps,
        stats,
        needs_recovery,
        guilty,
        window,
        ..
    } = st;
    stats.completions += 1;
    if !wc.status.is_ok() {
        stats.error_completions += 1;
        if *needs_recovery && wc.status == WcStatus::WrFlushErr {
            // A later WR the NIC flushed after the failing one: recovery
            // re-posts it (or reports it, if it is the failing VQP's).
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
        // No fast post until recovered (see `PhysState::window`).
        *window = None;
    }
    // Every WR before the completed one completed silently: it was
    // unsignaled (or its completion would have come first), so the user
    // did not ask for its completion either (the engine only ever adds
    // signals): it only leaves its VQP's count. One VQP lookup per run of
    // one VQP's WRs, not per WR; only the last WR delivers a completion.
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

/// Retires one WR of the VQP `id` (state `v`) and, when the user asked for
/// a completion or the WR failed, hands the user's completion to the VQP:
/// into `sink` when it is the polling VQP's, its ring is empty (so nothing
/// older waits there) and the sink has room; to the VQP's ring otherwise.
/// `None` when the VQP has no WR outstanding (the record is of an earlier
/// attachment of the VQP to this QP: it moves only when drained, see
/// `super::upgrade`, so this never happens; nothing is delivered then).
#[inline]
pub(super) fn deliver(
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

/// Applies `wc`, a CQE just polled, if it is the VQP `id`'s own success
/// retiring only its own WRs: the oldest one on the QP, or any while all
/// outstanding WRs are its own (`sole`). That is `route` then `deliver` for
/// a success into the caller's buffer (the VQP's ring is empty, there is
/// room): the earlier WRs were unsignaled and only leave the count.
///
/// `Some(true)` when `wc` is now the user's completion (status, opcode and
/// length as polled), `Some(false)` when the user did not ask for one;
/// `None`, nothing changed, when the CQE needs [`route`].
#[inline(always)]
fn own(
    credits: &mut SendQueueCredits<Rec>,
    sole: u32,
    stats: &mut DciStats,
    v: &mut VqpState,
    id: VqpId,
    wc: &mut Wc,
) -> Option<bool> {
    let wr_id = PhysWrId::from_raw(wc.wr_id);
    if !wc.status.is_ok() || wr_id.vqp() != id {
        return None;
    }
    let head = credits.head();
    let (seq, rec) = credits.retire_signaled(wr_id, sole == id.get())?;
    stats.completions += 1;
    let retired = (seq - head) as u32 + 1;
    let Some(left) = v.outstanding.checked_sub(retired) else {
        // Retired, but of an earlier attachment (see `deliver`): nothing
        // to deliver.
        stats.orphaned += u64::from(retired - v.outstanding);
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
