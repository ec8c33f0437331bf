//! # race-store: RACE hashing over disaggregated memory
//!
//! After "One-sided RDMA-Conscious Extendible Hashing for Disaggregated
//! Memory" (RACE, USENIX ATC'21): a hash table that clients read and modify
//! with one-sided RDMA only (READ, WRITE, CAS), so memory nodes spend no CPU
//! on the data path.
//!
//! This crate currently holds the **pure layer**: byte layouts, hashing and
//! table geometry, everything that reads or writes remote bytes, with no I/O
//! and no clock. The RDMA client and the memory-node server are built on top
//! of it later.
//!
//! ```text
//! key ──hash──> KeyHash { h1, h2 } ──┬─ low bits of h1 ─> directory entry ─> subtable
//!                                    ├─ high bits of h1 ─> combined bucket #1 ┐ one 128 B READ each,
//!                                    ├─ high bits of h2 ─> combined bucket #2 ┘ same doorbell
//!                                    └─ low bits of h2 ──> fingerprint (1..=255) in the slot
//! slot ──(node, offset, len)──> KV block { klen, magic, vlen, key, value, crc32 }
//! ```
//!
//!
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

pub mod error;
pub mod hash;
pub mod layout;

pub use error::{LayoutError, Result};
