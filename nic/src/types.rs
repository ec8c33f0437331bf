//! Verbs-shaped value types: GIDs, access flags, scatter/gather entries, work
//! requests and work completions.
//!
//! Every type here is plain data (`Copy` where it can be) so that the control
//! plane can keep copies of posted work requests (for recovery) without
//! allocating, and so that the same values flow unchanged to any provider.

use std::fmt;

/// A 16-byte global identifier of a port (an IPv6-shaped address in RoCE).
///
/// In `sim` a GID is `fabric id (8) | node slot (4) | slot generation (4)`, so a
/// GID of a node that died is never confused with the node that reuses its slot.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid(")?;
        for (i, chunk) in self.0.chunks(2).enumerate() {
            if i > 0 {
                write!(f, ":")?;
            }
            write!(f, "{:02x}{:02x}", chunk[0], chunk[1])?;
        }
        write!(f, ")")
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Memory-region and queue-pair access flags (`IBV_ACCESS_*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// The NIC may write into the region for local operations (READ results,
    /// atomic results, receive buffers).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// Remote peers may READ the region.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// Remote peers may run CAS/FAA on the region.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every flag above.
    pub const ALL: Access = Access(0b1111);

    /// Whether every flag in `other` is set in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            write!(f, "Access(NONE)")
        } else {
            write!(f, "Access({})", set.join("|"))
        }
    }
}

/// One scatter/gather entry: `length` bytes at virtual address `addr` inside the
/// memory region whose local key is `lkey`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Sge {
    /// Virtual address in the posting process.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region holding `addr..addr+length`.
    pub lkey: u32,
}

/// The most scatter/gather entries one work request may carry.
pub const MAX_SGE: usize = 4;
/// The most bytes of inline data one work request may carry.
pub const MAX_INLINE: usize = 64;

/// A fixed-capacity list of scatter/gather entries (no allocation per WR).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SgList {
    len: u8,
    entries: [Sge; MAX_SGE],
}

impl SgList {
    /// An empty list (a zero-length SEND, for example).
    #[inline]
    pub const fn empty() -> SgList {
        SgList {
            len: 0,
            entries: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
        }
    }

    /// A list of one entry.
    #[inline]
    pub const fn one(sge: Sge) -> SgList {
        let mut l = SgList::empty();
        l.entries[0] = sge;
        l.len = 1;
        l
    }

    /// A list from a slice; `None` when it has more than [`MAX_SGE`] entries.
    #[inline]
    pub fn from_slice(sges: &[Sge]) -> Option<SgList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList::empty();
        l.entries[..sges.len()].copy_from_slice(sges);
        l.len = sges.len() as u8;
        Some(l)
    }

    /// The entries.
    #[inline]
    pub fn as_slice(&self) -> &[Sge] {
        &self.entries[..self.len as usize]
    }

    /// The entry of a list of exactly one (the common WR's shape), read
    /// at a constant index: no bounds check.
    #[inline]
    pub fn single(&self) -> Option<&Sge> {
        if self.len == 1 {
            Some(&self.entries[0])
        } else {
            None
        }
    }

    /// Total length in bytes of all entries.
    #[inline(always)]
    pub fn total_len(&self) -> u64 {
        // The common list of one without a loop, so that a post's
        // accounting (inlined into the caller) makes no call for it.
        match self.single() {
            Some(s) => u64::from(s.length),
            None => self.total_len_of_any(),
        }
    }

    fn total_len_of_any(&self) -> u64 {
        self.as_slice().iter().map(|s| s.length as u64).sum()
    }
}

/// Bytes carried inside the work request itself (`IBV_SEND_INLINE`): copied at
/// post time, so they need no registered memory and no lkey.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InlineData {
    len: u8,
    bytes: [u8; MAX_INLINE],
}

impl InlineData {
    /// Inline data from `data`; `None` when longer than [`MAX_INLINE`].
    #[inline]
    pub fn new(data: &[u8]) -> Option<InlineData> {
        if data.len() > MAX_INLINE {
            return None;
        }
        let mut bytes = [0u8; MAX_INLINE];
        bytes[..data.len()].copy_from_slice(data);
        Some(InlineData {
            len: data.len() as u8,
            bytes,
        })
    }

    /// The bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Where the local side of a work request lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Payload {
    /// Registered local memory (lkey-checked by the NIC).
    Local(SgList),
    /// Inline bytes (only for WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM).
    Inline(InlineData),
}

impl Payload {
    /// Total payload length in bytes.
    #[inline]
    pub fn len(&self) -> u64 {
        match self {
            Payload::Local(sg) => sg.total_len(),
            Payload::Inline(d) => d.as_slice().len() as u64,
        }
    }

    /// Whether the payload is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A remote address and the rkey that grants access to it.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct RemoteAddr {
    /// Virtual address in the target process.
    pub addr: u64,
    /// Remote key of the target's memory region.
    pub rkey: u32,
}

impl RemoteAddr {
    /// The same region `delta` bytes further.
    #[inline]
    pub fn offset(self, delta: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(delta),
            rkey: self.rkey,
        }
    }
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WrOp {
    /// One-sided READ of `payload.len()` bytes from `remote` into the local SGEs.
    Read { remote: RemoteAddr },
    /// One-sided WRITE of the payload to `remote`.
    Write { remote: RemoteAddr },
    /// WRITE that also consumes a receive at the target and delivers `imm`.
    WriteImm { remote: RemoteAddr, imm: u32 },
    /// Two-sided SEND into a receive buffer posted by the target.
    Send,
    /// SEND that also delivers `imm` in the target's completion.
    SendImm { imm: u32 },
    /// 8-byte compare-and-swap at `remote`; the old value lands in the local SGE.
    CompareSwap {
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    },
    /// 8-byte fetch-and-add at `remote`; the old value lands in the local SGE.
    FetchAdd { remote: RemoteAddr, add: u64 },
}

impl WrOp {
    /// Whether this is an atomic (CAS or FAA).
    #[inline]
    pub fn is_atomic(&self) -> bool {
        matches!(self, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. })
    }

    /// The remote address of a one-sided operation.
    #[inline]
    pub fn remote(&self) -> Option<RemoteAddr> {
        match *self {
            WrOp::Read { remote }
            | WrOp::Write { remote }
            | WrOp::WriteImm { remote, .. }
            | WrOp::CompareSwap { remote, .. }
            | WrOp::FetchAdd { remote, .. } => Some(remote),
            WrOp::Send | WrOp::SendImm { .. } => None,
        }
    }

    /// The completion opcode a successful execution reports.
    #[inline]
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOp::Read { .. } => WcOpcode::RdmaRead,
            WrOp::Write { .. } | WrOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            WrOp::Send | WrOp::SendImm { .. } => WcOpcode::Send,
            WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// The address of a DC target, named per work request by a DC initiator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
pub struct DcTarget {
    /// GID of the target's port.
    pub gid: Gid,
    /// The target's DCT number.
    pub dct_num: u32,
    /// The key the DCT was created with; a mismatch is refused by the target.
    pub dc_key: u64,
}

/// The address of a UD destination, named per work request.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct UdTarget {
    /// GID of the destination's port.
    pub gid: Gid,
    /// Destination QP number.
    pub qpn: u32,
    /// Queue key; a mismatch makes the destination drop the datagram.
    pub qkey: u32,
}

/// Where a work request goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Destination {
    /// The QP's connected peer (RC).
    Connected,
    /// A DC target (DCI only).
    Dc(DcTarget),
    /// A UD destination (UD only).
    Ud(UdTarget),
}

/// Send flags (`IBV_SEND_*`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SendFlags(pub u8);

impl SendFlags {
    /// No flags: unsignaled, not fenced.
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion on success (errors always complete).
    pub const SIGNALED: SendFlags = SendFlags(1);
    /// Wait for earlier READs/atomics before executing.
    pub const FENCE: SendFlags = SendFlags(1 << 1);

    /// Whether every flag in `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// A send-queue work request. Plain data: a slice of these posted in one call is
/// one doorbell.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SendWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: WrOp,
    /// Local memory (or inline bytes).
    pub payload: Payload,
    /// Signaling and fencing.
    pub flags: SendFlags,
    /// Where it goes.
    pub dest: Destination,
}

