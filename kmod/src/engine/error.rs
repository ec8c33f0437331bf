//! Typed errors of the engine host: control path ([`EngineError`]) and data
//! path ([`VqpError`]).

use std::time::Duration;

use krcore_meta::table::LookupError;
use krcore_meta::wire::BootstrapError;
use krcore_nic::{Gid, NicError, PostError, WcStatus};

use crate::credits::CreditError;
use crate::handshake::RejectCode;
use crate::precheck::Rejection;
use crate::wrid::VqpId;

/// Why an RC handshake (RC fallback mode) did not produce a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeFailure {
    /// No answer to any of `attempts` Requests (the target is dead, not
    /// running its responder, or unreachable).
    Timeout {
        /// Requests sent.
        attempts: u32,
        /// How long the initiator waited in all.
        waited: Duration,
    },
    /// The target's responder refused.
    Rejected(RejectCode),
    /// The Accept came from another port than the one asked.
    WrongPeer {
        /// The GID the Accept named.
        gid: Gid,
    },
    /// DC mode (the handshake travels as messages): the target's messaging
    /// refused the handshake channel: `Unbound` when it does not serve
    /// upgrades (its reserved port is not bound), `Busy` when the port's
    /// receive slots are all granted to other initiators.
    Refused(crate::msg::RefuseCode),
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeFailure::Timeout { attempts, waited } => {
                write!(f, "no answer to {attempts} requests within {waited:?}")
            }
            HandshakeFailure::Rejected(code) => write!(f, "refused: {code}"),
            HandshakeFailure::WrongPeer { gid } => write!(f, "answered by another port {gid}"),
            HandshakeFailure::Refused(code) => write!(f, "handshake port: {code}"),
        }
    }
}

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
    /// A request over messaging (Register, Renew, Deregister, a store's
    /// Join or Leave) went unanswered: `attempts` tries, each waiting
    /// `meta_timeout` for a Grant, a credit or the answer, `waited` in all.
    NoAnswer {
        /// Tries made (the first and its retries).
        attempts: u32,
        /// Of those, tries whose request could not even be sent: no Grant
        /// or credit came from the meta node in time, an earlier message
        /// was lost, or the node reclaimed the channel. The others were
        /// sent and got no answer.
        unsent: u32,
        /// Time spent in all.
        waited: Duration,
    },
    /// RC fallback mode: the RC pair to the meta node could not be made.
    Handshake(HandshakeFailure),
    /// Registration over messaging: the meta node's messaging refused the
    /// request channel (`Unbound`: it serves no meta table on its reserved
    /// port, e.g. a `krcore_meta::LocalMetaHost`, which answers no request).
    Refused(crate::msg::RefuseCode),
}

