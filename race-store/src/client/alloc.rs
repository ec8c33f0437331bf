//! KV block memory: size classes carved from coarse blocks, and safe reuse of
//! unlinked blocks after a grace period.
//!
//! * **Grants** come from a memory node ([`Transport::alloc_blocks`], a
//!   two-sided message) for one (node, class): runs of blocks other
//!   clients gave back, else a new coarse block. A refill is a quarter of
//!   what the (node, class) already holds, at least `coarse_block_bytes`
//!   and at most [`MAX_REFILL`] (rounded to whole blocks): small tables
//!   waste little, large ones need few messages, and the uncarved
//!   remainder stays under a quarter of the class's footprint. A grant
//!   asked ahead that was needed before its answer came doubles the next
//!   ones, up to 4 MiB: a fast writer outruns 1 MiB grants.
//! * **Asked ahead.** Once a (node, class)'s current grant is half
//!   carved, its next one is asked for without waiting
//!   ([`Transport::alloc_block_ask`], on a transport that can): by the time
//!   it runs out the answer is usually there, so no write waits for a
//!   memory node's allocation port (whose serving thread may be asleep
//!   after an idle spell). Every 8 blocks carved meanwhile the ask is
//!   looked at ([`Transport::alloc_block_answer`] without waiting): the
//!   transport sends a request whose channel was still opening, and an
//!   answer that came is installed.
//! * **Given back** ([`KvAllocator::give_back`], at the client's close):
//!   free blocks, uncarved runs, grants asked ahead and retired blocks past
//!   their grace period go back to their nodes, which hand them out again
//!   ([`crate::pool`]).
//! * **Trimmed while running** ([`KvAllocator::trim`], after every write):
//!   a (node, class) whose free blocks pass [`FREE_HIGH`] gives its oldest
//!   ones back to the node until [`FREE_KEEP`] is left, without waiting
//!   for the answer where the transport can
//!   ([`Transport::return_blocks_ahead`]). Without it a client that deletes
//!   more than it inserts hoarded what it freed until it closed (the store
//!   ran out of memory while one client's free lists held it), and a killed
//!   one leaked all of it.
//! * **Size classes** ([`CLASS_UNITS`], in 64 B units, at most 25% internal
//!   waste) are carved from the current coarse block of the class, per node.
//!   A block's class is a function of its length, so a block freed by any
//!   client can be reused by any other through the slot word's length field.
//! * **Placement**: a block goes on the node of the key's slot (then its
//!   WRITE and the slot's CAS share one doorbell, and a batched write keeps
//!   its fast path): a free block or carved space of that node, its grant
//!   asked ahead, else a new grant of it; only when that node is out of
//!   memory (not asked first again for a grace period) or unreachable,
//!   another node's room, then another node's new grant. A block on
//!   another node costs its write a doorbell of its own (a batched write
//!   falls back to the single operation), a grant one round trip for all
//!   its blocks. (Until 2026-12-06 any node's room came before a new
//!   grant: a client placed every block on the first node it had room on,
//!   and half of a load's batched puts over two nodes went the single
//!   operation's way.) Free blocks a split strands on a node its keys left
//!   serve that node's other keys, and past [`FREE_HIGH`] go back to it.
//! * **Unreachable nodes.** A node whose coarse block request failed on the
//!   transport (down, no answer in time) is not asked again for a while
//!   ([`KvAllocator::with_backoff`]; the client uses its `lease_ticks`):
//!   refills go to the other nodes, and when none is left the allocation
//!   fails at once with the error the node gave, instead of every
//!   allocation waiting out the node's timeout anew.
//! * **Reclamation.** A block that was never published (its slot CAS failed,
//!   or never ran) goes straight back to the front of its (node, class)'s
//!   uncarved runs ([`KvAllocator::release`]): its WRITE may not have run,
//!   so the node may take it back once the client's lease on its grants
//!   ends, and a client that learns of a new lease drops its uncarved runs
//!   (the fence of [`crate::holders`]). Free lists hold written blocks
//!   only, which no node takes back: they are kept across a new lease. A
//!   block
//!   that was published and then unlinked by a successful CAS (update,
//!   delete, withdrawal or removal of a tentative copy) is *retired* by the
//!   client whose CAS unlinked it ([`KvAllocator::retire`]), stamped with
//!   the time, and only reused once `grace_ticks` have passed. Free lists are FIFO, so a reused address is
//!   as old as possible.
//!
//! Why the grace period is safe is argued in [`crate::client`] ("Timing
//! assumptions"): every client bounds each attempt of an operation to
//! `max_op_ticks`, and `grace_ticks > max_op_ticks` plus margin.
//!
//! Memory bound: per client, at most one partly carved grant per (node,
//! class) in use, plus the blocks retired during the last grace period.
//! Under an update-heavy load a client frees as many blocks as it
//! allocates, so its footprint stays at live data + one grace period of
//! updates + the carving slack, and a closed client's footprint goes back
//! to the nodes. (Free lists are per client while it runs: a pattern where
//! one client only deletes and another only inserts moves memory from one
//! to the other's free list up to [`FREE_HIGH`] per (node, class); the rest
//! goes back to the node at once: [`KvAllocator::trim`].)

