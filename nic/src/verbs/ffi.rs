//! Thin helpers over `rdma-sys`: constants in our vocabulary, errno capture,
//! value conversions and the few C layouts `rdma-sys` maps to Rust enums
//! (which would be undefined behaviour to read with an unknown value).
//!
//! Nothing here owns a handle; the owning inner structs live in the sibling
//! modules, each with its `Drop`.

use crate::types::{Access, Gid, QpState, WcOpcode, WcStatus};
pub(crate) use rdma_sys as sys;
use std::io;

/// Initial packet sequence number of every connected QP (both directions).
/// Any value works as long as both sides agree; a constant keeps the RC
/// handshake down to (GID, QPN).
pub(crate) const PSN: u32 = 0x4b2c;

/// Local ACK timeout exponent set at RTS: 4.096 us * 2^14 = 67 ms, the usual
/// value (perftest, rust-ibverbs). `Transition::Rts` carries the retry
/// counts; the timeout is not part of the contract.
pub(crate) const ACK_TIMEOUT: u8 = 14;

/// Minimal RNR NAK timer advertised at RTR (12 = 0.64 ms).
pub(crate) const MIN_RNR_TIMER: u8 = 12;

/// Outstanding READs/atomics per QP we ask for (capped by the device).
pub(crate) const RD_ATOMIC: u8 = 16;

/// Hop limit of the GRH for RoCE address vectors.
pub(crate) const HOP_LIMIT: u8 = 64;

/// The `errno` of the last failed libc/libibverbs call on this thread.
pub(crate) fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// An `io::Error` from a libibverbs return code (`ibv_post_*` and
/// `ibv_modify_qp` return the errno value instead of setting `errno`).
pub(crate) fn rc_error(rc: i32) -> io::Error {
    io::Error::from_raw_os_error(rc.abs())
}

/// Our access flags as `IBV_ACCESS_*` (the bit values are the same by
/// construction; this keeps the mapping explicit and masks unknown bits).
pub(crate) fn access_flags(a: Access) -> u32 {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_ATOMIC) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    f
}

/// Our QP state from `enum ibv_qp_state` (SQD and SQE, which this provider
/// never requests, read as ERR: the send queue does not accept work).
pub(crate) fn qp_state(s: u32) -> QpState {
    use sys::ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        _ => QpState::Err,
    }
}

/// `enum ibv_qp_state` from our state.
pub(crate) fn ibv_state(s: QpState) -> u32 {
    use sys::ibv_qp_state::*;
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Err => IBV_QPS_ERR,
    }
}

/// Our completion status from `enum ibv_wc_status` (same numbering; values
/// we have no name for become `GeneralErr`).
#[inline]
pub(crate) fn wc_status(s: u32) -> WcStatus {
    if s == sys::ibv_wc_status::IBV_WC_SUCCESS {
        return WcStatus::Success;
    }
    u8::try_from(s)
        .map(WcStatus::from_u8)
        .unwrap_or(WcStatus::GeneralErr)
}

/// Our completion opcode from `enum ibv_wc_opcode`.
#[inline]
pub(crate) fn wc_opcode(o: u32) -> WcOpcode {
    use sys::ibv_wc_opcode::*;
    match o {
        IBV_WC_SEND => WcOpcode::Send,
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Recv,
    }
}

/// Bytes of an `enum ibv_mtu` value (0 for an unknown value).
pub(crate) fn mtu_bytes(m: u32) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// `union ibv_gid` from our GID.
pub(crate) fn to_ibv_gid(g: Gid) -> sys::ibv_gid {
    sys::ibv_gid { raw: g.0 }
}

/// A RoCE address vector to `gid` from our `port` and GID index.
pub(crate) fn ah_attr(gid: Gid, port: u8, sgid_index: u8) -> sys::ibv_ah_attr {
    sys::ibv_ah_attr {
        grh: sys::ibv_global_route {
            dgid: to_ibv_gid(gid),
            flow_label: 0,
            sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    }
}

/// The layout of `struct ibv_async_event` with the event type as a plain
/// integer: `rdma-sys` declares it as a Rust enum, and a value the binding
/// does not know (a newer kernel) would be undefined behaviour to read.
#[repr(C)]
pub(crate) struct RawAsyncEvent {
    /// `union { cq, qp, srq, wq, port_num }`; we only compare it to CQ
    /// pointers we own.
    pub element: *mut libc::c_void,
    /// `enum ibv_event_type`.
    pub event_type: u32,
}

/// `IBV_EVENT_CQ_ERR`.
pub(crate) const EVENT_CQ_ERR: u32 = sys::ibv_event_type::IBV_EVENT_CQ_ERR as u32;

// Compile-time checks that our hand-written layout matches the binding's.
const _: () =
    assert!(std::mem::size_of::<RawAsyncEvent>() == std::mem::size_of::<sys::ibv_async_event>());
const _: () = assert!(std::mem::size_of::<sys::ibv_gid>() == 16);
