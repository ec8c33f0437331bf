//! Typed errors of the provider layer.
//!
//! Synchronous misuse (a bad state transition, a malformed work request, a full
//! send queue) is an `Err` from the call. Faults the NIC detects while executing
//! a work request are *completions* with an error [`crate::WcStatus`], never
//! errors from `post_send`, exactly as on hardware.

use crate::types::{QpState, QpType};
use std::path::PathBuf;

/// Result of a provider call.
pub type Result<T, E = NicError> = std::result::Result<T, E>;

/// Why a provider call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// The provider or device does not implement the feature.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A QP state transition that verbs does not allow.
    #[error("invalid QP transition for {qp_type:?} from {from:?} to {to:?}")]
    InvalidTransition {
        qp_type: QpType,
        from: QpState,
        to: QpState,
    },
    /// A fixed-size table or resource of the device is exhausted.
    #[error("out of {0}")]
    Exhausted(&'static str),
    /// The memory region is too large for the device or fabric.
    #[error("memory region of {requested} bytes exceeds the limit of {limit} bytes")]
    MrTooLarge { requested: u64, limit: u64 },
    /// The CQ overflowed: completions were lost and the CQ is in error.
    #[error("completion queue overflow (depth {depth}): the CQ is in error")]
    CqOverflow { depth: u32 },
    /// The fabric directory does not exist.
    #[error("sim fabric directory {0} does not exist")]
    FabricMissing(PathBuf),
    /// The fabric directory was made by another version of the sim.
    #[error("sim fabric {path} has layout version {found}, this build expects {expected}")]
    FabricVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    /// A fabric specification string could not be parsed, or names no sim
    /// fabric where one is needed.
    #[error(transparent)]
    BadFabricSpec(Box<crate::spec::SpecError>),
    /// The fabric names a provider this build was compiled without.
    #[error("{spec}: this build has no {provider} provider; rebuild with `--features {provider}`")]
    NoProvider {
        /// The fabric string.
        spec: String,
        /// The missing provider (the cargo feature of the same name).
        provider: &'static str,
    },
    /// The node was closed, or its fabric slot was reclaimed.
    #[error("node is closed")]
    NodeClosed,
    /// An OS call failed.
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Why `post_send`/`post_recv` refused a work request. The WRs before `index`
/// were posted (like `bad_wr` in verbs); this one and those after were not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work request {index} refused: {kind}")]
pub struct PostError {
    /// Index in the posted slice of the first refused WR.
    pub index: usize,
    /// Why.
    pub kind: PostErrorKind,
}

/// The reason a work request was refused at post time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostErrorKind {
    /// The queue has no free slot (ENOMEM): poll signaled completions first.
    #[error("queue full ({depth} slots)")]
    QueueFull { depth: u32 },
    /// The QP is not in a state that accepts this post (EINVAL).
    #[error("QP in state {0:?} cannot accept this post")]
    BadState(QpState),
    /// The WR is malformed for this QP (EINVAL): wrong opcode for the
    /// transport, too many SGEs, oversized inline data, atomic SGE not 8 bytes,
    /// wrong destination kind.
    #[error("malformed work request: {0}")]
    Malformed(&'static str),
}

impl From<crate::spec::SpecError> for NicError {
    fn from(e: crate::spec::SpecError) -> NicError {
        NicError::BadFabricSpec(Box::new(e))
    }
}
