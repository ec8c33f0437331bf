//! The elastic experiment against a deployed store (`krcore-elastic --meta
//! ADDR --store NAME --fabric F`): compute processes join a store that
//! `race-memnode` processes serve, found through the meta server alone.
//!
//! The driver loads `records` keys (skipped with `records = 0`, for a store
//! loaded already), then spawns `joiners` compute processes one after the
//! other. Each one opens a node on the fabric, finds the store
//! (`race_store::deploy::Store::connect`: the meta bootstrap and the
//! membership over TCP, one VQP per memory node by a metadata lookup),
//! issues its first get (the join ends there), then gets random loaded keys
//! for `gets` operations and reports. Every figure is measured, none is
//! modeled: on a real device (or the emulated guest) the join's time is the
//! device's own.

use crate::proc::{epoch_us, say, ChildProc, ProcError};
use race_store::deploy::{DeployError, Store, StoreOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What a joining process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinerSpec {
    /// This client's fabric string.
    pub fabric: String,
    /// The meta server's TCP address.
    pub meta: String,
    /// The store.
    pub store: String,
    /// Keys loaded (gets pick among them).
    pub records: u64,
    /// Gets after the first.
    pub gets: u64,
    /// Join order.
    pub index: usize,
    /// When the driver spawned it (us since the Unix epoch).
    pub spawn_us: u64,
    /// The compute node's engine (a `--config` file's `[engine]`).
    #[serde(default)]
    pub engine: krcore::EngineConfig,
    /// The clients' settings (a `--config` file's `[client]`).
    #[serde(default)]
    pub client: race_store::ClientConfig,
    /// Attach to the node daemon (`krcored`) at this socket instead of
    /// opening `fabric` with an engine of the process's own.
    #[serde(default)]
    pub daemon: Option<std::path::PathBuf>,
}

impl JoinerSpec {
    fn options(&self) -> StoreOptions {
        StoreOptions {
            client: self.client,
            engine: self.engine.clone(),
            ..StoreOptions::default()
        }
    }
}

/// What a joining process reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinerReport {
    /// Join order.
    pub index: usize,
    /// Spawn to `main` (process start), us.
    pub start_us: u64,
    /// Spawn to the store found and a client open, us.
    pub connected_us: u64,
    /// Spawn to the first get's answer, us.
    pub first_get_us: u64,
    /// Gets per second after the first.
    pub gets_per_sec: f64,
    /// QPs the process's node created (its own NIC's; an attached
    /// process opens none).
    pub qps_created: u64,
    /// Attached: QPs the node daemon's NIC created over the join
    /// (node-wide).
    #[serde(default)]
    pub daemon_qps_created: Option<u64>,
}

/// The key of record `k` (the same names as the embedded experiment).
pub fn key(k: u64) -> String {
    format!("elastic{k:012}")
}

/// Why the deployed experiment failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElasticError {
    /// The store.
    #[error(transparent)]
    Deploy(#[from] DeployError),
    /// A table operation.
    #[error("{what}")]
    Store {
        /// What was done.
        what: &'static str,
        /// What failed.
        #[source]
        source: race_store::Error,
    },
    /// A joining process.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// SIGINT or SIGTERM: the run stopped (a joining process running
    /// then was killed); the reports of the joiners before it are kept.
    #[error("stopped by a signal after {done} of {joiners} joining processes")]
    Stopped {
        /// Joining processes that reported.
        done: usize,
        /// Joining processes asked for.
        joiners: usize,
        /// Their reports.
        reports: Vec<JoinerReport>,
    },
    /// A joining process sent something unreadable.
    #[error("joining process {index}: bad report: {reason}")]
    BadReport {
        /// Join order.
        index: usize,
        /// What was wrong.
        reason: String,
    },
}

