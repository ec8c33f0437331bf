//! wr_id routing: the physical `wr_id` and the per-VQP slot table.
//!
//! Many VQPs share one physical QP and one CQ, so the `wr_id` the NIC sees
//! cannot be the user's. The engine posts a [`PhysWrId`] instead: the owning
//! VQP and a sequence number, packed in 64 bits. The engine's sequence is
//! the physical QP's own (its count of posted WRs): the user's `wr_id` and
//! whether the *user* asked for a completion are kept beside the QP's
//! record of the WR (see [`crate::credits`] and the engine's `physqp`), so
//! a completion finds both with one index. A [`SlotTable`] is the per-VQP
//! alternative (a VQP's own sequence -> [`Slot`]), for hosts that keep a
//! table per VQP (the `loom-tests` upgrade model does).
//!
//! # Layout of a physical wr_id
//!
//! ```text
//!  63            40 39                                   0
//! +----------------+--------------------------------------+
//! |  VQP id (24)   |  per-VQP sequence, mod 2^40 (40)     |
//! +----------------+--------------------------------------+
//! ```
//!
//! - 24 bits of VQP id: 16,777,215 VQPs per node. Id 0 is reserved
//!   ([`VqpId::ENGINE`]) for WRs the engine posts on its own behalf (meta
//!   READs, a signaled filler WR); user VQPs get ids from 1.
//! - 40 bits of sequence: the low bits of a 64-bit sequence counter (the
//!   QP's, or a slot table's). Never more than a `u32` count of sequences
//!   is outstanding, far below 2^40, so the full sequence is recovered from
//!   the 40 bits without ambiguity
//!   ([`crate::SendQueueCredits::resolve`], [`SlotTable::resolve`]).
//!
//! Every 64-bit value decodes (there is no invalid encoding): an unexpected
//! `wr_id` is caught by the slot table, which only resolves outstanding
//! sequences.
//!
//! # Slot table invariants
//!
//! - Sequences are handed out in order: `head <= seq < tail`, `tail - head <=
//!   capacity`; slot `seq mod L` (`L`: `capacity` rounded up to a power of
//!   two) holds sequence `seq` while it is outstanding.
//! - Retirement is in order and only of outstanding sequences
//!   ([`SlotTable::retire_through`]): a VQP's WRs all go to one physical QP at a
//!   time, whose send queue completes in order. Retiring twice, or retiring a
//!   sequence never handed out, is a typed error and changes nothing.

use std::fmt;

use krcore_nic::{SendFlags, SendWr};

/// Bits of the VQP id in a physical wr_id.
pub const VQP_ID_BITS: u32 = 24;
/// Bits of the per-VQP sequence in a physical wr_id.
pub const SEQ_BITS: u32 = 40;
/// Mask of the sequence bits.
pub const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Errors of wr_id encoding and of the slot table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WrIdError {
    /// A VQP id does not fit in [`VQP_ID_BITS`].
    #[error("VQP id {0} does not fit in {VQP_ID_BITS} bits")]
    VqpIdTooLarge(u32),
    /// The VQP already has `capacity` WRs outstanding.
    #[error("VQP slot table full ({capacity} outstanding WRs)")]
    SlotsFull {
        /// The table's capacity.
        capacity: u32,
    },
    /// A sequence that is not outstanding: already retired (`seq < head`) or
    /// never handed out (`seq >= tail`).
    #[error("sequence {seq} is not outstanding (outstanding: {head}..{tail})")]
    NotOutstanding {
        /// The sequence asked for.
        seq: u64,
        /// Oldest outstanding sequence.
        head: u64,
        /// Next sequence to hand out.
        tail: u64,
    },
}

/// A virtual QP's id, unique per node, [`VQP_ID_BITS`] wide.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct VqpId(u32);

impl VqpId {
    /// The id reserved for WRs the engine posts for itself.
    pub const ENGINE: VqpId = VqpId(0);
    /// The largest id.
    pub const MAX: VqpId = VqpId((1 << VQP_ID_BITS) - 1);

