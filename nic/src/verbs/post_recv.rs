//! Posting receives to a QP's RQ or an SRQ: chains of at most 16, each
//! receive tagged in the device's receive table first (see `recv`), the
//! tags of what the device refused cancelled.

use super::device::DeviceInner;
use super::ffi::sys;
use crate::error::{PostError, PostErrorKind};
use crate::types::*;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Posts receives to an RQ (`srq == None`) or an SRQ.
pub(crate) fn post_chain(
    dev: &DeviceInner,
    owner: u64,
    target: RecvTarget,
    max_sge: u32,
    wrs: &[RecvWr],
) -> std::result::Result<(), PostError> {
    const CHUNK: usize = 16;
    for (c, chunk) in wrs.chunks(CHUNK).enumerate() {
        let base = c * CHUNK;
        if let Some(i) = chunk
            .iter()
            .position(|w| w.sg.as_slice().len() > max_sge as usize)
        {
            post_chunk(dev, owner, &target, &chunk[..i]).map_err(|mut e| {
                e.index += base;
                e
            })?;
            return Err(PostError {
                index: base + i,
                kind: PostErrorKind::Malformed("more SGEs than max_recv_sge"),
            });
        }
        post_chunk(dev, owner, &target, chunk).map_err(|mut e| {
            e.index += base;
            e
        })?;
    }
    Ok(())
}

/// Where receives go.
pub(crate) enum RecvTarget<'a> {
    /// A QP's RQ: its handle and depth.
    Qp(*mut sys::ibv_qp, u32),
    /// An SRQ: its handle, its count of outstanding receives, its depth.
    Srq(*mut sys::ibv_srq, &'a Arc<AtomicU32>, u32),
}

fn post_chunk(
    dev: &DeviceInner,
    owner: u64,
    target: &RecvTarget<'_>,
    wrs: &[RecvWr],
) -> std::result::Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let n = wrs.len();
    let mut tags = [0u64; 16];
    let srq_count = match target {
        RecvTarget::Srq(_, outstanding, _) => Some(*outstanding),
        RecvTarget::Qp(..) => None,
    };
    dev.recv.insert(
        owner,
        wrs.iter().map(|w| w.wr_id),
        srq_count,
        &mut tags[..n],
    );
    let mut sges = [sys::ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }; 16 * MAX_SGE];
    // SAFETY: `ibv_recv_wr` is plain old data (integers and raw pointers);
    // all-zero is valid.
    let mut rws: [sys::ibv_recv_wr; 16] = unsafe { std::mem::zeroed() };
    let mut k = 0;
    for w in wrs {
        for s in w.sg.as_slice() {
            sges[k] = sys::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            };
            k += 1;
        }
    }
    // Link only through raw pointers from here on, so that no later access
    // through the arrays invalidates them.
    let base = rws.as_mut_ptr();
    let sbase = sges.as_mut_ptr();
    let mut k = 0;
    for (i, w) in wrs.iter().enumerate() {
        let ns = w.sg.as_slice().len();
        // SAFETY: `i < n <= 16` and `k + ns <= 16 * MAX_SGE`: in bounds of
        // `rws` and `sges`.
        unsafe {
            let r = &mut *base.add(i);
            r.wr_id = tags[i];
            r.num_sge = ns as i32;
            r.sg_list = if ns > 0 {
                sbase.add(k)
            } else {
                std::ptr::null_mut()
            };
            r.next = if i + 1 < n {
                base.add(i + 1)
            } else {
                std::ptr::null_mut()
            };
        }
        k += ns;
    }
    let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: the chain lives on this stack frame during the call; every
    // pointer in it is into `rws`/`sges`; the QP/SRQ is live (borrowed).
    let rc = unsafe {
        match target {
            RecvTarget::Qp(qp, _) => sys::ibv_post_recv(*qp, base, &mut bad),
            RecvTarget::Srq(srq, ..) => sys::ibv_post_srq_recv(*srq, base, &mut bad),
        }
    };
    if rc == 0 {
        dev.counters.recv_wrs.fetch_add(n as u64, Relaxed);
        return Ok(());
    }
    let index = if bad.is_null() {
        0
    } else {
        (bad as usize - base as usize) / std::mem::size_of::<sys::ibv_recv_wr>()
    };
    dev.recv.cancel(&tags[index..n]);
    dev.counters.recv_wrs.fetch_add(index as u64, Relaxed);
    let depth = match target {
        RecvTarget::Qp(_, d) => *d,
        RecvTarget::Srq(_, _, d) => *d,
    };
    Err(PostError {
        index,
        kind: recv_error_kind(rc, depth),
    })
}

fn recv_error_kind(rc: i32, depth: u32) -> PostErrorKind {
    match rc.abs() {
        libc::ENOMEM => PostErrorKind::QueueFull { depth },
        _ => PostErrorKind::Malformed("the device refused the receive request"),
    }
}
