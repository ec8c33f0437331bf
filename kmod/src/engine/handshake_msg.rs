//! DC mode: the DC -> RC upgrade's handshake carried by two-sided messaging.
//!
//! The handshake's payloads are the RC fallback's ([`crate::handshake`]:
//! Request, Accept, Reject, Close, with their nonces); only the carrier
//! differs. In DC mode they travel as messages to a reserved port of the
//! target's DCT/SRQ, [`HANDSHAKE_PORT`], and the answers come back over
//! messaging's reply path (the initiator's endpoint's reply ring), with
//! messaging's credits, sequence checks and loss reports. A DC engine thus
//! needs no UD QP for upgrades, on either end.
//!
//! ```text
//! initiator (builder thread / hint)              target
//!   Endpoint (engine's own):
//!     Open carrying Request{nonce, gid, qpn} --->  DCT/SRQ demux: Grant, and
//!                                                  the Request into the
//!                                                  reserved Port's ring
//!                                                  served by Engine::progress
//!                                                  or the handshake thread:
//!                                                  Passives::serve -> passive QP
//!     pop_reply <--- reply Accept{qpn} | Reject --  Port::reply
//!     Close (the channel, once idle) ----------->  slot back to the port
//!   RTR/RTS against the Accept
//!   later: only message Close{nonce} ----------->  Passives::close
//!          (eviction, timeout, engine dropped)
//! ```
//!
//! # One round trip
//!
//! The initiator's endpoint carries its Request in the channel's Open
//! ([`crate::msg::Carried`]): the target handles both in one pass of
//! whoever serves it, so a handshake costs one round trip and one wake of
//! the target's serving thread, as over UD (with a separate Open, the
//! Request waited for the Grant, and the target's thread had to run
//! twice: on a loaded host each run can be milliseconds away). An Open
//! that times out is sent again carrying the same Request; the port
//! delivers it once, and a Request that arrives twice anyway (a retry) is
//! answered with the same QP (same nonce).
//!
//! # Capacity: any number of initiators over time
//!
//! The initiator's endpoint is a control endpoint: its channel to a
//! target's [`HANDSHAKE_PORT`] asks for `msg.control_window` credits
//! (default 1: one Request outstanding), so the port's `msg.port_slots`
//! (default 64) admit that many initiators at once; and when an exchange
//! is over the initiator closes the channel
//! ([`Endpoint::close_channel`]: a Close message, sent only once the
//! Request's credit is back), so the target's slots return to it and the
//! number of initiators over time is unbounded. The handshake's Close of
//! a pair (evicted, timed out, or left when the engine's last handle
//! goes) travels as an only message (`Endpoint::send_only`): it opens
//! no channel of the initiator's, holds its slot at the target only until
//! the serving step pops it, and waits for nothing. An Open that finds every
//! slot granted is refused `Busy`; the initiator asks again after a short
//! pause ([`HandshakeStats::busy`]), within `handshake.retries`, and only
//! then fails with [`HandshakeFailure::Refused`]. Invariants: nothing is
//! dropped silently (a reply the target sends after the Close is counted
//! `orphaned` at the initiator; the Request it answers was answered
//! already), credits stay consistent (the Close carries none: the channel
//! is idle), and a closed initiator reopens with a fresh Open, behind its
//! Close on the same path.
//!
//! A channel that is never closed (its initiator crashed, its Close could
//! not be sent, or a retried Request's credit was still out) holds one
//! slot only until another initiator needs it: a reserved port whose
//! slots are all granted reclaims, at an Open, the channel idle longest if
//! idle for `msg.control_idle` (nothing of it in the ring; credits still
//! owed to it are dropped), and tells its sender with a Refuse `Reclaimed`
//! ([`MsgStats::reclaimed`](super::MsgStats::reclaimed)). That sender
//! forgets the channel and reopens at its next push. A Request that was in
//! flight when its channel was reclaimed is not delivered: counted
//! `orphaned` at the target and answered `Reclaimed`; the initiator's
//! attempt times out and the next attempt reopens and sends it again
//! (same nonce), within `handshake.retries`.
//!
//! # Who serves the reserved port
//!
//! Nothing unless the node serves upgrades: [`super::Engine::handshake_entry`]
//! (what a target calls to register its upgrade entry) or `eager_start`
//! binds [`HANDSHAKE_PORT`]. Requests that arrive there wait in its ring
//! until one of these pops them:
//! - [`super::Engine::progress`] (non-blocking; the host calls it), or
//! - with `EngineConfig::handshake_thread`, the engine's thread
//!   `krcore-handshake`, started when the port is bound and stopped (joined)
//!   when the engine's last handle goes;
//! - and an initiator of this node waiting for its own answer (so two
//!   engines without threads that upgrade to each other at once answer each
//!   other while they wait, as over UD).
//!
//! The messaging layer's Open and credits are handled by whoever drains the
//! receive CQ (any messaging call, [`super::Engine::msg_progress`], the
//! messaging thread, and the serving step above). If nobody does, the
//! initiator's wait ends with a typed [`HandshakeFailure::Timeout`]: every
//! wait is bounded by `handshake.retries + 1` attempts, attempt `k`
//! waiting [`super::HandshakeConfig::attempt_timeout`]`(k)` (`timeout`
//! doubled per attempt, at most 16 times), in all
//! [`super::HandshakeConfig::total_wait`] (a Request is re-sent with the
//! same nonce; the target answers a repeated nonce with the same QP, so
//! retries are idempotent).
//!
//! # Locks
//!
//! Handshakes of one engine are serialized by the client's lock (held for
//! one handshake; the RC pair cache serializes creations anyway); the
//! serving step takes the passive QPs' lock (try-lock: one server at a
//! time). Neither is on the data path: the VQPs' posts never take them.
//!
//! # Lifetime
//!
//! The reserved port and the initiator's endpoint are messaging objects,
//! which hold the engine; the engine holds them here. The cycle is broken
//! when the engine's last [`super::Engine`] handle is dropped
//! (`HsMsg::release`): the port is unbound, the endpoint dropped, the
//! thread stopped; after that this node neither serves nor starts upgrades
//! (typed [`EngineError::Unsupported`]), while its remaining VQPs keep
//! working. Before that, the upgrade pairs with no WR in flight are closed
//! and their targets told (one only message each: bounded, no wait; see
//! `super::rc::RcPool::close_idle`); a pair still busy then stays with its
//! VQPs and sends no Close (its target reclaims the passive end at
//! `passive_cap`, as for a crashed peer).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use krcore_nic::{Gid, Nic, RcPeer};
use parking_lot::Mutex;

