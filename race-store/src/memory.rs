//! In-process memory nodes and the transport that reaches them.
//!
//! A [`MemoryNode`] is a registered region (`Box<[AtomicU64]>`: word-granular
//! atomics, no `unsafe`; byte reads and writes are assembled from words) and
//! a coarse block allocator (the memory node's side of
//! [`Transport::alloc_block`](crate::remote::Transport::alloc_block)). A [`LocalCluster`] owns N of them behind an
//! `Arc`; each client gets its own [`LocalTransport`], and any number of
//! clients may run on any threads at once.
//!
//! The semantics are those of [`crate::remote`]: a batch executes in order,
//! each op on its own; every 8-byte word is read or written atomically
//! (`SeqCst`), a multi-word READ or WRITE is not atomic as a whole, CAS and
//! FAA are real atomic operations. [`LocalTransport::set_interleave`] yields
//! the thread between ops, which makes multi-word reads and writes of
//! concurrent clients interleave far more often (a stress knob);
//! [`LocalTransport::set_in_flight`] lets doorbells be posted ahead of their
//! completion ([`Transport::post_into`](crate::remote::Transport::post_into)), a posted batch executing only when
//! it is completed.
//!
//! Fault injection: [`LocalCluster::set_node_down`] makes every op to a node
//! (and every allocation on it) fail with [`TransportError::NodeDown`] until
//! it is brought back. Client crashes are injected per client with
//! [`crate::remote::FaultInjector`].
//!
//! ## Memory node 0 and bootstrap
//! [`MemoryNode::format`] lays out a new table on node 0 (see
//! [`crate::layout::table`] for the map): the superblock at offset 0, an idle
//! split log at 64, the directory at the fixed [`DIR_PTR`] (node 0, offset
//! 4096) with room to double up to `max_global_depth`, then the heap. The
//! `2^initial_global_depth` initial subtables (every bucket header set) are
//! spread over the nodes as splits place subtables, by suffix modulo the
//! node count ([`TableConfig::initial_subtable`]): node 0's at the start of
//! its heap, each other node's at the start of its own, laid out by that
//! node ([`MemoryNode::lay_out_share`]) before it serves. A client learns
//! everything else from the superblock when it opens. On other nodes the
//! first 4 KiB are reserved too, so that offset 0 is never a valid block on
//! any node.

use crate::sync::AtomicU64;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::holders::{HolderStats, Holders, DEFAULT_GRANT_LEASE};
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{DirEntry, DirectoryRepr};
use crate::layout::slot::{RemotePtr, MAX_OFFSET};
use crate::layout::subtable::{Subtable, Suffix};
use crate::layout::table::{
    node0_heap_start, SuperblockRepr, DIR_OFFSET, DIR_PTR, SPLIT_LOG_OFFSET, SPLIT_LOG_SIZE,
    SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE,
};
use crate::layout::usage::{UsageRepr, USAGE_OFFSET, USAGE_SIZE};
use crate::pool::{PoolStats, Refusal, ReturnPool, MAX_GRANT_RUNS};
use crate::remote::{Cause, TransportError};

mod collect;
mod grants;
mod local;
mod table;
#[cfg(test)]
mod tests;

pub use grants::TAKEBACK_CHUNK_BLOCKS;
pub use local::{ClusterConfig, LocalCluster, LocalTransport};
pub use table::TableConfig;

/// Alignment of every block the node allocator hands out.
pub const BLOCK_ALIGN: u64 = 64;
/// Bytes reserved at the start of every node (offset 0 is never a block).
pub const RESERVED_PREFIX: u64 = 4096;
const _: () = assert!(USAGE_OFFSET + USAGE_SIZE as u64 <= RESERVED_PREFIX);

/// How often a serving node rewrites its usage record
/// ([`MemoryNode::publish_usage`]).
pub const USAGE_EVERY: Duration = Duration::from_secs(1);

/// How often a serving memory node looks whether its usage changed, and
/// rewrites its record if it did: `race-kv usage` right after a load sees
/// the load (the record was up to [`USAGE_EVERY`] old before).
pub const USAGE_CHANGED_EVERY: Duration = Duration::from_millis(100);

