//! In-process memory nodes and the transport that reaches them.
//!
//! A [`MemoryNode`] is a registered region (`Box<[AtomicU64]>`: word-granular
//! atomics, no `unsafe`; byte reads and writes are assembled from words) and
//! a coarse block allocator (the memory node's side of
//! [`Transport::alloc_block`]). A [`LocalCluster`] owns N of them behind an
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
//! completion ([`Transport::post_into`]), a posted batch executing only when
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::holders::{HolderStats, Holders, DEFAULT_GRANT_LEASE};
use crate::layout::dir_header::DirHeader;
use crate::layout::directory::{DirEntry, DirectoryRepr};
use crate::layout::slot::{RemotePtr, MAX_OFFSET};
use crate::layout::subtable::{Subtable, SubtableGeometry, Suffix};
use crate::layout::table::{
    node0_heap_start, SuperblockRepr, DIR_OFFSET, DIR_PTR, SPLIT_LOG_OFFSET, SPLIT_LOG_SIZE,
    SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE,
};
use crate::layout::MAX_GLOBAL_DEPTH;
use crate::pool::{PoolStats, Refusal, ReturnPool, MAX_GRANT_RUNS};
use crate::remote::{
    BlockRun, Cause, Completions, LeaseBook, OpResult, RemoteOp, Ticket, Transport, TransportError,
};

mod grants;

/// Alignment of every block the node allocator hands out.
pub const BLOCK_ALIGN: u64 = 64;
/// Bytes reserved at the start of every node (offset 0 is never a block).
pub const RESERVED_PREFIX: u64 = 4096;

/// The shape of a new table.
///
/// (De)serializable for configuration files: any subset of fields (the
/// rest keep their defaults), unknown keys refused. The geometry is written
/// as its bucket-group count under `geometry_groups`; a count out of
/// `1..=SubtableGeometry::MAX_GROUPS` is a deserialize error. Depths are
/// not checked on reading: the table's format checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TableConfig {
    /// Geometry of every subtable. In a file: `geometry_groups`, the
    /// number of bucket groups ([`SubtableGeometry::new`]).
    #[serde(rename = "geometry_groups")]
    pub geometry: SubtableGeometry,
    /// Global depth of the initial directory (`2^depth` initial subtables).
    pub initial_global_depth: u8,
    /// Largest global depth; node 0 reserves the directory for it.
    pub max_global_depth: u8,
}

impl Default for TableConfig {
    fn default() -> Self {
        Self {
            geometry: SubtableGeometry::DEFAULT,
            initial_global_depth: 0,
            max_global_depth: 16,
        }
    }
}

impl TableConfig {
    /// The fill a presized table is made for: half its slots, so that
    /// subtables, which hold hash-uniform shares of the keys, are far from
    /// full (a subtable splits once a key finds no free slot in its
    /// buckets: at about 60% fill in a YCSB load).
    pub const PRESIZE_FILL: (u64, u64) = (1, 2);

    /// This table with enough initial subtables for `keys` keys
    /// without a split ([`Self::PRESIZE_FILL`]): `initial_global_depth`
    /// is the smallest depth whose `2^depth` subtables hold them, at most
    /// `max_global_depth`; 0 for `keys` 0 (one subtable, grown by splits).
    ///
    /// A split freezes, reads and rewrites a whole subtable (about 100 ms
    /// for the default geometry's 86,016 slots on `sim`), and while it runs
    /// the writers of that subtable wait: a table presized for its keys
    /// never splits to hold them. The initial subtables are spread over
    /// the memory nodes ([`Self::initial_subtable`]): each node holds
    /// about `2^depth / nodes` times [`SubtableGeometry::bytes`] of them.
    pub fn presized_for(self, keys: u64) -> TableConfig {
        let (num, den) = Self::PRESIZE_FILL;
        let per_subtable = (self.geometry.slots() * num / den).max(1);
        let subtables = keys.div_ceil(per_subtable).max(1);
        let depth = subtables
            .checked_next_power_of_two()
            .map_or(u64::BITS, u64::trailing_zeros);
        TableConfig {
            initial_global_depth: u8::try_from(depth)
                .unwrap_or(u8::MAX)
                .min(self.max_global_depth),
            ..self
        }
    }

