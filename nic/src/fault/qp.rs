//! The queue-pair side of the fault wrapper: chooses WRs to fail, forces
//! ERR, and accounts send-queue credits by what the user has polled.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Ctl, FaultCq, Rng};
use crate::error::{PostError, PostErrorKind, Result};
use crate::provider::{Nic, QueuePair};
use crate::types::{
    Destination, Gid, QpState, QpType, RecvWr, RemoteAddr, SendWr, Transition, Wc, WcStatus, WrOp,
};

/// A WR the inner QP holds a slot for.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    wr_id: u64,
    /// The status to report if the inner provider fails it (a WR this
    /// wrapper redirected).
    rewrite: Option<WcStatus>,
}

#[derive(Debug)]
struct QpState_ {
    rng: Rng,
    /// The connected peer (RC), from the RTR transition.
    peer: Option<Gid>,
    /// Posted WRs whose slot the user has not had credited yet, in order.
    outstanding: VecDeque<Outstanding>,
    /// Posted WRs not yet handed to the inner QP (a stalled node's, and
    /// every later one), in order, as the inner QP is to get them.
    held: VecDeque<SendWr>,
}

/// The node `wr` goes to on a QP of type `qp_type` connected to `peer`.
fn destination(wr: &SendWr, qp_type: QpType, peer: Option<Gid>) -> Option<Gid> {
    match (&wr.dest, qp_type) {
        (Destination::Dc(t), _) => Some(t.gid),
        (Destination::Connected, QpType::Rc) => peer,
        _ => None,
    }
}

pub(super) struct QpShared<N: Nic> {
    inner: N::Qp,
    ctl: Arc<Ctl<N>>,
    /// Send and receive CQs (to mark old-incarnation completions at reset).
    cqs: [FaultCq<N>; 2],
    st: Mutex<QpState_>,
}

impl<N: Nic> QpShared<N> {
    /// Hands the held WRs to the inner QP, in order, up to the first one
    /// whose node is still stalled (all of them with `force`: the inner QP
    /// is in ERR and flushes them). A WR the inner QP refuses is dropped
    /// from the wrapper's account as well (no completion will come).
    pub(super) fn release(&self, force: bool) {
        let mut st = self.st.lock();
        self.release_locked(&mut st, force);
    }

    fn release_locked(&self, st: &mut QpState_, force: bool) {
        if st.held.is_empty() {
            return;
        }
        let (qp_type, peer) = (self.inner.qp_type(), st.peer);
        let n = if force || self.inner.state() == QpState::Err {
            st.held.len()
        } else {
            st.held
                .iter()
                .position(|w| {
                    destination(w, qp_type, peer).is_some_and(|g| self.ctl.is_stalled(&g))
                })
                .unwrap_or(st.held.len())
        };
        if n == 0 {
            return;
        }
        let run: Vec<SendWr> = st.held.drain(..n).collect();
        self.ctl.held.fetch_sub(n as u64, Relaxed);
        if let Err(e) = self.inner.post_send(&run) {
            // Refused from `e.index` on: those never complete.
            for wr in run.get(e.index..).unwrap_or_default() {
                if let Some(at) = st.outstanding.iter().position(|o| o.wr_id == wr.wr_id) {
                    st.outstanding.remove(at);
                }
            }
        }
    }

    /// Credits the slots up to the WR `wc` completes and rewrites its status
    /// if this wrapper made it fail.
    pub(super) fn on_send_completion(&self, wc: &mut Wc) {
        let mut st = self.st.lock();
        let Some(at) = st.outstanding.iter().position(|o| o.wr_id == wc.wr_id) else {
            return;
        };
        let o = st.outstanding[at];
        st.outstanding.drain(..=at);
        if let Some(status) = o.rewrite {
            if !wc.status.is_ok() && wc.status != WcStatus::WrFlushErr {
                wc.status = status;
            }
        }
    }
}

