//! RC fallback mode: the node's RC pairs, one per target, in a bounded LRU
//! cache, each made by a handshake with the target's responder. What is
//! cached and how pairs are evicted is documented on [`RcStats`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use krcore_nic::{Gid, Nic, QpType, QueuePair, UdTarget};
use parking_lot::{Condvar, Mutex};

use super::config::EngineMode;
use super::device::{Device, QpHost};
use super::error::{EngineError, VqpError};
use super::handshake_ud::HandshakeResponder;
use super::pairing::handshake_target;
use super::physqp::{create_qp, PhysQp, RcLink};
use crate::dccache::CachedTarget;
use crate::sharedqp::DciStats;

/// What the RC pairs, and the VQPs posting on them or on DCIs, need of
/// their engine: the shared QP's host ([`QpHost`]), the pairs, how a GID
/// resolves, and how a closed pair's target is told. The engine object
/// implements it; a VQP holds its engine as `Arc<dyn RcHost<N>>` (and the
/// device beside it, for what its hot paths read), so that neither names
/// the engine object (the services above it, messaging and
/// the upgrade's handshake, are reached only through these calls).
pub(crate) trait RcHost<N: Nic>: QpHost<N> + Send + Sync {
    /// How the engine reaches other nodes.
    fn mode(&self) -> EngineMode;

    /// The RC pairs: RC fallback mode; DC mode with `upgrade_endpoint`
    /// (the upgraded VQPs' pairs).
    fn rc_pool(&self) -> Option<&RcPool<N>>;

    /// The UD handshake endpoint (RC fallback mode), if created.
    fn handshake_ud(&self) -> Option<&HandshakeResponder<N>>;

    /// DC mode with `upgrade_endpoint`: tells the node `gid` that this
    /// node closed its end `qpn` of their pair (one message, no wait; no
    /// message without the upgrade's handshake).
    fn tell_closed_msg(&self, qpn: u32, gid: Gid, nonce: u64);

    /// A DCCache miss of `gid`: one meta READ, whose entry is cached
    /// (counted as a connect miss).
    ///
    /// # Errors
    /// As [`super::Engine::resolve`].
    fn resolve_miss(&self, gid: &Gid) -> Result<CachedTarget, EngineError>;

    /// DCCache first ([`Device::cached`]); on a miss one meta READ
    /// ([`RcHost::resolve_miss`]).
    ///
    /// # Errors
    /// As [`super::Engine::resolve`].
    fn resolve(&self, gid: &Gid) -> Result<CachedTarget, EngineError> {
        match self.dev().cached(gid) {
            Some(hit) => Ok(hit),
            None => self.resolve_miss(gid),
        }
    }
}

/// A VQP's posts and polls pass the handle itself: the inline fast paths
/// never look at their host, so the handle is dereferenced (an `Arc` of a
/// trait object: its data offset is read from the vtable) only on the
/// general paths that do.
impl<N: Nic> QpHost<N> for Arc<dyn RcHost<N>> {
    #[inline(always)]
    fn dev(&self) -> &Device<N> {
        (**self).dev()
    }

    fn pair_up(&self, qp: &N::Qp, target: UdTarget) -> Result<u64, EngineError> {
        (**self).pair_up(qp, target)
    }
}

/// Field access through the engine as a VQP holds it (`eng.cfg`).
impl<N: Nic> std::ops::Deref for dyn RcHost<N> + '_ {
    type Target = Device<N>;

    #[inline(always)]
    fn deref(&self) -> &Device<N> {
        self.dev()
    }
}

