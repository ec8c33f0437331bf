//! Posting on a shared physical QP ([`crate::sharedqp`]): the core's inline fast path and
//! general path (`SharedQp::post_fast`, `SharedQp::plan`,
//! `SharedQp::ring`) with this QP's doorbell, and what only the host
//! does: refreshing the owned-MR snapshot, draining and recovering first,
//! reclaiming credits, marking an RC pair used. See the parent module's
//! docs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use krcore_nic::{Nic, PostError, QueuePair, SendWr};

use super::qp::{Link, PhysQp, PhysState, PostFail, RcLink};
use crate::engine::device::QpHost;
use crate::engine::error::VqpError;
use crate::sharedqp::Doorbell;
use crate::wrid::VqpId;

/// The error of a post on a closed RC pair (a reclaim that ran into an
/// error may have closed it).
#[cold]
fn closed() -> PostFail {
    VqpError::Post(krcore_nic::PostError {
        index: 0,
        kind: krcore_nic::PostErrorKind::BadState(krcore_nic::QpState::Reset),
    })
    .into()
}

impl<N: Nic> PhysQp<N> {
    /// Posts `wrs` for the VQP `id` as one doorbell (see
    /// [`crate::engine::Vqp::post_send`]). [`PostFail::Stale`] when this QP
    /// does not hold the VQP's state (it moved) or is closed.
    ///
    /// The caller's WRs keep their wr_ids and flags (only `dest` is set).
    /// The common post is checked inline (`SharedQp::post_fast`);
    /// anything else takes the general path ([`PhysQp::post_general`]).
    #[inline(always)]
    pub(crate) fn post(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<(), PostFail> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let PhysState {
            qp: Some(qp), core, ..
        } = st
        {
            let bell = Bell::<N> {
                qp,
                link: &self.link,
                tick: &self.words.rc_tick,
            };
            let generation = self.words.mr_generation();
            if let Some(posted) = core.post_fast(id, wrs, generation, Instant::now, bell) {
                return posted.map_err(PostFail::from);
            }
        }
        self.post_general(eng, st, id, wrs)
    }

    /// [`PhysQp::post`] in general: recovery first if needed, the
    /// owned-MR snapshot refreshed, the full pre-check, reclaiming credits
    /// when the batch does not fit.
    #[cold]
    #[inline(never)]
    fn post_general(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
        id: VqpId,
        wrs: &mut [SendWr],
    ) -> Result<(), PostFail> {
        let n = wrs.len();
        // WRs of dropped VQPs in flight: one of them may have failed, with
        // nobody polling for it (see `SharedQp::orphans_in_flight`).
        if st.core.orphans_in_flight() {
            self.drain(eng, st)?;
        }
        if st.core.needs_recovery() {
            self.recover(eng, st)?;
        }
        if st.qp.is_none() {
            return Err(PostFail::Stale);
        }
        if eng.dev().cfg.precheck {
            let generation = eng.dev().mrs.generation();
            if generation != st.core.mr_generation() {
                let (generation, mrs) = eng.dev().mrs.snapshot();
                st.core.set_mrs(generation, mrs);
            }
        }
        let plan = match st.core.plan(id, wrs, &eng.dev().policy, Instant::now)? {
            Some(plan) => plan,
            None => {
                // The VQP is full: completions already in the CQ may free
                // its slots.
                self.drain(eng, st)?;
                match st.core.plan(id, wrs, &eng.dev().policy, Instant::now)? {
                    Some(plan) => plan,
                    None => return Err(st.core.full(id, n).into()),
                }
            }
        };
        st.core.gate_orphans();
        if let Link::Rc(l) = &self.link {
            l.touch(&self.words.rc_tick);
        }
        if plan.must_reclaim() {
            self.reclaim(eng, st, n)?;
        }
        let PhysState { qp, core, .. } = st;
        // A reclaim that ran into an error may have closed an RC pair.
        let Some(qp) = qp.as_ref() else {
            return Err(closed());
        };
        // The plan forces only ever the batch's last WR.
        core.ring(
            id,
            wrs,
            plan.force_signal.is_some(),
            |wrs: &mut [SendWr]| qp.post_send(wrs),
        )
        .map_err(PostFail::from)
    }

    /// Polls until `n` credits are free, bounded by the reclaim timeout.
    fn reclaim(
        &self,
        eng: &(impl QpHost<N> + ?Sized),
        st: &mut PhysState<N>,
        n: usize,
    ) -> Result<(), VqpError> {
        let start = Instant::now();
        loop {
            self.drain(eng, st)?;
            if st.core.free() as usize >= n {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited > eng.dev().cfg.reclaim_timeout {
                return Err(VqpError::QueueBusy {
                    free: st.core.free(),
                    requested: n,
                    waited,
                });
            }
            std::thread::yield_now();
        }
    }
}

/// A shared QP's doorbell on the fast path: `post_send`, and for an RC
/// pair its LRU mark (the general path marks it itself).
struct Bell<'a, N: Nic> {
    qp: &'a N::Qp,
    link: &'a Link,
    tick: &'a AtomicU64,
}

impl<N: Nic> Doorbell for Bell<'_, N> {
    #[inline(always)]
    fn ring(&mut self, wrs: &mut [SendWr]) -> Result<(), PostError> {
        if let Link::Rc(l) = self.link {
            l.touch(self.tick);
        }
        self.qp.post_send(wrs)
    }
}

impl RcLink {
    /// Marks the pair most recently used (exact LRU): a load of the shared
    /// tick, and a bump only when another pair was used since this one.
    #[inline]
    fn touch(&self, tick: &AtomicU64) {
        let now = tick.load(Ordering::Relaxed);
        if self.used.load(Ordering::Relaxed) != now {
            self.used
                .store(tick.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}
