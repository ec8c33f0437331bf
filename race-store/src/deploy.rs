//! A deployed store: memory nodes and clients that find each other through
//! the meta server alone (its TCP address), on any provider.
//!
//! ```text
//! race-memnode (node i)                    meta server (krcore-meta)
//!   Node: --fabric F --meta ADDR  --register-->  DC entries (READ by peers)
//!   MemoryNodeServer (region, ALLOC_PORT)
//!   store_keep_joined(store, i, NodeInfo) ----->  store "S": i -> NodeInfo
//!
//! client process                          (TCP ADDR: bootstrap, StoreList)
//!   Store::connect(F, ADDR, "S") ---- StoreList ---->  members 0..n
//!   store.client() -> Client: one VQP per memory node (a meta lookup each)
//! ```
//!
//! - Serving side: [`MemoryNodeServer::deploy`] (see [`DeployedMemoryNode`]):
//!   node 0 formats the table and then joins the store; nodes `1..n` wait
//!   (bounded) until node 0 is a member, check that it formatted a store of
//!   the same size, and join. Membership is leased and renewed by a thread
//!   of the node; [`DeployedMemoryNode::shutdown`] leaves the store and
//!   removes the node's meta entry; a node that dies is swept when its lease
//!   runs out.
//! - Client side: [`Store::connect`] (a compute node of its own) or
//!   [`Store::open`] (on a node you built), then [`Store::client`] per
//!   thread.
//!
//! # Clocks
//!
//! Clients of every process compare leases and deadlines written in remote
//! memory (the resize lock, the reclamation grace): a deployed store's
//! clients use [`crate::clock::WallClock`], microseconds since 2024 from the
//! system clock. Across machines their clocks must agree (NTP) to well
//! within [`crate::ClientConfig`]'s `max_op_ticks` (100 ms by default) and
//! `grace_ticks` (300 ms); the defaults suit NTP-synchronised hosts (skew of
//! a few ms). With a larger skew raise `grace_ticks` and `lease_ticks` by it.
//!
//! # Invariants
//! - A member record is a [`NodeInfo`] (checked view; untrusted bytes): a
//!   record that does not parse, names another id, or a node count that
//!   differs from node 0's, is a typed error, never a guess.
//! - A client connects only to a complete store: members `0..n` all live,
//!   where `n` is node 0's node count.
//! - A memory node's region lives as long as its process (its record's
//!   `incarnation`). A node joins only at an id no live member holds, even
//!   one at its own GID (a process restarted on its host has its
//!   predecessor's GID; joining would renew the dead one's membership);
//!   node 0 formats only when the store has no live member (it would
//!   format an empty table beside their data).
//! - Every member records its incarnation in the table (node 0's members,
//!   `MEMBERS_OFFSET`) before it joins: node 0 when it formats, the others
//!   by a CAS from 0. Each client, when it connects, checks that every
//!   member is the process the table recorded at its id: a node that
//!   restarted empty ([`crate::Error::MemberReplaced`]) or one the table
//!   does not name ([`crate::Error::MemberNotInTable`]: its membership
//!   lapsed while a new node 0 formatted a new table, and its region holds
//!   the old table's data where the new directory points) is a typed
//!   error, never keys gone missing or old values back. Such a node leaves
//!   by itself ([`DeployedMemoryNode::check_standing`]).

use crate::layout::slot::RemotePtr;
use crate::layout::table::MEMBERS_OFFSET;
use crate::memory::TableConfig;
use crate::rdma::{MemoryNodeHandle, MemoryNodeServer, NodeInfo, VqpTransport};
use crate::remote::TransportError;
use krcore::{EngineError, Node, StoreMembership};
use krcore_meta::bootstrap::fetch_store_tcp;
use krcore_meta::wire::ErrorCode;
use krcore_meta::MetaError;
use krcore_nic::{AnyNic, Gid};
use std::time::{Duration, Instant};

mod store;
mod usage;

pub use store::{Store, StoreOptions, CLIENT_RECV_DEPTH};

/// The TCP address a meta server listens on unless told otherwise.
pub const DEFAULT_META_ADDR: &str = "127.0.0.1:7471";

/// How long a membership lasts unless renewed (renewed every third).
pub const DEFAULT_MEMBER_LEASE: Duration = Duration::from_secs(10);

