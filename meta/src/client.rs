//! The client side: [`MetaClient`] (a checked bootstrap: where the table
//! is), [`MetaRpc`] (Register/Renew/Deregister over UD with timeouts and
//! retries) and [`lookup_once`] (one READ of a bucket through a DC
//! initiator).
//!
//! Lookups by READ belong to the engine (kmod), which reads the table
//! through its own DC initiators and cache; [`lookup_once`] is the
//! one-READ primitive it and the tests share.
//!
//! # RPC semantics
//! - Each call sends up to `1 + retries` requests, each with its own request
//!   id, waiting [`RpcConfig::timeout`] for a reply after each. A reply to
//!   any attempt of the current call is accepted; replies to earlier calls
//!   (late replies) and datagrams from anyone but the server are discarded
//!   and counted. A call therefore returns or fails within
//!   `(1 + retries) * timeout` plus scheduling noise: never hangs.
//! - Retried requests may all be applied by the server (UD loses replies as
//!   well as requests). Renew is idempotent. A retried Register is applied
//!   again with a newer epoch: the returned lease may then be older than the
//!   table's entry (a later `renew` reports the current epoch). A retried
//!   Deregister whose first attempt was applied is refused with
//!   `NotRegistered`; [`MetaError::Refused::attempts`] tells.

use crate::bootstrap;
use crate::engine::Lease;
use crate::entry::{EntryRepr, ENTRY_LEN};
use crate::error::{MetaError, MetaResult};
use crate::table::{find_in_bucket, Geometry, MAX_SLOTS_PER_BUCKET};
use crate::ud::{Incoming, UdEndpoint};
use crate::wire::{BootstrapError, BootstrapRepr, Message, RegisterRepr, Repr};
use krcore_nic::sim::SimFabric;
use krcore_nic::{
    CompletionQueue, DcTarget, Destination, Gid, MemoryRegion, Nic, NicError, PostError, QueuePair,
    RemoteAddr, SendWr, UdTarget, Wc, WcStatus,
};
use std::time::{Duration, Instant};

/// A meta server as a client sees it: its bootstrap, checked once.
///
/// Invariant: the bootstrap's table layout is readable by this build
/// (`geometry()` succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaClient {
    bootstrap: BootstrapRepr,
    geometry: Geometry,
}

impl MetaClient {
    /// A client of the server `bootstrap` describes.
    ///
    /// # Errors
    /// [`MetaError::Bootstrap`] when this build cannot read its table.
    pub fn new(bootstrap: BootstrapRepr) -> MetaResult<MetaClient> {
        Ok(MetaClient {
            geometry: bootstrap.geometry()?,
            bootstrap,
        })
    }

    /// A client of the server published under `name` on `fabric`.
    ///
    /// # Errors
    /// See [`bootstrap::lookup_on_sim`].
    pub fn from_sim(fabric: &SimFabric, name: &str) -> MetaResult<MetaClient> {
        MetaClient::new(bootstrap::lookup_on_sim(fabric, name)?)
    }

    /// A client of the server whose TCP bootstrap listens on `addr`.
    ///
    /// # Errors
    /// See [`bootstrap::fetch_bootstrap_tcp`].
    pub fn from_tcp(
        addr: impl std::net::ToSocketAddrs,
        timeout: Duration,
    ) -> MetaResult<MetaClient> {
        MetaClient::new(bootstrap::fetch_bootstrap_tcp(addr, timeout)?)
    }

    /// The server's bootstrap.
    pub fn bootstrap(&self) -> &BootstrapRepr {
        &self.bootstrap
    }

    /// The table's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Where the bucket of `gid` is, and how many bytes one READ of it
    /// takes.
    pub fn bucket_of(&self, gid: &Gid) -> (RemoteAddr, usize) {
        let g = self.geometry;
        let off = g.bucket_offset(g.bucket_of(gid));
        (self.bootstrap.table.offset(off), g.bucket_len())
    }

    /// An RPC client on `nic` for this server.
    ///
    /// # Errors
    /// See [`MetaRpc::new`].
    pub fn rpc<N: Nic>(&self, nic: &N, cfg: RpcConfig) -> MetaResult<MetaRpc<N>> {
        MetaRpc::new(nic, &self.bootstrap, cfg)
    }
}

