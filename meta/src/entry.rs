//! One table entry: the 64-byte, little-endian record a client fetches with a
//! one-sided READ (as part of a bucket) and the server rewrites under a seqlock.
//!
//! # Layout (layout version [`crate::LAYOUT_VERSION`])
//!
//! ```text
//! offset size field
//!      0    8 version_head   u64  seqlock word: even = stable, odd = being written,
//!                                 0 = never written
//!      8   16 gid            [u8; 16]
//!     24    4 dct_num        u32
//!     28    2 lid            u16
//!     30    2 flags          u16  bit 0 = OCCUPIED, other bits must be 0
//!     32    8 dc_key         u64
//!     40    4 epoch          u32  != 0 when occupied
//!     44    4 checksum       u32  low 32 bits of xxh3_64(version || bytes 8..44 || bytes 48..56)
//!     48    8 lease_expiry   u64  server clock, ms
//!     56    8 version_tail   u64  copy of version_head
//! ```
//!
//! Every 8-byte word is 8-byte aligned inside the entry (and entries are
//! 64-byte aligned inside the table), so the server can write each word with one
//! atomic store. The checksum shares the word at offset 40 with the epoch.
//!
//! # Invariants of a stable entry (what [`EntryRepr::parse`] accepts)
//! - `version_head == version_tail`, and it is even.
//! - version 0: the slot was never written and all 64 bytes are zero (empty).
//! - version > 0: the checksum matches; `flags` has no unknown bit; when
//!   `OCCUPIED` is clear every field is zero (empty slot), when it is set the
//!   epoch is non-zero (an entry).
//!
//! How the two version copies and the checksum let a reader that copies the
//! whole entry in one READ detect a concurrent writer is described in
//! [`crate::table::SeqlockWrite`].

use crate::le::{get_gid, get_u16, get_u32, get_u64};
use krcore_nic::{DcTarget, Gid};
use xxhash_rust::xxh3::xxh3_64;

/// Size of one entry in bytes.
pub const ENTRY_LEN: usize = 64;

/// Named byte ranges of the entry layout.
pub mod field {
    use core::ops::Range;

    /// Seqlock word, first copy.
    pub const VERSION_HEAD: Range<usize> = 0..8;
    /// GID of the registered node.
    pub const GID: Range<usize> = 8..24;
    /// DCT number of the node.
    pub const DCT_NUM: Range<usize> = 24..28;
    /// LID of the node's port.
    pub const LID: Range<usize> = 28..30;
    /// Flags ([`super::FLAG_OCCUPIED`]).
    pub const FLAGS: Range<usize> = 30..32;
    /// DC key of the node's DCT.
    pub const DC_KEY: Range<usize> = 32..40;
    /// Registration epoch.
    pub const EPOCH: Range<usize> = 40..44;
    /// Checksum over the version and every other field.
    pub const CHECKSUM: Range<usize> = 44..48;
    /// Lease expiry (server clock, ms).
    pub const LEASE_EXPIRY: Range<usize> = 48..56;
    /// Seqlock word, second copy.
    pub const VERSION_TAIL: Range<usize> = 56..64;
}

/// Flag bit: the slot holds an entry.
pub const FLAG_OCCUPIED: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_OCCUPIED;

/// Why an entry's bytes do not hold a stable, valid entry.
///
/// [`EntryError::is_retryable`] tells a reader whether to READ again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// Fewer than [`ENTRY_LEN`] bytes.
    #[error("entry buffer of {len} bytes is shorter than {ENTRY_LEN}")]
    Truncated {
        /// Length of the buffer given.
        len: usize,
    },
    /// A writer was active while the bytes were copied: the version is odd or
    /// its two copies differ. Retry.
    #[error("torn entry: version head {head:#x}, tail {tail:#x}")]
    Torn {
        /// The first version copy.
        head: u64,
        /// The second version copy.
        tail: u64,
    },
    /// The slot is empty (never written, or deregistered).
    #[error("empty slot (version {version:#x})")]
    Empty {
        /// The slot's (even) version.
        version: u64,
    },
    /// The version is stable but the checksum does not match. With in-order
    /// READ execution this is corruption; RDMA does not formally order bytes
    /// inside one READ, so a reader may retry this a bounded number of times.
    #[error("entry checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The checksum in the entry.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
    /// The version is 0 (never written, so no checksum) but the other bytes
    /// are not all zero: the implicit integrity check of a never-written slot
    /// failed. Same cause and retry policy as [`EntryError::Checksum`] (a
    /// reader copying out of address order raced the slot's first write).
    #[error("never-written slot (version 0) holds non-zero bytes")]
    UnwrittenNotZero,
    /// The bytes are stable and the checksum matches but they break a layout
    /// invariant: unknown flags, an empty slot with fields set, an entry with
    /// epoch 0.
    #[error("malformed entry: {0}")]
    Malformed(&'static str),
}

impl EntryError {
    /// Whether reading the entry again may succeed: [`EntryError::Torn`] always;
    /// [`EntryError::Checksum`] and [`EntryError::UnwrittenNotZero`] a bounded
    /// number of times (see their docs).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EntryError::Torn { .. } | EntryError::Checksum { .. } | EntryError::UnwrittenNotZero
        )
    }
}

