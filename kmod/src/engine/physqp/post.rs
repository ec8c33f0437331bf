//! Posting on a shared physical QP: the inline fast path, the general
//! path with the full pre-check, and the doorbell (in place or from the
//! QP's copied records). See the parent module's docs.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use krcore_nic::{Destination, Gid, Nic, QueuePair, SendFlags, SendWr};

use super::super::error::VqpError;
use super::super::idhash::IdMap;
use super::super::mrs::{AnyMr, MrSnapshot};
use super::super::vqp::VqpState;
use super::super::EngineInner;
use super::{
    copies_range, settle_copies, DciStats, Link, PhysQp, PhysState, PostFail, RcLink, Rec, NO_SOLE,
};
use crate::credits::{CreditError, SendQueueCredits};
use crate::precheck::{
    fast_wr_ok, FastGrants, LocalMr, LocalMrTable, MrWindow, MrWindows, NoGrants, Plan, Precheck,
    QpKind, RemoteGrant, RemoteGrants, Ungranted,
};
use crate::wrid::{PhysWrId, VqpId};

/// The error of a post on a closed RC pair (a reclaim that ran into an
/// error may have closed it).
#[cold]
fn closed() -> PostFail {
    VqpError::Post(krcore_nic::PostError {
        index: 0,
        kind: krcore_nic::PostErrorKind::BadState(krcore_nic::QpState::Reset),
    })
    .into()
}

