//! The YCSB driver behind `krcore-ycsb`: backends ([`KvClient`]), the load
//! and run phases over client threads, and the progress display.
//!
//! A backend hands each client thread its own [`KvClient`] (a connection, a
//! VQP set, or a handle to an in-process map); the driver never shares one
//! client between threads, so backends need no locking of their own beyond
//! what their store needs.

mod batched;
mod deployed;
mod map;
pub mod mp;
mod phase;
mod race;
mod redis;
mod run;
pub mod verify;

pub use deployed::{DeployedTarget, StoreBackend};
pub use map::MapBackend;
pub use race::RaceBackend;
pub use redis::{RedisBackend, RedisError};
pub use run::{run_load, run_phase, sized, Gate, PhaseError, PhaseResult, RunOptions};

/// Why a backend operation failed (the driver records it as an `ERROR`
/// return, like YCSB's `Status.ERROR`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The store refused or failed the operation.
    #[error("{backend}: {message}")]
    Store {
        backend: &'static str,
        message: String,
    },
    /// The backend could not be set up.
    #[error("{backend} setup: {message}")]
    Setup {
        backend: &'static str,
        message: String,
    },
}

/// What a read or update found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The key existed.
    Yes,
    /// The key did not exist (YCSB's `NOT_FOUND`).
    No,
}

/// One operation of a batch ([`KvClient::batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp<'a> {
    /// [`KvClient::read`] this key.
    Read(&'a [u8]),
    /// [`KvClient::insert`] (key, value).
    Insert(&'a [u8], &'a [u8]),
    /// [`KvClient::update`] (key, value).
    Update(&'a [u8], &'a [u8]),
}

/// One client thread's connection to a store.
pub trait KvClient: Send {
    /// Reads `key` into `out` (cleared first).
    fn read(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Found, BackendError>;
    /// Inserts `key` (an upsert, as YCSB's inserts are for every binding).
    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), BackendError>;
    /// Replaces the value of an existing `key`; `Found::No` when absent.
    fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Found, BackendError>;
    /// Attempts the store restarted so far (failed CAS, stale cache, ...),
    /// cumulative; `None` for a backend that does not count them. The
    /// driver reports the difference across each write as `Retries`.
    fn retries(&self) -> Option<u64> {
        None
    }
    /// Runs `ops` with all of them in flight where the store can (the
    /// driver's `--batch`), one result per operation into `out` (cleared
    /// first), as the single calls return them; operations on one key take
    /// effect in submission order. The default runs them one by one.
    fn batch(&mut self, ops: &[BatchOp<'_>], out: &mut Vec<Result<Found, BackendError>>) {
        batched::one_by_one(self, ops, out);
    }
    /// Ends the client (after the phase's time is taken): a store that
    /// lends memory to its clients gets it back. The default does nothing.
    fn close(self: Box<Self>) -> Closed {
        Closed::default()
    }
}

/// What closing clients gave back to the store ([`KvClient::close`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// Bytes the store took back.
    pub returned_bytes: u64,
    /// Bytes the clients still held (leaked once they are gone).
    pub kept_bytes: u64,
    /// Bytes the clients gave back while they ran (free blocks past what
    /// a client keeps: race-store's trimming).
    pub trimmed_bytes: u64,
    /// The first failure.
    pub error: Option<String>,
}

impl Closed {
    /// Adds another client's.
    pub fn add(&mut self, other: Closed) {
        self.returned_bytes += other.returned_bytes;
        self.kept_bytes += other.kept_bytes;
        self.trimmed_bytes += other.trimmed_bytes;
        if self.error.is_none() {
            self.error = other.error;
        }
    }

    /// A comment line for the report (`None` when nothing was lent).
    pub fn line(&self) -> Option<String> {
        let lent = self.returned_bytes + self.kept_bytes + self.trimmed_bytes;
        if lent == 0 && self.error.is_none() {
            return None;
        }
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut l = format!(
            "# clients closed: gave back {:.1} MiB to the memory nodes, kept {:.1} MiB",
            mib(self.returned_bytes),
            mib(self.kept_bytes)
        );
        if self.trimmed_bytes > 0 {
            l.push_str(&format!(
                " ({:.1} MiB more given back while they ran)",
                mib(self.trimmed_bytes)
            ));
        }
        if let Some(e) = &self.error {
            l.push_str(&format!(" (first failure: {e})"));
        }
        Some(l)
    }
}

/// A store the driver can run against.
pub trait Backend: Send + Sync {
    /// Short name (`race`, `dashmap`, `redis`).
    fn name(&self) -> &'static str;
    /// A client for one thread.
    fn client(&self) -> Result<Box<dyn KvClient>, BackendError>;
    /// A label every figure must carry (e.g. "modeled (cx4)"), if any.
    fn label(&self) -> Option<String> {
        None
    }
    /// Bytes each memory node of an embedded store has handed out (its
    /// heap's end: table, subtables and KV blocks), by node id; empty for
    /// backends without memory nodes.
    fn memory_node_usage(&self) -> Vec<u64> {
        Vec::new()
    }
}

/// The line saying how much each memory node handed out
/// ([`Backend::memory_node_usage`]); `None` for no nodes.
pub fn memory_node_line(used: &[u64]) -> Option<String> {
    if used.is_empty() {
        return None;
    }
    let mib: Vec<String> = used
        .iter()
        .map(|&b| format!("{:.1}", b as f64 / f64::from(1u32 << 20)))
        .collect();
    Some(format!(
        "# memory nodes: handed out {} MiB (nodes 0..{})",
        mib.join(", "),
        used.len()
    ))
}
