//! DC mode: the hybrid DC -> RC upgrade of a VQP.
//!
//! A DC mode VQP is bound for life to a DCI of the pool. With the upgrade
//! configured (`EngineConfig::upgrade_endpoint` on both ends, and
//! `upgrade_after` or a hint), a VQP that is hot on one target moves its
//! state to an RC pair with that target: the same pairs as the RC fallback
//! mode ([`super::rc`]: one per target GID, at most `rc_cap`, least
//! recently used idle pair evicted), in the same PD, each made by one
//! handshake carried by two-sided messaging to the target's reserved port
//! ([`super::handshake_msg`]; the RC fallback's payloads, no UD QP).
//!
//! # Which targets serve upgrades
//!
//! A DC node's meta entry names its DCT. A node that serves upgrades
//! registers a second entry, under [`handshake_gid`] of its GID (naming the
//! same DCT; see [`super::Engine::handshake_entry`]), resolved through the
//! DCCache like any target. No entry: the upgrade fails
//! ([`super::EngineError::UnknownNode`]) and the VQP stays on its DCI,
//! without a message sent. The handshake then goes to the node's own GID.
//!
//! # When a VQP moves
//!
//! - Counting: each post adds its WRs to the VQP's counter (one relaxed
//!   `fetch_add` on the VQP's own atomic, only when `upgrade_after` is set).
//!   Reaching `next_at` (`upgrade_after` WRs since the connect), or a hint
//!   ([`super::Vqp::upgrade`]), sends the next post down the slow path.
//! - Building, in the background: the slow path (under the VQP's binding
//!   lock only; other VQPs on the DCI are not held) takes an existing open
//!   pair at once (no network). Without one it asks the engine's builder
//!   for it and returns to posting on the DCI: the builder is one thread
//!   (`krcore-upgrade`, started by the first connect of a VQP counted for
//!   the upgrade (`upgrade_after` set and the upgrade endpoint on), or
//!   else the first request, so that a build does not wait for a new
//!   thread's first run; idle on its queue meanwhile, none in an engine
//!   that never counts; stopped and joined with the engine) that resolves the target's
//!   endpoint and makes the pair (one handshake, bounded by the handshake
//!   timeout and retries), one target at a time, one build per target
//!   whatever the number of VQPs waiting for it (their ticket, `Build`).
//!   Meanwhile the VQP looks again every `BUILD_CHECK_WRS` WRs (a counted
//!   VQP; a hinted-only one at every post): the pair is ready when the
//!   pair cache holds it, the build failed when its ticket says so. No post
//!   ever waits for the network. A fresh pair is not evicted before a VQP
//!   that asked for it took it (reserved; see [`super::RcStats`]). A hint
//!   ([`super::Vqp::upgrade`]) and [`super::Engine::upgrade`] build on the
//!   calling thread instead: they wait for the pair.
//! - Switching: the state leaves the DCI only when none of the VQP's WRs is
//!   in flight there (`PhysQp::detach_drained`: checked and taken under the
//!   DCI's lock), so every DC WR completed before the first RC WR is
//!   posted: order kept, nothing lost or duplicated (completions not yet
//!   polled move with the state). Until then posts stay on the DCI and the
//!   pair waits (`pending`). A VQP that never lets its WRs drain never
//!   moves.
//! - Failing: a failed build (no entry, refused, timed out, pairs busy;
//!   the target refusing or dying mid-handshake is a timeout or a refusal)
//!   leaves the VQP on its DCI, counts `rc_upgrade_failures` once per VQP
//!   that waited for it, and backs off:
//!   the next attempt after `upgrade_after << failures` more WRs (at most
//!   2^10 times; a hinted-only VQP waits for the next hint).
//! - Falling back: a pair is evicted only with no WR in flight (or lost
//!   after its WRs were reported flushed): the next post of a VQP on it
//!   finds it closed and moves the state back to its DCI (`rc_downgrades`),
//!   then counts again. A connect to another target moves it back too
//!   (refused with [`super::EngineError::VqpBusy`] while WRs are in flight
//!   on the pair).
//!
//! Lock order: the VQP's binding lock, then a QP's lock (as in RC fallback
//! mode); the pair cache's locks and the builder's queue lock are taken
//! under the binding lock, never the other way round. The builder thread
//! takes no VQP's lock: it only fills the pair cache and its tickets.

