//! The node control block: one shared segment per node holding the tables a
//! NIC keeps in its own memory (MRs, QPs, CQs, SRQs), readable by every
//! process on the fabric.
//!
//! ```text
//! 0        header: magic, version, slot, generation
//! MR_OFF   MAX_MR  entries x 64 B : state(gen<<1|valid) base len access<<32|pd
//!                                   seg_off flags in_flight
//! QP_OFF   MAX_QP  entries x 128 B: see QpEntry
//! CQ_OFF   MAX_CQ  entries x 16 B : state(gen<<1|valid) capacity
//! SRQ_OFF  MAX_SRQ entries x 16 B : state(gen<<1|valid) capacity<<32|max_sge
//! ```
//! Entries are written by the owning process only (except a QP's state word,
//! which a remote sender may move to ERR, and its `sq_done` word, advanced by
//! whoever polls its send CQ in the owning process). Readers validate an MR
//! entry seqlock-style: the state word before and after reading the fields
//! must be equal and valid.

use super::shm::Segment;
use crate::types::{Access, Gid, QpState, QpType};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};

pub const MAX_MR: u32 = 4096;
pub const MAX_QP: u32 = 4096;
pub const MAX_CQ: u32 = 1024;
pub const MAX_SRQ: u32 = 1024;

const MAGIC: u64 = u64::from_le_bytes(*b"KRSIMNOD");
const MR_OFF: usize = 4096;
const MR_BYTES: usize = 64;
const QP_OFF: usize = MR_OFF + MAX_MR as usize * MR_BYTES;
const QP_BYTES: usize = 128;
const CQ_OFF: usize = QP_OFF + MAX_QP as usize * QP_BYTES;
const CQ_BYTES: usize = 16;
const SRQ_OFF: usize = CQ_OFF + MAX_CQ as usize * CQ_BYTES;
const SRQ_BYTES: usize = 16;
/// Size of a node control block.
pub const CTL_BYTES: usize = SRQ_OFF + MAX_SRQ as usize * SRQ_BYTES;

/// "No object" in a u32 index field.
pub const NONE: u32 = u32::MAX;

/// Writes the header of a fresh control block.
pub fn init(seg: &Segment, slot: u32, gen: u32) {
    seg.word(8)
        .store(super::fabric::FABRIC_VERSION as u64, Relaxed);
    seg.word(16).store(slot as u64, Relaxed);
    seg.word(24).store(gen as u64, Relaxed);
    seg.word(0).store(MAGIC, Release);
}

/// Whether `seg` is a control block of this layout.
pub fn valid(seg: &Segment) -> bool {
    seg.len() >= CTL_BYTES && seg.word(0).load(Acquire) == MAGIC
}

/// A snapshot of a valid MR entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    pub gen: u32,
    pub base: u64,
    pub len: u64,
    pub access: Access,
    pub pd: u32,
    /// Where `base` lies in the MR's segment (non-zero for a sub-region,
    /// whose segment is its parent's).
    pub seg_off: u64,
    /// Deregistration waits for the accesses in flight (see
    /// [`mr_in_flight`]): a sub-region, the remote key of a lease.
    pub strict: bool,
}

/// Flags word of an MR entry: [`MrInfo::strict`].
const MR_STRICT: u64 = 1;

/// MR key = index << 8 | low 8 bits of the generation (mlx5 style): a stale
/// key fails until the slot has been reused 256 times, as on hardware.
pub fn mr_key(idx: u32, gen: u32) -> u32 {
    (idx << 8) | (gen & 0xff)
}

/// Splits a key into `(index, generation low bits)`.
pub fn split_key(key: u32) -> (u32, u32) {
    (key >> 8, key & 0xff)
}

fn mr_word(seg: &Segment, idx: u32, w: usize) -> &AtomicU64 {
    seg.word(MR_OFF + idx as usize * MR_BYTES + w * 8)
}

/// Generation currently recorded in MR slot `idx` (valid or not).
pub fn mr_gen(seg: &Segment, idx: u32) -> (u32, bool) {
    let s = mr_word(seg, idx, 0).load(Acquire);
    ((s >> 1) as u32, s & 1 == 1)
}

/// Publishes MR slot `idx` with generation `gen` (`info.gen` is ignored).
pub fn mr_publish(seg: &Segment, idx: u32, gen: u32, info: &MrInfo) {
    mr_word(seg, idx, 1).store(info.base, Relaxed);
    mr_word(seg, idx, 2).store(info.len, Relaxed);
    mr_word(seg, idx, 3).store(((info.access.0 as u64) << 32) | info.pd as u64, Relaxed);
    mr_word(seg, idx, 4).store(info.seg_off, Relaxed);
    mr_word(seg, idx, 5).store(if info.strict { MR_STRICT } else { 0 }, Relaxed);
    mr_word(seg, idx, 6).store(0, Relaxed);
    mr_word(seg, idx, 0).store(((gen as u64) << 1) | 1, Release);
}

