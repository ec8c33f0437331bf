//! `krcore-ycsb`: YCSB-like load against a key-value backend, with YCSB's
//! generators and YCSB-format output.
//!
//! ```text
//! krcore-ycsb [-P FILE]... [-p KEY=VALUE]... [-threads N] [-target OPS] [-s]
//!             [--workload a|b|c|d|f|PATH] [--records N] [--operations N]
//!             [--threads N] [--db race|dashmap|redis] [--memory-nodes N]
//!             [--latency-model none|cx4] [--json PATH] [--seed N]
//!             [--processes N] [--fabric sim:mem|sim:NAME|sim:/path|verbs:DEV]
//! ```
//!
//! With no arguments: the RACE store on an embedded `sim:mem` cluster (a
//! meta server, two memory nodes, one compute node per client thread),
//! YCSB workload A after a load phase.
//!
//! With `--processes N` (N > 1) or a directory fabric (`--fabric sim:NAME`),
//! the driver hosts the meta server and memory nodes and runs each phase as
//! N client processes (this binary re-executed) on a shared `/dev/shm`
//! fabric (a fresh one, removed at exit, unless `--fabric` names one); their
//! histograms are merged into one report.
//!
//! A deployed store (`--store NAME`, with `--meta HOST:PORT` and a
//! `--fabric` for this client's device: `sim:NAME` or `verbs:DEV`): the
//! driver hosts nothing; it finds the memory nodes through the meta server
//! (`race_store::deploy::Store`) and runs `--phase load|run|both` (YCSB's
//! `-load` / `-t`) in this process or in `--processes N` children.
//! `--verify` logs the run phase's writes and then checks every key and the
//! table (`krcore_benches::driver::verify`); `--fail-fast` ends a phase at
//! its first failed operation.
//!
//! In every mode SIGINT/SIGTERM stop the phase that runs cleanly: its
//! report covers what ran, no later phase starts, the exit code is 1 (the
//! client processes are told to stop and report too); a second signal
//! ends the program at once.

use clap::{Parser, ValueEnum};
use krcore_benches::cluster::{fresh_fabric_dir, ClusterHost, ClusterOptions, FabricSpec};
use krcore_benches::driver::mp::{self, ChildSpec, Phase};
use krcore_benches::driver::verify::verify;
use krcore_benches::driver::{
    self, Backend, MapBackend, PhaseResult, RaceBackend, RedisBackend, RunOptions,
};
use krcore_benches::driver::{DeployedTarget, StoreBackend};
use krcore_benches::ycsb::{KeySpace, Properties, Workload};
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric};
use race_store::memory::TableConfig;
use race_store::{ClientConfig, ConflictPolicy};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Db {
    /// The RACE store over KRCore on an embedded sim:mem cluster.
    Race,
    /// An in-process concurrent map (the upper bound).
    Dashmap,
    /// A redis-server the driver starts on loopback (needs redis-server).
    Redis,
}

