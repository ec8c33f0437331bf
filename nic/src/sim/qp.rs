//! Sim queue pairs: the state machine, the send queue with its credits, and
//! the driving of posted work (execution lives in `exec`).
//!
//! Send-queue model: every posted WR gets a sequence number `seq`. Executed
//! WRs that need a completion (signaled, or failed, or flushed) push a CQE
//! carrying `seq`; polling it advances the QP's `sq_done` to `seq + 1`, which
//! frees every slot up to it. Free credits are `max_send_wr - (posted -
//! sq_done)`. Sequences never restart (RESET sets `sq_done = posted`), so a
//! stale CQE from before a reset cannot free slots it does not own.
//!
//! Before a doorbell's WRs execute, the remote bytes of each are prefetched
//! into the CPU cache (when the QP's caches already resolve its target and
//! MR), as a NIC's DMA engine keeps several reads of one doorbell in flight:
//! a hint that changes no result, check or counter.
//!
//! Work is executed in order at post time by the posting thread; a SEND that
//! finds no receive buffer (RNR) stays queued and is retried on later posts
//! and polls of the send CQ, every `rnr_interval`, `rnr_retry` times (7 =
//! forever), then fails with `RNR_RETRY_EXC_ERR`. Later WRs wait behind it,
//! as on a real send queue.

use super::cq::{push_cqe, Cqe, Drive};
use super::exec::{Exec, Outcome};
use super::qp_state::{Pending, QpInner, SendState};
use super::recv::{flush_recv_ring, post_recv_ring, RWQE_WORDS};
use super::ring::Ring;
use super::shm::now_ns;
use super::target::TargetCache;
use crate::error::{NicError, PostError, PostErrorKind, Result};
use crate::provider::QueuePair;
use crate::types::*;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Arc;

/// `qp` as the CQ's list of QPs with waiting work holds it.
fn pending_of(qp: &Arc<QpInner>) -> std::sync::Weak<dyn Drive> {
    let qp: Arc<dyn Drive> = qp.clone();
    Arc::downgrade(&qp)
}

impl Drive for QpInner {
    fn drive(self: Arc<Self>) -> bool {
        QpInner::drive(&self)
    }
}

impl QpInner {
    /// Retries waiting work; returns whether work is still waiting. Called by
    /// polling the send CQ (never blocks on the send lock).
    pub(crate) fn drive(self: &Arc<Self>) -> bool {
        match self.send.try_lock() {
            Some(mut st) => {
                self.progress(&mut st);
                let waiting = !st.pending.is_empty();
                st.on_cq_pending_list = waiting;
                waiting
            }
            None => true,
        }
    }

    fn complete(&self, st: &mut SendState, wr: &SendWr, seq: u64, status: WcStatus, byte_len: u32) {
        let visible_at = self.visible_at(st, wr, byte_len);
        push_cqe(
            &self.send_cq.inner.seg,
            &Cqe {
                wr_id: wr.wr_id,
                sq_seq: Some(seq),
                visible_at,
                byte_len,
                imm: None,
                qpn: self.qpn,
                src_qp: 0,
                status,
                opcode: wr.op.wc_opcode(),
            },
        );
    }

    /// Modeled completion time of `wr` (0 without a latency model).
    fn visible_at(&self, st: &mut SendState, wr: &SendWr, bytes: u32) -> u64 {
        let Some(m) = &self.node.config.latency else {
            return 0;
        };
        let base = match wr.op {
            WrOp::Read { .. } => m.read_ns,
            WrOp::Write { .. } | WrOp::WriteImm { .. } => m.write_ns,
            WrOp::Send | WrOp::SendImm { .. } => m.send_ns,
            WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => m.atomic_ns,
        };
        let gap = if self.qp_type == QpType::Dci {
            m.dc_gap_ns
        } else {
            m.rc_gap_ns
        };
        let t = now_ns() + base + (bytes as f64 / m.bytes_per_ns) as u64;
        let v = t.max(st.last_visible + gap);
        st.last_visible = v;
        v
    }

    fn flush_pending(&self, st: &mut SendState) {
        while let Some(p) = st.pending.pop_front() {
            self.complete(st, &p.wr, p.seq, WcStatus::WrFlushErr, 0);
        }
    }

