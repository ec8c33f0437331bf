//! One shared physical QP: a DC initiator of the pool (DC mode) or the RC
//! QP of one (node, target) pair (RC fallback mode). Its send CQ, and behind
//! ONE lock (this QP's, never the engine's) its credit account, the VQPs
//! bound to it and its snapshot of the owned MRs. The pre-check, credits,
//! wr_id routing and recovery below are the same code for both transports;
//! only the destination, the pre-check's transport and how the QP is brought
//! back after an error differ ([`Link`]).
//!
//! # Locking
//!
//! ONE lock per physical QP, and nothing else on the data path: the state of
//! every VQP bound to the QP (count of WRs in flight, completion ring,
//! target, grants: [`VqpState`]) lives in the QP's state, in a table by VQP
//! id ([`VqpTable`]), beside the QP's records of its WRs. A post takes the
//! QP's lock once;
//! so does a poll (pop the VQP's ring; when that is not enough, drain the
//! CQ, routing each completion to its VQP's ring, and pop again). Nothing
//! here takes an engine-wide lock. RC fallback mode: a VQP's binding lock
//! (see [`super::vqp`]) is taken before a QP's lock, never after. (RC
//! recovery sends a handshake through the engine's handshake endpoint,
//! whose locks are leaves.)
//!
//! # The common case inline
//!
//! A post of READs/WRITEs of one SGE in the MR the pre-check last looked
//! up, on a DCI or an RC pair with room, is checked inline (`PhysQp::post_fast`: the
//! pre-check's own verdict, computed without its general setup) and goes
//! straight to the doorbell; anything else (and anything it would reject)
//! takes the general path. A poll that reads this VQP's own success
//! retiring only this VQP's WRs (the oldest WR on the QP, or any while
//! `PhysState::sole` says every outstanding WR is this VQP's) applies it
//! inline without routing; anything else is routed in full.
//!
//! # One record per WR
//!
//! Each WR on the QP has ONE record, at its physical sequence (the QP's own
//! count of posted WRs) in the account `credits`, and beside it in `users`
//! the user's wr_id and signal flag. Two ways to post:
//!
//! - A VQP alone on the QP (every outstanding WR its own,
//!   `PhysState::sole`, or none outstanding) posts in place
//!   (`PhysQp::ring_in_place`): each record gets only the physical wr_id
//!   `(vqp, sequence)` and the flags (what the account and the routing
//!   read), the caller's WRs carry the physical wr_ids (and the forced
//!   signal) to the NIC and get their own back right after the doorbell.
//!   No copy of the WR is kept: no recovery can re-post it (see
//!   `Beside::kept`).
//! - Otherwise (or when the batch's records would wrap around the ring's
//!   end) the batch is copied into the records ([`SendQueueCredits::stage`],
//!   contiguous even where the ring wraps), the doorbell rings on the
//!   records themselves, and recovery may re-post them.
//!
//! Either way the post commits what the NIC took: no per-VQP table, and
//! the caller's WRs are left as they were (but `dest`). A completion finds its
//! record by the sequence bits of its wr_id ([`SendQueueCredits::resolve`],
//! O(1)), which also detects a completion of an old incarnation (its
//! sequence is below every outstanding one).
//!
//! # Invariants
//!
//! - Every WR on the QP was recorded in `credits` (in posting order, with
//!   its user's wr_id and flag in `users`) and counted in its VQP's
//!   `outstanding` before the lock was released.
//! - A polled completion retires, in order, every physical WR up to its own
//!   ([`SendQueueCredits::complete_range`]); each leaves its VQP's count
//!   once, and the completed one is delivered to its VQP's ring (or the
//!   poller's buffer) when the user signaled it or it failed. The earlier
//!   ones were unsignaled (or their completion would have come first), so
//!   their users did not ask for a completion either: the engine only adds
//!   signals.
//! - After an error completion the QP is in ERR. The failing WR's
//!   completion goes to its owner (the "guilty" VQP) when routed; the flush
//!   completions of the later WRs are not routed. Recovery resets the QP
//!   (discarding the flushes still to come), reports the guilty VQP's later
//!   WRs as `WR_FLUSH_ERR` (as its own QP would), brings the QP back to RTS
//!   and re-posts every other VQP's outstanding WRs in their original order
//!   (they never executed: the NIC flushes, it does not execute, what
//!   follows a failed WR), from their records, under NEW physical
//!   sequences (same user wr_ids), the last one forced signaled.
//!   Completions of the old incarnation that a CQ still returns after the
//!   reset (a delayed CQE) thus match no outstanding WR: they are counted
//!   stale and never start another recovery.
//!   Innocent VQPs thus see only their own results, each exactly once, in
//!   order. A dead target (`RETRY_EXC_ERR`) is the failing WR's typed
//!   status for its VQP, whose target is cleared and whose DCCache entry is
//!   invalidated; other VQPs' WRs to it fail the same way on their turn.
//!   A DCI needs no peer to come back; an RC QP's peer entered ERR too (on
//!   a remote error the responder's end fails as well), so the RC QP is
//!   re-handshaken: the responder resets and re-arms its end (see
//!   [`crate::handshake`]). If the target does not answer, the pair is
//!   closed and every outstanding WR is reported `WR_FLUSH_ERR` to its
//!   owner: its QP is destroyed and every later post re-acquires a pair
//!   (and fails, typed, while the target is gone).
//! - A VQP's state leaves a QP only with none of its WRs in flight there
//!   (`detach_drained`; a dropped VQP's WRs complete as orphans), so a
//!   record always belongs to the VQP's current attachment.
//! - A closed RC pair (`qp` is `None`: evicted, or lost) accepts no post:
//!   posts see [`PostFail::Stale`] and re-bind their VQP. An RC pair only
//!   carries WRs of VQPs attached to it and connected to its target.