/// Driver side: loads the store, runs `joiners` joining processes of `exe`
/// (each re-executed with `--joiner-spec JSON`), one after the other.
///
/// # Errors
/// [`ElasticError`].
pub fn run(
    exe: &std::path::Path,
    base: &JoinerSpec,
    joiners: usize,
    stop: &AtomicBool,
) -> Result<Vec<JoinerReport>, ElasticError> {
    let stopped = |reports: Vec<JoinerReport>| ElasticError::Stopped {
        done: reports.len(),
        joiners,
        reports,
    };
    if base.records > 0 {
        let store = Store::connect(&base.fabric, &base.meta, &base.store, base.options())?;
        let mut c = store.client().map_err(|source| ElasticError::Store {
            what: "open the loading client",
            source,
        })?;
        for k in 0..base.records {
            if k % 256 == 0 && stop.load(Ordering::Relaxed) {
                return Err(stopped(Vec::new()));
            }
            c.put(key(k).as_bytes(), &k.to_le_bytes())
                .map_err(|source| ElasticError::Store {
                    what: "load the store",
                    source,
                })?;
        }
    }
    let mut out = Vec::with_capacity(joiners);
    for index in 0..joiners {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped(out));
        }
        let spec = JoinerSpec {
            index,
            spawn_us: epoch_us(),
            ..base.clone()
        };
        let json = serde_json::to_string(&spec).map_err(|e| ElasticError::BadReport {
            index,
            reason: e.to_string(),
        })?;
        let mut cmd = Command::new(exe);
        cmd.arg("--joiner-spec").arg(json);
        let mut child = ChildProc::spawn(cmd)?;
        // Waited for in steps of 100 ms, so that a signal ends the wait
        // (the child is killed when dropped).
        let deadline = Instant::now() + Duration::from_secs(120);
        let line = loop {
            match child.expect("JOINED", Duration::from_millis(100)) {
                Err(ProcError::Timeout { .. }) if Instant::now() < deadline => {
                    if stop.load(Ordering::Relaxed) {
                        return Err(stopped(out));
                    }
                }
                r => break r?,
            }
        };
        let r: JoinerReport = serde_json::from_str(&line).map_err(|e| ElasticError::BadReport {
            index,
            reason: e.to_string(),
        })?;
        child.finish(Duration::from_secs(30));
        out.push(r);
    }
    Ok(out)
}

/// Joining process: joins, reads, prints `JOINED {json}`.
///
/// # Errors
/// A message for the operator (the driver sees the process exit).
pub fn joiner_main(spec: &JoinerSpec) -> Result<(), ElasticError> {
    let since = |t: u64| t.saturating_sub(spec.spawn_us);
    let start_us = since(epoch_us());
    let store = match &spec.daemon {
        None => Store::connect(&spec.fabric, &spec.meta, &spec.store, spec.options())?,
        Some(path) => {
            let node = krcore::Node::attach(path).map_err(DeployError::from)?;
            Store::open(&node, &spec.meta, &spec.store, spec.options())?
        }
    };
    let daemon_qps = || -> Result<Option<u64>, ElasticError> {
        let s = store.node().daemon_stats().map_err(DeployError::from)?;
        Ok(s.map(|s| s.qps_created))
    };
    let daemon_before = daemon_qps()?;
    let before = store.node().counters();
    let mut c = store.client().map_err(|source| ElasticError::Store {
        what: "open a client",
        source,
    })?;
    let connected_us = since(epoch_us());
    let records = spec.records.max(1);
    let mut rng = SmallRng::seed_from_u64(spec.index as u64 + 1);
    let get = |c: &mut race_store::Client<_>, k: u64| {
        c.get(key(k).as_bytes())
            .map_err(|source| ElasticError::Store {
                what: "get a key",
                source,
            })
    };
    get(&mut c, rng.gen_range(0..records))?;
    let first_get_us = since(epoch_us());
    let t0 = Instant::now();
    for _ in 0..spec.gets {
        get(&mut c, rng.gen_range(0..records))?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let report = JoinerReport {
        index: spec.index,
        start_us,
        connected_us,
        first_get_us,
        gets_per_sec: if secs > 0.0 {
            spec.gets as f64 / secs
        } else {
            0.0
        },
        qps_created: (store.node().counters() - before).qps_created,
        daemon_qps_created: match (daemon_before, daemon_qps()?) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        },
    };
    let json = serde_json::to_string(&report).map_err(|e| ElasticError::BadReport {
        index: spec.index,
        reason: e.to_string(),
    })?;
    say(&format!("JOINED {json}"));
    Ok(())
}

/// The reports as a table, with the median join.
pub fn print(reports: &[JoinerReport]) {
    krcore_cli::outln!("# krcore-elastic (deployed store; measured, not modeled)");
    krcore_cli::outln!(
        "joiner  start_ms  connected_ms  first_get_ms  gets/s  qps_created  daemon_qps_created"
    );
    for r in reports {
        krcore_cli::outln!(
            "{:>6}  {:>8.2}  {:>12.2}  {:>12.2}  {:>6.0}  {:>11}  {:>18}",
            r.index,
            r.start_us as f64 / 1e3,
            r.connected_us as f64 / 1e3,
            r.first_get_us as f64 / 1e3,
            r.gets_per_sec,
            r.qps_created,
            r.daemon_qps_created
                .map_or_else(|| "-".to_string(), |q| q.to_string())
        );
    }
    let mut joins: Vec<u64> = reports.iter().map(|r| r.first_get_us).collect();
    joins.sort_unstable();
    if let Some(m) = joins.get(joins.len() / 2) {
        krcore_cli::outln!(
            "median join (spawn to first get): {:.2} ms over {} joiners",
            *m as f64 / 1e3,
            joins.len()
        );
    }
}
