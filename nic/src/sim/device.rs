//! A sim node's state, below every object made on it: its configuration,
//! counters, control block and fabric slot, and the allocation of its
//! table indexes (`NodeInner`). The node's objects (`cq`, `recv`,
//! `qp_state`) hold it; `node` makes them.

use super::ctl;
use super::fabric::FabricInner;
use super::latency::LatencyModel;
use super::shm::Segment;
use crate::counters::Counters;
use crate::error::{NicError, Result};
use crate::types::*;
use parking_lot::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
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
    /// The host the node runs on (`host=`): it takes the host's GID, which a
    /// restarted process on the host takes again (see the fabric's docs).
    /// `None`: a GID of the node's own.
    pub host: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: None,
            dc: true,
            max_mr_size: 16 << 30,
            liveness_interval: Duration::from_millis(1),
            rnr_interval: Duration::from_micros(50),
            host: None,
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
    pub(crate) alloc: Mutex<Cursors>,
    pub(crate) next_pd: AtomicU32,
    pub counters: NodeCounters,
    pub qps: Mutex<Vec<Weak<dyn QpCounters>>>,
    pub retired: Mutex<Counters>,
    pub killed: AtomicBool,
    /// Where a host node's QP and MR numbering starts (index cursors and
    /// first generations): 0 for a node with a GID of its own; for a host
    /// node, a value its slot and generation give, so that a process
    /// restarted on the host does not hand out its predecessor's QP numbers
    /// and keys (a NIC gives a new process other numbers too).
    pub numbering_base: u32,
    /// The host's id (see the fabric's docs), for a host node.
    pub host: Option<u32>,
}

#[derive(Default)]
pub(crate) struct Cursors {
    pub(crate) mr: u32,
    pub(crate) qp: u32,
    pub(crate) cq: u32,
    pub(crate) srq: u32,
    /// Indexes handed out but not yet published in the control block.
    pub(crate) reserved: Vec<(&'static str, u32)>,
}

impl Cursors {
    /// Cursors that start at the places a numbering base gives.
    pub(crate) fn from_base(base: u32) -> Cursors {
        Cursors {
            mr: base % ctl::MAX_MR,
            qp: (base >> 12) % ctl::MAX_QP,
            ..Cursors::default()
        }
    }
}

/// The numbering base of a host node in `slot` with generation `gen`.
pub(crate) fn numbering_base(slot: u32, gen: u32) -> u32 {
    // A multiplicative hash: consecutive generations land far apart.
    (gen.wrapping_mul(0x9e37_79b9) ^ slot.wrapping_mul(0x85eb_ca6b)).max(1)
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
    pub(crate) fn alloc_index(
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
pub(crate) fn next_gen(g: u32, bits: u32) -> u32 {
    let mut n = g.wrapping_add(1);
    if n & ((1 << bits) - 1) == 0 {
        n = n.wrapping_add(1);
    }
    n
}

/// A QP as its node sees it when it sums its counters. (A trait, so that
/// the node's state does not name the QPs that hold it.)
pub(crate) trait QpCounters: Send + Sync {
    /// Adds the QP's data-path counters to `into`.
    fn add_counters(&self, into: &mut Counters);
}
