//! [`MemoryNodeServer`]: a RACE memory node on any KRCore provider.
//!
//! It registers one region (remote READ, WRITE and atomics) on its
//! [`Node`], so peers' VQPs reach it through the node's DCT (or RC pairs in
//! fallback mode); node 0 also lays out the table (superblock, directory,
//! initial subtables) with the very code the in-process nodes use
//! ([`MemoryNode::format`] over [`MrMemory`]). After that its CPU does one
//! thing: answer block allocation requests, two-sided messages to its
//! [`ALLOC_PORT`] (the SDK's messaging): coarse blocks, and blocks that
//! closing clients gave back ([`crate::pool`]), which it takes back over
//! the same port. Every key-value operation is one-sided.

use super::proto::{
    AllocReply, AllocRequest, NodeInfo, RunsKind, RunsReply, RunsRequest, ALLOC_PORT,
    FEATURE_COLLECT, FEATURE_LEASES, FEATURE_LEASE_END, FEATURE_RUNS, RUNS_COLLECTING,
    RUNS_DRAINING, RUNS_OUT_OF_MEMORY, RUNS_REFUSED,
};
use crate::collection::CollectStart;
use crate::layout::usage::UsageRepr;
use crate::memory::{
    MemoryNode, NodeMemory, NodeStats, TableConfig, BLOCK_ALIGN, USAGE_CHANGED_EVERY, USAGE_EVERY,
};
use crate::remote::{Cause, TransportError};
use crate::Error;
use krcore::{Access, MemoryRegion, Node, Port};
use krcore_nic::sim::SimFabric;
use krcore_nic::Nic;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shortest sleep of a served node between empty polls (see
/// [`MemoryNodeServer::spawn`]).
pub const MIN_IDLE: Duration = Duration::from_micros(20);

/// The fault-ahead thread's sleep once caught up, doubling up to
/// [`MAX_FAULT_SLEEP`]: the heap moves by at most a grant (1 MiB) per
/// request, far less than [`crate::memory::PREFAULT_AHEAD`] in that time.
const MIN_FAULT_SLEEP: Duration = Duration::from_millis(1);
const MAX_FAULT_SLEEP: Duration = Duration::from_millis(20);

/// Most messages one [`MemoryNodeServer::poll_once`] takes.
const POLL_BUDGET: usize = 64;

/// The published name of memory node `id` on a sim fabric.
pub fn node_name(id: u8) -> String {
    format!("race-node-{id}")
}

/// A registered region as a memory node's backing memory.
pub struct MrMemory<N: Nic>(pub MemoryRegion<N>);

impl<N: Nic> std::fmt::Debug for MrMemory<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrMemory")
            .field("addr", &format_args!("{:#x}", self.0.remote_addr(0).addr))
            .field("len", &self.0.len())
            .finish()
    }
}

impl<N: Nic> NodeMemory for MrMemory<N> {
    fn len_bytes(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) {
        // In range (checked by MemoryNode); the region re-checks.
        let _ = self.0.read(offset as usize, buf);
    }

    fn write_from(&self, offset: u64, bytes: &[u8]) {
        let _ = self.0.write(offset as usize, bytes);
    }

    fn prefault(&self, offset: u64, len: u64) {
        // In range (checked by MemoryNode); a hint: a page it misses is
        // faulted in by its first use, as before.
        if let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) {
            let _ = self.0.prefault(offset, len);
        }
    }
}

fn setup<E>(what: &'static str) -> impl Fn(E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| {
        Error::Transport(TransportError::Setup {
            what,
            source: Cause::new(e),
        })
    }
}

/// Receive slots a memory node's allocation port asks for. A client holds
/// a channel (one slot) while a request of it is out, asked ahead
/// included, so this many clients allocate at once without waiting; the
/// next waits until a channel closes or, idle for `msg.control_idle` (1 s
/// by default), is reclaimed. Until 2026-12-07 the port had the engine's
/// `msg.port_slots` (64): 100 writing clients of two memory nodes waited
/// about 1 s each, some 2 s (an allocation's timeout), and closes failed.
pub const ALLOC_PORT_SLOTS: u32 = 1024;

/// Receive slots a memory node leaves to its own channels' reply windows
/// (meta registration, store membership) when its budget is smaller than
/// [`ALLOC_PORT_SLOTS`] and the port takes the rest.
const BUDGET_HEADROOM: u32 = 32;

