//! [`Suffix`]: the identity of a subtable (the directory hashes it holds),
//! stored in every bucket header. A leaf of the layout: the buckets and the
//! subtables both name it (re-exported as
//! [`crate::layout::subtable::Suffix`]).

use crate::layout::error::{LayoutError, Result};
use crate::layout::{low_mask, MAX_GLOBAL_DEPTH};

/// The set of directory hashes whose low `depth` bits equal `bits`: the
/// identity of a subtable, stored in every bucket header.
///
/// Invariants: `depth <= MAX_GLOBAL_DEPTH` and `bits < 2^depth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Suffix {
    bits: u32,
    depth: u8,
}

impl Suffix {
    /// The suffix of depth 0, which contains every hash (the first subtable).
    pub const ROOT: Suffix = Suffix { bits: 0, depth: 0 };

    /// The suffix `bits` of depth `depth`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `depth > MAX_GLOBAL_DEPTH`,
    /// [`LayoutError::SuffixOutOfRange`] if `bits >= 2^depth`.
    pub const fn new(bits: u32, depth: u8) -> Result<Self> {
        if depth > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: depth as u32,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        if bits as u64 & !low_mask(depth) != 0 {
            return Err(LayoutError::SuffixOutOfRange {
                suffix: bits,
                depth,
            });
        }
        Ok(Self { bits, depth })
    }

    /// Validates the raw `{local_depth, suffix}` fields of a bucket header.
    ///
    /// # Errors
    /// As [`Suffix::new`], for any `local_depth` above the maximum.
    pub const fn from_header(local_depth: u32, suffix: u32) -> Result<Self> {
        if local_depth > MAX_GLOBAL_DEPTH as u32 {
            return Err(LayoutError::DepthOutOfRange {
                depth: local_depth,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        Self::new(suffix, local_depth as u8)
    }

    /// The suffix of depth `depth` that contains `dir_hash`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `depth > MAX_GLOBAL_DEPTH`.
    pub const fn of_hash(dir_hash: u64, depth: u8) -> Result<Self> {
        if depth > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: depth as u32,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        Ok(Self {
            bits: (dir_hash & low_mask(depth)) as u32,
            depth,
        })
    }

    /// The suffix bits.
    pub const fn bits(self) -> u32 {
        self.bits
    }

    /// The depth (number of significant bits).
    pub const fn depth(self) -> u8 {
        self.depth
    }

    /// Whether `dir_hash` ends in this suffix.
    pub const fn contains(self, dir_hash: u64) -> bool {
        dir_hash & low_mask(self.depth) == self.bits as u64
    }

    /// Whether every hash in `other` is also in `self` (`self` is a prefix).
    pub const fn covers(self, other: Suffix) -> bool {
        other.depth >= self.depth && self.contains(other.bits as u64)
    }

    /// The two halves one level deeper: `(bit d = 0, bit d = 1)`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if the depth is already the maximum.
    pub const fn split(self) -> Result<(Suffix, Suffix)> {
        if self.depth >= MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: self.depth as u32 + 1,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        let depth = self.depth + 1;
        Ok((
            Suffix {
                bits: self.bits,
                depth,
            },
            Suffix {
                bits: self.bits | (1 << self.depth),
                depth,
            },
        ))
    }
}
