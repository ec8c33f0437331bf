//! Shared test helpers: tiny clusters that split early, client configs for
//! manual and system clocks, and a reference model.
#![allow(dead_code)]

use std::sync::Arc;

use race_store::clock::{Clock, ManualClock, SystemClock};
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::{ClusterConfig, LocalCluster, LocalTransport, TableConfig};
use race_store::{Client, ClientConfig};

/// A cluster whose table starts as one subtable of `groups` bucket groups.
pub fn tiny_cluster(nodes: u8, groups: u32, node_bytes: u64, max_global_depth: u8) -> LocalCluster {
    LocalCluster::new(ClusterConfig {
        nodes,
        node_bytes,
        table: TableConfig {
            geometry: SubtableGeometry::new(groups).unwrap(),
            initial_global_depth: 0,
            max_global_depth,
        },
    })
    .unwrap()
}

/// For a [`ManualClock`] that only moves when told (or on backoff): leases
/// of 1000 ticks, attempts that never expire by themselves.
pub fn manual_config() -> ClientConfig {
    ClientConfig {
        lease_ticks: 1_000,
        lease_unit_ticks: 1,
        max_op_ticks: 1 << 30,
        grace_ticks: 1 << 32,
        max_attempts: 1_000_000,
        coarse_block_bytes: 4096,
        ..ClientConfig::default()
    }
}

/// Every node's account of its memory in use by `check`
/// (`TableCheck::accounts`, with the nodes' usage records now).
pub fn node_accounts(
    cluster: &LocalCluster,
    check: &race_store::client::TableCheck,
) -> Vec<race_store::client::NodeAccount> {
    let usages: Vec<_> = (0..cluster.len())
        .map(|n| (n, cluster.node(n).unwrap().usage(0)))
        .collect();
    check
        .accounts(&usages, Some(0))
        .into_iter()
        .map(|(_, a)| a)
        .collect()
}

/// For a [`ManualClock`] moved by hand one tick per operation: short
/// operations and grace periods, leases that never run out.
pub fn tick_config() -> ClientConfig {
    ClientConfig {
        lease_ticks: 1 << 30,
        lease_unit_ticks: 1,
        max_op_ticks: 64,
        grace_ticks: 256,
        ..ClientConfig::default()
    }
}

/// For a [`SystemClock`] (microseconds) under a loaded debug build.
pub fn system_config() -> ClientConfig {
    ClientConfig {
        lease_ticks: 2_000_000,
        lease_unit_ticks: 1_000,
        max_op_ticks: 500_000,
        grace_ticks: 1_500_000,
        max_attempts: 1_000_000,
        coarse_block_bytes: 4096,
        ..ClientConfig::default()
    }
}

pub fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_000, 1))
}

pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

pub fn open(
    cluster: &LocalCluster,
    clock: Arc<dyn Clock>,
    config: ClientConfig,
) -> Client<LocalTransport> {
    Client::open(cluster.transport(), clock, config).unwrap()
}

/// Deterministic key and value generators.
pub fn key(i: u64) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

pub fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = format!("v{key}.{version}:").into_bytes();
    while v.len() < len {
        v.push(b'a' + (v.len() % 26) as u8);
    }
    v.truncate(len.max(1));
    v
}

pub mod rdma;
pub mod sched;
