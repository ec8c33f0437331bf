//! The client side of a deployed store: [`Store`] (its memory nodes, found
//! through the meta server, and the node its clients post from) and its
//! options.

use super::{check_members, complete, members, DeployError, POLL};
use crate::clock::{Clock, WallClock};
use crate::rdma::{AllocEndpoints, NodeInfo, VqpTransport, STORE_ALLOC_ENDPOINTS};
use crate::remote::TransportError;
use crate::{Client, ClientConfig};
use krcore::{EngineError, Node};
use krcore_nic::AnyNic;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The least `recv_depth` of the node [`Store::connect`] opens: its
/// clients (a thread each) share it, and each channel an allocation
/// endpoint has open to a memory node's allocation port (one while a
/// request is out, asked ahead included) reserves `msg.reply_window` (4)
/// of its receive buffers. 1,024 buffers (8.1 MiB of them by default)
/// leave room for about 120 channels to two memory nodes (the
/// [`StoreOptions::alloc_endpoints`] of the store's clients hold at most
/// 32 per memory node; clients on other nodes, [`Store::client_on`], one
/// each); past that a client waits for another's channel to close. The
/// engine's default (256) held about 28, and a 100-thread client process
/// failed its writes.
pub const CLIENT_RECV_DEPTH: u32 = 1024;

/// What a client process needs of a deployed store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long [`Store::connect`] waits for the store to be complete (all
    /// its memory nodes registered), and [`Store::client`] for a member the
    /// meta table does not know yet (after the meta server restarts, each
    /// memory node joins the store again and registers again on its own
    /// schedule: a member may show before its registration).
    pub wait: Duration,
    /// The clients' configuration.
    pub client: ClientConfig,
    /// The engine of the compute node [`Store::connect`] opens (its meta
    /// location is the meta server's; [`Store::open`] uses the node given).
    pub engine: krcore::EngineConfig,
    /// Messaging endpoints the store's clients ([`Store::client`]) make
    /// their block allocations from, at most: shared, one lent to a client
    /// while a request of it is out (see [`AllocEndpoints`]). Each costs
    /// the node a VQP and a staging ring, and through the node daemon one
    /// of its endpoints of the process (`krcored --max-endpoints`, 64 by
    /// default). Default [`STORE_ALLOC_ENDPOINTS`].
    pub alloc_endpoints: usize,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            wait: Duration::from_secs(5),
            client: ClientConfig::default(),
            engine: krcore::EngineConfig::default(),
            alloc_endpoints: STORE_ALLOC_ENDPOINTS,
        }
    }
}

/// The client side of a deployed store: its memory nodes, found through the
/// meta server, and the node the clients post from. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    name: String,
    meta_addr: String,
    node: Node,
    infos: Vec<NodeInfo>,
    clock: Arc<WallClock>,
    config: ClientConfig,
    wait: Duration,
    /// The allocation endpoints of the clients on `node`.
    endpoints: Arc<AllocEndpoints>,
}

impl Store {
    /// Opens a compute node on `fabric` (a fabric string: `sim:NAME`,
    /// `verbs:DEV`, ...) that reads the meta table of the meta server at
    /// `meta_addr`, and finds the memory nodes of `store`. The node's
    /// `recv_depth` is at least [`CLIENT_RECV_DEPTH`]: room for many
    /// clients' allocation channels.
    ///
    /// # Errors
    /// As [`Store::open`], and [`DeployError::Sdk`] when the node cannot be
    /// opened (a bad fabric string, no such device, the meta server
    /// unreachable).
    pub fn connect(
        fabric: &str,
        meta_addr: &str,
        store: &str,
        opts: StoreOptions,
    ) -> Result<Store, DeployError> {
        let mut engine = opts.engine.clone();
        engine.recv_depth = engine.recv_depth.max(CLIENT_RECV_DEPTH);
        let node = Node::builder()
            .fabric(fabric)
            .config(engine)
            .meta_addr(meta_addr)
            .build()?;
        Store::open(&node, meta_addr, store, opts)
    }

