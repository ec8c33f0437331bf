//! The 8-byte slot word and the remote pointer it carries.
//!
//! ```text
//!  63        56 55        48 47        40 39                                0
//! +------------+------------+------------+-----------------------------------+
//! | fingerprint|  len (x64B)|  node id   |         offset (bytes)            |
//! +------------+------------+------------+-----------------------------------+
//!      8 bits       8 bits      8 bits                40 bits
//!                           \_______________ pointer, 48 bits ______________/
//! ```
//!
//! * `fingerprint`: 8 bits of the key's hash, never 0 for an occupied slot
//!   (see [`crate::hash`]), so the all-zero word [`Slot::EMPTY`] means empty.
//! * `len`: the KV block length in 64 B units, 1..=255 (64 B..=16320 B).
//! * pointer: a memory-node id (8 bits, up to 256 memory nodes) and a byte
//!   offset (40 bits, 1 TiB) relative to the base of that node's registered
//!   region. It is an offset, not a virtual address: the client adds the base
//!   address it learned for the node.
//!
//! Slots only ever change by a 64-bit CAS on the whole word, which is stored
//! little-endian in the bucket.
//!
//! ## The frozen bit
//! KV blocks are allocated 64 B aligned, so bit 0 of a pointer to a KV block
//! is always 0. The client uses that bit of the slot word as a *frozen* mark
//! ([`SLOT_FROZEN`]): a subtable being split has every slot frozen (the empty
//! slot becomes the word [`SLOT_FROZEN`]), so that no writer's CAS, which
//! always expects an unfrozen word, can succeed on it any more. Readers mask
//! the bit off ([`Slot::thawed`]) and keep reading frozen slots normally.
//!
//! ## The tentative bit
//! Bit 1 of the offset is free for the same reason. An inserter installs
//! its copy of a key *tentative* ([`SLOT_TENTATIVE`]): a claim that readers,
//! updates, deletes and scans ignore, and that only becomes the key's value
//! when its owner clears the bit with one more CAS (commits it) after
//! seeing no other copy of the key in the way (the protocol is in
//! `client::protocol`). [`Slot::ptr`] masks both flag bits.

use core::num::NonZeroU8;

use crate::layout::error::{LayoutError, Result};

/// Size of a slot in bytes.
pub const SLOT_SIZE: usize = 8;
/// Bit position of the fingerprint field.
pub const FP_SHIFT: u32 = 56;
/// Bit position of the length field.
pub const LEN_SHIFT: u32 = 48;
/// Width of the pointer field (node id + offset).
pub const PTR_BITS: u32 = 48;
/// Width of the memory-node id inside the pointer.
pub const NODE_BITS: u32 = 8;
/// Width of the byte offset inside the pointer.
pub const OFFSET_BITS: u32 = 40;
/// Bit position of the node id inside the pointer.
pub const NODE_SHIFT: u32 = OFFSET_BITS;
/// Largest byte offset a pointer can carry (1 TiB - 1).
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;
/// Mask of the pointer field.
pub const PTR_MASK: u64 = (1 << PTR_BITS) - 1;
/// Unit of the length field, and the alignment of KV block lengths.
pub const LEN_UNIT: usize = 64;
/// Largest value of the length field (255 units = 16320 B).
pub const MAX_LEN_UNITS: u8 = u8::MAX;
/// The frozen bit (bit 0 of the offset, which a 64 B aligned KV block never
/// uses); see the module docs. The frozen empty slot is exactly this word.
pub const SLOT_FROZEN: u64 = 1;
/// The tentative bit (bit 1 of the offset, also never used by a 64 B
/// aligned KV block): an insert's copy not committed yet; see the module
/// docs.
pub const SLOT_TENTATIVE: u64 = 2;
/// The flag bits of a slot word ([`SLOT_FROZEN`], [`SLOT_TENTATIVE`]).
pub const SLOT_FLAGS: u64 = SLOT_FROZEN | SLOT_TENTATIVE;

/// A location in the disaggregated memory: a memory node and a byte offset
/// into that node's registered region.
///
/// Invariant: `offset <= MAX_OFFSET`. Ordered by `(node, offset)`, which is the
/// "lowest slot address" order used to break ties between duplicate inserts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemotePtr {
    node: u8,
    offset: u64,
}

