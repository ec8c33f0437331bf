//! RACE clusters shared by processes: the fabric spec the drivers accept, a
//! host side (meta server and memory nodes, published on a sim fabric) and a
//! compute side (a process that finds them by name and joins).
//!
//! ```text
//! driver process                      client process (re-exec of the driver)
//!   ClusterHost::start(fabric)          Remote::discover(dir, n)
//!     meta node  -> publishes "krcore-meta" (bootstrap)
//!     memory node i -> publishes "race-node-i" (NodeInfo)
//!                                       Remote::compute_node()  (reads meta)
//!                                       VqpTransport::connect   (one VQP/node)
//! ```
//!
//! Every client of every process uses a [`ClusterClock`]: microseconds since
//! the cluster's epoch (the host's start, published on the fabric under
//! [`CLOCK_NAME`]), read from the system clock every process of the machine
//! shares, so the leases and deadlines written in remote memory compare
//! across processes.
//!
//! Invariants: a [`ClusterHost`] keeps its memory nodes serving until it is
//! dropped; a directory fabric it created ([`ClusterHost::fabric_dir`]) is
//! removed with it when it owns the temporary directory.

use crate::driver::{Backend, BackendError, BatchOp, Found, KvClient};
use krcore::Node;
use krcore_kmod::{EngineConfig, MetaLocation};
use krcore_meta::bootstrap;
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric};
use krcore_nic::AnyNic;
use race_store::clock::{Clock, SystemClock};
use race_store::memory::{NodeStats, TableConfig};
use race_store::rdma::{
    lookup_nodes_on_sim, MemoryNodeHandle, MemoryNodeServer, NodeInfo, VqpTransport,
};
use race_store::{Client, ClientConfig, Error};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why a cluster could not be set up or reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The `--fabric` value is not one the drivers accept.
    #[error("bad fabric {0:?}: expected sim:mem, sim:NAME, sim:/abs/path or verbs:DEVICE")]
    BadFabric(String),
    /// A fabric or setting this build cannot run.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A step of the setup failed.
    #[error("{what}: {message}")]
    Setup {
        /// The step.
        what: &'static str,
        /// The underlying error.
        message: String,
    },
}

fn setup(what: &'static str) -> impl Fn(String) -> ClusterError {
    move |message| ClusterError::Setup { what, message }
}

/// A fabric named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricSpec {
    /// `sim:mem`: private to one process.
    SimMem,
    /// `sim:NAME` (`/dev/shm/NAME`) or `sim:/abs/path`: a directory shared
    /// by processes.
    SimDir(PathBuf),
    /// `verbs:DEVICE`: a hardware (or Soft-RoCE) device.
    Verbs(String),
}

impl FabricSpec {
    /// Parses `sim:mem`, `sim:NAME`, `sim:/abs/path` or `verbs:DEVICE`.
    ///
    /// # Errors
    /// [`ClusterError::BadFabric`] for anything else.
    pub fn parse(s: &str) -> Result<FabricSpec, ClusterError> {
        let bad = || ClusterError::BadFabric(s.to_string());
        if let Some(dev) = s.strip_prefix("verbs:") {
            if dev.is_empty() || dev.contains(['/', '\0']) {
                return Err(bad());
            }
            return Ok(FabricSpec::Verbs(dev.to_string()));
        }
        let rest = s.strip_prefix("sim:").ok_or_else(bad)?;
        if rest == "mem" {
            return Ok(FabricSpec::SimMem);
        }
        if rest.is_empty() || rest.contains('\0') {
            return Err(bad());
        }
        if rest.starts_with('/') {
            Ok(FabricSpec::SimDir(PathBuf::from(rest)))
        } else if rest.contains('/') {
            Err(bad())
        } else {
            Ok(FabricSpec::SimDir(Path::new("/dev/shm").join(rest)))
        }
    }

    /// The error a RACE driver gives for `verbs:DEVICE`: the memory nodes
    /// and clients of these drivers find each other through a sim fabric's
    /// name service, which a verbs device does not have.
    pub fn verbs_unsupported(device: &str) -> ClusterError {
        ClusterError::Unsupported(format!(
            "verbs:{device}: the RACE drivers run their cluster on sim fabrics only: memory nodes \
             are found through the sim fabric's name service, which a verbs device lacks, and \
             krcore-benches is not built with krcore-nic's `verbs` feature; use sim:mem or sim:NAME"
        ))
    }
}

