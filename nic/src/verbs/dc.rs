//! DC (Dynamically Connected) transport through mlx5dv: a small hand-written
//! binding, because `rdma-sys` does not cover `mlx5dv.h`.
//!
//! **Untested on hardware.** It was written against rdma-core's `mlx5dv.h`
//! (v44) and follows the documented recipe (`man mlx5dv_create_qp`,
//! `man mlx5dv_wr_post`), but the machines this provider was developed on
//! have no ConnectX NIC: Soft-RoCE has no DC, so on rxe this module only
//! decides that DC is absent. On a device that is not mlx5 (or an mlx5 that
//! refuses to create a DCI) [`crate::DeviceCaps::dc`] is false and creating a
//! DCI/DCT returns [`crate::NicError::Unsupported`].
//!
//! - DCI: `mlx5dv_create_qp` with `IBV_QPT_DRIVER` and
//!   `MLX5DV_QP_INIT_ATTR_MASK_DC` (`MLX5DV_DCTYPE_DCI`), posted through the
//!   extended `ibv_wr_*` API (`ibv_qp_to_qp_ex`) with
//!   `mlx5dv_wr_set_dc_addr(ah, dct_num, dc_key)` naming the target per WR.
//! - DCT: the same call with `MLX5DV_DCTYPE_DCT` and the `dc_key`, on an SRQ;
//!   its `qp_num` is the DCT number. It goes INIT -> RTR and stays there.

use super::error::VerbsError;
use super::ffi::{self, sys};
use super::mlx5::*;
use super::mr::VerbsPd;
use super::qp_state::QpInner;
use super::send::SendState;
use super::wr::{self, Posted, NO_AH};
use super::VerbsNic;
use crate::error::Result;
use crate::provider::QpInit;
use crate::types::*;

impl DcSupport {
    /// Creates a DCI or DCT (in RESET).
    pub(crate) fn create(
        &self,
        pd: &VerbsPd,
        init: &QpInit<'_, VerbsNic>,
    ) -> Result<(*mut sys::ibv_qp, Option<DciHandles>)> {
        let dev = &pd.inner.dev;
        let dci = init.qp_type == QpType::Dci;
        let mut a = dci_attr(
            pd.inner.pd,
            init.send_cq.inner.cq,
            init.caps,
            dev.caps.max_inline,
        );
        let mut m = if dci {
            mlx5_attr(MLX5DV_DCTYPE_DCI, 0)
        } else {
            a.comp_mask = sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
            a.send_ops_flags = 0;
            a.cap = sys::ibv_qp_cap {
                max_send_wr: 0,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline_data: 0,
            };
            a.recv_cq = init.recv_cq.inner.cq;
            a.srq = init.srq.map_or(std::ptr::null_mut(), |s| s.inner.srq);
            mlx5_attr(MLX5DV_DCTYPE_DCT, init.dc_key)
        };
        // SAFETY: valid context, PD, CQs and SRQ of this device; both
        // attribute structs are fully initialised.
        let qp = unsafe { mlx5dv_create_qp(dev.ctx(), &mut a, &mut m) };
        if qp.is_null() {
            return Err(VerbsError::from_os("mlx5dv_create_qp", ffi::errno()).into());
        }
        if !dci {
            return Ok((qp, None));
        }
        // SAFETY: a QP created with SEND_OPS_FLAGS has an extended form.
        let qpx = unsafe { sys::ibv_qp_to_qp_ex(qp) };
        // SAFETY: `qpx` is the extended QP of an mlx5 DCI.
        let mqp = if qpx.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { mlx5dv_qp_ex_from_ibv_qp_ex(qpx) }
        };
        // SAFETY: `mqp` is null or points to the provider's live struct.
        if mqp.is_null() || unsafe { (*mqp).wr_set_dc_addr }.is_none() {
            // SAFETY: destroying the QP we just created, once.
            unsafe { sys::ibv_destroy_qp(qp) };
            return Err(crate::NicError::Unsupported(
                "mlx5dv did not expose wr_set_dc_addr for this DCI",
            ));
        }
        Ok((qp, Some(DciHandles { qpx, mqp })))
    }
}

impl DciHandles {
    /// Posts admitted WRs through `ibv_wr_start` .. `ibv_wr_complete` (one
    /// doorbell); all-or-nothing, as `ibv_wr_complete` is.
    pub(crate) fn post(&self, q: &QpInner, st: &mut SendState, wrs: &[SendWr]) -> Posted {
        let (qpx, mqp) = (self.qpx, self.mqp);
        // Resolve every address handle before starting, so that a failure
        // needs no abort of a half-built WR.
        let mut ahs = Vec::with_capacity(wrs.len());
        let mut cut = None;
        for wr in wrs {
            let Destination::Dc(t) = wr.dest else { break };
            match wr::ah_for(q, st, t.gid) {
                Some(ah) => ahs.push((ah, t)),
                None => {
                    cut = Some(NO_AH);
                    break;
                }
            }
        }
        if ahs.is_empty() {
            return (0, cut);
        }
        let mut sges = Vec::with_capacity(MAX_SGE);
        // SAFETY: `qpx`/`mqp` are the live extended handles of this DCI
        // (checked non-null with `wr_set_dc_addr` at creation); each WR is
        // built completely between start and complete; the SGE list and
        // inline bytes outlive the call that copies them.
        let rc = unsafe {
            sys::ibv_wr_start(qpx);
            for (i, (wr, (ah, t))) in wrs.iter().zip(&ahs).enumerate() {
                (*qpx).wr_id = st.posted + i as u64;
                (*qpx).wr_flags = wr::send_flags(wr);
                match wr.op {
                    WrOp::Read { remote } => sys::ibv_wr_rdma_read(qpx, remote.rkey, remote.addr),
                    WrOp::Write { remote } => sys::ibv_wr_rdma_write(qpx, remote.rkey, remote.addr),
                    WrOp::WriteImm { remote, imm } => {
                        sys::ibv_wr_rdma_write_imm(qpx, remote.rkey, remote.addr, imm.to_be())
                    }
                    WrOp::Send => sys::ibv_wr_send(qpx),
                    WrOp::SendImm { imm } => sys::ibv_wr_send_imm(qpx, imm.to_be()),
                    WrOp::CompareSwap {
                        remote,
                        compare,
                        swap,
                    } => sys::ibv_wr_atomic_cmp_swp(qpx, remote.rkey, remote.addr, compare, swap),
                    WrOp::FetchAdd { remote, add } => {
                        sys::ibv_wr_atomic_fetch_add(qpx, remote.rkey, remote.addr, add)
                    }
                }
                if let Some(set) = (*mqp).wr_set_dc_addr {
                    set(mqp, *ah, t.dct_num, t.dc_key);
                }
                match &wr.payload {
                    Payload::Inline(d) => sys::ibv_wr_set_inline_data(
                        qpx,
                        d.as_slice().as_ptr() as *mut libc::c_void,
                        d.as_slice().len(),
                    ),
                    Payload::Local(_) => {
                        sges.clear();
                        let n = wr::push_sges(&mut sges, &wr.payload);
                        sys::ibv_wr_set_sge_list(qpx, n, sges.as_ptr());
                    }
                }
            }
            sys::ibv_wr_complete(qpx)
        };
        if rc != 0 {
            return (0, Some(wr::device_refusal(rc, q.shared.max_send_wr)));
        }
        for (_, t) in &ahs {
            let key = (t.gid, t.dct_num);
            if st.last_dc != Some(key) {
                st.c.dc_target_switches += 1;
                st.last_dc = Some(key);
            }
        }
        (ahs.len(), cut)
    }
}