impl RemotePtr {
    /// A pointer to `offset` on memory node `node`.
    ///
    /// # Errors
    /// [`LayoutError::OffsetOutOfRange`] if `offset` needs more than 40 bits.
    pub const fn new(node: u8, offset: u64) -> Result<Self> {
        if offset > MAX_OFFSET {
            return Err(LayoutError::OffsetOutOfRange { offset });
        }
        Ok(Self { node, offset })
    }

    /// The memory-node id.
    pub const fn node(self) -> u8 {
        self.node
    }

    /// The byte offset into the node's region.
    pub const fn offset(self) -> u64 {
        self.offset
    }

    /// The 48-bit packed form `node << 40 | offset`.
    pub const fn to_bits(self) -> u64 {
        ((self.node as u64) << NODE_SHIFT) | self.offset
    }

    /// Unpacks the low 48 bits of `bits`; higher bits are ignored. Total: any
    /// 48-bit pattern is a pointer.
    pub const fn from_bits(bits: u64) -> Self {
        Self {
            node: ((bits >> NODE_SHIFT) & 0xff) as u8,
            offset: bits & MAX_OFFSET,
        }
    }

    /// The pointer `delta` bytes further on the same node.
    ///
    /// # Errors
    /// [`LayoutError::OffsetOutOfRange`] if the result leaves the 40-bit range.
    pub const fn add(self, delta: u64) -> Result<Self> {
        match self.offset.checked_add(delta) {
            Some(offset) => Self::new(self.node, offset),
            None => Err(LayoutError::OffsetOutOfRange { offset: u64::MAX }),
        }
    }
}

/// The 64-bit slot word: `fp 8 | len 8 | pointer 48` (see the module docs).
///
/// Any `u64` is representable, because slots are read from untrusted memory;
/// [`Slot::validate`] tells an empty or well-formed word from garbage. Slots
/// built with [`Slot::new`] or [`Slot::for_block`] are always well formed and
/// never equal to [`Slot::EMPTY`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Slot(u64);

impl Slot {
    /// The empty slot (all zero bits).
    pub const EMPTY: Slot = Slot(0);

    /// An occupied slot: fingerprint, block length in 64 B units, pointer.
    ///
    /// # Errors
    /// [`LayoutError::BlockLenOutOfRange`] if `len_units` is 0.
    pub const fn new(fp: NonZeroU8, len_units: u8, ptr: RemotePtr) -> Result<Self> {
        if len_units == 0 {
            return Err(LayoutError::BlockLenOutOfRange { bytes: 0 });
        }
        Ok(Slot(
            ((fp.get() as u64) << FP_SHIFT) | ((len_units as u64) << LEN_SHIFT) | ptr.to_bits(),
        ))
    }

    /// An occupied slot for a KV block of `block_len` bytes.
    ///
    /// # Errors
    /// [`LayoutError::BlockLenOutOfRange`] unless `block_len` is a multiple of
    /// 64 in `64..=16320`.
    pub const fn for_block(fp: NonZeroU8, block_len: usize, ptr: RemotePtr) -> Result<Self> {
        match len_units(block_len) {
            Ok(units) => Self::new(fp, units, ptr),
            Err(e) => Err(e),
        }
    }

    /// Reinterprets a raw word (as read from remote memory). Never fails.
    pub const fn from_raw(raw: u64) -> Self {
        Slot(raw)
    }

    /// The raw word, as stored and as used for CAS.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether this is the empty slot.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fingerprint field (0 only in an empty or malformed slot).
    pub const fn fingerprint(self) -> u8 {
        (self.0 >> FP_SHIFT) as u8
    }

    /// The length field, in 64 B units.
    pub const fn len_units(self) -> u8 {
        (self.0 >> LEN_SHIFT) as u8
    }

    /// The KV block length in bytes (`len_units * 64`), the size to READ.
    pub const fn block_len(self) -> usize {
        self.len_units() as usize * LEN_UNIT
    }

    /// The pointer field, without the flag bits ([`SLOT_FLAGS`]: a slot
    /// points to a 64 B aligned KV block).
    pub const fn ptr(self) -> RemotePtr {
        RemotePtr::from_bits(self.0 & PTR_MASK & !SLOT_FLAGS)
    }

    /// Whether this slot is occupied with fingerprint `fp` (frozen or not).
    pub const fn matches(self, fp: NonZeroU8) -> bool {
        self.fingerprint() == fp.get()
    }

