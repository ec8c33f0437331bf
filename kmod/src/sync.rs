//! The synchronization primitives the lock-free pieces use, from `std` in a
//! normal build and from [loom](https://docs.rs/loom) under
//! `RUSTFLAGS="--cfg krcore_loom"` with the `loom` feature, so that a loom model
//! (in the `loom-tests` crate) exercises the very same code.
//!
//! Code here sticks to the subset both implementations share (no `const fn
//! new`, no `get_mut`), and spinning goes through [`spin_loop`] so that loom
//! can schedule the thread that holds what the spinner waits for.

#[cfg(all(krcore_loom, not(feature = "loom")))]
compile_error!("`--cfg krcore_loom` needs the `loom` feature of krcore-kmod (`--features loom`)");

#[cfg(all(krcore_loom, feature = "loom"))]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(krcore_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// A busy-wait hint; a yield to the model's scheduler under loom.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(all(krcore_loom, feature = "loom"))]
    loom::thread::yield_now();
    #[cfg(not(krcore_loom))]
    std::hint::spin_loop();
}
