//! `verbs`: real RDMA through libibverbs (`rdma-sys`), feature `verbs`.
//!
//! [`VerbsNic::open_with`] opens one device by name on one port with one GID
//! index, each chosen by default when not given (the first ACTIVE port; the
//! first RoCE v2 IPv4-mapped GID on Ethernet, index 0 on InfiniBand), and
//! [`VerbsNic`] implements [`Nic`] with the same semantics as the `sim`, checked by the
//! same suite ([`crate::conformance`]) on Soft-RoCE (`rxe0`):
//!
//! ```no_run
//! # use krcore_nic::verbs::VerbsNic;
//! # use krcore_nic::{Nic, Access};
//! # use krcore_nic::verbs::VerbsOptions;
//! let nic = VerbsNic::open_with(&VerbsOptions::new("rxe0"))?;
//! println!("rxe0 port {} GID index {}", nic.port(), nic.gid_index());
//! let pd = nic.alloc_pd()?;
//! let mr = nic.alloc_mr(&pd, 4096, Access::ALL)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Design
//! - Raw handles live in one inner struct each (`DeviceInner`, `PdInner`,
//!   `MrInner`, `CqInner`, `SrqInner`, `QpInner`, `Ah`) whose `Drop`
//!   destroys them, holding an `Arc` to their parent, so objects are always
//!   destroyed before what they were made from (as rust-ibverbs does).
//! - The device never sees the caller's `wr_id`: a send WR carries its
//!   send-queue sequence number, a receive WR a tag from a device-wide table
//!   (`recv`). Polling maps them back, which gives exact send-queue credits
//!   (a signaled completion frees every slot before it, as in the sim), the
//!   WR's own opcode on error completions (undefined in verbs), and tells a
//!   flushed receive from a flushed send on a shared CQ.
//! - `post_send` validates and admits WRs (credits) like the sim, then posts
//!   them as ONE `ibv_post_send` chain (one doorbell); `bad_wr` becomes the
//!   [`crate::PostError`] index. A single WR (the latency path) is built on
//!   the stack, a chain in a per-QP reusable buffer.
//! - Send completions are mapped back without the QP's send lock: the CQ
//!   finds the QP in an open-addressing table by QP number (`qptable`,
//!   under the CQ's poll lock) and reads the `wr_id` from the QP's send
//!   ring, a seqlock per slot (`ring`), written under the send lock at post
//!   time. Send sequences are never reused on a CQ (a new QP starts past
//!   those of the destroyed QPs whose numbers the device may reuse), so a
//!   leftover completion can never be taken for another WR's.
//! - RoCE: every address vector is global (GRH with the peer's GID and our
//!   GID index); RC uses the port's active MTU (4096 for rxe on `lo` in
//!   the Soft-RoCE guest, 1024 for rxe on a 1500-byte Ethernet netdev), PSN
//!   `ffi::PSN` on both sides, ACK timeout 14 (67 ms), retry counts from
//!   [`crate::Transition::Rts`]. UD address handles are cached per QP by GID.
//! - No thread: the provider starts none (one sleeping thread makes the
//!   process multi-threaded, which measurably slows every post; rdma-core
//!   starts none either). The context's async events are read lazily and
//!   non-blocking by the provider itself (see `device`).
//! - CQ overflow: `IBV_EVENT_CQ_ERR` (what rxe and mlx5 raise when a CQ
//!   overflows) marks the CQ when the provider reads the device's async
//!   events, and `poll` then returns [`crate::NicError::CqOverflow`] once
//!   the CQ is drained. The events are read every `EVENT_CHECK_EMPTY_POLLS`
//!   (4096) empty polls of a CQ, after every failed device poll, and on
//!   [`VerbsNic::read_async_events`]; so an overflow is reported by the
//!   first poll after the provider has read the event, at the latest the
//!   4096th empty poll of that CQ after the event (or any poll that fails).
//! - DC: [`dc`](self) binds the few mlx5dv calls DC needs. It is untested on
//!   hardware (see its docs); on rxe `caps().dc` is false and DCI/DCT
//!   creation returns `Unsupported`.
//! - Counters: control-path counters are device-wide atomics; data-path ones
//!   are kept per QP under its send lock and summed by `counters()`. READs,
//!   WRITEs, atomics and bytes are counted when posted (a real NIC does not
//!   report unsignaled successes).
//!
//! ## Where a device departs from the sim (seen on rxe, kernel 6.1)
//! - A misaligned atomic is refused at post time (`EINVAL` from rxe's
//!   user-space provider, reported as `PostErrorKind::Malformed`), not
//!   completed with `REM_INV_REQ` as on mlx5 and in the sim.
//! - A remote access error moves the *responder* RC QP to ERR as well (the
//!   sim leaves the target alone): recovery resets both ends.
//! - Completions still in a CQ when their QP is reset are dropped (the
//!   contract's RESET discards outstanding work without completions;
//!   libmlx5 likewise removes them from the CQ, rxe leaves them there),
//!   whereas the sim still returns them. Poll before resetting to see them.
//! - Everything else the conformance suite checks holds unchanged,
//!   including CQ overflow (rxe raises `IBV_EVENT_CQ_ERR`).
//!
//! ## Files
//! Bottom to top (none imports one above it; `ci/imports.py` checks that
//! there is no circle): `ffi`, `error`, `ring`, `recv` (the device's
//! receive table), `select`, `mlx5` (the mlx5dv binding and the DC probe);
//! `device` (a context and port); `mr` (PDs, MRs); `post_recv`; `send` (a
//! QP's send side, shared with its CQ); `qptable`; `cq`; `srq`; `qp_state`
//! (what a QP holds); `wr`, `dc` (building and posting WRs); `qp` (the
//! QP's verbs); this file (`VerbsNic`, which makes them). The device's list
//! of QPs (for their counters) points back up through a small trait
//! (`device::QpCounters`).
//!
//! ## Thread safety
//! Every handle is `Send + Sync`; posting to one QP is serialized by its send
//! lock; polling one CQ is serialized by its poll lock, held across
//! `ibv_poll_cq` and the translation of what it returned, so that any
//! number of threads may poll one CQ without a completion being lost or
//! misattributed (see `cq`).