impl std::fmt::Display for MetaFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaFailure::Completion(s) => write!(f, "table READ completed with {s:?}"),
            MetaFailure::Timeout(d) => write!(f, "no completion for the table READ within {d:?}"),
            MetaFailure::NoAnswer {
                attempts,
                unsent,
                waited,
            } => write!(
                f,
                "no answer from the meta node's request port to {attempts} tries within \
                 {waited:?} ({unsent} of them not sent: no Grant or credit in time)"
            ),
            MetaFailure::Handshake(h) => write!(f, "RC handshake with the meta node: {h}"),
            MetaFailure::Refused(code) => write!(f, "the meta node's request port: {code}"),
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
    /// Another process of this machine runs an engine on the port: it holds
    /// the port's lock file ([`krcore_nic::Nic::port_lock_path`]). Two
    /// engines on one port share its GID and collide (the meta table, the
    /// DCCache and messaging know a node by its GID).
    #[error(
        "another process{} runs a KRCore engine on this port (GID {gid}, lock {}): processes on \
         one port share one engine (run krcored and attach to it) or take a GID each",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        path.display()
    )]
    PortInUse {
        /// The port's GID.
        gid: Gid,
        /// The lock file.
        path: std::path::PathBuf,
        /// The holder's process id, as it wrote it in the file (if it could).
        holder: Option<u32>,
    },
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
    /// DC mode, registration over messaging: the meta server answered the
    /// Register, Renew or Deregister of `gid` with an error.
    #[error("meta server refused the request for {gid}: {code:?}")]
    MetaRefused {
        /// The GID the request was about.
        gid: Gid,
        /// The server's code.
        code: krcore_meta::wire::ErrorCode,
    },
    /// The meta server did not answer (a lookup's READ, or a request over
    /// messaging about `gid`).
    #[error("meta server unavailable for {gid}: {failure}")]
    MetaUnavailable {
        /// The GID looked up, or the one the request was about.
        gid: Gid,
        /// What happened to the READ or the request.
        failure: MetaFailure,
    },
    /// The [`MetaSource`](super::MetaSource) could not fetch the meta
    /// server's bootstrap (see [`Engine::refresh_meta`](super::Engine::refresh_meta)).
    #[error("fetch the meta server's bootstrap again: {0}")]
    MetaSource(#[source] krcore_meta::MetaError),
    /// The meta server restarted with a table of another shape than the
    /// one this engine reads (see [`Engine::refresh_meta`](super::Engine::refresh_meta)):
    /// the engine keeps its old location; restart the process (or the
    /// server with its former geometry).
    #[error(
        "the meta server restarted with a table of another shape ({new:?}, was {old:?}): \
         restart this process to read it"
    )]
    MetaReshaped {
        /// The shape this engine reads.
        old: krcore_meta::table::Geometry,
        /// The restarted server's.
        new: krcore_meta::table::Geometry,
    },
    /// DC mode: the meta client's READ could not be posted on DCI 0 of the
    /// pool (its shared send queue stayed full for `reclaim_timeout`, or
    /// the provider refused the post).
    #[error("meta lookup of {gid}: the table READ could not be posted: {source}")]
    MetaPost {
        /// The GID looked up.
        gid: Gid,
        /// Why.
        #[source]
        source: VqpError,
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
    /// A provider refused a post on the engine's own QPs (the handshake
    /// endpoint).
    #[error("{op}: {source}")]
    Post {
        /// What the engine was doing.
        op: &'static str,
        /// The provider's refusal.
        #[source]
        source: PostError,
    },
    /// RC fallback mode: the handshake with `gid` failed; nothing was
    /// created that outlives the call.
    #[error("RC handshake with {gid}: {failure}")]
    Handshake {
        /// The target.
        gid: Gid,
        /// What happened.
        failure: HandshakeFailure,
    },
    /// RC fallback mode: the cache of RC pairs is at its cap and every
    /// pair still has WRs in flight, so none can be evicted. Retry after
    /// polling, or raise `EngineConfig::rc_cap`.
    #[error("all {cap} RC pairs have WRs in flight; none can be evicted")]
    RcPairsBusy {
        /// `EngineConfig::rc_cap`.
        cap: usize,
    },
    /// RC fallback mode: a VQP with WRs in flight cannot move to another
    /// target's RC pair (their completions come from the old one). Poll
    /// until `outstanding()` is 0 first.
    #[error("{vqp} has {outstanding} WRs in flight on its RC pair; poll them before reconnecting")]
    VqpBusy {
        /// The VQP.
        vqp: VqpId,
        /// Its WRs in flight.
        outstanding: u32,
    },
    /// The VQP has no target (connect it first).
    #[error("{vqp} is not connected")]
    NotConnected {
        /// The VQP.
        vqp: VqpId,
    },
    /// RC fallback mode: the meta entry of `gid` does not describe a
    /// handshake endpoint (its `dc_key` does not fit a qkey): the node
    /// registered a DC address. Mixed DC/RC-fallback clusters are not
    /// supported.
    #[error("{gid} is registered with a DC address (dc_key {dc_key:#x}), not an RC-fallback handshake endpoint")]
    NotAFallbackNode {
        /// The node.
        gid: Gid,
        /// The `dc_key` of its entry.
        dc_key: u64,
    },
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
    /// RC fallback mode: the VQP's RC pair was evicted or lost (its target
    /// stopped answering), and making a new one failed. Nothing was posted;
    /// the source says why (a dead target is
    /// [`EngineError::Handshake`]).
    #[error("{vqp}: its RC pair is gone and a new one could not be made: {source}")]
    Rebind {
        /// The VQP.
        vqp: VqpId,
        /// Why the new pair could not be made.
        #[source]
        source: Box<EngineError>,
    },
}

impl VqpError {
    pub(crate) fn nic(op: &'static str) -> impl FnOnce(NicError) -> VqpError {
        move |source| VqpError::Nic { op, source }
    }
}
