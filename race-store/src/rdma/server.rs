//! [`MemoryServer`]: a RACE memory node on any KRCore provider.
//!
//! It registers one region (remote READ, WRITE and atomics) in its engine's
//! protection domain, so peers' VQPs reach it through the node's DCT (or RC
//! pairs in fallback mode); node 0 also lays out the table (superblock,
//! directory, initial subtables) with the very code the in-process nodes use
//! ([`MemoryNode::format`] over [`MrMemory`]). After that its CPU does one
//! thing: answer coarse block allocation requests over UD. Every key-value
//! operation is one-sided.

use super::proto::{AllocReply, AllocRequest, NodeInfo, RPC_QKEY};
use crate::memory::{MemoryNode, NodeMemory, TableConfig};
use crate::Error;
use krcore::{Access, Node};
use krcore_kmod::OwnedMr;
use krcore_meta::ud::{Incoming, UdEndpoint};
use krcore_nic::sim::SimFabric;
use krcore_nic::{MemoryRegion, Nic, UdTarget};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The shortest sleep of a served node between empty polls (see
/// [`MemoryServer::spawn`]).
pub const MIN_IDLE: Duration = Duration::from_micros(20);

/// The published name of memory node `id` on a sim fabric.
pub fn node_name(id: u8) -> String {
    format!("race-node-{id}")
}

/// A registered region as a memory node's backing memory.
pub struct MrMemory<N: Nic>(pub OwnedMr<N>);

impl<N: Nic> std::fmt::Debug for MrMemory<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrMemory")
            .field("addr", &format_args!("{:#x}", self.0.addr()))
            .field("len", &self.0.len())
            .finish()
    }
}

impl<N: Nic> NodeMemory for MrMemory<N> {
    fn len_bytes(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) {
        // In range (checked by MemoryNode); the MR re-checks.
        let _ = self.0.read(offset as usize, buf);
    }

    fn write_from(&self, offset: u64, bytes: &[u8]) {
        let _ = self.0.write(offset as usize, bytes);
    }
}

fn setup(what: &'static str) -> impl Fn(String) -> Error {
    move |reason| Error::Transport(crate::remote::TransportError::Setup { what, reason })
}

/// A memory node hosted on `node`.
pub struct MemoryServer<N: Nic> {
    node: Node<N>,
    mem: MemoryNode<MrMemory<N>>,
    rpc: UdEndpoint<N>,
    info: NodeInfo,
    incoming: Vec<Incoming>,
    served: u64,
}

impl<N: Nic> std::fmt::Debug for MemoryServer<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryServer")
            .field("info", &self.info)
            .field("served", &self.served)
            .finish()
    }
}

impl<N: Nic> MemoryServer<N> {
    /// Registers `bytes` of memory on `node` as memory node `id`; node 0
    /// also formats `table` for a cluster of `nodes` memory nodes.
    ///
    /// # Errors
    /// Setup failures (memory, the RPC endpoint) as
    /// `Error::Transport(Setup)`; a bad table as [`Error::BadTable`].
    pub fn start(
        node: &Node<N>,
        id: u8,
        bytes: u64,
        table: &TableConfig,
        nodes: u8,
    ) -> Result<Self, Error> {
        let engine = node.engine();
        let len = usize::try_from(bytes).map_err(|_| setup("region size")("too large".into()))?;
        let region = engine
            .alloc_mr(len, Access::ALL)
            .map_err(|e| setup("register the region")(e.to_string()))?;
        let info_base = region.addr();
        let rkey = region.rkey();
        let mem = MemoryNode::with_memory(id, MrMemory(region));
        if id == 0 {
            mem.format(table, nodes)?;
        }
        let rpc = UdEndpoint::new(engine.nic(), engine.pd(), RPC_QKEY, 64, 64)
            .map_err(|e| setup("allocation RPC endpoint")(e.to_string()))?;
        let info = NodeInfo {
            id,
            gid: node.gid(),
            base: info_base,
            len: bytes,
            rkey,
            rpc_qpn: rpc.qpn(),
            rpc_qkey: RPC_QKEY,
        };
        Ok(MemoryServer {
            node: node.clone(),
            mem,
            rpc,
            info,
            incoming: Vec::new(),
            served: 0,
        })
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

    /// Allocation requests served.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Publishes [`MemoryServer::info`] under [`node_name`] on a sim fabric.
    ///
    /// # Errors
    /// The fabric's error.
    pub fn publish_on_sim(&self, fabric: &SimFabric) -> Result<(), Error> {
        fabric
            .publish(&node_name(self.info.id), &self.info.encode())
            .map_err(|e| setup("publish the node record")(e.to_string()))
    }

    /// Answers the allocation requests that arrived; returns how many.
    ///
    /// # Errors
    /// Provider failures of the RPC endpoint.
    pub fn poll_once(&mut self) -> Result<usize, Error> {
        self.incoming.clear();
        self.rpc
            .poll_recv(&mut self.incoming)
            .map_err(|e| setup("receive allocation requests")(e.to_string()))?;
        let mut n = 0;
        for i in 0..self.incoming.len() {
            let Some(&m) = self.incoming.get(i) else {
                break;
            };
            let Ok(req) = AllocRequest::decode(m.payload()) else {
                continue; // garbage is dropped
            };
            let offset = self.mem.alloc(req.size).ok();
            let reply = AllocReply {
                req_id: req.req_id,
                offset,
            }
            .encode();
            let dest = UdTarget {
                gid: m.src,
                qpn: m.src_qp,
                qkey: RPC_QKEY,
            };
            self.rpc
                .send_bytes(dest, &reply)
                .map_err(|e| setup("send an allocation reply")(e.to_string()))?;
            n += 1;
        }
        self.served += n as u64;
        Ok(n)
    }

    /// Serves on a thread of its own until the handle is dropped. Between
    /// empty polls it sleeps, from [`MIN_IDLE`] doubling up to `idle`
    /// (allocation is rare: clients carve coarse blocks; a thread waking
    /// every few microseconds would take CPU from the clients), and polls
    /// again right after serving a request.
    pub fn spawn(mut self, idle: Duration) -> MemoryServerHandle
    where
        N::Qp: Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let info = self.info;
        let flag = stop.clone();
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
        MemoryServerHandle { info, stop, thread }
    }
}

/// A running [`MemoryServer`]; stops (and joins) on drop.
#[derive(Debug)]
pub struct MemoryServerHandle {
    info: NodeInfo,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemoryServerHandle {
    /// The node's record.
    pub fn info(&self) -> NodeInfo {
        self.info
    }
}

impl Drop for MemoryServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
                .map_err(|e| setup("look up a memory node")(e.to_string()))?
                .ok_or_else(|| {
                    setup("look up a memory node")(format!("{} is not published", node_name(id)))
                })?;
            NodeInfo::decode(&bytes).map_err(Error::Transport)
        })
        .collect()
}
