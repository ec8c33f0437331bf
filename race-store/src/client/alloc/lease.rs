//! A client's leases on the memory nodes' grants, as its allocator uses
//! them (the fence of [`crate::holders`]): nothing of a node is used
//! without a live lease on it; a new lease drops what the node may have
//! taken back (uncarved runs); a change of the node's collection count
//! drops every block of the node held ([`crate::client::Client::collect`]).

use super::{class_bytes, KvAllocator};
use crate::error::Error;
use crate::remote::{Transport, TransportError};

impl KvAllocator {
    /// Whether (node, class) has a free block or uncarved bytes.
    pub(super) fn holds(&self, node: u8, class: usize) -> bool {
        self.arenas
            .get(usize::from(node))
            .and_then(|a| a.get(class))
            .is_some_and(|a| !a.free.is_empty() || a.uncarved > 0)
    }

    /// Whether this client's lease on node `node`'s grants is live
    /// (renewed if due). When the node started a new one, everything held
    /// under the old one is dropped first: the node may have taken it back;
    /// when the node's collection count changed, every block of it held.
    /// A node whose renewal failed is skipped for the back-off, as one
    /// whose grant failed (each renewal may wait out its timeout).
    pub(super) fn lease_ok<T: Transport>(&mut self, transport: &mut T, node: u8) -> bool {
        let now = self.now;
        if let Some(Some((until, _))) = self.unreachable.get(usize::from(node)) {
            if now < *until {
                return false;
            }
        }
        let generation = match transport.grant_lease(node) {
            Ok(None) => return true,
            Ok(Some(g)) => g,
            Err(e) => {
                self.note_collecting(node, &e);
                if self.backoff_ticks > 0 {
                    let e = Error::from(e);
                    let ticks = self.backoff_after(&e);
                    if let Some(u) = self.unreachable.get_mut(usize::from(node)) {
                        *u = Some((now.saturating_add(ticks), e));
                    }
                }
                return false;
            }
        };
        let Some(held) = self.held_under.get_mut(usize::from(node)) else {
            return false;
        };
        if *held != Some(generation) {
            let stale = held.is_some();
            *held = Some(generation);
            if stale {
                self.drop_node(node);
            }
        }
        if let Some(count) = transport.lease_collections(node) {
            let i = usize::from(node);
            if self
                .collections
                .get(i)
                .is_some_and(|c| c.0.unwrap_or(0) != count)
            {
                self.drop_collected(node);
            }
            if let Some(c) = self.collections.get_mut(i) {
                c.0 = Some(count);
            }
        }
        true
    }

    /// Notes node `node` as collecting if `e` says so (its lease ends at
    /// the next point between operations).
    pub(super) fn note_collecting(&mut self, node: u8, e: &TransportError) {
        if matches!(e, TransportError::Collecting { .. }) {
            if let Some(f) = self.ending.get_mut(usize::from(node)) {
                *f = true;
            }
        }
    }

    /// Ends this client's lease on every node found collecting since the
    /// last call, unless held (`hold_early_ends`). Called between
    /// operations (after a write: `trim`), where no block this client
    /// carved is written and not yet linked: the node's drain need not
    /// wait for the lease to run out, and nothing the collection's scan
    /// misses can be linked afterwards. What the client held there is
    /// handled as for any ended lease: the uncarved runs go now (the node
    /// takes back what was never written), the written free and retired
    /// blocks are kept until the next lease says whether the node
    /// collected (then they are dropped: `drop_collected`).
    pub(crate) fn end_collecting_leases<T: Transport>(&mut self, transport: &mut T) {
        if self.now < self.quiet_until || !self.ending.contains(&true) {
            return;
        }
        for node in 0..self.ending.len() {
            let Some(flag) = self.ending.get_mut(node) else {
                continue;
            };
            if !std::mem::take(flag) {
                continue;
            }
            let node = node as u8;
            self.drop_node(node);
            if let Ok(n) = transport.end_grant_leases(Some(node), true) {
                self.early_ends += n as u64;
            }
        }
    }

    /// No lease is ended early before tick `until`: an operation failed
    /// with a transport error, and a WR of it whose outcome is unknown
    /// might still link a block; the lease then runs out by the clock, as
    /// the grant lease's fence assumes.
    pub(crate) fn hold_early_ends(&mut self, until: u64) {
        self.quiet_until = self.quiet_until.max(until);
    }

    /// How long a node that failed with `e` is skipped: the back-off, but
    /// an eighth of a grace period for a node that is collecting (alive,
    /// and serving again once its collection ends: a collector moving on
    /// to the next node must find this one in use again, or writers of a
    /// two-node store would find both skipped).
    pub(super) fn backoff_after(&self, e: &Error) -> u64 {
        if matches!(e, Error::Transport(TransportError::Collecting { .. })) {
            self.collecting_skip().min(self.backoff_ticks.max(1))
        } else {
            self.backoff_ticks
        }
    }

    /// How long a node found collecting is left alone: an eighth of a
    /// grace period (at least a tick).
    pub(crate) fn collecting_skip(&self) -> u64 {
        (self.grace_ticks / 8).max(1)
    }

    /// Drops every block of node `node` this client holds (free, retired,
    /// uncarved; give-backs still out are dropped if refused): a
    /// collection of the node happened since it took them, which may have
    /// taken back any block of the node no slot linked (see
    /// [`crate::client::Client::collect`]). What a collection did not take
    /// (a block retired after its scan) waits for the next one.
    pub(super) fn drop_collected(&mut self, node: u8) {
        self.drop_node(node);
        let mut dropped = 0;
        if let Some(arenas) = self.arenas.get_mut(usize::from(node)) {
            for (class, a) in arenas.iter_mut().enumerate() {
                dropped += a.free.len() as u64 * class_bytes(class);
                a.free.clear();
            }
        }
        let before = self.quarantine.len();
        let mut retired = 0;
        self.quarantine.retain(|r| {
            let keep = r.ptr.node() != node;
            if !keep {
                retired += class_bytes(r.class);
            }
            keep
        });
        if self.quarantine.len() != before {
            self.retired_bytes -= retired;
            dropped += retired;
        }
        self.dropped_bytes += dropped;
        if let Some(c) = self.collections.get_mut(usize::from(node)) {
            c.1 = c.1.wrapping_add(1);
        }
    }

    /// How many times node `node`'s holdings were dropped for a collection
    /// ([`KvAllocator::drop_collected`]).
    pub(super) fn collection_drops(&self, node: u8) -> u32 {
        self.collections.get(usize::from(node)).map_or(0, |c| c.1)
    }

    /// Drops node `node`'s uncarved runs, blocks released unpublished among
    /// them: the node may have taken them back. Kept: free and retired
    /// blocks, which were written (a KV block's first word holds its magic),
    /// so never taken back; and grants asked ahead, whose answers say their
    /// own lease. (Until 2026-12-06 free blocks were dropped too: a client
    /// idle past its lease leaked its free lists, up to [`FREE_HIGH`] per
    /// class it used, at each such pause.)
    pub(super) fn drop_node(&mut self, node: u8) {
        let Some(arenas) = self.arenas.get_mut(usize::from(node)) else {
            return;
        };
        for a in arenas.iter_mut() {
            self.dropped_bytes += a.uncarved;
            a.chunks.clear();
            a.uncarved = 0;
        }
    }
}
