//! One shared DC initiator: its QP, its send CQ, and behind ONE lock (this
//! DCI's, never the engine's) its credit account, the VQPs bound to it and
//! its snapshot of the owned MRs.
//!
//! # Locking
//!
//! Lock order: a DCI's lock, then a VQP's lock. Posting and completion
//! routing run under the DCI's lock; they take a VQP's lock only briefly
//! (slot table, completion ring), never while polling for another VQP.
//! Nothing here takes an engine-wide lock.
//!
//! # Invariants
//!
//! - Every WR on the QP was recorded in `credits` (in posting order) and, with
//!   a physical wr_id `(vqp, seq)`, in that VQP's slot table, before the lock
//!   was released.
//! - A polled completion retires, in order, every physical WR up to its own
//!   ([`SendQueueCredits::complete`]); each is delivered to its VQP once:
//!   to the VQP's ring when the user signaled it or it failed, silently
//!   otherwise.
//! - After an error completion the DCI is in ERR: the engine collects the
//!   flushes (bounded), resets the QP, reports whatever was still outstanding
//!   as `WR_FLUSH_ERR` to its owner, and brings the QP back to RTS, so the
//!   pool keeps working. (Re-posting flushed WRs is a later step.)

use super::idhash::IdMap;
use std::sync::Arc;
use std::time::Instant;

use krcore_nic::{
    bring_up, Access, CompletionQueue, Destination, Nic, QpCaps, QpInit, QpType, QueuePair,
    SendFlags, SendWr, Transition, Wc, WcStatus,
};
use parking_lot::Mutex;

use super::error::{EngineError, VqpError};
use super::mrs::{AnyMr, MrSnapshot};
use super::vqp::{VqpShared, VqpState};
use super::EngineInner;
use crate::credits::SendQueueCredits;
use crate::dccache::DcCache;
use crate::precheck::{Plan, Precheck, Transport};
use crate::wrid::{PhysWrId, VqpId};

/// Completions polled per CQ poll call.
const POLL_BATCH: usize = 32;

/// Statistics of one DCI (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DciStats {
    /// Doorbells rung (accepted `post_send` calls).
    pub doorbells: u64,
    /// WRs posted.
    pub wrs: u64,
    /// WRs the engine forced signaled (pre-check (c)).
    pub forced_signals: u64,
    /// Batches rejected by the pre-check.
    pub rejected: u64,
    /// Completions polled from the CQ.
    pub completions: u64,
    /// Error completions polled (flushes included).
    pub error_completions: u64,
    /// Completions matching no outstanding WR (stale after a reset).
    pub stale_completions: u64,
    /// Completions for VQPs that no longer exist.
    pub orphaned: u64,
    /// Times the DCI was reset and brought up again after ERR.
    pub recoveries: u64,
    /// WRs still outstanding at a reset, reported flushed by the engine.
    pub flushed_by_reset: u64,
}

pub(crate) struct DciState {
    credits: SendQueueCredits,
    vqps: IdMap<VqpId, Arc<VqpShared>>,
    mr_generation: u64,
    mrs: MrSnapshot,
    needs_recovery: bool,
    stats: DciStats,
    /// Any instant: the `now` handed to the pre-check when the VQP knows no
    /// grants (nothing can expire then).
    epoch: Instant,
}

pub(crate) struct Dci<N: Nic> {
    pub(crate) index: usize,
    qp: N::Qp,
    cq: N::Cq,
    state: Mutex<DciState>,
}

impl<N: Nic> std::fmt::Debug for Dci<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dci")
            .field("index", &self.index)
            .field("qpn", &self.qp.qpn())
            .finish()
    }
}

