//! # krcore-meta: the KRCore meta server
//!
//! KRCore turns "connect to a node" into a metadata lookup: a DC initiator
//! reaches any node given its `(GID, dct_num, dc_key)`. The meta server holds
//! that metadata for every node in a table that clients read with ONE one-sided
//! READ (no server CPU); nodes register, renew and deregister with two-sided
//! messages (the only work of the server's CPU).
//!
//! This crate holds what every host and client of the table shares:
//! - the pure layer (byte layouts, message formats, the table registry), which
//!   does no I/O and reads no clock;
//! - around it, generic over the NIC provider: [`client::lookup_once`] (one
//!   READ of a bucket), [`bootstrap`] (how clients find a server: a sim
//!   fabric name or TCP), [`host::LocalMetaHost`] (the table MR behind a DCT of
//!   its own, registrations by local calls: test fixtures and benches), and
//!   [`ud`] (a UD endpoint: the RC fallback's first handshake uses it).
//!
//! ```text
//! client node                                         meta node (an engine)
//!   Engine::meta_register/.. --- message ----->  META_PORT: MsgMetaHost
//!                            <--- reply -------   MetaTable::handle -> Ok / Err
//!                                                 (SeqlockWrite -> MrTable stores)
//!   lookup: READ bucket_of(gid) via DCI <-------  table MR behind the DCT (no CPU)
//!   table::find_in_bucket(bytes, gid) -> entry | None | Torn (retry) | Corrupt
//!   bootstrap: sim fabric name "krcore-meta", or TCP -> BootstrapRepr
//!   Engine::store_join/leave --- message --->  META_PORT: StoreRegistry
//!   fetch_store_tcp(addr, "s") --- TCP ----->  StoreList -> StoreMembers
//! ```
//!
//! ## The server
//!
//! The server deployments run is `krcore_kmod::MsgMetaHost`: the table
//! hosted by an engine, requests as two-sided messages on the engine's
//! reserved port `krcore_kmod::META_PORT` (the same DCT/SRQ receive
//! protocol as every message: the sender's VQP id in the immediate,
//! credits, replies), sent by `Engine::meta_register`/`meta_renew`/
//! `meta_deregister`; in RC fallback mode the same over RC pairs. It lives
//! in `krcore-kmod` because messaging does (this crate does not depend on
//! the engine; the engine depends on it for the layout), and so does the
//! `krcore-meta` binary (in `krcore-cli`). Requests are handled
//! by [`MetaTable::handle`](registry::MetaTable::handle) here, in the format
//! of [`wire`].
//!
//! ## Modules
//! - [`entry`]: the 64-byte entry ([`entry::EntryView`], [`entry::EntryRepr`]).
//! - [`table`]: geometry and hashing, the reader's [`table::find_in_bucket`],
//!   [`table::TableMemory`] and the seqlock write [`table::SeqlockWrite`].
//! - [`registry`]: [`registry::MetaTable`], register/renew/deregister/sweep.
//! - [`stores`]: [`stores::StoreRegistry`], the membership of named stores
//!   (join/leave/list/sweep), kept beside the table; clients list a store
//!   over TCP ([`bootstrap::fetch_store_tcp`]).
//! - [`wire`]: two-sided messages ([`wire::Packet`], [`wire::Repr`]).
//! - [`MetaTable::handle`](registry::MetaTable::handle): bytes in, reply out.
//! - [`host`]: [`host::LocalMetaHost`] (table + DCT, local registrations) and
//!   [`host::MetaConfig`].
//! - [`mr_table`]: [`mr_table::MrTable`], the table memory in a registered MR.
//! - [`client`]: [`client::MetaClient`], [`client::lookup_once`].
//! - [`bootstrap`]: publishing/finding a server (sim names, TCP).
//! - [`error`]: [`MetaError`], the host layer's error.
//!
//! ## Invariants
//! - Everything on the wire or in the table is little-endian at fixed offsets
//!   (see each module's layout table); parsing never panics on any bytes.
//! - A table entry is written only by the server, as ten ordered 8-byte stores
//!   (version odd at both ends, body, checksum word, version even at both
//!   ends). A reader accepts an entry only if both version copies are equal
//!   and even and the checksum (which covers the version) matches, so a READ
//!   racing a write yields the old value, the new value, or a retryable error.
//! - A GID lives only in its bucket; one READ of the bucket finds it.
//! - Epochs only grow, table-wide: every (re-)registration gets a new one.
//! - Layout changes bump [`LAYOUT_VERSION`]; message format changes bump
//!   [`wire::WIRE_VERSION`].
//!
//! ## Thread safety
//! [`registry::MetaTable`] is a single-writer state machine (`&mut self`); the
//! host serialises requests and sweeps. Readers never touch it: they READ the
//! table memory, which the host's [`table::TableMemory`] writes with atomic
//! stores. [`host::LocalMetaHost`] is `Send`; its table changes take `&mut`.
//!
//! ## Cleanup
//! Dropping a server releases its NIC objects (clients' READs then fail with
//! an error completion) and removes its sim publications; a
//! [`bootstrap::TcpBootstrap`] stops and joins its thread when dropped.
//!
//! ## Quick start
//! ```
//! use krcore_meta::registry::MetaTable;
//! use krcore_meta::table::{find_in_bucket, Geometry};
//! use krcore_nic::{DcTarget, Gid};
//!
//! let geometry = Geometry::with_buckets(1024).unwrap();
//! let mut table = MetaTable::with_vec(geometry);
//! let node = DcTarget { gid: Gid([7; 16]), dct_num: 42, dc_key: 0xdc };
//! let lease = table.register(node, 0, 10_000, /* now_ms */ 0).unwrap();
//!
//! // A client READs bucket_len() bytes at bucket_offset(bucket_of(gid)).
//! let bucket = &table.memory()[geometry.bucket_range(geometry.bucket_of(&node.gid))];
//! let entry = find_in_bucket(bucket, &node.gid).unwrap().unwrap();
//! assert_eq!((entry.dc_target(), entry.epoch), (node, lease.epoch));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod bootstrap;
pub mod client;
pub mod entry;
pub mod error;
pub mod host;
mod le;
pub mod mr_table;
pub mod registry;
mod requests;
pub mod stores;
pub mod table;
pub mod ud;
pub mod wire;

pub use client::{lookup_once, MetaClient};
pub use error::{MetaError, MetaResult};
pub use host::{LocalMetaHost, MetaConfig};

/// Version of the table layout (entry format, bucket hash and its seed,
/// checksum function, bucket placement). A client refuses a table whose
/// bootstrap reports another version.
pub const LAYOUT_VERSION: u16 = 1;

/// Any error of this crate, for hosts that handle them together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An entry's bytes.
    #[error(transparent)]
    Entry(#[from] entry::EntryError),
    /// A table geometry.
    #[error(transparent)]
    Geometry(#[from] table::GeometryError),
    /// A bucket lookup.
    #[error(transparent)]
    Lookup(#[from] table::LookupError),
    /// A table operation.
    #[error(transparent)]
    Table(#[from] registry::TableError),
    /// A message's bytes.
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// A bootstrap reply's table description.
    #[error(transparent)]
    Bootstrap(#[from] wire::BootstrapError),
    /// A store membership operation.
    #[error(transparent)]
    Store(#[from] stores::StoreError),
    /// The host layer (server, RPC client, bootstrap).
    #[error(transparent)]
    Host(#[from] error::MetaError),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
