//! The state of one shared QP ([`SharedQp`]), the record of a WR
//! ([`Rec`]), the QP's shape, statistics and refusals, and the doorbell
//! the host hands in (see the parent module's docs; the methods are in
//! `stage.rs`, `route.rs` and `recover.rs`).

use std::time::Instant;

use krcore_nic::{Gid, PostError, SendWr};

use crate::credits::{CreditError, Posted, SendQueueCredits};
use crate::idhash::IdMap;
use crate::precheck::{LocalMr, LocalMrTable, MrWindows, Policy, Rejection};
use crate::wrid::{PhysWrId, Slot, VqpId};

use super::vqps::{VqpState, VqpTable};

/// `SharedQp::sole` when no VQP is known to own every outstanding WR: no
/// VQP id is this wide ([`crate::wrid::VQP_ID_BITS`] < 32).
pub(crate) const NO_SOLE: u32 = u32::MAX;
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

/// The host's doorbell: hands the WRs the core staged to the NIC
/// (`post_send` on the QP), once per post. Any
/// `FnMut(&mut [SendWr]) -> Result<(), PostError>` is one; the engine's is
/// a small struct whose method is inlined into the post.
pub trait Doorbell {
    /// Gives `wrs` to the NIC: `Err` with the index of the first WR it did
    /// not take.
    fn ring(&mut self, wrs: &mut [SendWr]) -> Result<(), PostError>;
}

impl<F: FnMut(&mut [SendWr]) -> Result<(), PostError>> Doorbell for F {
    #[inline(always)]
    fn ring(&mut self, wrs: &mut [SendWr]) -> Result<(), PostError> {
        self(wrs)
    }
}

/// Why the core refused a post (the host turns each into its typed error).
#[derive(Debug)]
pub enum Refusal {
    /// The QP does not hold the VQP's state (it moved), or an RC pair's
    /// target is no longer the VQP's: re-read the binding. Nothing posted.
    Stale,
    /// The VQP has no target.
    NotConnected {
        /// The VQP.
        vqp: VqpId,
    },
    /// The pre-check refused the batch.
    Rejected(Rejection),
    /// The VQP has no room for the batch.
    VqpFull {
        /// The VQP.
        vqp: VqpId,
        /// Its WRs in flight plus its completions not yet polled.
        outstanding: u32,
        /// WRs in the batch.
        requested: usize,
        /// Its capacity.
        capacity: u32,
    },
    /// The send queue has no room for the batch.
    Credit(CreditError),
    /// The NIC refused the doorbell from `index` on; the WRs before it
    /// were taken and are committed.
    Post(PostError),
}

/// The fixed shape of a shared QP: its queue and what its pre-check does.
#[derive(Clone, Copy, Debug)]
pub struct QpShape {
    /// The send queue's depth.
    pub depth: u32,
    /// The pre-check is on (else every batch is planned unvalidated).
    pub precheck: bool,
    /// The pre-check's policy (the same one is handed to each
    /// [`SharedQp::plan`]).
    pub policy: Policy,
    /// `None`: a DC initiator (any target, named per WR); `Some(gid)`: the
    /// RC QP of the pair with `gid`.
    pub peer: Option<Gid>,
}

/// An immutable snapshot of the owned MRs, by lkey: the pre-check's local
/// table (the host refreshes it when the MR generation moves).
#[derive(Debug, Clone, Default)]
pub(crate) struct MrSnapshot(pub(crate) std::sync::Arc<IdMap<u32, LocalMr>>);

impl LocalMrTable for MrSnapshot {
    fn lookup(&self, lkey: u32) -> Option<LocalMr> {
        self.0.get(&lkey).copied()
    }
}

/// Lets every lkey through, covering all memory with every access: the
/// table used when the pre-check is disabled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnyMr;

impl LocalMrTable for AnyMr {
    fn lookup(&self, _lkey: u32) -> Option<LocalMr> {
        Some(LocalMr {
            addr: 0,
            len: u64::MAX,
            access: krcore_nic::Access::ALL,
        })
    }
}

/// The record of one WR on the QP, at its physical sequence in the
/// account (see the module docs): what the account, the routing and
/// recovery read of it, in one place.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Rec {
    /// The physical wr_id it was posted with.
    pub(super) wr_id: u64,
    /// The user's wr_id.
    pub(super) user_wr_id: u64,
    /// The user signaled it (asked for its completion).
    pub(super) user_signaled: bool,
    /// [`Rec::SIGNALED`] and [`Rec::KEPT`] (one byte: a WR posted in place,
    /// as the user signaled it, has the flags `user_signaled as u8`).
    pub(super) flags: u8,
}

impl Rec {
    /// Posted signaled (a forced signal included): what the account reads.
    pub(super) const SIGNALED: u8 = 1;
    /// `SharedQp::copies` holds the whole WR as posted, at the record's
    /// index (recovery may re-post it). Not for a WR posted in place while
    /// every outstanding WR on the QP was its VQP's: nothing else of it is
    /// kept. Recovery never re-posts such a WR: it re-posts only WRs after
    /// the failing one, and of another VQP than the failing one's; but the
    /// failing WR, posted before it, was still outstanding when it was
    /// posted (its completion starts recovery under the same lock), hence
    /// of the same VQP.
    pub(super) const KEPT: u8 = 4;

