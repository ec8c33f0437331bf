//! The dump format of `race-kv dump` and `race-kv load`: a store's
//! key-value pairs as a byte stream, so that an operator can save a store
//! before its memory nodes restart (their data lives as long as their
//! processes) and load it into a new one. [`crate::Client::scan`] reads
//! the pairs to write.
//!
//! ```text
//! header  "RACEKV01" (8 bytes)
//! record  key_len u32 | value_len u32 | key | value       (key_len < 2^32 - 1)
//! footer  0xffff_ffff u32 | 0 u32 | records u64 | crc32 u32 | 0 u32
//! ```
//!
//! Little-endian. The footer's CRC32 covers every record's bytes (lengths
//! included) in order; a stream without its footer, or whose count or CRC
//! does not match, or followed by more bytes, is refused as a whole by
//! [`DumpReader`] once it reaches
//! the end: a loader that stops at the first error has loaded the records
//! before it (what it says).

use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"RACEKV01";
const END: u32 = u32::MAX;
/// The largest key or value a record may hold (the store's blocks are far
/// smaller; this bounds what a reader allocates for a damaged length).
pub const MAX_FIELD: u32 = 64 << 20;

/// A key and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Why a dump could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Reading or writing the stream failed.
    #[error("dump stream: {0}")]
    Io(#[from] std::io::Error),
    /// The stream does not start with the dump header.
    #[error("not a race-kv dump (no RACEKV01 header)")]
    NotADump,
    /// The stream ended before its footer (a truncated file).
    #[error("the dump ends after {records} record(s) without its footer (truncated)")]
    Truncated {
        /// Records read before the end.
        records: u64,
    },
    /// A record's length is past [`MAX_FIELD`].
    #[error(
        "record {record}: a length of {len} bytes is past the {MAX_FIELD}-byte limit (damaged)"
    )]
    TooLong {
        /// The record's index.
        record: u64,
        /// The length read.
        len: u32,
    },
    /// Bytes follow the footer.
    #[error("bytes follow the dump's footer (two dumps in one file, or damage)")]
    Trailing,
    /// The footer's reserved words are not zero.
    #[error("the dump's footer is damaged (reserved bytes not zero)")]
    BadFooter,
    /// The footer does not match the records read.
    #[error("the footer says {said} record(s) and CRC {said_crc:#010x}, the stream held {records} and {crc:#010x} (damaged)")]
    Mismatch {
        /// Records the footer counts.
        said: u64,
        /// The footer's CRC.
        said_crc: u32,
        /// Records read.
        records: u64,
        /// Their CRC.
        crc: u32,
    },
}

/// Writes a dump: [`DumpWriter::pair`] for each pair, then
/// [`DumpWriter::finish`].
pub struct DumpWriter<W: Write> {
    out: W,
    records: u64,
    crc: crc32fast::Hasher,
}