/// YCSB-like load against a key-value store.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Core workload a, b, c, d, e or f, or a YCSB property file (ignored
    /// when -P files are given).
    #[arg(long, default_value = "a")]
    workload: String,
    /// A YCSB property file, e.g. `workloads/workloada` (repeatable: later
    /// files override earlier ones), as YCSB's `-P`.
    #[arg(short = 'P', long = "property-file", value_name = "FILE")]
    property_files: Vec<PathBuf>,
    /// A property `key=value`, overriding the files (repeatable), as
    /// YCSB's `-p`: recordcount, operationcount, threadcount, target,
    /// status.interval and the core workload's properties.
    #[arg(short = 'p', long = "prop", value_name = "KEY=VALUE")]
    props: Vec<String>,
    /// Operations per second to aim at (the whole run, every thread and
    /// process; YCSB's `-target`; property `target`) [default: no limit].
    #[arg(long, allow_negative_numbers = true)]
    target: Option<f64>,
    /// Print a status line every `status.interval` seconds (default 10)
    /// on stderr, YCSB's `-s`.
    #[arg(long)]
    status: bool,
    /// Seconds between status lines (property `status.interval`).
    #[arg(long, hide = true, default_value_t = 10.0)]
    status_interval: f64,
    /// Records loaded (overrides the workload's recordcount).
    #[arg(long)]
    records: Option<u64>,
    /// Run-phase operations (overrides the workload's operationcount).
    #[arg(long)]
    operations: Option<u64>,
    /// Keys the embedded store's table is presized for: its initial
    /// subtables hold them without a split (a split stalls the writers of
    /// its subtable for about 100 ms) [default: the workload's, recordcount
    /// plus the run's inserts; 0: one subtable, grown by splits]. A
    /// deployed store's table is node 0's (race-memnode --expected-keys).
    #[arg(long)]
    expected_keys: Option<u64>,
    /// Client threads (YCSB's `-threads`; property `threadcount`) [default: 1].
    #[arg(long)]
    threads: Option<usize>,
    /// Operations each client thread keeps in flight (property `batch`):
    /// the thread draws B requests and runs them as one batch (race:
    /// `Client::batch`, their round trips shared; other backends one by
    /// one); each operation's latency is its batch's [default: 1].
    #[arg(long, value_name = "B")]
    batch: Option<usize>,
    /// Backend.
    #[arg(long, value_enum, default_value_t = Db::Race)]
    db: Db,
    /// What a race writer does after losing a CAS to another writer:
    /// `backoff` (the default: a random pause in units of the lost
    /// attempt's duration) or `retry` (search again at once, RACE's
    /// behaviour); overrides a --config file's `[client] conflict`.
    #[arg(long, value_enum)]
    conflict: Option<ConflictArg>,
    /// Memory nodes of the race cluster.
    #[arg(long, default_value_t = 2)]
    memory_nodes: u8,
    /// Megabytes of each memory node's region (allocated lazily).
    #[arg(long, default_value_t = 2048)]
    node_mb: u64,
    /// Latency model of the sim fabric (race only): none or cx4. Figures
    /// under a model are labelled modeled.
    #[arg(long, default_value = "none")]
    latency_model: String,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// RNG seed.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Client processes (race only); above 1 they share a /dev/shm fabric.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// Fabric of the race cluster: sim:mem (default with one process),
    /// sim:NAME (/dev/shm/NAME), sim:/abs/path, or verbs:DEVICE
    /// (unsupported by this driver). Default with --processes > 1: a fresh
    /// /dev/shm directory, removed at exit.
    #[arg(long)]
    fabric: Option<String>,
    /// The meta server of a deployed store (HOST:PORT) [default:
    /// 127.0.0.1:7471 with --store].
    #[arg(long)]
    meta: Option<String>,
    /// Run against the deployed store of this name (needs --fabric, or
    /// --host daemon:PATH).
    #[arg(long)]
    store: Option<String>,
    /// Where a deployed store's clients post from: `process` (an engine of
    /// this process on --fabric) or `daemon:PATH` (the node daemon,
    /// `krcored`, listening at PATH: no NIC and no QP of this process).
    #[arg(long, default_value = "process", value_parser = parse_host)]
    host: HostArg,
    /// Phases to run against a deployed store.
    #[arg(long, value_enum, default_value_t = PhaseArg::Both)]
    phase: PhaseArg,
    /// Log the run phase's writes and check every key and the table after
    /// it (deployed store).
    #[arg(long)]
    verify: bool,
    /// End a phase at its first failed operation.
    #[arg(long)]
    fail_fast: bool,
    /// A deployed store with --processes: the fabric of client process i
    /// is the i-th of these (repeatable; cycled), instead of --fabric. On
    /// one verbs device, give each process its own GID
    /// (`verbs:rxe0,gid=N`): a node is a GID.
    #[arg(long)]
    child_fabric: Vec<String>,
    /// How long to wait for the deployed store's memory nodes, in seconds.
    #[arg(long, default_value_t = 10)]
    wait_s: u64,
    /// A deployed store: the most messaging endpoints this process's client
    /// threads share for their block allocations (race-store's
    /// `StoreOptions::alloc_endpoints`, default 32). More lets more threads
    /// ask for memory ahead at once (up to one per thread); each costs the
    /// process a VQP, its staging ring, a slot of each memory node's
    /// allocation port and, through `krcored`, one of its endpoints.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    alloc_endpoints: Option<u32>,
    /// A TOML file with `[client]` (race-store's `ClientConfig`) and, for
    /// a deployed store, `[engine]` (the compute node's `EngineConfig`);
    /// the client processes of --processes get the same settings.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Internal: run as a client process (JSON spec from the driver).
    #[arg(long, hide = true)]
    child_spec: Option<String>,
}

