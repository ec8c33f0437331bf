//! The atomic word of in-process memory nodes, from `std` in a normal build
//! and from [loom](https://docs.rs/loom) under `RUSTFLAGS="--cfg krcore_loom"`
//! with the `loom` feature, so that the loom models in `loom-tests` run the
//! real client against memory whose every word is a loom atomic.

#[cfg(all(krcore_loom, not(feature = "loom")))]
compile_error!("`--cfg krcore_loom` needs the `loom` feature of race-store (`--features loom`)");

#[cfg(all(krcore_loom, feature = "loom"))]
pub(crate) use loom::sync::atomic::AtomicU64;

#[cfg(not(krcore_loom))]
pub(crate) use std::sync::atomic::AtomicU64;
