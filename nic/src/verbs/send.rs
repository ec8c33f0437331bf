//! A QP's send side as the rest of the provider shares it: the send ring
//! and credit counter its send CQ completes (`SendShared`), the state under
//! the send lock (`SendState`), and the address handles it caches (`Ah`).

use super::device::QpCounters;
use super::ffi::{self, sys};
use super::mr::PdInner;
use super::ring::SendRing;
use crate::counters::Counters;
use crate::types::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

/// An address handle (UD destinations and DC targets), destroyed on drop.
pub(crate) struct Ah {
    pub ah: *mut sys::ibv_ah,
    _pd: Arc<PdInner>,
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: `ah` came from `ibv_create_ah` and is destroyed once; the
        // QPs that used it have posted their WRs (AHs may be destroyed while
        // WRs naming them are outstanding only on some providers, so the
        // cache lives as long as its QP).
        unsafe { sys::ibv_destroy_ah(self.ah) };
    }
}

impl Ah {
    pub(crate) fn create(pd: &Arc<PdInner>, gid: Gid) -> Option<Ah> {
        let mut attr = ffi::ah_attr(gid, pd.dev.port, pd.dev.gid_index);
        // SAFETY: valid PD and a fully initialised attribute struct.
        let ah = unsafe { sys::ibv_create_ah(pd.pd, &mut attr) };
        (!ah.is_null()).then(|| Ah {
            ah,
            _pd: pd.clone(),
        })
    }
}

/// Send-side state, under the QP's send lock.
pub(crate) struct SendState {
    /// WRs posted since creation.
    pub posted: u64,
    /// Data-path counters of this QP.
    pub c: Counters,
    /// The state this provider last moved the QP to (the device may have
    /// moved it to ERR since; `state()` asks the device).
    pub state: QpState,
    /// Address handles by destination GID (UD, DCI).
    pub ahs: HashMap<Gid, Ah>,
    /// Reusable chain buffers (no allocation per post once warm).
    pub wrs: Vec<sys::ibv_send_wr>,
    pub sges: Vec<sys::ibv_sge>,
    /// Last DC target (for `dc_target_switches`).
    pub last_dc: Option<(Gid, u32)>,
}

/// What a CQ needs of a QP: the ring and the credit counter.
pub(crate) struct SendShared {
    pub max_send_wr: u32,
    /// One past the last completed (or discarded) sequence. Written only
    /// under the poll lock of the QP's send CQ (`cq`), read anywhere.
    pub sq_done: AtomicU64,
    /// Written only under `st` (one writer), read by pollers lock-free.
    pub ring: SendRing,
    pub st: Mutex<SendState>,
}

// SAFETY: the raw pointers inside (`ibv_send_wr` chain buffers, AHs) are only
// used under the `st` lock by the thread posting, and AHs are thread-safe
// handles.
unsafe impl Send for SendShared {}
// SAFETY: as above; all interior mutability is behind `st` or atomics.
unsafe impl Sync for SendShared {}

impl SendShared {
    /// A send queue of `max_send_wr` (>= 1) WRs whose first sequence is
    /// `start` (its send CQ's floor, see `CqPoll::register`).
    pub(crate) fn new(max_send_wr: u32, start: u64) -> SendShared {
        SendShared {
            max_send_wr,
            sq_done: AtomicU64::new(start),
            ring: SendRing::new(max_send_wr),
            st: Mutex::new(SendState {
                posted: start,
                c: Counters::default(),
                state: QpState::Reset,
                ahs: HashMap::new(),
                wrs: Vec::new(),
                sges: Vec::new(),
                last_dc: None,
            }),
        }
    }

    /// Resolves a polled send completion: the caller's `wr_id` and the WR's
    /// opcode, freeing every slot up to it. `None` for a stale completion.
    /// Called only under the poll lock of this QP's send CQ, the only
    /// place `sq_done` is written, so a load and a store suffice (and it
    /// never moves back).
    #[inline(always)]
    pub(crate) fn complete(&self, seq: u64) -> Option<(u64, WcOpcode)> {
        let r = self.ring.lookup(seq)?;
        if seq >= self.sq_done.load(Relaxed) {
            self.sq_done.store(seq + 1, Release);
        }
        Some(r)
    }

    #[inline]
    pub(crate) fn credits(&self, st: &SendState) -> u32 {
        let used = st.posted.saturating_sub(self.sq_done.load(Acquire));
        (self.max_send_wr as u64).saturating_sub(used) as u32
    }
}

impl QpCounters for SendShared {
    fn add_counters(&self, into: &mut Counters) {
        into.add_data_path(&self.st.lock().c);
    }
}