/// `--host`: an engine of this process, or the node daemon's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostArg {
    Process,
    Daemon(PathBuf),
}

fn parse_host(s: &str) -> Result<HostArg, String> {
    match s {
        "process" => Ok(HostArg::Process),
        _ => match s.strip_prefix("daemon:") {
            Some(path) if !path.is_empty() => Ok(HostArg::Daemon(PathBuf::from(path))),
            _ => Err(format!(
                "`{s}`: expected `process` or `daemon:PATH` (the krcored socket)"
            )),
        },
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ConflictArg {
    /// Back off after a lost CAS.
    Backoff,
    /// Search again at once.
    Retry,
}

impl Args {
    /// The race clients' settings: `base` with --conflict applied.
    fn client_config(&self, base: ClientConfig) -> ClientConfig {
        let conflict = match self.conflict {
            Some(ConflictArg::Backoff) => ConflictPolicy::Backoff,
            Some(ConflictArg::Retry) => ConflictPolicy::Retry,
            None => base.conflict,
        };
        ClientConfig { conflict, ..base }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PhaseArg {
    /// The load phase only (YCSB's -load).
    Load,
    /// The run phase only (YCSB's -t).
    Run,
    /// Load, then run.
    Both,
}

impl PhaseArg {
    fn phases(self) -> &'static [Phase] {
        match self {
            PhaseArg::Load => &[Phase::Load],
            PhaseArg::Run => &[Phase::Run],
            PhaseArg::Both => &[Phase::Load, Phase::Run],
        }
    }
}

/// YCSB's own spellings, turned into this driver's flags.
fn ycsb_spellings(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|a| match a.as_str() {
        "-load" => "--phase=load".to_string(),
        "-t" => "--phase=run".to_string(),
        "-threads" => "--threads".to_string(),
        "-batch" => "--batch".to_string(),
        "-target" => "--target".to_string(),
        "-s" => "--status".to_string(),
        _ => a,
    })
    .collect()
}

impl Args {
    /// Client threads per process: `--threads`, else property
    /// `threadcount` (folded in by [`resolve`]), else 1.
    fn threads(&self) -> usize {
        self.threads.unwrap_or(1)
    }

    /// Operations in flight per thread: `--batch`, else property `batch`,
    /// else 1.
    fn batch(&self) -> usize {
        self.batch.unwrap_or(1)
    }

    /// What the report's header names as the workload: the -P files, or
    /// `--workload`.
    fn workload_name(&self) -> String {
        if self.property_files.is_empty() {
            return self.workload.clone();
        }
        let files: Vec<String> = self
            .property_files
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        files.join("+")
    }

    /// The status interval, when `--status` asked for lines.
    fn status_every(&self) -> Option<Duration> {
        self.status
            .then(|| Duration::from_secs_f64(self.status_interval))
    }
}

/// The workload's properties: the -P files in order (or, without any,
/// `--workload`'s preset or file), then the -p overrides.
fn properties(args: &Args) -> Result<Properties, String> {
    let mut props = if args.property_files.is_empty() {
        let spec = &args.workload;
        let mut chars = spec.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => Workload::preset_properties(c).map_err(|e| e.to_string())?,
            _ => Properties::from_file(spec).map_err(|e| e.to_string())?,
        }
    } else {
        let mut p = Properties::new();
        for f in &args.property_files {
            p.extend(&Properties::from_file(f).map_err(|e| e.to_string())?);
        }
        p
    };
    for a in &args.props {
        props
            .set_assignment(a)
            .map_err(|e| format!("-p {a}: {e}"))?;
    }
    Ok(props)
}

/// A property as a number, checked.
fn number<T: std::str::FromStr>(p: &Properties, key: &str) -> Result<Option<T>, String> {
    p.get(key)
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| format!("property {key}={v}: not a valid number"))
        })
        .transpose()
}