impl<N: Nic> PhysQp<N> {
    /// Posts `wrs` for the VQP `id` as one doorbell (see
    /// [`crate::engine::Vqp::post_send`]). [`PostFail::Stale`] when this QP
    /// does not hold the VQP's state (it moved) or is closed.
    ///
    /// The WRs are copied into the QP's records (physical wr_id, forced
    /// signal) and the doorbell rings on the records themselves: the
    /// caller's WRs keep their wr_ids and flags (only `dest` is set).
    ///
    /// The common post is checked inline ([`PhysQp::post_fast`]); anything
    /// else takes the general path ([`PhysQp::post_general`]).
    #[inline(always)]
    pub(crate) fn post(
        &self,
        eng: &EngineInner<N>,
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<(), PostFail> {
        let mut guard = self.state.lock();
        self.post_fast(eng, &mut guard, id, wrs)
    }

    /// The common post, checked without the general pre-check's setup: a
    /// DCI or an RC pair (the VQP's target's) in RTS, the pre-check on and the owned-MR snapshot current,
    /// room in the VQP and in the send queue, and every WR a READ or WRITE
    /// of one SGE, or a CAS or FAA of one 8-byte SGE at an 8-byte aligned
    /// remote address, inside one of the two MRs the pre-check last looked
    /// up (`PhysState::window`), to a (target, rkey) with no grant known or
    /// the one the VQP's grant memo remembers, satisfied
    /// (`VqpState::last_grant`), all as the full pre-check judges them
    /// (`precheck::fast_wr_ok`: `MrWindows::holds` gives
    /// `precheck::local_ok`'s verdict, and `grant_covers` is the
    /// pre-check's own). Names the target in `wrs` on
    /// the way, decides whether the batch's last WR must be forced
    /// signaled (part (c), as [`crate::precheck::plan_batch`] decides it)
    /// and rings the doorbell (as [`PhysQp::ring_doorbell`] would, the
    /// checks it repeats already made), holding the borrows of the state
    /// it looked up (the VQP's state, the QP) from the checks to the
    /// commit. Anything else goes to [`PhysQp::post_general`], with
    /// nothing changed but `dest` of some WRs (which the general path sets
    /// to the same value): it decides, so this only ever accepts what the
    /// full pre-check accepts.
    #[inline(always)]
    fn post_fast(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<(), PostFail> {
        // Anything the fast path does not take: the general path decides.
        macro_rules! general {
            () => {
                return self.post_general(eng, st, id, wrs)
            };
        }
        let PhysState {
            qp,
            credits,
            vqps,
            sole,
            needs_recovery,
            window,
            mr_generation,
            stats,
            ..
        } = st;
        // A window says the fast path is on and the QP needs no recovery
        // (see `PhysState::window`).
        let Some(window) = window.as_ref() else {
            general!()
        };
        debug_assert!(self.fast && !*needs_recovery);
        let Some(qp) = qp.as_ref() else { general!() };
        if self.words.mr_generation() != *mr_generation {
            general!();
        }
        let Some((i, v)) = vqps.find(id) else {
            general!()
        };
        let n = wrs.len();
        if n == 0 || n > self.max_batch as usize || n > credits.free() as usize || !v.has_room(n) {
            general!();
        }
        let Some(target) = v.target.as_ref().map(|t| t.target) else {
            general!()
        };
        // DC: the VQP's target, named per WR. RC: the pair's target, which
        // must be the VQP's (otherwise the general path re-binds it); the
        // pair is marked used (by the general path too, should the post go
        // there after all).
        let dest = match &self.link {
            Link::Dci => Destination::Dc(target),
            Link::Rc(l) if l.gid == target.gid => {
                l.touch(&self.words.rc_tick);
                Destination::Connected
            }
            Link::Rc(_) => general!(),
        };
        // (`fast` says the policy takes SGEs: `common_shape`'s own check.)
        if v.grants.is_empty() {
            // No grant known: nothing to look up, and nothing to post
            // unless the VQP opted out of the grant rule.
            if v.ungranted == Ungranted::Refuse {
                general!();
            }
            for wr in wrs.iter_mut() {
                if !fast_wr_ok(wr, window, &FastGrants::None) {
                    general!();
                }
                wr.dest = dest;
            }
        } else {
            // The memo must hold this (target, rkey).
            // (Read in place: the VQP's state is this post's alone.)
            let Some((gid, rkey, grant)) = v.last_grant.get_mut() else {
                general!()
            };
            if *gid != target.gid {
                general!();
            }
            if grant.is_none() && v.ungranted == Ungranted::Refuse {
                general!();
            }
            let Some(memo) = FastGrants::memo(*rkey, grant.as_ref(), Instant::now) else {
                general!()
            };
            for wr in wrs.iter_mut() {
                if !fast_wr_ok(wr, window, &memo) {
                    general!();
                }
                wr.dest = dest;
            }
        }
        // (c) as `plan_batch`: the run of unsignaled WRs the batch leaves.
        // (The last WR signaled, the usual case, leaves none.)
        let run_after = if wrs[n - 1].is_signaled() {
            0
        } else {
            match wrs.iter().rposition(SendWr::is_signaled) {
                Some(k) => (n - 1 - k) as u32,
                None => credits.unsignaled_tail() + n as u32,
            }
        };
        let force_last = run_after > self.max_unsignaled;
        // The doorbell (`ring_doorbell`, the room checked above): in place
        // while the VQP is alone on the QP (out of line when the batch's
        // records wrap around the ring's end).
        let alone = credits.outstanding() == 0 || *sole == id.get();
        if !alone {
            return self.ring_copied(st, i, id, wrs, force_last);
        }
        let len = credits.ring_mut().len();
        let at = (credits.next_seq() as usize) & len.wrapping_sub(1);
        if at + n > len {
            return self.place_wrapping(qp, credits, v, stats, sole, id, wrs, force_last);
        }
        self.place::<false>(qp, credits, v, stats, sole, id, wrs, force_last)
    }

    /// [`PhysQp::post`] in general: recovery first if needed, the
    /// owned-MR snapshot refreshed, the full pre-check, reclaiming credits
    /// when the batch does not fit.
    #[cold]
    #[inline(never)]
    fn post_general(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        // WRs of dropped VQPs in flight: one of them may have failed, with
        // nobody polling for it (see `PhysState::orphans_until`).
        if st.orphans_until > st.credits.head() {
            self.drain(eng, st)?;
        }
        if st.needs_recovery {
            self.recover(eng, st)?;
        }
        if st.qp.is_none() {
            return Err(PostFail::Stale);
        }
        if eng.cfg.precheck {
            let generation = eng.mrs.generation();
            if generation != st.mr_generation {
                (st.mr_generation, st.mrs) = eng.mrs.snapshot();
                st.last_mr = None;
                st.window = None;
            }
        }
        let plan = match self.plan(eng, st, id, wrs)? {
            Some(plan) => plan,
            None => {
                // The VQP is full: completions already in the CQ may free
                // its slots.
                self.drain(eng, st)?;
                match self.plan(eng, st, id, wrs)? {
                    Some(plan) => plan,
                    None => {
                        let v = st.vqps.get(id).ok_or(PostFail::Stale)?;
                        return Err(VqpError::VqpFull {
                            vqp: id,
                            outstanding: v.occupied(),
                            requested: n,
                            capacity: v.capacity,
                        }
                        .into());
                    }
                }
            }
        };
        if st.orphans_until > st.credits.head() {
            // Some still in flight: the fast path stays off.
            st.window = None;
        }
        if let Link::Rc(l) = &self.link {
            l.touch(&self.words.rc_tick);
        }
        if plan.must_reclaim() {
            self.reclaim(eng, st, n)?;
        }
        let i = st.vqps.index(id).ok_or(PostFail::Stale)?;
        // The plan forces only ever the batch's last WR.
        self.ring_doorbell(st, i, id, wrs, plan.force_signal.is_some())
    }

    /// Names the VQP's target in `wrs` and runs the pre-check: `Ok(None)`
    /// when the VQP has no room for them.
    #[inline(always)]
    fn plan(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<Option<Plan>, PostFail> {
        let PhysState {
            credits,
            vqps,
            mrs,
            last_mr,
            window,
            needs_recovery,
            stats,
            epoch,
            ..
        } = st;
        let v = vqps.get(id).ok_or(PostFail::Stale)?;
        if !v.has_room(wrs.len()) {
            return Ok(None);
        }
        let Some(target) = v.target.map(|t| t.target) else {
            return Err(VqpError::NotConnected { vqp: id }.into());
        };
        let (dest, transport, peer) = match &self.link {
            Link::Dci => (Destination::Dc(target), QpKind::Dc, None),
            // The VQP moved to another target meanwhile.
            Link::Rc(l) if l.gid != target.gid => return Err(PostFail::Stale),
            Link::Rc(l) => (Destination::Connected, QpKind::Rc, Some(l.gid)),
        };
        for wr in wrs.iter_mut() {
            wr.dest = dest;
        }
        let queue = credits.view();
        let planned = if !eng.cfg.precheck {
            Precheck {
                transport,
                peer,
                local_mrs: &AnyMr,
                grants: &NoGrants,
                ungranted: Ungranted::Allow,
                now: *epoch,
                queue,
                policy: eng.policy,
            }
            .plan_unvalidated(wrs)
        } else {
            let mrs = LastMr {
                mrs,
                last: Cell::new(*last_mr),
            };
            let planned = if v.grants.is_empty() {
                // No grant known: nothing can expire, no lookup per WR.
                Precheck {
                    transport,
                    peer,
                    local_mrs: &mrs,
                    grants: &NoGrants,
                    ungranted: v.ungranted,
                    now: *epoch,
                    queue,
                    policy: eng.policy,
                }
                .check(wrs)
            } else {
                // The clock is read only when a known grant can expire.
                let now = if v.expiring > 0 {
                    Instant::now()
                } else {
                    *epoch
                };
                Precheck {
                    transport,
                    peer,
                    local_mrs: &mrs,
                    grants: &LastGrant {
                        grants: &v.grants,
                        last: &v.last_grant,
                    },
                    ungranted: v.ungranted,
                    now,
                    queue,
                    policy: eng.policy,
                }
                .check(wrs)
            };
            *last_mr = mrs.last.get();
            // The fast path's gate (see `PhysState::window`): the last
            // MR's window the most recent (the windows held stay: the
            // snapshot did not change).
            let last = last_mr.and_then(|(lkey, mr)| MrWindow::of(lkey, &mr));
            *window = match (last, *window) {
                _ if !self.fast || *needs_recovery => None,
                (Some(w), Some(held)) => Some(held.with(w)),
                (Some(w), None) => Some(MrWindows::one(w)),
                (None, held) => held,
            };
            planned
        };
        if planned.is_err() {
            stats.rejected += 1;
        }
        Ok(Some(planned.map_err(VqpError::from)?))
    }

    /// Rings the doorbell for the checked `wrs` of the VQP `id` (at
    /// position `i` of `vqps`), the last WR forced signaled if
    /// `force_last`, and counts what the NIC took.
    ///
    /// While every outstanding WR on the QP is this VQP's (or none is),
    /// the WRs go out in place ([`PhysQp::ring_in_place`]): no recovery
    /// can ever re-post them (see [`Beside::kept`]), so no copy is kept.
    /// Otherwise they are copied into the records and posted from there
    /// ([`PhysQp::ring_copied`]).
    #[inline(always)]
    fn ring_doorbell(
        &self,
        st: &mut PhysState<N>,
        i: usize,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        if st.credits.outstanding() == 0 || st.sole == id.get() {
            self.ring_in_place(st, i, id, wrs, force_last)
        } else {
            self.ring_copied(st, i, id, wrs, force_last)
        }
    }

    /// [`PhysQp::ring_doorbell`] of a VQP alone on the QP
    /// ([`PhysQp::place`]), after the checks the fast path makes itself:
    /// the QP open and room for the batch.
    #[inline(always)]
    fn ring_in_place(
        &self,
        st: &mut PhysState<N>,
        i: usize,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        let PhysState {
            qp,
            credits,
            vqps,
            stats,
            sole,
            ..
        } = st;
        let Some(qp) = qp else {
            return Err(closed());
        };
        if n > credits.free() as usize {
            // The pre-check left room for the batch (reclaiming if needed).
            return Err(VqpError::from(CreditError::WouldOverrun {
                requested: n,
                free: credits.free(),
            })
            .into());
        }
        let len = credits.ring_mut().len();
        let at = (credits.next_seq() as usize) & len.wrapping_sub(1);
        // (The caller found the VQP at `i` under this lock.)
        let Some(v) = vqps.at(i) else {
            return Err(PostFail::Stale);
        };
        if at + n > len {
            return self.place_wrapping(qp, credits, v, stats, sole, id, wrs, force_last);
        }
        self.place::<false>(qp, credits, v, stats, sole, id, wrs, force_last)
    }

    /// The doorbell of a VQP (`v`, id `id`) alone on the QP, for `wrs`
    /// that fit in the send queue (the callers checked): each WR gets its
    /// record only, and the caller's WRs themselves carry the physical
    /// wr_ids (and the forced signal) to the NIC, put back as they were
    /// once it took them.
    ///
    /// `WRAP`: the records may wrap around the ring's end (each is then
    /// indexed, and its wr_id packed, on its own:
    /// [`PhysQp::place_wrapping`]); otherwise the caller checked that they
    /// do not.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn place<const WRAP: bool>(
        &self,
        qp: &N::Qp,
        credits: &mut SendQueueCredits<Rec>,
        v: &mut VqpState,
        stats: &mut DciStats,
        sole: &mut u32,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        let first = credits.next_seq();
        let recs = credits.ring_mut();
        let mask = recs.len().wrapping_sub(1);
        let at = (first as usize) & mask;
        // The record of the batch's `k`th WR: at `(at + k) & mask` of
        // `recs` (`k` of the batch's own slice when it does not wrap).
        let (recs, at, mask) = if WRAP {
            (recs, at, mask)
        } else {
            (&mut recs[at..at + n], 0, usize::MAX)
        };
        // Without a wrap, the batch's physical wr_ids are consecutive: its
        // sequences do not wrap around the low `SEQ_BITS` either, since its
        // records do not wrap around the ring's end and the ring's length
        // (a power of two, at most 2^32) divides 2^SEQ_BITS.
        const _: () = assert!(crate::wrid::SEQ_BITS >= 32);
        let base = PhysWrId::new(id, first).raw();
        for k in 0..n {
            let wr = &mut wrs[k];
            let phys = if WRAP {
                PhysWrId::new(id, first + k as u64).raw()
            } else {
                base + k as u64
            };
            let signaled = wr.is_signaled();
            recs[(at + k) & mask] = Rec::new(phys, wr.wr_id, signaled, signaled, false);
            wr.wr_id = phys;
        }
        let mut restore_flags = None;
        if force_last {
            let last = &mut wrs[n - 1];
            restore_flags = Some(last.flags);
            last.flags = last.flags | SendFlags::SIGNALED;
            recs[(at + n - 1) & mask].flags |= Rec::SIGNALED;
        }
        let result = qp.post_send(wrs);
        // The caller's WRs as they were (but `dest`); the signaled ones
        // counted on the way (for the commit).
        let (mut signaled, mut newest) = (0u32, None);
        for k in 0..n {
            let rec = &recs[(at + k) & mask];
            wrs[k].wr_id = rec.user_wr_id;
            if rec.user_signaled {
                signaled += 1;
                newest = Some(k);
            }
        }
        if let Some(flags) = restore_flags {
            wrs[n - 1].flags = flags;
            signaled += u32::from(newest != Some(n - 1));
            newest = Some(n - 1);
        }
        let posted = match result {
            Ok(()) => {
                // All of them (straight line: the usual case).
                credits.commit_placed_counted(n, signaled, newest);
                *sole = id.get();
                v.outstanding += n as u32;
                stats.doorbells += 1;
                stats.wrs += n as u64;
                stats.forced_signals += u64::from(force_last);
                return Ok(());
            }
            Err(e) => e,
        };
        Self::placed_in_part(credits, v, stats, sole, id, (n, force_last), posted)
    }

    /// [`PhysQp::place`] of a batch whose records wrap around the ring's
    /// end (rare: kept out of line).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn place_wrapping(
        &self,
        qp: &N::Qp,
        credits: &mut SendQueueCredits<Rec>,
        v: &mut VqpState,
        stats: &mut DciStats,
        sole: &mut u32,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        self.place::<true>(qp, credits, v, stats, sole, id, wrs, force_last)
    }

    /// [`PhysQp::place`] of `n` WRs (the last forced signaled if
    /// `force_last`) when the NIC refused them from `e.index` on: the
    /// ones it took are committed and counted.
    #[cold]
    #[inline(never)]
    fn placed_in_part(
        credits: &mut SendQueueCredits<Rec>,
        v: &mut VqpState,
        stats: &mut DciStats,
        sole: &mut u32,
        id: VqpId,
        (n, force_last): (usize, bool),
        e: krcore_nic::PostError,
    ) -> Result<(), PostFail> {
        let posted = e.index.min(n);
        credits.commit_placed(posted);
        if posted > 0 {
            *sole = id.get();
            v.outstanding += posted as u32;
            stats.doorbells += 1;
            stats.wrs += posted as u64;
            stats.forced_signals += u64::from(force_last && posted == n);
        }
        Err(VqpError::Post(e).into())
    }

    /// [`PhysQp::ring_doorbell`] with other VQPs' WRs outstanding: copies
    /// the `wrs` into [`PhysState::copies`] (physical wr_ids), which
    /// recovery may re-post, records them (the users' wr_ids and flags),
    /// and rings the doorbell on the copies.
    #[inline(never)]
    fn ring_copied(
        &self,
        st: &mut PhysState<N>,
        i: usize,
        id: VqpId,
        wrs: &[SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        let PhysState {
            qp,
            credits,
            copies,
            vqps,
            stats,
            sole,
            ..
        } = st;
        // A reclaim that ran into an error may have closed an RC pair.
        let Some(qp) = qp else {
            return Err(closed());
        };
        // (The caller found the VQP at `i` under this lock.)
        let Some(v) = vqps.at(i) else {
            return Err(PostFail::Stale);
        };
        // (Only with other VQPs' WRs outstanding, from the callers; a VQP
        // alone would stay alone.)
        let alone = credits.outstanding() == 0 || *sole == id.get();
        let first = credits.next_seq();
        let len = credits.ring_mut().len();
        let mask = len - 1;
        // The pre-check left room for the batch (reclaiming if needed);
        // the spare copies fit any batch up to the depth.
        let staged = match copies.get_mut(copies_range(first, n, len)) {
            Some(staged) if n <= credits.free() as usize => staged,
            _ => {
                return Err(VqpError::from(CreditError::WouldOverrun {
                    requested: n,
                    free: credits.free(),
                })
                .into())
            }
        };
        // One copy of the batch (not one per WR), then the wr_ids and the
        // records; the signaled WRs are counted on the way (for the
        // commit).
        staged.copy_from_slice(wrs);
        let recs = credits.ring_mut();
        let (mut signaled, mut newest) = (0u32, None);
        for (k, (copy, wr)) in staged.iter_mut().zip(wrs).enumerate() {
            let seq = first + k as u64;
            copy.wr_id = PhysWrId::new(id, seq).raw();
            let user_signaled = wr.is_signaled();
            recs[(seq as usize) & mask] =
                Rec::new(copy.wr_id, wr.wr_id, user_signaled, user_signaled, true);
            if user_signaled {
                signaled += 1;
                newest = Some(k);
            }
        }
        if force_last {
            if let Some(last) = staged.last_mut() {
                signaled += u32::from(!last.is_signaled());
                last.flags = last.flags | SendFlags::SIGNALED;
                recs[((first + n as u64 - 1) as usize) & mask].flags |= Rec::SIGNALED;
                newest = Some(n - 1);
            }
        }
        let result = qp.post_send(staged);
        let posted = match &result {
            Ok(()) => n,
            Err(e) => e.index.min(n),
        };
        settle_copies(copies, first, posted, len);
        match &result {
            Ok(()) => credits.commit_placed_counted(n, signaled, newest),
            Err(_) => credits.commit_placed(posted),
        };
        if posted > 0 {
            *sole = if alone { id.get() } else { NO_SOLE };
            v.outstanding += posted as u32;
            stats.doorbells += 1;
            stats.wrs += posted as u64;
            stats.forced_signals += u64::from(force_last && posted == n);
        }
        result.map_err(|e| VqpError::Post(e).into())
    }

    /// Polls until `n` credits are free, bounded by the reclaim timeout.
    fn reclaim(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        n: usize,
    ) -> Result<(), VqpError> {
        let start = Instant::now();
        loop {
            self.drain(eng, st)?;
            if st.credits.free() as usize >= n {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited > eng.cfg.reclaim_timeout {
                return Err(VqpError::QueueBusy {
                    free: st.credits.free(),
                    requested: n,
                    waited,
                });
            }
            std::thread::yield_now();
        }
    }
}

impl RcLink {
    /// Marks the pair most recently used (exact LRU): a load of the shared
    /// tick, and a bump only when another pair was used since this one.
    #[inline]
    fn touch(&self, tick: &AtomicU64) {
        let now = tick.load(Ordering::Relaxed);
        if self.used.load(Ordering::Relaxed) != now {
            self.used
                .store(tick.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

/// A VQP's known grants with its last lookup remembered
/// ([`VqpState::last_grant`]): a VQP's WRs mostly name one (target, rkey),
/// so most WRs skip the hash lookup. The remembered answer (a grant, or
/// none known) is the map's own: every change of the VQP's grants clears it.
struct LastGrant<'a> {
    grants: &'a IdMap<(Gid, u32), RemoteGrant>,
    last: &'a Cell<Option<(Gid, u32, Option<RemoteGrant>)>>,
}

impl RemoteGrants for LastGrant<'_> {
    #[inline]
    fn lookup(&self, target: &Gid, rkey: u32) -> Option<RemoteGrant> {
        if let Some((gid, key, grant)) = self.last.get() {
            if key == rkey && gid == *target {
                return grant;
            }
        }
        let grant = self.grants.get(&(*target, rkey)).copied();
        self.last.set(Some((*target, rkey, grant)));
        grant
    }
}

/// The owned-MR snapshot with the last lookup remembered (see
/// `PhysState::last_mr`).
struct LastMr<'a> {
    mrs: &'a MrSnapshot,
    last: Cell<Option<(u32, LocalMr)>>,
}

impl LocalMrTable for LastMr<'_> {
    #[inline]
    fn lookup(&self, lkey: u32) -> Option<LocalMr> {
        if let Some((k, mr)) = self.last.get() {
            if k == lkey {
                return Some(mr);
            }
        }
        let mr = self.mrs.lookup(lkey)?;
        self.last.set(Some((lkey, mr)));
        Some(mr)
    }
}
