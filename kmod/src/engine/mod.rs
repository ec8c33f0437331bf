//! The engine host: the pure pieces ([`crate::dccache`], [`crate::precheck`],
//! [`crate::wrid`], [`crate::credits`]) driving a [`Nic`] in-process.
//!
//! ```text
//! Engine<N>  (Arc, Clone; no process-global state: two engines on two NICs
//!   |         in one process share nothing)
//!   |- PD, DCT + SRQ + receive CQ   incoming two-sided traffic (later issue)
//!   |- DCI pool [0..pool_size)      created lazily, each with its own send CQ
//!   |     `- per-DCI lock: credits, VQPs bound to it, MR snapshot
//!   |- DcCache                      lock-free reads, per-bucket writers
//!   |- meta client                  own DCI + READ buffer, own lock
//!   `- owned MRs                    copy-on-write map + generation
//! Vqp<N>  bound round-robin to one DCI: slot table, completion ring,
//!         target, known grants (its own lock)
//! ```
//!
//! # What takes which lock
//!
//! | operation            | locks                                           |
//! |----------------------|-------------------------------------------------|
//! | `post_send`, `poll`  | the VQP's DCI, then briefly each VQP it routes to|
//! | `connect`, hit       | none (DCCache seqlock read), then the VQP's      |
//! | `connect`, miss      | the meta DCI's (one READ round trip)            |
//! | `create_vqp`         | the pool's (creating a DCI when below the cap)  |
//! | `alloc_mr`, MR drop  | the MR map's (posts see it through one atomic)  |
//!
//! No lock spans DCIs: VQPs on different DCIs never contend.
//!
//! # What is cached
//!
//! - Per node (the [`DcCache`]): GID -> (`dct_num`, `dc_key`, meta epoch),
//!   34 B per target. Filled on a miss by one READ of the meta table;
//!   replaced when a lookup returns a newer epoch; invalidated when a WR to
//!   the target completes with `REM_ACCESS_ERR` or `RETRY_EXC_ERR`, or by
//!   [`Engine::invalidate`].
//! - Per VQP: its target (copied at `connect`; cleared by the same error
//!   completions, so the user connects again and sees a changed or removed
//!   registration).

mod dci;
mod error;
mod idhash;
mod meta;
mod mrs;
mod vqp;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use krcore_nic::{bring_up, Access, DcTarget, Gid, Nic, QpCaps, QpInit, QpType, QueuePair};
use parking_lot::Mutex;

pub use dci::DciStats;
pub use error::{EngineError, MetaFailure, VqpError};
pub use meta::{MetaLocation, MetaStats};
pub use mrs::OwnedMr;
pub use vqp::Vqp;

use crate::dccache::{CachedTarget, DcCache, Insert};
use crate::precheck::Policy;
use crate::wrid::VqpId;
use dci::Dci;
use meta::{MetaClient, MetaPolicy};
use mrs::MrRegistry;
use vqp::VqpShared;

/// DC initiators per CPU in KRCore's pool (the paper's Figure 14(a): more
/// than 2 per CPU removes contention; 8 is its default).
pub const DCIS_PER_CPU: usize = 8;

/// The `dc_key` of the engine's DCT unless configured otherwise.
pub const DEFAULT_DC_KEY: u64 = 0x6b72_636f_7265_6463; // "krcoredc"

