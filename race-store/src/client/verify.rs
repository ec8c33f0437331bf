//! A whole-table checker for tests and tools: reads the directory, every
//! subtable and every KV block, and checks the invariants of
//! [`super::protocol`]; and its light form, which reads no KV block, for
//! what each memory node's memory holds ([`TableCheck::accounts`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::hash::KeyHash;
use crate::layout::bucket::BUCKETS_PER_GROUP;
use crate::layout::directory::DirectoryRepr;
use crate::layout::kv;
use crate::layout::low_mask;
use crate::layout::slot::{RemotePtr, Slot};
use crate::layout::subtable::{Subtable, Suffix};
use crate::layout::table::{node0_heap_start, SplitLogRepr, SPLIT_LOG_SIZE};
use crate::layout::usage::UsageRepr;
use crate::memory::RESERVED_PREFIX;
use crate::remote::{RemoteOp, Transport};

use super::alloc::{class_bytes, class_of};
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
    /// Keys present in more than one slot (committed copies); each is also
    /// a problem (`problems`).
    pub duplicates: usize,
    /// Tentative slots in live subtables: copies of inserts still settling,
    /// or left by inserters that died before they committed or withdrew
    /// (not part of the table's content; the next insert of the key
    /// removes them, and so does [`Client::sweep_tentative`]).
    pub tentative_slots: usize,
    /// Every key with the value of its lowest-addressed copy, sorted by key
    /// ([`Client::check_table`] only).
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Distinct keys with a committed copy (a full check's; 0 from
    /// [`Client::account_table`]).
    pub keys: usize,
    /// Broken invariants, in words. Empty for a consistent table.
    pub problems: Vec<String>,
    /// The suffix of every live subtable.
    pub subtable_suffixes: Vec<Suffix>,
    /// The table's memory nodes (its superblock).
    pub nodes: u8,
    /// Bytes of one subtable (the table's geometry).
    pub subtable_bytes: u64,
    /// Bytes below node 0's heap: its records and the directory area, sized
    /// for the table's largest global depth (other nodes reserve
    /// [`RESERVED_PREFIX`]).
    pub node0_prefix: u64,
    /// Bytes of the KV blocks slots link (their size classes), each block
    /// once, by the memory node holding it (index: node id; as long as the
    /// highest node id holding one, plus one).
    pub linked_bytes_per_node: Vec<u64>,
}

/// What a memory node's bytes in use hold, by a table check and the node's
/// usage record read about then ([`TableCheck::accounts`]). Writers that
/// run meanwhile make it approximate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeAccount {
    /// Handed out and not pooled ([`UsageRepr::in_use`]).
    pub in_use: u64,
    /// Below the node's heap: its records (and node 0's directory area).
    pub reserved: u64,
    /// The live subtables it holds.
    pub subtables: u64,
    /// Subtables splits retired (kept, never reused: a client following a
    /// stale directory entry finds a retired subtable, never garbage), as
    /// splits place them (by suffix modulo the node count); `None` when the
    /// table's initial depth is not known.
    pub retired_subtables: Option<u64>,
    /// The KV blocks slots link.
    pub linked: u64,
    /// The rest: what clients hold (grants not carved yet, free blocks,
    /// blocks in their grace period, blocks written and not linked yet,
    /// spare subtables) and what dead clients and splitters left behind,
    /// which stays allocated while the node runs (`docs/design.md`, "Known
    /// gaps"). With no client running, what was lost.
    pub unlinked: u64,
}

impl TableCheck {
    /// Each memory node's bytes in use (`usages`: its usage record, from
    /// [`crate::deploy::Store::usage`] or [`crate::memory::MemoryNode::usage`]),
    /// split by what this check found ([`NodeAccount`]); `initial_depth`:
    /// the table's initial global depth (a memory node's
    /// [`crate::memory::TableConfig`]), which tells the subtables splits
    /// retired.
    pub fn accounts(
        &self,
        usages: &[(u8, UsageRepr)],
        initial_depth: Option<u8>,
    ) -> Vec<(u8, NodeAccount)> {
        let retired = initial_depth.map(|d| self.retired_per_node(d));
        usages
            .iter()
            .map(|&(node, usage)| {
                let i = usize::from(node);
                let subtables = self.subtables_per_node.get(i).copied().unwrap_or(0) as u64
                    * self.subtable_bytes;
                let retired_subtables = retired
                    .as_ref()
                    .map(|r| r.get(i).copied().unwrap_or(0) * self.subtable_bytes);
                let linked = self.linked_bytes_per_node.get(i).copied().unwrap_or(0);
                let in_use = usage.in_use();
                let prefix = if node == 0 {
                    self.node0_prefix
                } else {
                    RESERVED_PREFIX
                };
                let reserved = prefix.min(in_use);
                let known = reserved + subtables + retired_subtables.unwrap_or(0) + linked;
                let account = NodeAccount {
                    in_use,
                    reserved,
                    subtables,
                    retired_subtables,
                    linked,
                    unlinked: in_use.saturating_sub(known),
                };
                (node, account)
            })
            .collect()
    }

