//! Out-of-place KV blocks.
//!
//! A slot points to a KV block written before the slot's CAS. The block is
//! self-describing and checksummed, so a reader detects a block that is torn
//! (a concurrent writer), garbage, or reused for another key.
//!
//! ```text
//!  0      2      4        8          8+klen         8+klen+vlen      +4
//! +------+------+--------+-----------+--------------+---------------+---------+
//! | klen |magic | vlen   |   key     |    value     | crc32 (u32)   | zero pad|
//! | u16  | u16  | u32    | klen B    |   vlen B     | over [0, end) | to 64 B |
//! +------+------+--------+-----------+--------------+---------------+---------+
//! ```
//!
//! * All integers little-endian. `magic` is [`KV_MAGIC`] (the bytes "RK"), so
//!   a zeroed block or a bucket is rejected before the CRC is computed.
//! * `klen` in `1..=MAX_KEY_LEN`; `vlen` is `u32` to leave room for a wider
//!   length field later, but today the whole block is capped by the slot's
//!   8-bit length in 64 B units: `MAX_KV_BLOCK = 255 * 64 = 16320` bytes.
//! * The CRC-32 (IEEE, as computed by `crc32fast`) covers the header, key and
//!   value. The padding is written as zeros and not checked.
//! * The block length is `round_up(12 + klen + vlen, 64)`; that is what the
//!   slot's `len` field records and what a reader READs.

use crate::layout::error::{LayoutError, Result};
use crate::layout::slot::{LEN_UNIT, MAX_LEN_UNITS};
use crate::layout::{read_u16, read_u32, write_array};

/// Bytes of the header (`klen`, `magic`, `vlen`).
pub const KV_HEADER_SIZE: usize = 8;
/// Bytes of the trailing CRC.
pub const KV_CRC_SIZE: usize = 4;
/// Fixed overhead of a block: header and CRC.
pub const KV_OVERHEAD: usize = KV_HEADER_SIZE + KV_CRC_SIZE;
/// Block lengths are multiples of this.
pub const KV_ALIGN: usize = LEN_UNIT;
/// Largest block: what the slot's 8-bit length field can describe.
pub const MAX_KV_BLOCK: usize = MAX_LEN_UNITS as usize * KV_ALIGN;
/// Largest key (with an empty value).
pub const MAX_KEY_LEN: usize = MAX_KV_BLOCK - KV_OVERHEAD;
/// The magic in bytes 2..4 (`b"RK"` little-endian).
pub const KV_MAGIC: u16 = u16::from_le_bytes(*b"RK");

/// Byte ranges of the fixed fields.
pub mod field {
    use core::ops::Range;
    /// `klen: u16`.
    pub const KLEN: Range<usize> = 0..2;
    /// `magic: u16`.
    pub const MAGIC: Range<usize> = 2..4;
    /// `vlen: u32`.
    pub const VLEN: Range<usize> = 4..8;
    /// Start of the key.
    pub const KEY: usize = 8;
}

/// The largest value that fits in one block with a key of `key_len` bytes.
///
/// # Errors
/// [`LayoutError::EmptyKey`] or [`LayoutError::KeyTooLarge`].
pub const fn max_value_len(key_len: usize) -> Result<usize> {
    if key_len == 0 {
        return Err(LayoutError::EmptyKey);
    }
    if key_len > MAX_KEY_LEN {
        return Err(LayoutError::KeyTooLarge {
            len: key_len,
            max: MAX_KEY_LEN,
        });
    }
    Ok(MAX_KEY_LEN - key_len)
}

/// The length of the block for a key and value of these lengths: a multiple
/// of 64 in `64..=MAX_KV_BLOCK`.
///
/// # Errors
/// [`LayoutError::EmptyKey`], [`LayoutError::KeyTooLarge`] or
/// [`LayoutError::ValueTooLarge`].
pub const fn block_len(key_len: usize, value_len: usize) -> Result<usize> {
    let max = match max_value_len(key_len) {
        Ok(max) => max,
        Err(e) => return Err(e),
    };
    if value_len > max {
        return Err(LayoutError::ValueTooLarge {
            len: value_len,
            max,
        });
    }
    let used = KV_OVERHEAD + key_len + value_len;
    Ok(used.div_ceil(KV_ALIGN) * KV_ALIGN)
}

