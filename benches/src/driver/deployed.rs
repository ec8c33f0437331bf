//! The RACE store deployed on its own: a client of memory nodes found
//! through the meta server (`race_store::deploy::Store`), for
//! `krcore-ycsb --meta ADDR --store NAME`.

use super::{Backend, BackendError, KvClient};
use crate::cluster::RaceKv;
use krcore_nic::FabricSpec;
use race_store::deploy::{DeployError, Store, StoreOptions};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where a deployed store is: what a client process needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeployedTarget {
    /// The fabric string of this client's device.
    pub fabric: String,
    /// The meta server's TCP address.
    pub meta: String,
    /// The store's name.
    pub store: String,
    /// The compute node's engine (a `--config` file's `[engine]`).
    #[serde(default)]
    pub engine: krcore::EngineConfig,
    /// The clients' settings (a `--config` file's `[client]`).
    #[serde(default)]
    pub client: race_store::ClientConfig,
    /// Post through the node daemon (`krcored`) listening at this socket
    /// instead of an engine of this process (`--host daemon:PATH`); the
    /// fabric is then the daemon's, and `engine` is not used.
    #[serde(default)]
    pub daemon: Option<std::path::PathBuf>,
    /// The most allocation endpoints the process's clients share
    /// (`StoreOptions::alloc_endpoints`; `None`: its default).
    #[serde(default)]
    pub alloc_endpoints: Option<usize>,
}

/// A deployed store as a YCSB backend: the clients of every thread post
/// from one compute node of this process.
#[derive(Debug)]
pub struct StoreBackend {
    store: Store,
    label: Option<String>,
}

impl StoreBackend {
    /// Opens a compute node on `target.fabric` and finds the store's memory
    /// nodes (waiting at most `wait` for all of them).
    ///
    /// # Errors
    /// [`DeployError`].
    pub fn connect(target: &DeployedTarget, wait: Duration) -> Result<StoreBackend, DeployError> {
        let mut opts = StoreOptions {
            wait,
            client: target.client,
            engine: target.engine.clone(),
            ..StoreOptions::default()
        };
        if let Some(n) = target.alloc_endpoints {
            opts.alloc_endpoints = n;
        }
        let store = match &target.daemon {
            Some(socket) => {
                let node = krcore::Node::attach(socket)?;
                Store::open(&node, &target.meta, &target.store, opts)?
            }
            None => Store::connect(&target.fabric, &target.meta, &target.store, opts)?,
        };
        let label = target
            .fabric
            .parse::<FabricSpec>()
            .ok()
            .and_then(|s| s.as_sim().and_then(|s| s.latency()))
            .map(|m| format!("modeled ({})", m.name));
        Ok(StoreBackend { store, label })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl Backend for StoreBackend {
    fn name(&self) -> &'static str {
        "race"
    }

    fn client(&self) -> Result<Box<dyn KvClient>, BackendError> {
        let client = self.store.client().map_err(|e| BackendError::Setup {
            backend: "race",
            message: crate::cluster::error_chain(&e),
        })?;
        Ok(Box::new(RaceKv::new(client)))
    }

    fn label(&self) -> Option<String> {
        self.label.clone()
    }
}