use super::idhash::IdMap;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use krcore_nic::{
    bring_up, Access, CompletionQueue, Destination, Gid, Nic, QpCaps, QpInit, QpType, QueuePair,
    SendFlags, SendWr, Transition, UdTarget, Wc, WcStatus,
};
use parking_lot::Mutex;

use super::error::{EngineError, VqpError};
use super::mrs::{AnyMr, MrSnapshot};
use super::vqp::{VqpState, VqpTable};
use super::EngineInner;
use crate::credits::{CreditError, Posted, SendQueueCredits};
use crate::dccache::DcCache;
use crate::precheck::{
    LocalMr, LocalMrTable, MrWindow, NoGrants, OpKind, Plan, Precheck, RemoteGrant, RemoteGrants,
    Transport,
};
use crate::wrid::{PhysWrId, Slot, VqpId};

/// Completions polled per CQ poll call.
const POLL_BATCH: usize = 32;

/// [`PhysState::sole`] when no VQP is known to own every outstanding WR:
/// no VQP id is this wide ([`crate::wrid::VQP_ID_BITS`] < 32).
const NO_SOLE: u32 = u32::MAX;
const _: () = assert!(VqpId::MAX.get() < NO_SOLE);

/// Statistics of one shared physical QP (monotonic): a DCI, or in RC
/// fallback mode an RC pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DciStats {
    /// Doorbells rung (accepted `post_send` calls).
    pub doorbells: u64,
    /// WRs posted.
    pub wrs: u64,
    /// WRs the engine forced signaled (pre-check (c)).
    pub forced_signals: u64,
    /// Batches rejected by the pre-check.
    pub rejected: u64,
    /// Completions polled from the CQ.
    pub completions: u64,
    /// Error completions polled (flushes included).
    pub error_completions: u64,
    /// Completions matching no outstanding WR (stale after a reset).
    pub stale_completions: u64,
    /// Completions for VQPs that no longer exist.
    pub orphaned: u64,
    /// Times the QP was reset and brought up again after ERR (for an RC
    /// pair: re-handshaken with its target).
    pub recoveries: u64,
    /// WRs still outstanding at a reset that the engine reported flushed
    /// to their owner: the failing VQP's later WRs (and every WR when the
    /// QP could not be brought back).
    pub flushed_by_reset: u64,
    /// WRs of innocent VQPs the NIC flushed and the engine posted again
    /// after the reset (never executed, so the retry is safe).
    pub reposted: u64,
    /// RC pairs closed because their target did not answer the
    /// re-handshake after an error.
    pub lost: u64,
}

impl DciStats {
    /// Adds `o` into `self`.
    pub(crate) fn add(&mut self, o: &DciStats) {
        self.doorbells += o.doorbells;
        self.wrs += o.wrs;
        self.forced_signals += o.forced_signals;
        self.rejected += o.rejected;
        self.completions += o.completions;
        self.error_completions += o.error_completions;
        self.stale_completions += o.stale_completions;
        self.orphaned += o.orphaned;
        self.recoveries += o.recoveries;
        self.flushed_by_reset += o.flushed_by_reset;
        self.reposted += o.reposted;
        self.lost += o.lost;
    }
}

