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

use super::ctl::{self, QpEntry};
use super::fabric::FabricInner;
use super::node::{decode_recv, push_cqe, Cqe, NodeInner, RWQE_WORDS};
use super::qp::{flush_recv_ring, QpInner, SendState};
use super::ring::Ring;
use super::shm::{now_ns, Segment};
use crate::types::*;
use std::sync::atomic::Ordering::AcqRel;
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

/// The last target node a QP reached, so that the common case (the same
/// target again) costs no map lookup.
pub(crate) struct CachedNode {
    gid: Gid,
    slot: u32,
    gen: u32,
    ctl: Arc<Segment>,
    checked_ns: u64,
}

const SEG_CACHE: usize = 8;

/// Per-QP caches of resolved nodes and segment mappings.
#[derive(Default)]
pub(crate) struct TargetCache {
    node: Option<CachedNode>,
    segs: [Option<(u128, Arc<Segment>)>; SEG_CACHE],
    next: usize,
}

fn seg_key(slot: u32, gen: u32, kind: u8, idx: u32, objgen: u32) -> u128 {
    (slot as u128) << 96
        | (gen as u128) << 64
        | (kind as u128) << 56
        | (idx as u128) << 32
        | objgen as u128
}

const K_MR: u8 = 1;
const K_CQ: u8 = 2;
const K_SRQ: u8 = 3;
const K_RQ: u8 = 4;

/// A resolved piece of memory: `len` bytes at `off` in a segment.
struct Piece {
    seg: Arc<Segment>,
    off: usize,
    len: usize,
}

/// Up to MAX_SGE pieces without allocating.
#[derive(Default)]
struct Pieces {
    n: usize,
    p: [Option<Piece>; MAX_SGE],
}

impl Pieces {
    fn push(&mut self, piece: Piece) {
        if self.n < MAX_SGE {
            self.p[self.n] = Some(piece);
            self.n += 1;
        }
    }
    fn iter(&self) -> impl Iterator<Item = &Piece> {
        self.p[..self.n].iter().flatten()
    }
    fn total(&self) -> usize {
        self.iter().map(|p| p.len).sum()
    }
}

