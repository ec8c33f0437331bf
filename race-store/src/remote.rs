//! What a one-sided transport can do on memory nodes, as a small device trait.
//!
//! The RACE client is written against [`Transport`], in the style of
//! smoltcp's `phy::Device`: a few methods, several implementations
//! ([`crate::memory::LocalTransport`] in process; a KRCore virtual-QP
//! transport later), and wrappers that add behaviour around any of them
//! ([`FaultInjector`]).
//!
//! ## Round trips
//! One [`Transport::execute`] call is **one doorbell = one round trip**: all
//! the operations of the batch are posted together and the call returns when
//! all have completed. The client counts calls ([`TransportStats`]), which is
//! how tests assert "a search is 2 round trips".
//!
//! ## Ordering
//! Operations of one batch that target the **same memory node** execute in
//! batch order, each one completely before the next starts (as on one RC or DC
//! queue pair, where a later READ or atomic is not executed before an earlier
//! WRITE has been placed). Operations to **different nodes** have no order
//! between them. Each 8-byte aligned word is read and written atomically; a
//! READ or WRITE of several words is *not* atomic as a whole (a concurrent
//! reader may see any mix of old and new words). CAS and FAA are atomic on
//! their 8-byte aligned word.
//!
//! ## Failures
//! If `execute` returns an error, any prefix-closed subset of the batch (per
//! node) may have executed: the caller must treat the state of every op of
//! the batch as unknown (for a CAS: maybe done).
//!
//! ## Doorbells in flight
//! [`Transport::post_into`] posts a batch as `execute_into` does and may
//! return before it completes, with a [`Ticket`] that
//! [`Transport::complete_into`] (given the same batch and result buffer)
//! waits for. Up to [`Transport::max_in_flight`] posted doorbells may be
//! outstanding; meanwhile the caller may execute others. A doorbell in
//! flight is concurrent with every later one, to any node: the caller only
//! overlaps operations on different keys (their order does not matter, as
//! between two clients). The default completes at once (`max_in_flight`
//! 1); [`crate::rdma::VqpTransport`] keeps two in flight, and
//! [`crate::memory::LocalTransport`] executes a posted batch when it is
//! completed (the harshest order a caller may see). A failed `complete_into`
//! is as a failed `execute`.
//!
//! ## Memory-node allocation
//! [`Transport::alloc_block`] is the memory node's coarse allocator, reached
//! over a two-sided message (the node's CPU serves it). Clients carve their
//! own size classes out of these blocks; there is no remote free.

use crate::collection::{CollectStart, Collected};
use crate::layout::slot::RemotePtr;

mod error;
pub(crate) mod leases;
mod wrappers;
pub use error::{Cause, TransportError};
pub use leases::LeaseBook;
pub use wrappers::{CrashPlan, Delayed, FaultInjector};

/// One one-sided operation on a memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteOp<'a> {
    /// Read `len` bytes at `ptr`.
    Read {
        /// Where to read.
        ptr: RemotePtr,
        /// How many bytes.
        len: u32,
    },
    /// Write `bytes` at `ptr`.
    Write {
        /// Where to write.
        ptr: RemotePtr,
        /// What to write.
        bytes: &'a [u8],
    },
    /// Compare-and-swap the 8-byte aligned little-endian word at `ptr`.
    Cas {
        /// The word (8-byte aligned).
        ptr: RemotePtr,
        /// The value expected.
        expect: u64,
        /// The value installed if the word equals `expect`.
        new: u64,
    },
    /// Fetch-and-add on the 8-byte aligned word at `ptr` (wrapping).
    Faa {
        /// The word (8-byte aligned).
        ptr: RemotePtr,
        /// The addend.
        add: u64,
    },
}

impl RemoteOp<'_> {
    /// The target address.
    pub fn ptr(&self) -> RemotePtr {
        match *self {
            RemoteOp::Read { ptr, .. }
            | RemoteOp::Write { ptr, .. }
            | RemoteOp::Cas { ptr, .. }
            | RemoteOp::Faa { ptr, .. } => ptr,
        }
    }

    /// The target memory node.
    pub fn node(&self) -> u8 {
        self.ptr().node()
    }
}

