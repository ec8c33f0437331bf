//! The directory: a header word and `2^global_depth` entry words, as a
//! checked view, a parsed `Repr`, and a consistency check. The index
//! arithmetic of splits and doubling is in [`crate::layout::extendible`].
//!
//! ```text
//! directory image
//! 0        8                64      72      80
//! +--------+----------------+-------+-------+-----+------------------+
//! | header |  zero padding  | e[0]  | e[1]  | ... | e[2^g - 1]       |
//! +--------+----------------+-------+-------+-----+------------------+
//!
//! entry word (u64, little-endian)
//!  63  62          54 53     48 47        40 39                      0
//! +---+--------------+---------+------------+-------------------------+
//! | L | reserved (0) | local d |  node id   |  offset (bytes)         |
//! +---+--------------+---------+------------+-------------------------+
//! ```
//!
//! The header word has its own cache line (see [`crate::layout::dir_header`]).
//! Entry `i` points to the subtable holding every key whose directory hash
//! ends in the low `g` bits `i`. A subtable of local depth `d` and suffix `s`
//! is pointed to by the `2^(g-d)` entries `s + k * 2^d`
//! ([`crate::layout::extendible::entries_of`]).
//! The entry lock bit `L` marks a subtable being split; it has no lease of its
//! own (a client protocol that must survive a crashed splitter takes the
//! header lease as well).
//!
//! Invariants of a consistent directory ([`DirectoryRepr::check_consistency`]):
//! every entry has `local_depth <= global_depth`; all entries that agree on
//! their low `d` bits (`d` = the local depth) carry the same pointer and depth;
//! and no pointer is shared by two different suffixes.

use std::collections::HashMap;

use crate::layout::dir_header::DirHeader;
use crate::layout::error::{LayoutError, Result};
use crate::layout::slot::{RemotePtr, PTR_MASK};
use crate::layout::subtable::Suffix;
use crate::layout::{low_mask, read_u64, write_array, MAX_GLOBAL_DEPTH};

/// Offset of entry 0 from the directory base (the header has a cache line).
pub const DIR_ENTRIES_OFFSET: usize = 64;
/// Size of a directory entry.
pub const DIR_ENTRY_SIZE: usize = 8;
/// The entry lock bit.
pub const ENTRY_LOCK: u64 = 1 << 63;
/// Bit position of the entry's local depth.
pub const ENTRY_DEPTH_SHIFT: u32 = 48;
/// Mask of the reserved entry bits (54..=62), which must be zero.
pub const ENTRY_RESERVED_MASK: u64 = ((1 << 9) - 1) << 54;
const ENTRY_DEPTH_MASK: u64 = (1 << 6) - 1;

/// Bytes of a directory image at `global_depth`.
///
/// # Errors
/// [`LayoutError::DepthOutOfRange`] if `global_depth > MAX_GLOBAL_DEPTH`.
pub const fn directory_len(global_depth: u8) -> Result<usize> {
    if global_depth > MAX_GLOBAL_DEPTH {
        return Err(LayoutError::DepthOutOfRange {
            depth: global_depth as u32,
            max: MAX_GLOBAL_DEPTH,
        });
    }
    Ok(DIR_ENTRIES_OFFSET + (DIR_ENTRY_SIZE << global_depth))
}

/// Bytes of a directory image at the maximum global depth (what a memory node
/// reserves so that the directory can double in place).
pub const MAX_DIRECTORY_LEN: usize = DIR_ENTRIES_OFFSET + (DIR_ENTRY_SIZE << MAX_GLOBAL_DEPTH);

/// Offset of entry `index` from the directory base.
///
/// # Errors
/// [`LayoutError::DirIndexOutOfRange`] if `index >= 2^MAX_GLOBAL_DEPTH`.
pub const fn entry_offset(index: usize) -> Result<usize> {
    if index >> MAX_GLOBAL_DEPTH != 0 {
        return Err(LayoutError::DirIndexOutOfRange {
            index,
            global_depth: MAX_GLOBAL_DEPTH,
        });
    }
    Ok(DIR_ENTRIES_OFFSET + index * DIR_ENTRY_SIZE)
}

