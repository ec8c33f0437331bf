//! A sim node (`SimNic`), the provider's device: it makes the node's
//! protection domains, memory regions (here), completion queues (`cq`),
//! shared receive queues (`recv`) and QPs (`qp`) on its state (`device`).

use super::cq::{CqInner, SimCq, CQE_WORDS};
use super::ctl::{self, QpEntry};
use super::device::*;
use super::fabric::{FabricInner, SimFabric};
use super::qp::SimQp;
use super::qp_state::{QpInner, SendState};
use super::recv::{SimSrq, SrqInner, RWQE_WORDS};
use super::ring::{ring_bytes, Ring};
use super::shm::Segment;
use super::target::TargetCache;
use crate::counters::Counters;
use crate::error::{NicError, Result};
use crate::provider::{check_range, MemoryRegion, Nic, QpInit};
use crate::types::*;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Weak};

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
        let host = config.host.as_deref().map(super::fabric::host_id);
        let (slot, gen) = f.claim_slot(host)?;
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
        let (gid, numbering_base) = match host {
            Some(h) => (f.host_gid(h), super::device::numbering_base(slot, gen)),
            None => (f.gid(slot, gen), 0),
        };
        Ok(SimNic {
            inner: Arc::new(NodeInner {
                gid,
                fabric: f,
                slot,
                gen,
                ctl,
                config,
                caps,
                alloc: Mutex::new(Cursors::from_base(numbering_base)),
                next_pd: AtomicU32::new(1),
                counters: NodeCounters::default(),
                qps: Mutex::new(Vec::new()),
                retired: Mutex::new(Counters::default()),
                killed: AtomicBool::new(false),
                numbering_base,
                host,
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

    fn port_lock_path(&self) -> Option<std::path::PathBuf> {
        let host = self.inner.host?;
        Some(
            self.inner
                .fabric
                .dir()?
                .join(format!("host-{host:08x}.lock")),
        )
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
                let g = if g == 0 { n.numbering_base } else { g };
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
    fn prefault(&self, offset: usize, len: usize) -> Result<()> {
        check_range(self.len(), offset, len)?;
        self.inner.seg.prefault(self.inner.off + offset, len)
    }
}

/// A new QP of a node (here, beside the node that makes it, so that the
/// QP does not name the node's provider type).
impl SimQp {
    pub(crate) fn create(
        node: &Arc<NodeInner>,
        pd: u32,
        init: &QpInit<'_, SimNic>,
    ) -> Result<SimQp> {
        let t = init.qp_type;
        if matches!(t, QpType::Dci | QpType::Dct) && !node.caps.dc {
            return Err(NicError::Unsupported(
                "DC transport (this device has no DC support)",
            ));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.node, node) {
                return Err(NicError::InvalidArgument("CQ of another device".into()));
            }
        }
        if let Some(srq) = init.srq {
            if !Arc::ptr_eq(&srq.inner.node, node) {
                return Err(NicError::InvalidArgument("SRQ of another device".into()));
            }
        }
        let caps = init.caps;
        let max_wr = node.caps.max_qp_wr;
        if t == QpType::Dct && init.srq.is_none() {
            return Err(NicError::InvalidArgument("a DCT needs an SRQ".into()));
        }
        if t != QpType::Dct && (caps.max_send_wr == 0 || caps.max_send_wr > max_wr) {
            return Err(NicError::InvalidArgument(format!(
                "max_send_wr {} outside 1..={max_wr}",
                caps.max_send_wr
            )));
        }
        if caps.max_recv_wr > max_wr
            || caps.max_send_sge as usize > MAX_SGE
            || caps.max_recv_sge as usize > MAX_SGE
        {
            return Err(NicError::InvalidArgument(format!(
                "QP caps out of range (max {max_wr} WRs, {MAX_SGE} SGEs)"
            )));
        }
        let ctl_seg = node.ctl.clone();
        // On a host, the number is picked and the QP published under the
        // host's numbering lock: another process of the host cannot pick
        // the same number between the check and the publication.
        let numbering = node
            .host
            .and_then(|h| super::host::NumberingLock::take(&node.fabric, h));
        // A free entry, generation bumped (never 0 in the low 12 bits, so a
        // QPN is never 0), claimed under the node's allocation lock.
        let slot = node.alloc_qp_index(|i| {
            let sw = QpEntry::new(&ctl_seg, i).state_word();
            if sw.qp_type.is_some() {
                return None;
            }
            let g = if sw.gen == 0 {
                node.numbering_base
            } else {
                sw.gen
            };
            let mut g = g.wrapping_add(1);
            if g & 0xfff == 0 {
                g = g.wrapping_add(1);
            }
            // On a host, a number another live node of the host has is
            // taken (a WR to the host's GID finds its node by the number).
            let taken = node
                .host
                .is_some_and(|h| super::host::has_qpn(&node.fabric, h, node.slot, ctl::qpn(i, g)));
            (!taken).then_some(g)
        })?;
        let (idx, gen) = (slot.idx, slot.gen);
        let qpn = ctl::qpn(idx, gen);
        let use_rq = init.srq.is_none() && t != QpType::Dci && caps.max_recv_wr > 0;
        let rq = if use_rq {
            let cap = caps.max_recv_wr.next_power_of_two();
            let name = node.seg_name(format_args!("rq{idx}g{gen}"));
            let seg = node
                .fabric
                .create_segment(&name, ring_bytes(cap, RWQE_WORDS))?;
            Ring::init(&seg, 0, cap, RWQE_WORDS);
            Some((seg, name))
        } else {
            None
        };
        let e = QpEntry::new(&ctl_seg, idx);
        e.publish(
            gen,
            t,
            pd,
            (init.recv_cq.inner.idx, init.recv_cq.inner.gen),
            init.srq.map(|s| (s.inner.idx, s.inner.gen)),
            if use_rq { caps.max_recv_wr } else { 0 },
            if t == QpType::Dct { init.dc_key } else { 0 },
        );
        drop(slot);
        drop(numbering);
        node.counters.qps_created.fetch_add(1, Relaxed);
        node.charge(|m| m.qp_create_ns);
        let inner = Arc::new(QpInner {
            node: node.clone(),
            idx,
            qpn,
            qp_type: t,
            pd,
            caps,
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.cloned(),
            rq,
            send: Mutex::new(SendState {
                posted: 0,
                pending: VecDeque::new(),
                rnr_retry: 7,
                peer: None,
                last_dc: None,
                last_visible: 0,
                on_cq_pending_list: false,
                target: TargetCache::default(),
                c: Counters::default(),
            }),
        });
        let mut qps = node.qps.lock();
        qps.retain(|w| w.strong_count() > 0);
        let counted: Arc<dyn QpCounters> = inner.clone();
        qps.push(Arc::downgrade(&counted));
        Ok(SimQp { inner })
    }
}
