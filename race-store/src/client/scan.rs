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
//! handed over was the key's value at some time during the scan.
//!
//! A split moves keys out of a subtable into two new ones. After reading
//! every subtable, the scan reads the directory again; the subtables named
//! by entries that changed since the previous read (the halves of a split)
//! are read again, and so on until a pass in which the directory did not
//! change, [`RESCAN_PASSES`] at most. So every key that was in the table
//! for the whole scan is handed over (unless skipped, and counted): its
//! subtable either did not split before the last directory read, and was
//! read with the key in it (a split takes keys out of a subtable only
//! after the directory names its halves, and a subtable is never reused),
//! or its entry changed and its current subtable was read after that.
//! A split puts each key at the same slot position in its half, so a half
//! read again passes over the slots that still hold the word handed over
//! from the split subtable. A key a writer changed between the two reads
//! is handed over twice: its value at each read, the later read's last.
//! Loading a dump in order leaves the later value.

use std::collections::{HashMap, HashSet};

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::directory::DirEntry;
use crate::layout::kv;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::Suffix;
use crate::layout::{low_mask, read_u64};
use crate::remote::{RemoteOp, Transport, TransportError};

use super::engine::take_read;
use super::split::{image_slots, position_fits};
use super::Client;

/// How many times a slot whose block did not check out is read again.
pub const RESCAN_TRIES: usize = 3;

/// How many times the scan reads again the subtables of directory entries
/// that changed (splits) while it ran, before it gives up
/// ([`ScanReport::directory_changed`]).
pub const RESCAN_PASSES: usize = 8;

/// What [`Client::scan`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Pairs handed to the caller (a key whose subtable split during the
    /// scan and that a writer changed meanwhile is counted twice).
    pub pairs: u64,
    /// Subtables read, those read again after a split included.
    pub subtables: u64,
    /// Subtables read again because a split replaced the one read before.
    pub rescanned: u64,
    /// Slots whose block still did not check out after [`RESCAN_TRIES`]
    /// reads, and slots holding a malformed word, in the subtables the
    /// table has at the scan's end: their keys are missing from the scan
    /// (a key updated over and over while the scan ran, a damaged block,
    /// or garbage in the table).
    pub skipped: u64,
    /// Whether the directory still changed (splits) in the last of
    /// [`RESCAN_PASSES`] passes: keys those splits moved may be missing.
    pub directory_changed: bool,
    /// Whether the caller stopped the scan.
    pub stopped: bool,
}

impl ScanReport {
    /// Whether the scan saw the whole table: not stopped, no split left
    /// unread, no slot skipped.
    pub fn complete(&self) -> bool {
        !self.stopped && !self.directory_changed && self.skipped == 0
    }
}

/// A slot to read a block for: where it is, its bucket, its word.
struct Pending {
    /// The slot's index in the subtable ([`image_slots`] order).
    index: usize,
    addr: RemotePtr,
    group: u32,
    bucket: usize,
    word: Slot,
}

/// What the scan took from one subtable read.
struct SubtableRead {
    /// Slots skipped (see [`ScanReport::skipped`]).
    skipped: u64,
    /// Per slot ([`image_slots`] order): the word whose pair was handed
    /// over, or 0. A split puts each key at the same position in its half,
    /// with the same word until a writer changes it, so a half read again
    /// after a split passes over the slots that still hold what was handed
    /// over from the subtable it came from.
    handed: Vec<u64>,
}

/// A subtable to read: where, its suffix, and the subtable read before
/// whose keys it holds now (a split's half: the split subtable).
type ToRead = (RemotePtr, Suffix, Option<RemotePtr>);

