//! The meta client: one one-sided READ of the meta server's table bucket per
//! DCCache miss.
//!
//! # DC mode: READs through DCI 0 of the pool
//!
//! The client owns no QP. Its READs go through DCI 0 of the engine's pool
//! as a VQP of the engine's own ([`META_VQP`], the last VQP id, never handed
//! to a user), with a READ buffer registered as an owned MR: the same
//! pre-check, credits, wr_id routing and recovery as every VQP. Both are
//! made at the first lookup (the DCI only if the pool is still empty: a
//! compute node's first VQP usually made it already), so the engine start
//! creates nothing for the meta client and a join costs no QP for it.
//!
//! A dead meta server fails the READ with `RETRY_EXC_ERR`, which moves the
//! DCI to ERR. The pool's recovery handles that as for any VQP (see
//! `physqp`): the meta VQP is the guilty one and gets the error; every other
//! VQP's WRs that the NIC flushed are posted again (they never executed),
//! so the data path sees a short delay, no error. A READ whose completion
//! does not come within `meta_timeout` is abandoned (its late completion is
//! recognized by its wr_id and dropped). Lookups serialize on the client's
//! lock (each holds it for one READ round trip, plus retries); the data
//! path never takes it. The READs are left out of
//! [`super::EngineStats::dci`] (they are counted here).
//!
//! # RC fallback mode
//!
//! Without DC the table is READ through an RC QP of the engine's own, paired
//! by a handshake with the meta node's handshake endpoint. The location
//! then reads differently: [`MetaLocation::server`]'s `dct_num` is the UD
//! QPN of that endpoint and its `dc_key` the endpoint's qkey (what a
//! fallback meta host, [`super::RcMetaHost`], publishes in its bootstrap;
//! the table's MR and the endpoint's passive QPs share one PD there, so the
//! READ passes the target's protection check). The QP is created at start
//! (a miss creates no QP) and paired at the first lookup; after a failed
//! READ it is reset and paired again by the next lookup (a new handshake:
//! the meta node's end entered ERR too).

use std::time::{Duration, Instant};

use krcore_meta::entry::EntryRepr;
use krcore_meta::table::find_in_bucket;
use krcore_meta::wire::BootstrapRepr;
use std::sync::Arc;

use krcore_nic::{
    Access, CompletionQueue, DcTarget, Destination, Gid, MemoryRegion, Nic, QpCaps, QpInit, QpType,
    QueuePair, RemoteAddr, SendWr, Transition, Wc, WcStatus,
};
use parking_lot::{Mutex, RwLock};

use super::config::MetaLocation;
use super::device::{Device, QpHost};
use super::error::{EngineError, MetaFailure, VqpError};
use super::handshake_ud::HandshakeResponder;
use super::mrs::OwnedMr;
use super::physqp::{PhysQp, PostFail};
use crate::dccache::CachedTarget;
use crate::precheck::Ungranted;
use crate::sharedqp::DciStats;
use crate::sharedqp::VqpState;

/// The meta VQP's rule for keys it knows no grant for: its READs are the
/// engine's own, of the meta table its configuration names (its rkey
/// comes from there, not from a peer's token).
const META_UNGRANTED: Ungranted = Ungranted::Allow;
use crate::wrid::VqpId;

/// How lookups retry and wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MetaPolicy {
    /// READs after the first when the bucket is torn (or fails a checksum).
    pub retries: u32,
    /// First pause between READs; doubles up to 1 ms.
    pub backoff: Duration,
    /// Longest wait for one READ's completion.
    pub timeout: Duration,
}

/// Lookup statistics (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Table READs issued.
    pub reads: u64,
    /// READs repeated because the bucket was torn or failed a checksum.
    pub torn_retries: u64,
    /// Lookups that failed because the server did not answer.
    pub unavailable: u64,
    /// RC fallback mode: resets of the meta QP after a failed READ (DC
    /// mode: a failed READ's recovery of DCI 0 is counted in the engine's
    /// `dci.recoveries`).
    pub resets: u64,
    /// RC fallback mode: handshakes with the meta node.
    pub handshakes: u64,
}

/// The last VQP id: the meta client's VQP on DCI 0 (DC mode).
/// [`super::Engine::create_vqp`] never hands it out.
pub(crate) const META_VQP: VqpId = VqpId::MAX;

/// Completions taken from the meta VQP's ring per poll.
const POLL_BATCH: usize = 4;

/// How long a lookup spins for its READ's completion before it yields
/// between polls.
const SPIN_FOR: Duration = Duration::from_micros(200);