/// A directory entry word (see the module docs for the bits).
///
/// Any `u64` is representable; [`DirEntry::validate`] checks one read from
/// remote memory. Entries built by [`DirEntry::new`] are valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirEntry(u64);

impl DirEntry {
    /// An unlocked entry pointing to a subtable of `local_depth` at `ptr`.
    ///
    /// # Errors
    /// [`LayoutError::DepthOutOfRange`] if `local_depth > MAX_GLOBAL_DEPTH`.
    pub const fn new(local_depth: u8, ptr: RemotePtr) -> Result<Self> {
        if local_depth > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: local_depth as u32,
                max: MAX_GLOBAL_DEPTH,
            });
        }
        Ok(Self(
            ((local_depth as u64) << ENTRY_DEPTH_SHIFT) | ptr.to_bits(),
        ))
    }

    /// Reinterprets a raw word. Never fails.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw word, as stored and CASed.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether the lock bit is set.
    pub const fn is_locked(self) -> bool {
        self.0 & ENTRY_LOCK != 0
    }

    /// The entry with the lock bit set or cleared.
    pub const fn with_lock(self, locked: bool) -> Self {
        if locked {
            Self(self.0 | ENTRY_LOCK)
        } else {
            Self(self.0 & !ENTRY_LOCK)
        }
    }

    /// The local depth of the subtable.
    pub const fn local_depth(self) -> u8 {
        ((self.0 >> ENTRY_DEPTH_SHIFT) & ENTRY_DEPTH_MASK) as u8
    }

    /// The subtable's location.
    pub const fn ptr(self) -> RemotePtr {
        RemotePtr::from_bits(self.0 & PTR_MASK)
    }

    /// Checks the word against the directory's `global_depth`.
    ///
    /// # Errors
    /// [`LayoutError::MalformedDirWord`] for reserved bits,
    /// [`LayoutError::LocalDepthExceedsGlobal`] for a depth above `global_depth`.
    pub const fn validate(self, global_depth: u8) -> Result<Self> {
        if self.0 & ENTRY_RESERVED_MASK != 0 {
            return Err(LayoutError::MalformedDirWord {
                raw: self.0,
                reason: "reserved entry bits set",
            });
        }
        if self.local_depth() > global_depth {
            return Err(LayoutError::LocalDepthExceedsGlobal {
                local: self.local_depth(),
                global: global_depth,
            });
        }
        Ok(self)
    }

    /// Whether two entries name the same subtable at the same depth (the lock
    /// bit is ignored).
    pub const fn same_target(self, other: DirEntry) -> bool {
        (self.0 & !ENTRY_LOCK) == (other.0 & !ENTRY_LOCK)
    }
}

