//! The engine object: [`Engine`] (the handle users hold) and
//! `EngineInner` (what it shares with the engine's threads and the
//! objects that hold it). It composes the rooms below it (the device, the
//! DCI pool, the RC pairs, the meta client, messaging, the upgrade's
//! handshake) and implements the traits through which they reach it
//! ([`QpHost`], [`RcHost`], [`MsgHost`], [`UpgradeHost`]): nothing below
//! names it. The engine's calls by concern (messaging, meta registration,
//! store membership, fork) are in files on top of it. See the room's
//! module docs (`super`) for what it holds and which locks what takes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use krcore_nic::{bring_up, Access, DcTarget, Gid, Nic, QpCaps, QpInit, QpType, QueuePair};
use parking_lot::Mutex;

use super::config::{EngineConfig, EngineMode, MetaLocation};
use super::device::{Device, QpHost};
use super::error::EngineError;
use super::handshake_msg::{self, UpgradeHost};
use super::handshake_ud::{HandshakeResponder, ProgressThread};
use super::lazy::Lazy;
use super::messaging::{Endpoint, MsgHost, MsgNode};
use super::meta::{self, MetaClient, MetaPolicy};
use super::mrs::{LeaseStats, MrRegistry, OwnedMr, PostWords};
use super::pairing;
use super::physqp::PhysQp;
use super::rc::{self, handshake_gid, RcHost, RcPool};
use super::stats::EngineStats;
use super::vqp::Vqp;
use crate::dccache::{CachedTarget, DcCache, Insert};
use crate::sharedqp::DciStats;
use crate::wrid::VqpId;

/// The access flags that make an MR something peers use.
const REMOTE_ACCESS: Access = Access(Access::ALL.0 & !Access::LOCAL_WRITE.0);

/// DC mode: the DCT peers reach this node through. Created on first need
/// ([`EngineInner::receiver`]), or at start with `EngineConfig::eager_start`.
struct Receiver<N: Nic> {
    /// Receive CQ and SRQ: drained and refilled by messaging (`msg`).
    cq: N::Cq,
    srq: N::Srq,
    dct: N::Qp,
}

/// A handshake endpoint (UD QP, RC fallback mode) and, with
/// `handshake_thread`, the thread answering it, started when the node's
/// address is first handed out ([`EngineInner::served_endpoint`]).
struct HsEndpoint<N: Nic> {
    hs: HandshakeResponder<N>,
    /// Dropped (stopped and joined) with the engine.
    thread: Lazy<ProgressThread>,
}

/// RC fallback mode: the handshake endpoint (instead of a DCT; created at
/// start: it is the node's address) and the RC pairs (instead of a DCI
/// pool).
struct Fallback<N: Nic> {
    ep: Lazy<HsEndpoint<N>>,
    pool: RcPool<N>,
    /// Messaging's receive side (no DCT): the passive ends of peers' pairs
    /// share this SRQ and CQ.
    rx: RcRx<N>,
}

/// RC fallback mode: the SRQ and receive CQ messages arrive at (over the
/// passive ends of peers' pairs), made at start.
struct RcRx<N: Nic> {
    cq: N::Cq,
    srq: N::Srq,
}

/// DC mode with `upgrade_endpoint`: the RC pairs of upgraded VQPs, made by
/// handshakes carried by messaging (`handshake_msg`: no UD endpoint).
struct Upgrade<N: Nic> {
    hs: handshake_msg::HsMsg<N>,
    pool: RcPool<N>,
}

/// What the engine runs on: a DCT in DC mode, a handshake endpoint and RC
/// pairs in RC fallback mode.
enum ModeState<N: Nic> {
    Dc(Lazy<Receiver<N>>),
    Rc(Box<Fallback<N>>),
}

