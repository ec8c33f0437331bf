//! The SDK's error type.

use krcore_kmod::{EngineError, LeaseError, MsgError, VqpError};
use krcore_nic::{Gid, NicError, WcStatus};

/// Any error of the SDK.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening the fabric or node, or a provider call.
    #[error("NIC: {0}")]
    Nic(#[from] NicError),
    /// Starting the engine, connecting, registering memory.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The embedded meta server could not start.
    #[error(transparent)]
    Meta(#[from] krcore_meta::MetaError),
    /// Posting or polling on a VQP (pre-check rejections included, but
    /// [`Error::NotGranted`]).
    #[error(transparent)]
    Vqp(VqpError),
    /// The pre-check refused a one-sided WR to a remote key no grant the
    /// VQP knows covers (`krcore_kmod::Reason::NotGranted`): reach remote
    /// memory through its region token, or opt the VQP out
    /// ([`crate::Vqp::set_ungranted`]) to pass rkeys by hand.
    #[error("work request {index}: no grant known for rkey {rkey:#x} (remote {addr:#x}): use the region's token, or opt out with Vqp::set_ungranted")]
    NotGranted {
        /// Index of the WR in its batch.
        index: usize,
        /// The remote key.
        rkey: u32,
        /// The remote address.
        addr: u64,
    },
    /// A request reached the NIC and completed with an error status.
    #[error("request {wr_id:#x} completed with {status:?}")]
    Failed {
        /// The request's wr_id.
        wr_id: u64,
        /// The completion status.
        status: WcStatus,
    },
    /// A high-level operation reaches outside a region.
    #[error("{offset}+{len} lies outside the {region_len}-byte {which} region")]
    OutOfRange {
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The region's length.
        region_len: u64,
        /// `"local"` or `"remote"`.
        which: &'static str,
    },
    /// A wr_id with the bit the SDK reserves for its requests
    /// ([`crate::REQUEST_WR_ID_BIT`]).
    #[error("wr_id {0:#x} uses the bit reserved for SDK requests")]
    ReservedWrId(u64),
    /// The node builder was given contradictory or missing settings.
    #[error("node builder: {0}")]
    Builder(&'static str),
    /// Two-sided messaging (bind, push, pop, reply).
    #[error(transparent)]
    Msg(#[from] MsgError),
    /// A lease could not be taken (range, access).
    #[error("lease: {0}")]
    Lease(#[from] LeaseError),
    /// A call through the node daemon failed ([`crate::Node::attach`]):
    /// no daemon, another version, a quota, a refused doorbell, the
    /// daemon gone (attach again).
    #[error(transparent)]
    Daemon(#[from] krcore_kmod::daemon::DaemonError),
    /// The operation is not available here.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// The meta table refused a registration.
    #[error("registering {gid} with the meta table: {source}")]
    Register {
        /// The node.
        gid: Gid,
        /// Why.
        #[source]
        source: krcore_meta::registry::TableError,
    },
}

impl From<VqpError> for Error {
    fn from(e: VqpError) -> Error {
        match e {
            VqpError::Rejected(krcore_kmod::Rejection {
                index,
                reason: krcore_kmod::Reason::NotGranted { rkey, addr },
            }) => Error::NotGranted { index, rkey, addr },
            e => Error::Vqp(e),
        }
    }
}

/// A refused [`crate::MemoryRegion::deregister`]: the region comes back.
#[derive(Debug, thiserror::Error)]
#[error("deregistration refused: {reason}")]
pub struct DeregisterError<N: krcore_nic::Nic = krcore_nic::AnyNic> {
    /// The region, still registered.
    pub region: crate::MemoryRegion<N>,
    /// Why.
    pub reason: LeaseError,
}

/// Result of the SDK's fallible calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;