    /// Where initial subtable `bits` (suffix `bits` of the initial depth)
    /// lives in a store of `nodes` memory nodes: on node `bits % nodes`,
    /// where a split would place it, as that node's `bits / nodes`-th
    /// subtable from the start of its heap (after the directory area on
    /// node 0, after [`RESERVED_PREFIX`] on the others), each taking
    /// [`SubtableGeometry::bytes`] rounded up to [`BLOCK_ALIGN`]. Node 0
    /// writes these addresses into the directory when it formats the table
    /// ([`MemoryNode::format`]) and every other node lays out its own share
    /// there before it serves ([`MemoryNode::lay_out_share`]), so the
    /// directory and the subtables agree without a message between them.
    ///
    /// # Errors
    /// [`Error::BadTable`] for 0 nodes, a suffix beyond the initial depth or
    /// bad depths; [`Error::OutOfMemory`] for an offset past what a
    /// [`RemotePtr`] can address.
    pub fn initial_subtable(&self, bits: u32, nodes: u8) -> Result<RemotePtr, Error> {
        if nodes == 0 {
            return Err(Error::BadTable {
                reason: "a table needs at least one memory node",
            });
        }
        self.check_depths()?;
        if u64::from(bits) >> self.initial_global_depth != 0 {
            return Err(Error::BadTable {
                reason: "initial subtable suffix beyond the initial depth",
            });
        }
        let node = (bits % u32::from(nodes)) as u8;
        let index = u64::from(bits / u32::from(nodes));
        let start = if node == 0 {
            node0_heap_start(self.max_global_depth)?
        } else {
            RESERVED_PREFIX
        };
        let far = Error::OutOfMemory {
            what: "initial subtables beyond the addressable offsets",
        };
        let stride = self
            .geometry
            .bytes()
            .checked_next_multiple_of(BLOCK_ALIGN)
            .ok_or(far.clone())?;
        let offset = index
            .checked_mul(stride)
            .and_then(|o| o.checked_add(start.next_multiple_of(BLOCK_ALIGN)))
            .filter(|&o| o <= MAX_OFFSET)
            .ok_or(far)?;
        Ok(RemotePtr::new(node, offset)?)
    }

    /// How many of the initial subtables node `node` of `nodes` holds
    /// ([`Self::initial_subtable`]), and the offset where its share ends
    /// (its heap's start for an empty share): a region of at least that
    /// many bytes holds the share, and node 0's the directory too.
    ///
    /// # Errors
    /// As [`Self::initial_subtable`]; [`Error::BadTable`] for a node not
    /// below `nodes`.
    pub fn share(&self, node: u8, nodes: u8) -> Result<(u64, u64), Error> {
        if node >= nodes {
            return Err(Error::BadTable {
                reason: "memory node id not below the number of memory nodes",
            });
        }
        self.check_depths()?;
        let total = 1u64 << self.initial_global_depth;
        let count = total
            .saturating_sub(u64::from(node))
            .div_ceil(u64::from(nodes));
        let end = match count.checked_sub(1) {
            None if node == 0 => node0_heap_start(self.max_global_depth)?,
            None => RESERVED_PREFIX,
            Some(last) => {
                let bits = u64::from(node) + last * u64::from(nodes);
                let at = self.initial_subtable(u32::try_from(bits).unwrap_or(u32::MAX), nodes)?;
                at.offset() + self.geometry.bytes().next_multiple_of(BLOCK_ALIGN)
            }
        };
        Ok((count, end))
    }

    fn check_depths(&self) -> Result<(), Error> {
        if self.max_global_depth > MAX_GLOBAL_DEPTH
            || self.initial_global_depth > self.max_global_depth
        {
            return Err(Error::BadTable {
                reason: "initial depth above max depth, or max depth above 20",
            });
        }
        Ok(())
    }
}