/// Usage figures of one memory node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Size of the region.
    pub capacity: u64,
    /// Bytes handed out by the block allocator (including the reserved
    /// prefix and, on node 0, the table metadata and directory area).
    pub heap_used: u64,
    /// Blocks handed out.
    pub blocks: u64,
    /// Blocks clients gave back ([`crate::pool`]).
    pub pool: PoolStats,
    /// Bytes from the region's start that were faulted in ahead of use
    /// ([`MemoryNode::prefault_ahead`]).
    pub prefaulted: u64,
    /// Clients holding grants, and what was taken back from dead ones
    /// ([`crate::holders`]).
    pub holders: HolderStats,
}

/// Bytes of the region a memory node keeps faulted in beyond what it
/// handed out ([`MemoryNode::prefault_ahead`]).
pub const PREFAULT_AHEAD: u64 = 16 << 20;

/// Most bytes one [`MemoryNode::prefault_ahead`] faults in, so that a
/// serving node answers between steps.
pub const PREFAULT_STEP: u64 = 2 << 20;

#[derive(Debug)]
struct Heap {
    /// Where memory that clients may give back starts.
    floor: u64,
    next: u64,
    blocks: u64,
    pool: ReturnPool,
    /// Who holds which grants ([`crate::holders`]).
    holders: Holders,
    /// The node's microseconds at which ended leases are next looked for.
    expiry_check_at: u64,
    /// Start -> length of every block [`MemoryNode::alloc`] handed out
    /// (subtables, live or retired, and coarse blocks of clients of older
    /// nodes): a collection never takes them.
    coarse: BTreeMap<u64, u64>,
    /// The collection under way, if any ([`collect`]).
    collection: Option<collect::Collection>,
}

/// The bytes behind a memory node: plain atomic words in this process
/// ([`WordMemory`]), or a registered RDMA region (see `crate::rdma`).
/// Callers check ranges before calling.
pub trait NodeMemory: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn len_bytes(&self) -> u64;
    /// Copies `buf.len()` bytes at `offset` out (in range).
    fn read_into(&self, offset: u64, buf: &mut [u8]);
    /// Copies `bytes` in at `offset` (in range).
    fn write_from(&self, offset: u64, bytes: &[u8]);
    /// Faults `offset..offset + len` (in range) in without changing it,
    /// where the memory is backed lazily (see
    /// [`MemoryNode::prefault_ahead`]). The default does nothing: memory
    /// that is already in (this process's words, or a NIC's pinned
    /// registration).
    fn prefault(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }
}

/// A region of atomic words in this process (no `unsafe`): byte reads and
/// writes are assembled from words; partial words are merged with a CAS
/// loop so concurrent writers of other bytes of the word are not lost.
#[derive(Debug)]
pub struct WordMemory {
    words: Box<[AtomicU64]>,
}

impl WordMemory {
    /// `bytes` zeroed bytes (rounded up to 8).
    pub fn new(bytes: u64) -> Self {
        let n = usize::try_from(bytes.div_ceil(8)).unwrap_or(0);
        WordMemory {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn word(&self, offset: u64) -> Option<&AtomicU64> {
        usize::try_from(offset / 8)
            .ok()
            .and_then(|i| self.words.get(i))
    }
}

impl NodeMemory for WordMemory {
    fn len_bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        let mut at = offset;
        let mut filled = 0;
        while at < end {
            let word = self
                .word(at)
                .map_or(0, |w| w.load(Ordering::SeqCst))
                .to_le_bytes();
            let from = (at % 8) as usize;
            let take = (8 - from).min((end - at) as usize);
            if let (Some(dst), Some(src)) = (
                buf.get_mut(filled..filled + take),
                word.get(from..from + take),
            ) {
                dst.copy_from_slice(src);
            }
            filled += take;
            at += take as u64;
        }
    }

    fn write_from(&self, offset: u64, bytes: &[u8]) {
        let mut at = offset;
        let mut rest = bytes;
        while !rest.is_empty() {
            let from = (at % 8) as usize;
            let take = (8 - from).min(rest.len());
            let (chunk, tail) = rest.split_at(take);
            if let Some(word) = self.word(at) {
                if take == 8 {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(chunk);
                    word.store(u64::from_le_bytes(w), Ordering::SeqCst);
                } else {
                    let _ = word.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |old| {
                        let mut w = old.to_le_bytes();
                        if let Some(dst) = w.get_mut(from..from + take) {
                            dst.copy_from_slice(chunk);
                        }
                        Some(u64::from_le_bytes(w))
                    });
                }
            }
            at += take as u64;
            rest = tail;
        }
    }
}

