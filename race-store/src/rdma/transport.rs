//! [`VqpTransport`]: the client's [`Transport`] over KRCore virtual QPs.
//!
//! One VQP per memory node (connected by a metadata lookup, no QP created).
//! A batch becomes one doorbell per memory node it touches: the node's WRs are
//! posted together, only the last one signaled; the call returns when every
//! node's last WR has completed, which (RDMA completes a QP's WRs in order)
//! means all of them have. Each VQP knows a grant over its node's region, so
//! the engine's pre-check refuses any access outside it before it reaches the
//! NIC: a bad pointer from corrupted remote bytes is a typed error, never a
//! flushed shared queue.
//!
//! Block allocation is a two-sided message to the memory node's allocation
//! port (`ALLOC_PORT`, see [`super::MemoryNodeServer`]) from a messaging
//! endpoint (the SDK's messaging: credits, no silent drop) lent to the
//! transport while a request of it is out: its own, or one of a set
//! shared by the clients of its node ([`super::AllocEndpoints`],
//! [`VqpTransport::connect_sharing`]), made on the first
//! [`Transport::alloc_block`]: a client
//! that only reads (a joining compute node's first get) never creates a
//! QP at all, so connecting stays a metadata lookup. The endpoint's
//! channels have a window of one credit (one request out at a time), which
//! the port returns as it pops the request, so each allocation closes its
//! channel when answered: a memory node's port slots go back to it, and
//! any number of clients allocate over time. A client that dies before its
//! Close leaves its slot granted until the port, full, reclaims it (idle
//! for the memory node's `msg.control_idle`); an allocation that finds the
//! port full, or its own node's receive budget taken by the reply windows
//! of other clients' channels (the threads of one process share a node),
//! asks again for [`ALLOC_BUSY_WAIT`] before it fails.
//!
//! Local memory: one registered scratch buffer, cut per batch into a slice
//! per op (READ destinations, WRITE sources unless inline, 8-byte atomic
//! results).
//!
//! A batch given up on (no completion within the batch timeout, or a
//! doorbell refused after another node's was posted) may still have READs
//! in flight: a NIC executes them whenever its link lets it, and they land
//! in the buffer they name. That buffer is therefore never used again
//! while they may: it is *quarantined* (kept registered, out of use) and a
//! fresh one takes its place, so late bytes can never be read as a later
//! batch's results. A quarantined buffer is freed once the completions of
//! its WRs have come; at most [`MAX_QUARANTINE`] are kept, the oldest
//! deregistered beyond that (a WR still naming it then fails at the NIC's
//! local key check instead of writing anything).

use super::alloc_msg::{Allocations, Holder, Want};
use super::endpoints::AllocEndpoints;
use super::proto::{NodeInfo, FEATURE_COLLECT, FEATURE_LEASES, FEATURE_RUNS};
use crate::collection::{CollectStart, Collected};
use crate::layout::slot::RemotePtr;
use crate::remote::{
    AllocAsk, BlockRun, Cause, Completions, OpResult, RemoteOp, Ticket, Transport, TransportError,
};
use krcore::{Access, MemoryRegion, Node, RemoteGrant, Vqp};
use krcore_nic::{Nic, SendWr, Sge, Wc, WcStatus, MAX_INLINE};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod collect;
mod post;

use post::{failure_of, land, slot_mut};

/// Scratch buffer size (grows when a batch needs more).
const SCRATCH: usize = 1 << 20;
/// How long one batch may take before the transport gives up, by default
/// ([`VqpTransport::set_batch_timeout`]).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Scratch buffers of abandoned batches kept out of use at most (see the
/// module docs).
pub const MAX_QUARANTINE: usize = 8;
/// Bits of a wr_id that tag the batch (`batch << 24 | index`): the batch
/// counter wraps below the SDK's reserved request bit.
const BATCH_MASK: u64 = (1 << 39) - 1;
/// Doorbells [`Transport::post_into`] keeps in flight.
const IN_FLIGHT: usize = 2;
/// A slot's scratch buffer at first (it grows, while free, for a larger
/// batch).
const SLOT_SCRATCH: usize = 64 << 10;