/// How a [`MetaRpc`] waits and retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcConfig {
    /// How long to wait for a reply after each request.
    pub timeout: Duration,
    /// Requests re-sent after a timeout (0: one attempt only).
    pub retries: u32,
    /// UD receive buffers kept posted.
    pub recv_slots: u32,
    /// UD send slots.
    pub send_slots: u32,
}

impl Default for RpcConfig {
    fn default() -> RpcConfig {
        RpcConfig {
            timeout: Duration::from_millis(100),
            retries: 4,
            recv_slots: 16,
            send_slots: 8,
        }
    }
}

/// What an RPC client did (totals since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Calls made.
    pub calls: u64,
    /// Requests sent (first attempts and retries).
    pub requests: u64,
    /// Requests re-sent after a timeout.
    pub retries: u64,
    /// Calls that timed out after every retry.
    pub timeouts: u64,
    /// Replies discarded as late: to earlier calls, or a second reply to
    /// a retried call.
    pub stale_replies: u64,
    /// Datagrams from anyone but the server, or not a valid message.
    pub foreign: u64,
}

/// Register/Renew/Deregister client of a meta server, over one UD QP.
///
/// Not thread-safe by design (`&mut self`): one caller at a time, each call
/// waiting for its reply. Open one per thread if several need it.
pub struct MetaRpc<N: Nic> {
    ud: UdEndpoint<N>,
    server: UdTarget,
    cfg: RpcConfig,
    next_id: u64,
    stats: RpcStats,
    incoming: Vec<Incoming>,
    _pd: N::Pd,
}