/// Why a deployed store could not be served or reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeployError {
    /// The meta server's TCP service (unreachable, timed out, another wire
    /// version, a refusal).
    #[error("meta server {addr}")]
    Meta {
        /// The address asked.
        addr: String,
        /// What failed.
        #[source]
        source: Box<MetaError>,
    },
    /// Nobody registered the store (or all its members' leases ran out).
    #[error("no store named {store:?} is registered with the meta server at {addr}")]
    NoSuchStore {
        /// The store.
        store: String,
        /// The meta server.
        addr: String,
    },
    /// Some memory nodes of the store are not registered.
    #[error(
        "store {store:?} is incomplete: memory nodes {missing:?} of {nodes} are not registered"
    )]
    Incomplete {
        /// The store.
        store: String,
        /// Its number of memory nodes (node 0's record).
        nodes: u8,
        /// The ids missing.
        missing: Vec<u8>,
    },
    /// Node 0 never joined: the table was never formatted.
    #[error(
        "store {store:?}: memory node 0 did not register within {waited:?} (it formats the table: \
         start it first)"
    )]
    NodeZeroMissing {
        /// The store.
        store: String,
        /// How long this node waited.
        waited: Duration,
    },
    /// Live memory nodes of the store joined an earlier table: a new node 0
    /// would format an empty table beside their data.
    #[error(
        "store {store:?}: memory nodes {live:?} are live members of an earlier table (their data \
         is not in a new one): stop them to start the store anew"
    )]
    EarlierTable {
        /// The store.
        store: String,
        /// The live members' ids.
        live: Vec<u8>,
    },
    /// Another live node holds this id in the store (an earlier process at
    /// this node's own GID, too, until its lease runs out: a GID is a
    /// host's port, not a process).
    #[error(
        "store {store:?}: memory node id {id} is taken by node {holder} (until its lease runs out)"
    )]
    DuplicateId {
        /// The store.
        store: String,
        /// The id.
        id: u8,
        /// The GID holding it.
        holder: Gid,
    },
    /// The region cannot hold this node's share of the initial subtables
    /// (node 0's: and the directory), which node 0's table places on it.
    #[error(
        "store {store:?}: memory node {id} holds {subtables} of the table's initial subtables \
         and needs a region of at least {need_mib} MiB for them (it has {have_mib} MiB): \
         give it more memory, or presize the table for fewer keys"
    )]
    RegionTooSmall {
        /// The store.
        store: String,
        /// This node.
        id: u8,
        /// Initial subtables placed on it.
        subtables: u64,
        /// MiB its region needs (rounded up).
        need_mib: u64,
        /// MiB it has (rounded down).
        have_mib: u64,
    },
    /// The store's node 0 is another process than the one this node laid
    /// out its part of the table for: this node's membership lapsed (a
    /// process stopped or starved past its lease) while node 0 was
    /// replaced and formatted a new table. Its region holds the old table's
    /// data at the places the new table's directory names: it must not
    /// serve the new table ([`DeployedMemoryNode::check_standing`]).
    #[error(
        "store {store:?} has a new table (node 0 is incarnation {now:#x}, not {laid_out_for:#x}, \
         which memory node {id} laid out its part for): this node's membership lapsed and its \
         region holds the old table's data; it leaves (start it anew to join the new table)"
    )]
    TableReplaced {
        /// The store.
        store: String,
        /// This node.
        id: u8,
        /// Node 0's incarnation when this node joined.
        laid_out_for: u64,
        /// Node 0's incarnation now.
        now: u64,
    },
    /// This node and node 0 disagree on the number of memory nodes.
    #[error(
        "store {store:?}: node 0 formatted a store of {theirs} memory nodes, this one has {ours}"
    )]
    NodeCount {
        /// The store.
        store: String,
        /// This node's count.
        ours: u8,
        /// Node 0's.
        theirs: u8,
    },
    /// A member's record is not a valid memory node record.
    #[error("store {store:?}: member {id} has a malformed record")]
    BadRecord {
        /// The store.
        store: String,
        /// The member id.
        id: u16,
        /// Why.
        #[source]
        source: TransportError,
    },
    /// The SDK (opening the node, registering).
    #[error(transparent)]
    Sdk(Box<krcore::Error>),
    /// Joining the store (through the node's engine, or the node
    /// daemon's).
    #[error("joining store {store:?}")]
    Join {
        /// The store.
        store: String,
        /// What failed.
        #[source]
        source: Box<krcore::Error>,
    },
    /// Leaving the store at a shutdown (the meta server unreachable, for
    /// one): the node stopped serving all the same, and its membership
    /// lapses at the end of its lease.
    #[error("leaving store {store:?} (the membership lapses at the end of its lease)")]
    Leave {
        /// The store.
        store: String,
        /// What failed.
        #[source]
        source: Box<krcore::Error>,
    },
    /// The store (formatting, opening a client).
    #[error(transparent)]
    Store(#[from] crate::Error),
}

