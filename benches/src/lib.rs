//! Shared helpers for the KRCore-rs benchmarks and load drivers.
//!
//! - [`ycsb`]: the YCSB core-workload machinery (generators faithful to
//!   YCSB's Java, workloads A to F and property files, latency histograms,
//!   and reports in YCSB's text format or JSON) used by the `krcore-ycsb`
//!   driver. It is pure: no clock and no I/O besides reading a property file.
//!
//! - [`cluster`]: RACE clusters shared by processes on a directory sim
//!   fabric (host side and compute side) and the `--fabric` spec.
//! - [`proc`]: client processes of the drivers (re-exec, line protocol).
//! - [`elastic`]: the elastic scale-out experiment (joins measured and
//!   modeled, the verbs baseline's RC transport, the PNG plot).
//! - [`soak`]: the soak test's values, write logs and verification.
//! - [`driver`]: the YCSB driver (backends, phases, multi-process runs).
//!
//! Benchmarks report figures; they are never timed tests (DESIGN.md section 8).
#![forbid(unsafe_code)]

pub mod baseline;
pub mod cluster;
pub mod driver;
pub mod elastic;
pub mod proc;
pub mod soak;
pub mod ycsb;
