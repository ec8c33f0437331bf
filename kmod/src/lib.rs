//! # krcore-kmod: the KRCore control plane engine
//!
//! (Crate docs are completed as the pieces land.)
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod credits;
pub mod dccache;
mod sync;
pub mod wrid;

pub use credits::{CreditError, PostedWr, QueueView, SendQueueCredits};
pub use dccache::{CachedTarget, DcCache, Insert, Lookup, MetaEpoch};
pub use wrid::{PhysWrId, Slot, SlotTable, VqpId, WrIdError};
