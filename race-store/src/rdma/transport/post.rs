//! The posting side of [`VqpTransport`]: a batch's ops as one doorbell
//! per memory node, their completions landed into results, doorbells
//! posted ahead and completed later, and the errors of each.

use super::{setup, sge_of, Quarantined, Slot, VqpTransport, BATCH_MASK, IN_FLIGHT, SLOT_SCRATCH};
use crate::layout::slot::RemotePtr;
use crate::remote::{Cause, Completions, RemoteOp, TransportError};
use krcore::{Access, MemoryRegion, PollWait, VqpError};
use krcore_nic::{
    Destination, InlineData, Nic, Payload, RemoteAddr, SendFlags, SendWr, SgList, Sge, Wc,
    WcStatus, WrOp,
};
use std::time::Instant;

impl<N: Nic> VqpTransport<N> {
    /// One doorbell per memory node for a batch of at most [`CHUNK`] ops;
    /// appends the results to `out`.
    pub(super) fn execute_chunk(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        // Lay the batch out in scratch.
        let mut offs = std::mem::take(&mut self.offs);
        let need = self.layout(batch, &mut offs);
        if let Err(e) = self.grow_scratch(need.max(8)) {
            self.offs = offs;
            return Err(e);
        }
        if batch.len() >= 1 << 24 {
            return Err(TransportError::BadResponse {
                reason: "batch of 2^24 operations or more",
            });
        }
        self.next_tag();
        let mut last = std::mem::take(&mut self.last);
        last.clear();
        last.resize(self.remotes.len(), None);
        let res = self.post_and_wait(batch, &offs, &mut last, need, out);
        if res.is_err() {
            // What is still outstanding may land late: not in a buffer
            // the next batch reads.
            self.abandon_scratch(self.batch, &last);
        }
        self.offs = offs;
        self.last = last;
        res
    }

    /// A new batch tag in `self.batch` (never 0: a free slot's tag).
    pub(super) fn next_tag(&mut self) {
        self.batch = (self.batch + 1) & BATCH_MASK;
        if self.batch == 0 {
            self.batch = 1;
        }
    }

