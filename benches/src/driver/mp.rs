//! YCSB over client processes on a shared (directory) sim fabric.
//!
//! The driver hosts the cluster ([`crate::cluster::ClusterHost`]) and runs
//! each phase as `processes` children (its own binary re-executed with a
//! hidden flag carrying a [`ChildSpec`] as JSON). A child joins the fabric,
//! builds its clients, says `READY`, waits for `GO` (so every process starts
//! its clock together), runs its share, and sends `RESULT {json}` with its
//! measurements. The driver merges the histograms; a phase's runtime is
//! from the earliest child start to the latest child end. A driver whose
//! stop flag is set (SIGINT/SIGTERM) sends `STOP` to the children still
//! running; a child ends its phase on `STOP`, on its stdin closing (the
//! driver is gone) or on a signal of its own, and reports what it ran.
//!
//! Shares: the load phase splits the records into contiguous ranges
//! (YCSB's `insertstart`/`insertcount` per client); the run phase splits the
//! operations. Run-phase inserts (workload D) draw new key numbers from
//! `recordcount` up in every process, as independent YCSB clients do, so
//! two processes may insert the same new key (an upsert; no error).

use super::{run_load, run_phase, Gate, PhaseError, PhaseResult, RunOptions};
use crate::cluster::{Remote, SharedRaceBackend};
use crate::proc::{epoch_us, say, wait_for, ChildProc, ProcError};
use crate::ycsb::{KeySpace, Measurements, MeasurementsWire, Report, Status, Workload};
use krcore_nic::sim::{LatencyModel, SimConfig};
use parking_lot::Mutex;
use race_store::ClientConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which phase a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Insert the child's range of records.
    Load,
    /// Run the child's share of the operations.
    Run,
}

/// What one client process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    /// The fabric directory (a cluster the driver hosts; unused with
    /// `deployed`).
    pub fabric: PathBuf,
    /// A deployed store to run against instead (found through its meta
    /// server).
    #[serde(default)]
    pub deployed: Option<super::DeployedTarget>,
    /// The id of this child's first writer thread (see
    /// [`RunOptions::writer`]).
    #[serde(default)]
    pub writer: u64,
    /// Whether the run phase logs its writes for the verification pass.
    #[serde(default)]
    pub log_writes: bool,
    /// Whether the child ends its phase at its first failed operation.
    #[serde(default)]
    pub fail_fast: bool,
    /// This child's share of YCSB's `-target` (operations per second).
    #[serde(default)]
    pub target: Option<f64>,
    /// Operations each thread keeps in flight (`--batch`).
    #[serde(default = "one")]
    pub batch: usize,
    /// Memory nodes published on it.
    pub memory_nodes: u8,
    /// The phase.
    pub phase: Phase,
    /// The workload, already cut to this child's share.
    pub workload: Workload,
    /// Client threads.
    pub threads: usize,
    /// RNG seed (distinct per child).
    pub seed: u64,
    /// Latency model name (`none` or `cx4`).
    pub latency: String,
    /// The race clients' settings (a cluster the driver hosts).
    #[serde(default)]
    pub client: ClientConfig,
}

fn one() -> usize {
    1
}

/// What a child sends back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildResult {
    /// Its merged measurements.
    pub measurements: MeasurementsWire,
    /// When its clock started and stopped (us since the epoch).
    pub start_us: u64,
    /// See `start_us`.
    pub end_us: u64,
    /// Operations attempted.
    pub operations: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Its first error.
    pub first_error: Option<String>,
    /// Its logged writes.
    #[serde(default)]
    pub writes: Vec<super::verify::WriteRecord>,
    /// What its clients gave back when they closed: bytes returned, bytes
    /// kept, first failure.
    #[serde(default)]
    pub closed: (u64, u64, Option<String>),
    /// Bytes its clients gave back while they ran (trimmed free lists).
    #[serde(default)]
    pub trimmed: u64,
}

/// Why a multi-process phase failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MpError {
    /// Talking to a child failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// A child sent something unreadable.
    #[error("client process {pid}: bad result: {reason}")]
    BadResult {
        /// The child.
        pid: u32,
        /// What was wrong.
        reason: String,
    },
    /// Merging measurements failed.
    #[error(transparent)]
    Phase(#[from] PhaseError),
}

/// How often the driver looks at its stop flag while children run.
const STOP_POLL: Duration = Duration::from_millis(100);

/// How long a child may take to join and build its clients.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Splits `total` into `parts` nearly equal shares (the first ones larger).
pub fn shares(total: u64, parts: usize) -> Vec<u64> {
    let parts = parts.max(1) as u64;
    (0..parts)
        .map(|i| total / parts + u64::from(i < total % parts))
        .collect()
}