/// The statistics of any shared physical QP (the historical name is
/// [`DciStats`]).
pub type QpStats = DciStats;

/// What the QP is shared for.
pub(crate) enum Link {
    /// A DC initiator: any target, named per WR.
    Dci,
    /// The RC QP of the pair (this node, `target`).
    Rc(RcLink),
}

/// The far end of an RC pair.
pub(crate) struct RcLink {
    /// The target's GID.
    pub(crate) gid: Gid,
    /// The target's handshake endpoint.
    pub(crate) handshake: UdTarget,
    /// LRU stamp: the engine's RC tick when a VQP last used the pair.
    pub(crate) used: AtomicU64,
}

/// Why a post did not go through.
pub(crate) enum PostFail {
    /// The QP is closed, or no longer the VQP's: re-read the VQP's binding
    /// (RC fallback mode only). Nothing was posted; the WRs are untouched.
    Stale,
    /// A real error, for the caller.
    Vqp(VqpError),
}

impl From<VqpError> for PostFail {
    fn from(e: VqpError) -> PostFail {
        PostFail::Vqp(e)
    }
}

/// What is kept beside the record of one WR (see [`PhysState::users`]).
#[derive(Clone, Copy, Default)]
struct Beside {
    /// The user's wr_id and signal flag.
    slot: Slot,
    /// The record holds the whole WR as posted (recovery may re-post it).
    /// `false` for a WR posted while every outstanding WR on the QP was
    /// its VQP's ([`PhysQp::ring_in_place`]): its record has only the
    /// physical wr_id and the flags. Recovery never re-posts such a WR:
    /// it re-posts only WRs after the failing one, and of another VQP than
    /// the failing one's; but the failing WR, posted before it, was still
    /// outstanding when it was posted (its completion starts recovery
    /// under the same lock), hence of the same VQP.
    kept: bool,
}

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

pub(crate) struct PhysState<N: Nic> {
    /// `None`: an RC pair that was closed (evicted, or lost).
    qp: Option<N::Qp>,
    /// The account of the send queue, keeping ONE record per WR: the WR
    /// as posted (physical wr_id, forced signal). The doorbell rings on
    /// these records, and recovery re-posts from them.
    credits: SendQueueCredits<SendWr>,
    /// Beside each record (same index: sequence mod `users.len()`), the
    /// user's wr_id and signal flag, for the completion, and whether the
    /// record holds the whole WR ([`Beside::kept`]).
    users: Box<[Beside]>,
    /// The state of every VQP bound to this QP.
    vqps: VqpTable,
    /// `v.get()`: every outstanding WR is the VQP `v`'s (kept by every
    /// post; a re-post after recovery clears it to [`NO_SOLE`]). Lets a
    /// poll by `v` apply a completion that retires several WRs without
    /// routing each. (A raw id, compared in one instruction.)
    sole: u32,
    mr_generation: u64,
    mrs: MrSnapshot,
    /// The last MR the pre-check looked up in `mrs` (posts mostly reuse
    /// one MR): spares the hash lookup. Cleared with the snapshot.
    last_mr: Option<(u32, LocalMr)>,
    /// Invariant: `last_mr`'s [`MrWindow`] (`MrWindow::of`), kept beside
    /// it (set wherever `last_mr` is) so that the fast path does not
    /// rebuild it per post.
    window: Option<MrWindow>,
    /// The CQ poll buffer (kept, so that a poll initializes nothing).
    buf: Vec<Wc>,
    needs_recovery: bool,
    /// The VQP whose WR failed first and put the QP in ERR (recovery
    /// reports its flushed WRs to it and re-posts everybody else's).
    guilty: Option<VqpId>,
    /// RC: the nonce of the current pairing (for Close).
    nonce: u64,
    stats: DciStats,
    /// Any instant: the `now` handed to the pre-check when the VQP knows no
    /// grants (nothing can expire then).
    epoch: Instant,
}

pub(crate) struct PhysQp<N: Nic> {
    /// DC: index in the pool; RC: serial number of the pair.
    pub(crate) index: usize,
    qpn: u32,
    /// The pre-check is on (and the policy takes SGEs): posts may take
    /// the fast path ([`PhysQp::post_fast`]), on a DCI or an RC pair
    /// alike.
    fast: bool,
    /// [`crate::precheck::Policy::max_batch`] of the queue.
    max_batch: u32,
    /// [`crate::precheck::Policy::effective_max_unsignaled`] of the queue.
    max_unsignaled: u32,
    cq: N::Cq,
    pub(crate) link: Link,
    state: Mutex<PhysState<N>>,
}

