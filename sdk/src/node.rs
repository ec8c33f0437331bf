//! A node: one NIC port with its engine, and the builder that opens it.

use std::sync::Arc;

use std::time::Duration;

use krcore_kmod::{
    Engine, EngineConfig, EngineMode, MetaHostThread, MetaLease, MetaLeaseStats, MetaLocation,
    MsgMetaHost,
};
use krcore_meta::table::Geometry;
use krcore_meta::wire::BootstrapRepr;
use krcore_meta::MetaConfig;
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, AnyNic, DcTarget, FabricSpec, Gid, Nic};

use krcore_kmod::daemon::{Attached, NodeStats};

use crate::error::{Error, Result};
use crate::memory::{MemoryRegion, Mr};

/// The meta server a node of this process hosts: the node's own engine
/// hosts the table ([`MsgMetaHost`]: lookups are one-sided READs, through
/// the node's DCT, or in RC fallback mode over an RC pair with the node;
/// Register/Renew/Deregister arrive as messages on the reserved port
/// `krcore_kmod::META_PORT`), served by a thread of the node. It is the
/// server the `krcore-meta` binary runs.
pub struct MetaHost<N: Nic> {
    host: Arc<MsgMetaHost<N>>,
    _thread: MetaHostThread,
}

impl<N: Nic> MetaHost<N> {
    /// The host (its table, bootstrap and statistics).
    pub fn host(&self) -> &MsgMetaHost<N> {
        &self.host
    }

    /// What clients need to find the table (publish it for other
    /// processes).
    pub fn bootstrap(&self) -> BootstrapRepr {
        self.host.bootstrap()
    }

    /// Serves the bootstrap and the stores' membership over TCP on `addr`
    /// (`HOST:PORT`; port 0 picks one): what [`NodeBuilder::meta_addr`]
    /// and `race_store::deploy` read. Stops (and joins its thread) when
    /// dropped. Unauthenticated: bind it where only the cluster reaches.
    ///
    /// # Errors
    /// [`Error::Meta`] when the address cannot be bound.
    pub fn serve_tcp(
        &self,
        addr: impl std::net::ToSocketAddrs,
    ) -> Result<krcore_meta::bootstrap::TcpBootstrap> {
        Ok(self.host.serve_tcp(addr)?)
    }

    /// Publishes the bootstrap under `name` on `fabric` (clients of other
    /// processes find the server there, see `krcore_meta::bootstrap`).
    ///
    /// # Errors
    /// [`Error::Meta`] for a bad name or a failed write.
    pub fn publish_on_sim(&self, fabric: &SimFabric, name: &str) -> Result<()> {
        krcore_meta::bootstrap::publish_on_sim(fabric, name, &self.bootstrap())?;
        Ok(())
    }
}

impl<N: Nic> std::fmt::Debug for MetaHost<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.host.fmt(f)
    }
}

/// Lease of a registration made by the builder in an embedded meta table
/// (its clock is the caller's: the builder registers at time 0).
const EMBEDDED_LEASE_MS: u64 = 1 << 40;

/// Buckets of the embedded meta table a builder creates (8 entries each).
const EMBEDDED_BUCKETS: u32 = 1024;

/// Lease of a node's registration over messaging unless
/// [`NodeBuilder::lease`] says otherwise (renewed every third of it).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Where a node's engine runs.
pub(crate) enum Backend<N: Nic> {
    /// In this process, over a NIC it opened.
    Engine(Engine<N>),
    /// In the node daemon (`krcored`), shared by every attached process.
    Daemon(Attached),
}

struct NodeInner<N: Nic> {
    /// Dropped first: stops the renewals before the engine goes.
    lease: parking_lot::Mutex<Option<MetaLease<N>>>,
    backend: Backend<N>,
    fabric: Option<SimFabric>,
    meta_host: Option<Arc<MetaHost<N>>>,
}

/// What an attached node refuses: the calls that need an engine of the
/// process's own.
const ATTACHED: &str =
    "an attached node's engine is the node daemon's (krcored): not available through it";