impl<N: Nic> Drop for QpShared<N> {
    fn drop(&mut self) {
        let qpn = self.inner.qpn();
        let mut qps = self.ctl.qps.lock();
        if qps.get(&qpn).is_some_and(|w| w.strong_count() == 0) {
            qps.remove(&qpn);
        }
    }
}

/// A queue pair of a [`super::FaultNic`].
pub struct FaultQp<N: Nic> {
    s: Arc<QpShared<N>>,
}

impl<N: Nic> Clone for FaultQp<N> {
    fn clone(&self) -> Self {
        FaultQp { s: self.s.clone() }
    }
}

impl<N: Nic> std::fmt::Debug for FaultQp<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultQp")
            .field("qpn", &self.s.inner.qpn())
            .field("qp_type", &self.s.inner.qp_type())
            .field("outstanding", &self.s.st.lock().outstanding.len())
            .finish()
    }
}

/// A remote address inside no registered region of any provider (mappings
/// never start below 4 KiB), 8-byte aligned for atomics.
const NOWHERE: u64 = 8;

/// The same WR, sent where the inner provider must refuse it.
fn redirect(wr: &SendWr) -> SendWr {
    let mut w = *wr;
    let nowhere = |r: RemoteAddr| RemoteAddr {
        addr: NOWHERE,
        rkey: r.rkey,
    };
    w.op = match wr.op {
        WrOp::Read { remote } => WrOp::Read {
            remote: nowhere(remote),
        },
        WrOp::Write { remote } | WrOp::WriteImm { remote, .. } => WrOp::Write {
            remote: nowhere(remote),
        },
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
        } => WrOp::CompareSwap {
            remote: nowhere(remote),
            compare,
            swap,
        },
        WrOp::FetchAdd { remote, add } => WrOp::FetchAdd {
            remote: nowhere(remote),
            add,
        },
        WrOp::Send | WrOp::SendImm { .. } => WrOp::Write {
            remote: RemoteAddr {
                addr: NOWHERE,
                rkey: 0,
            },
        },
    };
    w
}

impl<N: Nic> FaultQp<N> {
    pub(super) fn new(inner: N::Qp, ctl: Arc<Ctl<N>>, rng: Rng, cqs: [FaultCq<N>; 2]) -> Self {
        let qpn = inner.qpn();
        let s = Arc::new(QpShared {
            inner,
            ctl: ctl.clone(),
            cqs,
            st: Mutex::new(QpState_ {
                rng,
                peer: None,
                outstanding: VecDeque::new(),
                held: VecDeque::new(),
            }),
        });
        ctl.qps.lock().insert(qpn, Arc::downgrade(&s));
        FaultQp { s }
    }

    /// The wrapped QP.
    pub fn inner(&self) -> &N::Qp {
        &self.s.inner
    }

    /// Moves the QP to ERR now (outside the fault budget), as a link
    /// failure would: outstanding and later WRs flush.
    ///
    /// # Errors
    /// The inner provider's `modify` errors.
    pub fn force_err(&self) -> Result<()> {
        self.s.inner.modify(Transition::Err)?;
        self.s.release(true);
        self.s.ctl.stats.forced_errs.fetch_add(1, Relaxed);
        Ok(())
    }

    /// The status `wr` should fail with, if any.
    fn choose_failure(&self, st: &mut QpState_, wr: &SendWr) -> Option<WcStatus> {
        let ctl = &self.s.ctl;
        let qp_type = self.s.inner.qp_type();
        if qp_type == QpType::Ud {
            return None;
        }
        let dest = destination(wr, qp_type, st.peer);
        if dest.is_some_and(|g| ctl.is_dropped(&g)) {
            ctl.stats.dropped_wrs.fetch_add(1, Relaxed);
            return Some(WcStatus::RetryExcErr);
        }
        if st.rng.chance(ctl.cfg.fail_ppm) && !ctl.cfg.fail_statuses.is_empty() && ctl.take_fault()
        {
            ctl.stats.failed_wrs.fetch_add(1, Relaxed);
            let i = st.rng.below(ctl.cfg.fail_statuses.len() as u64) as usize;
            return Some(ctl.cfg.fail_statuses[i]);
        }
        None
    }
}