/// The result of one [`RemoteOp`], in batch order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The bytes read (exactly the requested length).
    Read(Vec<u8>),
    /// The write completed.
    Written,
    /// The word's value before the CAS; it swapped iff `old == expect`.
    Cas {
        /// Previous value.
        old: u64,
    },
    /// The word's value before the addition.
    Faa {
        /// Previous value.
        old: u64,
    },
}

impl OpResult {
    /// The bytes of a READ result.
    pub fn read_bytes(&self) -> Option<&[u8]> {
        match self {
            OpResult::Read(b) => Some(b),
            _ => None,
        }
    }

    /// The previous value of a CAS.
    pub fn cas_old(&self) -> Option<u64> {
        match self {
            OpResult::Cas { old } => Some(*old),
            _ => None,
        }
    }

    /// The previous value of a FAA.
    pub fn faa_old(&self) -> Option<u64> {
        match self {
            OpResult::Faa { old } => Some(*old),
            _ => None,
        }
    }
}

/// One result of a doorbell in [`Completions`]: a READ's bytes live in the
/// shared byte buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Completion {
    Read { at: usize, len: usize },
    Written,
    Cas { old: u64 },
    Faa { old: u64 },
}

/// The results of one doorbell, in batch order, in caller-owned storage that
/// is reused from doorbell to doorbell: READ bytes go to one byte buffer, so
/// a warm `Completions` costs no allocation per operation (unlike a
/// `Vec<OpResult>`, one vector per READ). Filled by
/// [`Transport::execute_into`].
///
/// Invariant: every READ entry names a range inside `bytes[..filled]`.
/// The byte buffer is never shrunk: `clear` only resets `filled`, so a
/// landing area reserved again is not zeroed again (what lies past
/// `filled` is no result's).
#[derive(Clone, Debug, Default)]
pub struct Completions {
    entries: Vec<Completion>,
    bytes: Vec<u8>,
    /// The bytes in use (READ results and reserved landing areas).
    filled: usize,
}

/// Equal when they hold the same results (the same bytes for each READ),
/// whatever their storage holds besides.
impl PartialEq for Completions {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .enumerate()
                .all(|(i, (a, b))| match (a, b) {
                    (Completion::Read { .. }, Completion::Read { .. }) => {
                        self.read(i) == other.read(i)
                    }
                    _ => a == b,
                })
    }
}

impl Eq for Completions {}