/// One node: a NIC port, its KRCore engine, and (on `sim`) its fabric.
/// Cheap to clone; `Send + Sync`. [`Node::builder`] opens it on the
/// provider a fabric string names ([`AnyNic`]: `sim:...` or `verbs:DEV`);
/// [`Node::with_nic`] takes any provider's NIC.
pub struct Node<N: Nic = AnyNic> {
    inner: Arc<NodeInner<N>>,
}

impl<N: Nic> Clone for Node<N> {
    fn clone(&self) -> Self {
        Node {
            inner: self.inner.clone(),
        }
    }
}

impl<N: Nic> std::fmt::Debug for Node<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("gid", &self.gid())
            .field("hosts_meta", &self.inner.meta_host.is_some())
            .finish()
    }
}

impl Node<AnyNic> {
    /// A builder for a node on the provider its fabric string names
    /// (default `sim:mem`).
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    /// A node whose engine is the node daemon's (`krcored`) listening at
    /// `path`: the process opens no NIC and creates no QP; its VQPs are
    /// the daemon's (their connects hit the node-wide DCCache), its
    /// regions are shared memory the daemon registered (one-sided data
    /// lands in them with no copy). [`Vqp`](crate::Vqp) (verbs, requests, pushes and
    /// replies), [`MemoryRegion`] and [`Node::endpoint`] work as
    /// in-process (an endpoint lives in the daemon's engine: one control
    /// call per push or pop), and so do ports ([`Node::bind`]), leases,
    /// the DC -> RC upgrade hint and store membership
    /// ([`Node::store_keep_joined`]); [`Node::fork`] and [`Node::engine`]
    /// are refused with [`Error::Unsupported`] (see `krcore_kmod::daemon`
    /// for what the daemon carries).
    ///
    /// # Errors
    /// [`Error::Daemon`]: no daemon at `path`, another protocol version,
    /// the daemon's quota of processes.
    pub fn attach(path: impl AsRef<std::path::Path>) -> Result<Node> {
        let attached = Attached::attach(path)?;
        let node = Node {
            inner: Arc::new(NodeInner {
                lease: parking_lot::Mutex::new(None),
                backend: Backend::Daemon(attached),
                fabric: None,
                meta_host: None,
            }),
        };
        tracing::info!(gid = %node.gid(), mode = ?node.mode(), "node attached to its daemon");
        Ok(node)
    }
}

impl<N: Nic> Node<N> {
    /// The sim fabric the node is on (to open more nodes on it); `None`
    /// for other providers and for nodes made from an open NIC.
    pub fn fabric(&self) -> Option<&SimFabric> {
        self.inner.fabric.as_ref()
    }

    /// A node over any provider's NIC, with an engine configured by `cfg`.
    ///
    /// On a device without DC the engine runs in RC fallback mode; the SDK
    /// then turns `cfg.handshake_thread` on, so that the node accepts
    /// connections with no help from the caller once its address is handed
    /// out ([`Node::local_target`], registration, messaging): the thread
    /// starts then. A node that only connects out (a compute node issuing
    /// one-sided operations) runs no engine thread.
    ///
    /// # Errors
    /// [`Error::Engine`] when the engine cannot start.
    pub fn with_nic(nic: N, mut cfg: EngineConfig) -> Result<Node<N>> {
        cfg.handshake_thread = true;
        cfg.msg.progress_thread = true;
        let node = Node {
            inner: Arc::new(NodeInner {
                lease: parking_lot::Mutex::new(None),
                backend: Backend::Engine(Engine::start(nic, cfg)?),
                fabric: None,
                meta_host: None,
            }),
        };
        tracing::info!(gid = %node.gid(), provider = std::any::type_name::<N>(), mode = ?node.mode(), "node built");
        Ok(node)
    }

    pub(crate) fn backend(&self) -> &Backend<N> {
        &self.inner.backend
    }

    /// This process's engine: refused on an attached node.
    fn local(&self) -> Result<&Engine<N>> {
        match &self.inner.backend {
            Backend::Engine(e) => Ok(e),
            Backend::Daemon(_) => Err(Error::Unsupported(ATTACHED)),
        }
    }

    /// Whether the node's engine is the node daemon's ([`Node::attach`]).
    pub fn is_attached(&self) -> bool {
        matches!(self.inner.backend, Backend::Daemon(_))
    }

