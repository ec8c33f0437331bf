//! Queue pairs: creation, the state machine through `ibv_modify_qp`, receive
//! posting and the send-queue ring that enforces credits.
//!
//! Send-queue model (the same as the sim's): every posted WR gets a sequence
//! number `seq`, which is the `wr_id` the device sees; the caller's `wr_id`
//! and the WR's opcode wait in the send ring (`ring`, a slot per sequence
//! modulo a power of two >= `max_send_wr`, written under the send lock and
//! read by pollers without it). Polling a send completion for `seq` returns
//! the caller's `wr_id` and advances `sq_done` to `seq + 1`, freeing every
//! slot before it (unsignaled WRs included). Credits are
//! `max_send_wr - (posted - sq_done)`.
//!
//! Sequences are never reused on a send CQ: they never restart within a
//! QP, and a QP starts at its send CQ's floor, past every sequence of the
//! QPs destroyed before it (whose numbers the device may reuse), see `cq`.
//! RESET sets `sq_done = posted` and drops the ring (under the send CQ's
//! poll lock): a completion left in the CQ from before the reset is
//! dropped and frees nothing, as the contract's "discarded without
//! completions" says.

use super::device::DeviceInner;
use super::device::QpCounters;
use super::error::VerbsError;
use super::ffi::{self, sys};
use super::mr::VerbsPd;
use super::post_recv::{self, RecvTarget};
use super::qp_state::QpInner;
use super::VerbsNic;
use crate::error::{NicError, PostError, PostErrorKind, Result};
use crate::provider::{QpInit, QueuePair};
use crate::types::*;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// A queue pair of a verbs device.
#[derive(Clone)]
pub struct VerbsQp {
    pub(crate) inner: Arc<QpInner>,
}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &format_args!("{:#x}", self.inner.qpn))
            .field("type", &self.inner.qp_type)
            .finish()
    }
}

fn check_caps(dev: &DeviceInner, t: QpType, caps: &QpCaps) -> Result<()> {
    let max_wr = dev.caps.max_qp_wr;
    if t != QpType::Dct && (caps.max_send_wr == 0 || caps.max_send_wr > max_wr) {
        return Err(NicError::InvalidArgument(format!(
            "max_send_wr {} outside 1..={max_wr}",
            caps.max_send_wr
        )));
    }
    let max_sge = dev.caps.max_sge;
    if caps.max_recv_wr > max_wr || caps.max_send_sge > max_sge || caps.max_recv_sge > max_sge {
        return Err(NicError::InvalidArgument(format!(
            "QP caps out of range (max {max_wr} WRs, {max_sge} SGEs)"
        )));
    }
    Ok(())
}

impl VerbsQp {
    pub(crate) fn create(pd: &VerbsPd, init: &QpInit<'_, VerbsNic>) -> Result<VerbsQp> {
        let dev = &pd.inner.dev;
        let t = init.qp_type;
        init.send_cq.check_device(dev)?;
        init.recv_cq.check_device(dev)?;
        if let Some(srq) = init.srq {
            srq.check_device(dev)?;
        }
        check_caps(dev, t, &init.caps)?;
        if t == QpType::Dct && init.srq.is_none() {
            return Err(NicError::InvalidArgument("a DCT needs an SRQ".into()));
        }
        let caps = init.caps;
        let has_rq = init.srq.is_none() && t != QpType::Dci && caps.max_recv_wr > 0;
        let (qp, dc) = match t {
            QpType::Rc | QpType::Ud => (Self::create_std(pd, init, has_rq)?, None),
            QpType::Dci | QpType::Dct => {
                let Some(dcs) = &dev.dc else {
                    return Err(NicError::Unsupported(
                        "DC transport (this device has no DC support)",
                    ));
                };
                dcs.create(pd, init)?
            }
        };
        // SAFETY: `qp` is the valid QP just created.
        let qpn = unsafe { (*qp).qp_num };
        let max_send_wr = caps.max_send_wr.max(1);
        let shared = init.send_cq.inner.poll.lock().register(qpn, max_send_wr);
        {
            let mut qps = dev.qps.lock();
            qps.retain(|w| w.strong_count() > 0);
            let counted: Arc<dyn QpCounters> = shared.clone();
            qps.push(Arc::downgrade(&counted));
        }
        dev.counters.qps_created.fetch_add(1, Relaxed);
        Ok(VerbsQp {
            inner: Arc::new(QpInner {
                qp,
                qpn,
                qp_type: t,
                caps,
                owner: dev.next_id(),
                has_rq,
                shared,
                dc,
                send_cq: init.send_cq.clone(),
                _recv_cq: init.recv_cq.clone(),
                _srq: init.srq.cloned(),
                pd: pd.inner.clone(),
            }),
        })
    }

