//! # race-store: RACE hashing over disaggregated memory
//!
//! After "One-sided RDMA-Conscious Extendible Hashing for Disaggregated
//! Memory" (RACE, USENIX ATC'21): a hash table that clients read and modify
//! with one-sided RDMA only (READ, WRITE, CAS), so memory nodes spend no CPU
//! on the data path.
//!
//! The crate has three layers:
//!
//! * the **pure layer** ([`hash`], [`layout`]): byte layouts, hashing and
//!   table geometry, everything that reads or writes remote bytes, with no
//!   I/O and no clock;
//! * the **client engine** ([`client`]): the RACE protocol (search, insert
//!   of a tentative copy committed once settled, update, delete,
//!   read-modify-write, client-driven resizing under a leased lock, KV
//!   block reclamation). It does no I/O and
//!   reads no clock: it talks to memory nodes through a small [`remote::Transport`]
//!   trait (one call = one doorbell = one round trip) and gets time from a
//!   caller-provided [`clock::Clock`];
//! * **transports and hosts**: [`memory`] holds in-process memory nodes and
//!   their [`memory::LocalTransport`]; [`remote::FaultInjector`] wraps any
//!   transport to make its client die at a chosen doorbell. A transport over
//!   KRCore virtual QPs plugs in the same way.
//!
//! ```text
//! Client ──(RemoteOp batches: READ/WRITE/CAS/FAA)──> Transport ──> memory nodes
//!  │ │  + alloc_block (two-sided, coarse blocks)        ├─ LocalTransport (in process)
//!  │ │                                                  └─ FaultInjector<T>, ...
//!  │ └── Clock (now, backoff): SystemClock, ManualClock
//!  └──── pure layer: hash, layout (checked views)
//! ```
//!
//! The protocol, its invariants and its timing assumptions are written down
//! in [`client::protocol`].
//!
//! ## Modules
//! * [`client`]: [`Client`] and its configuration, statistics and table
//!   checker; [`client::protocol`] documents the protocol.
//! * [`remote`]: [`remote::RemoteOp`], [`remote::Transport`], round-trip
//!   counters, the fault injector.
//! * [`memory`]: [`memory::LocalCluster`] of in-process memory nodes, table
//!   bootstrap ([`memory::MemoryNode::format`]).
//! * [`pool`] and [`holders`]: a memory node's blocks given back, and its
//!   book of the clients holding its grants (leases, taking back).
//! * [`clock`]: [`clock::Clock`], [`clock::SystemClock`], [`clock::WallClock`]
//!   (one time base for client processes), [`clock::ManualClock`].
//! * [`hash`]: the two hash functions, fingerprint, directory index, bucket
//!   locations.
//! * [`layout`]: the remote structures, each a checked view:
//!   [`layout::slot`] (8 B slot word), [`layout::bucket`] (64 B bucket, 192 B
//!   group, 128 B combined bucket, insert choice), [`layout::subtable`]
//!   (geometry, suffixes, split plans), [`layout::dir_header`] (global depth
//!   and leased resize lock), [`layout::directory`] (entries, doubling,
//!   consistency), [`layout::kv`] (KV blocks with CRC), [`layout::table`]
//!   (superblock, split log, fixed locations on node 0).
//! * [`error`]: [`Error`] for table operations, [`LayoutError`] for the pure
//!   layer.
//!
//! ## Quick start
//! ```
//! use std::sync::Arc;
//! use race_store::clock::SystemClock;
//! use race_store::memory::{ClusterConfig, LocalCluster};
//! use race_store::{Client, ClientConfig, Error};
//!
//! # fn main() -> Result<(), Error> {
//! // Two memory nodes in this process; node 0 holds a fresh table.
//! let cluster = LocalCluster::new(ClusterConfig { nodes: 2, ..ClusterConfig::default() })?;
//! let clock = Arc::new(SystemClock::new());
//! // One client per thread; all share the table through the memory nodes.
//! let mut a = Client::open(cluster.transport(), clock.clone(), ClientConfig::default())?;
//! let mut b = Client::open(cluster.transport(), clock, ClientConfig::default())?;
//! a.insert(b"user:42", b"alice")?;
//! assert_eq!(b.get(b"user:42")?.as_deref(), Some(&b"alice"[..]));
//! assert_eq!(b.insert(b"user:42", b"bob"), Err(Error::KeyExists));
//! let before = b.stats().transport.round_trips;
//! b.get(b"user:42")?;
//! assert_eq!(b.stats().transport.round_trips - before, 2);
//! # Ok(()) }
//! ```
//!
//! The pure layer alone (what a client computes for one key):
//! ```
//! use race_store::hash::KeyHash;
//! use race_store::layout::bucket::{choose_insert_slot, CombinedBucket, COMBINED_SIZE};
//! use race_store::layout::slot::{RemotePtr, Slot};
//! use race_store::layout::subtable::SubtableGeometry;
//! use race_store::layout::kv;
//!
//! # fn main() -> Result<(), race_store::LayoutError> {
//! let geometry = SubtableGeometry::new(64)?;
//! let hash = KeyHash::of(b"user:42");
//! let [loc1, loc2] = hash.bucket_locs(geometry);
//! // READ 128 B at subtable base + these offsets (here: two empty buckets).
//! let (_off1, _off2) = (geometry.combined_offset(loc1)?, geometry.combined_offset(loc2)?);
//! let (b1, b2) = ([0u8; COMBINED_SIZE], [0u8; COMBINED_SIZE]);
//! let c1 = CombinedBucket::new_checked(&b1[..], loc1.side)?;
//! let c2 = CombinedBucket::new_checked(&b2[..], loc2.side)?;
//! let target = choose_insert_slot([&c1, &c2]).expect("empty buckets have room");
//!
//! // WRITE the KV block out of place, then CAS the empty slot to this word.
//! let block = kv::encode(b"user:42", b"hello")?;
//! let slot = Slot::for_block(hash.fingerprint(), block.len(), RemotePtr::new(0, 4096)?)?;
//! assert_eq!(slot.block_len(), 64);
//! assert_eq!(kv::decode_for_key(&block, b"user:42")?.value(), b"hello");
//! # let _ = target;
//! # Ok(()) }
//! ```
//!
//! ## Invariants
//! * Parsing never panics: every view is built by `new_checked` (length checked
//!   once, accessors infallible afterwards), every word type accepts any raw
//!   value and has a `validate`, and KV blocks are verified by length and CRC.
//!   Non-test code denies indexing, `unwrap`, `expect` and `panic!` (clippy).
//! * An occupied slot has a fingerprint in `1..=255` and a length in `1..=255`
//!   units of 64 B; the empty slot is the word 0; bit 0 marks a frozen slot
//!   (KV blocks are 64 B aligned).
//! * A subtable of local depth `d` and suffix `s` holds exactly the keys whose
//!   directory hash ends in `s`; every one of its bucket headers says so, and
//!   the `2^(g-d)` directory entries `s + k * 2^d` point to it.
//! * All integers in remote memory are little-endian.
//! * The client's invariants (copy-on-split, frozen slots, reclamation) are
//!   listed in [`client::protocol`].
//!
//! ## Thread safety
//! The pure layer is plain data and pure functions: `Send + Sync`, no global
//! state. A [`Client`] is `Send` (move it to a thread) but used through
//! `&mut self`: one client per thread. Clients coordinate only through the
//! memory nodes; a [`memory::LocalCluster`] and its transports may be used
//! from any number of threads.
//!
//! ## Cleanup
//! [`Client::close`] gives the memory a client took from the nodes back to
//! them ([`pool`]), after the grace period of its last retired blocks;
//! dropping a client gives back only what is free at once. Of a client
//! that crashed, each memory node takes back what it never wrote of its
//! grants once its grant lease ends ([`holders`]); what it wrote and had
//! not linked, or had unlinked, stays allocated. A resize lock it held is
//! broken by another client when the lock's lease expires.
//!
//! ## Tests
//! `tests/` holds model-based tests (threads against `HashMap` references),
//! a deterministic multi-client harness (`tests/common/sched.rs`: one remote
//! op per step, seeded), crash tests (a client dying at every doorbell of an
//! insert and of a split), round-trip assertions and the memory bound.
//! `tests/multiprocess.rs` runs clients as separate processes on a
//! `/dev/shm` fabric (a model check with concurrent splits, and clients
//! killed with SIGKILL mid-insert and while holding the resize lock).
//! `RACE_MODEL_OPS`, `RACE_SIM_SEEDS` and `RACE_MP_OPS` scale the randomized
//! ones. Benchmarks: `cargo bench -p krcore-benches --bench race_vs_map`
//! (against an in-process map); `examples/race_load.rs` is a fixed load for
//! profiling.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

pub mod client;
pub mod clock;
pub mod collection;
pub mod deploy;
pub mod dump;
pub mod error;
pub mod hash;
pub mod holders;
pub mod layout;
pub mod memory;
pub mod pool;
pub mod rdma;
pub mod remote;
mod sync;

#[cfg(test)]
mod prop_tests;

pub use client::{Client, ClientConfig, ConflictPolicy};
pub use error::{Error, LayoutError, Result};