    /// The node daemon's counters, node-wide (every attached process
    /// together: QPs its NIC created, modeled control time, DCCache hits
    /// and misses); `None` for a node with an engine of its own (see
    /// [`Node::counters`] and [`Node::engine`]).
    ///
    /// # Errors
    /// [`Error::Daemon`] when the daemon does not answer.
    pub fn daemon_stats(&self) -> Result<Option<NodeStats>> {
        match &self.inner.backend {
            Backend::Engine(_) => Ok(None),
            Backend::Daemon(a) => Ok(Some(a.node_stats()?)),
        }
    }

    /// This node's GID.
    pub fn gid(&self) -> Gid {
        match &self.inner.backend {
            Backend::Engine(e) => e.gid(),
            Backend::Daemon(a) => a.gid(),
        }
    }

    /// This node's address (what the meta server publishes for it): its
    /// DCT, or in RC fallback mode its handshake endpoint (see
    /// [`Engine::local_target`]). DC mode: the first call creates the DCT
    /// (a node that is never reached, such as a compute node issuing only
    /// one-sided operations, never creates one).
    ///
    /// # Errors
    /// [`Error::Engine`] when the DCT cannot be created;
    /// [`Error::Unsupported`] on an attached node (its daemon's engine is
    /// the node's address).
    pub fn local_target(&self) -> Result<DcTarget> {
        Ok(self.local()?.local_target()?)
    }

    /// The counters of this process's NIC ("connect created 0 QPs"). An
    /// attached node opened no NIC: all zero (the node's are
    /// [`Node::daemon_stats`]).
    pub fn counters(&self) -> krcore_nic::Counters {
        match &self.inner.backend {
            Backend::Engine(e) => e.nic().counters(),
            Backend::Daemon(_) => krcore_nic::Counters::default(),
        }
    }

    /// The engine (statistics, DCCache, configuration).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on an attached node ([`Node::attach`]): its
    /// engine runs in the node daemon (see [`Node::daemon_stats`]).
    pub fn engine(&self) -> Result<&Engine<N>> {
        self.local()
    }

    /// How the node's engine reaches other nodes: DC, or the RC fallback
    /// on a device without DC.
    pub fn mode(&self) -> EngineMode {
        match &self.inner.backend {
            Backend::Engine(e) => e.mode(),
            Backend::Daemon(a) if a.rc_fallback() => EngineMode::RcFallback,
            Backend::Daemon(_) => EngineMode::Dc,
        }
    }

    /// The meta server this node hosts, if it was built with
    /// [`NodeBuilder::host_meta`] (or joined such a node of this process).
    pub fn meta_server(&self) -> Option<&MetaHost<N>> {
        self.inner.meta_host.as_deref()
    }

    /// Where the meta table this node reads is.
    /// (`None` on an attached node: its daemon reads it.)
    pub fn meta_location(&self) -> Option<MetaLocation> {
        match &self.inner.backend {
            Backend::Engine(e) => e.meta_location(),
            Backend::Daemon(_) => None,
        }
    }

    /// Allocates registered memory owned by this process.
    ///
    /// # Errors
    /// [`Error::Engine`] with the provider's refusal; on an attached
    /// node [`Error::Daemon`] (its quota of registered bytes).
    pub fn alloc(&self, len: usize, access: Access) -> Result<MemoryRegion<N>> {
        let mr = match &self.inner.backend {
            Backend::Engine(e) => Mr::Local(e.alloc_mr(len, access)?),
            Backend::Daemon(a) => Mr::Attached(Arc::new(a.alloc(len, access)?)),
        };
        Ok(MemoryRegion {
            mr,
            gid: self.gid(),
        })
    }

    /// The renewal counters of this node's registration over messaging
    /// (`None` when the node did not register that way: see
    /// [`NodeBuilder::register`]).
    pub fn lease_stats(&self) -> Option<MetaLeaseStats> {
        self.inner.lease.lock().as_ref().map(MetaLease::stats)
    }

