//! `krcore-meta`: the meta server of a KRCore-rs deployment.
//!
//! ```text
//! krcore-meta --fabric F [--listen ADDR:PORT] [--buckets N] [--slots-per-bucket N]
//!             [--lease-sweep-ms N] [--name NAME] [--config FILE] [--ready-file PATH]
//! ```
//!
//! Opens a node on `--fabric` (`sim:NAME`, `sim:/path`, `verbs:DEV`, in DC
//! mode or, on devices without DC such as Soft-RoCE, in RC fallback mode)
//! whose engine hosts the meta table (`krcore::NodeBuilder::host_meta_with`):
//! clients look entries up with one-sided READs, nodes register, renew and
//! deregister with two-sided messages to its reserved port, and memory
//! nodes join named stores the same way. Its TCP listener (`--listen`,
//! default `127.0.0.1:7471`; every other program's `--meta`) answers the
//! bootstrap (where the table is) and store membership lists. On a sim
//! directory fabric it also publishes the bootstrap under `--name` for the
//! older name-based drivers.
//!
//! Prints `ready: ...` (and writes it to `--ready-file`) once serving; exits
//! 0 on SIGINT/SIGTERM. Exit codes: 2 for a bad command line, fabric string,
//! geometry or config file; 1 when the server cannot start (no such device,
//! the port in use, ...), with the cause on one line.
#![forbid(unsafe_code)]

use clap::Parser;
use krcore::Node;
use krcore_cli::{announce_ready, fail, init_tracing, load_toml, parse_fabric, usage, Shutdown};
use krcore_meta::bootstrap::DEFAULT_NAME;
use krcore_meta::table::{Geometry, DEFAULT_SLOTS_PER_BUCKET};
use krcore_meta::MetaConfig;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const PROGRAM: &str = "krcore-meta";

/// KRCore meta server: DCT metadata served by one-sided READ, registration
/// and store membership by two-sided messages, bootstrap over TCP.
#[derive(Parser, Debug)]
#[command(name = "krcore-meta", version)]
struct Args {
    /// Fabric to serve on: sim:NAME (/dev/shm/NAME), sim:/path, or
    /// verbs:DEVICE[,port=N][,gid=N].
    #[arg(long)]
    fabric: Option<String>,
    /// TCP address of the bootstrap and membership listener.
    #[arg(long)]
    listen: Option<String>,
    /// Buckets in the table.
    #[arg(long)]
    buckets: Option<u32>,
    /// Entries per bucket (one lookup READs a whole bucket).
    #[arg(long)]
    slots_per_bucket: Option<u32>,
    /// Least time between lease sweeps, in ms.
    #[arg(long)]
    lease_sweep_ms: Option<u64>,
    /// Name to publish the bootstrap under on a sim directory fabric.
    #[arg(long)]
    name: Option<String>,
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
    listen: Option<String>,
    buckets: Option<u32>,
    slots_per_bucket: Option<u32>,
    lease_sweep_ms: Option<u64>,
    name: Option<String>,
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
        return usage(
            PROGRAM,
            "--fabric is required (sim:NAME, sim:/path or verbs:DEVICE)",
        );
    };
    let spec = match parse_fabric(PROGRAM, &fabric) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if spec.as_sim().is_some_and(|s| s.dir_path().is_none()) {
        return usage(
            PROGRAM,
            "--fabric sim:mem is private to one process: a meta server needs a directory \
             fabric (sim:NAME or sim:/path) or a verbs device",
        );
    }
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| krcore_cli::DEFAULT_META_ADDR.to_string());
    let geometry = match Geometry::new(
        args.buckets.or(file.buckets).unwrap_or(1024),
        args.slots_per_bucket
            .or(file.slots_per_bucket)
            .unwrap_or(DEFAULT_SLOTS_PER_BUCKET),
    ) {
        Ok(g) => g,
        Err(e) => return usage(PROGRAM, format!("table geometry: {e}")),
    };
    let cfg = MetaConfig {
        geometry,
        lease_sweep_ms: args.lease_sweep_ms.or(file.lease_sweep_ms).unwrap_or(100),
        ..MetaConfig::default()
    };
    let shutdown = match Shutdown::install() {
        Ok(s) => s,
        Err(e) => return fail(PROGRAM, &e),
    };
    let node = match Node::builder()
        .fabric_spec(spec.clone())
        .config(file.engine)
        .host_meta_with(cfg)
        .build()
    {
        Ok(n) => n,
        Err(e) => return fail(PROGRAM, &e),
    };
    let Some(server) = node.meta_server() else {
        return fail(
            PROGRAM,
            &std::io::Error::other("the node hosts no meta server"),
        );
    };
    let tcp = match server.serve_tcp(listen.as_str()) {
        Ok(t) => t,
        Err(e) => return fail(PROGRAM, &e),
    };
    let name = args
        .name
        .or(file.name)
        .unwrap_or_else(|| DEFAULT_NAME.into());
    if let Some(f) = node.fabric().filter(|f| f.dir().is_some()) {
        if let Err(e) = server.publish_on_sim(f, &name) {
            return fail(PROGRAM, &e);
        }
    }
    let b = server.bootstrap();
    tracing::info!(
        gid = %b.server.gid,
        dct_num = b.server.dct_num,
        table_len = b.table_len,
        buckets = b.n_buckets,
        "meta table hosted"
    );
    krcore_cli::outln!(
        "bootstrap: gid {} dct_num {:#x} dc_key {:#x} meta_port {:#x}",
        b.server.gid,
        b.server.dct_num,
        b.server.dc_key,
        b.rpc_qpn
    );
    krcore_cli::outln!(
        "table: addr {:#x} rkey {:#x} len {} buckets {} slots/bucket {} incarnation {:#x}",
        b.table.addr,
        b.table.rkey,
        b.table_len,
        b.n_buckets,
        b.slots_per_bucket,
        b.incarnation
    );
    let line = format!(
        "krcore-meta listen {} fabric {} mode {:?} gid {}",
        tcp.local_addr(),
        spec,
        node.mode(),
        node.gid()
    );
    if let Err(e) = announce_ready(&line, args.ready_file.as_deref()) {
        return fail(PROGRAM, &e);
    }
    // On a sim directory fabric, the server also reclaims the slots and
    // files of nodes whose process died (a sim fabric has no kernel to do
    // it), every second.
    let fabric = node.fabric().filter(|f| f.dir().is_some()).cloned();
    let mut ticks = 0u32;
    shutdown.wait_until(Duration::from_millis(50), || {
        ticks = ticks.wrapping_add(1);
        if ticks % 20 == 0 {
            if let Some(f) = &fabric {
                let n = f.reap_dead();
                if n > 0 {
                    tracing::info!(nodes = n, "reclaimed the slots of dead sim nodes");
                }
            }
        }
        false
    });
    tracing::info!("signal received: stopping");
    let stats = server.host().stats();
    drop(tcp);
    drop(node);
    eprintln!(
        "{PROGRAM}: stopped ({} requests, {} store joins, {} swept)",
        stats.requests, stats.store_joins, stats.swept
    );
    ExitCode::SUCCESS
}