/// Where the bytes of a WRITE or SEND come from.
enum Source<'a> {
    Pieces(&'a Pieces),
    Bytes(&'a [u8]),
}

/// Copies the source stream (optionally preceded by `prefix`) into the
/// destination pieces, in order.
fn transfer(prefix: &[u8], src: &Source<'_>, dst: &Pieces) {
    let mut di = 0;
    let mut doff = 0;
    let mut put = |bytes: Option<&[u8]>, seg: Option<(&Segment, usize)>, mut len: usize| {
        let mut consumed = 0;
        while len > 0 && di < dst.n {
            let Some(d) = &dst.p[di] else { break };
            let n = len.min(d.len - doff);
            // Ranges were validated against their MRs; a failure here would
            // be a sim bug, and is ignored rather than crashing the host.
            match (bytes, seg) {
                (Some(b), _) => {
                    let _ = d.seg.copy_in(d.off + doff, &b[consumed..consumed + n]);
                }
                (None, Some((s, so))) => {
                    let _ = s.copy_to(so + consumed, &d.seg, d.off + doff, n);
                }
                _ => {}
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
            for p in ps.iter() {
                put(None, Some((&p.seg, p.off)), p.len);
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
            K_MR => format!("mr{idx}g{objgen}"),
            K_CQ => format!("cq{idx}g{objgen}"),
            K_SRQ => format!("srq{idx}g{objgen}"),
            _ => format!("rq{idx}g{objgen}"),
        };
        let seg = self
            .fabric()
            .open_segment(&FabricInner::seg_name(slot, gen, &what))?;
        let t = &mut self.st.target;
        t.segs[t.next] = Some((key, seg.clone()));
        t.next = (t.next + 1) % SEG_CACHE;
        Some(seg)
    }

    /// Resolves a destination GID to a live node's control block.
    fn target_node(&mut self, gid: &Gid) -> Option<(u32, u32, Arc<Segment>)> {
        let interval = self.node().config.liveness_interval.as_nanos() as u64;
        let cached = match &self.st.target.node {
            Some(c) if c.gid == *gid => Some((c.slot, c.gen, c.ctl.clone(), c.checked_ns)),
            _ => None,
        };
        if let Some((slot, gen, ctl_seg, checked_ns)) = cached {
            // Same-process nodes: the slot word is the truth. Others: the pid
            // check is trusted for `liveness_interval`.
            let state = self.fabric().slot_state(slot);
            if state & 0xff != super::fabric::SLOT_ALIVE || state >> 8 != gen as u64 {
                return None;
            }
            if self.fabric().slot_pid_is_self(slot) {
                return Some((slot, gen, ctl_seg));
            }
            let now = now_ns();
            if now.saturating_sub(checked_ns) > interval {
                if !self.fabric().slot_alive(slot, gen as u64) {
                    return None;
                }
                if let Some(c) = &mut self.st.target.node {
                    c.checked_ns = now;
                }
            }
            return Some((slot, gen, ctl_seg));
        }
        let (slot, gen) = self.fabric().parse_gid(gid)?;
        if !self.fabric().slot_alive(slot, gen as u64) {
            return None;
        }
        let ctl_seg = self
            .fabric()
            .open_segment(&FabricInner::seg_name(slot, gen, "ctl"))?;
        if !ctl::valid(&ctl_seg) {
            return None;
        }
        self.st.target.node = Some(CachedNode {
            gid: *gid,
            slot,
            gen,
            ctl: ctl_seg.clone(),
            checked_ns: now_ns(),
        });
        Some((slot, gen, ctl_seg))
    }

    /// Resolves local SGEs (`LOC_PROT_ERR` on any failed check).
    fn local(&mut self, sg: &SgList, need_write: bool) -> Result<Pieces, WcStatus> {
        let node = self.qp.node.clone();
        let mut out = Pieces::default();
        for s in sg.as_slice() {
            let info = ctl::mr_lookup(&node.ctl, s.lkey).ok_or(WcStatus::LocProtErr)?;
            if info.pd != self.qp.pd
                || (need_write && !info.access.contains(Access::LOCAL_WRITE))
                || s.addr < info.base
                || s.addr
                    .checked_add(s.length as u64)
                    .is_none_or(|e| e > info.base + info.len)
            {
                return Err(WcStatus::LocProtErr);
            }
            let (idx, _) = ctl::split_key(s.lkey);
            let seg = self
                .segment(node.slot, node.gen, K_MR, idx, info.gen)
                .ok_or(WcStatus::LocProtErr)?;
            out.push(Piece {
                seg,
                off: (s.addr - info.base) as usize,
                len: s.length as usize,
            });
        }
        Ok(out)
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
        target_pd: u32,
        target_access: Access,
    ) -> Result<Piece, WcStatus> {
        let info = ctl::mr_lookup(ctl_seg, remote.rkey).ok_or(WcStatus::RemAccessErr)?;
        if info.pd != target_pd
            || !info.access.contains(need)
            || !target_access.contains(need)
            || remote.addr < info.base
            || remote
                .addr
                .checked_add(len as u64)
                .is_none_or(|e| e > info.base + info.len)
        {
            return Err(WcStatus::RemAccessErr);
        }
        let (idx, _) = ctl::split_key(remote.rkey);
        let seg = self
            .segment(slot, gen, K_MR, idx, info.gen)
            .ok_or(WcStatus::RemAccessErr)?;
        Ok(Piece {
            seg,
            off: (remote.addr - info.base) as usize,
            len,
        })
    }

    /// Executes `wr`.
    pub(crate) fn run(&mut self, wr: &SendWr) -> Outcome {
        match self.run_inner(wr) {
            Ok(o) => o,
            Err(status) => done(status),
        }
    }

    fn run_inner(&mut self, wr: &SendWr) -> Result<Outcome, WcStatus> {
        let q = self.qp.clone();
        let ud = q.qp_type == QpType::Ud;
        let len = wr.payload.len() as usize;
        let dropped = Outcome::Done {
            status: WcStatus::Success,
            byte_len: len as u32,
        };
        let (gid, dst_qpn, dc_key) = match (q.qp_type, wr.dest) {
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
        let Some((slot, gen, ctl_seg)) = self.target_node(&gid) else {
            return if ud {
                Ok(dropped)
            } else {
                Err(WcStatus::RetryExcErr)
            };
        };
        let Some((te, tsw)) = QpEntry::by_qpn(&ctl_seg, dst_qpn) else {
            return if ud {
                Ok(dropped)
            } else {
                Err(WcStatus::RetryExcErr)
            };
        };
        let ready = matches!(tsw.state, QpState::Rtr | QpState::Rts);
        match q.qp_type {
            QpType::Rc => {
                if tsw.qp_type != Some(QpType::Rc) || !ready || te.peer() != (q.node.gid, q.qpn) {
                    return Err(WcStatus::RetryExcErr);
                }
            }
            QpType::Dci => {
                if tsw.qp_type != Some(QpType::Dct) || !ready {
                    return Err(WcStatus::RetryExcErr);
                }
                if te.dc_key() != dc_key {
                    return Err(WcStatus::RemAccessErr);
                }
            }
            _ => {
                if tsw.qp_type != Some(QpType::Ud) || !ready || te.qkey() as u64 != dc_key {
                    return Ok(dropped);
                }
            }
        }
        let (tpd, tacc) = (te.pd(), te.access());
        match wr.op {
            WrOp::Read { remote } => {
                let Payload::Local(sg) = &wr.payload else {
                    return Err(WcStatus::LocQpOpErr);
                };
                let r = self.remote(
                    slot,
                    gen,
                    &ctl_seg,
                    remote,
                    len,
                    Access::REMOTE_READ,
                    tpd,
                    tacc,
                )?;
                let locals = self.local(sg, true)?;
                transfer(&[], &Source::Pieces(&single(r)), &locals);
                self.st.c.reads += 1;
                self.st.c.bytes_read += len as u64;
                Ok(Outcome::Done {
                    status: WcStatus::Success,
                    byte_len: len as u32,
                })
            }
            WrOp::Write { remote } | WrOp::WriteImm { remote, .. } => {
                let imm = match wr.op {
                    WrOp::WriteImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let locals = match &wr.payload {
                    Payload::Local(sg) => Some(self.local(sg, false)?),
                    Payload::Inline(_) => None,
                };
                let r = single(self.remote(
                    slot,
                    gen,
                    &ctl_seg,
                    remote,
                    len,
                    Access::REMOTE_WRITE,
                    tpd,
                    tacc,
                )?);
                let src = match (&locals, &wr.payload) {
                    (Some(p), _) => Source::Pieces(p),
                    (None, Payload::Inline(d)) => Source::Bytes(d.as_slice()),
                    (None, Payload::Local(_)) => return Err(WcStatus::LocQpOpErr),
                };
                if let Some(imm) = imm {
                    // The write and its receive are one message: no receive,
                    // no write (RNR).
                    let out = self.deliver(
                        slot,
                        gen,
                        &ctl_seg,
                        &te,
                        tsw.gen,
                        dst_qpn,
                        Delivery::WriteImm {
                            imm,
                            len,
                            target: &r,
                            src: &src,
                        },
                    )?;
                    if out == Outcome::ReceiverNotReady {
                        return Ok(out);
                    }
                } else {
                    transfer(&[], &src, &r);
                }
                self.st.c.writes += 1;
                self.st.c.bytes_written += len as u64;
                Ok(Outcome::Done {
                    status: WcStatus::Success,
                    byte_len: len as u32,
                })
            }
            WrOp::Send | WrOp::SendImm { .. } => {
                let imm = match wr.op {
                    WrOp::SendImm { imm } => Some(imm),
                    _ => None,
                };
                let locals = match &wr.payload {
                    Payload::Local(sg) => Some(self.local(sg, false)?),
                    Payload::Inline(_) => None,
                };
                let src = match (&locals, &wr.payload) {
                    (Some(p), _) => Source::Pieces(p),
                    (None, Payload::Inline(d)) => Source::Bytes(d.as_slice()),
                    (None, Payload::Local(_)) => return Err(WcStatus::LocQpOpErr),
                };
                let out = self.deliver(
                    slot,
                    gen,
                    &ctl_seg,
                    &te,
                    tsw.gen,
                    dst_qpn,
                    Delivery::Send {
                        imm,
                        len,
                        src: &src,
                        ud,
                    },
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
                let r = self.remote(
                    slot,
                    gen,
                    &ctl_seg,
                    remote,
                    8,
                    Access::REMOTE_ATOMIC,
                    tpd,
                    tacc,
                )?;
                let locals = self.local(sg, true)?;
                let word = r.seg.u64_at(r.off).map_err(|_| WcStatus::RemInvReqErr)?;
                let old = match wr.op {
                    WrOp::CompareSwap { compare, swap, .. } => {
                        match word.compare_exchange(
                            compare,
                            swap,
                            AcqRel,
                            std::sync::atomic::Ordering::Acquire,
                        ) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    WrOp::FetchAdd { add, .. } => word.fetch_add(add, AcqRel),
                    _ => return Err(WcStatus::LocQpOpErr),
                };
                transfer(&[], &Source::Bytes(&old.to_ne_bytes()), &locals);
                self.st.c.atomics += 1;
                Ok(Outcome::Done {
                    status: WcStatus::Success,
                    byte_len: 8,
                })
            }
        }
    }

    /// Consumes a receive at the target and completes it there.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        slot: u32,
        gen: u32,
        ctl_seg: &Segment,
        te: &QpEntry<'_>,
        tgen: u32,
        dst_qpn: u32,
        d: Delivery<'_>,
    ) -> Result<Outcome, WcStatus> {
        let q = self.qp.clone();
        let (tidx, _) = ctl::split_qpn(dst_qpn);
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
        let rc_receiver = q.qp_type == QpType::Rc;
        let visible_at = match &q.node.config.latency {
            Some(m) => now_ns() + m.send_ns / 2,
            None => 0,
        };
        let fail = |this: &mut Self, rstatus: WcStatus, sstatus: WcStatus| {
            push_cqe(
                &rcq,
                &Cqe {
                    wr_id: recv.wr_id,
                    qpn: dst_qpn,
                    src_qp: q.qpn,
                    status: rstatus,
                    opcode: WcOpcode::Recv,
                    visible_at,
                    ..Cqe::default()
                },
            );
            if rc_receiver && te.force_err() {
                flush_recv_ring(&rq, &rcq, dst_qpn, false);
            }
            let _ = this;
            if matches!(d, Delivery::Send { ud: true, .. }) {
                Ok(Outcome::Done {
                    status: WcStatus::Success,
                    byte_len: 0,
                })
            } else {
                Err(sstatus)
            }
        };
        // Receive buffers are checked against the target's MR table.
        let target_pd = te.pd();
        let mut dst = Pieces::default();
        for s in recv.sg.as_slice() {
            let Some(info) = ctl::mr_lookup(ctl_seg, s.lkey) else {
                return fail(self, WcStatus::LocProtErr, WcStatus::RemOpErr);
            };
            if info.pd != target_pd
                || !info.access.contains(Access::LOCAL_WRITE)
                || s.addr < info.base
                || s.addr
                    .checked_add(s.length as u64)
                    .is_none_or(|e| e > info.base + info.len)
            {
                return fail(self, WcStatus::LocProtErr, WcStatus::RemOpErr);
            }
            let (idx, _) = ctl::split_key(s.lkey);
            let Some(seg) = self.segment(slot, gen, K_MR, idx, info.gen) else {
                return fail(self, WcStatus::LocProtErr, WcStatus::RemOpErr);
            };
            dst.push(Piece {
                seg,
                off: (s.addr - info.base) as usize,
                len: s.length as usize,
            });
        }
        let (byte_len, imm, opcode) = match d {
            Delivery::Send { imm, len, src, ud } => {
                let grh_len = if ud { GRH_LEN } else { 0 };
                if len + grh_len > dst.total() {
                    return fail(self, WcStatus::LocLenErr, WcStatus::RemInvReqErr);
                }
                let mut grh = [0u8; GRH_LEN];
                grh[8..24].copy_from_slice(q.node.gid.as_bytes());
                transfer(&grh[..grh_len], src, &dst);
                ((len + grh_len) as u32, imm, WcOpcode::Recv)
            }
            Delivery::WriteImm {
                imm,
                len,
                target,
                src,
            } => {
                transfer(&[], src, target);
                (len as u32, Some(imm), WcOpcode::RecvRdmaWithImm)
            }
        };
        push_cqe(
            &rcq,
            &Cqe {
                wr_id: recv.wr_id,
                qpn: dst_qpn,
                src_qp: q.qpn,
                status: WcStatus::Success,
                opcode,
                byte_len,
                imm,
                visible_at,
                sq_seq: None,
            },
        );
        Ok(Outcome::Done {
            status: WcStatus::Success,
            byte_len,
        })
    }
}

fn single(p: Piece) -> Pieces {
    let mut ps = Pieces::default();
    ps.push(p);
    ps
}

enum Delivery<'a> {
    Send {
        imm: Option<u32>,
        len: usize,
        src: &'a Source<'a>,
        ud: bool,
    },
    WriteImm {
        imm: u32,
        len: usize,
        target: &'a Pieces,
        src: &'a Source<'a>,
    },
}