pub(crate) struct EngineInner<N: Nic> {
    /// The NIC, PD, configuration, DCCache and MR registry (the engine
    /// derefs to it: `eng.cfg`).
    pub(super) dev: Arc<Device<N>>,
    mode_state: ModeState<N>,
    /// DC mode with `upgrade_endpoint`: the handshake over messaging and
    /// the RC pairs of upgraded VQPs.
    upgrade: Option<Box<Upgrade<N>>>,
    /// This engine (for the services that need an owning handle: the
    /// handshake's messaging objects).
    pub(super) me: std::sync::Weak<EngineInner<N>>,
    /// Live [`Engine`] handles; the last one's drop releases the services
    /// that hold the engine (`handshake_msg`, `meta_msg`'s endpoint) and sets
    /// `released`.
    pub(super) handles: AtomicUsize,
    pub(super) released: AtomicBool,
    /// This port's lock on the machine (see `port_lock`), held while the
    /// engine's state lives.
    pub(super) _port_lock: Option<super::port_lock::PortLock>,
    /// DC mode: the endpoint of meta registration over messaging
    /// (`meta_msg`); its lock serializes the calls.
    pub(super) meta_ep: Mutex<Option<Endpoint<N>>>,
    pub(super) meta_next_id: AtomicU64,
    /// Set at start from `cfg.meta`, or once later by a [`MsgMetaHost`]
    /// the engine hosts (it reads its own table).
    pub(super) meta: OnceLock<MetaClient<N>>,
    pub(super) pool: Mutex<Vec<Arc<PhysQp<N>>>>,
    pub(super) next_dci: AtomicUsize,
    pub(super) next_vqp: AtomicU32,
    /// Two-sided messaging, made by the first bind or endpoint.
    pub(super) msg: OnceLock<Arc<MsgNode<N>>>,
    pub(super) msg_init: Mutex<()>,
}

impl<N: Nic> std::ops::Deref for EngineInner<N> {
    type Target = Device<N>;

    #[inline(always)]
    fn deref(&self) -> &Device<N> {
        &self.dev
    }
}

impl<N: Nic> QpHost<N> for EngineInner<N> {
    #[inline(always)]
    fn dev(&self) -> &Device<N> {
        &self.dev
    }

    /// RC fallback mode through the engine's UD handshake endpoint
    /// ([`pairing::pair_with`]); DC mode (the upgrade) by a handshake
    /// carried by messaging to the node `target.gid` (`handshake_msg`; the
    /// UD fields are unused).
    ///
    /// # Errors
    /// As [`pairing::pair_with`]; DC mode: [`EngineError::Unsupported`]
    /// without `upgrade_endpoint` or once the engine's last handle was
    /// dropped.
    fn pair_up(&self, qp: &N::Qp, target: krcore_nic::UdTarget) -> Result<u64, EngineError> {
        if let Some(hs) = self.handshake_msg() {
            let me: Arc<dyn MsgHost<N>> = self.arc().ok_or(EngineError::Unsupported {
                reason: "the engine is being dropped",
            })?;
            return pairing::pair_via(qp, &self.cfg.handshake, |qpn| {
                hs.handshake(&me, qpn, target.gid)
            });
        }
        pairing::pair_with(self.handshake_endpoint()?, qp, target)
    }
}

impl<N: Nic> RcHost<N> for EngineInner<N> {
    fn mode(&self) -> EngineMode {
        match self.mode_state {
            ModeState::Dc(_) => EngineMode::Dc,
            ModeState::Rc(_) => EngineMode::RcFallback,
        }
    }

    fn rc_pool(&self) -> Option<&RcPool<N>> {
        match &self.mode_state {
            ModeState::Rc(f) => Some(&f.pool),
            ModeState::Dc(_) => self.upgrade.as_ref().map(|u| &u.pool),
        }
    }

    /// Never creates it.
    fn handshake_ud(&self) -> Option<&HandshakeResponder<N>> {
        match &self.mode_state {
            ModeState::Rc(f) => f.ep.get().map(|e| &e.hs),
            ModeState::Dc(_) => None,
        }
    }

    fn tell_closed_msg(&self, qpn: u32, gid: Gid, nonce: u64) {
        if let Some(hs) = self.handshake_msg() {
            hs.close(self.nic.gid(), qpn, gid, nonce);
        }
    }

    fn resolve_miss(&self, gid: &Gid) -> Result<CachedTarget, EngineError> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.refuse_in_child("a meta lookup (DCCache miss) in a forked child")?;
        let meta = self
            .meta
            .get()
            .ok_or(EngineError::NoMetaServer { gid: *gid })?;
        let before = meta.location();
        let found = match meta.lookup(self, || self.first_dci(), gid) {
            // The server may have restarted elsewhere: follow it and READ
            // its table once more (see `meta_follow`), if it moved (by
            // this refresh, or by one made meanwhile).
            Err(e @ EngineError::MetaUnavailable { .. }) => {
                let _ = self.refresh_meta();
                if meta.location() == before {
                    Err(e)
                } else {
                    meta.lookup(self, || self.first_dci(), gid)
                }
            }
            r => r,
        };
        let Some(entry) = found? else {
            self.cache.invalidate(gid);
            return Err(EngineError::UnknownNode { gid: *gid });
        };
        let found = CachedTarget {
            target: entry.dc_target(),
            epoch: entry.epoch,
        };
        Ok(match self.cache.insert(found.target, found.epoch) {
            // The cache already holds a newer registration (a concurrent
            // connect read the table after us): use that one.
            Insert::Stale { .. } => self.cache.get(gid).unwrap_or(found),
            _ => found,
        })
    }
}