/// Statistics of the RC pairs (RC fallback mode): the node's RC pairs,
/// one per target, in a bounded LRU cache, each made by a handshake with
/// the target's responder.
///
/// # What is cached
///
/// - Per target GID, at most one open RC pair: an RC QP of this node (in the
///   engine's PD, with its own send CQ, `dci_depth` deep) paired with a
///   passive QP of the target, shared by every VQP of this node connected to
///   that target. At most `EngineConfig::rc_cap` pairs exist at any time.
/// - Each pair's LRU stamp: the engine's RC tick when a post or a connect
///   last used it. Exact LRU at a small cost on the data path: a post loads
///   the shared tick, and bumps it (one `fetch_add`) only when another pair
///   was used since this one's last post.
///
/// # Creating and evicting
///
/// Creation is serialized (one creator at a time: the cache's `create`
/// lock; lookups of existing pairs take only the map lock, briefly): make
/// room first (so the cap holds at every instant; a handshake that then
/// fails may have evicted an idle pair, rebuilt on its next use), then
/// create the QP, bring it to INIT, handshake, RTR/RTS. A handshake that
/// fails destroys the new QP before returning: nothing is left behind (on
/// the target either: a timed-out handshake sends a Close, and an end that
/// still lingers is reclaimed by the responder's `passive_cap`).
///
/// Making room evicts, in order: closed pairs (lost after an error), then
/// the least recently used pair *with no WR in flight* (its CQ is drained
/// first) and not reserved (DC mode upgrade: a pair built in the
/// background is kept for the VQPs that asked for it until one of them
/// takes it, all of them gave up, or 1 s (`RESERVE_FOR`) passed; otherwise two
/// hot targets under a cap of one would evict each other's fresh pair
/// before its VQP ever looked). A pair with WRs in flight is never evicted: when every pair has
/// some, the connect is refused with [`EngineError::RcPairsBusy`] (the
/// caller polls and retries). An evicted pair's QP is destroyed at once and
/// its target is told (best effort: a Close datagram over UD; in DC mode an
/// only message to its handshake port, see `super::handshake_msg`); VQPs still bound to
/// it get a new pair on their next post.
///
/// Lock order: `create`, then the map; a pair's own lock is never taken
/// while the map lock is held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RcStats {
    /// Open pairs now.
    pub pairs: usize,
    /// Pairs created (each one RC QP and one handshake).
    pub created: u64,
    /// Connects (and re-binds) answered by an existing pair: no QP, no
    /// network.
    pub reused: u64,
    /// Pairs evicted to make room (LRU, idle ones only).
    pub evicted: u64,
    /// Connects refused because every pair had WRs in flight.
    pub busy: u64,
    /// Handshakes for a new pair that failed (typed errors to the caller).
    pub failed: u64,
    /// DC mode upgrade: pairs requested from the background builder
    /// (one per target at a time, shared by the VQPs waiting for it).
    pub builds: u64,
    /// DC mode upgrade: background builds that ended (`builds -
    /// builds_done` are in flight).
    pub builds_done: u64,
    /// DC mode upgrade: background builds that failed (no handshake entry,
    /// refused, timed out, pairs busy).
    pub build_failures: u64,
    /// Pairs closed because their target restarted on its GID (a
    /// handshake came from another endpoint of that GID than the pair's;
    /// see `RcPool::forget_restarted`).
    pub restarted: u64,
    /// The pairs' queue statistics, summed (closed pairs included).
    pub qp: DciStats,
}

/// The cache of RC pairs (see the module docs).
pub(crate) struct RcPool<N: Nic> {
    map: Mutex<HashMap<Gid, Arc<PhysQp<N>>>>,
    create: Mutex<()>,
    next_index: AtomicUsize,
    pub(crate) stats: Mutex<RcStats>,
    /// DC mode upgrade: the background builder, started by the first
    /// request (see `super::upgrade`); stopped and joined with the pool.
    pub(crate) builder: Mutex<Option<Builder>>,
    /// DC mode upgrade: pairs built in the background and not yet taken by
    /// the VQPs waiting for them (their ticket, and when the reservation
    /// lapses): not evicted meanwhile (see `make_room`).
    reserved: Mutex<HashMap<Gid, (Weak<Build>, Instant)>>,
}

/// Longest a pair built in the background stays reserved for the VQPs that
/// asked for it when none of them takes it (they stopped posting).
pub(crate) const RESERVE_FOR: Duration = Duration::from_secs(1);

impl<N: Nic> Default for RcPool<N> {
    fn default() -> RcPool<N> {
        RcPool {
            map: Mutex::new(HashMap::new()),
            create: Mutex::new(()),
            next_index: AtomicUsize::new(1),
            stats: Mutex::new(RcStats::default()),
            builder: Mutex::new(None),
            reserved: Mutex::new(HashMap::new()),
        }
    }
}

impl<N: Nic> RcPool<N> {
    pub(crate) fn stats(&self) -> RcStats {
        let pairs: Vec<_> = self.map.lock().values().cloned().collect();
        let mut s = *self.stats.lock();
        s.pairs = 0;
        for p in &pairs {
            s.qp.add(&p.stats());
            s.pairs += usize::from(p.is_open());
        }
        s
    }

