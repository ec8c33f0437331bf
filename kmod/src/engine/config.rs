//! [`EngineConfig`]: how an engine is set up.

use std::time::Duration;

use super::error::EngineError;
use super::meta::MetaLocation;
use super::msg::MsgConfig;
use super::responder::HandshakeConfig;
use crate::precheck::Policy;

/// DC initiators per CPU in KRCore's pool (the paper's Figure 14(a): more
/// than 2 per CPU removes contention; 8 is its default).
pub const DCIS_PER_CPU: usize = 8;

/// The `dc_key` of the engine's DCT unless configured otherwise.
pub const DEFAULT_DC_KEY: u64 = 0x6b72_636f_7265_6463; // "krcoredc"

/// How an engine is set up. Start from [`EngineConfig::default`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Most DC initiators in the pool (DC mode). Default: [`DCIS_PER_CPU`]
    /// times the CPUs available to the process.
    pub pool_size: usize,
    /// DCIs created at start (the rest on demand, by `create_vqp` and the
    /// first meta lookup, up to `pool_size`; DC mode). Default 0: the
    /// first VQP creates DCI 0, so an engine start creates no QP (see
    /// [`super::Engine::start`]).
    pub prestart: usize,
    /// Send-queue depth of each DCI, and in RC fallback mode of each RC QP
    /// (its CQ has as many entries). Default 128.
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
    /// Depth of the DCT's SRQ and receive CQ (DC mode). Default 256.
    pub recv_depth: u32,
    /// The DCT's `dc_key` (DC mode). Default [`DEFAULT_DC_KEY`].
    pub dc_key: u64,
    /// RC fallback mode: most RC pairs (one per target) at any time; past
    /// it the least recently used idle pair is evicted. Default 256.
    pub rc_cap: usize,
    /// The handshake (timeouts, retries, passive QP cap, `retry_cnt` and
    /// `rnr_retry` of the pairs): RC fallback mode's UD endpoint (also its
    /// qkey and slots), and DC mode's upgrade handshake over messaging.
    pub handshake: HandshakeConfig,
    /// RC fallback mode: answer peers' handshakes from a background thread
    /// of the engine's (named `krcore-handshake`), started when the node's
    /// address is first handed out ([`super::Engine::local_target`], what a
    /// node registers with the meta server; the first messaging port or
    /// endpoint): a node that only initiates (a compute node) runs none.
    /// Off, the host must call [`super::Engine::progress`] for this node
    /// to accept connections (its own connects drive its endpoint while
    /// they wait). Default false: the engine starts no thread unless asked;
    /// the SDK turns it on.
    /// DC mode with `upgrade_endpoint`: the thread serves the reserved
    /// handshake port, started when the node starts serving upgrades
    /// ([`super::Engine::handshake_entry`], or `eager_start`); a node that
    /// only initiates upgrades runs none.
    pub handshake_thread: bool,
    /// Two-sided messaging (DC mode): inline threshold, windows, buffers.
    pub msg: MsgConfig,
    /// DC mode, hybrid DC -> RC upgrade: a VQP that posted this many WRs to
    /// its current target moves to an RC pair with that target (see
    /// [`super::Vqp::transport`]). `None`: only on an explicit hint
    /// ([`super::Vqp::upgrade`]). After a failed upgrade the next attempt
    /// waits for `threshold << failures` more WRs (at most 2^10 times).
    /// Needs `upgrade_endpoint` on this node too (the pairs are made
    /// through it); without it every attempt fails, counted in
    /// `EngineStats::rc_upgrade_failures`. Ignored in RC fallback mode.
    /// Default `None` (off: a VQP stays on its DCI unless hinted).
    pub upgrade_after: Option<u64>,
    /// DC mode: the DC -> RC upgrade. Its handshakes travel as messages
    /// (no UD QP, see [`super::hs_msg`]): a node that serves upgrades
    /// answers them on its DCT's reserved port
    /// [`super::hs_msg::HANDSHAKE_PORT`], and says so in the meta table
    /// under [`super::handshake_gid`] of its GID: the host registers
    /// [`super::Engine::handshake_entry`] beside
    /// [`super::Engine::local_target`]. Answered from the thread of
    /// `handshake_thread`, or [`super::Engine::progress`]. Default false.
    pub upgrade_endpoint: bool,
    /// DC mode: create at start what is otherwise created on first need:
    /// the DCT with its SRQ and receive CQ (first need: the node must be
    /// reachable, see [`super::Engine::local_target`]) and, with
    /// `upgrade_endpoint`, the reserved handshake port (first need: see
    /// [`super::Engine::handshake_entry`]). For a node that is reached
    /// anyway (a memory node) and should not pay for it later, or that
    /// forks children before it registers. Default false: a node that only
    /// issues one-sided operations never creates them.
    pub eager_start: bool,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineConfig {
            pool_size: DCIS_PER_CPU * cpus,
            prestart: 0,
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
            recv_depth: 256,
            dc_key: DEFAULT_DC_KEY,
            rc_cap: 256,
            handshake: HandshakeConfig::default(),
            handshake_thread: false,
            msg: MsgConfig::default(),
            upgrade_after: None,
            upgrade_endpoint: false,
            eager_start: false,
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

    /// With the RC fallback's handshake thread on or off.
    pub fn with_handshake_thread(mut self, on: bool) -> EngineConfig {
        self.handshake_thread = on;
        self
    }

    /// With at most `n` RC pairs (RC fallback mode).
    pub fn with_rc_cap(mut self, n: usize) -> EngineConfig {
        self.rc_cap = n;
        self
    }

    /// With the DC -> RC upgrade after `n` WRs to one target (`None`: on
    /// hints only).
    pub fn with_upgrade_after(mut self, n: Option<u64>) -> EngineConfig {
        self.upgrade_after = n;
        self
    }

    /// With the DC mode handshake endpoint (answering peers' upgrades) on
    /// or off.
    pub fn with_upgrade_endpoint(mut self, on: bool) -> EngineConfig {
        self.upgrade_endpoint = on;
        self
    }

    /// With the DCT (and the upgrade's handshake endpoint) created at start
    /// (`true`) or on first need (`false`, the default).
    pub fn with_eager_start(mut self, on: bool) -> EngineConfig {
        self.eager_start = on;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), EngineError> {
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
        if self.rc_cap == 0 || self.handshake.passive_cap == 0 {
            return bad("rc_cap and handshake.passive_cap must be non-zero".into());
        }
        if self.upgrade_after == Some(0) {
            return bad("upgrade_after must be at least 1 (None turns it off)".into());
        }
        Ok(())
    }
}
