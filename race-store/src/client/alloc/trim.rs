//! A running client's surplus of free blocks, given back to the memory
//! nodes (the module docs of `alloc`: "Trimmed while running").
//!
//! Invariants:
//! * only blocks of a free list are given back: past their grace period
//!   (retired) or never published (released), so no reader of the table
//!   can reach them; the node cuts them out of whichever client's grant
//!   they lie in ([`crate::holders`]) and hands them out again at once;
//! * only under a live lease on the node's grants (the fence of
//!   [`crate::holders`]); blocks the node refused go back to the free list
//!   only under the generation they were held under;
//! * a give-back whose outcome is unknown (no answer in time, the node
//!   gone) is never used again: its blocks are counted as dropped (leaked
//!   if the node did not take them), never handed out twice.

use super::{class_bytes, coalesce, KvAllocator, ReturnReport, FREE_KEEP, TRIM_BLOCKS};
use crate::layout::slot::RemotePtr;
use crate::remote::{AllocAsk, Transport, TransportError};

/// Free blocks of one (node, class) sent back to the node, not answered
/// yet.
#[derive(Debug)]
pub(super) struct Trim {
    ask: AllocAsk,
    node: u8,
    class: usize,
    /// In free-list order (oldest first).
    blocks: Vec<RemotePtr>,
    /// The node's lease generation they were held under.
    generation: Option<u32>,
}

impl Trim {
    pub(super) fn bytes(&self) -> u64 {
        self.blocks.len() as u64 * class_bytes(self.class)
    }
}

impl KvAllocator {
    /// Gives back, to their nodes, the oldest free blocks of every (node,
    /// class) whose free list passed [`super::FREE_HIGH`], until
    /// [`FREE_KEEP`] is left: one message per node at a time, its answer
    /// collected by a later call where the transport sends it ahead. Moves
    /// retired blocks past their grace period to their free lists first
    /// (a client that only deletes never allocates, which does that too).
    /// The client calls it after every write; it costs a comparison when
    /// nothing is over.
    pub fn trim<T: Transport>(&mut self, transport: &mut T, now: u64) {
        self.reclaim(now);
        if self.over.is_empty() && self.giving.is_empty() {
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
            let sending = self.giving.iter().any(|g| g.node == node);
            let paused = self
                .trim_after
                .get(usize::from(node))
                .is_some_and(|&t| now < t);
            if sending || paused || !self.lease_ok(transport, node) {
                continue;
            }
            let n = usize::try_from((free - FREE_KEEP) / size)
                .unwrap_or(usize::MAX)
                .min(TRIM_BLOCKS);
            self.send_trim(transport, node, class, n);
        }
    }

    /// Gives the `n` oldest free blocks of (node, class) back.
    fn send_trim<T: Transport>(&mut self, transport: &mut T, node: u8, class: usize, n: usize) {
        let size = class_bytes(class);
        let generation = self.held_under.get(usize::from(node)).copied().flatten();
        let Some(a) = self.arena(node, class) else {
            return;
        };
        let blocks: Vec<RemotePtr> = a.free.drain(..n.min(a.free.len())).collect();
        if blocks.is_empty() {
            return;
        }
        let runs = coalesce(blocks.iter().map(|&p| (p, size)).collect());
        let mut trim = Trim {
            ask: AllocAsk(0),
            node,
            class,
            blocks,
            generation,
        };
        match transport.return_blocks_ahead(node, size, &runs) {
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

    /// Blocks that did not go back: to the front of their free list when
    /// `kept` (the node did not take them) under the generation they were
    /// held under, else dropped. The node is not trimmed again for a grace
    /// period.
    fn trim_failed(&mut self, trim: Trim, kept: bool) {
        let bytes = trim.bytes();
        let now = self.now;
        let pause = self.grace_ticks.max(1);
        if let Some(t) = self.trim_after.get_mut(usize::from(trim.node)) {
            *t = now.saturating_add(pause);
        }
        let held = self
            .held_under
            .get(usize::from(trim.node))
            .copied()
            .flatten();
        if !kept || held != trim.generation {
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
