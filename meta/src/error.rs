//! The host layer's error: what can go wrong starting or running a meta
//! server, talking to one, or finding one.

use crate::registry::TableError;
use crate::stores::StoreError;
use crate::table::GeometryError;
use crate::wire::{BootstrapError, ErrorCode, WireError};
use krcore_nic::{NicError, PostError, WcStatus};
use std::time::Duration;

/// Why a meta table host or bootstrap call failed.
///
/// Runtime failures only: bad bytes from the network are typed errors of
/// the call that parses them (a bootstrap), never a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The device has no DC transport, and a [`crate::LocalMetaHost`] serves
    /// its table through a DCT. On such devices host the table in an engine
    /// (`krcore_kmod::MsgMetaHost`, which runs in RC fallback mode).
    #[error(
        "the device has no DC support: LocalMetaHost serves its table through a DCT \
         (host the table in an engine instead: MsgMetaHost runs in RC fallback mode)"
    )]
    DcUnsupported,
    /// A provider call failed.
    #[error("{op}: {source}")]
    Nic {
        /// What the host was doing.
        op: &'static str,
        /// The provider's error.
        #[source]
        source: NicError,
    },
    /// The provider refused a work request at post time.
    #[error("{op}: {source}")]
    Post {
        /// What the host was doing.
        op: &'static str,
        /// The provider's refusal.
        #[source]
        source: PostError,
    },
    /// A work request completed with an error status.
    #[error("{op}: work request completed with {status:?}")]
    Completion {
        /// What the host was doing.
        op: &'static str,
        /// The completion status.
        status: WcStatus,
    },
    /// The configured geometry is invalid.
    #[error("table geometry: {0}")]
    Geometry(#[from] GeometryError),
    /// The table could not be set up over its memory.
    #[error("table: {0}")]
    Table(#[from] TableError),
    /// The configuration is inconsistent (the message says how).
    #[error("configuration: {0}")]
    Config(String),
    /// Bootstrap bytes are not a valid Bootstrap message.
    #[error("bootstrap bytes: {0}")]
    BootstrapBytes(#[source] WireError),
    /// The bootstrap describes a table this build cannot read.
    #[error("bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// Nothing is published under this name on the fabric.
    #[error("no meta server published as {name:?} on this fabric")]
    NotPublished {
        /// The well-known name.
        name: String,
    },
    /// The server answered with a message of the wrong type.
    #[error("{op}: unexpected reply {got:?}")]
    UnexpectedReply {
        /// The request.
        op: &'static str,
        /// The reply's type.
        got: crate::wire::MessageType,
    },
    /// A TCP connection to the meta server could not be made.
    #[error("cannot connect to the meta server at {addr}: {source}")]
    Connect {
        /// The address tried (the last one, if it resolved to several).
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A TCP exchange with the meta server did not finish in time.
    #[error("{op} at {addr}: no answer within {timeout:?}")]
    Timeout {
        /// What the client was doing.
        op: &'static str,
        /// The server's address.
        addr: String,
        /// The deadline it had.
        timeout: Duration,
    },
    /// The server speaks another version of the wire format (for example a
    /// v2 server, which answers every connection with its bootstrap).
    #[error("the meta server speaks wire version {theirs}, this build {ours}")]
    WireVersion {
        /// [`crate::wire::WIRE_VERSION`].
        ours: u8,
        /// The version of the server's reply.
        theirs: u8,
    },
    /// A reply's bytes are not a valid message.
    #[error("{op}: bad reply: {source}")]
    ReplyBytes {
        /// The request.
        op: &'static str,
        /// Why the bytes do not parse.
        #[source]
        source: WireError,
    },
    /// The server refused the request.
    #[error("{op}: refused by the meta server with {code:?}")]
    Refused {
        /// The request.
        op: &'static str,
        /// The server's code.
        code: ErrorCode,
    },
    /// The store has no live member.
    #[error("no store {store:?} on the meta server")]
    NoSuchStore {
        /// The store's name.
        store: String,
    },
    /// A store argument is invalid (checked before anything is sent).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// An OS call (TCP bootstrap, thread) failed.
    #[error("{op}: {source}")]
    Io {
        /// What the host was doing.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Result with [`MetaError`].
pub type MetaResult<T> = std::result::Result<T, MetaError>;

/// `map_err` helpers for provider results.
pub(crate) trait Ctx<T> {
    fn ctx(self, op: &'static str) -> MetaResult<T>;
}

impl<T> Ctx<T> for Result<T, NicError> {
    fn ctx(self, op: &'static str) -> MetaResult<T> {
        self.map_err(|source| MetaError::Nic { op, source })
    }
}

impl<T> Ctx<T> for Result<T, PostError> {
    fn ctx(self, op: &'static str) -> MetaResult<T> {
        self.map_err(|source| MetaError::Post { op, source })
    }
}
