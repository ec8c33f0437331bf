//! `fault`: a provider wrapper that injects the faults RDMA hardware can
//! produce, deterministically from a seed (after smoltcp's `FaultInjector`).
//!
//! [`FaultNic<N>`] implements [`Nic`] over any provider `N` and wraps its
//! queue pairs ([`FaultQp`]) and completion queues ([`FaultCq`]); protection
//! domains, memory regions and SRQs are the inner provider's own. Code under
//! test is generic over [`Nic`] and runs unchanged on `FaultNic<SimNic>` (or
//! `FaultNic<VerbsNic>`).
//!
//! # Faults
//!
//! - **Delayed and reordered completions** ([`FaultConfig::delay_ppm`],
//!   [`FaultConfig::max_delay_polls`], [`FaultConfig::reorder`]): a
//!   completion pulled from the inner CQ may be held back for up to
//!   `max_delay_polls` calls of [`crate::CompletionQueue::poll`], and completions
//!   of *different* queues (another QP, or the receive queue of the same QP)
//!   may be returned in any order. Completions of one QP's send queue (and of
//!   one receive queue) always stay in order, as RDMA guarantees. Every held
//!   completion is returned within `max_delay_polls + 1` polls: a poller
//!   never waits forever.
//! - **Failed work requests** ([`FaultConfig::fail_ppm`],
//!   [`FaultConfig::fail_statuses`]): a work request chosen at post time is
//!   redirected to remote address 8 (inside no memory region of any
//!   provider), so the *inner* provider refuses it at execution time and
//!   does what hardware does: the WR completes with an error, the QP enters
//!   ERR, and every later WR completes with `WR_FLUSH_ERR` until the QP is
//!   reset. The wrapper only rewrites that one completion's status to the
//!   chosen one (`RETRY_EXC_ERR`, `REM_ACCESS_ERR`, ...). A failed WR has
//!   no remote effect (it never reached remote memory). SENDs are redirected
//!   as WRITEs to the same address; UD sends are never failed (UD has no
//!   error to report for a lost datagram).
//! - **Dropped nodes** ([`FaultNic::drop_node`]): every later WR to that
//!   GID (the DC target's, or an RC QP's connected peer's) fails the same
//!   way with `RETRY_EXC_ERR`, until [`FaultNic::restore_node`].
//! - **Stalled nodes** ([`FaultNic::stall_node`]): WRs to that GID are
//!   held by the wrapper, neither executed nor completed, as while a link
//!   is down and the NIC retransmits; a QP executes in order, so every
//!   later WR of a QP holding one is held behind it. After
//!   [`FaultNic::resume_node`] the held WRs are handed to the inner
//!   provider, in order, at the next post on their QP or the next poll of
//!   any CQ of the NIC: a READ then lands in its local buffer *late*, long
//!   after the poster may have given up on it, as on hardware.
//! - **QPs forced to ERR** ([`FaultConfig::force_err_ppm`],
//!   [`FaultQp::force_err`]): before a doorbell the wrapper may move the QP
//!   to ERR, as a link or remote failure does; the inner provider flushes
//!   its outstanding and later WRs.
//!
//! [`FaultConfig::max_faults`] bounds the injected WR failures and forced
//! ERRs (not drops), so scripted workloads make progress; [`FaultStats`]
//! counts what was injected, so tests can check that faults happened.
//!
//! # Invariants kept
//!
//! - Each posted WR produces at most one completion, and a signaled WR (or a
//!   failed/flushed one) exactly one: the wrapper never invents or loses a
//!   completion of the inner provider; it only holds it back, reorders
//!   across queues, or rewrites the status of a WR it redirected.
//! - Send-queue credits follow what the *user* has polled (a slot is freed
//!   when a signaled completion at or after it is returned by the wrapper's
//!   `poll`), as on hardware: a held completion keeps its slot busy.
//! - Completions of a QP's old incarnation (pulled before a reset to RESET)
//!   are still returned, like CQEs left in a CQ, but credit nothing.
//! - Determinism: every random choice comes from a SplitMix64 stream per QP
//!   and per CQ, seeded from [`FaultConfig::seed`] and the object's creation
//!   order. A single-threaded script makes the same choices for one seed.
//!
//! # Not modelled
//!
//! A WR that executes remotely and then fails because its acknowledgement
//! was lost (`RETRY_EXC_ERR` with the effect applied) is not injected: every
//! injected failure has no remote effect.

mod cq;
mod qp;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::counters::Counters;
use crate::error::Result;
use crate::provider::{Nic, QpInit};
use crate::types::{Access, DeviceCaps, Gid, WcStatus};

pub use cq::FaultCq;
pub use qp::FaultQp;

