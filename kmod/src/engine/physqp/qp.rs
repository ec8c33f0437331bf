//! A shared physical QP as the engine holds it: the QP, its CQ, what it
//! is shared for ([`Link`]) and, behind its one lock, the protocol's core
//! (see the parent module's docs).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use krcore_nic::{bring_up, Access, Gid, Nic, QpCaps, QpInit, QpType, QueuePair, UdTarget, Wc};
use parking_lot::Mutex;

use crate::engine::device::{Device, QpHost};
use crate::engine::error::{EngineError, VqpError};
use crate::engine::mrs::PostWords;
use crate::sharedqp::{QpShape, Refusal, SharedQp, VqpState};
use crate::wrid::VqpId;

use crate::sharedqp::DciStats;

/// `PhysQp`'s alignment (its `repr`; a divisor of the page size).
#[cfg(test)]
const PHYS_QP_ALIGN: usize = 1024;

/// Completions polled per CQ poll call.
pub(super) const POLL_BATCH: usize = 32;

/// What the QP is shared for.
pub(crate) enum Link {
    /// A DC initiator: any target, named per WR.
    Dci,
    /// The RC QP of the pair (this node, `target`).
    Rc(RcLink),
}

/// The far end of an RC pair.
pub(crate) struct RcLink {
    /// The target's GID.
    pub(crate) gid: Gid,
    /// The target's handshake endpoint.
    pub(crate) handshake: UdTarget,
    /// LRU stamp: the engine's RC tick when a VQP last used the pair.
    pub(crate) used: AtomicU64,
}

/// Why a post did not go through.
pub(crate) enum PostFail {
    /// The QP is closed, or no longer the VQP's: re-read the VQP's binding
    /// (RC fallback mode only). Nothing was posted; the WRs are untouched.
    Stale,
    /// A real error, for the caller.
    Vqp(VqpError),
}

impl From<VqpError> for PostFail {
    fn from(e: VqpError) -> PostFail {
        PostFail::Vqp(e)
    }
}

impl From<Refusal> for PostFail {
    #[cold]
    fn from(r: Refusal) -> PostFail {
        PostFail::Vqp(match r {
            Refusal::Stale => return PostFail::Stale,
            Refusal::NotConnected { vqp } => VqpError::NotConnected { vqp },
            Refusal::Rejected(e) => VqpError::Rejected(e),
            Refusal::VqpFull {
                vqp,
                outstanding,
                requested,
                capacity,
            } => VqpError::VqpFull {
                vqp,
                outstanding,
                requested,
                capacity,
            },
            Refusal::Credit(e) => VqpError::Credit(e),
            Refusal::Post(e) => VqpError::Post(e),
        })
    }
}

/// What the QP's lock guards: the NIC's QP and the core's state.
pub(crate) struct PhysState<N: Nic> {
    /// `None`: an RC pair that was closed (evicted, or lost).
    pub(super) qp: Option<N::Qp>,
    /// The protocol's state (see [`crate::sharedqp`]).
    pub(super) core: SharedQp,
    /// The CQ poll buffer (kept, so that a poll initializes nothing).
    pub(super) buf: Vec<Wc>,
    /// RC: the nonce of the current pairing (for Close).
    pub(super) nonce: u64,
}

/// Aligned to 1,024 bytes and no larger (`tests::a_shared_qp_lies_in_one_page`): the
/// whole QP, its state and the inline state of a sole VQP (see
/// [`crate::sharedqp::VqpTable`]) lie in ONE page, so that a post or poll touches one page
/// of the engine's own for them (pages touched per operation are dear in
/// an emulated guest, see `krcore_lat`'s docs).
#[repr(align(1024))]
pub(crate) struct PhysQp<N: Nic> {
    /// DC: index in the pool; RC: serial number of the pair.
    pub(crate) index: usize,
    pub(super) qpn: u32,
    pub(super) cq: N::Cq,
    pub(crate) link: Link,
    /// The engine's [`PostWords`] (read by every post: the MR
    /// generation, the RC pairs' clock).
    pub(super) words: Arc<PostWords>,
    pub(super) state: Mutex<PhysState<N>>,
}

impl<N: Nic> std::fmt::Debug for PhysQp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(match self.link {
            Link::Dci => "Dci",
            Link::Rc(_) => "RcPair",
        });
        d.field("index", &self.index).field("qpn", &self.qpn);
        if let Link::Rc(l) = &self.link {
            d.field("target", &l.gid);
        }
        d.finish()
    }
}

/// The CQ and QP of a new shared QP (its CQ as deep as its send queue).
pub(crate) fn create_qp<N: Nic>(
    eng: &Device<N>,
    qp_type: QpType,
    what: (&'static str, &'static str),
) -> Result<(N::Qp, N::Cq), EngineError> {
    let depth = eng.cfg.dci_depth;
    // Every CQE retires at least one WR, and a WR holds its credit until
    // its CQE (or a later one) is polled: at most `depth` CQEs wait.
    let cq = eng.nic.create_cq(depth).map_err(EngineError::nic(what.0))?;
    let qp = eng
        .nic
        .create_qp(
            &eng.pd,
            &QpInit {
                qp_type,
                caps: QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: 0,
                    max_send_sge: eng.policy.max_sge as u32,
                    max_recv_sge: 1,
                },
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                dc_key: 0,
            },
        )
        .map_err(EngineError::nic(what.1))?;
    Ok((qp, cq))
}