    fn create_std(
        pd: &VerbsPd,
        init: &QpInit<'_, VerbsNic>,
        has_rq: bool,
    ) -> Result<*mut sys::ibv_qp> {
        let caps = init.caps;
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: init.send_cq.inner.cq,
            recv_cq: init.recv_cq.inner.cq,
            srq: init.srq.map_or(std::ptr::null_mut(), |s| s.inner.srq),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: if has_rq { caps.max_recv_wr } else { 0 },
                max_send_sge: caps.max_send_sge.max(1),
                max_recv_sge: caps.max_recv_sge.max(1),
                max_inline_data: pd.inner.dev.caps.max_inline,
            },
            qp_type: match init.qp_type {
                QpType::Ud => sys::ibv_qp_type::IBV_QPT_UD,
                _ => sys::ibv_qp_type::IBV_QPT_RC,
            },
            sq_sig_all: 0,
        };
        // SAFETY: valid PD, CQs and SRQ of this device (checked by the
        // caller) and a fully initialised attribute struct.
        let qp = unsafe { sys::ibv_create_qp(pd.inner.pd, &mut attr) };
        if qp.is_null() {
            return Err(VerbsError::from_os("ibv_create_qp", ffi::errno()).into());
        }
        Ok(qp)
    }

    /// The attributes and mask of a transition, or the contract's error.
    fn attrs(&self, t: Transition, from: QpState) -> Result<(sys::ibv_qp_attr, u32, QpState)> {
        let q = &self.inner;
        let dev = &q.pd.dev;
        let qt = q.qp_type;
        let invalid = |to| {
            Err(NicError::InvalidTransition {
                qp_type: qt,
                from,
                to,
            })
        };
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: `ibv_qp_attr` is plain old data; all-zero is a valid value
        // for every field (the mask says which ones the device reads).
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        let to = match t {
            Transition::Init { .. } => QpState::Init,
            Transition::Rtr { .. } => QpState::Rtr,
            Transition::Rts { .. } => QpState::Rts,
            Transition::Reset => QpState::Reset,
            Transition::Err => QpState::Err,
        };
        a.qp_state = ffi::ibv_state(to);
        let mut mask = m::IBV_QP_STATE.0;
        match t {
            Transition::Init { access, qkey } => {
                if from != QpState::Reset {
                    return invalid(QpState::Init);
                }
                a.pkey_index = 0;
                a.port_num = dev.port;
                mask |= m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0;
                match qt {
                    QpType::Ud => {
                        a.qkey = qkey;
                        mask |= m::IBV_QP_QKEY.0;
                    }
                    QpType::Rc | QpType::Dct => {
                        a.qp_access_flags = ffi::access_flags(access);
                        mask |= m::IBV_QP_ACCESS_FLAGS.0;
                    }
                    QpType::Dci => {}
                }
            }
            Transition::Rtr { peer } => {
                if from != QpState::Init {
                    return invalid(QpState::Rtr);
                }
                match (qt, peer) {
                    (QpType::Rc, Some(p)) => {
                        a.path_mtu = dev.active_mtu;
                        a.dest_qp_num = p.qpn;
                        a.rq_psn = ffi::PSN;
                        a.max_dest_rd_atomic = dev.rd_atomic;
                        a.min_rnr_timer = ffi::MIN_RNR_TIMER;
                        a.ah_attr = ffi::ah_attr(p.gid, dev.port, dev.gid_index);
                        mask |= m::IBV_QP_AV.0
                            | m::IBV_QP_PATH_MTU.0
                            | m::IBV_QP_DEST_QPN.0
                            | m::IBV_QP_RQ_PSN.0
                            | m::IBV_QP_MAX_DEST_RD_ATOMIC.0
                            | m::IBV_QP_MIN_RNR_TIMER.0;
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
                    (QpType::Ud, None) => {}
                    (QpType::Dci | QpType::Dct, None) => {
                        // The DC address vector names only our port/GID; the
                        // target comes per WR (DCI), the initiator per packet
                        // (DCT).
                        a.path_mtu = dev.active_mtu;
                        a.ah_attr = ffi::ah_attr(Gid::default(), dev.port, dev.gid_index);
                        mask |= m::IBV_QP_AV.0 | m::IBV_QP_PATH_MTU.0;
                        if qt == QpType::Dct {
                            a.min_rnr_timer = ffi::MIN_RNR_TIMER;
                            mask |= m::IBV_QP_MIN_RNR_TIMER.0;
                        }
                    }
                }
            }
            Transition::Rts {
                rnr_retry,
                retry_cnt,
            } => {
                if from != QpState::Rtr || qt == QpType::Dct {
                    return invalid(QpState::Rts);
                }
                a.sq_psn = ffi::PSN;
                mask |= m::IBV_QP_SQ_PSN.0;
                if qt != QpType::Ud {
                    a.timeout = ffi::ACK_TIMEOUT;
                    a.retry_cnt = retry_cnt.min(7);
                    a.rnr_retry = rnr_retry.min(7);
                    a.max_rd_atomic = dev.rd_atomic;
                    mask |= m::IBV_QP_TIMEOUT.0
                        | m::IBV_QP_RETRY_CNT.0
                        | m::IBV_QP_RNR_RETRY.0
                        | m::IBV_QP_MAX_QP_RD_ATOMIC.0;
                }
            }
            Transition::Reset | Transition::Err => {}
        }
        Ok((a, mask, to))
    }

    /// The state the device reports (ERR after a fault), or the last state
    /// this provider set when the query fails.
    fn query_state(&self) -> Option<QpState> {
        // SAFETY: both structs are plain old data and all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.inner.qp,
                &mut a,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        (rc == 0).then(|| ffi::qp_state(a.qp_state))
    }
}