use std::collections::VecDeque;
use std::time::Duration;

use crate::error::Error;
use crate::layout::slot::{RemotePtr, Slot, LEN_UNIT};
use crate::remote::{AllocAsk, BlockRun, Transport, TransportError, TransportStats};

/// Block sizes of the size classes, in 64 B units.
pub const CLASS_UNITS: [u8; 28] = [
    1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160,
    192, 224, 255,
];

/// Largest coarse block a refill asks for, unless the client's grants
/// ran out before their successors came (then up to 4 MiB).
pub const MAX_REFILL: u64 = 1 << 20;

/// Largest grant of a (node, class) whose grants ran out before the next
/// one came (see `ClassArena::floor`): at half of it, the ask ahead leaves
/// a writer of 300 MB/s about 6 ms for the memory node's answer, which
/// takes up to its idle sleep twice (the channel's Open, then the request).
const MAX_FAST_REFILL: u64 = 4 << 20;

/// Free bytes of one (node, class) past which a running client gives the
/// surplus back to the node (after every write): twice what it keeps,
/// so that a client whose frees and allocations alternate does not give
/// back and ask again.
pub const FREE_HIGH: u64 = 2 * FREE_KEEP;

/// Free bytes of one (node, class) a trimmed client keeps: one grant's
/// worth, for its next inserts.
pub const FREE_KEEP: u64 = MAX_REFILL;

/// Blocks given back by one message of [`KvAllocator::trim`] (at most as
/// many runs: 32 KiB of runs, inside the node daemon's 64 KiB messages).
const TRIM_BLOCKS: usize = 2048;

/// Blocks carved between two looks at a grant asked ahead (see
/// `ask_next`): a look is a messaging poll, too dear for every block.
const LOOK_EVERY: u32 = 8;

/// The size class of a block of `units` 64 B units (`1..=255`).
pub fn class_of(units: u8) -> usize {
    CLASS_UNITS
        .iter()
        .position(|&c| c >= units)
        .unwrap_or(CLASS_UNITS.len() - 1)
}

pub(crate) fn class_bytes(class: usize) -> u64 {
    u64::from(CLASS_UNITS.get(class).copied().unwrap_or(u8::MAX)) * LEN_UNIT as u64
}

