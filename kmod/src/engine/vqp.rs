//! Virtual QPs: a verbs-shaped handle bound to one shared physical QP.
//!
//! A VQP's state ([`VqpState`]: its count of WRs in flight, completion ring, target
//! and the remote grants it knows) lives INSIDE the physical QP it is bound
//! to, under that QP's lock: a post or a poll takes exactly one lock (the
//! QP's), never a second per-VQP lock, and finding a VQP's state, for its
//! post or poll or to route a completion to it, is a [`VqpTable`] lookup
//! (one multiply, one compare; no hashing) under the lock already held.
//! Only while no QP holds it
//! (RC fallback mode, before the first connect) does the state sit in the
//! VQP's own `parked` slot.
//!
//! Binding: in DC mode a VQP is bound at creation, for life, to a DCI of the
//! pool (any target is reached through it); an upgraded VQP's state moves
//! to an RC pair with its target and back (see `super::upgrade`). In RC fallback mode it is bound
//! at `connect` to the RC pair of its target (created by a handshake on a
//! miss of the engine's pair cache); the binding sits behind a small lock of
//! its own, held by each post and poll for the call (that lock, then the
//! QP's: no handle is cloned). Moving the state
//! from one QP to another (connect to another target, re-bind after the
//! pair was evicted or lost) happens under the binding lock, with no WR in
//! flight, so no post or poll runs meanwhile. A pair that was evicted or
//! lost is replaced transparently by the next post: a new pair for the same
//! target (one handshake), or a typed [`VqpError::Rebind`] when the target
//! does not answer.
//!
//! Capacity: `outstanding + ring.len() <= depth` at all times, so a
//! VQP's memory is fixed at creation, like a CQ sized to its send queue: a
//! post that would exceed it is refused with [`VqpError::VqpFull`] until the
//! user polls. Neither posting nor polling allocates.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use krcore_nic::{Gid, Nic, SendWr, Wc};
use parking_lot::Mutex;

use super::device::Device;
use super::error::{EngineError, VqpError};
use super::physqp::{PhysQp, PostFail};
use super::rc::{Build, RcHost};
use crate::dccache::CachedTarget;
use crate::precheck::{RemoteGrant, Ungranted};
use crate::sharedqp::VqpState;
use crate::wrid::VqpId;

/// Which physical QP a VQP posts on (see the module docs).
pub(crate) enum Binding<N: Nic> {
    /// DC mode: a DCI of the pool, for life, and an RC pair while upgraded
    /// (see `super::upgrade`).
    Dc(DcBinding<N>),
    /// RC fallback mode: its target's RC pair, once connected.
    Rc(Mutex<Option<Arc<PhysQp<N>>>>),
}

impl<N: Nic> Binding<N> {
    fn current(&self) -> Option<Arc<PhysQp<N>>> {
        match self {
            Binding::Dc(b) => Some(b.current()),
            Binding::Rc(slot) => slot.lock().clone(),
        }
    }
}

/// A virtual QP: what a user posts to and polls, sharing a physical QP (a DC
/// initiator, or in RC fallback mode its target's RC QP) with other VQPs.
///
/// `Send + Sync`; several threads may use one VQP (their posts are
/// serialized by the shared QP's lock). Dropping the VQP detaches it from
/// its QP: completions of WRs still in flight are then discarded.
// In declaration order: what every post and poll reads (engine, device,
// binding, id) leads, the parked state (RC fallback mode, unbound only) trails.
#[repr(C)]
pub struct Vqp<N: Nic> {
    pub(crate) engine: Arc<dyn RcHost<N>>,
    /// The engine's device (what the data path reads: configuration,
    /// DCCache, counters), held beside the engine so that reading it is
    /// not a call through the engine's trait object.
    pub(crate) dev: Arc<Device<N>>,
    pub(crate) binding: Binding<N>,
    pub(crate) id: VqpId,
    /// Bumped by every [`Vqp::add_grant`] and [`Vqp::remove_grant`] (after
    /// the change): see [`Vqp::grants_epoch`].
    grants_epoch: AtomicU64,
    /// The state while no QP holds it (RC fallback mode, unbound).
    pub(crate) parked: Mutex<Option<VqpState>>,
}

