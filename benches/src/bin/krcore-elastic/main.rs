//! `krcore-elastic`: compute nodes (separate processes) join a running RACE
//! cluster one by one while load runs; per join, the time from process
//! start to the first successful get, measured and modeled, in KRCore mode
//! (VQPs) and as a plain verbs application (one RC connection per memory
//! node). See `krcore_benches::elastic` for what is measured and modeled.
//!
//! ```text
//! krcore-elastic [--mode krcore|verbs|both] [--memory-nodes 4] [--compute-nodes 8]
//!                [--duration 6s] [--join-every 500ms] [--records 10000]
//!                [--latency-model cx4|none] [--no-model-sleep]
//!                [--pool-size 1] [--upgrade-after 100000|off]
//!                [--json PATH] [--png PATH]
//! krcore-elastic --fabric F --meta HOST:PORT --store NAME [--joiners 4]
//!                [--records 10000] [--gets 1000] [--host daemon --socket PATH]
//! ```
//!
//! `--host daemon`: the joining processes attach to the node daemon
//! (`krcored`) instead of starting an engine each: in the first form the
//! driver starts the node's one engine before the first join (as KRCore's
//! module at boot); in the second they attach to the `krcored` at
//! `--socket`.
//!
//! The second form joins a deployed store (memory nodes run by
//! `race-memnode`, found through the meta server at `--meta`): see
//! `krcore_benches::elastic::deployed`. Its figures are measured only.

use clap::{Parser, ValueEnum};
use krcore::Node;
use krcore_benches::baseline::RcEndpoint;
use krcore_benches::cluster::{fresh_fabric_dir, ClusterHost, ClusterOptions, Remote};
use krcore_benches::elastic::rc::{RcAcceptor, RcTransport};
use krcore_benches::elastic::{
    plot, rate_around, timeline, Buckets, EngineSummary, JoinRecord, JoinSched, LoadRecord, Mode,
    Modeled, Stamps, UpgradeEvent,
};
use krcore_benches::proc::{epoch_us, process_age_us, say, ChildProc, SchedSample};
use krcore_kmod::EngineConfig;
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric, SimNic};
use krcore_nic::Nic;
use race_store::rdma::VqpTransport;
use race_store::remote::Transport;
use race_store::{Client, ClientConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

mod child;
mod report;

use child::*;
use report::*;

/// Where a krcore-mode joining process's engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HostArg {
    /// An engine of its own, started by the process (lazily).
    Process,
    /// The node daemon's (krcored), started before the first join.
    Daemon,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Krcore,
    Verbs,
    Both,
}

