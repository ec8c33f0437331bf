//! Posting on a shared QP: the inline fast path, the full pre-check, and
//! the doorbell (in place, or from the QP's copies). The doorbell itself is
//! the host's `ring`, called once with the WRs to hand to the NIC, between
//! staging their records and committing what the NIC took. See the parent
//! module's docs.

use std::cell::Cell;
use std::time::Instant;

use krcore_nic::{Destination, Gid, PostError, SendFlags, SendWr};

use super::state::{
    copies_range, settle_copies, AnyMr, DciStats, Doorbell, MrSnapshot, Rec, Refusal, SharedQp,
    NO_SOLE,
};
use super::vqps::VqpState;
use crate::credits::{CreditError, SendQueueCredits};
use crate::idhash::IdMap;
use crate::precheck::{
    fast_wr_ok, FastGrants, LocalMr, LocalMrTable, MrWindow, MrWindows, NoGrants, Plan, Policy,
    Precheck, QpKind, RemoteGrant, RemoteGrants, Ungranted,
};
use crate::wrid::{PhysWrId, VqpId};

impl SharedQp {
    /// The common post, checked without the general pre-check's setup:
    /// `None`, nothing changed but `dest` of some WRs (which the general
    /// path sets to the same value), when it must take the general path
    /// ([`SharedQp::plan`] then [`SharedQp::ring`]), which decides, so this
    /// only ever accepts what the full pre-check accepts. `Some` when the
    /// doorbell rang (`ring`), or was refused.
    ///
    /// Taken when: the fast path is on and the QP needs no recovery (a
    /// window is held, see `SharedQp::window`), the owned-MR snapshot is of
    /// `mr_generation` (the registry's current one), there is room in the
    /// VQP and in the send queue, the VQP's target is the pair's (RC), and
    /// every WR is a READ or WRITE of one SGE, or a CAS or FAA of one
    /// 8-byte SGE at an 8-byte aligned remote address, inside one of the
    /// two MRs the pre-check last looked up, to a (target, rkey) with no
    /// grant known or the one the VQP's grant memo remembers, satisfied
    /// (`VqpState::last_grant`), all as the full pre-check judges them
    /// (`precheck::fast_wr_ok`: `MrWindows::holds` gives
    /// `precheck::local_ok`'s verdict, and `grant_covers` is the
    /// pre-check's own). `now` is called only when the memo's grant has
    /// an expiry.
    #[inline(always)]
    pub(crate) fn post_fast(
        &mut self,
        id: VqpId,
        wrs: &mut [SendWr],
        mr_generation: u64,
        now: impl FnOnce() -> Instant,
        ring: impl Doorbell,
    ) -> Option<Result<(), Refusal>> {
        let SharedQp {
            credits,
            vqps,
            sole,
            window,
            stats,
            ..
        } = self;
        // A window says the fast path is on and the QP needs no recovery
        // (see `SharedQp::window`).
        let window = window.as_ref()?;
        debug_assert!(self.fast && !self.needs_recovery);
        if mr_generation != self.mr_generation {
            return None;
        }
        let (i, v) = vqps.find(id)?;
        let n = wrs.len();
        if n == 0 || n > self.max_batch as usize || n > credits.free() as usize || !v.has_room(n) {
            return None;
        }
        let target = v.target.as_ref().map(|t| t.target)?;
        // DC: the VQP's target, named per WR. RC: the pair's target, which
        // must be the VQP's (otherwise the general path re-binds it).
        let dest = match self.peer {
            None => Destination::Dc(target),
            Some(gid) if gid == target.gid => Destination::Connected,
            Some(_) => return None,
        };
        // (`fast` says the policy takes SGEs: `common_shape`'s own check.)
        if v.grants.is_empty() {
            // No grant known: nothing to look up, and nothing to post
            // unless the VQP opted out of the grant rule.
            if v.ungranted == Ungranted::Refuse {
                return None;
            }
            for wr in wrs.iter_mut() {
                if !fast_wr_ok(wr, window, &FastGrants::None) {
                    return None;
                }
                wr.dest = dest;
            }
        } else {
            // The memo must hold this (target, rkey).
            // (Read in place: the VQP's state is this post's alone.)
            let (gid, rkey, grant) = v.last_grant.get_mut().as_ref()?;
            if *gid != target.gid {
                return None;
            }
            if grant.is_none() && v.ungranted == Ungranted::Refuse {
                return None;
            }
            let memo = FastGrants::memo(*rkey, grant.as_ref(), now)?;
            for wr in wrs.iter_mut() {
                if !fast_wr_ok(wr, window, &memo) {
                    return None;
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
        // The doorbell (`SharedQp::ring`, the room checked above): in place
        // while the VQP is alone on the QP (out of line when the batch's
        // records wrap around the ring's end).
        let alone = credits.outstanding() == 0 || *sole == id.get();
        if !alone {
            return Some(self.ring_copied(i, id, wrs, force_last, ring));
        }
        let len = credits.ring_mut().len();
        let at = (credits.next_seq() as usize) & len.wrapping_sub(1);
        if at + n > len {
            return Some(place_wrapping(
                credits, v, stats, sole, id, wrs, force_last, ring,
            ));
        }
        Some(place::<false>(
            credits, v, stats, sole, id, wrs, force_last, ring,
        ))
    }

    /// Names the VQP's target in `wrs` and runs the full pre-check under
    /// `policy` (the QP's, [`super::QpShape::policy`]; `now`: called only
    /// when a grant the VQP knows can expire):
    /// `Ok(None)` when the VQP has no room for them. The plan says whether
    /// the batch's last WR must be forced signaled and whether credits
    /// must be reclaimed first.
    #[inline(always)]
    pub fn plan(
        &mut self,
        id: VqpId,
        wrs: &mut [SendWr],
        policy: &Policy,
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<Plan>, Refusal> {
        let SharedQp {
            credits,
            vqps,
            mrs,
            last_mr,
            window,
            needs_recovery,
            stats,
            epoch,
            precheck,
            peer,
            fast,
            ..
        } = self;
        let v = vqps.get(id).ok_or(Refusal::Stale)?;
        if !v.has_room(wrs.len()) {
            return Ok(None);
        }
        let Some(target) = v.target.map(|t| t.target) else {
            return Err(Refusal::NotConnected { vqp: id });
        };
        let (dest, transport, peer) = match *peer {
            None => (Destination::Dc(target), QpKind::Dc, None),
            // The VQP moved to another target meanwhile.
            Some(gid) if gid != target.gid => return Err(Refusal::Stale),
            Some(gid) => (Destination::Connected, QpKind::Rc, Some(gid)),
        };
        for wr in wrs.iter_mut() {
            wr.dest = dest;
        }
        let queue = credits.view();
        let planned = if !*precheck {
            Precheck {
                transport,
                peer,
                local_mrs: &AnyMr,
                grants: &NoGrants,
                ungranted: Ungranted::Allow,
                now: *epoch,
                queue,
                policy: *policy,
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
                    policy: *policy,
                }
                .check(wrs)
            } else {
                // The clock is read only when a known grant can expire.
                let now = if v.expiring > 0 { now() } else { *epoch };
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
                    policy: *policy,
                }
                .check(wrs)
            };
            *last_mr = mrs.last.get();
            // The fast path's gate (see `SharedQp::window`): the last MR's
            // window the most recent (the windows held stay: the snapshot
            // did not change).
            let last = last_mr.and_then(|(lkey, mr)| MrWindow::of(lkey, &mr));
            *window = match (last, *window) {
                _ if !*fast || *needs_recovery => None,
                (Some(w), Some(held)) => Some(held.with(w)),
                (Some(w), None) => Some(MrWindows::one(w)),
                (None, held) => held,
            };
            planned
        };
        if planned.is_err() {
            stats.rejected += 1;
        }
        Ok(Some(planned.map_err(Refusal::Rejected)?))
    }

    /// The refusal of a batch of `n` WRs the VQP `id` has no room for.
    pub fn full(&self, id: VqpId, n: usize) -> Refusal {
        match self.vqps.get(id) {
            Some(v) => Refusal::VqpFull {
                vqp: id,
                outstanding: v.occupied(),
                requested: n,
                capacity: v.capacity,
            },
            None => Refusal::Stale,
        }
    }

    /// After a planned post: while WRs of detached VQPs are in flight, the
    /// fast path stays off (see `SharedQp::orphans_until`).
    #[inline]
    pub(crate) fn gate_orphans(&mut self) {
        if self.orphans_in_flight() {
            self.window = None;
        }
    }

    /// Rings the doorbell (`ring`) for the checked `wrs` of the VQP `id`,
    /// the last WR forced signaled if `force_last`, and counts what the
    /// NIC took.
    ///
    /// While every outstanding WR on the QP is this VQP's (or none is), the
    /// WRs go out in place: no recovery can ever re-post them (see
    /// `Rec::KEPT`), so no copy is kept. Otherwise they are copied into
    /// the copies and posted from there.
    #[inline(always)]
    pub fn ring(
        &mut self,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
        ring: impl Doorbell,
    ) -> Result<(), Refusal> {
        let i = self.vqps.index(id).ok_or(Refusal::Stale)?;
        if self.credits.outstanding() == 0 || self.sole == id.get() {
            self.ring_in_place(i, id, wrs, force_last, ring)
        } else {
            self.ring_copied(i, id, wrs, force_last, ring)
        }
    }

    /// [`SharedQp::ring`] of a VQP alone on the QP ([`place`]), after the
    /// checks the fast path makes itself: room for the batch.
    #[inline(always)]
    fn ring_in_place(
        &mut self,
        i: usize,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
        ring: impl Doorbell,
    ) -> Result<(), Refusal> {
        let n = wrs.len();
        let SharedQp {
            credits,
            vqps,
            stats,
            sole,
            ..
        } = self;
        if n > credits.free() as usize {
            // The pre-check left room for the batch (reclaiming if needed).
            return Err(Refusal::Credit(CreditError::WouldOverrun {
                requested: n,
                free: credits.free(),
            }));
        }
        let len = credits.ring_mut().len();
        let at = (credits.next_seq() as usize) & len.wrapping_sub(1);
        // (The caller found the VQP at `i` under this lock.)
        let Some(v) = vqps.at(i) else {
            return Err(Refusal::Stale);
        };
        if at + n > len {
            return place_wrapping(credits, v, stats, sole, id, wrs, force_last, ring);
        }
        place::<false>(credits, v, stats, sole, id, wrs, force_last, ring)
    }

    /// [`SharedQp::ring`] with other VQPs' WRs outstanding: copies the
    /// `wrs` into `SharedQp::copies` (physical wr_ids), which recovery may
    /// re-post, records them (the users' wr_ids and flags), and rings the
    /// doorbell on the copies.
    #[inline(never)]
    fn ring_copied(
        &mut self,
        i: usize,
        id: VqpId,
        wrs: &[SendWr],
        force_last: bool,
        mut ring: impl Doorbell,
    ) -> Result<(), Refusal> {
        let n = wrs.len();
        let SharedQp {
            credits,
            copies,
            vqps,
            stats,
            sole,
            ..
        } = self;
        // (The caller found the VQP at `i` under this lock.)
        let Some(v) = vqps.at(i) else {
            return Err(Refusal::Stale);
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
                return Err(Refusal::Credit(CreditError::WouldOverrun {
                    requested: n,
                    free: credits.free(),
                }))
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
        let result = ring.ring(staged);
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
        result.map_err(Refusal::Post)
    }
}

/// The doorbell of a VQP (`v`, id `id`) alone on the QP, for `wrs` that
/// fit in the send queue (the callers checked): each WR gets its record
/// only, and the caller's WRs themselves carry the physical wr_ids (and
/// the forced signal) to the NIC (`ring`), put back as they were once it
/// took them.
///
/// `WRAP`: the records may wrap around the ring's end (each is then
/// indexed, and its wr_id packed, on its own: [`place_wrapping`]);
/// otherwise the caller checked that they do not.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn place<const WRAP: bool>(
    credits: &mut SendQueueCredits<Rec>,
    v: &mut VqpState,
    stats: &mut DciStats,
    sole: &mut u32,
    id: VqpId,
    wrs: &mut [SendWr],
    force_last: bool,
    mut ring: impl Doorbell,
) -> Result<(), Refusal> {
    let n = wrs.len();
    let first = credits.next_seq();
    let recs = credits.ring_mut();
    let mask = recs.len().wrapping_sub(1);
    let at = (first as usize) & mask;
    // The record of the batch's `k`th WR: at `(at + k) & mask` of `recs`
    // (`k` of the batch's own slice when it does not wrap).
    let (recs, at, mask) = if WRAP {
        (recs, at, mask)
    } else {
        (&mut recs[at..at + n], 0, usize::MAX)
    };
    // Without a wrap, the batch's physical wr_ids are consecutive: its
    // sequences do not wrap around the low `SEQ_BITS` either, since its
    // records do not wrap around the ring's end and the ring's length (a
    // power of two, at most 2^32) divides 2^SEQ_BITS.
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
    let result = ring.ring(wrs);
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
    placed_in_part(credits, v, stats, sole, id, (n, force_last), posted)
}

/// [`place`] of a batch whose records wrap around the ring's end (rare:
/// kept out of line).
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn place_wrapping(
    credits: &mut SendQueueCredits<Rec>,
    v: &mut VqpState,
    stats: &mut DciStats,
    sole: &mut u32,
    id: VqpId,
    wrs: &mut [SendWr],
    force_last: bool,
    ring: impl Doorbell,
) -> Result<(), Refusal> {
    place::<true>(credits, v, stats, sole, id, wrs, force_last, ring)
}

/// [`place`] of `n` WRs (the last forced signaled if `force_last`) when
/// the NIC refused them from `e.index` on: the ones it took are committed
/// and counted.
#[cold]
#[inline(never)]
fn placed_in_part(
    credits: &mut SendQueueCredits<Rec>,
    v: &mut VqpState,
    stats: &mut DciStats,
    sole: &mut u32,
    id: VqpId,
    (n, force_last): (usize, bool),
    e: PostError,
) -> Result<(), Refusal> {
    let posted = e.index.min(n);
    credits.commit_placed(posted);
    if posted > 0 {
        *sole = id.get();
        v.outstanding += posted as u32;
        stats.doorbells += 1;
        stats.wrs += posted as u64;
        stats.forced_signals += u64::from(force_last && posted == n);
    }
    Err(Refusal::Post(e))
}

/// A VQP's known grants with its last lookup remembered
/// (`VqpState::last_grant`): a VQP's WRs mostly name one (target, rkey),
/// so most WRs skip the hash lookup. The remembered answer (a grant, or
/// none known) is the map's own: every change of the VQP's grants clears
/// it.
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
/// `SharedQp::last_mr`).
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
