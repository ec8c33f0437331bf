//! A memory node's side of a collection: taking back the blocks of its
//! heap that nobody can reach or hold, which dead clients left (written
//! and not linked yet, retired in their last grace period, in their free
//! lists). The client side, the table scan and the argument for why it is
//! safe are in [`crate::client::Client::collect`]; here:
//!
//! 1. [`MemoryNode::collect_begin`] starts collection `token`: from then on
//!    the node renews no holder's lease and grants nothing to holders
//!    ([`TransportError::Collecting`]), so every lease ends within one
//!    lease; it answers [`CollectStart::Draining`] while one is live, and
//!    [`CollectStart::Ready`] once none is (after taking back what the
//!    dead holders' grants left unwritten).
//! 2. [`MemoryNode::collect_live`] takes the runs of this node that the
//!    table links (its KV blocks), as the collector's scan found them
//!    after the node was ready.
//! 3. [`MemoryNode::collect_finish`] takes back (with `apply`) every byte
//!    of the heap handed out that is neither pooled, nor a block
//!    [`MemoryNode::alloc`] handed out (subtables, live or retired), nor
//!    in a live run, and counts the collection in every lease it answers
//!    from then on ([`crate::holders::GrantLease::collections`]): a client
//!    that sees the count change drops every block of the node it holds.
//!
//! A collection that sees no request for [`COLLECT_IDLE`] is abandoned
//! (its collector died): nothing is taken back, and the node serves
//! holders again. One collection at a time: another token is refused.

use std::time::Duration;

use super::{Heap, MemoryNode, NodeMemory, BLOCK_ALIGN};
use crate::collection::{CollectStart, Collected, COLLECT_IDLE};
use crate::remote::{Cause, TransportError};

/// A collection under way.
#[derive(Debug)]
pub(super) struct Collection {
    token: u64,
    /// The node's microseconds of the collector's last request.
    touched: u64,
    /// No holder was live at the collector's last begin: live runs are
    /// taken.
    ready: bool,
    /// The runs the table links, `(start, end)`, as sent.
    live: Vec<(u64, u64)>,
}

fn refused(node: u8, why: &'static str) -> TransportError {
    TransportError::Refused {
        node,
        source: Cause::msg(why),
    }
}

impl Heap {
    /// Whether a collection is under way at `now` (the node's
    /// microseconds); one idle for [`COLLECT_IDLE`] is dropped first.
    pub(super) fn collecting(&mut self, now: u64) -> bool {
        let idle = u64::try_from(COLLECT_IDLE.as_micros()).unwrap_or(u64::MAX);
        if self
            .collection
            .as_ref()
            .is_some_and(|c| now.saturating_sub(c.touched) > idle)
        {
            self.collection = None;
        }
        self.collection.is_some()
    }

    /// The collection `token`, touched at `now`.
    fn collection_of(&mut self, token: u64, now: u64) -> Option<&mut Collection> {
        if !self.collecting(now) {
            return None;
        }
        let c = self.collection.as_mut().filter(|c| c.token == token)?;
        c.touched = now;
        Some(c)
    }
}

impl<M: NodeMemory> MemoryNode<M> {
    /// Whether a collection is under way.
    pub fn collecting(&self) -> bool {
        let now = self.micros();
        self.heap.lock().collecting(now)
    }

