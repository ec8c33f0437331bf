//! A sim QP's state, below its execution (`exec`) and its verbs (`qp`):
//! the send queue's pending WRs and caches (`SendState`, under the send
//! lock), and `QpInner`, what a QP holds (its node, table entry, CQs,
//! receive ring).

use super::cq::SimCq;
use super::ctl::QpEntry;
use super::device::{NodeInner, QpCounters};
use super::recv::SimSrq;
use super::shm::Segment;
use super::target::TargetCache;
use crate::counters::Counters;
use crate::types::*;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

pub(crate) struct Pending {
    pub wr: SendWr,
    pub seq: u64,
    /// RNR retries spent.
    pub rnr_tries: u32,
    /// When the next RNR retry may happen (0: not blocked yet).
    pub next_try_ns: u64,
}

/// Mutable send-side state, guarded by the QP's send lock.
pub(crate) struct SendState {
    pub posted: u64,
    pub pending: VecDeque<Pending>,
    pub rnr_retry: u8,
    pub peer: Option<RcPeer>,
    pub last_dc: Option<(Gid, u32)>,
    pub last_visible: u64,
    pub on_cq_pending_list: bool,
    pub target: TargetCache,
    pub c: Counters,
}

pub(crate) struct QpInner {
    pub node: Arc<NodeInner>,
    pub idx: u32,
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: u32,
    pub caps: QpCaps,
    pub send_cq: SimCq,
    pub recv_cq: SimCq,
    #[allow(dead_code)]
    pub srq: Option<SimSrq>,
    pub rq: Option<(Arc<Segment>, String)>,
    pub send: Mutex<SendState>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let e = self.entry();
        e.free();
        if let Some((_, name)) = &self.rq {
            self.node.fabric.remove_segment(name);
        }
        let st = self.send.get_mut();
        let mut r = self.node.retired.lock();
        r.add_data_path(&st.c);
        self.node.counters.qps_destroyed.fetch_add(1, Relaxed);
    }
}

impl QpInner {
    pub(crate) fn entry(&self) -> QpEntry<'_> {
        QpEntry::new(&self.node.ctl, self.idx)
    }

    pub(crate) fn state(&self) -> QpState {
        self.entry().state_word().state
    }
}

impl QpCounters for QpInner {
    fn add_counters(&self, into: &mut Counters) {
        into.add_data_path(&self.send.lock().c);
    }
}