/// A doorbell of [`Transport::post_into`] in flight, with a scratch buffer
/// of its own (its READs land there while other doorbells run).
struct Slot<N: Nic> {
    mr: MemoryRegion<N>,
    sge: Sge,
    /// The doorbell's batch tag; 0: the slot is free.
    tag: u64,
    /// Each op's offset in `mr`, and the bytes they take.
    offs: Vec<usize>,
    need: usize,
    /// Per node, the index of its last (signaled) WR, until it completes.
    last: Vec<Option<usize>>,
    /// Nodes whose last WR has not completed.
    waiting: usize,
    /// The first error completion: node, op index, status.
    failure: Option<(u8, usize, WcStatus)>,
}

/// A scratch buffer that an abandoned batch's WRs may still land in.
struct Quarantined<N: Nic> {
    /// Held only to keep it registered and out of use.
    _mr: MemoryRegion<N>,
    /// The batch's tag.
    tag: u64,
    /// Per node, its last (signaled) WR whose completion has not come.
    last: Vec<Option<usize>>,
}

struct Remote<N: Nic> {
    info: NodeInfo,
    vqp: Vqp<N>,
}

/// A [`Transport`] over KRCore VQPs, for one client thread.
pub struct VqpTransport<N: Nic> {
    node: Node<N>,
    remotes: Vec<Remote<N>>,
    scratch: MemoryRegion<N>,
    /// `scratch`'s address, lkey and length, read once (a batch checks its
    /// whole layout against the length, then builds its SGEs directly).
    scratch_sge: Sge,
    /// Block allocation: the messaging endpoint (made at the first
    /// allocation) and the requests sent ahead.
    alloc: Allocations<N>,
    /// Per node: the renewal of the grant lease sent ahead, not collected.
    renewing: Vec<Option<AllocAsk>>,
    /// WRITEs of at most this many bytes go inline: `MAX_INLINE` (on a
    /// node attached to the node daemon too: its ring carries them in a
    /// continuation slot).
    max_inline: usize,
    /// Tags the wr_ids of a batch (`batch << 24 | index`), so completions of
    /// an abandoned batch are recognized and dropped.
    batch: u64,
    wcs: Vec<Wc>,
    wrs: Vec<Vec<SendWr>>,
    /// Per batch: each op's offset in scratch, and each node's last op
    /// (kept across batches to avoid allocating per doorbell).
    offs: Vec<usize>,
    /// Ops per node of the doorbell being cut (`execute_into`).
    per_node: Vec<usize>,
    last: Vec<Option<usize>>,
    /// Results for [`Transport::execute`] (which converts them).
    results: Completions,
    /// Doorbells posted by `post_into` (made on first use).
    slots: Vec<Slot<N>>,
    /// Scratch buffers of abandoned batches, oldest first.
    quarantine: Vec<Quarantined<N>>,
    /// The sync scratch buffer was abandoned but no fresh one could be
    /// made: the next batch makes one first.
    scratch_tainted: bool,
    batch_timeout: Duration,
    /// Asked, when an operation on a memory node fails, which incarnation
    /// serves its id now ([`VqpTransport::set_member_check`]).
    member_check: Option<MemberCheck>,
    /// Per node: when `member_check` was last asked, and the incarnation
    /// it found serving the id when that was another one.
    checked: Vec<(Option<Instant>, Option<u64>)>,
}

/// Which incarnation serves memory node id `id` now (`None`: none, or it
/// cannot be told): a deployed store asks its meta server.
pub type MemberCheck = std::sync::Arc<dyn Fn(u8) -> Option<u64> + Send + Sync>;

/// How often one memory node's membership is asked again after a failure.
const MEMBER_CHECK_EVERY: Duration = Duration::from_secs(1);

impl<N: Nic> std::fmt::Debug for VqpTransport<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VqpTransport")
            .field("gid", &self.node.gid())
            .field("nodes", &self.remotes.len())
            .finish()
    }
}

