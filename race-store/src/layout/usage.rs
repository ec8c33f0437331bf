//! A memory node's usage record: what it handed out of its region, what it
//! holds pooled, and its clients' grant leases, written by the node into its
//! own reserved prefix every second, and within 100 ms of a change
//! ([`crate::memory::USAGE_CHANGED_EVERY`]), so that anyone who reaches the store
//! reads every node's usage with one one-sided READ each, and nothing to
//! ask the nodes' CPUs (`race-kv usage`, [`crate::deploy::Store::usage`]).
//!
//! ```text
//! usage record (128 B) at USAGE_OFFSET of every node
//!  0      4       8            16         24          32       40        48
//! +------+-------+------------+----------+-----------+--------+---------+
//! |magic |version| written ms | capacity | heap used | pooled | cooling |
//! +------+-------+------------+----------+-----------+--------+---------+
//!  48         56       64          72      80       84        88     92  96
//! +----------+--------+-----------+-------+--------+---------+------+---+
//! | returned | reused | reclaimed | ended |holders | doomed  |crc32 | 0 |
//! |          |        |           | u64   | u32    | KiB u32 |      |   |
//! +----------+--------+-----------+-------+--------+---------+------+---+
//!  96                 100          104  128
//! +------------------+------------+----+
//! | ran out since    | crc32 of   | 0  |
//! | collection u32   | bytes 0-99 |    |
//! +------------------+------------+----+
//! ```
//!
//! * `written ms`: the node's wall clock (milliseconds since the Unix
//!   epoch) when it wrote the record; a reader compares it with its own
//!   (clocks of a deployment are NTP-synchronised) to tell a stale record,
//!   of a node that stopped writing, from a fresh one.
//! * The node writes the record with local stores while clients may READ
//!   it: a READ can see a torn record, which fails its CRC; the reader
//!   reads again.
//! * Nodes of older builds have zeros there (the prefix is never handed
//!   out): "no record" ([`LayoutError::BadMagic`]).
//! * Bytes 96-103 were added later, with a checksum of their own, so that
//!   readers of either build read the other's records: older readers check
//!   bytes 0-87 alone, and a node of an older build leaves 96-103 zero
//!   (`ran_out_since_collection` is `None`).

use crate::layout::error::{LayoutError, Result};
use crate::layout::table::{DIR_OFFSET, MEMBERS_OFFSET};
use crate::layout::{read_u32, read_u64, write_array};

/// Offset of the usage record on every memory node (in the reserved
/// prefix, past node 0's members).
pub const USAGE_OFFSET: u64 = 2304;
/// Bytes of the usage record.
pub const USAGE_SIZE: usize = 128;
const _: () = assert!(MEMBERS_OFFSET + 8 * 256 <= USAGE_OFFSET);
const _: () = assert!(USAGE_OFFSET + USAGE_SIZE as u64 <= DIR_OFFSET);
const _: () = assert!(USAGE_OFFSET % 64 == 0);

const USAGE_MAGIC: u32 = u32::from_le_bytes(*b"RSU1");
const USAGE_VERSION: u32 = 1;
const CRC_AT: usize = 88;
/// The later fields' value and checksum.
const RAN_OUT_AT: usize = 96;
const CRC2_AT: usize = 100;

/// The clock records are stamped with: the wall clock in milliseconds
/// since the Unix epoch (0 before it).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A memory node's usage, as its record holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageRepr {
    /// The node's wall clock when it wrote the record (ms since the epoch).
    pub written_ms: u64,
    /// Bytes of its region.
    pub capacity: u64,
    /// Bytes handed out by its block allocator.
    pub heap_used: u64,
    /// Of those, bytes clients gave back, pooled to hand out again.
    pub pooled: u64,
    /// Of those, bytes still in their grace period.
    pub cooling: u64,
    /// Bytes given back since the node started (taken back included).
    pub returned: u64,
    /// Bytes handed out again since the node started.
    pub reused: u64,
    /// Bytes taken back from dead clients since the node started.
    pub reclaimed: u64,
    /// Clients whose grant lease ended since the node started.
    pub ended: u64,
    /// Clients holding grants now.
    pub holders: u32,
    /// KiB of dead clients' grants not read yet (saturating).
    pub doomed_kib: u32,
    /// Leases that ran out since the node's last collection (saturating):
    /// what their holders left may still be allocated
    /// ([`crate::holders::HolderStats::ran_out_since_collection`]); `None`
    /// from a node of an older build.
    pub ran_out_since_collection: Option<u32>,
}

impl UsageRepr {
    /// Whether `other` says the same as this record but for its stamp.
    pub fn same_usage(&self, other: &UsageRepr) -> bool {
        UsageRepr {
            written_ms: 0,
            ..*self
        } == UsageRepr {
            written_ms: 0,
            ..*other
        }
    }

    /// Bytes in use: handed out and not pooled (clients hold them).
    pub fn in_use(&self) -> u64 {
        self.heap_used.saturating_sub(self.pooled)
    }

