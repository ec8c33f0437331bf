//! The elastic experiment behind `krcore-elastic` (after the KRCore paper's
//! elastic RACE experiment): memory nodes and a meta server are up, and
//! compute nodes (separate processes) join one by one while the ones
//! already in run load.
//!
//! # A join, measured and modeled
//! Each compute process stamps its phases (microseconds since the epoch,
//! the clock every process shares) from the driver's `spawn` to its first
//! successful get:
//!
//! | phase | krcore mode | verbs mode |
//! |---|---|---|
//! | `exec` | process start until `main` | same |
//! | `device` | open the fabric, find the cluster, open the NIC | same |
//! | `context` | engine start: a PD and nothing else (no QP: the DCT, the meta client's VQP and the upgrade's handshake endpoint are created on first need, which a compute node's join never has except the meta VQP, which shares DCI 0) | PD + CQ |
//! | `connect` | one VQP per memory node (the first creates DCI 0 of a small pool, `--pool-size`; DCCache/meta READ through it), scratch MR (the messaging endpoint that carries block allocations is made at the first allocation, which a get never makes) | per memory node: RC QP on both sides, QPN swap over loopback TCP, RTR/RTS; scratch MR |
//! | `first_get` | open the RACE client, first get | same |
//!
//! *Measured software time* is the wall time of these phases on this
//! machine (the sim executes the verbs; under a latency model data-path
//! completions wait their modeled time for real). *Modeled hardware time* is
//! what the sim charges, without sleeping, to control-path calls under the
//! latency model (`Counters::modeled_control_ns`: QP creation, RC connect,
//! MR registration), on the compute node and, in verbs mode, on the memory
//! nodes for their half of each connection. The modeled join is measured +
//! modeled. With `model_sleep` the process also sleeps the modeled control
//! time of its `connect` phase (both sides) before its first get, so that
//! the throughput timeline shows when a node would start contributing on
//! hardware once its host is up (the engine start is not slept, see below);
//! the slept time is excluded from the measured figures.
//!
//! # Engine start
//! In KRCore the DC pool is created once per host when the kernel module
//! loads, not per application. Here every compute process starts its own
//! engine, and the headline join ([`JoinRecord::modeled_us`],
//! [`JoinRecord::measured_us`]) includes it. The engine start is lazy (see
//! `krcore_kmod::Engine::start`): it creates no QP, and the join creates
//! one, DCI 0 of a pool of `--pool-size` DCIs created on demand, which the
//! meta lookups share. [`JoinRecord::app_modeled_us`] leaves the `context`
//! phase out (the KRCore setting with the pool up at boot) and is reported
//! as the split.
//!
//! # Throughput timeline
//! Each process counts completed gets per 100 ms bucket (absolute bucket
//! index `epoch_us / 100_000`); the driver sums them over processes.
//!
//! # DC->RC upgrades
//! In krcore mode the memory nodes run the engine's upgrade handshake
//! endpoint and the compute nodes set `EngineConfig::upgrade_after`: a VQP
//! that posted that many WRs to one memory node moves to an RC pair with
//! it. Each compute process samples its engine's upgrade counters while it
//! runs load and reports every change as an [`UpgradeEvent`] (time, node,
//! cumulative counts); the driver marks them on the timeline and compares
//! each process's own get rate just before and just after
//! ([`rate_around`]).

pub mod deployed;
pub mod plot;
pub mod rc;

use serde::{Deserialize, Serialize};

/// Timeline bucket width.
pub const BUCKET_US: u64 = 100_000;

/// The mode of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// VQPs connected through the DCCache / meta server.
    Krcore,
    /// One RC connection per memory node, made at join.
    Verbs,
    /// VQPs of the node daemon (`krcored`): the joining process attaches
    /// to the node's one engine, started before the first join (at boot),
    /// and creates no engine, NIC or QP of its own.
    Daemon,
}