    /// Removes this node's registration from the meta server at once (and
    /// stops its renewals), as a node that leaves cleanly does: peers that
    /// look it up from now on get `UnknownNode`. A node that did not
    /// register over messaging (see [`NodeBuilder::register`]) has nothing
    /// to remove.
    ///
    /// # Errors
    /// [`Error::Engine`]: the deregistration's failure (the meta server
    /// unreachable: the entry then runs out with its lease).
    pub fn deregister(&self) -> Result<()> {
        match self.inner.lease.lock().take() {
            Some(l) => Ok(l.deregister()?),
            None => Ok(()),
        }
    }

    /// The meta entries this node registers: its address and, in DC mode
    /// with the upgrade endpoint, the upgrade handshake's entry beside it
    /// (a registered node answers upgrades). Made on first need: the DCT.
    fn entries(&self) -> Result<Vec<DcTarget>> {
        let mut v = vec![self.local_target()?];
        v.extend(self.local()?.handshake_entry()?);
        Ok(v)
    }

    /// Registers the meta host's own node in its table (a local call:
    /// the host needs no message to itself).
    fn register_locally(&self, meta: &MsgMetaHost<N>) -> Result<()> {
        let entries = self.entries()?;
        let now = meta.now_ms();
        let mut t = meta.table();
        for e in entries {
            let r = t.register(e, 0, EMBEDDED_LEASE_MS, now);
            self.registered(r)?;
        }
        Ok(())
    }

    /// The engine's DC -> RC upgrade counters (DC mode; see
    /// [`krcore_kmod::EngineConfig::upgrade_after`]): `(upgrades,
    /// downgrades, failed attempts, RC pairs open now)`. On an attached
    /// node the daemon's, node-wide (the RC pairs serve every process);
    /// all zero when the daemon does not answer.
    pub fn upgrade_counters(&self) -> (u64, u64, u64, usize) {
        match &self.inner.backend {
            Backend::Engine(e) => {
                let s = e.stats();
                (
                    s.rc_upgrades,
                    s.rc_downgrades,
                    s.rc_upgrade_failures,
                    s.rc.pairs,
                )
            }
            Backend::Daemon(a) => a.node_stats().map_or((0, 0, 0, 0), |n| {
                (
                    n.rc_upgrades,
                    n.rc_downgrades,
                    n.rc_upgrade_failures,
                    n.rc_pairs as usize,
                )
            }),
        }
    }

    fn registered<T>(
        &self,
        r: std::result::Result<T, krcore_meta::registry::TableError>,
    ) -> Result<()> {
        r.map(|_| ()).map_err(|source| Error::Register {
            gid: self.gid(),
            source,
        })
    }
}

/// Where a [`NodeBuilder`] opens its node.
#[derive(Debug, Default)]
enum Place {
    #[default]
    Default,
    Spec(String),
    Parsed(FabricSpec),
    Fabric(SimFabric),
    Nic(AnyNic),
    Join(Node),
}

/// Builds a [`Node`] on the provider its fabric names (default `sim:mem`).
///
/// - Where: [`NodeBuilder::fabric`] (a fabric string, see
///   [`krcore_nic::FabricSpec`]: `sim:mem`, the default, `sim:NAME`,
///   `sim:/path`, `verbs:DEVICE[,port=N][,gid=N]`; sim options `dc=off`,
///   `latency=cx4`), [`NodeBuilder::fabric_spec`] (a parsed one),
///   [`NodeBuilder::sim_fabric`] (an open sim fabric),
///   [`NodeBuilder::nic`] (an open NIC), or [`NodeBuilder::join`] (the
///   fabric and meta table of another node of this process). `verbs:`
///   needs the SDK's `verbs` feature (without it: a typed "no verbs
///   provider" error).
/// - Meta server: [`NodeBuilder::meta`] (a location),
///   [`NodeBuilder::meta_addr`] (the meta server's TCP address: the
///   deployed path), [`NodeBuilder::host_meta`] (host the table on this
///   node), or inherited by `join`.
/// - Registration: [`NodeBuilder::register`] (default: on for `join`, off
///   for `meta`), [`NodeBuilder::lease`].
/// - Device: [`NodeBuilder::sim_config`] (for example `dc: false`, a device
///   like Soft-RoCE: the node runs in RC fallback mode).
/// - RC fallback mode: the engine answers peers' handshakes from a thread of
///   its own unless [`NodeBuilder::handshake_thread`] turns it off (the
///   caller then calls `node.engine().progress()`).
#[derive(Debug)]
pub struct NodeBuilder {
    place: Place,
    config: EngineConfig,
    meta: Option<MetaLocation>,
    meta_addr: Option<String>,
    host_meta: Option<MetaConfig>,
    register: Option<bool>,
    lease: Duration,
    sim: Option<SimConfig>,
    handshake_thread: bool,
    daemon: Option<std::path::PathBuf>,
}