    /// Subtables retired by the splits that made the live ones out of the
    /// `2^initial_depth` initial subtables (every ancestor of a live
    /// subtable below its depth, down to the initial depth), counted by
    /// the node splits place each on.
    fn retired_per_node(&self, initial_depth: u8) -> Vec<u64> {
        let mut retired = BTreeSet::new();
        for s in &self.subtable_suffixes {
            for d in initial_depth..s.depth() {
                retired.insert((d, s.bits() & low_mask(d) as u32));
            }
        }
        let nodes = u32::from(self.nodes.max(1));
        let mut per_node = vec![0u64; usize::from(self.nodes.max(1))];
        for (_, bits) in retired {
            if let Some(n) = per_node.get_mut((bits % nodes) as usize) {
                *n += 1;
            }
        }
        per_node
    }
}

/// A non-empty slot of a live subtable: its address, bucket group, bucket
/// and word (thawed).
type LiveSlot = (RemotePtr, u32, usize, Slot);

/// What both checks read first: the directory (checked), the split log,
/// and every live subtable with its suffix; the check so far, the
/// subtables, and the length of one subtable's READ.
#[allow(clippy::type_complexity)]
fn check_prelude<T: Transport>(
    c: &mut Client<T>,
) -> Result<(TableCheck, BTreeMap<RemotePtr, Suffix>, u32), Error> {
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
    check.subtable_suffixes = subtables.values().copied().collect();
    check.nodes = c.table.nodes;
    for sub in subtables.keys() {
        let node = usize::from(sub.node());
        if check.subtables_per_node.len() <= node {
            check.subtables_per_node.resize(node + 1, 0);
        }
        if let Some(n) = check.subtables_per_node.get_mut(node) {
            *n += 1;
        }
    }
    check.subtable_bytes = geometry.bytes();
    check.node0_prefix = node0_heap_start(c.table.max_global_depth)?;
    let len = u32::try_from(geometry.bytes()).map_err(|_| Error::BadTable {
        reason: "subtable larger than one READ",
    })?;
    Ok((check, subtables, len))
}

/// Reads live subtable `sub` (`suffix`), checks its bucket headers and
/// slot words (problems into `check`, frozen slots counted); its non-empty
/// slots.
fn check_subtable<T: Transport>(
    c: &mut Client<T>,
    check: &mut TableCheck,
    sub: RemotePtr,
    suffix: Suffix,
    len: u32,
) -> Result<Vec<LiveSlot>, Error> {
    let geometry = c.table.geometry;
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
    Ok(slots)
}

/// Adds `bytes` to node `node`'s linked bytes.
fn add_linked(check: &mut TableCheck, node: u8, bytes: u64) {
    let node = usize::from(node);
    if check.linked_bytes_per_node.len() <= node {
        check.linked_bytes_per_node.resize(node + 1, 0);
    }
    if let Some(n) = check.linked_bytes_per_node.get_mut(node) {
        *n += bytes;
    }
}

/// The block a slot links: its allocation's bytes (its size class: a
/// slot says its length).
fn block_bytes(word: Slot) -> u64 {
    class_bytes(class_of(word.len_units()))
}

/// Counts a key with more than one committed copy as a duplicate, and
/// says where its copies are: a broken invariant (an update changes one of
/// them, and a read may find the other).
fn note_copies<V>(check: &mut TableCheck, key: &[u8], copies: &[(RemotePtr, V)]) {
    if copies.len() > 1 {
        check.duplicates += 1;
        let at: Vec<_> = copies.iter().map(|(addr, _)| *addr).collect();
        check.problems.push(format!(
            "key \"{}\": {} committed copies, in slots {at:?}",
            key.escape_ascii(),
            copies.len()
        ));
    }
}