/// Memory figures of one client's KV allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvMemoryStats {
    /// Bytes of coarse blocks obtained from memory nodes for KV blocks.
    pub coarse_bytes: u64,
    /// Bytes of blocks in the free lists (reusable now; at most
    /// [`FREE_HIGH`] per (node, class) after a write).
    pub free_bytes: u64,
    /// Bytes of retired blocks waiting for their grace period.
    pub quarantined_bytes: u64,
    /// Bytes not yet carved out of the current coarse blocks.
    pub uncarved_bytes: u64,
    /// Bytes of uncarved runs (blocks released unpublished among them)
    /// dropped because a memory node ended this client's lease on its
    /// grants (the node took back what was never written:
    /// [`crate::holders`]), and free blocks given back whose answer did
    /// not come (trimming: leaked if the node did not take them, never
    /// used again), and every block of a node held when it was collected
    /// (free, retired: [`crate::client::Client::collect`]).
    pub dropped_bytes: u64,
    /// Bytes of free blocks given back, and of retired blocks handed over
    /// (`ClientConfig::retired_high_bytes`), to the memory nodes while the
    /// client ran (trimming).
    pub trimmed_bytes: u64,
    /// Bytes of blocks being given back (sent, not answered yet).
    pub giving_bytes: u64,
    /// Leases this client ended early, between two operations, on memory
    /// nodes it found collecting (so that their collections need not wait
    /// for the leases to run out: [`crate::client::Client::collect`]).
    pub leases_ended_early: u64,
}

impl KvMemoryStats {
    /// Bytes the client holds and would give back when it closes: free,
    /// retired, uncarved, and being given back.
    pub fn held_bytes(&self) -> u64 {
        self.free_bytes + self.quarantined_bytes + self.uncarved_bytes + self.giving_bytes
    }
}

#[derive(Debug, Default)]
struct ClassArena {
    free: VecDeque<RemotePtr>,
    /// Runs not carved yet (whole blocks of the class), carved from the
    /// front: a coarse block is one run, blocks given back by other
    /// clients come as several.
    chunks: VecDeque<(RemotePtr, u64)>,
    /// Bytes in `chunks` (kept, not summed: the ask-ahead check reads it
    /// after every allocation).
    uncarved: u64,
    /// Bytes of the last grant when it came.
    granted: u64,
    /// The next grant, asked for ahead.
    ahead: Option<AllocAsk>,
    /// Blocks carved since the ask ahead was last looked at.
    carves_since_look: u32,
    /// Bytes obtained for this (node, class).
    coarse: u64,
    /// The least the next grant asks for: twice the last grant after a
    /// refill that found the grant asked ahead not answered yet (the
    /// client carved faster than the memory node answered), so that a fast
    /// writer's grants double instead of growing by a quarter of its
    /// holdings.
    floor: u64,
    /// The tick before which this (node, class) is not refilled ahead of
    /// other nodes' room (it answered "out of memory").
    refill_first_after: u64,
}

impl ClassArena {
    /// Free blocks and uncarved runs of blocks of `size`, in address order,
    /// adjacent ones merged.
    fn runs(&self, size: u64) -> Vec<BlockRun> {
        let mut all: Vec<(RemotePtr, u64)> = self.free.iter().map(|&p| (p, size)).collect();
        all.extend(self.chunks.iter().copied().filter(|&(_, len)| len > 0));
        coalesce(all)
    }
}

/// `(start, len)` ranges of one node as runs in address order, adjacent
/// ones merged.
fn coalesce(mut all: Vec<(RemotePtr, u64)>) -> Vec<BlockRun> {
    all.sort_unstable_by_key(|(p, _)| p.offset());
    let mut out: Vec<BlockRun> = Vec::with_capacity(all.len());
    for (start, len) in all {
        match out.last_mut() {
            Some(last) if last.start.offset() + last.len == start.offset() => last.len += len,
            _ => out.push(BlockRun { start, len }),
        }
    }
    out
}

/// What a client gave back to the memory nodes ([`crate::Client::close`]).
#[derive(Debug, Default)]
pub struct ReturnReport {
    /// Bytes the memory nodes took back.
    pub returned_bytes: u64,
    /// Bytes still held: blocks a node did not take, and retired blocks in
    /// their grace period when the clock's tick length is unknown (leaked
    /// once the client is gone).
    pub kept_bytes: u64,
    /// The first failure (a node that does not take blocks back says
    /// [`TransportError::Unsupported`]).
    pub error: Option<Error>,
    /// Memory nodes told that this client's lease on their grants ended
    /// ([`Transport::end_grant_leases`]): they no longer count it as a
    /// live holder. A node not told (an older one, or one that failed)
    /// ends the lease when it runs out.
    pub leases_ended: usize,
}

