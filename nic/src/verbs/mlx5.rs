//! The mlx5dv binding (see `dc`): its C structs and functions, which
//! rdma-sys does not cover, whether a device is mlx5, the probe that tells
//! whether it creates DCIs, and a DCI's extended handles. A leaf below the
//! device, which keeps the probe's result.
//!
//! **Untested on hardware** (see `dc`).

use super::ffi::sys;
use crate::types::*;

/// `struct mlx5dv_dc_init_attr` (the union holds `dct_access_key`).
#[repr(C)]
pub(crate) struct DcInitAttr {
    dc_type: u32,
    dct_access_key: u64,
}

/// `struct mlx5dv_qp_init_attr`.
#[repr(C)]
pub(crate) struct Mlx5QpInitAttr {
    comp_mask: u64,
    create_flags: u32,
    dc_init_attr: DcInitAttr,
    send_ops_flags: u64,
}

/// The head of `struct mlx5dv_qp_ex` (the only member we call).
#[repr(C)]
pub(crate) struct Mlx5QpEx {
    comp_mask: u64,
    pub(crate) wr_set_dc_addr:
        Option<unsafe extern "C" fn(mqp: *mut Mlx5QpEx, ah: *mut sys::ibv_ah, dctn: u32, key: u64)>,
}

pub(crate) const MLX5DV_QP_INIT_ATTR_MASK_DC: u64 = 1 << 1;
pub(crate) const MLX5DV_DCTYPE_DCT: u32 = 1;
pub(crate) const MLX5DV_DCTYPE_DCI: u32 = 2;

const _: () = assert!(std::mem::size_of::<DcInitAttr>() == 16);
const _: () = assert!(std::mem::size_of::<Mlx5QpInitAttr>() == 40);

#[link(name = "mlx5")]
extern "C" {
    pub(crate) fn mlx5dv_is_supported(device: *mut sys::ibv_device) -> bool;
    pub(crate) fn mlx5dv_create_qp(
        context: *mut sys::ibv_context,
        qp_attr: *mut sys::ibv_qp_init_attr_ex,
        mlx5_qp_attr: *mut Mlx5QpInitAttr,
    ) -> *mut sys::ibv_qp;
    pub(crate) fn mlx5dv_qp_ex_from_ibv_qp_ex(qp: *mut sys::ibv_qp_ex) -> *mut Mlx5QpEx;
}

/// Whether `dev` is driven by the mlx5 provider.
pub(crate) fn is_mlx5(dev: *mut sys::ibv_device) -> bool {
    // SAFETY: `dev` is an entry of a live device list.
    unsafe { mlx5dv_is_supported(dev) }
}

/// Proof that the device created a DCI when probed at open.
#[derive(Debug)]
pub(crate) struct DcSupport(pub(crate) ());

/// Tries to create (and destroys) a DCI on `ctx`: DC works iff this does.
pub(crate) fn probe(ctx: *mut sys::ibv_context) -> Option<DcSupport> {
    // SAFETY: valid context; every object made here is destroyed below in
    // reverse order, on every path.
    unsafe {
        let pd = sys::ibv_alloc_pd(ctx);
        if pd.is_null() {
            return None;
        }
        let cq = sys::ibv_create_cq(ctx, 4, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mut ok = false;
        if !cq.is_null() {
            let mut a = dci_attr(pd, cq, QpCaps::default(), 0);
            let mut m = mlx5_attr(MLX5DV_DCTYPE_DCI, 0);
            let qp = mlx5dv_create_qp(ctx, &mut a, &mut m);
            if !qp.is_null() {
                ok = true;
                sys::ibv_destroy_qp(qp);
            }
            sys::ibv_destroy_cq(cq);
        }
        sys::ibv_dealloc_pd(pd);
        ok.then_some(DcSupport(()))
    }
}

pub(crate) fn mlx5_attr(dc_type: u32, key: u64) -> Mlx5QpInitAttr {
    Mlx5QpInitAttr {
        comp_mask: MLX5DV_QP_INIT_ATTR_MASK_DC,
        create_flags: 0,
        dc_init_attr: DcInitAttr {
            dc_type,
            dct_access_key: key,
        },
        send_ops_flags: 0,
    }
}

pub(crate) fn dci_attr(
    pd: *mut sys::ibv_pd,
    cq: *mut sys::ibv_cq,
    caps: QpCaps,
    max_inline: u32,
) -> sys::ibv_qp_init_attr_ex {
    use sys::ibv_qp_create_send_ops_flags as f;
    // SAFETY: plain old data; all-zero is valid for every field.
    let mut a: sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    a.qp_type = sys::ibv_qp_type::IBV_QPT_DRIVER;
    a.send_cq = cq;
    a.recv_cq = cq;
    a.cap.max_send_wr = caps.max_send_wr;
    a.cap.max_send_sge = caps.max_send_sge.max(1);
    a.cap.max_inline_data = max_inline;
    a.comp_mask = sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
        | sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
    a.pd = pd;
    a.send_ops_flags = u64::from(
        f::IBV_QP_EX_WITH_RDMA_WRITE.0
            | f::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0
            | f::IBV_QP_EX_WITH_SEND.0
            | f::IBV_QP_EX_WITH_SEND_WITH_IMM.0
            | f::IBV_QP_EX_WITH_RDMA_READ.0
            | f::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0
            | f::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0,
    );
    a
}

/// The extended handles of a DCI.
pub(crate) struct DciHandles {
    pub(crate) qpx: *mut sys::ibv_qp_ex,
    pub(crate) mqp: *mut Mlx5QpEx,
}
