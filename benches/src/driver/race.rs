//! The RACE store over KRCore on a sim fabric: a meta server, memory nodes
//! (`race_store::rdma::MemoryNodeServer`), and one compute node per client
//! thread, each reaching every memory node through VQPs connected by a
//! metadata lookup.

use super::{Backend, BackendError, KvClient};
use crate::cluster::RaceKv;
use krcore::Node;
use krcore_nic::sim::{LatencyModel, SimConfig};
use race_store::clock::{Clock, SystemClock};
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeHandle, MemoryNodeServer, NodeInfo, VqpTransport};
use race_store::{Client, ClientConfig};
use std::sync::Arc;
use std::time::Duration;

/// A RACE cluster on one sim fabric.
pub struct RaceBackend {
    meta: Node,
    infos: Vec<NodeInfo>,
    servers: Vec<MemoryNodeHandle>,
    clock: Arc<dyn Clock>,
    sim: SimConfig,
    label: Option<String>,
    config: ClientConfig,
}

fn setup(e: impl std::fmt::Display) -> BackendError {
    BackendError::Setup {
        backend: "race",
        message: e.to_string(),
    }
}

impl RaceBackend {
    /// A meta server and `memory_nodes` memory nodes of `node_bytes` each on
    /// a fresh `sim:mem` fabric, under `latency` (figures are then modeled),
    /// holding a new table of shape `table`.
    ///
    /// # Errors
    /// [`BackendError::Setup`].
    pub fn start(
        memory_nodes: u8,
        node_bytes: u64,
        latency: Option<LatencyModel>,
        table: TableConfig,
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
        let mut servers = Vec::new();
        let mut infos = Vec::new();
        for id in 0..memory_nodes.max(1) {
            // Room for an allocation port of ALLOC_PORT_SLOTS: many client
            // threads allocate at once.
            let node = Node::builder()
                .join(&meta)
                .config(race_store::rdma::memory_node_engine(Default::default()))
                .build()
                .map_err(setup)?;
            let s = MemoryNodeServer::start(&node, id, node_bytes, &table, memory_nodes.max(1))
                .map_err(setup)?;
            infos.push(s.info());
            servers.push(s.spawn(Duration::from_millis(1)));
        }
        Ok(RaceBackend {
            meta,
            infos,
            servers,
            clock: Arc::new(SystemClock::new()),
            label: latency.map(|m| format!("modeled ({})", m.name)),
            sim,
            config: ClientConfig::default(),
        })
    }

    /// The same backend whose clients use `config`.
    pub fn with_client_config(self, config: ClientConfig) -> RaceBackend {
        RaceBackend { config, ..self }
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
        let client = Client::open(t, self.clock.clone(), self.config).map_err(setup)?;
        Ok(Box::new(RaceKv::new(client)))
    }

    fn label(&self) -> Option<String> {
        self.label.clone()
    }

    fn memory_node_usage(&self) -> Vec<u64> {
        self.servers.iter().map(|s| s.stats().heap_used).collect()
    }
}