    /// Starts collection `token` (not 0), or looks again whether it is
    /// ready (see the module docs).
    ///
    /// # Errors
    /// [`TransportError::NodeDown`]; [`TransportError::Refused`] for token
    /// 0 or while another collection is under way.
    pub fn collect_begin(&self, token: u64) -> Result<CollectStart, TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        if token == 0 {
            return Err(refused(self.id, "collection token 0"));
        }
        let now = self.micros();
        {
            let mut heap = self.heap.lock();
            if heap.collecting(now) {
                if heap.collection_of(token, now).is_none() {
                    return Err(refused(self.id, "another collection is under way"));
                }
            } else {
                heap.collection = Some(Collection {
                    token,
                    touched: now,
                    ready: false,
                    live: Vec::new(),
                });
            }
        }
        // Leases that ended, and what their holders never wrote, first.
        self.reclaim_expired();
        let now = self.micros();
        let mut heap = self.heap.lock();
        let leases = heap.holders.live() as u64;
        let wait = heap.holders.last_lease_ends_in(now);
        let c = heap
            .collection_of(token, now)
            .ok_or_else(|| refused(self.id, "the collection was abandoned"))?;
        c.ready = leases == 0;
        Ok(if leases == 0 {
            CollectStart::Ready
        } else {
            CollectStart::Draining {
                wait: Duration::from_micros(wait),
                leases,
            }
        })
    }

    /// Runs `(offset, len)` of this node that the table links, for
    /// collection `token`.
    ///
    /// # Errors
    /// [`TransportError::Refused`] when `token` is not the ready collection
    /// or a run is empty, not 64-byte aligned or outside the heap.
    pub fn collect_live(&self, token: u64, runs: &[(u64, u64)]) -> Result<(), TransportError> {
        let now = self.micros();
        let mut heap = self.heap.lock();
        let (floor, top) = (heap.floor, heap.next);
        let c = heap
            .collection_of(token, now)
            .filter(|c| c.ready)
            .ok_or_else(|| refused(self.id, "no such ready collection"))?;
        let ok = runs.iter().all(|&(s, l)| {
            l > 0
                && s % BLOCK_ALIGN == 0
                && l % BLOCK_ALIGN == 0
                && s >= floor
                && s.checked_add(l).is_some_and(|e| e <= top)
        });
        if !ok {
            return Err(refused(self.id, "a live run outside the heap"));
        }
        c.live.extend(runs.iter().map(|&(s, l)| (s, s + l)));
        Ok(())
    }

    /// Ends collection `token`: with `apply`, takes back every byte of the
    /// heap handed out that is not pooled, not a block of
    /// [`MemoryNode::alloc`] and not live, to hand out at once, and counts
    /// the collection in the leases it answers from now on (if it took
    /// anything); without, only counts those bytes (and ends a collection
    /// not ready yet, counting nothing: an abort). The node serves holders
    /// again either way.
    ///
    /// # Errors
    /// [`TransportError::Refused`] when `token` is not the collection under
    /// way, or with `apply` not ready.
    pub fn collect_finish(&self, token: u64, apply: bool) -> Result<Collected, TransportError> {
        let now = self.micros();
        let mut heap = self.heap.lock();
        let Some(ready) = heap.collection_of(token, now).map(|c| c.ready) else {
            return Err(refused(self.id, "no such collection"));
        };
        if !ready {
            if apply {
                return Err(refused(self.id, "the collection is not ready"));
            }
            heap.collection = None;
            return Ok(Collected::default());
        }
        let Some(c) = heap.collection.take() else {
            return Err(refused(self.id, "no such ready collection"));
        };
        let mut kept: Vec<(u64, u64)> = c.live;
        kept.extend(heap.pool.runs());
        kept.extend(heap.coarse.iter().map(|(&s, &l)| (s, s + l)));
        let unreached = complement(heap.floor, heap.next, kept);
        let done = Collected {
            bytes: unreached.iter().map(|&(s, e)| e - s).sum(),
            runs: unreached.len() as u64,
        };
        if !apply {
            return Ok(done);
        }
        if !unreached.is_empty() {
            let runs: Vec<(u64, u64)> = unreached.iter().map(|&(s, e)| (s, e - s)).collect();
            let bounds = (heap.floor, heap.next);
            heap.pool
                .give(BLOCK_ALIGN, &runs, bounds, now, now)
                .map_err(|r| TransportError::Refused {
                    node: self.id,
                    source: Cause::new(r),
                })?;
            heap.holders.returned(&runs);
            heap.holders.collected();
        }
        heap.holders.note_collection();
        Ok(done)
    }
}