    /// Whether the frozen bit is set (see the module docs).
    pub const fn is_frozen(self) -> bool {
        self.0 & SLOT_FROZEN != 0
    }

    /// This word with the frozen bit set.
    pub const fn frozen(self) -> Self {
        Slot(self.0 | SLOT_FROZEN)
    }

    /// This word with the frozen bit cleared: the slot as it was before its
    /// subtable was frozen (what readers use).
    pub const fn thawed(self) -> Self {
        Slot(self.0 & !SLOT_FROZEN)
    }

    /// This word without its flag bits (frozen, tentative): the same for
    /// every state of one copy.
    pub const fn plain(self) -> Self {
        Slot(self.0 & !SLOT_FLAGS)
    }

    /// Whether the tentative bit is set: an insert's copy that its owner
    /// has not committed (see the module docs).
    pub const fn is_tentative(self) -> bool {
        self.0 & SLOT_TENTATIVE != 0
    }

    /// This word with the tentative bit set.
    pub const fn tentative(self) -> Self {
        Slot(self.0 | SLOT_TENTATIVE)
    }

    /// This word with the tentative bit cleared: the copy committed.
    pub const fn committed(self) -> Self {
        Slot(self.0 & !SLOT_TENTATIVE)
    }

    /// Checks that the word is either [`Slot::EMPTY`], the frozen empty slot
    /// [`SLOT_FROZEN`], or well formed (fingerprint and length both non-zero,
    /// frozen or not).
    ///
    /// # Errors
    /// [`LayoutError::MalformedSlot`] otherwise.
    pub const fn validate(self) -> Result<Self> {
        if self.thawed().is_empty() {
            return Ok(self);
        }
        if self.fingerprint() == 0 {
            return Err(LayoutError::MalformedSlot {
                raw: self.0,
                reason: "non-empty slot with fingerprint 0",
            });
        }
        if self.len_units() == 0 {
            return Err(LayoutError::MalformedSlot {
                raw: self.0,
                reason: "non-empty slot with length 0",
            });
        }
        Ok(self)
    }

    /// The little-endian bytes stored in the bucket.
    pub const fn to_le_bytes(self) -> [u8; SLOT_SIZE] {
        self.0.to_le_bytes()
    }

    /// The slot stored in little-endian `bytes`.
    pub const fn from_le_bytes(bytes: [u8; SLOT_SIZE]) -> Self {
        Slot(u64::from_le_bytes(bytes))
    }
}