impl<N: Nic> std::fmt::Debug for PhysQp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(match self.link {
            Link::Dci => "Dci",
            Link::Rc(_) => "RcPair",
        });
        d.field("index", &self.index).field("qpn", &self.qpn);
        if let Link::Rc(l) = &self.link {
            d.field("target", &l.gid);
        }
        d.finish()
    }
}

/// The CQ and QP of a new shared QP (its CQ as deep as its send queue).
pub(crate) fn create_qp<N: Nic>(
    eng: &EngineInner<N>,
    qp_type: QpType,
    what: (&'static str, &'static str),
) -> Result<(N::Qp, N::Cq), EngineError> {
    let depth = eng.cfg.dci_depth;
    // Every CQE retires at least one WR, and a WR holds its credit until
    // its CQE (or a later one) is polled: at most `depth` CQEs wait.
    let cq = eng.nic.create_cq(depth).map_err(EngineError::nic(what.0))?;
    let qp = eng
        .nic
        .create_qp(
            &eng.pd,
            &QpInit {
                qp_type,
                caps: QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: 0,
                    max_send_sge: eng.policy.max_sge as u32,
                    max_recv_sge: 1,
                },
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                dc_key: 0,
            },
        )
        .map_err(EngineError::nic(what.1))?;
    Ok((qp, cq))
}

impl<N: Nic> PhysQp<N> {
    /// Creates a DCI with a CQ of its own, brought up to RTS.
    pub(crate) fn dci(eng: &EngineInner<N>, index: usize) -> Result<PhysQp<N>, EngineError> {
        let (qp, cq) = create_qp(eng, QpType::Dci, ("create a DCI's CQ", "create a DCI"))?;
        bring_up(&qp, Access::NONE, None).map_err(EngineError::nic("bring up a DCI"))?;
        Ok(PhysQp::new(eng, index, qp, cq, Link::Dci, 0))
    }

    /// Wraps an RC QP already paired (RTS) with `link`'s target.
    pub(crate) fn rc(
        eng: &EngineInner<N>,
        index: usize,
        qp: N::Qp,
        cq: N::Cq,
        link: RcLink,
        nonce: u64,
    ) -> PhysQp<N> {
        PhysQp::new(eng, index, qp, cq, Link::Rc(link), nonce)
    }