/// The name under which a host publishes its clock epoch.
pub const CLOCK_NAME: &str = "race-clock-epoch";

/// Microseconds since a cluster epoch (itself microseconds since the Unix
/// epoch), from the system clock: the same ticks in every process of the
/// machine. Never goes backwards within one clock (a wall-clock step back
/// holds it until real time catches up).
#[derive(Debug)]
pub struct ClusterClock {
    epoch_us: u64,
    last: std::sync::atomic::AtomicU64,
}

impl ClusterClock {
    /// A clock counting from `epoch_us`.
    pub fn new(epoch_us: u64) -> ClusterClock {
        ClusterClock {
            epoch_us,
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Its epoch.
    pub fn epoch_us(&self) -> u64 {
        self.epoch_us
    }
}

impl Clock for ClusterClock {
    fn now(&self) -> u64 {
        let t = crate::proc::epoch_us().saturating_sub(self.epoch_us);
        self.last
            .fetch_max(t, std::sync::atomic::Ordering::Relaxed)
            .max(t)
    }

    fn backoff(&self, attempt: u32) {
        SystemClock::new().backoff(attempt);
    }
}

/// What a [`ClusterHost`] starts.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Memory nodes (1..=255).
    pub memory_nodes: u8,
    /// Bytes of each memory node's region (allocated lazily by the OS).
    pub node_bytes: u64,
    /// The table node 0 formats.
    pub table: TableConfig,
    /// The sim device of every node the host opens.
    pub sim: SimConfig,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            memory_nodes: 2,
            node_bytes: 1 << 30,
            table: TableConfig::default(),
            sim: SimConfig::default(),
        }
    }
}

/// The host side of a cluster: a meta server node and memory nodes on one
/// sim fabric, published under [`bootstrap::DEFAULT_NAME`] and
/// [`race_store::rdma::node_name`].
pub struct ClusterHost {
    clock: Arc<ClusterClock>,
    fabric: SimFabric,
    meta: Node,
    memory: Vec<Node>,
    infos: Vec<NodeInfo>,
    _servers: Vec<MemoryNodeHandle>,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for ClusterHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHost")
            .field("fabric", &self.fabric)
            .field("memory_nodes", &self.infos.len())
            .finish()
    }
}

/// A fresh directory for a fabric under `/dev/shm` (or the temp directory
/// where there is no `/dev/shm`), removed when dropped.
///
/// # Errors
/// [`ClusterError::Setup`] when it cannot be created.
pub fn fresh_fabric_dir(prefix: &str) -> Result<tempfile::TempDir, ClusterError> {
    let b = {
        let mut b = tempfile::Builder::new();
        b.prefix(prefix);
        b
    };
    let r = if Path::new("/dev/shm").is_dir() {
        b.tempdir_in("/dev/shm")
    } else {
        b.tempdir()
    };
    r.map_err(|e| setup("create a fabric directory")(e.to_string()))
}

impl ClusterHost {
    /// Starts a meta server and `opts.memory_nodes` memory nodes on
    /// `fabric`, each serving its allocation RPC from a thread, and
    /// publishes them. `dir`, if given, is removed when the host drops.
    ///
    /// # Errors
    /// [`ClusterError::Setup`].
    pub fn start(
        fabric: SimFabric,
        opts: &ClusterOptions,
        dir: Option<tempfile::TempDir>,
    ) -> Result<ClusterHost, ClusterError> {
        Self::start_with(fabric, opts, dir, EngineConfig::default())
    }

