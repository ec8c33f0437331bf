//! # krcore-kmod: the KRCore control plane engine
//!
//! (Crate docs are completed as the pieces land.)
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod credits;
pub mod dccache;
pub mod precheck;
mod sync;
pub mod wrid;

pub use credits::{CreditError, PostedWr, QueueView, SendQueueCredits};
pub use dccache::{CachedTarget, DcCache, Insert, Lookup, MetaEpoch};
pub use precheck::{
    LocalMr, LocalMrTable, NoGrants, OpKind, Plan, Policy, Precheck, Reason, Rejection,
    RemoteGrant, RemoteGrants, Transport,
};
pub use wrid::{PhysWrId, Slot, SlotTable, VqpId, WrIdError};