impl From<krcore::Error> for DeployError {
    fn from(e: krcore::Error) -> DeployError {
        DeployError::Sdk(Box::new(e))
    }
}

/// What one memory node of a deployed store serves.
#[derive(Debug, Clone)]
pub struct MemoryNodeOptions {
    /// The store's name (1..=32 bytes of `[A-Za-z0-9._-]`).
    pub store: String,
    /// This node's id (`0..nodes`).
    pub id: u8,
    /// The store's number of memory nodes.
    pub nodes: u8,
    /// Bytes of this node's region.
    pub bytes: u64,
    /// The table node 0 formats. The others take node 0's from its
    /// member record instead, and lay out their shares of its initial
    /// subtables ([`TableConfig::initial_subtable`]).
    pub table: TableConfig,
    /// The meta server's TCP address (to wait for node 0).
    pub meta_addr: String,
    /// The membership lease (renewed every third of it).
    pub lease: Duration,
    /// How long nodes `1..n` wait for node 0.
    pub wait: Duration,
    /// Longest sleep of the allocation server between empty polls.
    pub idle: Duration,
    /// How long a client's lease on the node's grants lasts without a
    /// request: a client not heard from for that long is dead, and what it
    /// never wrote of its grants is taken back ([`crate::holders`]).
    pub grant_lease: Duration,
}

impl MemoryNodeOptions {
    /// Options with the defaults: [`DEFAULT_MEMBER_LEASE`], 30 s of waiting
    /// for node 0, 1 ms idle sleep, grant leases of
    /// [`crate::holders::DEFAULT_GRANT_LEASE`].
    pub fn new(store: &str, id: u8, nodes: u8, bytes: u64, meta_addr: &str) -> MemoryNodeOptions {
        MemoryNodeOptions {
            store: store.to_string(),
            id,
            nodes,
            bytes,
            table: TableConfig::default(),
            meta_addr: meta_addr.to_string(),
            lease: DEFAULT_MEMBER_LEASE,
            wait: Duration::from_secs(30),
            idle: Duration::from_millis(1),
            grant_lease: crate::holders::DEFAULT_GRANT_LEASE,
        }
    }
}

/// A memory node serving a deployed store (see the module docs). Dropping
/// it stops serving and renewing: the membership then runs out by itself;
/// [`DeployedMemoryNode::shutdown`] leaves at once.
#[derive(Debug)]
pub struct DeployedMemoryNode {
    info: NodeInfo,
    store: String,
    meta_addr: String,
    /// Node 0's incarnation when this node joined (its own, on node 0).
    zero: u64,
    /// The process the table recorded at this id before this one.
    predecessor: Option<u64>,
    /// Dropped first: stops the renewals.
    lease: Option<StoreMembership<AnyNic>>,
    serving: Option<MemoryNodeHandle>,
    node: Node,
}

/// How often a waiting node asks whether node 0 has joined.
const POLL: Duration = Duration::from_millis(50);
/// One TCP request's bound.
const TCP_TIMEOUT: Duration = Duration::from_secs(2);

fn meta_err(addr: &str) -> impl Fn(MetaError) -> DeployError + '_ {
    move |source| DeployError::Meta {
        addr: addr.to_string(),
        source: Box::new(source),
    }
}