impl SendWr {
    /// A READ of `local.length` bytes at `remote` into `local`.
    #[inline]
    pub fn read(wr_id: u64, local: Sge, remote: RemoteAddr) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::Read { remote },
            payload: Payload::Local(SgList::one(local)),
            flags: SendFlags::SIGNALED,
            dest: Destination::Connected,
        }
    }

    /// A WRITE of `local` to `remote`.
    #[inline]
    pub fn write(wr_id: u64, local: Sge, remote: RemoteAddr) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::Write { remote },
            payload: Payload::Local(SgList::one(local)),
            flags: SendFlags::SIGNALED,
            dest: Destination::Connected,
        }
    }

    /// A CAS at `remote` (old value into the 8-byte `local`).
    #[inline]
    pub fn cas(wr_id: u64, local: Sge, remote: RemoteAddr, compare: u64, swap: u64) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            payload: Payload::Local(SgList::one(local)),
            flags: SendFlags::SIGNALED,
            dest: Destination::Connected,
        }
    }

    /// A FAA at `remote` (old value into the 8-byte `local`).
    #[inline]
    pub fn faa(wr_id: u64, local: Sge, remote: RemoteAddr, add: u64) -> SendWr {
        SendWr {
            wr_id,
            op: WrOp::FetchAdd { remote, add },
            payload: Payload::Local(SgList::one(local)),
            flags: SendFlags::SIGNALED,
            dest: Destination::Connected,
        }
    }

    /// A SEND of `local` (with `imm` when given).
    #[inline]
    pub fn send(wr_id: u64, local: Sge, imm: Option<u32>) -> SendWr {
        SendWr {
            wr_id,
            op: match imm {
                Some(imm) => WrOp::SendImm { imm },
                None => WrOp::Send,
            },
            payload: Payload::Local(SgList::one(local)),
            flags: SendFlags::SIGNALED,
            dest: Destination::Connected,
        }
    }

    /// The same WR with `dest` set.
    #[inline]
    pub fn to(mut self, dest: Destination) -> SendWr {
        self.dest = dest;
        self
    }

    /// The same WR signaled or not.
    #[inline]
    pub fn signaled(mut self, yes: bool) -> SendWr {
        if yes {
            self.flags.0 |= SendFlags::SIGNALED.0;
        } else {
            self.flags.0 &= !SendFlags::SIGNALED.0;
        }
        self
    }

    /// Whether the WR asks for a completion on success.
    #[inline]
    pub fn is_signaled(&self) -> bool {
        self.flags.contains(SendFlags::SIGNALED)
    }
}

