//! The RC handshake host (RC fallback mode): [`HandshakeResponder`], one UD
//! endpoint per node that answers peers' handshakes (the responder) and
//! carries this node's own (the initiator). The protocol and its byte layout
//! are in [`crate::handshake`]; what is kept and who drives it is on
//! [`HandshakeResponder`].

use super::config::HandshakeConfig;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use krcore_meta::mr_table::MrTable;
use krcore_meta::registry::MetaTable;
use krcore_meta::wire::{BootstrapRepr, Repr as MetaRepr, MAGIC as META_MAGIC};
use krcore_nic::{
    Access, CompletionQueue, Gid, Nic, QpCaps, QpInit, QpType, QueuePair, RcPeer, Transition,
    UdTarget, Wc,
};
use parking_lot::Mutex;

use super::error::{EngineError, HandshakeFailure};
// The UD endpoint of the handshake (and of a fallback meta host's RPC) is
// the meta crate's, the one UD request/reply endpoint of the workspace.
use krcore_meta::ud::{Incoming as Datagram, UdEndpoint, MAX_DATAGRAM};

/// A UD endpoint's error as the engine's.
fn ud_err(e: krcore_meta::MetaError) -> EngineError {
    match e {
        krcore_meta::MetaError::Nic { op, source } => EngineError::Nic { op, source },
        krcore_meta::MetaError::Post { op, source } => EngineError::Post { op, source },
        krcore_meta::MetaError::Config(c) => EngineError::Config(c),
        other => EngineError::Config(format!("the handshake's UD endpoint: {other}")),
    }
}
use crate::handshake::{HandshakeMessage, HandshakeRepr, RejectCode};

/// What a handshake endpoint did (totals since start, `passive_qps` aside).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandshakeStats {
    /// Initiator: Requests sent (first attempts and retries).
    pub requests_sent: u64,
    /// Initiator: Requests re-sent after a timeout.
    pub retries: u64,
    /// Initiator: handshakes that got an Accept.
    pub paired: u64,
    /// Initiator: handshakes refused by the target.
    pub refused: u64,
    /// Initiator: handshakes that got no answer.
    pub timeouts: u64,
    /// Initiator: Close messages sent.
    pub closes_sent: u64,
    /// Initiator (DC mode): Opens of the target's handshake port refused
    /// `Busy` (every slot held by another initiator's exchange) and asked
    /// again after a pause.
    pub busy: u64,
    /// Responder: Requests answered with an Accept (retries included).
    pub accepted: u64,
    /// Responder: retried Requests answered with the existing QP.
    pub duplicates: u64,
    /// Responder: re-handshakes (a passive QP reset and brought up again).
    pub rearmed: u64,
    /// Responder: Requests answered with a Reject.
    pub rejected: u64,
    /// Responder: passive QPs alive now.
    pub passive_qps: usize,
    /// Responder: passive QPs destroyed to make room.
    pub passive_evicted: u64,
    /// Responder: passive QPs destroyed by their initiator's Close.
    pub closed: u64,
    /// Stale messages ignored: old nonces, late answers.
    pub stale: u64,
    /// Meta RPC requests served (fallback meta host).
    pub meta_requests: u64,
    /// Datagrams that were none of the above (or malformed).
    pub dropped: u64,
    /// Datagrams not sent for lack of a send slot.
    pub lost_sends: u64,
    /// Times the UD QP was found in ERR and brought back.
    pub ud_recoveries: u64,
    /// Errors of the progress thread's calls.
    pub thread_errors: u64,
}

struct Passive<N: Nic> {
    qp: N::Qp,
    nonce: u64,
    /// Tick of the last Request for it (LRU among passive QPs).
    stamp: u64,
}

struct EndpointState<N: Nic> {
    ud: UdEndpoint<N>,
    passives: Passives<N>,
    incoming: Vec<Datagram>,
}

/// The responder's side of the handshake: the passive ends of peers'
/// pairs and the rules that answer a Request or a Close (see
/// [`HandshakeResponder`] for the invariants). Shared by the two carriers
/// of the handshake: the UD endpoint (RC fallback mode) and the reserved
/// messaging port (DC mode, `super::handshake_msg`).
pub(crate) struct Passives<N: Nic> {
    nic: Arc<N>,
    pd: N::Pd,
    cfg: HandshakeConfig,
    map: HashMap<(Gid, u32), Passive<N>>,
    cq: N::Cq,
    /// RC fallback mode with messaging: the node's SRQ and receive CQ, which
    /// the passive ends share (messages arrive over the peers' pairs).
    rx: Option<(N::Srq, N::Cq)>,
    tick: u64,
    wcs: [Wc; 8],
}