/// The SGE of a whole region (its length in `length`, saturated).
fn sge_of<N: Nic>(mr: &MemoryRegion<N>) -> Result<Sge, TransportError> {
    let len = u32::try_from(mr.len()).unwrap_or(u32::MAX);
    mr.sge(0, len).map_err(setup("scratch memory"))
}

fn setup<E>(what: &'static str) -> impl Fn(E) -> TransportError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| TransportError::Setup {
        what,
        source: Cause::new(e),
    }
}

impl<N: Nic> VqpTransport<N> {
    /// Connects `node` to the memory nodes `infos` (ids `0..infos.len()`, in
    /// order): one VQP each, connected through the node's engine (a DCCache
    /// hit or one READ of the meta table; no QP created).
    ///
    /// # Errors
    /// [`TransportError::Setup`] when a memory node is unknown to the meta
    /// server or a resource cannot be allocated (the SDK's error is its
    /// source); [`TransportError::BadResponse`] for a list out of id order.
    pub fn connect(node: &Node<N>, infos: &[NodeInfo]) -> Result<Self, TransportError> {
        VqpTransport::connect_sharing(node, infos, Arc::new(AllocEndpoints::new(node, 1)))
    }

    /// [`VqpTransport::connect`], making its block allocations from the
    /// endpoints of `endpoints`, shared with the node's other clients (an
    /// endpoint is lent to a client while a request of it is out): the
    /// node then holds at most `endpoints.cap()` allocation endpoints
    /// whatever its client count. `endpoints` must be of `node`.
    ///
    /// # Errors
    /// As [`VqpTransport::connect`].
    pub fn connect_sharing(
        node: &Node<N>,
        infos: &[NodeInfo],
        endpoints: Arc<AllocEndpoints<N>>,
    ) -> Result<Self, TransportError> {
        let mut remotes = Vec::with_capacity(infos.len());
        for (i, info) in infos.iter().enumerate() {
            if usize::from(info.id) != i {
                return Err(TransportError::BadResponse {
                    reason: "memory node list out of id order",
                });
            }
            // One call: on an attached node, one round trip to the daemon
            // per memory node.
            let vqp = node
                .connect_granted(
                    info.gid,
                    info.rkey,
                    RemoteGrant {
                        addr: info.base,
                        len: info.len,
                        access: Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
                        expires_at: None,
                    },
                )
                .map_err(setup("connect to a memory node, its region known"))?;
            remotes.push(Remote { info: *info, vqp });
        }
        let scratch = node
            .alloc(SCRATCH, Access::LOCAL_WRITE)
            .map_err(setup("scratch memory"))?;
        Ok(VqpTransport {
            scratch_sge: sge_of(&scratch)?,
            node: node.clone(),
            wrs: (0..infos.len()).map(|_| Vec::new()).collect(),
            offs: Vec::new(),
            per_node: Vec::new(),
            last: vec![None; infos.len()],
            remotes,
            scratch,
            alloc: Allocations::new(endpoints),
            renewing: Vec::new(),
            max_inline: MAX_INLINE,
            batch: 0,
            wcs: vec![Wc::default(); 16],
            results: Completions::new(),
            slots: Vec::new(),
            quarantine: Vec::new(),
            scratch_tainted: false,
            batch_timeout: BATCH_TIMEOUT,
            member_check: None,
            checked: vec![(None, None); infos.len()],
        })
    }

    /// How long a batch may wait for its completions before it fails with
    /// [`TransportError::Timeout`] (default [`BATCH_TIMEOUT`]). Its buffer
    /// is then quarantined (see the module docs).
    pub fn set_batch_timeout(&mut self, timeout: Duration) {
        self.batch_timeout = timeout;
    }

    /// Sets what tells which process serves a memory node's id now: when
    /// an operation on a node fails (it does not answer, its region or its
    /// VQP refuses), the transport asks it, at most once a second per node,
    /// and a node served by another incarnation than the one connected to
    /// fails as [`TransportError::NodeReplaced`] from then on: a memory
    /// node that restarted is empty, and saying "down" would have the
    /// caller wait for data that is gone. [`crate::deploy::Store`] sets it
    /// for its clients (the store's membership at the meta server).
    pub fn set_member_check(&mut self, check: MemberCheck) {
        self.member_check = Some(check);
    }