/// The live members of `store`, parsed (`Ok(None)`: no such store).
fn members(addr: &str, store: &str) -> Result<Option<Vec<NodeInfo>>, DeployError> {
    let list = match fetch_store_tcp(addr, store, TCP_TIMEOUT) {
        Ok(l) => l,
        Err(MetaError::NoSuchStore { .. }) => return Ok(None),
        Err(e) => return Err(meta_err(addr)(e)),
    };
    let mut out = Vec::with_capacity(list.len());
    for m in list {
        let bad = |source| DeployError::BadRecord {
            store: store.to_string(),
            id: m.id,
            source,
        };
        let info = NodeInfo::decode(&m.record).map_err(bad)?;
        if u16::from(info.id) != m.id || info.gid != m.gid {
            return Err(bad(TransportError::BadResponse {
                reason: "the record names another id or node than its member",
            }));
        }
        out.push(info);
    }
    Ok(Some(out))
}

/// The live members of `store` at the meta server `addr` (TCP only: no
/// fabric, no engine), by id, and whether they make a complete store
/// (`Ok`, or the [`DeployError::Incomplete`] or [`DeployError::NodeCount`]
/// a client would meet): what `race-memnode --status` prints.
///
/// # Errors
/// [`DeployError::NoSuchStore`], [`DeployError::Meta`],
/// [`DeployError::BadRecord`].
pub fn store_members(
    addr: &str,
    store: &str,
) -> Result<(Vec<NodeInfo>, Result<(), DeployError>), DeployError> {
    let Some(mut list) = members(addr, store)? else {
        return Err(DeployError::NoSuchStore {
            store: store.to_string(),
            addr: addr.to_string(),
        });
    };
    list.sort_by_key(|i| i.id);
    let complete = complete(store, &list).map(|_| ());
    Ok((list, complete))
}

/// Whether memory node `opts.id` may join `opts.store` now: no live member
/// holds the id, even one at this node's GID (a process restarted on its
/// host has its predecessor's GID: joining would renew the dead one's
/// membership as if this process had its region), and for node 0, no
/// member is live at all (node 0 would format an empty table beside their
/// data). [`MemoryNodeServer::deploy`] checks it first; a program calls it
/// before it opens (and registers) its node, so that a refused start does
/// not touch the meta entry of a live node at the same GID.
///
/// # Errors
/// [`DeployError::DuplicateId`], [`DeployError::EarlierTable`],
/// [`DeployError::Meta`], [`DeployError::BadRecord`].
pub fn check_membership(opts: &MemoryNodeOptions) -> Result<(), DeployError> {
    let store = opts.store.as_str();
    if let Some(list) = members(&opts.meta_addr, store)? {
        if let Some(held) = list.iter().find(|i| i.id == opts.id) {
            return Err(DeployError::DuplicateId {
                store: store.to_string(),
                id: opts.id,
                holder: held.gid,
            });
        }
        if opts.id == 0 && !list.is_empty() {
            return Err(DeployError::EarlierTable {
                store: store.to_string(),
                live: list.iter().map(|i| i.id).collect(),
            });
        }
    }
    Ok(())
}

