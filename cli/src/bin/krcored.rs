//! `krcored`: the node daemon, one KRCore engine for every process of a
//! node (what KRCore's kernel module is, as a user-space service).
//!
//! ```text
//! krcored --fabric F [--meta HOST:PORT] [--socket PATH] [--pool N]
//!         [--max-vqps N] [--max-mb M] [--max-ports N] [--max-endpoints N]
//!         [--max-leases N] [--idle-us U]
//!         [--data-threads N] [--meta-wait-s S] [--report-s S]
//!         [--config FILE] [--ready-file PATH]
//! ```
//!
//! Opens the NIC port `--fabric`, creates the whole DCI pool (`--pool`,
//! default 8 per core, KRCore's sizing), the DCT and its SRQ at start,
//! registers the node with the meta server at `--meta` once, and serves
//! processes that attach over the unix socket `--socket` (default
//! `/tmp/krcored.sock`): their VQPs are the daemon's, their connects hit
//! its node-wide DCCache, their memory is registered by it and shared with
//! them (see `krcore_kmod::daemon`). `--max-vqps`, `--max-mb`,
//! `--max-ports`, `--max-endpoints` and `--max-leases` bound what one
//! process may hold (the clients of a race-store `Store` writing through
//! the daemon share at most 32 endpoints for their allocations,
//! `StoreOptions::alloc_endpoints`; each costs the daemon a staging ring
//! of about 1 MiB);
//! `--meta-wait-s S` makes a daemon whose meta server does not answer yet
//! wait for it (at most S seconds). `--data-threads` is how many threads drain the processes' rings (each
//! process is served by the one with the fewest when it attaches: one core
//! per thread while they have work); `--idle-us` is how long a data thread
//! spins without work before it sleeps (a post then costs one eventfd
//! write).
//!
//! While it serves, a usage line goes to stderr every `--report-s` seconds
//! (default 60; 0: none): the processes attached, their VQPs and
//! registered memory, the node's QPs, and the doorbells, WRs, completions
//! and refusals since the last line.
//!
//! Prints `ready: ...` (and writes it to `--ready-file`) once serving; on
//! SIGINT/SIGTERM it closes every attached process's connection (their
//! next call fails, typed), deregisters and exits 0. Exit codes: 2 for a
//! bad command line or config file; 1 when it cannot serve (no such
//! device, the meta server unreachable, the socket held by a live daemon),
//! with the cause on one line.
#![forbid(unsafe_code)]

use clap::Parser;
use krcore::Node;
use krcore_cli::{
    announce_ready, build_waiting_for_meta, bytes_text, fail, init_tracing, load_toml,
    parse_fabric, usage, Periodic, Shutdown,
};
use krcore_kmod::daemon::{Daemon, DaemonConfig, DaemonStats};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const PROGRAM: &str = "krcored";
/// Default seconds between usage lines.
const REPORT_EVERY_S: u64 = 60;

