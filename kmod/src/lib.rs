//! # krcore-kmod: the KRCore control plane engine
//!
//! The "kernel module" of KRCore (USENIX ATC'22): virtual QPs (VQPs) over a
//! pool of shared, pre-initialized DC queue pairs. This crate holds the
//! engine's provider-independent pieces; the parts that drive a
//! [`krcore_nic::Nic`] are built on them.
//!
//! ```text
//! sdk (Vqp, MemoryRegion, completions)
//!   |
//! kmod engine ------------------------------------------------ no I/O, no clock
//!   |  dccache   Gid -> DC target metadata, node-wide, lock-free reads
//!   |  precheck  Algorithm 2: validity, capacity, signaling of a VQP's batch
//!   |  wrid      physical wr_id = (VQP id, sequence); per-VQP slot tables
//!   |  credits   send-queue credits of one shared physical QP
//!   |
//! host (later: pools, VQP table, CQ polling) -- threads, clocks, the provider
//!   |
//! krcore_nic::Nic (sim, verbs)
//! ```
//!
//! # The pieces
//!
//! - [`dccache`]: [`DcCache`], the bounded cache from a target's GID to its
//!   `dct_num`/`dc_key` and meta epoch; `connect` is a lookup here, a miss
//!   costs one meta-server READ. 34 bytes per target, fixed at construction.
//! - [`precheck`]: [`Precheck::check`] turns a VQP's batch into a typed
//!   [`Rejection`] (the batch never reaches the NIC) or a [`Plan`]: poll first
//!   to reclaim credits, and which WR to force signaled.
//! - [`wrid`]: [`PhysWrId`] packs (VQP id, sequence) into the 64-bit `wr_id`
//!   the NIC sees; a VQP's [`SlotTable`] maps the sequence back to the user's
//!   `wr_id` and whether the user asked for a completion.
//! - [`credits`]: [`SendQueueCredits`] accounts a physical send queue: a
//!   signaled completion credits every WR before it, including other VQPs'
//!   unsignaled WRs, and impossible completions are typed errors.
//!
//! Each module documents its invariants; each is tested against a reference
//! model.
//!
//! # Engine rules
//!
//! - **No I/O, no clock, no threads.** The engine takes inputs (`now`
//!   included) and returns decisions; the host polls, posts and sleeps. This
//!   keeps every test deterministic.
//! - **No process-global state**, so that the engine can later be hosted by a
//!   node-wide daemon.
//! - **No `unsafe`** (`#![forbid(unsafe_code)]`).
//!
//! # Thread safety
//!
//! [`DcCache`] is `Sync` and meant to be shared (`Arc`) by every VQP of a
//! node: reads take no lock, writers are serialized per bucket. The other
//! pieces are plain values with `&mut self` updates, owned by whoever owns the
//! physical QP or the VQP (behind that owner's lock or on its thread).
//!
//! # Example: one batch through the pieces
//!
//! ```
//! use std::collections::HashMap;
//! use std::time::Instant;
//! use krcore_kmod::{
//!     DcCache, LocalMr, NoGrants, PhysWrId, Policy, Precheck, SendQueueCredits, SlotTable,
//!     Transport, VqpId,
//! };
//! use krcore_nic::{Access, DcTarget, Destination, Gid, RemoteAddr, SendWr, Sge, WcStatus};
//!
//! // connect: resolve the target through the DCCache (a miss would READ the
//! // meta server and insert what it found).
//! let cache = DcCache::new(1024);
//! let target = DcTarget { gid: Gid([1; 16]), dct_num: 42, dc_key: 7 };
//! cache.insert(target, 1);
//! let hit = cache.get(&target.gid).expect("cached");
//!
//! // post: pre-check a VQP's batch against the shared physical QP.
//! let vqp = VqpId::new(1)?;
//! let mut slots = SlotTable::new(64);
//! let mut sq = SendQueueCredits::new(128);
//! let mrs = HashMap::from([(0x10, LocalMr { addr: 0x1000, len: 4096, access: Access::LOCAL_WRITE })]);
//! let local = Sge { addr: 0x1000, length: 64, lkey: 0x10 };
//! let user = [SendWr::read(7, local, RemoteAddr { addr: 0x9000, rkey: 3 })
//!     .to(Destination::Dc(hit.target))];
//! let check = Precheck {
//!     transport: Transport::Dc,
//!     peer: None,
//!     local_mrs: &mrs,
//!     grants: &NoGrants,
//!     now: Instant::now(),
//!     queue: sq.view(),
//!     policy: Policy::default(),
//! };
//! let plan = check.check(&user)?;
//! assert!(!plan.must_reclaim());
//!
//! // Swap in physical wr_ids, keeping the user's in the slot table.
//! let mut phys = user;
//! for wr in &mut phys {
//!     let seq = slots.push(wr.wr_id, wr.is_signaled())?;
//!     wr.wr_id = PhysWrId::new(vqp, seq).raw();
//! }
//! plan.apply(&mut phys);
//! sq.post_wrs(&phys)?;
//! // ... the host calls `qp.post_send(&phys)` and polls the CQ ...
//!
//! // A polled completion credits the queue and is routed to its VQP.
//! let polled = PhysWrId::from_raw(phys[0].wr_id);
//! let mut delivered = Vec::new();
//! for (_, posted) in sq.complete_wr_id(polled, WcStatus::Success)? {
//!     assert_eq!(posted.wr_id.vqp(), vqp);
//!     let seq = slots.resolve(posted.wr_id.wire_seq()).expect("outstanding");
//!     for (_, slot) in slots.retire_through(seq)? {
//!         if slot.user_signaled {
//!             delivered.push(slot.user_wr_id);
//!         }
//!     }
//! }
//! assert_eq!(delivered, [7]);
//! assert_eq!(sq.free(), 128);
//! # Ok::<(), krcore_kmod::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod credits;
pub mod dccache;
pub mod engine;
pub mod local_meta;
pub mod precheck;
mod sync;
pub mod wrid;

pub use engine::{
    DciStats, Engine, EngineConfig, EngineError, EngineStats, MetaFailure, MetaLocation, MetaStats,
    OwnedMr, Vqp, VqpError, DCIS_PER_CPU, DEFAULT_DC_KEY,
};
pub use local_meta::LocalMetaServer;

pub use credits::{CreditError, PostedWr, QueueView, SendQueueCredits};
pub use dccache::{CachedTarget, DcCache, Insert, Lookup, MetaEpoch};
pub use precheck::{
    LocalMr, LocalMrTable, NoGrants, OpKind, Plan, Policy, Precheck, Reason, Rejection,
    RemoteGrant, RemoteGrants, Transport,
};
pub use wrid::{PhysWrId, Slot, SlotTable, VqpId, WrIdError};

/// Any error of the engine's pieces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Encoding a wr_id or updating a VQP's slot table failed.
    #[error("wr_id routing: {0}")]
    WrId(#[from] WrIdError),
    /// A post or completion is inconsistent with the send-queue account.
    #[error("send-queue credits: {0}")]
    Credit(#[from] CreditError),
    /// The pre-check rejected a batch.
    #[error("pre-check: {0}")]
    Rejected(#[from] Rejection),
}

/// Result of the engine's fallible operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
