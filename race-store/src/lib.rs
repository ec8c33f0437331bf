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
//! ## Modules
//! * [`hash`]: the two hash functions, fingerprint, directory index, bucket
//!   locations.
//! * [`layout`]: the remote structures, each a checked view:
//!   [`layout::slot`] (8 B slot word), [`layout::bucket`] (64 B bucket, 192 B
//!   group, 128 B combined bucket, insert choice), [`layout::subtable`]
//!   (geometry, suffixes, split plans), [`layout::dir_header`] (global depth
//!   and leased resize lock), [`layout::directory`] (entries, doubling,
//!   consistency), [`layout::kv`] (KV blocks with CRC).
//! * [`error`]: [`LayoutError`], the one error type.
//!
//! ## Quick start
//! ```
//! use race_store::hash::KeyHash;
//! use race_store::layout::bucket::{choose_insert_slot, CombinedBucket, COMBINED_SIZE};
//! use race_store::layout::slot::{RemotePtr, Slot};
//! use race_store::layout::subtable::SubtableGeometry;
//! use race_store::layout::kv;
//!
//! # fn main() -> Result<(), race_store::LayoutError> {
//! let geometry = SubtableGeometry::new(64)?;
//! let hash = KeyHash::of(b"user:42");
//! let [loc1, loc2] = hash.bucket_locs(geometry);
//! // READ 128 B at subtable base + these offsets (here: two empty buckets).
//! let (_off1, _off2) = (geometry.combined_offset(loc1)?, geometry.combined_offset(loc2)?);
//! let (b1, b2) = ([0u8; COMBINED_SIZE], [0u8; COMBINED_SIZE]);
//! let c1 = CombinedBucket::new_checked(&b1[..], loc1.side)?;
//! let c2 = CombinedBucket::new_checked(&b2[..], loc2.side)?;
//! let target = choose_insert_slot([&c1, &c2]).expect("empty buckets have room");
//!
//! // WRITE the KV block out of place, then CAS the empty slot to this word.
//! let block = kv::encode(b"user:42", b"hello")?;
//! let slot = Slot::for_block(hash.fingerprint(), block.len(), RemotePtr::new(0, 4096)?)?;
//! assert_eq!(slot.block_len(), 64);
//! assert_eq!(kv::decode_for_key(&block, b"user:42")?.value(), b"hello");
//! # let _ = target;
//! # Ok(()) }
//! ```
//!
//! ## Invariants
//! * Parsing never panics: every view is built by `new_checked` (length checked
//!   once, accessors infallible afterwards), every word type accepts any raw
//!   value and has a `validate`, and KV blocks are verified by length and CRC.
//!   Non-test code denies indexing, `unwrap`, `expect` and `panic!` (clippy).
//! * An occupied slot has a fingerprint in `1..=255` and a length in `1..=255`
//!   units of 64 B; the empty slot is the word 0.
//! * A subtable of local depth `d` and suffix `s` holds exactly the keys whose
//!   directory hash ends in `s`; every one of its bucket headers says so, and
//!   the `2^(g-d)` directory entries `s + k * 2^d` point to it.
//! * All integers in remote memory are little-endian.
//!
//! ## Thread safety
//! Everything here is plain data and pure functions: `Send + Sync`, no global
//! state. Concurrency lives in remote memory and is the client's business.
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

pub mod client;
pub mod clock;
pub mod error;
pub mod hash;
pub mod layout;
pub mod memory;
pub mod remote;

#[cfg(test)]
mod prop_tests;

pub use client::{Client, ClientConfig};
pub use error::{Error, LayoutError, Result};
