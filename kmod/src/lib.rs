//! # krcore-kmod: the KRCore control plane engine
//!
//! The "kernel module" of KRCore (USENIX ATC'22): virtual QPs (VQPs) over a
//! pool of shared, pre-initialized DC queue pairs. This crate holds the
//! engine's provider-independent pieces (pure, no I/O) and the [`engine`]
//! that hosts them in-process over any [`krcore_nic::Nic`].
//!
//! ```text
//! sdk (Vqp, MemoryRegion, completions)
//!   |
//! engine (host) ---------------------------- threads, clocks, the provider
//!   |  Engine<N>  PD, DCI pool (per-QP lock), meta client (READs via DCI 0);
//!   |             DCT+SRQ, messaging (ports, endpoints), the upgrade's
//!   |             handshake port (handshake_msg: no UD QP): created on first need
//!   |             RC fallback (no DC): handshake endpoint, RC pairs (LRU)
//!   |  Vqp<N>     connect = DCCache lookup | one meta READ; post; poll
//!   |             RC fallback: + the target's RC pair (hit | handshake)
//!   |  MsgMetaHost the meta table hosted by an engine (either mode):
//!   |             registration as messages on META_PORT (engine::meta_msg),
//!   |             READ lookups; RcMetaHost: an older RC fallback host
//!   |
//! pure pieces ------------------------------------------- no I/O, no clock
//!   |  dccache   Gid -> DC target metadata, node-wide, lock-free reads
//!   |  precheck  Algorithm 2: validity, capacity, signaling of a VQP's batch
//!   |  wrid      physical wr_id = (VQP id, sequence); user slots
//!   |  sharedqp  the protocol of one shared physical QP: its credits, its
//!   |            VQPs' states, the fast and general post, completion
//!   |            routing, the plan of a recovery (the engine rings, polls,
//!   |            resets; loom and scenario tests drive this same core)
//!   |  credits   send-queue credits of one shared physical QP, a record per WR
//!   |  handshake the RC handshake's messages (RC fallback: over UD; DC
//!   |            upgrade: carried by messaging, engine::handshake_msg)
//!   |  msg       two-sided messages: header layout, credit accounts
//!   |
//! krcore_nic::Nic (sim, verbs)
//! ```
//!
//! # Modes
//!
//! On a device with DC the engine is KRCore proper ([`EngineMode::Dc`]). On
//! a device without DC (Soft-RoCE, other vendors) it runs in
//! [`EngineMode::RcFallback`] and says so ([`Engine::mode`],
//! [`EngineStats::mode`]): instead of a DCT it runs a handshake endpoint (a
//! UD QP, [`HandshakeResponder`]); instead of a DCI pool, a VQP's connect
//! gets the RC QP of its target's pair, shared by every VQP of the node that
//! talks to that target, made by a two-sided handshake over UD
//! ([`handshake`]) and cached (LRU, `EngineConfig::rc_cap`). Pre-check,
//! credits, wr_id routing and recovery are the same code on both (recovery
//! of an RC pair re-handshakes it: the target's end failed too). The meta
//! entry keeps its layout and names the handshake endpoint instead of a DCT
//! ([`Engine::local_target`]); the table is hosted by an engine as in DC
//! mode ([`MsgMetaHost`]: READs and registration messages over RC pairs
//! with it). Two-sided messaging works in both
//! modes: over the DCT in DC mode, over the RC pairs in RC fallback mode
//! (their passive ends share the receiver's SRQ). The UD handshake is what
//! RC fallback mode keeps UD for: it builds a node's first pair to a peer,
//! the meta node included (then meta registration travels as messages over
//! the pair; DC mode needs no UD QP at all: its upgrade handshake and meta
//! registration travel as messages). A cluster is all-DC or all-fallback:
//! mixed clusters are not supported.
//!
//! # Quick start
//!
//! ```
//! use krcore_kmod::{Engine, EngineConfig, MetaLocation};
//! use krcore_meta::{MetaConfig, LocalMetaHost};
//! use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
//! use krcore_nic::{Access, MemoryRegion, Nic, RemoteAddr, SendWr, Wc};
//! use std::time::{Duration, Instant};
//!
//! let fabric = SimFabric::in_memory();
//! let node = || SimNic::open(&fabric, SimConfig::default()).unwrap();
//! // The meta server (hosted in this process), a memory node registered in
//! // its table by a local call (remote nodes register over two-sided RPC).
//! let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
//! let location = MetaLocation::from_bootstrap(&meta.bootstrap())?;
//! let cfg = || EngineConfig::default().with_meta(location);
//! let server = Engine::start(node(), cfg())?;
//! meta.table_mut().register(server.local_target()?, 0, 60_000, 0).unwrap();
//! let remote = server.alloc_mr(4096, Access::ALL)?;
//!
//! let client = Engine::start(node(), cfg())?;
//! let vqp = client.create_vqp()?;
//! let before = client.nic().counters();
//! vqp.connect(server.gid())?; // DCCache miss: ONE READ of the meta table
//! let d = client.nic().counters() - before;
//! assert_eq!((d.reads, d.qps_created), (1, 0));
//!
//! // The server leases 8 bytes: a key of their own, enforced by the NIC
//! // until revoked or expired. The client's VQP must know the grant: its
//! // pre-check refuses a key no grant covers (`Reason::NotGranted`).
//! let lease = remote
//!     .lease(0, 8, Access::REMOTE_ATOMIC, Instant::now() + Duration::from_secs(60))
//!     .unwrap();
//! vqp.add_grant(server.gid(), lease.rkey, lease.grant);
//! let at = RemoteAddr { addr: lease.grant.addr, rkey: lease.rkey };
//! let local = client.alloc_mr(64, Access::LOCAL_WRITE)?;
//! vqp.post_send(&mut [SendWr::cas(9, local.sge(0, 8).unwrap(), at, 0, 1)])
//!     .unwrap();
//! let mut wc = [Wc::default()];
//! while vqp.poll(&mut wc).unwrap() == 0 {}
//! assert_eq!((wc[0].wr_id, remote.load_u64(0).unwrap()), (9, 1));
//! # Ok::<(), krcore_kmod::EngineError>(())
//! ```
//!
//! # The pieces
//!
//! - [`dccache`]: [`DcCache`], the bounded cache from a target's GID to its
//!   `dct_num`/`dc_key` and meta epoch; `connect` is a lookup here, a miss
//!   costs one meta-server READ. 34 bytes per slot (about 54 per target at
//!   capacity, with the table's headroom), fixed at construction.
//! - [`precheck`]: [`Precheck::check`] turns a VQP's batch into a typed
//!   [`Rejection`] (the batch never reaches the NIC) or a [`Plan`]: poll first
//!   to reclaim credits, and which WR to force signaled.
//! - [`wrid`]: [`PhysWrId`] packs (VQP id, sequence) into the 64-bit `wr_id`
//!   the NIC sees; the engine keeps the user's `wr_id` and whether the user
//!   asked for a completion beside the QP's record of the WR ([`Slot`]).
//! - [`credits`]: [`SendQueueCredits`] accounts a physical send queue with
//!   one record per WR (in the engine: the WR as posted, which the doorbell
//!   rings on and recovery re-posts): a signaled completion credits every
//!   WR before it, including other VQPs' unsignaled WRs, and impossible
//!   completions are typed errors.
//! - [`handshake`]: the RC handshake's messages
//!   ([`handshake::HandshakeRepr`]) and the protocol's rules: over UD in
//!   RC fallback mode, as messages to a reserved port in DC mode (the
//!   upgrade, [`engine::handshake_msg`]).
//! - [`msg`]: two-sided messaging's header ([`msg::MsgRepr`]), channel
//!   protocol and credit accounts ([`msg::SendWindow`],
//!   [`msg::ReturnBatch`]); hosted by [`Engine::bind`] ([`Port`]) and
//!   [`Engine::endpoint`] ([`Endpoint`]).
//!
//! Also hosted by the engine: MR leases ([`OwnedMr::lease`],
//! [`OwnedMr::deregister`]) and fork kits for worker processes
//! ([`Engine::prepare_fork`], [`ForkKit`]).
//!
//! - [`engine`]: [`Engine`] and [`Vqp`], the host: which lock guards what,
//!   how completions are routed, what is cached, and how a DCI in ERR is
//!   recovered are in its module docs. The meta server is a table hosted
//!   by an engine (`MsgMetaHost`: lookups are one-sided READs of it,
//!   registrations are messages to its reserved port).
//!
//! Each module documents its invariants; each is tested against a reference
//! model or, for the host, by scripted scenarios on the `sim` provider
//! (`tests/engine_*.rs`).
//!
//! # Engine rules
//!
//! - **No I/O, no clock, no threads in the pieces.** They take inputs (`now`
//!   included) and return decisions; the host ([`engine`]) polls, posts and
//!   reads the clock (pre-check `now`, bounded waits). This keeps the
//!   pieces' tests deterministic.
//! - **No process-global state**, so that the engine can later be hosted by a
//!   node-wide daemon.
//! - **No `unsafe`** (`#![forbid(unsafe_code)]`).
//!
//! # Thread safety
//!
//! [`DcCache`] is `Sync` and meant to be shared (`Arc`) by every VQP of a
//! node: reads take no lock, writers are serialized per bucket. The other
//! pieces are plain values with `&mut self` updates, owned by whoever owns the
//! physical QP or the VQP: in the [`engine`], a physical QP's lock guards
//! its [`SendQueueCredits`] and the state of the VQPs bound to it. [`Engine`] and
//! [`Vqp`] are `Send + Sync`; there is no engine-wide lock on the data path.
//!
//! The engine starts no thread unless asked: in RC fallback mode a node
//! answers peers' handshakes from [`Engine::progress`] (non-blocking, the
//! host calls it) or, with `EngineConfig::handshake_thread`, from a thread
//! the engine owns and joins when it is dropped.
//!
//! # Example: one batch through the pieces
//!
//! ```
//! use std::collections::HashMap;
//! use std::time::Instant;
//! use krcore_kmod::{
//!     DcCache, LocalMr, PhysWrId, Policy, Posted, Precheck, RemoteGrant, SendQueueCredits, Slot,
//!     QpKind, Ungranted, VqpId,
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
//! // One record per WR: the WR as posted, the user's wr_id beside it.
//! let mut sq = SendQueueCredits::with_records(128, 127, SendWr::read(0, Sge::default(), RemoteAddr::default()));
//! let mut users = vec![Slot::default(); 128];
//! let mrs = HashMap::from([(0x10, LocalMr { addr: 0x1000, len: 4096, access: Access::LOCAL_WRITE })]);
//! let local = Sge { addr: 0x1000, length: 64, lkey: 0x10 };
//! // The grant the target handed out for rkey 3 (a region token).
//! let grant = RemoteGrant { addr: 0x9000, len: 4096, access: Access::REMOTE_READ, expires_at: None };
//! let grants = HashMap::from([((target.gid, 3), grant)]);
//! let user = [SendWr::read(7, local, RemoteAddr { addr: 0x9000, rkey: 3 })
//!     .to(Destination::Dc(hit.target))];
//! let check = Precheck {
//!     transport: QpKind::Dc,
//!     peer: None,
//!     local_mrs: &mrs,
//!     grants: &grants,
//!     ungranted: Ungranted::Refuse,
//!     now: Instant::now(),
//!     queue: sq.view(),
//!     policy: Policy::default(),
//! };
//! let plan = check.check(&user)?;
//! assert!(!plan.must_reclaim());
//!
//! // Copy the batch into the records with physical wr_ids (the user's
//! // beside them), ring the doorbell on the records, commit.
//! let first = sq.next_seq();
//! let staged = sq.stage(user.len())?;
//! staged.copy_from_slice(&user);
//! for (i, wr) in staged.iter_mut().enumerate() {
//!     let seq = first + i as u64;
//!     users[seq as usize % 128] = Slot { user_wr_id: wr.wr_id, user_signaled: wr.is_signaled() };
//!     wr.wr_id = PhysWrId::new(vqp, seq).raw();
//! }
//! plan.apply(staged);
//! // ... the host calls `qp.post_send(staged)` ...
//! sq.commit(user.len());
//!
//! // A polled completion finds its record and credits the queue through it.
//! let polled = sq.record(first).wr_id();
//! let seq = sq.resolve(polled).expect("outstanding");
//! let mut delivered = Vec::new();
//! for s in sq.complete_range(seq, WcStatus::Success)? {
//!     assert_eq!(sq.record(s).wr_id().vqp(), vqp);
//!     let slot = users[s as usize % 128];
//!     if slot.user_signaled {
//!         delivered.push(slot.user_wr_id);
//!     }
//! }
//! assert_eq!(delivered, [7]);
//! assert_eq!(sq.free(), 128);
//! # Ok::<(), krcore_kmod::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod credits;
pub mod daemon;
pub mod dccache;
pub mod engine;
pub mod handshake;
mod idhash;
pub mod msg;
pub mod precheck;
pub mod sharedqp;
mod sync;
mod wire;
pub mod wrid;