impl<N: Nic> std::fmt::Debug for Vqp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phys = self.binding.current();
        let (target, outstanding, unpolled) = self
            .with_state(|st| (st.target.map(|t| t.target), st.outstanding, st.ring.len()))
            .unwrap_or_default();
        f.debug_struct("Vqp")
            .field("id", &self.id)
            .field("qp", &phys)
            .field("target", &target)
            .field("outstanding", &outstanding)
            .field("unpolled", &unpolled)
            .finish()
    }
}

impl<N: Nic> Drop for Vqp<N> {
    fn drop(&mut self) {
        if let Some(q) = self.binding.current() {
            q.detach(self.id);
        }
    }
}

impl<N: Nic> Vqp<N> {
    /// This VQP's id (also the `qp_num` of its completions).
    pub fn id(&self) -> VqpId {
        self.id
    }

    /// A VQP bound to `dci` for life (DC mode), its state handed to it.
    pub(crate) fn on_dci(
        engine: Arc<dyn RcHost<N>>,
        dev: Arc<Device<N>>,
        id: VqpId,
        dci: Arc<PhysQp<N>>,
    ) -> Vqp<N> {
        dci.attach(id, VqpState::new(dev.cfg.vqp_depth, dev.cfg.ungranted));
        let threshold = dev.cfg.upgrade_after;
        Vqp {
            engine,
            dev,
            binding: Binding::Dc(DcBinding::new(dci, threshold)),
            id,
            parked: Mutex::new(None),
            grants_epoch: AtomicU64::new(0),
        }
    }

    /// An unbound VQP (RC fallback mode), its state parked.
    pub(crate) fn unbound(engine: Arc<dyn RcHost<N>>, dev: Arc<Device<N>>, id: VqpId) -> Vqp<N> {
        let st = VqpState::new(dev.cfg.vqp_depth, dev.cfg.ungranted);
        Vqp {
            engine,
            dev,
            binding: Binding::Rc(Mutex::new(None)),
            id,
            parked: Mutex::new(Some(st)),
            grants_epoch: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the VQP's state wherever it lives; `None` only if it is
    /// nowhere (a bug: every move keeps it somewhere). RC: under the binding
    /// lock, so that no move runs meanwhile.
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut VqpState) -> R) -> Option<R> {
        match &self.binding {
            Binding::Dc(b) => b.with_current(|q| q.with_vqp(self.id, f)),
            Binding::Rc(slot) => {
                let slot = slot.lock();
                match &*slot {
                    Some(q) => q.with_vqp(self.id, f),
                    None => self.parked.lock().as_mut().map(f),
                }
            }
        }
    }

    /// RC: takes the state out of its current holder (the binding lock
    /// `slot` is held by the caller).
    fn take_state(&self, slot: &Option<Arc<PhysQp<N>>>) -> VqpState {
        let st = match slot {
            Some(q) => q.detach(self.id),
            None => self.parked.lock().take(),
        };
        // Every move keeps the state somewhere; a fresh one is the safe
        // answer should that ever fail (nothing is in flight to lose).
        st.unwrap_or_else(|| VqpState::new(self.dev.cfg.vqp_depth, self.dev.cfg.ungranted))
    }

    /// Index of the physical QP this VQP posts on: in DC mode the DCI's
    /// index in the pool; in RC fallback mode the serial number of its RC
    /// pair (0 before the first connect).
    pub fn dci_index(&self) -> usize {
        self.binding.current().map_or(0, |q| q.index)
    }

    /// QP number of the physical QP this VQP posts on (the DCI, or the RC
    /// QP); 0 in RC fallback mode before the first connect.
    pub fn dci_qpn(&self) -> u32 {
        self.physical_qpn().unwrap_or(0)
    }

    /// QP number of the physical QP this VQP posts on, if it has one.
    pub fn physical_qpn(&self) -> Option<u32> {
        self.binding.current().map(|q| q.qpn())
    }

