//! [`AllocEndpoints`]: the messaging endpoints the clients of one node make
//! their block allocations from, lent to a client while it has a request
//! out and taken back when it has none.
//!
//! A client needs an endpoint only while a request of it is out (sent
//! ahead, or waited for), and every endpoint costs its node: a VQP, a send
//! staging ring (about 1 MiB by default), a reply window of receive
//! buffers per channel from the node's budget, a slot of each memory
//! node's allocation port it talks to, and, on a node attached to the node
//! daemon, one of the daemon's endpoints of the process (64 by default).
//! With an endpoint per client, a process of 100 client threads attached
//! to `krcored` had 99% of its inserts refused on that quota (2026-12-07).
//! A set shared by the clients of a node ([`crate::deploy::Store`] makes one
//! per store) holds at most `cap` endpoints whatever the client count.
//!
//! # Invariants
//! - An endpoint is lent to one client at a time: the answers it receives
//!   are that client's (or strays of a request given up on), so a client's
//!   per-port count of requests out (`MAX_OUT_PER_PORT` in the exchange)
//!   is the endpoint's.
//! - A client gives its endpoint back only with no request of its own
//!   out, and none given up on whose answer may still come; otherwise
//!   ([`AllocEndpoints::discard`]) it drops it, so no later borrower
//!   inherits answers it does not count.
//! - Request ids come from the set ([`AllocEndpoints::next_request_id`]):
//!   unique over every borrower of every endpoint, so a late answer to a
//!   request given up on is never taken for a later borrower's.
//! - Requests sent ahead borrow only while more than a reserve of the cap
//!   is free ([`AllocEndpoints::lend`]): clients that ask ahead and then go
//!   idle can hold at most `cap - reserve`, and an allocation needed now
//!   always finds one within the short exchanges of the others.

use crate::remote::{Cause, TransportError};
use krcore::messaging::Endpoint;
use krcore::Node;
use krcore_nic::{AnyNic, Nic};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Endpoints a [`crate::deploy::Store`]'s clients share, by default
/// ([`crate::deploy::StoreOptions::alloc_endpoints`]): half of the node
/// daemon's default quota of 64 per process, leaving the rest to the
/// application.
pub const STORE_ALLOC_ENDPOINTS: usize = 32;

/// What a borrower wants an endpoint for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// A request sent ahead: refused when only the reserve is left.
    Ahead,
    /// A request needed now: waits for one up to the given time.
    Now(Duration),
}

struct Lent<N: Nic> {
    /// Endpoints made and not lent.
    free: Vec<Endpoint<N>>,
    /// Endpoints lent (or being made for a borrower).
    out: usize,
    /// Endpoints made, ever.
    made: u64,
}

/// The allocation endpoints of one node's clients (see the module docs).
/// `Send + Sync`; shared behind an `Arc`.
pub struct AllocEndpoints<N: Nic = AnyNic> {
    node: Node<N>,
    cap: usize,
    /// Endpoints lent for requests sent ahead, at most.
    ahead_cap: usize,
    next_id: AtomicU64,
    lent: Mutex<Lent<N>>,
    returned: Condvar,
}

impl<N: Nic> AllocEndpoints<N> {
    /// A set of at most `cap` endpoints (at least 1) of `node`: a quarter
    /// of them (at least one, when `cap` is above 1) kept for requests
    /// needed now.
    pub fn new(node: &Node<N>, cap: usize) -> AllocEndpoints<N> {
        let cap = cap.max(1);
        let reserve = if cap > 1 { (cap / 4).max(1) } else { 0 };
        AllocEndpoints {
            node: node.clone(),
            cap,
            ahead_cap: cap - reserve,
            next_id: AtomicU64::new(1),
            lent: Mutex::new(Lent {
                free: Vec::new(),
                out: 0,
                made: 0,
            }),
            returned: Condvar::new(),
        }
    }

    /// The most endpoints the set holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Endpoints the set holds now (lent or free).
    pub fn held(&self) -> usize {
        let l = self.lent.lock();
        l.out + l.free.len()
    }

    /// Endpoints made, ever (one dropped with requests out is replaced by
    /// a new one).
    pub fn made(&self) -> u64 {
        self.lent.lock().made
    }

