//! `sim`: a faithful software RNIC over shared memory (the embedded default).
//!
//! A [`SimFabric`] is either private to the process (`sim:mem`) or a directory
//! shared by processes (`sim:/dev/shm/NAME`). Each [`SimNic`] is a node on it
//! with a GID, a liveness record and a control block holding its MR, QP, CQ and
//! SRQ tables in shared memory. One-sided operations are executed by the
//! initiator directly on the target's mapped memory after the checks a NIC
//! makes (see `exec`), so no target CPU is involved; CAS and FAA are real
//! atomic instructions on the mapping. Two-sided operations consume a receive
//! posted at the target and push a completion into the target's CQ, which lives
//! in shared memory too.
//!
//! Like hardware, the sim punishes mistakes: error completions, QPs moving to
//! ERR, flushed work requests, send-queue credits, CQ overflow. With a
//! [`LatencyModel`] completions become visible only after their modeled time.
//!
//! Multi-process rules: every process opens the same directory with
//! [`SimFabric::open_dir`] (or [`SimFabric::from_spec`]); a process that dies
//! leaves a dead node, which peers see as `RETRY_EXC_ERR` within
//! [`SimConfig::liveness_interval`], and whose slot and files a later joiner or
//! [`SimFabric::reap_dead`] reclaims.
//!
//! Files, bottom to top (none imports one above it; `ci/imports.py` checks
//! that there is no circle): `shm` (mapped segments), `ring`, `ctl` (the
//! control block), `fabric`, `latency`; `device` (a node's state); `cq`,
//! `recv` (receive rings, SRQs); `target` (a QP's caches of what it
//! reaches); `qp_state` (what a QP holds); `exec` (one WR, with every
//! check); `qp` (the verbs of a QP: posting, credits, RNR retries); `node`
//! (`SimNic`, the provider's device, which makes all of them). The CQ's
//! list of QPs with waiting work and the node's list of QPs (for their
//! counters) point back up through two small traits (`cq::Drive`,
//! `device::QpCounters`).

mod cq;
mod ctl;
mod device;
mod exec;
mod fabric;
mod host;
mod latency;
mod node;
mod qp;
mod qp_state;
mod recv;
mod ring;
pub(crate) mod shm;
mod target;

pub use cq::SimCq;
pub use device::SimConfig;
pub use fabric::{SimFabric, FABRIC_VERSION, MAX_NAME_VALUE, MAX_NODES};
pub use latency::LatencyModel;
pub use node::{SimMr, SimNic, SimPd};
pub use qp::SimQp;
pub use recv::SimSrq;
pub use shm::{fork_process, ForkedChild};