impl<N: Nic> Passives<N> {
    /// No passive QP yet; their CQ is created here.
    ///
    /// # Errors
    /// [`EngineError::Config`] for a zero `passive_cap`;
    /// [`EngineError::Nic`] when the device refuses the CQ.
    pub(crate) fn new(
        nic: Arc<N>,
        pd: N::Pd,
        cfg: HandshakeConfig,
        rx: Option<(N::Srq, N::Cq)>,
    ) -> Result<Passives<N>, EngineError> {
        if cfg.passive_cap == 0 {
            return Err(EngineError::Config("passive_cap must be at least 1".into()));
        }
        let cq = nic
            .create_cq(64)
            .map_err(EngineError::nic("create the passive RC CQ"))?;
        Ok(Passives {
            nic,
            pd,
            cfg,
            map: HashMap::new(),
            cq,
            rx,
            tick: 0,
            wcs: [Wc::default(); 8],
        })
    }

    /// Passive QPs alive now.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Passive QPs never post; anything on their CQ (flushes) is noise.
    pub(crate) fn drain_cq(&mut self) -> Result<(), EngineError> {
        while self
            .cq
            .poll(&mut self.wcs)
            .map_err(EngineError::nic("poll the passive RC CQ"))?
            > 0
        {}
        Ok(())
    }

    /// Applies a Close of `(gid, qpn)` paired with `nonce`.
    pub(crate) fn close(&mut self, gid: Gid, qpn: u32, nonce: u64, stats: &Mutex<HandshakeStats>) {
        let known = self.map.get(&(gid, qpn)).map(|p| p.nonce);
        let mut s = stats.lock();
        if known == Some(nonce) {
            self.map.remove(&(gid, qpn));
            s.closed += 1;
        } else {
            s.stale += 1;
        }
    }

    /// The answer to a Request from `peer` with `nonce` (see the rules on
    /// [`HandshakeResponder`]): an Accept naming this node's end (`gid`)
    /// or a Reject; `None` for a stale Request (ignored).
    pub(crate) fn serve(
        &mut self,
        gid: Gid,
        nonce: u64,
        peer: RcPeer,
        stats: &Mutex<HandshakeStats>,
    ) -> Option<HandshakeMessage> {
        self.tick += 1;
        let tick = self.tick;
        let key = (peer.gid, peer.qpn);
        let full = self.map.len() >= self.cfg.passive_cap;
        let answer = match self.map.get_mut(&key) {
            Some(p) if p.nonce == nonce => {
                p.stamp = tick;
                stats.lock().duplicates += 1;
                Ok(p.qp.qpn())
            }
            Some(p) if p.nonce > nonce => {
                stats.lock().stale += 1;
                return None;
            }
            Some(p) => {
                p.nonce = nonce;
                p.stamp = tick;
                let qpn = p.qp.qpn();
                match p
                    .qp
                    .modify(Transition::Reset)
                    .and_then(|()| arm(&self.cfg, &p.qp, peer))
                {
                    Ok(()) => {
                        stats.lock().rearmed += 1;
                        Ok(qpn)
                    }
                    Err(_) => {
                        self.map.remove(&key);
                        Err(RejectCode::Resources)
                    }
                }
            }
            None if full && self.cfg.refuse_when_full => Err(RejectCode::Full),
            None => {
                if full {
                    let oldest = self
                        .map
                        .iter()
                        .min_by_key(|(_, p)| p.stamp)
                        .map(|(k, _)| *k);
                    if let Some(k) = oldest {
                        self.map.remove(&k);
                        stats.lock().passive_evicted += 1;
                    }
                }
                match self.create_passive(peer) {
                    Ok(qp) => {
                        let qpn = qp.qpn();
                        tracing::debug!(peer_gid = %peer.gid, peer_qpn = peer.qpn, qpn, "passive RC QP created");
                        self.map.insert(
                            key,
                            Passive {
                                qp,
                                nonce,
                                stamp: tick,
                            },
                        );
                        Ok(qpn)
                    }
                    Err(_) => Err(RejectCode::Resources),
                }
            }
        };
        Some(match answer {
            Ok(qpn) => {
                stats.lock().accepted += 1;
                HandshakeMessage::Accept { gid, qpn }
            }
            Err(code) => {
                stats.lock().rejected += 1;
                HandshakeMessage::Reject { code }
            }
        })
    }