impl Mode {
    /// `krcore`, `verbs` or `krcore-daemon`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Krcore => "krcore",
            Mode::Verbs => "verbs",
            Mode::Daemon => "krcore-daemon",
        }
    }
}

/// Phase stamps of one join (microseconds since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamps {
    /// The driver, just before spawning the process.
    pub spawn: u64,
    /// `main` entered.
    pub main: u64,
    /// Fabric opened, cluster found, NIC opened.
    pub device: u64,
    /// Engine (krcore) or PD + CQ (verbs) ready.
    pub context: u64,
    /// Connected to every memory node.
    pub connect: u64,
    /// First successful get returned.
    pub first_get: u64,
}

/// Modeled control-path nanoseconds of one join, per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Modeled {
    /// Opening the NIC.
    pub device_ns: u64,
    /// Engine start / PD + CQ.
    pub context_ns: u64,
    /// Connecting (compute node side).
    pub connect_ns: u64,
    /// The memory nodes' side of the connections (verbs mode).
    pub server_ns: u64,
    /// The first get (client open).
    pub first_get_ns: u64,
    /// QPs the compute node created during the join.
    pub qps_created: u64,
    /// QPs the memory nodes created for it.
    pub server_qps: u64,
}

impl Modeled {
    /// Every modeled nanosecond of the join.
    pub fn total_ns(&self) -> u64 {
        self.device_ns + self.context_ns + self.connect_ns + self.server_ns + self.first_get_ns
    }
}

/// A compute node's engine statistics (krcore mode), as far as the engine
/// reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineSummary {
    /// DCIs in the pool.
    pub dcis: u64,
    /// VQPs created.
    pub vqps_created: u64,
    /// Connects answered by the DCCache.
    pub connect_hits: u64,
    /// Connects that read the meta table.
    pub connect_misses: u64,
    /// Meta table READs.
    pub meta_reads: u64,
    /// VQPs moved from their DCI to an RC pair.
    #[serde(default)]
    pub rc_upgrades: u64,
    /// VQPs moved back to their DCI.
    #[serde(default)]
    pub rc_downgrades: u64,
    /// Upgrade attempts that failed (the VQP stayed on its DCI).
    #[serde(default)]
    pub rc_upgrade_failures: u64,
    /// DCTs created (0 until the node must be reachable; a compute node
    /// never is).
    #[serde(default)]
    pub dcts_created: u64,
    /// Handshake endpoints created (0 until the node's first upgrade).
    #[serde(default)]
    pub handshake_endpoints_created: u64,
}

/// A change of a compute process's upgrade counters, seen while it ran
/// load (sampled every few gets, so `t_us` is at most a few gets late).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeEvent {
    /// Compute process index (join order).
    pub node: usize,
    /// When the change was seen (`epoch_us`).
    pub t_us: u64,
    /// Cumulative upgrades, downgrades and failed attempts by then.
    pub upgrades: u64,
    /// Cumulative downgrades.
    pub downgrades: u64,
    /// Cumulative failed attempts.
    pub failures: u64,
}

/// What a compute process reports when it has joined.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRecord {
    /// Its index (join order).
    pub index: usize,
    /// Phase stamps.
    pub stamps: Stamps,
    /// Modeled control-path time.
    pub modeled: Modeled,
    /// Microseconds slept for the modeled time (excluded from `stamps`
    /// differences below).
    pub slept_us: u64,
    /// Engine statistics after the first get (krcore mode).
    pub engine: Option<EngineSummary>,
    /// The process's main thread as the scheduler saw it from its start
    /// to `main` and to its first get (where the kernel reports it): a
    /// slow stage spent waiting for a CPU was starved, not slow.
    #[serde(default)]
    pub sched: Option<JoinSched>,
}