/// The shape of a [`LocalCluster`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Number of memory nodes (1..=255).
    pub nodes: u8,
    /// Size of each node's region in bytes.
    pub node_bytes: u64,
    /// The table to format on node 0.
    pub table: TableConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nodes: 1,
            node_bytes: 64 << 20,
            table: TableConfig::default(),
        }
    }
}

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
        let heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        NodeStats {
            capacity: self.capacity(),
            heap_used: heap.next,
            blocks: heap.blocks,
            pool: heap.pool.stats(),
            prefaulted: self.prefaulted.load(Ordering::Relaxed),
            holders: heap.holders.stats(),
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
        let handed_out = self.heap.lock().unwrap_or_else(|e| e.into_inner()).next;
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
            let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
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
        if self.heap.lock().unwrap_or_else(|e| e.into_inner()).next != RESERVED_PREFIX {
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
    /// returns its offset. Blocks are never freed (clients recycle them).
    ///
    /// # Errors
    /// [`TransportError::NodeDown`] or [`TransportError::OutOfMemory`].
    pub fn alloc(&self, size: u64) -> Result<u64, TransportError> {
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
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
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
            let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
            heap.pool
                .take(block_bytes, size, MAX_GRANT_RUNS, self.micros())
        };
        if !reused.is_empty() {
            // Nobody holds them now: a zero first word says "not written
            // since granted" to the taking back of a dead holder's blocks.
            self.zero_first_words(&reused, block_bytes);
            return Ok(reused);
        }
        self.alloc(size).map(|offset| vec![(offset, size)])
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
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
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

/// N memory nodes in this process, node 0 formatted with a table.
#[derive(Clone, Debug)]
pub struct LocalCluster {
    nodes: Arc<[MemoryNode]>,
}

impl LocalCluster {
    /// Creates the nodes, formats the table on node 0 and lays out the
    /// other nodes' shares of its initial subtables.
    ///
    /// # Errors
    /// [`Error::BadTable`] for 0 nodes, or the errors of
    /// [`MemoryNode::format`].
    pub fn new(config: ClusterConfig) -> Result<Self, Error> {
        if config.nodes == 0 {
            return Err(Error::BadTable {
                reason: "a cluster needs at least one memory node",
            });
        }
        let nodes: Arc<[MemoryNode]> = (0..config.nodes)
            .map(|id| MemoryNode::new(id, config.node_bytes))
            .collect();
        nodes
            .first()
            .ok_or(Error::BadTable {
                reason: "no node 0",
            })?
            .format(&config.table, config.nodes)?;
        for node in nodes.iter().skip(1) {
            node.lay_out_share(&config.table, config.nodes)?;
        }
        Ok(Self { nodes })
    }

    /// A new transport for one client.
    pub fn transport(&self) -> LocalTransport {
        LocalTransport {
            nodes: Arc::clone(&self.nodes),
            interleave: false,
            in_flight: 1,
            posted: 0,
            leases: LeaseBook::new(),
        }
    }

    /// Sets how long a client's lease on each node's grants lasts
    /// ([`MemoryNode::set_grant_lease`]).
    pub fn set_grant_lease(&self, lease: Duration) {
        for n in self.nodes.iter() {
            n.set_grant_lease(lease);
        }
    }

    /// Node `id`.
    pub fn node(&self, id: u8) -> Option<&MemoryNode> {
        self.nodes.get(usize::from(id))
    }

    /// Number of nodes.
    pub fn len(&self) -> u8 {
        self.nodes.len() as u8
    }

    /// Always false: a cluster has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Fails (or revives) node `id`; false if there is no such node.
    pub fn set_node_down(&self, id: u8, down: bool) -> bool {
        self.node(id).map(|n| n.set_down(down)).is_some()
    }

    /// Usage figures of every node.
    pub fn stats(&self) -> Vec<NodeStats> {
        self.nodes.iter().map(MemoryNode::stats).collect()
    }
}

/// One client's transport to a [`LocalCluster`] (cheap to create; `Send`).
/// It names the client to the nodes as a holder of their grants
/// ([`crate::holders`]); a clone is another holder, with leases of its own.
#[derive(Debug)]
pub struct LocalTransport {
    nodes: Arc<[MemoryNode]>,
    interleave: bool,
    /// [`Transport::max_in_flight`]: 1 (the default) executes a posted
    /// batch at once.
    in_flight: usize,
    /// Tickets handed out.
    posted: u64,
    leases: LeaseBook,
}

impl Clone for LocalTransport {
    fn clone(&self) -> Self {
        LocalTransport {
            nodes: Arc::clone(&self.nodes),
            interleave: self.interleave,
            in_flight: self.in_flight,
            posted: 0,
            leases: LeaseBook::new(),
        }
    }
}

impl LocalTransport {
    /// Yield the thread between the ops of a batch (a stress knob: it makes
    /// concurrent clients interleave inside multi-op doorbells).
    pub fn set_interleave(&mut self, on: bool) {
        self.interleave = on;
    }

    /// Lets `n` posted doorbells be in flight (at least 1): a batch given
    /// to [`Transport::post_into`] then executes only when it is completed
    /// (later doorbells may execute before it, as a network may deliver
    /// them), the harshest order a caller that overlaps doorbells may see.
    pub fn set_in_flight(&mut self, n: usize) {
        self.in_flight = n.max(1);
    }

    fn node(&self, id: u8) -> Result<&MemoryNode, TransportError> {
        self.nodes
            .get(usize::from(id))
            .ok_or(TransportError::NoSuchNode { node: id })
    }

    fn execute_one(&self, op: &RemoteOp<'_>) -> Result<OpResult, TransportError> {
        let node = self.node(op.node())?;
        let offset = op.ptr().offset();
        Ok(match *op {
            RemoteOp::Read { len, .. } => OpResult::Read(node.read(offset, len as usize)?),
            RemoteOp::Write { bytes, .. } => {
                node.write(offset, bytes)?;
                OpResult::Written
            }
            RemoteOp::Cas { expect, new, .. } => OpResult::Cas {
                old: node.cas(offset, expect, new)?,
            },
            RemoteOp::Faa { add, .. } => OpResult::Faa {
                old: node.faa(offset, add)?,
            },
        })
    }
}

impl Transport for LocalTransport {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let mut out = Vec::with_capacity(batch.len());
        for (i, op) in batch.iter().enumerate() {
            if self.interleave && i > 0 {
                std::thread::yield_now();
            }
            out.push(self.execute_one(op)?);
        }
        Ok(out)
    }

    fn post_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, TransportError> {
        if self.in_flight == 1 {
            return self.execute_into(batch, out).map(|()| Ticket::DONE);
        }
        out.clear();
        self.posted += 1;
        Ok(Ticket(self.posted))
    }

    fn complete_into(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        if ticket == Ticket::DONE {
            return Ok(());
        }
        self.execute_into(batch, out)
    }

    fn max_in_flight(&self) -> usize {
        self.in_flight
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        let offset = self.node(node)?.alloc(size)?;
        RemotePtr::new(node, offset).map_err(|_| TransportError::OutOfMemory { node, size })
    }

    fn alloc_blocks(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let sent = Instant::now();
        let (runs, lease) = self
            .node(node)?
            .grant(self.leases.holder(), size, block_bytes)?;
        self.leases.learn(node, sent, lease)?;
        runs.into_iter()
            .map(|(offset, len)| {
                RemotePtr::new(node, offset)
                    .map(|start| BlockRun { start, len })
                    .map_err(|_| TransportError::OutOfMemory { node, size })
            })
            .collect()
    }

    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
        _wait: bool,
    ) -> Result<(), TransportError> {
        let runs: Vec<(u64, u64)> = runs.iter().map(|r| (r.start.offset(), r.len)).collect();
        let sent = Instant::now();
        let (_, lease) =
            self.node(node)?
                .give_back_as(self.leases.holder(), block_bytes, &runs, delay)?;
        // Only a grant's generation matters (see LeaseBook::learn).
        let _ = self.leases.learn(node, sent, lease);
        Ok(())
    }

    fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        let sent = Instant::now();
        if self.leases.due(node, sent) {
            let lease = self.node(node)?.renew(self.leases.holder())?;
            self.leases.learn(node, sent, lease)?;
        }
        Ok(self.leases.generation(node))
    }

    fn nodes(&self) -> u8 {
        self.nodes.len() as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::directory::Directory;

    fn p(node: u8, off: u64) -> RemotePtr {
        RemotePtr::new(node, off).unwrap()
    }

    #[test]
    fn presizing_picks_the_smallest_depth_that_holds_the_keys_at_half_fill() {
        let t = TableConfig::default();
        // 86,016 slots per subtable: 43,008 keys each.
        let depth = |keys| t.presized_for(keys).initial_global_depth;
        assert_eq!(depth(0), 0);
        assert_eq!(depth(43_008), 0);
        assert_eq!(depth(43_009), 1);
        assert_eq!(depth(100_000), 2);
        assert_eq!(depth(1_000_000), 5);
        assert_eq!(depth(u64::MAX), t.max_global_depth);
        assert_eq!(t.presized_for(1_000_000).geometry, t.geometry);
    }

    #[test]
    fn bytes_over_words() {
        let n = MemoryNode::new(1, 256);
        n.write(3, b"hello, world").unwrap();
        assert_eq!(n.read(3, 12).unwrap(), b"hello, world");
        assert_eq!(n.read(0, 3).unwrap(), [0, 0, 0]);
        n.write(5, b"XY").unwrap();
        assert_eq!(n.read(3, 12).unwrap(), b"heXYo, world");
        assert_eq!(n.read(16, 0).unwrap(), Vec::<u8>::new());
        assert!(matches!(
            n.read(250, 8),
            Err(TransportError::OutOfBounds { len: 8, .. })
        ));
        assert!(n.write(u64::MAX, b"x").is_err());
    }

    #[test]
    fn atomics_and_alignment() {
        let n = MemoryNode::new(2, 64);
        assert_eq!(n.cas(8, 0, 7).unwrap(), 0);
        assert_eq!(n.cas(8, 0, 9).unwrap(), 7);
        assert_eq!(n.faa(8, 3).unwrap(), 7);
        assert_eq!(n.read(8, 8).unwrap(), 10u64.to_le_bytes());
        assert!(matches!(
            n.cas(4, 0, 1),
            Err(TransportError::Misaligned { .. })
        ));
        assert!(matches!(
            n.faa(64, 1),
            Err(TransportError::OutOfBounds { .. })
        ));
        n.set_down(true);
        assert_eq!(n.cas(8, 0, 1), Err(TransportError::NodeDown { node: 2 }));
        assert_eq!(n.alloc(64), Err(TransportError::NodeDown { node: 2 }));
    }

    /// Memory that records what it was asked to fault in.
    #[derive(Debug)]
    struct Faults {
        words: WordMemory,
        asked: std::sync::Mutex<Vec<(u64, u64)>>,
    }

    impl NodeMemory for Faults {
        fn len_bytes(&self) -> u64 {
            self.words.len_bytes()
        }
        fn read_into(&self, offset: u64, buf: &mut [u8]) {
            self.words.read_into(offset, buf);
        }
        fn write_from(&self, offset: u64, bytes: &[u8]) {
            self.words.write_from(offset, bytes);
        }
        fn prefault(&self, offset: u64, len: u64) {
            self.asked.lock().unwrap().push((offset, len));
        }
    }

    #[test]
    fn prefault_keeps_ahead_of_the_heap_in_bounded_steps() {
        let cap = 3 * PREFAULT_AHEAD;
        let n = MemoryNode::with_memory(
            0,
            Faults {
                words: WordMemory::new(cap),
                asked: Default::default(),
            },
        );
        let catch_up = |n: &MemoryNode<Faults>| {
            let mut total = 0;
            loop {
                match n.prefault_ahead() {
                    0 => return total,
                    step => {
                        assert!(step <= PREFAULT_STEP);
                        total += step;
                    }
                }
            }
        };
        // From the region's start to PREFAULT_AHEAD past the heap's end.
        let first = catch_up(&n);
        assert_eq!(first, RESERVED_PREFIX + PREFAULT_AHEAD);
        assert_eq!(n.stats().prefaulted, first);
        // Handing out memory moves the target by as much, no more.
        n.alloc(5 << 20).unwrap();
        let heap = n.stats().heap_used;
        assert_eq!(catch_up(&n), heap - RESERVED_PREFIX);
        assert_eq!(n.stats().prefaulted, heap + PREFAULT_AHEAD);
        // Never past the region's end.
        while n.alloc(1 << 20).is_ok() {}
        catch_up(&n);
        assert_eq!(n.stats().prefaulted, cap);
        // The steps tile the region exactly once, in order.
        let asked = n.memory().asked.lock().unwrap().clone();
        let mut at = 0;
        for (off, len) in asked {
            assert_eq!(off, at);
            assert!(len > 0 && len <= PREFAULT_STEP);
            at += len;
        }
        assert_eq!(at, cap);
    }

    #[test]
    fn allocator_aligns_and_runs_out() {
        let n = MemoryNode::new(0, 8192);
        assert_eq!(n.alloc(1).unwrap(), 4096);
        assert_eq!(n.alloc(100).unwrap(), 4160);
        assert_eq!(n.alloc(64).unwrap(), 4288);
        assert_eq!(n.stats().blocks, 3);
        assert!(matches!(
            n.alloc(8192),
            Err(TransportError::OutOfMemory { .. })
        ));
        assert!(n.alloc(u64::MAX).is_err());
    }

    #[test]
    fn format_lays_out_directory_and_subtables() {
        let table = TableConfig {
            geometry: SubtableGeometry::new(2).unwrap(),
            initial_global_depth: 2,
            max_global_depth: 5,
        };
        let cluster = LocalCluster::new(ClusterConfig {
            nodes: 2,
            node_bytes: 1 << 16,
            table,
        })
        .unwrap();
        let n0 = cluster.node(0).unwrap();
        let sb = SuperblockRepr::parse(&n0.read(0, 64).unwrap()).unwrap();
        assert_eq!(
            (sb.geometry, sb.max_global_depth, sb.nodes),
            (table.geometry, 5, 2)
        );
        let dir_bytes = n0.read(DIR_OFFSET, 64 + 8 * 4).unwrap();
        let dir = DirectoryRepr::parse(&Directory::new_checked(&dir_bytes[..]).unwrap()).unwrap();
        dir.check_consistency().unwrap();
        assert_eq!(dir.global_depth(), 2);
        // Spread by suffix as splits place subtables: 0 and 2 on node 0
        // after the directory area, 1 and 3 on node 1 after its prefix.
        let stride = table.geometry.bytes().next_multiple_of(BLOCK_ALIGN);
        for (i, e) in dir.entries.iter().enumerate() {
            assert_eq!(e.local_depth(), 2);
            let (node, start) = match i % 2 {
                0 => (0, node0_heap_start(5).unwrap()),
                _ => (1, RESERVED_PREFIX),
            };
            assert_eq!(e.ptr().node(), node, "subtable {i}");
            assert_eq!(e.ptr().offset(), start + (i as u64 / 2) * stride);
            let img = cluster
                .node(node)
                .unwrap()
                .read(e.ptr().offset(), table.geometry.bytes() as usize)
                .unwrap();
            let st = Subtable::new_checked(&img[..], table.geometry).unwrap();
            assert_eq!(
                st.bucket(1, 2).unwrap().header(),
                Ok(Suffix::new(i as u32, 2).unwrap())
            );
        }
        for node in 0..2 {
            let (count, end) = table.share(node, 2).unwrap();
            assert_eq!(count, 2);
            assert_eq!(end, cluster.node(node).unwrap().stats().heap_used);
        }
        assert!(matches!(n0.format(&table, 2), Err(Error::BadTable { .. })));
        let n1 = cluster.node(1).unwrap();
        assert!(matches!(n1.format(&table, 2), Err(Error::BadTable { .. })));
        // A share is laid out once, on a node that holds one.
        for (node, nodes) in [(n1, 2), (n0, 2)] {
            assert!(matches!(
                node.lay_out_share(&table, nodes),
                Err(Error::BadTable { .. })
            ));
        }
        assert!(matches!(
            MemoryNode::new(2, 1 << 16).lay_out_share(&table, 2),
            Err(Error::BadTable { .. })
        ));
        // More nodes than subtables: the last ones hold none.
        let (count, end) = table.share(6, 7).unwrap();
        assert_eq!((count, end), (0, RESERVED_PREFIX));
        let idle = MemoryNode::new(6, 1 << 16);
        idle.lay_out_share(&table, 7).unwrap();
        assert_eq!(idle.stats().heap_used, RESERVED_PREFIX);
        assert!(table.share(7, 7).is_err());
        // A node too small for its share: out of memory, not a short table.
        let small = ClusterConfig {
            nodes: 2,
            node_bytes: RESERVED_PREFIX + stride,
            table: TableConfig {
                max_global_depth: 2,
                ..table
            },
        };
        assert!(matches!(
            LocalCluster::new(small),
            Err(Error::OutOfMemory { .. })
        ));
        let tiny = ClusterConfig {
            nodes: 1,
            node_bytes: 4096,
            table,
        };
        assert!(matches!(
            LocalCluster::new(tiny),
            Err(Error::OutOfMemory { .. })
        ));
        assert!(LocalCluster::new(ClusterConfig {
            nodes: 0,
            ..ClusterConfig::default()
        })
        .is_err());
    }

    #[test]
    fn transport_batches_in_order_and_node_down() {
        let cluster = LocalCluster::new(ClusterConfig {
            nodes: 2,
            node_bytes: 1 << 16,
            table: TableConfig {
                geometry: SubtableGeometry::new(1).unwrap(),
                initial_global_depth: 0,
                max_global_depth: 4,
            },
        })
        .unwrap();
        let mut t = cluster.transport();
        assert_eq!(t.nodes(), 2);
        let block = t.alloc_block(1, 100).unwrap();
        assert_eq!(block.node(), 1);
        assert_eq!(block.offset() % 64, 0);
        let data = 5u64.to_le_bytes();
        let r = t
            .execute(&[
                RemoteOp::Write {
                    ptr: block,
                    bytes: &data,
                },
                RemoteOp::Cas {
                    ptr: block,
                    expect: 5,
                    new: 6,
                },
                RemoteOp::Faa { ptr: block, add: 1 },
                RemoteOp::Read { ptr: block, len: 8 },
            ])
            .unwrap();
        assert_eq!(
            r,
            vec![
                OpResult::Written,
                OpResult::Cas { old: 5 },
                OpResult::Faa { old: 6 },
                OpResult::Read(7u64.to_le_bytes().to_vec())
            ]
        );
        assert!(cluster.set_node_down(1, true));
        assert_eq!(
            t.execute(&[RemoteOp::Read { ptr: block, len: 8 }]),
            Err(TransportError::NodeDown { node: 1 })
        );
        assert!(t
            .execute(&[RemoteOp::Read {
                ptr: p(0, 0),
                len: 8
            }])
            .is_ok());
        assert!(cluster.set_node_down(1, false));
        assert!(!cluster.set_node_down(9, true));
        assert_eq!(
            t.execute(&[RemoteOp::Read {
                ptr: p(3, 0),
                len: 8
            }]),
            Err(TransportError::NoSuchNode { node: 3 })
        );
        assert_eq!(cluster.len(), 2);
        assert!(!cluster.is_empty());
        assert_eq!(cluster.stats().len(), 2);
    }
}