/// Invalidates MR slot `idx` (keeps its generation). `SeqCst`: for a
/// strict MR, ordered before the wait for [`mr_in_flight`] to drain.
pub fn mr_invalidate(seg: &Segment, idx: u32) {
    let w = mr_word(seg, idx, 0);
    let s = w.load(Acquire);
    w.store(s & !1, SeqCst);
}

/// The count of WRs executing against strict MR slot `idx`: an executor
/// adds one (`SeqCst`) *before* it validates the slot's state word and
/// takes it off after its data moved; deregistration invalidates the
/// state word (`SeqCst`) and then waits for the count to reach zero. So
/// once a strict MR's deregistration returns, no access through its key
/// is moving data, and none will (the store/load pairs are `SeqCst`: an
/// executor either is counted before the invalidation or sees it).
pub fn mr_in_flight(seg: &Segment, idx: u32) -> &AtomicU64 {
    mr_word(seg, idx, 6)
}

/// Whether the state word of `key`'s slot, read after the executor
/// counted itself in flight, still equals `state` (`SeqCst`, the other
/// half of [`mr_in_flight`]'s protocol).
#[inline]
pub fn mr_still(seg: &Segment, key: u32, state: u64) -> bool {
    let (idx, _) = split_key(key);
    idx < MAX_MR && mr_word(seg, idx, 0).load(SeqCst) == state
}

/// The raw state word of the MR slot a key names (a cache of an entry stays
/// valid while this word is unchanged: fields change only while invalid, and
/// every registration bumps the generation).
#[inline]
pub fn mr_state_for_key(seg: &Segment, key: u32) -> Option<u64> {
    let (idx, _) = split_key(key);
    (idx < MAX_MR).then(|| mr_word(seg, idx, 0).load(Acquire))
}

/// Looks up the MR a key names; `None` when the key is out of range, stale,
/// or the entry changed while being read. Also returns the state word the
/// snapshot is valid for (see [`mr_state_for_key`]).
pub fn mr_lookup_state(seg: &Segment, key: u32) -> Option<(MrInfo, u64)> {
    let (idx, gen8) = split_key(key);
    if idx >= MAX_MR {
        return None;
    }
    let s0 = mr_word(seg, idx, 0).load(Acquire);
    if s0 & 1 == 0 || ((s0 >> 1) as u32 & 0xff) != gen8 {
        return None;
    }
    let base = mr_word(seg, idx, 1).load(Relaxed);
    let len = mr_word(seg, idx, 2).load(Relaxed);
    let ap = mr_word(seg, idx, 3).load(Relaxed);
    let seg_off = mr_word(seg, idx, 4).load(Relaxed);
    let flags = mr_word(seg, idx, 5).load(Relaxed);
    std::sync::atomic::fence(Acquire);
    if mr_word(seg, idx, 0).load(Relaxed) != s0 {
        return None;
    }
    let info = MrInfo {
        gen: (s0 >> 1) as u32,
        base,
        len,
        access: Access((ap >> 32) as u32),
        pd: ap as u32,
        seg_off,
        strict: flags & MR_STRICT != 0,
    };
    Some((info, s0))
}

/// QP number = (generation low 12 bits) << 12 | index; never 0 because
/// generations skip 0 in their low 12 bits.
pub fn qpn(idx: u32, gen: u32) -> u32 {
    ((gen & 0xfff) << 12) | idx
}

/// Splits a QP number into `(index, generation low bits)`.
pub fn split_qpn(qpn: u32) -> (u32, u32) {
    (qpn & 0xfff, (qpn >> 12) & 0xfff)
}

/// Word indexes of a QP entry.
mod qpw {
    pub const STATE: usize = 0; // gen<<16 | type<<8 | state
    pub const ACCESS_QKEY: usize = 1; // access<<32 | qkey
    pub const PD_RCQ: usize = 2; // pd<<32 | recv cq index
    pub const SRQ_RQ: usize = 3; // srq index<<32 | rq capacity
    pub const DC_KEY: usize = 4;
    pub const PEER_LO: usize = 5;
    pub const PEER_HI: usize = 6;
    pub const PEER_QPN: usize = 7;
    pub const SQ_DONE: usize = 8; // send-queue sequence freed by polling
    pub const RCQ_GEN: usize = 9;
    pub const SRQ_GEN: usize = 10;
}

/// Type value of a free QP slot.
pub const QP_FREE: u8 = 0;