    /// An id from its number.
    ///
    /// # Errors
    /// [`WrIdError::VqpIdTooLarge`] past [`VqpId::MAX`].
    pub const fn new(id: u32) -> Result<VqpId, WrIdError> {
        if id > VqpId::MAX.0 {
            Err(WrIdError::VqpIdTooLarge(id))
        } else {
            Ok(VqpId(id))
        }
    }

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for VqpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vqp#{}", self.0)
    }
}

/// A physical `wr_id`: (VQP id, sequence mod 2^40), see the module docs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PhysWrId(u64);

impl PhysWrId {
    /// Packs `vqp` and the low [`SEQ_BITS`] of `seq`.
    pub const fn new(vqp: VqpId, seq: u64) -> PhysWrId {
        PhysWrId(((vqp.0 as u64) << SEQ_BITS) | (seq & SEQ_MASK))
    }

    /// Reads a `wr_id` from a completion. Every value decodes.
    pub const fn from_raw(raw: u64) -> PhysWrId {
        PhysWrId(raw)
    }

    /// The value to put in [`krcore_nic::SendWr::wr_id`].
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The owning VQP.
    pub const fn vqp(self) -> VqpId {
        VqpId((self.0 >> SEQ_BITS) as u32)
    }

    /// The sequence, mod 2^40; [`SlotTable::resolve`] widens it.
    pub const fn wire_seq(self) -> u64 {
        self.0 & SEQ_MASK
    }
}

/// What a slot remembers about one outstanding WR of a VQP.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Slot {
    /// The `wr_id` the user gave.
    pub user_wr_id: u64,
    /// Whether the user asked for a completion. The engine may signal a WR the
    /// user left unsignaled (pre-check); that completion is not the user's.
    pub user_signaled: bool,
}

/// The per-VQP table from sequence to [`Slot`], with a fixed capacity: the
/// VQP's limit of outstanding WRs. A ring; no allocation after construction.
#[derive(Clone)]
pub struct SlotTable {
    /// A power of two at least `capacity` long (indexing is a mask, not a
    /// division); only `capacity` slots are ever outstanding.
    slots: Box<[Slot]>,
    capacity: u32,
    /// Oldest outstanding sequence.
    head: u64,
    /// Next sequence to hand out.
    tail: u64,
}

impl fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotTable")
            .field("capacity", &self.capacity())
            .field("head", &self.head)
            .field("tail", &self.tail)
            .finish()
    }
}

impl SlotTable {
    /// A table for up to `capacity` outstanding WRs, starting at sequence 0.
    ///
    /// # Panics
    /// If `capacity` is 0 (a configuration bug).
    pub fn new(capacity: u32) -> SlotTable {
        SlotTable::starting_at(capacity, 0)
    }

    /// A table whose first sequence is `first` (useful to test wrap-around).
    ///
    /// # Panics
    /// If `capacity` is 0.
    pub fn starting_at(capacity: u32, first: u64) -> SlotTable {
        assert!(capacity > 0, "a slot table needs a capacity of at least 1");
        SlotTable {
            slots: vec![Slot::default(); (capacity as usize).next_power_of_two()]
                .into_boxed_slice(),
            capacity,
            head: first,
            tail: first,
        }
    }

    /// Most WRs outstanding at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// WRs outstanding.
    pub fn outstanding(&self) -> u32 {
        (self.tail - self.head) as u32
    }

    /// Slots free.
    pub fn free(&self) -> u32 {
        self.capacity() - self.outstanding()
    }

    /// Oldest outstanding sequence (== [`SlotTable::next_seq`] when empty).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The sequence the next [`SlotTable::push`] returns.
    pub fn next_seq(&self) -> u64 {
        self.tail
    }

    #[inline]
    fn index(&self, seq: u64) -> usize {
        (seq as usize) & (self.slots.len() - 1)
    }