/// A checked view of a directory image.
///
/// Invariant after [`Directory::new_checked`]: the header was valid and the
/// buffer holds all `2^global_depth` entries. Accessors never panic, even if
/// the header is later rewritten through [`Directory::set_header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directory<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Directory<T> {
    /// Wraps `buffer` after validating the header and the length it implies.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`], or the errors of [`DirHeader::validate`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let got = buffer.as_ref().len();
        if got < DIR_ENTRIES_OFFSET {
            return Err(LayoutError::Truncated {
                what: "directory header",
                need: DIR_ENTRIES_OFFSET,
                got,
            });
        }
        let header = DirHeader::from_raw(read_u64(buffer.as_ref(), 0)).validate()?;
        let need = directory_len(header.global_depth())?;
        if got < need {
            return Err(LayoutError::Truncated {
                what: "directory",
                need,
                got,
            });
        }
        Ok(Self { buffer })
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The header word (validated at construction, raw afterwards).
    pub fn header(&self) -> DirHeader {
        DirHeader::from_raw(read_u64(self.buffer.as_ref(), 0))
    }

    /// Entry words the buffer has room for (up to `2^MAX_GLOBAL_DEPTH`).
    pub fn capacity(&self) -> usize {
        let room = self
            .buffer
            .as_ref()
            .len()
            .saturating_sub(DIR_ENTRIES_OFFSET)
            / DIR_ENTRY_SIZE;
        room.min(1 << MAX_GLOBAL_DEPTH)
    }

    /// Number of live entries: `2^global_depth` (bounded by the capacity).
    pub fn len(&self) -> usize {
        let depth = self.header().global_depth().min(MAX_GLOBAL_DEPTH);
        (1usize << depth).min(self.capacity())
    }

    /// Whether there are no live entries (only for a rewritten, garbage header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `index` (unvalidated), or `None` if `index >= len()`.
    pub fn entry(&self, index: usize) -> Option<DirEntry> {
        if index >= self.len() {
            return None;
        }
        let at = DIR_ENTRIES_OFFSET + index * DIR_ENTRY_SIZE;
        Some(DirEntry::from_raw(read_u64(self.buffer.as_ref(), at)))
    }

    /// The entry for a key with directory hash `dir_hash`.
    pub fn lookup(&self, dir_hash: u64) -> Option<DirEntry> {
        let depth = self.header().global_depth().min(MAX_GLOBAL_DEPTH);
        self.entry((dir_hash & low_mask(depth)) as usize)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Directory<T> {
    /// Writes the header word.
    pub fn set_header(&mut self, header: DirHeader) {
        write_array(self.buffer.as_mut(), 0, header.raw().to_le_bytes());
    }

    /// Writes entry `index`; any index below [`Directory::capacity`] is
    /// allowed, so that a doubling can fill the upper half first.
    ///
    /// # Errors
    /// [`LayoutError::DirIndexOutOfRange`] if `index >= capacity()`.
    pub fn set_entry(&mut self, index: usize, entry: DirEntry) -> Result<()> {
        if index >= self.capacity() {
            return Err(LayoutError::DirIndexOutOfRange {
                index,
                global_depth: self.header().global_depth(),
            });
        }
        let at = DIR_ENTRIES_OFFSET + index * DIR_ENTRY_SIZE;
        write_array(self.buffer.as_mut(), at, entry.raw().to_le_bytes());
        Ok(())
    }
}

/// A parsed, validated directory.
///
/// Invariant: `entries.len() == 2^header.global_depth()` and every entry
/// validates against that depth. Consistency across entries is checked
/// separately ([`DirectoryRepr::check_consistency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryRepr {
    /// The header word.
    pub header: DirHeader,
    /// The `2^global_depth` entries.
    pub entries: Vec<DirEntry>,
}

impl DirectoryRepr {
    /// A directory of depth 0 with one subtable at `root`.
    pub fn new(root: RemotePtr) -> Self {
        Self {
            header: DirHeader::default(),
            entries: vec![DirEntry(root.to_bits())],
        }
    }