    /// `r`, or [`TransportError::NodeReplaced`] when it failed on a memory
    /// node that another incarnation serves now (see
    /// [`VqpTransport::set_member_check`]).
    fn explain<T>(&mut self, r: Result<T, TransportError>) -> Result<T, TransportError> {
        let Err(e) = r else {
            return r;
        };
        let node = match &e {
            TransportError::NodeDown { node }
            | TransportError::Failed { node, .. }
            | TransportError::Refused { node, .. }
            | TransportError::Timeout { node, .. } => *node,
            TransportError::OutOfBounds { ptr, .. } | TransportError::Misaligned { ptr } => {
                ptr.node()
            }
            _ => return Err(e),
        };
        let (Some(check), Some(was)) = (
            self.member_check.as_ref(),
            self.remotes
                .get(usize::from(node))
                .map(|r| r.info.incarnation)
                .filter(|&i| i != 0),
        ) else {
            return Err(e);
        };
        let Some(seen) = self.checked.get_mut(usize::from(node)) else {
            return Err(e);
        };
        if seen.1.is_none() && seen.0.is_none_or(|at| at.elapsed() >= MEMBER_CHECK_EVERY) {
            seen.0 = Some(Instant::now());
            seen.1 = check(node).filter(|&now| now != was);
        }
        match seen.1 {
            Some(now) => Err(TransportError::NodeReplaced { node, was, now }),
            None => Err(e),
        }
    }

    /// Scratch buffers of abandoned batches held out of use now (their
    /// WRs may still land in them).
    pub fn quarantined(&self) -> usize {
        self.quarantine.len()
    }

    /// Keeps `mr`, which the WRs of batch `tag` still outstanding (`last`)
    /// may land in, out of use (nothing when none is outstanding).
    fn quarantine(&mut self, mr: MemoryRegion<N>, tag: u64, last: Vec<Option<usize>>) {
        if last.iter().all(Option::is_none) {
            return;
        }
        if self.quarantine.len() >= MAX_QUARANTINE {
            // Deregistered: a late WR naming it fails at the NIC.
            self.quarantine.remove(0);
        }
        self.quarantine.push(Quarantined { _mr: mr, tag, last });
    }

    /// The sync batch `tag` was abandoned with `last` outstanding: its
    /// scratch buffer is quarantined and a fresh one takes its place (or,
    /// if none can be made now, the next batch makes it first).
    fn abandon_scratch(&mut self, tag: u64, last: &[Option<usize>]) {
        if last.iter().all(Option::is_none) {
            return;
        }
        let fresh = self
            .node
            .alloc(self.scratch.len(), Access::LOCAL_WRITE)
            .ok()
            .and_then(|mr| sge_of(&mr).ok().map(|sge| (mr, sge)));
        match fresh {
            Some((mr, sge)) => {
                let old = std::mem::replace(&mut self.scratch, mr);
                self.scratch_sge = sge;
                self.quarantine(old, tag, last.to_vec());
            }
            None => self.scratch_tainted = true,
        }
    }

    /// Slot `k`'s batch `tag` was abandoned: with WRs outstanding, the
    /// slot goes, its buffer quarantined (a new slot is made when needed);
    /// otherwise it is freed.
    fn abandon_slot(&mut self, k: usize, tag: u64) {
        let Some(s) = self.slots.get_mut(k) else {
            return;
        };
        s.tag = 0;
        if s.last.iter().all(Option::is_none) {
            return;
        }
        let s = self.slots.remove(k);
        self.quarantine(s.mr, tag, s.last);
    }

    /// Whether node `node` takes runs requests ([`FEATURE_RUNS`]).
    fn takes_runs(&self, node: u8) -> bool {
        self.remotes
            .get(usize::from(node))
            .is_some_and(|r| r.info.features & FEATURE_RUNS != 0)
    }