/// The per-child specs of a phase: the load phase splits the base
/// workload's load range (`insertstart`, `insertcount`) into one share per
/// child, in order; the run phase splits `operationcount`.
pub fn child_specs(base: &ChildSpec, processes: usize) -> Vec<ChildSpec> {
    let mut out = Vec::new();
    let mut start = base.workload.insert_start;
    let op_shares = shares(base.workload.operation_count, processes);
    for (i, n) in shares(base.workload.insert_count, processes)
        .into_iter()
        .enumerate()
    {
        let mut s = base.clone();
        s.seed = base.seed.wrapping_add(1000 * i as u64);
        s.writer = base.writer + (i * base.threads.max(1)) as u64;
        s.target = base.target.map(|t| t / processes.max(1) as f64);
        match base.phase {
            Phase::Load => {
                s.workload.insert_start = start;
                s.workload.insert_count = n;
            }
            Phase::Run => s.workload.operation_count = op_shares[i],
        }
        start += n;
        out.push(s);
    }
    out
}

/// Driver side: runs one phase as `specs.len()` children of `exe`
/// (re-executed with `--child-spec JSON`), released together, and merges
/// their measurements. `label` marks modeled figures.
///
/// # Errors
/// [`MpError`].
pub fn run_children(
    exe: &std::path::Path,
    specs: &[ChildSpec],
    label: Option<String>,
    timeout: Duration,
    stop: Option<&AtomicBool>,
) -> Result<PhaseResult, MpError> {
    let mut kids = Vec::new();
    for s in specs {
        let json = serde_json::to_string(s).map_err(|e| MpError::BadResult {
            pid: 0,
            reason: e.to_string(),
        })?;
        let mut cmd = Command::new(exe);
        cmd.arg("--child-spec").arg(json);
        kids.push(ChildProc::spawn(cmd)?);
    }
    for k in &mut kids {
        k.expect("READY", READY_TIMEOUT)?;
    }
    for k in &mut kids {
        k.send("GO")?;
    }
    let mut all = Measurements::new();
    let (mut start, mut end) = (u64::MAX, 0);
    let (mut operations, mut errors, mut first_error) = (0, 0, None);
    let mut writes = Vec::new();
    let mut closed = super::Closed::default();
    let deadline = Instant::now() + timeout;
    let mut told = false;
    for i in 0..kids.len() {
        let line = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match kids[i].expect("RESULT", left.min(STOP_POLL)) {
                Ok(line) => break line,
                Err(ProcError::Timeout { pid, tag, .. }) if left.is_zero() => {
                    return Err(ProcError::Timeout { pid, tag, timeout }.into());
                }
                Err(ProcError::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if !told && stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                // Stopped (SIGINT/SIGTERM): every child still running ends
                // its phase and reports what it ran.
                told = true;
                for k in &mut kids[i..] {
                    let _ = k.send("STOP");
                }
            }
        };
        let k = &mut kids[i];
        let pid = k.pid();
        let r: ChildResult = serde_json::from_str(&line).map_err(|e| MpError::BadResult {
            pid,
            reason: e.to_string(),
        })?;
        let m = Measurements::from_wire(&r.measurements).map_err(|e| MpError::BadResult {
            pid,
            reason: e.to_string(),
        })?;
        all.merge(&m).map_err(PhaseError::from)?;
        start = start.min(r.start_us);
        end = end.max(r.end_us);
        operations += r.operations;
        errors += r.errors;
        first_error = first_error.or(r.first_error);
        writes.extend(r.writes);
        closed.add(super::Closed {
            returned_bytes: r.closed.0,
            kept_bytes: r.closed.1,
            trimmed_bytes: r.trimmed,
            error: r.closed.2,
        });
        k.finish(Duration::from_secs(30));
    }
    let runtime = Duration::from_micros(end.saturating_sub(start));
    let mut report = Report::new(&all, runtime, operations);
    if let Some(l) = label {
        report = report.with_label(l);
    }
    Ok(PhaseResult {
        report,
        measurements: all,
        runtime,
        operations,
        errors,
        first_error,
        writes,
        closed,
    })
}