impl MemoryNodeServer<AnyNic> {
    /// Serves memory node `opts.id` of the store `opts.store` on `node`
    /// (built with the meta server and registered: peers connect to it by
    /// a meta lookup). Node 0 formats the table and joins; the others wait
    /// for node 0 (at most `opts.wait`) and join.
    ///
    /// # Errors
    /// [`DeployError::NodeZeroMissing`], [`DeployError::NodeCount`],
    /// [`DeployError::DuplicateId`], [`DeployError::EarlierTable`] (node 0
    /// beside live members), [`DeployError::Meta`] (the meta server
    /// unreachable), [`DeployError::Store`] (a bad table or region), and
    /// [`DeployError::Join`].
    pub fn deploy(
        node: &Node,
        opts: &MemoryNodeOptions,
    ) -> Result<DeployedMemoryNode, DeployError> {
        let store = opts.store.as_str();
        check_membership(opts)?;
        let mut table = opts.table;
        let mut zero_info = None;
        if opts.id > 0 {
            let start = Instant::now();
            loop {
                if let Some(list) = members(&opts.meta_addr, store)? {
                    if let Some(zero) = list.iter().find(|i| i.id == 0) {
                        if zero.nodes != opts.nodes {
                            return Err(DeployError::NodeCount {
                                store: store.to_string(),
                                ours: opts.nodes,
                                theirs: zero.nodes,
                            });
                        }
                        // A node 0 of an older build names no table: it
                        // kept every initial subtable, as a table of one
                        // initial subtable does.
                        table = zero.table.unwrap_or(TableConfig {
                            initial_global_depth: 0,
                            ..table
                        });
                        zero_info = Some(*zero);
                        break;
                    }
                }
                if start.elapsed() >= opts.wait {
                    return Err(DeployError::NodeZeroMissing {
                        store: store.to_string(),
                        waited: start.elapsed(),
                    });
                }
                std::thread::sleep(POLL);
            }
        }
        let (subtables, need) = table.share(opts.id, opts.nodes)?;
        if need > opts.bytes {
            return Err(DeployError::RegionTooSmall {
                store: store.to_string(),
                id: opts.id,
                subtables,
                need_mib: need.div_ceil(1 << 20),
                have_mib: opts.bytes >> 20,
            });
        }
        let server = MemoryNodeServer::start(node, opts.id, opts.bytes, &table, opts.nodes)?;
        server.set_grant_lease(opts.grant_lease);
        let info = server.info();
        let (zero, predecessor) = match zero_info {
            Some(zero) => (zero.incarnation, record_in_table(node, &zero, &info)?),
            None => (info.incarnation, None),
        };
        let joined = node.store_keep_joined(store, u16::from(opts.id), &info.encode(), opts.lease);
        if let (Err(_), Some(zero_info)) = (&joined, zero_info) {
            // Not a member after all: the table forgets this process
            // (best effort), so that a node started later at the id is
            // not taken for the successor of one that held data.
            if predecessor.is_none() {
                let _ = cas_member_slot(node, &zero_info, opts.id, info.incarnation, 0);
            }
        }
        let lease = joined.map_err(|source| match source {
            krcore::Error::Engine(EngineError::MetaRefused {
                code: ErrorCode::MemberExists,
                ..
            }) => {
                let holder = members(&opts.meta_addr, store)
                    .ok()
                    .flatten()
                    .and_then(|l| l.into_iter().find(|i| i.id == opts.id))
                    .map_or(Gid([0; 16]), |i| i.gid);
                DeployError::DuplicateId {
                    store: store.to_string(),
                    id: opts.id,
                    holder,
                }
            }
            source => DeployError::Join {
                store: store.to_string(),
                source: Box::new(source),
            },
        })?;
        Ok(DeployedMemoryNode {
            info,
            store: store.to_string(),
            meta_addr: opts.meta_addr.clone(),
            zero,
            predecessor,
            lease: Some(lease),
            serving: Some(server.spawn(opts.idle)),
            node: node.clone(),
        })
    }
}

impl DeployedMemoryNode {
    /// The node's record (what clients read from the membership).
    pub fn info(&self) -> NodeInfo {
        self.info
    }

    /// The store's name.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The node it serves on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The incarnation of the process that served this id in the table
    /// before this one (it died and its data is lost: clients refuse the
    /// store with [`crate::Error::MemberReplaced`]), if one did.
    pub fn predecessor(&self) -> Option<u64> {
        self.predecessor
    }

    /// Whether this node may go on serving the store: its node 0 is still
    /// the process it joined beside. A membership that lapsed (the process
    /// stopped or starved past its lease) is renewed as a fresh one, and in
    /// the meantime a new node 0 may have formatted a new table (no member
    /// was live) whose directory names places in this node's region that
    /// hold the old table's data. Clients refuse such a node (it did not
    /// record itself in the new table, [`crate::Error::MemberNotInTable`]),
    /// and it keeps the id from a node that could serve it: a program
    /// calls this every few seconds and leaves on an error, as
    /// `race-memnode` does. A meta server that does not answer, or a store
    /// without a node 0 for now (a meta server restarted: the members
    /// join again), is no reason to leave.
    ///
    /// # Errors
    /// [`DeployError::TableReplaced`].
    pub fn check_standing(&self) -> Result<(), DeployError> {
        let Ok(Some(list)) = members(&self.meta_addr, &self.store) else {
            return Ok(());
        };
        match list.iter().find(|i| i.id == 0) {
            Some(zero) if zero.incarnation != self.zero && zero.incarnation != 0 => {
                Err(DeployError::TableReplaced {
                    store: self.store.clone(),
                    id: self.info.id,
                    laid_out_for: self.zero,
                    now: zero.incarnation,
                })
            }
            _ => Ok(()),
        }
    }