/// Encodes a KV block into a new buffer of exactly [`block_len`] bytes.
///
/// # Errors
/// As [`block_len`].
pub fn encode(key: &[u8], value: &[u8]) -> Result<Vec<u8>> {
    let mut buf = vec![0; block_len(key.len(), value.len())?];
    encode_into(key, value, &mut buf)?;
    Ok(buf)
}

/// Encodes a KV block into the front of `buf`, padding included; returns the
/// block length.
///
/// # Errors
/// As [`block_len`], or [`LayoutError::BufferTooSmall`].
pub fn encode_into(key: &[u8], value: &[u8], buf: &mut [u8]) -> Result<usize> {
    let len = block_len(key.len(), value.len())?;
    let got = buf.len();
    let Some(out) = buf.get_mut(..len) else {
        return Err(LayoutError::BufferTooSmall {
            what: "KV block",
            need: len,
            got,
        });
    };
    out.fill(0);
    // Lengths are bounded by MAX_KV_BLOCK, so the casts are lossless.
    write_array(out, field::KLEN.start, (key.len() as u16).to_le_bytes());
    write_array(out, field::MAGIC.start, KV_MAGIC.to_le_bytes());
    write_array(out, field::VLEN.start, (value.len() as u32).to_le_bytes());
    let key_end = field::KEY + key.len();
    let end = key_end + value.len();
    if let Some(dst) = out.get_mut(field::KEY..key_end) {
        dst.copy_from_slice(key);
    }
    if let Some(dst) = out.get_mut(key_end..end) {
        dst.copy_from_slice(value);
    }
    let crc = crc32fast::hash(out.get(..end).unwrap_or(&[]));
    write_array(out, end, crc.to_le_bytes());
    Ok(len)
}

/// A verified KV block borrowed from the buffer it was read into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRef<'a> {
    key: &'a [u8],
    value: &'a [u8],
    block_len: usize,
}

impl<'a> KvRef<'a> {
    /// The key (non-empty).
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The value.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The block length the header implies (64 B aligned); a reader may
    /// compare it with the slot's length field.
    pub fn block_len(&self) -> usize {
        self.block_len
    }
}

/// The key and value lengths a block's header declares, and the block
/// length they imply; checks the magic and that the lengths are possible.
fn header(buf: &[u8]) -> Result<(usize, usize, usize)> {
    if buf.len() < KV_HEADER_SIZE {
        return Err(LayoutError::Truncated {
            what: "KV block header",
            need: KV_HEADER_SIZE,
            got: buf.len(),
        });
    }
    let magic = read_u16(buf, field::MAGIC.start);
    if magic != KV_MAGIC {
        return Err(LayoutError::BadMagic {
            found: magic,
            expected: KV_MAGIC,
        });
    }
    let klen = usize::from(read_u16(buf, field::KLEN.start));
    let vlen = usize::try_from(read_u32(buf, field::VLEN.start)).unwrap_or(usize::MAX);
    Ok((klen, vlen, block_len(klen, vlen)?))
}

/// Bytes of a block that a reader of its key alone READs first: the header
/// and a key of up to 120 bytes ([`peek_key`]).
pub const KEY_PEEK: usize = 2 * KV_ALIGN;

/// What the first bytes of a block say of its key ([`peek_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPeek<'a> {
    /// The key.
    Key(&'a [u8]),
    /// The key ends past the bytes given: READ this many from the start.
    Need(usize),
}

/// The key of a block from its first bytes (at least the header), for a
/// reader that needs the key and not the value: a split placing a frozen
/// slot, whose block nobody may change while the slot points to it. The
/// header is checked (magic, lengths possible, and the length they imply
/// equal to `block_len`, the slot's); the CRC, which covers the value, is
/// not.
///
/// # Errors
/// As [`decode_checked`], but never [`LayoutError::ChecksumMismatch`];
/// [`LayoutError::BlockLenMismatch`] when the header implies another
/// length than `block_len`. Never panics, whatever the bytes.
pub fn peek_key(prefix: &[u8], block_len: usize) -> Result<KeyPeek<'_>> {
    let (klen, _, implied) = header(prefix)?;
    if implied != block_len {
        return Err(LayoutError::BlockLenMismatch {
            header: implied,
            slot: block_len,
        });
    }
    let key_end = field::KEY + klen;
    Ok(match prefix.get(field::KEY..key_end) {
        Some(key) => KeyPeek::Key(key),
        None => KeyPeek::Need(key_end),
    })
}