impl Completions {
    /// An empty result set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every result (keeps the storage).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.filled = 0;
    }

    /// `len` more bytes of the buffer, from `filled` on: their start and
    /// the bytes (whatever they held; zeroed only where the buffer grew).
    fn take(&mut self, len: usize) -> (usize, &mut [u8]) {
        let at = self.filled;
        let end = at.saturating_add(len);
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.filled = end;
        (at, self.bytes.get_mut(at..end).unwrap_or_default())
    }

    /// Number of results.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no result.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a READ result of `len` bytes (zeroed) and returns them, for
    /// the transport to fill.
    pub fn push_read(&mut self, len: usize) -> &mut [u8] {
        self.entries.push(Completion::Read {
            at: self.filled,
            len,
        });
        let (_, b) = self.take(len);
        b.fill(0);
        b
    }

    /// Appends `len` bytes that no result names yet and returns their
    /// start and the bytes, for the caller to overwrite whole (their
    /// content is unspecified: storage reused from earlier results is not
    /// zeroed again): a transport can copy a whole landing area at once,
    /// then declare the READ results in it with
    /// [`Completions::push_read_at`].
    pub fn reserve(&mut self, len: usize) -> (usize, &mut [u8]) {
        self.take(len)
    }

    /// Appends a READ result naming bytes `at..at + len` of the buffer (from
    /// [`Completions::reserve`]); `false`, appending nothing, if the range
    /// is not in the buffer.
    pub fn push_read_at(&mut self, at: usize, len: usize) -> bool {
        if at.checked_add(len).is_none_or(|end| end > self.filled) {
            return false;
        }
        self.entries.push(Completion::Read { at, len });
        true
    }

    /// The 8 bytes at `at` of the buffer as a native-endian word (what an
    /// RDMA atomic leaves in local memory), if in range.
    pub fn word_at(&self, at: usize) -> Option<u64> {
        let end = at.checked_add(8).filter(|&e| e <= self.filled)?;
        let b = self.bytes.get(at..end)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }

    /// Appends a READ result with these bytes.
    pub fn push_read_bytes(&mut self, bytes: &[u8]) {
        let (at, b) = self.take(bytes.len());
        b.copy_from_slice(bytes);
        self.entries.push(Completion::Read {
            at,
            len: bytes.len(),
        });
    }

    /// Appends a completed WRITE.
    pub fn push_written(&mut self) {
        self.entries.push(Completion::Written);
    }

    /// Appends a CAS result (the word's previous value).
    pub fn push_cas(&mut self, old: u64) {
        self.entries.push(Completion::Cas { old });
    }

    /// Appends a FAA result (the word's previous value).
    pub fn push_faa(&mut self, old: u64) {
        self.entries.push(Completion::Faa { old });
    }

    /// Appends an owned result.
    pub fn push(&mut self, result: &OpResult) {
        match result {
            OpResult::Read(b) => self.push_read_bytes(b),
            OpResult::Written => self.push_written(),
            OpResult::Cas { old } => self.push_cas(*old),
            OpResult::Faa { old } => self.push_faa(*old),
        }
    }

    /// The bytes of result `i` if it is a READ.
    pub fn read(&self, i: usize) -> Option<&[u8]> {
        match self.entries.get(i)? {
            Completion::Read { at, len } => self.bytes.get(*at..at.checked_add(*len)?),
            _ => None,
        }
    }

    /// The previous value of result `i` if it is a CAS.
    pub fn cas_old(&self, i: usize) -> Option<u64> {
        match self.entries.get(i)? {
            Completion::Cas { old } => Some(*old),
            _ => None,
        }
    }

    /// The previous value of result `i` if it is a FAA.
    pub fn faa_old(&self, i: usize) -> Option<u64> {
        match self.entries.get(i)? {
            Completion::Faa { old } => Some(*old),
            _ => None,
        }
    }

    /// Result `i` as an owned [`OpResult`].
    pub fn to_result(&self, i: usize) -> Option<OpResult> {
        Some(match self.entries.get(i)? {
            Completion::Read { .. } => OpResult::Read(self.read(i)?.to_vec()),
            Completion::Written => OpResult::Written,
            Completion::Cas { old } => OpResult::Cas { old: *old },
            Completion::Faa { old } => OpResult::Faa { old: *old },
        })
    }

    /// Every result as an owned [`OpResult`].
    pub fn to_results(&self) -> Vec<OpResult> {
        (0..self.len()).filter_map(|i| self.to_result(i)).collect()
    }
}

/// A doorbell posted by [`Transport::post_into`], to give back to
/// [`Transport::complete_into`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a posted doorbell must be completed"]
pub struct Ticket(pub u64);

impl Ticket {
    /// A doorbell that completed before `post_into` returned (its results
    /// are already in the buffer).
    pub const DONE: Ticket = Ticket(0);
}

/// A block request sent ahead by [`Transport::alloc_block_ask`], whose
/// answer [`Transport::alloc_block_answer`] collects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "an asked block is collected with alloc_block_answer"]
pub struct AllocAsk(pub u64);

/// Consecutive blocks of one size on one memory node: `len` bytes from
/// `start`, a whole number of blocks. A new coarse block is one run; blocks
/// another client gave back ([`Transport::return_blocks`]) come as several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    /// The first block.
    pub start: RemotePtr,
    /// Bytes of the run.
    pub len: u64,
}