#![allow(unsafe_code)]

mod cq;
mod dc;
mod device;
mod error;
mod ffi;
mod mlx5;
mod mr;
mod post_recv;
mod qp;
mod qp_state;
mod qptable;
mod recv;
mod ring;
mod select;
mod send;
mod srq;
mod wr;

pub use cq::VerbsCq;
pub use error::VerbsError;
pub use mr::{VerbsMr, VerbsPd};
pub use qp::VerbsQp;
pub use srq::VerbsSrq;

use crate::counters::Counters;
use crate::error::{NicError, Result};
use crate::provider::{Nic, QpInit};
use crate::types::{Access, DeviceCaps, Gid};
use device::DeviceInner;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};

/// How to open a device: [`VerbsNic::open_with`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VerbsOptions {
    /// The device, as `ibv_devices` lists it (`rxe0`, `mlx5_0`).
    pub device: String,
    /// The port (1-based); `None`: the first ACTIVE port.
    pub port: Option<u8>,
    /// The GID index of every address vector; `None`: the first RoCE v2
    /// IPv4-mapped GID of the port (Ethernet), index 0 (InfiniBand).
    pub gid_index: Option<u8>,
}

impl VerbsOptions {
    /// `device` with the default port and GID index.
    pub fn new(device: &str) -> VerbsOptions {
        VerbsOptions {
            device: device.to_string(),
            port: None,
            gid_index: None,
        }
    }
}

impl crate::spec::VerbsSpec {
    /// The options for [`VerbsNic::open_with`] (here, in the provider, so
    /// that the fabric strings do not import it).
    pub fn options(&self) -> VerbsOptions {
        VerbsOptions {
            device: self.device().to_string(),
            port: self.port(),
            gid_index: self.gid_index(),
        }
    }
}

/// An opened verbs device (one port): the verbs provider's device context.
/// Cheap to clone; the context is closed when the last clone and the last
/// object made from it are dropped.
///
/// Opening the same device twice gives two independent contexts with the
/// same GID: two "nodes" for loopback tests on one device.
#[derive(Clone)]
pub struct VerbsNic {
    inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for VerbsNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNic")
            .field("device", &self.inner.name)
            .field("port", &self.inner.port)
            .field("gid_index", &self.inner.gid_index)
            .field("gid", &self.inner.gid)
            .field("dc", &self.inner.caps.dc)
            .finish()
    }
}

impl VerbsNic {
    /// Opens device `name` (as `ibv_devices` lists it, e.g. `rxe0`,
    /// `mlx5_0`) on its first ACTIVE port, using the GID at `gid_index`
    /// for every address vector (on RoCE pick the RoCEv2 entry:
    /// `show_gids`, or `SOFTROCE_GID_INDEX` in the Soft-RoCE guest).
    /// The same as [`VerbsNic::open_with`] with `port: None`.
    ///
    /// # Errors
    /// The errors of [`VerbsNic::open_with`].
    pub fn open(name: &str, gid_index: u8) -> std::result::Result<VerbsNic, VerbsError> {
        VerbsNic::open_with(&VerbsOptions {
            device: name.to_string(),
            port: None,
            gid_index: Some(gid_index),
        })
    }