/// `cfg` with room for a memory node's allocation port of
/// [`ALLOC_PORT_SLOTS`] slots: `recv_depth` raised to hold them beside the
/// control slots and the engine's other ports (each SRQ receive buffer is
/// `HEADER_LEN + msg.inline_max` bytes: about 8.2 KiB by default, 10.1 MiB
/// for the 1,280 of the defaults, registered once). A memory node built without it
/// binds its port with what its budget has ([`MemoryNodeServer::start`]).
pub fn memory_node_engine(mut cfg: krcore::EngineConfig) -> krcore::EngineConfig {
    let need = ALLOC_PORT_SLOTS + cfg.msg.ctl_slots + 2 * cfg.msg.port_slots + BUDGET_HEADROOM;
    cfg.recv_depth = cfg.recv_depth.max(need.next_multiple_of(256));
    cfg
}

/// Binds the allocation port with [`ALLOC_PORT_SLOTS`] slots, or with
/// what the node's receive budget has left (less [`BUDGET_HEADROOM`]) if
/// that is fewer; an attached node's port has the daemon's slot count.
/// Clients come and go (and die): a full port takes back the slots of
/// idle channels.
fn bind_alloc_port<N: Nic>(node: &Node<N>) -> Result<(Port<N>, Option<u32>), Error> {
    let bound = match node.bind_reclaiming_with(ALLOC_PORT, ALLOC_PORT_SLOTS) {
        Ok(p) => Ok((p, Some(ALLOC_PORT_SLOTS))),
        Err(krcore::Error::Msg(krcore::MsgError::NoBuffers { free, .. }))
            if free > 2 * BUDGET_HEADROOM =>
        {
            let slots = free - BUDGET_HEADROOM;
            node.bind_reclaiming_with(ALLOC_PORT, slots)
                .map(|p| (p, Some(slots)))
        }
        Err(krcore::Error::Unsupported(_)) if node.is_attached() => {
            node.bind_reclaiming(ALLOC_PORT).map(|p| (p, None))
        }
        Err(e) => Err(e),
    };
    bound.map_err(setup("bind the allocation port"))
}

/// A memory node hosted on a [`Node`].
pub struct MemoryNodeServer<N: Nic> {
    node: Node<N>,
    mem: Arc<MemoryNode<MrMemory<N>>>,
    port: Port<N>,
    info: NodeInfo,
    served: u64,
    port_slots: Option<u32>,
}

impl<N: Nic> std::fmt::Debug for MemoryNodeServer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNodeServer")
            .field("info", &self.info)
            .field("served", &self.served)
            .finish()
    }
}

impl<N: Nic> MemoryNodeServer<N> {
    /// Registers `bytes` of memory on `node` as memory node `id` of a store
    /// of `nodes` memory nodes, and binds its allocation port; node 0 also
    /// formats `table`, and every other node lays out its share of the
    /// table's initial subtables ([`MemoryNode::lay_out_share`]): `table`
    /// must be the one node 0 formats.
    ///
    /// # Errors
    /// [`Error::BadTable`] for an id not below `nodes` or a bad table;
    /// setup failures (memory, the port) as `Error::Transport(Setup)` with
    /// the SDK's error as source.
    pub fn start(
        node: &Node<N>,
        id: u8,
        bytes: u64,
        table: &TableConfig,
        nodes: u8,
    ) -> Result<Self, Error> {
        if id >= nodes {
            return Err(Error::BadTable {
                reason: "memory node id not below the number of memory nodes",
            });
        }
        let len = usize::try_from(bytes).map_err(|_| Error::BadTable {
            reason: "memory node region larger than the address space",
        })?;
        let region = node
            .alloc(len, Access::ALL)
            .map_err(setup("register the region"))?;
        let remote = region.remote_addr(0);
        let mem = Arc::new(MemoryNode::with_memory(id, MrMemory(region)));
        let incarnation = crate::remote::leases::fresh_id();
        if id == 0 {
            mem.format(table, nodes)?;
            // Node 0 is the table's first member: its own slot names it
            // (the others record themselves there before they join,
            // `crate::deploy`).
            mem.write(
                crate::layout::table::MEMBERS_OFFSET,
                &incarnation.to_le_bytes(),
            )?;
        } else {
            mem.lay_out_share(table, nodes)?;
        }
        let (port, port_slots) = bind_alloc_port(node)?;
        let info = NodeInfo {
            id,
            nodes,
            gid: node.gid(),
            base: remote.addr,
            len: bytes,
            rkey: remote.rkey,
            alloc_port: ALLOC_PORT,
            features: FEATURE_RUNS | FEATURE_LEASES | FEATURE_LEASE_END | FEATURE_COLLECT,
            incarnation,
            table: Some(*table),
        };
        Ok(MemoryNodeServer {
            node: node.clone(),
            mem,
            port,
            info,
            served: 0,
            port_slots,
        })
    }

