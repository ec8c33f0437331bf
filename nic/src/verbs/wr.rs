//! `post_send`: validation, credits, and one `ibv_post_send` chain per call
//! (one doorbell). One WR (the latency path) is built on the stack; a chain
//! of several in the QP's reusable buffers.

use super::ffi::sys;
use super::qp_state::QpInner;
use super::send::{Ah, SendState};
use crate::error::{PostError, PostErrorKind};
use crate::types::*;

#[cold]
fn bad(index: usize, kind: PostErrorKind) -> PostError {
    PostError { index, kind }
}

/// Checks what a driver checks while building a WQE (EINVAL), so that every
/// device refuses the same WRs the same way.
#[inline(always)]
pub(crate) fn validate(q: &QpInner, index: usize, wr: &SendWr) -> Result<(), PostError> {
    let dev = &q.pd.dev.caps;
    // (No closures: each could become an out-of-line call on the post path.)
    let verdict = match crate::provider::validate_send_wr(q.qp_type, &q.caps, dev, wr) {
        // rxe and mlx5 refuse an oversized UD message at post time.
        Ok(()) if q.qp_type == QpType::Ud && wr.payload.len() > u64::from(dev.ud_mtu) => {
            Err("a UD message larger than the path MTU")
        }
        v => v,
    };
    match verdict {
        Ok(()) => Ok(()),
        Err(s) => Err(bad(index, PostErrorKind::Malformed(s))),
    }
}

/// How many WRs of `wrs` can be posted, and the error for the first one that
/// cannot.
fn admit(q: &QpInner, st: &SendState, wrs: &[SendWr]) -> (usize, Option<PostError>) {
    let credits = q.shared.credits(st) as usize;
    for (i, wr) in wrs.iter().enumerate() {
        if let Err(e) = validate(q, i, wr) {
            return (i, Some(e));
        }
        if i >= credits {
            return (
                i,
                Some(bad(
                    i,
                    PostErrorKind::QueueFull {
                        depth: q.shared.max_send_wr,
                    },
                )),
            );
        }
    }
    (wrs.len(), None)
}