use super::error::{EngineError, HandshakeFailure};
use super::handshake_ud::{HandshakeStats, Paired, Passives};
use super::messaging::{Endpoint, MsgError, MsgHost, Port, Service, Worker};
pub use super::messaging::{FIRST_RESERVED_PORT, HANDSHAKE_PORT};
use crate::handshake::{HandshakeMessage, HandshakeRepr};
use crate::msg::RefuseCode;

/// Longest the serving step waits for a reply credit: an initiator that
/// gave up leaves its replies unpopped, and the server must not stall on
/// it (the answer is counted lost; a retry of the Request gets it again).
const REPLY_WAIT: Duration = Duration::from_millis(5);

/// What a control exchange (the upgrade handshake, a meta registration)
/// does after pushing its request to a reserved port.
pub(crate) enum ControlPush {
    /// The request is on its way: wait for the answer.
    Sent,
    /// The attempt is spent, the next one may succeed: no Grant or credit
    /// in time (nobody drains the target), an earlier message of this
    /// endpoint lost, or the target reclaimed this endpoint's idle channel
    /// (forgotten: the next attempt opens a new one).
    Retry,
    /// Every slot of the target's port is held by an exchange in
    /// progress: ask again after [`busy_pause`] (or fail, when no attempt
    /// is left).
    Busy(MsgError),
    /// Anything else: fail.
    Fail(MsgError),
}

impl ControlPush {
    pub(crate) fn of(pushed: Result<(), MsgError>) -> ControlPush {
        match pushed {
            Ok(()) => ControlPush::Sent,
            Err(
                MsgError::Timeout(_)
                | MsgError::Lost { .. }
                | MsgError::Refused {
                    code: RefuseCode::Reclaimed,
                    ..
                },
            ) => ControlPush::Retry,
            Err(
                e @ MsgError::Refused {
                    code: RefuseCode::Busy,
                    ..
                },
            ) => ControlPush::Busy(e),
            Err(e) => ControlPush::Fail(e),
        }
    }
}

/// The pause before asking a busy port again: 1 ms, doubling per attempt,
/// at most the attempt's timeout.
pub(crate) fn busy_pause(attempt: u32, timeout: Duration) -> Duration {
    Duration::from_millis(1u64 << attempt.min(10)).min(timeout)
}

/// The serving side: the reserved port and the passive ends it made.
struct Server<N: Nic> {
    port: Port<N>,
    passives: Mutex<Passives<N>>,
}

