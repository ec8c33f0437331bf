//! Shared helpers for the benchmarks and drivers.
#![forbid(unsafe_code)]

pub mod ycsb;
