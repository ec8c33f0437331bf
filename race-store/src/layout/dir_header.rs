//! The directory header word: global depth and a leased resize lock.
//!
//! ```text
//!  63  62                       24 23             8 7  6 5          0
//! +---+---------------------------+----------------+----+------------+
//! | L |  lease expiry (39 bits)   | owner (16 bits)| 00 |global depth|
//! +---+---------------------------+----------------+----+------------+
//! ```
//!
//! * `L`: the resize lock. A client that doubles the directory (or otherwise
//!   needs the whole directory stable) takes it with one CAS.
//! * `owner`: the id of the client holding the lock.
//! * `lease expiry`: when the holder's lock may be broken, in coarse ticks of
//!   a clock the clients share (e.g. milliseconds since a cluster epoch: 39
//!   bits last 17 years). Clients' clocks need only agree to within the
//!   margin a caller adds to its lease; this module never reads a clock, the
//!   caller passes `now`.
//! * `global depth`: 6 bits, at most [`MAX_GLOBAL_DEPTH`].
//!
//! An unlocked header is canonical: owner, lease and reserved bits are zero, so
//! the word of an unlocked directory is just its global depth, and a lock CAS
//! expects exactly that. Because owner and expiry are inside the CASed word,
//! breaking an expired lock is also one CAS from the exact word observed: of
//! several clients racing to break it, one wins; and a crashed holder that
//! comes back cannot unlock or renew a lock it lost (its expected word is gone).

use crate::layout::error::{LayoutError, Result};
use crate::layout::MAX_GLOBAL_DEPTH;

/// The lock bit.
pub const HDR_LOCK: u64 = 1 << 63;
/// Bit position of the lease expiry.
pub const HDR_LEASE_SHIFT: u32 = 24;
/// Width of the lease expiry.
pub const HDR_LEASE_BITS: u32 = 39;
/// Largest lease expiry, in ticks.
pub const MAX_LEASE_TICKS: u64 = (1 << HDR_LEASE_BITS) - 1;
/// Bit position of the owner id.
pub const HDR_OWNER_SHIFT: u32 = 8;
/// Width of the owner id.
pub const HDR_OWNER_BITS: u32 = 16;
/// Width of the global depth field.
pub const HDR_DEPTH_BITS: u32 = 6;
/// Mask of the reserved bits (6 and 7), which must be zero.
pub const HDR_RESERVED_MASK: u64 = 0b1100_0000;
const DEPTH_MASK: u64 = (1 << HDR_DEPTH_BITS) - 1;
const OWNER_MASK: u64 = (1 << HDR_OWNER_BITS) - 1;

/// The directory header word (see the module docs for the bits).
///
/// Any `u64` is representable, because the word is read from remote memory;
/// [`DirHeader::validate`] checks it. Headers built by the constructors here
/// are always valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirHeader(u64);

/// What a client that wants the resize lock should do, given the header it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockDecision {
    /// The lock is free: CAS the observed word to `new`.
    Acquire {
        /// The locked header to install.
        new: DirHeader,
    },
    /// The holder's lease has expired: CAS the observed word to `new` to
    /// break its lock. The broken holder may have left a resize half done.
    Steal {
        /// The locked header to install.
        new: DirHeader,
        /// The owner whose lease expired.
        previous_owner: u16,
    },
    /// Held under a live lease; retry later (not before `expiry`).
    Busy {
        /// The holder.
        owner: u16,
        /// When its lease expires, in ticks.
        expiry: u64,
    },
}

impl DirHeader {
    /// The unlocked header of a directory at `global_depth`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `global_depth > MAX_GLOBAL_DEPTH`.
    pub const fn unlocked(global_depth: u8) -> Result<Self> {
        if global_depth > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: global_depth as u32,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        Ok(Self(global_depth as u64))
    }

    /// The header locked by `owner` until `expiry`, at `global_depth`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] or [`LayoutError::LeaseOutOfRange`].
    pub const fn locked(global_depth: u8, owner: u16, expiry: u64) -> Result<Self> {
        if expiry > MAX_LEASE_TICKS {
            return Err(LayoutError::LeaseOutOfRange { ticks: expiry });
        }
        match Self::unlocked(global_depth) {
            Ok(h) => Ok(Self(
                h.0 | HDR_LOCK | (expiry << HDR_LEASE_SHIFT) | ((owner as u64) << HDR_OWNER_SHIFT),
            )),
            Err(e) => Err(e),
        }
    }