/// The handshake over messaging of one DC engine with `upgrade_endpoint`
/// (see the module docs).
pub(crate) struct HsMsg<N: Nic> {
    stats: Mutex<HandshakeStats>,
    next_nonce: AtomicU64,
    server: Mutex<Option<Arc<Server<N>>>>,
    /// The initiator's endpoint; its lock serializes this node's handshakes.
    client: Mutex<Option<Endpoint<N>>>,
    thread: Mutex<Option<Worker>>,
    /// Set when the engine's last handle went (see the module docs).
    closed: AtomicBool,
}

impl<N: Nic> Default for HsMsg<N> {
    fn default() -> HsMsg<N> {
        // Nonces grow per initiator, across restarts too: start from the
        // wall clock (see crate::handshake).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        HsMsg {
            stats: Mutex::new(HandshakeStats::default()),
            next_nonce: AtomicU64::new(seed.max(1)),
            server: Mutex::new(None),
            client: Mutex::new(None),
            thread: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }
}

/// What the upgrade's handshake needs of its engine: messaging
/// ([`MsgHost`]) and, for its thread, the way back to this service. The
/// engine object implements it.
pub(crate) trait UpgradeHost<N: Nic>: MsgHost<N> {
    /// DC mode with `upgrade_endpoint`: the handshake over messaging.
    fn handshake_msg(&self) -> Option<&HsMsg<N>>;
}

fn closed_error() -> EngineError {
    EngineError::Unsupported {
        reason: "the engine's last handle was dropped: upgrades are no longer served or started",
    }
}

fn msg_error(gid: Gid, e: MsgError) -> EngineError {
    e.into_engine(gid, Service::Handshake)
}

impl<N: Nic> HsMsg<N> {
    /// Statistics of both sides (passive QPs counted now).
    pub(crate) fn stats(&self) -> HandshakeStats {
        let mut s = *self.stats.lock();
        if let Some(srv) = self.server.lock().clone() {
            s.passive_qps = srv.passives.lock().len();
        }
        s
    }

