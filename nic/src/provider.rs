//! The NIC provider contract: a small, verbs-shaped trait family.
//!
//! A provider is an opened device context ([`Nic`]) with associated handle types
//! for its objects. Handles are cheap to clone (reference counted) and the last
//! clone releases the object. The data path (`post_send`, `post_recv`, `poll`)
//! takes `&self` and is safe to call from several threads; providers serialize
//! per queue internally, never device-wide.
//!
//! Semantics every provider must keep (checked by [`crate::conformance`]):
//! - Faults detected while executing a WR are completions with an error status;
//!   the QP then enters ERR and every outstanding and later WR completes with
//!   `WR_FLUSH_ERR` until the QP is reset.
//! - Send-queue credits: a QP has `max_send_wr` slots; a slot is freed only
//!   when a signaled completion at or after it is polled from the CQ; posting
//!   into a full queue is refused with [`crate::PostErrorKind::QueueFull`].
//! - A CQ that overflows reports [`crate::NicError::CqOverflow`] from `poll`.

use crate::counters::Counters;
use crate::error::{PostError, Result};
use crate::types::{
    Access, DeviceCaps, Gid, QpCaps, QpState, QpType, RecvWr, RemoteAddr, SendWr, Sge, Transition,
    Wc,
};

/// An opened RDMA device (one port): the factory of every other object.
pub trait Nic: Send + Sync + Sized + 'static {
    /// Protection domain handle.
    type Pd: Clone + Send + Sync + 'static;
    /// Memory region handle.
    type Mr: MemoryRegion;
    /// Completion queue handle.
    type Cq: CompletionQueue;
    /// Shared receive queue handle.
    type Srq: SharedReceiveQueue;
    /// Queue pair handle.
    type Qp: QueuePair;

    /// The GID of this port.
    fn gid(&self) -> Gid;
    /// What the device supports.
    fn caps(&self) -> DeviceCaps;
    /// A snapshot of the device counters.
    fn counters(&self) -> Counters;

    /// The file through which the processes of this machine that open this
    /// port agree that one of them runs its engine (a lock file the engine
    /// holds for its life; see `krcore_kmod::Engine::start`), or `None`
    /// when no other process can have this port's GID. A GID is the
    /// port's: two processes with engines of their own on one port share it
    /// and collide (the meta table, the DCCache and messaging know a node
    /// by its GID). Verbs: one file per GID under `$KRCORE_RUN_DIR`
    /// (default the temporary directory). Sim: the host's file in a
    /// directory fabric (`host=`); `None` for a node with a GID of its own,
    /// and in an in-memory fabric (one process).
    fn port_lock_path(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd>;

    /// Allocates `len` bytes of zeroed memory and registers it.
    ///
    /// # Errors
    /// `MrTooLarge` past [`DeviceCaps::max_mr_size`], `Exhausted` when the MR
    /// table is full, `InvalidArgument` for a zero length.
    fn alloc_mr(&self, pd: &Self::Pd, len: usize, access: Access) -> Result<Self::Mr>;

    /// Registers caller memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes for as long as the
    /// returned region (and every clone of it) lives, and must not be
    /// accessed through Rust references while the NIC may write it.
    ///
    /// # Errors
    /// `Unsupported` where the provider cannot expose caller memory (the
    /// multi-process `sim` fabric), plus the errors of [`Nic::alloc_mr`].
    #[allow(unsafe_code)] // declaring the contract; implementations quarantine it
    unsafe fn register_mr(
        &self,
        pd: &Self::Pd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr>;

    /// Allocates `len` zeroed bytes that another process can map as well,
    /// and registers them: the region owns the memory, and the returned
    /// file maps the same bytes ([`crate::shared::SharedMap::map`]), so
    /// data the NIC moves lands in the other process's mapping with no
    /// copy. What a node daemon hands its attached processes as their
    /// buffers. The file stays valid after the region is deregistered (the
    /// bytes are then no longer reachable by the NIC).
    ///
    /// # Errors
    /// `Unsupported` where the provider cannot share its memory (the
    /// default); the errors of [`Nic::alloc_mr`]; `Os` when the shared file
    /// cannot be made or opened.
    fn alloc_shared_mr(
        &self,
        pd: &Self::Pd,
        len: usize,
        access: Access,
    ) -> Result<(Self::Mr, std::fs::File)> {
        let _ = (pd, len, access);
        Err(crate::error::NicError::Unsupported(
            "memory shared with another process on this provider",
        ))
    }

    /// Registers `offset..offset+len` of `parent` once more, as a region of
    /// its own: new keys over the same bytes, with `access` (a subset of
    /// the parent's). Remote access through the new rkey is limited to
    /// that range at the NIC, and ends when the last handle of the new
    /// region drops: after that a peer that posts the key gets
    /// `REM_ACCESS_ERR`, and once the drop returns no access through the
    /// key moves data any more. The sub-region keeps its parent
    /// registered while it lives. This is what an MR lease is made of (a
    /// key per lease that revocation invalidates): a memory window would
    /// bind faster on hardware, but a type 2 window answers only through
    /// the QP it was bound on (no DC target, no second peer) and a type 1
    /// window needs a send queue to bind it.
    ///
    /// # Errors
    /// `InvalidArgument` for a range outside `parent`, a zero length, an
    /// access the parent does not allow, or a remote write or atomic
    /// access without `LOCAL_WRITE` (verbs' own rule); `Exhausted` when the
    /// MR table is full; the registration's errors (pinning) on verbs.
    fn register_sub_mr(
        &self,
        parent: &Self::Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr>;

    /// Creates a completion queue of `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;

    /// Creates a shared receive queue of `max_wr` entries with up to `max_sge`
    /// SGEs each.
    fn create_srq(&self, pd: &Self::Pd, max_wr: u32, max_sge: u32) -> Result<Self::Srq>;

    /// Creates a QP in RESET.
    ///
    /// `recv_cq` receives receive completions; `srq` replaces the QP's own
    /// receive queue (required for DCT). DCI and DCT need [`DeviceCaps::dc`]. A
    /// DCT takes its `dc_key` here.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> Result<Self::Qp>;
}

/// How to create a QP.
pub struct QpInit<'a, N: Nic> {
    /// Transport.
    pub qp_type: QpType,
    /// Queue depths and SGE limits.
    pub caps: QpCaps,
    /// CQ for send completions (unused by DCT).
    pub send_cq: &'a N::Cq,
    /// CQ for receive completions (unused by DCI).
    pub recv_cq: &'a N::Cq,
    /// SRQ to receive from instead of a private receive queue.
    pub srq: Option<&'a N::Srq>,
    /// DC key of a DCT (ignored by other types).
    pub dc_key: u64,
}

impl<N: Nic> std::fmt::Debug for QpInit<'_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpInit")
            .field("qp_type", &self.qp_type)
            .field("caps", &self.caps)
            .field("srq", &self.srq.is_some())
            .field("dc_key", &self.dc_key)
            .finish()
    }
}

