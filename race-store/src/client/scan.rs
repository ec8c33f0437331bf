//! Every key-value pair of the table, subtable by subtable, streamed to the
//! caller: what a dump of the store reads (`race-kv dump`).
//!
//! The scan reads the directory, then each subtable the directory names
//! (one READ) and the KV blocks of its slots (one doorbell), and hands each
//! pair whose block checks out (CRC, the key's hash belongs to the
//! subtable, the slot's bucket and fingerprint) to the caller, each key
//! once per subtable. It takes no lock and writes nothing.
//!
//! # Under concurrent writes
//! A scan is not a snapshot. A block that does not check out (an update
//! unlinked it and its memory was reused, or a torn read) is looked at
//! again from its slot, [`RESCAN_TRIES`] times at most; a slot that has
//! been emptied meanwhile is a key deleted during the scan. Each pair
//! handed over was the key's value at some time during the scan. What the
//! scan cannot see is a split: keys it moves after their subtable was read
//! may be missed, or read twice; [`ScanReport::directory_changed`] says a
//! split happened between the scan's start and end, and the scan should
//! be run again (with the writers stopped, for a complete dump).

use std::collections::HashSet;

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::Suffix;
use crate::layout::{low_mask, read_u64};
use crate::remote::{RemoteOp, Transport};

use super::engine::take_read;
use super::split::{image_slots, position_fits};
use super::Client;

/// How many times a slot whose block did not check out is read again.
pub const RESCAN_TRIES: usize = 3;

/// What [`Client::scan`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Pairs handed to the caller.
    pub pairs: u64,
    /// Subtables read.
    pub subtables: u64,
    /// Slots whose block still did not check out after [`RESCAN_TRIES`]
    /// reads: their keys are missing from the scan (a key updated over and
    /// over while the scan ran, or a damaged block).
    pub skipped: u64,
    /// Whether the directory changed while the scan ran (a split): keys
    /// the split moved may be missing or twice.
    pub directory_changed: bool,
    /// Whether the caller stopped the scan.
    pub stopped: bool,
}

impl ScanReport {
    /// Whether the scan saw the whole table: not stopped, no split, no slot
    /// skipped.
    pub fn complete(&self) -> bool {
        !self.stopped && !self.directory_changed && self.skipped == 0
    }
}

/// A slot to read a block for: where it is, its bucket, its word.
struct Pending {
    addr: RemotePtr,
    group: u32,
    bucket: usize,
    word: Slot,
}

impl<T: Transport> Client<T> {
    /// Hands every key-value pair of the table to `each` (see the module
    /// docs for what a scan under concurrent writes sees); `each` returns
    /// `false` to stop the scan.
    ///
    /// # Errors
    /// Transport errors; table errors for a directory or subtable that
    /// does not parse.
    pub fn scan(
        &mut self,
        mut each: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<ScanReport, Error> {
        self.refresh_directory()?;
        let start: Vec<u64> = self.dir.entries().iter().map(|e| e.raw()).collect();
        let geometry = self.table.geometry;
        let mut subtables: Vec<(RemotePtr, Suffix)> = Vec::new();
        let mut seen_ptr = HashSet::new();
        for (i, e) in self.dir.entries().iter().enumerate() {
            let d = e.local_depth();
            if seen_ptr.insert(e.ptr()) {
                subtables.push((e.ptr(), Suffix::new((i as u64 & low_mask(d)) as u32, d)?));
            }
        }
        let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than one READ",
        })?;
        let mut report = ScanReport::default();
        for (sub, suffix) in subtables {
            report.subtables += 1;
            let mut res = self.exec(&[RemoteOp::Read { ptr: sub, len }])?;
            let image = take_read(&mut res, 0)?;
            let mut pending: Vec<Pending> = Vec::new();
            for s in image_slots(&image, geometry) {
                let word = s.word.thawed();
                if s.word.validate().is_ok() && !word.is_empty() {
                    pending.push(Pending {
                        addr: sub.add(s.offset as u64)?,
                        group: s.group,
                        bucket: s.bucket,
                        word,
                    });
                }
            }
            let mut keys: HashSet<Vec<u8>> = HashSet::new();
            for round in 0..=RESCAN_TRIES {
                if pending.is_empty() {
                    break;
                }
                if round > 0 {
                    pending = self.reread_slots(pending)?;
                    if pending.is_empty() {
                        break;
                    }
                }
                let ops: Vec<RemoteOp<'_>> = pending
                    .iter()
                    .map(|p| RemoteOp::Read {
                        ptr: p.word.ptr(),
                        len: p.word.block_len() as u32,
                    })
                    .collect();
                let mut res = self.exec(&ops)?;
                let mut again = Vec::new();
                for (i, p) in pending.into_iter().enumerate() {
                    let buf = take_read(&mut res, i)?;
                    let fits = kv::decode_checked(&buf).ok().filter(|kv| {
                        let hash = KeyHash::of(kv.key());
                        suffix.contains(hash.dir_hash())
                            && hash.fingerprint().get() == p.word.fingerprint()
                            && position_fits(&hash, geometry, p.group, p.bucket)
                            && kv.block_len() == p.word.block_len()
                    });
                    match fits {
                        Some(kv) => {
                            if keys.insert(kv.key().to_vec()) {
                                report.pairs += 1;
                                if !each(kv.key(), kv.value()) {
                                    report.stopped = true;
                                    return Ok(report);
                                }
                            }
                        }
                        None => again.push(p),
                    }
                }
                pending = again;
            }
            report.skipped += pending.len() as u64;
        }
        self.refresh_directory()?;
        report.directory_changed = self
            .dir
            .entries()
            .iter()
            .map(|e| e.raw())
            .ne(start.iter().copied());
        Ok(report)
    }

    /// Reads the slots of `pending` again: those that still hold a block,
    /// with their words now (a slot emptied meanwhile is a key deleted
    /// during the scan).
    fn reread_slots(&mut self, pending: Vec<Pending>) -> Result<Vec<Pending>, Error> {
        let ops: Vec<RemoteOp<'_>> = pending
            .iter()
            .map(|p| RemoteOp::Read {
                ptr: p.addr,
                len: 8,
            })
            .collect();
        let mut res = self.exec(&ops)?;
        let mut out = Vec::new();
        for (i, p) in pending.into_iter().enumerate() {
            let buf = take_read(&mut res, i)?;
            let word = Slot::from_raw(read_u64(&buf, 0));
            if word.validate().is_ok() && !word.thawed().is_empty() {
                out.push(Pending {
                    word: word.thawed(),
                    ..p
                });
            }
        }
        Ok(out)
    }
}
