//! Virtual QPs: a verbs-shaped handle bound to one shared DCI.
//!
//! A VQP owns its slot table (sequence -> the user's wr_id), its completion
//! ring, its target (after `connect`) and the remote grants it knows. All of
//! it sits behind the VQP's own lock; the shared DCI's lock is taken first
//! whenever both are needed (see [`super::dci`]).
//!
//! Capacity: `slots.outstanding() + ring.len() <= depth` at all times, so a
//! VQP's memory is fixed at creation, like a CQ sized to its send queue: a
//! post that would exceed it is refused with [`VqpError::VqpFull`] until the
//! user polls.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use krcore_nic::{Gid, Nic, SendWr, Wc};
use parking_lot::Mutex;

use super::dci::Dci;
use super::error::{EngineError, VqpError};
use super::EngineInner;
use crate::dccache::CachedTarget;
use crate::precheck::RemoteGrant;
use crate::wrid::{SlotTable, VqpId};

pub(crate) struct VqpState {
    pub(crate) slots: SlotTable,
    pub(crate) ring: VecDeque<Wc>,
    pub(crate) target: Option<CachedTarget>,
    pub(crate) grants: HashMap<(Gid, u32), RemoteGrant>,
}

impl VqpState {
    /// WRs in flight plus completions not yet polled.
    pub(crate) fn occupied(&self) -> u32 {
        self.slots.outstanding() + self.ring.len() as u32
    }

    pub(crate) fn has_room(&self, n: usize) -> bool {
        (self.occupied() as usize).saturating_add(n) <= self.slots.capacity() as usize
    }
}

pub(crate) struct VqpShared {
    pub(crate) id: VqpId,
    pub(crate) state: Mutex<VqpState>,
}

impl VqpShared {
    pub(crate) fn new(id: VqpId, depth: u32) -> VqpShared {
        VqpShared {
            id,
            state: Mutex::new(VqpState {
                slots: SlotTable::new(depth),
                ring: VecDeque::with_capacity(depth as usize),
                target: None,
                grants: HashMap::new(),
            }),
        }
    }

    fn pop(&self, out: &mut [Wc]) -> usize {
        let mut st = self.state.lock();
        let n = out.len().min(st.ring.len());
        for (slot, wc) in out.iter_mut().zip(st.ring.drain(..n)) {
            *slot = wc;
        }
        n
    }
}

/// A virtual QP: what a user posts to and polls, sharing a DC initiator with
/// other VQPs.
///
/// `Send + Sync`; several threads may use one VQP (their posts are
/// serialized by the shared DCI's lock). Dropping the VQP detaches it from
/// its DCI: completions of WRs still in flight are then discarded.
pub struct Vqp<N: Nic> {
    pub(crate) engine: Arc<EngineInner<N>>,
    pub(crate) dci: Arc<Dci<N>>,
    pub(crate) shared: Arc<VqpShared>,
}

impl<N: Nic> std::fmt::Debug for Vqp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("Vqp")
            .field("id", &self.shared.id)
            .field("dci", &self.dci.index)
            .field("target", &st.target.map(|t| t.target))
            .field("outstanding", &st.slots.outstanding())
            .field("unpolled", &st.ring.len())
            .finish()
    }
}

impl<N: Nic> Drop for Vqp<N> {
    fn drop(&mut self) {
        self.dci.detach(self.shared.id);
    }
}

impl<N: Nic> Vqp<N> {
    /// This VQP's id (also the `qp_num` of its completions).
    pub fn id(&self) -> VqpId {
        self.shared.id
    }

    /// Index in the engine's pool of the DCI this VQP posts on.
    pub fn dci_index(&self) -> usize {
        self.dci.index
    }

    /// QP number of that DCI.
    pub fn dci_qpn(&self) -> u32 {
        self.dci.qpn()
    }

    /// Points the VQP at the node `gid`: a DCCache hit costs nothing on the
    /// network and creates no QP; a miss costs one READ of the meta server's
    /// table (plus retries if the bucket was being written).
    ///
    /// # Errors
    /// [`EngineError::UnknownNode`] when the meta server has no live entry
    /// for `gid`; [`EngineError::MetaUnavailable`] when the meta server did
    /// not answer in time; [`EngineError::MetaInconsistent`],
    /// [`EngineError::NoMetaServer`], [`EngineError::Nic`]. The VQP keeps its
    /// previous target on error.
    pub fn connect(&self, gid: Gid) -> Result<(), EngineError> {
        let t = super::resolve(&self.engine, &gid)?;
        self.shared.state.lock().target = Some(t);
        Ok(())
    }

    /// The target the VQP posts to, if connected.
    pub fn target(&self) -> Option<CachedTarget> {
        self.shared.state.lock().target
    }

    /// Makes a remote grant known: WRs to `gid` with `rkey` must then stay
    /// inside it (pre-check (b)). WRs with an rkey no grant is known for are
    /// left to the NIC.
    pub fn add_grant(&self, gid: Gid, rkey: u32, grant: RemoteGrant) {
        self.shared.state.lock().grants.insert((gid, rkey), grant);
    }

    /// Forgets a grant; returns it if it was known.
    pub fn remove_grant(&self, gid: &Gid, rkey: u32) -> Option<RemoteGrant> {
        self.shared.state.lock().grants.remove(&(*gid, rkey))
    }

    /// WRs posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.shared.state.lock().slots.outstanding()
    }

    /// Posts `wrs` as ONE doorbell on the shared DCI.
    ///
    /// The engine names the VQP's target in every WR (`dest` stays set on
    /// return), runs the pre-check, polls the DCI to reclaim credits when
    /// the batch does not fit, may force the last WR signaled, and posts
    /// with physical wr_ids. On return the WRs hold the caller's wr_ids and
    /// flags again. Completions come back through [`Vqp::poll`] with the
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
    /// - [`VqpError::Nic`], [`VqpError::Credit`].
    pub fn post_send(&self, wrs: &mut [SendWr]) -> Result<(), VqpError> {
        self.dci.post(&self.engine, &self.shared, wrs)
    }

    /// Polls up to `out.len()` of this VQP's completions, oldest first.
    ///
    /// Drains the shared DCI's CQ (under that DCI's lock), routing every
    /// completion to its own VQP, then returns this VQP's. A VQP only ever
    /// sees its own completions, with its own wr_ids, `qp_num` = its id.
    ///
    /// # Errors
    /// [`VqpError::Nic`] when the CQ failed (overflow) and nothing was
    /// ready; [`VqpError::Nic`] when a DCI reset after an error failed.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize, VqpError> {
        let mut n = self.shared.pop(out);
        if n < out.len() {
            match self.dci.drain_locked(&self.engine) {
                Ok(_) => {}
                Err(e) if n == 0 => return Err(e),
                Err(_) => return Ok(n),
            }
            n += self.shared.pop(&mut out[n..]);
        }
        Ok(n)
    }
}