#[derive(Debug)]
struct Retired {
    tick: u64,
    ptr: RemotePtr,
    class: usize,
}

/// One client's KV block allocator (see the module docs).
#[derive(Debug)]
pub struct KvAllocator {
    arenas: Vec<Vec<ClassArena>>,
    quarantine: VecDeque<Retired>,
    coarse_bytes: u64,
    grace_ticks: u64,
    coarse_block_bytes: u64,
    /// Per node: until when it is not asked for coarse blocks, and the
    /// error its last request failed with.
    unreachable: Vec<Option<(u64, Error)>>,
    backoff_ticks: u64,
    /// Whether to ask for coarse blocks ahead (cleared once the transport
    /// says it cannot).
    ask_ahead: bool,
    /// Per node: the generation of the lease under which its free blocks
    /// and uncarved runs were obtained ([`Transport::grant_lease`]).
    held_under: Vec<Option<u32>>,
    /// Per node: its collection count as last learned
    /// ([`Transport::lease_collections`]; `None` before, read as 0), and
    /// how many times a change of it dropped what this client held there
    /// (a give-back sent before a drop and refused is dropped too).
    collections: Vec<(Option<u32>, u32)>,
    /// Per node: found collecting; its lease is ended at the next point
    /// between operations (`end_collecting_leases`).
    ending: Vec<bool>,
    /// The tick before which no lease is ended early (`hold_early_ends`).
    quiet_until: u64,
    early_ends: u64,
    dropped_bytes: u64,
    /// The tick of the allocation or give-back being served (the back-off
    /// of a node whose lease renewal failed counts from it).
    now: u64,
    /// (node, class) whose free blocks passed [`FREE_HIGH`], until trimmed
    /// to [`FREE_KEEP`].
    over: Vec<(u8, usize)>,
    /// Free blocks being given back, at most one message per node.
    giving: Vec<trim::Trim>,
    /// Whether the transport takes blocks back (cleared when it says it
    /// cannot).
    trims: bool,
    trimmed_bytes: u64,
    /// Per node: the tick before which it is not trimmed (after a failed
    /// give-back).
    trim_after: Vec<u64>,
    /// Bytes in `quarantine`.
    retired_bytes: u64,
    /// Bytes of retired blocks past which the oldest go to their nodes
    /// (`ClientConfig::retired_high_bytes`; never by default).
    retired_high: u64,
    /// The real time of a tick, if the clock follows real time: retired
    /// blocks are handed to the nodes while running only then.
    tick: Option<Duration>,
}

impl KvAllocator {
    /// An empty allocator for `nodes` memory nodes.
    pub fn new(nodes: u8, grace_ticks: u64, coarse_block_bytes: u64) -> Self {
        Self {
            arenas: (0..nodes)
                .map(|_| {
                    (0..CLASS_UNITS.len())
                        .map(|_| ClassArena::default())
                        .collect()
                })
                .collect(),
            quarantine: VecDeque::new(),
            coarse_bytes: 0,
            grace_ticks,
            coarse_block_bytes: coarse_block_bytes.max(LEN_UNIT as u64),
            unreachable: vec![None; usize::from(nodes)],
            backoff_ticks: 0,
            ask_ahead: true,
            held_under: vec![None; usize::from(nodes)],
            collections: vec![(None, 0); usize::from(nodes)],
            ending: vec![false; usize::from(nodes)],
            quiet_until: 0,
            early_ends: 0,
            dropped_bytes: 0,
            now: 0,
            over: Vec::new(),
            giving: Vec::new(),
            trims: true,
            trimmed_bytes: 0,
            trim_after: vec![0; usize::from(nodes)],
            retired_bytes: 0,
            retired_high: u64::MAX,
            tick: None,
        }
    }

