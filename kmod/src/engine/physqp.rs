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
//! A post of READs/WRITEs of one SGE (or CASes/FAAs of one 8-byte SGE at
//! an aligned remote address) in one of the two MRs the pre-check last
//! looked up, on a DCI or an RC pair with room, is checked inline (`PhysQp::post_fast`: the
//! pre-check's own verdict, computed without its general setup) and goes
//! straight to the doorbell; anything else (and anything it would reject)
//! takes the general path. A poll that reads this VQP's own success
//! retiring only this VQP's WRs (the oldest WR on the QP, or any while
//! `PhysState::sole` says every outstanding WR is this VQP's) applies it
//! inline without routing; anything else is routed in full.
//!
//! # One record per WR
//!
//! Each WR on the QP has ONE record ([`Rec`]: its physical wr_id, whether
//! it was posted signaled, the user's wr_id and signal flag), at its
//! physical sequence (the QP's own count of posted WRs) in the account
//! `credits`. Two ways to post:
//!
//! - A VQP alone on the QP (every outstanding WR its own,
//!   `PhysState::sole`, or none outstanding) posts in place
//!   (`PhysQp::ring_in_place`): each WR gets its record only, the
//!   caller's WRs carry the physical wr_ids `(vqp, sequence)` (and the
//!   forced signal) to the NIC and get their own back right after the
//!   doorbell. No copy of the WR is kept: no recovery can re-post it (see
//!   `Rec::kept`).
//! - Otherwise the batch is copied into `PhysState::copies` (at the same
//!   indices as the records, contiguous even where the ring wraps), the
//!   doorbell rings on the copies themselves, and recovery may re-post
//!   them.
//!
//! Either way the post commits what the NIC took: no per-VQP table, and
//! the caller's WRs are left as they were (but `dest`). A completion finds its
//! record by the sequence bits of its wr_id ([`SendQueueCredits::resolve`],
//! O(1)), which also detects a completion of an old incarnation (its
//! sequence is below every outstanding one).
//!
//! # Invariants
//!
//! - Every WR on the QP was recorded in `credits` (in posting order, its
//!   record holding its user's wr_id and flag) and counted in its VQP's
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

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use krcore_nic::{
    bring_up, Access, Gid, Nic, QpCaps, QpInit, QpType, QueuePair, SendWr, UdTarget, Wc,
};
use parking_lot::Mutex;

use super::error::{EngineError, VqpError};
use super::mrs::{MrSnapshot, PostWords};
use super::vqp::{VqpState, VqpTable};
use super::EngineInner;
use crate::credits::{Posted, SendQueueCredits};
use crate::precheck::{LocalMr, MrWindows};
use crate::wrid::{PhysWrId, Slot, VqpId};

mod poll;
mod post;
mod recover;

/// `PhysQp`'s alignment (its `repr`; a divisor of the page size).
#[cfg(test)]
const PHYS_QP_ALIGN: usize = 1024;

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

/// The record of one WR on the QP, at its physical sequence in the
/// account (see the module docs): what the account, the routing and
/// recovery read of it, in one place.
#[derive(Clone, Copy, Default, Debug)]
struct Rec {
    /// The physical wr_id it was posted with.
    wr_id: u64,
    /// The user's wr_id.
    user_wr_id: u64,
    /// The user signaled it (asked for its completion).
    user_signaled: bool,
    /// [`Rec::SIGNALED`] and [`Rec::KEPT`] (one byte: a WR posted in place,
    /// as the user signaled it, has the flags `user_signaled as u8`).
    flags: u8,
}

impl Rec {
    /// Posted signaled (a forced signal included): what the account reads.
    const SIGNALED: u8 = 1;
    /// `PhysState::copies` holds the whole WR as posted, at the record's
    /// index (recovery may re-post it). Not for a WR posted while every
    /// outstanding WR on the QP was its VQP's ([`PhysQp::ring_in_place`]):
    /// nothing else of it is kept. Recovery never re-posts such a WR: it
    /// re-posts only WRs after the failing one, and of another VQP than
    /// the failing one's; but the failing WR, posted before it, was still
    /// outstanding when it was posted (its completion starts recovery
    /// under the same lock), hence of the same VQP.
    const KEPT: u8 = 4;

    /// The record of a WR posted signaled or not (`signaled`), with the
    /// user's wr_id and signal flag, kept or not.
    #[inline(always)]
    fn new(wr_id: u64, user_wr_id: u64, signaled: bool, user_signaled: bool, kept: bool) -> Rec {
        Rec {
            wr_id,
            user_wr_id,
            user_signaled,
            flags: (u8::from(signaled) * Rec::SIGNALED) | (u8::from(kept) * Rec::KEPT),
        }
    }

    /// The whole WR is kept (see [`Rec::KEPT`]).
    #[inline]
    fn kept(&self) -> bool {
        self.flags & Rec::KEPT != 0
    }

    /// The user's wr_id and signal flag.
    #[inline]
    fn slot(&self) -> Slot {
        Slot {
            user_wr_id: self.user_wr_id,
            user_signaled: self.user_signaled,
        }
    }
}

impl Posted for Rec {
    #[inline]
    fn wr_id(&self) -> PhysWrId {
        PhysWrId::from_raw(self.wr_id)
    }
    #[inline]
    fn signaled(&self) -> bool {
        self.flags & Rec::SIGNALED != 0
    }
}