impl<N: Nic> MsgHost<N> for EngineInner<N> {
    fn msg_rx(&self) -> Result<(N::Srq, N::Cq, u32, u64), EngineError> {
        match &self.mode_state {
            ModeState::Dc(_) => {
                let r = self.receiver()?;
                Ok((r.srq.clone(), r.cq.clone(), r.dct.qpn(), self.cfg.dc_key))
            }
            ModeState::Rc(f) => {
                let t = self.served_endpoint()?.target();
                Ok((f.rx.srq.clone(), f.rx.cq.clone(), t.qpn, u64::from(t.qkey)))
            }
        }
    }

    fn msg_slot(&self) -> (&OnceLock<Arc<MsgNode<N>>>, &Mutex<()>) {
        (&self.msg, &self.msg_init)
    }

    fn forget_restarted_peers(&self) {
        let (Some(hs), ModeState::Rc(f)) = (self.handshake_ud(), &self.mode_state) else {
            return;
        };
        for peer in hs.take_peer_endpoints() {
            f.pool.forget_restarted(self, peer);
            self.forget_other_address(&peer.gid, peer.qpn);
        }
    }

    fn create_vqp(&self) -> Result<Vqp<N>, EngineError> {
        let me = self.me.upgrade().ok_or(EngineError::Unsupported {
            reason: "the engine is being dropped",
        })?;
        let n = self.next_vqp.fetch_add(1, Ordering::Relaxed);
        if n >= meta::META_VQP.get() {
            // The last id is the meta client's (see `meta`).
            return Err(EngineError::VqpIdsExhausted);
        }
        let id = VqpId::new(n).map_err(|_| EngineError::VqpIdsExhausted)?;
        Ok(match self.mode() {
            EngineMode::Dc => Vqp::on_dci(me, self.dev.clone(), id, self.pick_dci()?),
            EngineMode::RcFallback => Vqp::unbound(me, self.dev.clone(), id),
        })
    }

    fn msg_host(&self) -> Option<Arc<dyn MsgHost<N>>> {
        self.me.upgrade().map(|e| e as Arc<dyn MsgHost<N>>)
    }
}

impl<N: Nic> UpgradeHost<N> for EngineInner<N> {
    fn handshake_msg(&self) -> Option<&handshake_msg::HsMsg<N>> {
        self.upgrade.as_ref().map(|u| &u.hs)
    }
}

impl<N: Nic> EngineInner<N> {
    /// An owning handle of this engine (`None` while it is being dropped).
    pub(crate) fn arc(&self) -> Option<Arc<EngineInner<N>>> {
        self.me.upgrade()
    }

    /// RC fallback mode: the handshake endpoint (created at start; a
    /// failed start is retried here).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in DC mode (the upgrade's handshake
    /// travels as messages, `handshake_msg`), or when it must be created in a
    /// forked child; [`EngineError::Nic`] when the device refuses the UD QP.
    pub(crate) fn handshake_endpoint(&self) -> Result<&HandshakeResponder<N>, EngineError> {
        self.hs_endpoint().map(|e| &e.hs)
    }

    /// [`EngineInner::handshake_endpoint`] with its thread's slot.
    fn hs_endpoint(&self) -> Result<&HsEndpoint<N>, EngineError> {
        let f =
            match &self.mode_state {
                ModeState::Rc(f) => f,
                ModeState::Dc(_) => return Err(EngineError::Unsupported {
                    reason:
                        "DC mode has no handshake endpoint (the upgrade's handshake is messaging)",
                }),
            };
        self.create_once(
            &f.ep,
            "creating the handshake endpoint in a forked child",
            || start_endpoint(&self.nic, &self.pd, &self.cfg, &f.rx),
        )
    }

    /// RC fallback mode: the handshake endpoint, as handed out to peers
    /// (the node's address): with `handshake_thread`, the thread answering
    /// it is started here (once; not in a forked child, which runs no
    /// engine thread). Until then nobody can know the address, so nobody
    /// asks: a node that only initiates (its own connects drive its
    /// endpoint while they wait) runs no thread at all.
    ///
    /// # Errors
    /// As [`EngineInner::handshake_endpoint`]; [`EngineError::Config`]
    /// when the thread cannot be spawned (the next call tries again).
    pub(crate) fn served_endpoint(&self) -> Result<&HandshakeResponder<N>, EngineError> {
        let ep = self.hs_endpoint()?;
        if self.cfg.handshake_thread && !self.forked.load(Ordering::Relaxed) {
            ep.thread.get_or_try_init(|| ep.hs.spawn_progress())?;
        }
        Ok(&ep.hs)
    }