/// Elastic scale-out: compute processes join a running RACE cluster.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// krcore (VQPs), verbs (RC per memory node), or both, one after the other.
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    mode: ModeArg,
    /// krcore mode: the joining process's engine is its own (process) or
    /// the node daemon's (daemon: one engine per node, started before the
    /// first join, as KRCore's kernel module at boot).
    #[arg(long, value_enum, default_value_t = HostArg::Process)]
    host: HostArg,
    /// Memory nodes.
    #[arg(long, default_value_t = 4)]
    memory_nodes: u8,
    /// Compute nodes (processes) that join.
    #[arg(long, default_value_t = 8)]
    compute_nodes: usize,
    /// Run time of each mode, from the first spawn (e.g. 6s).
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    duration: Duration,
    /// Time between spawns (a spawn also waits for the previous join).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    join_every: Duration,
    /// Keys loaded before the first join.
    #[arg(long, default_value_t = 10_000)]
    records: u64,
    /// Megabytes of each memory node's region (allocated lazily).
    #[arg(long, default_value_t = 256)]
    node_mb: u64,
    /// Latency model of every node (cx4 or none). Modeled figures need it.
    #[arg(long, default_value = "cx4")]
    latency_model: String,
    /// Do not sleep the modeled control-path time before the first get.
    #[arg(long)]
    no_model_sleep: bool,
    /// Fail (exit 1) when a join's time from `main` to its first get is
    /// over this many times the median of those (and over the median +
    /// 50 ms): a tail in the join's own code. 0 turns the check off. A slow
    /// process start (the kernel's exec, before `main`) is reported, not
    /// failed.
    #[arg(long, default_value_t = 10.0)]
    tail_factor: f64,
    /// krcore mode: DCIs in each compute node's pool. None is created at
    /// engine start; each is created on demand by the first VQP bound to
    /// it (DCI 0 also carries the meta lookups).
    #[arg(long, default_value_t = 1)]
    pool_size: usize,
    /// krcore mode: WRs a VQP posts to one memory node before it moves to
    /// an RC pair (EngineConfig::upgrade_after); `off` or `0` disables the
    /// upgrade (and the handshake endpoints).
    #[arg(long, default_value = "100000", value_parser = parse_upgrade)]
    upgrade_after: Upgrade,
    /// Raw series and joins as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Throughput plot (PNG).
    #[arg(long)]
    png: Option<PathBuf>,
    /// A deployed store's meta server (HOST:PORT; with --store).
    #[arg(long)]
    meta: Option<String>,
    /// Join the deployed store of this name (needs --fabric).
    #[arg(long)]
    store: Option<String>,
    /// This client's fabric (deployed store): sim:NAME or verbs:DEVICE.
    #[arg(long)]
    fabric: Option<String>,
    /// Joining processes (deployed store).
    #[arg(long, default_value_t = 4)]
    joiners: usize,
    /// Gets each joining process issues after its first (deployed store).
    #[arg(long, default_value_t = 1000)]
    gets: u64,
    /// A deployed store: a TOML file with `[engine]` (the compute nodes'
    /// `EngineConfig`) and `[client]` (race-store's `ClientConfig`), for
    /// the driver's loading client and every joining process.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Deployed store with --host daemon: the node daemon's socket (the
    /// joining processes attach to it; the loading client opens --fabric).
    #[arg(long, default_value = "/tmp/krcored.sock")]
    socket: PathBuf,
    /// Internal: run as a compute process.
    #[arg(long, hide = true)]
    child_spec: Option<String>,
    /// Internal: run as a joining process of a deployed store.
    #[arg(long, hide = true)]
    joiner_spec: Option<String>,
}

/// `--upgrade-after`: a WR count, or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Upgrade(Option<u64>);