/// [`Client::account_table`]: the directory and the subtables only.
pub(crate) fn account_table<T: Transport>(c: &mut Client<T>) -> Result<TableCheck, Error> {
    let (mut check, subtables, len) = check_prelude(c)?;
    // Each block once (a split copies slots before it clears the old
    // ones): sorted and deduplicated at the end, 16 bytes a slot.
    let mut blocks: Vec<(RemotePtr, u64)> = Vec::new();
    for (&sub, &suffix) in &subtables {
        for (_, _, _, word) in check_subtable(c, &mut check, sub, suffix, len)? {
            check.tentative_slots += usize::from(word.is_tentative());
            blocks.push((word.ptr(), block_bytes(word)));
        }
    }
    blocks.sort_unstable();
    blocks.dedup_by_key(|b| b.0);
    for (ptr, bytes) in blocks {
        add_linked(&mut check, ptr.node(), bytes);
    }
    Ok(check)
}

/// KV blocks a check reads in one doorbell batch.
const CHECK_READS: usize = 2048;

/// The full check; with `keep_pairs`, every pair kept (`pairs`), else keys
/// counted and duplicates found subtable by subtable (a committed copy
/// outside its key's subtable is a problem already), so that what is held
/// is one subtable's keys.
pub(crate) fn check_table<T: Transport>(
    c: &mut Client<T>,
    keep_pairs: bool,
) -> Result<TableCheck, Error> {
    let (mut check, subtables, len) = check_prelude(c)?;
    let geometry = c.table.geometry;
    let mut copies: BTreeMap<Vec<u8>, Vec<(RemotePtr, Vec<u8>)>> = BTreeMap::new();
    // Blocks linked, each once (a split copies slots before it clears the
    // old ones: two slots may link one block meanwhile).
    let mut linked: BTreeSet<RemotePtr> = BTreeSet::new();
    for (&sub, &suffix) in &subtables {
        let slots = check_subtable(c, &mut check, sub, suffix, len)?;
        if slots.is_empty() {
            continue;
        }
        // The blocks in parts: what is read at once stays bounded.
        for part in slots.chunks(CHECK_READS) {
            let ops: Vec<RemoteOp<'_>> = part
                .iter()
                .map(|(_, _, _, w)| RemoteOp::Read {
                    ptr: w.ptr(),
                    len: w.block_len() as u32,
                })
                .collect();
            let mut res = c.exec(&ops)?;
            for (i, &(addr, group, bucket, word)) in part.iter().enumerate() {
                let buf = take_read(&mut res, i)?;
                if linked.insert(word.ptr()) {
                    add_linked(&mut check, word.ptr().node(), block_bytes(word));
                }
                let kv = match kv::decode_checked(&buf) {
                    Ok(kv) => kv,
                    Err(e) => {
                        check.problems.push(format!("slot {addr:?}: block {e}"));
                        continue;
                    }
                };
                let hash = KeyHash::of(kv.key());
                check.tentative_slots += usize::from(word.is_tentative());
                if !suffix.contains(hash.dir_hash())
                    || hash.fingerprint().get() != word.fingerprint()
                    || !position_fits(&hash, geometry, group, bucket)
                    || kv.block_len() != word.block_len()
                {
                    check
                        .problems
                        .push(format!("slot {addr:?}: key does not belong here"));
                }
                if word.is_tentative() {
                    continue;
                }
                let value = if keep_pairs {
                    kv.value().to_vec()
                } else {
                    Vec::new()
                };
                copies
                    .entry(kv.key().to_vec())
                    .or_default()
                    .push((addr, value));
            }
        }
        if !keep_pairs {
            check.keys += copies.len();
            for (key, v) in &copies {
                note_copies(&mut check, key, v);
            }
            copies.clear();
        }
    }
    for (key, mut v) in copies {
        v.sort_by_key(|(addr, _)| *addr);
        note_copies(&mut check, &key, &v);
        if let Some((_, value)) = v.into_iter().next() {
            check.pairs.push((key, value));
        }
    }
    if keep_pairs {
        check.keys = check.pairs.len();
    }
    Ok(check)
}
