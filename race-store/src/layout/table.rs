//! Table metadata on memory node 0: the superblock a client reads at open,
//! and the split log that lets any client finish a split whose owner died.
//!
//! ```text
//! node 0 region
//! 0          64         128                 4096 (DIR_OFFSET)
//! +----------+----------+-------- ... -------+--------+------------------+----------
//! |superblock| split log| members, then zero | dir hdr| dir entries ...   | heap ...
//! +----------+----------+-------- ... -------+--------+------------------+----------
//!                                            \__ MAX directory for max_global_depth _/
//!
//! superblock (64 B)
//!  0      8        12       16   17   18     24           32             40    44     48              56
//! +------+--------+--------+----+----+------+------------+--------------+-----+------+---------------+------+
//! |magic |version | groups |maxg|node| 0    | dir offset | log offset   |crc32|  0   |client counter | 0    |
//! +------+--------+--------+----+----+------+------------+--------------+-----+------+---------------+------+
//!
//! split log (64 B)
//!  0       8               16          20   21    24          32          40     44
//! +-------+---------------+-----------+----+-----+-----------+-----------+------+------+
//! | state | old subtable  | old suffix|old |  0  | new half 0| new half 1| crc32|  0   |
//! |       | ptr (48 bits) | bits u32  |dep.|     | ptr       | ptr       |      |      |
//! +-------+---------------+-----------+----+-----+-----------+-----------+------+------+
//! ```
//!
//! * The directory lives at the fixed [`DIR_PTR`] (node 0, offset
//!   [`DIR_OFFSET`]); its header word is also the table's resize lock (see
//!   [`crate::layout::dir_header`]). The superblock repeats the offset so a
//!   client can check it.
//! * The client counter is outside the CRC: each opening client takes an id
//!   with one FAA on it (ids are 16-bit lock owners, so they wrap after 65536
//!   opens).
//! * Members ([`MEMBERS_OFFSET`], 8 bytes per memory node id, zero at
//!   format): the incarnation of the process that serves each node id of
//!   this table, recorded by the first client of a deployed store that
//!   meets it (a CAS from 0). A memory node's region lives as long as its
//!   process, so another incarnation at an id has none of the table's data
//!   there (see `crate::deploy`).
//! * The split log is all zeros when idle. A resizing client writes it once,
//!   under the resize lock, before it changes anything, and clears it last;
//!   its CRC makes a log torn by a crash mid-WRITE read as idle (correctly:
//!   nothing was changed before the log WRITE completed).

use crate::layout::directory::directory_len;
use crate::layout::error::{LayoutError, Result};
use crate::layout::slot::RemotePtr;
use crate::layout::subtable::{SubtableGeometry, Suffix};
use crate::layout::{read_array, read_u32, read_u64, write_array, MAX_GLOBAL_DEPTH};

/// Offset of the superblock on node 0.
pub const SUPERBLOCK_OFFSET: u64 = 0;
/// Size of the superblock.
pub const SUPERBLOCK_SIZE: usize = 64;
/// Offset of the client counter word inside the superblock (FAA target).
pub const CLIENT_COUNTER_OFFSET: u64 = 48;
/// Offset of the split log on node 0.
pub const SPLIT_LOG_OFFSET: u64 = 64;
/// Size of the split log.
pub const SPLIT_LOG_SIZE: usize = 64;
/// Offset of the member incarnations on node 0 (one u64 per node id).
pub const MEMBERS_OFFSET: u64 = 128;
/// Offset of the directory on node 0.
pub const DIR_OFFSET: u64 = 4096;
const _: () = assert!(MEMBERS_OFFSET + 8 * 256 <= DIR_OFFSET);
/// Where the directory lives: node 0, [`DIR_OFFSET`].
pub const DIR_PTR: RemotePtr = match RemotePtr::new(0, DIR_OFFSET) {
    Ok(p) => p,
    Err(_) => RemotePtr::from_bits(0),
};
/// The superblock's magic (`b"RACETBL1"`).
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"RACETBL1");
/// The on-memory format version: 2 since inserts place tentative copies
/// (bit 1 of a slot word, [`crate::layout::slot::SLOT_TENTATIVE`]), which a
/// client of version 1 would take for committed ones.
pub const FORMAT_VERSION: u32 = 2;
/// The split log's state word when a split is logged (`b"SPLITLOG"`).
pub const SPLIT_LOG_ACTIVE: u64 = u64::from_le_bytes(*b"SPLITLOG");

const CRC_COVERS: usize = 40;
const CRC_AT: usize = 40;

/// First byte of node 0's heap for a table of `max_global_depth`: after the
/// largest directory, rounded up to 4 KiB.
///
/// # Errors
/// [`LayoutError::DepthOutOfRange`] if `max_global_depth > MAX_GLOBAL_DEPTH`.
pub const fn node0_heap_start(max_global_depth: u8) -> Result<u64> {
    match directory_len(max_global_depth) {
        Ok(len) => Ok((DIR_OFFSET + len as u64).div_ceil(4096) * 4096),
        Err(e) => Err(e),
    }
}

