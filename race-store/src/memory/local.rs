//! Memory nodes in this process ([`LocalCluster`]) and the transport that
//! reaches them ([`LocalTransport`]).

use super::{MemoryNode, NodeStats, TableConfig};
use crate::collection::{CollectStart, Collected};
use crate::error::Error;
use crate::layout::slot::RemotePtr;
use crate::remote::{
    BlockRun, Completions, LeaseBook, OpResult, RemoteOp, Ticket, Transport, TransportError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    fn end_grant_leases(&mut self, only: Option<u8>, _wait: bool) -> Result<usize, TransportError> {
        let mut told = 0;
        for node in 0..self.nodes() {
            if only.is_some_and(|n| n != node) || self.leases.generation(node).is_none() {
                continue;
            }
            self.leases.forget(node);
            self.node(node)?.end_lease(self.leases.holder());
            told += 1;
        }
        Ok(told)
    }

    fn lease_collections(&self, node: u8) -> Option<u32> {
        self.leases.collections(node)
    }

    fn collect_begin(&mut self, node: u8, token: u64) -> Result<CollectStart, TransportError> {
        self.node(node)?.collect_begin(token)
    }

    fn collect_live(
        &mut self,
        node: u8,
        token: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), TransportError> {
        self.node(node)?.collect_live(token, runs)
    }

    fn collect_finish(
        &mut self,
        node: u8,
        token: u64,
        apply: bool,
    ) -> Result<Collected, TransportError> {
        self.node(node)?.collect_finish(token, apply)
    }

    fn nodes(&self) -> u8 {
        self.nodes.len() as u8
    }
}