    /// Executes queued WRs in order until one must wait (RNR) or all ran.
    pub(crate) fn progress(self: &Arc<Self>, st: &mut SendState) {
        while !st.pending.is_empty() {
            if self.state() == QpState::Err {
                self.flush_pending(st);
                break;
            }
            let now_if_blocked = {
                let p = &st.pending[0];
                if p.next_try_ns != 0 {
                    let now = now_ns();
                    if now < p.next_try_ns {
                        break;
                    }
                    now
                } else {
                    0
                }
            };
            let wr = st.pending[0].wr;
            let outcome = Exec { qp: self, st }.run(&wr);
            match outcome {
                Outcome::Done { status, byte_len } => {
                    let Some(p) = st.pending.pop_front() else {
                        break;
                    };
                    self.finish(st, &p.wr, p.seq, status, byte_len);
                }
                Outcome::ReceiverNotReady => {
                    let interval = self.node.config.rnr_interval.as_nanos() as u64;
                    let rnr_retry = st.rnr_retry;
                    let p = &mut st.pending[0];
                    if p.next_try_ns == 0 {
                        p.next_try_ns = now_ns() + interval;
                    } else {
                        p.rnr_tries += 1;
                        p.next_try_ns = now_if_blocked + interval;
                        if rnr_retry != 7 && p.rnr_tries > rnr_retry as u32 {
                            let Some(p) = st.pending.pop_front() else {
                                break;
                            };
                            if self.entry().force_err() {
                                st.c.state_changes += 1;
                            }
                            self.complete(st, &p.wr, p.seq, WcStatus::RnrRetryExcErr, 0);
                            continue;
                        }
                    }
                    if !st.on_cq_pending_list {
                        st.on_cq_pending_list = true;
                        self.send_cq.add_pending(pending_of(self));
                    }
                    break;
                }
            }
        }
    }

    /// Completes an executed WR: a completion when signaled or failed; a
    /// failure moves the QP to ERR and flushes its receive queue.
    fn finish(&self, st: &mut SendState, wr: &SendWr, seq: u64, status: WcStatus, byte_len: u32) {
        if status == WcStatus::Success {
            if wr.is_signaled() {
                self.complete(st, wr, seq, status, byte_len);
            }
        } else {
            if self.entry().force_err() {
                st.c.state_changes += 1;
            }
            self.complete(st, wr, seq, status, byte_len);
            self.flush_rq();
        }
    }

    /// Queues a WR that found no receive buffer for RNR retries.
    fn wait_rnr(self: &Arc<Self>, st: &mut SendState, wr: &SendWr, seq: u64) {
        st.pending.push_back(Pending {
            wr: *wr,
            seq,
            rnr_tries: 0,
            next_try_ns: now_ns() + self.node.config.rnr_interval.as_nanos() as u64,
        });
        if !st.on_cq_pending_list {
            st.on_cq_pending_list = true;
            self.send_cq.add_pending(pending_of(self));
        }
    }

    /// Flushes the QP's own receive queue after it entered ERR: every posted
    /// receive completes with `WR_FLUSH_ERR` on the receive CQ.
    pub(crate) fn flush_rq(&self) {
        if let Some((seg, _)) = &self.rq {
            flush_recv_ring(seg, &self.recv_cq.inner.seg, self.qpn);
        }
    }
}

/// A queue pair of a sim node.
#[derive(Clone)]
pub struct SimQp {
    pub(crate) inner: Arc<QpInner>,
}

impl std::fmt::Debug for SimQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimQp")
            .field("qpn", &format_args!("{:#x}", self.inner.qpn))
            .field("type", &self.inner.qp_type)
            .field("state", &self.inner.state())
            .finish()
    }
}

impl SimQp {
    fn bad(index: usize, kind: PostErrorKind) -> PostError {
        PostError { index, kind }
    }

    /// Checks what a NIC driver checks while building a WQE (EINVAL).
    fn validate(&self, index: usize, wr: &SendWr) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        crate::provider::validate_send_wr(q.qp_type, &q.caps, &q.node.caps, wr)
            .map_err(|s| Self::bad(index, PostErrorKind::Malformed(s)))
    }

    fn credits(&self, st: &SendState) -> u32 {
        let done = self.inner.entry().sq_done().load(Acquire);
        let used = st.posted.saturating_sub(done);
        (self.inner.caps.max_send_wr as u64).saturating_sub(used) as u32
    }
}

impl QueuePair for SimQp {
    fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    fn state(&self) -> QpState {
        self.inner.state()
    }

    fn max_send_wr(&self) -> u32 {
        self.inner.caps.max_send_wr
    }

    fn send_credits(&self) -> u32 {
        let st = self.inner.send.lock();
        self.credits(&st)
    }