/// How an engine is set up. Start from [`EngineConfig::default`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Most DC initiators in the pool. Default: [`DCIS_PER_CPU`] times the
    /// CPUs available to the process.
    pub pool_size: usize,
    /// DCIs created at start (the rest on demand, by `create_vqp`, up to
    /// `pool_size`). Default 1.
    pub prestart: usize,
    /// Send-queue depth of each DCI (its CQ has as many entries). Default 128.
    pub dci_depth: u32,
    /// Per-VQP limit of WRs in flight plus completions not yet polled.
    /// Must exceed `policy.max_unsignaled`. Default 128.
    pub vqp_depth: u32,
    /// Pre-check limits; `max_sge`/`max_inline` are clamped to the device's.
    pub policy: Policy,
    /// Run the pre-check's validity checks (b). Capacity (a) and signaling
    /// (c) always run: they keep the shared queue's account exact. Turn it
    /// off only to show what it protects against. Default true.
    pub precheck: bool,
    /// DCCache capacity in targets. Default 4096.
    pub cache_capacity: usize,
    /// The meta server's table; `None`: connects can only hit the cache.
    pub meta: Option<MetaLocation>,
    /// READs after the first when the bucket is torn. Default 16.
    pub meta_retries: u32,
    /// First pause between torn READs (doubles up to 1 ms). Default 1 us.
    pub meta_backoff: Duration,
    /// Longest wait for a meta READ's completion. Default 1 s.
    pub meta_timeout: Duration,
    /// Longest a post polls for send-queue credits. Default 1 s.
    pub reclaim_timeout: Duration,
    /// Longest the engine collects flushes after a DCI error before it
    /// resets the DCI and reports the rest flushed itself. Default 100 ms.
    pub flush_timeout: Duration,
    /// Depth of the DCT's SRQ and receive CQ. Default 256.
    pub recv_depth: u32,
    /// The DCT's `dc_key`. Default [`DEFAULT_DC_KEY`].
    pub dc_key: u64,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineConfig {
            pool_size: DCIS_PER_CPU * cpus,
            prestart: 1,
            dci_depth: 128,
            vqp_depth: 128,
            policy: Policy::default(),
            precheck: true,
            cache_capacity: 4096,
            meta: None,
            meta_retries: 16,
            meta_backoff: Duration::from_micros(1),
            meta_timeout: Duration::from_secs(1),
            reclaim_timeout: Duration::from_secs(1),
            flush_timeout: Duration::from_millis(100),
            recv_depth: 256,
            dc_key: DEFAULT_DC_KEY,
        }
    }
}

impl EngineConfig {
    /// With the meta server at `meta`.
    pub fn with_meta(mut self, meta: MetaLocation) -> EngineConfig {
        self.meta = Some(meta);
        self
    }

    /// With at most `n` DCIs.
    pub fn with_pool_size(mut self, n: usize) -> EngineConfig {
        self.pool_size = n;
        self
    }

    /// With the pre-check's validity checks on or off.
    pub fn with_precheck(mut self, on: bool) -> EngineConfig {
        self.precheck = on;
        self
    }

    fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.pool_size == 0 {
            return bad("pool_size must be at least 1".into());
        }
        if self.prestart > self.pool_size {
            return bad(format!(
                "prestart {} exceeds pool_size {}",
                self.prestart, self.pool_size
            ));
        }
        if self.dci_depth < 2 {
            return bad("dci_depth must be at least 2".into());
        }
        if self.vqp_depth <= self.policy.max_unsignaled {
            return bad(format!(
                "vqp_depth {} must exceed policy.max_unsignaled {}",
                self.vqp_depth, self.policy.max_unsignaled
            ));
        }
        if self.cache_capacity == 0 || self.recv_depth == 0 {
            return bad("cache_capacity and recv_depth must be non-zero".into());
        }
        Ok(())
    }
}

/// Engine-wide statistics, summed over the DCIs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// DCIs created so far.
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
    /// MRs the engine owns right now.
    pub owned_mrs: usize,
}

struct Receiver<N: Nic> {
    #[allow(dead_code)] // polled by the two-sided path (later issue)
    cq: N::Cq,
    #[allow(dead_code)]
    srq: N::Srq,
    dct: N::Qp,
}

pub(crate) struct EngineInner<N: Nic> {
    pub(crate) nic: N,
    pub(crate) pd: N::Pd,
    pub(crate) cfg: EngineConfig,
    /// `cfg.policy` clamped to the device.
    pub(crate) policy: Policy,
    pub(crate) cache: DcCache,
    pub(crate) mrs: Arc<MrRegistry>,
    recv: Receiver<N>,
    meta: Option<MetaClient<N>>,
    pool: Mutex<Vec<Arc<Dci<N>>>>,
    next_dci: AtomicUsize,
    next_vqp: AtomicU32,
    hits: AtomicU64,
    misses: AtomicU64,
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
            .field("dcis", &self.inner.pool.lock().len())
            .field("cache", &self.inner.cache)
            .finish()
    }
}