    /// Parses a usage record.
    ///
    /// # Errors
    /// [`LayoutError::Truncated`], [`LayoutError::BadMagic`] (no record:
    /// a node of an older build, or another version),
    /// [`LayoutError::ChecksumMismatch`] (torn by the node's write: read it
    /// again).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        if buf.len() < USAGE_SIZE {
            return Err(LayoutError::Truncated {
                what: "usage record",
                need: USAGE_SIZE,
                got: buf.len(),
            });
        }
        if read_u32(buf, 0) != USAGE_MAGIC || read_u32(buf, 4) != USAGE_VERSION {
            return Err(LayoutError::BadMagic {
                found: read_u32(buf, 0) as u16,
                expected: USAGE_MAGIC as u16,
            });
        }
        let stored = read_u32(buf, CRC_AT);
        let computed = crc32fast::hash(buf.get(..CRC_AT).unwrap_or(&[]));
        if stored != computed {
            return Err(LayoutError::ChecksumMismatch { stored, computed });
        }
        let later = buf.get(RAN_OUT_AT..CRC2_AT + 4).unwrap_or(&[]);
        let ran_out_since_collection = if later.iter().all(|&b| b == 0) {
            None
        } else {
            let stored = read_u32(buf, CRC2_AT);
            let computed = crc32fast::hash(buf.get(..CRC2_AT).unwrap_or(&[]));
            if stored != computed {
                return Err(LayoutError::ChecksumMismatch { stored, computed });
            }
            Some(read_u32(buf, RAN_OUT_AT))
        };
        Ok(UsageRepr {
            ran_out_since_collection,
            written_ms: read_u64(buf, 8),
            capacity: read_u64(buf, 16),
            heap_used: read_u64(buf, 24),
            pooled: read_u64(buf, 32),
            cooling: read_u64(buf, 40),
            returned: read_u64(buf, 48),
            reused: read_u64(buf, 56),
            reclaimed: read_u64(buf, 64),
            ended: read_u64(buf, 72),
            holders: read_u32(buf, 80),
            doomed_kib: read_u32(buf, 84),
        })
    }

    /// The record's bytes.
    pub fn emit(&self) -> [u8; USAGE_SIZE] {
        let mut out = [0u8; USAGE_SIZE];
        write_array(&mut out, 0, USAGE_MAGIC.to_le_bytes());
        write_array(&mut out, 4, USAGE_VERSION.to_le_bytes());
        for (at, v) in [
            (8, self.written_ms),
            (16, self.capacity),
            (24, self.heap_used),
            (32, self.pooled),
            (40, self.cooling),
            (48, self.returned),
            (56, self.reused),
            (64, self.reclaimed),
            (72, self.ended),
        ] {
            write_array(&mut out, at, v.to_le_bytes());
        }
        write_array(&mut out, 80, self.holders.to_le_bytes());
        write_array(&mut out, 84, self.doomed_kib.to_le_bytes());
        let crc = crc32fast::hash(&out[..CRC_AT]);
        write_array(&mut out, CRC_AT, crc.to_le_bytes());
        if let Some(n) = self.ran_out_since_collection {
            write_array(&mut out, RAN_OUT_AT, n.to_le_bytes());
            let crc = crc32fast::hash(&out[..CRC2_AT]);
            write_array(&mut out, CRC2_AT, crc.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> UsageRepr {
        UsageRepr {
            written_ms: 1_765_000_000_000,
            capacity: 1 << 30,
            heap_used: 300 << 20,
            pooled: 20 << 20,
            cooling: 1 << 20,
            returned: 900 << 20,
            reused: 880 << 20,
            reclaimed: 5 << 20,
            ended: 3,
            holders: 7,
            doomed_kib: 64,
            ran_out_since_collection: Some(2),
        }
    }

    #[test]
    fn a_record_round_trips_and_says_what_is_in_use() {
        let r = sample();
        assert_eq!(UsageRepr::parse(&r.emit()), Ok(r));
        assert_eq!(r.in_use(), 280 << 20);
    }

    #[test]
    fn records_differing_only_in_their_stamp_say_the_same_usage() {
        let r = sample();
        let later = UsageRepr {
            written_ms: r.written_ms + 100,
            ..r
        };
        assert!(r.same_usage(&later));
        assert!(!r.same_usage(&UsageRepr {
            holders: 8,
            ..later
        }));
    }

    /// Records of either build read in the other: a record of an older
    /// node (bytes 96-103 zero) has no count, and a newer record's first
    /// 96 bytes, all an older reader checks, are those of the older
    /// layout.
    #[test]
    fn the_later_count_keeps_both_builds_reading_each_other() {
        let old = UsageRepr {
            ran_out_since_collection: None,
            ..sample()
        };
        let old_bytes = old.emit();
        assert!(old_bytes[RAN_OUT_AT..].iter().all(|&b| b == 0));
        assert_eq!(UsageRepr::parse(&old_bytes), Ok(old));
        let new_bytes = sample().emit();
        assert_eq!(new_bytes[..RAN_OUT_AT], old_bytes[..RAN_OUT_AT]);
        let zero = UsageRepr {
            ran_out_since_collection: Some(0),
            ..sample()
        };
        assert_eq!(UsageRepr::parse(&zero.emit()), Ok(zero));
        // The later count torn by the node's next write.
        let mut torn = new_bytes;
        torn[RAN_OUT_AT..RAN_OUT_AT + 4].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            UsageRepr::parse(&torn),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn zeros_torn_and_short_records_are_refused() {
        assert!(matches!(
            UsageRepr::parse(&[0u8; USAGE_SIZE]),
            Err(LayoutError::BadMagic { .. })
        ));
        let mut torn = sample().emit();
        // A READ that saw half of the node's next write.
        torn[24..32].copy_from_slice(&(301u64 << 20).to_le_bytes());
        assert!(matches!(
            UsageRepr::parse(&torn),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            UsageRepr::parse(&sample().emit()[..64]),
            Err(LayoutError::Truncated { .. })
        ));
    }
}