/// The node daemon: one KRCore engine shared by every process of the node.
#[derive(Parser, Debug)]
#[command(name = "krcored", version)]
struct Args {
    /// Fabric: sim:NAME or sim:/path (directory fabrics), or verbs:DEVICE[,port=N][,gid=N].
    #[arg(long)]
    fabric: Option<String>,
    /// The meta server's TCP address [default: 127.0.0.1:7471].
    #[arg(long)]
    meta: Option<String>,
    /// The unix socket processes attach to [default: /tmp/krcored.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// DCIs in the pool, all created at start [default: 8 per core].
    #[arg(long)]
    pool: Option<usize>,
    /// VQPs one process may hold [default: 1024].
    #[arg(long)]
    max_vqps: Option<u32>,
    /// MiB of registered memory one process may hold [default: 4096].
    #[arg(long)]
    max_mb: Option<u64>,
    /// Ports one process may hold bound [default: 16].
    #[arg(long)]
    max_ports: Option<u32>,
    /// Messaging endpoints one process may hold (a race-store `Store`'s
    /// clients share at most 32) [default: 64].
    #[arg(long)]
    max_endpoints: Option<u32>,
    /// Live leases one process may hold (each a key of the NIC) [default: 1024].
    #[arg(long)]
    max_leases: Option<u32>,
    /// Microseconds a data thread spins without work before it sleeps
    /// [default: 200].
    #[arg(long)]
    idle_us: Option<u64>,
    /// Data threads draining the processes' rings, each serving the
    /// processes placed on it (1..=64) [default: 1].
    #[arg(long)]
    data_threads: Option<usize>,
    /// Seconds to wait for the meta server when nobody answers at `--meta`
    /// yet (a daemon started before its meta server) [default: 0: fail at
    /// once].
    #[arg(long)]
    meta_wait_s: Option<u64>,
    /// Seconds between usage lines on stderr (processes attached, their
    /// VQPs and memory, the node's QPs, doorbells, WRs and refusals since
    /// the last line) [default: 60; 0: none].
    #[arg(long)]
    report_s: Option<u64>,
    /// TOML file with any of the settings above (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Also write the readiness line to this file.
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

/// The settings a `--config` file may hold.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    fabric: Option<String>,
    meta: Option<String>,
    socket: Option<PathBuf>,
    pool: Option<usize>,
    max_vqps: Option<u32>,
    max_mb: Option<u64>,
    max_ports: Option<u32>,
    max_endpoints: Option<u32>,
    max_leases: Option<u32>,
    idle_us: Option<u64>,
    data_threads: Option<usize>,
    meta_wait_s: Option<u64>,
    report_s: Option<u64>,
    /// The engine's settings (`[engine]`: see `krcore::EngineConfig`).
    engine: krcore::EngineConfig,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(PROGRAM);
    let file: FileConfig = match load_toml(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return usage(PROGRAM, e),
    };
    let Some(fabric) = args.fabric.or(file.fabric) else {
        return usage(PROGRAM, "--fabric is required (see --help)");
    };
    let spec = match parse_fabric(PROGRAM, &fabric) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let private = matches!(&spec, krcore_nic::FabricSpec::Sim(s) if matches!(s.location(), krcore_nic::SimLocation::Mem));
    if private {
        return usage(
            PROGRAM,
            "--fabric sim:mem is private to one process: a node daemon needs sim:/path or verbs:DEV",
        );
    }
    let meta = args
        .meta
        .or(file.meta)
        .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string());
    let socket = args
        .socket
        .or(file.socket)
        .unwrap_or_else(|| PathBuf::from("/tmp/krcored.sock"));
    let mut engine = file.engine;
    if let Some(p) = args.pool.or(file.pool) {
        if p == 0 {
            return usage(PROGRAM, "--pool must be at least 1");
        }
        engine.pool_size = p;
    }
    // The whole pool, the DCT and the handshake endpoint at start: an
    // attaching process's first connect creates nothing.
    engine.prestart = engine.pool_size;
    engine.eager_start = true;
    let mut cfg = DaemonConfig::default();
    if let Some(v) = args.max_vqps.or(file.max_vqps) {
        cfg.max_vqps = v;
    }
    if let Some(mb) = args.max_mb.or(file.max_mb) {
        let Some(b) = mb.checked_mul(1 << 20) else {
            return usage(PROGRAM, format!("--max-mb {mb}: out of range"));
        };
        cfg.max_mr_bytes = b;
    }
    if let Some(v) = args.max_ports.or(file.max_ports) {
        cfg.max_ports = v;
    }
    if let Some(v) = args.max_endpoints.or(file.max_endpoints) {
        cfg.max_endpoints = v;
    }
    if let Some(v) = args.max_leases.or(file.max_leases) {
        cfg.max_leases = v;
    }
    if let Some(us) = args.idle_us.or(file.idle_us) {
        cfg.idle_spin = Duration::from_micros(us);
    }
    if let Some(n) = args.data_threads.or(file.data_threads) {
        if !(1..=krcore_kmod::daemon::MAX_DATA_THREADS).contains(&n) {
            return usage(
                PROGRAM,
                format!(
                    "--data-threads {n}: expected 1..={}",
                    krcore_kmod::daemon::MAX_DATA_THREADS
                ),
            );
        }
        cfg.data_threads = n;
    }
    let report_s = args.report_s.or(file.report_s).unwrap_or(REPORT_EVERY_S);
    if report_s > u64::from(u32::MAX) {
        return usage(PROGRAM, format!("--report-s {report_s}: out of range"));
    }
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    let pool = engine.pool_size;
    let meta_wait = Duration::from_secs(args.meta_wait_s.or(file.meta_wait_s).unwrap_or(0));
    let built = build_waiting_for_meta(PROGRAM, meta_wait, &shutdown, || {
        Node::builder()
            .fabric_spec(spec.clone())
            .config(engine.clone())
            .meta_addr(meta.as_str())
            .register(true)
            .build()
    });
    let node = match built {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let engine = match node.engine() {
        Ok(e) => e.clone(),
        Err(e) => return fail(PROGRAM, &e),
    };
    let daemon = match Daemon::start(engine, &socket, cfg) {
        Ok(d) => d,
        Err(e) => return fail(PROGRAM, &e),
    };
    let line = format!(
        "krcored socket {} fabric {spec} mode {:?} gid {} dcis {pool} qps {} data threads {}",
        socket.display(),
        node.mode(),
        node.gid(),
        node.counters().qps_created,
        daemon.clients_per_thread().len(),
    );
    if let Err(e) = announce_ready(&line, args.ready_file.as_deref()) {
        return fail(PROGRAM, &e);
    }
    let mut period = Periodic::new(Duration::from_secs(report_s));
    let mut last = daemon.stats();
    shutdown.wait_until(Duration::from_millis(50), || {
        if let Some(since) = period.due(Instant::now()) {
            let now = daemon.stats();
            let qps = node.counters().qps_created;
            eprintln!("{PROGRAM}: {}", usage_line(&now, &last, qps, since));
            last = now;
        }
        false
    });
    let st = daemon.stats();
    tracing::info!(?st, "signal received: closing attached processes");
    daemon.shutdown();
    eprintln!(
        "{PROGRAM}: stopped; {} processes attached in all, {} doorbells, {} WRs",
        st.attached, st.doorbells, st.wrs
    );
    ExitCode::SUCCESS
}