/// The meta client's path to the table.
enum MetaLink<N: Nic> {
    /// DC mode before the first lookup: nothing created.
    Idle,
    /// DC mode: the meta VQP on DCI 0 of the pool and its READ buffer.
    Pool {
        dci: Arc<PhysQp<N>>,
        buf: OwnedMr<N>,
    },
    /// RC fallback mode: an RC QP of the client's own.
    Rc(RcLink<N>),
}

/// RC fallback mode: the client's RC QP, paired with the meta node.
struct RcLink<N: Nic> {
    qp: N::Qp,
    cq: N::Cq,
    buf: N::Mr,
    hs: HandshakeResponder<N>,
    /// The nonce of the pairing while the QP is paired (RTS).
    paired: Option<u64>,
}

/// The meta VQP's share of DCI 0's statistics (left out of the engine's).
#[derive(Debug, Clone, Copy, Default)]
struct DciShare {
    doorbells: u64,
    completions: u64,
}

struct MetaState<N: Nic> {
    next_wr_id: u64,
    stats: MetaStats,
    share: DciShare,
    link: MetaLink<N>,
}

/// How an engine fetches its meta server's bootstrap again (see
/// `meta_follow`). Called from the lease thread or a lookup, at most once
/// per [`REFRESH_EVERY`]; it should be bounded (the SDK's waits at most the
/// engine's `meta_timeout`).
pub type MetaSource = Arc<dyn Fn() -> Result<BootstrapRepr, krcore_meta::MetaError> + Send + Sync>;

/// Least time between two bootstrap fetches of
/// [`Engine::refresh_meta`](super::Engine::refresh_meta).
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// What [`Engine::refresh_meta`](super::Engine::refresh_meta) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetaRefresh {
    /// The engine has no [`MetaSource`], or reads no meta server.
    NoSource,
    /// The last fetch was less than [`REFRESH_EVERY`] ago: not fetched.
    Recent,
    /// The bootstrap names the server the engine reads.
    Same,
    /// The server moved (restarted): the engine reads `to` from now on.
    Moved {
        /// The location read until now.
        from: MetaLocation,
        /// The location read from now on.
        to: MetaLocation,
    },
}

/// How the client follows a restarted server: its source, when it was
/// last fetched, and whether the registration endpoint is the old
/// server's.
#[derive(Default)]
struct Follow {
    source: Option<MetaSource>,
    last: Option<Instant>,
    /// Set by a move; the next registration call drops its endpoint (it
    /// holds the endpoint's lock, which a refresh must not wait for: a
    /// lookup inside that call may refresh).
    stale_endpoint: bool,
}

pub(crate) struct MetaClient<N: Nic> {
    /// Where the table is: set at start, moved by [`MetaClient::relocate`]
    /// (a restarted server). Written under the state lock, so a lookup
    /// reads one location for all its READs.
    location: RwLock<MetaLocation>,
    policy: MetaPolicy,
    state: Mutex<MetaState<N>>,
    follow: Mutex<Follow>,
}

impl<N: Nic> MetaClient<N> {
    /// DC mode (`hs` is `None`): a client that creates nothing until its
    /// first lookup (see the module docs). RC fallback mode: a client
    /// READing through an RC QP (created here) paired with the meta node by
    /// `hs` at the first lookup.
    ///
    /// # Errors
    /// RC fallback mode: [`EngineError::NotAFallbackNode`] when the
    /// location names a DC server; [`EngineError::Nic`].
    pub(crate) fn start(
        nic: &N,
        pd: &N::Pd,
        location: MetaLocation,
        policy: MetaPolicy,
        hs: Option<HandshakeResponder<N>>,
    ) -> Result<MetaClient<N>, EngineError> {
        let link = match hs {
            None => MetaLink::Idle,
            Some(hs) => MetaLink::Rc(RcLink::start(nic, pd, &location, hs)?),
        };
        Ok(MetaClient {
            location: RwLock::new(location),
            follow: Mutex::default(),
            policy,
            state: Mutex::new(MetaState {
                next_wr_id: 1,
                stats: MetaStats::default(),
                share: DciShare::default(),
                link,
            }),
        })
    }

    pub(crate) fn stats(&self) -> MetaStats {
        self.state.lock().stats
    }

    /// Where the client reads the table.
    pub(crate) fn location(&self) -> MetaLocation {
        *self.location.read()
    }

    /// Sets how to fetch the bootstrap again (replacing an earlier source).
    pub(crate) fn set_source(&self, source: MetaSource) {
        self.follow.lock().source = Some(source);
    }