use std::sync::atomic::Ordering;

use krcore_nic::{Nic, SendWr, Wc};

use super::error::{EngineError, VqpError};
use super::physqp::PostFail;
use super::rc::{pair_for, request_build, start_builder};
use super::vqp::{Binding, DcBinding, Slot, Vqp, VqpPath};
use crate::sharedqp::VqpState;

/// WRs a counted VQP posts between two looks at the background build it
/// waits for.
const BUILD_CHECK_WRS: u64 = 16;

impl<N: Nic> Vqp<N> {
    fn dc_binding(&self) -> Option<&DcBinding<N>> {
        match &self.binding {
            Binding::Dc(b) => Some(b),
            Binding::Rc(_) => None,
        }
    }

    /// How the VQP reaches its target now: [`VqpPath::Dc`] on its DCI,
    /// [`VqpPath::Rc`] once upgraded (and always in RC fallback mode).
    pub fn path(&self) -> VqpPath {
        match self.dc_binding() {
            Some(b) if !b.on_rc.load(Ordering::Acquire) => VqpPath::Dc,
            _ => VqpPath::Rc,
        }
    }

    /// Hint (DC mode): moves the VQP to an RC pair with its target now.
    ///
    /// Makes (or finds) the pair, one handshake at most, on this thread:
    /// unlike an upgrade by threshold (built in the background), the hint
    /// waits for the build (bounded by the handshake timeout and retries;
    /// a background build of the same pair in flight is waited for, not
    /// repeated). Moves the state at once when none of the VQP's WRs is in flight,
    /// otherwise at the first post that finds them drained (the VQP keeps
    /// posting on its DCI meanwhile). Returns the transport after the call.
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] in RC fallback mode or without
    /// `upgrade_endpoint`; [`EngineError::NotConnected`]; the pair's errors
    /// ([`EngineError::UnknownNode`] when the target registered no handshake
    /// endpoint, [`EngineError::Handshake`], [`EngineError::RcPairsBusy`],
    /// ...). On error the VQP stays on its DCI, working.
    pub fn upgrade(&self) -> Result<VqpPath, EngineError> {
        let Some(b) = self.dc_binding() else {
            return Err(EngineError::Unsupported {
                reason: "RC fallback VQPs are on RC pairs already",
            });
        };
        let mut slot = b.slot.lock();
        if slot.rc.is_some() {
            return Ok(VqpPath::Rc);
        }
        let Some(t) = b.dci.with_vqp(self.id, |st| st.target).flatten() else {
            return Err(EngineError::NotConnected { vqp: self.id });
        };
        slot.build = None;
        let pair = match pair_for(&*self.engine, &t.target.gid) {
            Ok(p) => p,
            Err(e) => {
                self.dev.upgrade_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(vqp = %self.id, target_gid = %t.target.gid, reason = %e, "DC -> RC upgrade failed, VQP stays on DC");
                return Err(e);
            }
        };
        slot.pending = Some(pair);
        if self.switch(b, &mut slot) {
            Ok(VqpPath::Rc)
        } else {
            b.next_at.store(0, Ordering::Relaxed);
            Ok(VqpPath::Dc)
        }
    }

    /// Moves the state from the DCI to the pending pair if drained.
    fn switch(&self, b: &DcBinding<N>, slot: &mut Slot<N>) -> bool {
        let Some(pair) = slot.pending.as_ref() else {
            return false;
        };
        match b.dci.detach_drained(self.id) {
            Some(Ok(st)) => {
                pair.attach(self.id, st);
                tracing::info!(
                    vqp = %self.id,
                    target_gid = pair.rc_link().map(|l| tracing::field::display(l.gid)),
                    qpn = pair.qpn(),
                    dci_qpn = b.dci.qpn(),
                    "VQP upgraded DC -> RC"
                );
                slot.rc = slot.pending.take();
                b.on_rc.store(true, Ordering::Release);
                // Posts go down the slow path, to the pair (see `next_at`).
                b.next_at.store(0, Ordering::Relaxed);
                b.fails.store(0, Ordering::Relaxed);
                self.dev.upgrades.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Moves the state from the pair back to the DCI (the pair is closed,
    /// so nothing of the VQP's is in flight on it), then counts again.
    fn downgrade(&self, b: &DcBinding<N>, slot: &mut Slot<N>, count: u64) {
        let Some(pair) = slot.rc.take() else {
            return;
        };
        let st = pair
            .detach(self.id)
            .unwrap_or_else(|| VqpState::new(self.dev.cfg.vqp_depth, self.dev.cfg.ungranted));
        b.dci.attach(self.id, st);
        b.on_rc.store(false, Ordering::Release);
        self.dev.downgrades.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            vqp = %self.id,
            target_gid = pair.rc_link().map(|l| tracing::field::display(l.gid)),
            qpn = pair.qpn(),
            reason = "pair closed (evicted or lost)",
            "VQP moved back RC -> DC"
        );
        let next = self
            .dev
            .cfg
            .upgrade_after
            .map_or(u64::MAX, |t| count.saturating_add(t));
        b.next_at.store(next, Ordering::Relaxed);
    }

    /// A failed build: stay on DC, back off.
    fn failed(&self, b: &DcBinding<N>, count: u64) {
        self.dev.upgrade_failures.fetch_add(1, Ordering::Relaxed);
        let fails = b.fails.fetch_add(1, Ordering::Relaxed) + 1;
        let next = self.dev.cfg.upgrade_after.map_or(u64::MAX, |t| {
            count.saturating_add(t.saturating_mul(1 << fails.min(10)))
        });
        b.next_at.store(next, Ordering::Relaxed);
        tracing::info!(vqp = %self.id, failures = fails, retry_at_wrs = next, "DC -> RC upgrade failed, VQP stays on DC and backs off");
    }

    /// Tries to upgrade (under the binding lock): takes the pair if it
    /// exists, else waits for its background build (asking for one if
    /// none is in flight); moves when drained.
    fn try_upgrade(&self, b: &DcBinding<N>, slot: &mut Slot<N>, count: u64) {
        let Some(t) = b.dci.with_vqp(self.id, |st| st.target).flatten() else {
            return;
        };
        let gid = t.target.gid;
        if slot
            .pending
            .as_ref()
            .is_some_and(|p| !p.is_open() || p.rc_link().map(|l| l.gid) != Some(gid))
        {
            slot.pending = None;
        }
        if slot.pending.is_none() {
            let existing = self
                .engine
                .rc_pool()
                .and_then(|pool| pool.existing(&*self.engine, &gid));
            if let Some(p) = existing {
                slot.pending = Some(p);
                slot.build = None;
            } else {
                // Look again after a few more WRs (a hinted-only VQP, not
                // counted, at its next post).
                let again = if self.dev.cfg.upgrade_after.is_some() {
                    count.saturating_add(BUILD_CHECK_WRS)
                } else {
                    0
                };
                if let Some(bd) = slot.build.take().filter(|bd| bd.gid == gid) {
                    match bd.done.get() {
                        None => {
                            slot.build = Some(bd);
                            b.next_at.store(again, Ordering::Relaxed);
                            return;
                        }
                        Some(false) => return self.failed(b, count),
                        // Built, and evicted since: ask again.
                        Some(true) => {}
                    }
                }
                match request_build(&self.engine, gid) {
                    Ok(bd) => {
                        slot.build = Some(bd);
                        b.next_at.store(again, Ordering::Relaxed);
                    }
                    Err(_) => self.failed(b, count),
                }
                return;
            }
        }
        self.switch(b, slot);
    }

    /// DC mode: whether a post of `n` WRs goes to the DCI directly
    /// (`Ok`), or (`Err`) to [`Vqp::post_dc_rest`] because the VQP is
    /// upgraded or due to try (`next_at`, 0 while upgraded); either way
    /// with the VQP's count of WRs including these (see the module docs).
    /// Inlined into [`Vqp::post_send`].
    #[inline(always)]
    pub(crate) fn dc_direct(&self, b: &DcBinding<N>, n: usize) -> Result<u64, u64> {
        let n = n as u64;
        // Without `upgrade_after` nothing counts: the count stays 0 (no
        // load), and only a hint (`next_at` 0) or the upgrade sends a post
        // down the slow path.
        let count = if b.counts {
            b.wrs.fetch_add(n, Ordering::Relaxed).saturating_add(n)
        } else {
            0
        };
        if count < b.next_at.load(Ordering::Relaxed) {
            Ok(count)
        } else {
            Err(count)
        }
    }

    /// A DC mode post on the pair, or when due to try an upgrade, or
    /// after the state moved (see [`Vqp::dc_direct`]).
    #[inline(never)]
    pub(crate) fn post_dc_rest(
        &self,
        b: &DcBinding<N>,
        wrs: &mut [SendWr],
        count: u64,
    ) -> Result<(), VqpError> {
        for _ in 0..4 {
            let mut slot = b.slot.lock();
            if let Some(pair) = slot.rc.as_ref() {
                match pair.post(&self.engine, self.id, wrs) {
                    Ok(()) => return Ok(()),
                    Err(PostFail::Vqp(e)) => return Err(e),
                    Err(PostFail::Stale) => {
                        self.downgrade(b, &mut slot, count);
                        continue;
                    }
                }
            }
            if count >= b.next_at.load(Ordering::Relaxed) {
                self.try_upgrade(b, &mut slot, count);
                if slot.rc.is_some() {
                    continue;
                }
            }
            match b.dci.post(&self.engine, self.id, wrs) {
                Ok(()) => return Ok(()),
                Err(PostFail::Vqp(e)) => return Err(e),
                Err(PostFail::Stale) => continue,
            }
        }
        Err(VqpError::NotConnected { vqp: self.id })
    }

    /// A DC mode poll of an upgraded VQP, or after its state moved: on the
    /// QP holding the state, under the binding lock (no move in between).
    #[inline(never)]
    pub(crate) fn poll_dc_rest(&self, b: &DcBinding<N>, out: &mut [Wc]) -> Result<usize, VqpError> {
        b.with_current(|q| Ok(q.poll(&self.engine, self.id, out)?.unwrap_or(0)))
    }

    /// DC mode connect: sets the target; an upgraded VQP connecting to
    /// another target moves back to its DCI first (drained).
    pub(crate) fn connect_dc(
        &self,
        b: &DcBinding<N>,
        t: crate::dccache::CachedTarget,
    ) -> Result<(), EngineError> {
        let mut slot = b.slot.lock();
        let id = self.id;
        let q = slot.rc.clone().unwrap_or_else(|| b.dci.clone());
        let old = q
            .with_vqp(id, |st| st.target.map(|t| t.target.gid))
            .flatten();
        let same = old == Some(t.target.gid);
        if let Some(pair) = slot.rc.clone().filter(|_| !same) {
            match pair.detach_drained(id) {
                Some(Ok(st)) => {
                    b.dci.attach(id, st);
                    slot.rc = None;
                    b.on_rc.store(false, Ordering::Release);
                    self.dev.downgrades.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        vqp = %id,
                        target_gid = old.map(tracing::field::display),
                        qpn = pair.qpn(),
                        reason = "connect to another target",
                        "VQP moved back RC -> DC"
                    );
                }
                Some(Err(outstanding)) => {
                    return Err(EngineError::VqpBusy {
                        vqp: id,
                        outstanding,
                    })
                }
                None => {
                    // Every move keeps the state somewhere: fresh is safe.
                    b.dci.attach(
                        id,
                        VqpState::new(self.dev.cfg.vqp_depth, self.dev.cfg.ungranted),
                    );
                    slot.rc = None;
                    b.on_rc.store(false, Ordering::Release);
                }
            }
        }
        let q = slot.rc.clone().unwrap_or_else(|| b.dci.clone());
        q.with_vqp(id, |st| st.target = Some(t));
        if !same && self.dev.cfg.upgrade_after.is_some() {
            // A counted VQP may ask for a build later: have the builder
            // ready (best effort: a failure shows at the request).
            let _ = start_builder(&self.engine);
        }
        if !same {
            slot.pending = None;
            slot.build = None;
            b.wrs.store(0, Ordering::Relaxed);
            b.fails.store(0, Ordering::Relaxed);
            b.next_at.store(
                self.dev.cfg.upgrade_after.unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        Ok(())
    }
}
