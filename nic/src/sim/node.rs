//! A sim node (`SimNic`) and its protection domains, memory regions,
//! completion queues and shared receive queues.

use super::ctl::{self, QpEntry};
use super::fabric::{FabricInner, SimFabric};
use super::latency::LatencyModel;
use super::qp::{QpInner, SimQp};
use super::ring::{ring_bytes, Ring};
use super::shm::{now_ns, Segment};
use crate::counters::Counters;
use crate::error::{NicError, PostError, PostErrorKind, Result};
use crate::provider::{
    check_range, CompletionQueue, MemoryRegion, Nic, QpInit, SharedReceiveQueue,
};
use crate::types::*;
use parking_lot::Mutex;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Configuration of a sim node.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Latency model (`None`: completions are visible at once, no modeled cost).
    pub latency: Option<LatencyModel>,
    /// Whether the device offers DC (set `false` to act like Soft-RoCE or a
    /// non-ConnectX NIC, so that users exercise their RC fallback).
    pub dc: bool,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// How long a remote process's liveness check stays trusted by a QP.
    pub liveness_interval: Duration,
    /// Interval between receiver-not-ready retries.
    pub rnr_interval: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: None,
            dc: true,
            max_mr_size: 16 << 30,
            liveness_interval: Duration::from_millis(1),
            rnr_interval: Duration::from_micros(50),
        }
    }
}

/// Control-path counters kept at node level (the data-path ones live per QP).
#[derive(Default)]
pub(crate) struct NodeCounters {
    pub qps_created: AtomicU64,
    pub qps_destroyed: AtomicU64,
    pub state_changes: AtomicU64,
    pub recv_wrs: AtomicU64,
    pub error_completions: AtomicU64,
    pub mrs_registered: AtomicU64,
    pub modeled_control_ns: AtomicU64,
}

pub(crate) struct NodeInner {
    pub fabric: Arc<FabricInner>,
    pub slot: u32,
    pub gen: u32,
    pub gid: Gid,
    pub ctl: Arc<Segment>,
    pub config: SimConfig,
    pub caps: DeviceCaps,
    alloc: Mutex<Cursors>,
    next_pd: AtomicU32,
    pub counters: NodeCounters,
    pub qps: Mutex<Vec<Weak<QpInner>>>,
    pub retired: Mutex<Counters>,
    pub killed: AtomicBool,
}

#[derive(Default)]
struct Cursors {
    mr: u32,
    qp: u32,
    cq: u32,
    srq: u32,
    /// Indexes handed out but not yet published in the control block.
    reserved: Vec<(&'static str, u32)>,
}

/// A table index handed out by the allocator: other allocations skip it until
/// this guard drops, which the caller does after publishing the entry.
pub(crate) struct Reservation<'a> {
    node: &'a NodeInner,
    what: &'static str,
    pub idx: u32,
    pub gen: u32,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut c = self.node.alloc.lock();
        c.reserved.retain(|r| *r != (self.what, self.idx));
    }
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        self.fabric.close_slot(self.slot, self.gen);
    }
}

impl NodeInner {
    pub(crate) fn seg_name(&self, what: std::fmt::Arguments<'_>) -> String {
        FabricInner::seg_name(self.slot, self.gen, &what.to_string())
    }

    pub(crate) fn charge(&self, ns: impl Fn(&LatencyModel) -> u64) {
        if let Some(m) = &self.config.latency {
            self.counters.modeled_control_ns.fetch_add(ns(m), Relaxed);
        }
    }

    /// Reserves a QP table index (see [`NodeInner::alloc_index`]).
    pub(crate) fn alloc_qp_index(
        &self,
        free: impl Fn(u32) -> Option<u32>,
    ) -> Result<Reservation<'_>> {
        self.alloc_index(ctl::MAX_QP, |c| &mut c.qp, free, "queue pairs")
    }

    /// Reserves a free index of a table, scanning round-robin from the
    /// table's cursor; `free(idx)` returns the generation the new entry will
    /// have when `idx` is free in the control block. The index stays
    /// reserved until the returned guard drops (after the caller published
    /// it), so concurrent allocations never get the same index.
    fn alloc_index(
        &self,
        max: u32,
        cursor: impl Fn(&mut Cursors) -> &mut u32,
        free: impl Fn(u32) -> Option<u32>,
        what: &'static str,
    ) -> Result<Reservation<'_>> {
        let mut c = self.alloc.lock();
        let start = *cursor(&mut c);
        for k in 0..max {
            let idx = (start + k) % max;
            if c.reserved.contains(&(what, idx)) {
                continue;
            }
            if let Some(gen) = free(idx) {
                *cursor(&mut c) = (idx + 1) % max;
                c.reserved.push((what, idx));
                return Ok(Reservation {
                    node: self,
                    what,
                    idx,
                    gen,
                });
            }
        }
        Err(NicError::Exhausted(what))
    }
}