/// The distinct subtables `entries` name, with their suffixes; with
/// `before`, only those named by an entry that differs (pointer or depth)
/// from `before`'s for the same index (a directory that doubled repeats
/// its lower half), with the subtable that entry named.
pub(super) fn subtables_of(
    entries: &[DirEntry],
    before: Option<&[DirEntry]>,
) -> Result<Vec<ToRead>, Error> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let old = before.and_then(|b| b.get(i % b.len().max(1)));
        if let Some(old) = old {
            if old.ptr() == e.ptr() && old.local_depth() == e.local_depth() {
                continue;
            }
        }
        let d = e.local_depth();
        if seen.insert(e.ptr()) {
            let suffix = Suffix::new((i as u64 & low_mask(d)) as u32, d)?;
            out.push((e.ptr(), suffix, old.map(|o| o.ptr())));
        }
    }
    Ok(out)
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
        let mut before: Vec<DirEntry> = self.dir.entries().to_vec();
        let mut todo = subtables_of(&before, None)?;
        let mut report = ScanReport::default();
        // What each subtable read gave, for the subtables the directory
        // names: one a split replaced hands its keys on to its halves,
        // which are read again (and its skipped slots with them).
        let mut reads: HashMap<RemotePtr, SubtableRead> = HashMap::new();
        let mut passes = 0;
        loop {
            for &(sub, suffix, prior) in &todo {
                report.subtables += 1;
                let prior = prior
                    .and_then(|p| reads.get(&p))
                    .map(|r| r.handed.as_slice());
                let (read, stopped) =
                    self.scan_subtable(sub, suffix, prior, &mut each, &mut report)?;
                reads.insert(sub, read);
                if stopped {
                    report.stopped = true;
                    report.skipped = reads.values().map(|r| r.skipped).sum();
                    return Ok(report);
                }
            }
            let named: HashSet<RemotePtr> = before.iter().map(|e| e.ptr()).collect();
            reads.retain(|sub, _| named.contains(sub));
            self.refresh_directory()?;
            let now = self.dir.entries();
            let changed = subtables_of(now, Some(&before))?;
            if changed.is_empty() {
                break;
            }
            if passes == RESCAN_PASSES {
                report.directory_changed = true;
                break;
            }
            passes += 1;
            report.rescanned += changed.len() as u64;
            before = now.to_vec();
            todo = changed;
        }
        report.skipped = reads.values().map(|r| r.skipped).sum();
        Ok(report)
    }

    /// Reads subtable `sub` and its blocks, and hands its pairs to `each`
    /// (each key once; none whose slot holds the word `prior` handed over
    /// at its position): what it took, and whether `each` stopped the scan.
    fn scan_subtable(
        &mut self,
        sub: RemotePtr,
        suffix: Suffix,
        prior: Option<&[u64]>,
        each: &mut impl FnMut(&[u8], &[u8]) -> bool,
        report: &mut ScanReport,
    ) -> Result<(SubtableRead, bool), Error> {
        let geometry = self.table.geometry;
        let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than one READ",
        })?;
        let mut skipped = 0;
        let mut res = self.exec(&[RemoteOp::Read { ptr: sub, len }])?;
        let image = take_read(&mut res, 0)?;
        let slots = image_slots(&image, geometry);
        let mut handed = vec![0u64; slots.len()];
        let mut pending: Vec<Pending> = Vec::new();
        for (index, s) in slots.into_iter().enumerate() {
            let word = s.word.thawed();
            if s.word.validate().is_err() {
                // Garbage in a slot: whatever pair it held is lost to the
                // scan, which must say so.
                skipped += 1;
            } else if word.is_empty() || word.is_tentative() {
                // Empty, or an insert not committed (yet): no pair.
                continue;
            } else if prior.and_then(|p| p.get(index)) == Some(&word.raw()) {
                // Handed over from the subtable this one split from.
                if let Some(h) = handed.get_mut(index) {
                    *h = word.raw();
                }
            } else {
                pending.push(Pending {
                    index,
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
                let malformed;
                (pending, malformed) = self.reread_slots(pending)?;
                skipped += malformed;
                if pending.is_empty() {
                    break;
                }
            }
            let blocks = self.read_blocks(&pending)?;
            let mut again = Vec::new();
            for (p, buf) in pending.into_iter().zip(blocks) {
                let Some(buf) = buf else {
                    // Its pointer leads out of its node's memory.
                    skipped += 1;
                    continue;
                };
                let fits = kv::decode_checked(&buf).ok().filter(|kv| {
                    let hash = KeyHash::of(kv.key());
                    suffix.contains(hash.dir_hash())
                        && hash.fingerprint().get() == p.word.fingerprint()
                        && position_fits(&hash, geometry, p.group, p.bucket)
                        && kv.block_len() == p.word.block_len()
                });
                match fits {
                    Some(kv) => {
                        if let Some(h) = handed.get_mut(p.index) {
                            *h = p.word.raw();
                        }
                        if keys.insert(kv.key().to_vec()) {
                            report.pairs += 1;
                            if !each(kv.key(), kv.value()) {
                                return Ok((SubtableRead { skipped, handed }, true));
                            }
                        }
                    }
                    None => again.push(p),
                }
            }
            pending = again;
        }
        skipped += pending.len() as u64;
        Ok((SubtableRead { skipped, handed }, false))
    }

    /// The blocks the words of `pending` point to; `None` for a pointer
    /// out of its node's memory (garbage in a slot that passed
    /// validation: the doorbell of all of them is refused, so they are
    /// read one by one then).
    fn read_blocks(&mut self, pending: &[Pending]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let op = |p: &Pending| RemoteOp::Read {
            ptr: p.word.ptr(),
            len: p.word.block_len() as u32,
        };
        let out_of_bounds = |e: &Error| {
            matches!(
                e,
                Error::Transport(
                    TransportError::OutOfBounds { .. }
                        | TransportError::Misaligned { .. }
                        | TransportError::NoSuchNode { .. }
                )
            )
        };
        let ops: Vec<RemoteOp<'_>> = pending.iter().map(op).collect();
        match self.exec(&ops) {
            Ok(mut res) => (0..pending.len())
                .map(|i| take_read(&mut res, i).map(Some))
                .collect(),
            Err(e) if out_of_bounds(&e) => pending
                .iter()
                .map(|p| match self.exec(&[op(p)]) {
                    Ok(mut res) => take_read(&mut res, 0).map(Some),
                    Err(e) if out_of_bounds(&e) => Ok(None),
                    Err(e) => Err(e),
                })
                .collect(),
            Err(e) => Err(e),
        }
    }

    /// Reads the slots of `pending` again: those that still hold a block,
    /// with their words now (a slot emptied meanwhile is a key deleted
    /// during the scan), and how many now hold a malformed word.
    fn reread_slots(&mut self, pending: Vec<Pending>) -> Result<(Vec<Pending>, u64), Error> {
        let ops: Vec<RemoteOp<'_>> = pending
            .iter()
            .map(|p| RemoteOp::Read {
                ptr: p.addr,
                len: 8,
            })
            .collect();
        let mut res = self.exec(&ops)?;
        let mut out = Vec::new();
        let mut malformed = 0;
        for (i, p) in pending.into_iter().enumerate() {
            let buf = take_read(&mut res, i)?;
            let word = Slot::from_raw(read_u64(&buf, 0));
            if word.validate().is_err() {
                malformed += 1;
            } else if !word.thawed().is_empty() && !word.is_tentative() {
                out.push(Pending {
                    word: word.thawed(),
                    ..p
                });
            }
        }
        Ok((out, malformed))
    }
}