    /// DC mode: the DCT with its SRQ and receive CQ, created on first need
    /// (exactly once, see [`lazy`]): when the node must be reachable, i.e.
    /// by [`Engine::local_target`] (what a node registers with the meta
    /// server), by [`Engine::alloc_mr`] with remote access, and by the first
    /// messaging port or endpoint (`msg`).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in RC fallback mode (no DCT), or when it
    /// must be created in a forked child; [`EngineError::Nic`] when the
    /// device refuses a resource (nothing is kept; the next call tries
    /// again).
    fn receiver(&self) -> Result<&Receiver<N>, EngineError> {
        let ModeState::Dc(r) = &self.mode_state else {
            return Err(EngineError::Unsupported {
                reason: "RC fallback mode has no DCT (its handshake endpoint is its address)",
            });
        };
        self.create_once(r, "creating the DCT in a forked child", || {
            start_receiver(&*self.nic, &self.pd, &self.cfg)
        })
    }

    /// `lazy`'s value, created by `create` unless this is a forked child
    /// (a child creates no NIC object: see [`fork`]).
    fn create_once<'a, T>(
        &self,
        lazy: &'a Lazy<T>,
        in_child: &'static str,
        create: impl FnOnce() -> Result<T, EngineError>,
    ) -> Result<&'a T, EngineError> {
        if let Some(v) = lazy.get() {
            return Ok(v);
        }
        self.refuse_in_child(in_child)?;
        lazy.get_or_try_init(create)
    }

    /// A DCI of the pool, round-robin (created when the pool is below its
    /// cap: the pool grows in order).
    fn pick_dci(&self) -> Result<Arc<PhysQp<N>>, EngineError> {
        let k = self.next_dci.fetch_add(1, Ordering::Relaxed) % self.cfg.pool_size;
        let mut pool = self.pool.lock();
        if let Some(d) = pool.get(k) {
            return Ok(d.clone());
        }
        let index = pool.len();
        let d = Arc::new(PhysQp::dci(self, index)?);
        pool.push(d.clone());
        Ok(d)
    }

    /// DCI 0 of the pool, created if the pool is empty (the meta client's
    /// READs go through it).
    pub(crate) fn first_dci(&self) -> Result<Arc<PhysQp<N>>, EngineError> {
        let mut pool = self.pool.lock();
        if let Some(d) = pool.first() {
            return Ok(d.clone());
        }
        let d = Arc::new(PhysQp::dci(self, 0)?);
        pool.push(d.clone());
        Ok(d)
    }
}

impl<N: Nic> Drop for EngineInner<N> {
    /// RC fallback mode: tells every target (and the meta node) that this
    /// node's ends of their pairs are gone, so that they free theirs (best
    /// effort: a lost Close leaves an end until its responder needs room).
    fn drop(&mut self) {
        if let ModeState::Rc(f) = &self.mode_state {
            if let Some(e) = f.ep.get() {
                f.pool.close_all(&e.hs);
            }
            if let Some(m) = self.meta.get() {
                m.close();
            }
        }
        // DC mode: the upgrade's idle pairs were closed (and their targets
        // told) when the last handle went (see `Engine::drop`).
    }
}

/// The KRCore control plane of one NIC port, hosted in this process.
///
/// Cheap to clone (`Arc`); `Send + Sync`. See the module docs for what it
/// holds and which locks what takes.
pub struct Engine<N: Nic> {
    pub(super) inner: Arc<EngineInner<N>>,
}

impl<N: Nic> Clone for Engine<N> {
    fn clone(&self) -> Self {
        Engine::handle(self.inner.clone())
    }
}

impl<N: Nic> Drop for Engine<N> {
    /// The last handle releases the services that hold the engine (the
    /// upgrade's handshake over messaging, see `handshake_msg`), so that the
    /// engine is freed once its VQPs, ports and endpoints are gone too.
    ///
    /// DC mode: the upgrade's idle RC pairs are closed first and their
    /// targets told (bounded: one post each, no wait; see
    /// `rc::RcPool::close_idle`). Runs once: the internal handles the
    /// release itself makes (and drops) do not run it again.
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1
            && !self.inner.released.swap(true, Ordering::AcqRel)
        {
            if let (Some(pool), Some(_)) = (self.inner.rc_pool(), self.inner.handshake_msg()) {
                pool.close_idle(&*self.inner);
            }
            if let Some(hs) = self.inner.handshake_msg() {
                hs.release();
            }
            self.inner.release_meta_client();
        }
    }
}

