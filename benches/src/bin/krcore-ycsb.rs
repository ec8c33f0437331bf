//! `krcore-ycsb`: YCSB-like load against a key-value backend, with YCSB's
//! generators and YCSB-format output.
//!
//! ```text
//! krcore-ycsb [--workload a|b|c|d|f|PATH] [--records N] [--operations N]
//!             [--threads N] [--db race|dashmap|redis] [--memory-nodes N]
//!             [--latency-model none|cx4] [--json PATH] [--seed N]
//! ```
//!
//! With no arguments: the RACE store on an embedded `sim:mem` cluster (a
//! meta server, two memory nodes, one compute node per client thread),
//! YCSB workload A after a load phase.

use clap::{Parser, ValueEnum};
use krcore_benches::driver::{self, Backend, MapBackend, RaceBackend, RedisBackend, RunOptions};
use krcore_benches::ycsb::{KeySpace, Workload};
use krcore_nic::sim::LatencyModel;
use std::path::PathBuf;
use std::process::ExitCode;

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
    if let Some(path) = &args.json {
        let json = format!(
            "{{\"db\":\"{}\",\"workload\":{},\"threads\":{},\"load\":{},\"run\":{}}}",
            backend.name(),
            serde_json::to_string(&workload).unwrap_or_else(|_| "null".into()),
            opts.threads,
            load.report.to_json().unwrap_or_else(|_| "null".into()),
            run.report.to_json().unwrap_or_else(|_| "null".into()),
        );
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("krcore-ycsb: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if load.errors + run.errors > 0 {
        for (phase, r) in [("load", &load), ("run", &run)] {
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