    /// The allocation port's receive slots: as many clients have a request
    /// out at once without waiting ([`ALLOC_PORT_SLOTS`] when the node's
    /// engine has the room, see [`memory_node_engine`]); `None` on a node
    /// attached to `krcored`, whose ports have the daemon's
    /// `msg.port_slots`.
    pub fn alloc_port_slots(&self) -> Option<u32> {
        self.port_slots
    }

    /// What clients need to reach this node.
    pub fn info(&self) -> NodeInfo {
        self.info
    }

    /// The node hosting it.
    pub fn node(&self) -> &Node<N> {
        &self.node
    }

    /// Bytes handed out so far (including the reserved prefix and, on node
    /// 0, the table metadata).
    pub fn used_bytes(&self) -> u64 {
        self.mem.stats().heap_used
    }

    /// Usage figures, with the blocks clients gave back.
    pub fn stats(&self) -> NodeStats {
        self.mem.stats()
    }

    /// Allocation requests served.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Publishes [`MemoryNodeServer::info`] under [`node_name`] on a sim
    /// fabric.
    ///
    /// # Errors
    /// The fabric's error.
    pub fn publish_on_sim(&self, fabric: &SimFabric) -> Result<(), Error> {
        fabric
            .publish(&node_name(self.info.id), &self.info.encode())
            .map_err(setup("publish the node record"))
    }

    /// Answers the allocation requests that arrived; returns how many.
    /// Garbage is dropped; a reply that cannot be sent (the client is gone)
    /// only fails that client's call.
    ///
    /// # Errors
    /// Failures of the node's receive path.
    pub fn poll_once(&mut self) -> Result<usize, Error> {
        let mut n = 0;
        let mut first_err = None;
        // Bounded: a message whose delivery keeps failing (a dead sender's
        // descriptor) must not keep this call from the others.
        for _ in 0..POLL_BUDGET {
            let m = match self.port.try_pop() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            let bytes = m.to_vec();
            let reply = if RunsRequest::is_one(&bytes) {
                let Ok(req) = RunsRequest::decode(&bytes) else {
                    continue; // garbage is dropped
                };
                self.answer_runs(req).encode()
            } else {
                let Ok(req) = AllocRequest::decode(&bytes) else {
                    continue; // garbage is dropped
                };
                let offset = self.mem.alloc(req.size).ok();
                AllocReply {
                    req_id: req.req_id,
                    offset,
                }
                .encode()
                .to_vec()
            };
            // A reply that cannot be sent fails only that client's call
            // (it asks again).
            let _ = self.port.reply(&m, &reply);
            n += 1;
        }
        self.served += n as u64;
        match (n, first_err) {
            (0, Some(e)) => Err(setup("receive allocation requests")(e)),
            _ => Ok(n),
        }
    }

    /// Faults in the next part of the heap beyond what was handed out
    /// ([`MemoryNode::prefault_ahead`]: at most 2 MiB per call); returns
    /// the bytes, 0 once caught up. [`MemoryNodeServer::spawn`] calls it
    /// on a thread of its own; a host that calls
    /// [`MemoryNodeServer::poll_once`] itself should call it too (between
    /// polls, or on another thread), or the first remote WRITE to each
    /// page of lazily backed memory (the sim's) pays the kernel's zeroing
    /// of it.
    pub fn prefault_ahead(&self) -> u64 {
        self.mem.prefault_ahead()
    }

