//! The table of a CQ's send queues by QP number, looked up once per send
//! completion.
//!
//! Open addressing with linear probing, indexed by the QP number's low bits:
//! QP numbers are allocated by the device in runs (rxe: 0x11, 0x12, ...;
//! mlx5 likewise), not chosen by an attacker, so consecutive numbers land in
//! consecutive slots and a hit is usually the first slot probed (a few
//! instructions, where SipHash or even hashbrown with a one-multiply hasher
//! cost ~25 of the ~200 a send completion cost in user space).
//!
//! Invariants: the capacity is a power of two and the table is at most half
//! full, so every probe sequence reaches an empty slot and `get` ends;
//! every entry lies between its home slot and the first empty slot after
//! it (removal shifts later entries back to keep this).

use super::send::SendShared;
use std::sync::Arc;

/// Smallest capacity.
const MIN_CAP: usize = 8;

pub(crate) struct QpTable<T = Arc<SendShared>> {
    slots: Box<[Option<(u32, T)>]>,
    len: usize,
}

impl<T> Default for QpTable<T> {
    fn default() -> Self {
        QpTable {
            slots: (0..MIN_CAP).map(|_| None).collect(),
            len: 0,
        }
    }
}

impl<T> QpTable<T> {
    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The entry of QP `qpn`.
    #[inline]
    pub(crate) fn get(&self, qpn: u32) -> Option<&T> {
        let mask = self.mask();
        let mut i = qpn as usize & mask;
        loop {
            debug_assert!(i < self.slots.len());
            // SAFETY: `slots.len()` is a power of two (never 0), so
            // `i <= mask = len - 1` is in bounds.
            match unsafe { self.slots.get_unchecked(i) } {
                Some((k, v)) if *k == qpn => return Some(v),
                Some(_) => i = (i + 1) & mask,
                None => return None,
            }
        }
    }

    /// Inserts or replaces the entry of `qpn`.
    pub(crate) fn insert(&mut self, qpn: u32, v: T) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = qpn as usize & mask;
        loop {
            match &mut self.slots[i] {
                Some((k, old)) if *k == qpn => {
                    *old = v;
                    return;
                }
                Some(_) => i = (i + 1) & mask,
                empty @ None => {
                    *empty = Some((qpn, v));
                    self.len += 1;
                    return;
                }
            }
        }
    }

    /// Removes the entry of `qpn`, if any.
    pub(crate) fn remove(&mut self, qpn: u32) -> Option<T> {
        let mask = self.mask();
        let mut i = qpn as usize & mask;
        loop {
            match &self.slots[i] {
                Some((k, _)) if *k == qpn => break,
                Some(_) => i = (i + 1) & mask,
                None => return None,
            }
        }
        let (_, v) = self.slots[i].take()?;
        self.len -= 1;
        // Backward shift: move every later entry of the run whose home slot
        // is not in (hole, j] into the hole, so lookups never stop early.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some((k, _)) = &self.slots[j] {
            let home = *k as usize & mask;
            // Distance from home to j vs from hole to j (cyclic).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
            j = (j + 1) & mask;
        }
        Some(v)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots).into_vec();
        self.slots = (0..old.len() * 2).map(|_| None).collect();
        self.len = 0;
        for (k, v) in old.into_iter().flatten() {
            self.insert(k, v);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    #[test]
    fn sequential_qpns_and_removal() {
        let mut t = QpTable::<u32>::default();
        for q in 0x11..0x11 + 100 {
            t.insert(q, q * 2);
        }
        assert_eq!(t.len(), 100);
        assert_eq!(t.get(0x11 + 50), Some(&((0x11 + 50) * 2)));
        assert_eq!(t.get(7), None);
        assert_eq!(t.remove(0x11 + 50), Some((0x11 + 50) * 2));
        assert_eq!(t.remove(0x11 + 50), None);
        assert_eq!(t.get(0x11 + 50), None);
        t.insert(0x11, 1);
        assert_eq!(t.get(0x11), Some(&1), "replaced");
        assert_eq!(t.len(), 99);
    }

    /// Random inserts and removals with colliding keys (a small key space
    /// spread over many high bits), checked against a `HashMap` after every
    /// step.
    #[test]
    fn matches_a_hashmap() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut t = QpTable::<u64>::default();
        let mut r = HashMap::new();
        for step in 0..20_000u64 {
            // Keys collide in the low bits on purpose.
            let k: u32 = rng.gen_range(0..64u32) * 8 + (rng.gen_range(0..4u32) << 20);
            if rng.gen_bool(0.55) {
                t.insert(k, step);
                r.insert(k, step);
            } else {
                assert_eq!(t.remove(k), r.remove(&k), "remove {k:#x} at {step}");
            }
            assert_eq!(t.len(), r.len());
            if step % 97 == 0 {
                for (k, v) in &r {
                    assert_eq!(t.get(*k), Some(v), "get {k:#x} at {step}");
                }
            }
            let probe: u32 = rng.gen_range(0..64u32) * 8 + (rng.gen_range(0..4u32) << 20);
            assert_eq!(t.get(probe), r.get(&probe));
        }
    }
}
