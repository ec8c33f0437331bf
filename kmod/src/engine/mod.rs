//! The engine host: the pure pieces ([`crate::dccache`], [`crate::precheck`],
//! [`crate::wrid`], [`crate::credits`], [`crate::handshake`]) driving a
//! [`Nic`] in-process.
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
//!   |   |- DCT + SRQ + receive CQ   incoming two-sided traffic: messaging
//!   |   |                           (msg*.rs: ports, endpoints; made at the
//!   |   |                           first bind/endpoint, own locks)
//!   |   |- DCI pool [0..pool_size)  created lazily, each with its own send CQ
//!   |   |     `- per-QP lock: credits, the state of the VQPs bound to it
//!   |   |                     (slots, rings, targets, grants), MR snapshot
//!   |   `- with upgrade_endpoint: a handshake endpoint and RC pairs (as in
//!   |         the RC fallback) for upgraded VQPs (`upgrade`: DC -> RC)
//!   |- RC fallback mode:
//!   |   |- handshake endpoint       UD QP (instead of a DCT) + passive RC QPs
//!   |   |                           (peers' ends), progress() / its thread
//!   |   `- RC pairs (LRU, rc_cap)   one RC QP per target, own send CQ,
//!   |         `- per-QP lock        the same state as a DCI's
//!   |- DcCache                      lock-free reads, per-bucket writers
//!   |- meta client                  own DCI (RC mode: own RC QP) + READ
//!   |                               buffer, own lock
//!   `- owned MRs                    copy-on-write map + generation
//! Vqp<N>  DC: bound round-robin to one DCI (while upgraded, its state sits
//!         on its target's RC pair); RC: bound at connect to its target's
//!         pair. Its state (slot table, completion ring, target, known
//!         grants) lives in that QP, under the QP's lock
//! ```
//!
//! # What takes which lock
//!
//! | operation            | locks                                           |
//! |----------------------|-------------------------------------------------|
//! | `post_send`, `poll`  | the VQP's QP only (one lock; VQP state inside)   |
//! |                      | (RC: first the VQP's binding, for an `Arc` clone)|
//! | `connect`, hit       | none (DCCache seqlock read), then the VQP's QP   |
//! |                      | (RC: the binding's, the pair map's briefly)      |
//! | `connect`, miss      | the meta QP's (one READ round trip)             |
//! | RC: new pair         | the pair cache's creation lock (one handshake)  |
//! | `create_vqp`         | the pool's (creating a DCI when below the cap)  |
//! | DC upgrade, upgraded | the VQP's binding lock, then a QP's; a new pair: |
//! | post                 | the pair cache's locks (one handshake)          |
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
//! - Per node (the [`DcCache`]): GID -> (`dct_num`, `dc_key`, meta epoch),
//!   34 B per target. Filled on a miss by one READ of the meta table;
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
mod error;
mod fork;
mod idhash;
mod meta;
mod mrs;
mod msg;
mod msg_endpoint;
mod msg_port;
mod msg_send;
mod physqp;
mod rc;
mod rc_meta;
mod responder;
mod ud;
mod upgrade;
mod vqp;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use krcore_nic::{bring_up, Access, DcTarget, Gid, Nic, QpCaps, QpInit, QpType, QueuePair};
use parking_lot::Mutex;

pub use config::{EngineConfig, DCIS_PER_CPU, DEFAULT_DC_KEY};
pub use error::{EngineError, HandshakeFailure, MetaFailure, VqpError};
pub use fork::ForkKit;
pub use meta::{MetaLocation, MetaStats};
pub use mrs::{LeaseError, LeaseId, OwnedMr};
pub use msg::{Message, MsgConfig, MsgError, MsgStats, Sender};
pub use msg_endpoint::Endpoint;
pub use msg_port::Port;
pub use physqp::{DciStats, QpStats};
pub use rc::RcStats;
pub use rc_meta::RcMetaHost;
pub use responder::{
    HandshakeConfig, HandshakeResponder, HandshakeStats, ProgressThread, DEFAULT_HANDSHAKE_QKEY,
};
pub use upgrade::{handshake_gid, VqpTransport};
pub use vqp::Vqp;

use crate::dccache::{CachedTarget, DcCache, Insert};
use crate::precheck::Policy;
use crate::wrid::VqpId;
use meta::{MetaClient, MetaPolicy};
use mrs::MrRegistry;
use physqp::PhysQp;
use rc::RcPool;

