//! A node: one NIC port with its engine, and the builder that opens it.

use std::sync::Arc;

use krcore_kmod::{Engine, EngineConfig, MetaLocation};
use krcore_meta::table::Geometry;
use krcore_meta::{MetaConfig, MetaServer};
use krcore_nic::sim::{SimConfig, SimFabric, SimNic};
use krcore_nic::{Access, DcTarget, Gid, Nic};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::memory::MemoryRegion;
use crate::vqp::Vqp;

/// An embedded meta server hosted by a node of this process: the real
/// server (same table, same one-sided READ path for clients), with nodes of
/// the process registered by local calls through [`MetaServer::table_mut`].
pub type MetaHost<N> = Mutex<MetaServer<N>>;

/// Lease of a registration made by the builder in an embedded meta table
/// (its clock is the caller's: the builder registers at time 0).
const EMBEDDED_LEASE_MS: u64 = 1 << 40;

/// Buckets of the embedded meta table a builder creates (8 entries each).
const EMBEDDED_BUCKETS: u32 = 1024;

struct NodeInner<N: Nic> {
    engine: Engine<N>,
    fabric: Option<SimFabric>,
    meta_host: Option<Arc<MetaHost<N>>>,
}

/// One node: a NIC port, its KRCore engine, and (on `sim`) its fabric.
/// Cheap to clone; `Send + Sync`.
pub struct Node<N: Nic = SimNic> {
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

impl Node<SimNic> {
    /// A builder for a node on the `sim` provider.
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    /// The sim fabric the node is on (to open more nodes on it).
    pub fn fabric(&self) -> Option<&SimFabric> {
        self.inner.fabric.as_ref()
    }
}

impl<N: Nic> Node<N> {
    /// A node over any provider's NIC, with an engine configured by `cfg`.
    ///
    /// # Errors
    /// [`Error::Engine`] when the engine cannot start (no DC, ...).
    pub fn with_nic(nic: N, cfg: EngineConfig) -> Result<Node<N>> {
        Ok(Node {
            inner: Arc::new(NodeInner {
                engine: Engine::start(nic, cfg)?,
                fabric: None,
                meta_host: None,
            }),
        })
    }

    /// This node's GID.
    pub fn gid(&self) -> Gid {
        self.inner.engine.gid()
    }

    /// This node's DC address (what the meta server publishes for it).
    pub fn local_target(&self) -> DcTarget {
        self.inner.engine.local_target()
    }

    /// The NIC's counters ("connect created 0 QPs").
    pub fn counters(&self) -> krcore_nic::Counters {
        self.inner.engine.nic().counters()
    }

    /// The engine (statistics, DCCache, configuration).
    pub fn engine(&self) -> &Engine<N> {
        &self.inner.engine
    }

    /// The meta table this node hosts, if it was built with
    /// [`NodeBuilder::host_meta`].
    pub fn meta_server(&self) -> Option<&MetaHost<N>> {
        self.inner.meta_host.as_deref()
    }

    /// Where the meta table this node reads is.
    pub fn meta_location(&self) -> Option<MetaLocation> {
        self.inner.engine.meta_location()
    }

    /// Allocates registered memory owned by this process.
    ///
    /// # Errors
    /// [`Error::Engine`] with the provider's refusal.
    pub fn alloc(&self, len: usize, access: Access) -> Result<MemoryRegion<N>> {
        Ok(MemoryRegion {
            mr: self.inner.engine.alloc_mr(len, access)?,
            gid: self.gid(),
        })
    }

    /// A new VQP, not connected yet.
    ///
    /// # Errors
    /// [`Error::Engine`].
    pub fn vqp(&self) -> Result<Vqp<N>> {
        Ok(Vqp::new(self.inner.engine.create_vqp()?, self.clone()))
    }

    /// A new VQP connected to `gid`.
    ///
    /// # Errors
    /// [`Error::Engine`] (`UnknownNode`, `MetaUnavailable`, ...).
    pub fn connect(&self, gid: Gid) -> Result<Vqp<N>> {
        let v = self.vqp()?;
        v.connect(gid)?;
        Ok(v)
    }