/// A registered memory region.
///
/// The region's bytes may be written by the NIC (or remote peers) at any
/// time, so they are never handed out as `&[u8]`: use the copying accessors.
pub trait MemoryRegion: Clone + Send + Sync + 'static {
    /// Virtual address of the first byte in this process.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty (never true for a registered region).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key.
    fn rkey(&self) -> u32;
    /// Access flags it was registered with.
    fn access(&self) -> Access;

    /// Copies `buf.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()>;
    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Atomically loads the 8-byte word at `offset` (8-byte aligned).
    fn load_u64(&self, offset: usize) -> Result<u64>;
    /// Atomically stores the 8-byte word at `offset` (8-byte aligned).
    fn store_u64(&self, offset: usize, value: u64) -> Result<()>;

    /// Faults `offset..offset+len` in ahead of use, without changing its
    /// bytes. A NIC pins registered memory when it is registered, so for
    /// hardware providers this does nothing but check the range; the sim
    /// backs memory lazily, and there the first access to a page would
    /// otherwise pay the kernel's zeroing inside a data-path operation.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        check_range(self.len(), offset, len)
    }

    /// An SGE over `offset..offset+len` of this region.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        check_range(self.len(), offset, len as usize)?;
        Ok(Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        })
    }

    /// The remote address of `offset` in this region, for peers.
    fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr() + offset as u64,
            rkey: self.rkey(),
        }
    }
}