/// [`JoinRecord::sched`]: the main thread's scheduler figures at `main`
/// and at the first get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinSched {
    /// At `main` (the `exec` stage: process start until `main`).
    pub at_main: crate::proc::SchedSample,
    /// At the first get (the whole join).
    pub at_join: crate::proc::SchedSample,
    /// The process's age at `main` ([`crate::proc::process_age_us`], 10 ms
    /// resolution): an `exec` stage much longer than it was spent in the
    /// driver's spawn, before the process existed.
    #[serde(default)]
    pub age_at_main_us: Option<u64>,
}

impl JoinRecord {
    /// Measured software time of the join, process start to first get,
    /// without the modeled sleep.
    pub fn measured_us(&self) -> u64 {
        self.stamps
            .first_get
            .saturating_sub(self.stamps.spawn)
            .saturating_sub(self.slept_us)
    }

    /// Measured software time from `main` to the first get, without the
    /// modeled sleep: the join without the process start (the operating
    /// system's exec, the same in every mode), the part this code runs.
    pub fn after_main_us(&self) -> u64 {
        self.stamps
            .first_get
            .saturating_sub(self.stamps.main)
            .saturating_sub(self.slept_us)
    }

    /// [`JoinRecord::after_main_us`] + the modeled control-path time.
    pub fn after_main_modeled_us(&self) -> u64 {
        self.after_main_us() + self.modeled.total_ns() / 1000
    }

    /// Measured + modeled control-path time: the join on modeled hardware.
    pub fn modeled_us(&self) -> u64 {
        self.measured_us() + self.modeled.total_ns() / 1000
    }

    /// Measured software time of the `context` phase.
    pub fn context_us(&self) -> u64 {
        self.stamps.context.saturating_sub(self.stamps.device)
    }

    /// The join without the engine start (the KRCore setting, where the DC
    /// pool exists before any application): measured.
    pub fn app_measured_us(&self) -> u64 {
        self.measured_us().saturating_sub(self.context_us())
    }

    /// The join without the engine start: measured + modeled.
    pub fn app_modeled_us(&self) -> u64 {
        self.app_measured_us() + (self.modeled.total_ns() - self.modeled.context_ns) / 1000
    }

    /// The measured stage of the join that took longest, and its
    /// microseconds (the first get without the modeled sleep).
    pub fn slowest_stage(&self) -> (&'static str, u64) {
        let s = self.stamps;
        [
            ("exec (spawn -> main)", s.main.saturating_sub(s.spawn)),
            ("device", s.device.saturating_sub(s.main)),
            ("context", s.context.saturating_sub(s.device)),
            ("connect", s.connect.saturating_sub(s.context)),
            (
                "first get",
                s.first_get
                    .saturating_sub(s.connect)
                    .saturating_sub(self.slept_us),
            ),
        ]
        .into_iter()
        .fold(("exec (spawn -> main)", 0), |best, st| {
            if st.1 > best.1 {
                st
            } else {
                best
            }
        })
    }
}

/// The joins whose measured time exceeds `factor` times the median of
/// `joins` (the tail a median hides), slowest first.
pub fn outliers(joins: &[JoinRecord], factor: f64) -> Vec<&JoinRecord> {
    slower_than(joins, JoinRecord::measured_us, |median| {
        median as f64 * factor
    })
}

/// The median of `time` over `joins` (the upper one of an even count);
/// `None` for no joins.
pub fn median_of(joins: &[JoinRecord], time: fn(&JoinRecord) -> u64) -> Option<u64> {
    let mut times: Vec<u64> = joins.iter().map(time).collect();
    times.sort_unstable();
    times.get(times.len() / 2).copied()
}

/// The joins whose `time` exceeds `bound(median)`, slowest first.
fn slower_than(
    joins: &[JoinRecord],
    time: fn(&JoinRecord) -> u64,
    bound: impl Fn(u64) -> f64,
) -> Vec<&JoinRecord> {
    let Some(median) = median_of(joins, time) else {
        return Vec::new();
    };
    let bound = bound(median);
    let mut out: Vec<&JoinRecord> = joins.iter().filter(|j| time(j) as f64 > bound).collect();
    out.sort_by_key(|j| std::cmp::Reverse(time(j)));
    out
}

