//! A whole-table checker for tests and tools: reads the directory, every
//! subtable and every KV block, and checks the invariants of
//! [`super::protocol`].

use std::collections::BTreeMap;

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::bucket::BUCKETS_PER_GROUP;
use crate::layout::directory::DirectoryRepr;
use crate::layout::kv;
use crate::layout::low_mask;
use crate::layout::slot::RemotePtr;
use crate::layout::subtable::{Subtable, Suffix};
use crate::layout::table::{SplitLogRepr, SPLIT_LOG_SIZE};
use crate::remote::{RemoteOp, Transport};

use super::engine::take_read;
use super::split::{image_slots, position_fits};
use super::Client;

/// What [`Client::check_table`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCheck {
    /// The directory's global depth.
    pub global_depth: u8,
    /// Distinct subtables the directory points to.
    pub subtables: usize,
    /// Of those, how many each memory node holds (index: node id; as long
    /// as the highest node id holding one, plus one).
    pub subtables_per_node: Vec<usize>,
    /// Whether the resize lock is held.
    pub locked: bool,
    /// Whether a split is logged (in progress or abandoned by a dead client).
    pub split_logged: bool,
    /// Frozen slots in live subtables (non-zero only during a split).
    pub frozen_slots: usize,
    /// Keys present in more than one slot.
    pub duplicates: usize,
    /// Every key with the value of its lowest-addressed copy, sorted by key.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Broken invariants, in words. Empty for a consistent table.
    pub problems: Vec<String>,
}

pub(crate) fn check_table<T: Transport>(c: &mut Client<T>) -> Result<TableCheck, Error> {
    c.refresh_directory()?;
    let geometry = c.table.geometry;
    let dir = DirectoryRepr {
        header: c.dir.header(),
        entries: c.dir.entries().to_vec(),
    };
    let mut check = TableCheck {
        global_depth: dir.global_depth(),
        locked: dir.header.is_locked(),
        ..TableCheck::default()
    };
    if let Err(e) = dir.check_consistency() {
        check.problems.push(format!("directory: {e}"));
    }
    let log_ptr = RemotePtr::new(0, c.table.split_log_offset)?;
    let mut res = c.exec(&[RemoteOp::Read {
        ptr: log_ptr,
        len: SPLIT_LOG_SIZE as u32,
    }])?;
    check.split_logged = !matches!(SplitLogRepr::parse(&take_read(&mut res, 0)?), Ok(None));

    let mut subtables: BTreeMap<RemotePtr, Suffix> = BTreeMap::new();
    for (i, e) in dir.entries.iter().enumerate() {
        let d = e.local_depth();
        let suffix = Suffix::new((i as u64 & low_mask(d)) as u32, d)?;
        subtables.entry(e.ptr()).or_insert(suffix);
    }
    check.subtables = subtables.len();
    for sub in subtables.keys() {
        let node = usize::from(sub.node());
        if check.subtables_per_node.len() <= node {
            check.subtables_per_node.resize(node + 1, 0);
        }
        if let Some(n) = check.subtables_per_node.get_mut(node) {
            *n += 1;
        }
    }
    let mut copies: BTreeMap<Vec<u8>, Vec<(RemotePtr, Vec<u8>)>> = BTreeMap::new();
    let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
        reason: "subtable larger than one READ",
    })?;
    for (&sub, &suffix) in &subtables {
        let mut res = c.exec(&[RemoteOp::Read { ptr: sub, len }])?;
        let image = take_read(&mut res, 0)?;
        let st = Subtable::new_checked(&image[..], geometry)?;
        for group in 0..geometry.groups() {
            for bucket in 0..BUCKETS_PER_GROUP {
                let b = st.bucket(group, bucket)?;
                if b.header().ok() != Some(suffix) {
                    check.problems.push(format!(
                        "subtable {sub:?} ({suffix:?}) bucket {group}/{bucket}: header ({}, {})",
                        b.local_depth(),
                        b.suffix()
                    ));
                }
            }
        }
        let mut slots = Vec::new();
        for s in image_slots(&image, geometry) {
            if let Err(e) = s.word.validate() {
                check.problems.push(format!("{sub:?}: {e}"));
                continue;
            }
            check.frozen_slots += usize::from(s.word.is_frozen());
            if !s.word.thawed().is_empty() {
                slots.push((
                    sub.add(s.offset as u64)?,
                    s.group,
                    s.bucket,
                    s.word.thawed(),
                ));
            }
        }
        if slots.is_empty() {
            continue;
        }
        let ops: Vec<RemoteOp<'_>> = slots
            .iter()
            .map(|(_, _, _, w)| RemoteOp::Read {
                ptr: w.ptr(),
                len: w.block_len() as u32,
            })
            .collect();
        let mut res = c.exec(&ops)?;
        for (i, (addr, group, bucket, word)) in slots.into_iter().enumerate() {
            let buf = take_read(&mut res, i)?;
            let kv = match kv::decode_checked(&buf) {
                Ok(kv) => kv,
                Err(e) => {
                    check.problems.push(format!("slot {addr:?}: block {e}"));
                    continue;
                }
            };
            let hash = KeyHash::of(kv.key());
            if !suffix.contains(hash.dir_hash())
                || hash.fingerprint().get() != word.fingerprint()
                || !position_fits(&hash, geometry, group, bucket)
                || kv.block_len() != word.block_len()
            {
                check
                    .problems
                    .push(format!("slot {addr:?}: key does not belong here"));
            }
            copies
                .entry(kv.key().to_vec())
                .or_default()
                .push((addr, kv.value().to_vec()));
        }
    }
    for (key, mut v) in copies {
        v.sort_by_key(|(addr, _)| *addr);
        check.duplicates += usize::from(v.len() > 1);
        if let Some((_, value)) = v.into_iter().next() {
            check.pairs.push((key, value));
        }
    }
    Ok(check)
}
