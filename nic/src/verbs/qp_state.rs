//! What a verbs QP holds (`QpInner`: the `ibv_qp`, its send side, CQs,
//! SRQ and PD, and a DCI's extended handles), and its teardown; below the
//! WR building (`wr`, `dc`) and the QP's verbs (`qp`).

use super::cq::VerbsCq;
use super::ffi::sys;
use super::mr::PdInner;
use super::send::SendShared;
use super::srq::VerbsSrq;
use crate::counters::Counters;
use crate::types::*;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Owner of an `ibv_qp`.
pub(crate) struct QpInner {
    pub qp: *mut sys::ibv_qp,
    pub qpn: u32,
    pub qp_type: QpType,
    pub caps: QpCaps,
    /// Owner id of its receives in the device's receive table.
    pub owner: u64,
    pub has_rq: bool,
    pub shared: Arc<SendShared>,
    /// Extended QP handles of a DCI (`None` for other types).
    pub dc: Option<super::mlx5::DciHandles>,
    pub send_cq: VerbsCq,
    pub _recv_cq: VerbsCq,
    pub _srq: Option<VerbsSrq>,
    pub pd: Arc<PdInner>,
}

// SAFETY: the QP handle is only passed to thread-safe libibverbs calls;
// posting is serialized by `shared.st`.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // Before the QP number can be reused (the device frees it in
        // `ibv_destroy_qp`): out of the send CQ's table, its sequences
        // below the CQ's floor.
        let posted = self.shared.st.lock().posted;
        self.send_cq.inner.poll.lock().unregister(self.qpn, posted);
        // SAFETY: `qp` came from `ibv_create_qp`/`mlx5dv_create_qp` and is
        // destroyed once; its CQs, SRQ and PD outlive it (fields).
        unsafe { sys::ibv_destroy_qp(self.qp) };
        let dev = &self.pd.dev;
        dev.recv.release_owner(self.owner);
        let mut st = self.shared.st.lock();
        dev.retired.lock().add_data_path(&st.c);
        st.c = Counters::default();
        dev.counters.qps_destroyed.fetch_add(1, Relaxed);
    }
}
