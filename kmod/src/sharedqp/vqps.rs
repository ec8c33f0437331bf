//! The VQPs bound to one shared physical QP: each one's state
//! ([`VqpState`]: its count of WRs in flight, its ring of unpolled
//! completions, its target and the remote grants it knows), held in the
//! QP's [`VqpTable`] under the QP's one lock (see the parent module).

use std::cell::Cell;
use std::collections::VecDeque;

use krcore_nic::{Gid, Wc};

use crate::dccache::CachedTarget;
use crate::idhash::IdMap;
use crate::precheck::{RemoteGrant, Ungranted};
use crate::wrid::VqpId;

/// Everything a VQP owns, held by its physical QP (see the module docs).
/// Its WRs in flight are recorded by the QP itself, one record per WR
/// (the user's wr_id and signal flag beside the WR as posted, see
/// `super::physqp`); the VQP only counts them.
#[derive(Debug)]
pub struct VqpState {
    /// WRs posted and not yet completed (recorded in the QP's records).
    pub(crate) outstanding: u32,
    /// Most WRs outstanding plus completions unpolled (`vqp_depth`).
    pub(crate) capacity: u32,
    /// Completions not yet polled; never grows past its initial capacity.
    pub(crate) ring: VecDeque<Wc>,
    pub(crate) target: Option<CachedTarget>,
    /// Keyed by this process's own grants (no untrusted keys): the cheap
    /// [`IdMap`] hasher, not SipHash, on the pre-check's per-WR lookup.
    pub(crate) grants: IdMap<(Gid, u32), RemoteGrant>,
    /// The pre-check's last lookup in `grants`: (target, rkey) and what
    /// `grants` held for it. Invariant: it equals `grants`' answer, so
    /// every change of `grants` (`add_grant`, `remove_grant`) clears it.
    pub(crate) last_grant: Cell<Option<(Gid, u32, Option<RemoteGrant>)>>,
    /// How many of `grants` carry an expiry: the pre-check reads the
    /// clock only while there is one (leases are opt-in).
    pub(crate) expiring: u32,
    /// What the pre-check does under no known grant
    /// ([`Vqp::set_ungranted`]).
    pub(crate) ungranted: Ungranted,
}

impl VqpState {
    /// A VQP's state with room for `depth` WRs in flight plus completions
    /// unpolled, no target, no grant known; `ungranted`: what the
    /// pre-check does under no known grant.
    pub fn new(depth: u32, ungranted: Ungranted) -> VqpState {
        VqpState {
            outstanding: 0,
            capacity: depth,
            ring: VecDeque::with_capacity(depth as usize),
            target: None,
            grants: IdMap::default(),
            last_grant: Cell::new(None),
            expiring: 0,
            ungranted,
        }
    }

    /// Names (or clears) the VQP's target (its `connect`).
    pub fn set_target(&mut self, target: Option<CachedTarget>) {
        self.target = target;
    }

    /// WRs posted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.outstanding
    }

    /// WRs in flight plus completions not yet polled.
    pub fn occupied(&self) -> u32 {
        self.outstanding + self.ring.len() as u32
    }

    #[inline]
    pub(crate) fn has_room(&self, n: usize) -> bool {
        (self.occupied() as usize).saturating_add(n) <= self.capacity as usize
    }

    /// Moves up to `out.len()` completions out of the ring, oldest first.
    #[inline]
    pub fn pop(&mut self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(wc) = self.ring.pop_front() else {
                break;
            };
            out[n] = wc;
            n += 1;
        }
        n
    }
}

/// Buckets of [`VqpTable`]'s direct index (a power of two).
const DIRECT: usize = 64;