/// A receive work request: a buffer for one incoming message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RecvWr {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Where the message lands.
    pub sg: SgList,
}

impl RecvWr {
    /// A receive into one buffer.
    pub fn new(wr_id: u64, sge: Sge) -> RecvWr {
        RecvWr {
            wr_id,
            sg: SgList::one(sge),
        }
    }
}

/// Completion status, with the numeric values of `enum ibv_wc_status`.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, Default, Hash, serde::Serialize, serde::Deserialize,
)]
#[repr(u8)]
pub enum WcStatus {
    #[default]
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    FatalErr = 19,
    GeneralErr = 21,
}

impl WcStatus {
    /// From the numeric `ibv_wc_status` (unknown values map to `GeneralErr`).
    pub fn from_u8(v: u8) -> WcStatus {
        match v {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            7 => WcStatus::BadRespErr,
            8 => WcStatus::LocAccessErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            19 => WcStatus::FatalErr,
            _ => WcStatus::GeneralErr,
        }
    }

    /// Whether the status is success.
    #[inline]
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, Default, Hash, serde::Serialize, serde::Deserialize,
)]
#[repr(u8)]
pub enum WcOpcode {
    #[default]
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// From the numeric value (unknown values map to `Send`).
    pub fn from_u8(v: u8) -> WcOpcode {
        match v {
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Send,
        }
    }
}