    fn create_passive(&self, peer: RcPeer) -> krcore_nic::Result<N::Qp> {
        let qp = self.nic.create_qp(
            &self.pd,
            &QpInit {
                qp_type: QpType::Rc,
                caps: QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: 0,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                },
                send_cq: &self.cq,
                recv_cq: self.rx.as_ref().map_or(&self.cq, |r| &r.1),
                srq: self.rx.as_ref().map(|r| &r.0),
                dc_key: 0,
            },
        )?;
        arm(&self.cfg, &qp, peer)?;
        Ok(qp)
    }
}

/// RESET -> INIT -> RTR (against `peer`) -> RTS. Peers' one-sided
/// operations reach this node's MRs through it; each MR's own access flags
/// still decide what is allowed (as through a DCT).
fn arm<Q: QueuePair>(cfg: &HandshakeConfig, qp: &Q, peer: RcPeer) -> krcore_nic::Result<()> {
    qp.modify(Transition::Init {
        access: Access::ALL,
        qkey: 0,
    })?;
    qp.modify(Transition::Rtr { peer: Some(peer) })?;
    qp.modify(Transition::Rts {
        rnr_retry: cfg.rnr_retry,
        retry_cnt: cfg.retry_cnt,
    })
}

/// A meta table served through this endpoint (see `super::rc_meta`).
pub(crate) struct MetaHook<N: Nic> {
    pub(crate) table: Arc<Mutex<MetaTable<MrTable<N::Mr>>>>,
    pub(crate) bootstrap: BootstrapRepr,
    pub(crate) started: Instant,
    pub(crate) sweep_every_ms: u64,
    pub(crate) next_sweep_ms: AtomicU64,
}

struct Core<N: Nic> {
    pd: N::Pd,
    cfg: HandshakeConfig,
    gid: Gid,
    qpn: u32,
    ep: Mutex<EndpointState<N>>,
    mailbox: Mutex<HashMap<u64, Option<HandshakeRepr>>>,
    next_nonce: AtomicU64,
    stats: Mutex<HandshakeStats>,
    meta: OnceLock<MetaHook<N>>,
    /// Peers' handshake endpoints as their Requests name them (GID, the
    /// UD QPN they send from, their reply qkey), for the engine to compare
    /// with what it paired with ([`HandshakeResponder::take_peer_endpoints`]):
    /// at most [`PEER_NOTICES`], newest kept.
    peers: Mutex<VecDeque<UdTarget>>,
    /// Whether `peers` holds anything (one load for the engine's check).
    peers_pending: AtomicBool,
}

/// Most peer endpoints kept for the engine between two looks (hints: an
/// older one dropped only delays the detection of that peer's restart to
/// its pair's first error).
const PEER_NOTICES: usize = 256;

