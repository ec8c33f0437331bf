//! race-store over KRCore: memory nodes hosted on any provider
//! ([`MemoryServer`]) and clients whose [`crate::Transport`] is a set of
//! virtual QPs ([`VqpTransport`]).
//!
//! A cluster: a meta server, memory nodes (each a KRCore node registered in
//! the meta table, node 0 holding the table), and compute nodes whose client
//! threads connect to every memory node by a metadata lookup. On a sim
//! fabric, memory nodes publish their [`NodeInfo`] under [`node_name`];
//! elsewhere, hand the records to clients by any channel.

mod proto;
mod server;
mod transport;

pub use proto::{AllocReply, AllocRequest, NodeInfo, RPC_QKEY};
pub use server::{lookup_nodes_on_sim, node_name, MemoryServer, MemoryServerHandle, MrMemory};
pub use transport::VqpTransport;
