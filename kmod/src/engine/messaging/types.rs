//! The messaging host's vocabulary, shared by its files (see
//! [`super::node`]): errors and statistics, the sender of a message,
//! a popped message and the landing buffer its body may sit in, the
//! progress thread's handle, the bounded wait of blocking calls, and the
//! port numbers the engine reserves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::{Gid, MemoryRegion, Nic, WcStatus};
use parking_lot::Mutex;

use crate::engine::error::{EngineError, VqpError};
use crate::engine::mrs::OwnedMr;
use crate::msg::{Descriptor, RefuseCode, WindowError};

/// Errors of messaging.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
    /// The port is reserved for the engine's own services (from
    /// [`crate::engine::handshake_msg::FIRST_RESERVED_PORT`] on: the upgrade handshake).
    #[error("port {port} is reserved for the engine")]
    ReservedPort {
        /// The port.
        port: u16,
    },
    /// Messaging is not available here.
    #[error("messaging unsupported: {reason}")]
    Unsupported {
        /// Why.
        reason: &'static str,
    },
    /// The configuration cannot work.
    #[error("messaging configuration: {0}")]
    Config(String),
    /// Another port handle holds this port.
    #[error("port {port} is already bound")]
    PortInUse {
        /// The port.
        port: u16,
    },
    /// The node's receive buffers are all reserved.
    #[error("{wanted} receive slots wanted, {free} left unreserved")]
    NoBuffers {
        /// Slots asked for.
        wanted: u32,
        /// Slots left.
        free: u32,
    },
    /// The receiver refused the channel.
    #[error("{gid} port {port}: {code}")]
    Refused {
        /// The receiving node.
        gid: Gid,
        /// The port.
        port: u16,
        /// Why.
        code: RefuseCode,
    },
    /// The message is longer than `max_message`.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No credit (or nothing to pop) right now: try again later.
    #[error("would block")]
    WouldBlock,
    /// A blocking call gave up.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A message's SEND or a descriptor's READ completed with an error.
    #[error("{what} completed with {status:?}")]
    Failed {
        /// Which operation.
        what: &'static str,
        /// The completion status.
        status: WcStatus,
    },
    /// A message an earlier push accepted (it returned `Ok`) was not
    /// delivered: its SEND completed with `status` (the first failure), or
    /// the NIC flushed it after an earlier one failed (`WR_FLUSH_ERR`). One
    /// such error per lost message, returned by the endpoint's next pushes
    /// (nothing is sent by the call that returns it). The message's credit
    /// is back in the channel; the receiver sees the gap in `seq`
    /// ([`MsgStats::out_of_order`]).
    #[error("message {seq} to {gid} port {port} was lost: its SEND completed with {status:?}")]
    Lost {
        /// The receiving node.
        gid: Gid,
        /// The port.
        port: u16,
        /// The message's sequence number in its channel.
        seq: u64,
        /// Its completion status.
        status: WcStatus,
    },
    /// A reply a port sent earlier ([`Port::reply`](super::Port::reply)
    /// returned `Ok`) was not delivered, as [`MsgError::Lost`]: returned
    /// by the port's next replies, one per lost reply.
    #[error("reply {seq} to {to:?} was lost: its SEND completed with {status:?}")]
    ReplyLost {
        /// The endpoint it was for.
        to: Sender,
        /// The reply's sequence number in its channel.
        seq: u64,
        /// Its completion status.
        status: WcStatus,
    },
    /// A peer broke the credit protocol.
    #[error("credit protocol: {0}")]
    Window(#[from] WindowError),
    /// Engine (connect, MR) failure.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Posting or polling failure.
    #[error(transparent)]
    Vqp(#[from] VqpError),
    /// An attached process's messaging through the node daemon failed
    /// for a reason of the daemon's (it went, did not answer, refused,
    /// or failed in a way that has no variant here: its words).
    #[error("through the node daemon: {0}")]
    Daemon(#[source] Box<crate::daemon::DaemonError>),
}

impl MsgError {
    pub(crate) fn nic(what: &'static str) -> impl FnOnce(krcore_nic::NicError) -> MsgError {
        move |source| MsgError::Engine(EngineError::Nic { op: what, source })
    }

    /// This error of an exchange the engine carries over messaging with
    /// the node `gid` (`service`) as an engine error: engine errors as
    /// they are; a refusal as the service's typed failure (the port is not
    /// bound there, busy, or reclaimed the channel); anything else as a
    /// configuration error naming the service.
    pub(crate) fn into_engine(self, gid: Gid, service: Service) -> EngineError {
        match (self, service) {
            (MsgError::Engine(e), _) => e,
            (MsgError::Refused { code, .. }, Service::Handshake) => EngineError::Handshake {
                gid,
                failure: crate::engine::error::HandshakeFailure::Refused(code),
            },
            (MsgError::Refused { code, .. }, Service::MetaRegistration) => {
                EngineError::MetaUnavailable {
                    gid,
                    failure: crate::engine::error::MetaFailure::Refused(code),
                }
            }
            (other, Service::Handshake) => {
                EngineError::Config(format!("the handshake's messaging: {other}"))
            }
            (other, Service::MetaRegistration) => {
                EngineError::Config(format!("meta registration's messaging: {other}"))
            }
        }
    }
}

/// The engine's own exchanges carried by messaging (see
/// [`MsgError::into_engine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    /// The DC -> RC upgrade's handshake (`crate::engine::handshake_msg`).
    Handshake,
    /// Registration with the meta host (`crate::engine::meta_msg`).
    MetaRegistration,
}

/// Messaging statistics of a node (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MsgStats {
    /// Receive completions handled.
    pub received: u64,
    /// Data messages (inline) delivered to rings.
    pub inline_delivered: u64,
    /// Descriptor messages delivered to rings.
    pub descriptors_delivered: u64,
    /// Descriptor bodies pulled by READ.
    pub pulled: u64,
    /// Control messages handled.
    pub control: u64,
    /// Channels granted.
    pub granted: u64,
    /// Opens refused.
    pub refused: u64,
    /// Data messages whose sequence number was not the next one.
    pub out_of_order: u64,
    /// Receives that were not messages, or broke the protocol.
    pub malformed: u64,
    /// Messages for a port unbound after it granted the channel, or for
    /// an endpoint dropped since (not delivered; a port's sender is told
    /// with a Refuse, so its next push fails typed).
    pub orphaned: u64,
    /// Receive completions with an error status.
    pub recv_errors: u64,
    /// Error completions of the node's own message sends.
    pub send_errors: u64,
    /// Receives whose handling failed (a receive buffer that could not be
    /// read, an answer to an Open that could not be sent: that sender
    /// times out, typed).
    pub progress_errors: u64,
    /// Receive slots whose re-post the SRQ refused; each is posted again
    /// by the next drain (its message was delivered regardless).
    pub reposts_deferred: u64,
    /// Credit returns whose send failed after their message was popped:
    /// the message was delivered, the credits stay owed and go back with
    /// the next pop (or [`Port::return_credits`](super::Port::return_credits)).
    pub credits_deferred: u64,
    /// Releases of pulled descriptors whose send failed: the message was
    /// delivered, the Release is sent again by the next pop.
    pub releases_deferred: u64,
    /// Channels closed by their sender (a Close received by one of this
    /// node's ports: the channel's window went back to the port).
    pub closed: u64,
    /// Idle channels of the engine's reserved ports reclaimed for another
    /// sender (`msg.control_idle`; the reclaimed sender is told).
    pub reclaimed: u64,
    /// Channels dropped because another process at their sender's GID
    /// opened one from the same endpoint id (its Open named another DCT:
    /// the process that opened the old one died without closing it, and
    /// its messages not popped yet went with it).
    pub replaced: u64,
    /// Opens sent again because their answer did not come (a lost answer,
    /// or a slow port).
    pub open_resent: u64,
    /// Credits asked for again: Opens of open channels sent because a
    /// push waited for a credit (the port answers with the credits
    /// returned so far, making up a Credit lost on its way), and Grants
    /// of open channels sent because a port's reply waited for a reply
    /// credit (the endpoint sends its total again at its next pop).
    pub credits_asked: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) inline_delivered: AtomicU64,
    pub(crate) descriptors_delivered: AtomicU64,
    pub(crate) pulled: AtomicU64,
    pub(crate) control: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) out_of_order: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) orphaned: AtomicU64,
    pub(crate) recv_errors: AtomicU64,
    pub(crate) send_errors: AtomicU64,
    pub(crate) progress_errors: AtomicU64,
    pub(crate) reposts_deferred: AtomicU64,
    pub(crate) credits_deferred: AtomicU64,
    pub(crate) releases_deferred: AtomicU64,
    pub(crate) closed: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) replaced: AtomicU64,
    pub(crate) open_resent: AtomicU64,
    pub(crate) credits_asked: AtomicU64,
    /// Error completions of tagged data messages, by sending VQP: (tag,
    /// status), taken by their endpoint (which reports them lost).
    pub(crate) failed: Mutex<HashMap<u32, Vec<(u64, WcStatus)>>>,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Who sent a message: the node and the VQP id (the immediate data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sender {
    /// The sending node.
    pub gid: Gid,
    /// The sending VQP (an [`Endpoint`](super::Endpoint)'s id).
    pub vqp: u32,
}

pub(crate) enum Body<N: Nic> {
    Inline(Vec<u8>),
    Pending { len: u32, desc: Descriptor },
    Pulled { mr: Landing<N>, len: usize },
}

/// A received message (popped from a port, or a reply popped from an
/// endpoint).
pub struct Message<N: Nic> {
    /// Who sent it.
    pub from: Sender,
    /// The port it was sent to (for a reply: the port that replied).
    pub port: u16,
    /// The channel's sequence number.
    pub seq: u64,
    pub(crate) body: Body<N>,
}

impl<N: Nic> std::fmt::Debug for Message<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("from", &self.from)
            .field("port", &self.port)
            .field("seq", &self.seq)
            .field("len", &self.len())
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}

