//! A QP's caches of what its WRs reach: the last target node, a validated
//! destination QP, resolved MRs and mapped segments (`exec` fills and
//! checks them). A leaf below the QP's state, which holds one.

use super::ctl;
use super::shm::Segment;
use crate::types::*;
use std::sync::Arc;

/// The last target node a QP reached, so that the common case (the same
/// target again) costs no map lookup.
pub(crate) struct CachedNode {
    pub(super) gid: Gid,
    /// For a host's GID, the QP number the node was found by (a host's
    /// nodes share its GID); 0 for a node's own GID.
    pub(super) qpn: u32,
    pub(super) slot: u32,
    pub(super) gen: u32,
    /// The node's control block; `None` only while a WR borrows it (moved
    /// out and back: no reference-count traffic per WR).
    pub(super) ctl: Option<Arc<Segment>>,
    pub(super) checked_ns: u64,
    /// Our pid when the node was found to live in this process (0: it does
    /// not). Compared with the current pid, so a forked child re-checks.
    pub(super) local_pid: u32,
}

/// A destination QP validated for this initiator, kept while its state word
/// (generation, type, state) is unchanged: its PD, access flags, peer, keys
/// change only together with a transition.
#[derive(Clone, Copy)]
pub(super) struct CachedDst {
    pub(super) node: u64,
    pub(super) qpn: u32,
    pub(super) state: u64,
    pub(super) pd: u32,
    pub(super) access: Access,
    /// The destination's key (a DCT's `dc_key`, a UD QP's qkey; 0 for RC),
    /// fixed for the state word's generation; checked against every WR.
    pub(super) key: u64,
}

/// A resolved MR, kept while the MR's state word is unchanged (its fields
/// change only while it is invalid; re-registration bumps the generation).
pub(super) struct CachedMr {
    pub(super) node: u64,
    pub(super) key: u32,
    pub(super) state: u64,
    pub(super) info: ctl::MrInfo,
    pub(super) seg: Arc<Segment>,
    /// A strict MR's node control block and state word (see
    /// [`Exec::mr_strict`], [`Exec::uncount`]); `state` is then `u64::MAX`.
    pub(super) strict: Option<(Arc<Segment>, u64)>,
}

pub(super) const SEG_CACHE: usize = 8;
/// Target nodes kept besides the current one: a DCI that takes turns
/// between a few memory nodes finds each again without resolving it (a
/// map lookup, and for a node of another process a read of its
/// `/proc/PID/stat`).
pub(super) const SPARE_NODES: usize = 3;
/// A power of two (the home entry is a mask of the key's hash), at most 16
/// (`TargetCache::pinned` has a bit per entry).
pub(super) const MR_CACHE: usize = 16;
const _: () = assert!(MR_CACHE.is_power_of_two() && MR_CACHE <= 16);

/// Per-QP caches of resolved nodes, destination QPs, MRs and segments.
#[derive(Default)]
pub(crate) struct TargetCache {
    /// The current target node (the last one reached).
    pub(super) node: Option<CachedNode>,
    /// Earlier target nodes, swapped back in when reached again.
    pub(super) spare: [Option<CachedNode>; SPARE_NODES],
    pub(super) spare_next: usize,
    pub(super) dst: Option<CachedDst>,
    pub(super) mrs: [Option<CachedMr>; MR_CACHE],
    pub(super) mr_next: usize,
    /// MR cache entries used by the WR being executed (never evicted by it).
    pub(super) pinned: u16,
    /// Of those, the strict ones this WR counted itself in flight on
    /// (`ctl::mr_in_flight`), to take off when it is done.
    pub(super) counted: u16,
    pub(super) segs: [Option<(u128, Arc<Segment>)>; SEG_CACHE],
    pub(super) seg_next: usize,
}

pub(super) fn seg_key(slot: u32, gen: u32, kind: u8, idx: u32, objgen: u32) -> u128 {
    (slot as u128) << 96
        | (gen as u128) << 64
        | (kind as u128) << 56
        | (idx as u128) << 32
        | objgen as u128
}

/// The preferred MR cache entry of `(node, key)`.
#[inline(always)]
pub(super) fn mr_home(node: u64, key: u32) -> usize {
    ((key >> 8) ^ key ^ (node >> 32) as u32) as usize & (MR_CACHE - 1)
}

pub(super) fn node_key(slot: u32, gen: u32) -> u64 {
    (slot as u64) << 32 | gen as u64
}
