//! Sweeping the tentative copies dead inserters left (`race-kv sweep`).
//!
//! An inserter that dies between placing its tentative copy and committing
//! or withdrawing it leaves the copy in its slot (protocol, "Insert"). No
//! reader sees it, but it holds the slot and its KV block until the next
//! insert of the same key removes it; a key never inserted again keeps it.
//! [`Client::sweep_tentative`] removes them table-wide:
//!
//! 1. Read every subtable the directory names (one READ each) and note its
//!    tentative slot words, unfrozen (a frozen one is being split: its
//!    half carries it on, for a later sweep).
//! 2. Wait until `grace_ticks - max_op_ticks` have passed since the last
//!    of those reads: an inserter commits only within `max_op_ticks` of
//!    placing its copy, and withdraws past that, so a copy still in place
//!    after that wait was left by a dead one. The bound is the one a
//!    settling insert uses for a rival it waits for (`Client::settle`),
//!    with the same skew margin.
//! 3. CAS each noted slot from its word to empty, one doorbell per
//!    subtable, and retire the block of each CAS that applied (the remover
//!    retires, as when an insert removes a rival).
//!
//! Removing a tentative copy is always safe, whoever owns it: it is what a
//! settling insert does to rivals above its own copy. A live owner whose
//! copy was removed sees it gone and searches again, and does not retire
//! the block itself; and of its commit and the sweep's CAS, whichever comes
//! second fails. The wait only keeps the sweep out of the way of inserts
//! that are still settling. A slot whose word changed meanwhile (the owner
//! committed or withdrew, a settling insert removed it, a split froze it)
//! fails its CAS and is counted as [`SweepReport::changed`]; a block's
//! slot word is never the same twice within a grace period (a block is
//! reused only after one), so a CAS that applies removed the copy seen.

use crate::error::Error;
use crate::layout::slot::{RemotePtr, Slot};
use crate::remote::{RemoteOp, Transport};

use super::engine::{cas_old, take_read};
use super::scan::subtables_of;
use super::split::image_slots;
use super::Client;

/// What [`Client::sweep_tentative`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Subtables read.
    pub subtables: u64,
    /// Unfrozen tentative slots the reads found.
    pub tentative: u64,
    /// Of those, the ones removed (their blocks retired by this client).
    pub removed: u64,
    /// Of those, the ones whose word changed before the sweep's CAS (an
    /// insert committed, withdrew or removed it; a split froze it).
    pub changed: u64,
    /// Tentative slots left alone because their subtable is being split
    /// (the split's half carries them on).
    pub splitting: u64,
    /// Ticks waited between the reads and the CASes (0 when nothing was
    /// found).
    pub waited_ticks: u64,
}

impl<T: Transport> Client<T> {
    /// Removes the tentative copies that dead inserters left in the table
    /// (see [`crate::client::protocol`], "Insert"): reads every subtable,
    /// waits `grace_ticks - max_op_ticks` (on this client's clock; 200 ms
    /// with the defaults in microseconds) when it found any, and removes
    /// those still unchanged, retiring their blocks. It runs beside other
    /// clients' operations; a copy whose owner is still settling is left
    /// to it. The module docs (`client/sweep.rs`) have the argument.
    ///
    /// # Errors
    /// Transport errors; table errors for a directory or subtable that
    /// does not parse. Copies removed before an error stay removed (their
    /// blocks retired).
    pub fn sweep_tentative(&mut self) -> Result<SweepReport, Error> {
        self.refresh_directory()?;
        let geometry = self.table.geometry;
        let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
            reason: "subtable larger than one READ",
        })?;
        let mut report = SweepReport::default();
        let mut found: Vec<Vec<(RemotePtr, Slot)>> = Vec::new();
        for (sub, _, _) in subtables_of(self.dir.entries(), None)? {
            report.subtables += 1;
            let mut res = self.exec(&[RemoteOp::Read { ptr: sub, len }])?;
            let image = take_read(&mut res, 0)?;
            let mut here = Vec::new();
            for s in image_slots(&image, geometry) {
                if s.word.validate().is_err() || !s.word.thawed().is_tentative() {
                    continue;
                }
                if s.word.is_frozen() {
                    report.splitting += 1;
                } else {
                    here.push((sub.add(s.offset as u64)?, s.word));
                }
            }
            report.tentative += here.len() as u64;
            if !here.is_empty() {
                found.push(here);
            }
        }
        if found.is_empty() {
            return Ok(report);
        }
        // Every copy noted was in place at or before `seen`.
        let seen = self.now();
        report.waited_ticks = self.wait_past(seen, self.tentative_dead_after());
        for here in found {
            let ops: Vec<RemoteOp<'_>> = here
                .iter()
                .map(|&(ptr, word)| RemoteOp::Cas {
                    ptr,
                    expect: word.raw(),
                    new: Slot::EMPTY.raw(),
                })
                .collect();
            let res = self.exec(&ops)?;
            for (i, &(_, word)) in here.iter().enumerate() {
                if cas_old(&res, i)? == word.raw() {
                    self.retire(word);
                    report.removed += 1;
                } else {
                    report.changed += 1;
                }
            }
        }
        Ok(report)
    }
}
