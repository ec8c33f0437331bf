//! What a running client gives back to the memory nodes: the surplus of its
//! free lists, and its oldest retired blocks (the module docs of `alloc`:
//! "Trimmed while running").
//!
//! Invariants:
//! * free blocks given back are past their grace period (retired) or were
//!   never published (released): no reader of the table can reach them;
//!   the node hands them out again at once. Retired blocks go with what is
//!   left of their grace period (the youngest one's, for all of a
//!   message's), which the node waits out before it hands them out (its
//!   cooling list), as at a close. Either way the node cuts them out of
//!   whichever client's grant they lie in ([`crate::holders`]);
//! * only under a live lease on the node's grants (the fence of
//!   [`crate::holders`]); free and retired blocks the node refused go back
//!   to their lists whatever the lease's generation now (they were written,
//!   so no lease change takes them), unless the node was collected since
//!   they were sent ([`crate::client::Client::collect`]): then they are
//!   dropped;
//! * a give-back whose outcome is unknown (no answer in time, the node
//!   gone) is never used again: its blocks are counted as dropped (leaked
//!   if the node did not take them), never handed out twice.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{class_bytes, coalesce, KvAllocator, Retired, ReturnReport, FREE_KEEP, TRIM_BLOCKS};
use crate::layout::slot::RemotePtr;
use crate::remote::{AllocAsk, Transport, TransportError};

/// Blocks of one (node, class) sent back to the node, not answered yet.
#[derive(Debug)]
pub(super) struct Trim {
    ask: AllocAsk,
    node: u8,
    class: usize,
    /// In free-list (or retirement) order, oldest first.
    blocks: Vec<RemotePtr>,
    /// Retired blocks: the tick of the youngest one's retirement.
    retired: Option<u64>,
    /// The node's collection drops when it was sent: blocks of a refused
    /// give-back are not taken back in after a drop.
    drops: u32,
}

impl Trim {
    pub(super) fn bytes(&self) -> u64 {
        self.blocks.len() as u64 * class_bytes(self.class)
    }
}

impl KvAllocator {
    /// Gives back, to their nodes:
    /// * the oldest free blocks of every (node, class) whose free list
    ///   passed [`super::FREE_HIGH`], until [`FREE_KEEP`] is left: one
    ///   message per node at a time;
    /// * with a clock that follows real time, the oldest retired blocks
    ///   while they are more than `retired_high` bytes
    ///   (`ClientConfig::retired_high_bytes`), with what is left of
    ///   their grace period: [`TRIM_BLOCKS`] at a time, in one message per
    ///   (node, class) among them.
    ///
    /// Answers are collected by a later call where the transport sends
    /// ahead. Moves retired blocks past their grace period to their free
    /// lists first (a client that only deletes never allocates, which does
    /// that too). The client calls it after every write; it costs a few
    /// comparisons when nothing is over.
    pub fn trim<T: Transport>(&mut self, transport: &mut T, now: u64) {
        self.reclaim(now);
        self.now = now;
        self.end_collecting_leases(transport);
        let retired_over = self.retired_bytes > self.retired_high && self.tick.is_some();
        if self.over.is_empty() && self.giving.is_empty() && !retired_over {
            return;
        }
        self.now = now;
        self.collect_trims(transport, false, None);
        let mut i = 0;
        while let Some(&(node, class)) = self.over.get(i) {
            let size = class_bytes(class);
            let free = self
                .arenas
                .get(usize::from(node))
                .and_then(|a| a.get(class))
                .map_or(0, |a| a.free.len() as u64 * size);
            if free <= FREE_KEEP || !self.trims {
                self.over.swap_remove(i);
                continue;
            }
            i += 1;
            let sending = self
                .giving
                .iter()
                .any(|g| g.node == node && g.retired.is_none());
            if sending || !self.may_trim(transport, node) {
                continue;
            }
            let n = usize::try_from((free - FREE_KEEP) / size)
                .unwrap_or(usize::MAX)
                .min(TRIM_BLOCKS);
            self.trim_free(transport, node, class, n);
        }
        if retired_over {
            self.trim_retired(transport, now);
        }
    }

    /// Whether node `node` may be given blocks now: not paused after a
    /// failure, and under a live lease.
    fn may_trim<T: Transport>(&mut self, transport: &mut T, node: u8) -> bool {
        let paused = self
            .trim_after
            .get(usize::from(node))
            .is_some_and(|&t| self.now < t);
        !paused && self.lease_ok(transport, node)
    }

    /// Gives the `n` oldest free blocks of (node, class) back.
    fn trim_free<T: Transport>(&mut self, transport: &mut T, node: u8, class: usize, n: usize) {
        let Some(a) = self.arena(node, class) else {
            return;
        };
        let blocks: Vec<RemotePtr> = a.free.drain(..n.min(a.free.len())).collect();
        if blocks.is_empty() {
            return;
        }
        let trim = Trim {
            ask: AllocAsk(0),
            node,
            class,
            blocks,
            retired: None,
            drops: self.collection_drops(node),
        };
        self.send_trim(transport, trim, Duration::ZERO);
    }