/// The length field for a KV block of `block_len` bytes.
///
/// # Errors
/// [`LayoutError::BlockLenOutOfRange`] unless `block_len` is a multiple of 64
/// in `64..=16320`.
pub const fn len_units(block_len: usize) -> Result<u8> {
    if block_len == 0 || block_len % LEN_UNIT != 0 || block_len > MAX_LEN_UNITS as usize * LEN_UNIT
    {
        return Err(LayoutError::BlockLenOutOfRange { bytes: block_len });
    }
    Ok((block_len / LEN_UNIT) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(v: u8) -> NonZeroU8 {
        NonZeroU8::new(v).unwrap()
    }

    #[test]
    fn pointer_bounds() {
        let p = RemotePtr::new(255, MAX_OFFSET).unwrap();
        assert_eq!(p.to_bits(), PTR_MASK);
        assert_eq!(RemotePtr::from_bits(p.to_bits()), p);
        assert_eq!(
            RemotePtr::new(0, MAX_OFFSET + 1),
            Err(LayoutError::OffsetOutOfRange {
                offset: MAX_OFFSET + 1
            })
        );
        assert_eq!(RemotePtr::from_bits(u64::MAX), p);
        let q = RemotePtr::new(3, 100).unwrap();
        assert_eq!(q.add(28).unwrap(), RemotePtr::new(3, 128).unwrap());
        assert!(p.add(1).is_err());
        assert!(q.add(u64::MAX).is_err());
        // Order is (node, offset).
        assert!(RemotePtr::new(0, MAX_OFFSET).unwrap() < RemotePtr::new(1, 0).unwrap());
    }

    #[test]
    fn slot_round_trip_and_bit_positions() {
        let ptr = RemotePtr::new(0xAB, 0x12_3456_7890).unwrap();
        let s = Slot::new(fp(0xCD), 0xEF, ptr).unwrap();
        assert_eq!(s.raw(), 0xCDEF_AB12_3456_7890);
        assert_eq!(s.fingerprint(), 0xCD);
        assert_eq!(s.len_units(), 0xEF);
        assert_eq!(s.block_len(), 0xEF * 64);
        assert_eq!(s.ptr(), ptr);
        assert!(s.matches(fp(0xCD)));
        assert!(!s.matches(fp(0xCE)));
        assert!(!s.is_empty());
        assert_eq!(s.validate(), Ok(s));
        assert_eq!(Slot::from_le_bytes(s.to_le_bytes()), s);
        assert_eq!(s.to_le_bytes()[7], 0xCD);
    }

    #[test]
    fn slot_boundaries() {
        let zero = RemotePtr::default();
        let min = Slot::new(fp(1), 1, zero).unwrap();
        assert_eq!(min.raw(), 0x0101_0000_0000_0000);
        let max = Slot::new(fp(255), 255, RemotePtr::new(255, MAX_OFFSET).unwrap()).unwrap();
        assert_eq!(max.raw(), u64::MAX);
        assert_eq!(max.block_len(), 16320);
        assert_eq!(
            Slot::new(fp(1), 0, zero),
            Err(LayoutError::BlockLenOutOfRange { bytes: 0 })
        );
    }

    #[test]
    fn slot_for_block_lengths() {
        let ptr = RemotePtr::new(1, 64).unwrap();
        assert_eq!(Slot::for_block(fp(9), 64, ptr).unwrap().len_units(), 1);
        assert_eq!(Slot::for_block(fp(9), 16320, ptr).unwrap().len_units(), 255);
        for bad in [0, 1, 63, 65, 16321, 16384, usize::MAX] {
            assert_eq!(
                Slot::for_block(fp(9), bad, ptr),
                Err(LayoutError::BlockLenOutOfRange { bytes: bad }),
                "{bad}"
            );
        }
    }

    #[test]
    fn validate_rejects_garbage() {
        assert_eq!(Slot::EMPTY.validate(), Ok(Slot::EMPTY));
        assert!(Slot::EMPTY.is_empty());
        // Fingerprint 0 with other bits set.
        assert!(matches!(
            Slot::from_raw(0x0001_0000_0000_0040).validate(),
            Err(LayoutError::MalformedSlot { .. })
        ));
        // Length 0 with a fingerprint.
        assert!(matches!(
            Slot::from_raw(0x0700_0000_0000_0040).validate(),
            Err(LayoutError::MalformedSlot { .. })
        ));
    }

    #[test]
    fn frozen_bit() {
        let s = Slot::new(fp(9), 2, RemotePtr::new(3, 4096).unwrap()).unwrap();
        assert!(!s.is_frozen());
        let f = s.frozen();
        assert!(f.is_frozen() && !f.is_empty());
        assert_eq!(f.raw(), s.raw() | 1);
        assert_eq!(f.thawed(), s);
        assert_eq!((f.fingerprint(), f.len_units()), (9, 2));
        assert_eq!(f.validate(), Ok(f));
        let fe = Slot::EMPTY.frozen();
        assert_eq!(fe.raw(), SLOT_FROZEN);
        assert!(fe.is_frozen() && !fe.is_empty() && fe.thawed().is_empty());
        assert_eq!(fe.validate(), Ok(fe));
        // Frozen garbage is still garbage.
        assert!(Slot::from_raw(0x0001_0000_0000_0041).validate().is_err());
    }

    #[test]
    fn tentative_bit() {
        let ptr = RemotePtr::new(3, 4096).unwrap();
        let s = Slot::new(fp(9), 2, ptr).unwrap();
        assert!(!s.is_tentative());
        let t = s.tentative();
        assert!(t.is_tentative() && !t.is_frozen());
        assert_eq!(t.raw(), s.raw() | SLOT_TENTATIVE);
        assert_eq!((t.ptr(), t.committed()), (ptr, s));
        assert_eq!(t.validate(), Ok(t));
        // Frozen and tentative are independent; the pointer masks both.
        let ft = t.frozen();
        assert!(ft.is_frozen() && ft.is_tentative());
        assert_eq!(
            (ft.ptr(), ft.thawed(), ft.thawed().committed()),
            (ptr, t, s)
        );
    }
}
