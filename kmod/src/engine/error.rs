//! Typed errors of the engine host: control path ([`EngineError`]) and data
//! path ([`VqpError`]).

use std::time::Duration;

use krcore_meta::table::LookupError;
use krcore_meta::wire::BootstrapError;
use krcore_nic::{Gid, NicError, PostError, WcStatus};

use crate::credits::CreditError;
use crate::precheck::Rejection;
use crate::wrid::VqpId;

/// Why the meta server could not answer a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetaFailure {
    /// The READ of the table completed with an error (`RETRY_EXC_ERR`: the
    /// server is dead or unreachable; `REM_ACCESS_ERR`: the table's rkey or
    /// the server's `dc_key` is stale).
    Completion(WcStatus),
    /// No completion for the READ within the configured timeout.
    Timeout(Duration),
}

impl std::fmt::Display for MetaFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaFailure::Completion(s) => write!(f, "table READ completed with {s:?}"),
            MetaFailure::Timeout(d) => write!(f, "no completion for the table READ within {d:?}"),
        }
    }
}

/// Errors of the engine's control path: start, VQP creation, connect, MR
/// registration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The device cannot host this engine.
    #[error("unsupported device: {reason}")]
    Unsupported {
        /// Why, and what to do about it.
        reason: &'static str,
    },
    /// The configuration is inconsistent.
    #[error("bad engine configuration: {0}")]
    Config(String),
    /// A provider call failed.
    #[error("{op}: {source}")]
    Nic {
        /// What the engine was doing.
        op: &'static str,
        /// The provider's error.
        #[source]
        source: NicError,
    },
    /// The meta server's bootstrap describes a table this build cannot read.
    #[error("meta bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// The engine was started without a meta server location, and the
    /// target is not cached.
    #[error("{gid} is not cached and no meta server is configured")]
    NoMetaServer {
        /// The GID looked up.
        gid: Gid,
    },
    /// The meta server's table has no live registration for the GID.
    #[error("unknown node {gid}: not registered with the meta server")]
    UnknownNode {
        /// The GID looked up.
        gid: Gid,
    },
    /// The meta server did not answer.
    #[error("meta server unavailable while looking up {gid}: {failure}")]
    MetaUnavailable {
        /// The GID looked up.
        gid: Gid,
        /// What happened to the READ.
        failure: MetaFailure,
    },
    /// Every READ of the bucket found it torn or corrupt.
    #[error("meta table bucket of {gid} unreadable after {attempts} READs: {last}")]
    MetaInconsistent {
        /// The GID looked up.
        gid: Gid,
        /// READs issued.
        attempts: u32,
        /// What the last one found.
        #[source]
        last: LookupError,
    },
    /// Every VQP id was handed out.
    #[error("VQP ids exhausted")]
    VqpIdsExhausted,
}

impl EngineError {
    pub(crate) fn nic(op: &'static str) -> impl FnOnce(NicError) -> EngineError {
        move |source| EngineError::Nic { op, source }
    }
}

/// Errors of a VQP's data path. A post that returns an error posted nothing
/// unless the variant says otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VqpError {
    /// The VQP has no target: never connected, or its target was invalidated
    /// by a `REM_ACCESS_ERR`/`RETRY_EXC_ERR` completion. Connect again.
    #[error("{vqp} is not connected")]
    NotConnected {
        /// The VQP.
        vqp: VqpId,
    },
    /// The pre-check rejected the batch; nothing reached the NIC.
    #[error("pre-check: {0}")]
    Rejected(#[from] Rejection),
    /// The VQP has too many WRs posted and not yet polled by the user.
    #[error("{vqp} is full: {outstanding} WRs outstanding or unpolled, {requested} more asked, capacity {capacity}")]
    VqpFull {
        /// The VQP.
        vqp: VqpId,
        /// WRs posted and not yet completed, plus completions not yet polled.
        outstanding: u32,
        /// WRs in the batch.
        requested: usize,
        /// The VQP's depth.
        capacity: u32,
    },
    /// Polling did not free enough send-queue credits on the shared DCI in
    /// time (another VQP's WRs are still in flight). Retry later.
    #[error("shared send queue busy: {free} credits free, {requested} needed after {waited:?}")]
    QueueBusy {
        /// Credits free.
        free: u32,
        /// Credits needed.
        requested: usize,
        /// How long the engine polled.
        waited: Duration,
    },
    /// The provider refused the post. The first `error.index` WRs were
    /// posted (their completions will be delivered), the rest were not.
    #[error("post refused by the NIC: {0}")]
    Post(#[source] PostError),
    /// A provider call failed (CQ overflow, a failed DCI reset).
    #[error("{op}: {source}")]
    Nic {
        /// What the engine was doing.
        op: &'static str,
        /// The provider's error.
        #[source]
        source: NicError,
    },
    /// The engine's account of the shared send queue disagrees with the
    /// NIC (a provider bug): the DCI is reset.
    #[error("send-queue account: {0}")]
    Credit(#[from] CreditError),
}

impl VqpError {
    pub(crate) fn nic(op: &'static str) -> impl FnOnce(NicError) -> VqpError {
        move |source| VqpError::Nic { op, source }
    }
}