    /// Records a WR and returns its sequence.
    ///
    /// # Errors
    /// [`WrIdError::SlotsFull`] when `capacity` WRs are outstanding.
    pub fn push(&mut self, user_wr_id: u64, user_signaled: bool) -> Result<u64, WrIdError> {
        if self.free() == 0 {
            return Err(WrIdError::SlotsFull {
                capacity: self.capacity(),
            });
        }
        let seq = self.tail;
        let i = self.index(seq);
        self.slots[i] = Slot {
            user_wr_id,
            user_signaled,
        };
        self.tail += 1;
        Ok(seq)
    }

    /// Records a doorbell of WRs of the VQP `vqp`, all or nothing: each WR's
    /// user wr_id and signal flag go to a slot, and its `wr_id` becomes
    /// the physical one ([`PhysWrId`]). Returns the first sequence; the WRs
    /// hold `first..first + wrs.len()`. [`SlotTable::restore`] gives the
    /// caller its values back.
    ///
    /// # Errors
    /// [`WrIdError::SlotsFull`] when fewer than `wrs.len()` slots are free;
    /// nothing is recorded then.
    #[inline]
    pub fn record(&mut self, vqp: VqpId, wrs: &mut [SendWr]) -> Result<u64, WrIdError> {
        if wrs.len() > self.free() as usize {
            return Err(WrIdError::SlotsFull {
                capacity: self.capacity(),
            });
        }
        let first = self.tail;
        let mask = self.slots.len() - 1;
        for (i, wr) in wrs.iter_mut().enumerate() {
            let seq = first + i as u64;
            self.slots[(seq as usize) & mask] = Slot {
                user_wr_id: wr.wr_id,
                user_signaled: wr.is_signaled(),
            };
            wr.wr_id = PhysWrId::new(vqp, seq).raw();
        }
        self.tail = first + wrs.len() as u64;
        Ok(first)
    }

    /// Puts back into `wrs` the user wr_ids and signal flags recorded at
    /// sequences `first..` ([`SlotTable::record`]): the WRs read as the
    /// user wrote them (the engine may have forced a signal). WRs past
    /// the outstanding sequences are left as they are.
    #[inline]
    pub fn restore(&self, first: u64, wrs: &mut [SendWr]) {
        let mask = self.slots.len() - 1;
        let known = self.tail.saturating_sub(first).min(wrs.len() as u64) as usize;
        if first < self.head {
            return;
        }
        for (i, wr) in wrs[..known].iter_mut().enumerate() {
            let slot = self.slots[((first as usize) + i) & mask];
            wr.wr_id = slot.user_wr_id;
            if !slot.user_signaled {
                wr.flags = SendFlags(wr.flags.0 & !SendFlags::SIGNALED.0);
            }
        }
    }

    /// Undoes the last `n` pushes (the post they were for was refused).
    ///
    /// # Panics
    /// If fewer than `n` WRs are outstanding.
    pub fn unpush(&mut self, n: u32) {
        assert!(
            n <= self.outstanding(),
            "unpush past the oldest outstanding WR"
        );
        self.tail -= u64::from(n);
    }

    /// The full sequence of an outstanding WR from the 40 bits of a physical
    /// wr_id; `None` when no outstanding sequence has those low bits.
    pub fn resolve(&self, wire_seq: u64) -> Option<u64> {
        let delta = wire_seq.wrapping_sub(self.head) & SEQ_MASK;
        (delta < self.tail - self.head).then_some(self.head + delta)
    }

    /// The slot of an outstanding sequence.
    pub fn get(&self, seq: u64) -> Option<Slot> {
        (self.head..self.tail)
            .contains(&seq)
            .then(|| self.slots[self.index(seq)])
    }