    /// The allocation port's receive slots (how many clients have a
    /// request out at once without waiting;
    /// [`MemoryNodeServer::alloc_port_slots`]). `None` once it stopped
    /// serving, or on a node attached to `krcored`.
    pub fn alloc_port_slots(&self) -> Option<u32> {
        self.serving
            .as_ref()
            .and_then(MemoryNodeHandle::alloc_port_slots)
    }

    /// Usage figures: heap handed out, and the blocks clients gave back
    /// ([`crate::pool`]). `None` once it stopped serving.
    pub fn stats(&self) -> Option<crate::memory::NodeStats> {
        self.serving.as_ref().map(MemoryNodeHandle::stats)
    }

    /// Leaves the store and removes the node's meta entry, then stops
    /// serving. Clients that still hold the node's address get typed errors
    /// (the node is gone).
    ///
    /// # Errors
    /// The first failure of the leave ([`DeployError::Leave`]) or the
    /// deregistration (the rest is still done).
    pub fn shutdown(mut self) -> Result<(), DeployError> {
        let store = self.store.clone();
        let left = match self.lease.take() {
            Some(l) => l.leave().map_err(|source| DeployError::Leave {
                store,
                source: Box::new(source),
            }),
            None => Ok(()),
        };
        let deregistered = self.node.deregister().map_err(DeployError::from);
        if let Some(s) = self.serving.take() {
            s.stop();
        }
        left.and(deregistered)
    }
}

/// Memory node `info.id`'s slot in the table's members (node 0's
/// [`MEMBERS_OFFSET`]).
fn member_slot(id: u8) -> Result<RemotePtr, crate::Error> {
    Ok(RemotePtr::new(0, MEMBERS_OFFSET + 8 * u64::from(id))?)
}

/// Records memory node `info` in node 0's table (a CAS of its slot from
/// 0), before it joins the store: clients take a member for the table's
/// only when the table names it ([`check_members`]). A slot that names
/// another process is left as it is and returned: this node's predecessor
/// at the id served the table, and its data there is lost; clients are
/// told so ([`crate::Error::MemberReplaced`]) when they meet this node.
fn record_in_table(
    node: &Node,
    zero: &NodeInfo,
    info: &NodeInfo,
) -> Result<Option<u64>, DeployError> {
    match cas_member_slot(node, zero, info.id, 0, info.incarnation)? {
        0 => Ok(None),
        old if old == info.incarnation => Ok(None),
        old => Ok(Some(old)),
    }
}

/// CAS of memory node `id`'s slot in node 0's table from `expect` to
/// `new`; the value it held.
fn cas_member_slot(
    node: &Node,
    zero: &NodeInfo,
    id: u8,
    expect: u64,
    new: u64,
) -> Result<u64, DeployError> {
    use crate::remote::{OpResult, RemoteOp, Transport};
    let mut t =
        VqpTransport::connect(node, std::slice::from_ref(zero)).map_err(crate::Error::from)?;
    let r = t
        .execute(&[RemoteOp::Cas {
            ptr: member_slot(id)?,
            expect,
            new,
        }])
        .map_err(crate::Error::from)?;
    match r.first() {
        Some(OpResult::Cas { old }) => Ok(*old),
        _ => Err(crate::Error::from(TransportError::BadResponse {
            reason: "expected a CAS result",
        })
        .into()),
    }
}

