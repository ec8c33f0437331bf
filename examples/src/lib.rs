//! Shared helpers for the examples.
#![forbid(unsafe_code)]