    /// A grant (blocks given back first, else a coarse block), blocks
    /// given back, or a lease renewed or ended; for a request that names a holder,
    /// on its behalf ([`crate::holders`]), with its lease in the answer.
    fn answer_runs(&self, req: RunsRequest) -> RunsReply {
        let answer = |status, runs, lease| RunsReply {
            req_id: req.req_id,
            status,
            runs,
            lease,
            aware: req.aware,
        };
        let size_ok = req.block_bytes > 0 && req.block_bytes % BLOCK_ALIGN == 0;
        // A client that would not drop what it holds after a collection
        // (one of an older version: not aware, or naming no holder, which
        // no collection drains) is served only until the first, and a
        // client naming no holder not while one is under way.
        let blocks = matches!(req.kind, RunsKind::Grant { .. } | RunsKind::GiveBack { .. });
        let unaware = !req.aware && (req.holder.is_some() || blocks);
        if unaware && self.mem.collections() > 0 {
            return answer(RUNS_REFUSED, Vec::new(), None);
        }
        if req.holder.is_none() && blocks && self.mem.collecting() {
            return answer(RUNS_COLLECTING, Vec::new(), None);
        }
        // A named holder's lease is renewed once, first: a failure after it
        // still carries the lease (the node heard from the holder). Not for
        // an end: a holder may end its lease while a collection drains the
        // node (which renews nobody; the end is what the drain waits for).
        let renews = !matches!(req.kind, RunsKind::End);
        let lease = match req.holder.filter(|_| renews).map(|h| self.mem.renew(h)) {
            None => None,
            Some(Ok(lease)) => Some(lease),
            Some(Err(TransportError::Collecting { .. })) => {
                return answer(RUNS_COLLECTING, Vec::new(), None)
            }
            Some(Err(_)) => return answer(RUNS_OUT_OF_MEMORY, Vec::new(), None),
        };
        match req.kind {
            RunsKind::Grant { size } if size_ok && size > 0 => {
                match self.mem.alloc_blocks(size, req.block_bytes) {
                    Ok(runs) => {
                        if let Some(h) = req.holder {
                            self.mem.record_grant(h, req.block_bytes, &runs);
                        }
                        answer(0, runs, lease)
                    }
                    Err(_) => answer(RUNS_OUT_OF_MEMORY, Vec::new(), lease),
                }
            }
            RunsKind::GiveBack { runs, delay_us } => {
                let delay = Duration::from_micros(delay_us);
                match self.mem.give_back(req.block_bytes, &runs, delay) {
                    Ok(_) => answer(0, Vec::new(), lease),
                    Err(_) => answer(RUNS_REFUSED, Vec::new(), lease),
                }
            }
            RunsKind::Renew if lease.is_some() => answer(0, Vec::new(), lease),
            RunsKind::End => match req.holder {
                Some(h) => {
                    self.mem.end_lease(h);
                    answer(0, Vec::new(), None)
                }
                None => answer(RUNS_REFUSED, Vec::new(), None),
            },
            RunsKind::CollectBegin { token } => match self.mem.collect_begin(token) {
                Ok(CollectStart::Ready) => answer(0, Vec::new(), None),
                Ok(CollectStart::Draining { wait, leases }) => {
                    let wait_us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
                    answer(RUNS_DRAINING, vec![(wait_us, leases)], None)
                }
                Err(_) => answer(RUNS_REFUSED, Vec::new(), None),
            },
            RunsKind::CollectLive { token, runs } => match self.mem.collect_live(token, &runs) {
                Ok(()) => answer(0, Vec::new(), None),
                Err(_) => answer(RUNS_REFUSED, Vec::new(), None),
            },
            RunsKind::CollectFinish { token, apply } => {
                match self.mem.collect_finish(token, apply) {
                    Ok(c) => answer(0, vec![(c.bytes, c.runs)], None),
                    Err(_) => answer(RUNS_REFUSED, Vec::new(), None),
                }
            }
            RunsKind::Grant { .. } | RunsKind::Renew => answer(RUNS_REFUSED, Vec::new(), lease),
        }
    }

    /// Sets how long a client's lease on this node's grants lasts without
    /// a request ([`crate::holders::DEFAULT_GRANT_LEASE`] unless set).
    pub fn set_grant_lease(&self, lease: Duration) {
        self.mem.set_grant_lease(lease);
    }

