//! Sim completion queues: the CQE layout of a CQ ring in shared memory,
//! pushing a completion, and `SimCq` (polling, overflow).

use super::ctl::{self, QpEntry};
use super::device::NodeInner;
use super::ring::Ring;
use super::shm::{now_ns, Segment};
use crate::error::{NicError, Result};
use crate::provider::CompletionQueue;
use crate::types::*;
use parking_lot::Mutex;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Arc, Weak};

// Completion queue entries

/// Words of a CQ ring cell: sequence + 6 payload words (wr_id, sq_seq,
/// visible_at, byte_len | imm << 32, qpn | src_qp << 32, flags).
pub(crate) const CQE_WORDS: usize = 7;

/// A completion as stored in a CQ ring.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cqe {
    pub wr_id: u64,
    /// For send completions: the send-queue sequence it completes.
    pub sq_seq: Option<u64>,
    pub visible_at: u64,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qpn: u32,
    pub src_qp: u32,
    pub status: WcStatus,
    pub opcode: WcOpcode,
}

impl Cqe {
    pub(crate) fn encode(&self) -> [u64; CQE_WORDS - 1] {
        let flags = self.status as u64
            | (self.opcode as u64) << 8
            | (self.imm.is_some() as u64) << 16
            | (self.sq_seq.is_some() as u64) << 17;
        [
            self.wr_id,
            self.sq_seq.unwrap_or(0),
            self.visible_at,
            self.byte_len as u64 | (self.imm.unwrap_or(0) as u64) << 32,
            self.qpn as u64 | (self.src_qp as u64) << 32,
            flags,
        ]
    }

    pub(crate) fn decode(p: &[u64]) -> Cqe {
        let flags = p[5];
        Cqe {
            wr_id: p[0],
            sq_seq: (flags >> 17 & 1 == 1).then_some(p[1]),
            visible_at: p[2],
            byte_len: p[3] as u32,
            imm: (flags >> 16 & 1 == 1).then_some((p[3] >> 32) as u32),
            qpn: p[4] as u32,
            src_qp: (p[4] >> 32) as u32,
            status: WcStatus::from_u8(flags as u8),
            opcode: WcOpcode::from_u8((flags >> 8) as u8),
        }
    }
}

/// Pushes a completion into a CQ ring; on overflow marks the CQ in error (the
/// completion is lost, and `poll` reports it).
#[inline]
pub(crate) fn push_cqe(seg: &Segment, cqe: &Cqe) {
    let ring = Ring::attach(seg, 0, CQE_WORDS);
    if !ring.push(&cqe.encode()) {
        ring.set_overflowed();
    }
}

pub(crate) struct CqInner {
    pub node: Arc<NodeInner>,
    pub idx: u32,
    pub gen: u32,
    pub seg: Arc<Segment>,
    pub(crate) name: String,
    pub(crate) cap: u32,
    /// QPs with send work waiting (RNR) that polling must drive forward.
    pub pending: Mutex<Vec<Weak<dyn Drive>>>,
    pub pending_count: AtomicUsize,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        ctl::cq_invalidate(&self.node.ctl, self.idx);
        self.node.fabric.remove_segment(&self.name);
    }
}

/// A completion queue of a sim node, in shared memory (remote senders push
/// receive completions into it).
#[derive(Clone)]
pub struct SimCq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for SimCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCq")
            .field("idx", &self.inner.idx)
            .field("depth", &self.inner.cap)
            .finish()
    }
}

impl CompletionQueue for SimCq {
    fn depth(&self) -> u32 {
        self.inner.cap
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let cq = &self.inner;
        if cq.pending_count.load(Acquire) > 0 {
            self.drive_pending();
        }
        let ring = Ring::attach(&cq.seg, 0, CQE_WORDS);
        let now = if cq.node.config.latency.is_some() {
            now_ns()
        } else {
            u64::MAX
        };
        let mut n = 0;
        let mut buf = [0u64; CQE_WORDS - 1];
        while n < out.len() && ring.pop_if(&mut buf, |p| p[2] <= now) {
            let c = Cqe::decode(&buf);
            if let Some(seq) = c.sq_seq {
                if let Some((e, _)) = QpEntry::by_qpn(&cq.node.ctl, c.qpn) {
                    e.sq_done()
                        .fetch_max(seq + 1, std::sync::atomic::Ordering::AcqRel);
                }
            }
            if c.status != WcStatus::Success {
                cq.node.counters.error_completions.fetch_add(1, Relaxed);
            }
            out[n] = Wc {
                wr_id: c.wr_id,
                status: c.status,
                opcode: c.opcode,
                byte_len: c.byte_len,
                imm: c.imm,
                qp_num: c.qpn,
                src_qp: c.src_qp,
            };
            n += 1;
        }
        if n == 0 && ring.overflowed() {
            return Err(NicError::CqOverflow { depth: cq.cap });
        }
        Ok(n)
    }
}

/// A QP whose send work waits on a receiver (RNR), as the CQ it
/// completes on sees it: polling the CQ drives it. (A trait, so that the
/// CQ does not name the QP that holds it.)
pub(crate) trait Drive: Send + Sync {
    /// Retries the waiting work; whether work is still waiting.
    fn drive(self: Arc<Self>) -> bool;
}

impl SimCq {
    fn drive_pending(&self) {
        let mut list = self.inner.pending.lock();
        list.retain(|w| match w.upgrade() {
            Some(qp) => qp.drive(),
            None => false,
        });
        self.inner.pending_count.store(list.len(), Relaxed);
    }

    /// Registers a QP whose send work waits on a receiver (RNR), so polling
    /// this CQ keeps retrying it.
    pub(crate) fn add_pending(&self, qp: Weak<dyn Drive>) {
        let mut list = self.inner.pending.lock();
        if !list.iter().any(|w| w.ptr_eq(&qp)) {
            list.push(qp);
        }
        self.inner.pending_count.store(list.len(), Relaxed);
    }
}