impl<N: Nic> Engine<N> {
    /// Starts an engine on `nic`: a PD, the DCT with its SRQ and receive CQ,
    /// `cfg.prestart` DCIs, the DCCache, and the meta client's DCI when
    /// `cfg.meta` is set.
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] on a device without DC;
    /// [`EngineError::Config`]; [`EngineError::Nic`] when the device refuses
    /// a resource.
    pub fn start(nic: N, cfg: EngineConfig) -> Result<Engine<N>, EngineError> {
        cfg.validate()?;
        let caps = nic.caps();
        if !caps.dc {
            return Err(EngineError::Unsupported {
                reason: "the device has no DC transport (not a ConnectX NIC?); the RC fallback \
                         (connections over a UD handshake, DESIGN 3.2) is not implemented yet",
            });
        }
        let mut policy = cfg.policy;
        policy.max_sge = policy.max_sge.min(caps.max_sge as usize).max(1);
        policy.max_inline = policy.max_inline.min(caps.max_inline as usize);
        let pd = nic
            .alloc_pd()
            .map_err(EngineError::nic("allocate the PD"))?;
        let recv = Self::start_receiver(&nic, &pd, &cfg)?;
        let meta = match cfg.meta {
            Some(loc) => Some(MetaClient::start(
                &nic,
                &pd,
                loc,
                MetaPolicy {
                    retries: cfg.meta_retries,
                    backoff: cfg.meta_backoff,
                    timeout: cfg.meta_timeout,
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
            recv,
            meta,
            pool: Mutex::new(Vec::new()),
            next_dci: AtomicUsize::new(0),
            next_vqp: AtomicU32::new(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            cfg,
        });
        {
            let mut pool = inner.pool.lock();
            for i in 0..inner.cfg.prestart {
                pool.push(Arc::new(Dci::create(&inner, i)?));
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

    /// This node's DC address: what it registers with the meta server so
    /// that peers can reach its memory.
    pub fn local_target(&self) -> DcTarget {
        DcTarget {
            gid: self.inner.nic.gid(),
            dct_num: self.inner.recv.dct.qpn(),
            dc_key: self.inner.cfg.dc_key,
        }
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

    /// Creates a VQP bound round-robin to a DCI of the pool (creating the
    /// DCI when the pool is below its cap).
    ///
    /// # Errors
    /// [`EngineError::VqpIdsExhausted`]; [`EngineError::Nic`] when a DCI
    /// cannot be created.
    pub fn create_vqp(&self) -> Result<Vqp<N>, EngineError> {
        let n = self.inner.next_vqp.fetch_add(1, Ordering::Relaxed);
        let id = VqpId::new(n).map_err(|_| EngineError::VqpIdsExhausted)?;
        let dci = self.pick_dci()?;
        let shared = Arc::new(VqpShared::new(id, self.inner.cfg.vqp_depth));
        dci.attach(shared.clone());
        Ok(Vqp {
            engine: self.inner.clone(),
            dci,
            shared,
        })
    }

    fn pick_dci(&self) -> Result<Arc<Dci<N>>, EngineError> {
        let k = self.inner.next_dci.fetch_add(1, Ordering::Relaxed) % self.inner.cfg.pool_size;
        let mut pool = self.inner.pool.lock();
        if let Some(d) = pool.get(k) {
            return Ok(d.clone());
        }
        // Below the cap: create the next DCI (the pool grows in order).
        let index = pool.len();
        let d = Arc::new(Dci::create(&self.inner, index)?);
        pool.push(d.clone());
        Ok(d)
    }

    /// Allocates `len` bytes of zeroed memory registered in the engine's PD
    /// and known to the pre-check as this process's.
    ///
    /// # Errors
    /// [`EngineError::Nic`] with the provider's refusal.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<OwnedMr<N>, EngineError> {
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

    /// Statistics, summed over the DCIs (takes each DCI's lock briefly).
    pub fn stats(&self) -> EngineStats {
        let pool: Vec<Arc<Dci<N>>> = self.inner.pool.lock().clone();
        let mut dci = DciStats::default();
        for d in &pool {
            let s = d.stats();
            dci.doorbells += s.doorbells;
            dci.wrs += s.wrs;
            dci.forced_signals += s.forced_signals;
            dci.rejected += s.rejected;
            dci.completions += s.completions;
            dci.error_completions += s.error_completions;
            dci.stale_completions += s.stale_completions;
            dci.orphaned += s.orphaned;
            dci.recoveries += s.recoveries;
            dci.flushed_by_reset += s.flushed_by_reset;
        }
        EngineStats {
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
