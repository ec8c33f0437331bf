//! A client's close: everything the allocator holds goes back to the
//! memory nodes ([`KvAllocator::give_back`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{class_bytes, coalesce, KvAllocator, ReturnReport, CLASS_UNITS};
use crate::layout::slot::RemotePtr;
use crate::remote::{BlockRun, Transport, TransportError};

impl KvAllocator {
    /// Gives back to the memory nodes everything this allocator holds (it
    /// is done with it): free blocks and uncarved runs, usable at once;
    /// grants asked ahead (with `wait`: collected first); and retired
    /// blocks, which the nodes hold for what is left of their grace period
    /// at `now` when `tick` (the real time of a tick) is known, and which
    /// stay here otherwise. Everything given back leaves the allocator (see
    /// [`ReturnReport`]). Without `wait` (a client dropped without closing)
    /// nothing is waited for: a grant asked ahead is left to the transport,
    /// and messages go once.
    pub fn give_back<T: Transport>(
        &mut self,
        transport: &mut T,
        now: u64,
        tick: Option<Duration>,
        wait: bool,
    ) -> ReturnReport {
        let mut report = ReturnReport::default();
        self.now = now;
        self.collect_trims(transport, wait, Some(&mut report));
        self.collect_every_ask(transport, wait, &mut report);
        self.reclaim(now);
        let mut to = Giving {
            transport,
            wait,
            report,
            failed: vec![false; self.arenas.len()],
        };
        for node in 0..self.arenas.len() {
            // Free blocks and uncarved runs go back only under a live
            // lease: after it ended, the node may have handed them out
            // again (they are dropped, not given back twice).
            let held: u64 = self.arenas.get(node).map_or(0, |classes| {
                classes
                    .iter()
                    .enumerate()
                    .map(|(c, a)| a.free.len() as u64 * class_bytes(c) + a.uncarved)
                    .sum()
            });
            if held == 0 {
                continue;
            }
            if !self.lease_ok(to.transport, node as u8) {
                to.report.kept_bytes += held;
                continue;
            }
            for class in 0..CLASS_UNITS.len() {
                let size = class_bytes(class);
                let Some(arena) = self.arenas.get_mut(node).and_then(|a| a.get_mut(class)) else {
                    continue;
                };
                let runs = arena.runs(size);
                if !runs.is_empty() && to.give(node as u8, size, &runs, Duration::ZERO) {
                    arena.free.clear();
                    arena.chunks.clear();
                    arena.uncarved = 0;
                }
            }
        }
        if let (Some(tick), Some(end)) = (tick, self.quarantine_ends()) {
            let left = u32::try_from(end.saturating_sub(now)).unwrap_or(u32::MAX);
            let delay = tick.saturating_mul(left);
            // Retired blocks go back too only under a live lease: a node
            // collected since may have taken them back (the lease's answer
            // says so, and they are dropped).
            let mut live = vec![false; self.arenas.len()];
            let nodes: std::collections::BTreeSet<u8> =
                self.quarantine.iter().map(|r| r.ptr.node()).collect();
            for node in nodes {
                let ok = self.lease_ok(to.transport, node);
                if let Some(l) = live.get_mut(usize::from(node)) {
                    *l = ok;
                }
            }
            let mut groups: BTreeMap<(u8, usize), Vec<(RemotePtr, u64)>> = BTreeMap::new();
            self.retired_bytes = 0;
            for r in self.quarantine.drain(..) {
                if !live
                    .get(usize::from(r.ptr.node()))
                    .copied()
                    .unwrap_or(false)
                {
                    to.report.kept_bytes += class_bytes(r.class);
                    continue;
                }
                groups
                    .entry((r.ptr.node(), r.class))
                    .or_default()
                    .push((r.ptr, class_bytes(r.class)));
            }
            for ((node, class), blocks) in groups {
                to.give(node, class_bytes(class), &coalesce(blocks), delay);
            }
        } else {
            to.report.kept_bytes += self.stats().quarantined_bytes;
        }
        // Last, after every give-back: the nodes take back what is left
        // unwritten of the grants now, not a lease later. The allocator
        // holds nothing of them any more; a later allocation (a client
        // dropped after `close` does not make one) starts a new lease,
        // whose new generation drops what is left.
        match to.transport.end_grant_leases(None, wait) {
            Ok(n) => to.report.leases_ended = n,
            Err(e) => {
                to.report.error.get_or_insert(e.into());
            }
        }
        to.report
    }

    /// Takes every grant asked ahead off the arenas: collected into them
    /// with `wait`, else left to the transport.
    fn collect_every_ask<T: Transport>(
        &mut self,
        transport: &mut T,
        wait: bool,
        report: &mut ReturnReport,
    ) {
        for node in 0..self.arenas.len() {
            for class in 0..CLASS_UNITS.len() {
                let ask = self
                    .arenas
                    .get_mut(node)
                    .and_then(|a| a.get_mut(class))
                    .and_then(|a| a.ahead.take());
                let Some(ask) = ask.filter(|_| wait) else {
                    continue;
                };
                // As in `collect_ahead`: under a live lease only (else the
                // runs may have been taken back: collected, not kept).
                let live = self.lease_ok(transport, node as u8);
                match transport.alloc_block_answer(ask, true) {
                    Ok(Some(runs)) if !live => {
                        self.dropped_bytes += runs.iter().map(|r| r.len).sum::<u64>();
                    }
                    Ok(Some(runs)) => {
                        if let Err(e) = self.install(transport, node as u8, class, &runs) {
                            report.error.get_or_insert(e);
                        }
                    }
                    Ok(None) => {}
                    // Nothing was granted, so nothing is lost: a node out of
                    // memory, or collecting when the ask came (answered
                    // during a collection that may have ended since); or
                    // granted under a lease that has ended since (the client
                    // ended it on a collecting node and renewed after the
                    // collection), which the node took back when it ended.
                    Err(
                        TransportError::OutOfMemory { .. }
                        | TransportError::Collecting { .. }
                        | TransportError::LeaseEnded { .. },
                    ) => {}
                    Err(e) => {
                        report.error.get_or_insert(e.into());
                    }
                }
            }
        }
    }
}

/// Where [`KvAllocator::give_back`]'s runs go, and what came of them.
struct Giving<'a, T> {
    transport: &'a mut T,
    wait: bool,
    report: ReturnReport,
    /// Nodes that failed a give back: not asked again (a node that does
    /// not answer would make every (node, class) wait its timeout).
    failed: Vec<bool>,
}

impl<T: Transport> Giving<'_, T> {
    /// Gives `runs` of blocks of `size` back to `node`, usable after
    /// `delay`; whether the node took them.
    fn give(&mut self, node: u8, size: u64, runs: &[BlockRun], delay: Duration) -> bool {
        let bytes: u64 = runs.iter().map(|r| r.len).sum();
        let failed = self.failed.get_mut(usize::from(node));
        if failed.as_deref() == Some(&true) {
            self.report.kept_bytes += bytes;
            return false;
        }
        match self
            .transport
            .return_blocks(node, size, runs, delay, self.wait)
        {
            Ok(()) => {
                self.report.returned_bytes += bytes;
                true
            }
            Err(e) => {
                self.report.kept_bytes += bytes;
                // A node being collected takes nothing back, and takes
                // what is kept itself: that is no failure of the close.
                if !matches!(e, TransportError::Collecting { .. }) {
                    self.report.error.get_or_insert(e.into());
                }
                if let Some(f) = failed {
                    *f = true;
                }
                false
            }
        }
    }
}