/// The states of the VQPs bound to one physical QP, found by id without
/// hashing on the data path: dense positions `0..len` holding (id,
/// state), and a direct-mapped index from a multiplicative hash of the id
/// (one multiply, one compare) to its position; the ids whose bucket is
/// taken go to a spill map. Position 0 lives inline (`first`), in the QP's
/// own allocation; positions 1.. in `rest`. A sole state (an RC pair's
/// usual case) is thus found with one compare, and a post or poll touches
/// no page of another allocation for it.
///
/// Invariants: positions are dense (`rest` is empty unless `first` is
/// set); every id is held at most once; for each position `i`, its id is
/// found at `i` through exactly one of: its bucket
/// (`direct[bucket(id)] == i + 1`) or `spill` (`spill[id] == i`); `direct`
/// entries are 0 (empty) or a position plus one.
pub(crate) struct VqpTable {
    /// Position 0.
    first: Option<(VqpId, VqpState)>,
    /// Positions 1..: position `i` at `rest[i - 1]`.
    rest: Vec<(VqpId, VqpState)>,
    direct: [u32; DIRECT],
    spill: IdMap<VqpId, u32>,
}

impl Default for VqpTable {
    fn default() -> VqpTable {
        VqpTable {
            first: None,
            rest: Vec::new(),
            direct: [0; DIRECT],
            spill: IdMap::default(),
        }
    }
}

impl VqpTable {
    #[inline]
    fn bucket(id: VqpId) -> usize {
        (id.get().wrapping_mul(0x9e37_79b1) >> (32 - DIRECT.trailing_zeros())) as usize
    }

