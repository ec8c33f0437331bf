//! race-store over KRCore: memory nodes hosted on any provider
//! ([`MemoryNodeServer`]) and clients whose [`crate::remote::Transport`] is
//! a set of virtual QPs ([`VqpTransport`]).
//!
//! A cluster: a meta server, memory nodes (each a KRCore node registered in
//! the meta table, node 0 holding the table), and compute nodes whose client
//! threads connect to every memory node by a metadata lookup. On a sim
//! fabric, memory nodes may publish their [`NodeInfo`] under [`node_name`];
//! a deployed store finds them through the meta server (see
//! `race_store::deploy`).

mod alloc_msg;
mod endpoints;
mod proto;
mod server;
mod transport;

pub use endpoints::{AllocEndpoints, STORE_ALLOC_ENDPOINTS};
pub use proto::{
    AllocReply, AllocRequest, NodeInfo, RunsKind, RunsReply, RunsRequest, ALLOC_PORT,
    FEATURE_COLLECT, FEATURE_LEASES, FEATURE_LEASE_END, FEATURE_RUNS, MAX_RUNS, NODE_INFO_LEN,
    RUNS_COLLECTING, RUNS_DRAINING, RUNS_OUT_OF_MEMORY, RUNS_REFUSED, RUNS_REPLY_HEADER,
    RUNS_REQUEST_HEADER,
};
pub use server::{
    lookup_nodes_on_sim, memory_node_engine, node_name, MemoryNodeHandle, MemoryNodeServer,
    MrMemory, ALLOC_PORT_SLOTS, MIN_IDLE,
};
pub use transport::{VqpTransport, BATCH_TIMEOUT, MAX_QUARANTINE};