/// A view of QP entry `idx` in a control block.
#[derive(Clone, Copy, Debug)]
pub struct QpEntry<'a> {
    seg: &'a Segment,
    off: usize,
}

/// Decoded state word of a QP entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpStateWord {
    pub gen: u32,
    pub qp_type: Option<QpType>,
    pub state: QpState,
}

impl QpStateWord {
    fn decode(w: u64) -> QpStateWord {
        QpStateWord {
            gen: (w >> 16) as u32,
            qp_type: QpType::from_u8((w >> 8) as u8),
            state: QpState::from_u8(w as u8),
        }
    }
    fn encode(gen: u32, t: u8, s: QpState) -> u64 {
        ((gen as u64) << 16) | ((t as u64) << 8) | s as u64
    }
}

impl<'a> QpEntry<'a> {
    /// Entry `idx` (must be `< MAX_QP`).
    pub fn new(seg: &'a Segment, idx: u32) -> QpEntry<'a> {
        debug_assert!(idx < MAX_QP);
        QpEntry {
            seg,
            off: QP_OFF + idx as usize * QP_BYTES,
        }
    }

    /// Entry named by a QP number, if its generation matches and it is in use.
    #[inline]
    pub fn by_qpn(seg: &'a Segment, qpn: u32) -> Option<(QpEntry<'a>, QpStateWord)> {
        let (idx, gen12) = split_qpn(qpn);
        if idx >= MAX_QP {
            return None;
        }
        let e = QpEntry::new(seg, idx);
        let sw = e.state_word();
        (sw.qp_type.is_some() && sw.gen & 0xfff == gen12).then_some((e, sw))
    }

    #[inline]
    fn w(&self, i: usize) -> &'a AtomicU64 {
        self.seg.word(self.off + i * 8)
    }

    pub fn state_word(&self) -> QpStateWord {
        QpStateWord::decode(self.w(qpw::STATE).load(Acquire))
    }

    /// The raw state word (generation, type, state): a cache of the QP's
    /// other fields stays valid while it is unchanged, because those fields
    /// change only together with a transition.
    #[inline]
    pub fn state_raw(&self) -> u64 {
        self.w(qpw::STATE).load(Acquire)
    }

    /// Allocates the slot for a new QP (fields first, then the state word).
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        gen: u32,
        t: QpType,
        pd: u32,
        recv_cq: (u32, u32),
        srq: Option<(u32, u32)>,
        rq_cap: u32,
        dc_key: u64,
    ) {
        self.w(qpw::ACCESS_QKEY).store(0, Relaxed);
        self.w(qpw::PD_RCQ)
            .store(((pd as u64) << 32) | recv_cq.0 as u64, Relaxed);
        self.w(qpw::RCQ_GEN).store(recv_cq.1 as u64, Relaxed);
        let (si, sg) = srq.unwrap_or((NONE, 0));
        self.w(qpw::SRQ_RQ)
            .store(((si as u64) << 32) | rq_cap as u64, Relaxed);
        self.w(qpw::SRQ_GEN).store(sg as u64, Relaxed);
        self.w(qpw::DC_KEY).store(dc_key, Relaxed);
        self.w(qpw::PEER_QPN).store(0, Relaxed);
        self.w(qpw::SQ_DONE).store(0, Relaxed);
        self.w(qpw::STATE)
            .store(QpStateWord::encode(gen, t as u8, QpState::Reset), Release);
    }

    /// Frees the slot (keeps the generation).
    pub fn free(&self) {
        let sw = self.state_word();
        self.w(qpw::STATE).store(
            QpStateWord::encode(sw.gen, QP_FREE, QpState::Reset),
            Release,
        );
    }

    /// Moves the state from `from` to `to` if it is still `from`.
    pub fn cas_state(&self, from: QpState, to: QpState) -> bool {
        let cur = self.w(qpw::STATE).load(Acquire);
        let sw = QpStateWord::decode(cur);
        if sw.state != from || sw.qp_type.is_none() {
            return false;
        }
        let t = (cur >> 8) as u8;
        self.w(qpw::STATE)
            .compare_exchange(cur, QpStateWord::encode(sw.gen, t, to), AcqRel, Acquire)
            .is_ok()
    }

    /// Forces the state to ERR; returns whether this call moved it there.
    pub fn force_err(&self) -> bool {
        loop {
            let cur = self.w(qpw::STATE).load(Acquire);
            let sw = QpStateWord::decode(cur);
            if sw.state == QpState::Err || sw.qp_type.is_none() {
                return false;
            }
            let t = (cur >> 8) as u8;
            if self
                .w(qpw::STATE)
                .compare_exchange(
                    cur,
                    QpStateWord::encode(sw.gen, t, QpState::Err),
                    AcqRel,
                    Acquire,
                )
                .is_ok()
            {
                return true;
            }
        }
    }

    pub fn set_access_qkey(&self, access: Access, qkey: u32) {
        self.w(qpw::ACCESS_QKEY)
            .store(((access.0 as u64) << 32) | qkey as u64, Release);
    }
    pub fn access(&self) -> Access {
        Access((self.w(qpw::ACCESS_QKEY).load(Acquire) >> 32) as u32)
    }
    pub fn qkey(&self) -> u32 {
        self.w(qpw::ACCESS_QKEY).load(Acquire) as u32
    }
    pub fn pd(&self) -> u32 {
        (self.w(qpw::PD_RCQ).load(Acquire) >> 32) as u32
    }
    /// `(index, generation)` of the receive CQ.
    pub fn recv_cq(&self) -> (u32, u32) {
        (
            self.w(qpw::PD_RCQ).load(Acquire) as u32,
            self.w(qpw::RCQ_GEN).load(Acquire) as u32,
        )
    }
    /// `(index, generation)` of the SRQ, if the QP receives from one.
    pub fn srq(&self) -> Option<(u32, u32)> {
        let i = (self.w(qpw::SRQ_RQ).load(Acquire) >> 32) as u32;
        (i != NONE).then(|| (i, self.w(qpw::SRQ_GEN).load(Acquire) as u32))
    }
    pub fn dc_key(&self) -> u64 {
        self.w(qpw::DC_KEY).load(Acquire)
    }
    pub fn set_peer(&self, gid: Gid, qpn: u32) {
        let b = gid.as_bytes();
        self.w(qpw::PEER_LO).store(
            u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            Relaxed,
        );
        self.w(qpw::PEER_HI).store(
            u64::from_le_bytes(b[8..].try_into().unwrap_or_default()),
            Relaxed,
        );
        self.w(qpw::PEER_QPN).store(qpn as u64, Release);
    }
    pub fn peer(&self) -> (Gid, u32) {
        let qpn = self.w(qpw::PEER_QPN).load(Acquire) as u32;
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&self.w(qpw::PEER_LO).load(Relaxed).to_le_bytes());
        g[8..].copy_from_slice(&self.w(qpw::PEER_HI).load(Relaxed).to_le_bytes());
        (Gid(g), qpn)
    }
    /// The send-queue position freed by polling (monotonic).
    #[inline]
    pub fn sq_done(&self) -> &'a AtomicU64 {
        self.w(qpw::SQ_DONE)
    }
}