    /// Points the VQP at the node `gid`.
    ///
    /// DC mode: a DCCache hit costs nothing on the network and creates no
    /// QP; a miss costs one READ of the meta server's table (plus retries if
    /// the bucket was being written).
    ///
    /// RC fallback mode: the same lookup (the entry names the target's
    /// handshake endpoint), then the engine's RC pair to the target: an
    /// existing pair costs nothing (no QP, no network); otherwise one RC QP
    /// and one handshake round trip with the target (which may evict the
    /// least recently used idle pair when the cache is at its cap).
    ///
    /// # Errors
    /// [`EngineError::UnknownNode`] when the meta server has no live entry
    /// for `gid`; [`EngineError::MetaUnavailable`] when the meta server did
    /// not answer in time; [`EngineError::MetaInconsistent`],
    /// [`EngineError::NoMetaServer`], [`EngineError::Nic`]. RC fallback
    /// mode: [`EngineError::Handshake`] when the target does not answer
    /// (bounded by the handshake timeout and retries; nothing is left
    /// behind), [`EngineError::RcPairsBusy`], [`EngineError::VqpBusy`]
    /// (WRs in flight to another target), [`EngineError::NotAFallbackNode`].
    /// The VQP keeps its previous target on error.
    pub fn connect(&self, gid: Gid) -> Result<(), EngineError> {
        // `RcHost::resolve` with its hit taken through the VQP's own
        // device: a warm connect makes no call through the trait object.
        let t = match self.dev.cached(&gid) {
            Some(t) => t,
            None => self.engine.resolve_miss(&gid)?,
        };
        let slot = match &self.binding {
            Binding::Dc(b) => return self.connect_dc(b, t),
            Binding::Rc(slot) => slot,
        };
        let mut slot = slot.lock();
        if let Some(cur) = &*slot {
            if cur.rc_link().is_some_and(|l| l.gid == gid)
                && cur.is_open()
                && cur.with_vqp(self.id, |st| st.target = Some(t)).is_some()
            {
                return Ok(());
            }
        }
        let outstanding = match &*slot {
            Some(q) => q.with_vqp(self.id, |st| st.outstanding),
            None => self.parked.lock().as_ref().map(|st| st.outstanding),
        }
        .unwrap_or(0);
        if outstanding > 0 {
            return Err(EngineError::VqpBusy {
                vqp: self.id,
                outstanding,
            });
        }
        let pair = super::rc::acquire(&*self.engine, t)?;
        let mut st = self.take_state(&slot);
        st.target = Some(t);
        pair.attach(self.id, st);
        *slot = Some(pair);
        Ok(())
    }

    /// RC fallback mode: replaces the pair `stale` (closed, or no longer
    /// this VQP's) by the current pair of the VQP's target.
    fn rebind(&self, stale: &Arc<PhysQp<N>>) -> Result<(), VqpError> {
        let Binding::Rc(slot) = &self.binding else {
            return Ok(());
        };
        let mut slot = slot.lock();
        if !slot.as_ref().is_some_and(|q| Arc::ptr_eq(q, stale)) || stale.is_open() {
            // Someone re-bound it already (the state moved meanwhile): retry.
            return Ok(());
        }
        let vqp = self.id;
        let Some(old) = stale.with_vqp(vqp, |st| st.target).flatten() else {
            return Err(VqpError::NotConnected { vqp });
        };
        // The target's address as the node knows it now: the DCCache (a
        // hit, usually), or the meta table when the entry was dropped (the
        // peer restarted on its GID, see `RcPool::forget_restarted`). If
        // the table cannot be read, the old address is tried.
        let t = self.engine.resolve(&old.target.gid).unwrap_or(old);
        let pair = super::rc::acquire(&*self.engine, t).map_err(|e| VqpError::Rebind {
            vqp,
            source: Box::new(e),
        })?;
        let mut st = self.take_state(&slot);
        st.target = Some(t);
        pair.attach(vqp, st);
        *slot = Some(pair);
        Ok(())
    }