    /// A request id no other borrower of the set has used.
    pub(super) fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// An endpoint for a request to memory node `to`: a free one, or one
    /// made now while the set is under its cap (for `Need::Ahead`: under
    /// the cap less the reserve). Past it, `Need::Ahead` is refused and
    /// `Need::Now` waits for one to be given back.
    ///
    /// # Errors
    /// [`TransportError::Refused`]: nothing to lend for a request sent
    /// ahead, or the node could not make an endpoint (its cause says why:
    /// a daemon's quota, for one); [`TransportError::Timeout`]: none given
    /// back in time.
    pub(super) fn lend(&self, to: u8, need: Need) -> Result<Endpoint<N>, TransportError> {
        let deadline = match need {
            Need::Ahead => None,
            Need::Now(wait) => Some((Instant::now() + wait, wait)),
        };
        let mut l = self.lent.lock();
        loop {
            if need != Need::Ahead || l.out < self.ahead_cap {
                if let Some(ep) = l.free.pop() {
                    l.out += 1;
                    return Ok(ep);
                }
                if l.out + l.free.len() < self.cap {
                    l.out += 1;
                    l.made += 1;
                    drop(l);
                    return self.node.endpoint_with_window(1).map_err(|e| {
                        self.gone();
                        TransportError::Refused {
                            node: to,
                            source: Cause::new(e),
                        }
                    });
                }
            }
            match deadline {
                None => {
                    return Err(TransportError::Refused {
                        node: to,
                        source: Cause::msg(format!(
                            "no allocation endpoint free to ask ahead ({} of {} lent)",
                            l.out, self.cap
                        )),
                    })
                }
                Some((until, wait)) => {
                    if self.returned.wait_until(&mut l, until).timed_out() {
                        return Err(TransportError::Timeout {
                            node: to,
                            after: wait,
                        });
                    }
                }
            }
        }
    }

    /// Takes back an endpoint lent, with no request of its borrower out.
    pub(super) fn give_back(&self, ep: Endpoint<N>) {
        let mut l = self.lent.lock();
        l.out = l.out.saturating_sub(1);
        l.free.push(ep);
        drop(l);
        self.returned.notify_one();
    }

    /// An endpoint lent whose borrower goes with requests out: dropped
    /// (see the module docs), its place free for a new one.
    pub(super) fn discard(&self, ep: Endpoint<N>) {
        drop(ep);
        self.gone();
    }

    fn gone(&self) {
        let mut l = self.lent.lock();
        l.out = l.out.saturating_sub(1);
        drop(l);
        self.returned.notify_one();
    }
}

impl<N: Nic> std::fmt::Debug for AllocEndpoints<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.lent.lock();
        f.debug_struct("AllocEndpoints")
            .field("cap", &self.cap)
            .field("lent", &l.out)
            .field("free", &l.free.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_ahead_leave_the_reserve_to_requests_needed_now() {
        let node = Node::builder().host_meta().build().unwrap();
        let set = AllocEndpoints::new(&node, 4);
        let now = Need::Now(Duration::from_millis(50));
        // A quarter (1) kept: 3 lent ahead, the 4th refused ahead, lent now.
        let ahead: Vec<_> = (0..3).map(|_| set.lend(0, Need::Ahead).unwrap()).collect();
        assert!(matches!(
            set.lend(0, Need::Ahead),
            Err(TransportError::Refused { .. })
        ));
        let last = set.lend(0, now).unwrap();
        assert_eq!((set.held(), set.made()), (4, 4));
        // Past the cap a request needed now waits, and times out.
        assert!(matches!(
            set.lend(0, now),
            Err(TransportError::Timeout { .. })
        ));
        // One given back is lent again (not made anew), also to a waiter.
        std::thread::scope(|sc| {
            let waiter = sc.spawn(|| set.lend(0, Need::Now(Duration::from_secs(5))));
            std::thread::sleep(Duration::from_millis(20));
            set.give_back(last);
            let ep = waiter.join().unwrap().unwrap();
            set.give_back(ep);
        });
        assert_eq!((set.held(), set.made()), (4, 4));
        // One dropped with a request out is replaced by a new one.
        let mut ahead = ahead.into_iter();
        set.discard(ahead.next().unwrap());
        assert_eq!(set.held(), 3);
        let again: Vec<_> = (0..2).map(|_| set.lend(0, now).unwrap()).collect();
        assert_eq!((set.held(), set.made()), (4, 5));
        // Request ids are unique over the set.
        assert_ne!(set.next_request_id(), set.next_request_id());
        drop((again, ahead));
    }

    #[test]
    fn a_set_of_one_lends_its_endpoint_ahead() {
        let node = Node::builder().host_meta().build().unwrap();
        let set = AllocEndpoints::new(&node, 0);
        assert_eq!(set.cap(), 1);
        let ep = set.lend(0, Need::Ahead).unwrap();
        set.give_back(ep);
        assert!(set.lend(0, Need::Ahead).is_ok());
    }
}