impl<N: Nic> Message<N> {
    /// A message received elsewhere and carried here by value (an attached
    /// process's reply, popped by the node daemon's endpoint).
    pub fn from_bytes(from: Sender, port: u16, seq: u64, body: Vec<u8>) -> Message<N> {
        Message {
            from,
            port,
            seq,
            body: Body::Inline(body),
        }
    }

    /// Body length.
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Inline(v) => v.len(),
            Body::Pending { len, .. } => *len as usize,
            Body::Pulled { len, .. } => *len,
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the body travelled as a descriptor (pulled by READ into a
    /// registered landing buffer).
    pub fn is_zero_copy(&self) -> bool {
        !matches!(self.body, Body::Inline(_))
    }

    /// Copies the body out.
    pub fn to_vec(&self) -> Vec<u8> {
        match &self.body {
            Body::Inline(v) => v.clone(),
            Body::Pending { .. } => Vec::new(),
            Body::Pulled { mr, len } => {
                let mut v = vec![0u8; *len];
                // In range: the landing buffer is at least `len` long.
                let _ = mr.mr().read(0, &mut v);
                v
            }
        }
    }

    /// The registered buffer the body was pulled into (zero copy), and the
    /// body's length in it.
    pub fn region(&self) -> Option<(&OwnedMr<N>, usize)> {
        match &self.body {
            Body::Pulled { mr, len } => Some((mr.mr(), *len)),
            _ => None,
        }
    }
}

/// A landing buffer that goes back to its pool when the message is
/// dropped.
pub(crate) struct Landing<N: Nic> {
    pub(crate) mr: Option<OwnedMr<N>>,
    pub(crate) pool: std::sync::Weak<Mutex<Vec<OwnedMr<N>>>>,
}

impl<N: Nic> Landing<N> {
    pub(crate) fn mr(&self) -> &OwnedMr<N> {
        self.mr.as_ref().expect("present until drop")
    }
}

impl<N: Nic> Drop for Landing<N> {
    fn drop(&mut self) {
        if let (Some(mr), Some(pool)) = (self.mr.take(), self.pool.upgrade()) {
            let mut p = pool.lock();
            if p.len() < POOL_KEEP {
                p.push(mr);
            }
        }
    }
}

/// The progress thread: stopped and joined when the node is dropped
/// (detached if the thread itself drops the last engine handle).
pub(crate) struct Worker {
    pub(crate) stop: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// Retries `try_once` until it returns a value or `timeout` has passed
/// ([`MsgError::Timeout`]); its errors end the wait. Between tries it
/// yields, [`Backoff`]'s way.
pub(crate) fn wait_for<T>(
    timeout: Duration,
    mut try_once: impl FnMut() -> Result<Option<T>, MsgError>,
) -> Result<T, MsgError> {
    let start = Instant::now();
    let mut backoff = Backoff::new();
    loop {
        if let Some(v) = try_once()? {
            return Ok(v);
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(MsgError::Timeout(elapsed));
        }
        backoff.wait(timeout - elapsed);
    }
}

/// How a thread waiting for a message (a reply, a pop) waits between its
/// looks: it yields for [`Backoff::SPINS`] looks (an answer often comes
/// within microseconds), then sleeps, 20 us first and twice as long each
/// time up to 1 ms. Many waiting threads then leave the CPU to the threads
/// that answer them: with 200 client threads of one process on 2 cores
/// yielding without end, the memory nodes' serving threads of the same
/// process got about their 1/200 share and answered allocations after
/// their clients' 2 s timeouts.
pub(crate) struct Backoff {
    looks: u32,
    sleep: Duration,
}

impl Backoff {
    /// Looks answered by a yield before the first sleep.
    pub(crate) const SPINS: u32 = 64;
    const FIRST_SLEEP: Duration = Duration::from_micros(20);
    const MAX_SLEEP: Duration = Duration::from_millis(1);

    pub(crate) fn new() -> Backoff {
        Backoff {
            looks: 0,
            sleep: Self::FIRST_SLEEP,
        }
    }

    /// Waits before the next look (never longer than `left`).
    pub(crate) fn wait(&mut self, left: Duration) {
        if self.looks < Self::SPINS {
            self.looks += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep.min(left));
            self.sleep = (self.sleep * 2).min(Self::MAX_SLEEP);
        }
    }
}

/// Free buffers kept per pool.
pub(crate) const POOL_KEEP: usize = 8;

/// Smallest staging or landing buffer.
pub(crate) const MIN_BUFFER: usize = 64 << 10;

/// The reserved messaging port a DC engine serves the upgrade handshake on.
/// [`crate::engine::Engine::bind`] refuses it (and every port from
/// [`FIRST_RESERVED_PORT`] on) to users (the upgrade handshake,
/// `crate::engine::handshake_msg`).
pub const HANDSHAKE_PORT: u16 = 0xffff;

/// The first port reserved for the engine's own services
/// ([`HANDSHAKE_PORT`]; the rest for later services).
pub const FIRST_RESERVED_PORT: u16 = 0xfff0;