/// Fills the opcode-specific part of `w`.
#[inline(always)]
fn set_op(w: &mut sys::ibv_send_wr, op: &WrOp) {
    use sys::ibv_wr_opcode::*;
    let rdma = |remote: &RemoteAddr| sys::wr_t {
        rdma: sys::rdma_t {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
    };
    match op {
        WrOp::Read { remote } => {
            w.opcode = IBV_WR_RDMA_READ;
            w.wr = rdma(remote);
        }
        WrOp::Write { remote } => {
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr = rdma(remote);
        }
        WrOp::WriteImm { remote, imm } => {
            w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            w.wr = rdma(remote);
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        WrOp::Send => w.opcode = IBV_WR_SEND,
        WrOp::SendImm { imm } => {
            w.opcode = IBV_WR_SEND_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr = sys::wr_t {
                atomic: sys::atomic_t {
                    remote_addr: remote.addr,
                    compare_add: *compare,
                    swap: *swap,
                    rkey: remote.rkey,
                },
            };
        }
        WrOp::FetchAdd { remote, add } => {
            w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr = sys::wr_t {
                atomic: sys::atomic_t {
                    remote_addr: remote.addr,
                    compare_add: *add,
                    swap: 0,
                    rkey: remote.rkey,
                },
            };
        }
    }
}

/// `IBV_SEND_*` flags of a WR (branch-free: this runs on every post).
#[inline(always)]
pub(crate) fn send_flags(wr: &SendWr) -> u32 {
    use sys::ibv_send_flags as f;
    let signaled = u32::from(wr.is_signaled());
    let fence = u32::from(wr.flags.contains(SendFlags::FENCE));
    let inline = u32::from(matches!(wr.payload, Payload::Inline(_)));
    (signaled * f::IBV_SEND_SIGNALED.0)
        | (fence * f::IBV_SEND_FENCE.0)
        | (inline * f::IBV_SEND_INLINE.0)
}

/// The SGEs of a WR's payload (inline bytes are one SGE over the caller's
/// `InlineData`, which the device copies at post time).
#[inline]
pub(crate) fn push_sges(out: &mut Vec<sys::ibv_sge>, p: &Payload) -> usize {
    match p {
        Payload::Local(sg) => {
            for s in sg.as_slice() {
                out.push(sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                });
            }
            sg.as_slice().len()
        }
        Payload::Inline(d) if d.as_slice().is_empty() => 0,
        Payload::Inline(d) => {
            out.push(sys::ibv_sge {
                addr: d.as_slice().as_ptr() as u64,
                length: d.as_slice().len() as u32,
                lkey: 0,
            });
            1
        }
    }
}

/// Counts a posted WR.
#[inline(always)]
pub(crate) fn count(st: &mut SendState, wr: &SendWr) {
    match wr.op {
        WrOp::Read { .. } => {
            st.c.reads += 1;
            st.c.bytes_read += wr.payload.len();
        }
        WrOp::Write { .. } | WrOp::WriteImm { .. } => {
            st.c.writes += 1;
            st.c.bytes_written += wr.payload.len();
        }
        WrOp::Send | WrOp::SendImm { .. } => {
            st.c.sends += 1;
            st.c.bytes_written += wr.payload.len();
        }
        WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => st.c.atomics += 1,
    }
}

/// The `PostErrorKind` of a failed `ibv_post_send` return code.
pub(crate) fn device_refusal(rc: i32, depth: u32) -> PostErrorKind {
    match rc.abs() {
        libc::ENOMEM => PostErrorKind::QueueFull { depth },
        libc::EINVAL => PostErrorKind::Malformed("the device refused the work request (EINVAL)"),
        _ => PostErrorKind::Malformed("the device refused the work request"),
    }
}

#[inline(always)]
pub(crate) fn post_send(q: &QpInner, wrs: &[SendWr]) -> Result<(), PostError> {
    match wrs {
        [wr] if q.dc.is_none() => post_one(q, wr),
        _ => post_many(q, wrs),
    }
}

/// One WR on an RC or UD QP, the latency path: the same checks in the same
/// order as `post_many` (state, validation, credits), the WR and its SGEs
/// built on the stack, one `ibv_post_send`. Inlined into the provider's
/// `post_send` (see `VerbsQp::post_send`).
#[inline(always)]
fn post_one(q: &QpInner, wr: &SendWr) -> Result<(), PostError> {
    let sh = &*q.shared;
    let mut guard = sh.st.lock();
    let st = &mut *guard;
    if !matches!(st.state, QpState::Rts | QpState::Err) {
        return Err(bad(0, PostErrorKind::BadState(st.state)));
    }
    validate(q, 0, wr)?;
    if sh.credits(st) == 0 {
        return Err(bad(
            0,
            PostErrorKind::QueueFull {
                depth: sh.max_send_wr,
            },
        ));
    }
    let seq = st.posted;
    // SAFETY: `ibv_send_wr` is plain old data (integers, raw pointers and
    // unions of those); all-zero is a valid value.
    let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    let mut sges = [sys::ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }; MAX_SGE];
    let n = stack_sges(&mut sges, &wr.payload);
    w.wr_id = seq;
    w.num_sge = n as i32;
    if n > 0 {
        w.sg_list = sges.as_mut_ptr();
    }
    w.send_flags = send_flags(wr);
    set_op(&mut w, &wr.op);
    if let Destination::Ud(t) = wr.dest {
        let Some(ah) = ah_for(q, st, t.gid) else {
            return Err(bad(0, NO_AH));
        };
        w.wr = sys::wr_t {
            ud: sys::ud_t {
                ah,
                remote_qpn: t.qpn,
                remote_qkey: t.qkey,
            },
        };
    }
    // Remembered before the device can complete it.
    sh.ring.record(seq, wr.wr_id, wr.op.wc_opcode());
    let mut bad_wr: *mut sys::ibv_send_wr = std::ptr::null_mut();
    // SAFETY: `w` and `sges` live on this frame until the call returns;
    // `sg_list` points into `sges` (or is null with `num_sge` 0), an inline
    // SGE into `wr`, borrowed for the call; `next` is null; the QP is live.
    let rc = unsafe { sys::ibv_post_send(q.qp, &mut w, &mut bad_wr) };
    if rc != 0 {
        return Err(bad(0, device_refusal(rc, sh.max_send_wr)));
    }
    count(st, wr);
    st.posted = seq + 1;
    st.c.doorbells += 1;
    st.c.send_wrs += 1;
    Ok(())
}

/// The SGEs of a WR's payload into a stack array (see `push_sges`).
#[inline(always)]
fn stack_sges(out: &mut [sys::ibv_sge; MAX_SGE], p: &Payload) -> usize {
    match p {
        Payload::Local(sg) => {
            let s = sg.as_slice();
            for (o, s) in out.iter_mut().zip(s) {
                *o = sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
            }
            s.len()
        }
        Payload::Inline(d) if d.as_slice().is_empty() => 0,
        Payload::Inline(d) => {
            out[0] = sys::ibv_sge {
                addr: d.as_slice().as_ptr() as u64,
                length: d.as_slice().len() as u32,
                lkey: 0,
            };
            1
        }
    }
}

