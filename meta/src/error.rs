//! The host layer's error: what can go wrong starting or running a meta
//! server, talking to one, or finding one.

use crate::engine::TableError;
use crate::table::GeometryError;
use crate::wire::{BootstrapError, ErrorCode, WireError};
use krcore_nic::{NicError, PostError, WcStatus};
use std::time::Duration;

/// Why a meta-server host, RPC client or bootstrap call failed.
///
/// Runtime failures only: a bad request from the network never becomes an
/// error of the server (it is dropped and counted, see
/// [`crate::host::ServerStats`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The device has no DC transport, and lookups by READ are served
    /// through a DCT. The RC fallback (clients READ the table over RC QPs
    /// set up by a handshake) is not built yet: it comes with the verbs
    /// provider work.
    #[error(
        "the device has no DC support: the meta server's RC fallback for lookups \
         is not built yet (it comes with the verbs provider work)"
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
    /// The server did not answer within the configured timeout, after every
    /// retry: it is down, unreachable, or not serving this address.
    #[error("{op}: no reply from the meta server after {attempts} attempts ({waited:?})")]
    Timeout {
        /// The request.
        op: &'static str,
        /// Requests sent.
        attempts: u32,
        /// Time spent waiting in total.
        waited: Duration,
    },
    /// The server answered with an error code.
    #[error("{op}: the meta server refused it: {code:?} (after {attempts} attempts)")]
    Refused {
        /// The request.
        op: &'static str,
        /// The server's code ([`ErrorCode::BucketFull`], ...).
        code: ErrorCode,
        /// Requests sent for this call. Above 1, an earlier attempt may have
        /// been applied and its reply lost: a `Deregister` refused with
        /// [`ErrorCode::NotRegistered`] then did succeed.
        attempts: u32,
    },
    /// The server answered with a message of the wrong type.
    #[error("{op}: unexpected reply {got:?}")]
    UnexpectedReply {
        /// The request.
        op: &'static str,
        /// The reply's type.
        got: crate::wire::MessageType,
    },
    /// An OS call (TCP bootstrap, thread) failed.
    #[error("{op}: {source}")]
    Io {
        /// What the host was doing.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server thread panicked (a bug: the server never panics on input).
    #[error("the meta server thread panicked")]
    ServerPanicked,
}

impl MetaError {
    /// The code of a refused request, if this is one.
    pub fn refused_code(&self) -> Option<ErrorCode> {
        match self {
            MetaError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether this is a [`MetaError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, MetaError::Timeout { .. })
    }
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