/// One memory node: a region and a coarse block allocator. In process
/// ([`WordMemory`], the default) it also serves one-sided operations
/// itself; over RDMA the NIC does.
#[derive(Debug)]
pub struct MemoryNode<M: NodeMemory = WordMemory> {
    id: u8,
    mem: M,
    /// The pool's time base.
    born: Instant,
    heap: Mutex<Heap>,
    down: AtomicBool,
    /// The region's first bytes up to here were faulted in (a plain `std`
    /// atomic even under loom: no protocol reads it).
    prefaulted: std::sync::atomic::AtomicU64,
}

impl MemoryNode {
    /// A zeroed in-process node `id` of `bytes` bytes (rounded up to 8).
    pub fn new(id: u8, bytes: u64) -> Self {
        MemoryNode::with_memory(id, WordMemory::new(bytes))
    }
}

impl<M: NodeMemory> MemoryNode<M> {
    /// Node `id` over `mem` (zeroed), its heap starting after the reserved
    /// prefix.
    pub fn with_memory(id: u8, mem: M) -> Self {
        MemoryNode {
            id,
            mem,
            born: Instant::now(),
            heap: Mutex::new(Heap {
                floor: RESERVED_PREFIX,
                next: RESERVED_PREFIX,
                blocks: 0,
                pool: ReturnPool::new(),
                holders: Holders::new(DEFAULT_GRANT_LEASE),
                expiry_check_at: 0,
                coarse: BTreeMap::new(),
                collection: None,
            }),
            down: AtomicBool::new(false),
            prefaulted: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Microseconds since the node was made (the pool's time).
    fn micros(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The memory behind the node.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The node id.
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Size of the region in bytes.
    pub fn capacity(&self) -> u64 {
        self.mem.len_bytes()
    }

    /// Whether the node is failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Fails (or revives) the node.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Usage figures.
    pub fn stats(&self) -> NodeStats {
        let heap = self.heap.lock();
        NodeStats {
            capacity: self.capacity(),
            heap_used: heap.next,
            blocks: heap.blocks,
            pool: heap.pool.stats(),
            prefaulted: self.prefaulted.load(Ordering::Relaxed),
            holders: heap.holders.stats(),
        }
    }

    /// Writes the node's usage record ([`crate::layout::usage`]) into its
    /// reserved prefix, stamped with `written_ms` (the wall clock in ms
    /// since the epoch), for clients to READ. A serving node's upkeep
    /// thread calls it every [`USAGE_EVERY`], and within
    /// [`USAGE_CHANGED_EVERY`] of a change.
    pub fn publish_usage(&self, written_ms: u64) {
        self.write_usage(&self.usage(written_ms));
    }

    /// Writes `record` as the node's usage record (see
    /// [`MemoryNode::publish_usage`]).
    pub fn write_usage(&self, record: &UsageRepr) {
        if USAGE_OFFSET + USAGE_SIZE as u64 <= self.capacity() {
            self.mem.write_from(USAGE_OFFSET, &record.emit());
        }
    }

    /// The node's usage now, as its record holds it, stamped `written_ms`.
    pub fn usage(&self, written_ms: u64) -> UsageRepr {
        let s = self.stats();
        UsageRepr {
            written_ms,
            capacity: s.capacity,
            heap_used: s.heap_used,
            pooled: s.pool.pooled,
            cooling: s.pool.cooling,
            returned: s.pool.returned,
            reused: s.pool.reused,
            reclaimed: s.holders.reclaimed,
            ended: s.holders.ended,
            holders: u32::try_from(s.holders.holders).unwrap_or(u32::MAX),
            doomed_kib: u32::try_from(s.holders.doomed >> 10).unwrap_or(u32::MAX),
            ran_out_since_collection: Some(
                u32::try_from(s.holders.ran_out_since_collection).unwrap_or(u32::MAX),
            ),
        }
    }

    /// Faults in the next part of the region beyond what the node handed
    /// out, so that at least [`PREFAULT_AHEAD`] bytes past its heap's end
    /// (or the region's end) are in; at most [`PREFAULT_STEP`] bytes per
    /// call. Returns the bytes this call faulted in: 0 once caught up.
    ///
    /// Why: on a NIC, registered memory is pinned, so no remote WRITE ever
    /// waits for a page. Memory backed lazily (the sim's, a daemon's shared
    /// memory) gets its pages at first touch, and the sim's NIC touches
    /// them in the thread of the client whose WRITE lands there: the
    /// kernel's zeroing (here 1.4 ms per 2 MiB in 4 KiB pages, 2.5 ms for
    /// one 2 MiB huge page) became a stall of that client's operation,
    /// and of every operation batched with it. A serving node calls this
    /// between requests ([`crate::rdma::MemoryNodeServer::poll_once`]), so
    /// its own thread pays instead. It never changes a byte.
    pub fn prefault_ahead(&self) -> u64 {
        let handed_out = self.heap.lock().next;
        let target = handed_out
            .saturating_add(PREFAULT_AHEAD)
            .min(self.capacity());
        let from = self.prefaulted.load(Ordering::Relaxed);
        if from >= target {
            return 0;
        }
        let len = (target - from).min(PREFAULT_STEP);
        self.mem.prefault(from, len);
        self.prefaulted.fetch_max(from + len, Ordering::Relaxed);
        len
    }

    /// Lays out a new table on this node, which must be node 0 (see the module
    /// docs); `nodes` is the cluster size recorded in the superblock. The
    /// directory points at every initial subtable where
    /// [`TableConfig::initial_subtable`] places it; this node lays out its
    /// own share, and each other node must lay out its share
    /// ([`MemoryNode::lay_out_share`]) before a client opens the table.
    ///
    /// # Errors
    /// [`Error::BadTable`] if this is not node 0, the node was already used,
    /// or the depths are out of range; [`Error::OutOfMemory`] if the node is
    /// too small.
    pub fn format(&self, table: &TableConfig, nodes: u8) -> Result<(), Error> {
        if self.id != 0 {
            return Err(Error::BadTable {
                reason: "a table is formatted on node 0",
            });
        }
        table.check_depths()?;
        let g = table.initial_global_depth;
        {
            let mut heap = self.heap.lock();
            if heap.next != RESERVED_PREFIX {
                return Err(Error::BadTable {
                    reason: "node 0 is already in use",
                });
            }
            heap.next = node0_heap_start(table.max_global_depth)?;
            heap.floor = heap.next;
            if heap.next > self.capacity() {
                return Err(Error::OutOfMemory {
                    what: "directory area on node 0",
                });
            }
        }
        let mut sb = [0u8; SUPERBLOCK_SIZE];
        SuperblockRepr {
            geometry: table.geometry,
            max_global_depth: table.max_global_depth,
            nodes,
            dir_offset: DIR_OFFSET,
            split_log_offset: SPLIT_LOG_OFFSET,
        }
        .emit(&mut sb)?;
        self.write_share(table, nodes)?;
        let entries = (0..1u32 << g)
            .map(|bits| Ok(DirEntry::new(g, table.initial_subtable(bits, nodes)?)?))
            .collect::<Result<Vec<_>, Error>>()?;
        let dir = DirectoryRepr {
            header: DirHeader::unlocked(g)?,
            entries,
        };
        dir.check_consistency()?;
        let mut dir_bytes = vec![0u8; dir.buffer_len()];
        dir.emit(&mut dir_bytes)?;
        self.write(DIR_PTR.offset(), &dir_bytes)?;
        self.write(SPLIT_LOG_OFFSET, &[0u8; SPLIT_LOG_SIZE])?;
        self.write(SUPERBLOCK_OFFSET, &sb)?;
        Ok(())
    }

    /// Lays out this node's share of the initial subtables of `table` in a
    /// store of `nodes` memory nodes, as node 0's directory expects them
    /// ([`TableConfig::initial_subtable`]); nothing for a share that is
    /// empty (`2^initial_global_depth` subtables for `nodes` nodes: node
    /// `i` holds those whose suffix is `i` modulo `nodes`). Node 0 lays out
    /// its own share when it formats. The node must be fresh.
    ///
    /// # Errors
    /// [`Error::BadTable`] for node 0, an id not below `nodes`, a node
    /// already used or bad depths; [`Error::OutOfMemory`] if the node is
    /// too small for its share.
    pub fn lay_out_share(&self, table: &TableConfig, nodes: u8) -> Result<(), Error> {
        if self.id == 0 || self.id >= nodes {
            return Err(Error::BadTable {
                reason: "a share of the initial subtables is laid out on nodes 1..nodes",
            });
        }
        table.check_depths()?;
        if self.heap.lock().next != RESERVED_PREFIX {
            return Err(Error::BadTable {
                reason: "the memory node is already in use",
            });
        }
        self.write_share(table, nodes)
    }

    /// Allocates and writes this node's initial subtables (empty, every
    /// bucket header set) at the offsets [`TableConfig::initial_subtable`]
    /// gives; the heap must be where the first of them starts.
    fn write_share(&self, table: &TableConfig, nodes: u8) -> Result<(), Error> {
        let g = table.initial_global_depth;
        let oom = Error::OutOfMemory {
            what: "this memory node's share of the initial subtables",
        };
        let bytes = table.geometry.bytes();
        let mut image = vec![0u8; usize::try_from(bytes).map_err(|_| oom.clone())?];
        let share = (u32::from(self.id)..1u32 << g).step_by(usize::from(nodes.max(1)));
        for bits in share {
            let at = table.initial_subtable(bits, nodes)?;
            let offset = self.alloc(bytes).map_err(|_| oom.clone())?;
            if (at.node(), at.offset()) != (self.id, offset) {
                return Err(Error::BadTable {
                    reason: "initial subtable allocated away from its place",
                });
            }
            Subtable::new_checked(&mut image[..], table.geometry)?
                .init_empty(Suffix::new(bits, g)?);
            self.write(offset, &image)?;
        }
        Ok(())
    }

    fn out_of_bounds(&self, offset: u64, len: u64) -> TransportError {
        TransportError::OutOfBounds {
            ptr: RemotePtr::from_bits(u64::from(self.id) << 40 | (offset & MAX_OFFSET)),
            len,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity() => Ok(()),
            _ => Err(self.out_of_bounds(offset, len)),
        }
    }

    /// Reads `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`TransportError::NodeDown`] or [`TransportError::OutOfBounds`].
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, TransportError> {
        self.check(offset, len as u64)?;
        let mut out = vec![0u8; len];
        self.mem.read_into(offset, &mut out);
        Ok(out)
    }

    /// Writes `bytes` at `offset`.
    ///
    /// # Errors
    /// [`TransportError::NodeDown`] or [`TransportError::OutOfBounds`].
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        self.check(offset, bytes.len() as u64)?;
        self.mem.write_from(offset, bytes);
        Ok(())
    }

    /// Allocates a block of `size` bytes (rounded up to 64), 64-byte aligned;
    /// returns its offset. Blocks are never freed (clients recycle them;
    /// they are subtables, which a collection never takes back).
    ///
    /// # Errors
    /// [`TransportError::NodeDown`] or [`TransportError::OutOfMemory`].
    pub fn alloc(&self, size: u64) -> Result<u64, TransportError> {
        let start = self.alloc_heap(size)?;
        let rounded = size.max(1).next_multiple_of(BLOCK_ALIGN);
        self.heap.lock().coarse.insert(start, rounded);
        Ok(start)
    }

    /// New heap: `size` bytes (rounded up to 64), 64-byte aligned.
    fn alloc_heap(&self, size: u64) -> Result<u64, TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        let oom = TransportError::OutOfMemory {
            node: self.id,
            size,
        };
        let rounded = size
            .max(1)
            .checked_next_multiple_of(BLOCK_ALIGN)
            .ok_or(oom.clone())?;
        let mut heap = self.heap.lock();
        let start = heap.next.next_multiple_of(BLOCK_ALIGN);
        match start.checked_add(rounded) {
            Some(end) if end <= self.capacity() && end <= MAX_OFFSET => {
                heap.next = end;
                heap.blocks += 1;
                Ok(start)
            }
            _ => Err(oom),
        }
    }

    /// Memory for blocks of `block_bytes`: blocks clients gave back, up to
    /// `size` bytes in at most [`MAX_GRANT_RUNS`] runs, or else a new
    /// coarse block of `size` bytes (one run). Runs are `(offset, len)`.
    ///
    /// # Errors
    /// As [`MemoryNode::alloc`].
    pub fn alloc_blocks(
        &self,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<(u64, u64)>, TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        let reused = {
            let mut heap = self.heap.lock();
            heap.pool
                .take(block_bytes, size, MAX_GRANT_RUNS, self.micros())
        };
        if !reused.is_empty() {
            // Nobody holds them now: a zero first word says "not written
            // since granted" to the taking back of a dead holder's blocks.
            self.zero_first_words(&reused, block_bytes);
            return Ok(reused);
        }
        self.alloc_heap(size).map(|offset| vec![(offset, size)])
    }

    /// Takes back `runs` (`(offset, len)`) of blocks of `block_bytes` that a
    /// client no longer needs, to hand out again after `delay` (what is left
    /// of their grace period; see [`crate::pool`]); returns the bytes
    /// taken. All or nothing.
    ///
    /// # Errors
    /// [`TransportError::NodeDown`]; [`TransportError::Refused`] with the
    /// pool's [`Refusal`] as its source.
    pub fn give_back(
        &self,
        block_bytes: u64,
        runs: &[(u64, u64)],
        delay: Duration,
    ) -> Result<u64, TransportError> {
        if self.is_down() {
            return Err(TransportError::NodeDown { node: self.id });
        }
        let now = self.micros();
        let usable_from = now.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
        let mut heap = self.heap.lock();
        let bounds = (heap.floor, heap.next);
        let taken = heap
            .pool
            .give(block_bytes, runs, bounds, usable_from, now)
            .map_err(|r: Refusal| TransportError::Refused {
                node: self.id,
                source: Cause::new(r),
            })?;
        heap.holders.returned(runs);
        Ok(taken)
    }
}

impl MemoryNode<WordMemory> {
    fn atomic_word(&self, offset: u64) -> Result<&AtomicU64, TransportError> {
        self.check(offset, 8)?;
        if offset % 8 != 0 {
            return Err(TransportError::Misaligned {
                ptr: RemotePtr::from_bits(u64::from(self.id) << 40 | offset),
            });
        }
        self.mem
            .word(offset)
            .ok_or_else(|| self.out_of_bounds(offset, 8))
    }

    /// Compare-and-swap of the word at `offset`; returns the previous value.
    ///
    /// # Errors
    /// [`TransportError::NodeDown`], [`TransportError::OutOfBounds`] or
    /// [`TransportError::Misaligned`].
    pub fn cas(&self, offset: u64, expect: u64, new: u64) -> Result<u64, TransportError> {
        let word = self.atomic_word(offset)?;
        Ok(
            match word.compare_exchange(expect, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(old) | Err(old) => old,
            },
        )
    }

    /// Fetch-and-add of the word at `offset`; returns the previous value.
    ///
    /// # Errors
    /// As [`MemoryNode::cas`].
    pub fn faa(&self, offset: u64, add: u64) -> Result<u64, TransportError> {
        Ok(self.atomic_word(offset)?.fetch_add(add, Ordering::SeqCst))
    }
}