/// One end of the RC handshake (see [`crate::handshake`] for the protocol):
/// a UD endpoint that answers peers' handshakes and makes this node's own.
///
/// Cheap to clone (`Arc`); `Send + Sync`. Every engine in RC fallback mode
/// runs one; a process that serves memory without an engine (the fallback
/// meta host, [`super::RcMetaHost`]) runs one on its own PD.
///
/// ```text
/// HandshakeResponder<N>  (Arc, Clone)
///   |- UD endpoint + passive RC QPs + their CQ     behind the endpoint lock
///   |- mailbox: nonce -> reply                     its own lock
///   `- meta hook (fallback meta host only)         MetaTable behind its lock
/// progress():  try the endpoint lock; poll the UD receive CQ once;
///              Request -> create/re-arm a passive RC QP, Accept (or Reject)
///              Close   -> destroy that passive QP
///              Accept/Reject -> the mailbox, for the initiator waiting on it
///              meta RPC (fallback meta host) -> MetaTable::handle, reply
/// handshake(): send Request, wait for the mailbox (driving progress()
///              itself), retry with the same nonce, bounded.
/// ```
///
/// # CPU
///
/// A responder answers only when someone calls [`HandshakeResponder::progress`]
/// (non-blocking), or from the thread [`HandshakeResponder::spawn_progress`]
/// starts (the engine does when `EngineConfig::handshake_thread` is set). An
/// initiator waiting for an answer drives its own endpoint too, so two
/// engines without threads that connect to each other at the same time
/// answer each other while they wait (a Request arriving after the wait is
/// answered by the next `progress()`). The pair's data path never involves
/// the responder's CPU: its end of the pair is passive.
///
/// # What is kept (invariants)
///
/// - Passive QPs: at most `passive_cap`, keyed by the initiator's
///   `(gid, qpn)`, each with the newest nonce it was armed for. One per key:
///   a retried Request (same nonce) gets the same QP; a newer nonce re-arms
///   it (reset, then RTR/RTS against the same peer); an older one is stale.
///   A passive QP lives until its initiator's Close, or until it is the
///   least recently handshaken one when a new key needs room (an initiator
///   that died without a Close is reclaimed that way; a live one whose QP
///   was evicted sees `RETRY_EXC_ERR` and re-handshakes). With
///   `refuse_when_full`, a new key at the cap is refused instead
///   ([`RejectCode::Full`]): nothing is evicted.
/// - Mailbox: one entry per handshake in progress, removed when it ends
///   (success, failure or timeout): nothing outlives the call. A handshake
///   that timed out sends a Close for its nonce (best effort), so that a
///   responder that was only slow (not progressed) drops the end it makes
///   from the late Requests.
pub struct HandshakeResponder<N: Nic> {
    core: Arc<Core<N>>,
}

impl<N: Nic> Clone for HandshakeResponder<N> {
    fn clone(&self) -> Self {
        HandshakeResponder {
            core: self.core.clone(),
        }
    }
}

impl<N: Nic> std::fmt::Debug for HandshakeResponder<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeResponder")
            .field("target", &self.target())
            .field("stats", &self.stats())
            .finish()
    }
}

/// A paired RC QP: the peer to bring it to RTR against, and the nonce of
/// the pairing (for a later Close).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Paired {
    pub(crate) peer: RcPeer,
    pub(crate) nonce: u64,
}

impl<N: Nic> HandshakeResponder<N> {
    /// Starts an endpoint on `nic`: a UD QP (RTS, `cfg.qkey`) with its CQs
    /// and buffers, and a CQ for passive RC QPs, all in `pd`. Passive QPs
    /// are created in `pd` too: peers reach exactly the MRs of `pd`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for slot counts the device cannot take;
    /// [`EngineError::Nic`]/[`EngineError::Post`] when the provider refuses.
    pub fn start(
        nic: N,
        pd: N::Pd,
        cfg: HandshakeConfig,
    ) -> Result<HandshakeResponder<N>, EngineError> {
        Self::start_shared(Arc::new(nic), pd, cfg, None)
    }

    /// [`HandshakeResponder::start`] on a device handle shared with its
    /// owner (the engine).
    /// `rx`: the SRQ and receive CQ the passive ends share (RC fallback
    /// mode: messages arrive over peers' pairs).
    pub(crate) fn start_shared(
        nic: Arc<N>,
        pd: N::Pd,
        cfg: HandshakeConfig,
        rx: Option<(N::Srq, N::Cq)>,
    ) -> Result<HandshakeResponder<N>, EngineError> {
        let passives = Passives::new(nic.clone(), pd.clone(), cfg.clone(), rx)?;
        let ud = UdEndpoint::new(&*nic, &pd, cfg.qkey, cfg.recv_slots, cfg.send_slots)
            .map_err(ud_err)?;
        // Nonces grow per initiator, across restarts too: start from the
        // wall clock (see crate::handshake).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let (gid, qpn) = (nic.gid(), ud.qpn());
        Ok(HandshakeResponder {
            core: Arc::new(Core {
                pd,
                cfg,
                gid,
                qpn,
                ep: Mutex::new(EndpointState {
                    ud,
                    passives,
                    incoming: Vec::new(),
                }),
                mailbox: Mutex::new(HashMap::new()),
                next_nonce: AtomicU64::new(seed.max(1)),
                stats: Mutex::new(HandshakeStats::default()),
                meta: OnceLock::new(),
                peers: Mutex::new(VecDeque::new()),
                peers_pending: AtomicBool::new(false),
            }),
        })
    }