/// Decodes and verifies a KV block read from remote memory. `buf` may be
/// longer than the block (trailing bytes are ignored).
///
/// # Errors
/// [`LayoutError::Truncated`] if `buf` is shorter than the header or than the
/// lengths it declares, [`LayoutError::BadMagic`], [`LayoutError::EmptyKey`],
/// [`LayoutError::KeyTooLarge`], [`LayoutError::ValueTooLarge`] for
/// impossible lengths, [`LayoutError::ChecksumMismatch`] for a torn or
/// corrupted block. Never panics, whatever the bytes.
pub fn decode_checked(buf: &[u8]) -> Result<KvRef<'_>> {
    let (klen, vlen, block_len) = header(buf)?;
    // Bounded by MAX_KV_BLOCK after `block_len`, so no overflow.
    let key_end = field::KEY + klen;
    let end = key_end + vlen;
    let need = end + KV_CRC_SIZE;
    let (Some(covered), Some(stored)) = (buf.get(..end), buf.get(end..need)) else {
        return Err(LayoutError::Truncated {
            what: "KV block",
            need,
            got: buf.len(),
        });
    };
    let stored = read_u32(stored, 0);
    let computed = crc32fast::hash(covered);
    if stored != computed {
        return Err(LayoutError::ChecksumMismatch { stored, computed });
    }
    Ok(KvRef {
        key: covered.get(field::KEY..key_end).unwrap_or(&[]),
        value: covered.get(key_end..end).unwrap_or(&[]),
        block_len,
    })
}