    /// The real time of a clock tick ([`crate::clock::Clock::tick`]): with
    /// it, retired blocks past `retired_high` bytes go to their nodes while
    /// the client runs.
    pub fn with_tick(mut self, tick: Option<Duration>, retired_high: u64) -> Self {
        self.tick = tick;
        self.retired_high = retired_high;
        self
    }

    /// Skips a node for `ticks` after its coarse block request failed on
    /// the transport (0, the default: asks it every time).
    pub fn with_backoff(mut self, ticks: u64) -> Self {
        self.backoff_ticks = ticks;
        self
    }

    /// A block for `block_len` bytes (a multiple of 64), preferably on node
    /// `prefer` (see the module docs for the order of preference).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if no node can provide one, or the transport
    /// error of a node that is down.
    pub fn alloc<T: Transport>(
        &mut self,
        transport: &mut T,
        stats: &mut TransportStats,
        prefer: u8,
        block_len: usize,
        now: u64,
    ) -> Result<RemotePtr, Error> {
        self.reclaim(now);
        self.now = now;
        let units = u8::try_from(block_len / LEN_UNIT).unwrap_or(u8::MAX);
        let class = class_of(units);
        let nodes = self.arenas.len().max(1) as u16;
        let order: Vec<u8> = (0..nodes)
            .map(|i| ((u16::from(prefer) + i) % nodes) as u8)
            .collect();
        let mut first_err = None;
        let mut refilled = None;
        for &node in &order {
            // Nothing of a node is used without a live lease on its grants
            // (see crate::holders: the fence).
            if self.holds(node, class) && !self.lease_ok(transport, node) {
                continue;
            }
            if let Some(ptr) = self.take_free(node, class) {
                return Ok(ptr);
            }
            if let Some(ptr) = self.carve(node, class)? {
                self.ask_next(transport, stats, node, class, now);
                return Ok(ptr);
            }
            // The block asked ahead, if its answer is already there.
            if self.collect_ahead(transport, node, class)? {
                if let Some(ptr) = self.carve(node, class)? {
                    return Ok(ptr);
                }
            }
            let first_after = self.arena(node, class).map_or(0, |a| a.refill_first_after);
            if node == prefer && nodes > 1 && now >= first_after {
                // A new grant of the preferred node before another node's
                // room: a block on another node costs its write a round
                // trip of its own (a batched write of a new key falls back
                // to the single operation), a grant one round trip for
                // all its blocks. Without this, a client placed every
                // block on the node it had room on (the first it asked),
                // and half the batched puts of new keys over two nodes
                // went the single operation's way.
                refilled = Some(node);
                match self.refill_carve(transport, stats, node, class, now, &mut first_err)? {
                    Some(ptr) => return Ok(ptr),
                    None if first_err.is_none() => {
                        // Out of memory there: not first again for a while.
                        let not_before = now.saturating_add(self.grace_ticks);
                        if let Some(a) = self.arena(node, class) {
                            a.refill_first_after = not_before;
                        }
                    }
                    None => {}
                }
            }
        }
        for &node in &order {
            if refilled == Some(node) {
                continue;
            }
            if let Some(ptr) =
                self.refill_carve(transport, stats, node, class, now, &mut first_err)?
            {
                return Ok(ptr);
            }
        }
        Err(first_err.unwrap_or(Error::OutOfMemory {
            what: "KV block: no memory node has room",
        }))
    }