/// Checks that every memory node in `infos` is the process the table
/// recorded at its id (node 0's members, [`MEMBERS_OFFSET`]: node 0
/// records itself when it formats, the others before they join). A
/// region lives as long as its process: a node that restarted serves an
/// empty region, and a client that took it for its predecessor would find
/// the keys whose blocks were there missing, or the subtables there
/// empty; a node the table does not name laid out its part for another
/// table (its membership lapsed while node 0 was replaced) and holds that
/// table's data where this one's directory points.
///
/// # Errors
/// [`crate::Error::MemberReplaced`], [`crate::Error::MemberNotInTable`];
/// transport errors.
fn check_members<T: crate::remote::Transport>(
    t: &mut T,
    infos: &[NodeInfo],
) -> Result<(), crate::Error> {
    use crate::remote::{OpResult, RemoteOp};
    if infos.iter().any(|i| i.incarnation == 0) {
        // A node built before incarnations: nothing to compare.
        return Ok(());
    }
    let read = t.execute(&[RemoteOp::Read {
        ptr: member_slot(0)?,
        len: 8 * infos.len() as u32,
    }])?;
    let Some(bytes) = read.first().and_then(OpResult::read_bytes) else {
        return Err(crate::remote::TransportError::BadResponse {
            reason: "expected a READ result",
        }
        .into());
    };
    for info in infos {
        let at = 8 * usize::from(info.id);
        let recorded = krcore_nic::le::read_u64(bytes, at);
        if recorded == 0 {
            return Err(crate::Error::MemberNotInTable {
                id: info.id,
                found: info.incarnation,
            });
        }
        if recorded != info.incarnation {
            return Err(crate::Error::MemberReplaced {
                id: info.id,
                recorded,
                found: info.incarnation,
            });
        }
    }
    Ok(())
}

/// `list` as the complete node list `0..n` (`n` from node 0's record).
fn complete(store: &str, list: &[NodeInfo]) -> Result<Vec<NodeInfo>, DeployError> {
    let Some(nodes) = list.iter().find(|i| i.id == 0).map(|i| i.nodes) else {
        return Err(DeployError::Incomplete {
            store: store.to_string(),
            nodes: 0,
            missing: vec![0],
        });
    };
    let mut infos = Vec::with_capacity(usize::from(nodes));
    let mut missing = Vec::new();
    for id in 0..nodes {
        match list.iter().find(|i| i.id == id) {
            Some(i) if i.nodes == nodes => infos.push(*i),
            Some(i) => {
                return Err(DeployError::NodeCount {
                    store: store.to_string(),
                    ours: i.nodes,
                    theirs: nodes,
                })
            }
            None => missing.push(id),
        }
    }
    if !missing.is_empty() {
        return Err(DeployError::Incomplete {
            store: store.to_string(),
            nodes,
            missing,
        });
    }
    Ok(infos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ClusterConfig, LocalCluster};

    fn info(id: u8, incarnation: u64) -> NodeInfo {
        NodeInfo {
            id,
            nodes: 2,
            gid: Gid([id; 16]),
            base: 0,
            len: 1 << 20,
            rkey: 1,
            alloc_port: crate::rdma::ALLOC_PORT,
            features: 0,
            incarnation,
            table: None,
        }
    }

    #[test]
    fn clients_take_only_the_members_the_table_names() {
        let cluster = LocalCluster::new(ClusterConfig {
            nodes: 2,
            node_bytes: 4 << 20,
            ..ClusterConfig::default()
        })
        .unwrap();
        let zero = cluster.node(0).unwrap();
        let record = |id: u8, inc: u64| {
            zero.write(MEMBERS_OFFSET + 8 * u64::from(id), &inc.to_le_bytes())
                .unwrap();
        };
        let mut t = cluster.transport();
        let infos = [info(0, 0xA0), info(1, 0xB1)];
        // Node 0 recorded itself; node 1 did not (it laid out its part for
        // another table): refused, and nothing is recorded for it.
        record(0, 0xA0);
        match check_members(&mut t, &infos) {
            Err(crate::Error::MemberNotInTable { id: 1, found: 0xB1 }) => {}
            other => panic!("expected MemberNotInTable for node 1, got {other:?}"),
        }
        assert_eq!(zero.read(MEMBERS_OFFSET + 8, 8).unwrap(), vec![0; 8]);
        // Both recorded: taken.
        record(1, 0xB1);
        check_members(&mut t, &infos).unwrap();
        // Another process at id 1 than the one recorded: it restarted.
        match check_members(&mut t, &[info(0, 0xA0), info(1, 0xB2)]) {
            Err(crate::Error::MemberReplaced {
                id: 1,
                recorded: 0xB1,
                found: 0xB2,
            }) => {}
            other => panic!("expected MemberReplaced for node 1, got {other:?}"),
        }
        // Nodes built before incarnations: nothing to compare.
        check_members(&mut t, &[info(0, 0), info(1, 0)]).unwrap();
    }
}
