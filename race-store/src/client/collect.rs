//! Collecting what dead clients left (`race-kv collect`).
//!
//! A client that dies keeps what it held: blocks it wrote and had not
//! linked, blocks it retired in its last grace period, its free lists.
//! Nobody can reach them, but no memory node can tell them from linked
//! blocks or from blocks a live client holds (grant leases take back only
//! what was never written: [`crate::holders`]). [`Client::collect`] takes
//! them back, one memory node at a time, with the node's help
//! ([`crate::memory::MemoryNode::collect_begin`]):
//!
//! 1. **Drain.** The collector starts a collection on the node; from then
//!    on the node renews no lease and grants nothing, so every client's
//!    lease on it ends within a lease (a client's own clock ends it a
//!    quarter earlier: the fence of [`crate::holders`]). Writers allocate
//!    on the other nodes meanwhile; a store of one node refuses writes
//!    ([`crate::remote::TransportError::Collecting`]). The collector asks
//!    again until no lease is live. A client that learns that the node is
//!    collecting ends its lease there itself at the next point between
//!    two operations (`KvAllocator::end_collecting_leases`), where no
//!    block it carved waits to be linked: running writers do not make the
//!    drain wait for their leases to run out.
//! 2. **Scan.** It reads every subtable the directory names and notes every
//!    slot word that names a block on the node (tentative and frozen ones
//!    too), and sends those blocks as the node's live runs.
//! 3. **Wait** a grace period (`grace_ticks`) after the scan.
//! 4. **Finish.** The node takes back every byte of its heap in use that
//!    is not pooled, not a block of its coarse allocator (subtables, live
//!    or retired: a client following a stale directory entry must find a
//!    retired one), and not live; and from then on tells every lease its
//!    collection count.
//!
//! # Why nothing reachable or held is taken back
//! * *Linked blocks.* Once the node is ready, no client holds a live lease
//!   on it, and none can get one: nobody can link a block of the node it
//!   allocated or took from a free list (both need the lease), so every
//!   block linked at the finish was linked at the scan. A split copies
//!   slots into new subtables before it retires the old one, whose slots
//!   stay: the scan sees a linked block in one or the other.
//! * *Readers.* A block the scan saw unlinked was unlinked before it; a
//!   reader that read its slot before that finishes within a grace period,
//!   which the collector waits before the node hands the block out again.
//! * *Holders.* Every block a client holds of the node (free, retired,
//!   uncarved) it uses or gives back only after its lease on the node said
//!   live, and a client's lease answers carry the node's collection count:
//!   a client that sees it change drops every block of the node it held
//!   (`KvAllocator::drop_collected`), whatever the collection took. A
//!   block it unlinks after the scan is not taken, and dropped all the
//!   same: it waits for the next collection. Clients of an older version
//!   would not drop theirs: a node that has collected refuses them.
//!
//! The timing assumptions are those of the grant lease's fence and of the
//! grace period.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::collection::{CollectStart, Collected};
use crate::error::Error;
use crate::remote::{RemoteOp, Transport, TransportError};

use super::alloc::{class_bytes, class_of};
use super::engine::take_read;
use super::scan::subtables_of;
use super::split::image_slots;
use super::Client;

/// How a [`Client::collect`] runs.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Take the blocks back (`false`: only count them, a dry run).
    pub apply: bool,
    /// The memory nodes to collect, in turn (`None`: every node).
    pub nodes: Option<Vec<u8>>,
    /// How long to wait for a node's leases to end before giving up on it
    /// (they end within one grant lease: 10 s by default).
    pub max_drain: Duration,
    /// Set (by a signal handler, say) to stop: a node being collected ends
    /// its collection without taking anything back ([`Error::Cancelled`]).
    pub cancel: Option<Arc<AtomicBool>>,
}

impl CollectOptions {
    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            apply: true,
            nodes: None,
            max_drain: Duration::from_secs(60),
            cancel: None,
        }
    }
}

/// What [`Client::collect`] did on one memory node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCollect {
    /// The node.
    pub node: u8,
    /// How long its clients' leases took to end.
    pub drained: Duration,
    /// Subtables the scan read.
    pub subtables: u64,
    /// Blocks of the node the table links.
    pub live_blocks: u64,
    /// Their bytes (size classes).
    pub live_bytes: u64,
    /// What the node took back (or, in a dry run, would have).
    pub collected: Collected,
}