    /// `batch` laid out in a scratch buffer: each op's offset (8-byte
    /// aligned), and the bytes they take (inline WRITEs none).
    pub(super) fn layout(&self, batch: &[RemoteOp<'_>], offs: &mut Vec<usize>) -> usize {
        offs.clear();
        let mut need = 0usize;
        for op in batch {
            offs.push(need);
            need += match op {
                RemoteOp::Read { len, .. } => *len as usize,
                RemoteOp::Write { bytes, .. } if bytes.len() > self.max_inline => bytes.len(),
                RemoteOp::Write { .. } => 0,
                RemoteOp::Cas { .. } | RemoteOp::Faa { .. } => 8,
            }
            .next_multiple_of(8);
        }
        need
    }

    /// A free slot whose scratch holds `need` bytes (made or grown here:
    /// a free slot has nothing in flight), or `None` when every slot is in
    /// flight.
    pub(super) fn free_slot(&mut self, need: usize) -> Result<Option<usize>, TransportError> {
        let k = match self.slots.iter().position(|s| s.tag == 0) {
            Some(k) => k,
            None if self.slots.len() < IN_FLIGHT => {
                let mr = self
                    .node
                    .alloc(
                        SLOT_SCRATCH.max(need).next_power_of_two(),
                        Access::LOCAL_WRITE,
                    )
                    .map_err(setup("scratch memory"))?;
                self.slots.push(Slot {
                    sge: sge_of(&mr)?,
                    mr,
                    tag: 0,
                    offs: Vec::new(),
                    need: 0,
                    last: Vec::new(),
                    waiting: 0,
                    failure: None,
                });
                self.slots.len() - 1
            }
            None => return Ok(None),
        };
        if let Some(s) = self.slots.get_mut(k) {
            if need > s.mr.len() {
                s.mr = self
                    .node
                    .alloc(need.next_power_of_two(), Access::LOCAL_WRITE)
                    .map_err(setup("scratch memory"))?;
                s.sge = sge_of(&s.mr)?;
            }
        }
        Ok(Some(k))
    }

    /// Polls the nodes slot `k` waits on until its last WRs have completed
    /// (completions of the other slot are recorded in it), or the batch
    /// timeout.
    pub(super) fn wait_slot(&mut self, k: usize, wcs: &mut [Wc]) -> Result<(), TransportError> {
        let mut start: Option<Instant> = None;
        let mut idle = PollWait::default();
        loop {
            let Some(s) = self.slots.get(k) else {
                return Ok(());
            };
            if s.waiting == 0 {
                return Ok(());
            }
            let mut found = 0;
            let pending = |slots: &[Slot<N>], n: usize| {
                slots
                    .get(k)
                    .and_then(|s| s.last.get(n).copied().flatten())
                    .is_some()
            };
            for n in 0..self.remotes.len() {
                if !pending(&self.slots, n) {
                    continue;
                }
                let Some(r) = self.remotes.get(n) else {
                    continue;
                };
                let got = r.vqp.poll(wcs).map_err(|e| vqp_error(n as u8, e))?;
                found += got;
                for wc in wcs.iter().take(got) {
                    absorb(&mut self.slots, &mut self.quarantine, n, wc);
                }
            }
            let still = self.slots.get(k).map_or(0, |s| s.waiting);
            if still > 0 && start.get_or_insert_with(Instant::now).elapsed() > self.batch_timeout {
                let node = (0..self.remotes.len())
                    .find(|&n| pending(&self.slots, n))
                    .unwrap_or(0);
                return Err(TransportError::Timeout {
                    node: node as u8,
                    after: self.batch_timeout,
                });
            }
            if still > 0 && found == 0 {
                // Nothing came: let whoever serves the VQPs run (see
                // `Vqp::idle`), waiting on a node still pending.
                if let Some(n) = (0..self.remotes.len()).find(|&n| pending(&self.slots, n)) {
                    if let Some(r) = self.remotes.get(n) {
                        r.vqp.idle(&mut idle).map_err(|e| vqp_error(n as u8, e))?;
                    }
                }
            }
        }
    }

    pub(super) fn post_and_wait(
        &mut self,
        batch: &[RemoteOp<'_>],
        offs: &[usize],
        last: &mut [Option<usize>],
        need: usize,
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        // Every op's local bytes lie in `0..need`, and `need` fits the
        // scratch buffer (`grow_scratch`): each SGE below is in range.
        if need > self.scratch_sge.length as usize {
            return Err(TransportError::BadResponse {
                reason: "batch larger than the scratch buffer",
            });
        }
        self.post_wrs(batch, offs, last, self.batch, None)?;
        // Wait for every node's last WR; an error completion fails the batch.
        // The clock is read only once a poll came back short (on the sim a
        // doorbell has usually completed by the time post_send returns).
        let mut start: Option<Instant> = None;
        let mut failure = None;
        let wcs = &mut self.wcs;
        for n in 0..last.len() {
            let (Some(Some(last_i)), Some(remote)) = (last.get(n).copied(), self.remotes.get(n))
            else {
                continue;
            };
            // Only a node's last WR is signaled: without errors its one
            // completion is all there is, and a poll asking for one entry
            // returns once it has it (the VQP skips draining the rest of
            // the shared CQ, left for the next poll). Later polls (errors
            // complete every WR; stale completions of an abandoned batch)
            // take as many as fit.
            let mut want = 1;
            let mut idle = PollWait::default();
            while last.get(n).is_some_and(Option::is_some) {
                let all = wcs.len();
                let got = wcs.get_mut(..want.min(all)).unwrap_or_default();
                want = all;
                let k = remote.vqp.poll(got).map_err(|e| vqp_error(n as u8, e))?;
                for wc in wcs.iter().take(k) {
                    if wc.wr_id >> 24 != self.batch {
                        // A doorbell of `post_into` in flight (or a
                        // completion of an abandoned batch).
                        absorb(&mut self.slots, &mut self.quarantine, n, wc);
                        continue;
                    }
                    let i = (wc.wr_id & ((1 << 24) - 1)) as usize;
                    if wc.status != WcStatus::Success && failure.is_none() {
                        failure = failure_of(batch, n as u8, i, wc.status);
                    }
                    // Every WR completes (success, error or flush), the
                    // last one last: wait for it even after an error so no
                    // completion of this batch is left for the next.
                    if i == last_i {
                        if let Some(l) = last.get_mut(n) {
                            *l = None;
                        }
                    }
                }
                if last.get(n).is_some_and(Option::is_some)
                    && start.get_or_insert_with(Instant::now).elapsed() > self.batch_timeout
                {
                    return Err(TransportError::Timeout {
                        node: n as u8,
                        after: self.batch_timeout,
                    });
                }
                if k == 0 && last.get(n).is_some_and(Option::is_some) {
                    remote
                        .vqp
                        .idle(&mut idle)
                        .map_err(|e| vqp_error(n as u8, e))?;
                }
            }
        }
        if let Some(f) = failure {
            return Err(f);
        }
        land(&self.scratch, batch, offs, need, out)
    }

    /// Builds `batch`'s WRs (tagged `tag`; local bytes in the sync scratch
    /// buffer, or in slot `slot`'s) and posts them, one doorbell per memory
    /// node with its last WR signaled; `last` gets each node's last op
    /// (after a failed post: of the nodes whose WRs, all or some, were
    /// posted).
    pub(super) fn post_wrs(
        &mut self,
        batch: &[RemoteOp<'_>],
        offs: &[usize],
        last: &mut [Option<usize>],
        tag: u64,
        slot: Option<usize>,
    ) -> Result<(), TransportError> {
        let tag = tag << 24;
        let (scratch, mr) = match slot {
            None => (self.scratch_sge, &self.scratch),
            Some(k) => match self.slots.get(k) {
                Some(s) => (s.sge, &s.mr),
                None => {
                    return Err(TransportError::BadResponse {
                        reason: "no such doorbell slot",
                    })
                }
            },
        };
        let max_inline = self.max_inline;
        let local = |off: usize, len: u32| {
            SgList::one(Sge {
                addr: scratch.addr + off as u64,
                length: len,
                lkey: scratch.lkey,
            })
        };
        for w in &mut self.wrs {
            w.clear();
        }
        for (i, (op, &off)) in batch.iter().zip(offs).enumerate() {
            let ptr = op.ptr();
            let n = usize::from(ptr.node());
            let (Some(r), Some(wrs), Some(l)) =
                (self.remotes.get(n), self.wrs.get_mut(n), last.get_mut(n))
            else {
                return Err(TransportError::NoSuchNode { node: ptr.node() });
            };
            let remote = RemoteAddr {
                addr: r.info.base + ptr.offset(),
                rkey: r.info.rkey,
            };
            // Built in place, unsignaled; the node's last one is signaled
            // below.
            let (op, payload) = match *op {
                RemoteOp::Read { len, .. } => {
                    (WrOp::Read { remote }, Payload::Local(local(off, len)))
                }
                RemoteOp::Write { bytes, .. } => {
                    let inline = (bytes.len() <= max_inline)
                        .then(|| InlineData::new(bytes))
                        .flatten();
                    let payload = match inline {
                        Some(d) => Payload::Inline(d),
                        None => {
                            mr.write(off, bytes).map_err(setup("scratch copy"))?;
                            Payload::Local(local(off, bytes.len() as u32))
                        }
                    };
                    (WrOp::Write { remote }, payload)
                }
                RemoteOp::Cas { expect, new, .. } => (
                    WrOp::CompareSwap {
                        remote,
                        compare: expect,
                        swap: new,
                    },
                    Payload::Local(local(off, 8)),
                ),
                RemoteOp::Faa { add, .. } => (
                    WrOp::FetchAdd { remote, add },
                    Payload::Local(local(off, 8)),
                ),
            };
            wrs.push(SendWr {
                wr_id: tag | i as u64,
                op,
                payload,
                flags: SendFlags::NONE,
                dest: Destination::Connected,
            });
            *l = Some(i);
        }
        // One doorbell per memory node, its last WR signaled.
        for (n, (wrs, remote)) in self.wrs.iter_mut().zip(&self.remotes).enumerate() {
            if let Some(w) = wrs.last_mut() {
                w.flags = SendFlags::SIGNALED;
                let posted = match remote.vqp.post(wrs) {
                    // An error completion (a node that was down, a revoked
                    // registration) cleared the VQP's target: connect again
                    // (a DCCache miss, one meta READ) and retry once, so one
                    // failed batch does not leave the transport unusable.
                    Err(krcore::Error::Vqp(VqpError::NotConnected { .. })) => {
                        remote
                            .vqp
                            .connect(remote.info.gid)
                            .map_err(|_| TransportError::NodeDown { node: n as u8 })?;
                        remote.vqp.post(wrs)
                    }
                    other => other,
                };
                if let Err(e) = posted {
                    // Nothing was posted but for a refusal by the NIC (its
                    // first WRs were), and nothing of the later nodes.
                    let partial = matches!(e, krcore::Error::Vqp(VqpError::Post(_)));
                    for (m, l) in last.iter_mut().enumerate().skip(n) {
                        if m > n || !partial {
                            *l = None;
                        }
                    }
                    return Err(vqp_error(n as u8, e));
                }
            }
        }
        Ok(())
    }
}

pub(super) fn slot_mut<N: Nic>(
    slots: &mut [Slot<N>],
    k: usize,
) -> Result<&mut Slot<N>, TransportError> {
    slots.get_mut(k).ok_or(TransportError::BadResponse {
        reason: "no such doorbell slot",
    })
}

/// Records a completion of a doorbell in flight in its slot; one of an
/// abandoned batch frees its quarantined buffer once the batch has no WR
/// outstanding.
pub(super) fn absorb<N: Nic>(
    slots: &mut [Slot<N>],
    quarantine: &mut Vec<Quarantined<N>>,
    node: usize,
    wc: &Wc,
) {
    let tag = wc.wr_id >> 24;
    let Some(s) = slots.iter_mut().find(|s| s.tag != 0 && s.tag == tag) else {
        let i = (wc.wr_id & ((1 << 24) - 1)) as usize;
        if let Some(at) = quarantine.iter().position(|q| q.tag == tag) {
            let q = quarantine.get_mut(at);
            if let Some(l) = q.and_then(|q| q.last.get_mut(node)) {
                if *l == Some(i) {
                    *l = None;
                }
            }
            if quarantine
                .get(at)
                .is_some_and(|q| q.last.iter().all(Option::is_none))
            {
                quarantine.remove(at);
            }
        }
        return;
    };
    let i = (wc.wr_id & ((1 << 24) - 1)) as usize;
    if wc.status != WcStatus::Success && s.failure.is_none() {
        s.failure = Some((node as u8, i, wc.status));
    }
    if let Some(l) = s.last.get_mut(node) {
        if *l == Some(i) {
            *l = None;
            s.waiting = s.waiting.saturating_sub(1);
        }
    }
}

/// The error of op `i` of `batch` that completed with `status` on `node`.
pub(super) fn failure_of(
    batch: &[RemoteOp<'_>],
    node: u8,
    i: usize,
    status: WcStatus,
) -> Option<TransportError> {
    let op = batch.get(i).or(batch.last())?;
    let len = match op {
        RemoteOp::Read { len, .. } => u64::from(*len),
        RemoteOp::Write { bytes, .. } => bytes.len() as u64,
        _ => 8,
    };
    Some(status_error(node, op.ptr(), len, status))
}

/// The results of a completed doorbell into `out`: the landing area in one
/// copy out of `mr` (READ bytes and atomic results; the few bytes of
/// non-inline WRITE sources ride along), then each result names its part
/// of it.
pub(super) fn land<N: Nic>(
    mr: &MemoryRegion<N>,
    batch: &[RemoteOp<'_>],
    offs: &[usize],
    need: usize,
    out: &mut Completions,
) -> Result<(), TransportError> {
    let (base, landing) = out.reserve(need);
    if need > 0 {
        mr.read(0, landing).map_err(setup("scratch read"))?;
    }
    let bad = || TransportError::BadResponse {
        reason: "result outside the landing area",
    };
    for (op, &off) in batch.iter().zip(offs) {
        match op {
            RemoteOp::Read { len, .. } => {
                if !out.push_read_at(base + off, *len as usize) {
                    return Err(bad());
                }
            }
            RemoteOp::Write { .. } => out.push_written(),
            RemoteOp::Cas { .. } => out.push_cas(out.word_at(base + off).ok_or_else(bad)?),
            RemoteOp::Faa { .. } => out.push_faa(out.word_at(base + off).ok_or_else(bad)?),
        }
    }
    Ok(())
}

pub(super) fn vqp_error(node: u8, e: krcore::Error) -> TransportError {
    TransportError::Refused {
        node,
        source: Cause::new(e),
    }
}

pub(super) fn status_error(node: u8, ptr: RemotePtr, len: u64, status: WcStatus) -> TransportError {
    match status {
        WcStatus::RetryExcErr => TransportError::NodeDown { node },
        WcStatus::RemAccessErr => TransportError::OutOfBounds { ptr, len },
        WcStatus::RemInvReqErr => TransportError::Misaligned { ptr },
        other => TransportError::Failed {
            node,
            status: other,
        },
    }
}