impl<N: Nic> Engine<N> {
    /// A handle of `inner` (counted, see [`EngineInner::handles`]).
    pub(crate) fn handle(inner: Arc<EngineInner<N>>) -> Engine<N> {
        inner.handles.fetch_add(1, Ordering::AcqRel);
        Engine { inner }
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
    /// - DC mode (the device has DC): a PD, `cfg.prestart` DCIs, the
    ///   DCCache and the meta client (no QP of its own: its READs go through
    ///   DCI 0 of the pool). Nothing else: the DCT with its SRQ and receive
    ///   CQ is created when the node must be reachable, and with
    ///   `upgrade_endpoint` the upgrade's handshake port when the node
    ///   serves upgrades (see [`Engine::local_target`],
    ///   [`Engine::handshake_entry`]), unless `cfg.eager_start` does both
    ///   here. With `prestart` 0 the start
    ///   creates no QP at all: a compute node that only issues one-sided
    ///   operations creates one DCI (its first VQP's) before its first get.
    /// - RC fallback mode (no DC): a PD, the handshake endpoint (a UD QP,
    ///   instead of a DCT: it is the node's address; with
    ///   `cfg.handshake_thread` its thread starts when the address is first
    ///   handed out, see [`Engine::local_target`]), no DCI pool (RC pairs are made by
    ///   connects), the DCCache, and the meta client's RC QP when `cfg.meta`
    ///   is set (paired at the first lookup).
    ///   [`Engine::mode`] and [`EngineStats::mode`] say which.
    ///
    /// First of all it takes the port's lock on the machine
    /// ([`krcore_nic::Nic::port_lock_path`]): one engine per port, held
    /// while the engine's state lives (unless `cfg.port_lock` is off).
    ///
    /// # Errors
    /// [`EngineError::PortInUse`] when another engine holds the port's
    /// lock; [`EngineError::Config`]; [`EngineError::Nic`] when the device
    /// refuses a resource; in RC fallback mode
    /// [`EngineError::NotAFallbackNode`] when `cfg.meta` names a DC meta
    /// server.
    pub fn start(nic: N, cfg: EngineConfig) -> Result<Engine<N>, EngineError> {
        cfg.validate()?;
        let port_lock = match nic.port_lock_path().filter(|_| cfg.port_lock) {
            Some(path) => super::port_lock::PortLock::acquire(&path, nic.gid())?,
            None => None,
        };
        let caps = nic.caps();
        let mut policy = cfg.policy;
        policy.max_sge = policy.max_sge.min(caps.max_sge as usize).max(1);
        policy.max_inline = policy.max_inline.min(caps.max_inline as usize);
        let nic = Arc::new(nic);
        let pd = nic
            .alloc_pd()
            .map_err(EngineError::nic("allocate the PD"))?;
        let (mode_state, upgrade) = if caps.dc {
            let receiver = if cfg.eager_start {
                Lazy::ready(start_receiver(&*nic, &pd, &cfg)?)
            } else {
                Lazy::new()
            };
            let up = cfg.upgrade_endpoint.then(|| {
                Box::new(Upgrade {
                    hs: handshake_msg::HsMsg::default(),
                    pool: RcPool::default(),
                })
            });
            (ModeState::Dc(receiver), up)
        } else {
            let rx = RcRx {
                cq: nic
                    .create_cq(cfg.recv_depth)
                    .map_err(EngineError::nic("create the receive CQ"))?,
                srq: nic
                    .create_srq(&pd, cfg.recv_depth, 1)
                    .map_err(EngineError::nic("create the SRQ"))?,
            };
            let f = Fallback {
                ep: Lazy::ready(start_endpoint(&nic, &pd, &cfg, &rx)?),
                pool: RcPool::default(),
                rx,
            };
            (ModeState::Rc(Box::new(f)), None)
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
                match &mode_state {
                    ModeState::Rc(f) => f.ep.get().map(|e| e.hs.clone()),
                    ModeState::Dc(_) => None,
                },
            )?),
            None => None,
        };
        let words = Arc::new(PostWords::default());
        let inner = Arc::new_cyclic(|me| EngineInner {
            me: me.clone(),
            handles: AtomicUsize::new(0),
            released: AtomicBool::new(false),
            meta_ep: Mutex::new(None),
            meta_next_id: AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos() as u64,
            ),
            dev: Arc::new(Device {
                cache: DcCache::new(cfg.cache_capacity),
                nic,
                pd,
                policy,
                mrs: Arc::new(MrRegistry::new(words.clone())),
                words,
                cfg,
                forked: AtomicBool::new(false),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                upgrades: AtomicU64::new(0),
                downgrades: AtomicU64::new(0),
                upgrade_failures: AtomicU64::new(0),
            }),
            mode_state,
            upgrade,
            meta: meta.map_or_else(OnceLock::new, OnceLock::from),
            pool: Mutex::new(Vec::new()),
            next_dci: AtomicUsize::new(0),
            next_vqp: AtomicU32::new(1),
            msg: OnceLock::new(),
            msg_init: Mutex::new(()),
            _port_lock: port_lock,
        });
        if inner.mode() == EngineMode::Dc {
            let mut pool = inner.pool.lock();
            for i in 0..inner.cfg.prestart {
                pool.push(Arc::new(PhysQp::dci(&inner, i)?));
            }
        }
        let engine = Engine::handle(inner);
        if engine.inner.cfg.eager_start {
            if let Some(hs) = engine.inner.handshake_msg() {
                hs.serve(&(engine.inner.clone() as Arc<dyn UpgradeHost<N>>))?;
            }
        }
        Ok(engine)
    }

    /// How the engine reaches other nodes (DC, or the RC fallback).
    pub fn mode(&self) -> EngineMode {
        self.inner.mode()
    }

    /// One non-blocking step of the handshake's responder: answers
    /// peers' handshakes. RC fallback mode: the UD handshake endpoint (see
    /// [`HandshakeResponder::progress`]). DC mode with `upgrade_endpoint`,
    /// once the node serves upgrades ([`Engine::handshake_entry`]): the
    /// reserved messaging port [`handshake_msg::HANDSHAKE_PORT`] (see [`handshake_msg`]).
    /// Needed for this node to accept connections (upgrades) unless the
    /// engine runs its handshake thread. A no-op returning 0 when there is
    /// nothing to serve (DC mode: before the node serves upgrades; nobody
    /// can reach it then).
    ///
    /// # Errors
    /// Provider failures of the endpoint (CQ overflow, a refused post).
    pub fn progress(&self) -> Result<usize, EngineError> {
        if let Some(hs) = self.inner.handshake_msg() {
            return hs.progress();
        }
        match self.inner.handshake_ud() {
            Some(hs) => {
                let n = hs.progress();
                self.inner.forget_restarted_peers();
                n
            }
            None => Ok(0),
        }
    }

    /// RC fallback mode: the handshake endpoint (DC mode has none: the
    /// upgrade's handshake travels as messages, see [`handshake_msg`]). Looking
    /// at it starts no thread: publish the node's address with
    /// [`Engine::local_target`].
    pub fn handshake_responder(&self) -> Option<&HandshakeResponder<N>> {
        self.inner.handshake_ud()
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
    /// DC mode: its DCT (`dct_num`, `dc_key`), created by the first call
    /// (or an earlier first need, see [`Engine::start`]): the engine starts
    /// without it, since a node that only issues one-sided operations is
    /// never reached. Concurrent first calls create one DCT and all return
    /// it. RC fallback mode: the same entry layout names the handshake
    /// endpoint instead (created at start): `dct_num` is the endpoint's UD
    /// QPN and `dc_key` its qkey (below 2^32, which is how a fallback engine
    /// tells such an entry from a DC node's); with `handshake_thread` the
    /// first call starts the thread that answers peers' handshakes (see
    /// [`EngineConfig::handshake_thread`]). The engine knows the fabric's
    /// mode from its own device; mixed DC/RC-fallback clusters are not
    /// supported (a fallback engine refuses a DC node's entry with
    /// [`EngineError::NotAFallbackNode`]).
    ///
    /// # Errors
    /// DC mode: [`EngineError::Nic`] when the device refuses the DCT, SRQ
    /// or receive CQ (the next call tries again);
    /// [`EngineError::Unsupported`] in a forked child whose parent had not
    /// created the DCT before the fork. RC fallback mode:
    /// [`EngineError::Config`] when the handshake thread cannot be spawned
    /// (the next call tries again).
    pub fn local_target(&self) -> Result<DcTarget, EngineError> {
        let gid = self.inner.nic.gid();
        match &self.inner.mode_state {
            ModeState::Dc(_) => Ok(DcTarget {
                gid,
                dct_num: self.inner.receiver()?.dct.qpn(),
                dc_key: self.inner.cfg.dc_key,
            }),
            ModeState::Rc(_) => {
                let t = self.inner.served_endpoint()?.target();
                Ok(DcTarget {
                    gid,
                    dct_num: t.qpn,
                    dc_key: u64::from(t.qkey),
                })
            }
        }
    }

    /// DC mode with `upgrade_endpoint`: makes this node serve upgrade
    /// handshakes, and returns the meta entry that says so, for the host
    /// to register beside [`Engine::local_target`]: GID [`handshake_gid`]
    /// of this node's, naming its DCT (`dct_num`, `dc_key`), whose reserved
    /// messaging port [`handshake_msg::HANDSHAKE_PORT`] answers the handshakes
    /// (no UD QP: see [`handshake_msg`]). An initiator looks this entry up before
    /// it asks for a pair: a node without it is not asked. `Ok(None)` in RC
    /// fallback mode (the node's own entry names its handshake endpoint)
    /// and without `upgrade_endpoint`.
    ///
    /// The first call creates the DCT (if not yet), the messaging host and
    /// binds the reserved port; with `handshake_thread` it starts the
    /// thread serving it, otherwise the host calls [`Engine::progress`]. A
    /// node that only initiates upgrades never calls it and serves nothing.
    ///
    /// # Errors
    /// [`EngineError::Nic`] when the device refuses the DCT or messaging's
    /// buffers (the next call tries again); [`EngineError::Unsupported`]
    /// in a forked child, or after the engine's last handle was dropped.
    pub fn handshake_entry(&self) -> Result<Option<DcTarget>, EngineError> {
        let Some(hs) = self.inner.handshake_msg() else {
            return Ok(None);
        };
        hs.serve(&(self.inner.clone() as Arc<dyn UpgradeHost<N>>))?;
        Ok(Some(DcTarget {
            gid: handshake_gid(&self.inner.nic.gid()),
            dct_num: self.inner.receiver()?.dct.qpn(),
            dc_key: self.inner.cfg.dc_key,
        }))
    }

    /// DC mode with `upgrade_endpoint`: stops serving upgrade handshakes
    /// (the reserved port is unbound: Requests queued there are discarded,
    /// their initiators time out; later ones are refused, typed). Pairs
    /// made before keep working. [`Engine::handshake_entry`] serves again.
    pub fn stop_serving_upgrades(&self) {
        if let Some(hs) = self.inner.handshake_msg() {
            hs.stop_serving();
        }
    }

    /// DC mode: makes (or finds) the RC pair to `gid` now, through a
    /// handshake (over messaging) with the target's engine, so that the VQPs' upgrades to
    /// it cost no handshake (a VQP moves at its hint or threshold; see
    /// [`Vqp::upgrade`]).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in RC fallback mode or without
    /// `upgrade_endpoint`; as [`Vqp::upgrade`].
    pub fn upgrade(&self, gid: &Gid) -> Result<(), EngineError> {
        rc::pair_for(&*self.inner, gid).map(|_| ())
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
        self.inner.meta.get().map(|m| m.location())
    }

    /// Creates a VQP. DC mode: bound round-robin to a DCI of the pool
    /// (creating the DCI when the pool is below its cap). RC fallback mode:
    /// unbound until its first connect (no QP is created here).
    ///
    /// # Errors
    /// [`EngineError::VqpIdsExhausted`]; [`EngineError::Nic`] when a DCI
    /// cannot be created.
    pub fn create_vqp(&self) -> Result<Vqp<N>, EngineError> {
        MsgHost::create_vqp(&*self.inner)
    }

    /// Allocates `len` bytes of zeroed memory registered in the engine's PD
    /// and known to the pre-check as this process's.
    ///
    /// DC mode: memory with remote access is there for peers, which reach
    /// it through this node's DCT: the first such MR creates the DCT (see
    /// [`Engine::local_target`]) if it does not exist yet. Local-only
    /// memory (`LOCAL_WRITE`, the buffers of a node that only issues
    /// one-sided operations) creates nothing but the MR.
    ///
    /// # Errors
    /// [`EngineError::Nic`] with the provider's refusal (of the MR, or of
    /// the DCT).
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<OwnedMr<N>, EngineError> {
        self.inner
            .refuse_in_child("allocating an MR in a forked child")?;
        if self.mode() == EngineMode::Dc && access.0 & REMOTE_ACCESS.0 != 0 {
            self.inner.receiver()?;
        }
        let mr = self
            .inner
            .nic
            .alloc_mr(&self.inner.pd, len, access)
            .map_err(EngineError::nic("allocate an MR"))?;
        Ok(OwnedMr::new(mr, &self.inner.nic, &self.inner.mrs))
    }

    /// Makes an MR the caller registered (with [`Nic::register_mr`] or
    /// [`Nic::alloc_mr`], in [`Engine::pd`]) known to the pre-check as this
    /// process's. The engine cannot check the MR's PD: one registered in
    /// another PD passes the pre-check and fails at the NIC. Creates no
    /// DCT: peers reach the MR once the node is reachable
    /// ([`Engine::local_target`], which a node calls to register).
    pub fn register_mr(&self, mr: N::Mr) -> OwnedMr<N> {
        OwnedMr::new(mr, &self.inner.nic, &self.inner.mrs)
    }

    /// Resolves `gid` through the DCCache, or the meta server on a miss
    /// (what [`Vqp::connect`] does).
    ///
    /// # Errors
    /// As [`Vqp::connect`].
    pub fn resolve(&self, gid: &Gid) -> Result<CachedTarget, EngineError> {
        RcHost::resolve(&*self.inner, gid)
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
        let meta = self.inner.meta.get();
        if let Some(m) = meta {
            m.exclude_from(&mut dci);
        }
        EngineStats {
            dcts_created: match &self.inner.mode_state {
                ModeState::Dc(r) => r.creations(),
                ModeState::Rc(_) => 0,
            },
            handshake_endpoints_created: match &self.inner.mode_state {
                ModeState::Rc(f) => f.ep.creations(),
                ModeState::Dc(_) => 0,
            },
            handshake_thread_running: match &self.inner.mode_state {
                ModeState::Rc(f) => f.ep.get().is_some_and(|e| e.thread.get().is_some()),
                ModeState::Dc(_) => false,
            },
            mode: self.inner.mode(),
            rc: self.inner.rc_pool().map(RcPool::stats).unwrap_or_default(),
            handshake: match self.inner.handshake_msg() {
                Some(hs) => hs.stats(),
                None => self
                    .inner
                    .handshake_ud()
                    .map(HandshakeResponder::stats)
                    .unwrap_or_default(),
            },
            dcis: pool.len(),
            vqps_created: u64::from(self.inner.next_vqp.load(Ordering::Relaxed) - 1),
            connect_hits: self.inner.hits.load(Ordering::Relaxed),
            connect_misses: self.inner.misses.load(Ordering::Relaxed),
            meta: meta.map(MetaClient::stats).unwrap_or_default(),
            dci,
            owned_mrs: self.inner.mrs.len(),
            rc_upgrades: self.inner.upgrades.load(Ordering::Relaxed),
            rc_downgrades: self.inner.downgrades.load(Ordering::Relaxed),
            rc_upgrade_failures: self.inner.upgrade_failures.load(Ordering::Relaxed),
        }
    }
}