    /// The target the VQP posts to, if connected.
    pub fn target(&self) -> Option<CachedTarget> {
        self.with_state(|st| st.target).flatten()
    }

    /// Makes a remote grant known: WRs to `gid` with `rkey` must then stay
    /// inside it (pre-check (b)). WRs with an rkey no grant is known for are
    /// left to the NIC.
    ///
    /// A grant without expiry costs no clock read at posts; while the VQP
    /// knows one with an expiry, each post reads the clock once.
    pub fn add_grant(&self, gid: Gid, rkey: u32, grant: RemoteGrant) {
        self.with_state(|st| {
            st.last_grant.set(None);
            let old = st.grants.insert((gid, rkey), grant);
            st.expiring -= u32::from(old.is_some_and(|g| g.expires_at.is_some()));
            st.expiring += u32::from(grant.expires_at.is_some());
        });
        self.grants_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// What the pre-check does with this VQP's one-sided WRs to a
    /// (target, rkey) it knows no grant for: [`Ungranted::Refuse`] (the
    /// engine's default, [`super::EngineConfig::ungranted`]) or
    /// [`Ungranted::Allow`], the opt-out for raw verbs users who pass
    /// rkeys by hand (the NIC then judges them).
    pub fn set_ungranted(&self, rule: Ungranted) {
        self.with_state(|st| st.ungranted = rule);
    }

    /// Forgets a grant; returns it if it was known.
    pub fn remove_grant(&self, gid: &Gid, rkey: u32) -> Option<RemoteGrant> {
        let old = self
            .with_state(|st| {
                st.last_grant.set(None);
                let old = st.grants.remove(&(*gid, rkey));
                st.expiring -= u32::from(old.is_some_and(|g| g.expires_at.is_some()));
                old
            })
            .flatten();
        self.grants_epoch.fetch_add(1, Ordering::AcqRel);
        old
    }

    /// How many times the VQP's known grants were changed
    /// ([`Vqp::add_grant`], [`Vqp::remove_grant`]), read without a lock.
    /// A caller that added a grant and saw the epoch move by exactly one
    /// (its own change) knows the grant is still in place while the epoch
    /// stays at that value: it may skip adding it again (the SDK does, per
    /// request).
    pub fn grants_epoch(&self) -> u64 {
        self.grants_epoch.load(Ordering::Acquire)
    }

    /// WRs posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.with_state(|st| st.outstanding).unwrap_or(0)
    }