/// Next generation after `g` whose low `bits` bits are not all zero.
fn next_gen(g: u32, bits: u32) -> u32 {
    let mut n = g.wrapping_add(1);
    if n & ((1 << bits) - 1) == 0 {
        n = n.wrapping_add(1);
    }
    n
}

/// A node on a sim fabric: the sim's device context. Cheap to clone; the node
/// leaves the fabric when the last clone and the last object made from it are
/// dropped.
#[derive(Clone)]
pub struct SimNic {
    pub(crate) inner: Arc<NodeInner>,
}

impl std::fmt::Debug for SimNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNic")
            .field("gid", &self.inner.gid)
            .field("slot", &self.inner.slot)
            .finish()
    }
}

impl SimNic {
    /// Joins `fabric` as a new node.
    ///
    /// # Errors
    /// `Exhausted` when the fabric has no free slot; `Os` when the control
    /// block cannot be created.
    pub fn open(fabric: &SimFabric, config: SimConfig) -> Result<SimNic> {
        let f = fabric.inner.clone();
        let (slot, gen) = f.claim_slot()?;
        let ctl_name = FabricInner::seg_name(slot, gen, "ctl");
        let ctl = match f.create_segment(&ctl_name, ctl::CTL_BYTES) {
            Ok(s) => s,
            Err(e) => {
                f.close_slot(slot, gen);
                return Err(e);
            }
        };
        ctl::init(&ctl, slot, gen);
        f.publish_slot(slot, gen);
        let caps = DeviceCaps {
            dc: config.dc,
            max_mr_size: config.max_mr_size,
            max_qp_wr: 1 << 15,
            max_cqe: 1 << 20,
            max_sge: MAX_SGE as u32,
            max_inline: MAX_INLINE as u32,
            ud_mtu: 4096,
            register_user_memory: fabric.dir().is_none(),
        };
        Ok(SimNic {
            inner: Arc::new(NodeInner {
                gid: f.gid(slot, gen),
                fabric: f,
                slot,
                gen,
                ctl,
                config,
                caps,
                alloc: Mutex::new(Cursors::default()),
                next_pd: AtomicU32::new(1),
                counters: NodeCounters::default(),
                qps: Mutex::new(Vec::new()),
                retired: Mutex::new(Counters::default()),
                killed: AtomicBool::new(false),
            }),
        })
    }

    /// The fabric this node is on.
    pub fn fabric(&self) -> SimFabric {
        SimFabric {
            inner: self.inner.fabric.clone(),
        }
    }

    /// Opens a node on the fabric a spec names (`sim:mem`, `sim:NAME`,
    /// `sim:/path`) with the configuration of its options (`dc=`,
    /// `latency=`; see [`crate::SimSpec::config`]).
    ///
    /// # Errors
    /// The errors of [`SimFabric::from_spec`] and [`SimNic::open`].
    pub fn from_spec(spec: &str) -> Result<SimNic> {
        match crate::spec::FabricSpec::parse(spec)? {
            crate::spec::FabricSpec::Sim(s) => s.open_node(&s.open_fabric()?),
            crate::spec::FabricSpec::Verbs(_) => Err(NicError::BadFabricSpec(Box::new(
                crate::spec::SpecError::NotSim { spec: spec.into() },
            ))),
        }
    }

    /// Makes this node unreachable at once, as if its machine died: remote
    /// operations to it fail with `RETRY_EXC_ERR` from now on. Local objects
    /// stay usable for cleanup. For fault-injection tests.
    pub fn kill(&self) {
        self.inner.killed.store(true, Relaxed);
        self.inner.fabric.kill_slot(self.inner.slot, self.inner.gen);
    }

    /// The configuration the node was opened with.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }
}

/// A protection domain of a sim node.
#[derive(Clone, Debug)]
pub struct SimPd {
    pub(crate) id: u32,
    pub(crate) node: Weak<NodeInner>,
}

impl Nic for SimNic {
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Srq = SimSrq;
    type Qp = SimQp;

    fn gid(&self) -> Gid {
        self.inner.gid
    }

    fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    fn counters(&self) -> Counters {
        let n = &self.inner;
        let mut c = *n.retired.lock();
        for q in n.qps.lock().iter().filter_map(Weak::upgrade) {
            q.add_counters(&mut c);
        }
        c.qps_created = n.counters.qps_created.load(Relaxed);
        c.qps_destroyed = n.counters.qps_destroyed.load(Relaxed);
        c.state_changes += n.counters.state_changes.load(Relaxed);
        c.recv_wrs = n.counters.recv_wrs.load(Relaxed);
        c.error_completions = n.counters.error_completions.load(Relaxed);
        c.mrs_registered = n.counters.mrs_registered.load(Relaxed);
        c.modeled_control_ns = n.counters.modeled_control_ns.load(Relaxed);
        c
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        Ok(SimPd {
            id: self.inner.next_pd.fetch_add(1, Relaxed),
            node: Arc::downgrade(&self.inner),
        })
    }

    fn alloc_mr(&self, pd: &SimPd, len: usize, access: Access) -> Result<SimMr> {
        self.check_mr(pd, len)?;
        self.register_segment(pd, len, access, |name| {
            self.inner.fabric.create_segment(name, len)
        })
    }

    fn alloc_shared_mr(
        &self,
        pd: &SimPd,
        len: usize,
        access: Access,
    ) -> Result<(SimMr, std::fs::File)> {
        self.check_mr(pd, len)?;
        let fabric = &self.inner.fabric;
        match fabric.segment_path("") {
            // A directory fabric: the segment is a file already; the other
            // process opens the same file.
            Some(_) => {
                let mr = self
                    .register_segment(pd, len, access, |name| fabric.create_segment(name, len))?;
                let path = fabric
                    .segment_path(&mr.inner.name)
                    .expect("a directory fabric's segment has a path");
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|source| NicError::Os {
                        op: "open a memory region's segment file",
                        source,
                    })?;
                Ok((mr, file))
            }
            // sim:mem: a memfd mapped here, owned by the region's segment.
            None => {
                let file = crate::shared::memfd("krcore-mr", len)?;
                let seg = Arc::new(super::shm::Segment::map_file(&file, len)?);
                let mr = self.register_segment(pd, len, access, |name| {
                    fabric.insert_segment(name, seg.clone());
                    Ok(seg.clone())
                })?;
                Ok((mr, file))
            }
        }
    }

    fn register_sub_mr(
        &self,
        parent: &SimMr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<SimMr> {
        self.sub_mr(parent, offset, len, access)
    }

    #[allow(unsafe_code)]
    unsafe fn register_mr(
        &self,
        pd: &SimPd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<SimMr> {
        if !self.inner.caps.register_user_memory {
            return Err(NicError::Unsupported(
                "registering caller memory on a multi-process sim fabric (use alloc_mr)",
            ));
        }
        if ptr.is_null() {
            return Err(NicError::InvalidArgument("null pointer".into()));
        }
        self.check_mr(pd, len)?;
        // SAFETY: forwarded from this function's contract: the caller keeps
        // `ptr..ptr+len` valid and unaliased for the lifetime of the region.
        let seg = Arc::new(unsafe { super::shm::Segment::borrowed(ptr, len) });
        self.register_segment(pd, len, access, |name| {
            self.inner.fabric.insert_segment(name, seg.clone());
            Ok(seg.clone())
        })
    }

    fn create_cq(&self, depth: u32) -> Result<SimCq> {
        if depth == 0 || depth > self.inner.caps.max_cqe {
            return Err(NicError::InvalidArgument(format!(
                "CQ depth {depth} outside 1..={}",
                self.inner.caps.max_cqe
            )));
        }
        let n = &self.inner;
        let ctl = n.ctl.clone();
        let slot = n.alloc_index(
            ctl::MAX_CQ,
            |c| &mut c.cq,
            |i| {
                let (g, v) = ctl::cq_gen(&ctl, i);
                (!v).then(|| next_gen(g, 1))
            },
            "completion queues",
        )?;
        let (idx, gen) = (slot.idx, slot.gen);
        let cap = depth.next_power_of_two();
        let name = n.seg_name(format_args!("cq{idx}g{gen}"));
        let seg = n.fabric.create_segment(&name, ring_bytes(cap, CQE_WORDS))?;
        Ring::init(&seg, 0, cap, CQE_WORDS);
        ctl::cq_publish(&n.ctl, idx, gen, cap);
        drop(slot);
        Ok(SimCq {
            inner: Arc::new(CqInner {
                node: n.clone(),
                idx,
                gen,
                seg,
                name,
                cap,
                pending: Mutex::new(Vec::new()),
                pending_count: AtomicUsize::new(0),
            }),
        })
    }

    fn create_srq(&self, pd: &SimPd, max_wr: u32, max_sge: u32) -> Result<SimSrq> {
        self.check_pd(pd)?;
        if max_wr == 0
            || max_wr > self.inner.caps.max_qp_wr
            || max_sge == 0
            || max_sge > MAX_SGE as u32
        {
            return Err(NicError::InvalidArgument(format!(
                "SRQ max_wr {max_wr} / max_sge {max_sge} out of range"
            )));
        }
        let n = &self.inner;
        let ctl = n.ctl.clone();
        let slot = n.alloc_index(
            ctl::MAX_SRQ,
            |c| &mut c.srq,
            |i| {
                let (g, v) = ctl::srq_gen(&ctl, i);
                (!v).then(|| next_gen(g, 1))
            },
            "shared receive queues",
        )?;
        let (idx, gen) = (slot.idx, slot.gen);
        let cap = max_wr.next_power_of_two();
        let name = n.seg_name(format_args!("srq{idx}g{gen}"));
        let seg = n
            .fabric
            .create_segment(&name, ring_bytes(cap, RWQE_WORDS))?;
        Ring::init(&seg, 0, cap, RWQE_WORDS);
        ctl::srq_publish(&n.ctl, idx, gen, cap, max_sge);
        drop(slot);
        Ok(SimSrq {
            inner: Arc::new(SrqInner {
                node: n.clone(),
                idx,
                gen,
                seg,
                name,
                max_sge,
                pd: pd.id,
            }),
        })
    }

    fn create_qp(&self, pd: &SimPd, init: &QpInit<'_, Self>) -> Result<SimQp> {
        self.check_pd(pd)?;
        SimQp::create(&self.inner, pd.id, init)
    }
}

impl SimNic {
    fn check_pd(&self, pd: &SimPd) -> Result<()> {
        match pd.node.upgrade() {
            Some(n) if Arc::ptr_eq(&n, &self.inner) => Ok(()),
            _ => Err(NicError::InvalidArgument(
                "protection domain of another device".into(),
            )),
        }
    }

    fn check_mr(&self, pd: &SimPd, len: usize) -> Result<()> {
        self.check_pd(pd)?;
        if len == 0 {
            return Err(NicError::InvalidArgument(
                "zero-length memory region".into(),
            ));
        }
        if len as u64 > self.inner.caps.max_mr_size {
            return Err(NicError::MrTooLarge {
                requested: len as u64,
                limit: self.inner.caps.max_mr_size,
            });
        }
        Ok(())
    }

    fn register_segment(
        &self,
        pd: &SimPd,
        len: usize,
        access: Access,
        make: impl FnOnce(&str) -> Result<Arc<Segment>>,
    ) -> Result<SimMr> {
        let n = &self.inner;
        let (slot, name) = self.mr_slot()?;
        let seg = make(&name)?;
        let info = ctl::MrInfo {
            gen: slot.gen,
            base: seg.addr(),
            len: len as u64,
            access,
            pd: pd.id,
            seg_off: 0,
            strict: false,
        };
        let mr = self.publish_mr(slot, name, seg, info, None);
        n.charge(|m| m.mr_reg_ns);
        Ok(mr)
    }

    /// Reserves an MR slot and names its segment.
    fn mr_slot(&self) -> Result<(Reservation<'_>, String)> {
        let n = &self.inner;
        let ctl = n.ctl.clone();
        let slot = n.alloc_index(
            ctl::MAX_MR,
            |c| &mut c.mr,
            |i| {
                let (g, v) = ctl::mr_gen(&ctl, i);
                (!v).then(|| next_gen(g, 8))
            },
            "memory region keys",
        )?;
        let name = n.seg_name(format_args!("mr{}g{}", slot.idx, slot.gen));
        Ok((slot, name))
    }

    /// Publishes the MR `info` in the reserved `slot`, over `seg` (named
    /// `name` on the fabric), and makes its handle.
    fn publish_mr(
        &self,
        slot: Reservation<'_>,
        name: String,
        seg: Arc<Segment>,
        info: ctl::MrInfo,
        parent: Option<SimMr>,
    ) -> SimMr {
        let n = &self.inner;
        let (idx, gen) = (slot.idx, slot.gen);
        ctl::mr_publish(&n.ctl, idx, gen, &info);
        drop(slot);
        n.counters.mrs_registered.fetch_add(1, Relaxed);
        let key = ctl::mr_key(idx, gen);
        SimMr {
            inner: Arc::new(MrInner {
                node: n.clone(),
                idx,
                seg,
                pd: info.pd,
                off: info.seg_off as usize,
                len: info.len as usize,
                name,
                key,
                access: info.access,
                strict: info.strict,
                _parent: parent,
            }),
        }
    }

    /// [`Nic::register_sub_mr`]: a strict registration of its own over the
    /// parent's segment (on a directory fabric, a hard link of the
    /// parent's file under the new region's name, so other processes map
    /// the same pages).
    fn sub_mr(&self, parent: &SimMr, offset: usize, len: usize, access: Access) -> Result<SimMr> {
        let p = &parent.inner;
        if !Arc::ptr_eq(&p.node, &self.inner) {
            return Err(NicError::InvalidArgument(
                "memory region of another device".into(),
            ));
        }
        crate::provider::check_sub_mr(parent, offset, len, access)?;
        let (slot, name) = self.mr_slot()?;
        self.inner.fabric.link_segment(&p.name, &name, &p.seg)?;
        let info = ctl::MrInfo {
            gen: slot.gen,
            base: parent.addr() + offset as u64,
            len: len as u64,
            access,
            pd: p.pd,
            seg_off: (p.off + offset) as u64,
            strict: true,
        };
        let mr = self.publish_mr(slot, name, p.seg.clone(), info, Some(parent.clone()));
        self.inner.charge(|m| m.mr_reg_ns);
        Ok(mr)
    }
}

pub(crate) struct MrInner {
    node: Arc<NodeInner>,
    idx: u32,
    seg: Arc<Segment>,
    /// The protection domain's id.
    pd: u32,
    /// Where the region starts in `seg` (non-zero for a sub-region).
    off: usize,
    len: usize,
    name: String,
    key: u32,
    access: Access,
    /// Deregistration waits for the WRs moving data through the key (a
    /// sub-region: see `ctl::mr_in_flight`).
    strict: bool,
    /// A sub-region's parent, kept registered while the sub-region lives
    /// (as the verbs provider keeps its memory).
    _parent: Option<SimMr>,
}

/// How long deregistering a strict MR waits for the WRs in flight on it
/// (a sender that died mid-WR never takes its count off).
const STRICT_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

impl Drop for MrInner {
    fn drop(&mut self) {
        ctl::mr_invalidate(&self.node.ctl, self.idx);
        if self.strict {
            // No access through the key moves data once this returns
            // (`ctl::mr_in_flight`): wait for those already counted.
            let count = ctl::mr_in_flight(&self.node.ctl, self.idx);
            let start = std::time::Instant::now();
            while count.load(std::sync::atomic::Ordering::SeqCst) != 0 {
                if start.elapsed() > STRICT_DRAIN {
                    // A sender that died mid-WR: the key is invalid
                    // already, its count will never drop.
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.node.fabric.remove_segment(&self.name);
    }
}

/// A registered memory region of a sim node. Dropping the last clone
/// deregisters it: its keys go stale and remote use fails with
/// `REM_ACCESS_ERR`.
#[derive(Clone)]
pub struct SimMr {
    inner: Arc<MrInner>,
}

impl std::fmt::Debug for SimMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("key", &format_args!("{:#x}", self.inner.key))
            .finish()
    }
}

impl MemoryRegion for SimMr {
    fn addr(&self) -> u64 {
        self.inner.seg.addr() + self.inner.off as u64
    }
    fn len(&self) -> usize {
        self.inner.len
    }
    fn lkey(&self) -> u32 {
        self.inner.key
    }
    fn rkey(&self) -> u32 {
        self.inner.key
    }
    fn access(&self) -> Access {
        self.inner.access
    }
    fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        check_range(self.len(), offset, buf.len())?;
        self.inner.seg.copy_out(self.inner.off + offset, buf)
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(self.len(), offset, data.len())?;
        self.inner.seg.copy_in(self.inner.off + offset, data)
    }
    fn load_u64(&self, offset: usize) -> Result<u64> {
        check_range(self.len(), offset, 8)?;
        Ok(self
            .inner
            .seg
            .u64_at(self.inner.off + offset)?
            .load(Acquire))
    }
    fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        check_range(self.len(), offset, 8)?;
        self.inner
            .seg
            .u64_at(self.inner.off + offset)?
            .store(value, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
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
    name: String,
    cap: u32,
    /// QPs with send work waiting (RNR) that polling must drive forward.
    pub pending: Mutex<Vec<Weak<QpInner>>>,
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
    pub(crate) fn add_pending(&self, qp: Weak<QpInner>) {
        let mut list = self.inner.pending.lock();
        if !list.iter().any(|w| w.ptr_eq(&qp)) {
            list.push(qp);
        }
        self.inner.pending_count.store(list.len(), Relaxed);
    }
}

// ---------------------------------------------------------------------------
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
    name: String,
    max_sge: u32,
    #[allow(dead_code)]
    pd: u32,
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