/// Any number of WRs (and every DCI post): admitted as a prefix, posted as
/// one chain. Out of line: only the one-WR post (`post_one`) is inlined
/// into callers.
#[inline(never)]
fn post_many(q: &QpInner, wrs: &[SendWr]) -> Result<(), PostError> {
    let mut guard = q.shared.st.lock();
    let st = &mut *guard;
    if !matches!(st.state, QpState::Rts | QpState::Err) {
        return Err(bad(0, PostErrorKind::BadState(st.state)));
    }
    let (n, refused) = admit(q, st, wrs);
    if n == 0 {
        // Nothing admitted: an empty slice is a no-op (no doorbell).
        return refused.map_or(Ok(()), Err);
    }
    let wrs = &wrs[..n];
    // Remember every WR in the ring before the device can complete it.
    for (i, wr) in wrs.iter().enumerate() {
        q.shared
            .ring
            .record(st.posted + i as u64, wr.wr_id, wr.op.wc_opcode());
    }
    let posted = if let Some(dc) = &q.dc {
        dc.post(q, st, wrs)
    } else {
        post_chain(q, st, wrs)
    };
    let (done, failed) = posted;
    for wr in &wrs[..done] {
        count(st, wr);
    }
    st.posted += done as u64;
    if done > 0 {
        st.c.doorbells += 1;
        st.c.send_wrs += done as u64;
    }
    if let Some(kind) = failed {
        return Err(bad(done, kind));
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a post handed to the device: how many WRs it took, and why it
/// refused the next one.
pub(crate) type Posted = (usize, Option<PostErrorKind>);

/// No address handle could be made for a destination.
pub(crate) const NO_AH: PostErrorKind =
    PostErrorKind::Malformed("no address handle could be created for the destination GID");

/// Builds the chain for `wrs` (all admitted) and posts it with one
/// `ibv_post_send`.
fn post_chain(q: &QpInner, st: &mut SendState, wrs: &[SendWr]) -> Posted {
    st.wrs.clear();
    st.sges.clear();
    st.wrs.reserve(wrs.len());
    st.sges.reserve(wrs.len() * MAX_SGE);
    let mut cut = None;
    for (i, wr) in wrs.iter().enumerate() {
        // SAFETY: `ibv_send_wr` is plain old data (integers, raw pointers and
        // unions of those); all-zero is a valid value.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = st.posted + i as u64;
        w.num_sge = push_sges(&mut st.sges, &wr.payload) as i32;
        w.send_flags = send_flags(wr);
        set_op(&mut w, &wr.op);
        if let Destination::Ud(t) = wr.dest {
            let Some(ah) = ah_for(q, st, t.gid) else {
                cut = Some(NO_AH);
                break;
            };
            w.wr = sys::wr_t {
                ud: sys::ud_t {
                    ah,
                    remote_qpn: t.qpn,
                    remote_qkey: t.qkey,
                },
            };
        }
        st.wrs.push(w);
    }
    if st.wrs.is_empty() {
        return (0, cut);
    }
    link(st);
    let mut bad_wr: *mut sys::ibv_send_wr = std::ptr::null_mut();
    let head = st.wrs.as_mut_ptr();
    // SAFETY: the chain is in `st.wrs`/`st.sges`, linked by `link` and not
    // touched until the call returns; inline SGEs point into `wrs`, borrowed
    // for the call; the QP is live.
    let rc = unsafe { sys::ibv_post_send(q.qp, head, &mut bad_wr) };
    if rc == 0 {
        return (st.wrs.len(), cut);
    }
    let done = if bad_wr.is_null() {
        0
    } else {
        (bad_wr as usize - head as usize) / std::mem::size_of::<sys::ibv_send_wr>()
    };
    (done, Some(device_refusal(rc, q.shared.max_send_wr)))
}

/// Sets `next` and `sg_list` of the chain in `st.wrs` (after it is complete,
/// so no push can move what a pointer points to).
fn link(st: &mut SendState) {
    let n = st.wrs.len();
    let head = st.wrs.as_mut_ptr();
    let sges = st.sges.as_mut_ptr();
    let mut k = 0usize;
    for i in 0..n {
        // SAFETY: `i < n`: in bounds; every access below goes through the
        // raw pointers taken above, so none of them is invalidated.
        let w = unsafe { &mut *head.add(i) };
        w.sg_list = if w.num_sge > 0 {
            // SAFETY: `k + num_sge <= sges.len()`: the SGEs were pushed in
            // this order.
            unsafe { sges.add(k) }
        } else {
            std::ptr::null_mut()
        };
        k += w.num_sge as usize;
        w.next = if i + 1 < n {
            // SAFETY: `i + 1 < n`: in bounds.
            unsafe { head.add(i + 1) }
        } else {
            std::ptr::null_mut()
        };
    }
}

/// The cached address handle to `gid`, created on first use.
pub(crate) fn ah_for(q: &QpInner, st: &mut SendState, gid: Gid) -> Option<*mut sys::ibv_ah> {
    if let Some(a) = st.ahs.get(&gid) {
        return Some(a.ah);
    }
    let a = Ah::create(&q.pd, gid)?;
    let p = a.ah;
    st.ahs.insert(gid, a);
    Some(p)
}