/// How the engine reaches other nodes, decided at start from the device's
/// capabilities ([`krcore_nic::DeviceCaps::dc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineMode {
    /// KRCore proper: a pool of shared DC initiators; connect is a lookup.
    Dc,
    /// The device has no DC (Soft-RoCE, non-ConnectX NICs): each target is
    /// reached through one RC QP shared by the node's VQPs, made by a
    /// handshake over UD and cached (LRU, `EngineConfig::rc_cap`).
    RcFallback,
}

impl std::fmt::Display for EngineMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineMode::Dc => "DC",
            EngineMode::RcFallback => "RC fallback",
        })
    }
}

/// Engine-wide statistics, summed over the DCIs (or the RC pairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// How the engine reaches other nodes.
    pub mode: EngineMode,
    /// DCIs created so far (0 in RC fallback mode).
    pub dcis: usize,
    /// VQPs created so far.
    pub vqps_created: u64,
    /// Connects answered by the DCCache.
    pub connect_hits: u64,
    /// Connects that looked the meta table up.
    pub connect_misses: u64,
    /// The meta client's statistics.
    pub meta: MetaStats,
    /// The DCIs' statistics, summed.
    pub dci: DciStats,
    /// RC fallback mode (DC mode: the upgraded VQPs'): the RC pairs
    /// (their queues' statistics in `rc.qp`).
    pub rc: RcStats,
    /// RC fallback mode (DC mode with `upgrade_endpoint`): the handshake
    /// endpoint.
    pub handshake: HandshakeStats,
    /// MRs the engine owns right now.
    pub owned_mrs: usize,
    /// DC mode: VQPs moved from their DCI to an RC pair (threshold or hint).
    pub rc_upgrades: u64,
    /// DC mode: VQPs moved back to their DCI (their pair was evicted or
    /// lost, or they connected to another target).
    pub rc_downgrades: u64,
    /// DC mode: upgrade attempts that failed (no handshake entry, refused,
    /// timed out, pairs busy); the VQP stayed on its DCI.
    pub rc_upgrade_failures: u64,
}

impl Default for EngineStats {
    fn default() -> EngineStats {
        EngineStats {
            mode: EngineMode::Dc,
            dcis: 0,
            vqps_created: 0,
            connect_hits: 0,
            connect_misses: 0,
            meta: MetaStats::default(),
            dci: DciStats::default(),
            rc: RcStats::default(),
            handshake: HandshakeStats::default(),
            owned_mrs: 0,
            rc_upgrades: 0,
            rc_downgrades: 0,
            rc_upgrade_failures: 0,
        }
    }
}

/// DC mode: the DCT peers reach this node through.
struct Receiver<N: Nic> {
    /// Receive CQ and SRQ: drained and refilled by messaging (`msg`).
    cq: N::Cq,
    srq: N::Srq,
    dct: N::Qp,
}

/// RC fallback mode: the handshake endpoint (instead of a DCT) and the RC
/// pairs (instead of a DCI pool). DC mode with `upgrade_endpoint`: the same,
/// beside the DCT and the DCIs, for the DC -> RC upgrade.
struct Fallback<N: Nic> {
    hs: HandshakeResponder<N>,
    pool: RcPool<N>,
    /// Dropped (stopped and joined) with the engine.
    _thread: Option<ProgressThread>,
}

/// What the engine runs on: a DCT in DC mode, a handshake endpoint and RC
/// pairs in RC fallback mode.
enum Transport<N: Nic> {
    Dc(Receiver<N>),
    Rc(Box<Fallback<N>>),
}

pub(crate) struct EngineInner<N: Nic> {
    /// Shared with the handshake endpoint (RC fallback mode).
    pub(crate) nic: Arc<N>,
    pub(crate) pd: N::Pd,
    pub(crate) cfg: EngineConfig,
    /// `cfg.policy` clamped to the device.
    pub(crate) policy: Policy,
    pub(crate) cache: DcCache,
    pub(crate) mrs: Arc<MrRegistry>,
    /// RC fallback mode: the LRU clock of the RC pairs.
    pub(crate) rc_tick: AtomicU64,
    transport: Transport<N>,
    /// DC mode with `upgrade_endpoint`: the handshake endpoint and the RC
    /// pairs of upgraded VQPs.
    upgrade: Option<Box<Fallback<N>>>,
    pub(crate) upgrades: AtomicU64,
    pub(crate) downgrades: AtomicU64,
    pub(crate) upgrade_failures: AtomicU64,
    meta: Option<MetaClient<N>>,
    pool: Mutex<Vec<Arc<PhysQp<N>>>>,
    next_dci: AtomicUsize,
    next_vqp: AtomicU32,
    hits: AtomicU64,
    misses: AtomicU64,
    /// Two-sided messaging, made by the first bind or endpoint.
    msg: OnceLock<Arc<msg::MsgNode<N>>>,
    msg_init: Mutex<()>,
    /// Set in a forked child ([`ForkKit::adopt`]): no meta lookups, no new
    /// NIC objects, no messaging.
    forked: AtomicBool,
}