/// Child side: runs `spec` and prints `READY`, then (after `GO`) `RESULT`.
///
/// # Errors
/// A message for the operator (the driver sees the child exit).
pub fn child_main(spec: &ChildSpec) -> Result<(), String> {
    let backend: Box<dyn super::Backend> = match &spec.deployed {
        Some(target) => Box::new(
            super::StoreBackend::connect(target, Duration::from_secs(10))
                .map_err(|e| crate::cluster::error_chain(&e))?,
        ),
        None => {
            let model = LatencyModel::from_name(&spec.latency)?;
            let sim = SimConfig {
                latency: model,
                ..SimConfig::default()
            };
            let remote =
                Remote::discover(&spec.fabric, spec.memory_nodes).map_err(|e| e.to_string())?;
            Box::new(SharedRaceBackend::new(remote, sim, spec.client))
        }
    };
    let started = Arc::new(Mutex::new(0u64));
    let flag = started.clone();
    // SIGINT/SIGTERM, a STOP line from the driver, or the driver gone
    // (stdin closed) end the phase: the child reports what it ran.
    let stop = match krcore_cli::Shutdown::install() {
        Ok(s) => s.flag(),
        Err(e) => return Err(format!("install the signal handlers: {e}")),
    };
    let watch = stop.clone();
    let opts = RunOptions {
        threads: spec.threads.max(1),
        seed: spec.seed,
        writer: spec.writer,
        log_writes: spec.log_writes,
        stop: Some(stop),
        fail_fast: spec.fail_fast,
        target: spec.target,
        batch: spec.batch.max(1),
        status: None,
        progress: false,
        gate: Some(Gate(Arc::new(move || {
            say("READY");
            wait_for("GO")?;
            *flag.lock() = epoch_us();
            let watch = watch.clone();
            std::thread::Builder::new()
                .name("stop-watch".into())
                .spawn(move || {
                    let _ = wait_for("STOP");
                    watch.store(true, Ordering::Relaxed);
                })
                .map_err(|e| format!("spawn the stop watcher: {e}"))?;
            Ok(())
        }))),
    };
    let keys = KeySpace::new(&spec.workload);
    let r = match spec.phase {
        Phase::Load => run_load(backend.as_ref(), &spec.workload, &keys, &opts),
        Phase::Run => run_phase(backend.as_ref(), &spec.workload, &keys, &opts),
    }
    .map_err(|e| e.to_string())?;
    let start_us = *started.lock();
    let result = ChildResult {
        measurements: r.measurements.to_wire(),
        start_us,
        end_us: start_us + u64::try_from(r.runtime.as_micros()).unwrap_or(u64::MAX),
        operations: r.operations,
        errors: r.errors,
        first_error: r.first_error,
        writes: r.writes,
        closed: (r.closed.returned_bytes, r.closed.kept_bytes, r.closed.error),
        trimmed: r.closed.trimmed_bytes,
    };
    let json = serde_json::to_string(&result).map_err(|e| e.to_string())?;
    say(&format!("RESULT {json}"));
    Ok(())
}

/// Operations in `m` that returned `status` (every metric but `-FAILED`).
pub fn count_status(m: &Measurements, status: Status) -> u64 {
    m.iter()
        .filter(|(n, _)| !n.ends_with("-FAILED"))
        .map(|(_, x)| x.count(status))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sized;

    #[test]
    fn shares_cover_everything_once() {
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(shares(7, 0), vec![7]);
        let base = ChildSpec {
            fabric: "/x".into(),
            deployed: None,
            writer: 0,
            log_writes: false,
            fail_fast: false,
            target: Some(90.0),
            batch: 4,
            memory_nodes: 2,
            phase: Phase::Load,
            workload: sized(Workload::preset('a').unwrap(), 10, 100),
            threads: 1,
            seed: 1,
            latency: "none".into(),
            client: ClientConfig::default(),
        };
        let load = child_specs(&base, 3);
        let ranges: Vec<_> = load.iter().map(|s| s.workload.load_range()).collect();
        assert_eq!(ranges, vec![0..4, 4..7, 7..10]);
        // A loader of a share of a larger key space (YCSB's insertstart
        // and insertcount) splits its share.
        let mut share = base.clone();
        share.workload.record_count = 100;
        share.workload.insert_start = 40;
        share.workload.insert_count = 20;
        let ranges: Vec<_> = child_specs(&share, 3)
            .iter()
            .map(|s| s.workload.load_range())
            .collect();
        assert_eq!(ranges, vec![40..47, 47..54, 54..60]);
        let run = child_specs(
            &ChildSpec {
                phase: Phase::Run,
                ..base
            },
            3,
        );
        let ops: Vec<_> = run.iter().map(|s| s.workload.operation_count).collect();
        assert_eq!(ops, vec![34, 33, 33]);
        assert!(run.iter().all(|s| s.workload.load_range() == (0..10)));
        assert_ne!(run[0].seed, run[1].seed);
        // -target is the whole run's: each child gets its share.
        assert!(run.iter().all(|s| s.target == Some(30.0)));
    }
}