/// The workload, with the driver settings the properties carry folded
/// into `args` (flags win): threadcount, target, status.interval.
fn resolve(args: &mut Args) -> Result<Workload, String> {
    let mut props = properties(args)?;
    // The flags win over the properties, and take part in the workload's
    // own checks and defaults (insertcount is recordcount - insertstart
    // unless given).
    if let Some(n) = args.records {
        props.set("recordcount", n.to_string());
    }
    if let Some(n) = args.operations {
        props.set("operationcount", n.to_string());
    }
    if args.threads.is_none() {
        args.threads = number(&props, "threadcount")?;
    }
    if args.threads == Some(0) {
        return Err("threads (threadcount) must be at least 1".into());
    }
    if args.batch.is_none() {
        args.batch = number(&props, "batch")?;
    }
    if args.batch == Some(0) {
        return Err("batch must be at least 1".into());
    }
    if args.target.is_none() {
        args.target = number(&props, "target")?;
    }
    if let Some(t) = args.target {
        if !(t.is_finite() && t > 0.0) {
            return Err(format!(
                "target {t}: must be a positive number of operations per second"
            ));
        }
    }
    if let Some(s) = number::<f64>(&props, "status.interval")? {
        args.status_interval = s;
    }
    if !(args.status_interval.is_finite() && args.status_interval > 0.0) {
        return Err("status.interval must be a positive number of seconds".into());
    }
    Workload::from_properties(&props).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse_from(ycsb_spellings(std::env::args()));
    krcore_cli::init_tracing("krcore-ycsb");
    if let Some(spec) = &args.child_spec {
        let r = serde_json::from_str::<ChildSpec>(spec)
            .map_err(|e| e.to_string())
            .and_then(|s| mp::child_main(&s));
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("krcore-ycsb client process: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = args;
    let workload = match resolve(&mut args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("krcore-ycsb: {e}");
            return ExitCode::from(2);
        }
    };
    if args.status && args.processes > 1 {
        eprintln!(
            "krcore-ycsb: unsupported: -s (status lines) with --processes > 1 (each client process runs its own share; use one process with -threads)"
        );
        return ExitCode::from(2);
    }
    if let Err(e) = workload.ensure_no_scan() {
        eprintln!("krcore-ycsb: {e}");
        return ExitCode::from(2);
    }
    let records = records_text(&workload);
    let operations = workload.operation_count;
    let model = match LatencyModel::from_name(&args.latency_model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("krcore-ycsb: {e}");
            return ExitCode::from(2);
        }
    };
    if model.is_some() && !matches!(args.db, Db::Race) {
        eprintln!("krcore-ycsb: --latency-model applies to --db race only");
        return ExitCode::from(2);
    }
    // SIGINT/SIGTERM end the phase that runs: it reports what ran, and the
    // program exits 1 (a second signal ends it at once).
    let stop: Arc<AtomicBool> = match krcore_cli::Shutdown::install() {
        Ok(s) => s.flag(),
        Err(e) => return krcore_cli::fail("krcore-ycsb", &e),
    };
    if args.store.is_some() || args.meta.is_some() {
        if args.expected_keys.is_some() {
            eprintln!(
                "krcore-ycsb: --expected-keys sizes an embedded store; a deployed store's \
                 table is formatted by its node 0 (race-memnode --expected-keys)"
            );
            return ExitCode::from(2);
        }
        return run_deployed(&args, workload, records, operations, &stop);
    }
    let table = embedded_table(&args, &workload);
    if args.host != HostArg::Process {
        eprintln!(
            "krcore-ycsb: --host daemon:PATH runs against a deployed store (--store NAME); \
             the embedded cluster's clients have an engine each"
        );
        return ExitCode::from(2);
    }
    let fabric = match args.fabric.as_deref().map(FabricSpec::parse).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("krcore-ycsb: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(FabricSpec::Verbs(dev)) = &fabric {
        eprintln!("krcore-ycsb: {}", FabricSpec::verbs_unsupported(dev));
        return ExitCode::from(2);
    }
    let file_client = match krcore_cli::load_toml::<krcore_cli::ClientFile>(args.config.as_deref())
    {
        Ok(f) => f.client,
        Err(e) => return krcore_cli::usage("krcore-ycsb", e),
    };
    let multi = args.processes > 1 || matches!(fabric, Some(FabricSpec::SimDir(_)));
    if multi {
        if !matches!(args.db, Db::Race) {
            eprintln!("krcore-ycsb: --processes and directory fabrics apply to --db race only");
            return ExitCode::from(2);
        }
        if fabric == Some(FabricSpec::SimMem) {
            eprintln!(
                "krcore-ycsb: sim:mem is private to one process; use --fabric sim:NAME \
                 (or no --fabric) with --processes > 1"
            );
            return ExitCode::from(2);
        }
        return run_multi(
            &args,
            &workload,
            (records, operations),
            model,
            fabric,
            file_client,
            &stop,
        );
    }
    let backend: Box<dyn Backend> = match args.db {
        Db::Race => match RaceBackend::start(args.memory_nodes, args.node_mb << 20, model, table)
            .map(|b| b.with_client_config(args.client_config(file_client)))
        {
            Ok(r) => Box::new(r),
            Err(e) => {
                eprintln!("krcore-ycsb: {e}");
                return ExitCode::from(2);
            }
        },
        Db::Dashmap => Box::new(MapBackend::new()),
        Db::Redis => match RedisBackend::start() {
            Ok(r) => Box::new(r),
            Err(e) => {
                eprintln!("krcore-ycsb: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let opts = RunOptions {
        threads: args.threads().max(1),
        seed: args.seed,
        stop: Some(stop.clone()),
        progress: true,
        target: args.target,
        status: args.status_every(),
        batch: args.batch(),
        ..RunOptions::default()
    };
    let keys = KeySpace::new(&workload);
    krcore_cli::outln!(
        "# krcore-ycsb: db={} workload={} records={} operations={} threads={}",
        backend.name(),
        args.workload_name(),
        records,
        operations,
        opts.threads
    );
    let load = match driver::run_load(backend.as_ref(), &workload, &keys, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("krcore-ycsb: load phase: {e}");
            return ExitCode::FAILURE;
        }
    };
    krcore_cli::outln!("# load phase\n{}", load.report.to_text());
    if let Some(l) = load.closed.line() {
        krcore_cli::outln!("{l}");
    }
    if let Some(l) = driver::memory_node_line(&backend.memory_node_usage()) {
        krcore_cli::outln!("{l}");
    }
    if stopped(&stop, "load") {
        return ExitCode::FAILURE;
    }
    let run = match driver::run_phase(backend.as_ref(), &workload, &keys, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("krcore-ycsb: run phase: {e}");
            return ExitCode::FAILURE;
        }
    };
    krcore_cli::outln!("# run phase\n{}", run.report.to_text());
    if let Some(l) = run.closed.line() {
        krcore_cli::outln!("{l}");
    }
    if let Some(l) = driver::memory_node_line(&backend.memory_node_usage()) {
        krcore_cli::outln!("{l}");
    }
    if stopped(&stop, "run") {
        return ExitCode::FAILURE;
    }
    finish(&args, backend.name(), &workload, opts.threads, &load, &run)
}

/// Whether SIGINT/SIGTERM stopped the `phase` just reported (said on
/// stderr).
fn stopped(stop: &AtomicBool, phase: &str) -> bool {
    let s = stop.load(Ordering::Relaxed);
    if s {
        eprintln!("krcore-ycsb: stopped before the end of the {phase} phase");
    }
    s
}

/// Writes the JSON file and reports failed operations.
fn finish(
    args: &Args,
    db: &str,
    workload: &Workload,
    threads: usize,
    load: &PhaseResult,
    run: &PhaseResult,
) -> ExitCode {
    if let Some(path) = &args.json {
        let json = format!(
            "{{\"db\":\"{}\",\"workload\":{},\"threads\":{},\"load\":{},\"run\":{}}}",
            db,
            serde_json::to_string(workload).unwrap_or_else(|_| "null".into()),
            threads,
            load.report.to_json().unwrap_or_else(|_| "null".into()),
            run.report.to_json().unwrap_or_else(|_| "null".into()),
        );
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("krcore-ycsb: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if load.errors + run.errors > 0 {
        for (phase, r) in [("load", load), ("run", run)] {
            if let Some(e) = &r.first_error {
                eprintln!(
                    "krcore-ycsb: {phase} phase: {} failed, first error: {e}",
                    r.errors
                );
            }
        }
        eprintln!(
            "krcore-ycsb: {} operations failed",
            load.errors + run.errors
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The table of an embedded store: presized for `--expected-keys`, or
/// for the workload's keys.
fn embedded_table(args: &Args, workload: &Workload) -> TableConfig {
    TableConfig::default().presized_for(
        args.expected_keys
            .unwrap_or_else(|| workload.key_count_bound()),
        args.memory_nodes.max(1),
    )
}

/// Client processes on a directory fabric: the driver hosts the cluster.
fn run_multi(
    args: &Args,
    workload: &Workload,
    (records, operations): (String, u64),
    model: Option<LatencyModel>,
    fabric: Option<FabricSpec>,
    client: ClientConfig,
    stop: &AtomicBool,
) -> ExitCode {
    let (path, tmp) = match fabric {
        Some(FabricSpec::SimDir(p)) => (p, None),
        _ => match fresh_fabric_dir("krcore-ycsb-") {
            Ok(d) => (d.path().join("fabric"), Some(d)),
            Err(e) => {
                eprintln!("krcore-ycsb: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let sim_fabric = match SimFabric::open_dir(&path, true) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("krcore-ycsb: fabric {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let opts = ClusterOptions {
        memory_nodes: args.memory_nodes.max(1),
        node_bytes: args.node_mb << 20,
        table: embedded_table(args, workload),
        sim: SimConfig {
            latency: model,
            ..SimConfig::default()
        },
    };
    let host = match ClusterHost::start(sim_fabric, &opts, tmp) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("krcore-ycsb: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("krcore-ycsb: cannot find my own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let processes = args.processes.max(1);
    let threads = args.threads().max(1);
    krcore_cli::outln!(
        "# krcore-ycsb: db=race workload={} records={} operations={} processes={} threads/process={} fabric=sim:{}",
        args.workload_name(),
        records,
        operations,
        processes,
        threads,
        path.display()
    );
    let label = model.map(|m| format!("modeled ({})", m.name));
    let base = ChildSpec {
        fabric: path.clone(),
        deployed: None,
        writer: 0,
        log_writes: false,
        fail_fast: false,
        target: args.target,
        batch: args.batch(),
        memory_nodes: opts.memory_nodes,
        phase: Phase::Load,
        workload: workload.clone(),
        threads,
        seed: args.seed,
        latency: args.latency_model.clone(),
        client: args.client_config(client),
    };
    // Generous: a child reports when its share is done.
    let timeout = Duration::from_secs(3600);
    let mut phases = Vec::new();
    for phase in [Phase::Load, Phase::Run] {
        let specs = mp::child_specs(
            &ChildSpec {
                phase,
                ..base.clone()
            },
            processes,
        );
        match mp::run_children(&exe, &specs, label.clone(), timeout, Some(stop)) {
            Ok(r) => {
                let name = if phase == Phase::Load { "load" } else { "run" };
                krcore_cli::outln!("# {name} phase\n{}", r.report.to_text());
                if let Some(l) = r.closed.line() {
                    krcore_cli::outln!("{l}");
                }
                let used: Vec<u64> = host.node_stats().iter().map(|s| s.heap_used).collect();
                if let Some(l) = driver::memory_node_line(&used) {
                    krcore_cli::outln!("{l}");
                }
                if stopped(stop, name) {
                    return ExitCode::FAILURE;
                }
                phases.push(r);
            }
            Err(e) => {
                eprintln!("krcore-ycsb: {phase:?} phase: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let run = phases.pop();
    let load = phases.pop();
    match (load, run) {
        (Some(load), Some(run)) => finish(args, "race", workload, processes * threads, &load, &run),
        _ => ExitCode::FAILURE,
    }
}

/// A deployed store (`--store`): this process hosts nothing.
fn run_deployed(
    args: &Args,
    workload: Workload,
    records: String,
    operations: u64,
    stop: &Arc<AtomicBool>,
) -> ExitCode {
    const P: &str = "krcore-ycsb";
    let Some(store) = args.store.clone() else {
        return krcore_cli::usage(
            P,
            "--meta needs --store NAME (the deployed store to run against)",
        );
    };
    let daemon = match &args.host {
        HostArg::Process => None,
        HostArg::Daemon(p) => Some(p.clone()),
    };
    let fabric = match (args.fabric.clone(), &daemon) {
        (Some(f), _) => f,
        // The daemon's NIC is the node's: named for the report only.
        (None, Some(p)) => format!("krcored:{}", p.display()),
        (None, None) => {
            return krcore_cli::usage(
                P,
                "a deployed store needs --fabric for this client's device (sim:NAME or verbs:DEVICE), or --host daemon:PATH",
            )
        }
    };
    if daemon.is_some() && !args.child_fabric.is_empty() {
        return krcore_cli::usage(
            P,
            "--child-fabric and --host daemon:PATH: attached processes use the daemon's NIC",
        );
    }
    let fabrics = args.fabric.iter().filter(|_| daemon.is_none());
    for f in fabrics.chain(&args.child_fabric) {
        if let Err(code) = krcore_cli::parse_fabric(P, f) {
            return code;
        }
    }
    if !matches!(args.db, Db::Race) {
        return krcore_cli::usage(P, "--store runs the race backend only");
    }
    let file: krcore_cli::ClientFile = match krcore_cli::load_toml(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return krcore_cli::usage(P, e),
    };
    let target = DeployedTarget {
        fabric,
        meta: args
            .meta
            .clone()
            .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string()),
        store,
        engine: file.engine,
        client: args.client_config(file.client),
        daemon,
        alloc_endpoints: args.alloc_endpoints.map(|n| n as usize),
    };
    let stop = stop.clone();
    let wait = Duration::from_secs(args.wait_s);
    let processes = args.processes.max(1);
    let threads = args.threads().max(1);
    // In this process: the backend (its compute node) is made once.
    let local = if processes == 1 {
        match StoreBackend::connect(&target, wait) {
            Ok(b) => Some(b),
            Err(e) => return krcore_cli::fail(P, &e),
        }
    } else {
        None
    };
    krcore_cli::outln!(
        "# krcore-ycsb: db=race store={} meta={} fabric={} workload={} records={} operations={} processes={} threads/process={}",
        target.store, target.meta, target.fabric, args.workload_name(), records, operations, processes, threads
    );
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return krcore_cli::fail(P, &e),
    };
    let mut failed = 0;
    let mut writes = Vec::new();
    let mut label = None;
    for &phase in args.phase.phases() {
        let log = args.verify && phase == Phase::Run;
        let r = match &local {
            Some(backend) => {
                label = backend_label(backend);
                let opts = RunOptions {
                    threads,
                    seed: args.seed,
                    progress: true,
                    log_writes: log,
                    stop: Some(stop.clone()),
                    fail_fast: args.fail_fast,
                    target: args.target,
                    status: args.status_every(),
                    batch: args.batch(),
                    ..RunOptions::default()
                };
                let keys = KeySpace::new(&workload);
                match phase {
                    Phase::Load => driver::run_load(backend, &workload, &keys, &opts),
                    Phase::Run => driver::run_phase(backend, &workload, &keys, &opts),
                }
                .map_err(|e| e.to_string())
            }
            None => {
                let base = ChildSpec {
                    fabric: PathBuf::new(),
                    deployed: Some(target.clone()),
                    writer: 0,
                    log_writes: log,
                    fail_fast: args.fail_fast,
                    target: args.target,
                    batch: args.batch(),
                    memory_nodes: 0,
                    phase,
                    workload: workload.clone(),
                    threads,
                    seed: args.seed,
                    latency: "none".into(),
                    client: target.client,
                };
                let mut specs = mp::child_specs(&base, processes);
                if !args.child_fabric.is_empty() {
                    for (i, s) in specs.iter_mut().enumerate() {
                        if let Some(d) = &mut s.deployed {
                            d.fabric = args.child_fabric[i % args.child_fabric.len()].clone();
                        }
                    }
                }
                mp::run_children(
                    &exe,
                    &specs,
                    label.clone(),
                    Duration::from_secs(3600),
                    Some(&stop),
                )
                .map_err(|e| e.to_string())
            }
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{P}: error: {phase:?} phase: {e}");
                return ExitCode::FAILURE;
            }
        };
        let name = if phase == Phase::Load { "load" } else { "run" };
        krcore_cli::outln!("# {name} phase\n{}", r.report.to_text());
        if let Some(l) = r.closed.line() {
            krcore_cli::outln!("{l}");
        }
        if r.errors > 0 {
            eprintln!(
                "{P}: error: {name} phase: {} operations failed, first error: {}",
                r.errors,
                r.first_error.as_deref().unwrap_or("?")
            );
            failed += r.errors;
        }
        writes.extend(r.writes);
        if stopped(&stop, name) {
            return ExitCode::FAILURE;
        }
    }
    if args.verify && failed == 0 {
        return match local {
            Some(b) => verify_with(&b, &workload, &writes),
            None => match StoreBackend::connect(&target, wait) {
                Ok(b) => verify_with(&b, &workload, &writes),
                Err(e) => krcore_cli::fail(P, &e),
            },
        };
    }
    if failed > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn backend_label(b: &StoreBackend) -> Option<String> {
    use krcore_benches::driver::Backend;
    b.label()
}

/// `recordcount` as the header says it: with the part of the key space
/// this driver loads when it is not all of it (YCSB's `insertstart` and
/// `insertcount`, for loaders that share a store).
fn records_text(w: &Workload) -> String {
    let range = w.load_range();
    if range == (0..w.record_count) {
        w.record_count.to_string()
    } else {
        format!(
            "{} insertstart={} insertcount={}",
            w.record_count, w.insert_start, w.insert_count
        )
    }
}

/// The verification pass (see `krcore_benches::driver::verify`).
fn verify_with(
    backend: &StoreBackend,
    workload: &Workload,
    writes: &[krcore_benches::driver::verify::WriteRecord],
) -> ExitCode {
    const P: &str = "krcore-ycsb";
    let mut client = match backend.store().client() {
        Ok(c) => c,
        Err(e) => return krcore_cli::fail(P, &e),
    };
    match verify(&mut client, workload, workload.load_range(), writes) {
        Ok(report) => {
            krcore_cli::outln!("# verification\n{}", report.summary());
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                for e in &report.examples {
                    eprintln!("{P}: error: verification: {e}");
                }
                for p in report.table_problems.iter().take(5) {
                    eprintln!("{P}: error: table check: {p}");
                }
                ExitCode::FAILURE
            }
        }
        Err(e) => krcore_cli::fail(P, &e),
    }
}