/// What to inject and how often (`*_ppm`: per million).
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Chance that a completion is held back (per million completions).
    pub delay_ppm: u32,
    /// Longest hold, in polls of its CQ.
    pub max_delay_polls: u32,
    /// Return ready completions of different queues in a random order.
    pub reorder: bool,
    /// Chance that a send WR fails (per million WRs).
    pub fail_ppm: u32,
    /// Statuses a failed WR reports, one chosen at random per failure.
    pub fail_statuses: Vec<WcStatus>,
    /// Chance that a doorbell first forces the QP to ERR (per million).
    pub force_err_ppm: u32,
    /// Most WR failures plus forced ERRs injected (drops are not counted).
    pub max_faults: u64,
}

impl FaultConfig {
    /// No faults at all: the wrapper is transparent.
    pub fn none(seed: u64) -> FaultConfig {
        FaultConfig {
            seed,
            delay_ppm: 0,
            max_delay_polls: 0,
            reorder: false,
            fail_ppm: 0,
            fail_statuses: vec![WcStatus::RetryExcErr],
            force_err_ppm: 0,
            max_faults: 0,
        }
    }

    /// Only delays and reordering (no error): every operation must succeed.
    pub fn delays(seed: u64) -> FaultConfig {
        FaultConfig {
            delay_ppm: 300_000,
            max_delay_polls: 4,
            reorder: true,
            ..FaultConfig::none(seed)
        }
    }

    /// Delays, reordering, failed WRs (`RETRY_EXC_ERR`, `REM_ACCESS_ERR`)
    /// and forced ERRs, up to `max_faults`.
    pub fn chaos(seed: u64, max_faults: u64) -> FaultConfig {
        FaultConfig {
            fail_ppm: 20_000,
            fail_statuses: vec![WcStatus::RetryExcErr, WcStatus::RemAccessErr],
            force_err_ppm: 5_000,
            max_faults,
            ..FaultConfig::delays(seed)
        }
    }
}

/// What the wrapper injected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// WRs redirected to fail with a chosen status.
    pub failed_wrs: u64,
    /// WRs failed because their destination node is dropped.
    pub dropped_wrs: u64,
    /// QPs forced to ERR.
    pub forced_errs: u64,
    /// WRs held because their node (or an earlier WR of their QP) was
    /// stalled.
    pub stalled_wrs: u64,
    /// Completions held back at least one poll.
    pub delayed: u64,
    /// Completions returned ahead of an earlier-arrived one of another queue.
    pub reordered: u64,
    /// Completions of an old QP incarnation returned after its reset.
    pub stale: u64,
}

#[derive(Default)]
struct AtomicStats {
    failed_wrs: AtomicU64,
    dropped_wrs: AtomicU64,
    forced_errs: AtomicU64,
    stalled_wrs: AtomicU64,
    delayed: AtomicU64,
    reordered: AtomicU64,
    stale: AtomicU64,
}

/// State shared by a `FaultNic` and every object made from it.
struct Ctl<N: Nic> {
    cfg: FaultConfig,
    dropped: Mutex<HashSet<Gid>>,
    stalled: Mutex<HashSet<Gid>>,
    /// WRs held by the QPs right now (polls release them only when some
    /// are).
    held: AtomicU64,
    /// Objects created so far (each one's stream is seeded from its index).
    created: AtomicU64,
    /// Injected failures and forced ERRs, against `cfg.max_faults`.
    faults: AtomicU64,
    stats: AtomicStats,
    /// Live QPs by number, for the CQs' credit accounting.
    qps: Mutex<HashMap<u32, Weak<qp::QpShared<N>>>>,
}

impl<N: Nic> Ctl<N> {
    fn next_rng(&self) -> Rng {
        let k = self.created.fetch_add(1, Relaxed);
        Rng::new(self.cfg.seed ^ k.wrapping_mul(0xa076_1d64_78bd_642f))
    }

    /// Takes one unit of the fault budget.
    fn take_fault(&self) -> bool {
        self.faults
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < self.cfg.max_faults).then_some(n + 1)
            })
            .is_ok()
    }

    fn is_dropped(&self, gid: &Gid) -> bool {
        self.dropped.lock().contains(gid)
    }

    fn is_stalled(&self, gid: &Gid) -> bool {
        self.stalled.lock().contains(gid)
    }

    fn qp(&self, qpn: u32) -> Option<Arc<qp::QpShared<N>>> {
        self.qps.lock().get(&qpn).and_then(Weak::upgrade)
    }

    /// Hands every QP's held WRs that may go now to the inner provider
    /// (see [`FaultNic::resume_node`]).
    fn release_held(&self) {
        if self.held.load(Relaxed) == 0 {
            return;
        }
        let qps: Vec<_> = self.qps.lock().values().filter_map(Weak::upgrade).collect();
        for q in qps {
            q.release(false);
        }
    }
}

/// A provider wrapper injecting faults from a seed (see the module docs).
pub struct FaultNic<N: Nic> {
    inner: N,
    ctl: Arc<Ctl<N>>,
}

impl<N: Nic> std::fmt::Debug for FaultNic<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultNic")
            .field("cfg", &self.ctl.cfg)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<N: Nic + Clone> Clone for FaultNic<N> {
    /// Another handle on the same wrapped device and the same fault state.
    fn clone(&self) -> Self {
        FaultNic {
            inner: self.inner.clone(),
            ctl: self.ctl.clone(),
        }
    }
}