    /// Hands the oldest retired blocks (up to [`TRIM_BLOCKS`], and up to
    /// one of a node that cannot take them now) to their nodes, unless
    /// such a give-back is still out.
    fn trim_retired<T: Transport>(&mut self, transport: &mut T, now: u64) {
        let Some(tick) = self.tick else {
            return;
        };
        if !self.trims || self.giving.iter().any(|g| g.retired.is_some()) {
            return;
        }
        let mut ready: Vec<Option<bool>> = vec![None; self.arenas.len()];
        let mut groups: BTreeMap<(u8, usize), (Vec<RemotePtr>, u64)> = BTreeMap::new();
        for _ in 0..TRIM_BLOCKS {
            let Some(r) = self.quarantine.front() else {
                break;
            };
            let (node, class, at) = (r.ptr.node(), r.class, r.tick);
            let ok = match ready.get(usize::from(node)).copied().flatten() {
                Some(ok) => ok,
                None => {
                    let ok = self.may_trim(transport, node);
                    if let Some(slot) = ready.get_mut(usize::from(node)) {
                        *slot = Some(ok);
                    }
                    ok
                }
            };
            if !ok {
                // Kept in order: the rest waits for this node.
                break;
            }
            let Some(r) = self.quarantine.pop_front() else {
                break;
            };
            self.retired_bytes -= class_bytes(class);
            let group = groups.entry((node, class)).or_default();
            group.0.push(r.ptr);
            group.1 = group.1.max(at);
        }
        for ((node, class), (blocks, youngest)) in groups {
            let left = youngest
                .saturating_add(self.grace_ticks)
                .saturating_add(1)
                .saturating_sub(now);
            let delay = tick.saturating_mul(u32::try_from(left).unwrap_or(u32::MAX));
            let trim = Trim {
                ask: AllocAsk(0),
                node,
                class,
                blocks,
                retired: Some(youngest),
                drops: self.collection_drops(node),
            };
            self.send_trim(transport, trim, delay);
        }
    }

    /// Sends `trim`'s blocks back, usable by others after `delay`.
    fn send_trim<T: Transport>(&mut self, transport: &mut T, mut trim: Trim, delay: Duration) {
        let size = class_bytes(trim.class);
        let runs = coalesce(trim.blocks.iter().map(|&p| (p, size)).collect());
        match transport.return_blocks_ahead(trim.node, size, &runs, delay) {
            Ok(Some(ask)) => {
                trim.ask = ask;
                self.giving.push(trim);
            }
            Ok(None) => self.trimmed_bytes += trim.bytes(),
            Err(e) => {
                if matches!(e, TransportError::Unsupported { .. }) {
                    self.trims = false;
                    self.over.clear();
                }
                // Not sent, or refused; a wait that timed out may have
                // been taken.
                let kept = !matches!(e, TransportError::Timeout { .. });
                self.trim_failed(trim, kept);
            }
        }
    }

    /// Collects the answers to the blocks being given back (`wait`: every
    /// one, waited for; at a close, whose `report` counts them).
    pub(super) fn collect_trims<T: Transport>(
        &mut self,
        transport: &mut T,
        wait: bool,
        mut report: Option<&mut ReturnReport>,
    ) {
        let mut i = 0;
        while let Some(ask) = self.giving.get(i).map(|g| g.ask) {
            let answer = transport.alloc_block_answer(ask, wait);
            if matches!(answer, Ok(None)) && !wait {
                i += 1;
                continue;
            }
            let trim = self.giving.swap_remove(i);
            match answer {
                Ok(Some(_)) => match report.as_deref_mut() {
                    Some(r) => r.returned_bytes += trim.bytes(),
                    None => self.trimmed_bytes += trim.bytes(),
                },
                Ok(None) => self.trim_failed(trim, false),
                // A node collecting when they came did not take them: they
                // are still this client's (unless that collection finished:
                // see `trim_failed`), and the client is not to blame.
                Err(TransportError::Collecting { .. }) => self.trim_failed(trim, true),
                Err(e) => {
                    // The node said no: they are still this client's.
                    let kept = matches!(e, TransportError::Refused { .. });
                    if let Some(r) = report.as_deref_mut() {
                        r.error.get_or_insert(e.into());
                    }
                    self.trim_failed(trim, kept);
                }
            }
        }
    }

    /// Blocks that did not go back, when `kept` (the node did not take
    /// them): free ones to the front of their free list, retired ones to
    /// the front of the retired queue as retired when the youngest of them
    /// was (the queue's order holds: everything after was retired later);
    /// otherwise dropped. The node is not trimmed again for a grace period.
    fn trim_failed(&mut self, trim: Trim, kept: bool) {
        // A collection since it was sent: they may have been taken back.
        let kept = kept && trim.drops == self.collection_drops(trim.node);
        let bytes = trim.bytes();
        let pause = self.grace_ticks.max(1);
        let now = self.now;
        if let Some(t) = self.trim_after.get_mut(usize::from(trim.node)) {
            *t = now.saturating_add(pause);
        }
        if let (true, Some(tick)) = (kept, trim.retired) {
            for &ptr in trim.blocks.iter().rev() {
                self.quarantine.push_front(Retired {
                    tick,
                    ptr,
                    class: trim.class,
                });
            }
            self.retired_bytes += bytes;
            return;
        }
        if !kept {
            self.dropped_bytes += bytes;
            return;
        }
        if let Some(a) = self.arena(trim.node, trim.class) {
            for &p in trim.blocks.iter().rev() {
                a.free.push_front(p);
            }
        }
    }
}