    /// Binds the reserved port (once) and, with `handshake_thread`, starts
    /// the thread serving it.
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] after [`HsMsg::release`] or in a forked
    /// child; messaging's errors of the first use (DCT, receive buffers,
    /// the port's VQP), as engine errors.
    pub(crate) fn serve(&self, eng: &Arc<dyn UpgradeHost<N>>) -> Result<(), EngineError> {
        let mut server = self.server.lock();
        if server.is_some() {
            return Ok(());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(closed_error());
        }
        let dev = eng.dev();
        dev.refuse_in_child("serving upgrades in a forked child")?;
        let gid = dev.nic.gid();
        let msg: Arc<dyn MsgHost<N>> = eng.clone();
        let port = Port::bind(&msg, HANDSHAKE_PORT, true, None).map_err(|e| msg_error(gid, e))?;
        let passives = Passives::new(
            dev.nic.clone(),
            dev.pd.clone(),
            dev.cfg.handshake.clone(),
            None,
        )?;
        *server = Some(Arc::new(Server {
            port,
            passives: Mutex::new(passives),
        }));
        drop(server);
        if dev.cfg.handshake_thread {
            let stop = Arc::new(AtomicBool::new(false));
            let (flag, weak, sleep) = (
                stop.clone(),
                Arc::downgrade(eng),
                dev.cfg.handshake.idle_sleep,
            );
            let handle = std::thread::Builder::new()
                .name("krcore-handshake".into())
                .spawn(move || run(&weak, &flag, sleep))
                .map_err(|e| EngineError::Config(format!("spawn the handshake thread: {e}")))?;
            *self.thread.lock() = Some(Worker {
                stop,
                handle: Some(handle),
            });
        }
        Ok(())
    }

    /// Stops serving: the reserved port is unbound (Requests queued there
    /// are discarded; later ones are refused), the thread stopped.
    pub(crate) fn stop_serving(&self) {
        let worker = self.thread.lock().take();
        drop(worker);
        let server = self.server.lock().take();
        drop(server);
    }

    /// The engine's last handle went: break the cycle (see the module docs).
    pub(crate) fn release(&self) {
        self.closed.store(true, Ordering::Release);
        self.stop_serving();
        // A handshake in progress holds the client: it drops the endpoint
        // itself when it ends.
        if let Some(mut c) = self.client.try_lock() {
            c.take();
        }
    }

    /// One non-blocking serving step: pops what the reserved port holds and
    /// answers it. Returns the messages handled (0 when not serving, or
    /// another thread is serving right now).
    ///
    /// # Errors
    /// Provider failures of the passive CQ or the receive path.
    pub(crate) fn progress(&self) -> Result<usize, EngineError> {
        let Some(srv) = self.server.lock().clone() else {
            return Ok(0);
        };
        let Some(mut passives) = srv.passives.try_lock() else {
            return Ok(0);
        };
        passives.drain_cq()?;
        let mut handled = 0;
        loop {
            let msg = match srv.port.try_pop() {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(handled),
                Err(MsgError::Engine(e)) => return Err(e),
                // A message that failed on the way (counted by messaging).
                Err(_) => {
                    self.stats.lock().dropped += 1;
                    continue;
                }
            };
            handled += 1;
            let Ok(r) = HandshakeRepr::parse_bytes(&msg.to_vec()) else {
                self.stats.lock().dropped += 1;
                continue;
            };
            match r.message {
                // The Request names its sender's port; messaging says who
                // sent it: they must agree.
                HandshakeMessage::Request { gid, qpn, .. } if gid == msg.from.gid => {
                    let local = srv.port.eng.nic.gid();
                    let peer = RcPeer { gid, qpn };
                    let Some(answer) = passives.serve(local, r.nonce, peer, &self.stats) else {
                        continue;
                    };
                    let reply = HandshakeRepr {
                        nonce: r.nonce,
                        message: answer,
                    }
                    .emit();
                    if srv.port.reply_within(msg.from, &reply, REPLY_WAIT).is_err() {
                        self.stats.lock().lost_sends += 1;
                    }
                }
                HandshakeMessage::Close { gid, qpn } if gid == msg.from.gid => {
                    passives.close(gid, qpn, r.nonce, &self.stats);
                }
                _ => self.stats.lock().dropped += 1,
            }
        }
    }

    /// Pairs `local_qpn` (an RC QP of this node, in INIT) with the node
    /// `gid`: Request, then its answer, retried with the same nonce.
    ///
    /// # Errors
    /// [`EngineError::Handshake`]: no answer in `handshake.total_wait()`
    /// ([`HandshakeFailure::Timeout`]), refused by the target
    /// ([`HandshakeFailure::Rejected`], or [`HandshakeFailure::Refused`]
    /// when it does not serve upgrades or its port is busy), answered by
    /// another node; [`EngineError::Unsupported`] after the engine's last
    /// handle went; engine errors of messaging.
    pub(crate) fn handshake(
        &self,
        eng: &Arc<dyn MsgHost<N>>,
        local_qpn: u32,
        gid: Gid,
    ) -> Result<Paired, EngineError> {
        let mut client = self.client.lock();
        if self.closed.load(Ordering::Acquire) {
            client.take();
            return Err(closed_error());
        }
        if client.is_none() {
            let mut ep = Endpoint::control(eng).map_err(|e| msg_error(gid, e))?;
            // The Request rides in the channel's Open: one round trip
            // (Requests are idempotent, see `Endpoint::carry_first`).
            ep.carry_first = true;
            *client = Some(ep);
        }
        let Some(ep) = client.as_ref() else {
            return Err(closed_error());
        };
        let r = self.exchange(ep, eng.nic.gid(), local_qpn, gid, &eng.cfg.handshake);
        // The exchange is over: give the target's port its slot back (see
        // "Capacity" in the module docs). Best effort: a channel not idle
        // yet (a retried Request not popped) stays open for the next one.
        let _ = ep.close_channel(gid, HANDSHAKE_PORT);
        if self.closed.load(Ordering::Acquire) {
            client.take();
        }
        r
    }

    fn exchange(
        &self,
        ep: &Endpoint<N>,
        local: Gid,
        local_qpn: u32,
        gid: Gid,
        cfg: &super::config::HandshakeConfig,
    ) -> Result<Paired, EngineError> {
        // Late answers to earlier handshakes.
        while let Ok(Some(_)) = ep.try_pop_reply() {
            self.stats.lock().stale += 1;
        }
        let nonce = self.next_nonce.fetch_add(1, Ordering::Relaxed);
        let request = HandshakeRepr {
            nonce,
            message: HandshakeMessage::Request {
                gid: local,
                qpn: local_qpn,
                reply_qkey: 0,
            },
        }
        .emit();
        let attempts = cfg.retries.saturating_add(1);
        let start = Instant::now();
        for attempt in 0..attempts {
            if attempt > 0 {
                self.stats.lock().retries += 1;
            }
            let wait = cfg.attempt_timeout(attempt);
            match ControlPush::of(ep.push_timeout(gid, HANDSHAKE_PORT, &request, wait)) {
                ControlPush::Sent => self.stats.lock().requests_sent += 1,
                ControlPush::Retry => continue,
                ControlPush::Busy(_) if attempt + 1 < attempts => {
                    self.stats.lock().busy += 1;
                    std::thread::sleep(busy_pause(attempt, wait));
                    continue;
                }
                ControlPush::Busy(e) | ControlPush::Fail(e @ MsgError::Refused { .. }) => {
                    self.stats.lock().refused += 1;
                    return Err(msg_error(gid, e));
                }
                ControlPush::Fail(e) => return Err(msg_error(gid, e)),
            }
            let deadline = Instant::now() + wait;
            loop {
                // This node's own server too (see the module docs).
                let _ = self.progress();
                if let Ok(Some(m)) = ep.try_pop_reply() {
                    match HandshakeRepr::parse_bytes(&m.to_vec()) {
                        Ok(r) if r.nonce == nonce && m.from.gid == gid => {
                            return self.answered(gid, nonce, r.message);
                        }
                        _ => self.stats.lock().stale += 1,
                    }
                    continue;
                }
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.stats.lock().timeouts += 1;
        // A target that was only slow may still act on the Request: tell
        // it the QP is gone (best effort, no wait): behind the Request on
        // its channel when a credit is there, else as an only message.
        let close = close_message(local, local_qpn, nonce);
        let sent = match ep.credits(gid, HANDSHAKE_PORT) {
            Some(n) if n > 0 => ep.try_push(gid, HANDSHAKE_PORT, &close).is_ok(),
            _ => ep.send_only(gid, HANDSHAKE_PORT, &close).is_ok(),
        };
        if sent {
            self.stats.lock().closes_sent += 1;
        }
        Err(EngineError::Handshake {
            gid,
            failure: HandshakeFailure::Timeout {
                attempts,
                waited: start.elapsed(),
            },
        })
    }

    fn answered(
        &self,
        gid: Gid,
        nonce: u64,
        message: HandshakeMessage,
    ) -> Result<Paired, EngineError> {
        let failure = match message {
            HandshakeMessage::Accept { gid: peer, qpn } if peer == gid => {
                self.stats.lock().paired += 1;
                return Ok(Paired {
                    peer: RcPeer { gid: peer, qpn },
                    nonce,
                });
            }
            HandshakeMessage::Accept { gid: peer, .. } => HandshakeFailure::WrongPeer { gid: peer },
            HandshakeMessage::Reject { code } => {
                self.stats.lock().refused += 1;
                HandshakeFailure::Rejected(code)
            }
            _ => HandshakeFailure::Rejected(crate::handshake::RejectCode::Malformed),
        };
        Err(EngineError::Handshake { gid, failure })
    }

    /// Tells `gid` that `local_qpn` (paired with `nonce`) is gone: one
    /// only message to its handshake port from the initiator's endpoint
    /// ([`Endpoint::send_only`]): no channel opened or held, no wait. Best
    /// effort (skipped while a handshake holds the endpoint, or without
    /// one): a target that does not get it frees the passive end at its
    /// `passive_cap`.
    pub(crate) fn close(&self, local: Gid, local_qpn: u32, gid: Gid, nonce: u64) {
        let Some(client) = self.client.try_lock() else {
            return;
        };
        let Some(ep) = client.as_ref() else { return };
        let close = close_message(local, local_qpn, nonce);
        if ep.send_only(gid, HANDSHAKE_PORT, &close).is_ok() {
            self.stats.lock().closes_sent += 1;
        }
    }
}

/// The handshake's Close of `local`'s QP `local_qpn`, paired with `nonce`.
fn close_message(local: Gid, local_qpn: u32, nonce: u64) -> [u8; crate::handshake::HANDSHAKE_LEN] {
    HandshakeRepr {
        nonce,
        message: HandshakeMessage::Close {
            gid: local,
            qpn: local_qpn,
        },
    }
    .emit()
}

/// The handshake thread: serves the reserved port until stopped or the
/// engine is gone.
fn run<N: Nic>(eng: &Weak<dyn UpgradeHost<N>>, stop: &AtomicBool, idle_sleep: Duration) {
    let mut wait = super::idle::IdleWait::new(idle_sleep);
    while !stop.load(Ordering::Acquire) {
        let Some(e) = eng.upgrade() else { return };
        let n = match e.handshake_msg() {
            Some(hs) => hs.progress(),
            None => Ok(0),
        };
        if n.is_err() {
            if let Some(hs) = e.handshake_msg() {
                hs.stats.lock().thread_errors += 1;
            }
        }
        // Possibly the engine's last reference: dropping it ends the loop.
        drop(e);
        match n {
            Ok(n) => wait.after(n),
            Err(_) => wait.after_error(idle_sleep),
        }
    }
}