    /// Whether node `node` keeps leases on its grants ([`FEATURE_LEASES`]).
    fn takes_leases(&self, node: u8) -> bool {
        self.remotes
            .get(usize::from(node))
            .is_some_and(|r| r.info.features & FEATURE_LEASES != 0)
    }

    /// Whether node `node` has feature bit `feature` (see
    /// [`NodeInfo::features`]).
    fn has(&self, node: u8, feature: u32) -> bool {
        self.remotes
            .get(usize::from(node))
            .is_some_and(|r| r.info.features & feature != 0)
    }

    /// How to name this client to node `node`: not at all if it keeps no
    /// leases; aware of its collections where it collects.
    fn holder_for(&self, node: u8) -> Option<Holder> {
        self.takes_leases(node).then(|| Holder {
            id: self.alloc.leases.holder(),
            aware: self.has(node, FEATURE_COLLECT),
        })
    }

    /// A request for about `size` bytes of blocks of `block_bytes`: a grant
    /// where the node takes one, else a coarse block.
    fn grant(&self, node: u8, size: u64, block_bytes: u64) -> Want {
        if self.takes_runs(node) {
            Want::Grant {
                size,
                block_bytes,
                holder: self.holder_for(node),
            }
        } else {
            Want::Coarse { size }
        }
    }

    /// Node `node`'s allocation port: its GID and port number.
    fn alloc_port(&self, node: u8) -> Result<(krcore_nic::Gid, u16), TransportError> {
        let r = self
            .remotes
            .get(usize::from(node))
            .ok_or(TransportError::NoSuchNode { node })?;
        Ok((r.info.gid, r.info.alloc_port))
    }

    /// The client node.
    pub fn node(&self) -> &Node<N> {
        &self.node
    }

    /// Whether the transport has made its messaging endpoint (the only QP
    /// it may create itself, at the first block allocation).
    pub fn has_msg_endpoint(&self) -> bool {
        self.alloc.has_endpoint()
    }

    fn grow_scratch(&mut self, need: usize) -> Result<(), TransportError> {
        if need <= self.scratch.len() && !self.scratch_tainted {
            return Ok(());
        }
        let len = need.max(self.scratch.len()).next_power_of_two();
        self.scratch = self
            .node
            .alloc(len, Access::LOCAL_WRITE)
            .map_err(setup("scratch memory"))?;
        self.scratch_sge = sge_of(&self.scratch)?;
        self.scratch_tainted = false;
        Ok(())
    }
}

/// Most ops in one doorbell per memory node (well inside a VQP's batch cap
/// with the default depth, 128 - 16 WRs). Larger batches (a split reads
/// every KV block of a subtable; a client batch of 64 keys) run as
/// consecutive doorbells: per-node order is kept, and the scratch buffer is
/// reused.
const CHUNK: usize = 32;

impl<N: Nic> Transport for VqpTransport<N> {
    fn execute(&mut self, batch: &[RemoteOp<'_>]) -> Result<Vec<OpResult>, TransportError> {
        let mut out = std::mem::take(&mut self.results);
        let r = self.execute_into(batch, &mut out);
        let res = r.map(|()| out.to_results());
        self.results = out;
        res
    }

    fn execute_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        let r = self.execute_into_raw(batch, out);
        self.explain(r)
    }