/// The parsed superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperblockRepr {
    /// Geometry of every subtable.
    pub geometry: SubtableGeometry,
    /// Largest global depth the directory area can hold.
    pub max_global_depth: u8,
    /// Number of memory nodes.
    pub nodes: u8,
    /// Offset of the directory on node 0 (always [`DIR_OFFSET`] today).
    pub dir_offset: u64,
    /// Offset of the split log on node 0.
    pub split_log_offset: u64,
}

impl SuperblockRepr {
    /// Parses a superblock read from node 0.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`], [`LayoutError::BadMagic`],
    /// [`LayoutError::UnsupportedFormat`] (another version),
    /// [`LayoutError::ChecksumMismatch`], or the range errors of the geometry
    /// and depth.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let covered = check_crc(buf, "superblock", SUPERBLOCK_SIZE)?;
        if read_u64(covered, 0) != SUPERBLOCK_MAGIC {
            return Err(LayoutError::BadMagic {
                found: read_array::<2>(covered, 0)[0].into(),
                expected: SUPERBLOCK_MAGIC as u16,
            });
        }
        let version = read_u32(covered, 8);
        if version != FORMAT_VERSION {
            return Err(LayoutError::UnsupportedFormat {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let geometry = SubtableGeometry::new(read_u32(covered, 12))?;
        let [max_global_depth, nodes] = read_array::<2>(covered, 16);
        if max_global_depth > MAX_GLOBAL_DEPTH {
            return Err(LayoutError::DepthOutOfRange {
                depth: max_global_depth.into(),
                max: MAX_GLOBAL_DEPTH,
            });
        }
        Ok(Self {
            geometry,
            max_global_depth,
            nodes,
            dir_offset: read_u64(covered, 24),
            split_log_offset: read_u64(covered, 32),
        })
    }

    /// Writes the superblock (client counter zero) into `buf`.
    ///
    /// # Errors
    /// [`LayoutError::BufferTooSmall`] if `buf` is shorter than 64 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let out = prepare(buf, "superblock", SUPERBLOCK_SIZE)?;
        write_array(out, 0, SUPERBLOCK_MAGIC.to_le_bytes());
        write_array(out, 8, FORMAT_VERSION.to_le_bytes());
        write_array(out, 12, self.geometry.groups().to_le_bytes());
        write_array(out, 16, [self.max_global_depth, self.nodes]);
        write_array(out, 24, self.dir_offset.to_le_bytes());
        write_array(out, 32, self.split_log_offset.to_le_bytes());
        seal(out);
        Ok(())
    }
}

/// A logged split: the subtable being split and its two new halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitLogRepr {
    /// The suffix of the subtable being split (depth `d`).
    pub old: Suffix,
    /// Where the subtable being split lives.
    pub old_ptr: RemotePtr,
    /// The new subtables: `[bit d = 0, bit d = 1]`.
    pub new: [RemotePtr; 2],
}

impl SplitLogRepr {
    /// Parses a split log: `Ok(None)` when idle (state word 0).
    ///
    /// # Errors
    /// [`LayoutError::Truncated`], [`LayoutError::ChecksumMismatch`] or
    /// [`LayoutError::BadMagic`] for a torn or garbage log, or the suffix
    /// range errors.
    pub fn parse(buf: &[u8]) -> Result<Option<Self>> {
        if buf.len() >= 8 && read_u64(buf, 0) == 0 {
            return Ok(None);
        }
        let covered = check_crc(buf, "split log", SPLIT_LOG_SIZE)?;
        let state = read_u64(covered, 0);
        if state != SPLIT_LOG_ACTIVE {
            return Err(LayoutError::BadMagic {
                found: state as u16,
                expected: SPLIT_LOG_ACTIVE as u16,
            });
        }
        let depth = read_array::<1>(covered, 20)[0];
        Ok(Some(Self {
            old: Suffix::new(read_u32(covered, 16), depth)?,
            old_ptr: RemotePtr::from_bits(read_u64(covered, 8)),
            new: [
                RemotePtr::from_bits(read_u64(covered, 24)),
                RemotePtr::from_bits(read_u64(covered, 32)),
            ],
        }))
    }

    /// Writes the active log into `buf`.
    ///
    /// # Errors
    /// [`LayoutError::BufferTooSmall`] if `buf` is shorter than 64 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let out = prepare(buf, "split log", SPLIT_LOG_SIZE)?;
        write_array(out, 0, SPLIT_LOG_ACTIVE.to_le_bytes());
        write_array(out, 8, self.old_ptr.to_bits().to_le_bytes());
        write_array(out, 16, self.old.bits().to_le_bytes());
        write_array(out, 20, [self.old.depth()]);
        write_array(out, 24, self.new[0].to_bits().to_le_bytes());
        write_array(out, 32, self.new[1].to_bits().to_le_bytes());
        seal(out);
        Ok(())
    }
}