    /// Retires every outstanding WR up to and including `seq`, oldest first.
    ///
    /// The returned iterator yields `(seq, slot)`; dropping it early still
    /// retires them all.
    ///
    /// # Errors
    /// [`WrIdError::NotOutstanding`] when `seq` was already retired or never
    /// handed out; nothing is retired then.
    pub fn retire_through(&mut self, seq: u64) -> Result<RetiredSlots<'_>, WrIdError> {
        if !(self.head..self.tail).contains(&seq) {
            return Err(WrIdError::NotOutstanding {
                seq,
                head: self.head,
                tail: self.tail,
            });
        }
        let from = self.head;
        self.head = seq + 1;
        Ok(RetiredSlots {
            slots: &self.slots,
            next: from,
            end: seq + 1,
        })
    }

    /// Retires every outstanding WR (the VQP is torn down, or its QP reset and
    /// the caller re-posts them under new sequences).
    pub fn retire_all(&mut self) -> RetiredSlots<'_> {
        let from = self.head;
        self.head = self.tail;
        RetiredSlots {
            slots: &self.slots,
            next: from,
            end: self.tail,
        }
    }
}

/// Slots retired by [`SlotTable::retire_through`], oldest first.
#[derive(Debug)]
pub struct RetiredSlots<'a> {
    slots: &'a [Slot],
    next: u64,
    end: u64,
}