    /// The open pair to `gid`, if any (no QP, no network).
    pub(crate) fn get(&self, gid: &Gid) -> Option<Arc<PhysQp<N>>> {
        let p = self.map.lock().get(gid).cloned()?;
        p.is_open().then_some(p)
    }

    /// Reserves the pair to `gid` for the holders of `build` (see
    /// `reserved`).
    pub(crate) fn reserve(&self, gid: Gid, build: &Arc<Build>) {
        self.reserved
            .lock()
            .insert(gid, (Arc::downgrade(build), Instant::now() + RESERVE_FOR));
    }

    /// Whether the pair to `gid` is reserved (a waiting VQP still holds
    /// its ticket, and the reservation has not lapsed). Drops lapsed ones.
    fn is_reserved(&self, gid: &Gid) -> bool {
        let mut r = self.reserved.lock();
        let now = Instant::now();
        r.retain(|_, (w, until)| w.strong_count() > 0 && *until > now);
        r.contains_key(gid)
    }

    /// The open pair to `gid`, if any, counted as a reuse and stamped as
    /// used (as a hit of [`acquire_with`]).
    pub(crate) fn existing(&self, eng: &dyn RcHost<N>, gid: &Gid) -> Option<Arc<PhysQp<N>>> {
        let p = self.get(gid)?;
        self.stats.lock().reused += 1;
        if let Some(l) = p.rc_link() {
            l.used.store(
                eng.words.rc_tick.fetch_add(1, Ordering::Relaxed) + 1,
                Ordering::Relaxed,
            );
        }
        Some(p)
    }

    /// Closes every pair and tells each target (best effort): the engine
    /// is going away.
    pub(crate) fn close_all(&self, hs: &HandshakeResponder<N>) {
        let pairs: Vec<_> = self.map.lock().drain().map(|(_, p)| p).collect();
        for p in pairs {
            if let (Some(nonce), Some(l)) = (p.close(), p.rc_link()) {
                hs.close(p.qpn(), l.handshake, nonce);
            }
        }
    }

    /// DC mode, the engine's last handle went: closes every open pair with
    /// no WR in flight and tells its target (one only message each, no
    /// wait: see `super::handshake_msg::HsMsg::close`), so that targets free
    /// their passive ends now rather than at their `passive_cap`. A pair
    /// with WRs in flight stays (its VQPs still post on it; a VQP finding
    /// its pair closed moves back to its DCI). Returns the pairs closed.
    pub(crate) fn close_idle(&self, eng: &dyn RcHost<N>) -> usize {
        if eng.mode() != EngineMode::Dc {
            return 0;
        }
        let pairs: Vec<(Gid, Arc<PhysQp<N>>)> = self
            .map
            .lock()
            .iter()
            .map(|(g, p)| (*g, p.clone()))
            .collect();
        let mut closed = 0;
        for (gid, p) in pairs {
            if !p.is_open() {
                continue;
            }
            let Ok(Some(nonce)) = p.close_if_idle(eng) else {
                continue;
            };
            self.map.lock().remove(&gid);
            self.retire(&p);
            eng.tell_closed_msg(p.qpn(), gid, nonce);
            closed += 1;
        }
        closed
    }

    /// A Request came from `peer`'s handshake endpoint (RC fallback mode):
    /// if this node's pair to `peer.gid` was made with another endpoint of
    /// that GID, the peer restarted there (a new process on the same GID)
    /// and the pair leads to a QP that no longer exists, where RDMA drops
    /// what is sent, silently, until the retries run out. Closes that pair
    /// now if it has no WR in flight (one with WRs in flight stays: they
    /// fail, `RETRY_EXC_ERR`, and the pair is closed then); its VQPs get a
    /// new pair, with the new endpoint, at their next post. Returns
    /// whether a pair was closed. The endpoint is told apart by its UD QPN
    /// only: a restarted peer whose new endpoint got the old one's QPN
    /// (NICs allocate QPNs cyclically, so it is rare) is found as before,
    /// by the pair's first failed WR.
    pub(crate) fn forget_restarted(&self, eng: &dyn RcHost<N>, peer: UdTarget) -> bool {
        let Some(p) = self.get(&peer.gid) else {
            return false;
        };
        if p.rc_link().is_none_or(|l| l.handshake.qpn == peer.qpn) {
            return false;
        }
        let Ok(Some(_nonce)) = p.close_if_idle(eng) else {
            return false;
        };
        {
            let mut map = self.map.lock();
            if map.get(&peer.gid).is_some_and(|q| Arc::ptr_eq(q, &p)) {
                map.remove(&peer.gid);
            }
        }
        self.retire(&p);
        self.stats.lock().restarted += 1;
        tracing::info!(
            peer = %peer.gid,
            endpoint = peer.qpn,
            "a peer restarted on its GID: its stale RC pair is closed"
        );
        true
    }