    /// Up to two doorbells in flight, each with its own scratch buffer. A
    /// batch that needs more than one doorbell per node (32 ops),
    /// or finds both slots in flight, executes at once (`Ticket::DONE`).
    fn post_into(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, TransportError> {
        let r = self.post_into_raw(batch, out);
        self.explain(r)
    }

    fn complete_into(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        let r = self.complete_into_raw(ticket, batch, out);
        self.explain(r)
    }

    fn max_in_flight(&self) -> usize {
        IN_FLIGHT
    }

    fn alloc_block(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        let r = self.alloc_block_raw(node, size);
        self.explain(r)
    }

    fn alloc_blocks(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let r = self.alloc_blocks_raw(node, size, block_bytes);
        self.explain(r)
    }

    /// The request goes out now; its answer is collected by
    /// `alloc_block_answer` (answers to other requests that arrive
    /// meanwhile are kept for them).
    fn alloc_block_ask(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        let r = self.alloc_block_ask_raw(node, size, block_bytes)?;
        Some(self.explain(r))
    }

    fn alloc_block_answer(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        let r = self.alloc_block_answer_raw(ask, wait);
        self.explain(r)
    }

    /// In messages of at most [`MAX_RUNS`](super::proto::MAX_RUNS) runs that
    /// the allocation endpoint takes (about 4,000 through the node daemon);
    /// without `wait`, each is
    /// pushed once and not waited for (a message that cannot go at once is
    /// not sent: its blocks stay leaked).
    fn return_blocks(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        let r = self.return_blocks_raw(node, block_bytes, runs, delay, wait);
        self.explain(r)
    }

    /// One message, sent ahead as a grant asked ahead is (its Open
    /// carries it on a closed channel).
    fn return_blocks_ahead(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: std::time::Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        let r = self.return_blocks_ahead_raw(node, block_bytes, runs, delay);
        self.explain(r)
    }

    /// Renewed by a request of its own (grants and give-backs renew it
    /// too): sent ahead once a quarter of the lease is gone, its answer
    /// collected by a later call; waited for only when a quarter or less
    /// is left (an exchange while the memory node's thread sleeps would
    /// stall the write that carves: up to its idle sleep).
    fn grant_lease(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        let r = self.grant_lease_raw(node);
        self.explain(r)
    }

    fn lease_collections(&self, node: u8) -> Option<u32> {
        self.has(node, FEATURE_COLLECT)
            .then(|| self.alloc.leases.collections(node))
            .flatten()
    }

    fn collect_begin(&mut self, node: u8, token: u64) -> Result<CollectStart, TransportError> {
        let r = self.collect_begin_raw(node, token);
        self.explain(r)
    }

    fn collect_live(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        let r = self.collect_live_raw(node, token, runs);
        self.explain(r)
    }

    fn collect_finish(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        let r = self.collect_finish_raw(node, token, apply);
        self.explain(r)
    }

    /// An end request to every node that keeps leases, takes ends
    /// ([`crate::rdma::FEATURE_LEASE_END`]) and gave this client one: after the
    /// give-backs of its close, on the same channels, so each node has
    /// them first.
    fn end_grant_leases(&mut self, only: Option<u8>, wait: bool) -> Result<usize, TransportError> {
        let r = self.end_grant_leases_raw(only, wait);
        self.explain(r)
    }

    fn nodes(&self) -> u8 {
        self.remotes.len() as u8
    }
}

impl<N: Nic> VqpTransport<N> {
    // The bodies of the trait methods of the same names, whose errors
    // `explain` looks at.

    fn execute_into_raw(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        out.clear();
        // Cut the batch where a node would get more than CHUNK ops: each
        // doorbell is a contiguous run, so per-node order is kept.
        let mut per_node = std::mem::take(&mut self.per_node);
        per_node.clear();
        per_node.resize(self.remotes.len(), 0);
        let mut start = 0;
        let mut result = Ok(());
        for (i, op) in batch.iter().enumerate() {
            let Some(count) = per_node.get_mut(usize::from(op.node())) else {
                continue; // execute_chunk reports the node
            };
            if *count == CHUNK {
                result = self.execute_chunk(batch.get(start..i).unwrap_or_default(), out);
                if result.is_err() {
                    break;
                }
                start = i;
                per_node.iter_mut().for_each(|c| *c = 0);
                if let Some(c) = per_node.get_mut(usize::from(op.node())) {
                    *c = 1;
                }
            } else {
                *count += 1;
            }
        }
        if result.is_ok() && start < batch.len() {
            result = self.execute_chunk(batch.get(start..).unwrap_or_default(), out);
        }
        self.per_node = per_node;
        result
    }

