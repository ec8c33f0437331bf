//! # krcore: microsecond-scale RDMA connections, verbs-shaped
//!
//! The user API of KRCore-rs, after KRCore (USENIX ATC'22). A [`Node`] runs
//! the KRCore control plane ([`krcore_kmod::Engine`]) over one NIC port: a
//! pool of pre-initialized DC initiators shared by virtual QPs ([`Vqp`]). A
//! VQP's `connect` is a metadata lookup, not a 15.7 ms RC handshake: a hit in
//! the node's DCCache costs nothing; a miss costs ONE one-sided READ of the
//! meta server's table.
//!
//! ```text
//! krcore (this crate)   Node, Vqp, MemoryRegion, RemoteRegion, Request
//!   |                   verbs layer: post(&mut [SendWr]) = one doorbell, poll
//!   |                   Infinity-style layer: read/write/cas/faa -> Request
//! krcore-kmod           Engine: DCI pool, DCCache, pre-check, wr_id routing
//! krcore-nic            Nic trait: sim (default, no hardware), verbs (later)
//! ```
//!
//! # Quick start (runs on `sim:mem`, no RDMA hardware)
//!
//! ```
//! use krcore::{Access, Node, RemoteRegion, SendWr, Wc, WcStatus};
//!
//! // A memory node that also hosts the meta table, and a client that joins
//! // its fabric (both register themselves in the table).
//! let server = Node::builder().fabric("sim:mem").host_meta().build()?;
//! let client = Node::builder().join(&server).build()?;
//!
//! // The server shares a region; the token travels as plain data.
//! let region = server.alloc(4096, Access::ALL)?;
//! region.write(0, b"hello, rdma")?;
//! let json = serde_json::to_string(&region.token()).unwrap();
//! let token: RemoteRegion = serde_json::from_str(&json).unwrap();
//!
//! // High level: operations return a request token.
//! let vqp = client.connect(token.gid)?; // one READ of the meta table
//! let buf = client.alloc(64, Access::LOCAL_WRITE)?;
//! vqp.read(&buf, 0, &token, 0, 11)?.wait()?;
//! let mut got = [0u8; 11];
//! buf.read(0, &mut got)?;
//! assert_eq!(&got, b"hello, rdma");
//! let old = vqp.compare_and_swap(&token, 64, 0, 42)?.wait()?.old_value;
//! assert_eq!((old, region.load_u64(64)?), (Some(0), 42));
//! assert_eq!(vqp.fetch_add(&token, 64, 1)?.wait()?.old_value, Some(42));
//!
//! // Verbs level: a slice of WRs is one doorbell; completions carry your
//! // wr_ids. Out-of-grant WRs are typed rejections that never reach the NIC.
//! let mut wrs = [
//!     SendWr::write(1, buf.sge(0, 5)?, token.at(128)).signaled(false),
//!     SendWr::read(2, buf.sge(8, 5)?, token.at(128)),
//! ];
//! vqp.post(&mut wrs)?;
//! let mut wc = [Wc::default(); 4];
//! // Polls until a completion (a hand-written loop calls `vqp.idle`
//! // between empty polls: a pause in process; attached to `krcored`, a
//! // yield, then a sleep until the daemon completes a WR).
//! let n = vqp.poll_wait(&mut wc, std::time::Duration::from_secs(5))?;
//! assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 2, WcStatus::Success));
//! let bad = vqp.read(&buf, 0, &token, 4090, 8);
//! assert!(matches!(bad, Err(krcore::Error::OutOfRange { .. })));
//!
//! // A second VQP to the same node: a DCCache hit, no network, no QP.
//! let again = client.vqp()?; // may create a pool DCI (lazily, up to the cap)
//! let before = client.counters();
//! again.connect(server.gid())?;
//! let d = client.counters() - before;
//! assert_eq!((d.network_ops(), d.qps_created), (0, 0));
//! # Ok::<(), krcore::Error>(())
//! ```
//!
//! # Providers
//!
//! `sim` is the default: [`Node::builder`] opens a sim node (`sim:mem`, a
//! private in-process fabric, unless told otherwise). Any provider works
//! through [`Node::with_nic`].
//!
//! # Devices without DC (RC fallback mode)
//!
//! On a device without DC (Soft-RoCE, non-ConnectX NICs; in `sim`,
//! [`NodeBuilder::sim_config`] with `dc: false`) the engine runs in RC
//! fallback mode ([`Node::mode`], [`EngineStats::mode`]): a VQP's connect is
//! the same lookup, then the RC QP its node shares with the target (made
//! once by a handshake over UD, cached, LRU-evicted past
//! `EngineConfig::rc_cap`). The API does not change. Each node answers
//! handshakes from a thread of its own (the SDK's default; see
//! [`NodeBuilder::handshake_thread`]); [`NodeBuilder::host_meta`] hosts the
//! table on the node's engine in this mode too (READs and registration
//! messages over RC pairs with it). A cluster is all-DC or all-fallback.
//!
//! # Meta server
//!
//! A node reads the meta table at [`NodeBuilder::meta`]; for single-process
//! programs and tests, [`NodeBuilder::host_meta`] hosts the table on the
//! node's own engine ([`MetaHost`]: the same server the `krcore-meta` binary
//! runs) and [`NodeBuilder::join`] reads it. Nodes register by two-sided
//! messages to the server's reserved port and a thread of the node renews
//! the lease ([`NodeBuilder::register`], [`NodeBuilder::lease`],
//! [`Node::lease_stats`]); lookups are one-sided READs of the table.
//!
//! # Two-sided messaging
//!
//! [`Node::bind`] a port, [`Vqp::push`] to it, [`Port::pop`] and
//! [`Port::reply`]; credit-based flow control, zero-copy for large
//! messages (see [`messaging`]).
//!
//! # MR leases
//!
//! [`MemoryRegion::lease`] hands out a [`RemoteRegion`] with a remote key
//! of the lease's own and an expiry. The NIC enforces the lease: its key
//! covers only the leased range and access, and stops working when the
//! lease ends, by [`MemoryRegion::revoke`] (dead when the call returns) or
//! by expiry (the owner's engine deregisters the key itself, within a
//! wake-up of the expiry, with no message; see
//! [`krcore_kmod::Engine::lease_stats`]): a peer that posts it afterwards
//! gets `REM_ACCESS_ERR` ([`Error::Failed`]) whatever its software does.
//! A peer's pre-check also refuses an expired token before the NIC.
//! [`MemoryRegion::deregister`] refuses while leases are live; dropping a
//! leased region keeps it registered until its leases end.
//! ([`MemoryRegion::token`] hands out an unleased token under the region's
//! own key: no expiry, no revocation short of deregistering the region.)
//!
//! A VQP reaches only remote memory it knows a grant for: the request API
//! makes a token's grant known, [`Vqp::grant`] does so for WRs posted with
//! [`Vqp::post`], and a key no known grant covers is refused before the NIC
//! ([`Error::NotGranted`]). Raw verbs users who pass rkeys by hand opt out
//! per VQP ([`Vqp::set_ungranted`]) or per node (`ungranted = "allow"` in
//! the engine's configuration).