fn small_word(seg: &Segment, base: usize, bytes: usize, idx: u32, w: usize) -> &AtomicU64 {
    seg.word(base + idx as usize * bytes + w * 8)
}

/// Publishes CQ slot `idx`.
pub fn cq_publish(seg: &Segment, idx: u32, gen: u32, cap: u32) {
    small_word(seg, CQ_OFF, CQ_BYTES, idx, 1).store(cap as u64, Relaxed);
    small_word(seg, CQ_OFF, CQ_BYTES, idx, 0).store(((gen as u64) << 1) | 1, Release);
}
/// Generation and validity of CQ slot `idx`.
pub fn cq_gen(seg: &Segment, idx: u32) -> (u32, bool) {
    let s = small_word(seg, CQ_OFF, CQ_BYTES, idx, 0).load(Acquire);
    ((s >> 1) as u32, s & 1 == 1)
}
/// Invalidates CQ slot `idx`.
pub fn cq_invalidate(seg: &Segment, idx: u32) {
    let w = small_word(seg, CQ_OFF, CQ_BYTES, idx, 0);
    w.store(w.load(Acquire) & !1, Release);
}
/// Publishes SRQ slot `idx`.
pub fn srq_publish(seg: &Segment, idx: u32, gen: u32, cap: u32, max_sge: u32) {
    small_word(seg, SRQ_OFF, SRQ_BYTES, idx, 1)
        .store(((cap as u64) << 32) | max_sge as u64, Relaxed);
    small_word(seg, SRQ_OFF, SRQ_BYTES, idx, 0).store(((gen as u64) << 1) | 1, Release);
}
/// Generation and validity of SRQ slot `idx`.
pub fn srq_gen(seg: &Segment, idx: u32) -> (u32, bool) {
    let s = small_word(seg, SRQ_OFF, SRQ_BYTES, idx, 0).load(Acquire);
    ((s >> 1) as u32, s & 1 == 1)
}
/// Invalidates SRQ slot `idx`.
pub fn srq_invalidate(seg: &Segment, idx: u32) {
    let w = small_word(seg, SRQ_OFF, SRQ_BYTES, idx, 0);
    w.store(w.load(Acquire) & !1, Release);
}