impl Default for NodeBuilder {
    fn default() -> NodeBuilder {
        NodeBuilder {
            place: Place::default(),
            config: EngineConfig::default(),
            meta: None,
            meta_addr: None,
            host_meta: None,
            register: None,
            lease: DEFAULT_LEASE,
            sim: None,
            handshake_thread: true,
            daemon: None,
        }
    }
}

impl NodeBuilder {
    /// Opens the node on the fabric `spec` names (parsed at
    /// [`NodeBuilder::build`]: a bad string is a typed error there).
    pub fn fabric(mut self, spec: &str) -> NodeBuilder {
        self.place = Place::Spec(spec.to_string());
        self
    }

    /// Opens the node on a parsed fabric spec.
    pub fn fabric_spec(mut self, spec: FabricSpec) -> NodeBuilder {
        self.place = Place::Parsed(spec);
        self
    }

    /// Opens the node on an open fabric.
    pub fn sim_fabric(mut self, fabric: &SimFabric) -> NodeBuilder {
        self.place = Place::Fabric(fabric.clone());
        self
    }

    /// Uses an open NIC (a `SimNic`, a `VerbsNic`, or an [`AnyNic`]).
    pub fn nic(mut self, nic: impl Into<AnyNic>) -> NodeBuilder {
        self.place = Place::Nic(nic.into());
        self
    }

    /// Attaches to the node daemon (`krcored`) listening at `path` instead
    /// of opening a NIC: see [`Node::attach`]. The daemon's engine has its
    /// own fabric, meta server and configuration, so this excludes every
    /// other setting but [`NodeBuilder::register`]`(false)`.
    pub fn daemon(mut self, path: impl Into<std::path::PathBuf>) -> NodeBuilder {
        self.daemon = Some(path.into());
        self
    }

    /// Opens the node on `other`'s fabric, reading the meta table `other`
    /// hosts or reads, and registering in it (unless
    /// [`NodeBuilder::register`] says not to).
    pub fn join(mut self, other: &Node) -> NodeBuilder {
        self.place = Place::Join(other.clone());
        self
    }

    /// Reads the meta table at `location` (the node registers in it only
    /// with [`NodeBuilder::register`]).
    pub fn meta(mut self, location: MetaLocation) -> NodeBuilder {
        self.meta = Some(location);
        self
    }

    /// Reads the meta table of the meta server whose TCP bootstrap listens
    /// at `addr` (`HOST:PORT`, e.g. `meta-host:7471`): [`NodeBuilder::build`]
    /// fetches the bootstrap (bounded by the engine's `meta_timeout`). The
    /// node registers only with [`NodeBuilder::register`]. The node follows
    /// the server through restarts: when it stops answering, the bootstrap
    /// is fetched again from `addr` and a restarted server's new table is
    /// read, and registered in, from then on (see
    /// [`Engine::refresh_meta`]).
    pub fn meta_addr(mut self, addr: impl Into<String>) -> NodeBuilder {
        self.meta_addr = Some(addr.into());
        self
    }

    /// Whether the node registers with its meta server so that peers can
    /// reach it: as messages to the server
    /// ([`Engine::meta_keep_registered`]; in RC fallback mode over the RC
    /// pair the node's first handshake with the meta node builds) with a
    /// lease ([`NodeBuilder::lease`]) that a thread of the node renews
    /// (every third of it) until the node is dropped; the entry then stays
    /// until its lease runs out. Default: on for [`NodeBuilder::join`], off
    /// for [`NodeBuilder::meta`] (a compute node that is never reached needs
    /// no entry). The host of [`NodeBuilder::host_meta`] is always in its
    /// own table (a local call).
    pub fn register(mut self, on: bool) -> NodeBuilder {
        self.register = Some(on);
        self
    }