    fn post_into_raw(
        &mut self,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<Ticket, TransportError> {
        out.clear();
        let mut per_node = std::mem::take(&mut self.per_node);
        per_node.clear();
        per_node.resize(self.remotes.len(), 0);
        for op in batch {
            if let Some(c) = per_node.get_mut(usize::from(op.node())) {
                *c += 1;
            }
        }
        let one_doorbell = per_node.iter().all(|&c| c <= CHUNK);
        self.per_node = per_node;
        if batch.is_empty() || !one_doorbell {
            return self.execute_into(batch, out).map(|()| Ticket::DONE);
        }
        let mut offs = std::mem::take(&mut self.offs);
        let need = self.layout(batch, &mut offs);
        let k = match self.free_slot(need.max(8)) {
            Ok(Some(k)) => k,
            other => {
                self.offs = offs;
                other?;
                return self.execute_into(batch, out).map(|()| Ticket::DONE);
            }
        };
        self.next_tag();
        let tag = self.batch;
        let mut last = std::mem::take(&mut slot_mut(&mut self.slots, k)?.last);
        last.clear();
        last.resize(self.remotes.len(), None);
        let posted = self.post_wrs(batch, &offs, &mut last, tag, Some(k));
        let s = slot_mut(&mut self.slots, k)?;
        // The slot keeps this layout; its previous one is the spare.
        std::mem::swap(&mut s.offs, &mut offs);
        s.waiting = last.iter().filter(|l| l.is_some()).count();
        s.last = last;
        s.need = need;
        s.failure = None;
        self.offs = offs;
        // A failed post leaves the slot free, or, if some of it was
        // posted, quarantines its buffer (what was posted may land).
        if let Err(e) = posted {
            self.abandon_slot(k, tag);
            return Err(e);
        }
        slot_mut(&mut self.slots, k)?.tag = tag;
        Ok(Ticket(tag))
    }

    fn complete_into_raw(
        &mut self,
        ticket: Ticket,
        batch: &[RemoteOp<'_>],
        out: &mut Completions,
    ) -> Result<(), TransportError> {
        if ticket == Ticket::DONE {
            return Ok(());
        }
        let Some(k) = self.slots.iter().position(|s| s.tag == ticket.0) else {
            return Err(TransportError::BadResponse {
                reason: "no doorbell in flight with this ticket",
            });
        };
        let mut wcs = std::mem::take(&mut self.wcs);
        let waited = self.wait_slot(k, &mut wcs);
        self.wcs = wcs;
        if let Err(e) = waited {
            // Given up on: what has not completed may land late.
            self.abandon_slot(k, ticket.0);
            return Err(e);
        }
        let s = slot_mut(&mut self.slots, k)?;
        s.tag = 0;
        if let Some((node, i, status)) = s.failure.take() {
            return Err(failure_of(batch, node, i, status)
                .unwrap_or(TransportError::Failed { node, status }));
        }
        if s.offs.len() != batch.len() {
            return Err(TransportError::BadResponse {
                reason: "completed with another batch than posted",
            });
        }
        land(&s.mr, batch, &s.offs, s.need, out)
    }

    fn alloc_block_raw(&mut self, node: u8, size: u64) -> Result<RemotePtr, TransportError> {
        let to = self.alloc_port(node)?;
        let runs = self.alloc.exchange(node, to, &Want::Coarse { size })?;
        runs.first()
            .map(|r| r.start)
            .ok_or(TransportError::BadResponse {
                reason: "no block in the answer",
            })
    }

    fn alloc_blocks_raw(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Result<Vec<BlockRun>, TransportError> {
        let to = self.alloc_port(node)?;
        let want = self.grant(node, size, block_bytes);
        self.alloc.exchange(node, to, &want)
    }

    fn alloc_block_ask_raw(
        &mut self,
        node: u8,
        size: u64,
        block_bytes: u64,
    ) -> Option<Result<AllocAsk, TransportError>> {
        let to = match self.alloc_port(node) {
            Ok(to) => to,
            Err(e) => return Some(Err(e)),
        };
        let want = self.grant(node, size, block_bytes);
        Some(self.alloc.ask(node, to, want))
    }

    fn alloc_block_answer_raw(
        &mut self,
        ask: AllocAsk,
        wait: bool,
    ) -> Result<Option<Vec<BlockRun>>, TransportError> {
        self.alloc.answer(ask, wait)
    }

    fn return_blocks_raw(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
        wait: bool,
    ) -> Result<(), TransportError> {
        let to = self.give_back_port(node)?;
        // In messages the allocation endpoint takes (through the node
        // daemon: 64 KiB, about 4,000 runs; a client's retired blocks come
        // back in many more runs than that).
        let per_message = self.alloc.max_runs(node)?;
        for part in runs.chunks(per_message) {
            let want = self.give_back_want(node, block_bytes, part, delay);
            if wait {
                self.alloc.exchange(node, to, &want)?;
            } else {
                self.alloc.send_only(node, to, &want)?;
            }
        }
        Ok(())
    }

    fn return_blocks_ahead_raw(
        &mut self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
    ) -> Result<Option<AllocAsk>, TransportError> {
        let to = self.give_back_port(node)?;
        if runs.len() > self.alloc.max_runs(node)? {
            return Err(TransportError::Unsupported {
                what: "giving back more runs than one message holds",
            });
        }
        let want = self.give_back_want(node, block_bytes, runs, delay);
        self.alloc.ask(node, to, want).map(Some)
    }

    /// Node `node`'s allocation port, for a give-back (a node of an older
    /// version takes none: `Unsupported`).
    fn give_back_port(&self, node: u8) -> Result<(krcore_nic::Gid, u16), TransportError> {
        if !self.takes_runs(node) {
            return Err(TransportError::Unsupported {
                what: "giving blocks back to a memory node of an older version",
            });
        }
        self.alloc_port(node)
    }

    /// The request giving `runs` of blocks of `block_bytes` back to node
    /// `node`, usable by others after `delay`.
    fn give_back_want(
        &self,
        node: u8,
        block_bytes: u64,
        runs: &[BlockRun],
        delay: Duration,
    ) -> Want {
        Want::GiveBack {
            block_bytes,
            runs: runs.iter().map(|r| (r.start.offset(), r.len)).collect(),
            delay_us: u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            holder: self.holder_for(node),
        }
    }

    fn grant_lease_raw(&mut self, node: u8) -> Result<Option<u32>, TransportError> {
        let Some(holder) = self.holder_for(node) else {
            return Ok(None);
        };
        let i = usize::from(node);
        if self.renewing.len() <= i {
            self.renewing.resize(i + 1, None);
        }
        if let Some(ask) = self.renewing.get(i).copied().flatten() {
            // Collected if answered (a failed one is asked again), but a
            // node collecting is said at once, not when the lease is urgent:
            // the client ends its lease there early (see `Client::collect`).
            match self.alloc.answer(ask, false) {
                Ok(None) => {}
                r => {
                    self.renewing.get_mut(i).map(Option::take);
                    if let Err(e @ TransportError::Collecting { .. }) = r {
                        return Err(e);
                    }
                }
            }
        }
        let now = Instant::now();
        let pending = self.renewing.get_mut(i).and_then(Option::take);
        if self.alloc.leases.urgent(node, now) {
            let to = self.alloc_port(node)?;
            match pending {
                Some(ask) => {
                    self.alloc.answer(ask, true)?;
                }
                None => {
                    self.alloc.exchange(node, to, &Want::Renew { holder })?;
                }
            }
        } else if pending.is_some() || !self.alloc.leases.due(node, now) {
            // Still out, or not due yet.
            if let Some(slot) = self.renewing.get_mut(i) {
                *slot = pending;
            }
        } else {
            let to = self.alloc_port(node)?;
            // A renewal that cannot be sent ahead is sent when urgent.
            let asked = self.alloc.ask(node, to, Want::Renew { holder }).ok();
            if let Some(slot) = self.renewing.get_mut(i) {
                *slot = asked;
            }
        }
        Ok(self.alloc.leases.generation(node))
    }
}