/// A work completion.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Wc {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. For error completions the value is not defined by
    /// verbs; providers report the WR's own opcode where they know it.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: message length).
    pub byte_len: u32,
    /// Immediate data, for receives of `*_WITH_IMM`.
    pub imm: Option<u32>,
    /// The local QP the completion belongs to.
    pub qp_num: u32,
    /// For receives on UD/DCT: the sender's QP number.
    pub src_qp: u32,
}

/// Queue pair transport type.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum QpType {
    /// Reliable connected.
    Rc = 1,
    /// Unreliable datagram.
    Ud = 2,
    /// DC initiator (send only; target named per WR).
    Dci = 3,
    /// DC target (receive only; needs an SRQ).
    Dct = 4,
}

impl QpType {
    /// From the numeric value.
    pub fn from_u8(v: u8) -> Option<QpType> {
        match v {
            1 => Some(QpType::Rc),
            2 => Some(QpType::Ud),
            3 => Some(QpType::Dci),
            4 => Some(QpType::Dct),
            _ => None,
        }
    }
}

/// Queue pair state.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Err = 6,
}

impl QpState {
    /// From the numeric value.
    pub fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Err,
        }
    }
}

/// The connected peer of an RC QP, given at RTR.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
pub struct RcPeer {
    /// Peer port GID.
    pub gid: Gid,
    /// Peer QP number.
    pub qpn: u32,
}

/// A QP state transition and the attributes it needs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Transition {
    /// RESET -> INIT. `access`: remote operations this QP accepts (RC, DCT);
    /// `qkey`: the queue key (UD).
    Init { access: Access, qkey: u32 },
    /// INIT -> RTR. `peer` is required for RC and must be `None` otherwise.
    Rtr { peer: Option<RcPeer> },
    /// RTR -> RTS. `rnr_retry`: receiver-not-ready retries (7 = infinite);
    /// `retry_cnt`: transport retries before `RETRY_EXC_ERR`.
    Rts { rnr_retry: u8, retry_cnt: u8 },
    /// Any state -> RESET (outstanding work is discarded, without completions).
    Reset,
    /// Any state -> ERR (outstanding work completes with `WR_FLUSH_ERR`).
    Err,
}

/// Attributes for creating a QP.
#[derive(Clone, Copy, Debug)]
pub struct QpCaps {
    /// Send queue depth (credits). Ignored for DCT.
    pub max_send_wr: u32,
    /// Receive queue depth (0 when an SRQ is used, or for DCI).
    pub max_recv_wr: u32,
    /// Most SGEs per send WR.
    pub max_send_sge: u32,
    /// Most SGEs per receive WR.
    pub max_recv_sge: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
        }
    }
}

/// Device capabilities reported at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The device supports DC (DCI/DCT).
    pub dc: bool,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most inline bytes per WR.
    pub max_inline: u32,
    /// Largest message of a UD send (path MTU).
    pub ud_mtu: u32,
    /// Registering caller memory (`register_mr`) is supported.
    pub register_user_memory: bool,
}

/// Bytes of the Global Routing Header placed before the payload of every UD
/// receive, as on real hardware (the source GID sits at bytes 8..24).
pub const GRH_LEN: usize = 40;