/// Checks a send WR as a NIC driver does while building its WQE: the
/// destination kind fits the transport, UD carries only SENDs, inline data
/// only for WRITE/SEND and within `dev.max_inline`, SGEs within
/// `caps.max_send_sge`, atomics with exactly one 8-byte SGE. Every provider
/// refuses the same WRs the same way (`EINVAL`, [`crate::PostErrorKind::Malformed`]).
///
/// # Errors
/// The reason, for [`crate::PostErrorKind::Malformed`].
#[inline(always)]
pub fn validate_send_wr(
    qp_type: QpType,
    caps: &QpCaps,
    dev: &DeviceCaps,
    wr: &SendWr,
) -> std::result::Result<(), &'static str> {
    use crate::types::{Destination, Payload, WrOp};
    match (qp_type, &wr.dest) {
        (QpType::Rc, Destination::Connected) => {}
        (QpType::Dci, Destination::Dc(_)) => {}
        (QpType::Ud, Destination::Ud(_)) => {}
        (QpType::Rc, _) => return Err("an RC QP sends only to its connected peer"),
        (QpType::Dci, _) => return Err("a DCI work request must name a DC target"),
        (QpType::Ud, _) => return Err("a UD work request must name a UD destination"),
        (QpType::Dct, _) => return Err("a DCT has no send queue"),
    }
    if qp_type == QpType::Ud && !matches!(wr.op, WrOp::Send | WrOp::SendImm { .. }) {
        return Err("UD carries only SEND and SEND_WITH_IMM");
    }
    match &wr.payload {
        Payload::Inline(d) => {
            if matches!(wr.op, WrOp::Read { .. }) || wr.op.is_atomic() {
                return Err("inline data only for WRITE and SEND");
            }
            if d.as_slice().len() > dev.max_inline as usize {
                return Err("inline data larger than max_inline");
            }
        }
        Payload::Local(sg) => {
            if sg.as_slice().len() > caps.max_send_sge.max(1) as usize {
                return Err("more SGEs than max_send_sge");
            }
            if wr.op.is_atomic() && (sg.as_slice().len() != 1 || sg.as_slice()[0].length != 8) {
                return Err("an atomic needs exactly one 8-byte SGE");
            }
        }
    }
    Ok(())
}

/// The arguments of [`Nic::register_sub_mr`], checked the same way by every
/// provider.
pub(crate) fn check_sub_mr<M: MemoryRegion>(
    parent: &M,
    offset: usize,
    len: usize,
    access: Access,
) -> Result<()> {
    if len == 0 {
        return Err(crate::NicError::InvalidArgument(
            "zero-length sub-region".into(),
        ));
    }
    check_range(parent.len(), offset, len)?;
    if !parent.access().contains(access) {
        return Err(crate::NicError::InvalidArgument(format!(
            "sub-region access {access:?} beyond its parent's {:?}",
            parent.access()
        )));
    }
    if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(crate::NicError::InvalidArgument(
            "remote write or atomic access needs LOCAL_WRITE".into(),
        ));
    }
    Ok(())
}

/// Checks that `offset..offset+len` lies within `0..total`.
#[inline]
pub(crate) fn check_range(total: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(crate::NicError::InvalidArgument(format!(
            "range {offset}+{len} outside region of {total} bytes"
        ))),
    }
}

/// A completion queue.
pub trait CompletionQueue: Clone + Send + Sync + 'static {
    /// Depth in entries.
    fn depth(&self) -> u32;
    /// Polls up to `out.len()` completions; returns how many were written.
    ///
    /// Polling a send completion frees the send-queue credits of its QP up to
    /// and including that WR.
    ///
    /// # Errors
    /// `CqOverflow` once the queue has overflowed (sticky).
    fn poll(&self, out: &mut [Wc]) -> Result<usize>;
}

/// A shared receive queue.
pub trait SharedReceiveQueue: Clone + Send + Sync + 'static {
    /// Posts receive buffers.
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError>;
    /// Free slots right now (a hint for replenishing).
    fn free_slots(&self) -> u32;
}

/// A queue pair.
pub trait QueuePair: Clone + Send + Sync + 'static {
    /// QP number (the DCT number for a DCT).
    fn qpn(&self) -> u32;
    /// Transport.
    fn qp_type(&self) -> QpType;
    /// Current state (a fault may move it to ERR at any time).
    fn state(&self) -> QpState;
    /// Applies a state transition.
    ///
    /// # Errors
    /// `InvalidTransition` for a transition verbs does not allow from the
    /// current state; `InvalidArgument` for missing or extra attributes (an RC
    /// RTR without a peer, for example).
    fn modify(&self, t: Transition) -> Result<()>;
    /// Posts a slice of send WRs with one doorbell.
    fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError>;
    /// Posts receive buffers to the QP's own receive queue.
    fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError>;
    /// Send-queue slots free right now.
    fn send_credits(&self) -> u32;
    /// Send-queue depth.
    fn max_send_wr(&self) -> u32;
}

/// Brings `qp` from RESET to RTS (RC needs `peer`).
///
/// # Errors
/// The errors of [`QueuePair::modify`].
pub fn bring_up<Q: QueuePair>(qp: &Q, access: Access, peer: Option<crate::RcPeer>) -> Result<()> {
    qp.modify(Transition::Init { access, qkey: 0 })?;
    qp.modify(Transition::Rtr { peer })?;
    if qp.qp_type() != QpType::Dct {
        qp.modify(Transition::Rts {
            rnr_retry: 3,
            retry_cnt: 3,
        })?;
    }
    Ok(())
}
