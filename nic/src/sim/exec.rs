//! Execution of one send work request, with every check a NIC makes.
//!
//! The initiator executes one-sided operations directly on the target's
//! shared memory (no target CPU), after resolving and validating:
//! 1. the destination: a live node on this fabric (else `RETRY_EXC_ERR`), a
//!    target QP that exists, has the right type, is ready to receive (RTR or
//!    RTS) and, for RC, is connected back to us (else `RETRY_EXC_ERR`: its
//!    NIC drops our packets); a DCT's `dc_key` (else `REM_ACCESS_ERR`); a UD
//!    destination's `qkey` (else the datagram is silently dropped);
//! 2. local SGEs: lkey valid and current, same PD, inside the MR, and
//!    `LOCAL_WRITE` where the NIC writes (else `LOC_PROT_ERR`);
//! 3. the remote range: rkey valid and current (a deregistered MR's key is
//!    stale), MR in the target QP's PD, access flag on both the MR and the
//!    target QP, range inside the MR (else `REM_ACCESS_ERR`); atomics 8-byte
//!    aligned (else `REM_INV_REQ_ERR`);
//! 4. two-sided: a posted receive (else receiver-not-ready, retried by the
//!    QP, silent drop on UD), receive SGEs valid at the target (else the
//!    receiver gets `LOC_PROT_ERR` and the sender `REM_OP_ERR`), a buffer
//!    large enough (else `LOC_LEN_ERR` at the receiver, `REM_INV_REQ_ERR` at
//!    the sender); an RC receiver that fails enters ERR.

use super::cq::{push_cqe, Cqe};
use super::ctl::{self, QpEntry};
use super::device::NodeInner;
use super::fabric::{FabricInner, GidOf};
use super::qp_state::{QpInner, SendState};
use super::recv::{decode_recv, flush_recv_ring, RWQE_WORDS};
use super::ring::Ring;
use super::shm::{now_ns, Segment};
use super::target::*;
use crate::types::*;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::Arc;

/// What executing a WR produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Finished with `status` (its completion is due if signaled or failed).
    Done { status: WcStatus, byte_len: u32 },
    /// A two-sided message found no receive buffer: retry later.
    ReceiverNotReady,
}

fn done(status: WcStatus) -> Outcome {
    Outcome::Done {
        status,
        byte_len: 0,
    }
}

const K_CQ: u8 = 2;
const K_SRQ: u8 = 3;
const K_RQ: u8 = 4;

/// A resolved piece of memory: `len` bytes at `off` in the MR held by cache
/// entry `mr`.
#[derive(Clone, Copy, Default)]
struct Piece {
    mr: u8,
    off: usize,
    len: usize,
}

/// Up to MAX_SGE pieces without allocating.
#[derive(Clone, Copy, Default)]
struct Pieces {
    n: usize,
    p: [Piece; MAX_SGE],
}

impl Pieces {
    fn push(&mut self, piece: Piece) {
        if self.n < MAX_SGE {
            self.p[self.n] = piece;
            self.n += 1;
        }
    }
    fn as_slice(&self) -> &[Piece] {
        &self.p[..self.n]
    }
    fn total(&self) -> usize {
        self.as_slice().iter().map(|p| p.len).sum()
    }
}

/// Where the bytes of a WRITE or SEND come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Pieces(Pieces),
    Bytes(&'a [u8]),
}