/// The sender's GID from the 40 bytes a UD receive starts with: a GRH
/// (InfiniBand, RoCE v1, RoCE v2 over IPv6: the source GID at bytes 8..24),
/// or for RoCE v2 over IPv4 an IPv4 header in bytes 20..40 (the first 20
/// undefined), whose source address becomes the IPv4-mapped GID
/// `::ffff:a.b.c.d`. IPv4 is recognized as `ibv_init_ah_from_wc` does it:
/// bytes 20.. start an IPv4 header (`0x45`) and either the first nibble is
/// not an IPv6 version (the header's checksum may be 0 then: rxe over
/// loopback leaves it to offload) or the checksum is right. One more
/// condition keeps a GRH whose source GID holds `0x45` at byte 20 from being
/// misread: the header must carry UDP (RoCE v2 always does), unless its
/// checksum is right.
pub fn grh_source_gid(grh: &[u8; GRH_LEN]) -> Gid {
    let ip4 = &grh[20..40];
    let checksum_ok = || {
        let sum: u32 = ip4
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        (folded & 0xffff) + (folded >> 16) == 0xffff
    };
    const UDP: u8 = 17;
    let ipv4 = ip4[0] == 0x45 && ((grh[0] >> 4 != 6 && ip4[9] == UDP) || checksum_ok());
    let mut g = [0u8; 16];
    if ipv4 {
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..16].copy_from_slice(&ip4[12..16]);
    } else {
        g.copy_from_slice(&grh[8..24]);
    }
    Gid(g)
}

#[cfg(test)]
mod grh_tests {
    use super::*;

    fn ipv4_header(src: [u8; 4]) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[8] = 64; // TTL
        h[9] = 17; // UDP
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&[127, 0, 0, 1]);
        let sum: u32 = h
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        let csum = !((folded & 0xffff) + (folded >> 16)) as u16;
        h[10..12].copy_from_slice(&csum.to_be_bytes());
        h
    }

    #[test]
    fn a_grh_names_its_source_gid() {
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        let gid: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
        grh[8..24].copy_from_slice(&gid);
        assert_eq!(grh_source_gid(&grh), Gid(gid));
        // The sim writes only the source GID (byte 0 is 0), whatever it holds.
        let mut sim = [0u8; GRH_LEN];
        let mut g = [0u8; 16];
        g[12] = 0x45;
        sim[8..24].copy_from_slice(&g);
        assert_eq!(grh_source_gid(&sim), Gid(g));
    }

    #[test]
    fn roce_v2_over_ipv4_gives_the_ipv4_mapped_gid() {
        let mut want = [0u8; 16];
        want[10..12].copy_from_slice(&[0xff, 0xff]);
        want[12..16].copy_from_slice(&[10, 1, 2, 3]);
        let mut grh = [0u8; GRH_LEN];
        grh[20..40].copy_from_slice(&ipv4_header([10, 1, 2, 3]));
        assert_eq!(grh_source_gid(&grh), Gid(want));
        // As rxe delivers it over loopback: checksum left 0 (offload).
        grh[30..32].copy_from_slice(&[0, 0]);
        assert_eq!(grh_source_gid(&grh), Gid(want));
        // Seen in the Soft-RoCE guest, verbatim.
        let rxe: [u8; GRH_LEN] = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x45, 0, 0, 0x44, 0x01,
            0x93, 0x40, 0, 0x40, 0x11, 0, 0, 0x7f, 0, 0, 1, 0x7f, 0, 0, 1,
        ];
        let mut lo = [0u8; 16];
        lo[10..16].copy_from_slice(&[0xff, 0xff, 0x7f, 0, 0, 1]);
        assert_eq!(grh_source_gid(&rxe), Gid(lo));
        // An IPv6 GRH whose bytes 20.. happen to look like IPv4 without a
        // valid checksum is a GRH.
        let mut v6 = grh;
        v6[0] = 0x60;
        assert_ne!(grh_source_gid(&v6), Gid(want));
    }
}