    /// As [`ClusterHost::start`], the memory nodes' engines built with
    /// `memory_engine` (e.g. with `upgrade_endpoint`, so compute nodes can
    /// upgrade hot VQPs to RC: the SDK registers the handshake endpoint in
    /// the meta table beside the node's DCT when the node joins).
    ///
    /// # Errors
    /// [`ClusterError::Setup`].
    pub fn start_with(
        fabric: SimFabric,
        opts: &ClusterOptions,
        dir: Option<tempfile::TempDir>,
        memory_engine: EngineConfig,
    ) -> Result<ClusterHost, ClusterError> {
        let n = opts.memory_nodes.max(1);
        let epoch_us = crate::proc::epoch_us();
        fabric
            .publish(CLOCK_NAME, &epoch_us.to_le_bytes())
            .map_err(|e| setup("publish the clock epoch")(e.to_string()))?;
        let meta = Node::builder()
            .sim_fabric(&fabric)
            .sim_config(opts.sim.clone())
            .host_meta()
            .build()
            .map_err(|e| setup("start the meta server")(e.to_string()))?;
        meta.meta_server()
            .ok_or_else(|| {
                setup("start the meta server")("the meta node hosts no meta server".into())
            })?
            .publish_on_sim(&fabric, bootstrap::DEFAULT_NAME)
            .map_err(|e| setup("publish the meta server")(e.to_string()))?;
        let mut memory = Vec::new();
        let mut infos = Vec::new();
        let mut servers = Vec::new();
        for id in 0..n {
            let node = Node::builder()
                .join(&meta)
                .config(race_store::rdma::memory_node_engine(memory_engine.clone()))
                .build()
                .map_err(|e| setup("open a memory node")(e.to_string()))?;
            let s = MemoryNodeServer::start(&node, id, opts.node_bytes, &opts.table, n)
                .map_err(|e| setup("start a memory node")(e.to_string()))?;
            s.publish_on_sim(&fabric)
                .map_err(|e| setup("publish a memory node")(e.to_string()))?;
            infos.push(s.info());
            servers.push(s.spawn(Duration::from_micros(100)));
            memory.push(node);
        }
        Ok(ClusterHost {
            clock: Arc::new(ClusterClock::new(epoch_us)),
            fabric,
            meta,
            memory,
            infos,
            _servers: servers,
            _dir: dir,
        })
    }

    /// The fabric.
    pub fn fabric(&self) -> &SimFabric {
        &self.fabric
    }

    /// Usage figures of each memory node.
    pub fn node_stats(&self) -> Vec<NodeStats> {
        self._servers.iter().map(MemoryNodeHandle::stats).collect()
    }

    /// Sets how long a client's lease on the memory nodes' grants lasts
    /// ([`race_store::holders`]).
    pub fn set_grant_lease(&self, lease: Duration) {
        for s in &self._servers {
            s.set_grant_lease(lease);
        }
    }

    /// The fabric's directory (`None` on `sim:mem`).
    pub fn fabric_dir(&self) -> Option<&Path> {
        self.fabric.dir()
    }

    /// The meta server's node.
    pub fn meta(&self) -> &Node {
        &self.meta
    }

    /// The memory nodes, in id order.
    pub fn memory_nodes(&self) -> &[Node] {
        &self.memory
    }

    /// The memory nodes' records.
    pub fn infos(&self) -> &[NodeInfo] {
        &self.infos
    }

    /// A [`Remote`] for compute nodes of this process.
    pub fn remote(&self) -> Result<Remote, ClusterError> {
        Ok(Remote {
            fabric: self.fabric.clone(),
            meta: self
                .meta
                .meta_location()
                .ok_or_else(|| setup("meta location")("the meta node has none".into()))?,
            infos: self.infos.clone(),
            clock: self.clock.clone(),
        })
    }
}

/// What a compute process needs to reach a cluster.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The fabric.
    pub fabric: SimFabric,
    /// The meta table.
    pub meta: MetaLocation,
    /// The memory nodes.
    pub infos: Vec<NodeInfo>,
    /// The cluster's clock.
    pub clock: Arc<ClusterClock>,
}