    /// The (id, state) at position `i`, if there is one.
    #[inline]
    fn slot(&self, i: usize) -> Option<&(VqpId, VqpState)> {
        if i == 0 {
            self.first.as_ref()
        } else {
            self.rest.get(i.wrapping_sub(1))
        }
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> Option<&mut (VqpId, VqpState)> {
        if i == 0 {
            self.first.as_mut()
        } else {
            self.rest.get_mut(i.wrapping_sub(1))
        }
    }

    /// The position of `id`'s state, if held.
    #[inline]
    pub(crate) fn index(&self, id: VqpId) -> Option<usize> {
        if self.first.as_ref().is_some_and(|(i, _)| *i == id) {
            return Some(0);
        }
        self.index_rest(id)
    }

    /// [`VqpTable::index`] past position 0. An empty bucket (0) wraps to
    /// a position `rest` never has.
    #[inline]
    fn index_rest(&self, id: VqpId) -> Option<usize> {
        let d = (self.direct[Self::bucket(id)] as usize).wrapping_sub(1);
        match self.rest.get(d.wrapping_sub(1)) {
            Some((i, _)) if *i == id => Some(d),
            _ => self.index_spilled(id),
        }
    }

    /// `id`'s position and state, if held: position 0 with one compare.
    #[inline]
    pub(crate) fn find(&mut self, id: VqpId) -> Option<(usize, &mut VqpState)> {
        if self.first.as_ref().is_some_and(|(i, _)| *i == id) {
            return self.first.as_mut().map(|(_, st)| (0, st));
        }
        let i = self.index_rest(id)?;
        self.slot_mut(i).map(|(_, st)| (i, st))
    }

    #[cold]
    fn index_spilled(&self, id: VqpId) -> Option<usize> {
        if self.spill.is_empty() {
            return None;
        }
        self.spill.get(&id).map(|&i| i as usize)
    }

    /// The state at position `i` (from [`VqpTable::index`], no change
    /// since; `None` otherwise).
    #[inline]
    pub(crate) fn at(&mut self, i: usize) -> Option<&mut VqpState> {
        self.slot_mut(i).map(|(_, st)| st)
    }

    #[inline]
    pub(crate) fn get(&self, id: VqpId) -> Option<&VqpState> {
        self.index(id).and_then(|i| self.slot(i)).map(|(_, st)| st)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: VqpId) -> Option<&mut VqpState> {
        self.find(id).map(|(_, st)| st)
    }

    /// How many VQPs are held.
    fn count(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Records that `id` lives at position `i`.
    fn place(&mut self, id: VqpId, i: usize) {
        let b = Self::bucket(id);
        if self.direct[b] == 0 {
            self.direct[b] = i as u32 + 1;
        } else {
            self.spill.insert(id, i as u32);
        }
    }

    /// Forgets where `id` (at position `i`) lives.
    fn unplace(&mut self, id: VqpId, i: usize) {
        let b = Self::bucket(id);
        if self.direct[b] as usize == i + 1 {
            self.direct[b] = 0;
        } else {
            self.spill.remove(&id);
        }
    }

    /// Hands `id` its state (replacing one it had).
    pub(crate) fn insert(&mut self, id: VqpId, st: VqpState) {
        if let Some((_, held)) = self.find(id) {
            *held = st;
            return;
        }
        let i = self.count();
        if i == 0 {
            self.first = Some((id, st));
        } else {
            self.rest.push((id, st));
        }
        self.place(id, i);
    }

    /// Takes `id`'s state out (the last position's state moves to its
    /// position).
    pub(crate) fn remove(&mut self, id: VqpId) -> Option<VqpState> {
        let i = self.index(id)?;
        self.unplace(id, i);
        let last = self.count() - 1;
        let tail = if last == 0 {
            self.first.take()?
        } else {
            self.rest.pop()?
        };
        if i == last {
            return Some(tail.1);
        }
        // The last state moves to `i`.
        self.unplace(tail.0, last);
        self.place(tail.0, i);
        let slot = self.slot_mut(i)?;
        Some(std::mem::replace(slot, tail).1)
    }

    /// How many VQPs are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn id(n: u32) -> VqpId {
        VqpId::new(n).unwrap()
    }

    /// Checks every lookup of `t` against the reference `r` (ids 1..=max).
    fn same(t: &VqpTable, r: &HashMap<u32, u32>, max: u32) {
        assert_eq!(t.len(), r.len());
        for n in 1..=max {
            assert_eq!(
                t.get(id(n)).map(|s| s.capacity),
                r.get(&n).copied(),
                "vqp {n}"
            );
        }
    }

    #[test]
    fn the_table_agrees_with_a_map_through_inserts_removes_and_collisions() {
        // Ids spaced like a pool's round robin (many share a bucket, so
        // the spill map and the moves of `remove` are exercised), in a
        // fixed pseudo-random order of inserts and removes.
        let mut t = VqpTable::default();
        let mut r = HashMap::new();
        let max = 400;
        let mut x = 0x2545_f491_u32;
        for step in 0..5_000u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let n = 1 + (x % max);
            if x & 0x100 == 0 {
                t.insert(id(n), VqpState::new(step, Ungranted::Refuse));
                r.insert(n, step);
            } else {
                assert_eq!(
                    t.remove(id(n)).map(|s| s.capacity),
                    r.remove(&n),
                    "remove {n}"
                );
            }
            if step % 97 == 0 {
                same(&t, &r, max);
            }
        }
        same(&t, &r, max);
        for n in 1..=max {
            assert_eq!(t.remove(id(n)).map(|s| s.capacity), r.remove(&n));
        }
        same(&t, &r, max);
        assert!(t.spill.is_empty() && t.direct.iter().all(|&d| d == 0));
        assert!(t.first.is_none() && t.rest.is_empty());
    }

    #[test]
    fn index_finds_each_state_at_its_position() {
        let mut t = VqpTable::default();
        for n in [1, 9, 17, 25, 65, 129, 2] {
            t.insert(id(n), VqpState::new(n, Ungranted::Refuse));
        }
        for n in [1, 9, 17, 25, 65, 129, 2] {
            let i = t.index(id(n)).unwrap();
            assert_eq!(t.at(i).unwrap().capacity, n);
        }
        assert_eq!(t.index(id(3)), None);
        // Replacing keeps one entry.
        t.insert(id(9), VqpState::new(90, Ungranted::Refuse));
        assert_eq!(t.len(), 7);
        assert_eq!(t.get(id(9)).unwrap().capacity, 90);
    }
}