impl<N: Nic> FaultNic<N> {
    /// Wraps `inner`.
    pub fn new(inner: N, cfg: FaultConfig) -> FaultNic<N> {
        FaultNic {
            inner,
            ctl: Arc::new(Ctl {
                cfg,
                dropped: Mutex::new(HashSet::new()),
                stalled: Mutex::new(HashSet::new()),
                held: AtomicU64::new(0),
                created: AtomicU64::new(0),
                faults: AtomicU64::new(0),
                stats: AtomicStats::default(),
                qps: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &N {
        &self.inner
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.ctl.cfg
    }

    /// From now on, every WR to `gid` fails with `RETRY_EXC_ERR`.
    pub fn drop_node(&self, gid: Gid) {
        self.ctl.dropped.lock().insert(gid);
    }

    /// Undoes [`FaultNic::drop_node`].
    pub fn restore_node(&self, gid: Gid) {
        self.ctl.dropped.lock().remove(&gid);
    }

    /// From now on, WRs to `gid` are held (see the module docs): they
    /// neither execute nor complete until [`FaultNic::resume_node`].
    pub fn stall_node(&self, gid: Gid) {
        self.ctl.stalled.lock().insert(gid);
    }

    /// Undoes [`FaultNic::stall_node`]: the held WRs go to the inner
    /// provider at the next post on their QP or poll of a CQ (call
    /// [`FaultNic::release_held`] to hand them over at once).
    pub fn resume_node(&self, gid: Gid) {
        self.ctl.stalled.lock().remove(&gid);
    }

    /// Hands the held WRs that may go (none of whose node is stalled, nor
    /// an earlier WR's of their QP) to the inner provider now.
    pub fn release_held(&self) {
        self.ctl.release_held();
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        let s = &self.ctl.stats;
        FaultStats {
            failed_wrs: s.failed_wrs.load(Relaxed),
            dropped_wrs: s.dropped_wrs.load(Relaxed),
            forced_errs: s.forced_errs.load(Relaxed),
            stalled_wrs: s.stalled_wrs.load(Relaxed),
            delayed: s.delayed.load(Relaxed),
            reordered: s.reordered.load(Relaxed),
            stale: s.stale.load(Relaxed),
        }
    }
}

impl<N: Nic> Nic for FaultNic<N> {
    type Pd = N::Pd;
    type Mr = N::Mr;
    type Cq = FaultCq<N>;
    type Srq = N::Srq;
    type Qp = FaultQp<N>;

    fn gid(&self) -> Gid {
        self.inner.gid()
    }

    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn port_lock_path(&self) -> Option<std::path::PathBuf> {
        self.inner.port_lock_path()
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }

    fn alloc_pd(&self) -> Result<Self::Pd> {
        self.inner.alloc_pd()
    }

    fn alloc_mr(&self, pd: &Self::Pd, len: usize, access: Access) -> Result<Self::Mr> {
        self.inner.alloc_mr(pd, len, access)
    }

    fn alloc_shared_mr(
        &self,
        pd: &Self::Pd,
        len: usize,
        access: Access,
    ) -> Result<(Self::Mr, std::fs::File)> {
        self.inner.alloc_shared_mr(pd, len, access)
    }

    fn register_sub_mr(
        &self,
        parent: &Self::Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr> {
        self.inner.register_sub_mr(parent, offset, len, access)
    }

    #[allow(unsafe_code)] // forwards the same contract to the inner provider
    unsafe fn register_mr(
        &self,
        pd: &Self::Pd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr> {
        // SAFETY: the caller upholds `Nic::register_mr`'s contract for
        // `ptr..ptr+len`; the inner provider's contract is the same one and
        // the region it returns is the one handed back (same lifetime).
        unsafe { self.inner.register_mr(pd, ptr, len, access) }
    }

    fn create_cq(&self, depth: u32) -> Result<Self::Cq> {
        let inner = self.inner.create_cq(depth)?;
        Ok(FaultCq::new(inner, self.ctl.clone(), self.ctl.next_rng()))
    }

    fn create_srq(&self, pd: &Self::Pd, max_wr: u32, max_sge: u32) -> Result<Self::Srq> {
        self.inner.create_srq(pd, max_wr, max_sge)
    }

    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> Result<Self::Qp> {
        let inner_init = QpInit::<N> {
            qp_type: init.qp_type,
            caps: init.caps,
            send_cq: init.send_cq.inner(),
            recv_cq: init.recv_cq.inner(),
            srq: init.srq,
            dc_key: init.dc_key,
        };
        let inner = self.inner.create_qp(pd, &inner_init)?;
        let q = FaultQp::new(
            inner,
            self.ctl.clone(),
            self.ctl.next_rng(),
            [init.send_cq.clone(), init.recv_cq.clone()],
        );
        Ok(q)
    }
}

/// SplitMix64: a tiny, seedable, good-enough stream (no dependency).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `ppm` per million.
    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }
}

#[cfg(test)]
mod tests;