impl<N: Nic> std::fmt::Debug for MetaRpc<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaRpc")
            .field("server", &self.server)
            .field("qpn", &self.ud.qpn())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<N: Nic> MetaRpc<N> {
    /// A client on `nic` of the server `bootstrap` describes: a UD QP with
    /// the server's qkey and its buffers.
    ///
    /// # Errors
    /// [`MetaError::Config`] for slot counts the device cannot take;
    /// [`MetaError::Nic`]/[`MetaError::Post`] when the provider refuses.
    pub fn new(nic: &N, bootstrap: &BootstrapRepr, cfg: RpcConfig) -> MetaResult<MetaRpc<N>> {
        let pd = nic.alloc_pd().map_err(|source| MetaError::Nic {
            op: "allocate PD",
            source,
        })?;
        let ud = UdEndpoint::new(nic, &pd, bootstrap.rpc_qkey, cfg.recv_slots, cfg.send_slots)?;
        // Request ids start somewhere new for every client, so that a
        // client reusing a dead one's QPN does not take its late replies.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Ok(MetaRpc {
            next_id: seed ^ (u64::from(ud.qpn()) << 32),
            ud,
            server: bootstrap.rpc_target(),
            cfg,
            stats: RpcStats::default(),
            incoming: Vec::new(),
            _pd: pd,
        })
    }

    /// The server's UD address.
    pub fn server(&self) -> UdTarget {
        self.server
    }

    /// Counters of this client.
    pub fn stats(&self) -> RpcStats {
        self.stats
    }

    /// Registers (or re-registers) `target` with a lease of `lease_ms`.
    ///
    /// # Errors
    /// [`MetaError::Timeout`]; [`MetaError::Refused`] with
    /// `BucketFull`, `InvalidLease`, `EpochExhausted`; provider failures.
    pub fn register(&mut self, target: DcTarget, lid: u16, lease_ms: u64) -> MetaResult<Lease> {
        let m = Message::Register(RegisterRepr {
            target,
            lid,
            lease_ms,
        });
        self.lease_call("register", m)
    }

    /// Renews the lease of `gid` by the length it registered with.
    ///
    /// # Errors
    /// [`MetaError::Timeout`]; [`MetaError::Refused`] with `NotRegistered`
    /// or `LeaseExpired` (register again); provider failures.
    pub fn renew(&mut self, gid: &Gid) -> MetaResult<Lease> {
        self.lease_call("renew", Message::Renew { gid: *gid })
    }

    /// Removes the registration of `gid`, returning its epoch and expiry.
    ///
    /// # Errors
    /// [`MetaError::Timeout`]; [`MetaError::Refused`] with `NotRegistered`
    /// (see the module docs on retries); provider failures.
    pub fn deregister(&mut self, gid: &Gid) -> MetaResult<Lease> {
        self.lease_call("deregister", Message::Deregister { gid: *gid })
    }

    /// Asks the server for its bootstrap over RPC (to check its
    /// incarnation, for example).
    ///
    /// # Errors
    /// [`MetaError::Timeout`], [`MetaError::UnexpectedReply`], provider
    /// failures.
    pub fn fetch_bootstrap(&mut self) -> MetaResult<BootstrapRepr> {
        let op = "bootstrap";
        match self.call(op, Message::BootstrapRequest)? {
            (Message::Bootstrap(b), _) => Ok(b),
            (Message::Err(code), attempts) => Err(MetaError::Refused { op, code, attempts }),
            (other, _) => Err(MetaError::UnexpectedReply {
                op,
                got: other.msg_type(),
            }),
        }
    }

    fn lease_call(&mut self, op: &'static str, m: Message) -> MetaResult<Lease> {
        match self.call(op, m)? {
            (Message::Ok(lease), _) => Ok(lease),
            (Message::Err(code), attempts) => Err(MetaError::Refused { op, code, attempts }),
            (other, _) => Err(MetaError::UnexpectedReply {
                op,
                got: other.msg_type(),
            }),
        }
    }

    /// Sends `message` and waits for the reply, retrying; returns the reply
    /// and the number of requests sent.
    fn call(&mut self, op: &'static str, message: Message) -> MetaResult<(Message, u32)> {
        let attempts = self.cfg.retries.saturating_add(1);
        let base = self.next_id;
        self.next_id = self.next_id.wrapping_add(u64::from(attempts));
        self.stats.calls += 1;
        let start = Instant::now();
        for attempt in 0..attempts {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            let request_id = base.wrapping_add(u64::from(attempt));
            // A request the endpoint could not send (no free slot) is as
            // good as lost: wait and retry like any other.
            self.ud.send(
                self.server,
                &Repr {
                    request_id,
                    message,
                },
            )?;
            self.stats.requests += 1;
            if let Some(reply) = self.wait(base, attempt)? {
                return Ok((reply, attempt + 1));
            }
        }
        self.stats.timeouts += 1;
        Err(MetaError::Timeout {
            op,
            attempts,
            waited: start.elapsed(),
        })
    }

    /// Waits up to one timeout for a reply to attempts `0..=attempt` of the
    /// call whose first request id is `base`.
    fn wait(&mut self, base: u64, attempt: u32) -> MetaResult<Option<Message>> {
        const SPIN_POLLS: u32 = 64;
        let deadline = Instant::now() + self.cfg.timeout;
        let mut idle = 0u32;
        loop {
            let mut incoming = std::mem::take(&mut self.incoming);
            incoming.clear();
            let polled = self.ud.poll_recv(&mut incoming);
            let mut found = None;
            for m in &incoming {
                match self.accept(m, base, attempt) {
                    Some(reply) if found.is_none() => found = Some(reply),
                    // A second reply to this call (an earlier attempt's).
                    Some(_) => self.stats.stale_replies += 1,
                    None => {}
                }
            }
            self.incoming = incoming;
            if found.is_some() {
                return Ok(found);
            }
            if polled? > 0 {
                idle = 0;
                continue;
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if idle < SPIN_POLLS {
                idle += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// The reply in `m` if it answers one of attempts `0..=attempt`;
    /// counts what it discards.
    fn accept(&mut self, m: &Incoming, base: u64, attempt: u32) -> Option<Message> {
        if m.src != self.server.gid || m.src_qp != self.server.qpn {
            self.stats.foreign += 1;
            return None;
        }
        let Ok(r) = Repr::parse_bytes(m.payload()) else {
            self.stats.foreign += 1;
            return None;
        };
        if r.message.msg_type().is_request() {
            self.stats.foreign += 1;
            return None;
        }
        if r.request_id.wrapping_sub(base) > u64::from(attempt) {
            self.stats.stale_replies += 1;
            return None;
        }
        Some(r.message)
    }
}

/// `wr_id` of the READ [`lookup_once`] posts.
pub const LOOKUP_WR_ID: u64 = u64::from_le_bytes(*b"KRMTlook");
/// How long [`lookup_once`] waits for its completion.
pub const LOOKUP_WAIT: Duration = Duration::from_secs(5);

/// Why [`lookup_once`] has no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The READ completed but the bucket gave no answer:
    /// [`crate::table::LookupError::Torn`] (retry) or `Corrupt`.
    #[error(transparent)]
    Bucket(#[from] crate::table::LookupError),
    /// The bootstrap describes a table this build cannot read.
    #[error("bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// The scratch region cannot hold one bucket.
    #[error("scratch region of {have} bytes cannot hold a {need}-byte bucket")]
    ScratchTooSmall {
        /// Bytes of one bucket.
        need: usize,
        /// Bytes of the scratch region.
        have: usize,
    },
    /// A provider call failed.
    #[error("lookup: {0}")]
    Nic(#[from] NicError),
    /// The READ was refused at post time (QP not in RTS, queue full).
    #[error("lookup READ refused: {0}")]
    Post(#[from] PostError),
    /// The READ completed with an error: the server is dead
    /// (`RETRY_EXC_ERR`), its table moved (`REM_ACCESS_ERR`), or the QP was
    /// already in ERR (`WR_FLUSH_ERR`). The DCI is in ERR now and needs a
    /// reset before its next use.
    #[error("lookup READ completed with {0:?}")]
    Completion(WcStatus),
    /// No completion within [`LOOKUP_WAIT`].
    #[error("lookup READ did not complete within {0:?}")]
    Timeout(Duration),
    /// The CQ returned another work request's completion (the CQ must be
    /// dedicated to the lookup while it runs).
    #[error("unexpected completion of wr_id {:#x} on the lookup CQ", .0.wr_id)]
    UnexpectedCompletion(Wc),
}

impl LookupError {
    /// Whether the bucket was being written while it was read: READ again.
    pub fn is_torn(&self) -> bool {
        matches!(
            self,
            LookupError::Bucket(crate::table::LookupError::Torn { .. })
        )
    }

    /// Whether another READ may succeed: a torn bucket always, a checksum
    /// mismatch a bounded number of times (see
    /// [`crate::table::LookupError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, LookupError::Bucket(e) if e.is_retryable())
    }
}

/// Looks `gid` up with exactly one READ: the bucket `bootstrap` places it
/// in, read through the DC initiator `qp` into the start of `scratch`, then
/// parsed with [`find_in_bucket`].
///
/// Preconditions: `qp` is a DCI in RTS with a free send slot; `cq` is its
/// send CQ with nothing else outstanding; `scratch` is a local region with
/// `LOCAL_WRITE` of at least one bucket. The READ is signaled; its
/// completion is polled here (at most [`LOOKUP_WAIT`]).
///
/// Returns `Ok(Some(entry))` when a stable entry holds `gid`, `Ok(None)`
/// when every slot is stable and none does.
///
/// # Errors
/// [`LookupError`]; [`LookupError::is_torn`] says the READ raced a write
/// and may simply be repeated.
pub fn lookup_once<N: Nic>(
    qp: &N::Qp,
    cq: &N::Cq,
    scratch: &N::Mr,
    bootstrap: &BootstrapRepr,
    gid: &Gid,
) -> Result<Option<EntryRepr>, LookupError> {
    let g = bootstrap.geometry()?;
    let len = g.bucket_len();
    if scratch.len() < len {
        return Err(LookupError::ScratchTooSmall {
            need: len,
            have: scratch.len(),
        });
    }
    let remote = bootstrap.table.offset(g.bucket_offset(g.bucket_of(gid)));
    let wr = SendWr::read(LOOKUP_WR_ID, scratch.sge(0, len as u32)?, remote)
        .to(Destination::Dc(bootstrap.server));
    qp.post_send(&[wr])?;
    let start = Instant::now();
    let mut wc = [Wc::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            break;
        }
        if start.elapsed() >= LOOKUP_WAIT {
            return Err(LookupError::Timeout(LOOKUP_WAIT));
        }
        std::hint::spin_loop();
    }
    let wc = wc[0];
    if wc.wr_id != LOOKUP_WR_ID {
        return Err(LookupError::UnexpectedCompletion(wc));
    }
    if wc.status != WcStatus::Success {
        return Err(LookupError::Completion(wc.status));
    }
    let mut buf = [0u8; MAX_SLOTS_PER_BUCKET as usize * ENTRY_LEN];
    scratch.read(0, &mut buf[..len])?;
    Ok(find_in_bucket(&buf[..len], gid)?)
}