    /// Posts `wrs` as ONE doorbell on the shared physical QP.
    ///
    /// The engine names the VQP's target in every WR (`dest` stays set on
    /// return: the DC target, or `Connected` on an RC pair), runs the
    /// pre-check, polls the QP to reclaim credits when
    /// the batch does not fit, and posts copies of the WRs (kept as the
    /// QP's records of them) with physical wr_ids, the last one possibly
    /// forced signaled. The caller's WRs keep their wr_ids and flags. Completions come back through [`Vqp::poll`] with the
    /// caller's wr_ids: one per WR the caller signaled, and one per WR that
    /// failed.
    ///
    /// # Errors
    /// - [`VqpError::NotConnected`]: no target.
    /// - [`VqpError::Rejected`]: the pre-check found a bad WR; nothing was
    ///   posted (with the pre-check enabled, a bad WR never reaches the NIC).
    /// - [`VqpError::VqpFull`]: poll first.
    /// - [`VqpError::QueueBusy`]: the shared send queue did not drain in time.
    /// - [`VqpError::Post`]: the provider refused part of the batch (see its
    ///   docs for which WRs were posted).
    /// - [`VqpError::Rebind`] (RC fallback mode): the VQP's pair was
    ///   evicted or lost and a new one could not be made.
    /// - [`VqpError::Nic`], [`VqpError::Credit`].
    #[inline(always)]
    pub fn post_send(&self, wrs: &mut [SendWr]) -> Result<(), VqpError> {
        // The binding only names the shared QP (RC fallback mode: and holds
        // the binding lock, before the QP's, for the call), so that ONE
        // copy of the QP's post is inlined into the caller, whatever the
        // transport: in an emulated guest (Soft-RoCE under TCG) every code
        // page and every out-of-line call on the path costs far more than
        // its instructions (see `krcore_lat`'s docs).
        let mut rc_slot = None;
        let mut dc_count = 0;
        let q: &PhysQp<N> = match &self.binding {
            Binding::Dc(b) => match self.dc_direct(b, wrs.len()) {
                Ok(count) => {
                    dc_count = count;
                    &b.dci
                }
                Err(count) => return self.post_dc_rest(b, wrs, count),
            },
            Binding::Rc(slot) => match rc_slot.insert(slot.lock()).as_deref() {
                Some(q) => q,
                None => return Err(VqpError::NotConnected { vqp: self.id }),
            },
        };
        // One WR (the usual post, every atomic of the SDK): its own copy,
        // the batch's length known, its loops gone.
        let posted = match wrs {
            [wr] => q.post(&self.engine, self.id, std::slice::from_mut(wr)),
            _ => q.post(&self.engine, self.id, wrs),
        };
        match posted {
            Ok(()) => Ok(()),
            Err(PostFail::Vqp(e)) => Err(e),
            Err(PostFail::Stale) => {
                // The binding lock is released before the pair is replaced.
                let stale = rc_slot.and_then(|g| (*g).clone());
                self.post_after_stale(stale, wrs, dc_count)
            }
        }
    }

    /// [`Vqp::post_send`] when the QP it tried no longer holds the VQP's
    /// state (nothing was posted): DC mode, the state moved to an RC pair
    /// meanwhile ([`Vqp::post_dc_rest`]); RC fallback mode, the pair
    /// `stale` was closed (evicted or lost) and is replaced.
    #[cold]
    #[inline(never)]
    fn post_after_stale(
        &self,
        stale: Option<Arc<PhysQp<N>>>,
        wrs: &mut [SendWr],
        dc_count: u64,
    ) -> Result<(), VqpError> {
        match (&self.binding, stale) {
            (Binding::Dc(b), _) => self.post_dc_rest(b, wrs, dc_count),
            (Binding::Rc(slot), Some(stale)) => self.post_rc_rebinding(slot, stale, wrs),
            // (An RC post holds its pair while it tries it.)
            (Binding::Rc(_), None) => Err(VqpError::NotConnected { vqp: self.id }),
        }
    }

    /// One try of an RC fallback mode post on the pair the binding names,
    /// under the binding lock: `Ok(Some(pair))` when the pair is stale
    /// (nothing was posted).
    fn try_post_rc(
        &self,
        slot: &Mutex<Option<Arc<PhysQp<N>>>>,
        wrs: &mut [SendWr],
    ) -> Result<Option<Arc<PhysQp<N>>>, VqpError> {
        let slot = slot.lock();
        let Some(q) = slot.as_ref() else {
            return Err(VqpError::NotConnected { vqp: self.id });
        };
        match q.post(&self.engine, self.id, wrs) {
            Ok(()) => Ok(None),
            Err(PostFail::Vqp(e)) => Err(e),
            Err(PostFail::Stale) => Ok(Some(q.clone())),
        }
    }

    /// An RC fallback mode post after its first try found the pair `stale`: the
    /// pair is replaced, then the post is tried again; two more
    /// replacements in a row mean concurrent reconnects: give up typed.
    #[cold]
    #[inline(never)]
    fn post_rc_rebinding(
        &self,
        slot: &Mutex<Option<Arc<PhysQp<N>>>>,
        mut stale: Arc<PhysQp<N>>,
        wrs: &mut [SendWr],
    ) -> Result<(), VqpError> {
        for _ in 0..2 {
            self.rebind(&stale)?;
            match self.try_post_rc(slot, wrs)? {
                None => return Ok(()),
                Some(q) => stale = q,
            }
        }
        self.rebind(&stale)?;
        Err(VqpError::NotConnected { vqp: self.id })
    }