/// A one-sided transport to a set of memory nodes (see the module docs for
/// the round-trip, ordering and failure contract).
pub trait Transport {
    /// Posts `batch` with one doorbell and waits for all of it: one round
    /// trip. Results are in batch order.
    ///
    /// # Errors
    /// A [`TransportError`]; the batch may then have partly executed.
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError>;

    /// As [`Transport::execute`], with the results in `out` (cleared first),
    /// whose storage is reused: the client's hot paths call this. The
    /// default goes through `execute`; a transport that can fill `out`
    /// directly overrides it (and the two must behave alike).
    ///
    /// # Errors
    /// As [`Transport::execute`]; `out` is then unspecified.
    fn execute_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        out.clear();
        for r in &self.execute(batch)? {
            out.push(r);
        }
        Ok(())
    }

    /// Posts `batch` as [`Transport::execute_into`] does, and may return
    /// before it has completed: `complete_into` with the ticket, the same
    /// batch and the same `out` then waits for it and fills `out`. The
    /// default executes it at once and returns [`Ticket::DONE`].
    ///
    /// # Errors
    /// As `execute_into` (then no ticket is outstanding).
    fn post_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, TransportError> {
        self.execute_into(batch, out).map(|()| Ticket::DONE)
    }

    /// Waits for a doorbell of [`Transport::post_into`] (`batch` and `out`
    /// as given to it); [`Ticket::DONE`] returns at once.
    ///
    /// # Errors
    /// As `execute_into`; `out` is then unspecified.
    fn complete_into(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        let _ = (ticket, batch, out);
        Ok(())
    }

    /// How many posted doorbells can be in flight at once (1: `post_into`
    /// completes before it returns). A caller that overlaps doorbells
    /// checks this first.
    fn max_in_flight(&self) -> usize {
        1
    }

    /// Asks memory node `node` for a block of `size` bytes (64-byte aligned),
    /// over a two-sided message.
    ///
    /// # Errors
    /// [`TransportError::OutOfMemory`], [`TransportError::NodeDown`], ...
    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError>;

    /// Memory for blocks of `block_bytes` (a multiple of 64): about `size`
    /// bytes (a multiple of `block_bytes`) from memory node `node`, as
    /// runs of whole blocks. A node that holds blocks given back by other
    /// clients ([`Transport::return_blocks`]) hands those out first (then
    /// the runs may add up to less than `size`); otherwise a new coarse
    /// block, one run. The default asks [`Transport::alloc_block`] for one
    /// coarse block.
    ///
    /// # Errors
    /// As [`Transport::alloc_block`].
    fn alloc_blocks(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let _ = block_bytes;
        self.alloc_block(node, size)
            .map(|start| vec![BlockRun { start, len: size }])
    }

    /// Sends [`Transport::alloc_blocks`]'s request without waiting for the
    /// answer, which [`Transport::alloc_block_answer`] collects: a client
    /// asks for its next blocks while it still carves the current ones,
    /// so that no write waits for a memory node's answer (a transport may
    /// keep the request until it can go without waiting, and send it from
    /// a later `alloc_block_answer`, which the client calls every few
    /// blocks it carves). `None` (the default): the transport cannot; the
    /// client then asks with `alloc_blocks` when it runs out.
    ///
    /// # Errors
    /// Sending the request, as `alloc_blocks` (inside `Some`).
    fn alloc_block_ask(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        let _ = (node, size, block_bytes);
        None
    }

    /// The answer to `ask` ([`Transport::alloc_block_ask`]): the runs, or
    /// `Ok(None)` while it has not come; with `wait`, waits for it (bounded
    /// as `alloc_blocks`). An ask is answered once: after `Ok(Some)` or an
    /// error it is forgotten (memory answered after the wait gave up is
    /// leaked, never handed out twice).
    ///
    /// # Errors
    /// As `alloc_blocks`; [`TransportError::BadResponse`] for an unknown
    /// ask.
    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        let _ = (ask, wait);
        Err(TransportError::BadResponse {
            reason: "no block was asked ahead on this transport",
        })
    }

    /// Gives blocks of `block_bytes` on memory node `node` back to it, for
    /// any client's later [`Transport::alloc_blocks`]: blocks this client
    /// took and no longer needs, which the node hands out no sooner than
    /// `delay` from now (what is left of their grace period: a reader of
    /// the table may still reach them until then; see [`crate::client`]).
    /// Every run lies on `node`. With `wait` the call waits for the node's
    /// answer (bounded as `alloc_blocks`); without, it sends what it can at
    /// once and does not wait (a client dropped without closing).
    ///
    /// # Errors
    /// [`TransportError::Unsupported`] (the default) when the transport or
    /// the node cannot take blocks back: they stay leaked, as before this
    /// call existed. [`TransportError::BadResponse`] when the node refused
    /// the runs (out of its heap, overlapping blocks it holds). Otherwise
    /// as `alloc_blocks`.
    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        let _ = (node, block_bytes, runs, delay, wait);
        Err(TransportError::Unsupported {
            what: "giving blocks back to a memory node",
        })
    }

    /// [`Transport::return_blocks`] without waiting for the node's answer
    /// where the transport can: `Ok(Some(ask))`, whose answer
    /// [`Transport::alloc_block_answer`] collects (no runs: the node took
    /// them; [`TransportError::Refused`]: it did not). `Ok(None)`: the
    /// node took them already (the default: `return_blocks`, waiting). A
    /// running client gives the surplus of its free lists back so (after
    /// every write, once a free list passed [`crate::client::FREE_HIGH`]),
    /// and the oldest of its retired blocks, with what is left of their
    /// grace period as `delay` (once they passed
    /// [`crate::ClientConfig::retired_high_bytes`]), at most 2,048 runs at
    /// a time.
    ///
    /// # Errors
    /// As `return_blocks`; except for [`TransportError::Timeout`], the
    /// node did not take the blocks.
    fn return_blocks_ahead(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        self.return_blocks(node, block_bytes, runs, delay, true)
            .map(|()| None)
    }

    /// The client's lease on memory node `node`'s grants (see
    /// [`crate::holders`]): its generation, with more than a quarter of
    /// the lease left (renewed once a quarter is gone: before returning,
    /// or sent ahead and waited for only when a quarter is left). The client carves from a node's grants and
    /// free blocks only after this said `Ok`, and drops them all when the
    /// generation changed (the node may have taken them back). `Ok(None)`
    /// (the default): the transport or the node keeps no leases.
    ///
    /// # Errors
    /// The renewal's failure: the client then leaves the node's grants
    /// alone.
    fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        let _ = node;
        Ok(None)
    }

    /// Ends the client's leases on the memory nodes' grants (see
    /// [`crate::holders`]), after it gave back what it holds at its close:
    /// each node then takes back at once what is left unwritten of its
    /// grants, instead of a lease later, and no longer counts it as a
    /// live holder. The client uses nothing of those grants afterwards (a
    /// later allocation starts a new lease). With `wait` each node's answer
    /// is waited for; without, what can go at once is sent. Returns how
    /// many nodes were told. `Ok(0)` (the default): the transport keeps
    /// no leases, or its nodes cannot end one. With `only`, that node's
    /// lease alone (a client ends it early when the node is collecting:
    /// see [`crate::client::Client::collect`]).
    ///
    /// # Errors
    /// The first node's failure (the others are still told); its lease
    /// then runs out as a dead client's would.
    fn end_grant_leases(&mut self, only: Option<u8>, wait: bool) -> Result<usize, TransportError> {
        let _ = (only, wait);
        Ok(0)
    }

    /// Node `node`'s collection count as the client's last lease answer
    /// from it said ([`crate::holders::GrantLease::collections`]): the
    /// client drops every block of the node it holds when it changes.
    /// `None` before the first answer, and (the default) where nothing is
    /// collected.
    fn lease_collections(&self, node: u8) -> Option<u32> {
        let _ = node;
        None
    }

    /// Starts collection `token` on node `node`, or looks again whether it
    /// is ready ([`crate::memory::MemoryNode::collect_begin`]; the whole
    /// protocol: [`crate::client::Client::collect`]).
    ///
    /// # Errors
    /// [`TransportError::Unsupported`] (the default: a transport or node
    /// that cannot collect); [`TransportError::Refused`] while another
    /// collection is under way; as `alloc_blocks` otherwise.
    fn collect_begin(&mut self, node: u8, token: u64) -> Result<CollectStart, TransportError> {
        let _ = (node, token);
        Err(CANNOT_COLLECT)
    }

    /// Runs `(offset, len)` of node `node` that the table links, for its
    /// ready collection `token` ([`crate::memory::MemoryNode::collect_live`]),
    /// in as many requests as they need.
    ///
    /// # Errors
    /// As [`Transport::collect_begin`]; [`TransportError::Refused`] when
    /// `token` is not ready there.
    fn collect_live(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        let _ = (node, token, runs);
        Err(CANNOT_COLLECT)
    }

    /// Ends collection `token` on node `node`, taking back what nothing
    /// reaches with `apply` ([`crate::memory::MemoryNode::collect_finish`]).
    ///
    /// # Errors
    /// As [`Transport::collect_live`].
    fn collect_finish(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        let _ = (node, token, apply);
        Err(CANNOT_COLLECT)
    }

    /// Number of memory nodes (ids `0..nodes()`).
    fn nodes(&self) -> u8;
}

