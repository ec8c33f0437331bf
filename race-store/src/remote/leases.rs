//! A client's leases on memory nodes' grants, as its transport learns them
//! from the nodes' answers (see [`crate::holders`] for the protocol and
//! its timing argument).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::TransportError;
use crate::holders::GrantLease;

#[derive(Clone, Copy, Debug)]
struct Held {
    generation: u32,
    /// The node's collections as the answer said ([`GrantLease::collections`]).
    collections: u32,
    lease: Duration,
    /// End of the lease by this client's clock: the send time of the last
    /// answered request plus the lease.
    until: Instant,
}

/// One transport's holder id and its lease on each memory node.
#[derive(Debug)]
pub struct LeaseBook {
    holder: u64,
    held: Vec<Option<Held>>,
}

/// A fresh random id, never 0: a grant holder's, a memory node process's
/// incarnation.
///
/// RandomState is keyed from the OS's randomness once per process (then per
/// thread, incremented): with the pid, the time and a counter, ids drawn
/// anywhere collide with a probability of about n^2 / 2^64. (A holder-id
/// collision only delays taking back memory, see crate::holders:
/// generations keep it safe.)
pub(crate) fn fresh_id() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

impl Default for LeaseBook {
    fn default() -> Self {
        LeaseBook::new()
    }
}

impl LeaseBook {
    /// A book with a fresh random holder id (never 0) and no lease yet.
    pub fn new() -> Self {
        LeaseBook {
            holder: fresh_id(),
            held: Vec::new(),
        }
    }

    /// The holder id requests name.
    pub fn holder(&self) -> u64 {
        self.holder
    }

    /// An answer from node `node` to a request sent at `sent` carried
    /// `terms`. A generation older than one already learned is refused
    /// with [`TransportError::LeaseEnded`]: whatever the answer granted
    /// belonged to a record the node has ended, and may have been taken
    /// back.
    ///
    /// # Errors
    /// [`TransportError::LeaseEnded`] (nothing is learned).
    pub fn learn(
        &mut self,
        node: u8,
        sent: Instant,
        terms: GrantLease,
    ) -> Result<(), TransportError> {
        let i = usize::from(node);
        if self.held.len() <= i {
            self.held.resize(i + 1, None);
        }
        let lease = Duration::from_millis(u64::from(terms.lease_ms));
        let fresh = Held {
            generation: terms.generation,
            collections: terms.collections,
            lease,
            until: sent + lease,
        };
        let Some(slot) = self.held.get_mut(i) else {
            return Ok(());
        };
        match slot {
            Some(h) if terms.generation < h.generation => Err(TransportError::LeaseEnded { node }),
            Some(h) if terms.generation == h.generation => {
                h.until = h.until.max(fresh.until);
                h.lease = lease;
                Ok(())
            }
            _ => {
                *slot = Some(fresh);
                Ok(())
            }
        }
    }

    /// Whether node `node`'s lease should be renewed (ahead, without
    /// waiting) before the client carves from its grants at `now`: none
    /// learned yet, or a quarter of it gone. Early, so that a writer
    /// learns soon that the node is collecting (its renewal is refused),
    /// and ends its lease there: a collection's drain waits for it. Until
    /// 2026-12-08 at half a lease (a drain beside running writers took up
    /// to 5 s of the default 10 s lease).
    pub fn due(&self, node: u8, now: Instant) -> bool {
        self.ends_within(node, now, 3, 4)
    }

    /// None learned for node `node`, or at most `num / den` of its lease
    /// left at `now`.
    fn ends_within(&self, node: u8, now: Instant, num: u32, den: u32) -> bool {
        match self.held.get(usize::from(node)).copied().flatten() {
            None => true,
            Some(h) => now + h.lease * num / den >= h.until,
        }
    }

    /// Whether node `node`'s lease must be renewed before the client
    /// carves from its grants at `now`, waiting for the renewal: none
    /// learned yet, or a quarter of it or less left (a transport that sends
    /// renewals ahead sends one at [`LeaseBook::due`] and waits only here).
    pub fn urgent(&self, node: u8, now: Instant) -> bool {
        self.ends_within(node, now, 1, 4)
    }

    /// Forgets node `node`'s lease (the client ended it): the next use
    /// renews it, and the node answers with a new generation.
    pub fn forget(&mut self, node: u8) {
        if let Some(h) = self.held.get_mut(usize::from(node)) {
            *h = None;
        }
    }

    /// The collection count of node `node` its last lease answer said,
    /// once learned.
    pub fn collections(&self, node: u8) -> Option<u32> {
        self.held
            .get(usize::from(node))
            .copied()
            .flatten()
            .map(|h| h.collections)
    }

    /// The generation of node `node`'s lease, once learned.
    pub fn generation(&self, node: u8) -> Option<u32> {
        self.held
            .get(usize::from(node))
            .copied()
            .flatten()
            .map(|h| h.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(generation: u32) -> GrantLease {
        GrantLease {
            lease_ms: 1000,
            generation,
            collections: 0,
        }
    }

    #[test]
    fn a_lease_runs_from_the_send_and_is_due_at_a_quarter() {
        let mut b = LeaseBook::new();
        assert_ne!(b.holder(), 0);
        assert_ne!(LeaseBook::new().holder(), b.holder());
        let t0 = Instant::now();
        assert!(b.due(2, t0) && b.urgent(2, t0), "nothing learned yet");
        b.learn(2, t0, terms(4)).unwrap();
        assert_eq!(b.generation(2), Some(4));
        assert_eq!(b.generation(1), None);
        assert!(!b.due(2, t0 + Duration::from_millis(249)));
        assert!(b.due(2, t0 + Duration::from_millis(250)));
        assert!(!b.urgent(2, t0 + Duration::from_millis(749)));
        assert!(b.urgent(2, t0 + Duration::from_millis(750)));
        // An answer to an earlier request does not shorten it.
        b.learn(2, t0 - Duration::from_millis(300), terms(4))
            .unwrap();
        assert!(!b.due(2, t0 + Duration::from_millis(249)));
        b.learn(2, t0 + Duration::from_millis(400), terms(4))
            .unwrap();
        assert!(!b.due(2, t0 + Duration::from_millis(649)));
        assert!(b.due(2, t0 + Duration::from_millis(650)));
    }

    #[test]
    fn an_older_generation_is_refused_and_a_newer_replaces() {
        let mut b = LeaseBook::new();
        let t0 = Instant::now();
        b.learn(0, t0, terms(4)).unwrap();
        assert!(matches!(
            b.learn(0, t0, terms(3)),
            Err(TransportError::LeaseEnded { node: 0 })
        ));
        b.learn(0, t0 - Duration::from_millis(900), terms(5))
            .unwrap();
        assert_eq!(b.generation(0), Some(5));
        assert!(
            b.due(0, t0),
            "the new record's lease counts from its own send"
        );
    }
}