    /// Serves on a thread of its own until the handle is dropped (or
    /// [`MemoryNodeHandle::stop`]), and keeps the heap faulted in ahead of
    /// what it hands out on a second one
    /// ([`MemoryNodeServer::prefault_ahead`]: a step takes milliseconds on
    /// lazily backed memory, which the serving thread must not spend). Between empty polls it sleeps, from
    /// [`MIN_IDLE`] doubling up to `idle` (allocation is rare: clients
    /// carve coarse blocks; a thread waking every few microseconds would
    /// take CPU from the clients), and polls again right after serving a
    /// request.
    pub fn spawn(mut self, idle: Duration) -> MemoryNodeHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let (info, port_slots) = (self.info, self.port_slots);
        let flag = stop.clone();
        let mem = self.mem.clone();
        let stats: StatsFn = Arc::new(move || mem.stats());
        let mem_lease = self.mem.clone();
        let set_lease: LeaseFn = Arc::new(move |d| mem_lease.set_grant_lease(d));
        let mem_fault = self.mem.clone();
        let thread = std::thread::Builder::new()
            .name(format!("race-node-{}", info.id))
            .spawn(move || {
                let mut sleep = MIN_IDLE.min(idle);
                while !flag.load(Ordering::Relaxed) {
                    match self.poll_once() {
                        Ok(0) => {
                            std::thread::sleep(sleep);
                            sleep = (sleep * 2).min(idle);
                        }
                        Ok(_) => sleep = MIN_IDLE.min(idle),
                        Err(_) => std::thread::sleep(idle * 10),
                    }
                }
            })
            .ok();
        let flag = stop.clone();
        let fault = std::thread::Builder::new()
            .name(format!("race-fault-{}", info.id))
            .spawn(move || {
                let mut sleep = MIN_FAULT_SLEEP;
                let mut published: Option<(Instant, UsageRepr)> = None;
                let mut looked = Instant::now();
                while !flag.load(Ordering::Relaxed) {
                    // Also takes back what dead clients never wrote (a
                    // scan of their grants' blocks: off the serving
                    // thread too).
                    mem_fault.reclaim_if_due();
                    // And keeps the node's usage record fresh for clients
                    // to READ: rewritten every USAGE_EVERY, and as soon as
                    // it changed (looked at every USAGE_CHANGED_EVERY).
                    let due = published.is_none_or(|(t, _)| t.elapsed() >= USAGE_EVERY);
                    if due || looked.elapsed() >= USAGE_CHANGED_EVERY {
                        looked = Instant::now();
                        let now = mem_fault.usage(crate::layout::usage::wall_ms());
                        let changed = published.is_none_or(|(_, last)| !last.same_usage(&now));
                        if due || changed {
                            mem_fault.write_usage(&now);
                            published = Some((Instant::now(), now));
                        }
                    }
                    if mem_fault.prefault_ahead() > 0 {
                        sleep = MIN_FAULT_SLEEP;
                    } else {
                        std::thread::sleep(sleep);
                        sleep = (sleep * 2).min(MAX_FAULT_SLEEP);
                    }
                }
            })
            .ok();
        MemoryNodeHandle {
            info,
            port_slots,
            stop,
            thread,
            fault,
            stats,
            set_lease,
        }
    }
}

type StatsFn = Arc<dyn Fn() -> NodeStats + Send + Sync>;
type LeaseFn = Arc<dyn Fn(Duration) + Send + Sync>;

/// A running [`MemoryNodeServer`]; stops (and joins) on drop.
pub struct MemoryNodeHandle {
    info: NodeInfo,
    port_slots: Option<u32>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    fault: Option<std::thread::JoinHandle<()>>,
    stats: StatsFn,
    set_lease: LeaseFn,
}

impl std::fmt::Debug for MemoryNodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNodeHandle")
            .field("info", &self.info)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl MemoryNodeHandle {
    /// The node's record.
    pub fn info(&self) -> NodeInfo {
        self.info
    }

    /// Usage figures, with the blocks clients gave back.
    pub fn stats(&self) -> NodeStats {
        (self.stats)()
    }

    /// The allocation port's receive slots
    /// ([`MemoryNodeServer::alloc_port_slots`]).
    pub fn alloc_port_slots(&self) -> Option<u32> {
        self.port_slots
    }

    /// Sets how long a client's lease on the node's grants lasts
    /// ([`MemoryNodeServer::set_grant_lease`]).
    pub fn set_grant_lease(&self, lease: Duration) {
        (self.set_lease)(lease);
    }

    /// Stops serving and joins the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in [self.thread.take(), self.fault.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl Drop for MemoryNodeHandle {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Reads the records of memory nodes `0..count` published on a sim fabric.
///
/// # Errors
/// `Error::Transport(Setup)` when a record is missing or malformed.
pub fn lookup_nodes_on_sim(fabric: &SimFabric, count: u8) -> Result<Vec<NodeInfo>, Error> {
    (0..count)
        .map(|id| {
            let bytes = fabric
                .lookup(&node_name(id))
                .map_err(setup("look up a memory node"))?
                .ok_or_else(|| {
                    Error::Transport(TransportError::Setup {
                        what: "look up a memory node",
                        source: Cause::msg(format!("{} is not published", node_name(id))),
                    })
                })?;
            NodeInfo::decode(&bytes).map_err(Error::Transport)
        })
        .collect()
}