pub(crate) struct PhysState<N: Nic> {
    /// `None`: an RC pair that was closed (evicted, or lost).
    qp: Option<N::Qp>,
    /// The account of the send queue, keeping ONE record per WR ([`Rec`]),
    /// `L` of them (a power of two, no spare records): sequence `s` at
    /// `s & (L - 1)`.
    credits: SendQueueCredits<Rec>,
    /// The WRs posted by copy ([`PhysQp::ring_copied`], and re-posts) as
    /// they went to the NIC (physical wr_id, forced signal), at their
    /// records' indices: the doorbell rings on them, and recovery re-posts
    /// from them (the records say which are kept, [`Rec::kept`]). `2L - 1`
    /// of them: a batch (at most the depth, `<= L`) is staged
    /// contiguously from its first index, past `L` where the ring wraps,
    /// and that part is moved to the front once posted
    /// ([`settle_copies`]).
    copies: Box<[SendWr]>,
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
    /// The windows (`MrWindow::of`) of the last two distinct MRs
    /// of `mrs` the pre-check left in `last_mr` ([`MrWindows`]: a VQP's
    /// READ buffer and the SDK's scratch MR for its atomics), kept (set by
    /// the pre-check that sets `last_mr`) so that the fast path does not
    /// rebuild them per post; also the fast path's gate. Invariants: only
    /// MRs of the current snapshot `mrs` (cleared with it); `Some` only
    /// while `fast` is set and `needs_recovery` is not (the completion
    /// that sets `needs_recovery` clears it; the next general post's
    /// pre-check sets it again), so that the fast path checks neither.
    window: Option<MrWindows>,
    /// The CQ poll buffer (kept, so that a poll initializes nothing).
    buf: Vec<Wc>,
    needs_recovery: bool,
    /// Sequences below it may be WRs of VQPs detached with WRs in flight
    /// (a VQP dropped right after a post: the messaging's answers to an
    /// Open). Such a VQP polls no more, so an error of its WR (a dead
    /// target) would leave the QP in ERR unseen, and every WR posted
    /// behind it would be flushed. Until all of them retired
    /// (`credits.head() >= orphans_until`) posts take the general path,
    /// which drains the CQ first (recovering the QP if one failed), and
    /// the fast path's gate `window` stays `None`.
    orphans_until: u64,
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

/// Aligned to 1,024 bytes and no larger (`tests::a_shared_qp_lies_in_one_page`): the
/// whole QP, its state and the inline state of a sole VQP (see
/// [`VqpTable`]) lie in ONE page, so that a post or poll touches one page
/// of the engine's own for them (pages touched per operation are dear in
/// an emulated guest, see `krcore_lat`'s docs).
#[repr(align(1024))]
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
    /// The engine's [`PostWords`] (read by every post: the MR
    /// generation, the RC pairs' clock).
    words: Arc<PostWords>,
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
        tracing::debug!(index, qpn = qp.qpn(), "DCI created");
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
            words: eng.words.clone(),
            state: Mutex::new(PhysState {
                qp: Some(qp),
                // No spare records: `ring_len` of them.
                credits: SendQueueCredits::with_records(eng.cfg.dci_depth, 0, Rec::default()),
                // Spare copies: any batch up to the depth is staged
                // contiguously where the ring wraps.
                copies: vec![
                    SendWr::read(0, Default::default(), Default::default());
                    2 * ring_len as usize - 1
                ]
                .into_boxed_slice(),
                vqps: VqpTable::default(),
                sole: NO_SOLE,
                epoch: Instant::now(),
                mr_generation: u64::MAX,
                mrs: MrSnapshot::default(),
                last_mr: None,
                window: None,
                buf: vec![Wc::default(); POLL_BATCH],
                needs_recovery: false,
                orphans_until: 0,
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
        let mut st = self.state.lock();
        let v = st.vqps.remove(id)?;
        if v.outstanding > 0 {
            // Its WRs complete as orphans: the next post looks for them
            // first (see `PhysState::orphans_until`).
            st.orphans_until = st.credits.next_seq();
            st.window = None;
        }
        Some(v)
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
}

/// Where the copies of `n` WRs from sequence `first` on are staged
/// (contiguous; see [`PhysState::copies`]): their range in `copies`, for a
/// ring of `len` records.
#[inline]
fn copies_range(first: u64, n: usize, len: usize) -> std::ops::Range<usize> {
    let at = (first as usize) & (len - 1);
    at..at + n
}

/// After the doorbell: the copies of the `posted` WRs staged from sequence
/// `first` on ([`copies_range`]) that went past the ring's `len` records
/// move to the front, where their records' indices are (those copies
/// belong to no outstanding WR: the batch had the credits).
#[inline]
fn settle_copies(copies: &mut [SendWr], first: u64, posted: usize, len: usize) {
    let end = copies_range(first, posted, len).end;
    if end > len {
        copies.copy_within(len..end, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::{PhysQp, PHYS_QP_ALIGN};

    /// A shared QP never straddles a page: aligned to a divisor of the
    /// page size, and no larger than its alignment.
    fn fits_one_block<N: krcore_nic::Nic>() {
        assert_eq!(std::mem::align_of::<PhysQp<N>>(), PHYS_QP_ALIGN);
        assert_eq!(std::mem::size_of::<PhysQp<N>>(), PHYS_QP_ALIGN);
        assert_eq!(4096 % PHYS_QP_ALIGN, 0);
    }

    #[test]
    fn a_shared_qp_lies_in_one_page() {
        fits_one_block::<krcore_nic::sim::SimNic>();
        #[cfg(feature = "verbs")]
        fits_one_block::<krcore_nic::verbs::VerbsNic>();
    }
}
