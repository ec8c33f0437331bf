//! The completion-queue side of the fault wrapper: holds completions back
//! and interleaves different queues, never reordering one queue.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Ctl, Rng};
use crate::error::Result;
use crate::provider::{CompletionQueue, Nic};
use crate::types::{Wc, WcOpcode};

/// A completion held by the wrapper.
#[derive(Clone, Copy, Debug)]
struct Held {
    wc: Wc,
    /// Returned no earlier than this poll number.
    ready_at: u64,
    /// Arrival order (to return in order when not reordering).
    seq: u64,
    /// Belongs to an incarnation of its QP that was reset since.
    stale: bool,
}

/// One ordered stream: a QP's send queue or a receive queue.
#[derive(Debug)]
struct Stream {
    qpn: u32,
    recv: bool,
    q: VecDeque<Held>,
}

#[derive(Debug)]
struct CqState {
    rng: Rng,
    polls: u64,
    seq: u64,
    streams: Vec<Stream>,
}

struct CqShared<N: Nic> {
    inner: N::Cq,
    ctl: Arc<Ctl<N>>,
    st: Mutex<CqState>,
}

/// A completion queue of a [`super::FaultNic`].
pub struct FaultCq<N: Nic> {
    s: Arc<CqShared<N>>,
}

impl<N: Nic> Clone for FaultCq<N> {
    fn clone(&self) -> Self {
        FaultCq { s: self.s.clone() }
    }
}

impl<N: Nic> std::fmt::Debug for FaultCq<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.s.st.lock();
        let held: usize = st.streams.iter().map(|s| s.q.len()).sum();
        f.debug_struct("FaultCq")
            .field("depth", &self.s.inner.depth())
            .field("held", &held)
            .finish()
    }
}

fn is_recv(op: WcOpcode) -> bool {
    matches!(op, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

const PULL_BATCH: usize = 32;

impl<N: Nic> FaultCq<N> {
    pub(super) fn new(inner: N::Cq, ctl: Arc<Ctl<N>>, rng: Rng) -> FaultCq<N> {
        FaultCq {
            s: Arc::new(CqShared {
                inner,
                ctl,
                st: Mutex::new(CqState {
                    rng,
                    polls: 0,
                    seq: 0,
                    streams: Vec::new(),
                }),
            }),
        }
    }

    /// The wrapped CQ.
    pub fn inner(&self) -> &N::Cq {
        &self.s.inner
    }

    /// Completions held back right now.
    pub fn held(&self) -> usize {
        self.s.st.lock().streams.iter().map(|s| s.q.len()).sum()
    }

    /// Moves everything the inner CQ has into the held streams.
    fn pull(&self, st: &mut CqState) -> Result<()> {
        let cfg = &self.s.ctl.cfg;
        let mut buf = [Wc::default(); PULL_BATCH];
        loop {
            let k = self.s.inner.poll(&mut buf)?;
            for wc in &buf[..k] {
                let delay = if st.rng.chance(cfg.delay_ppm) && cfg.max_delay_polls > 0 {
                    1 + st.rng.below(u64::from(cfg.max_delay_polls))
                } else {
                    0
                };
                if delay > 0 {
                    self.s.ctl.stats.delayed.fetch_add(1, Relaxed);
                }
                let held = Held {
                    wc: *wc,
                    ready_at: st.polls + delay,
                    seq: st.seq,
                    stale: false,
                };
                st.seq += 1;
                let recv = is_recv(wc.opcode);
                match st
                    .streams
                    .iter_mut()
                    .find(|s| s.qpn == wc.qp_num && s.recv == recv)
                {
                    Some(s) => s.q.push_back(held),
                    None => st.streams.push(Stream {
                        qpn: wc.qp_num,
                        recv,
                        q: VecDeque::from([held]),
                    }),
                }
            }
            if k < buf.len() {
                return Ok(());
            }
        }
    }

    /// After QP `qpn` was reset: what its streams hold belongs to the old
    /// incarnation (returned later, crediting nothing).
    pub(super) fn mark_stale(&self, qpn: u32) -> Result<()> {
        let mut st = self.s.st.lock();
        self.pull(&mut st)?;
        for s in st.streams.iter_mut().filter(|s| s.qpn == qpn) {
            for h in s.q.iter_mut() {
                h.stale = true;
            }
        }
        Ok(())
    }
}

impl<N: Nic> CompletionQueue for FaultCq<N> {
    fn depth(&self) -> u32 {
        self.s.inner.depth()
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        // A resumed node's held WRs execute first (before the CQ's lock:
        // the inner provider may complete them into this CQ).
        self.s.ctl.release_held();
        let mut st = self.s.st.lock();
        st.polls += 1;
        self.pull(&mut st)?;
        let now = st.polls;
        let mut n = 0;
        while n < out.len() {
            // Streams whose head is ready; a stream's later completions wait
            // for its head, so one queue is never reordered.
            let ready: Vec<usize> = st
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| s.q.front().is_some_and(|h| h.ready_at <= now))
                .map(|(i, _)| i)
                .collect();
            if ready.is_empty() {
                break;
            }
            let oldest = *ready
                .iter()
                .min_by_key(|&&i| st.streams[i].q.front().map(|h| h.seq))
                .expect("non-empty");
            let pick = if self.s.ctl.cfg.reorder {
                ready[st.rng.below(ready.len() as u64) as usize]
            } else {
                oldest
            };
            // Returned ahead of a completion that arrived earlier?
            let pick_seq = st.streams[pick].q.front().map(|h| h.seq);
            let earliest = st
                .streams
                .iter()
                .filter_map(|s| s.q.front().map(|h| h.seq))
                .min();
            if pick_seq != earliest {
                self.s.ctl.stats.reordered.fetch_add(1, Relaxed);
            }
            let h = st.streams[pick].q.pop_front().expect("ready head");
            if st.streams[pick].q.is_empty() {
                st.streams.swap_remove(pick);
            }
            let mut wc = h.wc;
            if h.stale {
                self.s.ctl.stats.stale.fetch_add(1, Relaxed);
            } else if !is_recv(wc.opcode) {
                if let Some(qp) = self.s.ctl.qp(wc.qp_num) {
                    qp.on_send_completion(&mut wc);
                }
            }
            out[n] = wc;
            n += 1;
        }
        Ok(n)
    }
}