    /// Reinterprets a raw word. Never fails.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw word, as stored and CASed.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The global depth field.
    pub const fn global_depth(self) -> u8 {
        (self.0 & DEPTH_MASK) as u8
    }

    /// Whether the lock bit is set.
    pub const fn is_locked(self) -> bool {
        self.0 & HDR_LOCK != 0
    }

    /// The owner field (0 when unlocked).
    pub const fn owner(self) -> u16 {
        ((self.0 >> HDR_OWNER_SHIFT) & OWNER_MASK) as u16
    }

    /// The lease expiry field, in ticks (0 when unlocked).
    pub const fn lease_expiry(self) -> u64 {
        (self.0 >> HDR_LEASE_SHIFT) & MAX_LEASE_TICKS
    }

    /// Whether the header is locked and its lease has expired at `now`.
    pub const fn lease_expired(self, now: u64) -> bool {
        self.is_locked() && now >= self.lease_expiry()
    }

    /// Checks the word: depth in range, reserved bits zero, and an unlocked
    /// word canonical (no owner, no lease).
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] or [`LayoutError::MalformedDirWord`].
    pub const fn validate(self) -> Result<Self> {
        if self.global_depth() > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: self.global_depth() as u32,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        if self.0 & HDR_RESERVED_MASK != 0 {
            return Err(LayoutError::MalformedDirWord {
                raw: self.0,
                reason: "reserved header bits set",
            });
        }
        if !self.is_locked() && self.0 != self.global_depth() as u64 {
            return Err(LayoutError::MalformedDirWord {
                raw: self.0,
                reason: "unlocked header with owner or lease bits",
            });
        }
        Ok(self)
    }

    /// Decides how `owner` can take the lock at `now` for `lease_ticks`.
    ///
    /// # Errors
    /// [`LayoutError::LeaseOutOfRange`] if `now + lease_ticks` overflows the
    /// lease field, or the errors of [`DirHeader::validate`] for a garbage word.
    pub const fn try_lock(self, owner: u16, now: u64, lease_ticks: u64) -> Result<LockDecision> {
        if let Err(e) = self.validate() {
            return Err(e);
        }
        if self.is_locked() && !self.lease_expired(now) {
            return Ok(LockDecision::Busy {
                owner: self.owner(),
                expiry: self.lease_expiry(),
            });
        }
        let new = match Self::locked(self.global_depth(), owner, expiry(now, lease_ticks)) {
            Ok(new) => new,
            Err(e) => return Err(e),
        };
        if self.is_locked() {
            Ok(LockDecision::Steal {
                new,
                previous_owner: self.owner(),
            })
        } else {
            Ok(LockDecision::Acquire { new })
        }
    }

    /// The header with `owner`'s lease extended to `now + lease_ticks` (CAS
    /// the observed word to it).
    ///
    /// # Errors
    /// [`LayoutError::NotLockOwner`] if the header is not locked by `owner`,
    /// [`LayoutError::LeaseOutOfRange`] if the expiry overflows.
    pub const fn renew(self, owner: u16, now: u64, lease_ticks: u64) -> Result<Self> {
        if !self.is_locked() || self.owner() != owner {
            return Err(LayoutError::NotLockOwner { owner });
        }
        Self::locked(self.global_depth(), owner, expiry(now, lease_ticks))
    }

    /// The unlocked header at `new_global_depth` that `owner` installs to
    /// release the lock (after a doubling, `new_global_depth` is one more).
    ///
    /// # Errors
    /// [`LayoutError::NotLockOwner`] or [`LayoutError::DepthOutOfRange`].
    pub const fn unlock(self, owner: u16, new_global_depth: u8) -> Result<Self> {
        if !self.is_locked() || self.owner() != owner {
            return Err(LayoutError::NotLockOwner { owner });
        }
        Self::unlocked(new_global_depth)
    }
}

