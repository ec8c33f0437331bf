//! Receive queues: the layout of a receive ring's entries, posting to and
//! flushing a ring, and shared receive queues (`SimSrq`).

use super::cq::{push_cqe, Cqe};
use super::ctl;
use super::device::NodeInner;
use super::ring::Ring;
use super::shm::Segment;
use crate::error::{PostError, PostErrorKind};
use crate::provider::SharedReceiveQueue;
use crate::types::*;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

// Receive queue entries

/// Words of a receive ring cell: sequence, wr_id, SGE count, 4 x (addr,
/// len | lkey << 32).
pub(crate) const RWQE_WORDS: usize = 3 + 2 * MAX_SGE;

pub(crate) fn encode_recv(wr: &RecvWr) -> [u64; RWQE_WORDS - 1] {
    let mut p = [0u64; RWQE_WORDS - 1];
    p[0] = wr.wr_id;
    let sges = wr.sg.as_slice();
    p[1] = sges.len() as u64;
    for (i, s) in sges.iter().enumerate() {
        p[2 + 2 * i] = s.addr;
        p[3 + 2 * i] = s.length as u64 | (s.lkey as u64) << 32;
    }
    p
}

pub(crate) fn decode_recv(p: &[u64]) -> RecvWr {
    let n = (p[1] as usize).min(MAX_SGE);
    let mut sges = [Sge::default(); MAX_SGE];
    for (i, s) in sges.iter_mut().enumerate().take(n) {
        *s = Sge {
            addr: p[2 + 2 * i],
            length: p[3 + 2 * i] as u32,
            lkey: (p[3 + 2 * i] >> 32) as u32,
        };
    }
    RecvWr {
        wr_id: p[0],
        sg: SgList::from_slice(&sges[..n]).unwrap_or_default(),
    }
}

/// Pushes receive WRs into a ring, refusing malformed ones and stopping when
/// the ring is full.
pub(crate) fn post_recv_ring(
    seg: &Segment,
    wrs: &[RecvWr],
    max_sge: u32,
) -> std::result::Result<(), PostError> {
    let ring = Ring::attach(seg, 0, RWQE_WORDS);
    for (index, wr) in wrs.iter().enumerate() {
        if wr.sg.as_slice().len() > max_sge as usize {
            return Err(PostError {
                index,
                kind: PostErrorKind::Malformed("more SGEs than max_recv_sge"),
            });
        }
        if !ring.push(&encode_recv(wr)) {
            return Err(PostError {
                index,
                kind: PostErrorKind::QueueFull {
                    depth: ring.capacity() as u32,
                },
            });
        }
    }
    Ok(())
}

pub(crate) struct SrqInner {
    pub node: Arc<NodeInner>,
    pub idx: u32,
    pub gen: u32,
    pub seg: Arc<Segment>,
    pub(crate) name: String,
    pub(crate) max_sge: u32,
    #[allow(dead_code)]
    pub(crate) pd: u32,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        ctl::srq_invalidate(&self.node.ctl, self.idx);
        self.node.fabric.remove_segment(&self.name);
    }
}

/// A shared receive queue of a sim node.
#[derive(Clone)]
pub struct SimSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for SimSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSrq")
            .field("idx", &self.inner.idx)
            .finish()
    }
}

impl SharedReceiveQueue for SimSrq {
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let r = post_recv_ring(&self.inner.seg, wrs, self.inner.max_sge);
        let posted = r.as_ref().map(|_| wrs.len()).unwrap_or_else(|e| e.index);
        self.inner
            .node
            .counters
            .recv_wrs
            .fetch_add(posted as u64, Relaxed);
        r
    }

    fn free_slots(&self) -> u32 {
        let ring = Ring::attach(&self.inner.seg, 0, RWQE_WORDS);
        (ring.capacity() - ring.len().min(ring.capacity())) as u32
    }
}

/// Flushes a receive ring into a CQ (used by the owner and by a remote sender
/// that moved the owner's QP to ERR).
pub(crate) fn flush_recv_ring(rq: &Segment, cq: &Segment, qpn: u32) {
    let ring = Ring::attach(rq, 0, RWQE_WORDS);
    let mut buf = [0u64; RWQE_WORDS - 1];
    while ring.pop(&mut buf) {
        push_cqe(
            cq,
            &Cqe {
                wr_id: buf[0],
                qpn,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                ..Cqe::default()
            },
        );
    }
}