    fn retire(&self, p: &PhysQp<N>) {
        let mut s = self.stats.lock();
        let st = p.stats();
        s.qp.add(&st);
    }
}

/// The open pair to `t`'s node, created (one RC QP, one handshake) when
/// there is none. See the module docs for eviction.
///
/// # Errors
/// [`EngineError::Handshake`], [`EngineError::RcPairsBusy`],
/// [`EngineError::NotAFallbackNode`], [`EngineError::Nic`].
pub(crate) fn acquire<N: Nic>(
    eng: &dyn RcHost<N>,
    t: CachedTarget,
) -> Result<Arc<PhysQp<N>>, EngineError> {
    let hs_target = handshake_target(&t.target)?;
    acquire_with(eng, t.target.gid, hs_target)
}

/// The open pair to the node `gid`, whose handshake endpoint is
/// `hs_target` (the DC mode upgrade finds it under another name: see
/// `super::upgrade`). As [`acquire`].
pub(crate) fn acquire_with<N: Nic>(
    eng: &dyn RcHost<N>,
    gid: Gid,
    hs_target: UdTarget,
) -> Result<Arc<PhysQp<N>>, EngineError> {
    let pool = eng.rc_pool().ok_or(EngineError::Unsupported {
        reason: "RC pairs exist only in RC fallback mode or with upgrade_endpoint",
    })?;
    let hit = |p: Arc<PhysQp<N>>| {
        pool.stats.lock().reused += 1;
        if let Some(l) = p.rc_link() {
            l.used.store(
                eng.words.rc_tick.fetch_add(1, Ordering::Relaxed) + 1,
                Ordering::Relaxed,
            );
        }
        p
    };
    if let Some(p) = pool.get(&gid) {
        return Ok(hit(p));
    }
    let _creating = pool.create.lock();
    // Another creator may have made it while this one waited.
    if let Some(p) = pool.get(&gid) {
        return Ok(hit(p));
    }
    make_room(eng, pool)?;
    let (qp, cq) = create_qp(
        eng,
        QpType::Rc,
        ("create an RC pair's CQ", "create an RC QP"),
    )?;
    let nonce = match eng.pair_up(&qp, hs_target) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(target_gid = %gid, qpn = qp.qpn(), reason = %e, "RC pair handshake failed");
            pool.stats.lock().failed += 1;
            // `qp` and `cq` are dropped here: destroyed, nothing leaks.
            return Err(e);
        }
    };
    let link = RcLink {
        gid,
        handshake: hs_target,
        used: AtomicU64::new(eng.words.rc_tick.fetch_add(1, Ordering::Relaxed) + 1),
    };
    let index = pool.next_index.fetch_add(1, Ordering::Relaxed);
    let pair = Arc::new(PhysQp::rc(eng, index, qp, cq, link, nonce));
    if let Some(old) = pool.map.lock().insert(gid, pair.clone()) {
        // A closed pair of the same target: fold its statistics.
        pool.retire(&old);
    }
    pool.stats.lock().created += 1;
    tracing::debug!(target_gid = %gid, qpn = pair.qpn(), index, "RC pair created");
    Ok(pair)
}

