//! # krcore-meta: the meta server's table layout, wire format and engine
//!
//! Placeholder crate docs; completed with the table and wire layers.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod engine;
pub mod entry;
pub mod table;

/// Version of the table layout (entry format, bucket hash, checksum function).
/// A client refuses a table whose bootstrap reports another version.
pub const LAYOUT_VERSION: u16 = 1;

#[cfg(test)]
mod tests;