impl<N: Nic> EngineInner<N> {
    /// The handshake endpoint (RC fallback mode).
    /// DC mode: the upgrade's endpoint, if configured.
    pub(crate) fn handshake(&self) -> Option<&HandshakeResponder<N>> {
        match &self.transport {
            Transport::Rc(f) => Some(&f.hs),
            Transport::Dc(_) => self.upgrade.as_ref().map(|f| &f.hs),
        }
    }

    /// The RC pairs (RC fallback mode).
    /// DC mode: the upgraded VQPs' pairs, if the upgrade is configured.
    pub(crate) fn rc_pool(&self) -> Option<&RcPool<N>> {
        match &self.transport {
            Transport::Rc(f) => Some(&f.pool),
            Transport::Dc(_) => self.upgrade.as_ref().map(|f| &f.pool),
        }
    }

    fn mode(&self) -> EngineMode {
        match self.transport {
            Transport::Dc(_) => EngineMode::Dc,
            Transport::Rc(_) => EngineMode::RcFallback,
        }
    }
}

impl<N: Nic> Drop for EngineInner<N> {
    /// RC fallback mode: tells every target (and the meta node) that this
    /// node's ends of their pairs are gone, so that they free theirs (best
    /// effort: a lost Close leaves an end until its responder needs room).
    fn drop(&mut self) {
        if let Transport::Rc(f) = &self.transport {
            f.pool.close_all(&f.hs);
            if let Some(m) = &self.meta {
                m.close();
            }
        }
        if let Some(f) = &self.upgrade {
            f.pool.close_all(&f.hs);
        }
    }
}

/// The KRCore control plane of one NIC port, hosted in this process.
///
/// Cheap to clone (`Arc`); `Send + Sync`. See the module docs for what it
/// holds and which locks what takes.
pub struct Engine<N: Nic> {
    inner: Arc<EngineInner<N>>,
}

impl<N: Nic> Clone for Engine<N> {
    fn clone(&self) -> Self {
        Engine {
            inner: self.inner.clone(),
        }
    }
}

impl<N: Nic> std::fmt::Debug for Engine<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("gid", &self.inner.nic.gid())
            .field("mode", &self.inner.mode())
            .field("dcis", &self.inner.pool.lock().len())
            .field("cache", &self.inner.cache)
            .finish()
    }
}