/// A checked view over the bytes of one entry.
///
/// Once [`EntryView::new_checked`] has accepted a buffer, no accessor can panic.
/// Only the first [`ENTRY_LEN`] bytes are used.
#[derive(Debug, Clone, Copy)]
pub struct EntryView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EntryView<T> {
    /// Wraps `buffer` without checking its length; accessors panic if it is
    /// shorter than [`ENTRY_LEN`]. Prefer [`EntryView::new_checked`].
    pub fn new_unchecked(buffer: T) -> EntryView<T> {
        EntryView { buffer }
    }

    /// Wraps `buffer` after checking that it holds at least [`ENTRY_LEN`] bytes.
    ///
    /// # Errors
    /// [`EntryError::Truncated`] when the buffer is too short.
    pub fn new_checked(buffer: T) -> Result<EntryView<T>, EntryError> {
        let v = EntryView::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks the buffer length (see [`EntryView::new_checked`]).
    ///
    /// # Errors
    /// [`EntryError::Truncated`] when the buffer is too short.
    pub fn check_len(&self) -> Result<(), EntryError> {
        let len = self.buffer.as_ref().len();
        if len < ENTRY_LEN {
            return Err(EntryError::Truncated { len });
        }
        Ok(())
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The first copy of the seqlock word.
    pub fn version_head(&self) -> u64 {
        get_u64(self.b(), field::VERSION_HEAD)
    }

    /// The second copy of the seqlock word.
    pub fn version_tail(&self) -> u64 {
        get_u64(self.b(), field::VERSION_TAIL)
    }

    /// The GID field.
    pub fn gid(&self) -> Gid {
        get_gid(self.b(), field::GID)
    }

    /// The DCT number field.
    pub fn dct_num(&self) -> u32 {
        get_u32(self.b(), field::DCT_NUM)
    }

    /// The LID field.
    pub fn lid(&self) -> u16 {
        get_u16(self.b(), field::LID)
    }

    /// The flags field.
    pub fn flags(&self) -> u16 {
        get_u16(self.b(), field::FLAGS)
    }

    /// The DC key field.
    pub fn dc_key(&self) -> u64 {
        get_u64(self.b(), field::DC_KEY)
    }

    /// The epoch field.
    pub fn epoch(&self) -> u32 {
        get_u32(self.b(), field::EPOCH)
    }

    /// The stored checksum.
    pub fn checksum(&self) -> u32 {
        get_u32(self.b(), field::CHECKSUM)
    }

    /// The lease expiry field (server clock, ms).
    pub fn lease_expiry_ms(&self) -> u64 {
        get_u64(self.b(), field::LEASE_EXPIRY)
    }

    /// The checksum the entry should carry for `version` and its other fields.
    pub fn compute_checksum(&self, version: u64) -> u32 {
        compute_checksum(&self.b()[..ENTRY_LEN], version)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EntryView<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets both copies of the seqlock word.
    pub fn set_version(&mut self, v: u64) {
        self.bm()[field::VERSION_HEAD].copy_from_slice(&v.to_le_bytes());
        self.bm()[field::VERSION_TAIL].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the first copy of the seqlock word only.
    pub fn set_version_head(&mut self, v: u64) {
        self.bm()[field::VERSION_HEAD].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the second copy of the seqlock word only.
    pub fn set_version_tail(&mut self, v: u64) {
        self.bm()[field::VERSION_TAIL].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the GID field.
    pub fn set_gid(&mut self, gid: &Gid) {
        self.bm()[field::GID].copy_from_slice(gid.as_bytes());
    }

    /// Sets the DCT number field.
    pub fn set_dct_num(&mut self, v: u32) {
        self.bm()[field::DCT_NUM].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the LID field.
    pub fn set_lid(&mut self, v: u16) {
        self.bm()[field::LID].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the flags field.
    pub fn set_flags(&mut self, v: u16) {
        self.bm()[field::FLAGS].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the DC key field.
    pub fn set_dc_key(&mut self, v: u64) {
        self.bm()[field::DC_KEY].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the epoch field.
    pub fn set_epoch(&mut self, v: u32) {
        self.bm()[field::EPOCH].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u32) {
        self.bm()[field::CHECKSUM].copy_from_slice(&v.to_le_bytes());
    }

    /// Sets the lease expiry field.
    pub fn set_lease_expiry_ms(&mut self, v: u64) {
        self.bm()[field::LEASE_EXPIRY].copy_from_slice(&v.to_le_bytes());
    }

    /// Recomputes and stores the checksum for `version` (the version copies
    /// themselves are not touched).
    pub fn fill_checksum(&mut self, version: u64) {
        let c = self.compute_checksum(version);
        self.set_checksum(c);
    }
}

/// The checksum of `entry` (at least [`ENTRY_LEN`] bytes) for `version`:
/// the low 32 bits of `xxh3_64(version_le || entry[8..44] || entry[48..56])`.
fn compute_checksum(entry: &[u8], version: u64) -> u32 {
    let mut buf = [0u8; 8 + 36 + 8];
    buf[..8].copy_from_slice(&version.to_le_bytes());
    buf[8..44].copy_from_slice(&entry[field::GID.start..field::CHECKSUM.start]);
    buf[44..].copy_from_slice(&entry[field::LEASE_EXPIRY]);
    xxh3_64(&buf) as u32
}

/// A parsed, occupied entry: the metadata of one registered node.
///
/// Invariant: `epoch != 0` (epoch 0 means "no registration").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryRepr {
    /// GID of the node's port (the key of the table).
    pub gid: Gid,
    /// DCT number of the node's DC target.
    pub dct_num: u32,
    /// DC key the node's DCT was created with.
    pub dc_key: u64,
    /// LID of the node's port (0 on RoCE).
    pub lid: u16,
    /// Registration epoch, bumped by the server on every (re-)registration, so
    /// a client holding a cached entry detects a restarted node.
    pub epoch: u32,
    /// Lease expiry on the server's clock (ms). Only the server compares it
    /// against a clock; clients may use it for diagnostics.
    pub lease_expiry_ms: u64,
}

impl EntryRepr {
    /// Parses a stable, occupied entry.
    ///
    /// Checks, in order: the seqlock copies (equal and even, else
    /// [`EntryError::Torn`]), the never-written slot (all zero, else
    /// [`EntryError::UnwrittenNotZero`]), the checksum, the flags, and emptiness.
    /// Never panics, whatever the bytes.
    ///
    /// # Errors
    /// See [`EntryError`]; [`EntryError::Empty`] for a free slot.
    pub fn parse<T: AsRef<[u8]>>(view: &EntryView<T>) -> Result<EntryRepr, EntryError> {
        view.check_len()?;
        let head = view.version_head();
        let tail = view.version_tail();
        if head != tail || head % 2 == 1 {
            return Err(EntryError::Torn { head, tail });
        }
        let version = head;
        if version == 0 {
            return if view.b()[..ENTRY_LEN].iter().all(|&b| b == 0) {
                Err(EntryError::Empty { version })
            } else {
                Err(EntryError::UnwrittenNotZero)
            };
        }
        let stored = view.checksum();
        let computed = view.compute_checksum(version);
        if stored != computed {
            return Err(EntryError::Checksum { stored, computed });
        }
        let flags = view.flags();
        if flags & !KNOWN_FLAGS != 0 {
            return Err(EntryError::Malformed("unknown flag bits"));
        }
        if flags & FLAG_OCCUPIED == 0 {
            let fields = &view.b()[field::GID.start..field::CHECKSUM.start];
            let lease = &view.b()[field::LEASE_EXPIRY];
            return if fields.iter().chain(lease).all(|&b| b == 0) {
                Err(EntryError::Empty { version })
            } else {
                Err(EntryError::Malformed("empty slot with fields set"))
            };
        }
        let epoch = view.epoch();
        if epoch == 0 {
            return Err(EntryError::Malformed("occupied entry with epoch 0"));
        }
        Ok(EntryRepr {
            gid: view.gid(),
            dct_num: view.dct_num(),
            dc_key: view.dc_key(),
            lid: view.lid(),
            epoch,
            lease_expiry_ms: view.lease_expiry_ms(),
        })
    }

    /// Writes this entry as a stable image with `version` (must be even and
    /// non-zero for the result to parse): both version copies, every field,
    /// `OCCUPIED`, and the checksum.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut EntryView<T>, version: u64) {
        view.set_gid(&self.gid);
        view.set_dct_num(self.dct_num);
        view.set_lid(self.lid);
        view.set_flags(FLAG_OCCUPIED);
        view.set_dc_key(self.dc_key);
        view.set_epoch(self.epoch);
        view.set_lease_expiry_ms(self.lease_expiry_ms);
        view.fill_checksum(version);
        view.set_version(version);
    }

    /// The stable image of this entry with `version` (see [`EntryRepr::emit`]).
    pub fn to_image(&self, version: u64) -> [u8; ENTRY_LEN] {
        let mut img = [0u8; ENTRY_LEN];
        self.emit(&mut EntryView::new_unchecked(&mut img[..]), version);
        img
    }

    /// The address a DC initiator needs to reach this node.
    pub fn dc_target(&self) -> DcTarget {
        DcTarget {
            gid: self.gid,
            dct_num: self.dct_num,
            dc_key: self.dc_key,
        }
    }
}

/// The stable image of an empty (deregistered) slot with `version`: every field
/// zero, `OCCUPIED` clear, a valid checksum. `version` 0 gives the all-zero
/// never-written image.
pub fn empty_image(version: u64) -> [u8; ENTRY_LEN] {
    let mut img = [0u8; ENTRY_LEN];
    if version != 0 {
        let mut v = EntryView::new_unchecked(&mut img[..]);
        v.fill_checksum(version);
        v.set_version(version);
    }
    img
}

// The field ranges tile exactly one entry.
const _: () = assert!(field::VERSION_TAIL.end == ENTRY_LEN);