    /// Finds the memory nodes of `store` for clients on `node` (which reads
    /// the same meta server's table), waiting up to `opts.wait` for the
    /// store to be complete.
    ///
    /// # Errors
    /// [`DeployError::NoSuchStore`], [`DeployError::Incomplete`],
    /// [`DeployError::BadRecord`], [`DeployError::Meta`].
    pub fn open(
        node: &Node,
        meta_addr: &str,
        store: &str,
        opts: StoreOptions,
    ) -> Result<Store, DeployError> {
        let start = Instant::now();
        loop {
            let err = match members(meta_addr, store)? {
                None => DeployError::NoSuchStore {
                    store: store.to_string(),
                    addr: meta_addr.to_string(),
                },
                Some(list) => match complete(store, &list) {
                    Ok(infos) => {
                        return Ok(Store {
                            name: store.to_string(),
                            meta_addr: meta_addr.to_string(),
                            node: node.clone(),
                            infos,
                            clock: Arc::new(WallClock),
                            config: opts.client,
                            wait: opts.wait,
                            endpoints: Arc::new(AllocEndpoints::new(node, opts.alloc_endpoints)),
                        })
                    }
                    Err(e) => e,
                },
            };
            if start.elapsed() >= opts.wait {
                return Err(err);
            }
            std::thread::sleep(POLL);
        }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The memory nodes, in id order.
    pub fn infos(&self) -> &[NodeInfo] {
        &self.infos
    }

    /// The node the clients post from.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The clients' clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// A client (one per thread) on the store's node: one VQP per memory
    /// node (a meta lookup each, no QP created). When a memory node stops
    /// answering, the client asks the store's membership whether another
    /// process serves its id now: its operations then fail as
    /// [`crate::remote::TransportError::NodeReplaced`] (the node restarted
    /// empty), not as a node that is down. Its block allocations go
    /// through the store's shared allocation endpoints
    /// ([`StoreOptions::alloc_endpoints`]).
    ///
    /// A member the meta table does not know (it joined the store again
    /// before it registered again, after a meta server restart) is waited
    /// for, up to [`StoreOptions::wait`].
    ///
    /// # Errors
    /// Transport setup and table errors ([`crate::Error`]).
    pub fn client(&self) -> Result<Client<VqpTransport<AnyNic>>, crate::Error> {
        self.client_with(&self.node, self.endpoints.clone())
    }

    /// A client on another node (a compute node per thread, for instance),
    /// with an allocation endpoint of its own.
    ///
    /// # Errors
    /// As [`Store::client`].
    pub fn client_on(&self, node: &Node) -> Result<Client<VqpTransport<AnyNic>>, crate::Error> {
        self.client_with(node, Arc::new(AllocEndpoints::new(node, 1)))
    }

    /// The allocation endpoints of the store's clients (see
    /// [`StoreOptions::alloc_endpoints`]).
    pub fn alloc_endpoints(&self) -> &AllocEndpoints {
        &self.endpoints
    }

    fn client_with(
        &self,
        node: &Node,
        endpoints: Arc<AllocEndpoints>,
    ) -> Result<Client<VqpTransport<AnyNic>>, crate::Error> {
        let start = Instant::now();
        let mut t = loop {
            match VqpTransport::connect_sharing(node, &self.infos, endpoints.clone()) {
                Err(e) if unregistered(&e) && start.elapsed() < self.wait => {
                    std::thread::sleep(POLL);
                }
                r => break r?,
            }
        };
        check_members(&mut t, &self.infos)?;
        // A memory node that stops answering may have restarted (empty):
        // the store's membership tells (VqpTransport::set_member_check).
        let (addr, store) = (self.meta_addr.clone(), self.name.clone());
        t.set_member_check(Arc::new(move |id| {
            members(&addr, &store)
                .ok()
                .flatten()?
                .into_iter()
                .find(|i| i.id == id)
                .map(|i| i.incarnation)
        }));
        Client::open(t, self.clock(), self.config)
    }
}

/// Whether a transport's setup failed on a memory node the meta table has
/// no registration for.
fn unregistered(e: &TransportError) -> bool {
    let TransportError::Setup { source, .. } = e else {
        return false;
    };
    matches!(
        source.get().downcast_ref::<krcore::Error>(),
        Some(krcore::Error::Engine(EngineError::UnknownNode { .. }))
    )
}