impl QueuePair for VerbsQp {
    fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    fn state(&self) -> QpState {
        match self.query_state() {
            Some(s) => s,
            None => self.inner.shared.st.lock().state,
        }
    }

    fn max_send_wr(&self) -> u32 {
        self.inner.shared.max_send_wr
    }

    fn send_credits(&self) -> u32 {
        let sh = &self.inner.shared;
        let st = sh.st.lock();
        sh.credits(&st)
    }

    fn modify(&self, t: Transition) -> Result<()> {
        let q = &self.inner;
        let sh = &q.shared;
        let mut st = sh.st.lock();
        let from = match t {
            // A fault may have moved the QP to ERR behind our back.
            Transition::Init { .. } | Transition::Rtr { .. } | Transition::Rts { .. } => {
                if st.state == QpState::Rts || st.state == QpState::Rtr {
                    self.query_state().unwrap_or(st.state)
                } else {
                    st.state
                }
            }
            _ => st.state,
        };
        let (mut a, mask, to) = self.attrs(t, from)?;
        // SAFETY: valid QP; `a` is initialised for every bit in `mask`.
        let rc = unsafe { sys::ibv_modify_qp(q.qp, &mut a, mask as i32) };
        if rc != 0 {
            let now = self.query_state().unwrap_or(st.state);
            if now != from {
                return Err(NicError::InvalidTransition {
                    qp_type: q.qp_type,
                    from: now,
                    to,
                });
            }
            return Err(VerbsError::from_os("ibv_modify_qp", ffi::rc_error(rc)).into());
        }
        st.state = to;
        if to == QpState::Reset {
            // Outstanding work is discarded without completions.
            sh.discard(&st, &mut q.send_cq.inner.poll.lock());
            st.last_dc = None;
            if q.has_rq {
                q.pd.dev.recv.release_owner(q.owner);
            }
        }
        st.c.state_changes += 1;
        Ok(())
    }

    /// Inlined into callers (the engine's doorbell included): in the
    /// emulated guest an out-of-line call costs far more than its
    /// instructions (see `krcore_lat`'s docs).
    #[inline(always)]
    fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        super::wr::post_send(&self.inner, wrs)
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let q = &self.inner;
        if !q.has_rq {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::Malformed(match q.qp_type {
                    QpType::Dci => "a DCI has no receive queue",
                    _ => "this QP receives from an SRQ (or was created with max_recv_wr 0)",
                }),
            });
        }
        let state = q.shared.st.lock().state;
        if state == QpState::Reset {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::BadState(state),
            });
        }
        post_recv::post_chain(
            &q.pd.dev,
            q.owner,
            RecvTarget::Qp(q.qp, q.caps.max_recv_wr),
            q.caps.max_recv_sge.max(1),
            wrs,
        )
    }
}