/// What a transport that cannot collect answers each collection step.
const CANNOT_COLLECT: TransportError = TransportError::Unsupported {
    what: "collecting a memory node",
};

/// Implements [`Transport`] for a pointer type by forwarding every call to
/// the transport it points to (`&mut T`, `Box<T>`).
macro_rules! forward_transport {
    ($ptr:ty) => {
        impl<T: Transport + ?Sized> Transport for $ptr {
            fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
                (**self).execute(batch)
            }
            fn execute_into(
                &mut self,
                batch: &[RemoteOp<'_>],
                out: &mut Completions,
            ) -> Result<(), TransportError> {
                (**self).execute_into(batch, out)
            }
            fn post_into(
                &mut self,
                batch: &[RemoteOp<'_>],
                out: &mut Completions,
            ) -> Result<Ticket, TransportError> {
                (**self).post_into(batch, out)
            }
            fn complete_into(
                &mut self,
                ticket: Ticket,
                batch: &[RemoteOp<'_>],
                out: &mut Completions,
            ) -> Result<(), TransportError> {
                (**self).complete_into(ticket, batch, out)
            }
            fn max_in_flight(&self) -> usize {
                (**self).max_in_flight()
            }
            fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
                (**self).alloc_block(node, size)
            }
            fn alloc_blocks(
                &mut self,
                node: u8,
                size: u64,
                block_bytes: u64,
            ) -> Result<Vec<BlockRun>, TransportError> {
                (**self).alloc_blocks(node, size, block_bytes)
            }
            fn alloc_block_ask(
                &mut self,
                node: u8,
                size: u64,
                block_bytes: u64,
            ) -> Option<Result<AllocAsk, TransportError>> {
                (**self).alloc_block_ask(node, size, block_bytes)
            }
            fn alloc_block_answer(
                &mut self,
                ask: AllocAsk,
                wait: bool,
            ) -> Result<Option<Vec<BlockRun>>, TransportError> {
                (**self).alloc_block_answer(ask, wait)
            }
            fn return_blocks(
                &mut self,
                node: u8,
                block_bytes: u64,
                runs: &[BlockRun],
                delay: std::time::Duration,
                wait: bool,
            ) -> Result<(), TransportError> {
                (**self).return_blocks(node, block_bytes, runs, delay, wait)
            }
            fn return_blocks_ahead(
                &mut self,
                node: u8,
                block_bytes: u64,
                runs: &[BlockRun],
                delay: std::time::Duration,
            ) -> Result<Option<AllocAsk>, TransportError> {
                (**self).return_blocks_ahead(node, block_bytes, runs, delay)
            }
            fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
                (**self).grant_lease(node)
            }
            fn end_grant_leases(
                &mut self,
                only: Option<u8>,
                wait: bool,
            ) -> Result<usize, TransportError> {
                (**self).end_grant_leases(only, wait)
            }
            fn lease_collections(&self, node: u8) -> Option<u32> {
                (**self).lease_collections(node)
            }
            fn collect_begin(
                &mut self,
                node: u8,
                token: u64,
            ) -> Result<CollectStart, TransportError> {
                (**self).collect_begin(node, token)
            }
            fn collect_live(
                &mut self,
                node: u8,
                token: u64,
                runs: &[(u64, u64)],
            ) -> Result<(), TransportError> {
                (**self).collect_live(node, token, runs)
            }
            fn collect_finish(
                &mut self,
                node: u8,
                token: u64,
                apply: bool,
            ) -> Result<Collected, TransportError> {
                (**self).collect_finish(node, token, apply)
            }
            fn nodes(&self) -> u8 {
                (**self).nodes()
            }
        }
    };
}