/// One usage line: `s` now, against `last` `over` ago; `qps` the node's
/// QPs created so far.
fn usage_line(s: &DaemonStats, last: &DaemonStats, qps: u64, over: Duration) -> String {
    format!(
        "{} process(es) attached ({} in all, {} gone) holding {} VQP(s) and {} registered; \
         {qps} QP(s) created on the node; last {} s: {} doorbell(s), {} WR(s), {} completion(s), \
         {} doorbell(s) and {} request(s) refused, {} data-thread sleep(s)",
        s.clients,
        s.attached,
        s.detached,
        s.vqps,
        bytes_text(s.mr_bytes),
        over.as_secs(),
        s.doorbells.saturating_sub(last.doorbells),
        s.wrs.saturating_sub(last.wrs),
        s.completions.saturating_sub(last.completions),
        s.refused_doorbells.saturating_sub(last.refused_doorbells),
        s.refused_requests.saturating_sub(last.refused_requests),
        s.sleeps.saturating_sub(last.sleeps),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_line_counts_since_the_last_one() {
        let last = DaemonStats {
            doorbells: 10,
            wrs: 100,
            completions: 90,
            refused_requests: 1,
            ..DaemonStats::default()
        };
        let now = DaemonStats {
            clients: 2,
            vqps: 7,
            mr_bytes: 3 << 20,
            attached: 5,
            detached: 3,
            doorbells: 25,
            wrs: 160,
            completions: 150,
            refused_doorbells: 2,
            refused_requests: 1,
            sleeps: 4,
        };
        let l = usage_line(&now, &last, 9, Duration::from_secs(60));
        assert_eq!(
            l,
            "2 process(es) attached (5 in all, 3 gone) holding 7 VQP(s) and 3.0 MiB registered; \
             9 QP(s) created on the node; last 60 s: 15 doorbell(s), 60 WR(s), 60 completion(s), \
             2 doorbell(s) and 0 request(s) refused, 4 data-thread sleep(s)"
        );
    }
}