fn prepare<'a>(buf: &'a mut [u8], what: &'static str, need: usize) -> Result<&'a mut [u8]> {
    let got = buf.len();
    let out = buf
        .get_mut(..need)
        .ok_or(LayoutError::BufferTooSmall { what, need, got })?;
    out.fill(0);
    Ok(out)
}

fn seal(out: &mut [u8]) {
    let crc = crc32fast::hash(out.get(..CRC_COVERS).unwrap_or(&[]));
    write_array(out, CRC_AT, crc.to_le_bytes());
}

fn check_crc<'a>(buf: &'a [u8], what: &'static str, need: usize) -> Result<&'a [u8]> {
    if buf.len() < need {
        return Err(LayoutError::Truncated {
            what,
            need,
            got: buf.len(),
        });
    }
    let covered = buf.get(..CRC_COVERS).unwrap_or(&[]);
    let stored = read_u32(buf, CRC_AT);
    let computed = crc32fast::hash(covered);
    if stored != computed {
        return Err(LayoutError::ChecksumMismatch { stored, computed });
    }
    Ok(covered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> SuperblockRepr {
        SuperblockRepr {
            geometry: SubtableGeometry::new(5).unwrap(),
            max_global_depth: 12,
            nodes: 3,
            dir_offset: DIR_OFFSET,
            split_log_offset: SPLIT_LOG_OFFSET,
        }
    }

    #[test]
    fn superblock_round_trip_and_errors() {
        let mut buf = [0xAAu8; 64];
        sb().emit(&mut buf).unwrap();
        assert_eq!(&buf[0..8], b"RACETBL1");
        assert_eq!(SuperblockRepr::parse(&buf), Ok(sb()));
        // The client counter is outside the CRC.
        buf[48] = 7;
        assert_eq!(SuperblockRepr::parse(&buf), Ok(sb()));
        buf[12] ^= 1;
        assert!(matches!(
            SuperblockRepr::parse(&buf),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            SuperblockRepr::parse(&buf[..63]),
            Err(LayoutError::Truncated { .. })
        ));
        assert!(SuperblockRepr::parse(&[0u8; 64]).is_err());
        assert!(sb().emit(&mut [0u8; 63]).is_err());
        let mut bad = sb();
        bad.max_global_depth = 21;
        bad.emit(&mut buf).unwrap();
        assert!(matches!(
            SuperblockRepr::parse(&buf),
            Err(LayoutError::DepthOutOfRange { .. })
        )); // A table of another format version (CRC intact): refused by name.
        sb().emit(&mut buf).unwrap();
        buf[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32fast::hash(&buf[..CRC_COVERS]);
        buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SuperblockRepr::parse(&buf),
            Err(LayoutError::UnsupportedFormat {
                found: 1,
                supported: FORMAT_VERSION
            })
        );
    }

    #[test]
    fn split_log_round_trip_and_errors() {
        assert_eq!(SplitLogRepr::parse(&[0u8; 64]), Ok(None));
        let log = SplitLogRepr {
            old: Suffix::new(0b101, 3).unwrap(),
            old_ptr: RemotePtr::new(1, 8192).unwrap(),
            new: [
                RemotePtr::new(2, 4096).unwrap(),
                RemotePtr::new(0, 1 << 30).unwrap(),
            ],
        };
        let mut buf = [0u8; 64];
        log.emit(&mut buf).unwrap();
        assert_eq!(SplitLogRepr::parse(&buf), Ok(Some(log)));
        // Torn: the second half of the WRITE missing.
        let mut torn = buf;
        torn[32..].fill(0);
        assert!(SplitLogRepr::parse(&torn).is_err());
        assert!(SplitLogRepr::parse(&buf[..40]).is_err());
        let mut garbage = [0x55u8; 64];
        let crc = crc32fast::hash(&garbage[..40]);
        garbage[40..44].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            SplitLogRepr::parse(&garbage),
            Err(LayoutError::BadMagic { .. })
        ));
    }

    #[test]
    fn fixed_locations() {
        assert_eq!(DIR_PTR, RemotePtr::new(0, 4096).unwrap());
        assert_eq!(node0_heap_start(0), Ok(8192));
        assert_eq!(node0_heap_start(9), Ok(4096 + 8192));
        assert!(node0_heap_start(21).is_err());
        assert!(SPLIT_LOG_OFFSET as usize >= SUPERBLOCK_SIZE);
        assert!(SPLIT_LOG_OFFSET + SPLIT_LOG_SIZE as u64 <= DIR_OFFSET);
    }
}