    /// Registers this node in an embedded meta table (the meta server host
    /// does this over two-sided messages in a deployment).
    ///
    /// # Errors
    /// [`Error::Register`].
    pub fn register_in(&self, meta: &MetaHost<N>) -> Result<()> {
        meta.lock()
            .table_mut()
            .register(self.local_target(), 0, EMBEDDED_LEASE_MS, 0)
            .map(|_| ())
            .map_err(|source| Error::Register {
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
    Fabric(SimFabric),
    Nic(SimNic),
    Join(Node<SimNic>),
}

/// Builds a [`Node`] on the `sim` provider (the default provider).
///
/// - Where: [`NodeBuilder::fabric`] (a spec: `sim:mem`, the default,
///   `sim:NAME`, `sim:/path`), [`NodeBuilder::sim_fabric`] (an open fabric),
///   [`NodeBuilder::nic`] (an open node), or [`NodeBuilder::join`] (the
///   fabric and meta table of another node of this process).
/// - Meta server: [`NodeBuilder::meta`] (a location), [`NodeBuilder::host_meta`]
///   (host an embedded table on this node), or inherited by `join`.
#[derive(Debug, Default)]
pub struct NodeBuilder {
    place: Place,
    config: EngineConfig,
    meta: Option<MetaLocation>,
    host_meta: bool,
}

impl NodeBuilder {
    /// Opens the node on the fabric `spec` names.
    pub fn fabric(mut self, spec: &str) -> NodeBuilder {
        self.place = Place::Spec(spec.to_string());
        self
    }

    /// Opens the node on an open fabric.
    pub fn sim_fabric(mut self, fabric: &SimFabric) -> NodeBuilder {
        self.place = Place::Fabric(fabric.clone());
        self
    }

    /// Uses an open sim node.
    pub fn nic(mut self, nic: SimNic) -> NodeBuilder {
        self.place = Place::Nic(nic);
        self
    }

    /// Opens the node on `other`'s fabric, reading (and registering in) the
    /// meta table `other` hosts or reads.
    pub fn join(mut self, other: &Node<SimNic>) -> NodeBuilder {
        self.place = Place::Join(other.clone());
        self
    }

    /// Reads the meta table at `location`.
    pub fn meta(mut self, location: MetaLocation) -> NodeBuilder {
        self.meta = Some(location);
        self
    }

    /// Hosts an embedded meta table on this node (and registers the node in
    /// it): the simplest single-process setup.
    pub fn host_meta(mut self) -> NodeBuilder {
        self.host_meta = true;
        self
    }

    /// The engine's configuration (its `meta` is set by the builder).
    pub fn config(mut self, config: EngineConfig) -> NodeBuilder {
        self.config = config;
        self
    }

    /// Opens the node and starts its engine.
    ///
    /// # Errors
    /// [`Error::Nic`] (bad spec, fabric full), [`Error::Engine`],
    /// [`Error::Builder`] for contradictory settings, [`Error::Register`].
    pub fn build(self) -> Result<Node<SimNic>> {
        let NodeBuilder {
            place,
            mut config,
            meta,
            host_meta,
        } = self;
        let mut joined_meta_host = None;
        let (nic, fabric) = match place {
            Place::Default => {
                let f = SimFabric::in_memory();
                (SimNic::open(&f, SimConfig::default())?, Some(f))
            }
            Place::Spec(spec) => {
                let f = SimFabric::from_spec(&spec)?;
                (SimNic::open(&f, SimConfig::default())?, Some(f))
            }
            Place::Fabric(f) => (SimNic::open(&f, SimConfig::default())?, Some(f)),
            Place::Nic(nic) => (nic, None),
            Place::Join(other) => {
                let f = other
                    .fabric()
                    .cloned()
                    .ok_or(Error::Builder("the node to join has no known fabric"))?;
                if meta.is_none() {
                    config.meta = other.meta_location();
                }
                joined_meta_host = other.inner.meta_host.clone();
                (SimNic::open(&f, SimConfig::default())?, Some(f))
            }
        };
        if let Some(m) = meta {
            config.meta = Some(m);
        }
        let meta_host = if host_meta {
            if config.meta.is_some() {
                return Err(Error::Builder(
                    "host_meta and a meta location exclude each other",
                ));
            }
            let host = MetaServer::start(
                nic.clone(),
                MetaConfig {
                    geometry: Geometry::with_buckets(EMBEDDED_BUCKETS)
                        .map_err(|_| Error::Builder("embedded meta geometry"))?,
                    ..MetaConfig::default()
                },
            )?;
            config.meta = Some(MetaLocation::from_bootstrap(&host.bootstrap())?);
            Some(Arc::new(Mutex::new(host)))
        } else {
            joined_meta_host
        };
        let node = Node {
            inner: Arc::new(NodeInner {
                engine: Engine::start(nic, config)?,
                fabric,
                meta_host,
            }),
        };
        if let Some(host) = &node.inner.meta_host {
            node.register_in(host)?;
        }
        Ok(node)
    }
}