    fn new(
        eng: &EngineInner<N>,
        index: usize,
        qp: N::Qp,
        cq: N::Cq,
        link: Link,
        nonce: u64,
    ) -> PhysQp<N> {
        let ring_len = eng.cfg.dci_depth.next_power_of_two();
        let depth = eng.cfg.dci_depth;
        PhysQp {
            index,
            qpn: qp.qpn(),
            fast: eng.cfg.precheck && eng.policy.max_sge > 0,
            max_batch: eng.policy.max_batch(depth),
            max_unsignaled: eng.policy.effective_max_unsignaled(depth),
            cq,
            link,
            state: Mutex::new(PhysState {
                qp: Some(qp),
                // Spare records: any batch up to the depth is staged
                // contiguously where the ring wraps.
                credits: SendQueueCredits::with_records(
                    eng.cfg.dci_depth,
                    ring_len - 1,
                    SendWr::read(0, Default::default(), Default::default()),
                ),
                users: vec![Beside::default(); ring_len as usize].into_boxed_slice(),
                vqps: VqpTable::default(),
                sole: NO_SOLE,
                epoch: Instant::now(),
                mr_generation: u64::MAX,
                mrs: MrSnapshot::default(),
                last_mr: None,
                window: None,
                buf: vec![Wc::default(); POLL_BATCH],
                needs_recovery: false,
                guilty: None,
                nonce,
                stats: DciStats::default(),
            }),
        }
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The target of an RC pair.
    pub(crate) fn rc_link(&self) -> Option<&RcLink> {
        match &self.link {
            Link::Rc(l) => Some(l),
            Link::Dci => None,
        }
    }

    /// Whether the QP still exists (an RC pair may be closed).
    pub(crate) fn is_open(&self) -> bool {
        self.state.lock().qp.is_some()
    }

    /// Hands the VQP `id`'s state to this QP.
    pub(crate) fn attach(&self, id: VqpId, vqp: VqpState) {
        self.state.lock().vqps.insert(id, vqp);
    }

    /// Takes the VQP `id`'s state back (completions of its WRs still in
    /// flight are then discarded).
    pub(crate) fn detach(&self, id: VqpId) -> Option<VqpState> {
        self.state.lock().vqps.remove(id)
    }

    /// Takes the VQP `id`'s state back only if none of its WRs is in
    /// flight, checked and taken under one lock (the DC -> RC upgrade's
    /// switch): `Some(Err(outstanding))` otherwise, `None` when this QP
    /// does not hold it.
    pub(crate) fn detach_drained(&self, id: VqpId) -> Option<Result<VqpState, u32>> {
        let mut st = self.state.lock();
        let n = st.vqps.get(id)?.outstanding;
        if n > 0 {
            return Some(Err(n));
        }
        st.vqps.remove(id).map(Ok)
    }

    /// Runs `f` on the state of the VQP `id`, if this QP holds it.
    pub(crate) fn with_vqp<R>(&self, id: VqpId, f: impl FnOnce(&mut VqpState) -> R) -> Option<R> {
        self.state.lock().vqps.get_mut(id).map(f)
    }

    pub(crate) fn stats(&self) -> DciStats {
        self.state.lock().stats
    }

    /// Closes the pair whatever is in flight (the engine is going away):
    /// returns the pairing's nonce if it was open.
    pub(crate) fn close(&self) -> Option<u64> {
        let mut st = self.state.lock();
        st.qp.take().map(|_| st.nonce)
    }

    /// Closes an idle RC pair (eviction): drains its CQ, and if no WR is
    /// left in flight destroys the QP and returns the pairing's nonce (for
    /// the Close message). `Ok(None)`: WRs are in flight, the pair stays.
    pub(crate) fn close_if_idle(&self, eng: &EngineInner<N>) -> Result<Option<u64>, VqpError> {
        let mut st = self.state.lock();
        if st.qp.is_some() {
            self.drain(eng, &mut st)?;
        }
        if st.qp.is_some() && st.credits.outstanding() > 0 {
            return Ok(None);
        }
        // Dropping the QP (its last handle) destroys it and discards
        // nothing: no WR is in flight.
        st.qp = None;
        Ok(Some(st.nonce))
    }

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
    /// of one SGE inside the MR the pre-check last looked up
    /// (`PhysState::last_mr`), to a (target, rkey) with no grant known or
    /// the one the VQP's grant memo remembers, satisfied
    /// (`VqpState::last_grant`), all as the full pre-check judges them
    /// (`MrWindow::holds` gives `precheck::local_ok`'s verdict, and
    /// `grant_covers` is the pre-check's own). Names the target in `wrs` on
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
            users,
            vqps,
            sole,
            needs_recovery,
            window,
            mr_generation,
            stats,
            ..
        } = st;
        if !self.fast || *needs_recovery {
            general!();
        }
        let Some(qp) = qp.as_ref() else { general!() };
        let Some(window) = window.as_ref() else {
            general!()
        };
        if eng.mrs.generation() != *mr_generation {
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
        // must be the VQP's (otherwise the general path re-binds it).
        let dest = match &self.link {
            Link::Dci => Destination::Dc(target),
            Link::Rc(l) if l.gid == target.gid => Destination::Connected,
            Link::Rc(_) => general!(),
        };
        // (`fast` says the policy takes SGEs: `common_shape`'s own check.)
        if v.grants.is_empty() {
            // No grant known: nothing to look up.
            for wr in wrs.iter_mut() {
                let Some((_, op, sge)) = crate::precheck::common_shape_of(wr) else {
                    general!()
                };
                if !window.holds(sge, op == OpKind::Read) {
                    general!();
                }
                wr.dest = dest;
            }
        } else {
            // The memo must hold this (target, rkey).
            let Some((gid, rkey, known)) = v.last_grant.get() else {
                general!()
            };
            if gid != target.gid {
                general!();
            }
            let now = known.and_then(|g| g.expires_at).map(|_| Instant::now());
            for wr in wrs.iter_mut() {
                let Some((remote, op, sge)) = crate::precheck::common_shape_of(wr) else {
                    general!()
                };
                if !window.holds(sge, op == OpKind::Read) || remote.rkey != rkey {
                    general!();
                }
                if let Some(grant) = &known {
                    let len = u64::from(sge.length);
                    if grant.expires_at.zip(now).is_some_and(|(t, now)| now >= t)
                        || crate::precheck::grant_covers(grant, remote, op, len).is_err()
                    {
                        general!();
                    }
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
        if let Link::Rc(l) = &self.link {
            l.touch(&eng.rc_tick);
        }
        let force_last = run_after > self.max_unsignaled;
        // The doorbell (`ring_doorbell`, the room checked above): in place
        // while the VQP is alone on the QP and the batch's records do not
        // wrap around the ring's end.
        let alone = credits.outstanding() == 0 || *sole == id.get();
        let at = (credits.next_seq() as usize) & users.len().wrapping_sub(1);
        if !alone || at + n > users.len() || at + n > credits.records_mut().len() {
            return self.ring_copied(st, i, id, wrs, force_last);
        }
        self.place(qp, credits, users, v, stats, sole, id, wrs, force_last)
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
        if let Link::Rc(l) = &self.link {
            l.touch(&eng.rc_tick);
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
            Link::Dci => (Destination::Dc(target), Transport::Dc, None),
            // The VQP moved to another target meanwhile.
            Link::Rc(l) if l.gid != target.gid => return Err(PostFail::Stale),
            Link::Rc(l) => (Destination::Connected, Transport::Rc, Some(l.gid)),
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
                    now,
                    queue,
                    policy: eng.policy,
                }
                .check(wrs)
            };
            *last_mr = mrs.last.get();
            *window = last_mr.and_then(|(lkey, mr)| MrWindow::of(lkey, &mr));
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
    /// the QP open, room for the batch, and records that do not wrap
    /// around the ring's end (otherwise the batch is copied and staged).
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
            users,
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
        let at = (credits.next_seq() as usize) & users.len().wrapping_sub(1);
        if at + n > users.len() || at + n > credits.records_mut().len() {
            // The batch wraps around the ring's end: copied and staged.
            return self.ring_copied(st, i, id, wrs, force_last);
        }
        self.place(
            qp,
            credits,
            users,
            vqps.at(i),
            stats,
            sole,
            id,
            wrs,
            force_last,
        )
    }

    /// The doorbell of a VQP (`v`, id `id`) alone on the QP, for `wrs`
    /// that fit in the send queue and whose records (from the next
    /// sequence on) do not wrap around the ring's end (the callers
    /// checked both): the records get only the physical wr_id and the
    /// flags (what the account and the routing read), and the caller's
    /// WRs themselves carry the physical wr_ids (and the forced signal)
    /// to the NIC, put back as they were once it took them.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn place(
        &self,
        qp: &N::Qp,
        credits: &mut SendQueueCredits<SendWr>,
        users: &mut [Beside],
        v: &mut VqpState,
        stats: &mut DciStats,
        sole: &mut u32,
        id: VqpId,
        wrs: &mut [SendWr],
        force_last: bool,
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        let first = credits.next_seq();
        let at = (first as usize) & users.len().wrapping_sub(1);
        let end = at + n;
        let (slots, recs) = (&mut users[at..end], &mut credits.records_mut()[at..end]);
        for k in 0..n {
            let wr = &mut wrs[k];
            let phys = PhysWrId::new(id, first + k as u64).raw();
            slots[k] = Beside {
                slot: Slot {
                    user_wr_id: wr.wr_id,
                    user_signaled: wr.is_signaled(),
                },
                kept: false,
            };
            recs[k].wr_id = phys;
            recs[k].flags = wr.flags;
            wr.wr_id = phys;
        }
        let mut restore_flags = None;
        if force_last {
            let last = &mut wrs[n - 1];
            restore_flags = Some(last.flags);
            last.flags = last.flags | SendFlags::SIGNALED;
            recs[n - 1].flags = last.flags;
        }
        let result = qp.post_send(wrs);
        // The caller's WRs as they were (but `dest`); the signaled ones
        // counted on the way (for the commit).
        let (mut signaled, mut newest) = (0u32, None);
        for k in 0..n {
            let slot = slots[k].slot;
            wrs[k].wr_id = slot.user_wr_id;
            if slot.user_signaled {
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

    /// [`PhysQp::place`] of `n` WRs (the last forced signaled if
    /// `force_last`) when the NIC refused them from `e.index` on: the
    /// ones it took are committed and counted.
    #[cold]
    #[inline(never)]
    fn placed_in_part(
        credits: &mut SendQueueCredits<SendWr>,
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

    /// [`PhysQp::ring_doorbell`] with other VQPs' WRs outstanding (or a
    /// batch whose records wrap around the ring's end): copies the `wrs`
    /// into the QP's records (physical wr_ids, the users' wr_ids and flags
    /// beside them), which recovery may re-post, and rings the doorbell on
    /// the records.
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
            users,
            vqps,
            stats,
            sole,
            ..
        } = st;
        // A reclaim that ran into an error may have closed an RC pair.
        let Some(qp) = qp else {
            return Err(closed());
        };
        // (A VQP alone on the QP comes here when its batch wraps around
        // the ring's end: it stays alone.)
        let alone = credits.outstanding() == 0 || *sole == id.get();
        let first = credits.next_seq();
        // The pre-check left room for the batch (reclaiming if needed).
        let staged = credits.stage(n).map_err(VqpError::from)?;
        let mask = users.len() - 1;
        // One copy of the batch (not one per WR), then the wr_ids; the
        // signaled WRs are counted on the way (for the commit).
        staged.copy_from_slice(wrs);
        let (mut signaled, mut newest) = (0u32, None);
        for (k, (rec, wr)) in staged.iter_mut().zip(wrs).enumerate() {
            let seq = first + k as u64;
            rec.wr_id = PhysWrId::new(id, seq).raw();
            let user_signaled = wr.is_signaled();
            users[(seq as usize) & mask] = Beside {
                slot: Slot {
                    user_wr_id: wr.wr_id,
                    user_signaled,
                },
                kept: true,
            };
            if user_signaled {
                signaled += 1;
                newest = Some(k);
            }
        }
        if force_last {
            if let Some(last) = staged.last_mut() {
                signaled += u32::from(!last.is_signaled());
                last.flags = last.flags | SendFlags::SIGNALED;
                newest = Some(n - 1);
            }
        }
        let result = qp.post_send(staged);
        let posted = match &result {
            Ok(()) => {
                credits.commit_counted(n, signaled, newest);
                n
            }
            Err(e) => {
                let posted = e.index.min(n);
                credits.commit(posted);
                posted
            }
        };
        if posted > 0 {
            *sole = if alone { id.get() } else { NO_SOLE };
            vqps.at(i).outstanding += posted as u32;
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

    /// Polls up to `out.len()` completions of the VQP `id` (see
    /// [`crate::engine::Vqp::poll`]): its ring first, then the CQ drained
    /// and routed. `None` when this QP does not hold the VQP's state.
    ///
    /// The synchronous case is inlined: one CQE, this VQP's own success
    /// for the oldest WR on the QP, which retires only itself (no other
    /// VQP's WR is involved, nothing to route). Anything else continues in
    /// [`PhysQp::poll_rest`], the CQE already read handed over.
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
            users,
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
            return self.poll_rest(eng, st, id, out, n, None);
        }
        // One CQE, read straight into the caller's next entry (rewritten
        // in place into the user's completion below, or handed on).
        match self.cq.poll(&mut out[n..=n]) {
            Ok(0) => return Ok(Some(n)),
            Ok(_) => {}
            Err(e) if n == 0 => return Err(VqpError::nic("poll a shared QP's CQ")(e)),
            Err(_) => return Ok(Some(n)),
        }
        // This VQP's success, retiring only its own WRs: the oldest one
        // on the QP, or any while all outstanding WRs are its own.
        let wc = &mut out[n];
        let wr_id = PhysWrId::from_raw(wc.wr_id);
        let head = credits.head();
        let retired = if wc.status.is_ok() && wr_id.vqp() == id {
            credits.retire_signaled(wr_id, *sole == id.get())
        } else {
            None
        };
        let Some(seq) = retired else {
            let wc = *wc;
            return self.poll_rest(eng, st, id, out, n, Some(wc));
        };
        // `route` then `deliver`, for a success into `out` (the ring is
        // empty, there is room): the earlier WRs were unsignaled and only
        // leave the count.
        stats.completions += 1;
        let retired = (seq - head) as u32 + 1;
        let mut n = n;
        match v.outstanding.checked_sub(retired) {
            Some(left) => {
                v.outstanding = left;
                let slot = users[(seq as usize) & users.len().wrapping_sub(1)].slot;
                if slot.user_signaled {
                    // The user's completion: status, opcode and length as
                    // polled.
                    wc.wr_id = slot.user_wr_id;
                    wc.imm = None;
                    wc.qp_num = id.get();
                    wc.src_qp = 0;
                    n += 1;
                }
            }
            // Retired, but of an earlier attachment (see `deliver`):
            // nothing to deliver.
            None => {
                stats.orphaned += u64::from(retired - v.outstanding);
                v.outstanding = 0;
            }
        }
        if n == out.len() {
            return Ok(Some(n));
        }
        self.poll_rest(eng, st, id, out, n, None)
    }

    /// The rest of [`PhysQp::poll`]: `n` entries of `out` filled, the
    /// VQP's ring empty; `polled` a CQE read and not yet applied. Routes it,
    /// then drains the CQ into `out` (recovering the QP if needed).
    #[cold]
    #[inline(never)]
    fn poll_rest(
        &self,
        eng: &EngineInner<N>,
        st: &mut PhysState<N>,
        id: VqpId,
        out: &mut [Wc],
        n: usize,
        polled: Option<Wc>,
    ) -> Result<Option<usize>, VqpError> {
        let mut sink = Sink { vqp: id, out, n };
        if let Some(wc) = polled {
            // Routed as the drain would.
            route(&eng.cache, st, &wc, Some(&mut sink));
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
    fn drain(&self, eng: &EngineInner<N>, st: &mut PhysState<N>) -> Result<usize, VqpError> {
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

    /// Brings a QP that reported an error back to RTS (see the module docs).
    fn recover(&self, eng: &EngineInner<N>, st: &mut PhysState<N>) -> Result<(), VqpError> {
        let mut buf = [Wc::default(); POLL_BATCH];
        // The failing WR was delivered to its owner when its completion was
        // routed; the NIC flushes every later WR (none of them executed).
        // Reset: the flush completions still to come match nothing.
        if let Some(qp) = &st.qp {
            qp.modify(Transition::Reset)
                .map_err(VqpError::nic("reset a shared QP"))?;
        }
        let guilty = st.guilty.take();
        let PhysState {
            credits,
            users,
            vqps,
            stats,
            ..
        } = &mut *st;
        // The failing VQP's later WRs are flushed, as on a QP of its own;
        // every other VQP's are posted again, in their order (their records
        // are copied out: the re-post writes new records over them).
        let mask = users.len() - 1;
        let mut again: Vec<(SendWr, Slot)> = Vec::new();
        for seq in credits.reset_range() {
            let wr = *credits.record(seq);
            let Beside { slot, kept } = users[(seq as usize) & mask];
            let owner = PhysWrId::from_raw(wr.wr_id).vqp();
            // Never a WR posted in place (see `Beside::kept`); should one
            // come here, it is reported flushed, never re-posted from a
            // partial record.
            debug_assert!(kept || Some(owner) == guilty, "re-post of a WR not kept");
            match vqps.get_mut(owner) {
                Some(_) if Some(owner) != guilty && kept => again.push((wr, slot)),
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
            (Some(qp), Link::Rc(l)) => match super::rc::pair_up(eng, qp, l.handshake) {
                Ok(nonce) => {
                    st.nonce = nonce;
                    true
                }
                Err(_) => {
                    // The target did not answer (or the QP could not be
                    // brought up): close the pair. Its VQPs re-bind on their
                    // next post, and fail, typed, while the target is gone.
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
        self.repost(eng, st, &again);
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
            users,
            stats,
            ..
        } = &mut *st;
        let mask = users.len() - 1;
        let first = credits.next_seq();
        // After the reset every credit is free, and the spare records fit
        // any batch up to the depth.
        let (Some(qp), Ok(staged)) = (qp.as_ref(), credits.stage(again.len())) else {
            return self.flush_all(eng, st, again);
        };
        for (i, (rec, (wr, slot))) in staged.iter_mut().zip(again).enumerate() {
            let seq = first + i as u64;
            *rec = *wr;
            rec.wr_id = PhysWrId::new(PhysWrId::from_raw(wr.wr_id).vqp(), seq).raw();
            users[(seq as usize) & mask] = Beside {
                slot: *slot,
                kept: true,
            };
        }
        if let Some(last) = staged.last_mut() {
            last.flags = last.flags | SendFlags::SIGNALED;
        }
        let posted = match qp.post_send(staged) {
            Ok(()) => again.len(),
            Err(e) => e.index.min(again.len()),
        };
        credits.commit(posted);
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

impl RcLink {
    /// Marks the pair most recently used (exact LRU): a load of the shared
    /// tick, and a bump only when another pair was used since this one.
    fn touch(&self, tick: &AtomicU64) {
        let now = tick.load(Ordering::Relaxed);
        if self.used.load(Ordering::Relaxed) != now {
            self.used
                .store(tick.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
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
        users,
        vqps,
        stats,
        needs_recovery,
        guilty,
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
    let slot = users[(last as usize) & (users.len() - 1)].slot;
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
fn deliver(
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

/// The owned-MR snapshot with the last lookup remembered (see
/// `PhysState::last_mr`).
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