    /// Parses a directory view, validating every entry.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`] if the view holds fewer entries than the
    /// header says, or the errors of the header and entry validation.
    pub fn parse<T: AsRef<[u8]>>(dir: &Directory<T>) -> Result<Self> {
        let header = dir.header().validate()?;
        let g = header.global_depth();
        let need = 1usize << g;
        if dir.len() < need {
            return Err(LayoutError::Truncated {
                what: "directory",
                need: directory_len(g)?,
                got: DIR_ENTRIES_OFFSET + dir.len() * DIR_ENTRY_SIZE,
            });
        }
        let entries = (0..need)
            .map(|i| dir.entry(i).unwrap_or_default().validate(g))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { header, entries })
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        DIR_ENTRIES_OFFSET + self.entries.len() * DIR_ENTRY_SIZE
    }

    /// Writes the directory image (header, zero padding, entries) into `buf`.
    ///
    /// # Errors
    /// [`LayoutError::BufferTooSmall`] if `buf` is shorter than `buffer_len()`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let need = self.buffer_len();
        let Some(out) = buf.get_mut(..need) else {
            return Err(LayoutError::BufferTooSmall {
                what: "directory",
                need,
                got: buf.len(),
            });
        };
        out.fill(0);
        write_array(out, 0, self.header.raw().to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            write_array(
                out,
                DIR_ENTRIES_OFFSET + i * DIR_ENTRY_SIZE,
                e.raw().to_le_bytes(),
            );
        }
        Ok(())
    }

    /// The global depth.
    pub fn global_depth(&self) -> u8 {
        self.header.global_depth()
    }

    /// The entry for directory hash `dir_hash`.
    pub fn lookup(&self, dir_hash: u64) -> Option<DirEntry> {
        let index = (dir_hash & low_mask(self.global_depth())) as usize;
        self.entries.get(index).copied()
    }

    /// Checks the extendible-hashing invariants (module docs).
    ///
    /// # Errors
    /// [`LayoutError::InconsistentDirectory`] naming the first bad entry, or
    /// an entry validation error.
    pub fn check_consistency(&self) -> Result<()> {
        let g = self.global_depth();
        if self.entries.len() != 1usize << g {
            return Err(LayoutError::InconsistentDirectory {
                index: self.entries.len(),
                reason: "entry count is not 2^global_depth",
            });
        }
        let mut owners: HashMap<RemotePtr, Suffix> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            let e = e.validate(g)?;
            let d = e.local_depth();
            let first = i & low_mask(d) as usize;
            let canonical = self.entries.get(first).copied().unwrap_or_default();
            if !e.same_target(canonical) {
                return Err(LayoutError::InconsistentDirectory {
                    index: i,
                    reason: "entry differs from the entry of its suffix",
                });
            }
            let suffix = Suffix::new(first as u32, d)?;
            if *owners.entry(e.ptr()).or_insert(suffix) != suffix {
                return Err(LayoutError::InconsistentDirectory {
                    index: i,
                    reason: "one subtable pointer under two suffixes",
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::subtable::SplitPlan;

    fn ptr(n: u64) -> RemotePtr {
        RemotePtr::new((n % 3) as u8, n * 4096).unwrap()
    }

    #[test]
    fn entry_bits_and_validation() {
        let p = RemotePtr::new(0xAB, 0x12_3456_7890).unwrap();
        let e = DirEntry::new(20, p).unwrap();
        assert_eq!(e.raw(), (20 << 48) | 0xAB12_3456_7890);
        assert_eq!((e.local_depth(), e.ptr(), e.is_locked()), (20, p, false));
        let l = e.with_lock(true);
        assert_eq!(l.raw(), e.raw() | (1 << 63));
        assert!(l.is_locked() && l.same_target(e));
        assert_eq!(l.with_lock(false), e);
        assert_eq!(e.validate(20), Ok(e));
        assert_eq!(
            e.validate(19),
            Err(LayoutError::LocalDepthExceedsGlobal {
                local: 20,
                global: 19
            })
        );
        assert!(DirEntry::new(21, p).is_err());
        assert!(matches!(
            DirEntry::from_raw(1 << 54).validate(20),
            Err(LayoutError::MalformedDirWord { .. })
        ));
        assert!(DirEntry::from_raw(1 << 62).validate(20).is_err());
    }

    #[test]
    fn lengths_and_offsets() {
        assert_eq!(directory_len(0), Ok(72));
        assert_eq!(directory_len(3), Ok(128));
        assert_eq!(directory_len(20), Ok(MAX_DIRECTORY_LEN));
        assert!(directory_len(21).is_err());
        assert_eq!(entry_offset(0), Ok(64));
        assert_eq!(entry_offset(5), Ok(104));
        assert!(entry_offset(1 << 20).is_err());
        assert!(entry_offset(usize::MAX).is_err());
    }

    #[test]
    fn repr_doubling() {
        let mut d = DirectoryRepr::new(ptr(0));
        d.double().unwrap();
        assert_eq!(d.global_depth(), 1);
        assert_eq!(d.entries.len(), 2);
        d.check_consistency().unwrap();
        d.header = DirHeader::locked(1, 3, 99).unwrap();
        d.double().unwrap();
        assert_eq!(d.header, DirHeader::locked(2, 3, 99).unwrap());
    }

    #[test]
    fn view_repr_round_trip() {
        let mut d = DirectoryRepr::new(ptr(0));
        d.double().unwrap();
        d.double().unwrap();
        let plan = SplitPlan::new(Suffix::ROOT).unwrap();
        d.apply_split(&plan, ptr(0), ptr(1)).unwrap();
        d.check_consistency().unwrap();
        let mut buf = vec![0xEEu8; d.buffer_len() + 8];
        d.emit(&mut buf).unwrap();
        assert_eq!(&buf[8..64], &[0u8; 56]);
        let view = Directory::new_checked(&buf[..]).unwrap();
        assert_eq!(view.header(), d.header);
        assert_eq!(view.len(), 4);
        assert!(!view.is_empty());
        assert_eq!(view.capacity(), 5);
        assert_eq!(view.entry(4), None);
        assert_eq!(view.lookup(0b110), Some(d.entries[2]));
        assert_eq!(view.lookup(0b110), d.lookup(0b110));
        assert_eq!(DirectoryRepr::parse(&view), Ok(d.clone()));
        assert!(matches!(
            d.emit(&mut buf[..95]),
            Err(LayoutError::BufferTooSmall {
                need: 96,
                got: 95,
                ..
            })
        ));
    }

    #[test]
    fn view_errors_and_writes() {
        assert!(matches!(
            Directory::new_checked(&[0u8; 63][..]),
            Err(LayoutError::Truncated {
                need: 64,
                got: 63,
                ..
            })
        ));
        let mut buf = [0u8; 96];
        buf[0] = 3; // depth 3 needs 128 bytes
        assert!(matches!(
            Directory::new_checked(&buf[..]),
            Err(LayoutError::Truncated {
                need: 128,
                got: 96,
                ..
            })
        ));
        buf[0] = 0x80; // reserved bit
        assert!(Directory::new_checked(&buf[..]).is_err());
        buf[0] = 2;
        let mut view = Directory::new_checked(&mut buf[..]).unwrap();
        // A doubling writes the upper half before raising the depth.
        view.set_entry(3, DirEntry::new(1, ptr(1)).unwrap())
            .unwrap();
        assert!(matches!(
            view.set_entry(4, DirEntry::default()),
            Err(LayoutError::DirIndexOutOfRange { index: 4, .. })
        ));
        // A header rewritten to a depth the buffer cannot hold stays panic-free.
        view.set_header(DirHeader::from_raw(63));
        assert_eq!(view.len(), 4);
        assert_eq!(view.lookup(3), Some(DirEntry::new(1, ptr(1)).unwrap()));
        assert_eq!(view.lookup(u64::MAX), None);
        view.set_header(DirHeader::unlocked(2).unwrap());
        // Entry 3 has depth 1 but entry 1 (same low bit) is empty: inconsistent.
        let repr = DirectoryRepr::parse(&view).unwrap();
        assert!(matches!(
            repr.check_consistency(),
            Err(LayoutError::InconsistentDirectory { index: 3, .. })
        ));
        // A local depth above the global depth fails to parse.
        view.set_entry(0, DirEntry::new(3, ptr(0)).unwrap())
            .unwrap();
        assert!(matches!(
            DirectoryRepr::parse(&view),
            Err(LayoutError::LocalDepthExceedsGlobal {
                local: 3,
                global: 2
            })
        ));
    }

    #[test]
    fn consistency_errors() {
        let mut d = DirectoryRepr::new(ptr(0));
        d.double().unwrap();
        // Two suffixes of depth 1 that share a pointer.
        d.entries = vec![DirEntry::new(1, ptr(5)).unwrap(); 2];
        assert!(matches!(
            d.check_consistency(),
            Err(LayoutError::InconsistentDirectory { index: 1, .. })
        ));
        // Lock bits do not matter.
        d.entries = vec![
            DirEntry::new(0, ptr(5)).unwrap(),
            DirEntry::new(0, ptr(5)).unwrap().with_lock(true),
        ];
        d.check_consistency().unwrap();
        d.entries.pop();
        assert!(matches!(
            d.check_consistency(),
            Err(LayoutError::InconsistentDirectory { index: 1, .. })
        ));
    }
}
