//! A race-store cluster over KRCore on `sim:mem`: a meta server and RDMA
//! memory nodes, node 0 holding a table of one small subtable.

use std::time::Duration;

use krcore::Node;
use krcore_kmod::EngineConfig;
use race_store::layout::subtable::SubtableGeometry;
use race_store::memory::TableConfig;
use race_store::rdma::{MemoryNodeHandle, MemoryNodeServer, NodeInfo};

pub struct Cluster {
    pub meta: Node,
    pub _servers: Vec<MemoryNodeHandle>,
    pub infos: Vec<NodeInfo>,
    /// The memory nodes' own nodes (their engines' counters).
    #[allow(dead_code)] // not every test binary looks at them
    pub memory: Vec<Node>,
}

impl Cluster {
    /// A client on a node of its own, reaching the memory nodes over
    /// messaging, on the system clock.
    pub fn client(
        &self,
        config: race_store::ClientConfig,
    ) -> race_store::Client<race_store::rdma::VqpTransport<krcore_nic::AnyNic>> {
        let node = Node::builder().join(&self.meta).build().unwrap();
        let t = race_store::rdma::VqpTransport::connect(&node, &self.infos).unwrap();
        let clock: std::sync::Arc<dyn race_store::clock::Clock> =
            std::sync::Arc::new(race_store::clock::SystemClock::new());
        race_store::Client::open(t, clock, config).unwrap()
    }
}

/// `memory_nodes` memory nodes of `bytes` each, serving (idle sleep 50
/// us); the table may grow to `max_global_depth`.
pub fn cluster(memory_nodes: u8, bytes: u64, max_global_depth: u8) -> Cluster {
    cluster_with(
        memory_nodes,
        bytes,
        max_global_depth,
        EngineConfig::default(),
    )
}

/// [`cluster`] with `engine` as the memory nodes' engine settings.
pub fn cluster_with(
    memory_nodes: u8,
    bytes: u64,
    max_global_depth: u8,
    engine: EngineConfig,
) -> Cluster {
    cluster_leased(memory_nodes, bytes, max_global_depth, engine, None)
}

/// [`cluster_with`] whose memory nodes lease their grants for `lease`
/// (their default if `None`).
pub fn cluster_leased(
    memory_nodes: u8,
    bytes: u64,
    max_global_depth: u8,
    engine: EngineConfig,
    lease: Option<Duration>,
) -> Cluster {
    let meta = Node::builder()
        .fabric("sim:mem")
        .host_meta()
        .build()
        .unwrap();
    let table = TableConfig {
        geometry: SubtableGeometry::new(1).unwrap(),
        initial_global_depth: 0,
        max_global_depth,
    };
    let mut servers = Vec::new();
    let mut infos = Vec::new();
    let mut memory = Vec::new();
    for id in 0..memory_nodes {
        let node = Node::builder()
            .join(&meta)
            .config(engine.clone())
            .build()
            .unwrap();
        let s = MemoryNodeServer::start(&node, id, bytes, &table, memory_nodes).unwrap();
        if let Some(lease) = lease {
            s.set_grant_lease(lease);
        }
        infos.push(s.info());
        servers.push(s.spawn(Duration::from_micros(50)));
        memory.push(node);
    }
    Cluster {
        meta,
        _servers: servers,
        infos,
        memory,
    }
}