impl<N: Nic> Dci<N> {
    /// Creates a DCI with a CQ of its own, brought up to RTS.
    pub(crate) fn create(eng: &EngineInner<N>, index: usize) -> Result<Dci<N>, EngineError> {
        let depth = eng.cfg.dci_depth;
        // Every CQE retires at least one WR, and a WR holds its credit until
        // its CQE (or a later one) is polled: at most `depth` CQEs wait.
        let cq = eng
            .nic
            .create_cq(depth)
            .map_err(EngineError::nic("create a DCI's CQ"))?;
        let qp = eng
            .nic
            .create_qp(
                &eng.pd,
                &QpInit {
                    qp_type: QpType::Dci,
                    caps: QpCaps {
                        max_send_wr: depth,
                        max_recv_wr: 0,
                        max_send_sge: eng.policy.max_sge as u32,
                        max_recv_sge: 0,
                    },
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    dc_key: 0,
                },
            )
            .map_err(EngineError::nic("create a DCI"))?;
        bring_up(&qp, Access::NONE, None).map_err(EngineError::nic("bring up a DCI"))?;
        Ok(Dci {
            index,
            qp,
            cq,
            state: Mutex::new(DciState {
                credits: SendQueueCredits::new(depth),
                vqps: IdMap::default(),
                epoch: Instant::now(),
                mr_generation: u64::MAX,
                mrs: MrSnapshot::default(),
                needs_recovery: false,
                stats: DciStats::default(),
            }),
        })
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    pub(crate) fn attach(&self, vqp: Arc<VqpShared>) {
        self.state.lock().vqps.insert(vqp.id, vqp);
    }

    pub(crate) fn detach(&self, id: VqpId) {
        self.state.lock().vqps.remove(&id);
    }

    pub(crate) fn stats(&self) -> DciStats {
        self.state.lock().stats
    }

    /// Posts `wrs` for `vqp` as one doorbell (see [`crate::engine::Vqp::post_send`]).
    pub(crate) fn post(
        &self,
        eng: &EngineInner<N>,
        vqp: &VqpShared,
        wrs: &mut [SendWr],
    ) -> Result<(), VqpError> {
        let n = wrs.len();
        let mut st = self.state.lock();
        if st.needs_recovery {
            self.recover(eng, &mut st)?;
        }
        if eng.cfg.precheck {
            let generation = eng.mrs.generation();
            if generation != st.mr_generation {
                (st.mr_generation, st.mrs) = eng.mrs.snapshot();
            }
        }
        let plan = {
            let mut v = vqp.state.lock();
            if !v.has_room(n) {
                // Completions already in the CQ may free the VQP's slots.
                drop(v);
                self.drain(eng, &mut st)?;
                v = vqp.state.lock();
                if !v.has_room(n) {
                    return Err(VqpError::VqpFull {
                        vqp: vqp.id,
                        outstanding: v.occupied(),
                        requested: n,
                        capacity: v.slots.capacity(),
                    });
                }
            }
            let target = v
                .target
                .ok_or(VqpError::NotConnected { vqp: vqp.id })?
                .target;
            for wr in wrs.iter_mut() {
                wr.dest = Destination::Dc(target);
            }
            let planned = self.plan(eng, &st, &v, wrs);
            if planned.is_err() {
                st.stats.rejected += 1;
            }
            planned?
        };
        if plan.must_reclaim() {
            self.reclaim(eng, &mut st, n)?;
        }
        let mut v = vqp.state.lock();
        let first = v.slots.next_seq();
        let (occupied, capacity) = (v.occupied(), v.slots.capacity());
        for wr in wrs.iter_mut() {
            // Room was checked under this DCI's lock, which every poster of
            // this VQP holds: the push cannot fail.
            let seq = v
                .slots
                .push(wr.wr_id, wr.is_signaled())
                .map_err(|_| VqpError::VqpFull {
                    vqp: vqp.id,
                    outstanding: occupied,
                    requested: n,
                    capacity,
                })?;
            wr.wr_id = PhysWrId::new(vqp.id, seq).raw();
        }
        plan.apply(wrs);
        let result = self.qp.post_send(wrs);
        let posted = match &result {
            Ok(()) => n,
            Err(e) => e.index.min(n),
        };
        let accounted = st.credits.post_wrs(&wrs[..posted]);
        // Give the caller its WRs back as it wrote them (dest aside).
        for (i, wr) in wrs.iter_mut().enumerate() {
            if let Some(slot) = v.slots.get(first + i as u64) {
                wr.wr_id = slot.user_wr_id;
                if !slot.user_signaled {
                    wr.flags = SendFlags(wr.flags.0 & !SendFlags::SIGNALED.0);
                }
            }
        }
        v.slots.unpush((n - posted) as u32);
        drop(v);
        if posted > 0 {
            st.stats.doorbells += 1;
            st.stats.wrs += posted as u64;
            st.stats.forced_signals += u64::from(plan.force_signal.is_some_and(|i| i < posted));
        }
        if let Err(e) = accounted {
            // Our account and the NIC disagree: start over from a reset.
            st.needs_recovery = true;
            return Err(e.into());
        }
        result.map_err(VqpError::Post)
    }

    fn plan(
        &self,
        eng: &EngineInner<N>,
        st: &DciState,
        v: &VqpState,
        wrs: &[SendWr],
    ) -> Result<Plan, VqpError> {
        // Grants are the only thing that expires: read the clock only when
        // the VQP knows some (a clock read per post is measurable).
        let now = if v.grants.is_empty() {
            st.epoch
        } else {
            Instant::now()
        };
        let queue = st.credits.view();
        if eng.cfg.precheck {
            Precheck {
                transport: Transport::Dc,
                peer: None,
                local_mrs: &st.mrs,
                grants: &v.grants,
                now,
                queue,
                policy: eng.policy,
            }
            .check(wrs)
            .map_err(VqpError::from)
        } else {
            Precheck {
                transport: Transport::Dc,
                peer: None,
                local_mrs: &AnyMr,
                grants: &v.grants,
                now,
                queue,
                policy: eng.policy,
            }
            .plan_unvalidated(wrs)
            .map_err(VqpError::from)
        }
    }

    /// Polls until `n` credits are free, bounded by the reclaim timeout.
    fn reclaim(&self, eng: &EngineInner<N>, st: &mut DciState, n: usize) -> Result<(), VqpError> {
        let start = Instant::now();
        loop {
            self.drain(eng, st)?;
            if st.credits.free() as usize >= n {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited > eng.cfg.reclaim_timeout {
                return Err(VqpError::QueueBusy {
                    free: st.credits.free(),
                    requested: n,
                    waited,
                });
            }
            std::thread::yield_now();
        }
    }

    /// Drains the CQ under this DCI's lock and routes every completion.
    pub(crate) fn drain_locked(&self, eng: &EngineInner<N>) -> Result<usize, VqpError> {
        let mut st = self.state.lock();
        self.drain(eng, &mut st)
    }

    /// Polls the CQ until it is empty, routing each completion; recovers the
    /// DCI if one of them was an error.
    fn drain(&self, eng: &EngineInner<N>, st: &mut DciState) -> Result<usize, VqpError> {
        let mut buf = [Wc::default(); POLL_BATCH];
        let mut total = 0;
        loop {
            let k = self
                .cq
                .poll(&mut buf)
                .map_err(VqpError::nic("poll a DCI's CQ"))?;
            for wc in &buf[..k] {
                route(&eng.cache, st, wc);
            }
            total += k;
            if k < buf.len() {
                break;
            }
        }
        if st.needs_recovery {
            self.recover(eng, st)?;
        }
        Ok(total)
    }

    /// Brings a DCI that reported an error back to RTS (see the module docs).
    fn recover(&self, eng: &EngineInner<N>, st: &mut DciState) -> Result<(), VqpError> {
        let mut buf = [Wc::default(); POLL_BATCH];
        let start = Instant::now();
        // The NIC flushes every outstanding WR; collect those completions so
        // their owners see them, for a bounded time.
        while st.credits.outstanding() > 0 && start.elapsed() < eng.cfg.flush_timeout {
            let k = self
                .cq
                .poll(&mut buf)
                .map_err(VqpError::nic("poll a DCI's CQ"))?;
            for wc in &buf[..k] {
                route(&eng.cache, st, wc);
            }
            if k == 0 {
                std::thread::yield_now();
            }
        }
        self.qp
            .modify(Transition::Reset)
            .map_err(VqpError::nic("reset a DCI"))?;
        let DciState {
            credits,
            vqps,
            stats,
            ..
        } = st;
        for (_, posted) in credits.reset() {
            stats.flushed_by_reset += 1;
            deliver(&eng.cache, vqps, posted.wr_id, WcStatus::WrFlushErr, None);
        }
        // Completions of the old incarnation still in the CQ match nothing.
        loop {
            let k = self
                .cq
                .poll(&mut buf)
                .map_err(VqpError::nic("poll a DCI's CQ"))?;
            stats.stale_completions += k as u64;
            if k < buf.len() {
                break;
            }
        }
        bring_up(&self.qp, Access::NONE, None).map_err(VqpError::nic("bring up a DCI"))?;
        st.needs_recovery = false;
        st.stats.recoveries += 1;
        Ok(())
    }
}

/// Applies one polled completion: credits the shared queue and delivers
/// every WR it retires to its VQP.
fn route(cache: &DcCache, st: &mut DciState, wc: &Wc) {
    let DciState {
        credits,
        vqps,
        stats,
        needs_recovery,
        ..
    } = st;
    stats.completions += 1;
    if !wc.status.is_ok() {
        stats.error_completions += 1;
        // The QP is in ERR now (verbs: any error completion).
        *needs_recovery = true;
    }
    let retired = match credits.complete_wr_id(PhysWrId::from_raw(wc.wr_id), wc.status) {
        Ok(r) => r,
        Err(_) => {
            stats.stale_completions += 1;
            return;
        }
    };
    // Delivering a WR retires every earlier WR of its VQP (they completed
    // silently before it), so only the last WR of each run of one VQP's WRs
    // needs a delivery: one map lookup and one VQP lock per run, not per WR.
    let len = retired.len();
    let mut run: Option<(PhysWrId, usize)> = None;
    for (i, (_, posted)) in retired.enumerate() {
        let wr = posted.wr_id;
        if let Some((prev, n)) = run {
            if prev.vqp() != wr.vqp() {
                if !deliver(cache, vqps, prev, WcStatus::Success, None) {
                    stats.orphaned += n as u64;
                }
                run = None;
            }
        }
        run = Some((wr, run.map_or(1, |(_, n)| n + 1)));
        if i + 1 == len {
            if let Some((last, n)) = run.take() {
                if !deliver(cache, vqps, last, wc.status, Some(wc)) {
                    stats.orphaned += n as u64;
                }
            }
        }
    }
}

/// Retires one physical WR in its VQP's slot table and, when the user asked
/// for a completion or the WR failed, pushes the user's completion to the
/// VQP's ring. Returns false when the VQP is gone or does not know the WR.
fn deliver(
    cache: &DcCache,
    vqps: &IdMap<VqpId, Arc<VqpShared>>,
    wr: PhysWrId,
    status: WcStatus,
    wc: Option<&Wc>,
) -> bool {
    let Some(vqp) = vqps.get(&wr.vqp()) else {
        return false;
    };
    let mut guard = vqp.state.lock();
    let VqpState {
        slots,
        ring,
        target,
        ..
    } = &mut *guard;
    let Some(seq) = slots.resolve(wr.wire_seq()) else {
        return false;
    };
    let Ok(retired) = slots.retire_through(seq) else {
        return false;
    };
    for (s, slot) in retired {
        // Earlier slots of this VQP (none, when completions come in order)
        // completed silently before this one.
        let status = if s == seq { status } else { WcStatus::Success };
        if slot.user_signaled || !status.is_ok() {
            ring.push_back(Wc {
                wr_id: slot.user_wr_id,
                status,
                opcode: wc.map(|w| w.opcode).unwrap_or_default(),
                byte_len: wc.map_or(0, |w| w.byte_len),
                imm: None,
                qp_num: vqp.id.get(),
                src_qp: 0,
            });
        }
    }
    if matches!(status, WcStatus::RemAccessErr | WcStatus::RetryExcErr) {
        // The target refused us (stale dc_key, vanished MR) or is gone: its
        // cached metadata may be stale. The VQP must connect again.
        if let Some(t) = target.take() {
            cache.invalidate(&t.target.gid);
        }
    }
    true
}