    /// The lease of a registration over messaging. Default [`DEFAULT_LEASE`].
    pub fn lease(mut self, lease: Duration) -> NodeBuilder {
        self.lease = lease;
        self
    }

    /// Hosts the meta table on this node (and registers the node in it):
    /// the simplest single-process setup, and what the `krcore-meta`
    /// binary runs. The node's engine hosts it ([`MsgMetaHost`],
    /// [`Node::meta_server`]) in either mode: other nodes register by
    /// messages to it (in RC fallback mode over the RC pair their first
    /// handshake with the node builds) and READ it. A 1024-bucket table
    /// with the default settings (see [`NodeBuilder::host_meta_with`]).
    pub fn host_meta(self) -> NodeBuilder {
        let geometry = Geometry::with_buckets(EMBEDDED_BUCKETS)
            .unwrap_or_else(|_| MetaConfig::default().geometry);
        self.host_meta_with(MetaConfig {
            geometry,
            ..MetaConfig::default()
        })
    }

    /// As [`NodeBuilder::host_meta`], with the table's settings (geometry,
    /// `lease_sweep_ms`, `first_epoch`, `incarnation`; the UD settings are
    /// not used).
    pub fn host_meta_with(mut self, meta: MetaConfig) -> NodeBuilder {
        self.host_meta = Some(meta);
        self
    }

    /// The engine's configuration (its `meta` and `handshake_thread` are
    /// set by the builder).
    pub fn config(mut self, config: EngineConfig) -> NodeBuilder {
        self.config = config;
        self
    }

    /// The sim device to open (ignored for [`NodeBuilder::nic`] and verbs).
    /// Default: the fabric string's options (`dc`, `latency`) or
    /// [`SimConfig::default`] (with DC), or with [`NodeBuilder::join`] the
    /// joined node's (a cluster is all-DC or all-RC-fallback).
    pub fn sim_config(mut self, sim: SimConfig) -> NodeBuilder {
        self.sim = Some(sim);
        self
    }

    /// RC fallback mode: whether the engine answers handshakes from a
    /// thread of its own. Default true.
    pub fn handshake_thread(mut self, on: bool) -> NodeBuilder {
        self.handshake_thread = on;
        self
    }