impl Remote {
    /// Opens the directory fabric at `dir` and finds the meta server and
    /// memory nodes `0..memory_nodes` published on it.
    ///
    /// # Errors
    /// [`ClusterError::Setup`] when the fabric or a record is missing.
    pub fn discover(dir: &Path, memory_nodes: u8) -> Result<Remote, ClusterError> {
        let fabric = SimFabric::open_dir(dir, false)
            .map_err(|e| setup("open the fabric directory")(e.to_string()))?;
        let b = bootstrap::lookup_on_sim(&fabric, bootstrap::DEFAULT_NAME)
            .map_err(|e| setup("find the meta server")(e.to_string()))?;
        let meta = MetaLocation::from_bootstrap(&b)
            .map_err(|e| setup("read the meta bootstrap")(e.to_string()))?;
        let infos = lookup_nodes_on_sim(&fabric, memory_nodes)
            .map_err(|e| setup("find the memory nodes")(e.to_string()))?;
        let epoch = fabric
            .lookup(CLOCK_NAME)
            .map_err(|e| setup("find the clock epoch")(e.to_string()))?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| {
                setup("find the clock epoch")(format!("{CLOCK_NAME} is not published"))
            })?;
        Ok(Remote {
            fabric,
            meta,
            infos,
            clock: Arc::new(ClusterClock::new(u64::from_le_bytes(epoch))),
        })
    }

    /// A compute node on the fabric, reading the meta table (it registers
    /// nowhere: nobody connects to a compute node).
    ///
    /// # Errors
    /// [`ClusterError::Setup`].
    pub fn compute_node(&self, sim: &SimConfig) -> Result<Node, ClusterError> {
        Node::builder()
            .sim_fabric(&self.fabric)
            .sim_config(sim.clone())
            .meta(self.meta)
            .build()
            .map_err(|e| setup("open a compute node")(e.to_string()))
    }

    /// A RACE client on a fresh compute node: one VQP per memory node.
    ///
    /// # Errors
    /// [`ClusterError::Setup`].
    pub fn race_client(
        &self,
        sim: &SimConfig,
        config: ClientConfig,
    ) -> Result<Client<VqpTransport<AnyNic>>, ClusterError> {
        let node = self.compute_node(sim)?;
        self.race_client_on(&node, config)
    }

    /// A RACE client posting from `node` (a node attached to the node
    /// daemon, for instance): one VQP per memory node.
    ///
    /// # Errors
    /// [`ClusterError::Setup`].
    pub fn race_client_on(
        &self,
        node: &Node,
        config: ClientConfig,
    ) -> Result<Client<VqpTransport<AnyNic>>, ClusterError> {
        let t = VqpTransport::connect(node, &self.infos)
            .map_err(|e| setup("connect to the memory nodes")(e.to_string()))?;
        let clock: Arc<dyn Clock> = self.clock.clone();
        Client::open(t, clock, config).map_err(|e| setup("open the RACE client")(error_chain(&e)))
    }
}

/// An error with its sources: "transport error: memory node 1: ...".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// The RACE store as a YCSB backend for one process of a multi-process run:
/// each client thread is a compute node of its own on a shared fabric.
#[derive(Debug)]
pub struct SharedRaceBackend {
    remote: Remote,
    sim: SimConfig,
    config: ClientConfig,
    label: Option<String>,
}

impl SharedRaceBackend {
    /// Clients of `remote`'s cluster on devices configured by `sim` (its
    /// latency model, if any, labels the figures).
    pub fn new(remote: Remote, sim: SimConfig, config: ClientConfig) -> SharedRaceBackend {
        let label = sim
            .latency
            .map(|m: LatencyModel| format!("modeled ({})", m.name));
        SharedRaceBackend {
            remote,
            sim,
            config,
            label,
        }
    }
}

/// One YCSB client thread's RACE client.
pub struct RaceKv<T: race_store::remote::Transport> {
    /// The client.
    pub client: Client<T>,
    /// Reused storage of [`KvClient::batch`].
    replies: Vec<race_store::client::Reply>,
}

impl<T: race_store::remote::Transport> RaceKv<T> {
    /// A YCSB client over `client`.
    pub fn new(client: Client<T>) -> Self {
        RaceKv {
            client,
            replies: Vec::new(),
        }
    }
}

fn store(e: &Error) -> BackendError {
    BackendError::Store {
        backend: "race",
        message: error_chain(e),
    }
}

