//! wr_id routing: the physical `wr_id`.
//!
//! Many VQPs share one physical QP and one CQ, so the `wr_id` the NIC sees
//! cannot be the user's. The engine posts a [`PhysWrId`] instead: the owning
//! VQP and a sequence number, packed in 64 bits. The engine's sequence is
//! the physical QP's own (its count of posted WRs): the user's `wr_id` and
//! whether the *user* asked for a completion ([`Slot`]) are kept beside the
//! QP's record of the WR (see [`crate::credits`] and the engine's
//! `physqp`), so a completion finds both with one index.
//!
//! # Layout of a physical wr_id
//!
//! ```text
//!  63            40 39                                   0
//! +----------------+--------------------------------------+
//! |  VQP id (24)   |  QP sequence, mod 2^40 (40)          |
//! +----------------+--------------------------------------+
//! ```
//!
//! - 24 bits of VQP id. Id 0 ([`VqpId::ENGINE`]) and the largest id
//!   ([`VqpId::MAX`], the engine's meta READs) are not given to user VQPs,
//!   which get ids from 1: at most 2^24 - 2 per node.
//! - 40 bits of sequence: the low bits of the QP's 64-bit count of posted
//!   WRs. Never more than a `u32` count of sequences is outstanding, far
//!   below 2^40, so the full sequence is recovered from the 40 bits without
//!   ambiguity ([`crate::SendQueueCredits::resolve`]).
//!
//! Every 64-bit value decodes (there is no invalid encoding): an unexpected
//! `wr_id` is caught by the QP's account, which only resolves outstanding
//! sequences.

use std::fmt;

/// Bits of the VQP id in a physical wr_id.
pub const VQP_ID_BITS: u32 = 24;
/// Bits of the QP sequence in a physical wr_id.
pub const SEQ_BITS: u32 = 40;
/// Mask of the sequence bits.
pub const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Errors of wr_id encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WrIdError {
    /// A VQP id does not fit in [`VQP_ID_BITS`].
    #[error("VQP id {0} does not fit in {VQP_ID_BITS} bits")]
    VqpIdTooLarge(u32),
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

    /// The sequence, mod 2^40; [`crate::SendQueueCredits::resolve`] widens
    /// it.
    pub const fn wire_seq(self) -> u64 {
        self.0 & SEQ_MASK
    }
}

/// What the engine keeps beside the record of one outstanding WR of a VQP.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Slot {
    /// The `wr_id` the user gave.
    pub user_wr_id: u64,
    /// Whether the user asked for a completion. The engine may signal a WR the
    /// user left unsignaled (pre-check); that completion is not the user's.
    pub user_signaled: bool,
}

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
}