/// The joins whose time from `main` to the first get
/// ([`JoinRecord::after_main_us`]) exceeds both `factor` times the median
/// of those and the median plus `floor_us`, slowest first: a tail in the
/// join's own code (the driver fails on one). A slow process start (the
/// kernel's exec, before `main`) is [`outliers`]' business and is reported,
/// not failed: no code of this repository runs there.
pub fn tails_after_main(joins: &[JoinRecord], factor: f64, floor_us: u64) -> Vec<&JoinRecord> {
    slower_than(joins, JoinRecord::after_main_us, |median| {
        (median as f64 * factor).max((median + floor_us) as f64)
    })
}

/// What a compute process reports at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadRecord {
    /// `(bucket index, gets completed)` pairs.
    pub buckets: Vec<(u64, u64)>,
    /// Gets completed.
    pub ops: u64,
    /// Gets that failed.
    pub errors: u64,
    /// Engine statistics at the end (krcore mode).
    pub engine: Option<EngineSummary>,
    /// Changes of the upgrade counters while the process ran (krcore mode).
    #[serde(default)]
    pub upgrades: Vec<UpgradeEvent>,
}

/// A process's own get rate (ops/s) over the `window_us` before and the
/// `window_us` after `t_us`, from its buckets (whole buckets only: the one
/// holding `t_us` is in neither window). `None` when either window has no
/// whole bucket inside the process's data.
pub fn rate_around(r: &LoadRecord, t_us: u64, window_us: u64) -> Option<(f64, f64)> {
    let b = t_us / BUCKET_US;
    let k = (window_us / BUCKET_US).max(1);
    let (first, last) = (r.buckets.first()?.0, r.buckets.last()?.0);
    // Whole buckets strictly inside the data (the first and last bucket of
    // a process are partial).
    if b < first + 1 + k || b + k + 1 > last {
        return None;
    }
    let sum = |lo: u64, hi: u64| -> u64 {
        r.buckets
            .iter()
            .filter(|(x, _)| (lo..hi).contains(x))
            .map(|p| p.1)
            .sum()
    };
    let secs = (k * BUCKET_US) as f64 / 1e6;
    Some((
        sum(b - k, b) as f64 / secs,
        sum(b + 1, b + 1 + k) as f64 / secs,
    ))
}

/// Per-bucket counts of a process, in a dense window.
#[derive(Debug, Clone, Default)]
pub struct Buckets {
    counts: std::collections::BTreeMap<u64, u64>,
}

impl Buckets {
    /// Counts one op completed at `t_us`.
    pub fn add(&mut self, t_us: u64, n: u64) {
        *self.counts.entry(t_us / BUCKET_US).or_default() += n;
    }

    /// As `(bucket, count)` pairs.
    pub fn pairs(&self) -> Vec<(u64, u64)> {
        self.counts.iter().map(|(&b, &c)| (b, c)).collect()
    }
}