impl<T: race_store::remote::Transport + Send> KvClient for RaceKv<T> {
    fn read(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Found, BackendError> {
        out.clear();
        Ok(match self.client.get(key).map_err(|e| store(&e))? {
            Some(v) => {
                out.extend_from_slice(&v);
                Found::Yes
            }
            None => Found::No,
        })
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.client.put(key, value).map_err(|e| store(&e))
    }

    fn close(self: Box<Self>) -> crate::driver::Closed {
        let trimmed_bytes = self.client.stats().kv_memory.trimmed_bytes;
        let r = self.client.close();
        crate::driver::Closed {
            returned_bytes: r.returned_bytes,
            kept_bytes: r.kept_bytes,
            trimmed_bytes,
            error: r.error.map(|e| error_chain(&e)),
        }
    }

    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Found, BackendError> {
        match self.client.update(key, value) {
            Ok(()) => Ok(Found::Yes),
            Err(Error::NotFound) => Ok(Found::No),
            Err(e) => Err(store(&e)),
        }
    }

    fn retries(&self) -> Option<u64> {
        Some(self.client.retries())
    }

    fn batch(&mut self, ops: &[BatchOp<'_>], out: &mut Vec<Result<Found, BackendError>>) {
        use race_store::client::Op;
        let race: Vec<Op<'_>> = ops
            .iter()
            .map(|op| match *op {
                BatchOp::Read(k) => Op::Get(k),
                // YCSB's inserts are upserts.
                BatchOp::Insert(k, v) => Op::Put(k, v),
                BatchOp::Update(k, v) => Op::Update(k, v),
            })
            .collect();
        self.client.batch_into(&race, &mut self.replies);
        out.clear();
        // The replies stay for the next batch, which refills their value
        // buffers.
        out.extend(self.replies.iter().zip(ops).map(|(r, op)| match (r, op) {
            (Ok(Some(_)), _) | (Ok(None), BatchOp::Insert(..) | BatchOp::Update(..)) => {
                Ok(Found::Yes)
            }
            (Ok(None), BatchOp::Read(_)) | (Err(Error::NotFound), BatchOp::Update(..)) => {
                Ok(Found::No)
            }
            (Err(e), _) => Err(store(e)),
        }));
    }
}

impl Backend for SharedRaceBackend {
    fn name(&self) -> &'static str {
        "race"
    }

    fn client(&self) -> Result<Box<dyn KvClient>, BackendError> {
        let client = self
            .remote
            .race_client(&self.sim, self.config)
            .map_err(|e| BackendError::Setup {
                backend: "race",
                message: e.to_string(),
            })?;
        Ok(Box::new(RaceKv::new(client)))
    }

    fn label(&self) -> Option<String> {
        self.label.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_specs_parse_or_fail_typed() {
        assert_eq!(FabricSpec::parse("sim:mem").unwrap(), FabricSpec::SimMem);
        assert_eq!(
            FabricSpec::parse("sim:krc").unwrap(),
            FabricSpec::SimDir(PathBuf::from("/dev/shm/krc"))
        );
        assert_eq!(
            FabricSpec::parse("sim:/tmp/x").unwrap(),
            FabricSpec::SimDir(PathBuf::from("/tmp/x"))
        );
        assert_eq!(
            FabricSpec::parse("verbs:rxe0").unwrap(),
            FabricSpec::Verbs("rxe0".into())
        );
        for bad in ["", "sim:", "sim:a/b", "tcp:1", "verbs:", "mem"] {
            assert!(
                matches!(FabricSpec::parse(bad), Err(ClusterError::BadFabric(_))),
                "{bad}"
            );
        }
        let e = FabricSpec::verbs_unsupported("rxe0").to_string();
        assert!(e.starts_with("unsupported: verbs:rxe0"), "{e}");
    }

    #[test]
    fn a_second_process_view_finds_the_cluster() {
        let dir = fresh_fabric_dir("krcore-cluster-test-").unwrap();
        let path = dir.path().join("fab");
        let fabric = SimFabric::open_dir(&path, true).unwrap();
        let host = ClusterHost::start(
            fabric,
            &ClusterOptions {
                memory_nodes: 2,
                node_bytes: 16 << 20,
                ..ClusterOptions::default()
            },
            None,
        )
        .unwrap();
        // What a client process does, from the directory alone.
        let remote = Remote::discover(&path, 2).unwrap();
        assert_eq!(remote.infos, host.infos());
        assert_eq!(
            remote.clock.epoch_us(),
            host.remote().unwrap().clock.epoch_us()
        );
        let mut a = remote
            .race_client(&SimConfig::default(), ClientConfig::default())
            .unwrap();
        let mut b = host
            .remote()
            .unwrap()
            .race_client(&SimConfig::default(), ClientConfig::default())
            .unwrap();
        a.put(b"k", b"v1").unwrap();
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
        assert!(
            Remote::discover(&path, 3).is_err(),
            "node 2 is not published"
        );
    }
}
