//! # The node daemon: one engine per node for every process
//!
//! KRCore's connect is a lookup because its kernel module built the DC
//! pool when the machine booted, and every process on the machine uses
//! that one pool, one DCCache and one registration with the meta server.
//! This module hosts the engine that way in user space: [`Daemon`] serves
//! one [`crate::Engine`] on a unix socket (the `krcored` binary runs it),
//! and processes [`Attached::attach`] to it. An attached process creates
//! no QP: its VQPs are the daemon's, its connects hit the node-wide
//! DCCache, its memory is registered once by the daemon.
//!
//! ```text
//!  process                          krcored
//!  Attached ── unix socket ──────── control thread (per process)
//!    AttachedMr  ◄─ memfd/segment ─  alloc_shared_mr + register
//!    AttachedVqp ◄─ ring memfd ────  data thread: SQ -> post_send,
//!      post: SQEs, tail, wait head     poll -> CQ, for every ring
//!      poll: CQEs                    Engine (DCI pool, DCCache, meta)
//! ```
//!
//! - **Control**: framed messages ([`wire`]); shared memory is handed over
//!   as descriptors on the replies.
//! - **Data path**: one ring file per VQP (layout in `ring`): the
//!   process writes submission entries and publishes its tail; the
//!   daemon's data thread posts them as one doorbell, writes the verdict
//!   and advances the head (a post is synchronous, so it fails as an
//!   in-process post does, typed); completions come back in the same
//!   file. No system call per operation while the data thread is busy;
//!   after `DaemonConfig::idle_spin` without work it raises the idle flag
//!   in each process's page and sleeps on an eventfd, which a process
//!   that posts then writes (one system call, only then).
//! - **Memory**: regions are allocated by the daemon's NIC as shareable
//!   files (`krcore_nic::Nic::alloc_shared_mr`: the segment file on a sim
//!   directory fabric, a memfd on verbs) and mapped by the process, so
//!   one-sided data lands in the process's memory with no copy.
//! - **Trust**: every SGE is checked against the posting process's own
//!   regions; remote keys need grants (the pre-check cannot be switched
//!   off), and a grant naming this node is refused unless the key is one
//!   of the process's own regions (not another attached process's regions
//!   or leases, nor the daemon engine's own buffers).
//!   A process that dies has its VQPs and memory released when its socket
//!   closes; a daemon that dies makes its processes' calls fail with
//!   [`DaemonError::Gone`] within milliseconds (no hang), and one that is
//!   alive but does not answer (stuck, stopped) fails a control call with
//!   [`DaemonError::Unanswered`] after [`CONTROL_TIMEOUT`]
//!   ([`Attached::attach_timeout`] sets another bound) and a doorbell with
//!   [`DaemonError::Timeout`] after [`DOORBELL_TIMEOUT`].
//!
//! - **Messaging**: a process's endpoints ([`Attached::endpoint`]) and
//!   ports ([`Attached::bind`]) live in the daemon's engine; each push,
//!   pop and reply is one control call, served on the process's own
//!   control thread (a push waiting for a credit stalls no other process;
//!   a waiting pop is made of calls of at most 20 ms, so the process's
//!   other threads get the connection between them). A process sends
//!   messages of at most [`wire::MAX_MSG_BYTES`] and receives up to
//!   [`wire::MAX_RECV_BYTES`] (what a peer's engine sends by default).
//!   Ports are the node's: one process holds a port at a time, and it is
//!   unbound when the process goes. Failures come back as the in-process
//!   endpoint's and port's [`crate::MsgError`]s (`Refused`, `TooLarge`,
//!   `Timeout`, `Lost`, `ReplyLost`, `PortInUse`, ...); the daemon's own as
//!   [`crate::MsgError::Daemon`]. Meant for requests (a store's block
//!   allocation, a memory node's allocator), not bulk data.
//!
//! - **Upgrades**: the daemon's engine upgrades by threshold
//!   (`EngineConfig::upgrade_after`), and on a process's hint
//!   ([`AttachedVqp::upgrade`]), node-wide: the RC pair built for one
//!   process's VQP serves every process's VQP to that target (one pair,
//!   no second handshake).
//!
//! - **Leases**: [`AttachedMr::lease`] has the daemon's engine lease a
//!   range of the process's region (a key of the NIC's own, dead at the
//!   NIC once revoked or expired), at most
//!   [`DaemonConfig::max_leases`] live per process; a region freed while
//!   leased stays registered until its leases end, and a process that
//!   goes has all its leases revoked.
//!
//! - **Store membership**: [`Attached::store_join`] joins a named store
//!   through the daemon's engine (a memory node attached to the daemon;
//!   the member's GID is the node's). The daemon refuses a member id
//!   another of its processes holds, lets a process leave only what it
//!   joined, and leaves what a process joined when the process goes.
//!
//! Through the daemon a WR is a READ, WRITE, CAS or FAA to the VQP's
//! target with up to four SGEs or (a WRITE) up to 64 bytes of inline data,
//! as in-process. Fork is not carried (a worker of an attached process
//! would share its control connection): the SDK refuses it, typed.

mod client;
mod client_msg;
mod client_store;
mod error;
mod host;
mod host_data;
mod host_lease;
mod host_msg;
mod host_state;
mod host_store;
mod ring;
mod sock;
pub mod wire;

pub use client::{
    Attached, AttachedLease, AttachedMr, AttachedVqp, CqWait, CONTROL_TIMEOUT, DOORBELL_TIMEOUT,
};
pub use client_msg::{AttachedEndpoint, AttachedPort, Received};
pub use error::DaemonError;
pub use host::{Daemon, StartError, MAX_DATA_THREADS};
pub use host_state::{DaemonConfig, DaemonStats};
pub use ring::PostCode;
pub use ring::{
    decode_cqe_bytes, decode_sqe_bytes, encode_cqe_bytes, encode_sqe_bytes, sqe_continues,
    sqe_slots, DecodeError, EncodeError, CQE_BYTES, CQ_CAP, RING_BYTES, SQE_BYTES, SQ_CAP,
};
pub use wire::{NodeStats, PROTOCOL_VERSION};