impl<N: Nic> Engine<N> {
    /// Starts an engine on `nic`.
    ///
    /// - DC mode (the device has DC): a PD, the DCT with its SRQ and
    ///   receive CQ, `cfg.prestart` DCIs, the DCCache, and the meta client's
    ///   DCI when `cfg.meta` is set.
    /// - RC fallback mode (no DC): a PD, the handshake endpoint (a UD QP,
    ///   instead of a DCT; its thread when `cfg.handshake_thread`), no DCI
    ///   pool (RC pairs are made by connects), the DCCache, and the meta
    ///   client's RC QP when `cfg.meta` is set (paired at the first lookup).
    ///   [`Engine::mode`] and [`EngineStats::mode`] say which.
    ///
    /// # Errors
    /// [`EngineError::Config`]; [`EngineError::Nic`] when the device refuses
    /// a resource; in RC fallback mode [`EngineError::NotAFallbackNode`]
    /// when `cfg.meta` names a DC meta server.
    pub fn start(nic: N, cfg: EngineConfig) -> Result<Engine<N>, EngineError> {
        cfg.validate()?;
        let caps = nic.caps();
        let mut policy = cfg.policy;
        policy.max_sge = policy.max_sge.min(caps.max_sge as usize).max(1);
        policy.max_inline = policy.max_inline.min(caps.max_inline as usize);
        let nic = Arc::new(nic);
        let pd = nic
            .alloc_pd()
            .map_err(EngineError::nic("allocate the PD"))?;
        let fallback = || -> Result<Box<Fallback<N>>, EngineError> {
            let hs =
                HandshakeResponder::start_shared(nic.clone(), pd.clone(), cfg.handshake.clone())?;
            let thread = if cfg.handshake_thread {
                Some(hs.spawn_progress()?)
            } else {
                None
            };
            Ok(Box::new(Fallback {
                hs,
                pool: RcPool::default(),
                _thread: thread,
            }))
        };
        let (transport, upgrade) = if caps.dc {
            let up = if cfg.upgrade_endpoint {
                Some(fallback()?)
            } else {
                None
            };
            (Transport::Dc(Self::start_receiver(&nic, &pd, &cfg)?), up)
        } else {
            (Transport::Rc(fallback()?), None)
        };
        let meta = match cfg.meta {
            Some(loc) => Some(MetaClient::start(
                &*nic,
                &pd,
                loc,
                MetaPolicy {
                    retries: cfg.meta_retries,
                    backoff: cfg.meta_backoff,
                    timeout: cfg.meta_timeout,
                },
                match &transport {
                    Transport::Rc(f) => Some(f.hs.clone()),
                    Transport::Dc(_) => None,
                },
            )?),
            None => None,
        };
        let inner = Arc::new(EngineInner {
            cache: DcCache::new(cfg.cache_capacity),
            nic,
            pd,
            policy,
            mrs: Arc::new(MrRegistry::default()),
            rc_tick: AtomicU64::new(0),
            transport,
            upgrade,
            upgrades: AtomicU64::new(0),
            downgrades: AtomicU64::new(0),
            upgrade_failures: AtomicU64::new(0),
            meta,
            pool: Mutex::new(Vec::new()),
            next_dci: AtomicUsize::new(0),
            next_vqp: AtomicU32::new(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            msg: OnceLock::new(),
            msg_init: Mutex::new(()),
            forked: AtomicBool::new(false),
            cfg,
        });
        if inner.mode() == EngineMode::Dc {
            let mut pool = inner.pool.lock();
            for i in 0..inner.cfg.prestart {
                pool.push(Arc::new(PhysQp::dci(&inner, i)?));
            }
        }
        Ok(Engine { inner })
    }

    fn start_receiver(nic: &N, pd: &N::Pd, cfg: &EngineConfig) -> Result<Receiver<N>, EngineError> {
        let cq = nic
            .create_cq(cfg.recv_depth)
            .map_err(EngineError::nic("create the receive CQ"))?;
        let srq = nic
            .create_srq(pd, cfg.recv_depth, 1)
            .map_err(EngineError::nic("create the SRQ"))?;
        let dct = nic
            .create_qp(
                pd,
                &QpInit {
                    qp_type: QpType::Dct,
                    caps: QpCaps {
                        max_send_wr: 0,
                        max_recv_wr: 0,
                        max_send_sge: 0,
                        max_recv_sge: 1,
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: Some(&srq),
                    dc_key: cfg.dc_key,
                },
            )
            .map_err(EngineError::nic("create the DCT"))?;
        // Peers' one-sided operations reach this node's MRs through the DCT;
        // each MR's own access flags still decide what is allowed.
        bring_up(&dct, Access::ALL, None).map_err(EngineError::nic("bring up the DCT"))?;
        Ok(Receiver { cq, srq, dct })
    }

    /// How the engine reaches other nodes (DC, or the RC fallback).
    pub fn mode(&self) -> EngineMode {
        self.inner.mode()
    }

    /// RC fallback mode (and DC mode with `upgrade_endpoint`): one
    /// non-blocking step of the handshake endpoint (answers peers'
    /// handshakes; see [`HandshakeResponder::progress`]). Needed for this
    /// node to accept connections (upgrades) unless the engine runs its
    /// handshake thread. A no-op returning 0 without an endpoint.
    ///
    /// # Errors
    /// Provider failures of the endpoint (CQ overflow, a refused post).
    pub fn progress(&self) -> Result<usize, EngineError> {
        match self.inner.handshake() {
            Some(hs) => hs.progress(),
            None => Ok(0),
        }
    }

    /// RC fallback mode (and DC mode with `upgrade_endpoint`): the
    /// handshake endpoint.
    pub fn handshake_responder(&self) -> Option<&HandshakeResponder<N>> {
        self.inner.handshake()
    }

    /// The NIC the engine runs on.
    pub fn nic(&self) -> &N {
        &self.inner.nic
    }

    /// The engine's protection domain (MRs for [`Engine::register_mr`]).
    pub fn pd(&self) -> &N::Pd {
        &self.inner.pd
    }

    /// This node's GID.
    pub fn gid(&self) -> Gid {
        self.inner.nic.gid()
    }

    /// This node's address: what it registers with the meta server so that
    /// peers can reach its memory.
    ///
    /// DC mode: its DCT (`dct_num`, `dc_key`). RC fallback mode: the same
    /// entry layout names the handshake endpoint instead: `dct_num` is the
    /// endpoint's UD QPN and `dc_key` its qkey (below 2^32, which is how a
    /// fallback engine tells such an entry from a DC node's). The engine
    /// knows the fabric's mode from its own device; mixed DC/RC-fallback
    /// clusters are not supported (a fallback engine refuses a DC node's
    /// entry with [`EngineError::NotAFallbackNode`]).
    pub fn local_target(&self) -> DcTarget {
        let gid = self.inner.nic.gid();
        match &self.inner.transport {
            Transport::Dc(r) => DcTarget {
                gid,
                dct_num: r.dct.qpn(),
                dc_key: self.inner.cfg.dc_key,
            },
            Transport::Rc(f) => {
                let t = f.hs.target();
                DcTarget {
                    gid,
                    dct_num: t.qpn,
                    dc_key: u64::from(t.qkey),
                }
            }
        }
    }

    /// DC mode with `upgrade_endpoint`: the meta entry naming this node's
    /// handshake endpoint, for the host to register beside
    /// [`Engine::local_target`]: GID [`handshake_gid`] of this node's,
    /// `dct_num` = the endpoint's UD QPN, `dc_key` = its qkey. `None` in RC
    /// fallback mode (the node's own entry names it) and without the
    /// endpoint.
    pub fn handshake_entry(&self) -> Option<DcTarget> {
        let f = self.inner.upgrade.as_ref()?;
        let t = f.hs.target();
        Some(DcTarget {
            gid: handshake_gid(&self.inner.nic.gid()),
            dct_num: t.qpn,
            dc_key: u64::from(t.qkey),
        })
    }

    /// DC mode: makes (or finds) the RC pair to `gid` now, through a
    /// handshake with the target's endpoint, so that the VQPs' upgrades to
    /// it cost no handshake (a VQP moves at its hint or threshold; see
    /// [`Vqp::upgrade`]).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in RC fallback mode or without
    /// `upgrade_endpoint`; as [`Vqp::upgrade`].
    pub fn upgrade(&self, gid: &Gid) -> Result<(), EngineError> {
        upgrade::pair_for(&self.inner, gid).map(|_| ())
    }

    /// The configuration (with the policy as given, before clamping).
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// The node-wide DCCache.
    pub fn cache(&self) -> &DcCache {
        &self.inner.cache
    }

    /// The meta server's location, if configured.
    pub fn meta_location(&self) -> Option<MetaLocation> {
        self.inner.meta.as_ref().map(|m| m.location)
    }

    /// Creates a VQP. DC mode: bound round-robin to a DCI of the pool
    /// (creating the DCI when the pool is below its cap). RC fallback mode:
    /// unbound until its first connect (no QP is created here).
    ///
    /// # Errors
    /// [`EngineError::VqpIdsExhausted`]; [`EngineError::Nic`] when a DCI
    /// cannot be created.
    pub fn create_vqp(&self) -> Result<Vqp<N>, EngineError> {
        let n = self.inner.next_vqp.fetch_add(1, Ordering::Relaxed);
        let id = VqpId::new(n).map_err(|_| EngineError::VqpIdsExhausted)?;
        Ok(match self.inner.mode() {
            EngineMode::Dc => Vqp::on_dci(self.inner.clone(), id, self.pick_dci()?),
            EngineMode::RcFallback => Vqp::unbound(self.inner.clone(), id),
        })
    }

    fn pick_dci(&self) -> Result<Arc<PhysQp<N>>, EngineError> {
        let k = self.inner.next_dci.fetch_add(1, Ordering::Relaxed) % self.inner.cfg.pool_size;
        let mut pool = self.inner.pool.lock();
        if let Some(d) = pool.get(k) {
            return Ok(d.clone());
        }
        // Below the cap: create the next DCI (the pool grows in order).
        let index = pool.len();
        let d = Arc::new(PhysQp::dci(&self.inner, index)?);
        pool.push(d.clone());
        Ok(d)
    }

    /// Allocates `len` bytes of zeroed memory registered in the engine's PD
    /// and known to the pre-check as this process's.
    ///
    /// # Errors
    /// [`EngineError::Nic`] with the provider's refusal.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<OwnedMr<N>, EngineError> {
        fork::refuse_in_child(&self.inner, "allocating an MR in a forked child")?;
        let mr = self
            .inner
            .nic
            .alloc_mr(&self.inner.pd, len, access)
            .map_err(EngineError::nic("allocate an MR"))?;
        Ok(OwnedMr::new(mr, &self.inner.mrs))
    }

    /// Makes an MR the caller registered (with [`Nic::register_mr`] or
    /// [`Nic::alloc_mr`], in [`Engine::pd`]) known to the pre-check as this
    /// process's. The engine cannot check the MR's PD: one registered in
    /// another PD passes the pre-check and fails at the NIC.
    pub fn register_mr(&self, mr: N::Mr) -> OwnedMr<N> {
        OwnedMr::new(mr, &self.inner.mrs)
    }

    /// Resolves `gid` through the DCCache, or the meta server on a miss
    /// (what [`Vqp::connect`] does).
    ///
    /// # Errors
    /// As [`Vqp::connect`].
    pub fn resolve(&self, gid: &Gid) -> Result<CachedTarget, EngineError> {
        resolve(&self.inner, gid)
    }

    /// Drops the cached metadata of `gid` (the next connect READs the meta
    /// table). Returns whether it was cached.
    pub fn invalidate(&self, gid: &Gid) -> bool {
        self.inner.cache.invalidate(gid)
    }

    /// Statistics, summed over the DCIs or RC pairs (takes each one's lock
    /// briefly).
    pub fn stats(&self) -> EngineStats {
        let pool: Vec<Arc<PhysQp<N>>> = self.inner.pool.lock().clone();
        let mut dci = DciStats::default();
        for d in &pool {
            dci.add(&d.stats());
        }
        EngineStats {
            mode: self.inner.mode(),
            rc: self.inner.rc_pool().map(RcPool::stats).unwrap_or_default(),
            handshake: self
                .inner
                .handshake()
                .map(HandshakeResponder::stats)
                .unwrap_or_default(),
            dcis: pool.len(),
            vqps_created: u64::from(self.inner.next_vqp.load(Ordering::Relaxed) - 1),
            connect_hits: self.inner.hits.load(Ordering::Relaxed),
            connect_misses: self.inner.misses.load(Ordering::Relaxed),
            meta: self
                .inner
                .meta
                .as_ref()
                .map(MetaClient::stats)
                .unwrap_or_default(),
            dci,
            owned_mrs: self.inner.mrs.len(),
            rc_upgrades: self.inner.upgrades.load(Ordering::Relaxed),
            rc_downgrades: self.inner.downgrades.load(Ordering::Relaxed),
            rc_upgrade_failures: self.inner.upgrade_failures.load(Ordering::Relaxed),
        }
    }
}

/// DCCache first; on a miss one meta READ, whose entry is cached.
pub(crate) fn resolve<N: Nic>(
    eng: &EngineInner<N>,
    gid: &Gid,
) -> Result<CachedTarget, EngineError> {
    if let Some(hit) = eng.cache.lookup(gid).hit() {
        eng.hits.fetch_add(1, Ordering::Relaxed);
        return Ok(hit);
    }
    eng.misses.fetch_add(1, Ordering::Relaxed);
    fork::refuse_in_child(eng, "a meta lookup (DCCache miss) in a forked child")?;
    let meta = eng
        .meta
        .as_ref()
        .ok_or(EngineError::NoMetaServer { gid: *gid })?;
    let Some(entry) = meta.lookup(gid)? else {
        eng.cache.invalidate(gid);
        return Err(EngineError::UnknownNode { gid: *gid });
    };
    let found = CachedTarget {
        target: entry.dc_target(),
        epoch: entry.epoch,
    };
    Ok(match eng.cache.insert(found.target, found.epoch) {
        // The cache already holds a newer registration (a concurrent
        // connect read the table after us): use that one.
        Insert::Stale { .. } => eng.cache.get(gid).unwrap_or(found),
        _ => found,
    })
}