impl<T: Transport> Client<T> {
    /// Collects what dead clients left on the memory nodes (see the module
    /// docs, `client/collect.rs`): for each node in turn, waits until no
    /// client's lease on it is live (the node renews none meanwhile),
    /// scans the table, waits a grace period and has the node take back
    /// every block that nothing links, pools or holds. Run it when the
    /// store's writers can do without one node's memory for a lease: its
    /// reads go on.
    ///
    /// # Errors
    /// [`TransportError::NoSuchNode`] for a node id out of range (before
    /// anything starts); [`TransportError::Unsupported`] for a node that
    /// cannot collect;
    /// [`Error::LeasesLive`] when a node's leases did not end within
    /// `max_drain`; transport and table errors. A node whose collection
    /// failed after it started ends it without taking anything back;
    /// nodes collected before stay collected.
    pub fn collect(&mut self, opts: &CollectOptions) -> Result<Vec<NodeCollect>, Error> {
        let count = self.transport.nodes();
        let nodes = match &opts.nodes {
            Some(n) => n.clone(),
            None => (0..count).collect(),
        };
        if let Some(&node) = nodes.iter().find(|&&n| n >= count) {
            return Err(TransportError::NoSuchNode { node }.into());
        }
        let mut out = Vec::with_capacity(nodes.len());
        for node in nodes {
            let token = crate::remote::leases::fresh_id();
            let r = self.collect_node(node, token, opts);
            if r.is_err() {
                // Ends it: the node serves its clients again at once.
                let _ = self.transport.collect_finish(node, token, false);
            }
            out.push(r?);
        }
        Ok(out)
    }

    fn collect_node(
        &mut self,
        node: u8,
        token: u64,
        opts: &CollectOptions,
    ) -> Result<NodeCollect, Error> {
        let mut report = NodeCollect {
            node,
            ..NodeCollect::default()
        };
        let start = Instant::now();
        let cancelled = || Error::Cancelled { node };
        loop {
            if opts.cancelled() {
                return Err(cancelled());
            }
            match self.transport.collect_begin(node, token)? {
                CollectStart::Ready => break,
                CollectStart::Draining { wait, leases } => {
                    let spent = start.elapsed();
                    if spent >= opts.max_drain {
                        return Err(Error::LeasesLive {
                            node,
                            leases,
                            waited: spent,
                        });
                    }
                    // In slices, for the cancel flag.
                    let nap = (wait + Duration::from_millis(5))
                        .min(opts.max_drain - spent)
                        .clamp(Duration::from_millis(1), Duration::from_millis(50));
                    std::thread::sleep(nap);
                }
            }
        }
        report.drained = start.elapsed();
        let live = self.linked_on(node, &mut report)?;
        // A reader that read a slot before its block was unlinked is done
        // within a grace period.
        let seen = self.now();
        self.wait_past(seen, self.config.grace_ticks);
        if opts.cancelled() {
            return Err(cancelled());
        }
        self.transport.collect_live(node, token, &live)?;
        report.collected = self.transport.collect_finish(node, token, opts.apply)?;
        Ok(report)
    }

    /// The blocks of node `node` that slots of the table name, as sorted
    /// `(offset, len)` runs of their size classes (each block once).
    fn linked_on(&mut self, node: u8, report: &mut NodeCollect) -> Result<Vec<(u64, u64)>, Error> {
        self.refresh_directory()?;
        let geometry = self.table.geometry;
        let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than one READ",
        })?;
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        for (sub, _, _) in subtables_of(self.dir.entries(), None)? {
            report.subtables += 1;
            let mut res = self.exec(&[RemoteOp::Read { ptr: sub, len }])?;
            let image = take_read(&mut res, 0)?;
            for s in image_slots(&image, geometry) {
                let word = s.word.thawed();
                if s.word.validate().is_err() || word.is_empty() || word.ptr().node() != node {
                    continue;
                }
                blocks.push((word.ptr().offset(), class_bytes(class_of(word.len_units()))));
            }
        }
        blocks.sort_unstable();
        blocks.dedup_by_key(|b| b.0);
        report.live_blocks = blocks.len() as u64;
        report.live_bytes = blocks.iter().map(|b| b.1).sum();
        // Adjacent blocks as one run.
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
        for (at, len) in blocks {
            match runs.last_mut() {
                Some(last) if last.0 + last.1 == at => last.1 += len,
                _ => runs.push((at, len)),
            }
        }
        Ok(runs)
    }
}