/// Decodes a block as [`decode_checked`] and checks that it holds `key`.
///
/// # Errors
/// The errors of [`decode_checked`], or [`LayoutError::KeyMismatch`] for a
/// valid block of another key (the block was freed and reused).
pub fn decode_for_key<'a>(buf: &'a [u8], key: &[u8]) -> Result<KvRef<'a>> {
    let kv = decode_checked(buf)?;
    if kv.key != key {
        return Err(LayoutError::KeyMismatch);
    }
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_key_reads_the_key_from_the_first_bytes() {
        let block = encode(b"user1234", &[7; 1000]).unwrap();
        let len = block.len();
        assert_eq!(
            peek_key(&block[..KEY_PEEK], len),
            Ok(KeyPeek::Key(&b"user1234"[..]))
        );
        // The value is not looked at: a torn value goes unnoticed here
        // (the block is immutable while a frozen slot points to it).
        let mut torn = block.clone();
        torn[500] ^= 1;
        assert_eq!(
            peek_key(&torn[..KEY_PEEK], len),
            Ok(KeyPeek::Key(&b"user1234"[..]))
        );
        // A key past the first bytes: how many to READ.
        let long = vec![b'k'; 300];
        let block = encode(&long, b"v").unwrap();
        assert_eq!(
            peek_key(&block[..KEY_PEEK], block.len()),
            Ok(KeyPeek::Need(308))
        );
        assert_eq!(
            peek_key(&block[..308], block.len()),
            Ok(KeyPeek::Key(&long[..]))
        );
        // The header is checked: magic, possible lengths, the slot's length.
        assert!(matches!(
            peek_key(&block[..KEY_PEEK], block.len() - 64),
            Err(LayoutError::BlockLenMismatch { .. })
        ));
        assert!(matches!(
            peek_key(&[0; 64], 64),
            Err(LayoutError::BadMagic { .. })
        ));
        let mut empty = encode(b"k", b"").unwrap();
        empty[0] = 0;
        assert!(matches!(peek_key(&empty, 64), Err(LayoutError::EmptyKey)));
        assert!(matches!(
            peek_key(&block[..4], 64),
            Err(LayoutError::Truncated { .. })
        ));
    }

    #[test]
    fn round_trip_and_layout() {
        let block = encode(b"key", b"value").unwrap();
        assert_eq!(block.len(), 64);
        assert_eq!(&block[0..8], &[3, 0, b'R', b'K', 5, 0, 0, 0]);
        assert_eq!(&block[8..16], b"keyvalue");
        let crc = crc32fast::hash(&block[..16]);
        assert_eq!(&block[16..20], &crc.to_le_bytes());
        assert!(block[20..].iter().all(|&b| b == 0));
        let kv = decode_checked(&block).unwrap();
        assert_eq!(
            (kv.key(), kv.value(), kv.block_len()),
            (&b"key"[..], &b"value"[..], 64)
        );
        assert_eq!(decode_for_key(&block, b"key"), Ok(kv));
        assert_eq!(
            decode_for_key(&block, b"kez"),
            Err(LayoutError::KeyMismatch)
        );
        // Trailing bytes are ignored.
        let mut longer = block.clone();
        longer.extend_from_slice(&[0xFF; 64]);
        assert_eq!(decode_checked(&longer), Ok(kv));
        // Empty values are allowed.
        let e = encode(b"k", b"").unwrap();
        assert_eq!(decode_checked(&e).unwrap().value(), b"");
    }

    #[test]
    fn alignment_boundaries() {
        // 12 + 1 + 51 = 64 fits one unit; one more byte needs two.
        assert_eq!(block_len(1, 51), Ok(64));
        assert_eq!(block_len(1, 52), Ok(128));
        assert_eq!(block_len(1, max_value_len(1).unwrap()), Ok(MAX_KV_BLOCK));
        assert_eq!(MAX_KV_BLOCK, 16320);
        assert_eq!(max_value_len(1), Ok(16307));
        assert_eq!(max_value_len(MAX_KEY_LEN), Ok(0));
        for (k, v) in [(1, 51), (1, 52), (100, 1000), (1, 16307), (MAX_KEY_LEN, 0)] {
            let key = vec![7u8; k];
            let value = vec![9u8; v];
            let block = encode(&key, &value).unwrap();
            assert_eq!(block.len(), block_len(k, v).unwrap());
            assert_eq!(block.len() % 64, 0);
            let kv = decode_checked(&block).unwrap();
            assert_eq!((kv.key(), kv.value()), (&key[..], &value[..]));
        }
    }

    #[test]
    fn encode_errors() {
        assert_eq!(encode(b"", b"v"), Err(LayoutError::EmptyKey));
        assert_eq!(max_value_len(0), Err(LayoutError::EmptyKey));
        let big_key = vec![1u8; MAX_KEY_LEN + 1];
        assert_eq!(
            encode(&big_key, b""),
            Err(LayoutError::KeyTooLarge {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            })
        );
        assert!(matches!(
            max_value_len(usize::MAX),
            Err(LayoutError::KeyTooLarge { .. })
        ));
        let big_value = vec![1u8; 16308];
        assert_eq!(
            encode(b"k", &big_value),
            Err(LayoutError::ValueTooLarge {
                len: 16308,
                max: 16307
            })
        );
        assert!(matches!(
            block_len(1, usize::MAX),
            Err(LayoutError::ValueTooLarge { .. })
        ));
        let mut small = [0u8; 63];
        assert_eq!(
            encode_into(b"k", b"v", &mut small),
            Err(LayoutError::BufferTooSmall {
                what: "KV block",
                need: 64,
                got: 63
            })
        );
        let mut dirty = [0xAAu8; 200];
        assert_eq!(encode_into(b"k", b"v", &mut dirty), Ok(64));
        assert!(dirty[14..64].iter().all(|&b| b == 0));
        assert!(dirty[64..].iter().all(|&b| b == 0xAA));
        assert!(decode_checked(&dirty).is_ok());
    }

    #[test]
    fn decode_errors() {
        let block = encode(b"key", b"value").unwrap();
        assert_eq!(
            decode_checked(&block[..7]),
            Err(LayoutError::Truncated {
                what: "KV block header",
                need: 8,
                got: 7
            })
        );
        assert_eq!(
            decode_checked(&block[..19]),
            Err(LayoutError::Truncated {
                what: "KV block",
                need: 20,
                got: 19
            })
        );
        assert_eq!(
            decode_checked(&[0u8; 64]),
            Err(LayoutError::BadMagic {
                found: 0,
                expected: KV_MAGIC
            })
        );
        let mut b = block.clone();
        b[0..2].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(decode_checked(&b), Err(LayoutError::EmptyKey));
        b[0..2].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            decode_checked(&b),
            Err(LayoutError::KeyTooLarge { .. })
        ));
        let mut b = block.clone();
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_checked(&b),
            Err(LayoutError::ValueTooLarge { .. })
        ));
        let mut b = block.clone();
        b[9] ^= 1;
        assert!(matches!(
            decode_checked(&b),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
        // A torn block: the first half of a new write over an old block.
        let old = encode(b"key", b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
        let new = encode(b"key", b"BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB").unwrap();
        let mut torn = old.clone();
        torn[..32].copy_from_slice(&new[..32]);
        assert!(matches!(
            decode_checked(&torn),
            Err(LayoutError::ChecksumMismatch { .. })
        ));
    }
}