    /// The source for a fetch now (and the fetch's time noted), or why
    /// none is due: no source, or one fetched within [`REFRESH_EVERY`].
    pub(crate) fn source_for_refresh(&self) -> Result<MetaSource, MetaRefresh> {
        let mut f = self.follow.lock();
        let Some(source) = f.source.clone() else {
            return Err(MetaRefresh::NoSource);
        };
        if f.last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return Err(MetaRefresh::Recent);
        }
        f.last = Some(Instant::now());
        Ok(source)
    }

    /// Notes that the registration endpoint talks to a server that moved.
    pub(crate) fn mark_endpoint_stale(&self) {
        self.follow.lock().stale_endpoint = true;
    }

    /// Whether the registration endpoint must be replaced (once per move).
    pub(crate) fn take_stale_endpoint(&self) -> bool {
        std::mem::take(&mut self.follow.lock().stale_endpoint)
    }

    /// Reads the table at `to` from now on (the server restarted: another
    /// DCT, table rkey or endpoint). Waits for a lookup in progress. RC
    /// fallback mode: the pair with the old node is closed (best effort)
    /// and the QP reset, so the next lookup pairs with the new one. Returns
    /// whether the location changed.
    ///
    /// # Errors
    /// [`EngineError::MetaReshaped`] when `to`'s table has another shape
    /// (the READ buffers are sized for this one); [`EngineError::Nic`] when
    /// the RC QP cannot be reset; [`EngineError::NotAFallbackNode`] when an
    /// RC fallback client is moved to a DC server.
    pub(crate) fn relocate(&self, to: MetaLocation) -> Result<bool, EngineError> {
        let mut st = self.state.lock();
        let from = self.location();
        if from == to {
            return Ok(false);
        }
        if from.geometry != to.geometry {
            return Err(EngineError::MetaReshaped {
                old: from.geometry,
                new: to.geometry,
            });
        }
        let MetaState { stats, link, .. } = &mut *st;
        if let MetaLink::Rc(l) = link {
            // The new server must name a handshake endpoint too.
            super::pairing::handshake_target(&to.server)?;
            l.unpair(&from.server);
            l.rearm(stats)
                .map_err(EngineError::nic("reset the meta QP for the moved server"))?;
        }
        *self.location.write() = to;
        Ok(true)
    }

    /// Takes the meta VQP's READs out of `dci` (the pool's summed
    /// statistics).
    pub(crate) fn exclude_from(&self, dci: &mut DciStats) {
        let st = self.state.lock();
        dci.doorbells = dci.doorbells.saturating_sub(st.share.doorbells);
        dci.wrs = dci.wrs.saturating_sub(st.share.doorbells);
        dci.completions = dci.completions.saturating_sub(st.share.completions);
    }

    /// RC fallback mode: tells the meta node the pair is going away (best
    /// effort), so that it frees its end.
    pub(crate) fn close(&self) {
        let mut st = self.state.lock();
        if let MetaLink::Rc(l) = &mut st.link {
            l.unpair(&self.location().server);
        }
    }

    /// Looks `gid` up: `Ok(None)` when the table has no entry for it.
    ///
    /// # Errors
    /// [`EngineError::MetaUnavailable`], [`EngineError::MetaInconsistent`],
    /// [`EngineError::Nic`]; DC mode: [`EngineError::MetaPost`] when the
    /// READ could not be posted on DCI 0 (its send queue stayed full).
    pub(crate) fn lookup(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        first_dci: impl Fn() -> Result<Arc<PhysQp<N>>, EngineError>,
        gid: &Gid,
    ) -> Result<Option<EntryRepr>, EngineError> {
        let mut st = self.state.lock();
        // Read under the state lock: a relocation waits for this lookup.
        let loc = self.location();
        let g = loc.geometry;
        let remote = loc.table.offset(g.bucket_offset(g.bucket_of(gid)));
        let len = g.bucket_len();
        let mut bytes = vec![0u8; len];
        let mut backoff = self.policy.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            st.read_bucket(
                eng,
                &first_dci,
                remote,
                &mut bytes,
                loc.server,
                self.policy.timeout,
            )
            .map_err(|e| match e {
                ReadError::Failed(failure) => EngineError::MetaUnavailable { gid: *gid, failure },
                ReadError::Post(source) => EngineError::MetaPost { gid: *gid, source },
                ReadError::Nic(e) => e,
            })?;
            match find_in_bucket(&bytes, gid) {
                Ok(found) => return Ok(found),
                Err(last) if !last.is_retryable() || attempts > self.policy.retries => {
                    return Err(EngineError::MetaInconsistent {
                        gid: *gid,
                        attempts,
                        last,
                    })
                }
                Err(_) => {}
            }
            st.stats.torn_retries += 1;
            if !backoff.is_zero() {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(1));
            }
        }
    }
}