/// Sums processes' buckets into `(seconds since start_us, ops/s)` points,
/// one per bucket from `start_us` to the last bucket with data.
pub fn timeline(records: &[LoadRecord], start_us: u64) -> Vec<(f64, f64)> {
    let mut sum = std::collections::BTreeMap::new();
    for r in records {
        for &(b, c) in &r.buckets {
            *sum.entry(b).or_insert(0u64) += c;
        }
    }
    let first = start_us / BUCKET_US;
    let Some(&last) = sum.keys().next_back() else {
        return Vec::new();
    };
    (first..=last)
        .map(|b| {
            let t = (b - first) as f64 * BUCKET_US as f64 / 1e6;
            let ops = sum.get(&b).copied().unwrap_or(0) as f64 * 1e6 / BUCKET_US as f64;
            (t, ops)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_figures_add_up() {
        let j = JoinRecord {
            index: 0,
            stamps: Stamps {
                spawn: 1_000,
                main: 2_000,
                device: 3_000,
                context: 5_000,
                connect: 6_000,
                first_get: 10_000,
            },
            modeled: Modeled {
                context_ns: 2_000_000,
                connect_ns: 1_000_000,
                server_ns: 500_000,
                ..Modeled::default()
            },
            slept_us: 3_500,
            engine: None,
            sched: None,
        };
        assert_eq!(j.measured_us(), 5_500);
        assert_eq!(j.modeled_us(), 5_500 + 3_500);
        assert_eq!(j.context_us(), 2_000);
        assert_eq!(j.app_measured_us(), 3_500);
        assert_eq!(j.app_modeled_us(), 3_500 + 1_500);
    }

    #[test]
    fn the_tail_is_named_with_its_slowest_stage() {
        let join = |index: usize, exec: u64, get: u64| JoinRecord {
            index,
            stamps: Stamps {
                spawn: 0,
                main: exec,
                device: exec + 100,
                context: exec + 200,
                connect: exec + 300,
                first_get: exec + 300 + get,
            },
            modeled: Modeled::default(),
            slept_us: 0,
            engine: None,
            sched: None,
        };
        let joins = [
            join(0, 1_000, 500),
            join(1, 1_200, 400),
            join(2, 566_000, 300),
            join(3, 900, 60_000),
            join(4, 1_100, 450),
        ];
        assert_eq!(joins[2].slowest_stage(), ("exec (spawn -> main)", 566_000));
        assert_eq!(joins[3].slowest_stage(), ("first get", 60_000));
        let slow: Vec<usize> = outliers(&joins, 10.0).iter().map(|j| j.index).collect();
        assert_eq!(slow, [2, 3]);
        assert!(outliers(&joins[..2], 10.0).is_empty());
        assert!(outliers(&[], 10.0).is_empty());
        // Join 2's tail is its exec (before main): not a tail of the join's
        // code; join 3's first get is.
        let tails: Vec<usize> = tails_after_main(&joins, 10.0, 1_000)
            .iter()
            .map(|j| j.index)
            .collect();
        assert_eq!(tails, vec![3]);
        // The floor: 10x a tiny median is not a tail.
        assert!(tails_after_main(&joins, 10.0, 100_000).is_empty());
        assert!(tails_after_main(&[], 10.0, 0).is_empty());
    }

    #[test]
    fn rate_around_compares_whole_buckets_before_and_after() {
        let r = LoadRecord {
            buckets: (10..30)
                .map(|b| (b, if b < 20 { 100 } else { 300 }))
                .collect(),
            ..LoadRecord::default()
        };
        // Event in bucket 20: before = buckets 15..20, after = 21..26.
        let (a, b) = rate_around(&r, 20 * BUCKET_US + 5, 5 * BUCKET_US).unwrap();
        assert_eq!(a, 1000.0);
        assert_eq!(b, 3000.0);
        // Too close to either end of the data.
        assert_eq!(rate_around(&r, 12 * BUCKET_US, 5 * BUCKET_US), None);
        assert_eq!(rate_around(&r, 27 * BUCKET_US, 5 * BUCKET_US), None);
    }

    #[test]
    fn timelines_sum_processes_and_fill_gaps() {
        let mut a = Buckets::default();
        a.add(1_000_050_000, 3);
        a.add(1_000_350_000, 1);
        let mut b = Buckets::default();
        b.add(1_000_099_999, 2);
        let recs = [
            LoadRecord {
                buckets: a.pairs(),
                ..LoadRecord::default()
            },
            LoadRecord {
                buckets: b.pairs(),
                ..LoadRecord::default()
            },
        ];
        let t = timeline(&recs, 1_000_000_000);
        assert_eq!(t, vec![(0.0, 50.0), (0.1, 0.0), (0.2, 0.0), (0.3, 10.0)]);
    }
}
