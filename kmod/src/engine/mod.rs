//! The engine host: the pure pieces ([`crate::dccache`], [`crate::precheck`],
//! [`crate::wrid`], [`crate::credits`], [`crate::handshake`]) driving a
//! [`Nic`](krcore_nic::Nic) in-process.
//!
//! # Layers
//!
//! The engine object (`object.rs`: [`Engine`] and what it shares) composes
//! the rooms of this module and implements the traits through which they
//! reach it: the shared QP's host through `QpHost` (the device, pairing),
//! the RC pairs, the meta client and the VQP through `RcHost`, messaging
//! through `MsgHost`, the upgrade's handshake through `UpgradeHost`.
//! Nothing below the object names it; its calls by concern (messaging,
//! meta registration, store membership, fork kits) sit on top of it.
//! `docs/design.md` (section 1.4) lists the layers.
//!
//! # Modes
//!
//! [`Engine::start`] picks the mode from the device ([`EngineMode`]):
//! KRCore proper on a device with DC, the RC fallback without it (Soft-RoCE,
//! non-ConnectX NICs). Both share the VQP, pre-check, credit, routing and
//! recovery code (the `physqp` module: "a shared physical QP"); they differ in what
//! that QP is and how a VQP gets one.
//!
//! ```text
//! Engine<N>  (Arc, Clone; no process-global state: two engines on two NICs
//!   |         in one process share nothing)
//!   |- PD
//!   |- DC mode:
//!   |   |- DCT + SRQ + receive CQ   (lazy: first need) incoming traffic:
//!   |   |                           peers' one-sided ops, messaging
//!   |   |                           (`messaging`: ports, endpoints; made at
//!   |   |                           the first bind/endpoint, own locks)
//!   |   |- DCI pool [0..pool_size)  created lazily, each with its own send CQ
//!   |   |     `- per-QP lock: credits, the state of the VQPs bound to it
//!   |   |                     (slots, rings, targets, grants), MR snapshot
//!   |   `- with upgrade_endpoint: RC pairs (as in the RC fallback) for
//!   |         upgraded VQPs (`upgrade`: DC -> RC), made by handshakes
//!   |         carried by messaging (`handshake_msg`: the reserved port
//!   |         HANDSHAKE_PORT on the DCT, served by progress() / the
//!   |         handshake thread; no UD QP)
//!   |- RC fallback mode:
//!   |   |- handshake endpoint       UD QP (instead of a DCT) + passive RC QPs
//!   |   |                           (peers' ends), progress() / its thread
//!   |   `- RC pairs (LRU, rc_cap)   one RC QP per target, own send CQ,
//!   |         `- per-QP lock        the same state as a DCI's
//!   |- DcCache                      lock-free reads, per-bucket writers
//!   |- meta client                  DC: a VQP of its own on DCI 0 + READ
//!   |                               buffer (lazy: first lookup); RC mode:
//!   |                               own RC QP; own lock
//!   `- owned MRs                    copy-on-write map + generation
//! Vqp<N>  DC: bound round-robin to one DCI (while upgraded, its state sits
//!         on its target's RC pair); RC: bound at connect to its target's
//!         pair. Its state (slot table, completion ring, target, known
//!         grants) lives in that QP, under the QP's lock
//! ```
//!
//! # What is created when (DC mode)
//!
//! [`Engine::start`] creates the PD and `prestart` DCIs (0: none), nothing
//! else. Everything else is created on first need, exactly once however
//! many threads need it at the same moment (the `lazy` module: a
//! `OnceLock` whose creation runs under a mutex of its own; a failed
//! creation keeps nothing and is retried by the next need; errors are typed,
//! never a panic):
//!
//! | resource                     | first need                               |
//! |------------------------------|------------------------------------------|
//! | a DCI of the pool            | `create_vqp` (round-robin, up to `pool_size`); DCI 0 also by the first meta lookup |
//! | DCT + SRQ + receive CQ       | the node must be reachable: [`Engine::local_target`] (what a node registers with the meta server), [`Engine::alloc_mr`] with remote access, the first messaging port or endpoint |
//! | meta client's VQP + buffer   | the first DCCache miss (one MR; no QP: it shares DCI 0) |
//! | upgrade: reserved port + passive CQ | [`Engine::handshake_entry`] (a target registers it: it answers from then on); an initiator's first upgrade makes its messaging endpoint (and the DCT its answers arrive at) |
//!
//! `EngineConfig::eager_start` creates the DCT and serves upgrades at
//! start instead (a memory node reached anyway). A compute node that
//! only issues one-sided operations thus creates one QP (its first VQP's
//! DCI) before its first get. In a forked child nothing is created (see
//! [`ForkKit`]). RC fallback mode creates its handshake endpoint (the
//! node's address) and the meta client's RC QP at start.
//!
//! # What takes which lock
//!
//! | operation            | locks                                           |
//! |----------------------|-------------------------------------------------|
//! | `post_send`, `poll`  | the VQP's QP only (one lock; VQP state inside)   |
//! |                      | (RC: first the VQP's binding, for an `Arc` clone)|
//! | `connect`, hit       | none (DCCache seqlock read), then the VQP's QP   |
//! |                      | (RC: the binding's, the pair map's briefly)      |
//! | `connect`, miss      | the meta client's (one READ round trip; DC: the  |
//! |                      | posts and polls take DCI 0's lock briefly)      |
//! | first need of a lazy | its creation lock (once; never on a data path)  |
//! | resource             |                                                 |
//! | RC: new pair         | the pair cache's creation lock (one handshake)  |
//! | `create_vqp`         | the pool's (creating a DCI when below the cap)  |
//! | DC upgrade, upgraded | the VQP's binding lock, then a QP's; a new pair: |
//! | post                 | the builder's queue lock (the handshake runs on |
//! |                      | the engine's builder thread; a hint: the pair   |
//! |                      | cache's locks, one handshake, on its thread)    |
//! | `alloc_mr`, MR drop  | the MR map's (posts see it through one atomic)  |
//! | messaging receive    | the node's receive lock (try-lock), then a      |
//! |                      | port's or endpoint's state lock (see `msg`)     |
//!
//! No lock spans physical QPs: VQPs on different QPs never contend. RC
//! recovery re-handshakes under the pair's lock (bounded by the handshake
//! timeout and retries).
//!
//! # What is cached
//!
//! - Per node (the [`DcCache`](crate::dccache::DcCache)): GID -> (`dct_num`, `dc_key`, meta epoch),
//!   34 B per slot (about 54 B per target at capacity). Filled on a miss by one READ of the meta table;
//!   replaced when a lookup returns a newer epoch; invalidated when a WR to
//!   the target completes with `REM_ACCESS_ERR` or `RETRY_EXC_ERR`, or by
//!   [`Engine::invalidate`]. In RC fallback mode the same fields name the
//!   target's handshake endpoint (`dct_num` = UD QPN, `dc_key` = qkey).
//! - RC fallback mode, per node: at most `rc_cap` RC pairs, one per target
//!   (see [`RcStats`]); per handshake endpoint, at most `passive_cap`
//!   passive ends of peers' pairs (see [`HandshakeResponder`]).
//! - Per VQP: its target (copied at `connect`; cleared by the same error
//!   completions, so the user connects again and sees a changed or removed
//!   registration); in RC fallback mode, its pair.