    /// A new grant of (node, class) and a block carved from it; `None` when
    /// the node is out of memory, or failed (the error kept in `first_err`,
    /// the node skipped for the back-off after a transport error), or is
    /// still skipped.
    fn refill_carve<T: Transport>(
        &mut self,
        transport: &mut T,
        stats: &mut TransportStats,
        node: u8,
        class: usize,
        now: u64,
        first_err: &mut Option<Error>,
    ) -> Result<Option<RemotePtr>, Error> {
        let slot = self.unreachable.get_mut(usize::from(node));
        if let Some(Some((until, e))) = slot.as_deref() {
            if now < *until {
                first_err.get_or_insert(e.clone());
                return Ok(None);
            }
        }
        match self.refill(transport, stats, node, class) {
            Ok(()) => {
                if let Some(u) = self.unreachable.get_mut(usize::from(node)) {
                    *u = None;
                }
                self.carve(node, class)
            }
            Err(Error::OutOfMemory { .. }) => Ok(None),
            Err(e) => {
                if let Error::Transport(t) = &e {
                    self.note_collecting(node, t);
                }
                if self.backoff_ticks > 0 && matches!(e, Error::Transport(_)) {
                    let ticks = self.backoff_after(&e);
                    if let Some(u) = self.unreachable.get_mut(usize::from(node)) {
                        *u = Some((now.saturating_add(ticks), e.clone()));
                    }
                }
                first_err.get_or_insert(e);
                Ok(None)
            }
        }
    }

    fn take_free(&mut self, node: u8, class: usize) -> Option<RemotePtr> {
        self.arena(node, class)?.free.pop_front()
    }

    fn carve(&mut self, node: u8, class: usize) -> Result<Option<RemotePtr>, Error> {
        let size = class_bytes(class);
        let Some(arena) = self.arena(node, class) else {
            return Ok(None);
        };
        while let Some(&(ptr, left)) = arena.chunks.front() {
            if left < size {
                // Not a whole block (runs are whole blocks of the class).
                arena.chunks.pop_front();
                arena.uncarved -= left;
                continue;
            }
            if left == size {
                arena.chunks.pop_front();
            } else if let Some(front) = arena.chunks.front_mut() {
                *front = (ptr.add(size)?, left - size);
            }
            arena.uncarved -= size;
            return Ok(Some(ptr));
        }
        Ok(None)
    }

    /// The length of the next coarse block of (node, class): a quarter of
    /// what it holds, within bounds, in whole blocks.
    fn refill_len(&self, node: u8, class: usize) -> Option<u64> {
        let size = class_bytes(class);
        let min = self.coarse_block_bytes;
        let arena = self.arenas.get(usize::from(node))?.get(class)?;
        let want = (arena.coarse / 4)
            .clamp(min, MAX_REFILL.max(min))
            .max(arena.floor)
            .max(size);
        Some(want / size * size)
    }

    /// Asks for (node, class)'s next grant if the current one is half
    /// carved and none is asked yet (see the module docs). A failure here
    /// is left to the refill, which asks again when it must.
    fn ask_next<T: Transport>(
        &mut self,
        transport: &mut T,
        stats: &mut TransportStats,
        node: u8,
        class: usize,
        now: u64,
    ) {
        if !self.ask_ahead {
            return;
        }
        if let Some(Some((until, _))) = self.unreachable.get(usize::from(node)) {
            if now < *until {
                return;
            }
        }
        let Some(a) = self.arena(node, class) else {
            return;
        };
        if a.ahead.is_some() {
            // Asked already: every few carves, a look at it (a request
            // whose channel was still opening goes out; an answer that came
            // is installed).
            a.carves_since_look += 1;
            if a.carves_since_look >= LOOK_EVERY {
                a.carves_since_look = 0;
                let _ = self.collect_ahead(transport, node, class);
            }
            return;
        }
        let due = !a.chunks.is_empty() && a.uncarved * 2 <= a.granted;
        let Some(coarse) = self.refill_len(node, class).filter(|_| due) else {
            return;
        };
        match transport.alloc_block_ask(node, coarse, class_bytes(class)) {
            None => self.ask_ahead = false,
            Some(Ok(ask)) => {
                stats.block_rpcs += 1;
                if let Some(a) = self.arena(node, class) {
                    a.ahead = Some(ask);
                }
            }
            Some(Err(_)) => {}
        }
    }

