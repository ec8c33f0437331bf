//! Two-sided messaging over the node's DCT/SRQ (DC mode): bound [`Port`]s
//! that receive, [`Endpoint`]s (a VQP each) that push and get replies. The
//! protocol, header layout and credit accounts are the pure
//! [`crate::msg`]; this is the host.
//!
//! ```text
//! MsgNode<N>  (per engine, made by the first bind/endpoint)
//!   |- receive buffers: recv_depth slots of HEADER_LEN + inline_max bytes,
//!   |  posted on the DCT's SRQ; re-posted as soon as a slot is handled
//!   |- receive lock (try-lock): one thread at a time drains the receive CQ
//!   |  and demultiplexes: port messages -> that port's ring (by the port
//!   |  number in the header), answers and replies -> the endpoint's (by the
//!   |  VQP id in the header), Open -> Grant/Refuse sent at once
//!   |- budget: receive slots not reserved (ports' slots, reply windows)
//!   `- Grant/Refuse: sent from a VQP made for each (Opens are rare)
//! Port<N>      ring + channels (own lock); a VQP for replies, credit
//!              returns, releases and descriptor READs (own lock)
//! Endpoint<N>  a VQP; channels, reply ring (own lock); send staging
//! ```
//!
//! # Buffers and flow control (no receive-not-ready, no drop)
//!
//! The SRQ holds `recv_depth` buffers. `ctl_slots` of them are kept for
//! control messages (handled, and re-posted, by whoever polls next). The
//! rest is a budget from which [`Engine::bind`] reserves the port's
//! `port_slots`, and each channel an endpoint opens reserves its
//! `reply_window`. A port grants a channel at most the slots it has not
//! granted yet; a channel sends a data message only with a credit, which
//! comes back after the receiving user popped it. So the data messages that
//! can be in flight to this node never exceed its reservations: a slow
//! receiver slows its senders (their pushes block or say
//! [`MsgError::WouldBlock`]), and nothing is dropped. A message that cannot
//! be delivered (unbound port, the port's slots all granted, too large) is
//! a typed error at the sender.
//!
//! Control messages are bounded per channel (one Open, then at most one
//! Credit per half window and one Release per descriptor); `ctl_slots` is
//! sized for the expected number of concurrently opening senders. The
//! receive CQ is drained by every call into messaging (push, pop, reply,
//! [`Engine::msg_progress`]): a node whose users never call in leaves
//! control messages queued (senders then wait, bounded by their timeouts).
//!
//! # Ordering
//!
//! A channel's data messages go from one VQP (one DCI) to one DCT, so they
//! arrive in order; the receive CQ is drained by one thread at a time, so
//! they enter the port's ring in order. The ring is FIFO: per-sender order
//! is kept (checked: [`MsgStats::out_of_order`]). Replies of a port go
//! through the port's one VQP: per-channel order again.
//!
//! # Zero copy
//!
//! A message longer than `inline_max` travels as a descriptor: the sender
//! copies it into a registered staging buffer (none with
//! [`Endpoint::push_region`]: the caller's own MR is the buffer), the
//! receiver READs it into a registered landing buffer at pop time (one
//! READ, no SRQ bounce), then sends Release so the sender reuses the buffer.
//!
//! # Not supported (typed errors)
//!
//! RC fallback mode ([`MsgError::Unsupported`]: the handshake endpoint does
//! not carry data messages yet; the RC handshake and meta registration keep
//! their own UD protocol); a forked child.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krcore_nic::CompletionQueue;
use krcore_nic::{
    Access, Gid, InlineData, MemoryRegion, Nic, Payload, RecvWr, SendFlags, SendWr, SgList, Sge,
    SharedReceiveQueue, Wc, WcStatus, WrOp,
};
use parking_lot::{Mutex, RwLock};

use super::error::{EngineError, VqpError};
use super::mrs::OwnedMr;
use super::vqp::Vqp;
use super::{Engine, EngineInner, EngineMode, Transport};
use crate::msg::{
    Descriptor, MsgDst, MsgKind, MsgRepr, RefuseCode, ReturnBatch, SendWindow, SeqCheck,
    WindowError, HEADER_LEN,
};

/// How messaging is set up (part of [`super::EngineConfig`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MsgConfig {
    /// Largest body sent inline through the SRQ; longer ones travel as a
    /// descriptor and are pulled with one READ. Each receive buffer is
    /// `HEADER_LEN + inline_max` bytes. Default 8192.
    pub inline_max: usize,
    /// Largest message. Default 16 MiB.
    pub max_message: usize,
    /// Credits a channel asks for (data messages in flight or unpopped).
    /// Default 8.
    pub window: u32,
    /// Replies a channel can hold at the sender (reserved from the
    /// sender's receive budget at Open). Default 4.
    pub reply_window: u32,
    /// Receive slots a bind reserves for its port (shared by its senders'
    /// windows). Default 64.
    pub port_slots: u32,
    /// Receive slots kept for control messages. Default 32.
    pub ctl_slots: u32,
    /// Longest a blocking call waits (push for a credit or the Open's
    /// answer, pop, reply, a descriptor READ). Default 1 s.
    pub timeout: Duration,
    /// Drain the receive CQ from a thread of the engine's (named
    /// `krcore-msg`, started by the first bind/endpoint, joined when the
    /// engine is dropped), so that Opens are answered and credits flow
    /// while this node's users do not call in. Off, the host calls
    /// [`Engine::msg_progress`] (every messaging call drains it too).
    /// Default false (the engine starts no thread unless asked); the SDK
    /// turns it on.
    pub progress_thread: bool,
    /// Sleep of the progress thread after an idle spell. Default 50 us.
    pub idle_sleep: Duration,
}

impl Default for MsgConfig {
    fn default() -> MsgConfig {
        MsgConfig {
            inline_max: 8192,
            max_message: 16 << 20,
            window: 8,
            reply_window: 4,
            port_slots: 64,
            ctl_slots: 32,
            timeout: Duration::from_secs(1),
            progress_thread: false,
            idle_sleep: Duration::from_micros(50),
        }
    }
}