/// DC mode: the DCT with its SRQ and receive CQ, brought up.
fn start_receiver<N: Nic>(
    nic: &N,
    pd: &N::Pd,
    cfg: &EngineConfig,
) -> Result<Receiver<N>, EngineError> {
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
    tracing::debug!(qpn = dct.qpn(), gid = %nic.gid(), "DCT created");
    Ok(Receiver { cq, srq, dct })
}

/// RC fallback mode: the handshake endpoint in the engine's PD (the node's
/// address), its passive ends sharing `rx` (messages arrive over peers'
/// pairs); its thread (with `cfg.handshake_thread`) is started when the
/// address is handed out ([`EngineInner::served_endpoint`]).
fn start_endpoint<N: Nic>(
    nic: &Arc<N>,
    pd: &N::Pd,
    cfg: &EngineConfig,
    rx: &RcRx<N>,
) -> Result<HsEndpoint<N>, EngineError> {
    let hs = HandshakeResponder::start_shared(
        nic.clone(),
        pd.clone(),
        cfg.handshake.clone(),
        Some((rx.srq.clone(), rx.cq.clone())),
    )?;
    Ok(HsEndpoint {
        hs,
        thread: Lazy::new(),
    })
}

impl<N: Nic> EngineInner<N> {
    /// The engine's last handle went: drop the registration endpoint (it
    /// holds the engine), unless a call holds it (that call drops it).
    pub(crate) fn release_meta_client(&self) {
        if let Some(mut c) = self.meta_ep.try_lock() {
            c.take();
        }
    }
}

impl<N: Nic> Engine<N> {
    /// Ends the leases that expired (deregisters their keys) now, without
    /// waiting for the lease reaper; returns how many leases stay live.
    pub fn sweep_leases(&self) -> usize {
        self.inner.mrs.sweep(Instant::now())
    }

    /// The counters of the engine's leases: live, granted, revoked,
    /// expired, and how late expired keys were deregistered.
    pub fn lease_stats(&self) -> LeaseStats {
        self.inner.mrs.lease_stats()
    }
}