    fn refill<T: Transport>(
        &mut self,
        transport: &mut T,
        stats: &mut TransportStats,
        node: u8,
        class: usize,
    ) -> Result<(), Error> {
        let coarse = self.refill_len(node, class).ok_or(Error::BadTable {
            reason: "allocation on an unknown node",
        })?;
        let ahead = self
            .arena(node, class)
            .ok_or(Error::BadTable {
                reason: "allocation on an unknown node",
            })?
            .ahead
            .take();
        // Asked ahead and not answered yet: this grant is needed before it
        // came (the client carves faster than the node answers).
        let starved = ahead.is_some();
        // Asked ahead: its answer, waited for if it has not come. An ask
        // that timed out (perhaps long before: a busy node) or never got
        // its answer is dropped and asked again now, with the exchange's
        // own attempts: a grant asked ahead is a guess, and its failure is
        // no reason to fail the write that needs a block (until 2026-12-07
        // it failed it).
        // The lease first (see `collect_ahead`): an answer that came under
        // an ended lease is refused, or, with no live lease, not used.
        let live = ahead.is_none() || self.lease_ok(transport, node);
        let mut stale = 0;
        let answered = ahead.and_then(|ask| match transport.alloc_block_answer(ask, true) {
            Ok(Some(runs)) if !live => {
                stale = runs.iter().map(|r| r.len).sum();
                None
            }
            Ok(Some(runs)) => Some(Ok(runs)),
            Ok(None) | Err(TransportError::Timeout { .. } | TransportError::LeaseEnded { .. }) => {
                None
            }
            Err(e) => Some(Err(e)),
        });
        self.dropped_bytes += stale;
        let got = answered.unwrap_or_else(|| {
            stats.block_rpcs += 1;
            transport.alloc_blocks(node, coarse, class_bytes(class))
        });
        match got {
            Ok(runs) => {
                self.install(transport, node, class, &runs)?;
                if starved {
                    if let Some(a) = self.arena(node, class) {
                        a.floor = a.granted.saturating_mul(2).min(MAX_FAST_REFILL);
                    }
                }
                Ok(())
            }
            Err(TransportError::OutOfMemory { .. }) => Err(Error::OutOfMemory {
                what: "KV block: memory node full",
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes (node, class)'s block asked ahead as its chunk if the answer
    /// has come (`true`). A failed ask is dropped: the refill asks again
    /// when it must.
    fn collect_ahead<T: Transport>(
        &mut self,
        transport: &mut T,
        node: u8,
        class: usize,
    ) -> Result<bool, Error> {
        let Some(ask) = self.arena(node, class).and_then(|a| a.ahead) else {
            return Ok(false);
        };
        // The lease first: renewed now if it ran out, so that an answer
        // that came under the ended one is refused (LeaseEnded) rather than
        // installed after the renewal dropped what that lease held (the
        // node took back those runs when it ended).
        if !self.lease_ok(transport, node) {
            return Ok(false);
        }
        let answer = transport.alloc_block_answer(ask, false);
        if !matches!(answer, Ok(None)) {
            if let Some(a) = self.arena(node, class) {
                a.ahead = None;
            }
        }
        match answer {
            Err(e) => {
                self.note_collecting(node, &e);
                Ok(false)
            }
            Ok(None) => Ok(false),
            Ok(Some(runs)) => {
                self.install(transport, node, class, &runs)?;
                Ok(true)
            }
        }
    }

    /// A grant's runs join (node, class)'s chunks (after what was held
    /// under an ended lease is dropped: the grant came under the current
    /// one).
    fn install<T: Transport>(
        &mut self,
        transport: &mut T,
        node: u8,
        class: usize,
        runs: &[BlockRun],
    ) -> Result<(), Error> {
        let size = class_bytes(class);
        if runs.iter().any(|r| {
            r.start.node() != node || r.start.offset() % LEN_UNIT as u64 != 0 || r.len % size != 0
        }) {
            return Err(Error::BadTable {
                reason: "memory node granted blocks of another node, size or alignment",
            });
        }
        self.lease_ok(transport, node);
        let arena = self.arena(node, class).ok_or(Error::BadTable {
            reason: "allocation on an unknown node",
        })?;
        let len: u64 = runs.iter().map(|r| r.len).sum();
        arena.coarse += len;
        arena.chunks.extend(runs.iter().map(|r| (r.start, r.len)));
        arena.uncarved += len;
        arena.granted = len;
        self.coarse_bytes += len;
        Ok(())
    }

    /// Returns a block that was never published (immediately reusable; its
    /// WRITE may not have run).
    pub fn release(&mut self, ptr: RemotePtr, block_len: usize) {
        let class = class_of(u8::try_from(block_len / LEN_UNIT).unwrap_or(u8::MAX));
        // Its WRITE may never have run: back with the uncarved runs, which
        // a new lease on the node drops (free lists hold written blocks).
        let size = class_bytes(class);
        if let Some(a) = self.arena(ptr.node(), class) {
            a.chunks.push_front((ptr, size));
            a.uncarved += size;
        }
    }

    /// Puts `ptr` on its free list, noting a list past [`FREE_HIGH`].
    fn free_one(&mut self, ptr: RemotePtr, class: usize) {
        let node = ptr.node();
        let Some(a) = self.arena(node, class) else {
            return;
        };
        a.free.push_back(ptr);
        let over = a.free.len() as u64 * class_bytes(class) > FREE_HIGH;
        if over && !self.over.contains(&(node, class)) {
            self.over.push((node, class));
        }
    }

    /// Retires the block of a published slot this client just unlinked; it
    /// is reused after the grace period.
    pub fn retire(&mut self, slot: Slot, now: u64) {
        let slot = slot.thawed();
        if slot.is_empty() {
            return;
        }
        let class = class_of(slot.len_units());
        self.retired_bytes += class_bytes(class);
        self.quarantine.push_back(Retired {
            tick: now,
            ptr: slot.ptr(),
            class,
        });
    }

    /// Moves the retired blocks whose grace period has passed to their free
    /// lists.
    pub fn reclaim(&mut self, now: u64) {
        while let Some(r) = self.quarantine.front() {
            if now.saturating_sub(r.tick) <= self.grace_ticks {
                break;
            }
            let (ptr, class) = (r.ptr, r.class);
            self.quarantine.pop_front();
            self.retired_bytes -= class_bytes(class);
            self.free_one(ptr, class);
        }
    }

    /// The tick after which every retired block's grace period has passed
    /// (`None`: none is retired).
    pub fn quarantine_ends(&self) -> Option<u64> {
        self.quarantine
            .back()
            .map(|r| r.tick.saturating_add(self.grace_ticks).saturating_add(1))
    }

    fn arena(&mut self, node: u8, class: usize) -> Option<&mut ClassArena> {
        self.arenas
            .get_mut(usize::from(node))
            .and_then(|a| a.get_mut(class))
    }

    /// Memory figures.
    pub fn stats(&self) -> KvMemoryStats {
        let mut s = KvMemoryStats {
            coarse_bytes: self.coarse_bytes,
            dropped_bytes: self.dropped_bytes,
            leases_ended_early: self.early_ends,
            ..KvMemoryStats::default()
        };
        for node in &self.arenas {
            for (class, a) in node.iter().enumerate() {
                s.free_bytes += a.free.len() as u64 * class_bytes(class);
                s.uncarved_bytes += a.uncarved;
            }
        }
        s.quarantined_bytes = self.retired_bytes;
        s.trimmed_bytes = self.trimmed_bytes;
        s.giving_bytes = self.giving.iter().map(trim::Trim::bytes).sum();
        s
    }
}

mod close;
mod lease;
mod trim;

#[cfg(test)]
mod tests;
