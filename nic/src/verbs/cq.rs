//! Completion queues: `ibv_poll_cq`, and the translation of device
//! completions back to the caller's `wr_id`s with send-queue credit release.

use super::device::DeviceInner;
use super::error::VerbsError;
use super::ffi::{self, sys};
use super::qptable::QpTable;
use super::recv::RECV_TAG;
use crate::error::{NicError, Result};
use crate::provider::CompletionQueue;
use crate::types::{Wc, WcOpcode, WcStatus};
use parking_lot::RwLock;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Device completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;

/// Owner of an `ibv_cq`.
pub(crate) struct CqInner {
    pub cq: *mut sys::ibv_cq,
    depth: u32,
    /// Send queues completing here, by QP number (credits and `wr_id`s).
    pub send_qps: RwLock<QpTable>,
    /// Set by the async event thread on `IBV_EVENT_CQ_ERR`, or by a failed
    /// poll. Sticky.
    overflowed: Arc<AtomicBool>,
    pub dev: Arc<DeviceInner>,
}

// SAFETY: the CQ handle is only passed to thread-safe libibverbs calls
// (`ibv_poll_cq` on one CQ from several threads is serialized by the
// provider library's CQ lock).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        self.dev.cq_flags.lock().remove(&(self.cq as usize));
        // SAFETY: `cq` came from `ibv_create_cq`; every QP using it holds
        // an `Arc` to this struct, so none is left; destroyed once.
        unsafe { sys::ibv_destroy_cq(self.cq) };
    }
}

/// A completion queue of a verbs device.
#[derive(Clone)]
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("depth", &self.inner.depth)
            .finish()
    }
}

