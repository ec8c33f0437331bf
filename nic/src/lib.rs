//! # krcore-nic: the NIC provider contract and `sim`, a software RNIC
//!
//! The bottom layer of KRCore-rs. Everything above it (the control plane in
//! `krcore-kmod`, the SDK, the RACE store) is generic over the [`Nic`] trait and
//! never knows which provider it runs on.
//!
//! ```text
//! krcore (sdk) -> krcore-kmod (engine) -> krcore-nic::Nic
//!                                           |- sim::SimNic   (default, no hardware)
//!                                           `- verbs::VerbsNic (feature `verbs`)
//! ```
//!
//! ## Providers
//! - [`sim`]: a faithful software RNIC over shared memory. `sim:mem` is a private
//!   in-process fabric; `sim:/dev/shm/NAME` is a directory fabric shared by
//!   processes. One-sided operations are executed by the initiator directly on
//!   the target's memory after the checks a NIC does; errors are completions,
//!   QPs go to ERR and flush, send-queue credits are enforced.
//! - `verbs` (cargo feature `verbs`, needs `libibverbs-dev`, `librdmacm-dev`,
//!   `libclang-dev`): real RDMA through rdma-sys, on ConnectX (with DC through
//!   a small mlx5dv binding) or Soft-RoCE (RC/UD only; `caps().dc` is false).
//!
//! ## Choosing a provider at run time
//! [`FabricSpec`] parses the one `--fabric` string every binary takes
//! (`sim:mem`, `sim:NAME`, `sim:/abs/path`, `verbs:DEVICE`, with options
//! such as `,dc=off` or `,port=1,gid=3`); [`FabricSpec::open`] returns an
//! [`AnyNic`], an enum over this build's providers that implements [`Nic`]
//! by static dispatch.
//!
//! ## Wrappers
//! - [`fault::FaultNic`]: wraps any provider and injects, from a seed, the
//!   faults hardware produces (delayed/reordered completions within RDMA's
//!   ordering, failed WRs, dropped nodes, QPs forced to ERR), for tests.
//!
//! ## Invariants every provider keeps
//! See [`provider`] and the suite in [`conformance`], which runs unchanged on
//! every provider.
#![deny(unsafe_code)]
#![warn(missing_debug_implementations)]

pub mod any;
pub mod conformance;
pub mod counters;
pub mod error;
pub mod fault;
pub mod le;
pub mod provider;
pub mod shared;
pub mod sim;
pub mod spec;
pub mod types;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use any::{AnyCq, AnyMr, AnyNic, AnyPd, AnyQp, AnySrq, Opened};
pub use counters::Counters;
pub use error::{NicError, PostError, PostErrorKind, Result};
pub use provider::{
    bring_up, CompletionQueue, MemoryRegion, Nic, QpInit, QueuePair, SharedReceiveQueue,
};
pub use spec::{FabricSpec, SimLocation, SimSpec, SpecError, VerbsSpec};
pub use types::*;