    /// Opens the node and starts its engine (and registers it, see
    /// [`NodeBuilder::register`]).
    ///
    /// # Errors
    /// [`Error::Nic`] (bad fabric string, no such device, fabric full, no
    /// verbs provider in this build), [`Error::Meta`] (the TCP bootstrap of
    /// [`NodeBuilder::meta_addr`]: unreachable, another wire version),
    /// [`Error::Engine`] (the registration over messaging:
    /// `MetaUnavailable` when the meta server does not answer,
    /// `MetaRefused`), [`Error::Builder`] for contradictory settings,
    /// [`Error::Register`].
    pub fn build(self) -> Result<Node> {
        let NodeBuilder {
            place,
            mut config,
            mut meta,
            meta_addr,
            host_meta,
            register,
            lease,
            sim,
            handshake_thread,
            daemon,
        } = self;
        config.handshake_thread = handshake_thread;
        // Ports answer Opens and return credits while their users do not
        // call in (see krcore::messaging).
        config.msg.progress_thread = true;
        if let Some(path) = daemon {
            if !matches!(place, Place::Default) {
                return Err(Error::Builder(
                    "an attached node opens no fabric or NIC: daemon excludes fabric, nic and join",
                ));
            }
            if meta.is_some() || meta_addr.is_some() || host_meta.is_some() {
                return Err(Error::Builder(
                    "an attached node reads its daemon's meta server: no meta, meta_addr or host_meta",
                ));
            }
            if register == Some(true) {
                return Err(Error::Builder(
                    "an attached node is registered by its daemon: no register(true)",
                ));
            }
            if sim.is_some() {
                return Err(Error::Builder(
                    "an attached node opens no device: no sim_config",
                ));
            }
            return Node::attach(path);
        }
        let mut joined_meta_host = None;
        let joined = matches!(place, Place::Join(_));
        if let Some(addr) = &meta_addr {
            if meta.is_some() {
                return Err(Error::Builder("meta and meta_addr exclude each other"));
            }
            let b =
                krcore_meta::bootstrap::fetch_bootstrap_tcp(addr.as_str(), config.meta_timeout)?;
            meta = Some(MetaLocation::from_bootstrap(&b)?);
        }
        let dev = |sim: Option<SimConfig>| sim.unwrap_or_default();
        let open_spec =
            |spec: FabricSpec, sim: Option<SimConfig>| -> Result<(AnyNic, Option<SimFabric>)> {
                match (spec.as_sim(), sim) {
                    // An explicit sim device replaces the string's options.
                    (Some(s), Some(cfg)) => {
                        let f = s.open_fabric()?;
                        Ok((SimNic::open(&f, cfg)?.into(), Some(f)))
                    }
                    _ => {
                        let o = spec.open()?;
                        Ok((o.nic, o.fabric))
                    }
                }
            };
        let (nic, fabric): (AnyNic, Option<SimFabric>) = match place {
            Place::Default => {
                let f = SimFabric::in_memory();
                (SimNic::open(&f, dev(sim))?.into(), Some(f))
            }
            Place::Spec(spec) => open_spec(
                spec.parse::<FabricSpec>()
                    .map_err(krcore_nic::NicError::from)?,
                sim,
            )?,
            Place::Parsed(spec) => open_spec(spec, sim)?,
            Place::Fabric(f) => (SimNic::open(&f, dev(sim))?.into(), Some(f)),
            Place::Nic(nic) => {
                let fabric = nic.as_sim().map(krcore_nic::sim::SimNic::fabric);
                (nic, fabric)
            }
            Place::Join(other) => {
                let f = other
                    .fabric()
                    .cloned()
                    .ok_or(Error::Builder("the node to join has no known fabric"))?;
                if meta.is_none() {
                    config.meta = other.meta_location();
                }
                joined_meta_host = other.inner.meta_host.clone();
                let joined_nic = other.engine().ok().and_then(|e| e.nic().as_sim());
                let sim = match (sim, joined_nic) {
                    (Some(s), _) => s,
                    (None, Some(n)) => n.config().clone(),
                    (None, None) => SimConfig::default(),
                };
                (SimNic::open(&f, sim)?.into(), Some(f))
            }
        };
        if let Some(m) = meta {
            config.meta = Some(m);
        }
        if host_meta.is_some() && config.meta.is_some() {
            return Err(Error::Builder(
                "host_meta and a meta location exclude each other",
            ));
        }
        let idle_sleep = config.msg.idle_sleep;
        let fetch_timeout = config.meta_timeout;
        let engine = Engine::start(nic, config)?;
        if let Some(addr) = meta_addr {
            // A restarted server is found again at the same address (see
            // `Engine::refresh_meta`).
            engine.set_meta_source(Arc::new(move || {
                krcore_meta::bootstrap::fetch_bootstrap_tcp(addr.as_str(), fetch_timeout)
            }));
        }
        let hosts = host_meta.is_some();
        let meta_host = match host_meta {
            Some(meta_cfg) => {
                // The node's engine hosts the table and reads it.
                let host = Arc::new(MsgMetaHost::start(&engine, meta_cfg)?);
                let thread = host.spawn(idle_sleep)?;
                Some(Arc::new(MetaHost {
                    host,
                    _thread: thread,
                }))
            }
            None => joined_meta_host,
        };
        let node = Node {
            inner: Arc::new(NodeInner {
                lease: parking_lot::Mutex::new(None),
                backend: Backend::Engine(engine),
                fabric,
                meta_host,
            }),
        };
        if hosts {
            // The host: a local call into its own table.
            if let Some(h) = &node.inner.meta_host {
                node.register_locally(&h.host)?;
            }
        } else if register.unwrap_or(joined) {
            let entries = node.entries()?;
            let kept = node.local()?.meta_keep_registered(&entries, 0, lease)?;
            *node.inner.lease.lock() = Some(kept);
        }
        tracing::info!(
            gid = %node.gid(),
            provider = node.local()?.nic().provider(),
            mode = ?node.mode(),
            hosts_meta = hosts,
            registered = hosts || node.inner.lease.lock().is_some(),
            "node built"
        );
        Ok(node)
    }
}