impl VerbsCq {
    pub(crate) fn create(dev: &Arc<DeviceInner>, depth: u32) -> Result<VerbsCq> {
        if depth == 0 || depth > dev.caps.max_cqe {
            return Err(NicError::InvalidArgument(format!(
                "CQ depth {depth} outside 1..={}",
                dev.caps.max_cqe
            )));
        }
        // SAFETY: valid context; no completion channel, no vector.
        let cq = unsafe {
            sys::ibv_create_cq(
                dev.ctx(),
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(VerbsError::from_os("ibv_create_cq", ffi::errno()).into());
        }
        // SAFETY: `cq` is valid; `cqe` is the depth the device granted.
        let granted = unsafe { (*cq).cqe }.max(depth as i32) as u32;
        let overflowed = Arc::new(AtomicBool::new(false));
        dev.cq_flags.lock().insert(cq as usize, overflowed.clone());
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                depth: granted,
                send_qps: RwLock::new(QpTable::default()),
                overflowed,
                dev: dev.clone(),
            }),
        })
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.inner.dev, dev) {
            Ok(())
        } else {
            Err(NicError::InvalidArgument("CQ of another device".into()))
        }
    }

    /// Translates one device completion into `wc`; `false` (and `wc`
    /// untouched) for a stale one (its QP was reset or destroyed and its
    /// slot reused). The send completion of a successful WR is the inline
    /// fast path; receives and errors are out of line.
    #[inline]
    fn translate(&self, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
        if w.wr_id & RECV_TAG != 0 {
            return self.translate_recv(w, wc);
        }
        if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
            return self.translate_send_error(w, wc);
        }
        let Some((wr_id, _)) = self.complete_send(w) else {
            return false;
        };
        *wc = Wc {
            wr_id,
            status: WcStatus::Success,
            opcode: ffi::wc_opcode(w.opcode),
            byte_len: w.byte_len,
            imm: None,
            qp_num: w.qp_num,
            src_qp: 0,
        };
        true
    }

    /// The caller's `wr_id` and the opcode of the send WR a completion is
    /// for, freeing its QP's send slots up to it; `None` when stale.
    #[inline]
    fn complete_send(&self, w: &sys::ibv_wc) -> Option<(u64, WcOpcode)> {
        // Resolved under the table's read lock (lock order: `send_qps`, then
        // a QP's `st`; nothing takes them the other way round; the ring
        // itself is read without `st`): no reference count traffic per
        // completion.
        self.inner
            .send_qps
            .read()
            .get(w.qp_num)
            .and_then(|sh| sh.complete(w.wr_id))
    }

    #[cold]
    #[inline(never)]
    fn translate_send_error(&self, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
        let Some((wr_id, opcode)) = self.complete_send(w) else {
            return false;
        };
        self.count_error();
        // Verbs leaves the opcode of an error completion undefined: report
        // the WR's own, as the contract asks.
        *wc = Wc {
            wr_id,
            status: ffi::wc_status(w.status),
            opcode,
            byte_len: w.byte_len,
            imm: None,
            qp_num: w.qp_num,
            src_qp: 0,
        };
        true
    }

    #[inline(never)]
    fn translate_recv(&self, w: &sys::ibv_wc, wc: &mut Wc) -> bool {
        let Some(wr_id) = self.inner.dev.recv.take(w.wr_id) else {
            return false;
        };
        let status = ffi::wc_status(w.status);
        let imm = if status.is_ok() && w.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate
            // (network byte order); every bit pattern is a valid u32.
            let be = unsafe { w.imm_data_invalidated_rkey_union.imm_data };
            Some(u32::from_be(be))
        } else {
            None
        };
        if !status.is_ok() {
            self.count_error();
        }
        *wc = Wc {
            wr_id,
            status,
            opcode: ffi::wc_opcode(w.opcode),
            byte_len: w.byte_len,
            imm,
            qp_num: w.qp_num,
            src_qp: w.src_qp,
        };
        true
    }

    fn count_error(&self) {
        self.inner
            .dev
            .counters
            .error_completions
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl CompletionQueue for VerbsCq {
    fn depth(&self) -> u32 {
        self.inner.depth
    }

    #[inline]
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        // The empty poll (the common case of a spinning caller) stays small:
        // one `ibv_poll_cq`, the overflow flag; translation behind one branch.
        let mut raw: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        let got = if want == 0 {
            0
        } else {
            // SAFETY: `raw` has room for `want` completions; the CQ is live.
            unsafe { sys::ibv_poll_cq(self.inner.cq, want as i32, raw[0].as_mut_ptr()) }
        };
        if got > 0 {
            let n = self.take(out, &mut raw, got as usize, want);
            if n > 0 {
                return Ok(n);
            }
        } else if got < 0 {
            // A CQ in error (mlx5 reports overflow this way too).
            self.inner.overflowed.store(true, Ordering::Release);
        }
        if self.inner.overflowed.load(Ordering::Acquire) {
            return Err(NicError::CqOverflow {
                depth: self.inner.depth,
            });
        }
        Ok(0)
    }
}

impl VerbsCq {
    /// Translates the `got` completions of a first poll that asked for
    /// `want` into `out`, and polls on while batches come back full and
    /// `out` has room. Returns how many it wrote (stale ones are dropped).
    #[inline(always)]
    fn take(
        &self,
        out: &mut [Wc],
        raw: &mut [MaybeUninit<sys::ibv_wc>; POLL_BATCH],
        mut got: usize,
        mut want: usize,
    ) -> usize {
        let mut n = 0;
        loop {
            for w in &raw[..got] {
                // SAFETY: the first `got` entries were written by the poll.
                let w = unsafe { w.assume_init_ref() };
                if self.translate(w, &mut out[n]) {
                    n += 1;
                }
            }
            if got < want || n == out.len() {
                return n;
            }
            want = (out.len() - n).min(POLL_BATCH);
            // SAFETY: as in `poll`.
            let r = unsafe { sys::ibv_poll_cq(self.inner.cq, want as i32, raw[0].as_mut_ptr()) };
            if r < 0 {
                self.inner.overflowed.store(true, Ordering::Release);
                return n;
            }
            got = r as usize;
        }
    }
}