/// `now + lease`, saturated to a value that `DirHeader::locked` rejects.
const fn expiry(now: u64, lease_ticks: u64) -> u64 {
    now.saturating_add(lease_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_positions() {
        let h = DirHeader::locked(5, 0xBEEF, 0x12_3456_789A).unwrap();
        assert_eq!(
            h.raw(),
            (1 << 63) | (0x12_3456_789A << 24) | (0xBEEF << 8) | 5
        );
        assert_eq!(h.global_depth(), 5);
        assert_eq!(h.owner(), 0xBEEF);
        assert_eq!(h.lease_expiry(), 0x12_3456_789A);
        assert!(h.is_locked());
        assert_eq!(h.validate(), Ok(h));
        let u = DirHeader::unlocked(MAX_GLOBAL_DEPTH).unwrap();
        assert_eq!(u.raw(), 20);
        assert!(!u.is_locked());
        assert_eq!((u.owner(), u.lease_expiry()), (0, 0));
        let max = DirHeader::locked(MAX_GLOBAL_DEPTH, u16::MAX, MAX_LEASE_TICKS).unwrap();
        assert_eq!(max.raw() & HDR_RESERVED_MASK, 0);
        assert_eq!(max.lease_expiry(), MAX_LEASE_TICKS);
        assert_eq!(max.owner(), u16::MAX);
    }

    #[test]
    fn construction_errors() {
        assert_eq!(
            DirHeader::unlocked(21),
            Err(LayoutError::DepthOutOfRange { depth: 21, max: 20 })
        );
        assert_eq!(
            DirHeader::locked(1, 1, MAX_LEASE_TICKS + 1),
            Err(LayoutError::LeaseOutOfRange {
                ticks: MAX_LEASE_TICKS + 1
            })
        );
        assert!(DirHeader::locked(21, 1, 1).is_err());
    }

    #[test]
    fn validate_rejects_garbage() {
        for raw in [21, 63, 0x40, 0x80, 0x100 | 3, 1 << 30] {
            assert!(DirHeader::from_raw(raw).validate().is_err(), "{raw:#x}");
        }
        assert_eq!(
            DirHeader::from_raw(3).validate(),
            Ok(DirHeader::from_raw(3))
        );
        // Locked with owner 0 and lease 0 is legal (owner 0 is a valid id).
        let h = DirHeader::from_raw(HDR_LOCK | 3);
        assert_eq!(h.validate(), Ok(h));
    }

    #[test]
    fn lock_lifecycle() {
        let free = DirHeader::unlocked(4).unwrap();
        let LockDecision::Acquire { new: held } = free.try_lock(7, 1000, 50).unwrap() else {
            panic!("free lock must be acquirable");
        };
        assert_eq!(held, DirHeader::locked(4, 7, 1050).unwrap());
        // Another client sees a live lease.
        assert_eq!(
            held.try_lock(8, 1049, 50),
            Ok(LockDecision::Busy {
                owner: 7,
                expiry: 1050
            })
        );
        assert!(!held.lease_expired(1049));
        assert!(held.lease_expired(1050));
        // The holder renews.
        let renewed = held.renew(7, 1040, 50).unwrap();
        assert_eq!(renewed.lease_expiry(), 1090);
        assert_eq!(
            held.renew(8, 1040, 50),
            Err(LayoutError::NotLockOwner { owner: 8 })
        );
        // The lease expires and client 8 breaks the lock.
        assert_eq!(
            renewed.try_lock(8, 1090, 50),
            Ok(LockDecision::Steal {
                new: DirHeader::locked(4, 8, 1140).unwrap(),
                previous_owner: 7
            })
        );
        // The holder unlocks after a doubling.
        assert_eq!(renewed.unlock(7, 5), DirHeader::unlocked(5));
        assert_eq!(
            renewed.unlock(9, 5),
            Err(LayoutError::NotLockOwner { owner: 9 })
        );
        assert_eq!(
            free.unlock(7, 4),
            Err(LayoutError::NotLockOwner { owner: 7 })
        );
        assert_eq!(
            free.renew(7, 0, 1),
            Err(LayoutError::NotLockOwner { owner: 7 })
        );
        assert!(matches!(
            renewed.unlock(7, 21),
            Err(LayoutError::DepthOutOfRange { .. })
        ));
    }

    #[test]
    fn lock_errors() {
        let free = DirHeader::unlocked(1).unwrap();
        assert!(matches!(
            free.try_lock(1, MAX_LEASE_TICKS, 1),
            Err(LayoutError::LeaseOutOfRange { .. })
        ));
        assert!(matches!(
            free.try_lock(1, u64::MAX, u64::MAX),
            Err(LayoutError::LeaseOutOfRange { ticks: u64::MAX })
        ));
        assert!(DirHeader::from_raw(0x80).try_lock(1, 0, 1).is_err());
        let held = DirHeader::locked(1, 1, 10).unwrap();
        assert!(matches!(
            held.renew(1, MAX_LEASE_TICKS, 1),
            Err(LayoutError::LeaseOutOfRange { .. })
        ));
    }
}