    /// Opens `opts.device` on `opts.port` (default: the first ACTIVE
    /// port) with the GID at `opts.gid_index` (default: the port's first
    /// RoCE v2 entry with an IPv4-mapped address, as read from
    /// `/sys/class/infiniband/DEV/ports/P/gid_attrs/types/I`, or index 0
    /// on an InfiniBand port). Every object of this context uses that
    /// port and GID index ([`VerbsNic::port`], [`VerbsNic::gid_index`]).
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::UnknownDevice`] (listing the
    /// devices found), [`VerbsError::NoSuchPort`], [`VerbsError::PortDown`]
    /// (an explicit port that is not ACTIVE), [`VerbsError::NoActivePort`],
    /// [`VerbsError::BadGidIndex`] (an explicit index),
    /// [`VerbsError::NoUsableGid`] (no default GID, listing the entries),
    /// or [`VerbsError::Os`] when a verbs call fails.
    pub fn open_with(opts: &VerbsOptions) -> std::result::Result<VerbsNic, VerbsError> {
        Ok(VerbsNic {
            inner: Arc::new(DeviceInner::open(opts)?),
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The port this context uses (1-based).
    pub fn port(&self) -> u8 {
        self.inner.port
    }

    /// The GID index this context uses.
    pub fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }

    /// Reads the device's queued async events now (non-blocking), instead
    /// of waiting for the next periodic read of the poll path: a CQ
    /// reported overflowed among them returns
    /// [`NicError::CqOverflow`] from its next poll that finds it empty.
    /// Every event read is acknowledged. Returns how many events this call
    /// read: 0 when none was queued, or when another thread of the process
    /// was reading them at that moment (this call then skips; that read, or
    /// the next, flags what is queued). The provider starts no thread, so
    /// nothing else reads them; calling this is never needed for
    /// correctness, only to learn of an overflow sooner.
    pub fn read_async_events(&self) -> usize {
        self.inner.drain_events()
    }

    /// The path MTU of RC connections, in bytes.
    pub fn path_mtu(&self) -> u32 {
        self.inner.caps.ud_mtu
    }
}

impl Nic for VerbsNic {
    type Pd = VerbsPd;
    type Mr = VerbsMr;
    type Cq = VerbsCq;
    type Srq = VerbsSrq;
    type Qp = VerbsQp;

    fn gid(&self) -> Gid {
        self.inner.gid
    }

    fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    fn port_lock_path(&self) -> Option<std::path::PathBuf> {
        let dir = std::env::var_os("KRCORE_RUN_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let hex: String = self
            .inner
            .gid
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(dir.join(format!("krcore-port-{hex}.lock")))
    }

    fn counters(&self) -> Counters {
        let d = &self.inner;
        let mut c = *d.retired.lock();
        for q in d.qps.lock().iter().filter_map(Weak::upgrade) {
            q.add_counters(&mut c);
        }
        c.qps_created = d.counters.qps_created.load(Relaxed);
        c.qps_destroyed = d.counters.qps_destroyed.load(Relaxed);
        c.state_changes += d.counters.state_changes.load(Relaxed);
        c.recv_wrs = d.counters.recv_wrs.load(Relaxed);
        c.error_completions = d.counters.error_completions.load(Relaxed);
        c.mrs_registered = d.counters.mrs_registered.load(Relaxed);
        c
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        VerbsPd::alloc(&self.inner)
    }

    fn alloc_mr(&self, pd: &VerbsPd, len: usize, access: Access) -> Result<VerbsMr> {
        pd.check_device(&self.inner)?;
        VerbsMr::alloc(pd, len, access)
    }

    fn alloc_shared_mr(
        &self,
        pd: &VerbsPd,
        len: usize,
        access: Access,
    ) -> Result<(VerbsMr, std::fs::File)> {
        pd.check_device(&self.inner)?;
        VerbsMr::alloc_shared(pd, len, access)
    }

    unsafe fn register_mr(
        &self,
        pd: &VerbsPd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        pd.check_device(&self.inner)?;
        if ptr.is_null() {
            return Err(NicError::InvalidArgument("null pointer".into()));
        }
        mr::check_len(&self.inner, len)?;
        // SAFETY: forwarded from this function's contract: the caller keeps
        // `ptr..ptr+len` valid and unaliased while the region lives.
        unsafe { VerbsMr::register(pd, ptr, len, access, None) }
    }

    fn register_sub_mr(
        &self,
        parent: &VerbsMr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        parent.check_device(&self.inner)?;
        crate::provider::check_sub_mr(parent, offset, len, access)?;
        parent.register_sub(offset, len, access)
    }

    fn create_cq(&self, depth: u32) -> Result<VerbsCq> {
        VerbsCq::create(&self.inner, depth)
    }

    fn create_srq(&self, pd: &VerbsPd, max_wr: u32, max_sge: u32) -> Result<VerbsSrq> {
        pd.check_device(&self.inner)?;
        VerbsSrq::create(pd, max_wr, max_sge)
    }

    fn create_qp(&self, pd: &VerbsPd, init: &QpInit<'_, Self>) -> Result<VerbsQp> {
        pd.check_device(&self.inner)?;
        VerbsQp::create(pd, init)
    }
}