mod config;
mod device;
mod error;
mod fork;
pub mod handshake_msg;
mod handshake_ud;
mod idle;
mod lazy;
mod messaging;
mod messaging_api;
mod meta;
mod meta_follow;
pub mod meta_lease;
pub mod meta_msg;
mod mrs;
mod object;
mod pairing;
mod physqp;
mod port_lock;
mod rc;
mod rc_meta;
mod stats;
pub mod store_msg;
mod upgrade;
mod vqp;

pub use crate::sharedqp::{DciStats, QpStats};
pub use config::{
    EngineConfig, EngineMode, HandshakeConfig, MetaLocation, MsgConfig, DCIS_PER_CPU,
    DEFAULT_DC_KEY, DEFAULT_HANDSHAKE_QKEY,
};
pub use error::{EngineError, HandshakeFailure, MetaFailure, VqpError};
pub use fork::ForkKit;
pub use handshake_ud::{HandshakeResponder, HandshakeStats, ProgressThread};
pub use messaging::{Endpoint, Message, MsgError, MsgStats, Port, PortUsage, Sender};
pub use meta::{MetaRefresh, MetaSource, MetaStats, REFRESH_EVERY};
pub use meta_lease::{MetaLease, MetaLeaseStats};
pub use meta_msg::{MetaHostStats, MetaHostThread, MsgMetaHost, META_PORT};
pub use mrs::{LeaseError, LeaseId, LeaseStats, Leased, OwnedMr, LEASE_REAPER};
pub use object::Engine;
pub use rc::handshake_gid;
pub use rc::RcStats;
pub use rc_meta::RcMetaHost;
pub use stats::EngineStats;
pub use vqp::{Vqp, VqpPath};