forward_transport!(&mut T);
forward_transport!(Box<T>);

/// Counters of transport use: round trips (doorbells), operations, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// `execute` calls: doorbells, i.e. round trips.
    pub round_trips: u64,
    /// Operations posted.
    pub ops: u64,
    /// READs posted.
    pub reads: u64,
    /// WRITEs posted.
    pub writes: u64,
    /// CAS and FAA posted.
    pub atomics: u64,
    /// Bytes requested by READs.
    pub bytes_read: u64,
    /// Bytes carried by WRITEs.
    pub bytes_written: u64,
    /// `alloc_block` calls (two-sided messages to memory nodes).
    pub block_rpcs: u64,
}

impl TransportStats {
    /// Accounts one doorbell carrying `batch`.
    pub fn record(&mut self, batch: &[RemoteOp<'_>]) {
        self.round_trips += 1;
        self.ops += batch.len() as u64;
        for op in batch {
            match op {
                RemoteOp::Read { len, .. } => {
                    self.reads += 1;
                    self.bytes_read += u64::from(*len);
                }
                RemoteOp::Write { bytes, .. } => {
                    self.writes += 1;
                    self.bytes_written += bytes.len() as u64;
                }
                RemoteOp::Cas { .. } | RemoteOp::Faa { .. } => self.atomics += 1,
            }
        }
    }

    /// The counters accumulated since `earlier` (field-wise difference).
    pub fn since(&self, earlier: &TransportStats) -> TransportStats {
        TransportStats {
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            ops: self.ops.saturating_sub(earlier.ops),
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            atomics: self.atomics.saturating_sub(earlier.atomics),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            block_rpcs: self.block_rpcs.saturating_sub(earlier.block_rpcs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport that records batches and answers with fixed results.
    #[derive(Default)]
    struct Recorder {
        batches: Vec<usize>,
    }

    impl Transport for Recorder {
        fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
            self.batches.push(batch.len());
            Ok(batch.iter().map(|_| OpResult::Written).collect())
        }
        fn alloc_block(&mut self, node: u8, _size: u64) -> Result<RemotePtr, TransportError> {
            Ok(RemotePtr::new(node, 4096).unwrap())
        }
        fn nodes(&self) -> u8 {
            1
        }
    }

    fn p(off: u64) -> RemotePtr {
        RemotePtr::new(0, off).unwrap()
    }

    #[test]
    fn stats_count_doorbells_ops_and_bytes() {
        let mut s = TransportStats::default();
        let bytes = [0u8; 100];
        s.record(&[
            RemoteOp::Read {
                ptr: p(0),
                len: 128,
            },
            RemoteOp::Write {
                ptr: p(64),
                bytes: &bytes,
            },
            RemoteOp::Cas {
                ptr: p(8),
                expect: 0,
                new: 1,
            },
            RemoteOp::Faa { ptr: p(16), add: 1 },
        ]);
        let before = s;
        s.record(&[RemoteOp::Read { ptr: p(0), len: 64 }]);
        assert_eq!(
            before,
            TransportStats {
                round_trips: 1,
                ops: 4,
                reads: 1,
                writes: 1,
                atomics: 2,
                bytes_read: 128,
                bytes_written: 100,
                block_rpcs: 0
            }
        );
        let d = s.since(&before);
        assert_eq!((d.round_trips, d.ops, d.bytes_read), (1, 1, 64));
    }

    #[test]
    fn fault_injector_crashes_at_doorbell_with_prefix() {
        let plan = CrashPlan {
            at_doorbell: 2,
            executed_prefix: 1,
        };
        let mut t = FaultInjector::new(Recorder::default(), Some(plan));
        let batch = [
            RemoteOp::Read { ptr: p(0), len: 8 },
            RemoteOp::Read { ptr: p(8), len: 8 },
        ];
        assert!(t.execute(&batch).is_ok());
        assert_eq!(t.execute(&batch), Err(TransportError::Disconnected));
        assert!(t.is_dead());
        assert_eq!(t.execute(&batch), Err(TransportError::Disconnected));
        assert_eq!(t.alloc_block(0, 64), Err(TransportError::Disconnected));
        assert_eq!(t.doorbells(), 2);
        assert_eq!(t.nodes(), 1);
        // Doorbell 1 fully, doorbell 2 only its first op.
        assert_eq!(t.into_inner().batches, vec![2, 1]);
        let mut healthy = FaultInjector::new(Recorder::default(), None);
        for _ in 0..5 {
            assert!(healthy.execute(&batch).is_ok());
        }
        assert_eq!(
            RemoteOp::Faa { ptr: p(16), add: 1 }.ptr(),
            RemoteOp::Read { ptr: p(16), len: 1 }.ptr()
        );
        assert_eq!(OpResult::Cas { old: 3 }.cas_old(), Some(3));
        assert_eq!(OpResult::Written.read_bytes(), None);
        assert_eq!(OpResult::Faa { old: 5 }.faa_old(), Some(5));
    }

    #[test]
    fn reused_completions_name_only_their_own_bytes() {
        let mut c = Completions::new();
        let (at, area) = c.reserve(24);
        area.copy_from_slice(&[7u8; 24]);
        assert!(c.push_read_at(at, 16));
        c.push_cas(9);
        assert_eq!(c.read(0), Some(&[7u8; 16][..]));
        // Cleared: the storage stays, the results go; a smaller landing
        // area is handed out again without being zeroed, and results past
        // it are refused.
        c.clear();
        assert!(c.is_empty());
        let (at, area) = c.reserve(8);
        assert_eq!(at, 0);
        area.copy_from_slice(&[1u8; 8]);
        assert!(!c.push_read_at(0, 16), "past the reserved bytes");
        assert_eq!(c.word_at(8), None, "past the reserved bytes");
        assert!(c.push_read_at(0, 8));
        c.push_read_bytes(b"abc");
        assert_eq!(c.read(0), Some(&[1u8; 8][..]));
        assert_eq!(c.read(1), Some(&b"abc"[..]));
        // Equal to a fresh set with the same results, whatever lies past.
        let mut fresh = Completions::new();
        fresh.push_read_bytes(&[1u8; 8]);
        fresh.push_read_bytes(b"abc");
        assert_eq!(c, fresh);
        assert_eq!(c.to_results(), fresh.to_results());
        fresh.push_written();
        assert_ne!(c, fresh);
        // push_read still zeroes what it hands out.
        c.clear();
        c.reserve(8).1.copy_from_slice(&[5u8; 8]);
        c.clear();
        assert_eq!(c.push_read(8), &mut [0u8; 8][..]);
    }
}