impl<N: Nic> QueuePair for FaultQp<N> {
    fn qpn(&self) -> u32 {
        self.s.inner.qpn()
    }

    fn qp_type(&self) -> QpType {
        self.s.inner.qp_type()
    }

    fn state(&self) -> QpState {
        self.s.inner.state()
    }

    fn modify(&self, t: Transition) -> Result<()> {
        self.s.inner.modify(t)?;
        match t {
            Transition::Rtr { peer } => self.s.st.lock().peer = peer.map(|p| p.gid),
            Transition::Reset => {
                // The inner QP discarded its outstanding work: what the CQs
                // hold of it now is the old incarnation's (and the held
                // WRs go with it).
                for cq in &self.s.cqs {
                    cq.mark_stale(self.s.inner.qpn())?;
                }
                let mut st = self.s.st.lock();
                st.outstanding.clear();
                let dropped = st.held.len() as u64;
                st.held.clear();
                self.s.ctl.held.fetch_sub(dropped, Relaxed);
            }
            // In ERR the inner QP flushes what it gets.
            Transition::Err => self.s.release(true),
            _ => {}
        }
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        let ctl = &self.s.ctl;
        let mut st = self.s.st.lock();
        if !wrs.is_empty()
            && self.s.inner.state() == QpState::Rts
            && st.rng.chance(ctl.cfg.force_err_ppm)
            && ctl.take_fault()
            && self.s.inner.modify(Transition::Err).is_ok()
        {
            ctl.stats.forced_errs.fetch_add(1, Relaxed);
        }
        // Credits by what the user polled: a held completion keeps its slot.
        let free = (self.s.inner.max_send_wr() as usize).saturating_sub(st.outstanding.len());
        let take = wrs.len().min(free);
        let mut out = Vec::with_capacity(take);
        let mut rewrites = Vec::with_capacity(take);
        for wr in &wrs[..take] {
            match self.choose_failure(&mut st, wr) {
                Some(status) => {
                    out.push(redirect(wr));
                    rewrites.push(Some(status));
                }
                None => {
                    out.push(*wr);
                    rewrites.push(None);
                }
            }
        }
        // A resumed node's held WRs go first; behind a WR still held, or
        // from the first WR to a stalled node on, the doorbell is held.
        self.s.release_locked(&mut st, false);
        let qp_type = self.s.inner.qp_type();
        let direct = if st.held.is_empty() {
            out.iter()
                .position(|w| destination(w, qp_type, st.peer).is_some_and(|g| ctl.is_stalled(&g)))
                .unwrap_or(out.len())
        } else {
            0
        };
        let r = self
            .s
            .inner
            .post_send(out.get(..direct).unwrap_or_default());
        let posted = match &r {
            Ok(()) => {
                let later = out.get(direct..).unwrap_or_default();
                st.held.extend(later.iter().copied());
                let n = later.len() as u64;
                ctl.held.fetch_add(n, Relaxed);
                ctl.stats.stalled_wrs.fetch_add(n, Relaxed);
                take
            }
            Err(e) => e.index.min(direct),
        };
        for (wr, rewrite) in wrs[..posted].iter().zip(&rewrites) {
            st.outstanding.push_back(Outstanding {
                wr_id: wr.wr_id,
                rewrite: *rewrite,
            });
        }
        r?;
        if take < wrs.len() {
            return Err(PostError {
                index: take,
                kind: PostErrorKind::QueueFull {
                    depth: self.s.inner.max_send_wr(),
                },
            });
        }
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        self.s.inner.post_recv(wrs)
    }

    fn send_credits(&self) -> u32 {
        let used = self.s.st.lock().outstanding.len() as u32;
        self.s
            .inner
            .max_send_wr()
            .saturating_sub(used)
            .min(self.s.inner.send_credits())
    }

    fn max_send_wr(&self) -> u32 {
        self.s.inner.max_send_wr()
    }
}