    /// The record of a WR posted signaled or not (`signaled`), with the
    /// user's wr_id and signal flag, kept or not.
    #[inline(always)]
    pub(super) fn new(
        wr_id: u64,
        user_wr_id: u64,
        signaled: bool,
        user_signaled: bool,
        kept: bool,
    ) -> Rec {
        Rec {
            wr_id,
            user_wr_id,
            user_signaled,
            flags: (u8::from(signaled) * Rec::SIGNALED) | (u8::from(kept) * Rec::KEPT),
        }
    }

    /// The whole WR is kept (see [`Rec::KEPT`]).
    #[inline]
    pub(super) fn kept(&self) -> bool {
        self.flags & Rec::KEPT != 0
    }

    /// The user's wr_id and signal flag.
    #[inline]
    pub(super) fn slot(&self) -> Slot {
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

/// The state of one shared physical QP (see the module docs): held by its
/// host under the QP's one lock.
pub struct SharedQp {
    /// The account of the send queue, keeping ONE record per WR ([`Rec`]),
    /// `L` of them (a power of two, no spare records): sequence `s` at
    /// `s & (L - 1)`.
    pub(super) credits: SendQueueCredits<Rec>,
    /// The WRs posted by copy (and re-posts) as they went to the NIC
    /// (physical wr_id, forced signal), at their records' indices: the
    /// doorbell rings on them, and recovery re-posts from them (the
    /// records say which are kept, [`Rec::kept`]). `2L - 1` of them: a
    /// batch (at most the depth, `<= L`) is staged contiguously from its
    /// first index, past `L` where the ring wraps, and that part is moved
    /// to the front once posted ([`settle_copies`]).
    pub(super) copies: Box<[SendWr]>,
    /// The state of every VQP bound to this QP.
    pub(super) vqps: VqpTable,
    /// `v.get()`: every outstanding WR is the VQP `v`'s (kept by every
    /// post; a re-post after recovery clears it to [`NO_SOLE`]). Lets a
    /// poll by `v` apply a completion that retires several WRs without
    /// routing each. (A raw id, compared in one instruction.)
    pub(super) sole: u32,
    /// The MR generation `mrs` was taken at.
    pub(super) mr_generation: u64,
    pub(super) mrs: MrSnapshot,
    /// The last MR the pre-check looked up in `mrs` (posts mostly reuse
    /// one MR): spares the hash lookup. Cleared with the snapshot.
    pub(super) last_mr: Option<(u32, LocalMr)>,
    /// The windows (`MrWindow::of`) of the last two distinct MRs of `mrs`
    /// the pre-check left in `last_mr` ([`MrWindows`]: a VQP's READ buffer
    /// and the SDK's scratch MR for its atomics), kept (set by the
    /// pre-check that sets `last_mr`) so that the fast path does not
    /// rebuild them per post; also the fast path's gate. Invariants: only
    /// MRs of the current snapshot `mrs` (cleared with it); `Some` only
    /// while `fast` is set and `needs_recovery` is not (the completion that
    /// sets `needs_recovery` clears it; the next general post's pre-check
    /// sets it again), so that the fast path checks neither.
    pub(super) window: Option<MrWindows>,
    pub(super) needs_recovery: bool,
    /// Sequences below it may be WRs of VQPs detached with WRs in flight
    /// (a VQP dropped right after a post: the messaging's answers to an
    /// Open). Such a VQP polls no more, so an error of its WR (a dead
    /// target) would leave the QP in ERR unseen, and every WR posted behind
    /// it would be flushed. Until all of them retired (`credits.head() >=
    /// orphans_until`) posts take the general path, which drains the CQ
    /// first (recovering the QP if one failed), and the fast path's gate
    /// `window` stays `None`.
    pub(super) orphans_until: u64,
    /// The VQP whose WR failed first and put the QP in ERR (recovery
    /// reports its flushed WRs to it and re-posts everybody else's).
    pub(super) guilty: Option<VqpId>,
    pub(super) stats: DciStats,
    /// Any instant: the `now` handed to the pre-check when the VQP knows no
    /// grants (nothing can expire then).
    pub(super) epoch: Instant,
    /// The pre-check is on and the policy takes SGEs: posts may take the
    /// fast path ([`SharedQp::post_fast`]).
    pub(super) fast: bool,
    /// [`Policy::max_batch`] of the queue.
    pub(super) max_batch: u32,
    /// [`Policy::effective_max_unsignaled`] of the queue.
    pub(super) max_unsignaled: u32,
    /// [`QpShape::precheck`].
    pub(super) precheck: bool,
    /// [`QpShape::peer`].
    pub(super) peer: Option<Gid>,
}

impl std::fmt::Debug for SharedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedQp")
            .field("next_seq", &self.credits.next_seq())
            .field("outstanding", &self.credits.outstanding())
            .field("sole", &self.sole)
            .field("needs_recovery", &self.needs_recovery)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl SharedQp {
    /// The state of a new shared QP of `shape`, nothing posted. `epoch`:
    /// any instant (see `SharedQp::epoch`).
    pub fn new(shape: QpShape, epoch: Instant) -> SharedQp {
        let depth = shape.depth;
        let ring_len = depth.next_power_of_two();
        SharedQp {
            // No spare records: `ring_len` of them.
            credits: SendQueueCredits::with_records(depth, 0, Rec::default()),
            // Spare copies: any batch up to the depth is staged
            // contiguously where the ring wraps.
            copies: vec![
                SendWr::read(0, Default::default(), Default::default());
                2 * ring_len as usize - 1
            ]
            .into_boxed_slice(),
            vqps: VqpTable::default(),
            sole: NO_SOLE,
            mr_generation: u64::MAX,
            mrs: MrSnapshot::default(),
            last_mr: None,
            window: None,
            needs_recovery: false,
            orphans_until: 0,
            guilty: None,
            stats: DciStats::default(),
            epoch,
            fast: shape.precheck && shape.policy.max_sge > 0,
            max_batch: shape.policy.max_batch(depth),
            max_unsignaled: shape.policy.effective_max_unsignaled(depth),
            precheck: shape.precheck,
            peer: shape.peer,
        }
    }

    /// Hands the VQP `id`'s state to this QP.
    pub fn attach(&mut self, id: VqpId, vqp: VqpState) {
        self.vqps.insert(id, vqp);
    }

    /// Takes the VQP `id`'s state back (completions of its WRs still in
    /// flight are then discarded: they complete as orphans).
    pub fn detach(&mut self, id: VqpId) -> Option<VqpState> {
        let v = self.vqps.remove(id)?;
        if v.outstanding > 0 {
            // The next post looks for them first (see
            // `SharedQp::orphans_until`).
            self.orphans_until = self.credits.next_seq();
            self.window = None;
        }
        Some(v)
    }

    /// Takes the VQP `id`'s state back only if none of its WRs is in
    /// flight (the DC -> RC upgrade's switch): `Some(Err(outstanding))`
    /// otherwise, `None` when this QP does not hold it.
    pub fn detach_drained(&mut self, id: VqpId) -> Option<Result<VqpState, u32>> {
        let n = self.vqps.get(id)?.outstanding;
        if n > 0 {
            return Some(Err(n));
        }
        self.vqps.remove(id).map(Ok)
    }

    /// The state of the VQP `id`, if this QP holds it.
    pub fn vqp_mut(&mut self, id: VqpId) -> Option<&mut VqpState> {
        self.vqps.get_mut(id)
    }

    /// The QP's statistics.
    pub fn stats(&self) -> DciStats {
        self.stats
    }

    /// Counts a pair closed because its target did not answer.
    pub fn note_lost(&mut self) {
        self.stats.lost += 1;
    }

    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> u32 {
        self.credits.outstanding()
    }

    /// Credits free in the send queue.
    pub fn free(&self) -> u32 {
        self.credits.free()
    }

    /// An error completion was routed: the QP is in ERR and must be
    /// recovered ([`SharedQp::reset`]) before anything else is posted.
    #[inline]
    pub fn needs_recovery(&self) -> bool {
        self.needs_recovery
    }

    /// WRs of detached VQPs may still be in flight (see
    /// `SharedQp::orphans_until`).
    #[inline]
    pub(crate) fn orphans_in_flight(&self) -> bool {
        self.orphans_until > self.credits.head()
    }

    /// The MR generation the snapshot is of.
    #[inline]
    pub(crate) fn mr_generation(&self) -> u64 {
        self.mr_generation
    }

    /// A new snapshot of the owned MRs, of `generation`: the pre-check's
    /// memos of the old one go.
    pub(crate) fn set_mrs(&mut self, generation: u64, mrs: MrSnapshot) {
        self.mr_generation = generation;
        self.mrs = mrs;
        self.last_mr = None;
        self.window = None;
    }
}

/// Where the copies of `n` WRs from sequence `first` on are staged
/// (contiguous; see `SharedQp::copies`): their range in `copies`, for a
/// ring of `len` records.
#[inline]
pub(super) fn copies_range(first: u64, n: usize, len: usize) -> std::ops::Range<usize> {
    let at = (first as usize) & (len - 1);
    at..at + n
}

/// After the doorbell: the copies of the `posted` WRs staged from sequence
/// `first` on ([`copies_range`]) that went past the ring's `len` records
/// move to the front, where their records' indices are (those copies
/// belong to no outstanding WR: the batch had the credits).
#[inline]
pub(super) fn settle_copies(copies: &mut [SendWr], first: u64, posted: usize, len: usize) {
    let end = copies_range(first, posted, len).end;
    if end > len {
        copies.copy_within(len..end, 0);
    }
}