impl<W: Write> std::fmt::Debug for DumpWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DumpWriter")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl<W: Write> DumpWriter<W> {
    /// Starts a dump on `out` (writes the header).
    ///
    /// # Errors
    /// [`DumpError::Io`].
    pub fn new(mut out: W) -> Result<Self, DumpError> {
        out.write_all(MAGIC)?;
        Ok(DumpWriter {
            out,
            records: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    /// Writes one pair.
    ///
    /// # Errors
    /// [`DumpError::TooLong`] for a key or value past [`MAX_FIELD`];
    /// [`DumpError::Io`].
    pub fn pair(&mut self, key: &[u8], value: &[u8]) -> Result<(), DumpError> {
        let len = |b: &[u8]| {
            u32::try_from(b.len())
                .ok()
                .filter(|&l| l <= MAX_FIELD)
                .ok_or(DumpError::TooLong {
                    record: self.records,
                    len: u32::try_from(b.len()).unwrap_or(u32::MAX),
                })
        };
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&len(key)?.to_le_bytes());
        head[4..].copy_from_slice(&len(value)?.to_le_bytes());
        for part in [&head[..], key, value] {
            self.crc.update(part);
            self.out.write_all(part)?;
        }
        self.records += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the footer and flushes; the records written.
    ///
    /// # Errors
    /// [`DumpError::Io`].
    pub fn finish(mut self) -> Result<u64, DumpError> {
        let mut foot = [0u8; 24];
        foot[..4].copy_from_slice(&END.to_le_bytes());
        foot[8..16].copy_from_slice(&self.records.to_le_bytes());
        foot[16..20].copy_from_slice(&self.crc.clone().finalize().to_le_bytes());
        self.out.write_all(&foot)?;
        self.out.flush()?;
        Ok(self.records)
    }
}

/// Reads a dump, one pair at a time ([`DumpReader::next_pair`]).
pub struct DumpReader<R: Read> {
    input: R,
    records: u64,
    crc: crc32fast::Hasher,
    done: bool,
}

impl<R: Read> std::fmt::Debug for DumpReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DumpReader")
            .field("records", &self.records)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<R: Read> DumpReader<R> {
    /// Starts reading `input` (checks the header).
    ///
    /// # Errors
    /// [`DumpError::NotADump`]; [`DumpError::Io`].
    pub fn new(mut input: R) -> Result<Self, DumpError> {
        let mut magic = [0u8; 8];
        match input.read_exact(&mut magic) {
            Ok(()) if &magic == MAGIC => {}
            Ok(()) => return Err(DumpError::NotADump),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(DumpError::NotADump)
            }
            Err(e) => return Err(e.into()),
        }
        Ok(DumpReader {
            input,
            records: 0,
            crc: crc32fast::Hasher::new(),
            done: false,
        })
    }

    /// The next pair, `None` after the footer (checked).
    ///
    /// # Errors
    /// [`DumpError::Truncated`], [`DumpError::TooLong`],
    /// [`DumpError::Mismatch`], [`DumpError::Io`].
    pub fn next_pair(&mut self) -> Result<Option<Pair>, DumpError> {
        if self.done {
            return Ok(None);
        }
        let mut head = [0u8; 8];
        self.exact(&mut head)?;
        let key_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if key_len == END {
            let mut rest = [0u8; 16];
            self.exact(&mut rest)?;
            if head[4..8] != [0; 4] || rest[12..16] != [0; 4] {
                return Err(DumpError::BadFooter);
            }
            let said = u64::from_le_bytes(rest[..8].try_into().unwrap_or([0; 8]));
            let said_crc = u32::from_le_bytes(rest[8..12].try_into().unwrap_or([0; 4]));
            let crc = self.crc.clone().finalize();
            if said != self.records || said_crc != crc {
                return Err(DumpError::Mismatch {
                    said,
                    said_crc,
                    records: self.records,
                    crc,
                });
            }
            let mut more = [0u8; 1];
            loop {
                match self.input.read(&mut more) {
                    Ok(0) => break,
                    Ok(_) => return Err(DumpError::Trailing),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            self.done = true;
            return Ok(None);
        }
        let value_len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        for len in [key_len, value_len] {
            if len > MAX_FIELD {
                return Err(DumpError::TooLong {
                    record: self.records,
                    len,
                });
            }
        }
        let mut key = vec![0u8; key_len as usize];
        let mut value = vec![0u8; value_len as usize];
        self.exact(&mut key)?;
        self.exact(&mut value)?;
        for part in [&head[..], &key, &value] {
            self.crc.update(part);
        }
        self.records += 1;
        Ok(Some((key, value)))
    }

    /// Records read so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), DumpError> {
        match self.input.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(DumpError::Truncated {
                records: self.records,
            }),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = DumpWriter::new(&mut out).unwrap();
        for (k, v) in pairs {
            w.pair(k, v).unwrap();
        }
        assert_eq!(w.finish().unwrap(), pairs.len() as u64);
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Pair>, DumpError> {
        let mut r = DumpReader::new(bytes)?;
        let mut out = Vec::new();
        while let Some(p) = r.next_pair()? {
            out.push(p);
        }
        Ok(out)
    }

    #[test]
    fn pairs_round_trip_with_any_bytes() {
        let big = vec![0xffu8; 70_000];
        let pairs: Vec<(&[u8], &[u8])> = vec![(b"k1", b"v1"), (b"", b""), (&[0, 255, 10], &big)];
        let out = dump(&pairs);
        let got = read_all(&out).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = pairs
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(got, want);
        // An empty dump is a header and a footer.
        let mut empty = Vec::new();
        DumpWriter::new(&mut empty).unwrap().finish().unwrap();
        assert_eq!(read_all(&empty).unwrap(), vec![]);
    }

    #[test]
    fn damaged_streams_are_refused_with_what_was_read() {
        let good = dump(&[(b"a", b"1"), (b"b", b"2")]);
        assert!(matches!(read_all(b"RACEKV02"), Err(DumpError::NotADump)));
        assert!(matches!(read_all(b"RAC"), Err(DumpError::NotADump)));
        // Cut anywhere before the footer's end: truncated, never a short
        // success.
        for cut in 8..good.len() {
            match read_all(&good[..cut]) {
                Err(DumpError::Truncated { records }) => assert!(records <= 2),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        // A flipped value byte: the footer's CRC says so.
        let mut flipped = good.clone();
        flipped[8 + 8 + 1] ^= 1;
        assert!(matches!(
            read_all(&flipped),
            Err(DumpError::Mismatch { .. })
        ));
        // Nothing may follow the footer.
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(read_all(&trailing), Err(DumpError::Trailing)));
        // Reserved footer bytes must be zero.
        let mut reserved = good.clone();
        let n = reserved.len();
        reserved[n - 1] = 1;
        assert!(matches!(read_all(&reserved), Err(DumpError::BadFooter)));
        // A damaged length past the limit is refused before allocating.
        let mut long = good.clone();
        long[8..12].copy_from_slice(&(MAX_FIELD + 1).to_le_bytes());
        assert!(matches!(
            read_all(&long),
            Err(DumpError::TooLong { record: 0, .. })
        ));
    }
}