/// The parts of `floor..top` that no range of `kept` (`(start, end)`, in
/// any order, overlapping or not) covers, by address.
fn complement(floor: u64, top: u64, mut kept: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    kept.sort_unstable();
    let mut out = Vec::new();
    let mut at = floor;
    for (s, e) in kept {
        if s > at && at < top {
            out.push((at, s.min(top)));
        }
        at = at.max(e);
    }
    if at < top {
        out.push((at, top));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryNode;

    #[test]
    fn the_complement_skips_every_kept_range() {
        assert_eq!(complement(0, 100, vec![]), vec![(0, 100)]);
        assert_eq!(
            complement(10, 100, vec![(50, 60), (0, 20), (55, 70), (90, 200)]),
            vec![(20, 50), (70, 90)]
        );
        assert_eq!(complement(10, 100, vec![(0, 100)]), vec![]);
        assert_eq!(complement(10, 100, vec![(100, 120)]), vec![(10, 100)]);
    }

    /// A node with a holder that wrote one block of three and died: the
    /// collection waits out its lease, takes back the two unreached
    /// blocks (the live one and the subtable stay), counts itself in the
    /// next lease, and refuses holders meanwhile.
    #[test]
    fn a_collection_drains_leases_then_takes_back_what_nothing_links() {
        let lease = Duration::from_millis(30);
        let n = MemoryNode::new(1, 1 << 20);
        n.set_grant_lease(lease);
        let sub = n.alloc(4096).unwrap();
        let (runs, first) = n.grant(7, 3 * 128, 128).unwrap();
        assert_eq!(first.collections, 0);
        let g = runs[0].0;
        // All three written (never taken back by the lease's end); the
        // second is linked.
        for i in 0..3 {
            n.write(g + i * 128, &[0xab; 8]).unwrap();
        }
        let start = n.collect_begin(5).unwrap();
        assert!(
            matches!(start, CollectStart::Draining { leases: 1, .. }),
            "{start:?}"
        );
        assert!(matches!(
            n.renew(7),
            Err(TransportError::Collecting { node: 1 })
        ));
        assert!(matches!(
            n.collect_begin(6),
            Err(TransportError::Refused { .. })
        ));
        assert!(n.collect_live(5, &[(g + 128, 128)]).is_err(), "not ready");
        std::thread::sleep(lease * 2);
        assert_eq!(n.collect_begin(5).unwrap(), CollectStart::Ready);
        let h = n.stats().holders;
        assert_eq!((h.ran_out, h.ran_out_since_collection), (1, 1));
        n.collect_live(5, &[(g + 128, 128)]).unwrap();
        assert!(n.collect_live(5, &[(g + 1, 64)]).is_err(), "misaligned");
        assert!(n.collect_live(5, &[(1 << 20, 64)]).is_err(), "outside");
        let dry = n.collect_finish(5, false).unwrap();
        assert_eq!(
            dry,
            Collected {
                bytes: 256,
                runs: 2
            }
        );
        assert!(n.collect_finish(5, true).is_err(), "the dry run ended it");
        assert_eq!(n.stats().holders.ran_out_since_collection, 1, "a dry run");
        // Again, applied.
        assert_eq!(n.collect_begin(5).unwrap(), CollectStart::Ready);
        n.collect_live(5, &[(g + 128, 128)]).unwrap();
        assert_eq!(n.collect_finish(5, true).unwrap(), dry);
        let h = n.stats().holders;
        assert_eq!((h.ran_out, h.ran_out_since_collection), (1, 0));
        assert_eq!(n.usage(0).ran_out_since_collection, Some(0));
        assert_eq!(n.stats().pool.pooled, 256);
        assert!(n.stats().heap_used > sub);
        // Served again, and the lease says a collection took blocks.
        let after = n.renew(7).unwrap();
        assert_eq!(after.collections, 1);
        assert!(after.generation > first.generation);
        // The pool hands them out again.
        let (again, _) = n.grant(8, 128, 128).unwrap();
        assert!(again[0].0 == g || again[0].0 == g + 256, "{again:?}");
    }

    #[test]
    fn an_abandoned_collection_ends_by_itself() {
        let n = MemoryNode::new(1, 1 << 20);
        assert_eq!(n.collect_begin(9).unwrap(), CollectStart::Ready);
        {
            let mut heap = n.heap.lock();
            if let Some(c) = heap.collection.as_mut() {
                c.touched = 0;
            }
        }
        let idle = u64::try_from(COLLECT_IDLE.as_micros()).unwrap();
        assert!(!n.heap.lock().collecting(idle + 1));
        assert!(n.renew(1).is_ok());
        assert!(n.collect_finish(9, true).is_err());
    }
}