/// Errors of messaging.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
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
    /// A peer broke the credit protocol.
    #[error("credit protocol: {0}")]
    Window(#[from] WindowError),
    /// Engine (connect, MR) failure.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Posting or polling failure.
    #[error(transparent)]
    Vqp(#[from] VqpError),
}

impl MsgError {
    fn nic(what: &'static str) -> impl FnOnce(krcore_nic::NicError) -> MsgError {
        move |source| MsgError::Engine(EngineError::Nic { op: what, source })
    }
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
    /// Data messages for a port unbound after it granted the channel.
    pub orphaned: u64,
    /// Receive completions with an error status.
    pub recv_errors: u64,
    /// Error completions of the node's own message sends.
    pub send_errors: u64,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    inline_delivered: AtomicU64,
    descriptors_delivered: AtomicU64,
    pulled: AtomicU64,
    control: AtomicU64,
    granted: AtomicU64,
    refused: AtomicU64,
    out_of_order: AtomicU64,
    malformed: AtomicU64,
    orphaned: AtomicU64,
    recv_errors: AtomicU64,
    send_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Who sent a message: the node and the VQP id (the immediate data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sender {
    /// The sending node.
    pub gid: Gid,
    /// The sending VQP (an [`Endpoint`]'s id).
    pub vqp: u32,
}

enum Body<N: Nic> {
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
    body: Body<N>,
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
struct Landing<N: Nic> {
    mr: Option<OwnedMr<N>>,
    pool: std::sync::Weak<Mutex<Vec<OwnedMr<N>>>>,
}

impl<N: Nic> Landing<N> {
    fn mr(&self) -> &OwnedMr<N> {
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

/// Free buffers kept per pool.
const POOL_KEEP: usize = 8;
/// Smallest staging or landing buffer.
const MIN_BUFFER: usize = 64 << 10;

/// A buffer of at least `len` bytes from `pool`, or a new one.
fn take_buffer<N: Nic>(
    eng: &EngineInner<N>,
    pool: &Mutex<Vec<OwnedMr<N>>>,
    len: usize,
    access: Access,
) -> Result<OwnedMr<N>, MsgError> {
    let mut p = pool.lock();
    if let Some(i) = p.iter().position(|m| m.len() >= len) {
        return Ok(p.swap_remove(i));
    }
    drop(p);
    let size = len.max(MIN_BUFFER).next_power_of_two();
    let mr = eng
        .nic
        .alloc_mr(&eng.pd, size, access)
        .map_err(MsgError::nic("allocate a message buffer"))?;
    Ok(OwnedMr::new(mr, &eng.mrs))
}

/// The receive side of one channel at the port.
struct ChannelRx {
    window: u32,
    returns: ReturnBatch,
    seq: SeqCheck,
    reply: SendWindow,
}

struct PortState<N: Nic> {
    ring: VecDeque<Message<N>>,
    channels: HashMap<Sender, ChannelRx>,
    /// Slots not granted to any channel.
    ungranted: u32,
    bound: bool,
    /// Tokens of reply descriptors the endpoints released.
    released: Vec<u64>,
}

struct PortShared<N: Nic> {
    port: u16,
    state: Mutex<PortState<N>>,
}

/// The node's messaging host (see the module docs).
pub(crate) struct MsgNode<N: Nic> {
    cfg: MsgConfig,
    slot_len: usize,
    /// Bytes of a staging ring.
    ring_len: usize,
    bufs: OwnedMr<N>,
    srq: N::Srq,
    cq: N::Cq,
    recv: Mutex<Vec<u8>>,
    budget: Mutex<u32>,
    ports: RwLock<HashMap<u16, Arc<PortShared<N>>>>,
    endpoints: RwLock<HashMap<u32, Arc<EndpointShared<N>>>>,
    counters: Counters,
    thread: Mutex<Option<Worker>>,
}

/// The progress thread: stopped and joined when the node is dropped
/// (detached if the thread itself drops the last engine handle).
struct Worker {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
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

fn run_progress<N: Nic>(
    eng: std::sync::Weak<EngineInner<N>>,
    stop: &std::sync::atomic::AtomicBool,
    idle_sleep: Duration,
) {
    const SPIN_POLLS: u32 = 64;
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        let Some(e) = eng.upgrade() else {
            return;
        };
        let n = match e.msg.get() {
            Some(m) => m.progress(&e).unwrap_or(0),
            None => 0,
        };
        drop(e);
        if n > 0 {
            idle = 0;
        } else if idle < SPIN_POLLS {
            idle += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(idle_sleep);
        }
    }
}

impl<N: Nic> MsgNode<N> {
    /// The node's messaging host, made on first use.
    pub(crate) fn get(eng: &Arc<EngineInner<N>>) -> Result<Arc<MsgNode<N>>, MsgError> {
        if eng.forked.load(Ordering::Relaxed) {
            return Err(MsgError::Unsupported {
                reason: "a forked child does not receive (the parent owns the SRQ)",
            });
        }
        if let Some(m) = eng.msg.get() {
            return Ok(m.clone());
        }
        let Transport::Dc(r) = &eng.transport else {
            return Err(MsgError::Unsupported {
                reason: "RC fallback mode has no DCT/SRQ for messages",
            });
        };
        let _guard = eng.msg_init.lock();
        if let Some(m) = eng.msg.get() {
            return Ok(m.clone());
        }
        let cfg = eng.cfg.msg.clone();
        let depth = eng.cfg.recv_depth;
        if cfg.ctl_slots >= depth || cfg.window == 0 || cfg.reply_window == 0 {
            return Err(MsgError::Config(format!(
                "ctl_slots {} must be below recv_depth {depth}; windows non-zero",
                cfg.ctl_slots
            )));
        }
        if (eng.policy.max_inline) < HEADER_LEN {
            return Err(MsgError::Unsupported {
                reason: "the device's inline limit is below the message header",
            });
        }
        let slot_len = HEADER_LEN + cfg.inline_max;
        let mr = eng
            .nic
            .alloc_mr(&eng.pd, slot_len * depth as usize, Access::LOCAL_WRITE)
            .map_err(MsgError::nic("allocate the receive buffers"))?;
        let bufs = OwnedMr::new(mr, &eng.mrs);
        for i in 0..depth {
            let sge = MemoryRegion::sge(&*bufs, i as usize * slot_len, slot_len as u32)
                .map_err(MsgError::nic("a receive buffer"))?;
            r.srq
                .post_recv(&[RecvWr::new(u64::from(i), sge)])
                .map_err(|e| MsgError::Vqp(VqpError::Post(e)))?;
        }
        let node = Arc::new(MsgNode {
            budget: Mutex::new(depth - cfg.ctl_slots),
            cfg,
            slot_len,
            ring_len: slot_len * eng.cfg.vqp_depth as usize,
            bufs,
            srq: r.srq.clone(),
            cq: r.cq.clone(),
            recv: Mutex::new(vec![0u8; slot_len]),
            ports: RwLock::new(HashMap::new()),
            endpoints: RwLock::new(HashMap::new()),
            counters: Counters::default(),
            thread: Mutex::new(None),
        });
        let _ = eng.msg.set(node.clone());
        if node.cfg.progress_thread {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flag, weak, sleep) = (stop.clone(), Arc::downgrade(eng), node.cfg.idle_sleep);
            let handle = std::thread::Builder::new()
                .name("krcore-msg".into())
                .spawn(move || run_progress(weak, &flag, sleep))
                .map_err(|e| MsgError::Config(format!("spawn the messaging thread: {e}")))?;
            *node.thread.lock() = Some(Worker {
                stop,
                handle: Some(handle),
            });
        }
        Ok(node)
    }

    /// A staging ring for inline sends: `vqp_depth` slots of a receive
    /// slot's size, used round-robin ([`MsgNode::ring_slot`]): a slot is
    /// reused `vqp_depth` posts of its VQP later, when the VQP's depth
    /// guarantees the WR that used it was retired.
    fn staging_ring(&self, eng: &EngineInner<N>) -> Result<OwnedMr<N>, MsgError> {
        let slots = eng.cfg.vqp_depth as usize;
        let mr = eng
            .nic
            .alloc_mr(&eng.pd, slots * self.slot_len, Access::LOCAL_WRITE)
            .map_err(MsgError::nic("allocate a send staging ring"))?;
        Ok(OwnedMr::new(mr, &eng.mrs))
    }

    /// The offset of the next staging slot (every post of the VQP counts).
    fn ring_slot(&self, posts: &mut u64) -> usize {
        let slots = self.ring_len / self.slot_len;
        let off = (*posts % slots as u64) as usize * self.slot_len;
        *posts += 1;
        off
    }

    fn reserve(&self, n: u32) -> Result<(), MsgError> {
        let mut b = self.budget.lock();
        if *b < n {
            return Err(MsgError::NoBuffers {
                wanted: n,
                free: *b,
            });
        }
        *b -= n;
        Ok(())
    }

    fn unreserve(&self, n: u32) {
        *self.budget.lock() += n;
    }

    fn stats(&self) -> MsgStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MsgStats {
            received: l(&c.received),
            inline_delivered: l(&c.inline_delivered),
            descriptors_delivered: l(&c.descriptors_delivered),
            pulled: l(&c.pulled),
            control: l(&c.control),
            granted: l(&c.granted),
            refused: l(&c.refused),
            out_of_order: l(&c.out_of_order),
            malformed: l(&c.malformed),
            orphaned: l(&c.orphaned),
            recv_errors: l(&c.recv_errors),
            send_errors: l(&c.send_errors),
        }
    }

    /// Drains the receive CQ (one thread at a time; others return 0 at
    /// once) and demultiplexes what arrived.
    fn progress(&self, eng: &Arc<EngineInner<N>>) -> Result<usize, MsgError> {
        let Some(mut buf) = self.recv.try_lock() else {
            return Ok(0);
        };
        let mut wcs = [Wc::default(); 16];
        let mut total = 0;
        loop {
            let k = self
                .cq
                .poll(&mut wcs)
                .map_err(MsgError::nic("poll the receive CQ"))?;
            for wc in &wcs[..k] {
                self.handle(eng, &mut buf, wc)?;
            }
            total += k;
            if k < wcs.len() {
                return Ok(total);
            }
        }
    }

    fn handle(&self, eng: &Arc<EngineInner<N>>, buf: &mut [u8], wc: &Wc) -> Result<(), MsgError> {
        bump(&self.counters.received);
        let slot = wc.wr_id as usize;
        let off = slot * self.slot_len;
        let repost = |this: &MsgNode<N>| -> Result<(), MsgError> {
            let sge = this
                .bufs
                .sge(off, this.slot_len as u32)
                .map_err(MsgError::nic("a receive buffer"))?;
            this.srq
                .post_recv(&[RecvWr::new(wc.wr_id, sge)])
                .map_err(|e| MsgError::Vqp(VqpError::Post(e)))
        };
        if !wc.status.is_ok() {
            bump(&self.counters.recv_errors);
            return repost(self);
        }
        let len = (wc.byte_len as usize).min(self.slot_len);
        let bytes = &mut buf[..len];
        self.bufs
            .read(off, bytes)
            .map_err(MsgError::nic("read a receive buffer"))?;
        let parsed = MsgRepr::parse_bytes(bytes);
        let body = bytes.get(HEADER_LEN..).unwrap_or(&[]).to_vec();
        repost(self)?;
        let Ok(m) = parsed else {
            bump(&self.counters.malformed);
            return Ok(());
        };
        let Some(imm) = wc.imm else {
            bump(&self.counters.malformed);
            return Ok(());
        };
        match m.dst {
            MsgDst::Port(p) => self.to_port(
                eng,
                m,
                p,
                Sender {
                    gid: m.src,
                    vqp: imm,
                },
                body,
            ),
            MsgDst::Vqp { vqp, from } => {
                self.to_endpoint(m, vqp, from, body);
                Ok(())
            }
        }
    }

    fn to_port(
        &self,
        eng: &Arc<EngineInner<N>>,
        m: MsgRepr,
        p: u16,
        from: Sender,
        body: Vec<u8>,
    ) -> Result<(), MsgError> {
        let port = self.ports.read().get(&p).cloned();
        match m.kind {
            MsgKind::Open {
                window,
                reply_window,
            } => {
                bump(&self.counters.control);
                let answer = match &port {
                    None => MsgKind::Refuse(RefuseCode::Unbound),
                    Some(port) => port.admit(from, window, reply_window),
                };
                match answer {
                    MsgKind::Grant { .. } => bump(&self.counters.granted),
                    _ => bump(&self.counters.refused),
                }
                let reply = MsgRepr {
                    src: eng.nic.gid(),
                    dst: MsgDst::Vqp {
                        vqp: from.vqp,
                        from: p,
                    },
                    kind: answer,
                };
                self.send_ctl(eng, from.gid, &reply)
            }
            MsgKind::Release { token } => {
                bump(&self.counters.control);
                if let Some(port) = port {
                    port.state.lock().released.push(token);
                }
                Ok(())
            }
            MsgKind::Credit { count } => {
                bump(&self.counters.control);
                if let Some(port) = port {
                    let mut st = port.state.lock();
                    let ok = st
                        .channels
                        .get_mut(&from)
                        .is_some_and(|c| c.reply.credit(count).is_ok());
                    if !ok {
                        bump(&self.counters.malformed);
                    }
                }
                Ok(())
            }
            MsgKind::Data { seq, .. } | MsgKind::Desc { seq, .. } => {
                let Some(port) = port else {
                    bump(&self.counters.orphaned);
                    return Ok(());
                };
                let body = match m.kind {
                    MsgKind::Desc { len, desc, .. } => {
                        bump(&self.counters.descriptors_delivered);
                        Body::Pending { len, desc }
                    }
                    _ => {
                        bump(&self.counters.inline_delivered);
                        Body::Inline(body)
                    }
                };
                let mut st = port.state.lock();
                let Some(c) = st.channels.get_mut(&from) else {
                    bump(&self.counters.orphaned);
                    return Ok(());
                };
                if c.seq.accept(seq).is_err() {
                    bump(&self.counters.out_of_order);
                }
                st.ring.push_back(Message {
                    from,
                    port: p,
                    seq,
                    body,
                });
                Ok(())
            }
            _ => {
                bump(&self.counters.malformed);
                Ok(())
            }
        }
    }

    fn to_endpoint(&self, m: MsgRepr, vqp: u32, from: u16, body: Vec<u8>) {
        let Some(ep) = self.endpoints.read().get(&vqp).cloned() else {
            bump(&self.counters.orphaned);
            return;
        };
        let key = (m.src, from);
        let mut st = ep.state.lock();
        match m.kind {
            MsgKind::Grant { window } => {
                bump(&self.counters.control);
                if let Some(c) = st.channels.get_mut(&key) {
                    c.status = Status::Open;
                    c.fwd = SendWindow::new(window);
                }
            }
            MsgKind::Refuse(code) => {
                bump(&self.counters.control);
                if let Some(c) = st.channels.get_mut(&key) {
                    c.status = Status::Refused(code);
                }
            }
            MsgKind::Credit { count } => {
                bump(&self.counters.control);
                let ok = st
                    .channels
                    .get_mut(&key)
                    .is_some_and(|c| c.fwd.credit(count).is_ok());
                if !ok {
                    bump(&self.counters.malformed);
                }
            }
            MsgKind::Release { token } => {
                bump(&self.counters.control);
                st.released.push(token);
            }
            MsgKind::Data { seq, .. } | MsgKind::Desc { seq, .. } => {
                let Some(c) = st.channels.get_mut(&key) else {
                    bump(&self.counters.orphaned);
                    return;
                };
                if c.reply_seq.accept(seq).is_err() {
                    bump(&self.counters.out_of_order);
                }
                let body = match m.kind {
                    MsgKind::Desc { len, desc, .. } => {
                        bump(&self.counters.descriptors_delivered);
                        Body::Pending { len, desc }
                    }
                    _ => {
                        bump(&self.counters.inline_delivered);
                        Body::Inline(body)
                    }
                };
                st.replies.push_back(Message {
                    from: Sender { gid: m.src, vqp: 0 },
                    port: from,
                    seq,
                    body,
                });
            }
            MsgKind::Open { .. } => bump(&self.counters.malformed),
        }
    }

    /// Sends an answer to an Open from a VQP made for it (Opens are rare:
    /// once per channel). The VQP is dropped after the post: the inline
    /// send needs no buffer, and its completion is not needed. (The node
    /// keeps no VQP of its own: a VQP holds the engine, which holds this.)
    fn send_ctl(&self, eng: &Arc<EngineInner<N>>, to: Gid, m: &MsgRepr) -> Result<(), MsgError> {
        let vqp = Engine { inner: eng.clone() }.create_vqp()?;
        let imm = vqp.id().get();
        send_inline(&vqp, to, imm, &m.emit(), self.cfg.timeout, &self.counters)
    }
}

/// Points `vqp` at `to` (a DCCache hit after the first time).
fn aim<N: Nic>(vqp: &Vqp<N>, to: Gid) -> Result<(), MsgError> {
    if vqp.target().map(|t| t.target.gid) != Some(to) {
        vqp.connect(to)?;
    }
    Ok(())
}

/// Polls `vqp`'s completions away, counting errors of message sends.
fn reap<N: Nic>(vqp: &Vqp<N>, counters: &Counters) -> Result<(), MsgError> {
    let mut wcs = [Wc::default(); 16];
    loop {
        let k = vqp.poll(&mut wcs)?;
        for wc in &wcs[..k] {
            if !wc.status.is_ok() {
                bump(&counters.send_errors);
            }
        }
        if k < wcs.len() {
            return Ok(());
        }
    }
}

/// Posts one unsignaled WR on `vqp`, reaping completions while the VQP is
/// full (bounded by `timeout`).
fn post_one<N: Nic>(
    vqp: &Vqp<N>,
    mut wr: SendWr,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    let start = Instant::now();
    loop {
        match vqp.post_send(std::slice::from_mut(&mut wr)) {
            Ok(()) => return Ok(()),
            Err(VqpError::VqpFull { .. }) if start.elapsed() < timeout => {
                reap(vqp, counters)?;
                std::thread::yield_now();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn send_inline<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    imm: u32,
    bytes: &[u8],
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    aim(vqp, to)?;
    let data = InlineData::new(bytes).ok_or(MsgError::Unsupported {
        reason: "control message longer than the inline limit",
    })?;
    let wr = SendWr {
        wr_id: 0,
        op: WrOp::SendImm { imm },
        payload: Payload::Inline(data),
        flags: SendFlags::NONE,
        dest: krcore_nic::Destination::Connected,
    };
    post_one(vqp, wr, timeout, counters)
}

impl<N: Nic> PortShared<N> {
    fn admit(&self, from: Sender, window: u32, reply_window: u32) -> MsgKind {
        let mut st = self.state.lock();
        if !st.bound {
            return MsgKind::Refuse(RefuseCode::Unbound);
        }
        if let Some(c) = st.channels.get(&from) {
            // A repeated Open (the answer was slow): the same grant.
            return MsgKind::Grant { window: c.window };
        }
        let granted = window.min(st.ungranted);
        if granted == 0 {
            return MsgKind::Refuse(RefuseCode::Busy);
        }
        st.ungranted -= granted;
        st.channels.insert(
            from,
            ChannelRx {
                window: granted,
                returns: ReturnBatch::new(granted),
                seq: SeqCheck::default(),
                reply: SendWindow::new(reply_window),
            },
        );
        MsgKind::Grant { window: granted }
    }
}

/// A bound port: receives the messages pushed to it, in per-sender order,
/// and replies to their senders. Dropping it unbinds the port (messages
/// still in its ring are discarded; later ones are counted as
/// [`MsgStats::orphaned`]).
pub struct Port<N: Nic> {
    eng: Arc<EngineInner<N>>,
    node: Arc<MsgNode<N>>,
    shared: Arc<PortShared<N>>,
    tx: Mutex<PortTx<N>>,
}

struct PortTx<N: Nic> {
    vqp: Vqp<N>,
    landing: Arc<Mutex<Vec<OwnedMr<N>>>>,
    staging: Staging<N>,
    /// Staging slots for inline replies (see `EpTx::ring`).
    ring: OwnedMr<N>,
    posts: u64,
}

impl<N: Nic> std::fmt::Debug for Port<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Port")
            .field("port", &self.shared.port)
            .field("queued", &st.ring.len())
            .field("channels", &st.channels.len())
            .finish()
    }
}

impl<N: Nic> Drop for Port<N> {
    fn drop(&mut self) {
        self.node.ports.write().remove(&self.shared.port);
        let mut st = self.shared.state.lock();
        st.bound = false;
        st.ring.clear();
        self.node.unreserve(self.node.cfg.port_slots);
    }
}

impl<N: Nic> Engine<N> {
    /// Binds `port` on this node: messages pushed to it are received by
    /// the returned [`Port`]. Reserves `msg.port_slots` receive slots.
    ///
    /// # Errors
    /// [`MsgError::PortInUse`]; [`MsgError::NoBuffers`] when the node's
    /// receive slots are all reserved; [`MsgError::Unsupported`] in RC
    /// fallback mode or a forked child; engine errors of the first use
    /// (receive buffers, the port's VQP).
    pub fn bind(&self, port: u16) -> Result<Port<N>, MsgError> {
        let node = MsgNode::get(&self.inner)?;
        let slots = node.cfg.port_slots;
        if node.ports.read().contains_key(&port) {
            return Err(MsgError::PortInUse { port });
        }
        let vqp = self.create_vqp()?;
        let ring = node.staging_ring(&self.inner)?;
        let shared = Arc::new(PortShared {
            port,
            state: Mutex::new(PortState {
                ring: VecDeque::new(),
                channels: HashMap::new(),
                ungranted: slots,
                bound: true,
                released: Vec::new(),
            }),
        });
        {
            let mut ports = node.ports.write();
            if ports.contains_key(&port) {
                return Err(MsgError::PortInUse { port });
            }
            node.reserve(slots)?;
            ports.insert(port, shared.clone());
        }
        Ok(Port {
            eng: self.inner.clone(),
            node,
            shared,
            tx: Mutex::new(PortTx {
                vqp,
                landing: Arc::new(Mutex::new(Vec::new())),
                staging: Staging::default(),
                ring,
                posts: 0,
            }),
        })
    }

    /// A new messaging endpoint (a VQP of its own): pushes messages to
    /// ports and receives their replies.
    ///
    /// # Errors
    /// As [`Engine::bind`] ([`MsgError::Unsupported`], engine errors).
    pub fn endpoint(&self) -> Result<Endpoint<N>, MsgError> {
        let node = MsgNode::get(&self.inner)?;
        let vqp = self.create_vqp()?;
        let id = vqp.id().get();
        let shared = Arc::new(EndpointShared {
            state: Mutex::new(EpState {
                channels: HashMap::new(),
                replies: VecDeque::new(),
                released: Vec::new(),
            }),
        });
        let ring = node.staging_ring(&self.inner)?;
        node.endpoints.write().insert(id, shared.clone());
        Ok(Endpoint {
            eng: self.inner.clone(),
            node,
            shared,
            tx: Mutex::new(EpTx {
                vqp,
                ring,
                posts: 0,
                staging: Staging::default(),
                landing: Arc::new(Mutex::new(Vec::new())),
            }),
            id,
        })
    }

    /// Handles what arrived for this node's ports and endpoints (they do it
    /// themselves on every call; this is for a host with no other reason to
    /// call in). Returns the receives handled; 0 before messaging is used.
    ///
    /// # Errors
    /// Provider failures of the receive path.
    pub fn msg_progress(&self) -> Result<usize, MsgError> {
        match self.inner.msg.get() {
            Some(m) => m.clone().progress(&self.inner),
            None => Ok(0),
        }
    }

    /// Messaging statistics (zeros before messaging is used).
    pub fn msg_stats(&self) -> MsgStats {
        self.inner.msg.get().map(|m| m.stats()).unwrap_or_default()
    }

    /// Receive slots not reserved by ports or reply windows (`None` before
    /// messaging is used).
    pub fn msg_unreserved(&self) -> Option<u32> {
        self.inner.msg.get().map(|m| *m.budget.lock())
    }
}

/// Descriptor buffers lent out until the receiver's Release.
struct Staging<N: Nic> {
    free: Arc<Mutex<Vec<OwnedMr<N>>>>,
    lent: HashMap<u64, (OwnedMr<N>, bool)>,
    next_token: u64,
}

impl<N: Nic> Default for Staging<N> {
    fn default() -> Self {
        Staging {
            free: Arc::new(Mutex::new(Vec::new())),
            lent: HashMap::new(),
            next_token: 1,
        }
    }
}

impl<N: Nic> Staging<N> {
    /// Takes back a released buffer (`pooled`: it came from the pool).
    fn release(&mut self, token: u64) {
        if let Some((mr, pooled)) = self.lent.remove(&token) {
            let mut f = self.free.lock();
            if pooled && f.len() < POOL_KEEP {
                f.push(mr);
            }
        }
    }

    /// Lends `mr` for one descriptor; returns its token.
    fn lend(&mut self, mr: OwnedMr<N>, pooled: bool) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        self.lent.insert(t, (mr, pooled));
        t
    }
}

impl<N: Nic> Port<N> {
    /// The port number.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// Messages received and not popped yet.
    pub fn queued(&self) -> usize {
        self.shared.state.lock().ring.len()
    }

    /// The oldest message, if any (non-blocking). A descriptor's body is
    /// pulled here (one READ, waited for); its sender then gets the buffer
    /// back. The message's credit goes back to its sender (in batches of
    /// half its window).
    ///
    /// # Errors
    /// [`MsgError::Failed`] when the pull failed (the message is consumed
    /// and reported, not dropped silently); engine and post errors.
    pub fn try_pop(&self) -> Result<Option<Message<N>>, MsgError> {
        self.node.progress(&self.eng)?;
        let mut tx = self.tx.lock();
        let (mut msg, credit) = {
            let mut st = self.shared.state.lock();
            let Some(msg) = st.ring.pop_front() else {
                return Ok(None);
            };
            let credit = st
                .channels
                .get_mut(&msg.from)
                .and_then(|c| c.returns.popped());
            (msg, credit)
        };
        let pulled = self.pull(&mut tx, &mut msg);
        if let Some(n) = credit {
            let m = MsgRepr {
                src: self.eng.nic.gid(),
                dst: MsgDst::Vqp {
                    vqp: msg.from.vqp,
                    from: self.shared.port,
                },
                kind: MsgKind::Credit { count: n },
            };
            let imm = tx.vqp.id().get();
            send_inline(
                &tx.vqp,
                msg.from.gid,
                imm,
                &m.emit(),
                self.node.cfg.timeout,
                &self.node.counters,
            )?;
        }
        pulled?;
        Ok(Some(msg))
    }

    /// Pulls a descriptor's body (one READ) and releases the sender's
    /// buffer.
    fn pull(&self, tx: &mut PortTx<N>, msg: &mut Message<N>) -> Result<(), MsgError> {
        let Body::Pending { len, desc } = msg.body else {
            return Ok(());
        };
        let landing = take_buffer(&self.eng, &tx.landing, len as usize, Access::LOCAL_WRITE)?;
        let read = read_into(
            &tx.vqp,
            msg.from.gid,
            &landing,
            len,
            desc,
            self.node.cfg.timeout,
            &self.node.counters,
        );
        // Release whatever happened: the sender's buffer is not read again.
        let m = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Vqp {
                vqp: msg.from.vqp,
                from: self.shared.port,
            },
            kind: MsgKind::Release { token: desc.token },
        };
        let imm = tx.vqp.id().get();
        send_inline(
            &tx.vqp,
            msg.from.gid,
            imm,
            &m.emit(),
            self.node.cfg.timeout,
            &self.node.counters,
        )?;
        read?;
        bump(&self.node.counters.pulled);
        msg.body = Body::Pulled {
            mr: Landing {
                mr: Some(landing),
                pool: Arc::downgrade(&tx.landing),
            },
            len: len as usize,
        };
        Ok(())
    }

    /// Pops the oldest message, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Port::try_pop`].
    pub fn pop_timeout(&self, timeout: Duration) -> Result<Message<N>, MsgError> {
        let start = Instant::now();
        loop {
            if let Some(m) = self.try_pop()? {
                return Ok(m);
            }
            if start.elapsed() >= timeout {
                return Err(MsgError::Timeout(start.elapsed()));
            }
            std::thread::yield_now();
        }
    }

    /// Pops the oldest message, waiting up to `msg.timeout`.
    ///
    /// # Errors
    /// As [`Port::pop_timeout`].
    pub fn pop(&self) -> Result<Message<N>, MsgError> {
        self.pop_timeout(self.node.cfg.timeout)
    }

    /// Replies to `to`'s sender (its endpoint's reply ring), waiting up to
    /// `msg.timeout` for a reply credit.
    ///
    /// # Errors
    /// [`MsgError::TooLarge`], [`MsgError::Timeout`] (the sender does not
    /// pop its replies), [`MsgError::Refused`] with
    /// [`RefuseCode::Unbound`] when the sender's channel is unknown here;
    /// engine and post errors.
    pub fn reply(&self, to: &Message<N>, data: &[u8]) -> Result<(), MsgError> {
        self.reply_to(to.from, data)
    }

    /// Replies to `sender` (see [`Port::reply`]).
    ///
    /// # Errors
    /// As [`Port::reply`].
    pub fn reply_to(&self, sender: Sender, data: &[u8]) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        if data.len() > cfg.max_message {
            return Err(MsgError::TooLarge {
                len: data.len(),
                max: cfg.max_message,
            });
        }
        let start = Instant::now();
        loop {
            self.node.progress(&self.eng)?;
            let taken = {
                let mut st = self.shared.state.lock();
                let Some(c) = st.channels.get_mut(&sender) else {
                    return Err(MsgError::Refused {
                        gid: sender.gid,
                        port: self.shared.port,
                        code: RefuseCode::Unbound,
                    });
                };
                c.reply.take()
            };
            if let Some(seq) = taken {
                let mut tx = self.tx.lock();
                let tx = &mut *tx;
                let dst = MsgDst::Vqp {
                    vqp: sender.vqp,
                    from: self.shared.port,
                };
                let released = std::mem::take(&mut self.shared.state.lock().released);
                for t in released {
                    tx.staging.release(t);
                }
                let imm = tx.vqp.id().get();
                let slot = self.node.ring_slot(&mut tx.posts);
                let r = send_data(
                    &self.eng,
                    &tx.vqp,
                    &mut tx.staging,
                    (&tx.ring, slot),
                    sender.gid,
                    dst,
                    imm,
                    seq,
                    data,
                    &self.node,
                );
                if r.is_err() {
                    if let Some(c) = self.shared.state.lock().channels.get_mut(&sender) {
                        c.reply.untake();
                    }
                }
                return r;
            }
            if start.elapsed() >= cfg.timeout {
                return Err(MsgError::Timeout(start.elapsed()));
            }
            std::thread::yield_now();
        }
    }
}

/// READs `len` bytes at `desc` from `from` into `landing`, waiting for the
/// completion (bounded).
fn read_into<N: Nic>(
    vqp: &Vqp<N>,
    from: Gid,
    landing: &OwnedMr<N>,
    len: u32,
    desc: Descriptor,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    const PULL: u64 = 0x5055_4c4c; // "PULL"
    aim(vqp, from)?;
    let sge = landing
        .sge(0, len)
        .map_err(MsgError::nic("a landing buffer"))?;
    let wr = SendWr::read(
        PULL,
        sge,
        krcore_nic::RemoteAddr {
            addr: desc.addr,
            rkey: desc.rkey,
        },
    );
    post_one(vqp, wr, timeout, counters)?;
    let start = Instant::now();
    let mut wcs = [Wc::default(); 16];
    loop {
        let k = vqp.poll(&mut wcs)?;
        for wc in &wcs[..k] {
            if wc.wr_id == PULL {
                return if wc.status.is_ok() {
                    Ok(())
                } else {
                    Err(MsgError::Failed {
                        what: "descriptor READ",
                        status: wc.status,
                    })
                };
            }
            if !wc.status.is_ok() {
                bump(&counters.send_errors);
            }
        }
        if start.elapsed() >= timeout {
            return Err(MsgError::Timeout(start.elapsed()));
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
}

/// Sends one data message (inline, or a descriptor of a staging buffer or
/// of `region`) from `vqp`, unsignaled.
#[allow(clippy::too_many_arguments)]
fn send_data<N: Nic>(
    eng: &EngineInner<N>,
    vqp: &Vqp<N>,
    staging: &mut Staging<N>,
    (ring, off): (&OwnedMr<N>, usize),
    to: Gid,
    dst: MsgDst,
    imm: u32,
    seq: u64,
    data: &[u8],
    node: &MsgNode<N>,
) -> Result<(), MsgError> {
    let cfg = &node.cfg;
    aim(vqp, to)?;
    let src = eng.nic.gid();
    if data.len() <= cfg.inline_max {
        let header = MsgRepr {
            src,
            dst,
            kind: MsgKind::Data {
                seq,
                len: data.len() as u32,
            },
        }
        .emit();
        if HEADER_LEN + data.len() <= eng.policy.max_inline {
            let mut b = [0u8; krcore_nic::MAX_INLINE];
            b[..HEADER_LEN].copy_from_slice(&header);
            b[HEADER_LEN..HEADER_LEN + data.len()].copy_from_slice(data);
            return send_inline(
                vqp,
                to,
                imm,
                &b[..HEADER_LEN + data.len()],
                cfg.timeout,
                &node.counters,
            );
        }
        // Through a staging slot of the sender's ring.
        ring.write(off, &header)
            .and_then(|()| ring.write(off + HEADER_LEN, data))
            .map_err(MsgError::nic("write a staging buffer"))?;
        let sge = ring
            .sge(off, (HEADER_LEN + data.len()) as u32)
            .map_err(MsgError::nic("a staging buffer"))?;
        return post_one(vqp, send_wr(sge, imm), cfg.timeout, &node.counters);
    }
    let mr = take_buffer(
        eng,
        &staging.free,
        data.len(),
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    )?;
    mr.write(0, data)
        .map_err(MsgError::nic("write a staging buffer"))?;
    let desc = Descriptor {
        addr: mr.addr(),
        rkey: mr.rkey(),
        token: 0,
    };
    let token = staging.lend(mr, true);
    send_descriptor(
        vqp,
        to,
        dst,
        imm,
        seq,
        data.len() as u32,
        Descriptor { token, ..desc },
        src,
        cfg.timeout,
        &node.counters,
    )
    .inspect_err(|_| staging.release(token))
}

#[allow(clippy::too_many_arguments)]
fn send_descriptor<N: Nic>(
    vqp: &Vqp<N>,
    to: Gid,
    dst: MsgDst,
    imm: u32,
    seq: u64,
    len: u32,
    desc: Descriptor,
    src: Gid,
    timeout: Duration,
    counters: &Counters,
) -> Result<(), MsgError> {
    let header = MsgRepr {
        src,
        dst,
        kind: MsgKind::Desc { seq, len, desc },
    }
    .emit();
    send_inline(vqp, to, imm, &header, timeout, counters)
}

fn send_wr(sge: Sge, imm: u32) -> SendWr {
    SendWr {
        wr_id: 0,
        op: WrOp::SendImm { imm },
        payload: Payload::Local(SgList::one(sge)),
        flags: SendFlags::NONE,
        dest: krcore_nic::Destination::Connected,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Opening,
    Open,
    Refused(RefuseCode),
}

/// The send side of one channel at the endpoint.
struct ChannelTx {
    status: Status,
    fwd: SendWindow,
    reply_returns: ReturnBatch,
    reply_seq: SeqCheck,
    reply_window: u32,
}

struct EpState<N: Nic> {
    channels: HashMap<(Gid, u16), ChannelTx>,
    replies: VecDeque<Message<N>>,
    released: Vec<u64>,
}

struct EndpointShared<N: Nic> {
    state: Mutex<EpState<N>>,
}

struct EpTx<N: Nic> {
    vqp: Vqp<N>,
    /// `ring_slots` staging slots for inline messages, used round-robin:
    /// a slot is reused `ring_slots` posts later, when the VQP's depth
    /// guarantees the WR that used it was retired.
    ring: OwnedMr<N>,
    posts: u64,
    staging: Staging<N>,
    landing: Arc<Mutex<Vec<OwnedMr<N>>>>,
}

/// A messaging endpoint: one VQP that pushes messages to ports (its id is
/// the immediate of every message) and receives their replies. `Send +
/// Sync`; pushes are serialized per endpoint.
pub struct Endpoint<N: Nic> {
    eng: Arc<EngineInner<N>>,
    node: Arc<MsgNode<N>>,
    shared: Arc<EndpointShared<N>>,
    tx: Mutex<EpTx<N>>,
    id: u32,
}

impl<N: Nic> std::fmt::Debug for Endpoint<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Endpoint")
            .field("vqp", &self.id)
            .field("channels", &st.channels.len())
            .field("replies", &st.replies.len())
            .finish()
    }
}

impl<N: Nic> Drop for Endpoint<N> {
    fn drop(&mut self) {
        self.node.endpoints.write().remove(&self.id);
        let st = self.shared.state.lock();
        let reserved: u32 = st.channels.values().map(|c| c.reply_window).sum();
        self.node.unreserve(reserved);
    }
}

/// How a push waits for a credit.
#[derive(Clone, Copy)]
enum Wait {
    No,
    For(Duration),
}

impl<N: Nic> Endpoint<N> {
    /// The endpoint's VQP id (the immediate data of its messages; what a
    /// port sees as [`Sender::vqp`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Pushes `data` to `port` at node `gid`, waiting up to `msg.timeout`
    /// for a credit (the first push to a port also waits for the channel's
    /// Open round trip).
    ///
    /// # Errors
    /// [`MsgError::TooLarge`]; [`MsgError::Refused`] (`Unbound`: no such
    /// port; `Busy`: its slots are all granted); [`MsgError::NoBuffers`]
    /// (no room here for the channel's replies); [`MsgError::Timeout`] when
    /// the receiver does not pop; engine (`UnknownNode`, ...) and post
    /// errors. Nothing is sent on error.
    pub fn push(&self, gid: Gid, port: u16, data: &[u8]) -> Result<(), MsgError> {
        self.push_with(
            gid,
            port,
            Payload2::Bytes(data),
            Wait::For(self.node.cfg.timeout),
        )
    }

    /// [`Endpoint::push`] waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::push`].
    pub fn push_timeout(
        &self,
        gid: Gid,
        port: u16,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), MsgError> {
        self.push_with(gid, port, Payload2::Bytes(data), Wait::For(timeout))
    }

    /// Pushes without waiting for a credit: [`MsgError::WouldBlock`] when
    /// the channel has none (the receiver has not popped enough yet). The
    /// channel's first push still waits for the Open round trip.
    ///
    /// # Errors
    /// [`MsgError::WouldBlock`]; as [`Endpoint::push`].
    pub fn try_push(&self, gid: Gid, port: u16, data: &[u8]) -> Result<(), MsgError> {
        self.push_with(gid, port, Payload2::Bytes(data), Wait::No)
    }

    /// Pushes `len` bytes at `offset` of `region` as a descriptor (zero
    /// copy: the receiver READs them from `region`). The region must allow
    /// `REMOTE_READ`, and must not be written until the receiver released
    /// it ([`Endpoint::in_flight_regions`] drops to 0).
    ///
    /// # Errors
    /// As [`Endpoint::push`]; [`MsgError::Engine`] for a range outside the
    /// region.
    pub fn push_region(
        &self,
        gid: Gid,
        port: u16,
        region: &OwnedMr<N>,
        offset: usize,
        len: u32,
    ) -> Result<(), MsgError> {
        region
            .sge(offset, len)
            .map_err(MsgError::nic("the pushed region"))?;
        self.push_with(
            gid,
            port,
            Payload2::Region(region, offset, len),
            Wait::For(self.node.cfg.timeout),
        )
    }

    /// Descriptor buffers not yet released by their receivers.
    pub fn in_flight_regions(&self) -> usize {
        let _ = self.node.progress(&self.eng);
        let mut tx = self.tx.lock();
        self.collect_released(&mut tx);
        tx.staging.lent.len()
    }

    fn collect_released(&self, tx: &mut EpTx<N>) {
        let released = std::mem::take(&mut self.shared.state.lock().released);
        for t in released {
            tx.staging.release(t);
        }
    }

    fn push_with(
        &self,
        gid: Gid,
        port: u16,
        payload: Payload2<'_, N>,
        wait: Wait,
    ) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        let len = payload.len();
        if len > cfg.max_message {
            return Err(MsgError::TooLarge {
                len,
                max: cfg.max_message,
            });
        }
        let key = (gid, port);
        let start = Instant::now();
        let mut tx = self.tx.lock();
        self.open(&mut tx, key, start)?;
        loop {
            self.node.progress(&self.eng)?;
            let seq = {
                let mut st = self.shared.state.lock();
                match st.channels.get_mut(&key) {
                    Some(c) => c.fwd.take(),
                    None => None,
                }
            };
            if let Some(seq) = seq {
                let r = self.send(&mut tx, gid, port, seq, payload);
                if r.is_err() {
                    if let Some(c) = self.shared.state.lock().channels.get_mut(&key) {
                        c.fwd.untake();
                    }
                }
                return r;
            }
            match wait {
                Wait::No => return Err(MsgError::WouldBlock),
                Wait::For(t) if start.elapsed() >= t => {
                    return Err(MsgError::Timeout(start.elapsed()))
                }
                Wait::For(_) => {
                    reap(&tx.vqp, &self.node.counters)?;
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Opens the channel `key` if needed: Open, then wait for its answer.
    fn open(&self, tx: &mut EpTx<N>, key: (Gid, u16), start: Instant) -> Result<(), MsgError> {
        let cfg = &self.node.cfg;
        let status = self
            .shared
            .state
            .lock()
            .channels
            .get(&key)
            .map(|c| c.status);
        match status {
            Some(Status::Open) => return Ok(()),
            // A refusal that came after an Open timed out: ask again (the
            // port may be bound, or drained, by now).
            Some(Status::Refused(_)) => self.forget(key),
            Some(Status::Opening) | None => {}
        }
        // An Open still unanswered is sent again: a port answers a repeated
        // Open with the same grant.
        if status != Some(Status::Opening) {
            self.node.reserve(cfg.reply_window)?;
            self.shared.state.lock().channels.insert(
                key,
                ChannelTx {
                    status: Status::Opening,
                    fwd: SendWindow::new(0),
                    reply_returns: ReturnBatch::new(cfg.reply_window),
                    reply_seq: SeqCheck::default(),
                    reply_window: cfg.reply_window,
                },
            );
        }
        let open = MsgRepr {
            src: self.eng.nic.gid(),
            dst: MsgDst::Port(key.1),
            kind: MsgKind::Open {
                window: cfg.window,
                reply_window: cfg.reply_window,
            },
        };
        if let Err(e) = send_inline(
            &tx.vqp,
            key.0,
            self.id,
            &open.emit(),
            cfg.timeout,
            &self.node.counters,
        ) {
            self.forget(key);
            return Err(e);
        }
        loop {
            self.node.progress(&self.eng)?;
            let status = self
                .shared
                .state
                .lock()
                .channels
                .get(&key)
                .map(|c| c.status);
            match status {
                Some(Status::Open) => return Ok(()),
                Some(Status::Refused(code)) => {
                    self.forget(key);
                    return Err(MsgError::Refused {
                        gid: key.0,
                        port: key.1,
                        code,
                    });
                }
                _ => {}
            }
            if start.elapsed() >= cfg.timeout {
                // Left Opening: a late Grant still opens it.
                return Err(MsgError::Timeout(start.elapsed()));
            }
            reap(&tx.vqp, &self.node.counters)?;
            std::thread::yield_now();
        }
    }

    fn forget(&self, key: (Gid, u16)) {
        if self.shared.state.lock().channels.remove(&key).is_some() {
            self.node.unreserve(self.node.cfg.reply_window);
        }
    }

    fn send(
        &self,
        tx: &mut EpTx<N>,
        gid: Gid,
        port: u16,
        seq: u64,
        payload: Payload2<'_, N>,
    ) -> Result<(), MsgError> {
        self.collect_released(tx);
        let dst = MsgDst::Port(port);
        let EpTx {
            vqp,
            ring,
            posts,
            staging,
            ..
        } = tx;
        let slot = self.node.ring_slot(posts);
        match payload {
            Payload2::Bytes(data) => send_data(
                &self.eng,
                vqp,
                staging,
                (ring, slot),
                gid,
                dst,
                self.id,
                seq,
                data,
                &self.node,
            ),
            Payload2::Region(mr, offset, len) => {
                aim(vqp, gid)?;
                let desc = Descriptor {
                    addr: mr.addr() + offset as u64,
                    rkey: mr.rkey(),
                    token: 0,
                };
                let token = staging.lend(mr.clone(), false);
                send_descriptor(
                    vqp,
                    gid,
                    dst,
                    self.id,
                    seq,
                    len,
                    Descriptor { token, ..desc },
                    self.eng.nic.gid(),
                    self.node.cfg.timeout,
                    &self.node.counters,
                )
                .inspect_err(|_| staging.release(token))
            }
        }
    }

    /// The oldest reply, if any (non-blocking); a descriptor's body is
    /// pulled here. The reply's credit goes back to its port.
    ///
    /// # Errors
    /// As [`Port::try_pop`].
    pub fn try_pop_reply(&self) -> Result<Option<Message<N>>, MsgError> {
        self.node.progress(&self.eng)?;
        let tx = self.tx.lock();
        let (mut msg, credit) = {
            let mut st = self.shared.state.lock();
            let Some(msg) = st.replies.pop_front() else {
                return Ok(None);
            };
            let credit = st
                .channels
                .get_mut(&(msg.from.gid, msg.port))
                .and_then(|c| c.reply_returns.popped());
            (msg, credit)
        };
        let mut pulled = Ok(());
        if let Body::Pending { len, desc } = msg.body {
            pulled = (|| {
                let landing =
                    take_buffer(&self.eng, &tx.landing, len as usize, Access::LOCAL_WRITE)?;
                let read = read_into(
                    &tx.vqp,
                    msg.from.gid,
                    &landing,
                    len,
                    desc,
                    self.node.cfg.timeout,
                    &self.node.counters,
                );
                // Release whatever happened: the buffer is not read again.
                let rel = MsgRepr {
                    src: self.eng.nic.gid(),
                    dst: MsgDst::Port(msg.port),
                    kind: MsgKind::Release { token: desc.token },
                };
                send_inline(
                    &tx.vqp,
                    msg.from.gid,
                    self.id,
                    &rel.emit(),
                    self.node.cfg.timeout,
                    &self.node.counters,
                )?;
                read?;
                bump(&self.node.counters.pulled);
                msg.body = Body::Pulled {
                    mr: Landing {
                        mr: Some(landing),
                        pool: Arc::downgrade(&tx.landing),
                    },
                    len: len as usize,
                };
                Ok::<(), MsgError>(())
            })();
        }
        if let Some(n) = credit {
            let m = MsgRepr {
                src: self.eng.nic.gid(),
                dst: MsgDst::Port(msg.port),
                kind: MsgKind::Credit { count: n },
            };
            send_inline(
                &tx.vqp,
                msg.from.gid,
                self.id,
                &m.emit(),
                self.node.cfg.timeout,
                &self.node.counters,
            )?;
        }
        pulled?;
        Ok(Some(msg))
    }

    /// Pops the oldest reply, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`MsgError::Timeout`]; as [`Endpoint::try_pop_reply`].
    pub fn pop_reply_timeout(&self, timeout: Duration) -> Result<Message<N>, MsgError> {
        let start = Instant::now();
        loop {
            if let Some(m) = self.try_pop_reply()? {
                return Ok(m);
            }
            if start.elapsed() >= timeout {
                return Err(MsgError::Timeout(start.elapsed()));
            }
            std::thread::yield_now();
        }
    }

    /// Pops the oldest reply, waiting up to `msg.timeout`.
    ///
    /// # Errors
    /// As [`Endpoint::pop_reply_timeout`].
    pub fn pop_reply(&self) -> Result<Message<N>, MsgError> {
        self.pop_reply_timeout(self.node.cfg.timeout)
    }

    /// Credits available now on the channel to (`gid`, `port`) (`None`
    /// before it is open).
    pub fn credits(&self, gid: Gid, port: u16) -> Option<u32> {
        let _ = self.node.progress(&self.eng);
        let st = self.shared.state.lock();
        st.channels
            .get(&(gid, port))
            .filter(|c| c.status == Status::Open)
            .map(|c| c.fwd.available())
    }
}

#[derive(Clone, Copy)]
enum Payload2<'a, N: Nic> {
    Bytes(&'a [u8]),
    Region(&'a OwnedMr<N>, usize, u32),
}

impl<N: Nic> Payload2<'_, N> {
    fn len(&self) -> usize {
        match self {
            Payload2::Bytes(b) => b.len(),
            Payload2::Region(_, _, l) => *l as usize,
        }
    }
}

// Mode check used by the SDK's docs: messaging runs in DC mode only.
impl<N: Nic> Engine<N> {
    /// Whether this engine can bind ports and push messages (DC mode, not a
    /// forked child).
    pub fn msg_supported(&self) -> bool {
        self.mode() == EngineMode::Dc && !self.inner.forked.load(Ordering::Relaxed)
    }
}