    /// The handshake endpoints that peers' Requests came from since the
    /// last call (see `Core::peers`), oldest first; empty at the cost of
    /// one load when there are none. A peer whose endpoint differs from
    /// the one this node paired with restarted on its GID: the engine's
    /// pair to it (and its cached address) is stale
    /// (`super::rc::RcPool::forget_restarted`).
    pub(crate) fn take_peer_endpoints(&self) -> Vec<UdTarget> {
        if !self.core.peers_pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut q = self.core.peers.lock();
        self.core.peers_pending.store(false, Ordering::Release);
        q.drain(..).collect()
    }

    /// Where peers send handshakes: this port's GID, the UD QPN, the qkey.
    pub fn target(&self) -> UdTarget {
        UdTarget {
            gid: self.core.gid,
            qpn: self.core.qpn,
            qkey: self.core.cfg.qkey,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HandshakeConfig {
        &self.core.cfg
    }

    /// The PD passive QPs are created in.
    pub fn pd(&self) -> &N::Pd {
        &self.core.pd
    }

    /// Statistics (takes the endpoint lock briefly for the UD counters).
    pub fn stats(&self) -> HandshakeStats {
        let mut s = *self.core.stats.lock();
        let ep = self.core.ep.lock();
        s.passive_qps = ep.passives.len();
        s.ud_recoveries = ep.ud.counters.recoveries;
        s.lost_sends += ep.ud.counters.no_credit;
        s
    }

    /// One non-blocking step: polls the UD receive CQ once and handles what
    /// arrived (answers Requests, applies Closes, files answers for waiting
    /// initiators, serves meta RPCs on a fallback meta host). Returns the
    /// number of receive completions polled; 0 also when another thread is
    /// in the endpoint right now.
    ///
    /// # Errors
    /// Provider failures (CQ overflow, a refused post). Bad datagrams are
    /// not errors: they are counted and dropped.
    pub fn progress(&self) -> Result<usize, EngineError> {
        self.core.progress()
    }

    /// Runs [`HandshakeResponder::progress`] on a thread of its own (named
    /// `krcore-handshake`) until the returned handle is dropped.
    ///
    /// # Errors
    /// [`EngineError::Config`] when the thread cannot be created.
    pub fn spawn_progress(&self) -> Result<ProgressThread, EngineError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let core = self.core.clone();
        let thread = std::thread::Builder::new()
            .name("krcore-handshake".into())
            .spawn(move || core.run(&flag))
            .map_err(|e| EngineError::Config(format!("spawn the handshake thread: {e}")))?;
        Ok(ProgressThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Pairs `local_qpn` (an RC QP of this node, in INIT) with the
    /// responder at `target`: returns the peer to bring it to RTR against.
    pub(crate) fn handshake(
        &self,
        local_qpn: u32,
        target: UdTarget,
    ) -> Result<Paired, EngineError> {
        self.core.handshake(local_qpn, target)
    }

    /// Tells `target` that `local_qpn` (paired with `nonce`) is gone, so
    /// that it frees its end. Best effort: a lost Close leaves the passive
    /// QP until the target needs its room.
    pub(crate) fn close(&self, local_qpn: u32, target: UdTarget, nonce: u64) {
        self.core.send_close(local_qpn, target, nonce);
    }

    /// Serves `hook`'s table through this endpoint (once).
    pub(crate) fn attach_meta(&self, hook: MetaHook<N>) -> Result<(), EngineError> {
        self.core
            .meta
            .set(hook)
            .map_err(|_| EngineError::Config("a meta table is already attached".into()))
    }
}

impl<N: Nic> Core<N> {
    fn run(&self, stop: &AtomicBool) {
        let mut wait = super::idle::IdleWait::new(self.cfg.idle_sleep);
        while !stop.load(Ordering::Acquire) {
            match self.progress() {
                Ok(n) => wait.after(n),
                Err(_) => {
                    self.stats.lock().thread_errors += 1;
                    wait.after_error(Duration::from_millis(1));
                }
            }
        }
    }

    fn progress(&self) -> Result<usize, EngineError> {
        let Some(mut ep) = self.ep.try_lock() else {
            return Ok(0);
        };
        let ep = &mut *ep;
        ep.passives.drain_cq()?;
        let mut incoming = std::mem::take(&mut ep.incoming);
        incoming.clear();
        let polled = ep.ud.poll_recv(&mut incoming).map_err(ud_err);
        let mut result = Ok(());
        for d in &incoming {
            if let Err(e) = self.dispatch(ep, d) {
                result = Err(e);
                break;
            }
        }
        ep.incoming = incoming;
        if let Some(hook) = self.meta.get() {
            let now = hook.started.elapsed().as_millis() as u64;
            if now >= hook.next_sweep_ms.load(Ordering::Relaxed) {
                let gone = hook.table.lock().sweep(now);
                for gid in gone {
                    tracing::info!(gid = %gid, now_ms = now, "meta registration swept: its lease ran out");
                }
                hook.next_sweep_ms
                    .store(now.saturating_add(hook.sweep_every_ms), Ordering::Relaxed);
            }
        }
        result?;
        polled
    }

    fn dispatch(&self, ep: &mut EndpointState<N>, d: &Datagram) -> Result<(), EngineError> {
        let payload = d.payload();
        if HandshakeRepr::is_handshake(payload) {
            let Ok(r) = HandshakeRepr::parse_bytes(payload) else {
                self.stats.lock().dropped += 1;
                return Ok(());
            };
            return match r.message {
                HandshakeMessage::Request {
                    gid,
                    qpn,
                    reply_qkey,
                } => {
                    // The Request names its sender's port: the GID to
                    // answer at (and to pair with), whatever the GRH holds.
                    let reply_to = UdTarget {
                        gid,
                        qpn: d.src_qp,
                        qkey: reply_qkey,
                    };
                    // Noted before the answer: whatever the peer sends over
                    // the new pair comes after it.
                    self.note_peer(reply_to);
                    self.serve(ep, r.nonce, RcPeer { gid, qpn }, reply_to)
                }
                HandshakeMessage::Close { gid, qpn } => {
                    ep.passives.close(gid, qpn, r.nonce, &self.stats);
                    Ok(())
                }
                HandshakeMessage::Accept { .. } | HandshakeMessage::Reject { .. } => {
                    let mut mailbox = self.mailbox.lock();
                    match mailbox.get_mut(&r.nonce) {
                        Some(slot @ None) => *slot = Some(r),
                        _ => self.stats.lock().stale += 1,
                    }
                    Ok(())
                }
            };
        }
        if payload.get(..4) == Some(&META_MAGIC.to_le_bytes()[..]) {
            if let Some(hook) = self.meta.get() {
                return self.serve_meta(ep, hook, d);
            }
        }
        self.stats.lock().dropped += 1;
        Ok(())
    }

    fn note_peer(&self, peer: UdTarget) {
        let mut q = self.peers.lock();
        if q.back() == Some(&peer) {
            return; // a retried Request
        }
        if q.len() == PEER_NOTICES {
            q.pop_front();
        }
        q.push_back(peer);
        self.peers_pending.store(true, Ordering::Release);
    }

    /// Answers a Request from `peer` (see the module docs for the rules).
    fn serve(
        &self,
        ep: &mut EndpointState<N>,
        nonce: u64,
        peer: RcPeer,
        reply_to: UdTarget,
    ) -> Result<(), EngineError> {
        let Some(message) = ep.passives.serve(self.gid, nonce, peer, &self.stats) else {
            return Ok(());
        };
        let sent = ep
            .ud
            .send_bytes(reply_to, &HandshakeRepr { nonce, message }.emit())
            .map_err(ud_err)?;
        if !sent {
            self.stats.lock().lost_sends += 1;
        }
        Ok(())
    }

    fn serve_meta(
        &self,
        ep: &mut EndpointState<N>,
        hook: &MetaHook<N>,
        d: &Datagram,
    ) -> Result<(), EngineError> {
        let now = hook.started.elapsed().as_millis() as u64;
        let reply: Option<MetaRepr> = hook.table.lock().handle(d.payload(), now, &hook.bootstrap);
        let Some(reply) = reply else {
            self.stats.lock().dropped += 1;
            return Ok(());
        };
        self.stats.lock().meta_requests += 1;
        let mut buf = [0u8; MAX_DATAGRAM];
        let Ok(len) = reply.emit(&mut buf) else {
            self.stats.lock().dropped += 1;
            return Ok(());
        };
        let dest = UdTarget {
            gid: d.src,
            qpn: d.src_qp,
            qkey: self.cfg.qkey,
        };
        if !ep.ud.send_bytes(dest, &buf[..len]).map_err(ud_err)? {
            self.stats.lock().lost_sends += 1;
        }
        Ok(())
    }

    fn send_close(&self, local_qpn: u32, target: UdTarget, nonce: u64) {
        let msg = HandshakeRepr {
            nonce,
            message: HandshakeMessage::Close {
                gid: self.gid,
                qpn: local_qpn,
            },
        };
        let sent = self.ep.lock().ud.send_bytes(target, &msg.emit());
        if matches!(sent, Ok(true)) {
            self.stats.lock().closes_sent += 1;
        }
    }

    fn handshake(&self, local_qpn: u32, target: UdTarget) -> Result<Paired, EngineError> {
        let nonce = self.next_nonce.fetch_add(1, Ordering::Relaxed);
        self.mailbox.lock().insert(nonce, None);
        let r = self.exchange(nonce, local_qpn, target);
        self.mailbox.lock().remove(&nonce);
        let failure = match r {
            Ok(HandshakeRepr {
                message: HandshakeMessage::Accept { gid, qpn },
                ..
            }) if gid == target.gid => {
                self.stats.lock().paired += 1;
                return Ok(Paired {
                    peer: RcPeer { gid, qpn },
                    nonce,
                });
            }
            Ok(HandshakeRepr {
                message: HandshakeMessage::Accept { gid, .. },
                ..
            }) => HandshakeFailure::WrongPeer { gid },
            Ok(HandshakeRepr {
                message: HandshakeMessage::Reject { code },
                ..
            }) => {
                self.stats.lock().refused += 1;
                HandshakeFailure::Rejected(code)
            }
            Ok(_) => HandshakeFailure::Rejected(RejectCode::Malformed),
            Err(Exchange::Timeout { attempts, waited }) => {
                self.stats.lock().timeouts += 1;
                // A responder that was merely slow may still act on the
                // Requests: tell it the QP is gone (best effort), so that
                // it does not keep an end for it.
                self.send_close(local_qpn, target, nonce);
                HandshakeFailure::Timeout { attempts, waited }
            }
            Err(Exchange::Engine(e)) => return Err(e),
        };
        Err(EngineError::Handshake {
            gid: target.gid,
            failure,
        })
    }

    /// Sends the Request (retrying) until the mailbox holds an answer.
    fn exchange(
        &self,
        nonce: u64,
        local_qpn: u32,
        target: UdTarget,
    ) -> Result<HandshakeRepr, Exchange> {
        let request = HandshakeRepr {
            nonce,
            message: HandshakeMessage::Request {
                gid: self.gid,
                qpn: local_qpn,
                reply_qkey: self.cfg.qkey,
            },
        }
        .emit();
        let attempts = self.cfg.retries.saturating_add(1);
        let start = Instant::now();
        for attempt in 0..attempts {
            if attempt > 0 {
                self.stats.lock().retries += 1;
            }
            // A Request the endpoint could not send is as good as lost.
            self.ep
                .lock()
                .ud
                .send_bytes(target, &request)
                .map_err(|e| Exchange::Engine(ud_err(e)))?;
            self.stats.lock().requests_sent += 1;
            let deadline = Instant::now() + self.cfg.attempt_timeout(attempt);
            loop {
                if let Some(Some(r)) = self.mailbox.lock().get_mut(&nonce).map(Option::take) {
                    return Ok(r);
                }
                if Instant::now() >= deadline {
                    break;
                }
                if self.progress().map_err(Exchange::Engine)? == 0 {
                    std::thread::yield_now();
                }
            }
        }
        Err(Exchange::Timeout {
            attempts,
            waited: start.elapsed(),
        })
    }
}

enum Exchange {
    Timeout { attempts: u32, waited: Duration },
    Engine(EngineError),
}

/// A thread running a [`HandshakeResponder`]'s progress loop. Dropping the
/// handle stops the thread and joins it (within about one idle sleep).
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread")
            .field(
                "running",
                &self.thread.as_ref().is_some_and(|t| !t.is_finished()),
            )
            .finish()
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
