//! The RACE store over KRCore on a sim fabric: a meta server, memory nodes
//! (`race_store::rdma::MemoryNodeServer`), and one compute node per client
//! thread, each reaching every memory node through VQPs connected by a
//! metadata lookup.

use super::{Backend, BackendError, Found, KvClient};
use krcore::Node;
use krcore_nic::sim::{LatencyModel, SimConfig};
use krcore_nic::AnyNic;
use race_store::clock::{Clock, SystemClock};
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeHandle, MemoryNodeServer, NodeInfo, VqpTransport};
use race_store::{Client, ClientConfig, Error};
use std::sync::Arc;
use std::time::Duration;

/// A RACE cluster on one sim fabric.
pub struct RaceBackend {
    meta: Node,
    infos: Vec<NodeInfo>,
    _servers: Vec<MemoryNodeHandle>,
    clock: Arc<dyn Clock>,
    sim: SimConfig,
    label: Option<String>,
}

fn setup(e: impl std::fmt::Display) -> BackendError {
    BackendError::Setup {
        backend: "race",
        message: e.to_string(),
    }
}

impl RaceBackend {
    /// A meta server and `memory_nodes` memory nodes of `node_bytes` each on
    /// a fresh `sim:mem` fabric, under `latency` (figures are then modeled).
    ///
    /// # Errors
    /// [`BackendError::Setup`].
    pub fn start(
        memory_nodes: u8,
        node_bytes: u64,
        latency: Option<LatencyModel>,
    ) -> Result<RaceBackend, BackendError> {
        let sim = SimConfig {
            latency,
            ..SimConfig::default()
        };
        let meta = Node::builder()
            .fabric("sim:mem")
            .sim_config(sim.clone())
            .host_meta()
            .build()
            .map_err(setup)?;
        let table = TableConfig::default();
        let mut servers = Vec::new();
        let mut infos = Vec::new();
        for id in 0..memory_nodes.max(1) {
            let node = Node::builder().join(&meta).build().map_err(setup)?;
            let s = MemoryNodeServer::start(&node, id, node_bytes, &table, memory_nodes.max(1))
                .map_err(setup)?;
            infos.push(s.info());
            servers.push(s.spawn(Duration::from_millis(1)));
        }
        Ok(RaceBackend {
            meta,
            infos,
            _servers: servers,
            clock: Arc::new(SystemClock::new()),
            label: latency.map(|m| format!("modeled ({})", m.name)),
            sim,
        })
    }
}

struct RaceClient {
    client: Client<VqpTransport<AnyNic>>,
}

fn store(e: Error) -> BackendError {
    // The whole chain: "transport error: memory node 1: out of memory ...".
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    BackendError::Store {
        backend: "race",
        message,
    }
}

impl KvClient for RaceClient {
    fn read(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Found, BackendError> {
        out.clear();
        Ok(match self.client.get(key).map_err(store)? {
            Some(v) => {
                out.extend_from_slice(&v);
                Found::Yes
            }
            None => Found::No,
        })
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.client.put(key, value).map_err(store)
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Found, BackendError> {
        match self.client.update(key, value) {
            Ok(()) => Ok(Found::Yes),
            Err(Error::NotFound) => Ok(Found::No),
            Err(e) => Err(store(e)),
        }
    }

    fn retries(&self) -> Option<u64> {
        Some(self.client.stats().retries)
    }
}

impl Backend for RaceBackend {
    fn name(&self) -> &'static str {
        "race"
    }

    fn client(&self) -> Result<Box<dyn KvClient>, BackendError> {
        // Each client thread is a compute node of its own.
        let node = Node::builder()
            .join(&self.meta)
            .sim_config(self.sim.clone())
            .build()
            .map_err(setup)?;
        let t = VqpTransport::connect(&node, &self.infos).map_err(setup)?;
        let client = Client::open(t, self.clock.clone(), ClientConfig::default()).map_err(setup)?;
        Ok(Box::new(RaceClient { client }))
    }

    fn label(&self) -> Option<String> {
        self.label.clone()
    }
}