/// Evicts until a new pair fits under the cap (see the module docs).
fn make_room<N: Nic>(eng: &dyn RcHost<N>, pool: &RcPool<N>) -> Result<(), EngineError> {
    let cap = eng.cfg.rc_cap;
    loop {
        let snapshot: Vec<(Gid, Arc<PhysQp<N>>)> = pool
            .map
            .lock()
            .iter()
            .map(|(g, p)| (*g, p.clone()))
            .collect();
        // Pair locks are taken with the map lock released.
        let mut pairs: Vec<(u64, bool, Gid, Arc<PhysQp<N>>)> = snapshot
            .into_iter()
            .map(|(g, p)| {
                let used = p.rc_link().map_or(0, |l| l.used.load(Ordering::Relaxed));
                (used, p.is_open(), g, p)
            })
            .collect();
        // Closed pairs hold no QP: drop them from the map first.
        let closed: Vec<Gid> = pairs.iter().filter(|p| !p.1).map(|p| p.2).collect();
        if !closed.is_empty() {
            let mut map = pool.map.lock();
            for g in &closed {
                if let Some(p) = map.remove(g) {
                    pool.retire(&p);
                }
            }
            pairs.retain(|p| p.1);
        }
        if pairs.len() < cap {
            return Ok(());
        }
        pairs.sort_by_key(|p| p.0);
        let mut evicted = false;
        for (_, _, gid, p) in &pairs {
            if pool.is_reserved(gid) {
                continue;
            }
            let nonce = p.close_if_idle(eng).map_err(|e| match e {
                VqpError::Nic { op, source } => EngineError::Nic { op, source },
                other => EngineError::Config(format!("draining an RC pair to evict it: {other}")),
            })?;
            let Some(nonce) = nonce else { continue };
            pool.map.lock().remove(gid);
            pool.retire(p);
            pool.stats.lock().evicted += 1;
            tracing::info!(target_gid = %gid, qpn = p.qpn(), cap, "RC pair evicted (least recently used)");
            if let (Some(hs), Some(l)) = (eng.handshake_ud(), p.rc_link()) {
                hs.close(p.qpn(), l.handshake, nonce);
            } else if let Some(l) = p.rc_link() {
                eng.tell_closed_msg(p.qpn(), l.gid, nonce);
            }
            evicted = true;
            break;
        }
        if !evicted {
            pool.stats.lock().busy += 1;
            return Err(EngineError::RcPairsBusy { cap });
        }
    }
}

/// The name of `gid`'s upgrade entry in the meta table (DC mode): the
/// GID with bit 0 of its first byte flipped. Port GIDs never collide with
/// it: link-local `fe80::` becomes multicast `ff80::`, IPv4-mapped `::ffff:`
/// becomes the discard prefix `0100::`, and on `sim` the first byte is the
/// fabric's id, the same for every node of a fabric.
pub fn handshake_gid(gid: &Gid) -> Gid {
    let mut g = gid.0;
    g[0] ^= 0x01;
    Gid(g)
}

/// The RC pair to the node `gid` for the upgrade: existing, or made by a
/// handshake (over messaging) with a node that registered [`handshake_gid`]
/// of its GID.
pub(crate) fn pair_for<N: Nic>(
    eng: &dyn RcHost<N>,
    gid: &Gid,
) -> Result<Arc<PhysQp<N>>, EngineError> {
    if eng.mode() != EngineMode::Dc || eng.rc_pool().is_none() {
        return Err(EngineError::Unsupported {
            reason: "the DC -> RC upgrade needs DC mode and EngineConfig::upgrade_endpoint",
        });
    }
    // The pool's pairs are the parent's QPs (shared mappings, guarded by
    // the parent's locks, not the child's copies): a child never posts on
    // them, nor makes its own.
    eng.refuse_in_child("the DC -> RC upgrade in a forked child")?;
    // The entry says the node serves upgrades (on its DCT's reserved
    // messaging port); the handshake goes to the node's GID.
    let t = eng.resolve(&handshake_gid(gid))?;
    let hs = krcore_nic::UdTarget {
        gid: *gid,
        qpn: t.target.dct_num,
        qkey: 0,
    };
    acquire_with(eng, *gid, hs)
}

/// One background build of the pair to one node: the ticket the VQPs
/// waiting for it hold.
#[derive(Debug)]
pub(crate) struct Build {
    pub(crate) gid: Gid,
    /// Set once by the builder when the build ended: whether it succeeded
    /// (the pair is then in the pair cache, unless evicted since).
    pub(crate) done: OnceLock<bool>,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Arc<Build>>,
    /// The build in flight per target (queued or running).
    inflight: HashMap<Gid, Arc<Build>>,
    stop: bool,
}

#[derive(Default)]
struct BuilderShared {
    jobs: Mutex<Jobs>,
    wake: Condvar,
}