enum ReadError {
    Failed(MetaFailure),
    Post(VqpError),
    Nic(EngineError),
}

impl<N: Nic> MetaState<N> {
    /// One READ of `out.len()` bytes at `remote`, waited for.
    fn read_bucket(
        &mut self,
        eng: &(impl QpHost<N> + ?Sized),
        first_dci: &impl Fn() -> Result<Arc<PhysQp<N>>, EngineError>,
        remote: RemoteAddr,
        out: &mut [u8],
        server: DcTarget,
        timeout: Duration,
    ) -> Result<(), ReadError> {
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        if let MetaLink::Rc(l) = &mut self.link {
            return l.read_bucket(&mut self.stats, wr_id, remote, out, server, timeout);
        }
        if let MetaLink::Idle = self.link {
            let dci = first_dci().map_err(ReadError::Nic)?;
            self.link = start_pool(eng.dev(), dci, out.len()).map_err(ReadError::Nic)?;
        }
        let MetaLink::Pool { dci, buf } = &self.link else {
            // Idle was replaced above and Rc returned: not reached.
            return Err(ReadError::Nic(EngineError::Config(
                "the meta client has no path to the table".into(),
            )));
        };
        let target = CachedTarget {
            target: server,
            epoch: 0,
        };
        // The VQP's target is cleared by a RETRY_EXC_ERR (a dead server):
        // set it for every READ.
        if dci
            .with_vqp(META_VQP, |v| v.target = Some(target))
            .is_none()
        {
            let mut v = VqpState::new(eng.dev().cfg.vqp_depth, META_UNGRANTED);
            v.target = Some(target);
            dci.attach(META_VQP, v);
        }
        let sge = buf
            .sge(0, out.len() as u32)
            .map_err(|e| ReadError::Nic(EngineError::nic("meta READ buffer")(e)))?;
        let mut wr = [SendWr::read(wr_id, sge, remote)];
        self.stats.reads += 1;
        match dci.post(eng, META_VQP, &mut wr) {
            Ok(()) => self.share.doorbells += 1,
            Err(PostFail::Vqp(e)) => return Err(ReadError::Post(e)),
            Err(PostFail::Stale) => {
                return Err(ReadError::Post(VqpError::NotConnected { vqp: META_VQP }))
            }
        }
        let start = Instant::now();
        let mut wcs = [Wc::default(); POLL_BATCH];
        let status = 'wait: loop {
            let n = match dci.poll(eng, META_VQP, &mut wcs) {
                Ok(Some(n)) => n,
                // The state is gone from the DCI (never detached: not
                // expected); the next lookup attaches a fresh one.
                Ok(None) => return Err(ReadError::Post(VqpError::NotConnected { vqp: META_VQP })),
                Err(e) => return Err(ReadError::Post(e)),
            };
            self.share.completions += n as u64;
            // Others are late completions of abandoned READs.
            if let Some(wc) = wcs[..n].iter().find(|wc| wc.wr_id == wr_id) {
                break 'wait Some(wc.status);
            }
            if n == 0 {
                let waited = start.elapsed();
                if waited > timeout {
                    break None;
                }
                // A READ completes in microseconds: spin (yielding would
                // hand the CPU to any busy process for a whole time slice
                // per lookup on a loaded host); past SPIN_FOR, yield.
                if waited < SPIN_FOR {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        };
        match status {
            Some(WcStatus::Success) => buf
                .read(0, out)
                .map_err(|e| ReadError::Nic(EngineError::nic("meta READ buffer")(e))),
            other => {
                self.stats.unavailable += 1;
                Err(ReadError::Failed(match other {
                    Some(s) => MetaFailure::Completion(s),
                    None => MetaFailure::Timeout(timeout),
                }))
            }
        }
    }
}

/// DC mode, the first lookup: DCI 0 (created if the pool is empty), the
/// meta VQP on it and its READ buffer (an owned MR: the pre-check knows its
/// lkey).
fn start_pool<N: Nic>(
    eng: &Device<N>,
    dci: Arc<PhysQp<N>>,
    len: usize,
) -> Result<MetaLink<N>, EngineError> {
    let mr = eng
        .nic
        .alloc_mr(&eng.pd, len, Access::LOCAL_WRITE)
        .map_err(EngineError::nic("allocate the meta READ buffer"))?;
    let buf = OwnedMr::new(mr, &eng.nic, &eng.mrs);
    dci.attach(META_VQP, VqpState::new(eng.cfg.vqp_depth, META_UNGRANTED));
    Ok(MetaLink::Pool { dci, buf })
}

impl<N: Nic> RcLink<N> {
    /// The RC QP (in RESET until the first lookup pairs it) and its READ
    /// buffer.
    fn start(
        nic: &N,
        pd: &N::Pd,
        location: &MetaLocation,
        hs: HandshakeResponder<N>,
    ) -> Result<RcLink<N>, EngineError> {
        // Check the location names a handshake endpoint before use.
        super::pairing::handshake_target(&location.server)?;
        let cq = nic
            .create_cq(8)
            .map_err(EngineError::nic("create the meta CQ"))?;
        let qp = nic
            .create_qp(
                pd,
                &QpInit {
                    qp_type: QpType::Rc,
                    caps: QpCaps {
                        max_send_wr: 4,
                        max_recv_wr: 0,
                        max_send_sge: 1,
                        max_recv_sge: 0,
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    dc_key: 0,
                },
            )
            .map_err(EngineError::nic("create the meta QP"))?;
        let buf = nic
            .alloc_mr(pd, location.geometry.bucket_len(), Access::LOCAL_WRITE)
            .map_err(EngineError::nic("allocate the meta READ buffer"))?;
        Ok(RcLink {
            qp,
            cq,
            buf,
            hs,
            paired: None,
        })
    }

    /// Tells the meta node at `server` that the pair is going away (best
    /// effort: it frees its end), if the QP is paired.
    fn unpair(&mut self, server: &DcTarget) {
        if let (Some(nonce), Ok(target)) =
            (self.paired.take(), super::pairing::handshake_target(server))
        {
            self.hs.close(self.qp.qpn(), target, nonce);
        }
    }

    /// Pairs the QP with the meta node if it is not.
    fn pair(&mut self, stats: &mut MetaStats, server: DcTarget) -> Result<(), ReadError> {
        if self.paired.is_some() {
            return Ok(());
        }
        stats.handshakes += 1;
        let target = super::pairing::handshake_target(&server).map_err(ReadError::Nic)?;
        match super::pairing::pair_with(&self.hs, &self.qp, target) {
            Ok(nonce) => {
                self.paired = Some(nonce);
                Ok(())
            }
            Err(EngineError::Handshake { failure, .. }) => {
                stats.unavailable += 1;
                Err(ReadError::Failed(MetaFailure::Handshake(failure)))
            }
            Err(e) => Err(ReadError::Nic(e)),
        }
    }

    /// One READ of `out.len()` bytes at `remote`, waited for.
    fn read_bucket(
        &mut self,
        stats: &mut MetaStats,
        wr_id: u64,
        remote: RemoteAddr,
        out: &mut [u8],
        server: DcTarget,
        timeout: Duration,
    ) -> Result<(), ReadError> {
        let nic = |op| move |e| ReadError::Nic(EngineError::nic(op)(e));
        self.pair(stats, server)?;
        let sge = self
            .buf
            .sge(0, out.len() as u32)
            .map_err(nic("meta READ buffer"))?;
        let wr = SendWr::read(wr_id, sge, remote).to(Destination::Connected);
        stats.reads += 1;
        if let Err(e) = self.qp.post_send(&[wr]) {
            // Not in RTS (a reset that failed half way): re-arm and report.
            self.rearm(stats).map_err(nic("re-arm the meta QP"))?;
            return Err(ReadError::Nic(EngineError::Config(format!(
                "meta QP refused the READ: {e}"
            ))));
        }
        let start = Instant::now();
        let mut wc = [Wc::default()];
        let status = loop {
            match self.cq.poll(&mut wc).map_err(nic("poll the meta CQ"))? {
                1 if wc[0].wr_id == wr_id => break Some(wc[0].status),
                1 => {} // a stale completion from before a reset
                _ if start.elapsed() > timeout => break None,
                _ => std::hint::spin_loop(),
            }
        };
        match status {
            Some(WcStatus::Success) => {
                self.buf.read(0, out).map_err(nic("meta READ buffer"))?;
                Ok(())
            }
            other => {
                stats.unavailable += 1;
                self.rearm(stats).map_err(nic("re-arm the meta QP"))?;
                Err(ReadError::Failed(match other {
                    Some(s) => MetaFailure::Completion(s),
                    None => MetaFailure::Timeout(timeout),
                }))
            }
        }
    }

    /// Reset (discarding whatever is outstanding), left in RESET to be
    /// paired again by the next lookup.
    fn rearm(&mut self, stats: &mut MetaStats) -> krcore_nic::Result<()> {
        stats.resets += 1;
        self.qp.modify(Transition::Reset)?;
        let mut wc = [Wc::default(); 4];
        while self.cq.poll(&mut wc)? > 0 {}
        self.paired = None;
        Ok(())
    }
}
