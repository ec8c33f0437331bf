//! The node's device as the engine's data path sees it: the NIC, its
//! protection domain, the configuration and the pre-check's policy, the
//! node-wide DCCache, the owned-MR registry and the words every post reads.
//! Made once at the engine's start (its counters and the fork flag are
//! the only words that change); the engine object (`super::EngineInner`)
//! holds it and derefs to it.
//!
//! A shared QP's host (`super::physqp`) takes a [`QpHost`]: the device,
//! and the one service it calls back (pairing an RC QP with its target
//! again after an error), so that it does not name the engine object.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use krcore_nic::{Gid, Nic, UdTarget};

use super::config::EngineConfig;
use super::error::EngineError;
use super::mrs::{MrRegistry, PostWords};
use crate::dccache::{CachedTarget, DcCache};
use crate::precheck::Policy;

/// See the module docs.
pub(crate) struct Device<N: Nic> {
    /// Shared with the handshake endpoint (RC fallback mode).
    pub(crate) nic: Arc<N>,
    pub(crate) pd: N::Pd,
    pub(crate) cfg: EngineConfig,
    /// `cfg.policy` clamped to the device.
    pub(crate) policy: Policy,
    pub(crate) cache: DcCache,
    pub(crate) mrs: Arc<MrRegistry>,
    /// The words every post reads (the registry's generation, the RC
    /// pairs' LRU clock), shared with the registry and each shared QP.
    pub(crate) words: Arc<PostWords>,
    /// Set in a forked child (`super::ForkKit::adopt`): no meta lookups,
    /// no new NIC objects, no messaging.
    pub(crate) forked: AtomicBool,
    /// Connects answered by the DCCache, and by a meta READ.
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    /// VQPs moved DC -> RC, back, and failed builds (`super::upgrade`).
    pub(crate) upgrades: AtomicU64,
    pub(crate) downgrades: AtomicU64,
    pub(crate) upgrade_failures: AtomicU64,
}

impl<N: Nic> Device<N> {
    /// A peer at `gid` showed its endpoint `num` (DC mode: its DCT number;
    /// RC fallback: its handshake UD QPN): a cached address of that GID
    /// naming another endpoint is stale (a node keeps its endpoint for
    /// its life, so the GID's process restarted) and is dropped. Returns
    /// the stale endpoint's number, if one was dropped.
    pub(crate) fn forget_other_address(&self, gid: &Gid, num: u32) -> Option<u32> {
        let stale = self.cache.get(gid)?.target.dct_num;
        if stale == num {
            return None;
        }
        self.cache.invalidate(gid);
        Some(stale)
    }

    /// The DCCache's entry of `gid`, counted as a connect hit; `None` on a
    /// miss (counted by the meta lookup that follows: the engine's
    /// `RcHost::resolve`). The static first half of a connect, which a VQP
    /// takes without calling its engine.
    #[inline]
    pub(crate) fn cached(&self, gid: &Gid) -> Option<CachedTarget> {
        let hit = self.cache.lookup(gid).hit()?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(hit)
    }

    /// `Err(Unsupported)` naming `what` in a forked child.
    pub(crate) fn refuse_in_child(&self, what: &'static str) -> Result<(), EngineError> {
        if self.forked.load(Ordering::Relaxed) {
            return Err(EngineError::Unsupported { reason: what });
        }
        Ok(())
    }
}

/// What a shared QP's host needs of the engine (see the module docs).
pub(crate) trait QpHost<N: Nic> {
    /// The device.
    fn dev(&self) -> &Device<N>;

    /// Pairs `qp` (an RC QP of this engine, in RESET) with the node at
    /// `target` again: the recovery of an RC pair after an error. Returns
    /// the pairing's nonce.
    ///
    /// # Errors
    /// The pairing's (`super::pairing::pair_with`).
    fn pair_up(&self, qp: &N::Qp, target: UdTarget) -> Result<u64, EngineError>;
}