pub use engine::{
    DciStats, Endpoint, Engine, EngineConfig, EngineError, EngineMode, EngineStats, ForkKit,
    HandshakeConfig, HandshakeFailure, HandshakeResponder, HandshakeStats, LeaseError, LeaseId,
    LeaseStats, Leased, Message, MetaFailure, MetaHostStats, MetaHostThread, MetaLease,
    MetaLeaseStats, MetaLocation, MetaRefresh, MetaSource, MetaStats, MsgConfig, MsgError,
    MsgMetaHost, MsgStats, OwnedMr, Port, ProgressThread, QpStats, RcMetaHost, RcStats, Sender,
    Vqp, VqpError, VqpPath, DCIS_PER_CPU, DEFAULT_DC_KEY, DEFAULT_HANDSHAKE_QKEY, LEASE_REAPER,
    META_PORT, REFRESH_EVERY,
};

pub use credits::{CreditError, Posted, PostedWr, QueueView, SendQueueCredits};
pub use dccache::{CachedTarget, DcCache, Insert, Lookup, MetaEpoch};
pub use precheck::{
    LocalMr, LocalMrTable, NoGrants, OpKind, Plan, Policy, Precheck, QpKind, Reason, Rejection,
    RemoteGrant, RemoteGrants, Ungranted,
};
pub use wrid::{PhysWrId, Slot, VqpId, WrIdError};

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