/// The engine's background builder of upgrade pairs (see the module
/// docs): its queue and its thread, stopped and joined when dropped (with
/// the pair cache, so with the engine).
pub(crate) struct Builder {
    shared: Arc<BuilderShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Builder {
    fn drop(&mut self) {
        self.shared.jobs.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            // The engine's last handle may be the builder's own (the user
            // dropped the engine during a build): it exits by itself then.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Starts the engine's builder if it is not running yet (idle on its
/// queue until a request): done at the connect of a counted VQP, so that
/// the first build does not wait for a new thread's first run (a thread
/// that a loaded host schedules milliseconds later).
///
/// # Errors
/// As [`request_build`].
pub(crate) fn start_builder<N: Nic>(eng: &Arc<dyn RcHost<N>>) -> Result<(), EngineError> {
    let pool = eng.rc_pool().ok_or(EngineError::Unsupported {
        reason: "the DC -> RC upgrade needs DC mode and EngineConfig::upgrade_endpoint",
    })?;
    started(eng, &mut pool.builder.lock()).map(|_| ())
}

/// The builder's queue, its thread started if needed.
fn started<'a, N: Nic>(
    eng: &Arc<dyn RcHost<N>>,
    builder: &'a mut Option<Builder>,
) -> Result<&'a Arc<BuilderShared>, EngineError> {
    eng.refuse_in_child("a background RC build in a forked child")?;
    if builder.is_none() {
        let shared = Arc::new(BuilderShared::default());
        let (s, weak) = (shared.clone(), Arc::downgrade(eng));
        let thread = std::thread::Builder::new()
            .name("krcore-upgrade".into())
            .spawn(move || run_builder(&s, &weak))
            .map_err(|e| EngineError::Config(format!("spawn the upgrade builder: {e}")))?;
        *builder = Some(Builder {
            shared,
            thread: Some(thread),
        });
    }
    Ok(&builder.as_ref().expect("started above").shared)
}

/// Asks the builder for the pair to `gid` (starting the builder if
/// needed): the build in flight for `gid`, or a new one.
///
/// # Errors
/// [`EngineError::Unsupported`] without the upgrade or in a forked child;
/// [`EngineError::Config`] when the thread cannot be started.
pub(crate) fn request_build<N: Nic>(
    eng: &Arc<dyn RcHost<N>>,
    gid: Gid,
) -> Result<Arc<Build>, EngineError> {
    let pool = eng.rc_pool().ok_or(EngineError::Unsupported {
        reason: "the DC -> RC upgrade needs DC mode and EngineConfig::upgrade_endpoint",
    })?;
    let mut builder = pool.builder.lock();
    let shared = started(eng, &mut builder)?;
    let mut jobs = shared.jobs.lock();
    if let Some(b) = jobs.inflight.get(&gid) {
        return Ok(b.clone());
    }
    let b = Arc::new(Build {
        gid,
        done: OnceLock::new(),
    });
    jobs.inflight.insert(gid, b.clone());
    jobs.queue.push_back(b.clone());
    pool.stats.lock().builds += 1;
    shared.wake.notify_one();
    Ok(b)
}

/// The builder's loop: one build at a time, until stopped or the engine
/// is gone.
fn run_builder<N: Nic>(shared: &BuilderShared, eng: &Weak<dyn RcHost<N>>) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock();
            loop {
                if jobs.stop {
                    return;
                }
                if let Some(j) = jobs.queue.pop_front() {
                    break j;
                }
                shared.wake.wait(&mut jobs);
            }
        };
        let Some(e) = eng.upgrade() else { return };
        let ok = match pair_for(&*e, &job.gid) {
            Ok(_) => true,
            Err(err) => {
                tracing::warn!(target_gid = %job.gid, reason = %err, "DC -> RC upgrade: building the pair failed");
                false
            }
        };
        if ok {
            if let Some(pool) = e.rc_pool() {
                pool.reserve(job.gid, &job);
            }
        }
        shared.jobs.lock().inflight.remove(&job.gid);
        let _ = job.done.set(ok);
        if let Some(pool) = e.rc_pool() {
            let mut s = pool.stats.lock();
            s.builds_done += 1;
            s.build_failures += u64::from(!ok);
        }
        // Possibly the engine's last handle: dropping it stops this loop.
        drop(e);
    }
}