    /// Polls up to `out.len()` of this VQP's completions, oldest first.
    ///
    /// Under the shared QP's lock (the only lock taken): returns what this
    /// VQP's ring holds; when that is not enough, drains the QP's CQ,
    /// routing every completion to its own VQP, then returns this VQP's. A VQP only ever
    /// sees its own completions, with its own wr_ids, `qp_num` = its id.
    ///
    /// In RC fallback mode a poll that finds the pair in error re-handshakes
    /// it with the target (bounded by the handshake timeout and retries).
    ///
    /// # Errors
    /// [`VqpError::Nic`] when the CQ failed (overflow) and nothing was
    /// ready; [`VqpError::Nic`] when a QP reset after an error failed.
    #[inline(always)]
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize, VqpError> {
        // As `post_send`: the binding names the QP (RC fallback mode: under
        // the binding lock, so the state cannot move meanwhile), and ONE
        // copy of the QP's poll is inlined.
        let mut rc_slot = None;
        let q: &PhysQp<N> = match &self.binding {
            Binding::Dc(b) if b.on_rc() => return self.poll_dc_rest(b, out),
            Binding::Dc(b) => &b.dci,
            Binding::Rc(slot) => match rc_slot.insert(slot.lock()).as_deref() {
                Some(q) => q,
                None => return Ok(0),
            },
        };
        // One entry (a synchronous wait's poll): its own copy, the
        // array's length known.
        let polled = match out {
            [wc] => q.poll(&self.engine, self.id, std::slice::from_mut(wc)),
            _ => q.poll(&self.engine, self.id, out),
        };
        match (polled?, &self.binding) {
            (Some(n), _) => Ok(n),
            // DC mode: the state moved to an RC pair meanwhile.
            (None, Binding::Dc(b)) => self.poll_dc_rest(b, out),
            // RC fallback mode: the pair under the binding lock holds the
            // state whenever it is bound.
            (None, Binding::Rc(_)) => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A meta table (returned: keep it), a server engine registered in it
    /// and a client engine, on one in-memory fabric, one DCI each.
    fn server_and_client() -> (
        krcore_meta::LocalMetaHost<krcore_nic::sim::SimNic>,
        crate::Engine<krcore_nic::sim::SimNic>,
        crate::Engine<krcore_nic::sim::SimNic>,
    ) {
        use crate::{Engine, EngineConfig, MetaLocation};
        use krcore_meta::{LocalMetaHost, MetaConfig};
        use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
        let f = SimFabric::in_memory();
        let node = || SimNic::open(&f, SimConfig::default()).unwrap();
        let mut meta = LocalMetaHost::start(node(), MetaConfig::default()).unwrap();
        let loc = MetaLocation::from_bootstrap(&meta.bootstrap()).unwrap();
        let cfg = || EngineConfig::default().with_meta(loc).with_pool_size(1);
        let server = Engine::start(node(), cfg()).unwrap();
        meta.table_mut()
            .register(server.local_target().unwrap(), 0, 1 << 40, 0)
            .unwrap();
        let client = Engine::start(node(), cfg()).unwrap();
        (meta, server, client)
    }

    /// A grant over the whole of `mr`, every remote access, no expiry.
    fn whole(mr: &super::super::OwnedMr<krcore_nic::sim::SimNic>) -> RemoteGrant {
        use krcore_nic::{Access, MemoryRegion};
        RemoteGrant {
            addr: mr.addr(),
            len: mr.len() as u64,
            access: Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            expires_at: None,
        }
    }

    /// Two VQPs on one DCI: B's unsignaled WR is posted before A's
    /// signaled one, so A's completion retires B's WR too. A's poll must
    /// route it (B's count drops, A gets its completion), not apply it as
    /// if every retired WR were A's (the inline poll does so only while
    /// all outstanding WRs are the poller's, `SharedQp::sole`).

    #[test]
    fn a_completion_retiring_another_vqps_wr_is_routed() {
        use krcore_nic::{Access, MemoryRegion, SendWr, Wc, WcStatus};

        let (_meta, server, client) = server_and_client();
        let remote = server.alloc_mr(4096, Access::ALL).unwrap();
        let local = client.alloc_mr(4096, Access::ALL).unwrap();
        let (a, b) = (client.create_vqp().unwrap(), client.create_vqp().unwrap());
        a.connect(server.gid()).unwrap();
        b.connect(server.gid()).unwrap();
        for v in [&a, &b] {
            v.add_grant(server.gid(), remote.rkey(), whole(&remote));
        }
        assert_eq!(a.dci_qpn(), b.dci_qpn(), "one shared DCI");
        let read = |id, off| SendWr::read(id, local.sge(off, 64).unwrap(), remote.remote(off));
        for round in 0..3u64 {
            b.post_send(&mut [read(100 + round, 0).signaled(false)])
                .unwrap();
            a.post_send(&mut [read(200 + round, 64)]).unwrap();
            let mut wc = [Wc::default(); 4];
            let mut got = 0;
            for _ in 0..1000 {
                got = a.poll(&mut wc).unwrap();
                if got > 0 {
                    break;
                }
            }
            assert_eq!(got, 1, "round {round}: A's completion");
            assert_eq!(wc[0].wr_id, 200 + round);
            assert_eq!(wc[0].status, WcStatus::Success);
            assert_eq!(wc[0].qp_num, a.id().get());
            assert_eq!((a.outstanding(), b.outstanding()), (0, 0));
            assert_eq!(b.poll(&mut wc).unwrap(), 0, "B asked for nothing");
        }
        // A alone: its unsignaled WR then its signaled one, retired by one
        // completion through the inline path.
        a.post_send(&mut [read(300, 0).signaled(false), read(301, 64)])
            .unwrap();
        let mut wc = [Wc::default(); 4];
        let mut got = 0;
        for _ in 0..1000 {
            got = a.poll(&mut wc).unwrap();
            if got > 0 {
                break;
            }
        }
        assert_eq!((got, wc[0].wr_id), (1, 301));
        assert_eq!(a.outstanding(), 0);
    }

    /// A VQP alone on its DCI posts in place (the caller's WRs carry the
    /// physical wr_ids to the NIC): every post, forced signal and ring
    /// wrap-around included, hands the WRs back with the caller's wr_ids
    /// and flags, and the completions carry the caller's wr_ids.
    #[test]
    fn in_place_posts_give_the_callers_wrs_back_as_they_were() {
        use krcore_nic::{Access, Destination, MemoryRegion, SendWr, Wc, WcStatus};

        let (_meta, server, client) = server_and_client();
        let remote = server.alloc_mr(4096, Access::ALL).unwrap();
        let local = client.alloc_mr(4096, Access::ALL).unwrap();
        let v = client.create_vqp().unwrap();
        v.connect(server.gid()).unwrap();
        v.add_grant(server.gid(), remote.rkey(), whole(&remote));
        let read = |id: u64| {
            let off = (id as usize % 32) * 64;
            SendWr::read(id, local.sge(off, 64).unwrap(), remote.remote(off))
        };
        // 20 unsignaled WRs (more than max_unsignaled: the last is forced
        // signaled), then one signaled: 21 WRs a round, past the 128
        // records of the DCI several times.
        for round in 0..20u64 {
            let mut quiet: Vec<SendWr> = (0..20)
                .map(|k| read(1000 * round + k).signaled(false))
                .collect();
            let before = quiet.clone();
            v.post_send(&mut quiet).unwrap();
            for (wr, was) in quiet.iter().zip(&before) {
                assert_eq!(
                    (wr.wr_id, wr.flags),
                    (was.wr_id, was.flags),
                    "round {round}"
                );
                assert!(matches!(wr.dest, Destination::Dc(_)), "dest named");
            }
            let mut loud = [read(1000 * round + 999)];
            v.post_send(&mut loud).unwrap();
            assert_eq!(
                (loud[0].wr_id, loud[0].is_signaled()),
                (1000 * round + 999, true)
            );
            let mut wc = [Wc::default(); 4];
            let mut got = 0;
            for _ in 0..1000 {
                got = v.poll(&mut wc).unwrap();
                if got > 0 {
                    break;
                }
            }
            assert_eq!(got, 1, "round {round}: only the signaled WR's completion");
            assert_eq!(
                (wc[0].wr_id, wc[0].status),
                (1000 * round + 999, WcStatus::Success)
            );
            assert_eq!(v.outstanding(), 0, "round {round}");
        }
        let s = client.stats().dci;
        assert_eq!(s.forced_signals, 20, "{s:?}");
        assert_eq!(
            (s.wrs, s.error_completions, s.orphaned),
            (420, 0, 0),
            "{s:?}"
        );
    }
}

/// How a VQP reaches its target right now ([`Vqp::path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VqpPath {
    /// Through a DC initiator of the pool.
    Dc,
    /// Through the RC pair with its target (upgraded, or RC fallback mode).
    Rc,
}

pub(crate) struct Slot<N: Nic> {
    /// The pair holding the VQP's state, once upgraded.
    pub(crate) rc: Option<Arc<PhysQp<N>>>,
    /// A pair made for the VQP, waiting for its DC WRs to drain.
    pub(crate) pending: Option<Arc<PhysQp<N>>>,
    /// The background build the VQP waits for.
    pub(crate) build: Option<Arc<Build>>,
}

/// A DC mode VQP's binding: its DCI for life, and while upgraded its RC
/// pair (see the module docs).
pub(crate) struct DcBinding<N: Nic> {
    pub(crate) dci: Arc<PhysQp<N>>,
    pub(crate) slot: Mutex<Slot<N>>,
    /// The state is on `slot.rc` (read without the lock by polls and
    /// [`Vqp::path`]).
    pub(crate) on_rc: AtomicBool,
    /// WRs posted since the connect (counted with `upgrade_after` only:
    /// always 0 without it).
    pub(crate) wrs: AtomicU64,
    /// Count at which the next post tries to upgrade (0: hinted). Also 0
    /// while the state is on `slot.rc` (set by the switch, under the lock,
    /// rewritten by every move back to the DCI): the only gate of a post's
    /// DCI path, one load ([`Vqp::dc_direct`]); a post that read it before
    /// the switch finds the state gone from the DCI (`PostFail::Stale`)
    /// and takes the slow path.
    pub(crate) next_at: AtomicU64,
    pub(crate) fails: AtomicU32,
    /// `upgrade_after` is set: posts count their WRs (read by every post,
    /// so kept here rather than read from the engine's configuration).
    pub(crate) counts: bool,
}

impl<N: Nic> DcBinding<N> {
    /// The state is on the RC pair (`on_rc`, read without the lock).
    #[inline(always)]
    pub(crate) fn on_rc(&self) -> bool {
        self.on_rc.load(Ordering::Acquire)
    }

    pub(crate) fn new(dci: Arc<PhysQp<N>>, threshold: Option<u64>) -> DcBinding<N> {
        DcBinding {
            dci,
            slot: Mutex::new(Slot {
                rc: None,
                pending: None,
                build: None,
            }),
            on_rc: AtomicBool::new(false),
            wrs: AtomicU64::new(0),
            next_at: AtomicU64::new(threshold.unwrap_or(u64::MAX)),
            fails: AtomicU32::new(0),
            counts: threshold.is_some(),
        }
    }

    /// The QP holding the state now.
    pub(crate) fn current(&self) -> Arc<PhysQp<N>> {
        self.slot
            .lock()
            .rc
            .clone()
            .unwrap_or_else(|| self.dci.clone())
    }

    /// Runs `f` on the QP holding the state, with no move in between.
    pub(crate) fn with_current<R>(&self, f: impl FnOnce(&Arc<PhysQp<N>>) -> R) -> R {
        let slot = self.slot.lock();
        f(slot.rc.as_ref().unwrap_or(&self.dci))
    }
}
