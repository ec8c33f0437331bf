//! `krcore-ycsb`: YCSB-like load against a key-value backend, with YCSB's
//! generators and YCSB-format output.
//!
//! ```text
//! krcore-ycsb [--workload a|b|c|d|f|PATH] [--records N] [--operations N]
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

use clap::{Parser, ValueEnum};
use krcore_benches::cluster::{fresh_fabric_dir, ClusterHost, ClusterOptions, FabricSpec};
use krcore_benches::driver::mp::{self, ChildSpec, Phase};
use krcore_benches::driver::{
    self, Backend, MapBackend, PhaseResult, RaceBackend, RedisBackend, RunOptions,
};
use krcore_benches::ycsb::{KeySpace, Workload};
use krcore_nic::sim::{LatencyModel, SimConfig, SimFabric};
use std::path::PathBuf;
use std::process::ExitCode;
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
    /// Core workload a, b, c, d, e or f, or a YCSB property file.
    #[arg(long, default_value = "a")]
    workload: String,
    /// Records loaded (overrides the workload's recordcount).
    #[arg(long)]
    records: Option<u64>,
    /// Run-phase operations (overrides the workload's operationcount).
    #[arg(long)]
    operations: Option<u64>,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Backend.
    #[arg(long, value_enum, default_value_t = Db::Race)]
    db: Db,
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
    /// Internal: run as a client process (JSON spec from the driver).
    #[arg(long, hide = true)]
    child_spec: Option<String>,
}

fn load_workload(spec: &str) -> Result<Workload, String> {
    let mut chars = spec.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Workload::preset(c).map_err(|e| e.to_string()),
        _ => Workload::from_file(spec).map_err(|e| e.to_string()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
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
    let mut workload = match load_workload(&args.workload) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("krcore-ycsb: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = workload.ensure_no_scan() {
        eprintln!("krcore-ycsb: {e}");
        return ExitCode::from(2);
    }
    let records = args.records.unwrap_or(workload.record_count);
    let operations = args.operations.unwrap_or(workload.operation_count);
    workload = driver::sized(workload, records, operations);
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
        return run_multi(&args, &workload, records, operations, model, fabric);
    }
    let backend: Box<dyn Backend> = match args.db {
        Db::Race => match RaceBackend::start(args.memory_nodes, args.node_mb << 20, model) {
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
        threads: args.threads.max(1),
        seed: args.seed,
        progress: true,
        gate: None,
    };
    let keys = KeySpace::new(&workload);
    println!(
        "# krcore-ycsb: db={} workload={} records={} operations={} threads={}",
        backend.name(),
        args.workload,
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
    println!("# load phase\n{}", load.report.to_text());
    let run = match driver::run_phase(backend.as_ref(), &workload, &keys, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("krcore-ycsb: run phase: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("# run phase\n{}", run.report.to_text());
    finish(&args, backend.name(), &workload, opts.threads, &load, &run)
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

/// Client processes on a directory fabric: the driver hosts the cluster.
fn run_multi(
    args: &Args,
    workload: &Workload,
    records: u64,
    operations: u64,
    model: Option<LatencyModel>,
    fabric: Option<FabricSpec>,
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
        sim: SimConfig {
            latency: model,
            ..SimConfig::default()
        },
        ..ClusterOptions::default()
    };
    let _host = match ClusterHost::start(sim_fabric, &opts, tmp) {
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
    let threads = args.threads.max(1);
    println!(
        "# krcore-ycsb: db=race workload={} records={} operations={} processes={} threads/process={} fabric=sim:{}",
        args.workload,
        records,
        operations,
        processes,
        threads,
        path.display()
    );
    let label = model.map(|m| format!("modeled ({})", m.name));
    let base = ChildSpec {
        fabric: path.clone(),
        memory_nodes: opts.memory_nodes,
        phase: Phase::Load,
        workload: workload.clone(),
        threads,
        seed: args.seed,
        latency: args.latency_model.clone(),
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
            records,
            operations,
        );
        match mp::run_children(&exe, &specs, label.clone(), timeout) {
            Ok(r) => {
                let name = if phase == Phase::Load { "load" } else { "run" };
                println!("# {name} phase\n{}", r.report.to_text());
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