/// Copies the source stream (optionally preceded by `prefix`) into the
/// destination pieces, in order. Every piece was validated against its MR.
fn transfer(cache: &TargetCache, prefix: &[u8], src: &Source<'_>, dst: &Pieces) {
    let seg = |p: &Piece| cache.mrs[p.mr as usize].as_ref().map(|m| &*m.seg);
    // Fast path: one piece to one piece of the same length (nearly every
    // READ, WRITE and atomic result).
    if prefix.is_empty() && dst.n == 1 {
        let d = &dst.p[0];
        match src {
            Source::Pieces(ps) if ps.n == 1 && ps.p[0].len == d.len => {
                if let (Some(ss), Some(ds)) = (seg(&ps.p[0]), seg(d)) {
                    let _ = ss.copy_to(ps.p[0].off, ds, d.off, d.len);
                }
                return;
            }
            Source::Bytes(b) if b.len() == d.len => {
                if let Some(ds) = seg(d) {
                    let _ = ds.copy_in(d.off, b);
                }
                return;
            }
            _ => {}
        }
    }
    let mut di = 0;
    let mut doff = 0;
    let mut put = |bytes: Option<&[u8]>, from: Option<(&Segment, usize)>, mut len: usize| {
        let mut consumed = 0;
        while len > 0 && di < dst.n {
            let d = &dst.p[di];
            let n = len.min(d.len - doff);
            if let Some(dseg) = seg(d) {
                // Ranges were validated against their MRs; a failure here
                // would be a sim bug and is ignored rather than crashing.
                match (bytes, from) {
                    (Some(b), _) => {
                        let _ = dseg.copy_in(d.off + doff, &b[consumed..consumed + n]);
                    }
                    (None, Some((s, so))) => {
                        let _ = s.copy_to(so + consumed, dseg, d.off + doff, n);
                    }
                    _ => {}
                }
            }
            consumed += n;
            len -= n;
            doff += n;
            if doff == d.len {
                di += 1;
                doff = 0;
            }
        }
    };
    if !prefix.is_empty() {
        put(Some(prefix), None, prefix.len());
    }
    match src {
        Source::Bytes(b) => put(Some(b), None, b.len()),
        Source::Pieces(ps) => {
            for p in ps.as_slice() {
                if let Some(s) = seg(p) {
                    put(None, Some((s, p.off)), p.len);
                }
            }
        }
    }
}

pub(crate) struct Exec<'a> {
    pub qp: &'a Arc<QpInner>,
    pub st: &'a mut SendState,
}

