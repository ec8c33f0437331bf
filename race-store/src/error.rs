//! The crate's two error types.
//!
//! * [`LayoutError`], of the pure layout layer: every check on bytes that
//!   came from remote memory, and every constructor with an out-of-range
//!   argument, fails with one instead of panicking. Variants carry the values
//!   that explain the failure.
//! * [`Error`], of the client and the memory nodes: what a table operation
//!   can fail with.

pub use crate::layout::error::{LayoutError, Result};
use crate::remote::TransportError;

/// Why a table operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `update` or `delete` of a key that is not in the table.
    #[error("key not found")]
    NotFound,
    /// `insert` of a key that is already in the table.
    #[error("key already exists")]
    KeyExists,
    /// The empty key is not allowed.
    #[error("empty key")]
    EmptyKey,
    /// The key does not fit in a KV block even with an empty value.
    #[error("key of {len} bytes exceeds the maximum {max}")]
    KeyTooLarge {
        /// The key length.
        len: usize,
        /// The largest key length.
        max: usize,
    },
    /// The value does not fit in one KV block with its key
    /// (see [`crate::layout::kv::max_value_len`]).
    #[error("value of {len} bytes exceeds the maximum {max} for this key")]
    ValueTooLarge {
        /// The value length.
        len: usize,
        /// The largest value length for this key.
        max: usize,
    },
    /// The memory nodes cannot provide what the operation needs: a KV block,
    /// a new subtable for a split, or a deeper directory. The table is left
    /// consistent: every other key stays readable and writable.
    #[error("out of memory: {what}")]
    OutOfMemory {
        /// What could not be allocated.
        what: &'static str,
    },
    /// The transport failed (a memory node is down, this client was
    /// disconnected, ...) before the operation could take effect: a read
    /// saw nothing, a write did not apply (a write that may have applied is
    /// [`Error::OutcomeUnknown`]).
    #[error("transport error")]
    Transport(#[from] TransportError),
    /// A write operation (`op`: insert, put, update, delete, rmw) failed on
    /// the transport after it sent the atomic that makes it visible: it may
    /// or may not have applied, as with any timeout. A `get` of the key
    /// tells which (once the memory node is reachable again); retrying the
    /// operation is safe for `put`, `update` to the same value and `delete`
    /// (an `insert` retried may then report [`Error::KeyExists`] for its own
    /// first attempt).
    #[error("{op}: outcome unknown (it may have applied): transport error")]
    OutcomeUnknown {
        /// The operation.
        op: &'static str,
        /// What failed.
        #[source]
        source: TransportError,
    },
    /// A memory node of a deployed store is another process than the one
    /// the table recorded at its id (see `crate::deploy`): it restarted,
    /// and the table's data on it (blocks, subtables) is lost.
    #[error(
        "memory node {id} is another process (incarnation {found:#x}) than the one this table \
         used ({recorded:#x}): it restarted and the table's data on it is lost; start the \
         store anew (every memory node)"
    )]
    MemberReplaced {
        /// The node id.
        id: u8,
        /// The incarnation the table recorded.
        recorded: u64,
        /// The incarnation serving the id now.
        found: u64,
    },
    /// A memory node of a deployed store that the table does not name (see
    /// `crate::deploy`): every member records itself in node 0's table
    /// before it joins, so this one laid out its part for another table
    /// (its membership lapsed while node 0 was replaced) or runs a
    /// race-store older than the table's node 0.
    #[error(
        "memory node {id} (incarnation {found:#x}) did not join this store's table: it laid out \
         its part for an earlier table (its membership lapsed while node 0 was replaced) or runs \
         an older race-store; stop it and start it anew"
    )]
    MemberNotInTable {
        /// The node id.
        id: u8,
        /// The incarnation serving the id.
        found: u64,
    },
    /// A remote structure that must be valid failed its checks.
    #[error("corrupt remote {what}")]
    Corrupt {
        /// The structure.
        what: &'static str,
        /// The check that failed.
        #[source]
        source: LayoutError,
    },
    /// The memory nodes do not hold a table this client can use, or the
    /// configuration is invalid.
    #[error("bad table or configuration: {reason}")]
    BadTable {
        /// What is wrong.
        reason: &'static str,
    },
    /// The operation retried too often (livelock guard,
    /// [`crate::client::ClientConfig::max_attempts`]).
    #[error("operation gave up after {attempts} attempts")]
    Contention {
        /// Attempts made.
        attempts: u32,
    },
    /// A memory node's clients still held live leases on it when a
    /// collection gave up waiting ([`crate::client::Client::collect`]):
    /// nothing was taken back, and the node serves them again.
    #[error(
        "memory node {node}: {leases} client lease(s) still live after {waited:?}; not collected"
    )]
    LeasesLive {
        /// The node.
        node: u8,
        /// Leases live at the last look.
        leases: u64,
        /// How long the collection waited.
        waited: std::time::Duration,
    },
    /// A collection was cancelled ([`crate::client::CollectOptions::cancel`])
    /// before it took anything back from the node.
    #[error("memory node {node}: collection cancelled; nothing taken back there")]
    Cancelled {
        /// The node.
        node: u8,
    },
    /// An internal layout computation failed (a bug, or a configuration
    /// outside the layout's limits).
    #[error("layout error")]
    Layout(#[from] LayoutError),
}

impl Error {
    /// Maps the errors of [`crate::layout::kv::encode`] and
    /// [`crate::layout::kv::block_len`] to the user-facing variants.
    pub fn from_kv(e: LayoutError) -> Self {
        match e {
            LayoutError::EmptyKey => Error::EmptyKey,
            LayoutError::KeyTooLarge { len, max } => Error::KeyTooLarge { len, max },
            LayoutError::ValueTooLarge { len, max } => Error::ValueTooLarge { len, max },
            other => Error::Layout(other),
        }
    }

    /// A [`Error::Corrupt`] for `what`.
    pub fn corrupt(what: &'static str, source: LayoutError) -> Self {
        Error::Corrupt { what, source }
    }

    /// Whether an operation that failed with this error may have left a
    /// WR whose outcome is unknown (a transport failure other than a
    /// memory node's answer that it is collecting, which is definite).
    pub(crate) fn may_leave_work(&self) -> bool {
        match self {
            Error::Transport(e) | Error::OutcomeUnknown { source: e, .. } => {
                !matches!(e, TransportError::Collecting { .. })
            }
            _ => false,
        }
    }
}