impl<N: Nic> PhysQp<N> {
    /// Creates a DCI with a CQ of its own, brought up to RTS.
    pub(crate) fn dci(eng: &Device<N>, index: usize) -> Result<PhysQp<N>, EngineError> {
        let (qp, cq) = create_qp(eng, QpType::Dci, ("create a DCI's CQ", "create a DCI"))?;
        bring_up(&qp, Access::NONE, None).map_err(EngineError::nic("bring up a DCI"))?;
        tracing::debug!(index, qpn = qp.qpn(), "DCI created");
        Ok(PhysQp::new(eng, index, qp, cq, Link::Dci, 0))
    }

    /// Wraps an RC QP already paired (RTS) with `link`'s target.
    pub(crate) fn rc(
        eng: &Device<N>,
        index: usize,
        qp: N::Qp,
        cq: N::Cq,
        link: RcLink,
        nonce: u64,
    ) -> PhysQp<N> {
        PhysQp::new(eng, index, qp, cq, Link::Rc(link), nonce)
    }

    fn new(
        eng: &Device<N>,
        index: usize,
        qp: N::Qp,
        cq: N::Cq,
        link: Link,
        nonce: u64,
    ) -> PhysQp<N> {
        let shape = QpShape {
            depth: eng.cfg.dci_depth,
            precheck: eng.cfg.precheck,
            policy: eng.policy,
            peer: match &link {
                Link::Dci => None,
                Link::Rc(l) => Some(l.gid),
            },
        };
        PhysQp {
            index,
            qpn: qp.qpn(),
            cq,
            link,
            words: eng.words.clone(),
            state: Mutex::new(PhysState {
                qp: Some(qp),
                core: SharedQp::new(shape, Instant::now()),
                buf: vec![Wc::default(); POLL_BATCH],
                nonce,
            }),
        }
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The target of an RC pair.
    pub(crate) fn rc_link(&self) -> Option<&RcLink> {
        match &self.link {
            Link::Rc(l) => Some(l),
            Link::Dci => None,
        }
    }

    /// Whether the QP still exists (an RC pair may be closed).
    pub(crate) fn is_open(&self) -> bool {
        self.state.lock().qp.is_some()
    }

    /// Hands the VQP `id`'s state to this QP.
    pub(crate) fn attach(&self, id: VqpId, vqp: VqpState) {
        self.state.lock().core.attach(id, vqp);
    }

    /// Takes the VQP `id`'s state back (completions of its WRs still in
    /// flight are then discarded).
    pub(crate) fn detach(&self, id: VqpId) -> Option<VqpState> {
        self.state.lock().core.detach(id)
    }

    /// Takes the VQP `id`'s state back only if none of its WRs is in
    /// flight, checked and taken under one lock (the DC -> RC upgrade's
    /// switch): `Some(Err(outstanding))` otherwise, `None` when this QP
    /// does not hold it.
    pub(crate) fn detach_drained(&self, id: VqpId) -> Option<Result<VqpState, u32>> {
        self.state.lock().core.detach_drained(id)
    }

    /// Runs `f` on the state of the VQP `id`, if this QP holds it.
    pub(crate) fn with_vqp<R>(&self, id: VqpId, f: impl FnOnce(&mut VqpState) -> R) -> Option<R> {
        self.state.lock().core.vqp_mut(id).map(f)
    }

    pub(crate) fn stats(&self) -> DciStats {
        self.state.lock().core.stats()
    }

    /// Closes the pair whatever is in flight (the engine is going away):
    /// returns the pairing's nonce if it was open.
    pub(crate) fn close(&self) -> Option<u64> {
        let mut st = self.state.lock();
        st.qp.take().map(|_| st.nonce)
    }

    /// Closes an idle RC pair (eviction): drains its CQ, and if no WR is
    /// left in flight destroys the QP and returns the pairing's nonce (for
    /// the Close message). `Ok(None)`: WRs are in flight, the pair stays.
    pub(crate) fn close_if_idle(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
    ) -> Result<Option<u64>, VqpError> {
        let mut st = self.state.lock();
        if st.qp.is_some() {
            self.drain(eng, &mut st)?;
        }
        if st.qp.is_some() && st.core.outstanding() > 0 {
            return Ok(None);
        }
        // Dropping the QP (its last handle) destroys it and discards
        // nothing: no WR is in flight.
        st.qp = None;
        Ok(Some(st.nonce))
    }
}

#[cfg(test)]
mod tests {
    use super::{PhysQp, PHYS_QP_ALIGN};

    /// A shared QP never straddles a page: aligned to a divisor of the
    /// page size, and no larger than its alignment.
    fn fits_one_block<N: krcore_nic::Nic>() {
        assert_eq!(std::mem::align_of::<PhysQp<N>>(), PHYS_QP_ALIGN);
        assert_eq!(std::mem::size_of::<PhysQp<N>>(), PHYS_QP_ALIGN);
        assert_eq!(4096 % PHYS_QP_ALIGN, 0);
    }

    #[test]
    fn a_shared_qp_lies_in_one_page() {
        fits_one_block::<krcore_nic::sim::SimNic>();
        #[cfg(feature = "verbs")]
        fits_one_block::<krcore_nic::verbs::VerbsNic>();
    }
}