impl Exec<'_> {
    fn node(&self) -> &NodeInner {
        &self.qp.node
    }

    fn fabric(&self) -> &FabricInner {
        &self.qp.node.fabric
    }

    /// A segment of node `(slot, gen)`, through the per-QP cache.
    fn segment(
        &mut self,
        slot: u32,
        gen: u32,
        kind: u8,
        idx: u32,
        objgen: u32,
    ) -> Option<Arc<Segment>> {
        let key = seg_key(slot, gen, kind, idx, objgen);
        for (k, s) in self.st.target.segs.iter().flatten() {
            if *k == key {
                return Some(s.clone());
            }
        }
        let what = match kind {
            K_CQ => format!("cq{idx}g{objgen}"),
            K_SRQ => format!("srq{idx}g{objgen}"),
            _ => format!("rq{idx}g{objgen}"),
        };
        let seg = self
            .fabric()
            .open_segment(&FabricInner::seg_name(slot, gen, &what))?;
        let t = &mut self.st.target;
        t.segs[t.seg_next] = Some((key, seg.clone()));
        t.seg_next = (t.seg_next + 1) % SEG_CACHE;
        Some(seg)
    }

    /// Resolves a destination (GID, QP number) to a live node, leaving it in
    /// the cache's `node` entry; returns its `(slot, generation)`. A node's
    /// GID names the node; a host's GID, the live node of the host that has
    /// QP `qpn` (see the fabric's docs), looked up again when the cached
    /// one died (the host's process restarted).
    fn target_node(&mut self, gid: &Gid, qpn: u32) -> Option<(u32, u32)> {
        let is = |c: &CachedNode| c.gid == *gid && (c.qpn == 0 || c.qpn == qpn) && c.ctl.is_some();
        let t = &mut self.st.target;
        if !t.node.as_ref().is_some_and(is) {
            // An earlier target again: swap it back in.
            if let Some(i) = t.spare.iter().position(|c| c.as_ref().is_some_and(is)) {
                std::mem::swap(&mut t.node, &mut t.spare[i]);
            }
        }
        let cached = t
            .node
            .as_ref()
            .filter(|c| is(c))
            .map(|c| (c.slot, c.gen, c.checked_ns, c.local_pid, c.qpn != 0));
        if let Some((slot, gen, checked_ns, local_pid, host)) = cached {
            // Same-process nodes: the slot word is the truth. Others: the pid
            // check is trusted for `liveness_interval`.
            let state = self.fabric().slot_state(slot);
            let mut live = state & 0xff == super::fabric::SLOT_ALIVE && state >> 8 == gen as u64;
            if live && (local_pid == 0 || local_pid != super::shm::pid()) {
                let now = now_ns();
                let interval = self.node().config.liveness_interval.as_nanos() as u64;
                if now.saturating_sub(checked_ns) > interval {
                    live = self.fabric().slot_alive_within(slot, gen as u64, interval);
                    if let (true, Some(c)) = (live, &mut self.st.target.node) {
                        c.checked_ns = now;
                    }
                }
            }
            if live {
                return Some((slot, gen));
            }
            if !host {
                return None;
            }
            self.st.target.node = None;
        }
        let (slot, gen, ctl_seg, cached_qpn) = match self.fabric().parse_gid(gid)? {
            GidOf::Node(slot, gen) => {
                let interval = self.node().config.liveness_interval.as_nanos() as u64;
                if !self.fabric().slot_alive_within(slot, gen as u64, interval) {
                    return None;
                }
                let ctl_seg = self
                    .fabric()
                    .open_segment(&FabricInner::seg_name(slot, gen, "ctl"))?;
                if !ctl::valid(&ctl_seg) {
                    return None;
                }
                (slot, gen, ctl_seg, 0)
            }
            GidOf::Host(host) => {
                let (slot, gen, ctl_seg) = super::host::node_of(self.fabric(), host, qpn)?;
                (slot, gen, ctl_seg, qpn)
            }
        };
        let local_pid = if self.fabric().slot_pid_is_self(slot) {
            super::shm::pid()
        } else {
            0
        };
        let t = &mut self.st.target;
        if let Some(old) = t.node.take() {
            t.spare[t.spare_next] = Some(old);
            t.spare_next = (t.spare_next + 1) % SPARE_NODES;
        }
        t.node = Some(CachedNode {
            gid: *gid,
            qpn: cached_qpn,
            slot,
            gen,
            ctl: Some(ctl_seg),
            checked_ns: now_ns(),
            local_pid,
        });
        Some((slot, gen))
    }

    /// The MR a key names on node `(slot, gen)`, through the validated
    /// cache; returns its cache index (pinned for the current WR).
    #[inline(always)]
    fn mr(&mut self, slot: u32, gen: u32, ctl_seg: &Segment, key: u32) -> Option<u8> {
        let nk = node_key(slot, gen);
        let home = mr_home(nk, key);
        let t = &mut self.st.target;
        // Probe the home entry first, then the rest.
        let found = match &t.mrs[home] {
            Some(m) if m.node == nk && m.key == key => Some(home),
            _ => t
                .mrs
                .iter()
                .position(|e| matches!(e, Some(m) if m.node == nk && m.key == key)),
        };
        if let Some(i) = found {
            // (A strict entry's `state` never matches: it takes the
            // counted path below.)
            let state = t.mrs[i].as_ref().map(|m| m.state);
            if ctl::mr_state_for_key(ctl_seg, key) == state {
                t.pinned |= 1 << i;
                return Some(i as u8);
            }
            if t.mrs[i].as_ref().is_some_and(|m| m.strict.is_some()) {
                if let Some(i) = self.mr_strict(i, key) {
                    return Some(i);
                }
                // Not that registration any more: look the key up again.
                return self.mr_miss(slot, gen, ctl_seg, key);
            }
            t.mrs[i] = None;
        }
        self.mr_miss(slot, gen, ctl_seg, key)
    }

    /// [`Exec::mr`] for the strict MR cached at `i` (a lease's
    /// sub-region): counts this WR in flight on it, then checks that it is
    /// still the registration cached (`ctl::mr_in_flight`'s protocol),
    /// else takes the count off and drops the entry.
    #[cold]
    #[inline(never)]
    fn mr_strict(&mut self, i: usize, key: u32) -> Option<u8> {
        use std::sync::atomic::Ordering::SeqCst;
        let t = &mut self.st.target;
        let m = t.mrs[i].as_ref()?;
        let (ctl_seg, state) = m.strict.as_ref()?;
        let (idx, _) = ctl::split_key(key);
        if t.counted & (1 << i) == 0 {
            ctl::mr_in_flight(ctl_seg, idx).fetch_add(1, SeqCst);
            t.counted |= 1 << i;
        }
        if ctl::mr_still(ctl_seg, key, *state) {
            t.pinned |= 1 << i;
            return Some(i as u8);
        }
        ctl::mr_in_flight(ctl_seg, idx).fetch_sub(1, SeqCst);
        t.counted &= !(1 << i);
        t.mrs[i] = None;
        None
    }

    /// Takes this WR's in-flight counts off the strict MRs it used (their
    /// entries were pinned, so are still cached).
    #[cold]
    #[inline(never)]
    fn uncount(&mut self) {
        let t = &mut self.st.target;
        for i in 0..MR_CACHE {
            if t.counted & (1 << i) == 0 {
                continue;
            }
            if let Some(m) = &t.mrs[i] {
                if let Some((ctl_seg, _)) = &m.strict {
                    let (idx, _) = ctl::split_key(m.key);
                    ctl::mr_in_flight(ctl_seg, idx)
                        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
        t.counted = 0;
    }

    /// [`Exec::mr`] when the key is not cached (or its MR changed): resolves
    /// it from the control block and caches it. Kept out of line so the hit
    /// path stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn mr_miss(&mut self, slot: u32, gen: u32, ctl_seg: &Segment, key: u32) -> Option<u8> {
        let nk = node_key(slot, gen);
        let home = mr_home(nk, key);
        let (info, state) = ctl::mr_lookup_state(ctl_seg, key)?;
        let (idx, _) = ctl::split_key(key);
        // A strict MR's entry holds its node's control block, to take this
        // WR's in-flight count off it when done (`Exec::uncount`).
        let strict = if info.strict {
            let ctl = self
                .qp
                .node
                .fabric
                .open_segment(&FabricInner::seg_name(slot, gen, "ctl"))?;
            Some((ctl, state))
        } else {
            None
        };
        let name = FabricInner::seg_name(slot, gen, &format!("mr{idx}g{}", info.gen));
        let seg = self.qp.node.fabric.open_segment(&name)?;
        let t = &mut self.st.target;
        let i = if t.pinned & (1 << home) == 0 {
            home
        } else {
            let mut i = t.mr_next;
            while t.pinned & (1 << i) != 0 {
                i = (i + 1) % MR_CACHE;
            }
            t.mr_next = (i + 1) % MR_CACHE;
            i
        };
        t.mrs[i] = Some(CachedMr {
            node: nk,
            key,
            // A strict entry's state word is in `strict`: this never
            // matches one ((gen << 1 | 1) < u64::MAX), so the hit path
            // sends it to `mr_strict`.
            state: if info.strict { u64::MAX } else { state },
            info,
            seg,
            strict,
        });
        if info.strict {
            return self.mr_strict(i, key);
        }
        t.pinned |= 1 << i;
        Some(i as u8)
    }

    /// The cached MR at `i` (one that fails every check if the entry is
    /// empty), by reference: no copy per SGE.
    #[inline(always)]
    fn mr_info(&self, i: u8) -> &ctl::MrInfo {
        const NO_MR: ctl::MrInfo = ctl::MrInfo {
            gen: 0,
            base: 0,
            len: 0,
            access: Access::NONE,
            pd: u32::MAX,
            seg_off: 0,
            strict: false,
        };
        match &self.st.target.mrs[i as usize] {
            Some(m) => &m.info,
            None => &NO_MR,
        }
    }

    /// Resolves one local SGE (`LOC_PROT_ERR` on any failed check).
    #[inline]
    fn local_one(&mut self, s: &Sge, need_write: bool) -> Result<Piece, WcStatus> {
        let qp = self.qp;
        let node = &qp.node;
        let i = self
            .mr(node.slot, node.gen, &node.ctl, s.lkey)
            .ok_or(WcStatus::LocProtErr)?;
        let info = self.mr_info(i);
        if info.pd != qp.pd
            || (need_write && !info.access.contains(Access::LOCAL_WRITE))
            || s.addr < info.base
            || s.addr
                .checked_add(s.length as u64)
                .is_none_or(|e| e > info.base + info.len)
        {
            return Err(WcStatus::LocProtErr);
        }
        Ok(Piece {
            mr: i,
            off: (s.addr - info.base + info.seg_off) as usize,
            len: s.length as usize,
        })
    }

    /// Resolves local SGEs (`LOC_PROT_ERR` on any failed check).
    fn local(&mut self, sg: &SgList, need_write: bool, out: &mut Pieces) -> Result<(), WcStatus> {
        out.n = 0;
        for s in sg.as_slice() {
            let p = self.local_one(s, need_write)?;
            out.push(p);
        }
        Ok(())
    }

    /// Copies piece `src` into piece `dst` (same length).
    fn copy_piece(&self, src: &Piece, dst: &Piece) {
        let t = &self.st.target;
        if let (Some(s), Some(d)) = (&t.mrs[src.mr as usize], &t.mrs[dst.mr as usize]) {
            // Both ranges were validated against their MRs.
            let _ = s
                .seg
                .copy_to(src.off, &d.seg, dst.off, dst.len.min(src.len));
        }
    }

    /// Resolves a remote range (`REM_ACCESS_ERR` on any failed check).
    #[allow(clippy::too_many_arguments)]
    fn remote(
        &mut self,
        slot: u32,
        gen: u32,
        ctl_seg: &Segment,
        remote: RemoteAddr,
        len: usize,
        need: Access,
        dst: &CachedDst,
    ) -> Result<Piece, WcStatus> {
        let i = self
            .mr(slot, gen, ctl_seg, remote.rkey)
            .ok_or(WcStatus::RemAccessErr)?;
        let info = self.mr_info(i);
        if info.pd != dst.pd
            || !info.access.contains(need)
            || !dst.access.contains(need)
            || remote.addr < info.base
            || remote
                .addr
                .checked_add(len as u64)
                .is_none_or(|e| e > info.base + info.len)
        {
            return Err(WcStatus::RemAccessErr);
        }
        Ok(Piece {
            mr: i,
            off: (remote.addr - info.base + info.seg_off) as usize,
            len,
        })
    }

    /// Validates the destination QP (through the cache) for this initiator.
    fn destination(
        &mut self,
        slot: u32,
        gen: u32,
        ctl_seg: &Segment,
        dst_qpn: u32,
        key: u64,
    ) -> Result<(CachedDst, u32), DstError> {
        let q = self.qp;
        let nk = node_key(slot, gen);
        let (idx, _) = ctl::split_qpn(dst_qpn);
        if idx >= ctl::MAX_QP {
            return Err(DstError::Unreachable);
        }
        let te = QpEntry::new(ctl_seg, idx);
        let raw = te.state_raw();
        if let Some(d) = self.st.target.dst {
            if d.node == nk && d.qpn == dst_qpn && d.state == raw {
                return match q.qp_type {
                    _ if d.key == key => Ok((d, (raw >> 16) as u32)),
                    QpType::Dci => Err(DstError::KeyMismatch),
                    QpType::Ud => Err(DstError::Unreachable),
                    _ => Ok((d, (raw >> 16) as u32)),
                };
            }
        }
        let Some((te, tsw)) = QpEntry::by_qpn(ctl_seg, dst_qpn) else {
            return Err(DstError::Unreachable);
        };
        let ready = matches!(tsw.state, QpState::Rtr | QpState::Rts);
        match q.qp_type {
            QpType::Rc => {
                if tsw.qp_type != Some(QpType::Rc) || !ready || te.peer() != (q.node.gid, q.qpn) {
                    return Err(DstError::Unreachable);
                }
            }
            QpType::Dci => {
                if tsw.qp_type != Some(QpType::Dct) || !ready {
                    return Err(DstError::Unreachable);
                }
                if te.dc_key() != key {
                    return Err(DstError::KeyMismatch);
                }
            }
            _ => {
                if tsw.qp_type != Some(QpType::Ud) || !ready || te.qkey() as u64 != key {
                    return Err(DstError::Unreachable);
                }
            }
        }
        let d = CachedDst {
            node: nk,
            qpn: dst_qpn,
            state: te.state_raw(),
            pd: te.pd(),
            access: te.access(),
            key,
        };
        if d.state == raw {
            self.st.target.dst = Some(d);
        }
        Ok((d, tsw.gen))
    }

    /// Starts fetching into the CPU cache the remote bytes `wr` will
    /// access, when its target node and MR are already in this QP's cache
    /// and the range lies inside the MR: the read-ahead a NIC's DMA engine
    /// does for the WRs of one doorbell (it has several reads in flight),
    /// so the sim does not stall on one cache miss per WR in turn. Only a
    /// hint: nothing is checked, changed or counted here (execution does
    /// every check, in order), and a stale cache entry costs a useless
    /// prefetch at most.
    #[inline]
    pub(crate) fn prefetch(&self, wr: &SendWr) {
        let (remote, len) = match wr.op {
            WrOp::Read { remote } | WrOp::Write { remote } | WrOp::WriteImm { remote, .. } => {
                (remote, wr.payload.len() as usize)
            }
            WrOp::CompareSwap { remote, .. } | WrOp::FetchAdd { remote, .. } => (remote, 8),
            WrOp::Send | WrOp::SendImm { .. } => return,
        };
        // The last target node, without checking that it is this WR's: an
        // MR of another node misses below, or costs a useless prefetch.
        let t = &self.st.target;
        let Some(n) = &t.node else {
            return;
        };
        let nk = node_key(n.slot, n.gen);
        let Some(m) = &t.mrs[mr_home(nk, remote.rkey)] else {
            return;
        };
        if m.node != nk || m.key != remote.rkey || remote.addr < m.info.base {
            return;
        }
        let off = remote.addr - m.info.base;
        if off.saturating_add(len as u64) <= m.info.len {
            m.seg.prefetch((off + m.info.seg_off) as usize, len);
        }
    }

    /// Executes `wr`.
    pub(crate) fn run(&mut self, wr: &SendWr) -> Outcome {
        self.st.target.pinned = 0;
        let out = match self.run_inner(wr) {
            Ok(o) => o,
            Err(status) => done(status),
        };
        self.st.target.pinned = 0;
        if self.st.target.counted != 0 {
            self.uncount();
        }
        out
    }

    fn run_inner(&mut self, wr: &SendWr) -> Result<Outcome, WcStatus> {
        let q = self.qp;
        let ud = q.qp_type == QpType::Ud;
        let len = wr.payload.len() as usize;
        let dropped = Outcome::Done {
            status: WcStatus::Success,
            byte_len: len as u32,
        };
        let (gid, dst_qpn, key) = match (q.qp_type, wr.dest) {
            (QpType::Rc, Destination::Connected) => match self.st.peer {
                Some(p) => (p.gid, p.qpn, 0),
                None => return Err(WcStatus::RetryExcErr),
            },
            (QpType::Dci, Destination::Dc(t)) => {
                if self.st.last_dc != Some((t.gid, t.dct_num)) {
                    self.st.last_dc = Some((t.gid, t.dct_num));
                    self.st.c.dc_target_switches += 1;
                    if let Some(m) = &q.node.config.latency {
                        self.st.last_visible += m.dc_reconnect_ns;
                    }
                }
                (t.gid, t.dct_num, t.dc_key)
            }
            (QpType::Ud, Destination::Ud(t)) => (t.gid, t.qpn, t.qkey as u64),
            _ => return Err(WcStatus::LocQpOpErr),
        };
        if ud && len > q.node.caps.ud_mtu as usize {
            return Err(WcStatus::LocLenErr);
        }
        let unreachable = if ud {
            Ok(dropped)
        } else {
            Err(WcStatus::RetryExcErr)
        };
        let Some((slot, gen)) = self.target_node(&gid, dst_qpn) else {
            return unreachable;
        };
        // Borrow the target's control block out of the cache for the rest of
        // the WR (moved, not cloned: no reference-count traffic per WR; only
        // the pointer moves, not the whole cache entry).
        let Some(ctl) = self.st.target.node.as_mut().and_then(|n| n.ctl.take()) else {
            return unreachable;
        };
        let r = self.on_node(wr, len, (slot, gen), &ctl, dst_qpn, key);
        if let Some(n) = &mut self.st.target.node {
            n.ctl = Some(ctl);
        }
        r
    }

    /// Executes `wr` (of `len` payload bytes) on the live node `(slot, gen)`.
    fn on_node(
        &mut self,
        wr: &SendWr,
        len: usize,
        (slot, gen): (u32, u32),
        ctl_seg: &Segment,
        dst_qpn: u32,
        key: u64,
    ) -> Result<Outcome, WcStatus> {
        let q = self.qp;
        let ud = q.qp_type == QpType::Ud;
        let dropped = Outcome::Done {
            status: WcStatus::Success,
            byte_len: len as u32,
        };
        let (dst, tgen) = match self.destination(slot, gen, ctl_seg, dst_qpn, key) {
            Ok(d) => d,
            Err(_) if ud => return Ok(dropped),
            Err(DstError::Unreachable) => return Err(WcStatus::RetryExcErr),
            Err(DstError::KeyMismatch) => return Err(WcStatus::RemAccessErr),
        };
        let ok = |byte_len: usize| Outcome::Done {
            status: WcStatus::Success,
            byte_len: byte_len as u32,
        };
        match wr.op {
            WrOp::Read { remote } => {
                let Payload::Local(sg) = &wr.payload else {
                    return Err(WcStatus::LocQpOpErr);
                };
                let r = self.remote(slot, gen, ctl_seg, remote, len, Access::REMOTE_READ, &dst)?;
                if let [sge] = sg.as_slice() {
                    // One SGE, the common case: no scatter list to build.
                    let l = self.local_one(sge, true)?;
                    self.copy_piece(&r, &l);
                } else {
                    let mut locals = Pieces::default();
                    self.local(sg, true, &mut locals)?;
                    transfer(&self.st.target, &[], &Source::Pieces(single(r)), &locals);
                }
                self.st.c.reads += 1;
                self.st.c.bytes_read += len as u64;
                Ok(ok(len))
            }
            WrOp::Write { remote } if matches!(&wr.payload, Payload::Local(sg) if sg.as_slice().len() == 1) =>
            {
                // One SGE, the common case: no gather list to build.
                let Payload::Local(sg) = &wr.payload else {
                    return Err(WcStatus::LocQpOpErr);
                };
                let l = self.local_one(&sg.as_slice()[0], false)?;
                let r = self.remote(slot, gen, ctl_seg, remote, len, Access::REMOTE_WRITE, &dst)?;
                self.copy_piece(&l, &r);
                self.st.c.writes += 1;
                self.st.c.bytes_written += len as u64;
                Ok(ok(len))
            }
            WrOp::Write { remote } | WrOp::WriteImm { remote, .. } => {
                let src = self.source(&wr.payload)?;
                let r = single(self.remote(
                    slot,
                    gen,
                    ctl_seg,
                    remote,
                    len,
                    Access::REMOTE_WRITE,
                    &dst,
                )?);
                if let WrOp::WriteImm { imm, .. } = wr.op {
                    // The write and its receive are one message: no receive,
                    // no write (RNR).
                    let d = Delivery::WriteImm {
                        imm,
                        len,
                        target: r,
                        src,
                    };
                    if self.deliver(slot, gen, ctl_seg, &dst, tgen, d)? == Outcome::ReceiverNotReady
                    {
                        return Ok(Outcome::ReceiverNotReady);
                    }
                } else {
                    transfer(&self.st.target, &[], &src, &r);
                }
                self.st.c.writes += 1;
                self.st.c.bytes_written += len as u64;
                Ok(ok(len))
            }
            WrOp::Send | WrOp::SendImm { .. } => {
                let imm = match wr.op {
                    WrOp::SendImm { imm } => Some(imm),
                    _ => None,
                };
                let src = self.source(&wr.payload)?;
                let out = self.deliver(
                    slot,
                    gen,
                    ctl_seg,
                    &dst,
                    tgen,
                    Delivery::Send { imm, len, src, ud },
                )?;
                if out == Outcome::ReceiverNotReady {
                    return if ud { Ok(dropped) } else { Ok(out) };
                }
                self.st.c.sends += 1;
                self.st.c.bytes_written += len as u64;
                Ok(out)
            }
            WrOp::CompareSwap { remote, .. } | WrOp::FetchAdd { remote, .. } => {
                let Payload::Local(sg) = &wr.payload else {
                    return Err(WcStatus::LocQpOpErr);
                };
                if remote.addr % 8 != 0 {
                    return Err(WcStatus::RemInvReqErr);
                }
                let r = self.remote(slot, gen, ctl_seg, remote, 8, Access::REMOTE_ATOMIC, &dst)?;
                let mut locals = Pieces::default();
                self.local(sg, true, &mut locals)?;
                let Some(m) = &self.st.target.mrs[r.mr as usize] else {
                    return Err(WcStatus::RemAccessErr);
                };
                let word = m.seg.u64_at(r.off).map_err(|_| WcStatus::RemInvReqErr)?;
                let old = match wr.op {
                    WrOp::CompareSwap { compare, swap, .. } => {
                        match word.compare_exchange(compare, swap, AcqRel, Acquire) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    WrOp::FetchAdd { add, .. } => word.fetch_add(add, AcqRel),
                    _ => return Err(WcStatus::LocQpOpErr),
                };
                let bytes = old.to_ne_bytes();
                transfer(&self.st.target, &[], &Source::Bytes(&bytes), &locals);
                self.st.c.atomics += 1;
                Ok(ok(8))
            }
        }
    }

    /// The local source of a WRITE or SEND.
    fn source<'w>(&mut self, payload: &'w Payload) -> Result<Source<'w>, WcStatus> {
        Ok(match payload {
            Payload::Local(sg) => {
                let mut ps = Pieces::default();
                self.local(sg, false, &mut ps)?;
                Source::Pieces(ps)
            }
            Payload::Inline(d) => Source::Bytes(d.as_slice()),
        })
    }

    /// Consumes a receive at the target and completes it there.
    fn deliver(
        &mut self,
        slot: u32,
        gen: u32,
        ctl_seg: &Segment,
        dst: &CachedDst,
        tgen: u32,
        d: Delivery<'_>,
    ) -> Result<Outcome, WcStatus> {
        let q = self.qp;
        let dst_qpn = dst.qpn;
        let (tidx, _) = ctl::split_qpn(dst_qpn);
        let te = QpEntry::new(ctl_seg, tidx);
        let rq = match te.srq() {
            Some((si, sg)) => self.segment(slot, gen, K_SRQ, si, sg),
            None => self.segment(slot, gen, K_RQ, tidx, tgen),
        };
        let Some(rq) = rq else {
            return Ok(Outcome::ReceiverNotReady);
        };
        let (ci, cg) = te.recv_cq();
        let Some(rcq) = self.segment(slot, gen, K_CQ, ci, cg) else {
            return Err(WcStatus::RemOpErr);
        };
        let ring = Ring::attach(&rq, 0, RWQE_WORDS);
        let mut buf = [0u64; RWQE_WORDS - 1];
        if !ring.pop(&mut buf) {
            return Ok(Outcome::ReceiverNotReady);
        }
        let recv = decode_recv(&buf);
        let ud = matches!(d, Delivery::Send { ud: true, .. });
        let visible_at = match &q.node.config.latency {
            Some(m) => now_ns() + m.send_ns / 2,
            None => 0,
        };
        let cqe = |status, opcode, byte_len, imm| Cqe {
            wr_id: recv.wr_id,
            qpn: dst_qpn,
            src_qp: q.qpn,
            status,
            opcode,
            byte_len,
            imm,
            visible_at,
            sq_seq: None,
        };
        let fail = |rstatus: WcStatus, sstatus: WcStatus| {
            push_cqe(&rcq, &cqe(rstatus, WcOpcode::Recv, 0, None));
            if q.qp_type == QpType::Rc && te.force_err() {
                flush_recv_ring(&rq, &rcq, dst_qpn);
            }
            if ud {
                Ok(Outcome::Done {
                    status: WcStatus::Success,
                    byte_len: 0,
                })
            } else {
                Err(sstatus)
            }
        };
        // Receive buffers are checked against the target's MR table.
        let mut rdst = Pieces::default();
        for s in recv.sg.as_slice() {
            let Some(i) = self.mr(slot, gen, ctl_seg, s.lkey) else {
                return fail(WcStatus::LocProtErr, WcStatus::RemOpErr);
            };
            let info = self.mr_info(i);
            if info.pd != dst.pd
                || !info.access.contains(Access::LOCAL_WRITE)
                || s.addr < info.base
                || s.addr
                    .checked_add(s.length as u64)
                    .is_none_or(|e| e > info.base + info.len)
            {
                return fail(WcStatus::LocProtErr, WcStatus::RemOpErr);
            }
            rdst.push(Piece {
                mr: i,
                off: (s.addr - info.base + info.seg_off) as usize,
                len: s.length as usize,
            });
        }
        let done_cqe = match d {
            Delivery::Send { imm, len, src, ud } => {
                let grh_len = if ud { GRH_LEN } else { 0 };
                if len + grh_len > rdst.total() {
                    return fail(WcStatus::LocLenErr, WcStatus::RemInvReqErr);
                }
                let mut grh = [0u8; GRH_LEN];
                grh[8..24].copy_from_slice(q.node.gid.as_bytes());
                transfer(&self.st.target, &grh[..grh_len], &src, &rdst);
                cqe(
                    WcStatus::Success,
                    WcOpcode::Recv,
                    (len + grh_len) as u32,
                    imm,
                )
            }
            Delivery::WriteImm {
                imm,
                len,
                target,
                src,
            } => {
                transfer(&self.st.target, &[], &src, &target);
                cqe(
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    len as u32,
                    Some(imm),
                )
            }
        };
        push_cqe(&rcq, &done_cqe);
        Ok(Outcome::Done {
            status: WcStatus::Success,
            byte_len: done_cqe.byte_len,
        })
    }
}

fn single(p: Piece) -> Pieces {
    let mut ps = Pieces::default();
    ps.push(p);
    ps
}

/// Why a destination QP was not usable.
enum DstError {
    /// Missing, wrong type, not ready, or not connected to us: the target
    /// NIC drops our packets (`RETRY_EXC_ERR`; UD: silent drop).
    Unreachable,
    /// The DCT refuses the key (`REM_ACCESS_ERR`).
    KeyMismatch,
}

enum Delivery<'a> {
    Send {
        imm: Option<u32>,
        len: usize,
        src: Source<'a>,
        ud: bool,
    },
    WriteImm {
        imm: u32,
        len: usize,
        target: Pieces,
        src: Source<'a>,
    },
}