/// [`TableConfig`] as a configuration file's type.
#[cfg(test)]
mod table_config_tests {
    use super::{SubtableGeometry, TableConfig};

    #[test]
    fn default_round_trips_through_toml() {
        let text = toml::to_string_pretty(&TableConfig::default()).expect("serializes");
        println!("{text}");
        assert!(text.contains("geometry_groups = 4096"), "{text}");
        let back: TableConfig = toml::from_str(&text).expect("its own output parses");
        assert_eq!(back, TableConfig::default());
        assert_eq!(
            toml::from_str::<TableConfig>("").ok(),
            Some(TableConfig::default())
        );
    }

    #[test]
    fn partial_file_overrides_only_what_it_names() {
        let c: TableConfig = toml::from_str("geometry_groups = 2\n").expect("parses");
        let want = TableConfig {
            geometry: SubtableGeometry::new(2).expect("in range"),
            ..TableConfig::default()
        };
        assert_eq!(c, want);
        let c: TableConfig = toml::from_str("max_global_depth = 9\n").expect("parses");
        assert_eq!(c.max_global_depth, 9);
        assert_eq!(c.geometry, SubtableGeometry::DEFAULT);
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        for (text, key) in [
            ("geometry = 2\n", "geometry"),
            ("max_depth = 3\n", "max_depth"),
        ] {
            let err = toml::from_str::<TableConfig>(text)
                .expect_err(text)
                .to_string();
            assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
        }
    }

    #[test]
    fn invalid_geometry_is_a_deserialize_error() {
        let max = SubtableGeometry::MAX_GROUPS;
        for groups in [0, max + 1] {
            let text = format!("geometry_groups = {groups}\n");
            let err = toml::from_str::<TableConfig>(&text)
                .expect_err(&text)
                .to_string();
            assert!(err.contains("out of range"), "{err}");
        }
        let err = toml::from_str::<TableConfig>("geometry_groups = -1\n")
            .expect_err("negative")
            .to_string();
        assert!(err.contains("geometry_groups"), "{err}");
    }
}
