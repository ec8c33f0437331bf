//! Shared receive queues.

use super::device::DeviceInner;
use super::error::VerbsError;
use super::ffi::{self, sys};
use super::mr::{PdInner, VerbsPd};
use super::post_recv::{self, RecvTarget};
use crate::error::{NicError, PostError, Result};
use crate::provider::SharedReceiveQueue;
use crate::types::RecvWr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// Owner of an `ibv_srq`.
pub(crate) struct SrqInner {
    pub srq: *mut sys::ibv_srq,
    pub max_wr: u32,
    max_sge: u32,
    owner: u64,
    /// Receives posted and not yet completed (or released).
    pub outstanding: Arc<AtomicU32>,
    pd: Arc<PdInner>,
}

// SAFETY: the SRQ handle is only passed to thread-safe libibverbs calls.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: `srq` came from `ibv_create_srq`; every QP using it holds
        // an `Arc` to this struct, so none is left; destroyed once.
        unsafe { sys::ibv_destroy_srq(self.srq) };
        self.pd.dev.recv.release_owner(self.owner);
    }
}

/// A shared receive queue of a verbs device.
#[derive(Clone)]
pub struct VerbsSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSrq")
            .field("max_wr", &self.inner.max_wr)
            .field("outstanding", &self.inner.outstanding.load(Relaxed))
            .finish()
    }
}

impl VerbsSrq {
    pub(crate) fn create(pd: &VerbsPd, max_wr: u32, max_sge: u32) -> Result<VerbsSrq> {
        let dev = &pd.inner.dev;
        if max_wr == 0 || max_wr > dev.caps.max_qp_wr || max_sge == 0 || max_sge > dev.caps.max_sge
        {
            return Err(NicError::InvalidArgument(format!(
                "SRQ max_wr {max_wr} / max_sge {max_sge} out of range"
            )));
        }
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: valid PD and a fully initialised attribute struct.
        let srq = unsafe { sys::ibv_create_srq(pd.inner.pd, &mut attr) };
        if srq.is_null() {
            return Err(VerbsError::from_os("ibv_create_srq", ffi::errno()).into());
        }
        Ok(VerbsSrq {
            inner: Arc::new(SrqInner {
                srq,
                max_wr,
                max_sge,
                owner: dev.next_id(),
                outstanding: Arc::new(AtomicU32::new(0)),
                pd: pd.inner.clone(),
            }),
        })
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.inner.pd.dev, dev) {
            Ok(())
        } else {
            Err(NicError::InvalidArgument("SRQ of another device".into()))
        }
    }
}

impl SharedReceiveQueue for VerbsSrq {
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        post_recv::post_chain(
            &self.inner.pd.dev,
            self.inner.owner,
            RecvTarget::Srq(self.inner.srq, &self.inner.outstanding, self.inner.max_wr),
            self.inner.max_sge,
            wrs,
        )
    }

    fn free_slots(&self) -> u32 {
        self.inner
            .max_wr
            .saturating_sub(self.inner.outstanding.load(Relaxed))
    }
}