    fn modify(&self, t: Transition) -> Result<()> {
        let q = &self.inner;
        let e = q.entry();
        let mut st = q.send.lock();
        let from = e.state_word().state;
        let qt = q.qp_type;
        let invalid = |to| {
            Err(NicError::InvalidTransition {
                qp_type: qt,
                from,
                to,
            })
        };
        let moved = match t {
            Transition::Init { access, qkey } => {
                if from != QpState::Reset {
                    return invalid(QpState::Init);
                }
                e.set_access_qkey(access, qkey);
                e.cas_state(QpState::Reset, QpState::Init)
            }
            Transition::Rtr { peer } => {
                if from != QpState::Init {
                    return invalid(QpState::Rtr);
                }
                match (qt, peer) {
                    (QpType::Rc, Some(p)) => {
                        e.set_peer(p.gid, p.qpn);
                        st.peer = Some(p);
                        q.node.charge(|m| m.rc_connect_ns);
                    }
                    (QpType::Rc, None) => {
                        return Err(NicError::InvalidArgument(
                            "an RC QP needs the remote GID and QPN at RTR".into(),
                        ))
                    }
                    (_, Some(_)) => {
                        return Err(NicError::InvalidArgument(format!(
                            "a {qt:?} QP takes no remote peer at RTR"
                        )))
                    }
                    (_, None) => {}
                }
                e.cas_state(QpState::Init, QpState::Rtr)
            }
            Transition::Rts { rnr_retry, .. } => {
                if from != QpState::Rtr || qt == QpType::Dct {
                    return invalid(QpState::Rts);
                }
                st.rnr_retry = rnr_retry.min(7);
                e.cas_state(QpState::Rtr, QpState::Rts)
            }
            Transition::Reset => {
                // Outstanding work is discarded without completions; every
                // slot becomes free.
                st.pending.clear();
                e.sq_done().fetch_max(st.posted, AcqRel);
                if let Some((seg, _)) = &q.rq {
                    let ring = Ring::attach(seg, 0, RWQE_WORDS);
                    let mut buf = [0u64; RWQE_WORDS - 1];
                    while ring.pop(&mut buf) {}
                }
                st.peer = None;
                st.last_dc = None;
                st.target = TargetCache::default();
                loop {
                    let cur = e.state_word().state;
                    if cur == QpState::Reset || e.cas_state(cur, QpState::Reset) {
                        break;
                    }
                }
                true
            }
            Transition::Err => {
                e.force_err();
                q.flush_pending(&mut st);
                q.flush_rq();
                true
            }
        };
        if !moved {
            // A remote peer moved the QP to ERR concurrently.
            return invalid(e.state_word().state);
        }
        q.node.counters.state_changes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let mut st = q.send.lock();
        let state = q.state();
        if !matches!(state, QpState::Rts | QpState::Err) {
            return Err(Self::bad(0, PostErrorKind::BadState(state)));
        }
        let mut result = Ok(());
        let mut n = 0;
        // Fast path: with nothing queued on an RTS QP, execute each WR
        // straight from the caller's slice (no copy into the queue).
        let mut direct = state == QpState::Rts && st.pending.is_empty();
        // Free slots are read once per doorbell and re-read only when they
        // run out (a concurrent poll may have freed some meanwhile).
        let mut free = self.credits(&st);
        if direct {
            // Read ahead for the whole doorbell first (see `Exec::prefetch`).
            let ex = Exec { qp: q, st: &mut st };
            for wr in wrs {
                ex.prefetch(wr);
            }
        }
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.validate(i, wr) {
                result = Err(e);
                break;
            }
            if free == 0 {
                free = self.credits(&st);
            }
            if free == 0 {
                result = Err(Self::bad(
                    i,
                    PostErrorKind::QueueFull {
                        depth: q.caps.max_send_wr,
                    },
                ));
                break;
            }
            free -= 1;
            let seq = st.posted;
            st.posted += 1;
            n += 1;
            if direct {
                match (Exec { qp: q, st: &mut st }).run(wr) {
                    Outcome::Done { status, byte_len } => {
                        q.finish(&mut st, wr, seq, status, byte_len);
                        direct = status == WcStatus::Success;
                    }
                    Outcome::ReceiverNotReady => {
                        q.wait_rnr(&mut st, wr, seq);
                        direct = false;
                    }
                }
            } else {
                st.pending.push_back(Pending {
                    wr: *wr,
                    seq,
                    rnr_tries: 0,
                    next_try_ns: 0,
                });
            }
        }
        if n > 0 {
            st.c.doorbells += 1;
            st.c.send_wrs += n;
            if !st.pending.is_empty() {
                q.progress(&mut st);
            }
        }
        result
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        let state = q.state();
        let Some((seg, _)) = &q.rq else {
            return Err(Self::bad(
                0,
                PostErrorKind::Malformed(match q.qp_type {
                    QpType::Dci => "a DCI has no receive queue",
                    _ => "this QP receives from an SRQ (or was created with max_recv_wr 0)",
                }),
            ));
        };
        if state == QpState::Reset {
            return Err(Self::bad(0, PostErrorKind::BadState(state)));
        }
        let r = post_recv_ring(seg, wrs, q.caps.max_recv_sge.max(1));
        let posted = r.as_ref().map(|_| wrs.len()).unwrap_or_else(|e| e.index);
        q.node.counters.recv_wrs.fetch_add(posted as u64, Relaxed);
        if q.state() == QpState::Err {
            q.flush_rq();
        }
        r
    }
}

impl SimQp {
    /// Convenience for tests and tools: a CQ-independent view of how many
    /// posted WRs have not been executed yet (waiting on RNR).
    pub fn waiting_wrs(&self) -> usize {
        self.inner.send.lock().pending.len()
    }
}