fn parse_upgrade(s: &str) -> Result<Upgrade, String> {
    match s {
        "off" | "0" => Ok(Upgrade(None)),
        _ => s
            .parse::<u64>()
            .map(|n| Upgrade(Some(n)))
            .map_err(|_| format!("bad --upgrade-after {s:?} (a WR count, or off)")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// After the first get: announces the join, then gets until the run's
/// end and reports the load.
fn run_load(
    spec: &ChildSpec,
    mut client: Client<AnyTransport>,
    mut rng: SmallRng,
    node: Option<&Node>,
    stamps: Stamps,
    modeled: Modeled,
    slept_us: u64,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let first_get = stamps.first_get;
    let join = JoinRecord {
        index: spec.index,
        stamps,
        modeled,
        slept_us,
        engine: node.and_then(engine_summary),
        sched: SCHED_AT_MAIN.get().and_then(|&(at_main, age)| {
            Some(JoinSched {
                at_main: at_main?,
                at_join: SchedSample::now()?,
                age_at_main_us: age,
            })
        }),
    };
    say(&format!(
        "JOINED {}",
        serde_json::to_string(&join).map_err(|x| e(&x))?
    ));
    let mut buckets = Buckets::default();
    buckets.add(first_get, 1);
    let (mut ops, mut errors) = (1u64, 0u64);
    let mut upgrades = Vec::new();
    let mut seen = (0, 0, 0);
    loop {
        let now = epoch_us();
        if now >= spec.stop_us {
            break;
        }
        if let Some(n) = node.filter(|_| ops % 64 == 0) {
            let (u, d, f, _) = n.upgrade_counters();
            if (u, d, f) != seen {
                seen = (u, d, f);
                upgrades.push(UpgradeEvent {
                    node: spec.index,
                    t_us: now,
                    upgrades: u,
                    downgrades: d,
                    failures: f,
                });
            }
        }
        let k = rng.gen_range(0..spec.records.max(1));
        match client.get(key(k).as_bytes()) {
            Ok(Some(_)) => {
                ops += 1;
                buckets.add(epoch_us(), 1);
            }
            _ => errors += 1,
        }
    }
    let load = LoadRecord {
        buckets: buckets.pairs(),
        ops,
        errors,
        engine: node.and_then(engine_summary),
        upgrades,
    };
    say(&format!(
        "RESULT {}",
        serde_json::to_string(&load).map_err(|x| e(&x))?
    ));
    Ok(())
}

#[derive(Debug, Serialize)]
struct ModeRun {
    mode: Mode,
    memory_nodes: u8,
    compute_nodes: usize,
    start_us: u64,
    joins: Vec<JoinRecord>,
    loads: Vec<LoadRecord>,
    /// `(seconds since start, ops/s)`.
    timeline: Vec<(f64, f64)>,
    /// Every compute process's upgrade events, in time order.
    upgrades: Vec<UpgradeEvent>,
    /// Per process, at its first upgrade: `(node, seconds since start, its
    /// own ops/s over the 500 ms before, over the 500 ms after)`.
    upgrade_rates: Vec<(usize, f64, f64, f64)>,
    /// Daemon mode: the node daemon's start and counters.
    daemon: Option<DaemonReport>,
}

impl ModeRun {
    /// Mean over joins, in ms.
    fn mean(&self, f: impl Fn(&JoinRecord) -> u64) -> f64 {
        if self.joins.is_empty() {
            return 0.0;
        }
        self.joins.iter().map(|j| f(j) as f64).sum::<f64>() / self.joins.len() as f64 / 1000.0
    }

    /// Median over joins, in ms (robust to a process start stalled by
    /// the machine's load).
    fn median(&self, f: impl Fn(&JoinRecord) -> u64) -> f64 {
        let mut v: Vec<u64> = self.joins.iter().map(f).collect();
        v.sort_unstable();
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2] as f64 / 1000.0,
            n => (v[n / 2 - 1] + v[n / 2]) as f64 / 2000.0,
        }
    }
}

fn run_mode(args: &Args, mode: Mode) -> Result<ModeRun, String> {
    let model = LatencyModel::from_name(&args.latency_model)?;
    let dir = fresh_fabric_dir("krcore-elastic-").map_err(|e| e.to_string())?;
    let path = dir.path().join("fabric");
    let fabric = SimFabric::open_dir(&path, true).map_err(|e| e.to_string())?;
    let opts = ClusterOptions {
        memory_nodes: args.memory_nodes.max(1),
        node_bytes: args.node_mb << 20,
        sim: SimConfig {
            latency: model,
            ..SimConfig::default()
        },
        ..ClusterOptions::default()
    };
    // krcore mode with the upgrade: the memory nodes answer handshakes.
    // Reached from the start: their DCT (and endpoint) made at start. The
    // endpoint's thread answers a handful of upgrade handshakes per run:
    // idle, it polls every 1 ms instead of 100 us (10x fewer wakeups
    // competing with the joining processes for the CPU).
    let mut memory_engine = EngineConfig::default()
        .with_eager_start(true)
        .with_upgrade_endpoint(mode != Mode::Verbs && args.upgrade_after.0.is_some());
    memory_engine.handshake.idle_sleep = Duration::from_millis(1);
    let host = ClusterHost::start_with(fabric, &opts, Some(dir), memory_engine)
        .map_err(|e| e.to_string())?;
    let mut loader = host
        .remote()
        .map_err(|e| e.to_string())?
        .race_client(&SimConfig::default(), ClientConfig::default())
        .map_err(|e| e.to_string())?;
    for k in 0..args.records.max(1) {
        loader
            .put(key(k).as_bytes(), &k.to_le_bytes())
            .map_err(|e| format!("load: {e}"))?;
    }
    // Closed, not dropped: a dropped client gives back without waiting
    // for the answers, and a memory node answering a node that is gone
    // puts its shared DCI in ERR (recovered, with a warning each run).
    let _ = loader.close();
    let acceptors: Vec<RcAcceptor> = if mode == Mode::Verbs {
        host.memory_nodes()
            .iter()
            .map(RcAcceptor::start)
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    let addrs: Vec<SocketAddr> = acceptors.iter().map(RcAcceptor::addr).collect();
    // Daemon mode: the node's one engine, started before the first join
    // (KRCore's module loads at boot), serves every joining process.
    let daemon = match mode {
        Mode::Daemon => Some(start_daemon(args, &host, model)?),
        _ => None,
    };
    let socket = daemon.as_ref().map(|d| d.daemon.path().to_path_buf());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let start_us = epoch_us();
    let stop_us = start_us + u64::try_from(args.duration.as_micros()).unwrap_or(u64::MAX);
    let mut kids = Vec::new();
    let mut joins = Vec::new();
    for index in 0..args.compute_nodes {
        let slot =
            start_us + index as u64 * u64::try_from(args.join_every.as_micros()).unwrap_or(0);
        let now = epoch_us();
        if slot > now {
            std::thread::sleep(Duration::from_micros(slot - now));
        }
        let spec = ChildSpec {
            mode,
            fabric: path.clone(),
            memory_nodes: opts.memory_nodes,
            acceptors: addrs.clone(),
            index,
            spawn_us: epoch_us(),
            stop_us,
            records: args.records.max(1),
            latency: args.latency_model.clone(),
            model_sleep: !args.no_model_sleep && model.is_some(),
            pool_size: args.pool_size,
            upgrade_after: args.upgrade_after.0,
            socket: socket.clone(),
        };
        let mut cmd = Command::new(&exe);
        cmd.arg("--child-spec")
            .arg(serde_json::to_string(&spec).map_err(|e| e.to_string())?);
        let mut kid = ChildProc::spawn(cmd).map_err(|e| e.to_string())?;
        let line = kid
            .expect("JOINED", Duration::from_secs(120))
            .map_err(|e| e.to_string())?;
        let j: JoinRecord = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        joins.push(j);
        kids.push(kid);
    }
    let mut loads = Vec::new();
    let left = Duration::from_micros(stop_us.saturating_sub(epoch_us())) + Duration::from_secs(60);
    for k in &mut kids {
        let line = k.expect("RESULT", left).map_err(|e| e.to_string())?;
        loads.push(serde_json::from_str::<LoadRecord>(&line).map_err(|e| e.to_string())?);
        k.finish(Duration::from_secs(10));
    }
    drop(acceptors);
    let daemon_report = daemon.map(BootDaemon::finish);
    let timeline = timeline(&loads, start_us);
    let mut upgrades: Vec<UpgradeEvent> = loads.iter().flat_map(|l| l.upgrades.clone()).collect();
    upgrades.sort_by_key(|u| u.t_us);
    let upgrade_rates = loads
        .iter()
        .filter_map(|l| {
            let u = l.upgrades.iter().find(|u| u.upgrades > 0)?;
            let (a, b) = rate_around(l, u.t_us, 500_000)?;
            Some((u.node, secs_since(start_us, u.t_us), a, b))
        })
        .collect();
    Ok(ModeRun {
        mode,
        memory_nodes: opts.memory_nodes,
        compute_nodes: args.compute_nodes,
        start_us,
        joins,
        loads,
        timeline,
        upgrades,
        upgrade_rates,
        daemon: daemon_report,
    })
}

/// The node daemon of a daemon-mode run, and what its start cost.
struct BootDaemon {
    // Dropped first: stops serving before its node goes.
    daemon: krcore_kmod::daemon::Daemon<krcore_nic::AnyNic>,
    node: Node,
    report: DaemonReport,
    _dir: tempfile::TempDir,
}

/// What the node daemon did over a run (its engine and NIC, node-wide).
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct DaemonReport {
    /// Its start, once per node ("at boot"): measured, and modeled
    /// control-path time, and the QPs it created.
    start_measured_us: u64,
    start_modeled_ns: u64,
    start_qps: u64,
    /// QPs its NIC created after its start (every join and load).
    qps_after_start: u64,
    dcis: u64,
    vqps_created: u64,
    connect_hits: u64,
    connect_misses: u64,
    meta_reads: u64,
    rc_upgrades: u64,
    processes_attached: u64,
}

impl BootDaemon {
    fn finish(self) -> DaemonReport {
        let BootDaemon {
            daemon,
            node,
            mut report,
            _dir,
        } = self;
        let stats = daemon.stats();
        daemon.shutdown();
        let c = node.counters();
        if let Ok(e) = node.engine() {
            let s = e.stats();
            report.dcis = s.dcis as u64;
            report.vqps_created = s.vqps_created;
            report.connect_hits = s.connect_hits;
            report.connect_misses = s.connect_misses;
            report.meta_reads = s.meta.reads;
            report.rc_upgrades = s.rc_upgrades;
        }
        report.qps_after_start = c.qps_created - report.start_qps;
        report.processes_attached = stats.attached;
        report
    }
}

/// Starts the node daemon on the run's fabric, as `krcored` does: the
/// whole DCI pool, DCT and handshake endpoint at start, registered with
/// the meta server.
fn start_daemon(
    args: &Args,
    host: &ClusterHost,
    model: Option<LatencyModel>,
) -> Result<BootDaemon, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let t0 = epoch_us();
    let nic = SimNic::open(
        host.fabric(),
        SimConfig {
            latency: model,
            ..SimConfig::default()
        },
    )
    .map_err(|x| e(&x))?;
    let c0 = nic.counters();
    let mut cfg = EngineConfig::default()
        .with_pool_size(args.pool_size.max(1))
        .with_upgrade_after(args.upgrade_after.0)
        .with_upgrade_endpoint(args.upgrade_after.0.is_some())
        .with_eager_start(true);
    cfg.prestart = cfg.pool_size;
    let remote = host.remote().map_err(|x| e(&x))?;
    let node = Node::builder()
        .nic(nic.clone())
        .config(cfg)
        .meta(remote.meta)
        .register(true)
        .build()
        .map_err(|x| e(&x))?;
    let dir = tempfile::tempdir().map_err(|x| e(&x))?;
    let engine = node.engine().map_err(|x| e(&x))?.clone();
    let daemon = krcore_kmod::daemon::Daemon::start(
        engine,
        &dir.path().join("krcored.sock"),
        krcore_kmod::daemon::DaemonConfig::default(),
    )
    .map_err(|x| e(&x))?;
    let c1 = nic.counters();
    Ok(BootDaemon {
        daemon,
        node,
        report: DaemonReport {
            start_measured_us: epoch_us() - t0,
            start_modeled_ns: c1.modeled_control_ns - c0.modeled_control_ns,
            start_qps: c1.qps_created - c0.qps_created,
            ..DaemonReport::default()
        },
        _dir: dir,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    krcore_cli::init_tracing("krcore-elastic");
    if let Some(spec) = &args.joiner_spec {
        use krcore_benches::elastic::deployed;
        let r = serde_json::from_str::<deployed::JoinerSpec>(spec)
            .map_err(|e| e.to_string())
            .and_then(|s| deployed::joiner_main(&s).map_err(|e| krcore_cli::error_chain(&e)));
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("krcore-elastic joining process: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.store.is_some() || args.meta.is_some() {
        return run_deployed(&args);
    }
    if let Some(spec) = &args.child_spec {
        let r = serde_json::from_str::<ChildSpec>(spec)
            .map_err(|e| e.to_string())
            .and_then(|s| child_main(&s));
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("krcore-elastic compute process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = LatencyModel::from_name(&args.latency_model) {
        eprintln!("krcore-elastic: {e}");
        return ExitCode::from(2);
    }
    if args.compute_nodes == 0 {
        eprintln!("krcore-elastic: --compute-nodes must be at least 1");
        return ExitCode::from(2);
    }
    let krcore = match args.host {
        HostArg::Process => Mode::Krcore,
        HostArg::Daemon => Mode::Daemon,
    };
    let modes = match args.mode {
        ModeArg::Krcore => vec![krcore],
        ModeArg::Verbs => vec![Mode::Verbs],
        ModeArg::Both => vec![krcore, Mode::Verbs],
    };
    let mut runs = Vec::new();
    let mut tails = Vec::new();
    for m in modes {
        match run_mode(&args, m) {
            Ok(r) => {
                tails.extend(print_mode(&r, &args.latency_model, args.tail_factor));
                runs.push(r);
            }
            Err(e) => {
                eprintln!("krcore-elastic: mode {}: {e}", m.name());
                return ExitCode::FAILURE;
            }
        }
    }
    if let [k, v] = runs.as_slice() {
        let red = |f: fn(&JoinRecord) -> u64| {
            let (a, b) = (k.median(f), v.median(f));
            if b > 0.0 {
                100.0 * (1.0 - a / b)
            } else {
                0.0
            }
        };
        krcore_cli::outln!("# krcore vs verbs: median join time, how much shorter in krcore mode");
        krcore_cli::outln!("headline, process start to first get WITH the engine start:");
        krcore_cli::outln!(
            "  modeled ({}) join (measured + modeled control path): krcore {:.2} ms, verbs {:.2} ms: {:.1}% shorter",
            args.latency_model,
            k.median(JoinRecord::modeled_us),
            v.median(JoinRecord::modeled_us),
            red(JoinRecord::modeled_us)
        );
        krcore_cli::outln!(
            "  measured software time: krcore {:.2} ms, verbs {:.2} ms: {:.1}% shorter",
            k.median(JoinRecord::measured_us),
            v.median(JoinRecord::measured_us),
            red(JoinRecord::measured_us)
        );
        krcore_cli::outln!(
            "  engine start alone: modeled ({}) control time krcore {:.2} ms, verbs {:.2} ms; measured krcore {:.2} ms, verbs {:.2} ms",
            args.latency_model,
            k.median(|j| j.modeled.context_ns / 1000),
            v.median(|j| j.modeled.context_ns / 1000),
            k.median(JoinRecord::context_us),
            v.median(JoinRecord::context_us),
        );
        krcore_cli::outln!(
            "  from main (without the process start, the same exec in both modes): modeled ({}) krcore {:.2} ms, verbs {:.2} ms: {:.1}% shorter; measured krcore {:.2} ms, verbs {:.2} ms",
            args.latency_model,
            k.median(JoinRecord::after_main_modeled_us),
            v.median(JoinRecord::after_main_modeled_us),
            red(JoinRecord::after_main_modeled_us),
            k.median(JoinRecord::after_main_us),
            v.median(JoinRecord::after_main_us),
        );
        krcore_cli::outln!(
            "  split: without the per-process engine start (KRCore's DC pool exists at boot):"
        );
        krcore_cli::outln!(
            "  measured: {:.1}% shorter, modeled ({}): {:.1}% shorter",
            red(JoinRecord::app_measured_us),
            args.latency_model,
            red(JoinRecord::app_modeled_us)
        );
        krcore_cli::outln!(
            "  modeled ({}) control-path time alone: {:.1}% shorter",
            args.latency_model,
            red(|j| (j.modeled.total_ns() - j.modeled.context_ns) / 1000)
        );
    }
    if let Some(p) = &args.json {
        let json = serde_json::json!({
            "latency_model": args.latency_model,
            "model_sleep": !args.no_model_sleep,
            "bucket_ms": 100,
            "upgrade_after": args.upgrade_after.0,
            "pool_size": args.pool_size,
            "runs": runs,
        });
        if let Err(e) = std::fs::write(p, json.to_string()) {
            eprintln!("krcore-elastic: {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(p) = &args.png {
        let series: Vec<plot::Series> = runs
            .iter()
            .map(|r| plot::Series {
                name: format!(
                    "{}: median join {:.1} ms modeled {}, {:.1} ms measured, with engine start",
                    r.mode.name(),
                    r.median(JoinRecord::modeled_us),
                    args.latency_model,
                    r.median(JoinRecord::measured_us),
                ),
                points: r.timeline.clone(),
                joins: r
                    .joins
                    .iter()
                    .map(|j| j.stamps.first_get.saturating_sub(r.start_us) as f64 / 1e6)
                    .collect(),
                upgrades: r
                    .upgrades
                    .iter()
                    .filter(|u| u.upgrades > 0)
                    .map(|u| secs_since(r.start_us, u.t_us))
                    .collect(),
            })
            .collect();
        let title = format!(
            "RACE gets while {} compute nodes join ({} memory nodes)",
            args.compute_nodes, args.memory_nodes
        );
        let notes = vec![
            format!(
                "dashed: join (first successful get); sim fabric, latency model {}{}",
                args.latency_model,
                if args.no_model_sleep {
                    ""
                } else {
                    ", modeled control-path time slept before the first get"
                }
            ),
            match args.upgrade_after.0 {
                Some(n) => format!(
                    "triangles on the time axis: a compute node's VQPs moved DC->RC (upgrade_after {n} WRs)"
                ),
                None => "DC->RC upgrade off (--upgrade-after off)".to_string(),
            },
        ];
        if let Err(e) = plot::draw(p, &title, &notes, &series) {
            eprintln!("krcore-elastic: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(first) = tails.first() {
        // One line for the error; every tail was printed above as an
        // OUTLIER with its stage.
        let more = if tails.len() > 1 {
            format!(" (and {} more)", tails.len() - 1)
        } else {
            String::new()
        };
        eprintln!("krcore-elastic: error: a join tail in the join's own code: {first}{more}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `--store`: the elastic experiment against a deployed store.
fn run_deployed(args: &Args) -> ExitCode {
    use krcore_benches::elastic::deployed;
    const P: &str = "krcore-elastic";
    let (Some(store), Some(fabric)) = (args.store.clone(), args.fabric.clone()) else {
        return krcore_cli::usage(P, "a deployed store needs --store NAME and --fabric F");
    };
    if let Err(code) = krcore_cli::parse_fabric(P, &fabric) {
        return code;
    }
    if args.joiners == 0 {
        return krcore_cli::usage(P, "--joiners must be at least 1");
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return krcore_cli::fail(P, &e),
    };
    let file: krcore_cli::ClientFile = match krcore_cli::load_toml(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return krcore_cli::usage(P, e),
    };
    let stop = match krcore_cli::Shutdown::install() {
        Ok(s) => s.flag(),
        Err(e) => return krcore_cli::fail(P, &e),
    };
    let base = deployed::JoinerSpec {
        fabric,
        meta: args
            .meta
            .clone()
            .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string()),
        store,
        records: args.records,
        gets: args.gets,
        index: 0,
        spawn_us: 0,
        engine: file.engine,
        client: file.client,
        daemon: (args.host == HostArg::Daemon).then(|| args.socket.clone()),
    };
    match deployed::run(&exe, &base, args.joiners, &stop) {
        Ok(reports) => {
            deployed::print(&reports);
            ExitCode::SUCCESS
        }
        Err(e) => {
            if let deployed::ElasticError::Stopped { reports, .. } = &e {
                if !reports.is_empty() {
                    deployed::print(reports);
                }
            }
            krcore_cli::fail(P, &e)
        }
    }
}