impl Iterator for RetiredSlots<'_> {
    type Item = (u64, Slot);

    fn next(&mut self) -> Option<(u64, Slot)> {
        if self.next == self.end {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        Some((seq, self.slots[(seq as usize) & (self.slots.len() - 1)]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for RetiredSlots<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vqp_id_width() {
        assert_eq!(VqpId::new(0).unwrap(), VqpId::ENGINE);
        assert_eq!(VqpId::new((1 << 24) - 1).unwrap(), VqpId::MAX);
        assert_eq!(VqpId::new(1 << 24), Err(WrIdError::VqpIdTooLarge(1 << 24)));
    }

    #[test]
    fn encode_decode_roundtrip() {
        for (id, seq) in [
            (0, 0),
            (1, 1),
            (VqpId::MAX.get(), SEQ_MASK),
            (77, 12345678901),
        ] {
            let vqp = VqpId::new(id).unwrap();
            let w = PhysWrId::new(vqp, seq);
            let back = PhysWrId::from_raw(w.raw());
            assert_eq!(back.vqp(), vqp);
            assert_eq!(back.wire_seq(), seq & SEQ_MASK);
        }
        // The sequence wraps at 2^40 and never spills into the VQP id.
        let w = PhysWrId::new(VqpId::new(5).unwrap(), (1 << SEQ_BITS) + 3);
        assert_eq!(w.vqp().get(), 5);
        assert_eq!(w.wire_seq(), 3);
        assert_eq!(PhysWrId::from_raw(u64::MAX).vqp(), VqpId::MAX);
    }

    #[test]
    fn slot_table_fifo_and_capacity() {
        let mut t = SlotTable::new(3);
        assert_eq!(t.push(100, true), Ok(0));
        assert_eq!(t.push(101, false), Ok(1));
        assert_eq!(t.push(102, true), Ok(2));
        assert_eq!(t.push(103, true), Err(WrIdError::SlotsFull { capacity: 3 }));
        assert_eq!(t.free(), 0);
        assert_eq!(
            t.get(1),
            Some(Slot {
                user_wr_id: 101,
                user_signaled: false
            })
        );
        let retired: Vec<_> = t.retire_through(1).unwrap().collect();
        assert_eq!(retired.len(), 2);
        assert_eq!(retired[0].1.user_wr_id, 100);
        assert_eq!(
            retired[1],
            (
                1,
                Slot {
                    user_wr_id: 101,
                    user_signaled: false
                }
            )
        );
        assert_eq!(t.outstanding(), 1);
        assert_eq!(t.push(103, true), Ok(3));
        assert_eq!(t.get(3).unwrap().user_wr_id, 103);
        assert_eq!(t.get(2).unwrap().user_wr_id, 102);
        assert_eq!(t.get(1), None);
    }

    #[test]
    fn retire_rejects_double_and_future() {
        let mut t = SlotTable::new(4);
        t.push(1, true).unwrap();
        t.push(2, true).unwrap();
        t.retire_through(0).unwrap();
        let err = t.retire_through(0).unwrap_err();
        assert_eq!(
            err,
            WrIdError::NotOutstanding {
                seq: 0,
                head: 1,
                tail: 2
            }
        );
        let err = t.retire_through(2).unwrap_err();
        assert_eq!(
            err,
            WrIdError::NotOutstanding {
                seq: 2,
                head: 1,
                tail: 2
            }
        );
        // Nothing changed.
        assert_eq!(t.outstanding(), 1);
        assert_eq!(t.retire_through(1).unwrap().len(), 1);
    }

    #[test]
    fn dropping_the_iterator_still_retires() {
        let mut t = SlotTable::new(4);
        for i in 0..4 {
            t.push(i, false).unwrap();
        }
        let _ = t.retire_through(2).unwrap();
        assert_eq!(t.head(), 3);
        assert_eq!(t.retire_all().map(|(s, _)| s).collect::<Vec<_>>(), vec![3]);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn resolve_across_the_40_bit_wrap() {
        let first = (1 << SEQ_BITS) - 2;
        let mut t = SlotTable::starting_at(8, first);
        let seqs: Vec<u64> = (0..4).map(|i| t.push(i, true).unwrap()).collect();
        assert_eq!(seqs, vec![first, first + 1, first + 2, first + 3]);
        let vqp = VqpId::new(9).unwrap();
        for &s in &seqs {
            let wire = PhysWrId::new(vqp, s).wire_seq();
            assert_eq!(t.resolve(wire), Some(s));
        }
        // Low bits of a sequence that is not outstanding do not resolve.
        assert_eq!(t.resolve(PhysWrId::new(vqp, first + 4).wire_seq()), None);
        assert_eq!(t.resolve(PhysWrId::new(vqp, first - 1).wire_seq()), None);
        t.retire_through(first + 1).unwrap();
        assert_eq!(t.resolve(PhysWrId::new(vqp, first).wire_seq()), None);
        assert_eq!(
            t.resolve(PhysWrId::new(vqp, first + 2).wire_seq()),
            Some(first + 2)
        );
    }

    #[test]
    fn unpush_rolls_back_a_refused_post() {
        let mut t = SlotTable::new(4);
        t.push(1, true).unwrap();
        t.push(2, true).unwrap();
        t.push(3, true).unwrap();
        t.unpush(2);
        assert_eq!(t.next_seq(), 1);
        assert_eq!(t.push(9, false), Ok(1));
        assert_eq!(t.get(1).unwrap().user_wr_id, 9);
    }

    #[test]
    fn record_rewrites_wr_ids_and_restore_gives_them_back() {
        use krcore_nic::{RemoteAddr, Sge};
        let vqp = VqpId::new(7).unwrap();
        let mut t = SlotTable::starting_at(3, (1 << SEQ_BITS) - 1);
        let wr = |id, sig| SendWr::read(id, Sge::default(), RemoteAddr::default()).signaled(sig);
        let mut wrs = [wr(10, false), wr(11, true)];
        let first = t.record(vqp, &mut wrs).unwrap();
        assert_eq!(first, (1 << SEQ_BITS) - 1);
        assert_eq!(wrs[0].wr_id, PhysWrId::new(vqp, first).raw());
        assert_eq!(wrs[1].wr_id, PhysWrId::new(vqp, first + 1).raw());
        assert_eq!(
            t.get(first + 1).unwrap(),
            Slot {
                user_wr_id: 11,
                user_signaled: true
            }
        );
        // The engine forces a signal on the first; restore undoes it.
        wrs[0].flags = wrs[0].flags | SendFlags::SIGNALED;
        t.restore(first, &mut wrs);
        assert_eq!((wrs[0].wr_id, wrs[0].is_signaled()), (10, false));
        assert_eq!((wrs[1].wr_id, wrs[1].is_signaled()), (11, true));
        // Two more do not fit in a capacity of 3: nothing is recorded.
        let mut more = [wr(12, true), wr(13, true)];
        assert_eq!(
            t.record(vqp, &mut more),
            Err(WrIdError::SlotsFull { capacity: 3 })
        );
        assert_eq!((t.outstanding(), more[0].wr_id), (2, 12));
    }
}