//! # What a node creates, and when
//!
//! Building a node that is not registered anywhere (a compute node given a
//! meta location, [`NodeBuilder::meta`]) creates no QP: its first VQP
//! creates the DCI it posts on (which also carries the meta lookups), and a
//! node that only issues one-sided operations needs nothing else. Its DCT
//! is created when it must be reachable ([`Node::local_target`], what
//! registering in a meta table calls; a region with remote access; the
//! first [`Node::bind`]), and the DC -> RC upgrade's handshake endpoint when
//! it registers as an upgrade target or upgrades first itself (see
//! [`krcore_kmod::Engine::start`]; [`EngineConfig::eager_start`] makes both
//! at start).
//!
//! # One engine per node (the node daemon)
//!
//! [`Node::attach`] (or [`NodeBuilder::daemon`]) attaches to the node
//! daemon, `krcored` (see `krcore_kmod::daemon`), instead of starting an
//! engine: the process opens no NIC and creates no QP; its VQPs are the
//! daemon's, their connects hit the node-wide DCCache, its regions are
//! shared memory the daemon registered. [`Vqp`] (verbs and requests) and
//! [`MemoryRegion`] work as in-process, and so does messaging (pushes,
//! replies, [`Node::bind`]: the port is bound in the daemon's engine, a
//! port of the node) and leases ([`MemoryRegion::lease`]: made and
//! enforced by the daemon's NIC) and the upgrade hint ([`Vqp::upgrade`]:
//! the pair is node-wide); what the daemon does not carry (fork, the
//! engine itself) is [`Error::Unsupported`], and failures through the
//! daemon are [`Error::Daemon`]. [`Node::daemon_stats`] reads the node's counters.
//!
//! # Worker processes (fork)
//!
//! On a directory fabric ([`krcore_nic::sim::SimFabric::open_dir`],
//! `sim:/dev/shm/NAME`), [`Node::fork`] starts a worker process that
//! inherits the initialized node (engine, warm DCCache, MRs) and posts at
//! once on DCIs the parent prepared for it: see [`Worker`] for what the
//! worker may and may not do. `sim:mem` is private to its process:
//! [`Error::Unsupported`].
//!
//! # Thread safety
//!
//! [`Node`], [`Vqp`] and [`MemoryRegion`] are `Send + Sync` and cheap to
//! clone. VQPs on different DCIs never contend; VQPs sharing a DCI serialize
//! their posts and polls on that DCI's lock only.
//!
//! # Errors
//!
//! Every fallible call returns [`Error`]: engine and VQP errors are typed
//! (`UnknownNode`, `MetaUnavailable`, pre-check `Rejected` with its reason,
//! ...), and a request that completed with an error status is
//! [`Error::Failed`].
//!
//! # Cleanup
//!
//! Dropping the last handle of a node, VQP or region releases it. A VQP
//! dropped with WRs in flight discards their completions.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod error;
mod fork;
mod memory;
pub mod messaging;
mod node;
mod raw;
mod store;
mod vqp;

pub use error::{DeregisterError, Error, Result};
pub use fork::Worker;
pub use krcore_kmod::daemon::{DaemonError, NodeStats};
pub use memory::{MemoryRegion, RemoteRegion};
pub use messaging::{Message, MsgError, Port, Sender};
pub use node::{MetaHost, Node, NodeBuilder, DEFAULT_LEASE};
pub use store::StoreMembership;
pub use vqp::{Completion, PollWait, Request, Vqp, REQUEST_WR_ID_BIT};

pub use krcore_kmod::{
    EngineConfig, EngineError, EngineMode, EngineStats, HandshakeFailure, LeaseError, LeaseId,
    MetaFailure, MetaLease, MetaLocation, Reason, Rejection, RemoteGrant, Ungranted, VqpError,
    VqpPath,
};
pub use krcore_meta::table::Geometry;
pub use krcore_nic::{
    sim, Access, Counters, DcTarget, Destination, Gid, InlineData, NicError, Payload, RemoteAddr,
    SendFlags, SendWr, SgList, Sge, Wc, WcOpcode, WcStatus, WrOp,
};
